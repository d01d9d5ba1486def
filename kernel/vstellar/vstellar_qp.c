// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar queue pairs: create, modify, query and destroy, and multicast
 * attachment, for user and kernel QPs alike. The two differ in where the
 * SQ and RQ rings live and who sizes them: a user QP's rings are in the
 * process's memory, laid out by the provider and pinned here, and the
 * provider posts to them; a kernel QP's are DMA-coherent memory sized here
 * from the requested capabilities, and vstellar_datapath.c posts to them.
 */
#include <linux/log2.h>
#include <rdma/ib_umem.h>

#include "vstellar.h"

/*
 * The device's type for an IB QP type, or -EOPNOTSUPP. The GSI QP is the
 * MAD layer's (kernel only); the kernel data path builds RC and UD WQEs,
 * so UC is for user space only.
 */
static int vstellar_qp_type(struct vstellar_dev *dev, enum ib_qp_type type,
			    bool user)
{
	switch (type) {
	case IB_QPT_GSI:
		return user ? -EOPNOTSUPP : VSTELLAR_QPT_GSI;
	case IB_QPT_UD:
		if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_UD)))
			return -EOPNOTSUPP;
		return VSTELLAR_QPT_UD;
	case IB_QPT_RC:
		if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_RC)))
			return -EOPNOTSUPP;
		return VSTELLAR_QPT_RC;
	case IB_QPT_UC:
		if (!user || !(dev->features & BIT(VIRTIO_VSTELLAR_F_UC)))
			return -EOPNOTSUPP;
		return VSTELLAR_QPT_UC;
	default:
		return -EOPNOTSUPP;
	}
}

/*
 * A ring of 1 << log_wqe slots of 1 << log_stride bytes the provider chose:
 * it holds @want WQEs, the device allows it, and a slot is no smaller than
 * @min_log_stride.
 */
static bool vstellar_user_wq_ok(struct vstellar_dev *dev, u8 log_wqe,
				u8 log_stride, u32 want, u8 min_log_stride)
{
	return log_wqe <= VSTELLAR_MAX_LOG_WQE &&
	       (1U << log_wqe) <= le32_to_cpu(dev->attr.max_qp_wr) &&
	       (1U << log_wqe) >= want &&
	       log_stride >= min_log_stride &&
	       log_stride <= VSTELLAR_MAX_LOG_STRIDE;
}

/* A QP on an SRQ has no RQ: its RQ fields must be 0 (the ABI says so). */
static int vstellar_check_qp_ucmd(struct vstellar_dev *dev,
				  const struct vstellar_create_qp *u,
				  const struct ib_qp_init_attr *init)
{
	if (u->comp_mask ||
	    !vstellar_user_wq_ok(dev, u->sq_log_wqe, u->sq_log_stride,
				 init->cap.max_send_wr,
				 VSTELLAR_MIN_SQ_LOG_STRIDE))
		return -EINVAL;
	if (init->srq)
		return u->rq_buf_addr || u->rq_log_wqe || u->rq_log_stride ?
		       -EINVAL : 0;
	if (!vstellar_user_wq_ok(dev, u->rq_log_wqe, u->rq_log_stride,
				 init->cap.max_recv_wr,
				 VSTELLAR_MIN_RQ_LOG_STRIDE))
		return -EINVAL;
	return 0;
}

static struct ib_umem *vstellar_qp_get_user_wq(struct vstellar_dev *dev,
					       u64 addr, u8 log_wqe,
					       u8 log_stride,
					       unsigned long *pgsz)
{
	return vstellar_user_ring_get(dev, addr,
				      (size_t)1 << (log_wqe + log_stride), pgsz);
}

/* The provider's rings: their addresses and layout are in the command. */
static int vstellar_qp_get_user_rings(struct vstellar_dev *dev,
				      struct vstellar_qp *qp,
				      const struct ib_qp_init_attr *init,
				      struct ib_udata *udata,
				      struct vstellar_create_qp_params *params)
{
	struct vstellar_create_qp ucmd;
	unsigned long sq_pgsz, rq_pgsz;
	struct ib_umem *umem;
	int err;

	if (udata->inlen < offsetofend(typeof(ucmd), rq_log_stride))
		return -EINVAL;
	err = ib_copy_from_udata(&ucmd, udata, min(sizeof(ucmd), udata->inlen));
	if (err)
		return err;
	err = vstellar_check_qp_ucmd(dev, &ucmd, init);
	if (err)
		return err;
	qp->sq_log_wqe = ucmd.sq_log_wqe;
	qp->sq_log_stride = ucmd.sq_log_stride;
	qp->rq_log_wqe = ucmd.rq_log_wqe;
	qp->rq_log_stride = ucmd.rq_log_stride;

	umem = vstellar_qp_get_user_wq(dev, ucmd.sq_buf_addr, qp->sq_log_wqe,
				       qp->sq_log_stride, &sq_pgsz);
	if (IS_ERR(umem))
		return PTR_ERR(umem);
	qp->sq_umem = umem;
	if (init->srq) {
		vstellar_pages_of_umem(&params->sq, qp->sq_umem, sq_pgsz);
		return 0;
	}
	umem = vstellar_qp_get_user_wq(dev, ucmd.rq_buf_addr, qp->rq_log_wqe,
				       qp->rq_log_stride, &rq_pgsz);
	if (IS_ERR(umem))
		return PTR_ERR(umem);
	qp->rq_umem = umem;
	/* one page size for both rings: the smaller one fits both */
	sq_pgsz = min(sq_pgsz, rq_pgsz);
	vstellar_pages_of_umem(&params->sq, qp->sq_umem, sq_pgsz);
	vstellar_pages_of_umem(&params->rq, qp->rq_umem, sq_pgsz);
	return 0;
}

/*
 * Kernel rings, sized from the requested capabilities: a slot holds a WQE
 * and its SGEs. No inline data: kernel ULPs post SGEs.
 */
static int vstellar_qp_alloc_kernel_rings(struct vstellar_dev *dev,
					  struct vstellar_qp *qp,
					  const struct ib_qp_init_attr *init,
					  struct vstellar_create_qp_params *params)
{
	const struct ib_qp_cap *cap = &init->cap;
	u32 max_wr = le32_to_cpu(dev->attr.max_qp_wr);
	int err;

	if (!dev->kdb)
		return -EOPNOTSUPP;
	/* a user SRQ has no kernel ring to take receives from */
	if (init->srq && !to_vsrq(init->srq)->kring.buf)
		return -EOPNOTSUPP;
	if (cap->max_inline_data ||
	    cap->max_send_sge > le32_to_cpu(dev->attr.max_send_sge) ||
	    cap->max_recv_sge > le32_to_cpu(dev->attr.max_recv_sge) ||
	    cap->max_send_wr > max_wr || cap->max_recv_wr > max_wr)
		return -EINVAL;
	qp->sq_log_wqe = order_base_2(max(cap->max_send_wr, 1U));
	qp->sq_log_stride = order_base_2(sizeof(struct vstellar_send_wqe) +
					 sizeof(struct vstellar_sge) *
					 cap->max_send_sge);
	err = vstellar_kring_alloc(dev, &qp->sq,
				   (size_t)1 << (qp->sq_log_wqe + qp->sq_log_stride));
	if (err)
		return err;
	vstellar_pages_of_kring(&params->sq, &qp->sq);
	if (init->srq)
		return 0;

	qp->rq_log_wqe = order_base_2(max(cap->max_recv_wr, 1U));
	qp->rq_log_stride = max(VSTELLAR_MIN_RQ_LOG_STRIDE,
				order_base_2(sizeof(struct vstellar_recv_wqe) +
					     sizeof(struct vstellar_sge) *
					     cap->max_recv_sge));
	err = vstellar_kring_alloc(dev, &qp->rq,
				   (size_t)1 << (qp->rq_log_wqe + qp->rq_log_stride));
	if (err)
		return err;
	vstellar_pages_of_kring(&params->rq, &qp->rq);
	return 0;
}

/* Whichever rings the QP has: user QPs have no krings, kernel QPs no umem. */
static void vstellar_qp_free_rings(struct vstellar_dev *dev,
				   struct vstellar_qp *qp)
{
	ib_umem_release(qp->rq_umem);
	ib_umem_release(qp->sq_umem);
	vstellar_kring_free(dev, &qp->rq);
	vstellar_kring_free(dev, &qp->sq);
}

/* What the device granted, for the provider to lay out its WQEs by. */
static int vstellar_qp_copy_to_user(struct vstellar_qp *qp,
				    struct ib_udata *udata)
{
	struct vstellar_create_qp_resp uresp = {
		.qpn = qp->qpn,
		.db_slot = qp->db_slot,
		.max_send_sge = qp->cap.max_send_sge,
		.max_recv_sge = qp->cap.max_recv_sge,
		.max_inline_data = qp->cap.max_inline_data,
	};

	return ib_copy_to_udata(udata, &uresp, min(sizeof(uresp), udata->outlen));
}

/*
 * The capabilities the QP has. A user QP gets what the device granted (the
 * provider sized its slots for that); a kernel QP keeps the SGEs it asked
 * for, which its slots were sized for.
 */
static void vstellar_qp_set_cap(struct vstellar_qp *qp,
				struct ib_qp_init_attr *init, bool user,
				const struct vstellar_create_qp_result *res)
{
	init->cap.max_send_wr = 1U << qp->sq_log_wqe;
	init->cap.max_recv_wr = init->srq ? 0 : 1U << qp->rq_log_wqe;
	if (user) {
		init->cap.max_send_sge = res->max_send_sge;
		init->cap.max_recv_sge = init->srq ? 0 : res->max_recv_sge;
		init->cap.max_inline_data = res->max_inline_data;
	}
	qp->cap = init->cap;
}

int vstellar_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *init,
		       struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);
	struct vstellar_create_qp_params params = {};
	struct vstellar_create_qp_result res;
	int err;

	if (init->create_flags)
		return -EOPNOTSUPP;
	/* basic SRQs only (create_srq makes no other kind) */
	if (init->srq && init->srq->srq_type != IB_SRQT_BASIC)
		return -EOPNOTSUPP;
	err = vstellar_qp_type(dev, init->qp_type, udata);
	if (err < 0)
		return err;
	params.qp_type = err;
	/* the device puts no GSI QP on an SRQ */
	if (init->srq && init->qp_type == IB_QPT_GSI)
		return -EOPNOTSUPP;
	/* IB: a QP on an SRQ has no RQ; its receive caps are ignored */
	if (init->srq) {
		init->cap.max_recv_wr = 0;
		init->cap.max_recv_sge = 0;
	}
	qp->ucontext = vstellar_uctx_handle(udata);
	qp->sq_sig_all = init->sq_sig_type == IB_SIGNAL_ALL_WR;
	spin_lock_init(&qp->sq_lock);
	spin_lock_init(&qp->rq_lock);
	if (udata)
		err = vstellar_qp_get_user_rings(dev, qp, init, udata, &params);
	else
		err = vstellar_qp_alloc_kernel_rings(dev, qp, init, &params);
	if (err)
		goto err_rings;

	params.pdn = to_vpd(ibqp->pd)->pdn;
	params.send_cqn = to_vcq(init->send_cq)->cqn;
	params.recv_cqn = to_vcq(init->recv_cq)->cqn;
	params.sq_sig_all = qp->sq_sig_all;
	params.sq_log_wqe = qp->sq_log_wqe;
	params.sq_log_stride = qp->sq_log_stride;
	params.rq_log_wqe = qp->rq_log_wqe;
	params.rq_log_stride = qp->rq_log_stride;
	params.max_send_sge = init->cap.max_send_sge;
	params.max_recv_sge = init->cap.max_recv_sge;
	params.max_inline_data = init->cap.max_inline_data;
	if (init->srq) {
		params.use_srq = true;
		params.srqn = to_vsrq(init->srq)->srqn;
	}
	err = vstellar_cmd_create_qp(dev, qp->ucontext, &params, &res);
	if (err)
		goto err_rings;
	qp->qpn = res.qpn;
	qp->db_slot = res.db_slot;
	/* the kernel rings this slot itself: it must be one of its page */
	if (!udata && !vstellar_kdb_slot_ok(qp->db_slot)) {
		err = -EIO;
		goto err_destroy;
	}
	/* the device answers to QP 1 for the GSI QP, whatever its own QPN */
	ibqp->qp_num = init->qp_type == IB_QPT_GSI ? 1 : qp->qpn;
	vstellar_qp_set_cap(qp, init, udata, &res);

	err = xa_insert_irq(&dev->qps, qp->qpn, qp, GFP_KERNEL);
	if (err) {
		dev_err_ratelimited(&dev->vdev->dev,
				    "CREATE_QP: QPN %u already in use\n", qp->qpn);
		err = -EIO;
		goto err_destroy;
	}
	if (udata) {
		err = vstellar_qp_copy_to_user(qp, udata);
		if (err)
			goto err_xa;
	}
	return 0;

err_xa:
	xa_erase_irq(&dev->qps, qp->qpn);
err_destroy:
	vstellar_cmd_destroy_qp(dev, qp->ucontext, qp->qpn);
err_rings:
	vstellar_qp_free_rings(dev, qp);
	return err;
}


/*
 * F_MCAST, user and kernel UD QPs: the device checks the QP's type and
 * that gid is a RoCEv2 IPv4 or IPv6 group (ib_attach_mcast checks it too, uverbs
 * does not).
 */
int vstellar_attach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);

	if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_MCAST)))
		return -EOPNOTSUPP;
	return vstellar_cmd_mcast(dev, qp->ucontext, true, qp->qpn, gid, lid);
}

int vstellar_detach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);
	int err;

	if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_MCAST)))
		return -EOPNOTSUPP;
	err = vstellar_cmd_mcast(dev, qp->ucontext, false, qp->qpn, gid, lid);
	/* a lost device keeps no groups: leaving always works then */
	return vstellar_com_is_dead_err(err) ? 0 : err;
}

/* A kernel QP's ring indices follow a RESET. */
int vstellar_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
		       int attr_mask, struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);
	int err;

	if (attr_mask & ~VSTELLAR_QP_ATTR_MASK_VALID)
		return -EOPNOTSUPP;
	if (udata && udata->inlen &&
	    !ib_is_udata_cleared(udata, 0, udata->inlen))
		return -EINVAL;
	err = vstellar_cmd_modify_qp(dev, qp->ucontext, qp->qpn, attr,
				     attr_mask);
	if (!err && qp->sq.buf && (attr_mask & IB_QP_STATE) &&
	    attr->qp_state == IB_QPS_RESET)
		vstellar_kqp_reset(qp);
	return err;
}

int vstellar_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
		      int attr_mask, struct ib_qp_init_attr *init_attr)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);
	int err;

	err = vstellar_cmd_query_qp(dev, qp->ucontext, qp->qpn,
				    ibqp->qp_type == IB_QPT_RC ||
				    ibqp->qp_type == IB_QPT_UC, attr);
	if (err)
		return err;
	attr->cap = qp->cap;

	memset(init_attr, 0, sizeof(*init_attr));
	init_attr->qp_type = ibqp->qp_type;
	init_attr->send_cq = ibqp->send_cq;
	init_attr->recv_cq = ibqp->recv_cq;
	init_attr->srq = ibqp->srq;
	init_attr->cap = qp->cap;
	init_attr->sq_sig_type = qp->sq_sig_all ? IB_SIGNAL_ALL_WR :
						  IB_SIGNAL_REQ_WR;
	return 0;
}

int vstellar_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);
	int err;

	err = vstellar_cmd_destroy_qp(dev, qp->ucontext, qp->qpn);
	if (err)
		return err;
	xa_erase_irq(&dev->qps, qp->qpn);
	vstellar_qp_free_rings(dev, qp);
	return 0;
}
