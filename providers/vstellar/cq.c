// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * vStellar provider: completions. CQEs are polled from the CQ ring in this
 * process's memory by their owner (phase) bit, and the consumer index goes
 * back to the device through the CQ's doorbell slot; arming is a doorbell
 * store too. No system call on this path.
 */
#include <config.h>

#include <endian.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <util/udma_barrier.h>
#include <util/util.h>

#include "vstellar.h"

/*
 * The WQE with the low 16 bits @idx16 completed: everything up to it is
 * done. False if that WQE is not outstanding (completed already, or never
 * posted): a device that completes a WQE twice would hand the program a
 * wr_id it already got back (UCX asserts on it; a program freeing the
 * buffer twice would not), so such a CQE is reported and skipped.
 */
static bool vstellar_wq_retire(struct vstellar_cq *cq, uint32_t qpn,
			       const char *name, struct vstellar_wq *wq,
			       uint16_t idx16)
{
	uint32_t ci = atomic_load_explicit((_Atomic(uint32_t) *)&wq->ci,
					   memory_order_relaxed);
	uint32_t pi = atomic_load_explicit((_Atomic(uint32_t) *)&wq->pi,
					   memory_order_relaxed);
	uint32_t i = ci + (uint16_t)(idx16 - (uint16_t)ci);

	if (i - ci >= pi - ci) {
		if (!cq->bad_cqes++)
			fprintf(stderr,
				"vstellar: QP %u: the device completed %s WQE %u, which is not outstanding (completed up to %u, posted up to %u): CQE skipped\n",
				qpn, name, i, ci, pi);
		return false;
	}
	atomic_store_explicit((_Atomic(uint32_t) *)&wq->ci, i + 1,
			      memory_order_relaxed);
	return true;
}

/*
 * A CQE was read: the WQE it names (and, for a QP's own rings, every
 * earlier one) is done, so its ring slot may be posted again. False if
 * the CQE is to be skipped (it names no outstanding WQE).
 */
static bool vstellar_cqe_retire(struct vstellar_cq *cq,
				const struct vstellar_cqe *cqe)
{
	struct vstellar_context *ctx = to_vctx(cq->vcq.cq.context);
	uint32_t qpn = le32toh(cqe->qpn);
	struct vstellar_qp *qp = cq->last_qp;

	if (!qp || qp->qpn != qpn) {
		qp = vstellar_qp_table_lookup(ctx, qpn);
		cq->last_qp = qp;
	}
	if (!qp)
		return true;
	if ((cqe->opcode & VSTELLAR_WC_RECV) &&
	    (cqe->wc_flags & VSTELLAR_CQE_SRQ)) {
		/* SRQ WQEs complete out of order: count them */
		if (qp->srq)
			atomic_fetch_add_explicit(
				(_Atomic(uint32_t) *)&qp->srq->wq.ci, 1,
				memory_order_relaxed);
		return true;
	}
	if (cqe->opcode & VSTELLAR_WC_RECV)
		return vstellar_wq_retire(cq, qpn, "receive", &qp->rq,
					  le16toh(cqe->wqe_idx));
	return vstellar_wq_retire(cq, qpn, "send", &qp->sq,
				  le16toh(cqe->wqe_idx));
}

static unsigned int vstellar_cqe_wc_flags(const struct vstellar_cqe *cqe)
{
	unsigned int flags = 0;

	if (cqe->wc_flags & VSTELLAR_CQE_WITH_IMM)
		flags |= IBV_WC_WITH_IMM;
	if (cqe->wc_flags & VSTELLAR_CQE_WITH_INV)
		flags |= IBV_WC_WITH_INV;
	if (cqe->wc_flags & VSTELLAR_CQE_GRH)
		flags |= IBV_WC_GRH;
	return flags;
}

/*
 * RoCE has no service level in a completion; like mlx5 (and so as UCX's
 * ud_verbs expects), a datagram's sl says what its GRH area holds: 2 for
 * an IPv4 header, 1 for IPv6, 0 when there is no GRH.
 */
static uint8_t vstellar_cqe_sl(const struct vstellar_cqe *cqe)
{
	if (!(cqe->wc_flags & VSTELLAR_CQE_GRH))
		return 0;
	return (cqe->wc_flags & VSTELLAR_CQE_GRH_IPV4) ? 2 : 1;
}

/* False if the CQE is to be skipped (vstellar_cqe_retire). */
static bool vstellar_cqe_to_wc(struct vstellar_cq *cq,
			       const struct vstellar_cqe *cqe,
			       struct ibv_wc *wc)
{
	if (!vstellar_cqe_retire(cq, cqe))
		return false;
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = le64toh(cqe->wr_id);
	wc->status = cqe->status;
	wc->opcode = cqe->opcode;
	wc->vendor_err = cqe->vendor_err;
	wc->byte_len = le32toh(cqe->byte_len);
	wc->qp_num = le32toh(cqe->qpn);
	wc->src_qp = le32toh(cqe->src_qp);
	wc->wc_flags = vstellar_cqe_wc_flags(cqe);
	if (wc->wc_flags & IBV_WC_WITH_IMM)
		wc->imm_data = cqe->imm_data;
	else if (wc->wc_flags & IBV_WC_WITH_INV)
		wc->invalidated_rkey = le32toh(cqe->invalidated_rkey);
	wc->sl = vstellar_cqe_sl(cqe);
	return true;
}

/* The CQE at the consumer index if the device has written it, else NULL. */
static struct vstellar_cqe *vstellar_cq_next_cqe(struct vstellar_cq *cq)
{
	struct vstellar_cqe *cqe =
		&cq->ring[cq->ci & ((1U << cq->log_cqe) - 1)];
	uint8_t want = !((cq->ci >> cq->log_cqe) & 1);
	uint8_t owner;

	owner = atomic_load_explicit((_Atomic(uint8_t) *)&cqe->owner,
				     memory_order_relaxed);
	if ((owner & VSTELLAR_CQE_OWNER) != want)
		return NULL;
	/* the CQE's body is read only after its owner byte */
	udma_from_device_barrier();
	return cqe;
}

/* CQEs are read before the device may reuse their slots (release). */
static void vstellar_cq_update_ci(struct vstellar_cq *cq)
{
	atomic_store_explicit((_Atomic(uint32_t) *)&cq->db->ci,
			      htole32(cq->ci), memory_order_release);
}

int vstellar_poll_cq(struct ibv_cq *ibcq, int ne, struct ibv_wc *wc)
{
	struct vstellar_cq *cq = to_vcq(ibcq);
	struct vstellar_cqe *cqe;
	uint32_t start;
	int n = 0;

	pthread_spin_lock(&cq->lock);
	start = cq->ci;
	while (n < ne && (cqe = vstellar_cq_next_cqe(cq))) {
		if (vstellar_cqe_to_wc(cq, cqe, &wc[n]))
			n++;
		cq->ci++;
	}
	if (cq->ci != start)
		vstellar_cq_update_ci(cq);
	pthread_spin_unlock(&cq->lock);
	if (!n && vstellar_device_gone(to_vctx(ibcq->context)))
		return -EIO;
	return n;
}

/*
 * The extended poll API (ibv_start_poll/next_poll/end_poll): cq->cur is
 * the CQE the caller reads through the read_* functions. It is consumed
 * by next_poll or end_poll; the lock is held from start to end.
 */
static int vstellar_cq_take(struct vstellar_cq *cq)
{
	struct vstellar_cqe *cqe;

	while ((cqe = vstellar_cq_next_cqe(cq)) && !vstellar_cqe_retire(cq, cqe))
		cq->ci++;	/* skipped: it names no outstanding WQE */
	cq->cur = cqe;
	if (!cqe)
		return ENOENT;
	cq->vcq.cq_ex.wr_id = le64toh(cqe->wr_id);
	cq->vcq.cq_ex.status = cqe->status;
	return 0;
}

static int vstellar_start_poll(struct ibv_cq_ex *ibcq,
			       struct ibv_poll_cq_attr *attr)
{
	struct vstellar_cq *cq = to_vcq(ibv_cq_ex_to_cq(ibcq));
	int ret;

	if (attr->comp_mask)
		return EINVAL;
	pthread_spin_lock(&cq->lock);
	ret = vstellar_cq_take(cq);
	if (ret)
		pthread_spin_unlock(&cq->lock);
	if (ret == ENOENT && vstellar_device_gone(to_vctx(ibcq->context)))
		return EIO;
	return ret;
}

static int vstellar_next_poll(struct ibv_cq_ex *ibcq)
{
	struct vstellar_cq *cq = to_vcq(ibv_cq_ex_to_cq(ibcq));

	cq->ci++;
	return vstellar_cq_take(cq);
}

static void vstellar_end_poll(struct ibv_cq_ex *ibcq)
{
	struct vstellar_cq *cq = to_vcq(ibv_cq_ex_to_cq(ibcq));

	if (cq->cur) {
		cq->ci++;
		cq->cur = NULL;
	}
	vstellar_cq_update_ci(cq);
	pthread_spin_unlock(&cq->lock);
}

static struct vstellar_cqe *vstellar_cur_cqe(struct ibv_cq_ex *ibcq)
{
	return to_vcq(ibv_cq_ex_to_cq(ibcq))->cur;
}

static enum ibv_wc_opcode vstellar_read_opcode(struct ibv_cq_ex *ibcq)
{
	return vstellar_cur_cqe(ibcq)->opcode;
}

static uint32_t vstellar_read_vendor_err(struct ibv_cq_ex *ibcq)
{
	return vstellar_cur_cqe(ibcq)->vendor_err;
}

static uint32_t vstellar_read_byte_len(struct ibv_cq_ex *ibcq)
{
	return le32toh(vstellar_cur_cqe(ibcq)->byte_len);
}

static __be32 vstellar_read_imm_data(struct ibv_cq_ex *ibcq)
{
	const struct vstellar_cqe *cqe = vstellar_cur_cqe(ibcq);

	/*
	 * ibv_wc_read_invalidated_rkey() reads this too, and wants the key in
	 * host order, as ibv_wc.invalidated_rkey holds it.
	 */
	if (cqe->wc_flags & VSTELLAR_CQE_WITH_INV)
		return (__force __be32)le32toh(cqe->invalidated_rkey);
	return cqe->imm_data;
}

static uint32_t vstellar_read_qp_num(struct ibv_cq_ex *ibcq)
{
	return le32toh(vstellar_cur_cqe(ibcq)->qpn);
}

static uint32_t vstellar_read_src_qp(struct ibv_cq_ex *ibcq)
{
	return le32toh(vstellar_cur_cqe(ibcq)->src_qp);
}

static unsigned int vstellar_read_wc_flags(struct ibv_cq_ex *ibcq)
{
	return vstellar_cqe_wc_flags(vstellar_cur_cqe(ibcq));
}

/* RoCE has no LIDs. */
static uint32_t vstellar_read_slid(struct ibv_cq_ex *ibcq)
{
	return 0;
}

static uint8_t vstellar_read_sl(struct ibv_cq_ex *ibcq)
{
	return vstellar_cqe_sl(vstellar_cur_cqe(ibcq));
}

static uint8_t vstellar_read_dlid_path_bits(struct ibv_cq_ex *ibcq)
{
	return 0;
}

void vstellar_cq_ex_init(struct vstellar_cq *cq, uint64_t wc_flags)
{
	struct ibv_cq_ex *cqex = &cq->vcq.cq_ex;

	cqex->start_poll = vstellar_start_poll;
	cqex->next_poll = vstellar_next_poll;
	cqex->end_poll = vstellar_end_poll;
	cqex->read_opcode = vstellar_read_opcode;
	cqex->read_vendor_err = vstellar_read_vendor_err;
	cqex->read_wc_flags = vstellar_read_wc_flags;
	if (wc_flags & IBV_WC_EX_WITH_BYTE_LEN)
		cqex->read_byte_len = vstellar_read_byte_len;
	if (wc_flags & IBV_WC_EX_WITH_IMM)
		cqex->read_imm_data = vstellar_read_imm_data;
	if (wc_flags & IBV_WC_EX_WITH_QP_NUM)
		cqex->read_qp_num = vstellar_read_qp_num;
	if (wc_flags & IBV_WC_EX_WITH_SRC_QP)
		cqex->read_src_qp = vstellar_read_src_qp;
	if (wc_flags & IBV_WC_EX_WITH_SLID)
		cqex->read_slid = vstellar_read_slid;
	if (wc_flags & IBV_WC_EX_WITH_SL)
		cqex->read_sl = vstellar_read_sl;
	if (wc_flags & IBV_WC_EX_WITH_DLID_PATH_BITS)
		cqex->read_dlid_path_bits = vstellar_read_dlid_path_bits;
}

/*
 * Arming is a doorbell store, no system call: vstellard treats the CQ as
 * armed while arm differs from the value it last consumed, and then sends
 * a notification that the driver turns into a completion event.
 */
int vstellar_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
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
