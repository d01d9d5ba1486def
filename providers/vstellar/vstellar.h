/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * vStellar rdma-core provider: objects and the uverbs command wrappers.
 * The device interface (rings, WQEs, CQEs, doorbell page) is
 * include/vstellar/virtio_vstellar.h, the driver's udata ABI
 * include/vstellar/vstellar-abi.h; see docs/provider.md.
 */
#ifndef VSTELLAR_PROVIDER_H
#define VSTELLAR_PROVIDER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <infiniband/driver.h>
#include <util/util.h>

#include <vstellar/virtio_vstellar.h>
#include <vstellar/vstellar-abi.h>

/*
 * Command wrappers: the core uverbs request/response, then our driver
 * payload (what DECLARE_DRV_CMD would declare for an in-tree kernel ABI
 * header; ours lives out of rdma-core's kernel-headers/).
 */
struct vstellar_get_context_cmd {
	struct ibv_get_context ibv_cmd;
};

struct vstellar_get_context_cmd_resp {
	struct ib_uverbs_get_context_resp ibv_resp;
	struct vstellar_alloc_ucontext_resp drv;
};

struct vstellar_create_cq_cmd {
	struct ibv_create_cq ibv_cmd;
	struct vstellar_create_cq drv;
};

struct vstellar_create_cq_cmd_resp {
	struct ib_uverbs_create_cq_resp ibv_resp;
	struct vstellar_create_cq_resp drv;
};

struct vstellar_create_cq_ex_cmd {
	struct ibv_create_cq_ex ibv_cmd;
	struct vstellar_create_cq drv;
};

struct vstellar_create_cq_ex_cmd_resp {
	struct ib_uverbs_ex_create_cq_resp ibv_resp;
	struct vstellar_create_cq_resp drv;
};

struct vstellar_resize_cq_cmd {
	struct ibv_resize_cq ibv_cmd;
	struct vstellar_resize_cq drv;
};

struct vstellar_resize_cq_cmd_resp {
	struct ib_uverbs_resize_cq_resp ibv_resp;
	struct vstellar_resize_cq_resp drv;
};

struct vstellar_modify_srq_cmd {
	struct ibv_modify_srq ibv_cmd;
	struct vstellar_modify_srq drv;
};

struct vstellar_create_qp_cmd {
	struct ibv_create_qp ibv_cmd;
	struct vstellar_create_qp drv;
};

struct vstellar_create_qp_cmd_resp {
	struct ib_uverbs_create_qp_resp ibv_resp;
	struct vstellar_create_qp_resp drv;
};

struct vstellar_create_srq_cmd {
	struct ibv_create_srq ibv_cmd;
	struct vstellar_create_srq drv;
};

struct vstellar_create_srq_cmd_resp {
	struct ib_uverbs_create_srq_resp ibv_resp;
	struct vstellar_create_srq_resp drv;
};

struct vstellar_create_ah_cmd_resp {
	struct ib_uverbs_create_ah_resp ibv_resp;
	struct vstellar_create_ah_resp drv;
};

struct vstellar_device {
	struct verbs_device ibv_dev;
};

struct vstellar_qp;

#define VSTELLAR_QP_TABLE_SIZE 256	/* buckets; QPN % size */
/*
 * Smallest CQ ring (64 CQEs, 2 KiB), as hardware providers round CQs up:
 * completions of work already posted may still be on their way when an
 * application resizes a CQ down to what it has polled (pyverbs'
 * test_resize_cq does), and a ring that small would overflow.
 */
#define VSTELLAR_MIN_LOG_CQE 6

struct vstellar_context {
	struct verbs_context ibv_ctx;
	uint32_t ucontext;
	uint32_t features;		/* VIRTIO_VSTELLAR_F_* negotiated */
	uint32_t max_qp_wr;
	uint32_t max_cqe;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
	uint32_t num_cq_queues;
	uint32_t min_sq_log_stride;
	uint32_t min_rq_log_stride;
	uint32_t db_slots;
	void *db_page;			/* mmapped doorbell page (cacheable) */
	size_t db_page_size;
	void *kick_page;		/* mmapped kick page (uncached) or NULL */
	bool db_suppress;		/* need_kick is maintained by the device */
	bool db_alive;			/* the device keeps hdr->alive (1.4) */

	pthread_mutex_t qp_table_lock;
	struct vstellar_qp *qp_table[VSTELLAR_QP_TABLE_SIZE];
};

struct vstellar_pd {
	struct ibv_pd ibv_pd;
};

struct vstellar_cq {
	struct verbs_cq vcq;
	pthread_spinlock_t lock;
	struct vstellar_cqe *ring;
	size_t ring_size;		/* bytes mapped for the ring */
	uint32_t log_cqe;
	uint32_t cqn;
	uint32_t ci;			/* free-running consumer index */
	uint32_t arm_seq;		/* bits 0..30 of the last arm */
	struct vstellar_db_cq *db;	/* slot in the doorbell page */
	struct vstellar_qp *last_qp;	/* lookup cache for poll */
	struct vstellar_cqe *cur;	/* extended poll: the CQE being read */
	uint32_t bad_cqes;		/* CQEs skipped: no outstanding WQE */
};

struct vstellar_wq {
	void *ring;
	size_t ring_size;
	uint32_t log_wqe;
	uint32_t log_stride;
	uint32_t pi;			/* free-running producer index */
	uint32_t ci;			/* retired (completed) index; for an SRQ,
					 * the number of completed WQEs */
	uint32_t max_sge;
	pthread_spinlock_t lock;
};

/*
 * An SRQ: a receive ring shared by QPs. The device takes its WQEs in
 * posting order but they complete out of order (many QPs), so a slot is
 * free again once as many completions as posts before it were polled:
 * wq.ci counts completions, and wq.pi - wq.ci WQEs are outstanding.
 */
struct vstellar_srq {
	struct verbs_srq vsrq;
	uint32_t srqn;
	struct vstellar_wq wq;
	struct vstellar_db_srq *db;
};

struct vstellar_qp {
	struct verbs_qp vqp;
	uint32_t qpn;
	struct vstellar_srq *srq;	/* receives come from it; rq unused */
	bool sq_sig_all;
	uint32_t max_inline_data;
	struct vstellar_wq sq;
	struct vstellar_wq rq;
	struct vstellar_db_qp *db;
	struct vstellar_qp *hash_next;
	/* extended post (ibv_wr_*): state between wr_start and wr_complete */
	uint32_t wr_start_pi;
	int wr_err;
	struct vstellar_send_wqe *wr_cur;
};

struct vstellar_ah {
	struct ibv_ah ibv_ah;
	struct vstellar_av av;	/* copied into every UD WQE that names it */
};

static inline struct vstellar_context *to_vctx(struct ibv_context *ibctx)
{
	return container_of(ibctx, struct vstellar_context, ibv_ctx.context);
}

/*
 * Whether the device went away (hot unplug): the kernel then replaces the
 * doorbell page's mapping by a zeroed page, so the alive word the device
 * set reads 0. Rings live in the process's memory and would just stay
 * empty, so an empty poll checks this to fail instead of waiting forever.
 */
static inline bool vstellar_device_gone(struct vstellar_context *ctx)
{
	const struct vstellar_db_page_hdr *hdr = ctx->db_page;

	return ctx->db_alive &&
	       atomic_load_explicit((_Atomic(uint32_t) *)&hdr->alive,
				    memory_order_relaxed) != htole32(VSTELLAR_DB_ALIVE);
}

static inline struct vstellar_cq *to_vcq(struct ibv_cq *ibcq)
{
	return container_of(ibcq, struct vstellar_cq, vcq.cq);
}

static inline struct vstellar_qp *to_vqp(struct ibv_qp *ibqp)
{
	return container_of(ibqp, struct vstellar_qp, vqp.qp);
}

static inline struct vstellar_qp *qpex_to_vqp(struct ibv_qp_ex *qpex)
{
	return container_of(qpex, struct vstellar_qp, vqp.qp_ex);
}

static inline struct vstellar_srq *to_vsrq(struct ibv_srq *ibsrq)
{
	return container_of(ibsrq, struct vstellar_srq, vsrq.srq);
}

static inline struct vstellar_ah *to_vah(struct ibv_ah *ibah)
{
	return container_of(ibah, struct vstellar_ah, ibv_ah);
}

/*
 * What the provider's files share: vstellar.c (device, context, the ops
 * table), verbs.c (control verbs), cq.c (polling), qp.c (posting and the
 * QP table). Calls go one way: verbs.c and cq.c use qp.c, verbs.c uses
 * cq.c; qp.c uses neither.
 */
#define VSTELLAR_SEND_OPS                                                      \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |      \
	 IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |                  \
	 IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |        \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | VSTELLAR_SEND_OPS_MW)
/* ... of them, those that need memory windows (F_MW) */
#define VSTELLAR_SEND_OPS_MW                                                   \
	(IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV |                   \
	 IBV_QP_EX_WITH_SEND_WITH_INV)

/* Ring slot @idx of a work queue (any index: rings wrap). */
static inline void *vstellar_wq_slot(struct vstellar_wq *wq, uint32_t idx)
{
	return (char *)wq->ring +
	       ((size_t)(idx & ((1U << wq->log_wqe) - 1)) << wq->log_stride);
}

/* No free slot: every slot holds a WQE that has not completed yet. */
static inline bool vstellar_wq_full(struct vstellar_wq *wq)
{
	uint32_t ci = atomic_load_explicit((_Atomic(uint32_t) *)&wq->ci,
					   memory_order_relaxed);

	return wq->pi - ci >= (1U << wq->log_wqe);
}

/* The ibv_wc_flags_ex an extended CQ can report (no timestamps). */
#define VSTELLAR_CQ_EX_WC_FLAGS                                                \
	(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM |                        \
	 IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |                       \
	 IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |                             \
	 IBV_WC_EX_WITH_DLID_PATH_BITS)

/* verbs.c */
struct ibv_pd *vstellar_alloc_pd(struct ibv_context *context);
int vstellar_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *vstellar_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
			       uint64_t hca_va, int access);
struct ibv_mr *vstellar_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				      size_t length, uint64_t iova, int fd,
				      int access);
int vstellar_dereg_mr(struct verbs_mr *vmr);
int vstellar_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice,
		       uint32_t flags, struct ibv_sge *sg_list,
		       uint32_t num_sge);
struct ibv_mw *vstellar_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int vstellar_dealloc_mw(struct ibv_mw *mw);
struct ibv_cq *vstellar_create_cq(struct ibv_context *context, int cqe,
				  struct ibv_comp_channel *channel,
				  int comp_vector);
struct ibv_cq_ex *vstellar_create_cq_ex(struct ibv_context *context,
					struct ibv_cq_init_attr_ex *attr);
int vstellar_destroy_cq(struct ibv_cq *ibcq);
int vstellar_resize_cq(struct ibv_cq *ibcq, int cqe);
struct ibv_qp *vstellar_create_qp(struct ibv_pd *pd,
				  struct ibv_qp_init_attr *attr);
struct ibv_qp *vstellar_create_qp_ex(struct ibv_context *context,
				     struct ibv_qp_init_attr_ex *attr);
int vstellar_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		      int attr_mask, struct ibv_qp_init_attr *init_attr);
int vstellar_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		       int attr_mask);
int vstellar_destroy_qp(struct ibv_qp *ibqp);
struct ibv_ah *vstellar_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr);
struct ibv_srq *vstellar_create_srq(struct ibv_pd *pd,
				    struct ibv_srq_init_attr *attr);
int vstellar_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
			int attr_mask);
int vstellar_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr);
int vstellar_destroy_srq(struct ibv_srq *ibsrq);
int vstellar_destroy_ah(struct ibv_ah *ibah);

/* cq.c */
int vstellar_poll_cq(struct ibv_cq *ibcq, int ne, struct ibv_wc *wc);
int vstellar_req_notify_cq(struct ibv_cq *ibcq, int solicited_only);
void vstellar_cq_ex_init(struct vstellar_cq *cq, uint64_t wc_flags);

/* qp.c */
int vstellar_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		       struct ibv_send_wr **bad_wr);
int vstellar_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		       struct ibv_recv_wr **bad_wr);
int vstellar_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
			   struct ibv_recv_wr **bad_wr);
int vstellar_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw,
		     struct ibv_mw_bind *mw_bind);
void vstellar_qp_ex_init(struct vstellar_qp *qp, uint64_t ops);
void vstellar_qp_table_init(struct vstellar_context *ctx);
void vstellar_qp_table_fini(struct vstellar_context *ctx);
void vstellar_qp_table_insert(struct vstellar_context *ctx,
			      struct vstellar_qp *qp);
void vstellar_qp_table_remove(struct vstellar_context *ctx,
			      struct vstellar_qp *qp);
struct vstellar_qp *vstellar_qp_table_lookup(struct vstellar_context *ctx,
					     uint32_t qpn);

#endif /* VSTELLAR_PROVIDER_H */
