// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar completion queues: create, resize and destroy, for user and
 * kernel CQs alike. The two differ only in where the CQE ring lives: a
 * user CQ's is in the process's memory (sized by the provider, pinned
 * here) and the provider polls it; a kernel CQ's is DMA-coherent memory
 * allocated here, polled by vstellar_datapath.c.
 */
#include <linux/log2.h>
#include <rdma/ib_umem.h>

#include "vstellar.h"

/* A ring of 1 << log_cqe CQEs holds @cqe and the device allows it. */
static bool vstellar_cq_size_ok(struct vstellar_dev *dev, u32 log_cqe, int cqe)
{
	return log_cqe <= VSTELLAR_MAX_LOG_CQE && (1U << log_cqe) >= cqe &&
	       (1U << log_cqe) <= le32_to_cpu(dev->attr.max_cqe);
}

/* The provider's ring: its address and size are in the create command. */
static int vstellar_cq_get_user_ring(struct vstellar_dev *dev,
				     struct vstellar_cq *cq, int cqe,
				     struct ib_udata *udata,
				     struct vstellar_pages *ring)
{
	struct vstellar_create_cq ucmd;
	unsigned long pgsz;
	int err;

	if (udata->inlen < offsetofend(typeof(ucmd), log_cqe))
		return -EINVAL;
	err = ib_copy_from_udata(&ucmd, udata, min(sizeof(ucmd), udata->inlen));
	if (err)
		return err;
	if (ucmd.comp_mask || !vstellar_cq_size_ok(dev, ucmd.log_cqe, cqe))
		return -EINVAL;
	cq->umem = vstellar_user_ring_get(dev, ucmd.buf_addr,
					  sizeof(struct vstellar_cqe) << ucmd.log_cqe,
					  &pgsz);
	if (IS_ERR(cq->umem)) {
		err = PTR_ERR(cq->umem);
		cq->umem = NULL;
		return err;
	}
	cq->log_cqe = ucmd.log_cqe;
	vstellar_pages_of_umem(ring, cq->umem, pgsz);
	return 0;
}

/* A kernel ring: the smallest power of two that holds @cqe (2 at least). */
static int vstellar_cq_alloc_kernel_ring(struct vstellar_dev *dev,
					 struct vstellar_cq *cq, int cqe,
					 struct vstellar_pages *ring)
{
	int err;

	if (!dev->kdb)
		return -EOPNOTSUPP;
	cq->log_cqe = order_base_2(max(cqe, 2));
	if (!vstellar_cq_size_ok(dev, cq->log_cqe, cqe))
		return -EINVAL;
	err = vstellar_kring_alloc(dev, &cq->kring,
				   sizeof(struct vstellar_cqe) << cq->log_cqe);
	if (err)
		return err;
	vstellar_pages_of_kring(ring, &cq->kring);
	return 0;
}

/* Whichever ring the CQ has: a user CQ has no kring, a kernel one no umem. */
static void vstellar_cq_free_ring(struct vstellar_dev *dev,
				  struct vstellar_cq *cq)
{
	ib_umem_release(cq->umem);
	vstellar_kring_free(dev, &cq->kring);
}

static int vstellar_cq_copy_to_user(struct vstellar_cq *cq,
				    struct ib_udata *udata)
{
	struct vstellar_create_cq_resp uresp = {
		.cqn = cq->cqn,
		.db_slot = cq->db_slot,
		.log_cqe = cq->log_cqe,
	};

	return ib_copy_to_udata(udata, &uresp, min(sizeof(uresp), udata->outlen));
}

int vstellar_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
		       vstellar_uverbs_arg_t *arg)
{
	struct ib_udata *udata = vstellar_uverbs_udata(arg);
	struct vstellar_dev *dev = to_vdev(ibcq->device);
	struct vstellar_cq *cq = to_vcq(ibcq);
	struct vstellar_create_cq_params params = {};
	struct vstellar_create_cq_result res;
	int err;

	if (attr->flags)
		return -EOPNOTSUPP;
	if (attr->cqe < 1)
		return -EINVAL;
	cq->ucontext = vstellar_uctx_handle(udata);
	mutex_init(&cq->resize_mutex);
	spin_lock_init(&cq->lock);
	if (udata)
		err = vstellar_cq_get_user_ring(dev, cq, attr->cqe, udata,
						&params.ring);
	else
		err = vstellar_cq_alloc_kernel_ring(dev, cq, attr->cqe,
						    &params.ring);
	if (err)
		goto err_ring;

	params.log_cqe = cq->log_cqe;
	params.cq_queue = attr->comp_vector % dev->num_cqnq;
	err = vstellar_cmd_create_cq(dev, cq->ucontext, &params, &res);
	if (err)
		goto err_ring;
	cq->cqn = res.cqn;
	cq->db_slot = res.db_slot;
	ibcq->cqe = 1 << cq->log_cqe;
	/* the kernel rings this slot itself: it must be one of its page */
	if (!udata && !vstellar_kdb_slot_ok(cq->db_slot)) {
		err = -EIO;
		goto err_destroy;
	}
	err = xa_insert_irq(&dev->cqs, cq->cqn, cq, GFP_KERNEL);
	if (err) {
		dev_err_ratelimited(&dev->vdev->dev,
				    "CREATE_CQ: CQN %u already in use\n", cq->cqn);
		err = -EIO;
		goto err_destroy;
	}
	if (udata) {
		err = vstellar_cq_copy_to_user(cq, udata);
		if (err)
			goto err_xa;
	}
	return 0;

err_xa:
	xa_erase_irq(&dev->cqs, cq->cqn);
err_destroy:
	vstellar_cmd_destroy_cq(dev, cq->ucontext, cq->cqn);
err_ring:
	vstellar_cq_free_ring(dev, cq);
	return err;
}

/*
 * F_RESIZE_CQ, user CQs: the provider hands a new zeroed ring; the device
 * moves the CQEs not yet polled to its start. The provider holds its CQ
 * lock throughout, so nothing polls meanwhile; resize_mutex keeps two
 * resizes of one CQ (a hostile process) from pinning one ring while the
 * device writes another. Kernel CQs cannot be resized (no kernel ULP we
 * serve asks for it).
 */
int vstellar_resize_cq(struct ib_cq *ibcq, int cqe, struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibcq->device);
	struct vstellar_cq *cq = to_vcq(ibcq);
	struct vstellar_resize_cq_resp uresp = {};
	struct vstellar_resize_cq ucmd;
	struct vstellar_pages pages;
	struct ib_umem *umem, *old;
	unsigned long pgsz;
	u32 moved;
	int err;

	if (!udata || !cq->umem ||
	    !(dev->features & BIT(VIRTIO_VSTELLAR_F_RESIZE_CQ)))
		return -EOPNOTSUPP;
	if (udata->inlen < offsetofend(typeof(ucmd), log_cqe))
		return -EINVAL;
	err = ib_copy_from_udata(&ucmd, udata, min(sizeof(ucmd), udata->inlen));
	if (err)
		return err;
	if (ucmd.comp_mask || cqe < 1 ||
	    !vstellar_cq_size_ok(dev, ucmd.log_cqe, cqe))
		return -EINVAL;
	umem = vstellar_user_ring_get(dev, ucmd.buf_addr,
				      sizeof(struct vstellar_cqe) << ucmd.log_cqe,
				      &pgsz);
	if (IS_ERR(umem))
		return PTR_ERR(umem);
	vstellar_pages_of_umem(&pages, umem, pgsz);

	mutex_lock(&cq->resize_mutex);
	err = vstellar_cmd_resize_cq(dev, cq->ucontext, cq->cqn, ucmd.log_cqe,
				     &pages, &moved);
	if (err) {
		mutex_unlock(&cq->resize_mutex);
		ib_umem_release(umem);
		/* LIMIT: more CQEs outstanding than the new ring holds */
		return err == -ENOSPC ? -EINVAL : err;
	}
	old = cq->umem;
	cq->umem = umem;
	cq->log_cqe = ucmd.log_cqe;
	ibcq->cqe = 1 << cq->log_cqe;
	mutex_unlock(&cq->resize_mutex);
	ib_umem_release(old);

	uresp.cqe_moved = moved;
	uresp.log_cqe = ucmd.log_cqe;
	return ib_copy_to_udata(udata, &uresp, min(sizeof(uresp), udata->outlen));
}

int vstellar_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibcq->device);
	struct vstellar_cq *cq = to_vcq(ibcq);
	int err;

	err = vstellar_cmd_destroy_cq(dev, cq->ucontext, cq->cqn);
	if (err)
		return err;
	/* after this, no notification still queued runs the CQ's handler */
	xa_erase_irq(&dev->cqs, cq->cqn);
	vstellar_cq_free_ring(dev, cq);
	return 0;
}
