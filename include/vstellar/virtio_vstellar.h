/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause */
/*
 * vStellar device interface: the virtio RDMA device (virtio ID 42) that
 * vstellard serves behind QEMU's vhost-user-vstellar-pci.
 *
 * Defined once here and shared by the guest driver (kernel/vstellar), the
 * rdma-core provider (providers/vstellar), the QEMU frontend and vstellard.
 * The prose specification is docs/virtio-vstellar.md; where this header and
 * the document disagree, it is a bug in both.
 *
 * Rules: every field has a fixed width and is little-endian (__le*) unless
 * it is an InfiniBand wire value (__be*: immediate data, GIDs are raw bytes).
 * Every structure has a static-asserted size. Reserved fields are written
 * as zero and a device rejects commands whose reserved fields are not zero,
 * so they can be given meaning later without a new command.
 *
 * Types come from <linux/types.h>: the kernel's own in kernel builds, the
 * uapi copy (linux-libc-dev) in userspace, as rdma-core's kernel-headers do.
 */
#ifndef VSTELLAR_VIRTIO_VSTELLAR_H
#define VSTELLAR_VIRTIO_VSTELLAR_H

#include <linux/types.h>

#ifdef __cplusplus
#define VSTELLAR_ABI_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define VSTELLAR_ABI_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
#define VSTELLAR_ABI_SIZE(type, size) \
	VSTELLAR_ABI_ASSERT(sizeof(struct type) == (size), #type " size")
#define VSTELLAR_ABI_OFFSET(type, field, off) \
	VSTELLAR_ABI_ASSERT(__builtin_offsetof(struct type, field) == (off), \
			    #type "." #field " offset")

/* ------------------------------------------------------------------ */
/* Identity and version                                                 */
/* ------------------------------------------------------------------ */

/* "RDMA device" in the virtio specification's device ID table. */
#define VIRTIO_ID_VSTELLAR		42
#define VSTELLAR_PCI_VENDOR_ID		0x1af4	/* virtio (Red Hat, Inc.) */
#define VSTELLAR_PCI_DEVICE_ID		(0x1040 + VIRTIO_ID_VSTELLAR) /* 0x106a */

/*
 * Interface version, in config.abi_version as (major << 16) | minor. A new
 * minor only adds (commands, feature bits, meaning for reserved fields); a
 * driver refuses a device whose major differs from its own.
 */
#define VSTELLAR_ABI_MAJOR		1
#define VSTELLAR_ABI_MINOR		7
#define VSTELLAR_ABI_VERSION \
	((VSTELLAR_ABI_MAJOR << 16) | VSTELLAR_ABI_MINOR)
#define VSTELLAR_ABI_VERSION_MAJOR(v)	((v) >> 16)

/* ------------------------------------------------------------------ */
/* Feature bits (device-specific range 0..23)                           */
/* ------------------------------------------------------------------ */

/* Reliable-connected QPs (IB_QPT_RC). */
#define VIRTIO_VSTELLAR_F_RC		0
/*
 * Datagram QPs: UD, and for the kernel the GSI QP (QP1, which carries the
 * CM's MADs, so rdma_cm works), the kernel doorbell page (KERNEL_DB) and
 * the local DMA lkey. Send WQEs carry their address vector inline.
 */
#define VIRTIO_VSTELLAR_F_UD		1
/* Doorbell notification suppression (db page need_kick, kick queue). */
#define VIRTIO_VSTELLAR_F_DB_SUPPRESS	2
/* More than one CQ notification queue (config.num_cq_queues > 1). */
#define VIRTIO_VSTELLAR_F_MULTI_CQNQ	3
/* RDMA atomics (compare-and-swap, fetch-and-add) on RC QPs. */
#define VIRTIO_VSTELLAR_F_ATOMIC	4
/* Inline data in send WQEs (config.max_inline_data > 0). */
#define VIRTIO_VSTELLAR_F_INLINE	5
/*
 * Shared receive queues (minor 2): CREATE/MODIFY/QUERY/DESTROY_SRQ, QPs
 * created with VSTELLAR_QP_CREATE_USE_SRQ, SRQ doorbell slots, CQEs with
 * VSTELLAR_CQE_SRQ, the SRQ_LIMIT_REACHED and QP_LAST_WQE_REACHED events.
 */
#define VIRTIO_VSTELLAR_F_SRQ		6
/*
 * Unreliable-connected QPs (minor 3): VSTELLAR_QPT_UC with SEND,
 * SEND_IMM, RDMA_WRITE and RDMA_WRITE_IMM; no acknowledgements and no
 * retransmission, so a lost packet loses its message.
 */
#define VIRTIO_VSTELLAR_F_UC		7
/* RESIZE_CQ (minor 3): a CQ moves to a new ring with its CQEs. */
#define VIRTIO_VSTELLAR_F_RESIZE_CQ	8
/*
 * Memory windows type 1 and 2 (minor 3): ALLOC_MW, DEALLOC_MW, the BIND_MW
 * WQE, LOCAL_INV and SEND_WITH_INV of windows, VSTELLAR_ACCESS_MW_BIND,
 * resp_query_device.max_mw.
 */
#define VIRTIO_VSTELLAR_F_MW		9
/*
 * Memory management extensions for kernel users (minor 3): ALLOC_MR, the
 * REG_MR and LOCAL_INV WQEs on kernel QPs, SEND_WITH_INV, remote
 * invalidation (VSTELLAR_CQE_WITH_INV), config.max_fast_reg_pages.
 */
#define VIRTIO_VSTELLAR_F_MEM_MGT	10
/*
 * UD multicast (minor 3): ATTACH_MCAST, DETACH_MCAST; UD send WQEs whose
 * destination GID is a multicast group reach every QP attached to it.
 */
#define VIRTIO_VSTELLAR_F_MCAST		11
/* RESIZE_SRQ (minor 3): an SRQ moves to a ring of another size. */
#define VIRTIO_VSTELLAR_F_RESIZE_SRQ	12
/*
 * MRs over memory another device exports (minor 6): a REG_MR page list
 * may name device memory (an accelerator's BAR, in the memory table like
 * RAM), and INVALIDATE_MR withdraws such an MR's pages when their exporter
 * moves them (dma-buf move_notify): every later access through the MR
 * fails as one through an invalid key would.
 */
#define VIRTIO_VSTELLAR_F_DMABUF	13
/*
 * On-demand paging (minor 7): REG_MR with VSTELLAR_ACCESS_ON_DEMAND and no
 * pages makes an MR whose pages the driver supplies when the device asks
 * (VSTELLAR_EV_PAGE_FAULT, MAP_MR_PAGES) and takes back before it reuses
 * them (UNMAP_MR_PAGES). A driver that negotiates it posts event buffers
 * of sizeof(struct vstellar_event_page_fault) bytes.
 */
#define VIRTIO_VSTELLAR_F_ODP		14

/*
 * Every device feature bit, once: the driver negotiates this list and the
 * QEMU frontend passes it through between the guest and vstellard.
 */
#define VSTELLAR_FEATURE_LIST(X)					\
	X(VIRTIO_VSTELLAR_F_RC)						\
	X(VIRTIO_VSTELLAR_F_UD)						\
	X(VIRTIO_VSTELLAR_F_DB_SUPPRESS)				\
	X(VIRTIO_VSTELLAR_F_MULTI_CQNQ)					\
	X(VIRTIO_VSTELLAR_F_ATOMIC)					\
	X(VIRTIO_VSTELLAR_F_INLINE)					\
	X(VIRTIO_VSTELLAR_F_SRQ)					\
	X(VIRTIO_VSTELLAR_F_UC)						\
	X(VIRTIO_VSTELLAR_F_RESIZE_CQ)					\
	X(VIRTIO_VSTELLAR_F_MW)						\
	X(VIRTIO_VSTELLAR_F_MEM_MGT)					\
	X(VIRTIO_VSTELLAR_F_MCAST)					\
	X(VIRTIO_VSTELLAR_F_RESIZE_SRQ)					\
	X(VIRTIO_VSTELLAR_F_DMABUF)					\
	X(VIRTIO_VSTELLAR_F_ODP)

/* ------------------------------------------------------------------ */
/* Virtqueues                                                           */
/* ------------------------------------------------------------------ */

enum vstellar_vq {
	/* driver -> device commands; one request chain = out hdr+body, in resp */
	VSTELLAR_VQ_CONTROL = 0,
	/* device -> driver async events; driver posts writable buffers */
	VSTELLAR_VQ_EVENT = 1,
	/*
	 * Doorbell kick queue: carries no buffers. Its notify page (the
	 * device runs with page-per-vq) is mapped into user contexts; any
	 * store to it wakes vstellard through the queue's ioeventfd.
	 */
	VSTELLAR_VQ_KICK = 2,
	/* CQ notification queues: VSTELLAR_VQ_CQN0 + i, i < num_cq_queues */
	VSTELLAR_VQ_CQN0 = 3,
};
#define VSTELLAR_MAX_CQ_QUEUES		64
#define VSTELLAR_MAX_VQS		(VSTELLAR_VQ_CQN0 + VSTELLAR_MAX_CQ_QUEUES)

/* ------------------------------------------------------------------ */
/* Config space                                                         */
/* ------------------------------------------------------------------ */

/* config.device_status bits */
#define VSTELLAR_DEV_S_FATAL		(1u << 0) /* device lost state; reset it */
#define VSTELLAR_DEV_S_BACKEND_LOST	(1u << 1) /* frontend: vstellard went away */

/* Shared-memory region ids (virtio PCI capability type 8, "shm") */
#define VSTELLAR_SHM_DOORBELL		0

#define VSTELLAR_DB_PAGE_SIZE		4096

/*
 * The doorbell region is a memfd of the frontend that vhost-user's memory
 * table hands to the backend like guest RAM. The table of every vhost-user
 * device of a guest holds the doorbell regions of all its vStellar devices,
 * so the frontend names its memfd VSTELLAR_DB_MEMFD_NAME "-<id>" and gives
 * the backend the id in config.db_region_id (SET_CONFIG, minor 4).
 */
#define VSTELLAR_DB_MEMFD_NAME		"vstellar-doorbell"

struct virtio_vstellar_config {
	__le32 abi_version;		/* VSTELLAR_ABI_VERSION */
	__le32 device_status;		/* VSTELLAR_DEV_S_*, read-only */
	__le32 epoch;			/* +1 at every backend (re)connection */
	__le32 num_cq_queues;		/* CQ notification vqs, 1..64 */
	__u8 node_guid[8];		/* EUI-64, network byte order */
	__le64 page_size_cap;		/* bit n set: MR pages of 2^n supported */
	__le64 max_mr_size;		/* bytes */
	__le32 max_ucontext;
	__le32 max_pd;
	__le32 max_qp;
	__le32 max_qp_wr;		/* entries per SQ or RQ, power of two */
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_inline_data;		/* bytes */
	__le32 max_cq;
	__le32 max_cqe;			/* entries per CQ, power of two */
	__le32 max_mr;
	__le32 max_ah;
	__le32 max_qp_rd_atom;		/* outstanding RDMA reads/atomics, responder */
	__le32 max_qp_init_rd_atom;	/* ... initiator */
	__le32 max_cmd_pages;		/* page addresses in one command */
	__le32 max_msg_size;		/* bytes */
	__le32 gid_table_len;
	__le32 db_page_count;		/* pages in shm region VSTELLAR_SHM_DOORBELL */
	__le32 db_page_size;		/* VSTELLAR_DB_PAGE_SIZE */
	__le32 db_slots;		/* doorbell slots per page (see db page) */
	__le32 max_fast_reg_pages;	/* minor 3, F_MEM_MGT: pages one
					 * ALLOC_MR may ask for; 0 without */
	__le32 db_region_id;		/* minor 4, frontend to backend
					 * only (SET_CONFIG): names this
					 * device's doorbell memfd; reads 0 */
	__le16 max_mcast_grp;		/* minor 5, F_MCAST: groups one device
					 * may join; 0 (minor < 5):
					 * VSTELLAR_MAX_MCAST_GRP */
	__le16 max_mcast_qp_attach;	/* minor 5: QPs per group; 0:
					 * VSTELLAR_MAX_MCAST_QP_ATTACH */
};
VSTELLAR_ABI_SIZE(virtio_vstellar_config, 128);
VSTELLAR_ABI_OFFSET(virtio_vstellar_config, node_guid, 16);
VSTELLAR_ABI_OFFSET(virtio_vstellar_config, max_ucontext, 40);
VSTELLAR_ABI_OFFSET(virtio_vstellar_config, db_slots, 112);
VSTELLAR_ABI_OFFSET(virtio_vstellar_config, max_fast_reg_pages, 116);
VSTELLAR_ABI_OFFSET(virtio_vstellar_config, db_region_id, 120);

/* ------------------------------------------------------------------ */
/* Control queue: command header, status codes                          */
/* ------------------------------------------------------------------ */

/*
 * Every control command, described once:
 *   X(name, opcode, request body, response body, flags)
 * A body is VSTELLAR_BODY(struct tag) or VSTELLAR_NO_BODY. Flags:
 *   VSTELLAR_CMDF_PAGES     __le64 page addresses follow the body, so the
 *                           body length is a minimum, not exact;
 *   VSTELLAR_CMDF_RESERVED  the opcode is reserved: a device answers
 *                           UNSUPPORTED and a driver never sends it.
 * The opcode enum, vstellar_cmd_name(), vstellar_cmd_info() (the length
 * checks) and the device's dispatch all expand this list, so a command
 * added here reaches the driver, the provider and vstellard together.
 * Opcodes are dense from 1 (asserted below).
 */
#define VSTELLAR_NO_BODY	0
#define VSTELLAR_BODY(tag)	sizeof(struct tag)
#define VSTELLAR_CMDF_PAGES	(1u << 0)
#define VSTELLAR_CMDF_RESERVED	(1u << 1)

#define VSTELLAR_CMD_LIST(X)						\
	X(QUERY_DEVICE,	    0x01, VSTELLAR_NO_BODY,				\
	  VSTELLAR_BODY(vstellar_resp_query_device), 0)			\
	X(QUERY_PORT,	    0x02, VSTELLAR_BODY(vstellar_cmd_query_port),	\
	  VSTELLAR_BODY(vstellar_resp_query_port), 0)			\
	X(ALLOC_UCONTEXT,   0x03, VSTELLAR_NO_BODY,				\
	  VSTELLAR_BODY(vstellar_resp_alloc_ucontext), 0)		\
	X(DEALLOC_UCONTEXT, 0x04, VSTELLAR_BODY(vstellar_cmd_handle),	\
	  VSTELLAR_NO_BODY, 0)						\
	X(ALLOC_PD,	    0x05, VSTELLAR_NO_BODY,				\
	  VSTELLAR_BODY(vstellar_resp_alloc_pd), 0)			\
	X(DEALLOC_PD,	    0x06, VSTELLAR_BODY(vstellar_cmd_handle),	\
	  VSTELLAR_NO_BODY, 0)						\
	X(CREATE_CQ,	    0x07, VSTELLAR_BODY(vstellar_cmd_create_cq),	\
	  VSTELLAR_BODY(vstellar_resp_create_cq), VSTELLAR_CMDF_PAGES)	\
	/* minor 3, VIRTIO_VSTELLAR_F_RESIZE_CQ */				\
	X(RESIZE_CQ,	    0x08, VSTELLAR_BODY(vstellar_cmd_resize_cq),	\
	  VSTELLAR_BODY(vstellar_resp_resize_cq), VSTELLAR_CMDF_PAGES)	\
	X(DESTROY_CQ,	    0x09, VSTELLAR_BODY(vstellar_cmd_handle),	\
	  VSTELLAR_NO_BODY, 0)						\
	X(REQ_NOTIFY_CQ,    0x0a, VSTELLAR_BODY(vstellar_cmd_req_notify_cq), \
	  VSTELLAR_NO_BODY, 0)						\
	X(CREATE_QP,	    0x0b, VSTELLAR_BODY(vstellar_cmd_create_qp),	\
	  VSTELLAR_BODY(vstellar_resp_create_qp), VSTELLAR_CMDF_PAGES)	\
	X(MODIFY_QP,	    0x0c, VSTELLAR_BODY(vstellar_cmd_modify_qp),	\
	  VSTELLAR_NO_BODY, 0)						\
	X(QUERY_QP,	    0x0d, VSTELLAR_BODY(vstellar_cmd_handle),	\
	  VSTELLAR_BODY(vstellar_resp_query_qp), 0)			\
	X(DESTROY_QP,	    0x0e, VSTELLAR_BODY(vstellar_cmd_handle),	\
	  VSTELLAR_NO_BODY, 0)						\
	X(REG_MR,	    0x0f, VSTELLAR_BODY(vstellar_cmd_reg_mr),	\
	  VSTELLAR_BODY(vstellar_resp_reg_mr), VSTELLAR_CMDF_PAGES)	\
	X(DEREG_MR,	    0x10, VSTELLAR_BODY(vstellar_cmd_handle),	\
	  VSTELLAR_NO_BODY, 0)						\
	X(ADD_GID,	    0x11, VSTELLAR_BODY(vstellar_cmd_gid),		\
	  VSTELLAR_NO_BODY, 0)						\
	X(DEL_GID,	    0x12, VSTELLAR_BODY(vstellar_cmd_gid),		\
	  VSTELLAR_NO_BODY, 0)						\
	X(CREATE_AH,	    0x13, VSTELLAR_BODY(vstellar_cmd_create_ah),	\
	  VSTELLAR_BODY(vstellar_resp_create_ah), VSTELLAR_CMDF_RESERVED) \
	X(DESTROY_AH,	    0x14, VSTELLAR_BODY(vstellar_cmd_handle),	\
	  VSTELLAR_NO_BODY, VSTELLAR_CMDF_RESERVED)			\
	/* minor 1, VIRTIO_VSTELLAR_F_UD */					\
	X(KERNEL_DB,	    0x15, VSTELLAR_NO_BODY,				\
	  VSTELLAR_BODY(vstellar_resp_kernel_db), 0)			\
	/* minor 2, VIRTIO_VSTELLAR_F_SRQ */					\
	X(CREATE_SRQ,	    0x16, VSTELLAR_BODY(vstellar_cmd_create_srq),	\
	  VSTELLAR_BODY(vstellar_resp_create_srq), VSTELLAR_CMDF_PAGES)	\
	X(MODIFY_SRQ,	    0x17, VSTELLAR_BODY(vstellar_cmd_modify_srq),	\
	  VSTELLAR_NO_BODY, 0)						\
	X(QUERY_SRQ,	    0x18, VSTELLAR_BODY(vstellar_cmd_handle),	\
	  VSTELLAR_BODY(vstellar_resp_query_srq), 0)			\
	X(DESTROY_SRQ,	    0x19, VSTELLAR_BODY(vstellar_cmd_handle),	\
	  VSTELLAR_NO_BODY, 0)						\
	/* minor 3, VIRTIO_VSTELLAR_F_MEM_MGT */				\
	X(ALLOC_MR,	    0x1a, VSTELLAR_BODY(vstellar_cmd_alloc_mr),	\
	  VSTELLAR_BODY(vstellar_resp_reg_mr), 0)			\
	/* minor 3, VIRTIO_VSTELLAR_F_MW */					\
	X(ALLOC_MW,	    0x1b, VSTELLAR_BODY(vstellar_cmd_alloc_mw),	\
	  VSTELLAR_BODY(vstellar_resp_alloc_mw), 0)			\
	X(DEALLOC_MW,	    0x1c, VSTELLAR_BODY(vstellar_cmd_handle),	\
	  VSTELLAR_NO_BODY, 0)						\
	/* minor 3, VIRTIO_VSTELLAR_F_MCAST */				\
	X(ATTACH_MCAST,	    0x1d, VSTELLAR_BODY(vstellar_cmd_mcast),		\
	  VSTELLAR_NO_BODY, 0)						\
	X(DETACH_MCAST,	    0x1e, VSTELLAR_BODY(vstellar_cmd_mcast),		\
	  VSTELLAR_NO_BODY, 0)						\
	/* minor 3, VIRTIO_VSTELLAR_F_RESIZE_SRQ */				\
	X(RESIZE_SRQ,	    0x1f, VSTELLAR_BODY(vstellar_cmd_resize_srq),	\
	  VSTELLAR_NO_BODY, VSTELLAR_CMDF_PAGES)			\
	/* minor 6, VIRTIO_VSTELLAR_F_DMABUF */				\
	X(INVALIDATE_MR,    0x20, VSTELLAR_BODY(vstellar_cmd_handle),	\
	  VSTELLAR_NO_BODY, 0)						\
	/* minor 7, VIRTIO_VSTELLAR_F_ODP */					\
	X(MAP_MR_PAGES,	    0x21, VSTELLAR_BODY(vstellar_cmd_map_mr_pages), \
	  VSTELLAR_NO_BODY, VSTELLAR_CMDF_PAGES)			\
	X(UNMAP_MR_PAGES,   0x22, VSTELLAR_BODY(vstellar_cmd_unmap_mr_pages), \
	  VSTELLAR_NO_BODY, 0)

enum vstellar_cmd_opcode {
#define VSTELLAR_CMD_ENUM_(name, op, req, resp, flags) VSTELLAR_CMD_##name = op,
	VSTELLAR_CMD_LIST(VSTELLAR_CMD_ENUM_)
#undef VSTELLAR_CMD_ENUM_
};

/* Dense opcodes: the n-th entry of the list has opcode n + 1. */
enum vstellar_cmd_index_ {
#define VSTELLAR_CMD_INDEX_(name, op, req, resp, flags) VSTELLAR_CMD_INDEX_##name,
	VSTELLAR_CMD_LIST(VSTELLAR_CMD_INDEX_)
#undef VSTELLAR_CMD_INDEX_
	VSTELLAR_CMD_COUNT_
};
#define VSTELLAR_CMD_MAX	VSTELLAR_CMD_COUNT_
#define VSTELLAR_CMD_DENSE_(name, op, req, resp, flags)		\
	VSTELLAR_ABI_ASSERT(VSTELLAR_CMD_INDEX_##name + 1 == (op),	\
			    "opcode " #name " out of order");
VSTELLAR_CMD_LIST(VSTELLAR_CMD_DENSE_)
#undef VSTELLAR_CMD_DENSE_

/*
 * A request is one descriptor chain: device-readable part = cmd_hdr + the
 * opcode's body (+ the page list, for commands that carry one), device-
 * writable part = resp_hdr + the opcode's response body. The device reads
 * exactly hdr.length body bytes and copies them before it validates them.
 */
struct vstellar_cmd_hdr {
	__le16 opcode;		/* enum vstellar_cmd_opcode */
	__le16 flags;		/* none defined: 0 */
	__le32 cmd_id;		/* driver's cookie, echoed in the response */
	__le32 ucontext;	/* owning user context handle, 0 = kernel */
	__le32 length;		/* body bytes that follow this header */
};
VSTELLAR_ABI_SIZE(vstellar_cmd_hdr, 16);

struct vstellar_resp_hdr {
	__le16 opcode;		/* echoed */
	__le16 status;		/* enum vstellar_status */
	__le32 cmd_id;		/* echoed */
	__le32 length;		/* response body bytes written after this header */
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_resp_hdr, 16);

/*
 * Status codes. X-macro with the errno each one maps to, so the kernel and
 * userspace expand it with their own errno definitions:
 *   #define X(name, val, err) case VSTELLAR_STATUS_##name: return -err;
 */
#define VSTELLAR_STATUS_LIST(X)				\
	X(OK,		0,  0)				\
	X(BAD_OPCODE,	1,  EOPNOTSUPP)			\
	X(BAD_LENGTH,	2,  EINVAL)			\
	X(BAD_FIELD,	3,  EINVAL)			\
	X(BAD_HANDLE,	4,  ENOENT)			\
	X(BAD_STATE,	5,  EINVAL)			\
	X(NO_RESOURCES,	6,  ENOMEM)			\
	X(LIMIT,	7,  ENOSPC)			\
	X(BAD_ADDRESS,	8,  EFAULT)			\
	X(ACCESS,	9,  EACCES)			\
	X(BUSY,		10, EBUSY)			\
	X(UNSUPPORTED,	11, EOPNOTSUPP)			\
	X(DEVICE_FATAL,	12, EIO)			\
	X(INTERNAL,	13, EIO)

enum vstellar_status {
#define VSTELLAR_STATUS_ENUM_(name, val, err) VSTELLAR_STATUS_##name = val,
	VSTELLAR_STATUS_LIST(VSTELLAR_STATUS_ENUM_)
#undef VSTELLAR_STATUS_ENUM_
};

/* ------------------------------------------------------------------ */
/* Command bodies                                                       */
/* ------------------------------------------------------------------ */

/* QUERY_DEVICE: no body. Response: */
struct vstellar_resp_query_device {
	__le64 fw_version;
	__u8 sys_image_guid[8];
	__le32 vendor_id;
	__le32 vendor_part_id;
	__le32 hw_version;
	__le32 device_cap_flags;	/* VSTELLAR_DEVCAP_* */
	__le32 max_qp;
	__le32 max_qp_wr;
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_cq;
	__le32 max_cqe;
	__le32 max_mr;
	__le32 max_pd;
	__le32 max_ah;
	__le32 max_qp_rd_atom;
	__le32 max_qp_init_rd_atom;
	__le32 max_inline_data;
	__le64 max_mr_size;
	__le64 page_size_cap;
	__le32 max_srq;		/* minor 2: 0 without F_SRQ */
	__le32 max_srq_wr;
	__le32 max_srq_sge;
	__le32 max_mw;		/* minor 3: 0 without F_MW */
};
VSTELLAR_ABI_SIZE(vstellar_resp_query_device, 112);

#define VSTELLAR_DEVCAP_RC_RNR_NAK_GEN	(1u << 0)
#define VSTELLAR_DEVCAP_SYS_IMAGE_GUID	(1u << 1)

/* QUERY_PORT */
struct vstellar_cmd_query_port {
	__le32 port;		/* 1 */
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_cmd_query_port, 8);

/* Port states, MTUs: the IB numbering (ib_port_state, ib_mtu). */
struct vstellar_resp_query_port {
	__u8 state;		/* 1 DOWN .. 4 ACTIVE */
	__u8 phys_state;	/* 5 LINK_UP, 3 DISABLED */
	__u8 max_mtu;		/* IB_MTU_256 = 1 .. IB_MTU_4096 = 5 */
	__u8 active_mtu;
	__u8 active_speed;	/* IB_SPEED_* */
	__u8 active_width;	/* IB_WIDTH_* */
	__le16 reserved0;
	__le32 gid_table_len;
	__le32 port_cap_flags;
	__le32 max_msg_size;
	__le32 reserved[3];
};
VSTELLAR_ABI_SIZE(vstellar_resp_query_port, 32);

/* ALLOC_UCONTEXT: no body; hdr.ucontext must be 0. Response: */
struct vstellar_resp_alloc_ucontext {
	__le32 ucontext;	/* handle, nonzero */
	__le32 db_page;		/* index of its page in the doorbell region */
};
VSTELLAR_ABI_SIZE(vstellar_resp_alloc_ucontext, 8);

/*
 * Commands that only name one object use this body; the handle must
 * belong to hdr.ucontext: DEALLOC_UCONTEXT (handle = the ucontext,
 * hdr.ucontext = 0), DEALLOC_PD, DESTROY_CQ, DESTROY_QP, QUERY_QP,
 * DEREG_MR, DESTROY_AH. No response body.
 */
struct vstellar_cmd_handle {
	__le32 handle;
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_cmd_handle, 8);

/* ALLOC_PD: no body. Response: */
struct vstellar_resp_alloc_pd {
	__le32 pdn;
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_resp_alloc_pd, 8);

/*
 * Page list: commands that describe guest memory (CQ and QP rings, MRs)
 * are followed by num_pages __le64 guest-physical addresses, each aligned
 * to 1 << page_shift. The pages need not be contiguous.
 */

/* CREATE_CQ, followed by num_pages addresses of the CQE ring */
struct vstellar_cmd_create_cq {
	__le32 log_cqe;		/* ring of 1 << log_cqe CQEs (32 bytes each) */
	__le32 cq_queue;	/* CQ notification queue index, < num_cq_queues */
	__le32 page_shift;	/* 12 .. 30 */
	__le32 num_pages;
	__le64 ring_offset;	/* byte offset of the ring in the first page */
};
VSTELLAR_ABI_SIZE(vstellar_cmd_create_cq, 24);

struct vstellar_resp_create_cq {
	__le32 cqn;
	__le32 db_slot;		/* slot in the ucontext's doorbell page */
};
VSTELLAR_ABI_SIZE(vstellar_resp_create_cq, 8);

/*
 * RESIZE_CQ (minor 3, F_RESIZE_CQ), followed by num_pages addresses of the
 * new ring (zeroed by the driver), with the same rules as CREATE_CQ. Only
 * a CQ with a doorbell slot can be resized (BAD_STATE otherwise): the
 * device reads the consumer index ci from the slot, copies the CQEs not yet
 * polled, [ci, pi) of the old ring, oldest first, into entries 0 .. n - 1
 * of the new ring (pass 0, so their owner bit is 1), stores 0 in the
 * slot's ci, and writes the next CQE at entry n. The old ring is not read
 * or written again once the response is written. The driver must neither
 * poll the CQ nor store its ci while the command runs; afterwards it polls
 * the new ring from index 0. LIMIT when the n CQEs do not fit in the new
 * ring (IB: a CQ cannot shrink below its outstanding completions);
 * BAD_STATE when the slot's ci is not within the ring (a broken driver;
 * the CQ is unchanged). An overflowed CQ (CQ_ERR sent) stays so.
 */
struct vstellar_cmd_resize_cq {
	__le32 cqn;
	__le32 log_cqe;		/* new ring of 1 << log_cqe CQEs, <= max_cqe */
	__le32 page_shift;	/* 12 .. 30 */
	__le32 num_pages;
	__le64 ring_offset;	/* byte offset of the ring in the first page */
};
VSTELLAR_ABI_SIZE(vstellar_cmd_resize_cq, 24);

struct vstellar_resp_resize_cq {
	__le32 cqe_moved;	/* n: CQEs now at entries 0 .. n - 1 */
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_resp_resize_cq, 8);

/* REQ_NOTIFY_CQ (kernel CQs; user CQs arm through their doorbell slot) */
#define VSTELLAR_NOTIFY_NEXT_COMP	1
#define VSTELLAR_NOTIFY_SOLICITED	2
struct vstellar_cmd_req_notify_cq {
	__le32 cqn;
	__le32 flags;		/* exactly one VSTELLAR_NOTIFY_* */
};
VSTELLAR_ABI_SIZE(vstellar_cmd_req_notify_cq, 8);

/*
 * QP types: the IB numbering. UD and GSI QPs need VIRTIO_VSTELLAR_F_UD; the
 * GSI QP belongs to the kernel (hdr.ucontext 0), at most one per device: it
 * answers to QP number 1 for every GID of the device, whatever QPN
 * CREATE_QP returned, and its datagrams leave with source QP 1.
 */
#define VSTELLAR_QPT_GSI		1
#define VSTELLAR_QPT_RC			2
#define VSTELLAR_QPT_UC			3	/* F_UC (minor 3) */
#define VSTELLAR_QPT_UD			4
#define VSTELLAR_GSI_QPN		1
#define VSTELLAR_GSI_QKEY		0x80010000u
/* A UD payload is at most this many bytes (one packet). */
#define VSTELLAR_UD_MAX_PAYLOAD		4096
/*
 * Bytes in front of every UD receive: the GRH area. For IPv4 GIDs it holds
 * 20 zero bytes and then the IPv4 header (as RoCEv2 NICs write it), else an
 * IPv6 header. byte_len counts them.
 */
#define VSTELLAR_GRH_BYTES		40

/*
 * Ring limits, the same for every layer. A device's config.max_qp_wr and
 * config.max_cqe never exceed 1 << VSTELLAR_MAX_LOG_WQE and
 * 1 << VSTELLAR_MAX_LOG_CQE; within those bounds the config is the limit.
 * WQE rings stop at 2^16 entries because a CQE names its WQE in the 16-bit
 * wqe_idx.
 * A WQE slot is 1 << log_stride bytes, with log_stride between the minimum
 * of its queue (a send WQE header is 64 bytes, a receive WQE 16) and
 * VSTELLAR_MAX_LOG_STRIDE (one 4 KiB page).
 */
#define VSTELLAR_MAX_LOG_WQE		16
#define VSTELLAR_MAX_LOG_CQE		20
#define VSTELLAR_MIN_SQ_LOG_STRIDE	6
#define VSTELLAR_MIN_RQ_LOG_STRIDE	4
#define VSTELLAR_MAX_LOG_STRIDE		12

/*
 * CREATE_QP, followed by sq_pages + rq_pages addresses (SQ ring first).
 * A WQE slot is 1 << log_stride bytes; a WQE never spans slots.
 */
struct vstellar_cmd_create_qp {
	__le32 pdn;
	__le32 send_cqn;
	__le32 recv_cqn;
	__u8 qp_type;		/* VSTELLAR_QPT_* */
	__u8 sq_sig_all;
	__u8 sq_log_wqe;	/* SQ entries = 1 << sq_log_wqe */
	__u8 sq_log_stride;	/* VSTELLAR_MIN_SQ_LOG_STRIDE .. MAX */
	__u8 rq_log_wqe;
	__u8 rq_log_stride;	/* VSTELLAR_MIN_RQ_LOG_STRIDE .. MAX */
	__u8 page_shift;
	__u8 create_flags;	/* VSTELLAR_QP_CREATE_* (minor 2) */
	__le32 max_send_sge;
	__le32 max_recv_sge;
	__le32 max_inline_data;
	__le32 sq_pages;
	__le32 rq_pages;
	__le64 sq_offset;	/* byte offset of each ring in its first page */
	union {
		__le64 rq_offset;
		/* with VSTELLAR_QP_CREATE_USE_SRQ: the QP has no RQ */
		struct {
			__le32 srqn;	/* an SRQ of the same ucontext */
			__le32 reserved;
		} srq;
	};
};
VSTELLAR_ABI_SIZE(vstellar_cmd_create_qp, 56);

/*
 * The QP takes its receives from the SRQ named in srq.srqn (RC and UD QPs,
 * F_SRQ): rq_log_wqe, rq_log_stride, rq_pages and max_recv_sge are 0, and
 * the QP's doorbell slot has no meaning for rq_pi.
 */
#define VSTELLAR_QP_CREATE_USE_SRQ	(1u << 0)
#define VSTELLAR_QP_CREATE_VALID	0x01u

struct vstellar_resp_create_qp {
	__le32 qpn;
	__le32 db_slot;
	__le32 max_send_sge;	/* what the device granted */
	__le32 max_recv_sge;
	__le32 max_inline_data;
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_resp_create_qp, 24);

/* QP states: the IB numbering (ib_qp_state) */
enum vstellar_qp_state {
	VSTELLAR_QPS_RESET = 0, VSTELLAR_QPS_INIT, VSTELLAR_QPS_RTR,
	VSTELLAR_QPS_RTS, VSTELLAR_QPS_SQD, VSTELLAR_QPS_SQE, VSTELLAR_QPS_ERR,
};

/* attr_mask bits: the IB numbering (enum ib_qp_attr_mask) */
#define VSTELLAR_QP_STATE		(1u << 0)
#define VSTELLAR_QP_CUR_STATE		(1u << 1)
#define VSTELLAR_QP_ACCESS_FLAGS	(1u << 3)
#define VSTELLAR_QP_PKEY_INDEX		(1u << 4)
#define VSTELLAR_QP_PORT		(1u << 5)
#define VSTELLAR_QP_QKEY		(1u << 6)
#define VSTELLAR_QP_AV			(1u << 7)
#define VSTELLAR_QP_PATH_MTU		(1u << 8)
#define VSTELLAR_QP_TIMEOUT		(1u << 9)
#define VSTELLAR_QP_RETRY_CNT		(1u << 10)
#define VSTELLAR_QP_RNR_RETRY		(1u << 11)
#define VSTELLAR_QP_RQ_PSN		(1u << 12)
#define VSTELLAR_QP_MAX_QP_RD_ATOMIC	(1u << 13)
#define VSTELLAR_QP_MIN_RNR_TIMER	(1u << 15)
#define VSTELLAR_QP_SQ_PSN		(1u << 16)
#define VSTELLAR_QP_MAX_DEST_RD_ATOMIC	(1u << 17)
#define VSTELLAR_QP_DEST_QPN		(1u << 20)
#define VSTELLAR_QP_ATTR_MASK_VALID	0x0013bffbu

/* Access flags: the IB numbering (ib_access_flags) */
#define VSTELLAR_ACCESS_LOCAL_WRITE	(1u << 0)
#define VSTELLAR_ACCESS_REMOTE_WRITE	(1u << 1)
#define VSTELLAR_ACCESS_REMOTE_READ	(1u << 2)
#define VSTELLAR_ACCESS_REMOTE_ATOMIC	(1u << 3)
#define VSTELLAR_ACCESS_VALID		0x0000000fu
/*
 * Minor 3, F_MW: windows may be bound to the MR (REG_MR command or WQE
 * only; never a QP access flag).
 */
#define VSTELLAR_ACCESS_MW_BIND		(1u << 4)
/*
 * Minor 7, F_ODP: an on-demand MR (REG_MR only, num_pages 0, page_shift
 * 12). iova 0 with length VSTELLAR_ODP_IMPLICIT_LENGTH is an implicit MR:
 * the whole address space of the process.
 */
#define VSTELLAR_ACCESS_ON_DEMAND	(1u << 5)
#define VSTELLAR_ODP_IMPLICIT_LENGTH	(~(__u64)0)

/* Address vector (RoCEv2-style: GIDs are IPv6 or IPv4-mapped addresses) */
struct vstellar_av {
	__u8 dgid[16];
	__be32 flow_label;	/* low 20 bits */
	__u8 sgid_index;
	__u8 hop_limit;
	__u8 traffic_class;
	__u8 sl;
	__u8 dmac[6];
	__u8 reserved[2];
};
VSTELLAR_ABI_SIZE(vstellar_av, 32);

struct vstellar_qp_attr {
	__le32 attr_mask;	/* VSTELLAR_QP_*, which fields are meant */
	__u8 qp_state;
	__u8 cur_qp_state;
	__u8 path_mtu;		/* IB_MTU_* */
	__u8 port;
	__le32 qkey;
	__le32 rq_psn;		/* 24 bits */
	__le32 sq_psn;		/* 24 bits */
	__le32 dest_qpn;	/* 24 bits */
	__le32 access_flags;	/* VSTELLAR_ACCESS_* */
	__le16 pkey_index;
	__u8 max_rd_atomic;
	__u8 max_dest_rd_atomic;
	__u8 min_rnr_timer;
	__u8 timeout;
	__u8 retry_cnt;
	__u8 rnr_retry;
	__le32 reserved;
	struct vstellar_av av;
};
VSTELLAR_ABI_SIZE(vstellar_qp_attr, 72);

/* MODIFY_QP; no response body */
struct vstellar_cmd_modify_qp {
	__le32 qpn;
	__le32 reserved;
	struct vstellar_qp_attr attr;
};
VSTELLAR_ABI_SIZE(vstellar_cmd_modify_qp, 80);

/* QUERY_QP: vstellar_cmd_handle body; response: (attr_mask = all valid) */
struct vstellar_resp_query_qp {
	struct vstellar_qp_attr attr;
	__le32 sq_draining;
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_resp_query_qp, 80);

/*
 * REG_MR, followed by num_pages addresses. The MR covers [iova, iova +
 * length); iova's offset inside a page of 1 << page_shift is the offset
 * of the first byte in the first page.
 */
struct vstellar_cmd_reg_mr {
	__le32 pdn;
	__le32 access_flags;	/* VSTELLAR_ACCESS_* */
	__le64 iova;
	__le64 length;
	__le32 page_shift;	/* a bit set in page_size_cap */
	__le32 num_pages;
};
VSTELLAR_ABI_SIZE(vstellar_cmd_reg_mr, 32);

struct vstellar_resp_reg_mr {
	__le32 mrn;		/* handle for DEREG_MR */
	__le32 lkey;
	__le32 rkey;
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_resp_reg_mr, 16);

/*
 * INVALIDATE_MR (minor 6, F_DMABUF; body struct vstellar_cmd_handle): the
 * MR made by REG_MR stops granting access and forgets its pages before
 * the response is written; a WQE or an incoming request that names it
 * later fails as with an invalid key (local protection error, remote
 * access error). Windows bound to it stay bound but reach nothing. Only
 * DEREG_MR remains possible; invalidating twice is not an error. For
 * fast-registration MRs use the LOCAL_INV WQE (BAD_HANDLE here).
 */

/*
 * MAP_MR_PAGES (minor 7, F_ODP), followed by num_pages addresses: the
 * pages of an on-demand MR from iova on (page aligned, pages of 4 KiB),
 * each a guest-physical address with VSTELLAR_ODP_PAGE_WRITABLE or'ed in
 * when the device may write it (a page mapped for reading only, such as
 * the shared zero page, is never written: a write to it faults again).
 * The range lies inside the MR; a page already mapped is replaced. Every
 * access waiting on these pages is retried.
 */
#define VSTELLAR_ODP_PAGE_WRITABLE	(1ull << 0)
struct vstellar_cmd_map_mr_pages {
	__le32 mrn;
	__le32 num_pages;
	__le64 iova;
};
VSTELLAR_ABI_SIZE(vstellar_cmd_map_mr_pages, 16);

/*
 * UNMAP_MR_PAGES (minor 7, F_ODP): [iova, iova + length) of an on-demand
 * MR (page aligned; clipped to the MR) loses its pages before the
 * response is written; an access to them afterwards faults again. The
 * driver sends it from its invalidation callback, before the kernel
 * reuses the pages.
 */
struct vstellar_cmd_unmap_mr_pages {
	__le32 mrn;
	__le32 reserved;
	__le64 iova;
	__le64 length;
};
VSTELLAR_ABI_SIZE(vstellar_cmd_unmap_mr_pages, 24);

/* ADD_GID / DEL_GID (DEL_GID: only port and index are read) */
#define VSTELLAR_GID_TYPE_ROCE_V2	1
struct vstellar_cmd_gid {
	__le32 port;
	__le32 index;		/* < gid_table_len */
	__u8 gid[16];
	__le32 gid_type;	/* VSTELLAR_GID_TYPE_* */
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_cmd_gid, 32);

/*
 * CREATE_AH / DESTROY_AH: reserved. Address handles live in the driver and
 * send WQEs carry the address vector (see vstellar_send_wqe.u.ud); a device
 * answers UNSUPPORTED.
 */
struct vstellar_cmd_create_ah {
	__le32 pdn;
	__le32 reserved;
	struct vstellar_av av;
};
VSTELLAR_ABI_SIZE(vstellar_cmd_create_ah, 40);

struct vstellar_resp_create_ah {
	__le32 ah;
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_resp_create_ah, 8);

/*
 * KERNEL_DB (minor 1): no body, hdr.ucontext 0. Gives the kernel a doorbell
 * page of its own, used like a user context's: kernel CQs and QPs created
 * after it get doorbell slots in it and are served from it. Once per device
 * reset (BUSY the second time). Response:
 */
struct vstellar_resp_kernel_db {
	__le32 db_page;		/* index of the page in the doorbell region */
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_resp_kernel_db, 8);

/*
 * Shared receive queues (minor 2, F_SRQ). An SRQ is a receive ring like a
 * QP's RQ (vstellar_recv_wqe + SGEs per slot) that many RC and UD QPs of the
 * same ucontext take their receives from. The device takes SRQ WQEs in the
 * order they were posted, whichever QP a message arrives on, so completions
 * come back out of ring order; a CQE for an SRQ receive has
 * VSTELLAR_CQE_SRQ set and wqe_idx names the SRQ slot. The device copies a
 * WQE out of the ring before it uses it, so a slot may be posted again once
 * its completion has been polled: the driver keeps at most 1 << log_wqe
 * WQEs outstanding (posted, not yet completed).
 *
 * srq_limit: when it is nonzero and the number of WQEs posted but not yet
 * taken by the device falls below it, the device sends one
 * VSTELLAR_EV_SRQ_LIMIT_REACHED event for the SRQ and sets its limit to 0
 * (disarmed), as IB defines; MODIFY_SRQ arms it again.
 *
 * CREATE_SRQ, followed by num_pages addresses of the ring. The ucontext's
 * doorbell page gets a struct vstellar_db_srq slot.
 */
struct vstellar_cmd_create_srq {
	__le32 pdn;
	__u8 log_wqe;		/* 1 << log_wqe entries, <= max_qp_wr */
	__u8 log_stride;	/* VSTELLAR_MIN_RQ_LOG_STRIDE .. MAX */
	__u8 page_shift;
	__u8 reserved0;
	__le32 max_sge;		/* <= max_recv_sge */
	__le32 srq_limit;	/* < 1 << log_wqe; 0 = not armed */
	__le32 num_pages;
	__le32 reserved1;
	__le64 ring_offset;	/* byte offset of the ring in the first page */
};
VSTELLAR_ABI_SIZE(vstellar_cmd_create_srq, 32);

struct vstellar_resp_create_srq {
	__le32 srqn;
	__le32 db_slot;		/* struct vstellar_db_srq in the doorbell page */
	__le32 max_sge;		/* what the device granted */
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_resp_create_srq, 16);

/* MODIFY_SRQ: attr_mask bits, the IB numbering (ib_srq_attr_mask) */
#define VSTELLAR_SRQ_MAX_WR		(1u << 0) /* resizing: RESIZE_SRQ instead */
#define VSTELLAR_SRQ_LIMIT		(1u << 1)
struct vstellar_cmd_modify_srq {
	__le32 srqn;
	__le32 attr_mask;	/* VSTELLAR_SRQ_LIMIT only */
	__le32 srq_limit;
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_cmd_modify_srq, 16);

/*
 * RESIZE_SRQ (minor 3, F_RESIZE_SRQ), followed by num_pages addresses of
 * the new ring: 1 << log_wqe slots of the SRQ's stride, zeroed by the
 * driver. The device first takes every WQE posted in the old ring (up to
 * the slot's pi) as it would anyway, then reads WQEs from the new ring;
 * indices stay free-running, so the next WQE is at pi & ((1 << log_wqe) -
 * 1) of the new ring, and wqe_idx in later CQEs names slots of it. The
 * driver must not post to the SRQ while the command runs, and it keeps at
 * most 1 << log_wqe WQEs outstanding from then on. LIMIT beyond max_srq_wr;
 * BAD_FIELD when the new ring cannot hold the WQEs posted and not yet
 * taken by a QP, or the armed limit; BAD_STATE for a failed SRQ or a pi
 * the device cannot take up to. On failure the SRQ is unchanged (except
 * that posted WQEs may have been taken).
 */
struct vstellar_cmd_resize_srq {
	__le32 srqn;
	__u8 log_wqe;
	__u8 page_shift;
	__le16 reserved0;
	__le32 num_pages;
	__le32 reserved1;
	__le64 ring_offset;	/* byte offset of the ring in the first page */
};
VSTELLAR_ABI_SIZE(vstellar_cmd_resize_srq, 24);

/* QUERY_SRQ: vstellar_cmd_handle body; response: */
struct vstellar_resp_query_srq {
	__le32 max_wr;		/* 1 << log_wqe */
	__le32 max_sge;
	__le32 srq_limit;	/* 0 once the limit event fired */
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_resp_query_srq, 16);

/*
 * Keys (minor 3). Every lkey and rkey is (index << 8) | key byte. The
 * device picks the 24-bit index of an MR or a window from a CSPRNG when
 * it creates the object and never changes it while the object lives; it
 * is how a key names its object. The key byte is random at creation too;
 * afterwards the consumer may choose it at each registration (REG_MR WQE,
 * ib_update_fast_reg_key) or bind (BIND_MW: ibv_inc_rkey), so a stale key
 * of a re-registered object no longer matches. An access whose key's
 * index names no object, or whose key byte is not the current one, is a
 * protection error (local) or a remote access error NAK (remote).
 */
#define VSTELLAR_KEY_INDEX(key)		((key) >> 8)
#define VSTELLAR_KEY_BYTE(key)		((key) & 0xffu)

/*
 * ALLOC_MR (minor 3, F_MEM_MGT, kernel only: hdr.ucontext 0, else ACCESS):
 * a fast-registration MR of the PD that can later map up to max_num_pages
 * pages (1 .. config.max_fast_reg_pages). It starts FREE: no translation,
 * every access fails until a REG_MR WQE makes it VALID. lkey == rkey.
 * Response: struct vstellar_resp_reg_mr; DEREG_MR frees it.
 */
struct vstellar_cmd_alloc_mr {
	__le32 pdn;
	__le32 max_num_pages;
	__le32 reserved[2];
};
VSTELLAR_ABI_SIZE(vstellar_cmd_alloc_mr, 16);

/*
 * ALLOC_MW (minor 3, F_MW): a memory window of the PD, IB type 1 or 2
 * (type 2 is IB's 2B: usable only through the QP it was bound on).
 * Type 1 starts VALID and unbound, type 2 FREE. DEALLOC_MW (cmd_handle)
 * frees a window, bound or not; its rkey stops working at once.
 */
#define VSTELLAR_MW_TYPE_1		1
#define VSTELLAR_MW_TYPE_2		2
struct vstellar_cmd_alloc_mw {
	__le32 pdn;
	__le32 type;		/* VSTELLAR_MW_TYPE_* */
};
VSTELLAR_ABI_SIZE(vstellar_cmd_alloc_mw, 8);

struct vstellar_resp_alloc_mw {
	__le32 mwn;		/* handle for DEALLOC_MW */
	__le32 rkey;		/* current rkey; binds change its key byte */
};
VSTELLAR_ABI_SIZE(vstellar_resp_alloc_mw, 8);

/*
 * UD multicast (minor 3, F_MCAST). ATTACH_MCAST attaches UD QP qpn of
 * hdr.ucontext to the group mgid, DETACH_MCAST detaches it; no response
 * body. A group is a RoCEv2 multicast GID: an IPv4-mapped address in
 * 224.0.0.0/4 or an IPv6 one in ff00::/8 (what rdma_cm makes for a
 * multicast address); anything else is BAD_FIELD, as is a QP that is not UD (GSI included).
 * Attaching a QP twice is OK; detaching one that is not attached is
 * BAD_FIELD. A device supports config.max_mcast_grp groups and
 * config.max_mcast_qp_attach QPs per group (LIMIT beyond; at most
 * VSTELLAR_MAX_MCAST_GRP and VSTELLAR_MAX_MCAST_QP_ATTACH, which a
 * device of minor < 5 supports). A UD send
 * WQE whose av.dgid is such a group goes to every QP attached to it, on
 * this device and any other the fabric reaches (docs/transport.md), whose
 * Q_Key matches; remote_qpn is not looked at.
 */
#define VSTELLAR_MAX_MCAST_GRP		256
#define VSTELLAR_MAX_MCAST_QP_ATTACH	64
struct vstellar_cmd_mcast {
	__le32 qpn;
	__le16 mlid;		/* IB LID of the group: ignored (RoCE) */
	__le16 reserved;
	__u8 mgid[16];
};
VSTELLAR_ABI_SIZE(vstellar_cmd_mcast, 24);

/*
 * Local DMA lkey (minor 1): in an SGE of a kernel QP (hdr.ucontext 0) this
 * lkey means "addr is a guest-physical address", for local access only.
 * Never valid for a user QP. No MR key ever has this value.
 */
#define VSTELLAR_LOCAL_DMA_LKEY		0

/* What a command's request and response look like (from VSTELLAR_CMD_LIST). */
struct vstellar_cmd_info {
	const char *name;	/* "CREATE_QP" */
	__u32 req_len;		/* body bytes; a minimum with VSTELLAR_CMDF_PAGES */
	__u32 resp_len;		/* response body bytes */
	__u32 flags;		/* VSTELLAR_CMDF_* */
};

/* The description of opcode op, or NULL if no command has it. */
static inline const struct vstellar_cmd_info *vstellar_cmd_info(unsigned int op)
{
	static const struct vstellar_cmd_info table[VSTELLAR_CMD_MAX] = {
#define VSTELLAR_CMD_INFO_(name, op, req, resp, flags) \
		{ #name, (__u32)(req), (__u32)(resp), (flags) },
		VSTELLAR_CMD_LIST(VSTELLAR_CMD_INFO_)
#undef VSTELLAR_CMD_INFO_
	};

	return (op >= 1 && op <= VSTELLAR_CMD_MAX) ? &table[op - 1] : (const struct vstellar_cmd_info *)0;
}

/* A command's name for messages ("CREATE_QP"), "UNKNOWN" for a bad opcode. */
static inline const char *vstellar_cmd_name(unsigned int op)
{
	const struct vstellar_cmd_info *info = vstellar_cmd_info(op);

	return info ? info->name : "UNKNOWN";
}

/* ------------------------------------------------------------------ */
/* Event queue and CQ notification queues                               */
/* ------------------------------------------------------------------ */

/* Async event types (numbered like enum ib_event_type where one exists) */
enum vstellar_event_type {
	VSTELLAR_EV_CQ_ERR		= 0,
	VSTELLAR_EV_QP_FATAL		= 1,
	VSTELLAR_EV_QP_REQ_ERR		= 2,
	VSTELLAR_EV_QP_ACCESS_ERR	= 3,
	VSTELLAR_EV_COMM_EST		= 4,
	VSTELLAR_EV_SQ_DRAINED		= 5,
	VSTELLAR_EV_DEVICE_FATAL	= 8,
	VSTELLAR_EV_PORT_ACTIVE		= 9,
	VSTELLAR_EV_PORT_ERR		= 10,
	VSTELLAR_EV_SRQ_ERR		= 14,	/* object = SRQN (minor 2) */
	VSTELLAR_EV_SRQ_LIMIT_REACHED	= 15,	/* object = SRQN (minor 2) */
	VSTELLAR_EV_QP_LAST_WQE_REACHED	= 16,	/* QP on an SRQ entered ERR */
	VSTELLAR_EV_GID_CHANGE		= 18,
	/* minor 7, F_ODP: struct vstellar_event_page_fault, object = MRN */
	VSTELLAR_EV_PAGE_FAULT		= 64,
};

/* One per eventq buffer (driver posts writable buffers >= 16 bytes) */
struct vstellar_event {
	__le16 type;		/* enum vstellar_event_type */
	__le16 reserved0;
	__le32 object;		/* QPN, CQN, SRQN or port, by type; 0 for device */
	__le32 ucontext;	/* owner of object, 0 = kernel or device */
	__le32 info;		/* VSTELLAR_STATUS_* or WC status that caused it */
};
VSTELLAR_ABI_SIZE(vstellar_event, 16);

/*
 * Minor 7, F_ODP: an access met pages of an on-demand MR that are not
 * mapped (or mapped read-only, for a write). The driver answers with
 * MAP_MR_PAGES, or with nothing if the process has no such memory: the
 * access then fails after the device's fault timeout. The device asks for
 * a page once, and again only after a while without an answer; faults of
 * the same pages waiting in the queue merge.
 */
#define VSTELLAR_FAULT_WRITE		(1u << 0)
struct vstellar_event_page_fault {
	__le16 type;		/* VSTELLAR_EV_PAGE_FAULT */
	__le16 flags;		/* VSTELLAR_FAULT_* */
	__le32 object;		/* MRN */
	__le32 ucontext;
	__le32 num_pages;	/* pages of 4 KiB the access needs, >= 1 */
	__le64 iova;		/* first missing page, page aligned */
	__le64 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_event_page_fault, 32);
/* Its first 16 bytes read as a struct vstellar_event. */
VSTELLAR_ABI_OFFSET(vstellar_event_page_fault, object, 4);
VSTELLAR_ABI_OFFSET(vstellar_event_page_fault, ucontext, 8);
VSTELLAR_ABI_OFFSET(vstellar_event_page_fault, iova, 16);

/* One per CQ notification buffer: an armed CQ got a completion */
struct vstellar_cq_notify {
	__le32 cqn;
	__le32 ucontext;
};
VSTELLAR_ABI_SIZE(vstellar_cq_notify, 8);

/* ------------------------------------------------------------------ */
/* Doorbell page (one per user context, in shm region VSTELLAR_SHM_DOORBELL) */
/* ------------------------------------------------------------------ */

/*
 * The first 64 bytes are the header; the rest are 8-byte slots, handed out
 * by CREATE_QP and CREATE_CQ (db_slot is the slot's index in the page,
 * VSTELLAR_DB_FIRST_SLOT .. db_slots - 1). All indices are free-running
 * 32-bit counters; ring position = index & (entries - 1).
 */
struct vstellar_db_page_hdr {
	__le32 need_kick;	/* device: nonzero = store to the kick page after
				 * the next index update (notification suppression) */
	__le32 alive;		/* minor 4, device: VSTELLAR_DB_ALIVE from
				 * ALLOC_UCONTEXT on; reads 0 once the guest kernel
				 * has cut the page's mappings (device removed) */
	__le32 reserved[14];
};
#define VSTELLAR_DB_ALIVE		0x4c545356u	/* "VSTL" */
VSTELLAR_ABI_SIZE(vstellar_db_page_hdr, 64);

struct vstellar_db_qp {
	__le32 sq_pi;		/* SQ producer index (WQEs posted) */
	__le32 rq_pi;		/* RQ producer index */
};
VSTELLAR_ABI_SIZE(vstellar_db_qp, 8);

#define VSTELLAR_CQ_ARM_SOLICITED	(1u << 31)
struct vstellar_db_cq {
	__le32 ci;		/* CQ consumer index (CQEs polled) */
	__le32 arm;		/* bit 31 solicited-only; bits 0..30 arm sequence:
				 * armed while != the device's last seen value */
};
VSTELLAR_ABI_SIZE(vstellar_db_cq, 8);

/* SRQ slot (minor 2): the driver writes pi; the second word is reserved. */
struct vstellar_db_srq {
	__le32 pi;		/* SRQ producer index (WQEs posted) */
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_db_srq, 8);

#define VSTELLAR_DB_SLOT_SIZE		8
#define VSTELLAR_DB_FIRST_SLOT		(sizeof(struct vstellar_db_page_hdr) / VSTELLAR_DB_SLOT_SIZE)
#define VSTELLAR_DB_SLOTS_PER_PAGE	(VSTELLAR_DB_PAGE_SIZE / VSTELLAR_DB_SLOT_SIZE)

/* ------------------------------------------------------------------ */
/* Data path: SGE, WQEs, CQE                                            */
/* ------------------------------------------------------------------ */

struct vstellar_sge {
	__le64 addr;		/* in the MR's iova space */
	__le32 length;
	__le32 lkey;
};
VSTELLAR_ABI_SIZE(vstellar_sge, 16);

enum vstellar_wr_opcode {
	VSTELLAR_WR_RDMA_WRITE		= 0,
	VSTELLAR_WR_RDMA_WRITE_IMM	= 1,
	VSTELLAR_WR_SEND		= 2,
	VSTELLAR_WR_SEND_IMM		= 3,
	VSTELLAR_WR_RDMA_READ		= 4,
	VSTELLAR_WR_ATOMIC_CMP_SWP	= 5,
	VSTELLAR_WR_ATOMIC_FETCH_ADD	= 6,
	/* minor 3: F_MEM_MGT (REG_MR, LOCAL_INV of MRs, SEND_WITH_INV),
	 * F_MW (BIND_MW, LOCAL_INV and SEND_WITH_INV of type 2 windows) */
	VSTELLAR_WR_LOCAL_INV		= 7,
	VSTELLAR_WR_SEND_WITH_INV	= 8,
	VSTELLAR_WR_REG_MR		= 9,
	VSTELLAR_WR_BIND_MW		= 10,
};

#define VSTELLAR_WQE_SIGNALED		(1u << 0)
#define VSTELLAR_WQE_SOLICITED		(1u << 1)
#define VSTELLAR_WQE_INLINE		(1u << 2)
#define VSTELLAR_WQE_FENCE		(1u << 3)

/* Send WQE: this header, then num_sge SGEs or inline_len bytes of data */
struct vstellar_send_wqe {
	__le64 wr_id;
	__u8 opcode;		/* enum vstellar_wr_opcode */
	__u8 flags;		/* VSTELLAR_WQE_* */
	__u8 num_sge;
	__u8 reserved0;
	__le32 inline_len;
	union {
		__be32 imm_data;	/* *_IMM */
		/* LOCAL_INV, SEND_WITH_INV: the key to invalidate */
		__le32 invalidate_rkey;
	};
	__le32 reserved1;
	union {
		struct {
			__le64 remote_addr;
			__le32 rkey;
			__le32 reserved;
		} rdma;
		struct {
			__le64 remote_addr;
			__le32 rkey;
			__le32 reserved;
			__le64 compare_add;
			__le64 swap;
		} atomic;
		/*
		 * UD and GSI: the address vector travels in the WQE (no AH
		 * object in the device), so posting never waits for a
		 * command. remote_qkey with bit 31 set means "the QP's own
		 * Q_Key", as in IB.
		 */
		struct {
			struct vstellar_av av;
			__le32 remote_qpn;
			__le32 remote_qkey;
		} ud;
		/*
		 * REG_MR (kernel QPs only): map the fast-registration MR
		 * named by key's index to [iova, iova + length), the pages
		 * listed at page_list (npages __le64 guest-physical
		 * addresses, each aligned to 1 << page_shift; the list
		 * itself is contiguous guest-physical memory, 8-byte
		 * aligned). iova's offset in a page is the offset of the
		 * first byte in the first page. key becomes the MR's lkey
		 * and rkey. No SGEs.
		 */
		struct {
			__le64 iova;
			__le64 length;
			__le64 page_list;
			__le32 npages;		/* <= the MR's max_num_pages */
			__le32 key;
			__le32 access;		/* VSTELLAR_ACCESS_* */
			__u8 page_shift;	/* a bit of page_size_cap */
			__u8 reserved[3];
		} reg_mr;
		/*
		 * BIND_MW: bind the window whose current rkey is mw_rkey to
		 * [addr, addr + length) of the MR mr_lkey, with the remote
		 * access rights in access; new_rkey (same index, the
		 * consumer's key byte) becomes its rkey. mw_type says what
		 * the poster meant (type 1: the ibv_bind_mw verb, type 2: a
		 * work request); it must be the window's type. length 0
		 * unbinds a type 1 window. No SGEs.
		 */
		struct {
			__le64 addr;
			__le64 length;
			__le32 mw_rkey;
			__le32 new_rkey;
			__le32 mr_lkey;
			__le32 access;		/* VSTELLAR_ACCESS_REMOTE_* */
			__u8 mw_type;		/* VSTELLAR_MW_TYPE_* */
			__u8 reserved[7];
		} bind_mw;
		__u8 raw[40];
	} u;
};
VSTELLAR_ABI_SIZE(vstellar_send_wqe, 64);
VSTELLAR_ABI_OFFSET(vstellar_send_wqe, invalidate_rkey, 16);
VSTELLAR_ABI_OFFSET(vstellar_send_wqe, u.reg_mr.page_shift, 60);
VSTELLAR_ABI_OFFSET(vstellar_send_wqe, u.bind_mw.mw_type, 56);

/* Receive WQE: this header, then num_sge SGEs */
struct vstellar_recv_wqe {
	__le64 wr_id;
	__le32 num_sge;
	__le32 reserved;
};
VSTELLAR_ABI_SIZE(vstellar_recv_wqe, 16);

/* WC opcodes and statuses: the ibv_wc_opcode / ibv_wc_status numbering */
enum vstellar_wc_opcode {
	VSTELLAR_WC_SEND		= 0,
	VSTELLAR_WC_RDMA_WRITE		= 1,
	VSTELLAR_WC_RDMA_READ		= 2,
	VSTELLAR_WC_COMP_SWAP		= 3,
	VSTELLAR_WC_FETCH_ADD		= 4,
	VSTELLAR_WC_BIND_MW		= 5,	/* minor 3 */
	VSTELLAR_WC_LOCAL_INV		= 6,	/* minor 3 */
	/*
	 * Minor 3: a REG_MR WQE completed. ibv_wc_opcode has no such value
	 * and the kernel's IB_WC_REG_MR moved between releases, so the
	 * number is outside both; the driver maps it to IB_WC_REG_MR.
	 */
	VSTELLAR_WC_REG_MR		= 64,
	VSTELLAR_WC_RECV		= 128,
	VSTELLAR_WC_RECV_RDMA_WITH_IMM	= 129,
};

#define VSTELLAR_CQE_OWNER		(1u << 0) /* phase bit, in cqe.owner */
#define VSTELLAR_CQE_WITH_IMM		(1u << 0) /* in cqe.wc_flags */
#define VSTELLAR_CQE_GRH		(1u << 1) /* UD receive: GRH area filled */
#define VSTELLAR_CQE_SRQ		(1u << 2) /* receive from the QP's SRQ:
						   * wqe_idx is the SRQ slot */
/*
 * With VSTELLAR_CQE_GRH: the GRH area holds an IPv4 header (RoCEv2 over
 * IPv4), else an IPv6 one. RoCE NICs report this in the completion
 * (IBTA Annex A17.4.5.1); libibverbs has no field for it, so providers
 * put the mlx5 packet type in ibv_wc.sl (2 = IPv4, 1 = IPv6), which is
 * where UCX's ud_verbs looks before it checks a datagram's destination.
 */
#define VSTELLAR_CQE_GRH_IPV4		(1u << 3)
/*
 * Minor 3: a receive of SEND_WITH_INV; the device invalidated the key in
 * cqe.invalidated_rkey (ibv_wc.invalidated_rkey, IBV_WC_WITH_INV).
 */
#define VSTELLAR_CQE_WITH_INV		(1u << 4)

/*
 * CQE, 32 bytes. The device writes everything, then (release) the owner
 * byte. On pass p over the ring (p = index >> log_cqe) a valid CQE has
 * owner bit == !(p & 1); the ring starts zeroed, so the first pass writes 1.
 */
struct vstellar_cqe {
	__le64 wr_id;
	__le32 qpn;
	__le32 byte_len;
	union {
		__be32 imm_data;		/* VSTELLAR_CQE_WITH_IMM */
		__le32 invalidated_rkey;	/* VSTELLAR_CQE_WITH_INV */
	};
	__le32 src_qp;		/* UD receives */
	__le16 wqe_idx;		/* low 16 bits of the completed WQE's index */
	__u8 opcode;		/* enum vstellar_wc_opcode */
	__u8 status;		/* ibv_wc_status */
	__u8 vendor_err;
	__u8 wc_flags;		/* VSTELLAR_CQE_WITH_IMM, ... */
	__u8 reserved;
	__u8 owner;		/* VSTELLAR_CQE_OWNER */
};
VSTELLAR_ABI_SIZE(vstellar_cqe, 32);
VSTELLAR_ABI_OFFSET(vstellar_cqe, owner, 31);
VSTELLAR_ABI_OFFSET(vstellar_cqe, invalidated_rkey, 16);

#endif /* VSTELLAR_VIRTIO_VSTELLAR_H */
