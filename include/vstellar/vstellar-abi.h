/* SPDX-License-Identifier: ((GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause) */
/*
 * uverbs ABI between vstellar.ko and the rdma-core provider
 * (providers/vstellar). Laid out like rdma-core's kernel-headers/rdma/
 * *-abi.h: fixed-width fields, 64-bit values as __aligned_u64, no holes.
 *
 * The device interface itself (ring, WQE, CQE and doorbell layouts) is
 * include/vstellar/virtio_vstellar.h; this file only says what the
 * provider and the driver pass each other through the udata of the verbs
 * commands. See docs/driver.md.
 *
 * Memory model: the provider allocates the CQ and QP rings in its own
 * memory (page aligned, zeroed) and passes their addresses; the driver pins
 * them (ib_umem) and hands the page list to the device. The only mmaps are
 * the context's doorbell page and the kick page, at the offsets (mmap keys)
 * returned by alloc_ucontext.
 */
#ifndef VSTELLAR_ABI_USER_H
#define VSTELLAR_ABI_USER_H

#include <linux/types.h>

/* ib_device_ops.uverbs_abi_ver; the provider refuses any other. */
#define VSTELLAR_UVERBS_ABI_VERSION	1

/* alloc_ucontext: no input. Output: */
enum {
	/* kick_mmap_key is valid (the kick page can be mapped) */
	VSTELLAR_UCTX_KICK_PAGE = 1 << 0,
};

struct vstellar_alloc_ucontext_resp {
	__u32 comp_mask;		/* VSTELLAR_UCTX_* */
	__u32 ucontext;			/* device handle of this context */
	/* mmap(offset = db_mmap_key, length = db_page_size): doorbell page */
	__aligned_u64 db_mmap_key;
	/* mmap(offset = kick_mmap_key, length = 4096): kick page (store any
	 * 32-bit value at offset 0 when the doorbell page's need_kick is set)
	 */
	__aligned_u64 kick_mmap_key;
	__u32 db_page_size;		/* 4096 */
	__u32 db_first_slot;		/* first slot index used for QPs/CQs */
	__u32 db_slots;			/* slots per page */
	__u32 device_features;		/* negotiated VIRTIO_VSTELLAR_F_* bits */
	__u32 max_qp_wr;		/* power of two */
	__u32 max_cqe;			/* power of two */
	__u32 max_send_sge;
	__u32 max_recv_sge;
	__u32 max_inline_data;
	__u32 num_cq_queues;
	__u32 cqe_size;			/* sizeof(struct vstellar_cqe) */
	__u32 min_sq_log_stride;	/* 6 */
	__u32 min_rq_log_stride;	/* 4 */
	__u32 reserved;
};

/*
 * create_cq. The ring is 1 << log_cqe CQEs of cqe_size bytes at buf_addr,
 * page aligned and zeroed. The completion vector given to ibv_create_cq
 * picks the CQ notification queue (modulo num_cq_queues).
 */
struct vstellar_create_cq {
	__aligned_u64 buf_addr;
	__u32 log_cqe;
	__u32 comp_mask;		/* 0 */
};

struct vstellar_create_cq_resp {
	__u32 cqn;
	__u32 db_slot;			/* struct vstellar_db_cq in the doorbell page */
	__u32 log_cqe;
	__u32 reserved;
};

/*
 * resize_cq (F_RESIZE_CQ): the new ring, same rules as create_cq. The
 * device moves the CQEs not yet polled to entries 0 .. cqe_moved - 1 of
 * the new ring and resets the slot's ci to 0; the provider polls the new
 * ring from index 0 (see RESIZE_CQ in virtio_vstellar.h).
 */
struct vstellar_resize_cq {
	__aligned_u64 buf_addr;
	__u32 log_cqe;
	__u32 comp_mask;		/* 0 */
};

struct vstellar_resize_cq_resp {
	__u32 cqe_moved;
	__u32 log_cqe;
};

/*
 * create_qp. SQ: 1 << sq_log_wqe slots of 1 << sq_log_stride bytes at
 * sq_buf_addr; RQ likewise. Both page aligned. A QP on an SRQ has no RQ:
 * rq_buf_addr, rq_log_wqe and rq_log_stride are 0.
 */
struct vstellar_create_qp {
	__aligned_u64 sq_buf_addr;
	__aligned_u64 rq_buf_addr;
	__u8 sq_log_wqe;
	__u8 sq_log_stride;
	__u8 rq_log_wqe;
	__u8 rq_log_stride;
	__u32 comp_mask;		/* 0 */
};

struct vstellar_create_qp_resp {
	__u32 qpn;
	__u32 db_slot;			/* struct vstellar_db_qp in the doorbell page */
	__u32 max_send_sge;		/* granted by the device */
	__u32 max_recv_sge;
	__u32 max_inline_data;
	__u32 reserved;
};

/*
 * create_srq (minor 2). The ring is 1 << log_wqe slots of 1 << log_stride
 * bytes at buf_addr, page aligned and zeroed, as a QP's RQ.
 */
struct vstellar_create_srq {
	__aligned_u64 buf_addr;
	__u8 log_wqe;
	__u8 log_stride;
	__u8 reserved[2];
	__u32 comp_mask;		/* 0 */
};

/*
 * modify_srq with IBV_SRQ_MAX_WR (F_RESIZE_SRQ): the new ring, 1 << log_wqe
 * slots of the SRQ's stride at buf_addr, page aligned and zeroed. Without
 * IBV_SRQ_MAX_WR the provider passes no driver data.
 */
struct vstellar_modify_srq {
	__aligned_u64 buf_addr;
	__u8 log_wqe;
	__u8 reserved[3];
	__u32 comp_mask;		/* 0 */
};

struct vstellar_create_srq_resp {
	__u32 srqn;
	__u32 db_slot;			/* struct vstellar_db_srq in the doorbell page */
	__u32 max_sge;			/* granted by the device */
	__u32 reserved;
};

/*
 * create_ah (UD): the driver writes nothing here (ah stays 0). The device
 * keeps no AHs: the provider builds the address vector from the attributes
 * and every UD send WQE carries it (struct vstellar_send_wqe, u.ud.av).
 * The struct keeps the response's size stable for old providers.
 */
struct vstellar_create_ah_resp {
	__u32 ah;
	__u32 reserved;
};

#endif /* VSTELLAR_ABI_USER_H */
