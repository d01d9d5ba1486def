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

struct vstellar_create_qp_cmd {
	struct ibv_create_qp ibv_cmd;
	struct vstellar_create_qp drv;
};

struct vstellar_create_qp_cmd_resp {
	struct ib_uverbs_create_qp_resp ibv_resp;
	struct vstellar_create_qp_resp drv;
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
};

struct vstellar_wq {
	void *ring;
	size_t ring_size;
	uint32_t log_wqe;
	uint32_t log_stride;
	uint32_t pi;			/* free-running producer index */
	uint32_t ci;			/* retired (completed) index */
	uint32_t max_sge;
	pthread_spinlock_t lock;
};

struct vstellar_qp {
	struct verbs_qp vqp;
	uint32_t qpn;
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

static inline struct vstellar_ah *to_vah(struct ibv_ah *ibah)
{
	return container_of(ibah, struct vstellar_ah, ibv_ah);
}

#endif /* VSTELLAR_PROVIDER_H */
