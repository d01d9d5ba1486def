// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * vStellar provider: the control verbs (PD, MR, CQ, QP, AH). Each goes
 * through the kernel (vstellar.ko) with the udata of
 * include/vstellar/vstellar-abi.h; CQ and QP rings are allocated here, in
 * this process's memory, and pinned by the kernel.
 */
#include <config.h>

#include <endian.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ccan/minmax.h>
#include <util/util.h>

#include "vstellar.h"

static unsigned int log2_up(uint32_t n)
{
	unsigned int l = 0;

	while (l < 31 && (1U << l) < n)
		l++;
	return l;
}

/* ------------------------------------------------------------------ */
/* Rings in our memory                                                  */
/* ------------------------------------------------------------------ */

static void *vstellar_ring_alloc(size_t bytes, size_t *alloc_size)
{
	size_t pg = sysconf(_SC_PAGESIZE);
	size_t size = align(bytes, pg);
	void *buf;

	if (posix_memalign(&buf, pg, size)) {
		errno = ENOMEM;
		return NULL;
	}
	memset(buf, 0, size);
	/* the kernel pins these pages: a forked child must not COW them */
	if (ibv_dontfork_range(buf, size)) {
		free(buf);
		errno = ENOMEM;
		return NULL;
	}
	*alloc_size = size;
	return buf;
}

static void vstellar_ring_free(void *buf, size_t size)
{
	if (!buf)
		return;
	ibv_dofork_range(buf, size);
	free(buf);
}

/* ------------------------------------------------------------------ */
/* Doorbells                                                            */
/* ------------------------------------------------------------------ */

static void *vstellar_db_slot(struct vstellar_context *ctx, uint32_t slot)
{
	return (char *)ctx->db_page + (size_t)slot * VSTELLAR_DB_SLOT_SIZE;
}

static bool vstellar_db_slot_ok(struct vstellar_context *ctx, uint32_t slot)
{
	return slot >= VSTELLAR_DB_FIRST_SLOT && slot < ctx->db_slots &&
	       (size_t)(slot + 1) * VSTELLAR_DB_SLOT_SIZE <= ctx->db_page_size;
}

/* ------------------------------------------------------------------ */
/* PD, MR                                                               */
/* ------------------------------------------------------------------ */

struct ibv_pd *vstellar_alloc_pd(struct ibv_context *context)
{
	struct ib_uverbs_alloc_pd_resp resp;
	struct ibv_alloc_pd cmd;
	struct vstellar_pd *pd;
	int ret;

	pd = calloc(1, sizeof(*pd));
	if (!pd)
		return NULL;
	ret = ibv_cmd_alloc_pd(context, &pd->ibv_pd, &cmd, sizeof(cmd), &resp,
			       sizeof(resp));
	if (ret) {
		free(pd);
		errno = ret;
		return NULL;
	}
	return &pd->ibv_pd;
}

int vstellar_dealloc_pd(struct ibv_pd *pd)
{
	int ret;

	ret = ibv_cmd_dealloc_pd(pd);
	if (ret)
		return ret;
	free(pd);
	return 0;
}

/*
 * The access flags go to the kernel as they are: IBV_ACCESS_ON_DEMAND
 * makes an on-demand MR, and with addr NULL and length SIZE_MAX an
 * implicit one (ibv_cmd_reg_mr sends the length as UINT64_MAX).
 */
struct ibv_mr *vstellar_reg_mr(struct ibv_pd *pd, void *addr,
			       size_t length, uint64_t hca_va,
			       int access)
{
	struct ib_uverbs_reg_mr_resp resp;
	struct ibv_reg_mr cmd;
	struct verbs_mr *vmr;
	int ret;

	vmr = calloc(1, sizeof(*vmr));
	if (!vmr)
		return NULL;
	ret = ibv_cmd_reg_mr(pd, addr, length, hca_va, access, vmr, &cmd,
			     sizeof(cmd), &resp, sizeof(resp));
	if (ret) {
		free(vmr);
		errno = ret;
		return NULL;
	}
	return &vmr->ibv_mr;
}

/*
 * ibv_advise_mr: prefetch ranges of on-demand MRs (IBV_ACCESS_ON_DEMAND,
 * which ibv_reg_mr passes to the kernel as it is, implicit MRs too). The
 * kernel maps the pages and hands them to the device (docs/driver.md,
 * "On-demand paging").
 */
int vstellar_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice,
		       uint32_t flags, struct ibv_sge *sg_list,
		       uint32_t num_sge)
{
	return ibv_cmd_advise_mr(pd, advice, flags, sg_list, num_sge);
}

/*
 * ibv_reg_dmabuf_mr: the kernel attaches to the dmabuf and hands the
 * device its pages (an accelerator's memory, say: docs/accelerator.md).
 * No driver data either way.
 */
struct ibv_mr *vstellar_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				      size_t length, uint64_t iova, int fd,
				      int access)
{
	struct verbs_mr *vmr;
	int ret;

	vmr = calloc(1, sizeof(*vmr));
	if (!vmr)
		return NULL;
	ret = ibv_cmd_reg_dmabuf_mr(pd, offset, length, iova, fd, access, vmr,
				    NULL);
	if (ret) {
		free(vmr);
		errno = ret;
		return NULL;
	}
	return &vmr->ibv_mr;
}

int vstellar_dereg_mr(struct verbs_mr *vmr)
{
	int ret;

	ret = ibv_cmd_dereg_mr(vmr);
	if (ret)
		return ret;
	free(vmr);
	return 0;
}

/*
 * Memory windows (F_MW): the kernel allocates them (ALLOC_MW), the send
 * queue binds them (qp.c).
 */
struct ibv_mw *vstellar_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct vstellar_context *ctx = to_vctx(pd->context);
	struct ib_uverbs_alloc_mw_resp resp;
	struct ibv_alloc_mw cmd;
	struct ibv_mw *mw;
	int ret;

	if (!(ctx->features & (1U << VIRTIO_VSTELLAR_F_MW))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	mw = calloc(1, sizeof(*mw));
	if (!mw)
		return NULL;
	ret = ibv_cmd_alloc_mw(pd, type, mw, &cmd, sizeof(cmd), &resp,
			       sizeof(resp));
	if (ret) {
		free(mw);
		errno = ret;
		return NULL;
	}
	return mw;
}

int vstellar_dealloc_mw(struct ibv_mw *mw)
{
	int ret;

	ret = ibv_cmd_dealloc_mw(mw);
	if (ret)
		return ret;
	free(mw);
	return 0;
}

/* ------------------------------------------------------------------ */
/* CQ                                                                   */
/* ------------------------------------------------------------------ */

/*
 * Both ibv_create_cq and ibv_create_cq_ex end here: the ring in our memory,
 * then the uverbs command (legacy or extended) with our udata.
 */
static struct vstellar_cq *
vstellar_cq_create(struct ibv_context *context,
		   struct ibv_cq_init_attr_ex *attr, bool ex)
{
	struct vstellar_context *ctx = to_vctx(context);
	struct vstellar_create_cq_ex_cmd_resp resp_ex = {};
	struct vstellar_create_cq_cmd_resp resp = {};
	struct vstellar_create_cq_ex_cmd cmd_ex = {};
	struct vstellar_create_cq_cmd cmd = {};
	struct vstellar_create_cq_resp *drv_resp;
	struct vstellar_create_cq *drv_cmd;
	struct vstellar_cq *cq;
	uint32_t log_cqe;
	int ret;

	if (attr->cqe < 1 || attr->cqe > ctx->max_cqe) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return NULL;
	if (pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE))
		goto err_free;

	log_cqe = max_t(uint32_t, log2_up(attr->cqe), VSTELLAR_MIN_LOG_CQE);
	cq->ring = vstellar_ring_alloc(sizeof(struct vstellar_cqe) << log_cqe,
				       &cq->ring_size);
	if (!cq->ring)
		goto err_lock;

	drv_cmd = ex ? &cmd_ex.drv : &cmd.drv;
	drv_resp = ex ? &resp_ex.drv : &resp.drv;
	drv_cmd->buf_addr = (uintptr_t)cq->ring;
	drv_cmd->log_cqe = log_cqe;
	if (ex)
		ret = ibv_cmd_create_cq_ex(context, attr, &cq->vcq,
					   &cmd_ex.ibv_cmd, sizeof(cmd_ex),
					   &resp_ex.ibv_resp, sizeof(resp_ex),
					   0);
	else
		ret = ibv_cmd_create_cq(context, attr->cqe, attr->channel,
					attr->comp_vector, &cq->vcq.cq,
					&cmd.ibv_cmd, sizeof(cmd),
					&resp.ibv_resp, sizeof(resp));
	if (ret) {
		errno = ret;
		goto err_ring;
	}
	if (drv_resp->log_cqe != log_cqe ||
	    !vstellar_db_slot_ok(ctx, drv_resp->db_slot)) {
		verbs_err(&ctx->ibv_ctx, "vstellar: bad create_cq response\n");
		ibv_cmd_destroy_cq(&cq->vcq.cq);
		errno = EPROTO;
		goto err_ring;
	}
	cq->log_cqe = log_cqe;
	cq->cqn = drv_resp->cqn;
	cq->db = vstellar_db_slot(ctx, drv_resp->db_slot);
	cq->ci = 0;
	cq->arm_seq = le32toh(atomic_load_explicit(
		(_Atomic(uint32_t) *)&cq->db->arm, memory_order_relaxed)) &
		~VSTELLAR_CQ_ARM_SOLICITED;
	return cq;

err_ring:
	vstellar_ring_free(cq->ring, cq->ring_size);
err_lock:
	pthread_spin_destroy(&cq->lock);
err_free:
	free(cq);
	return NULL;
}

struct ibv_cq *vstellar_create_cq(struct ibv_context *context, int cqe,
				  struct ibv_comp_channel *channel,
				  int comp_vector)
{
	struct ibv_cq_init_attr_ex attr = {
		.cqe = cqe < 0 ? 0 : cqe,
		.channel = channel,
		.comp_vector = comp_vector,
	};
	struct vstellar_cq *cq = vstellar_cq_create(context, &attr, false);

	return cq ? &cq->vcq.cq : NULL;
}

struct ibv_cq_ex *vstellar_create_cq_ex(struct ibv_context *context,
					struct ibv_cq_init_attr_ex *attr)
{
	struct vstellar_cq *cq;

	if (attr->wc_flags & ~VSTELLAR_CQ_EX_WC_FLAGS ||
	    attr->comp_mask & ~(IBV_CQ_INIT_ATTR_MASK_FLAGS |
				IBV_CQ_INIT_ATTR_MASK_PD) ||
	    ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
	     attr->flags & ~IBV_CREATE_CQ_ATTR_SINGLE_THREADED)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	cq = vstellar_cq_create(context, attr, true);
	if (!cq)
		return NULL;
	vstellar_cq_ex_init(cq, attr->wc_flags);
	return &cq->vcq.cq_ex;
}

/*
 * A new zeroed ring; the device moves the CQEs not yet polled to its start
 * and resets the consumer index (RESIZE_CQ). The CQ lock is held across
 * the command so no poll reads the old ring or stores ci meanwhile.
 */
int vstellar_resize_cq(struct ibv_cq *ibcq, int cqe)
{
	struct vstellar_context *ctx = to_vctx(ibcq->context);
	struct vstellar_cq *cq = to_vcq(ibcq);
	struct vstellar_resize_cq_cmd_resp resp = {};
	struct vstellar_resize_cq_cmd cmd = {};
	struct vstellar_cqe *ring, *old;
	size_t size, old_size;
	uint32_t log_cqe;
	int ret;

	if (!(ctx->features & (1U << VIRTIO_VSTELLAR_F_RESIZE_CQ)))
		return EOPNOTSUPP;
	if (cqe < 1 || (uint32_t)cqe > ctx->max_cqe)
		return EINVAL;
	log_cqe = max_t(uint32_t, log2_up(cqe), VSTELLAR_MIN_LOG_CQE);
	ring = vstellar_ring_alloc(sizeof(struct vstellar_cqe) << log_cqe,
				   &size);
	if (!ring)
		return ENOMEM;
	cmd.drv.buf_addr = (uintptr_t)ring;
	cmd.drv.log_cqe = log_cqe;

	pthread_spin_lock(&cq->lock);
	ret = ibv_cmd_resize_cq(ibcq, cqe, &cmd.ibv_cmd, sizeof(cmd),
				&resp.ibv_resp, sizeof(resp));
	if (ret) {
		pthread_spin_unlock(&cq->lock);
		vstellar_ring_free(ring, size);
		return ret;
	}
	old = cq->ring;
	old_size = cq->ring_size;
	cq->ring = ring;
	cq->ring_size = size;
	cq->log_cqe = log_cqe;
	cq->ci = 0;
	cq->cur = NULL;
	pthread_spin_unlock(&cq->lock);
	vstellar_ring_free(old, old_size);
	return 0;
}

int vstellar_destroy_cq(struct ibv_cq *ibcq)
{
	struct vstellar_cq *cq = to_vcq(ibcq);
	int ret;

	ret = ibv_cmd_destroy_cq(ibcq);
	if (ret)
		return ret;
	vstellar_ring_free(cq->ring, cq->ring_size);
	pthread_spin_destroy(&cq->lock);
	free(cq);
	return 0;
}

/* ------------------------------------------------------------------ */
/* QP                                                                   */
/* ------------------------------------------------------------------ */

/* The sizes of a new QP's rings: log2 of their slots and of a slot's bytes. */
struct vstellar_qp_rings {
	uint32_t sq_log_wqe, sq_log_stride;
	uint32_t rq_log_wqe, rq_log_stride;
};

/*
 * Whether the device offers what @attr asks for: the init attributes we
 * know, its send operations (those of memory windows only with F_MW) and
 * its QP type (UC with F_UC, an SRQ with F_SRQ). No create flag is
 * supported, so only 0 is (pyverbs asks for it).
 */
static bool vstellar_qp_attr_supported(struct vstellar_context *ctx,
				       const struct ibv_qp_init_attr_ex *attr)
{
	if (attr->comp_mask & ~(IBV_QP_INIT_ATTR_PD |
				IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
				IBV_QP_INIT_ATTR_CREATE_FLAGS) ||
	    !(attr->comp_mask & IBV_QP_INIT_ATTR_PD) ||
	    ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) &&
	     attr->create_flags))
		return false;
	if ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    ((attr->send_ops_flags & ~VSTELLAR_SEND_OPS) ||
	     ((attr->send_ops_flags & VSTELLAR_SEND_OPS_MW) &&
	      !(ctx->features & (1U << VIRTIO_VSTELLAR_F_MW)))))
		return false;
	if ((attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UD &&
	     attr->qp_type != IBV_QPT_UC) ||
	    (attr->qp_type == IBV_QPT_UC &&
	     !(ctx->features & (1U << VIRTIO_VSTELLAR_F_UC))) ||
	    (attr->srq && !(ctx->features & (1U << VIRTIO_VSTELLAR_F_SRQ))))
		return false;
	/* UC: SEND and RDMA WRITE (with or without immediate) only */
	if (attr->qp_type == IBV_QPT_UC &&
	    (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    (attr->send_ops_flags & (IBV_QP_EX_WITH_RDMA_READ |
				     IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
				     IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)))
		return false;
	return true;
}

/*
 * The rings that hold @cap: a power of two of slots, each large enough for
 * the WQE header and its SGEs or inline data, and no smaller than the
 * device's minimum stride. False if @cap asks for more than the device
 * has. With an SRQ the QP has no receive queue of its own (IB): @cap's
 * receive side is zeroed first.
 */
static bool vstellar_qp_size_rings(struct vstellar_context *ctx, bool srq,
				   struct ibv_qp_cap *cap,
				   struct vstellar_qp_rings *r)
{
	uint32_t max_wr = min_t(uint32_t, ctx->max_qp_wr,
				1U << VSTELLAR_MAX_LOG_WQE);
	uint32_t send_bytes, recv_bytes, fit;

	if (srq) {
		cap->max_recv_wr = 0;
		cap->max_recv_sge = 0;
	}
	if (cap->max_send_wr > max_wr || cap->max_recv_wr > max_wr ||
	    cap->max_send_sge > ctx->max_send_sge ||
	    cap->max_recv_sge > ctx->max_recv_sge ||
	    cap->max_inline_data > ctx->max_inline_data)
		return false;

	r->sq_log_wqe = log2_up(max_t(uint32_t, cap->max_send_wr, 1));
	r->rq_log_wqe = log2_up(max_t(uint32_t, cap->max_recv_wr, 1));
	fit = max_t(uint32_t, cap->max_send_sge, 1) *
	      sizeof(struct vstellar_sge);
	send_bytes = sizeof(struct vstellar_send_wqe) +
		     max_t(uint32_t, fit, cap->max_inline_data);
	recv_bytes = sizeof(struct vstellar_recv_wqe) +
		     max_t(uint32_t, cap->max_recv_sge, 1) *
			     sizeof(struct vstellar_sge);
	r->sq_log_stride = max_t(uint32_t, log2_up(send_bytes),
				 ctx->min_sq_log_stride);
	r->rq_log_stride = max_t(uint32_t, log2_up(recv_bytes),
				 ctx->min_rq_log_stride);
	return r->sq_log_stride <= VSTELLAR_MAX_LOG_STRIDE &&
	       r->rq_log_stride <= VSTELLAR_MAX_LOG_STRIDE;
}

/* A QP's rings and locks; what vstellar_qp_alloc made, or part of it. */
static void vstellar_qp_free(struct vstellar_qp *qp)
{
	vstellar_ring_free(qp->rq.ring, qp->rq.ring_size);
	vstellar_ring_free(qp->sq.ring, qp->sq.ring_size);
	pthread_spin_destroy(&qp->rq.lock);
	pthread_spin_destroy(&qp->sq.lock);
	free(qp);
}

/* A work queue's ring of 1 << log_wqe slots of 1 << log_stride bytes. */
static bool vstellar_wq_alloc(struct vstellar_wq *wq, uint32_t log_wqe,
			      uint32_t log_stride)
{
	wq->log_wqe = log_wqe;
	wq->log_stride = log_stride;
	wq->ring = vstellar_ring_alloc((size_t)1 << (log_wqe + log_stride),
				       &wq->ring_size);
	return wq->ring;
}

/*
 * A new QP with its locks and its rings in our memory (the kernel pins
 * them); with an SRQ, no receive ring.
 */
static struct vstellar_qp *vstellar_qp_alloc(const struct vstellar_qp_rings *r,
					     struct ibv_srq *srq)
{
	struct vstellar_qp *qp = calloc(1, sizeof(*qp));

	if (!qp)
		return NULL;
	if (pthread_spin_init(&qp->sq.lock, PTHREAD_PROCESS_PRIVATE)) {
		free(qp);
		return NULL;
	}
	if (pthread_spin_init(&qp->rq.lock, PTHREAD_PROCESS_PRIVATE)) {
		pthread_spin_destroy(&qp->sq.lock);
		free(qp);
		return NULL;
	}
	if (!vstellar_wq_alloc(&qp->sq, r->sq_log_wqe, r->sq_log_stride))
		goto err;
	if (srq)
		qp->srq = to_vsrq(srq);
	else if (!vstellar_wq_alloc(&qp->rq, r->rq_log_wqe, r->rq_log_stride))
		goto err;
	return qp;

err:
	vstellar_qp_free(qp);
	return NULL;
}

/*
 * CREATE_QP through the kernel with the rings' addresses and sizes; the
 * QPN and doorbell slot the device answers. -1 with errno set on failure.
 */
static int vstellar_qp_create_cmd(struct ibv_context *context,
				  struct vstellar_qp *qp,
				  struct ibv_qp_init_attr_ex *attr,
				  struct vstellar_create_qp_cmd_resp *resp)
{
	struct vstellar_context *ctx = to_vctx(context);
	struct vstellar_create_qp_cmd cmd = {};
	uint32_t comp_mask;
	int ret;

	cmd.drv.sq_buf_addr = (uintptr_t)qp->sq.ring;
	cmd.drv.sq_log_wqe = qp->sq.log_wqe;
	cmd.drv.sq_log_stride = qp->sq.log_stride;
	if (!qp->srq) {
		cmd.drv.rq_buf_addr = (uintptr_t)qp->rq.ring;
		cmd.drv.rq_log_wqe = qp->rq.log_wqe;
		cmd.drv.rq_log_stride = qp->rq.log_stride;
	}
	/* create_flags is 0 (checked before): the command need not carry it */
	comp_mask = attr->comp_mask;
	attr->comp_mask &= ~IBV_QP_INIT_ATTR_CREATE_FLAGS;
	ret = ibv_cmd_create_qp_ex(context, &qp->vqp, attr, &cmd.ibv_cmd,
				   sizeof(cmd), &resp->ibv_resp, sizeof(*resp));
	attr->comp_mask = comp_mask;
	if (ret) {
		errno = ret;
		return -1;
	}
	if (!vstellar_db_slot_ok(ctx, resp->drv.db_slot)) {
		verbs_err(&ctx->ibv_ctx, "vstellar: bad create_qp response\n");
		ibv_cmd_destroy_qp(&qp->vqp.qp);
		errno = EPROTO;
		return -1;
	}
	qp->qpn = resp->drv.qpn;
	qp->db = vstellar_db_slot(ctx, resp->drv.db_slot);
	qp->sq_sig_all = attr->sq_sig_all;
	return 0;
}

/*
 * What the device granted, within what our slots hold (inline data only
 * with F_INLINE); the caller learns it through @cap.
 */
static void vstellar_qp_set_caps(struct vstellar_context *ctx,
				 struct vstellar_qp *qp,
				 const struct vstellar_create_qp_resp *granted,
				 struct ibv_qp_cap *cap)
{
	uint32_t send_room = (1U << qp->sq.log_stride) -
			     sizeof(struct vstellar_send_wqe);

	qp->sq.max_sge = min_t(uint32_t, granted->max_send_sge,
			       send_room / sizeof(struct vstellar_sge));
	if (!qp->srq)
		qp->rq.max_sge = min_t(uint32_t, granted->max_recv_sge,
				       ((1U << qp->rq.log_stride) -
					sizeof(struct vstellar_recv_wqe)) /
					       sizeof(struct vstellar_sge));
	qp->max_inline_data = min_t(uint32_t, granted->max_inline_data,
				    send_room);
	if (!(ctx->features & (1U << VIRTIO_VSTELLAR_F_INLINE)))
		qp->max_inline_data = 0;
	cap->max_send_wr = 1U << qp->sq.log_wqe;
	cap->max_recv_wr = qp->srq ? 0 : 1U << qp->rq.log_wqe;
	cap->max_send_sge = qp->sq.max_sge;
	cap->max_recv_sge = qp->rq.max_sge;
	cap->max_inline_data = qp->max_inline_data;
}

struct ibv_qp *vstellar_create_qp_ex(struct ibv_context *context,
				     struct ibv_qp_init_attr_ex *attr)
{
	struct vstellar_context *ctx = to_vctx(context);
	struct vstellar_create_qp_cmd_resp resp = {};
	struct vstellar_qp_rings rings;
	struct vstellar_qp *qp;

	if (!vstellar_qp_attr_supported(ctx, attr)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!vstellar_qp_size_rings(ctx, attr->srq, &attr->cap, &rings)) {
		errno = EINVAL;
		return NULL;
	}
	qp = vstellar_qp_alloc(&rings, attr->srq);
	if (!qp)
		return NULL;
	if (vstellar_qp_create_cmd(context, qp, attr, &resp)) {
		vstellar_qp_free(qp);
		return NULL;
	}
	vstellar_qp_set_caps(ctx, qp, &resp.drv, &attr->cap);
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		vstellar_qp_ex_init(qp, attr->send_ops_flags);
	vstellar_qp_table_insert(ctx, qp);
	return &qp->vqp.qp;
}

struct ibv_qp *vstellar_create_qp(struct ibv_pd *pd,
				  struct ibv_qp_init_attr *attr)
{
	struct ibv_qp_init_attr_ex attr_ex = {};
	struct ibv_qp *qp;

	memcpy(&attr_ex, attr, sizeof(*attr));
	attr_ex.comp_mask = IBV_QP_INIT_ATTR_PD;
	attr_ex.pd = pd;
	qp = vstellar_create_qp_ex(pd->context, &attr_ex);
	if (qp)
		memcpy(attr, &attr_ex, sizeof(*attr));
	return qp;
}

int vstellar_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		      int attr_mask, struct ibv_qp_init_attr *init_attr)
{
	struct vstellar_qp *qp = to_vqp(ibqp);
	struct ibv_query_qp cmd;
	int ret;

	ret = ibv_cmd_query_qp(ibqp, attr, attr_mask, init_attr, &cmd,
			       sizeof(cmd));
	if (ret)
		return ret;
	attr->cap.max_send_wr = 1U << qp->sq.log_wqe;
	attr->cap.max_recv_wr = qp->srq ? 0 : 1U << qp->rq.log_wqe;
	attr->cap.max_send_sge = qp->sq.max_sge;
	attr->cap.max_recv_sge = qp->rq.max_sge;
	attr->cap.max_inline_data = qp->max_inline_data;
	init_attr->cap = attr->cap;
	return 0;
}

int vstellar_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		       int attr_mask)
{
	struct vstellar_qp *qp = to_vqp(ibqp);
	struct ibv_modify_qp cmd;
	int ret;

	ret = ibv_cmd_modify_qp(ibqp, attr, attr_mask, &cmd, sizeof(cmd));
	if (ret)
		return ret;
	/*
	 * RESET forgets every WQE: the device zeroes the QP's doorbell slot
	 * and both sides restart at index 0 (docs/provider.md).
	 */
	if ((attr_mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET) {
		pthread_spin_lock(&qp->sq.lock);
		qp->sq.pi = 0;
		atomic_store_explicit((_Atomic(uint32_t) *)&qp->sq.ci, 0,
				      memory_order_relaxed);
		pthread_spin_unlock(&qp->sq.lock);
		pthread_spin_lock(&qp->rq.lock);
		qp->rq.pi = 0;
		atomic_store_explicit((_Atomic(uint32_t) *)&qp->rq.ci, 0,
				      memory_order_relaxed);
		pthread_spin_unlock(&qp->rq.lock);
	}
	return 0;
}

int vstellar_destroy_qp(struct ibv_qp *ibqp)
{
	struct vstellar_context *ctx = to_vctx(ibqp->context);
	struct vstellar_qp *qp = to_vqp(ibqp);
	struct vstellar_cq *cq;
	int ret;

	ret = ibv_cmd_destroy_qp(ibqp);
	if (ret)
		return ret;
	vstellar_qp_table_remove(ctx, qp);
	/* drop the poll caches that may still point at it */
	cq = to_vcq(ibqp->send_cq);
	pthread_spin_lock(&cq->lock);
	if (cq->last_qp == qp)
		cq->last_qp = NULL;
	pthread_spin_unlock(&cq->lock);
	cq = to_vcq(ibqp->recv_cq);
	pthread_spin_lock(&cq->lock);
	if (cq->last_qp == qp)
		cq->last_qp = NULL;
	pthread_spin_unlock(&cq->lock);

	vstellar_qp_free(qp);
	return 0;
}
/* ------------------------------------------------------------------ */
/* SRQ                                                                  */
/* ------------------------------------------------------------------ */

struct ibv_srq *vstellar_create_srq(struct ibv_pd *pd,
				    struct ibv_srq_init_attr *init_attr)
{
	struct vstellar_context *ctx = to_vctx(pd->context);
	struct ibv_srq_attr *attr = &init_attr->attr;
	struct vstellar_create_srq_cmd_resp resp = {};
	struct vstellar_create_srq_cmd cmd = {};
	uint32_t max_wr = min_t(uint32_t, ctx->max_qp_wr,
				1U << VSTELLAR_MAX_LOG_WQE);
	uint32_t log_wqe, log_stride, recv_bytes, fit;
	struct vstellar_srq *srq;
	int ret;

	if (!(ctx->features & (1U << VIRTIO_VSTELLAR_F_SRQ))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (attr->max_wr < 1 || attr->max_wr > max_wr ||
	    attr->max_sge > ctx->max_recv_sge ||
	    attr->srq_limit >= attr->max_wr) {
		errno = EINVAL;
		return NULL;
	}
	log_wqe = log2_up(attr->max_wr);
	recv_bytes = sizeof(struct vstellar_recv_wqe) +
		     max_t(uint32_t, attr->max_sge, 1) *
			     sizeof(struct vstellar_sge);
	log_stride = max_t(uint32_t, log2_up(recv_bytes),
			   ctx->min_rq_log_stride);
	if (log_stride > VSTELLAR_MAX_LOG_STRIDE) {
		errno = EINVAL;
		return NULL;
	}

	srq = calloc(1, sizeof(*srq));
	if (!srq)
		return NULL;
	if (pthread_spin_init(&srq->wq.lock, PTHREAD_PROCESS_PRIVATE))
		goto err_free;
	srq->wq.log_wqe = log_wqe;
	srq->wq.log_stride = log_stride;
	srq->wq.ring = vstellar_ring_alloc((size_t)1 << (log_wqe + log_stride),
					   &srq->wq.ring_size);
	if (!srq->wq.ring)
		goto err_lock;

	cmd.drv.buf_addr = (uintptr_t)srq->wq.ring;
	cmd.drv.log_wqe = log_wqe;
	cmd.drv.log_stride = log_stride;
	ret = ibv_cmd_create_srq(pd, &srq->vsrq.srq, init_attr, &cmd.ibv_cmd,
				 sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret) {
		errno = ret;
		goto err_ring;
	}
	if (!vstellar_db_slot_ok(ctx, resp.drv.db_slot)) {
		verbs_err(&ctx->ibv_ctx, "vstellar: bad create_srq response\n");
		ibv_cmd_destroy_srq(&srq->vsrq.srq);
		errno = EPROTO;
		goto err_ring;
	}
	srq->srqn = resp.drv.srqn;
	srq->db = vstellar_db_slot(ctx, resp.drv.db_slot);
	fit = ((1U << log_stride) - sizeof(struct vstellar_recv_wqe)) /
	      sizeof(struct vstellar_sge);
	srq->wq.max_sge = min_t(uint32_t, resp.drv.max_sge, fit);
	attr->max_wr = 1U << log_wqe;
	attr->max_sge = srq->wq.max_sge;
	return &srq->vsrq.srq;

err_ring:
	vstellar_ring_free(srq->wq.ring, srq->wq.ring_size);
err_lock:
	pthread_spin_destroy(&srq->wq.lock);
err_free:
	free(srq);
	return NULL;
}

/* Only the limit can change (arming SRQ_LIMIT_REACHED); no resizing. */
/*
 * IBV_SRQ_MAX_WR (F_RESIZE_SRQ): a new zeroed ring of the same stride; the
 * device takes what the old ring holds and reads the new one from then on,
 * at the same free-running indices. The WQE lock is held across the
 * command, so nothing is posted into the old ring meanwhile; the WQEs
 * outstanding (posted, not completed) must fit the new ring.
 */
int vstellar_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
			int attr_mask)
{
	struct vstellar_context *ctx = to_vctx(ibsrq->context);
	struct vstellar_srq *srq = to_vsrq(ibsrq);
	struct vstellar_modify_srq_cmd cmd = {};
	uint32_t max_wr = min_t(uint32_t, ctx->max_qp_wr,
				1U << VSTELLAR_MAX_LOG_WQE);
	uint32_t log_wqe, ci;
	size_t size;
	void *ring;
	int ret;

	if (attr_mask & ~(IBV_SRQ_LIMIT | IBV_SRQ_MAX_WR))
		return EOPNOTSUPP;
	if (!(attr_mask & IBV_SRQ_MAX_WR))
		return ibv_cmd_modify_srq(ibsrq, attr, attr_mask, &cmd.ibv_cmd,
					  sizeof(cmd.ibv_cmd));
	if (!(ctx->features & (1U << VIRTIO_VSTELLAR_F_RESIZE_SRQ)))
		return EOPNOTSUPP;
	if (attr->max_wr < 1 || attr->max_wr > max_wr)
		return EINVAL;
	log_wqe = log2_up(attr->max_wr);
	ring = vstellar_ring_alloc((size_t)1 << (log_wqe + srq->wq.log_stride),
				   &size);
	if (!ring)
		return ENOMEM;
	cmd.drv.buf_addr = (uintptr_t)ring;
	cmd.drv.log_wqe = log_wqe;

	pthread_spin_lock(&srq->wq.lock);
	ci = atomic_load_explicit((_Atomic(uint32_t) *)&srq->wq.ci,
				  memory_order_relaxed);
	if (srq->wq.pi - ci > (1U << log_wqe)) {
		ret = EINVAL;
		goto err;
	}
	ret = ibv_cmd_modify_srq(ibsrq, attr, attr_mask, &cmd.ibv_cmd,
				 sizeof(cmd));
	if (ret)
		goto err;
	vstellar_ring_free(srq->wq.ring, srq->wq.ring_size);
	srq->wq.ring = ring;
	srq->wq.ring_size = size;
	srq->wq.log_wqe = log_wqe;
	pthread_spin_unlock(&srq->wq.lock);
	return 0;

err:
	pthread_spin_unlock(&srq->wq.lock);
	vstellar_ring_free(ring, size);
	return ret;
}

int vstellar_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct vstellar_srq *srq = to_vsrq(ibsrq);
	struct ibv_query_srq cmd;
	int ret;

	ret = ibv_cmd_query_srq(ibsrq, attr, &cmd, sizeof(cmd));
	if (ret)
		return ret;
	attr->max_wr = 1U << srq->wq.log_wqe;
	attr->max_sge = srq->wq.max_sge;
	return 0;
}

int vstellar_destroy_srq(struct ibv_srq *ibsrq)
{
	struct vstellar_srq *srq = to_vsrq(ibsrq);
	int ret;

	ret = ibv_cmd_destroy_srq(ibsrq);
	if (ret)
		return ret;
	vstellar_ring_free(srq->wq.ring, srq->wq.ring_size);
	pthread_spin_destroy(&srq->wq.lock);
	free(srq);
	return 0;
}

/* ------------------------------------------------------------------ */
/* AH (UD)                                                              */
/* ------------------------------------------------------------------ */

struct ibv_ah *vstellar_create_ah(struct ibv_pd *pd,
				  struct ibv_ah_attr *attr)
{
	struct vstellar_create_ah_cmd_resp resp = {};
	struct vstellar_ah *ah;
	int ret;

	ah = calloc(1, sizeof(*ah));
	if (!ah)
		return NULL;
	ret = ibv_cmd_create_ah(pd, &ah->ibv_ah, attr, &resp.ibv_resp,
				sizeof(resp));
	if (ret) {
		free(ah);
		errno = ret;
		return NULL;
	}
	/* the device keeps no AH: UD WQEs carry the address vector itself */
	memcpy(ah->av.dgid, attr->grh.dgid.raw, sizeof(ah->av.dgid));
	ah->av.flow_label = htobe32(attr->grh.flow_label & 0xfffff);
	ah->av.sgid_index = attr->grh.sgid_index;
	ah->av.hop_limit = attr->grh.hop_limit;
	ah->av.traffic_class = attr->grh.traffic_class;
	ah->av.sl = attr->sl;
	return &ah->ibv_ah;
}

int vstellar_destroy_ah(struct ibv_ah *ibah)
{
	int ret;

	ret = ibv_cmd_destroy_ah(ibah);
	if (ret)
		return ret;
	free(to_vah(ibah));
	return 0;
}
