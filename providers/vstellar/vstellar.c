// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * vStellar rdma-core provider.
 *
 * Control verbs go through the kernel (vstellar.ko) with the udata of
 * include/vstellar/vstellar-abi.h. The data path never enters the kernel:
 * WQEs are written into rings in this process's memory, producer indices
 * into the context's doorbell page (mmapped; RAM on the host side), and the
 * kick page (a virtio notify register) is touched only when the device set
 * need_kick. CQEs are polled from the CQ ring by their owner (phase) bit;
 * CQs are armed through their doorbell slot. See docs/provider.md.
 */
#include <config.h>

#include <endian.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ccan/array_size.h>
#include <ccan/minmax.h>
#include <util/mmio.h>
#include <util/udma_barrier.h>
#include <util/util.h>

#include "vstellar.h"

static const struct verbs_match_ent vstellar_match_table[] = {
	/* the ib_device's parent is the virtio device, ID 42 ("RDMA device") */
	VERBS_MODALIAS_MATCH("virtio:d0000002Av*", NULL),
	/* fallback: the name vstellar.ko registers ("vstellar%d") */
	VERBS_NAME_MATCH("vstellar", NULL),
	{},
};

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

/*
 * Publish a producer index: the WQEs it covers are in memory before the
 * index (release); the index is visible before need_kick is read (full
 * fence, pairs with vstellard's "need_kick = 1; fence; rescan"); the kick
 * page is written only when the device asked for it.
 */
static void vstellar_ring_db(struct vstellar_context *ctx, __le32 *index,
			     uint32_t value)
{
	struct vstellar_db_page_hdr *hdr = ctx->db_page;

	udma_to_device_barrier();
	atomic_store_explicit((_Atomic(uint32_t) *)index, htole32(value),
			      memory_order_release);
	if (!ctx->kick_page)
		return;
	if (ctx->db_suppress) {
		atomic_thread_fence(memory_order_seq_cst);
		if (!atomic_load_explicit((_Atomic(uint32_t) *)&hdr->need_kick,
					  memory_order_relaxed))
			return;
	}
	mmio_write32_le(ctx->kick_page, htole32(VSTELLAR_VQ_KICK));
}

/* ------------------------------------------------------------------ */
/* Device and port                                                      */
/* ------------------------------------------------------------------ */

static int vstellar_query_device_ex(struct ibv_context *context,
				    const struct ibv_query_device_ex_input *input,
				    struct ibv_device_attr_ex *attr,
				    size_t attr_size)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);
	uint64_t fw;
	int ret;

	ret = ibv_cmd_query_device_any(context, input, attr, attr_size, &resp,
				       &resp_size);
	if (ret)
		return ret;
	fw = resp.base.fw_ver;
	snprintf(attr->orig_attr.fw_ver, sizeof(attr->orig_attr.fw_ver),
		 "%u.%u.%u", (unsigned int)(fw >> 32) & 0xffff,
		 (unsigned int)(fw >> 16) & 0xffff, (unsigned int)fw & 0xffff);
	return 0;
}

static int vstellar_query_port(struct ibv_context *context, uint8_t port,
			       struct ibv_port_attr *attr)
{
	struct ibv_query_port cmd;

	return ibv_cmd_query_port(context, port, attr, &cmd, sizeof(cmd));
}

/* ------------------------------------------------------------------ */
/* PD, MR                                                               */
/* ------------------------------------------------------------------ */

static struct ibv_pd *vstellar_alloc_pd(struct ibv_context *context)
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

static int vstellar_dealloc_pd(struct ibv_pd *pd)
{
	int ret;

	ret = ibv_cmd_dealloc_pd(pd);
	if (ret)
		return ret;
	free(pd);
	return 0;
}

static struct ibv_mr *vstellar_reg_mr(struct ibv_pd *pd, void *addr,
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

static int vstellar_dereg_mr(struct verbs_mr *vmr)
{
	int ret;

	ret = ibv_cmd_dereg_mr(vmr);
	if (ret)
		return ret;
	free(vmr);
	return 0;
}

/* ------------------------------------------------------------------ */
/* QP table (CQEs name their QP by QPN)                                 */
/* ------------------------------------------------------------------ */

static void vstellar_qp_table_add(struct vstellar_context *ctx,
				  struct vstellar_qp *qp)
{
	struct vstellar_qp **head =
		&ctx->qp_table[qp->qpn % VSTELLAR_QP_TABLE_SIZE];

	pthread_mutex_lock(&ctx->qp_table_lock);
	qp->hash_next = *head;
	*head = qp;
	pthread_mutex_unlock(&ctx->qp_table_lock);
}

static void vstellar_qp_table_del(struct vstellar_context *ctx,
				  struct vstellar_qp *qp)
{
	struct vstellar_qp **p =
		&ctx->qp_table[qp->qpn % VSTELLAR_QP_TABLE_SIZE];

	pthread_mutex_lock(&ctx->qp_table_lock);
	for (; *p; p = &(*p)->hash_next) {
		if (*p == qp) {
			*p = qp->hash_next;
			break;
		}
	}
	pthread_mutex_unlock(&ctx->qp_table_lock);
}

static struct vstellar_qp *vstellar_qp_find(struct vstellar_context *ctx,
					    uint32_t qpn)
{
	struct vstellar_qp *qp;

	pthread_mutex_lock(&ctx->qp_table_lock);
	for (qp = ctx->qp_table[qpn % VSTELLAR_QP_TABLE_SIZE]; qp;
	     qp = qp->hash_next)
		if (qp->qpn == qpn)
			break;
	pthread_mutex_unlock(&ctx->qp_table_lock);
	return qp;
}

/* ------------------------------------------------------------------ */
/* CQ                                                                   */
/* ------------------------------------------------------------------ */

static struct ibv_cq *vstellar_create_cq(struct ibv_context *context, int cqe,
					 struct ibv_comp_channel *channel,
					 int comp_vector)
{
	struct vstellar_context *ctx = to_vctx(context);
	struct vstellar_create_cq_cmd_resp resp = {};
	struct vstellar_create_cq_cmd cmd = {};
	struct vstellar_cq *cq;
	uint32_t log_cqe;
	int ret;

	if (cqe < 1 || (uint32_t)cqe > ctx->max_cqe) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return NULL;
	if (pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE))
		goto err_free;

	log_cqe = log2_up(cqe);
	cq->ring = vstellar_ring_alloc(sizeof(struct vstellar_cqe) << log_cqe,
				       &cq->ring_size);
	if (!cq->ring)
		goto err_lock;

	cmd.drv.buf_addr = (uintptr_t)cq->ring;
	cmd.drv.log_cqe = log_cqe;
	ret = ibv_cmd_create_cq(context, cqe, channel, comp_vector,
				&cq->vcq.cq, &cmd.ibv_cmd, sizeof(cmd),
				&resp.ibv_resp, sizeof(resp));
	if (ret) {
		errno = ret;
		goto err_ring;
	}
	if (resp.drv.log_cqe != log_cqe ||
	    !vstellar_db_slot_ok(ctx, resp.drv.db_slot)) {
		verbs_err(&ctx->ibv_ctx, "vstellar: bad create_cq response\n");
		ibv_cmd_destroy_cq(&cq->vcq.cq);
		errno = EPROTO;
		goto err_ring;
	}
	cq->log_cqe = log_cqe;
	cq->cqn = resp.drv.cqn;
	cq->db = vstellar_db_slot(ctx, resp.drv.db_slot);
	cq->ci = 0;
	cq->arm_seq = le32toh(atomic_load_explicit(
		(_Atomic(uint32_t) *)&cq->db->arm, memory_order_relaxed)) &
		~VSTELLAR_CQ_ARM_SOLICITED;
	return &cq->vcq.cq;

err_ring:
	vstellar_ring_free(cq->ring, cq->ring_size);
err_lock:
	pthread_spin_destroy(&cq->lock);
err_free:
	free(cq);
	return NULL;
}

static int vstellar_destroy_cq(struct ibv_cq *ibcq)
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

/* The WQE with the low 16 bits @idx16 completed: everything up to it is done. */
static void vstellar_wq_retire(struct vstellar_wq *wq, uint16_t idx16)
{
	uint32_t ci = atomic_load_explicit((_Atomic(uint32_t) *)&wq->ci,
					   memory_order_relaxed);

	ci += (uint16_t)(idx16 - (uint16_t)ci) + 1;
	atomic_store_explicit((_Atomic(uint32_t) *)&wq->ci, ci,
			      memory_order_relaxed);
}

static void vstellar_cqe_to_wc(struct vstellar_cq *cq,
			       const struct vstellar_cqe *cqe,
			       struct ibv_wc *wc)
{
	struct vstellar_context *ctx = to_vctx(cq->vcq.cq.context);
	uint32_t qpn = le32toh(cqe->qpn);
	struct vstellar_qp *qp = cq->last_qp;

	memset(wc, 0, sizeof(*wc));
	wc->wr_id = le64toh(cqe->wr_id);
	wc->status = cqe->status;
	wc->opcode = cqe->opcode;
	wc->vendor_err = cqe->vendor_err;
	wc->byte_len = le32toh(cqe->byte_len);
	wc->qp_num = qpn;
	wc->src_qp = le32toh(cqe->src_qp);
	if (cqe->wc_flags & VSTELLAR_CQE_WITH_IMM) {
		wc->wc_flags |= IBV_WC_WITH_IMM;
		wc->imm_data = cqe->imm_data;
	}
	if (cqe->wc_flags & VSTELLAR_CQE_GRH)
		wc->wc_flags |= IBV_WC_GRH;

	if (!qp || qp->qpn != qpn) {
		qp = vstellar_qp_find(ctx, qpn);
		cq->last_qp = qp;
	}
	if (!qp)
		return;
	if (cqe->opcode & VSTELLAR_WC_RECV)
		vstellar_wq_retire(&qp->rq, le16toh(cqe->wqe_idx));
	else
		vstellar_wq_retire(&qp->sq, le16toh(cqe->wqe_idx));
}

static int vstellar_poll_cq(struct ibv_cq *ibcq, int ne, struct ibv_wc *wc)
{
	struct vstellar_cq *cq = to_vcq(ibcq);
	uint32_t mask = (1U << cq->log_cqe) - 1;
	int n;

	pthread_spin_lock(&cq->lock);
	for (n = 0; n < ne; n++) {
		struct vstellar_cqe *cqe = &cq->ring[cq->ci & mask];
		uint8_t want = !((cq->ci >> cq->log_cqe) & 1);
		uint8_t owner;

		owner = atomic_load_explicit((_Atomic(uint8_t) *)&cqe->owner,
					     memory_order_relaxed);
		if ((owner & VSTELLAR_CQE_OWNER) != want)
			break;
		/* the CQE's body is read only after its owner byte */
		udma_from_device_barrier();
		vstellar_cqe_to_wc(cq, cqe, &wc[n]);
		cq->ci++;
	}
	if (n)
		/* CQEs are read before the device may reuse their slots */
		atomic_store_explicit((_Atomic(uint32_t) *)&cq->db->ci,
				      htole32(cq->ci), memory_order_release);
	pthread_spin_unlock(&cq->lock);
	return n;
}

/*
 * Arming is a doorbell store, no system call: vstellard treats the CQ as
 * armed while arm differs from the value it last consumed, and then sends
 * a notification that the driver turns into a completion event.
 */
static int vstellar_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct vstellar_cq *cq = to_vcq(ibcq);
	uint32_t val;

	pthread_spin_lock(&cq->lock);
	cq->arm_seq = (cq->arm_seq + 1) & ~VSTELLAR_CQ_ARM_SOLICITED;
	val = cq->arm_seq | (solicited_only ? VSTELLAR_CQ_ARM_SOLICITED : 0);
	atomic_store_explicit((_Atomic(uint32_t) *)&cq->db->arm, htole32(val),
			      memory_order_release);
	pthread_spin_unlock(&cq->lock);
	return 0;
}

/* ------------------------------------------------------------------ */
/* QP                                                                   */
/* ------------------------------------------------------------------ */

static void *vstellar_wq_slot(struct vstellar_wq *wq, uint32_t idx)
{
	return (char *)wq->ring +
	       ((size_t)(idx & ((1U << wq->log_wqe) - 1)) << wq->log_stride);
}

static bool vstellar_wq_full(struct vstellar_wq *wq)
{
	uint32_t ci = atomic_load_explicit((_Atomic(uint32_t) *)&wq->ci,
					   memory_order_relaxed);

	return wq->pi - ci >= (1U << wq->log_wqe);
}

static void vstellar_qp_ex_init(struct vstellar_qp *qp, uint64_t ops);

#define VSTELLAR_SEND_OPS                                                      \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |      \
	 IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |                  \
	 IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |        \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)

static struct ibv_qp *vstellar_create_qp_ex(struct ibv_context *context,
					    struct ibv_qp_init_attr_ex *attr)
{
	struct vstellar_context *ctx = to_vctx(context);
	struct vstellar_create_qp_cmd_resp resp = {};
	struct vstellar_create_qp_cmd cmd = {};
	struct ibv_qp_cap *cap = &attr->cap;
	uint32_t max_wr = min_t(uint32_t, ctx->max_qp_wr,
				1U << VSTELLAR_MAX_LOG_WQE);
	uint32_t sq_log_wqe, rq_log_wqe, sq_log_stride, rq_log_stride;
	uint32_t send_bytes, recv_bytes, fit;
	struct vstellar_qp *qp;
	int ret;

	if (attr->comp_mask & ~(IBV_QP_INIT_ATTR_PD |
				IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) ||
	    !(attr->comp_mask & IBV_QP_INIT_ATTR_PD)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
	    (attr->send_ops_flags & ~VSTELLAR_SEND_OPS)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if ((attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UD) ||
	    attr->srq) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (cap->max_send_wr > max_wr || cap->max_recv_wr > max_wr ||
	    cap->max_send_sge > ctx->max_send_sge ||
	    cap->max_recv_sge > ctx->max_recv_sge ||
	    cap->max_inline_data > ctx->max_inline_data) {
		errno = EINVAL;
		return NULL;
	}

	sq_log_wqe = log2_up(max_t(uint32_t, cap->max_send_wr, 1));
	rq_log_wqe = log2_up(max_t(uint32_t, cap->max_recv_wr, 1));
	fit = max_t(uint32_t, cap->max_send_sge, 1) *
	      sizeof(struct vstellar_sge);
	send_bytes = sizeof(struct vstellar_send_wqe) +
		     max_t(uint32_t, fit, cap->max_inline_data);
	recv_bytes = sizeof(struct vstellar_recv_wqe) +
		     max_t(uint32_t, cap->max_recv_sge, 1) *
			     sizeof(struct vstellar_sge);
	sq_log_stride = max_t(uint32_t, log2_up(send_bytes),
			      ctx->min_sq_log_stride);
	rq_log_stride = max_t(uint32_t, log2_up(recv_bytes),
			      ctx->min_rq_log_stride);
	if (sq_log_stride > VSTELLAR_MAX_LOG_STRIDE ||
	    rq_log_stride > VSTELLAR_MAX_LOG_STRIDE) {
		errno = EINVAL;
		return NULL;
	}

	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return NULL;
	if (pthread_spin_init(&qp->sq.lock, PTHREAD_PROCESS_PRIVATE))
		goto err_free;
	if (pthread_spin_init(&qp->rq.lock, PTHREAD_PROCESS_PRIVATE))
		goto err_sqlock;
	qp->sq.log_wqe = sq_log_wqe;
	qp->sq.log_stride = sq_log_stride;
	qp->rq.log_wqe = rq_log_wqe;
	qp->rq.log_stride = rq_log_stride;
	qp->sq.ring = vstellar_ring_alloc((size_t)1 << (sq_log_wqe + sq_log_stride),
					  &qp->sq.ring_size);
	if (!qp->sq.ring)
		goto err_rqlock;
	qp->rq.ring = vstellar_ring_alloc((size_t)1 << (rq_log_wqe + rq_log_stride),
					  &qp->rq.ring_size);
	if (!qp->rq.ring)
		goto err_sq;

	cmd.drv.sq_buf_addr = (uintptr_t)qp->sq.ring;
	cmd.drv.rq_buf_addr = (uintptr_t)qp->rq.ring;
	cmd.drv.sq_log_wqe = sq_log_wqe;
	cmd.drv.sq_log_stride = sq_log_stride;
	cmd.drv.rq_log_wqe = rq_log_wqe;
	cmd.drv.rq_log_stride = rq_log_stride;
	ret = ibv_cmd_create_qp_ex(context, &qp->vqp, attr, &cmd.ibv_cmd,
				   sizeof(cmd), &resp.ibv_resp, sizeof(resp));
	if (ret) {
		errno = ret;
		goto err_rq;
	}
	if (!vstellar_db_slot_ok(ctx, resp.drv.db_slot)) {
		verbs_err(&ctx->ibv_ctx, "vstellar: bad create_qp response\n");
		ibv_cmd_destroy_qp(&qp->vqp.qp);
		errno = EPROTO;
		goto err_rq;
	}
	qp->qpn = resp.drv.qpn;
	qp->db = vstellar_db_slot(ctx, resp.drv.db_slot);
	qp->sq_sig_all = attr->sq_sig_all;

	/* what the device granted, within what our slots hold */
	fit = ((1U << sq_log_stride) - sizeof(struct vstellar_send_wqe)) /
	      sizeof(struct vstellar_sge);
	qp->sq.max_sge = min_t(uint32_t, resp.drv.max_send_sge, fit);
	fit = ((1U << rq_log_stride) - sizeof(struct vstellar_recv_wqe)) /
	      sizeof(struct vstellar_sge);
	qp->rq.max_sge = min_t(uint32_t, resp.drv.max_recv_sge, fit);
	qp->max_inline_data = min_t(uint32_t, resp.drv.max_inline_data,
				    (1U << sq_log_stride) -
					    sizeof(struct vstellar_send_wqe));
	if (!(ctx->features & (1U << VIRTIO_VSTELLAR_F_INLINE)))
		qp->max_inline_data = 0;
	cap->max_send_wr = 1U << sq_log_wqe;
	cap->max_recv_wr = 1U << rq_log_wqe;
	cap->max_send_sge = qp->sq.max_sge;
	cap->max_recv_sge = qp->rq.max_sge;
	cap->max_inline_data = qp->max_inline_data;

	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		vstellar_qp_ex_init(qp, attr->send_ops_flags);
	vstellar_qp_table_add(ctx, qp);
	return &qp->vqp.qp;

err_rq:
	vstellar_ring_free(qp->rq.ring, qp->rq.ring_size);
err_sq:
	vstellar_ring_free(qp->sq.ring, qp->sq.ring_size);
err_rqlock:
	pthread_spin_destroy(&qp->rq.lock);
err_sqlock:
	pthread_spin_destroy(&qp->sq.lock);
err_free:
	free(qp);
	return NULL;
}

static struct ibv_qp *vstellar_create_qp(struct ibv_pd *pd,
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

static int vstellar_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
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
	attr->cap.max_recv_wr = 1U << qp->rq.log_wqe;
	attr->cap.max_send_sge = qp->sq.max_sge;
	attr->cap.max_recv_sge = qp->rq.max_sge;
	attr->cap.max_inline_data = qp->max_inline_data;
	init_attr->cap = attr->cap;
	return 0;
}

static int vstellar_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
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

static int vstellar_destroy_qp(struct ibv_qp *ibqp)
{
	struct vstellar_context *ctx = to_vctx(ibqp->context);
	struct vstellar_qp *qp = to_vqp(ibqp);
	struct vstellar_cq *cq;
	int ret;

	ret = ibv_cmd_destroy_qp(ibqp);
	if (ret)
		return ret;
	vstellar_qp_table_del(ctx, qp);
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

	vstellar_ring_free(qp->rq.ring, qp->rq.ring_size);
	vstellar_ring_free(qp->sq.ring, qp->sq.ring_size);
	pthread_spin_destroy(&qp->rq.lock);
	pthread_spin_destroy(&qp->sq.lock);
	free(qp);
	return 0;
}

/* ------------------------------------------------------------------ */
/* Posting                                                              */
/* ------------------------------------------------------------------ */

static int vstellar_wr_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
		return VSTELLAR_WR_RDMA_WRITE;
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return VSTELLAR_WR_RDMA_WRITE_IMM;
	case IBV_WR_SEND:
		return VSTELLAR_WR_SEND;
	case IBV_WR_SEND_WITH_IMM:
		return VSTELLAR_WR_SEND_IMM;
	case IBV_WR_RDMA_READ:
		return VSTELLAR_WR_RDMA_READ;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return VSTELLAR_WR_ATOMIC_CMP_SWP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return VSTELLAR_WR_ATOMIC_FETCH_ADD;
	default:
		return -1;
	}
}

/* Start a send WQE in the next SQ slot; the caller checked for room. */
static struct vstellar_send_wqe *
vstellar_send_wqe_start(struct vstellar_qp *qp, uint8_t opcode,
			uint64_t wr_id, unsigned int send_flags)
{
	struct vstellar_send_wqe *wqe = vstellar_wq_slot(&qp->sq, qp->sq.pi);

	memset(wqe, 0, sizeof(*wqe));
	wqe->wr_id = htole64(wr_id);
	wqe->opcode = opcode;
	if ((send_flags & IBV_SEND_SIGNALED) || qp->sq_sig_all)
		wqe->flags |= VSTELLAR_WQE_SIGNALED;
	if (send_flags & IBV_SEND_SOLICITED)
		wqe->flags |= VSTELLAR_WQE_SOLICITED;
	if (send_flags & IBV_SEND_FENCE)
		wqe->flags |= VSTELLAR_WQE_FENCE;
	return wqe;
}

static bool vstellar_opcode_inline_ok(uint8_t opcode)
{
	return opcode == VSTELLAR_WR_SEND || opcode == VSTELLAR_WR_SEND_IMM ||
	       opcode == VSTELLAR_WR_RDMA_WRITE ||
	       opcode == VSTELLAR_WR_RDMA_WRITE_IMM;
}

static int vstellar_wqe_set_inline(struct vstellar_qp *qp,
				   struct vstellar_send_wqe *wqe,
				   const struct ibv_data_buf *bufs,
				   size_t num_buf)
{
	uint8_t *dst = (uint8_t *)(wqe + 1);
	size_t total = 0, i;

	if (!vstellar_opcode_inline_ok(wqe->opcode))
		return EINVAL;
	for (i = 0; i < num_buf; i++) {
		if (bufs[i].length > qp->max_inline_data - total)
			return EINVAL;
		memcpy(dst + total, bufs[i].addr, bufs[i].length);
		total += bufs[i].length;
	}
	wqe->flags |= VSTELLAR_WQE_INLINE;
	wqe->inline_len = htole32(total);
	wqe->num_sge = 0;
	return 0;
}

static int vstellar_wqe_set_sges(struct vstellar_qp *qp,
				 struct vstellar_send_wqe *wqe,
				 const struct ibv_sge *sg, size_t num_sge)
{
	struct vstellar_sge *dst = (struct vstellar_sge *)(wqe + 1);
	size_t i;

	if (num_sge > qp->sq.max_sge)
		return EINVAL;
	for (i = 0; i < num_sge; i++) {
		dst[i].addr = htole64(sg[i].addr);
		dst[i].length = htole32(sg[i].length);
		dst[i].lkey = htole32(sg[i].lkey);
	}
	wqe->num_sge = num_sge;
	wqe->flags &= ~VSTELLAR_WQE_INLINE;
	wqe->inline_len = 0;
	return 0;
}

static int vstellar_build_send(struct vstellar_qp *qp, struct ibv_send_wr *wr)
{
	struct vstellar_send_wqe *wqe;
	int opcode = vstellar_wr_opcode(wr->opcode);

	if (opcode < 0)
		return EINVAL;
	wqe = vstellar_send_wqe_start(qp, opcode, wr->wr_id, wr->send_flags);

	switch (opcode) {
	case VSTELLAR_WR_RDMA_WRITE_IMM:
	case VSTELLAR_WR_SEND_IMM:
		wqe->imm_data = wr->imm_data;
		break;
	default:
		break;
	}
	switch (opcode) {
	case VSTELLAR_WR_RDMA_WRITE:
	case VSTELLAR_WR_RDMA_WRITE_IMM:
	case VSTELLAR_WR_RDMA_READ:
		wqe->u.rdma.remote_addr = htole64(wr->wr.rdma.remote_addr);
		wqe->u.rdma.rkey = htole32(wr->wr.rdma.rkey);
		break;
	case VSTELLAR_WR_ATOMIC_CMP_SWP:
	case VSTELLAR_WR_ATOMIC_FETCH_ADD:
		wqe->u.atomic.remote_addr = htole64(wr->wr.atomic.remote_addr);
		wqe->u.atomic.rkey = htole32(wr->wr.atomic.rkey);
		wqe->u.atomic.compare_add = htole64(wr->wr.atomic.compare_add);
		wqe->u.atomic.swap = htole64(wr->wr.atomic.swap);
		break;
	default:
		break;
	}
	if (qp->vqp.qp.qp_type == IBV_QPT_UD) {
		if (opcode != VSTELLAR_WR_SEND && opcode != VSTELLAR_WR_SEND_IMM)
			return EINVAL;
		if (!wr->wr.ud.ah)
			return EINVAL;
		wqe->u.ud.av = to_vah(wr->wr.ud.ah)->av;
		wqe->u.ud.remote_qpn = htole32(wr->wr.ud.remote_qpn);
		wqe->u.ud.remote_qkey = htole32(wr->wr.ud.remote_qkey);
	}

	if ((wr->send_flags & IBV_SEND_INLINE) && wr->num_sge) {
		struct ibv_data_buf bufs[16];
		int i;

		if (wr->num_sge > (int)ARRAY_SIZE(bufs))
			return EINVAL;
		for (i = 0; i < wr->num_sge; i++) {
			bufs[i].addr = (void *)(uintptr_t)wr->sg_list[i].addr;
			bufs[i].length = wr->sg_list[i].length;
		}
		return vstellar_wqe_set_inline(qp, wqe, bufs, wr->num_sge);
	}
	if (wr->num_sge < 0)
		return EINVAL;
	return vstellar_wqe_set_sges(qp, wqe, wr->sg_list, wr->num_sge);
}

/* Sends may be posted from RTS on (in SQD, SQE and ERR too: ERR flushes). */
static bool vstellar_sq_open(struct ibv_qp *ibqp)
{
	return ibqp->state != IBV_QPS_RESET && ibqp->state != IBV_QPS_INIT &&
	       ibqp->state != IBV_QPS_RTR;
}

static int vstellar_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
			      struct ibv_send_wr **bad_wr)
{
	struct vstellar_context *ctx = to_vctx(ibqp->context);
	struct vstellar_qp *qp = to_vqp(ibqp);
	uint32_t start;
	int ret = 0;

	/* IB: sends are refused before RTS (libibverbs tracks the state) */
	if (!vstellar_sq_open(ibqp)) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_spin_lock(&qp->sq.lock);
	start = qp->sq.pi;
	for (; wr; wr = wr->next) {
		if (vstellar_wq_full(&qp->sq)) {
			ret = ENOMEM;
			break;
		}
		ret = vstellar_build_send(qp, wr);
		if (ret)
			break;
		qp->sq.pi++;
	}
	if (ret)
		*bad_wr = wr;
	if (qp->sq.pi != start)
		vstellar_ring_db(ctx, &qp->db->sq_pi, qp->sq.pi);
	pthread_spin_unlock(&qp->sq.lock);
	return ret;
}

static int vstellar_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
			      struct ibv_recv_wr **bad_wr)
{
	struct vstellar_context *ctx = to_vctx(ibqp->context);
	struct vstellar_qp *qp = to_vqp(ibqp);
	uint32_t start;
	int ret = 0;

	/* IB: receives are refused in RESET */
	if (ibqp->state == IBV_QPS_RESET) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_spin_lock(&qp->rq.lock);
	start = qp->rq.pi;
	for (; wr; wr = wr->next) {
		struct vstellar_recv_wqe *wqe;
		struct vstellar_sge *sge;
		int i;

		if (vstellar_wq_full(&qp->rq)) {
			ret = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->rq.max_sge) {
			ret = EINVAL;
			break;
		}
		wqe = vstellar_wq_slot(&qp->rq, qp->rq.pi);
		wqe->wr_id = htole64(wr->wr_id);
		wqe->num_sge = htole32(wr->num_sge);
		wqe->reserved = 0;
		sge = (struct vstellar_sge *)(wqe + 1);
		for (i = 0; i < wr->num_sge; i++) {
			sge[i].addr = htole64(wr->sg_list[i].addr);
			sge[i].length = htole32(wr->sg_list[i].length);
			sge[i].lkey = htole32(wr->sg_list[i].lkey);
		}
		qp->rq.pi++;
	}
	if (ret)
		*bad_wr = wr;
	if (qp->rq.pi != start)
		vstellar_ring_db(ctx, &qp->db->rq_pi, qp->rq.pi);
	pthread_spin_unlock(&qp->rq.lock);
	return ret;
}

/* ------------------------------------------------------------------ */
/* Extended posting (ibv_wr_*), as perftest uses by default             */
/* ------------------------------------------------------------------ */

static void vstellar_wr_start(struct ibv_qp_ex *qpex)
{
	struct vstellar_qp *qp = qpex_to_vqp(qpex);

	pthread_spin_lock(&qp->sq.lock);
	qp->wr_start_pi = qp->sq.pi;
	qp->wr_err = vstellar_sq_open(&qp->vqp.qp) ? 0 : EINVAL;
	qp->wr_cur = NULL;
}

static int vstellar_wr_complete(struct ibv_qp_ex *qpex)
{
	struct vstellar_qp *qp = qpex_to_vqp(qpex);
	int ret = qp->wr_err;

	if (ret)
		qp->sq.pi = qp->wr_start_pi;
	else if (qp->sq.pi != qp->wr_start_pi)
		vstellar_ring_db(to_vctx(qp->vqp.qp.context), &qp->db->sq_pi,
				 qp->sq.pi);
	qp->wr_cur = NULL;
	pthread_spin_unlock(&qp->sq.lock);
	return ret;
}

static void vstellar_wr_abort(struct ibv_qp_ex *qpex)
{
	struct vstellar_qp *qp = qpex_to_vqp(qpex);

	qp->sq.pi = qp->wr_start_pi;
	qp->wr_cur = NULL;
	pthread_spin_unlock(&qp->sq.lock);
}

static struct vstellar_send_wqe *vstellar_wr_new(struct ibv_qp_ex *qpex,
						 uint8_t opcode)
{
	struct vstellar_qp *qp = qpex_to_vqp(qpex);
	struct vstellar_send_wqe *wqe;

	qp->wr_cur = NULL;
	if (qp->wr_err)
		return NULL;
	if (vstellar_wq_full(&qp->sq)) {
		qp->wr_err = ENOMEM;
		return NULL;
	}
	wqe = vstellar_send_wqe_start(qp, opcode, qpex->wr_id,
				      qpex->wr_flags);
	qp->sq.pi++;
	qp->wr_cur = wqe;
	return wqe;
}

static void vstellar_wr_rdma(struct ibv_qp_ex *qpex, uint8_t opcode,
			     uint32_t rkey, uint64_t remote_addr,
			     __be32 imm)
{
	struct vstellar_send_wqe *wqe = vstellar_wr_new(qpex, opcode);

	if (!wqe)
		return;
	wqe->u.rdma.remote_addr = htole64(remote_addr);
	wqe->u.rdma.rkey = htole32(rkey);
	wqe->imm_data = imm;
}

static void vstellar_wr_rdma_write(struct ibv_qp_ex *qpex, uint32_t rkey,
				   uint64_t remote_addr)
{
	vstellar_wr_rdma(qpex, VSTELLAR_WR_RDMA_WRITE, rkey, remote_addr, 0);
}

static void vstellar_wr_rdma_write_imm(struct ibv_qp_ex *qpex, uint32_t rkey,
				       uint64_t remote_addr, __be32 imm)
{
	vstellar_wr_rdma(qpex, VSTELLAR_WR_RDMA_WRITE_IMM, rkey, remote_addr,
			 imm);
}

static void vstellar_wr_rdma_read(struct ibv_qp_ex *qpex, uint32_t rkey,
				  uint64_t remote_addr)
{
	vstellar_wr_rdma(qpex, VSTELLAR_WR_RDMA_READ, rkey, remote_addr, 0);
}

static void vstellar_wr_send(struct ibv_qp_ex *qpex)
{
	vstellar_wr_new(qpex, VSTELLAR_WR_SEND);
}

static void vstellar_wr_send_imm(struct ibv_qp_ex *qpex, __be32 imm)
{
	struct vstellar_send_wqe *wqe = vstellar_wr_new(qpex,
							VSTELLAR_WR_SEND_IMM);

	if (wqe)
		wqe->imm_data = imm;
}

static void vstellar_wr_atomic(struct ibv_qp_ex *qpex, uint8_t opcode,
			       uint32_t rkey, uint64_t remote_addr,
			       uint64_t compare_add, uint64_t swap)
{
	struct vstellar_send_wqe *wqe = vstellar_wr_new(qpex, opcode);

	if (!wqe)
		return;
	wqe->u.atomic.remote_addr = htole64(remote_addr);
	wqe->u.atomic.rkey = htole32(rkey);
	wqe->u.atomic.compare_add = htole64(compare_add);
	wqe->u.atomic.swap = htole64(swap);
}

static void vstellar_wr_atomic_cmp_swp(struct ibv_qp_ex *qpex, uint32_t rkey,
				       uint64_t remote_addr, uint64_t compare,
				       uint64_t swap)
{
	vstellar_wr_atomic(qpex, VSTELLAR_WR_ATOMIC_CMP_SWP, rkey, remote_addr,
			   compare, swap);
}

static void vstellar_wr_atomic_fetch_add(struct ibv_qp_ex *qpex,
					 uint32_t rkey, uint64_t remote_addr,
					 uint64_t add)
{
	vstellar_wr_atomic(qpex, VSTELLAR_WR_ATOMIC_FETCH_ADD, rkey,
			   remote_addr, add, 0);
}

static void vstellar_wr_set_sge_list(struct ibv_qp_ex *qpex, size_t num_sge,
				     const struct ibv_sge *sg_list)
{
	struct vstellar_qp *qp = qpex_to_vqp(qpex);
	int ret;

	if (!qp->wr_cur) {
		if (!qp->wr_err)
			qp->wr_err = EINVAL;
		return;
	}
	ret = vstellar_wqe_set_sges(qp, qp->wr_cur, sg_list, num_sge);
	if (ret)
		qp->wr_err = ret;
}

static void vstellar_wr_set_sge(struct ibv_qp_ex *qpex, uint32_t lkey,
				uint64_t addr, uint32_t length)
{
	struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };

	vstellar_wr_set_sge_list(qpex, 1, &sge);
}

static void vstellar_wr_set_inline_data_list(struct ibv_qp_ex *qpex,
					     size_t num_buf,
					     const struct ibv_data_buf *buf_list)
{
	struct vstellar_qp *qp = qpex_to_vqp(qpex);
	int ret;

	if (!qp->wr_cur) {
		if (!qp->wr_err)
			qp->wr_err = EINVAL;
		return;
	}
	ret = vstellar_wqe_set_inline(qp, qp->wr_cur, buf_list, num_buf);
	if (ret)
		qp->wr_err = ret;
}

static void vstellar_wr_set_inline_data(struct ibv_qp_ex *qpex, void *addr,
					size_t length)
{
	struct ibv_data_buf buf = { .addr = addr, .length = length };

	vstellar_wr_set_inline_data_list(qpex, 1, &buf);
}

static void vstellar_wr_set_ud_addr(struct ibv_qp_ex *qpex, struct ibv_ah *ah,
				    uint32_t remote_qpn, uint32_t remote_qkey)
{
	struct vstellar_qp *qp = qpex_to_vqp(qpex);
	struct vstellar_send_wqe *wqe = qp->wr_cur;

	if (!wqe) {
		if (!qp->wr_err)
			qp->wr_err = EINVAL;
		return;
	}
	if (!ah || (wqe->opcode != VSTELLAR_WR_SEND &&
		    wqe->opcode != VSTELLAR_WR_SEND_IMM)) {
		qp->wr_err = EINVAL;
		return;
	}
	wqe->u.ud.av = to_vah(ah)->av;
	wqe->u.ud.remote_qpn = htole32(remote_qpn);
	wqe->u.ud.remote_qkey = htole32(remote_qkey);
}

static void vstellar_qp_ex_init(struct vstellar_qp *qp, uint64_t ops)
{
	struct ibv_qp_ex *qpex = &qp->vqp.qp_ex;

	qp->vqp.comp_mask |= VERBS_QP_EX;
	qpex->wr_start = vstellar_wr_start;
	qpex->wr_complete = vstellar_wr_complete;
	qpex->wr_abort = vstellar_wr_abort;
	if (ops & IBV_QP_EX_WITH_RDMA_WRITE)
		qpex->wr_rdma_write = vstellar_wr_rdma_write;
	if (ops & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
		qpex->wr_rdma_write_imm = vstellar_wr_rdma_write_imm;
	if (ops & IBV_QP_EX_WITH_RDMA_READ)
		qpex->wr_rdma_read = vstellar_wr_rdma_read;
	if (ops & IBV_QP_EX_WITH_SEND)
		qpex->wr_send = vstellar_wr_send;
	if (ops & IBV_QP_EX_WITH_SEND_WITH_IMM)
		qpex->wr_send_imm = vstellar_wr_send_imm;
	if (ops & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP)
		qpex->wr_atomic_cmp_swp = vstellar_wr_atomic_cmp_swp;
	if (ops & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
		qpex->wr_atomic_fetch_add = vstellar_wr_atomic_fetch_add;
	qpex->wr_set_sge = vstellar_wr_set_sge;
	qpex->wr_set_sge_list = vstellar_wr_set_sge_list;
	qpex->wr_set_inline_data = vstellar_wr_set_inline_data;
	qpex->wr_set_inline_data_list = vstellar_wr_set_inline_data_list;
	if (qp->vqp.qp.qp_type == IBV_QPT_UD)
		qpex->wr_set_ud_addr = vstellar_wr_set_ud_addr;
}

/* ------------------------------------------------------------------ */
/* AH (UD)                                                              */
/* ------------------------------------------------------------------ */

static struct ibv_ah *vstellar_create_ah(struct ibv_pd *pd,
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

static int vstellar_destroy_ah(struct ibv_ah *ibah)
{
	int ret;

	ret = ibv_cmd_destroy_ah(ibah);
	if (ret)
		return ret;
	free(to_vah(ibah));
	return 0;
}

/* ------------------------------------------------------------------ */
/* Context and device                                                   */
/* ------------------------------------------------------------------ */

static void vstellar_free_context(struct ibv_context *ibctx);

static const struct verbs_context_ops vstellar_ctx_ops = {
	.alloc_pd = vstellar_alloc_pd,
	.create_ah = vstellar_create_ah,
	.create_cq = vstellar_create_cq,
	.create_qp = vstellar_create_qp,
	.create_qp_ex = vstellar_create_qp_ex,
	.dealloc_pd = vstellar_dealloc_pd,
	.dereg_mr = vstellar_dereg_mr,
	.destroy_ah = vstellar_destroy_ah,
	.destroy_cq = vstellar_destroy_cq,
	.destroy_qp = vstellar_destroy_qp,
	.free_context = vstellar_free_context,
	.modify_qp = vstellar_modify_qp,
	.poll_cq = vstellar_poll_cq,
	.post_recv = vstellar_post_recv,
	.post_send = vstellar_post_send,
	.query_device_ex = vstellar_query_device_ex,
	.query_port = vstellar_query_port,
	.query_qp = vstellar_query_qp,
	.reg_mr = vstellar_reg_mr,
	.req_notify_cq = vstellar_req_notify_cq,
};

static struct verbs_context *vstellar_alloc_context(struct ibv_device *ibdev,
						    int cmd_fd,
						    void *private_data)
{
	struct vstellar_get_context_cmd_resp resp = {};
	struct vstellar_get_context_cmd cmd = {};
	struct vstellar_alloc_ucontext_resp *u = &resp.drv;
	struct vstellar_context *ctx;

	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx,
					   RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;
	pthread_mutex_init(&ctx->qp_table_lock, NULL);

	if (ibv_cmd_get_context(&ctx->ibv_ctx, &cmd.ibv_cmd, sizeof(cmd),
				&resp.ibv_resp, sizeof(resp)))
		goto err;
	if (u->db_page_size != VSTELLAR_DB_PAGE_SIZE ||
	    u->cqe_size != sizeof(struct vstellar_cqe) ||
	    u->db_first_slot != VSTELLAR_DB_FIRST_SLOT ||
	    u->db_slots > VSTELLAR_DB_SLOTS_PER_PAGE) {
		verbs_err(&ctx->ibv_ctx,
			  "vstellar: unexpected alloc_ucontext response (db page %u, cqe %u, first slot %u, slots %u)\n",
			  u->db_page_size, u->cqe_size, u->db_first_slot,
			  u->db_slots);
		errno = EPROTO;
		goto err;
	}
	ctx->ucontext = u->ucontext;
	ctx->features = u->device_features;
	ctx->max_qp_wr = u->max_qp_wr;
	ctx->max_cqe = u->max_cqe;
	ctx->max_send_sge = u->max_send_sge;
	ctx->max_recv_sge = u->max_recv_sge;
	ctx->max_inline_data = u->max_inline_data;
	ctx->num_cq_queues = u->num_cq_queues;
	ctx->min_sq_log_stride = max_t(uint32_t, u->min_sq_log_stride, 6);
	ctx->min_rq_log_stride = max_t(uint32_t, u->min_rq_log_stride, 4);
	ctx->db_slots = u->db_slots;
	ctx->db_page_size = u->db_page_size;
	ctx->db_suppress = ctx->features & (1U << VIRTIO_VSTELLAR_F_DB_SUPPRESS);

	ctx->db_page = mmap(NULL, ctx->db_page_size, PROT_READ | PROT_WRITE,
			    MAP_SHARED, cmd_fd, u->db_mmap_key);
	if (ctx->db_page == MAP_FAILED) {
		verbs_err(&ctx->ibv_ctx, "vstellar: mmap of the doorbell page failed: %m\n");
		ctx->db_page = NULL;
		goto err;
	}
	if (u->comp_mask & VSTELLAR_UCTX_KICK_PAGE) {
		ctx->kick_page = mmap(NULL, VSTELLAR_DB_PAGE_SIZE, PROT_WRITE,
				      MAP_SHARED, cmd_fd, u->kick_mmap_key);
		if (ctx->kick_page == MAP_FAILED) {
			verbs_err(&ctx->ibv_ctx, "vstellar: mmap of the kick page failed: %m\n");
			ctx->kick_page = NULL;
			goto err;
		}
	} else {
		verbs_warn(&ctx->ibv_ctx,
			   "vstellar: no kick page; doorbells rely on the device polling\n");
	}

	verbs_set_ops(&ctx->ibv_ctx, &vstellar_ctx_ops);
	return &ctx->ibv_ctx;

err:
	if (ctx->db_page)
		munmap(ctx->db_page, ctx->db_page_size);
	pthread_mutex_destroy(&ctx->qp_table_lock);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
	return NULL;
}

static void vstellar_free_context(struct ibv_context *ibctx)
{
	struct vstellar_context *ctx = to_vctx(ibctx);

	if (ctx->kick_page)
		munmap(ctx->kick_page, VSTELLAR_DB_PAGE_SIZE);
	if (ctx->db_page)
		munmap(ctx->db_page, ctx->db_page_size);
	pthread_mutex_destroy(&ctx->qp_table_lock);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

static struct verbs_device *vstellar_device_alloc(struct verbs_sysfs_dev *unused)
{
	struct vstellar_device *dev;

	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return NULL;
	return &dev->ibv_dev;
}

static void vstellar_uninit_device(struct verbs_device *verbs_device)
{
	free(container_of(verbs_device, struct vstellar_device, ibv_dev));
}

static const struct verbs_device_ops vstellar_dev_ops = {
	.name = "vstellar",
	.match_min_abi_version = VSTELLAR_UVERBS_ABI_VERSION,
	.match_max_abi_version = VSTELLAR_UVERBS_ABI_VERSION,
	.match_table = vstellar_match_table,
	.alloc_device = vstellar_device_alloc,
	.uninit_device = vstellar_uninit_device,
	.alloc_context = vstellar_alloc_context,
};
PROVIDER_DRIVER(vstellar, vstellar_dev_ops);
