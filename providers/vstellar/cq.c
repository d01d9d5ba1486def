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
#include <stdlib.h>
#include <string.h>

#include <util/udma_barrier.h>
#include <util/util.h>

#include "vstellar.h"

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

int vstellar_poll_cq(struct ibv_cq *ibcq, int ne, struct ibv_wc *wc)
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
