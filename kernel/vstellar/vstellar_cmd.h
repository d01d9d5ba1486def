/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/*
 * vStellar device commands: one typed function per control-queue command
 * the driver sends. Each one encodes its request (the wire structure and,
 * where the command has one, the page list), runs it through the
 * transport (vstellar_com.c) and decodes the answer into CPU-endian
 * results. Nothing above this file builds a vstellar_cmd_* structure.
 *
 * Commands the driver never sends have no function: CREATE_AH and
 * DESTROY_AH are reserved (the device answers UNSUPPORTED), and kernel
 * CQs arm through their doorbell slot instead of REQ_NOTIFY_CQ.
 */
#ifndef _VSTELLAR_CMD_H_
#define _VSTELLAR_CMD_H_

#include <linux/types.h>
#include <rdma/ib_verbs.h>

#include <vstellar/virtio_vstellar.h>

struct ib_umem;
struct vstellar_dev;
struct vstellar_kring;

/*
 * The guest memory of one ring or MR as a command names it: npages pages
 * of pgsz bytes, the first byte at offset in the first page. Either pinned
 * user memory (umem) or one DMA-contiguous kernel ring (dma).
 */
struct vstellar_pages {
	struct ib_umem *umem;
	dma_addr_t dma;
	unsigned long pgsz;
	size_t npages;
	u64 offset;
};

/* Describe a ring or MR; the commands below turn it into a page list. */
void vstellar_pages_of_umem(struct vstellar_pages *p, struct ib_umem *umem,
			    unsigned long pgsz);
void vstellar_pages_of_kring(struct vstellar_pages *p,
			     const struct vstellar_kring *r);

/* ---------------------------------------------------------------- */
/* Device, port, GIDs                                                */
/* ---------------------------------------------------------------- */

/* The answer is kept as the device wrote it (dev->attr). */
int vstellar_cmd_query_device(struct vstellar_dev *dev,
			      struct vstellar_resp_query_device *attr);

/*
 * Fills the fields of @props the device knows (state, MTUs, speed, width,
 * GID table length, maximum message size) and adds its capability flags
 * to port_cap_flags; on error @props is untouched.
 */
int vstellar_cmd_query_port(struct vstellar_dev *dev, u32 port,
			    struct ib_port_attr *props);

int vstellar_cmd_add_gid(struct vstellar_dev *dev, u32 port, u32 index,
			 const union ib_gid *gid);
int vstellar_cmd_del_gid(struct vstellar_dev *dev, u32 port, u32 index);
int vstellar_cmd_mcast(struct vstellar_dev *dev, u32 uctx, bool attach,
		       u32 qpn, const union ib_gid *gid, u16 lid);

/* The kernel's doorbell page (minor 1): its index in the region. */
int vstellar_cmd_kernel_db(struct vstellar_dev *dev, u32 *db_page);

/* ---------------------------------------------------------------- */
/* User contexts and PDs                                             */
/* ---------------------------------------------------------------- */

struct vstellar_alloc_ucontext_result {
	u32 ucontext;		/* device handle */
	u32 db_page;		/* its page in the doorbell region */
};

int vstellar_cmd_alloc_ucontext(struct vstellar_dev *dev,
				struct vstellar_alloc_ucontext_result *res);
int vstellar_cmd_dealloc_ucontext(struct vstellar_dev *dev, u32 ucontext);

int vstellar_cmd_alloc_pd(struct vstellar_dev *dev, u32 uctx, u32 *pdn);
int vstellar_cmd_dealloc_pd(struct vstellar_dev *dev, u32 uctx, u32 pdn);

/* ---------------------------------------------------------------- */
/* CQs                                                               */
/* ---------------------------------------------------------------- */

struct vstellar_create_cq_params {
	u32 log_cqe;			/* 1 << log_cqe CQEs */
	u32 cq_queue;			/* CQ notification queue */
	struct vstellar_pages ring;
};

struct vstellar_create_cq_result {
	u32 cqn;
	u32 db_slot;
};

int vstellar_cmd_create_cq(struct vstellar_dev *dev, u32 uctx,
			   const struct vstellar_create_cq_params *params,
			   struct vstellar_create_cq_result *res);
int vstellar_cmd_destroy_cq(struct vstellar_dev *dev, u32 uctx, u32 cqn);
/* F_RESIZE_CQ: *moved = CQEs the device moved to the new ring's start */
int vstellar_cmd_resize_cq(struct vstellar_dev *dev, u32 uctx, u32 cqn,
			   u32 log_cqe, const struct vstellar_pages *ring,
			   u32 *moved);

/* ---------------------------------------------------------------- */
/* QPs                                                               */
/* ---------------------------------------------------------------- */

struct vstellar_create_qp_params {
	u32 pdn;
	u32 send_cqn;
	u32 recv_cqn;
	u8 qp_type;			/* VSTELLAR_QPT_* */
	bool sq_sig_all;
	u8 sq_log_wqe;
	u8 sq_log_stride;
	u8 rq_log_wqe;
	u8 rq_log_stride;
	u32 max_send_sge;
	u32 max_recv_sge;
	u32 max_inline_data;
	/*
	 * use_srq (F_SRQ): receives come from SRQ srqn and the QP has no RQ,
	 * so rq_log_wqe, rq_log_stride and max_recv_sge are 0 and rq unused.
	 */
	bool use_srq;
	u32 srqn;
	/* one page size for both rings: sq.pgsz == rq.pgsz */
	struct vstellar_pages sq;
	struct vstellar_pages rq;
};

/* What the device granted. */
struct vstellar_create_qp_result {
	u32 qpn;
	u32 db_slot;
	u32 max_send_sge;
	u32 max_recv_sge;
	u32 max_inline_data;
};

int vstellar_cmd_create_qp(struct vstellar_dev *dev, u32 uctx,
			   const struct vstellar_create_qp_params *params,
			   struct vstellar_create_qp_result *res);

/* The fields of @attr that @attr_mask names (IB numbering both sides). */
int vstellar_cmd_modify_qp(struct vstellar_dev *dev, u32 uctx, u32 qpn,
			   const struct ib_qp_attr *attr, int attr_mask);

/*
 * Fills @attr with the device's view of the QP (state, PSNs, keys,
 * timers, address vector when @has_av); the caller adds the capabilities
 * it keeps itself. On error @attr is untouched.
 */
int vstellar_cmd_query_qp(struct vstellar_dev *dev, u32 uctx, u32 qpn,
			  bool has_av, struct ib_qp_attr *attr);
int vstellar_cmd_destroy_qp(struct vstellar_dev *dev, u32 uctx, u32 qpn);

/* ---------------------------------------------------------------- */
/* SRQs (F_SRQ)                                                      */
/* ---------------------------------------------------------------- */

struct vstellar_create_srq_params {
	u32 pdn;
	u8 log_wqe;			/* 1 << log_wqe slots */
	u8 log_stride;			/* of 1 << log_stride bytes */
	u32 max_sge;
	u32 srq_limit;			/* 0: not armed */
	struct vstellar_pages ring;
};

struct vstellar_create_srq_result {
	u32 srqn;
	u32 db_slot;
	u32 max_sge;			/* what the device granted */
};

int vstellar_cmd_create_srq(struct vstellar_dev *dev, u32 uctx,
			    const struct vstellar_create_srq_params *params,
			    struct vstellar_create_srq_result *res);

/* Arms SRQ_LIMIT_REACHED (0 disarms): the only attribute that changes. */
/* F_RESIZE_SRQ: the SRQ reads its WQEs from ring (1 << log_wqe slots) */
int vstellar_cmd_resize_srq(struct vstellar_dev *dev, u32 uctx, u32 srqn,
			    u8 log_wqe, const struct vstellar_pages *ring);
int vstellar_cmd_modify_srq(struct vstellar_dev *dev, u32 uctx, u32 srqn,
			    u32 srq_limit);

/* Fills @attr with the device's view; on error @attr is untouched. */
int vstellar_cmd_query_srq(struct vstellar_dev *dev, u32 uctx, u32 srqn,
			   struct ib_srq_attr *attr);

/* BUSY (-EBUSY) while QPs use the SRQ. */
int vstellar_cmd_destroy_srq(struct vstellar_dev *dev, u32 uctx, u32 srqn);

/* ---------------------------------------------------------------- */
/* MRs                                                               */
/* ---------------------------------------------------------------- */

struct vstellar_reg_mr_params {
	u32 pdn;
	u32 access_flags;		/* VSTELLAR_ACCESS_* */
	u64 iova;
	u64 length;
	struct vstellar_pages pages;	/* offset unused: iova carries it */
};

struct vstellar_reg_mr_result {
	u32 mrn;
	u32 lkey;
	u32 rkey;
};

int vstellar_cmd_reg_mr(struct vstellar_dev *dev, u32 uctx,
			const struct vstellar_reg_mr_params *params,
			struct vstellar_reg_mr_result *res);
int vstellar_cmd_dereg_mr(struct vstellar_dev *dev, u32 uctx, u32 mrn);

/*
 * On-demand paging (minor 7, F_ODP). REG_MR of an on-demand MR: no pages,
 * @access_flags VSTELLAR_ACCESS_* (ON_DEMAND is added); iova 0 and length
 * VSTELLAR_ODP_IMPLICIT_LENGTH make an implicit MR. MAP_MR_PAGES takes
 * @n (1 .. max_cmd_pages) entries of an ODP umem's dma_list; the device
 * pages are of 1 << VSTELLAR_ODP_PAGE_SHIFT bytes.
 */
#define VSTELLAR_ODP_PAGE_SHIFT	12
int vstellar_cmd_reg_odp_mr(struct vstellar_dev *dev, u32 uctx, u32 pdn,
			    u32 access_flags, u64 iova, u64 length,
			    struct vstellar_reg_mr_result *res);
int vstellar_cmd_map_mr_pages(struct vstellar_dev *dev, u32 uctx, u32 mrn,
			      u64 iova, const dma_addr_t *odp_pages, u32 n);
int vstellar_cmd_unmap_mr_pages(struct vstellar_dev *dev, u32 uctx, u32 mrn,
				u64 iova, u64 length);
int vstellar_cmd_invalidate_mr(struct vstellar_dev *dev, u32 uctx, u32 mrn);
int vstellar_cmd_alloc_mw(struct vstellar_dev *dev, u32 uctx, u32 pdn,
			  u32 type, u32 *mwn, u32 *rkey);
int vstellar_cmd_dealloc_mw(struct vstellar_dev *dev, u32 uctx, u32 mwn);

/*
 * ALLOC_MR (minor 3, F_MEM_MGT, kernel only): a fast-registration MR of
 * @pdn for up to @max_num_pages pages, FREE until a REG_MR WQE maps it.
 * DEREG_MR frees it.
 */
int vstellar_cmd_alloc_mr(struct vstellar_dev *dev, u32 pdn, u32 max_num_pages,
			  struct vstellar_reg_mr_result *res);

/* ---------------------------------------------------------------- */
/* Address vectors (in MODIFY_QP, QUERY_QP and UD send WQEs)          */
/* ---------------------------------------------------------------- */

void vstellar_av_from_ah_attr(struct vstellar_av *av,
			      const struct rdma_ah_attr *ah);

#endif /* _VSTELLAR_CMD_H_ */
