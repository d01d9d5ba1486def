// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar shared receive queues (F_SRQ): create, modify (limit, and
 * resizing for user SRQs), query and destroy, for user and kernel SRQs
 * alike. The two differ in where the ring lives and who sizes it: a user
 * SRQ's is in the process's memory, laid out by the provider and pinned
 * here; a kernel SRQ's is DMA-coherent memory sized here from the
 * requested attributes, and vstellar_datapath.c posts to it.
 */
#include <linux/log2.h>
#include <rdma/ib_umem.h>

#include "vstellar.h"

/* The limit event fires below a fill level; it must be one the ring has. */
static bool vstellar_srq_limit_ok(u32 log_wqe, u32 srq_limit)
{
	return srq_limit < (1U << log_wqe);
}

static int vstellar_check_srq_ucmd(struct vstellar_dev *dev,
				   const struct vstellar_create_srq *u,
				   const struct ib_srq_attr *attr)
{
	u32 max_wr = le32_to_cpu(dev->attr.max_srq_wr);
	u32 max_sge = le32_to_cpu(dev->attr.max_srq_sge);

	if (u->comp_mask || u->reserved[0] || u->reserved[1])
		return -EINVAL;
	if (u->log_wqe > VSTELLAR_MAX_LOG_WQE ||
	    (1U << u->log_wqe) > max_wr || (1U << u->log_wqe) < attr->max_wr ||
	    !vstellar_srq_limit_ok(u->log_wqe, attr->srq_limit))
		return -EINVAL;
	/* a WQE with its SGEs must fit one slot */
	if (u->log_stride < VSTELLAR_MIN_RQ_LOG_STRIDE ||
	    u->log_stride > VSTELLAR_MAX_LOG_STRIDE || attr->max_sge > max_sge ||
	    sizeof(struct vstellar_recv_wqe) +
	    sizeof(struct vstellar_sge) * attr->max_sge > (1U << u->log_stride))
		return -EINVAL;
	return 0;
}

/* The provider's ring: its address and layout are in the create command. */
static int vstellar_srq_get_user_ring(struct vstellar_dev *dev,
				      struct vstellar_srq *srq,
				      const struct ib_srq_attr *attr,
				      struct ib_udata *udata,
				      struct vstellar_pages *ring)
{
	struct vstellar_create_srq ucmd = {};
	unsigned long pgsz;
	int err;

	if (udata->inlen < offsetofend(typeof(ucmd), log_stride))
		return -EINVAL;
	if (udata->inlen > sizeof(ucmd) &&
	    !ib_is_udata_cleared(udata, sizeof(ucmd),
				 udata->inlen - sizeof(ucmd)))
		return -EINVAL;
	err = ib_copy_from_udata(&ucmd, udata, min(sizeof(ucmd), udata->inlen));
	if (err)
		return err;
	err = vstellar_check_srq_ucmd(dev, &ucmd, attr);
	if (err)
		return err;
	srq->umem = vstellar_user_ring_get(dev, ucmd.buf_addr,
					   (size_t)1 << (ucmd.log_wqe +
							 ucmd.log_stride),
					   &pgsz);
	if (IS_ERR(srq->umem)) {
		err = PTR_ERR(srq->umem);
		srq->umem = NULL;
		return err;
	}
	srq->log_wqe = ucmd.log_wqe;
	srq->log_stride = ucmd.log_stride;
	vstellar_pages_of_umem(ring, srq->umem, pgsz);
	return 0;
}

/* A kernel ring: slots that hold a WQE and max_sge SGEs, max_wr of them. */
static int vstellar_srq_alloc_kernel_ring(struct vstellar_dev *dev,
					  struct vstellar_srq *srq,
					  const struct ib_srq_attr *attr,
					  struct vstellar_pages *ring)
{
	int err;

	if (!dev->kdb)
		return -EOPNOTSUPP;
	if (!attr->max_wr || attr->max_wr > le32_to_cpu(dev->attr.max_srq_wr) ||
	    attr->max_sge > le32_to_cpu(dev->attr.max_srq_sge))
		return -EINVAL;
	srq->log_wqe = order_base_2(attr->max_wr);
	srq->log_stride = max(VSTELLAR_MIN_RQ_LOG_STRIDE,
			      order_base_2(sizeof(struct vstellar_recv_wqe) +
					   sizeof(struct vstellar_sge) *
					   attr->max_sge));
	if (srq->log_wqe > VSTELLAR_MAX_LOG_WQE ||
	    !vstellar_srq_limit_ok(srq->log_wqe, attr->srq_limit))
		return -EINVAL;
	err = vstellar_kring_alloc(dev, &srq->kring,
				   (size_t)1 << (srq->log_wqe + srq->log_stride));
	if (err)
		return err;
	vstellar_pages_of_kring(ring, &srq->kring);
	return 0;
}

/* Whichever ring the SRQ has: a user SRQ has no kring, a kernel one no umem. */
static void vstellar_srq_free_ring(struct vstellar_dev *dev,
				   struct vstellar_srq *srq)
{
	ib_umem_release(srq->umem);
	vstellar_kring_free(dev, &srq->kring);
}

static int vstellar_srq_copy_to_user(struct vstellar_srq *srq,
				     struct ib_udata *udata)
{
	struct vstellar_create_srq_resp uresp = {
		.srqn = srq->srqn,
		.db_slot = srq->db_slot,
		.max_sge = srq->max_sge,
	};

	return ib_copy_to_udata(udata, &uresp, min(sizeof(uresp), udata->outlen));
}

int vstellar_create_srq(struct ib_srq *ibsrq,
			struct ib_srq_init_attr *init_attr,
			struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibsrq->device);
	struct vstellar_srq *srq = to_vsrq(ibsrq);
	struct ib_srq_attr *attr = &init_attr->attr;
	struct vstellar_create_srq_params params = {};
	struct vstellar_create_srq_result res;
	u32 fit;
	int err;

	if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_SRQ)) ||
	    init_attr->srq_type != IB_SRQT_BASIC)
		return -EOPNOTSUPP;
	srq->ucontext = vstellar_uctx_handle(udata);
	mutex_init(&srq->resize_mutex);
	spin_lock_init(&srq->lock);
	atomic_set(&srq->done, 0);
	if (udata)
		err = vstellar_srq_get_user_ring(dev, srq, attr, udata,
						 &params.ring);
	else
		err = vstellar_srq_alloc_kernel_ring(dev, srq, attr,
						     &params.ring);
	if (err)
		goto err_ring;

	params.pdn = to_vpd(ibsrq->pd)->pdn;
	params.log_wqe = srq->log_wqe;
	params.log_stride = srq->log_stride;
	params.max_sge = attr->max_sge;
	params.srq_limit = attr->srq_limit;
	err = vstellar_cmd_create_srq(dev, srq->ucontext, &params, &res);
	if (err)
		goto err_ring;
	srq->srqn = res.srqn;
	srq->db_slot = res.db_slot;
	srq->max_sge = res.max_sge;
	if (!udata) {
		/* the kernel rings this slot itself: it must be one of its page */
		if (!vstellar_kdb_slot_ok(srq->db_slot)) {
			err = -EIO;
			goto err_destroy;
		}
		/* never more SGEs than a slot holds, whatever the device granted */
		fit = ((1U << srq->log_stride) -
		       sizeof(struct vstellar_recv_wqe)) /
		      sizeof(struct vstellar_sge);
		srq->max_sge = min(srq->max_sge, fit);
	}
	attr->max_wr = 1U << srq->log_wqe;
	attr->max_sge = srq->max_sge;

	err = xa_insert_irq(&dev->srqs, srq->srqn, srq, GFP_KERNEL);
	if (err) {
		dev_err_ratelimited(&dev->vdev->dev,
				    "CREATE_SRQ: SRQN %u already in use\n",
				    srq->srqn);
		err = -EIO;
		goto err_destroy;
	}
	if (udata) {
		err = vstellar_srq_copy_to_user(srq, udata);
		if (err)
			goto err_xa;
	}
	return 0;

err_xa:
	xa_erase_irq(&dev->srqs, srq->srqn);
err_destroy:
	vstellar_cmd_destroy_srq(dev, srq->ucontext, srq->srqn);
err_ring:
	vstellar_srq_free_ring(dev, srq);
	return err;
}

/*
 * IB_SRQ_MAX_WR (F_RESIZE_SRQ, user SRQs): the provider hands a new zeroed
 * ring of the same stride; the device takes what the old ring holds and
 * reads the new one from then on. resize_mutex keeps the ring the device
 * reads the pinned one when a process races two resizes.
 */
static int vstellar_resize_user_srq(struct vstellar_srq *srq,
				    struct ib_srq_attr *attr,
				    struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(srq->ibsrq.device);
	struct vstellar_modify_srq ucmd;
	struct vstellar_pages pages;
	struct ib_umem *umem, *old;
	unsigned long pgsz;
	int err;

	if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_RESIZE_SRQ)) || !srq->umem)
		return -EOPNOTSUPP;
	if (!udata || udata->inlen < offsetofend(typeof(ucmd), log_wqe))
		return -EINVAL;
	err = ib_copy_from_udata(&ucmd, udata, min(sizeof(ucmd), udata->inlen));
	if (err)
		return err;
	if (ucmd.comp_mask || ucmd.reserved[0] || ucmd.reserved[1] ||
	    ucmd.reserved[2] || ucmd.log_wqe > VSTELLAR_MAX_LOG_WQE ||
	    (1U << ucmd.log_wqe) < attr->max_wr ||
	    (1U << ucmd.log_wqe) > le32_to_cpu(dev->attr.max_srq_wr))
		return -EINVAL;
	umem = vstellar_user_ring_get(dev, ucmd.buf_addr,
				      (size_t)1 << (ucmd.log_wqe + srq->log_stride),
				      &pgsz);
	if (IS_ERR(umem))
		return PTR_ERR(umem);
	vstellar_pages_of_umem(&pages, umem, pgsz);

	mutex_lock(&srq->resize_mutex);
	err = vstellar_cmd_resize_srq(dev, srq->ucontext, srq->srqn,
				      ucmd.log_wqe, &pages);
	if (err) {
		mutex_unlock(&srq->resize_mutex);
		ib_umem_release(umem);
		return err == -ENOSPC ? -EINVAL : err;
	}
	old = srq->umem;
	srq->umem = umem;
	srq->log_wqe = ucmd.log_wqe;
	mutex_unlock(&srq->resize_mutex);
	ib_umem_release(old);
	return 0;
}

int vstellar_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
			enum ib_srq_attr_mask attr_mask,
			struct ib_udata *udata)
{
	struct vstellar_srq *srq = to_vsrq(ibsrq);
	int err;

	if (attr_mask & ~(IB_SRQ_MAX_WR | IB_SRQ_LIMIT))
		return -EINVAL;
	if (attr_mask & IB_SRQ_MAX_WR) {
		err = vstellar_resize_user_srq(srq, attr, udata);
		if (err)
			return err;
	} else if (udata && udata->inlen &&
		   !ib_is_udata_cleared(udata, 0, udata->inlen)) {
		return -EINVAL;
	}
	if (!(attr_mask & IB_SRQ_LIMIT))
		return 0;
	if (!vstellar_srq_limit_ok(srq->log_wqe, attr->srq_limit))
		return -EINVAL;
	return vstellar_cmd_modify_srq(to_vdev(ibsrq->device), srq->ucontext,
				       srq->srqn, attr->srq_limit);
}

int vstellar_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr)
{
	struct vstellar_srq *srq = to_vsrq(ibsrq);

	return vstellar_cmd_query_srq(to_vdev(ibsrq->device), srq->ucontext,
				      srq->srqn, attr);
}

int vstellar_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibsrq->device);
	struct vstellar_srq *srq = to_vsrq(ibsrq);
	int err;

	err = vstellar_cmd_destroy_srq(dev, srq->ucontext, srq->srqn);
	if (err)
		return err;
	/* after this, no event still queued runs the SRQ's handler */
	xa_erase_irq(&dev->srqs, srq->srqn);
	vstellar_srq_free_ring(dev, srq);
	return 0;
}
