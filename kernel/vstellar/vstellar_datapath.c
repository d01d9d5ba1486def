// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar kernel data path: posting WQEs (fast registration and
 * invalidation included), polling CQEs and arming CQs for kernel users,
 * on the rings of kernel CQs, QPs and SRQs. The MAD layer's GSI QP (QP1)
 * runs here, and with it the CM and rdma_cm; so do the RC and UD QPs,
 * SRQs and fast-registration MRs of NVMe over RDMA and NFS over RDMA.
 * User space runs its own data path in the provider, on rings in its
 * memory; these verbs refuse user objects.
 *
 * The rings are DMA-coherent kernel memory (allocated here, by the create
 * verbs) and the doorbells are in the kernel's own doorbell page
 * (VSTELLAR_CMD_KERNEL_DB). SGEs carry the local DMA lkey and DMA
 * (guest-physical) addresses, or the key of a fast-registration MR. No
 * verb here sends a command: each is memory operations plus, when the
 * device asks for it, one store to the kick page, so they work in any
 * context.
 */
#include <linux/dma-mapping.h>
#include <linux/io.h>
#include <linux/log2.h>
#include <rdma/ib_verbs.h>

#include "vstellar.h"

/* ---------------------------------------------------------------- */
/* The kernel's doorbell page                                        */
/* ---------------------------------------------------------------- */

int vstellar_kernel_db_init(struct vstellar_dev *dev)
{
	u32 page;
	int err;

	if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_UD)) || !dev->db_len ||
	    !dev->kick_addr || PAGE_SIZE != VSTELLAR_DB_PAGE_SIZE)
		return -EOPNOTSUPP;
	err = vstellar_cmd_kernel_db(dev, &page);
	if (err)
		return err;
	if (page >= dev->db_len / VSTELLAR_DB_PAGE_SIZE)
		return -EIO;
	/* RAM in the host (a shared memfd), so cacheable, as for user space */
	dev->kdb = memremap(dev->db_base + (u64)page * VSTELLAR_DB_PAGE_SIZE,
			    VSTELLAR_DB_PAGE_SIZE, MEMREMAP_WB);
	if (!dev->kdb)
		return -ENOMEM;
	dev->kkick = ioremap(dev->kick_addr, PAGE_SIZE);
	if (!dev->kkick) {
		memunmap(dev->kdb);
		dev->kdb = NULL;
		return -ENOMEM;
	}
	return 0;
}

void vstellar_kernel_db_fini(struct vstellar_dev *dev)
{
	if (dev->kkick)
		iounmap(dev->kkick);
	if (dev->kdb)
		memunmap(dev->kdb);
	dev->kkick = NULL;
	dev->kdb = NULL;
}

/* A slot the device handed out must be a doorbell slot of the page. */
bool vstellar_kdb_slot_ok(u32 slot)
{
	return slot >= VSTELLAR_DB_FIRST_SLOT && slot < VSTELLAR_DB_SLOTS_PER_PAGE;
}

static __le32 *vstellar_kdb_word(struct vstellar_dev *dev, u32 slot, u32 off)
{
	return dev->kdb + slot * VSTELLAR_DB_SLOT_SIZE + off;
}

/*
 * After an index store: the store is visible before need_kick is read
 * (pairs with the device's "need_kick = 1; fence; rescan"), and the kick
 * page is written only when the device sleeps.
 */
static void vstellar_kdb_ring(struct vstellar_dev *dev, __le32 *word, u32 val)
{
	/* the device reads the index, then the WQEs up to it */
	smp_store_release(word, cpu_to_le32(val));
	/* index store before the need_kick load (see above) */
	smp_mb();
	if (READ_ONCE(((struct vstellar_db_page_hdr *)dev->kdb)->need_kick))
		writel(VSTELLAR_VQ_KICK, dev->kkick);
}

/*
 * After a post: makes the WQEs from index @start to @pi visible, then
 * stores @pi in the queue's doorbell word at @off of @slot. Nothing to do
 * if nothing was posted.
 */
static void vstellar_kdb_publish(struct vstellar_dev *dev, u32 slot,
				 size_t off, u32 start, u32 pi)
{
	if (pi == start)
		return;
	dma_wmb();	/* WQEs before the index that publishes them */
	vstellar_kdb_ring(dev, vstellar_kdb_word(dev, slot, off), pi);
}

/* ---------------------------------------------------------------- */
/* Kernel rings                                                      */
/* ---------------------------------------------------------------- */

/* A CQE, SQ, RQ or SRQ ring, or an MR's page list: one DMA-coherent buffer. */
int vstellar_kring_alloc(struct vstellar_dev *dev, struct vstellar_kring *r,
			 size_t size)
{
	r->size = PAGE_ALIGN(size);
	r->buf = dma_alloc_coherent(vstellar_dma_device(dev->vdev), r->size,
				    &r->dma, GFP_KERNEL);
	return r->buf ? 0 : -ENOMEM;
}

/* Frees @r if it was allocated: a no-op for the rings of user objects. */
void vstellar_kring_free(struct vstellar_dev *dev, struct vstellar_kring *r)
{
	if (r->buf)
		dma_free_coherent(vstellar_dma_device(dev->vdev), r->size,
				  r->buf, r->dma);
	r->buf = NULL;
}

/* RESET forgets every WQE, on both sides: indices restart at 0. */
void vstellar_kqp_reset(struct vstellar_qp *qp)
{
	qp->sq_pi = 0;
	qp->rq_pi = 0;
	WRITE_ONCE(qp->sq_done, 0);
	WRITE_ONCE(qp->rq_done, 0);
}

/* ---------------------------------------------------------------- */
/* Polling and arming CQs                                            */
/* ---------------------------------------------------------------- */

static struct vstellar_cqe *vstellar_next_cqe(struct vstellar_cq *cq)
{
	struct vstellar_cqe *e = cq->kring.buf +
		(cq->ci & ((1U << cq->log_cqe) - 1)) * sizeof(*e);
	u8 want = ((cq->ci >> cq->log_cqe) & 1) ? 0 : VSTELLAR_CQE_OWNER;

	if ((READ_ONCE(e->owner) & VSTELLAR_CQE_OWNER) != want)
		return NULL;
	dma_rmb();	/* the rest of the CQE after its owner bit */
	return e;
}

/* Index i (free-running) of the WQE a 16-bit wqe_idx names, given done. */
static u32 vstellar_wqe_index(u32 done, u16 wqe_idx)
{
	return done + (u16)(wqe_idx - (u16)done);
}

/*
 * Whether the WQE a completion names is one the device may complete: posted
 * (before pi) and not completed yet (at or after done). Anything else is a
 * device that completed a WQE twice or made one up; handing its wr_id to the
 * ULP would run a completion handler twice (a double free in nvmet), so the
 * CQE is reported and dropped.
 */
static bool vstellar_wqe_outstanding(struct vstellar_dev *dev,
				     struct vstellar_qp *qp, const char *wq,
				     u32 done, u32 pi, u32 i)
{
	if (likely(i - done < pi - done))
		return true;
	WARN_ONCE(1, "vstellar: QP %u: the device completed %s WQE %u, which is not outstanding (completed up to %u, posted up to %u)\n",
		  qp->ibqp.qp_num, wq, i, done, pi);
	ibdev_err_ratelimited(&dev->ibdev,
			      "QP %u: %s completion of WQE %u dropped: not outstanding (done %u, posted %u)\n",
			      qp->ibqp.qp_num, wq, i, done, pi);
	return false;
}

/*
 * A receive from the QP's SRQ: the device wrote the WQE's wr_id into the
 * CQE, and the SRQ's WQEs complete out of order, so only their number
 * counts (one more slot free).
 */
static void vstellar_srq_completed(struct vstellar_qp *qp)
{
	struct vstellar_srq *srq;

	if (!qp->ibqp.srq)
		return;
	srq = to_vsrq(qp->ibqp.srq);
	if (srq->kring.buf)
		atomic_inc(&srq->done);
}

/*
 * The device numbers WC opcodes as libibverbs does, which the kernel's
 * enum follows up to LOCAL_INV; REG_MR has a number of its own.
 */
static enum ib_wc_opcode vstellar_wc_opcode(u8 op)
{
	switch (op) {
	case VSTELLAR_WC_SEND:
		return IB_WC_SEND;
	case VSTELLAR_WC_RDMA_WRITE:
		return IB_WC_RDMA_WRITE;
	case VSTELLAR_WC_RDMA_READ:
		return IB_WC_RDMA_READ;
	case VSTELLAR_WC_COMP_SWAP:
		return IB_WC_COMP_SWAP;
	case VSTELLAR_WC_FETCH_ADD:
		return IB_WC_FETCH_ADD;
	case VSTELLAR_WC_BIND_MW:
		return IB_WC_BIND_MW;
	case VSTELLAR_WC_LOCAL_INV:
		return IB_WC_LOCAL_INV;
	case VSTELLAR_WC_REG_MR:
		return IB_WC_REG_MR;
	case VSTELLAR_WC_RECV_RDMA_WITH_IMM:
		return IB_WC_RECV_RDMA_WITH_IMM;
	default:
		return IB_WC_RECV;
	}
}

static bool vstellar_cqe_to_wc(struct vstellar_dev *dev,
			       const struct vstellar_cqe *e, struct ib_wc *wc)
{
	struct vstellar_qp *qp;
	u16 idx = le16_to_cpu(e->wqe_idx);
	u32 i;

	qp = xa_load(&dev->qps, le32_to_cpu(e->qpn));
	if (!qp || !qp->sq.buf)
		return false;	/* its QP is gone (or not a kernel QP) */
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = le64_to_cpu(e->wr_id);
	wc->status = e->status;
	wc->opcode = vstellar_wc_opcode(e->opcode);
	wc->vendor_err = e->vendor_err;
	wc->byte_len = le32_to_cpu(e->byte_len);
	wc->qp = &qp->ibqp;
	wc->port_num = VSTELLAR_PORT;
	if (e->opcode & VSTELLAR_WC_RECV) {
		wc->src_qp = le32_to_cpu(e->src_qp);
		if (e->wc_flags & VSTELLAR_CQE_GRH)
			wc->wc_flags |= IB_WC_GRH;
		if (e->wc_flags & VSTELLAR_CQE_WITH_IMM) {
			wc->wc_flags |= IB_WC_WITH_IMM;
			wc->ex.imm_data = e->imm_data;
		} else if (e->wc_flags & VSTELLAR_CQE_WITH_INV) {
			wc->wc_flags |= IB_WC_WITH_INVALIDATE;
			wc->ex.invalidate_rkey = le32_to_cpu(e->invalidated_rkey);
		}
		if (e->wc_flags & VSTELLAR_CQE_SRQ) {
			vstellar_srq_completed(qp);
		} else {
			i = vstellar_wqe_index(qp->rq_done, idx);
			if (!vstellar_wqe_outstanding(dev, qp, "receive", qp->rq_done,
						      READ_ONCE(qp->rq_pi), i))
				return false;
			WRITE_ONCE(qp->rq_done, i + 1);
		}
	} else {
		i = vstellar_wqe_index(qp->sq_done, idx);
		if (!vstellar_wqe_outstanding(dev, qp, "send", qp->sq_done,
					      READ_ONCE(qp->sq_pi), i))
			return false;
		WRITE_ONCE(qp->sq_done, i + 1);
	}
	return true;
}

int vstellar_poll_cq(struct ib_cq *ibcq, int num_entries, struct ib_wc *wc)
{
	struct vstellar_dev *dev = to_vdev(ibcq->device);
	struct vstellar_cq *cq = to_vcq(ibcq);
	struct vstellar_cqe *e;
	unsigned long flags;
	u32 start;
	int n = 0;

	if (!cq->kring.buf)
		return -EOPNOTSUPP;	/* a user CQ: the provider polls it */
	spin_lock_irqsave(&cq->lock, flags);
	start = cq->ci;
	while (n < num_entries && (e = vstellar_next_cqe(cq))) {
		if (vstellar_cqe_to_wc(dev, e, &wc[n]))
			n++;
		cq->ci++;
	}
	if (cq->ci != start) {
		__le32 *ci = vstellar_kdb_word(dev, cq->db_slot,
					       offsetof(struct vstellar_db_cq, ci));

		/* the CQEs are read before the device may reuse their slots */
		smp_store_release(ci, cpu_to_le32(cq->ci));
	}
	spin_unlock_irqrestore(&cq->lock, flags);
	return n;
}

/*
 * Arming is a new value in the slot's arm word: the device notifies once
 * for the next CQE it writes after seeing a value it has not consumed.
 */
int vstellar_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags)
{
	struct vstellar_dev *dev = to_vdev(ibcq->device);
	struct vstellar_cq *cq = to_vcq(ibcq);
	unsigned long irqflags;
	u32 arm;
	int ret = 0;

	if (!cq->kring.buf)
		return -EOPNOTSUPP;
	spin_lock_irqsave(&cq->lock, irqflags);
	cq->arm_seq = (cq->arm_seq + 1) & ~VSTELLAR_CQ_ARM_SOLICITED;
	arm = cq->arm_seq;
	if ((flags & IB_CQ_SOLICITED_MASK) == IB_CQ_SOLICITED)
		arm |= VSTELLAR_CQ_ARM_SOLICITED;
	WRITE_ONCE(*vstellar_kdb_word(dev, cq->db_slot,
				      offsetof(struct vstellar_db_cq, arm)),
		   cpu_to_le32(arm));
	/* pairs with the device's fence between its CQE store and arm load */
	smp_mb();
	if ((flags & IB_CQ_REPORT_MISSED_EVENTS) && vstellar_next_cqe(cq))
		ret = 1;
	spin_unlock_irqrestore(&cq->lock, irqflags);
	return ret;
}

/* ---------------------------------------------------------------- */
/* Posting to QPs                                                    */
/* ---------------------------------------------------------------- */

static void vstellar_put_sges(struct vstellar_sge *dst,
			      const struct ib_sge *src, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		dst[i].addr = cpu_to_le64(src[i].addr);
		dst[i].length = cpu_to_le32(src[i].length);
		dst[i].lkey = cpu_to_le32(src[i].lkey);
	}
}

static void vstellar_put_recv_wqe(struct vstellar_recv_wqe *wqe, u32 stride,
				  const struct ib_recv_wr *wr)
{
	memset(wqe, 0, stride);
	wqe->wr_id = cpu_to_le64(wr->wr_id);
	wqe->num_sge = cpu_to_le32(wr->num_sge);
	vstellar_put_sges((struct vstellar_sge *)(wqe + 1), wr->sg_list,
			  wr->num_sge);
}

/* The fields every send WQE has, in a slot cleared first; SGEs follow. */
static void vstellar_put_send_hdr(struct vstellar_qp *qp,
				  const struct ib_send_wr *wr,
				  struct vstellar_send_wqe *wqe, u8 opcode)
{
	memset(wqe, 0, 1U << qp->sq_log_stride);
	wqe->wr_id = cpu_to_le64(wr->wr_id);
	wqe->opcode = opcode;
	if (wr->send_flags & IB_SEND_SIGNALED)
		wqe->flags |= VSTELLAR_WQE_SIGNALED;
	if (wr->send_flags & IB_SEND_SOLICITED)
		wqe->flags |= VSTELLAR_WQE_SOLICITED;
	if (wr->send_flags & IB_SEND_FENCE)
		wqe->flags |= VSTELLAR_WQE_FENCE;
	wqe->num_sge = wr->num_sge;
	vstellar_put_sges((struct vstellar_sge *)(wqe + 1), wr->sg_list,
			  wr->num_sge);
}

static int vstellar_build_ud_wqe(struct vstellar_qp *qp,
				 const struct ib_send_wr *wr,
				 struct vstellar_send_wqe *wqe)
{
	const struct ib_ud_wr *ud = ud_wr(wr);

	if (wr->opcode != IB_WR_SEND && wr->opcode != IB_WR_SEND_WITH_IMM)
		return -EINVAL;
	if (!ud->ah)
		return -EINVAL;
	vstellar_put_send_hdr(qp, wr, wqe, wr->opcode == IB_WR_SEND ?
			      VSTELLAR_WR_SEND : VSTELLAR_WR_SEND_IMM);
	if (wr->opcode == IB_WR_SEND_WITH_IMM)
		wqe->imm_data = wr->ex.imm_data;
	wqe->u.ud.av = to_vah(ud->ah)->av;
	wqe->u.ud.remote_qpn = cpu_to_le32(ud->remote_qpn);
	wqe->u.ud.remote_qkey = cpu_to_le32(ud->remote_qkey);
	return 0;
}

/*
 * IB_WR_REG_MR: the device reads the page list map_mr_sg wrote when it
 * executes the WQE, and makes @reg->key the MR's lkey and rkey.
 */
static int vstellar_build_reg_mr(const struct ib_reg_wr *reg,
				 struct vstellar_send_wqe *wqe)
{
	struct vstellar_mr *mr = to_vmr(reg->mr);
	int access = reg->access & ~IB_ACCESS_OPTIONAL;

	if (!mr->plist.buf || !mr->npages ||
	    (access & ~(int)VSTELLAR_ACCESS_VALID) ||
	    (reg->key & ~0xffU) != (mr->ibmr.lkey & ~0xffU))
		return -EINVAL;
	wqe->u.reg_mr.iova = cpu_to_le64(mr->ibmr.iova);
	wqe->u.reg_mr.length = cpu_to_le64(mr->ibmr.length);
	wqe->u.reg_mr.page_list = cpu_to_le64(mr->plist.dma);
	wqe->u.reg_mr.npages = cpu_to_le32(mr->npages);
	wqe->u.reg_mr.key = cpu_to_le32(reg->key);
	wqe->u.reg_mr.access = cpu_to_le32(access);
	wqe->u.reg_mr.page_shift = ilog2(mr->ibmr.page_size);
	return 0;
}

/* The device's opcode for an RC work request, or -EINVAL. */
static int vstellar_rc_opcode(struct vstellar_dev *dev,
			      const struct ib_send_wr *wr)
{
	bool mem_mgt = dev->features & BIT(VIRTIO_VSTELLAR_F_MEM_MGT);
	bool atomic = dev->features & BIT(VIRTIO_VSTELLAR_F_ATOMIC);

	switch (wr->opcode) {
	case IB_WR_SEND:
		return VSTELLAR_WR_SEND;
	case IB_WR_SEND_WITH_IMM:
		return VSTELLAR_WR_SEND_IMM;
	case IB_WR_RDMA_WRITE:
		return VSTELLAR_WR_RDMA_WRITE;
	case IB_WR_RDMA_WRITE_WITH_IMM:
		return VSTELLAR_WR_RDMA_WRITE_IMM;
	case IB_WR_RDMA_READ:
		return VSTELLAR_WR_RDMA_READ;
	case IB_WR_ATOMIC_CMP_AND_SWP:
		return atomic ? VSTELLAR_WR_ATOMIC_CMP_SWP : -EINVAL;
	case IB_WR_ATOMIC_FETCH_AND_ADD:
		return atomic ? VSTELLAR_WR_ATOMIC_FETCH_ADD : -EINVAL;
	case IB_WR_SEND_WITH_INV:
		return mem_mgt ? VSTELLAR_WR_SEND_WITH_INV : -EINVAL;
	/* no SGEs: the device would refuse the WQE and fail the QP */
	case IB_WR_LOCAL_INV:
		return mem_mgt && !wr->num_sge ? VSTELLAR_WR_LOCAL_INV : -EINVAL;
	case IB_WR_REG_MR:
		return mem_mgt && !wr->num_sge ? VSTELLAR_WR_REG_MR : -EINVAL;
	default:
		return -EINVAL;
	}
}

static int vstellar_build_rc_wqe(struct vstellar_dev *dev,
				 struct vstellar_qp *qp,
				 const struct ib_send_wr *wr,
				 struct vstellar_send_wqe *wqe)
{
	int op = vstellar_rc_opcode(dev, wr);

	if (op < 0)
		return op;
	vstellar_put_send_hdr(qp, wr, wqe, op);
	switch (wr->opcode) {
	case IB_WR_SEND_WITH_IMM:
		wqe->imm_data = wr->ex.imm_data;
		break;
	case IB_WR_SEND_WITH_INV:
	case IB_WR_LOCAL_INV:
		wqe->invalidate_rkey = cpu_to_le32(wr->ex.invalidate_rkey);
		break;
	case IB_WR_RDMA_WRITE_WITH_IMM:
		wqe->imm_data = wr->ex.imm_data;
		fallthrough;
	case IB_WR_RDMA_WRITE:
	case IB_WR_RDMA_READ:
		wqe->u.rdma.remote_addr = cpu_to_le64(rdma_wr(wr)->remote_addr);
		wqe->u.rdma.rkey = cpu_to_le32(rdma_wr(wr)->rkey);
		break;
	case IB_WR_ATOMIC_CMP_AND_SWP:
	case IB_WR_ATOMIC_FETCH_AND_ADD:
		wqe->u.atomic.remote_addr =
			cpu_to_le64(atomic_wr(wr)->remote_addr);
		wqe->u.atomic.rkey = cpu_to_le32(atomic_wr(wr)->rkey);
		wqe->u.atomic.compare_add =
			cpu_to_le64(atomic_wr(wr)->compare_add);
		wqe->u.atomic.swap = cpu_to_le64(atomic_wr(wr)->swap);
		break;
	case IB_WR_REG_MR:
		return vstellar_build_reg_mr(reg_wr(wr), wqe);
	default:
		break;
	}
	return 0;
}

int vstellar_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
		       const struct ib_send_wr **bad_wr)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);
	u32 size = 1U << qp->sq_log_wqe, start;
	unsigned long flags;
	int err = 0;

	if (!qp->sq.buf) {
		*bad_wr = wr;
		return -EOPNOTSUPP;	/* a user QP: the provider posts */
	}
	spin_lock_irqsave(&qp->sq_lock, flags);
	start = qp->sq_pi;
	for (; wr; wr = wr->next) {
		void *slot;

		if (qp->sq_pi - READ_ONCE(qp->sq_done) >= size) {
			err = -ENOMEM;
			break;
		}
		/* inline data is not offered to kernel QPs (max_inline_data 0) */
		if (wr->num_sge > qp->cap.max_send_sge ||
		    (wr->send_flags & IB_SEND_INLINE)) {
			err = -EINVAL;
			break;
		}
		slot = qp->sq.buf + ((qp->sq_pi & (size - 1)) << qp->sq_log_stride);
		if (ibqp->qp_type == IB_QPT_RC)
			err = vstellar_build_rc_wqe(dev, qp, wr, slot);
		else
			err = vstellar_build_ud_wqe(qp, wr, slot);
		if (err)
			break;
		qp->sq_pi++;
	}
	vstellar_kdb_publish(dev, qp->db_slot,
			     offsetof(struct vstellar_db_qp, sq_pi), start, qp->sq_pi);
	spin_unlock_irqrestore(&qp->sq_lock, flags);
	if (err)
		*bad_wr = wr;
	return err;
}

int vstellar_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
		       const struct ib_recv_wr **bad_wr)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);
	u32 size = 1U << qp->rq_log_wqe, start;
	unsigned long flags;
	int err = 0;

	if (ibqp->srq) {
		*bad_wr = wr;
		return -EINVAL;		/* its receives go to the SRQ */
	}
	if (!qp->rq.buf) {
		*bad_wr = wr;
		return -EOPNOTSUPP;
	}
	spin_lock_irqsave(&qp->rq_lock, flags);
	start = qp->rq_pi;
	for (; wr; wr = wr->next) {
		struct vstellar_recv_wqe *wqe;

		if (qp->rq_pi - READ_ONCE(qp->rq_done) >= size) {
			err = -ENOMEM;
			break;
		}
		if (wr->num_sge > qp->cap.max_recv_sge) {
			err = -EINVAL;
			break;
		}
		wqe = qp->rq.buf + ((qp->rq_pi & (size - 1)) << qp->rq_log_stride);
		vstellar_put_recv_wqe(wqe, 1U << qp->rq_log_stride, wr);
		qp->rq_pi++;
	}
	vstellar_kdb_publish(dev, qp->db_slot,
			     offsetof(struct vstellar_db_qp, rq_pi), start, qp->rq_pi);
	spin_unlock_irqrestore(&qp->rq_lock, flags);
	if (err)
		*bad_wr = wr;
	return err;
}

/* ---------------------------------------------------------------- */
/* Posting to SRQs                                                   */
/* ---------------------------------------------------------------- */

/*
 * As post_recv, on the SRQ's ring and doorbell slot. A slot is free again
 * once as many WQEs completed as were posted before it: the device takes
 * the WQEs in ring order and copies each out before using it.
 */
int vstellar_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr,
			   const struct ib_recv_wr **bad_wr)
{
	struct vstellar_dev *dev = to_vdev(ibsrq->device);
	struct vstellar_srq *srq = to_vsrq(ibsrq);
	u32 size = 1U << srq->log_wqe, start;
	unsigned long flags;
	int err = 0;

	if (!srq->kring.buf) {
		*bad_wr = wr;
		return -EOPNOTSUPP;	/* a user SRQ: the provider posts */
	}
	spin_lock_irqsave(&srq->lock, flags);
	start = srq->pi;
	for (; wr; wr = wr->next) {
		void *slot;

		if (srq->pi - (u32)atomic_read(&srq->done) >= size) {
			err = -ENOMEM;
			break;
		}
		if (wr->num_sge > srq->max_sge) {
			err = -EINVAL;
			break;
		}
		slot = srq->kring.buf +
		       ((srq->pi & (size - 1)) << srq->log_stride);
		vstellar_put_recv_wqe(slot, 1U << srq->log_stride, wr);
		srq->pi++;
	}
	vstellar_kdb_publish(dev, srq->db_slot,
			     offsetof(struct vstellar_db_srq, pi), start, srq->pi);
	spin_unlock_irqrestore(&srq->lock, flags);
	if (err)
		*bad_wr = wr;
	return err;
}
