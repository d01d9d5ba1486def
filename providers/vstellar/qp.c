// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * vStellar provider: posting work requests. WQEs are written into the QP's
 * rings in this process's memory and the producer index into the
 * context's doorbell page; the kick page is touched only when the device
 * set need_kick. Both ibv_post_send/recv and the extended ibv_wr_* API.
 * And the context's QP table, by which the poller (cq.c) finds the QP a
 * CQE names.
 */
#include <config.h>

#include <endian.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <ccan/array_size.h>
#include <util/mmio.h>
#include <util/udma_barrier.h>
#include <util/util.h>

#include "vstellar.h"

/* ------------------------------------------------------------------ */
/* QP table: CQEs name their QP by QPN                                  */
/* ------------------------------------------------------------------ */

void vstellar_qp_table_init(struct vstellar_context *ctx)
{
	pthread_mutex_init(&ctx->qp_table_lock, NULL);
}

void vstellar_qp_table_fini(struct vstellar_context *ctx)
{
	pthread_mutex_destroy(&ctx->qp_table_lock);
}

void vstellar_qp_table_insert(struct vstellar_context *ctx,
			      struct vstellar_qp *qp)
{
	struct vstellar_qp **head =
		&ctx->qp_table[qp->qpn % VSTELLAR_QP_TABLE_SIZE];

	pthread_mutex_lock(&ctx->qp_table_lock);
	qp->hash_next = *head;
	*head = qp;
	pthread_mutex_unlock(&ctx->qp_table_lock);
}

void vstellar_qp_table_remove(struct vstellar_context *ctx,
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

struct vstellar_qp *vstellar_qp_table_lookup(struct vstellar_context *ctx,
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
/* Doorbells                                                            */
/* ------------------------------------------------------------------ */

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
	case IBV_WR_LOCAL_INV:
		return VSTELLAR_WR_LOCAL_INV;
	case IBV_WR_SEND_WITH_INV:
		return VSTELLAR_WR_SEND_WITH_INV;
	case IBV_WR_BIND_MW:
		return VSTELLAR_WR_BIND_MW;
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
	       opcode == VSTELLAR_WR_SEND_WITH_INV ||
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

/*
 * A window's remote rights, from ibv_mw_bind_info.mw_access_flags. Local
 * write means nothing for a window (the MR has it or not) and is ignored,
 * as other providers do; zero-based windows are not offered.
 */
static int vstellar_mw_access(unsigned int flags, __le32 *out)
{
	const unsigned int remote = IBV_ACCESS_REMOTE_READ |
				    IBV_ACCESS_REMOTE_WRITE |
				    IBV_ACCESS_REMOTE_ATOMIC;

	if (flags & ~(remote | IBV_ACCESS_LOCAL_WRITE))
		return EINVAL;
	*out = htole32(flags & remote);
	return 0;
}

/*
 * A BIND_MW WQE: the window's current rkey names it, new_rkey is the one
 * it gets. type 1 comes from ibv_bind_mw(), type 2 from a work request.
 */
static int vstellar_wqe_set_bind(struct vstellar_qp *qp,
				 struct vstellar_send_wqe *wqe,
				 struct ibv_mw *mw, uint32_t new_rkey,
				 const struct ibv_mw_bind_info *bi)
{
	if (!mw || qp->vqp.qp.qp_type != IBV_QPT_RC ||
	    (bi->length && !bi->mr) ||
	    (bi->mr && bi->mr->pd != mw->pd))
		return EINVAL;
	wqe->u.bind_mw.mw_rkey = htole32(mw->rkey);
	wqe->u.bind_mw.new_rkey = htole32(new_rkey);
	wqe->u.bind_mw.mr_lkey = htole32(bi->mr ? bi->mr->lkey : 0);
	wqe->u.bind_mw.addr = htole64(bi->addr);
	wqe->u.bind_mw.length = htole64(bi->length);
	wqe->u.bind_mw.mw_type = mw->type == IBV_MW_TYPE_1 ?
		VSTELLAR_MW_TYPE_1 : VSTELLAR_MW_TYPE_2;
	return vstellar_mw_access(bi->mw_access_flags,
				  &wqe->u.bind_mw.access);
}

static int vstellar_build_send(struct vstellar_qp *qp, struct ibv_send_wr *wr)
{
	struct vstellar_send_wqe *wqe;
	int opcode = vstellar_wr_opcode(wr->opcode);

	if (opcode < 0)
		return EINVAL;
	if (opcode >= VSTELLAR_WR_LOCAL_INV &&
	    !(to_vctx(qp->vqp.qp.context)->features &
	      (1U << VIRTIO_VSTELLAR_F_MW)))
		return EINVAL;
	wqe = vstellar_send_wqe_start(qp, opcode, wr->wr_id, wr->send_flags);

	switch (opcode) {
	case VSTELLAR_WR_LOCAL_INV:
		if (qp->vqp.qp.qp_type != IBV_QPT_RC)
			return EINVAL;
		wqe->invalidate_rkey = htole32(wr->invalidate_rkey);
		return 0;
	case VSTELLAR_WR_BIND_MW:
		/* a work request binds type 2 windows; ibv_bind_mw() type 1 */
		if (!wr->bind_mw.mw || wr->bind_mw.mw->type != IBV_MW_TYPE_2)
			return EINVAL;
		return vstellar_wqe_set_bind(qp, wqe, wr->bind_mw.mw,
					     wr->bind_mw.rkey,
					     &wr->bind_mw.bind_info);
	case VSTELLAR_WR_SEND_WITH_INV:
		wqe->invalidate_rkey = htole32(wr->invalidate_rkey);
		break;
	default:
		break;
	}

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
	if (qp->vqp.qp.qp_type == IBV_QPT_UC &&
	    (opcode == VSTELLAR_WR_RDMA_READ ||
	     opcode == VSTELLAR_WR_ATOMIC_CMP_SWP ||
	     opcode == VSTELLAR_WR_ATOMIC_FETCH_ADD))
		return EINVAL;
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

/*
 * ibv_bind_mw(): type 1 windows are bound through the send queue too, by a
 * BIND_MW WQE that completes like any other (IBV_WC_BIND_MW). The window
 * takes the next key byte; mw->rkey is the new rkey once the WQE is posted.
 */
int vstellar_bind_mw(struct ibv_qp *ibqp, struct ibv_mw *mw,
		     struct ibv_mw_bind *mw_bind)
{
	struct vstellar_context *ctx = to_vctx(ibqp->context);
	struct vstellar_qp *qp = to_vqp(ibqp);
	struct vstellar_send_wqe *wqe;
	uint32_t rkey = ibv_inc_rkey(mw->rkey);
	int ret;

	if (mw->type != IBV_MW_TYPE_1 || !vstellar_sq_open(ibqp) ||
	    (mw_bind->send_flags & IBV_SEND_INLINE))
		return EINVAL;
	pthread_spin_lock(&qp->sq.lock);
	if (vstellar_wq_full(&qp->sq)) {
		pthread_spin_unlock(&qp->sq.lock);
		return ENOMEM;
	}
	wqe = vstellar_send_wqe_start(qp, VSTELLAR_WR_BIND_MW, mw_bind->wr_id,
				      mw_bind->send_flags);
	ret = vstellar_wqe_set_bind(qp, wqe, mw, rkey, &mw_bind->bind_info);
	if (!ret) {
		qp->sq.pi++;
		vstellar_ring_db(ctx, &qp->db->sq_pi, qp->sq.pi);
		mw->rkey = rkey;
	}
	pthread_spin_unlock(&qp->sq.lock);
	return ret;
}

int vstellar_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
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

/*
 * Write receive WQEs into @wq (a QP's RQ or an SRQ; the caller holds its
 * lock) and publish the new producer index in @pi_db.
 */
static int vstellar_post_recv_wq(struct vstellar_context *ctx,
				 struct vstellar_wq *wq, __le32 *pi_db,
				 struct ibv_recv_wr *wr,
				 struct ibv_recv_wr **bad_wr)
{
	uint32_t start = wq->pi;
	int ret = 0;

	for (; wr; wr = wr->next) {
		struct vstellar_recv_wqe *wqe;
		struct vstellar_sge *sge;
		int i;

		if (vstellar_wq_full(wq)) {
			ret = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > wq->max_sge) {
			ret = EINVAL;
			break;
		}
		wqe = vstellar_wq_slot(wq, wq->pi);
		wqe->wr_id = htole64(wr->wr_id);
		wqe->num_sge = htole32(wr->num_sge);
		wqe->reserved = 0;
		sge = (struct vstellar_sge *)(wqe + 1);
		for (i = 0; i < wr->num_sge; i++) {
			sge[i].addr = htole64(wr->sg_list[i].addr);
			sge[i].length = htole32(wr->sg_list[i].length);
			sge[i].lkey = htole32(wr->sg_list[i].lkey);
		}
		wq->pi++;
	}
	if (ret)
		*bad_wr = wr;
	if (wq->pi != start)
		vstellar_ring_db(ctx, pi_db, wq->pi);
	return ret;
}

int vstellar_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		       struct ibv_recv_wr **bad_wr)
{
	struct vstellar_qp *qp = to_vqp(ibqp);
	int ret;

	/* IB: receives are refused in RESET, and on a QP with an SRQ */
	if (ibqp->state == IBV_QPS_RESET || qp->srq) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_spin_lock(&qp->rq.lock);
	ret = vstellar_post_recv_wq(to_vctx(ibqp->context), &qp->rq,
				    &qp->db->rq_pi, wr, bad_wr);
	pthread_spin_unlock(&qp->rq.lock);
	return ret;
}

int vstellar_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
			   struct ibv_recv_wr **bad_wr)
{
	struct vstellar_srq *srq = to_vsrq(ibsrq);
	int ret;

	pthread_spin_lock(&srq->wq.lock);
	ret = vstellar_post_recv_wq(to_vctx(ibsrq->context), &srq->wq,
				    &srq->db->pi, wr, bad_wr);
	pthread_spin_unlock(&srq->wq.lock);
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

static void vstellar_wr_send_inv(struct ibv_qp_ex *qpex,
				 uint32_t invalidate_rkey)
{
	struct vstellar_send_wqe *wqe =
		vstellar_wr_new(qpex, VSTELLAR_WR_SEND_WITH_INV);

	if (wqe)
		wqe->invalidate_rkey = htole32(invalidate_rkey);
}

static void vstellar_wr_local_inv(struct ibv_qp_ex *qpex,
				  uint32_t invalidate_rkey)
{
	struct vstellar_send_wqe *wqe =
		vstellar_wr_new(qpex, VSTELLAR_WR_LOCAL_INV);

	if (wqe)
		wqe->invalidate_rkey = htole32(invalidate_rkey);
	qpex_to_vqp(qpex)->wr_cur = NULL;	/* takes no SGEs */
}

static void vstellar_wr_bind_mw(struct ibv_qp_ex *qpex, struct ibv_mw *mw,
				uint32_t rkey,
				const struct ibv_mw_bind_info *bind_info)
{
	struct vstellar_qp *qp = qpex_to_vqp(qpex);
	struct vstellar_send_wqe *wqe = vstellar_wr_new(qpex,
						       VSTELLAR_WR_BIND_MW);
	int ret;

	if (!wqe)
		return;
	qp->wr_cur = NULL;	/* takes no SGEs */
	ret = (!mw || mw->type != IBV_MW_TYPE_2) ? EINVAL :
	      vstellar_wqe_set_bind(qp, wqe, mw, rkey, bind_info);
	if (ret && !qp->wr_err)
		qp->wr_err = ret;
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

void vstellar_qp_ex_init(struct vstellar_qp *qp, uint64_t ops)
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
	if (ops & IBV_QP_EX_WITH_SEND_WITH_INV)
		qpex->wr_send_inv = vstellar_wr_send_inv;
	if (ops & IBV_QP_EX_WITH_LOCAL_INV)
		qpex->wr_local_inv = vstellar_wr_local_inv;
	if (ops & IBV_QP_EX_WITH_BIND_MW)
		qpex->wr_bind_mw = vstellar_wr_bind_mw;
	qpex->wr_set_sge = vstellar_wr_set_sge;
	qpex->wr_set_sge_list = vstellar_wr_set_sge_list;
	qpex->wr_set_inline_data = vstellar_wr_set_inline_data;
	qpex->wr_set_inline_data_list = vstellar_wr_set_inline_data_list;
	if (qp->vqp.qp.qp_type == IBV_QPT_UD)
		qpex->wr_set_ud_addr = vstellar_wr_set_ud_addr;
}
