// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar memory keys: MRs over user memory (REG_MR; on-demand ones with
 * F_ODP, paged by vstellar_odp.c) and over dmabufs
 * (F_DMABUF: REG_MR, INVALIDATE_MR when the exporter moves the buffer),
 * the kernel's DMA MR (the local DMA lkey, no device object),
 * fast-registration MRs (F_MEM_MGT: ALLOC_MR, then REG_MR WQEs from the
 * page list map_mr_sg fills) and memory windows (F_MW).
 */
#include <linux/dma-buf.h>
#include <linux/dma-resv.h>
#include <linux/log2.h>
#include <rdma/ib_umem.h>

#include "vstellar.h"

/* ---------------------------------------------------------------- */
/* MRs over user memory                                              */
/* ---------------------------------------------------------------- */

/*
 * The access flags a user MR may have, optional ones dropped as the core
 * allows: MW_BIND with F_MW, ON_DEMAND with F_ODP (and then no MW_BIND:
 * the device binds no windows to an on-demand MR).
 */
static int vstellar_user_mr_access(struct vstellar_dev *dev, int *access_flags)
{
	int valid = VSTELLAR_ACCESS_VALID;

	BUILD_BUG_ON(VSTELLAR_ACCESS_MW_BIND != IB_ACCESS_MW_BIND);
	*access_flags &= ~IB_ACCESS_OPTIONAL;
	if (*access_flags & IB_ACCESS_ON_DEMAND) {
		if (!vstellar_odp_on(dev))
			return -EOPNOTSUPP;
		valid |= IB_ACCESS_ON_DEMAND;
	} else if (dev->features & BIT(VIRTIO_VSTELLAR_F_MW)) {
		valid |= VSTELLAR_ACCESS_MW_BIND;
	}
	return *access_flags & ~valid ? -EOPNOTSUPP : 0;
}

/*
 * A new user MR of this context, once the access flags and the length
 * are ones the device takes (an implicit on-demand MR has no length).
 */
static struct vstellar_mr *vstellar_new_user_mr(struct vstellar_dev *dev,
						struct ib_udata *udata,
						int *access_flags, u64 length,
						bool implicit)
{
	struct vstellar_mr *mr;
	int err;

	err = vstellar_user_mr_access(dev, access_flags);
	if (err)
		return ERR_PTR(err);
	if (!implicit &&
	    (!length || length > le64_to_cpu(dev->attr.max_mr_size)))
		return ERR_PTR(-EINVAL);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->dev = dev;
	mr->ucontext = vstellar_uctx_handle(udata);
	return mr;
}

/* REG_MR of mr->umem's pages (user memory or a mapped dmabuf). */
static int vstellar_mr_register(struct vstellar_dev *dev, struct ib_pd *ibpd,
				struct vstellar_mr *mr, u64 virt_addr,
				u64 length, int access_flags)
{
	struct vstellar_reg_mr_params params = {};
	struct vstellar_reg_mr_result res;
	unsigned long pgsz;
	int err;

	pgsz = ib_umem_find_best_pgsz(mr->umem, vstellar_pgsz_bitmap(dev),
				      virt_addr);
	if (!pgsz)
		return -EINVAL;
	params.pdn = to_vpd(ibpd)->pdn;
	params.access_flags = access_flags;
	params.iova = virt_addr;
	params.length = length;
	vstellar_pages_of_umem(&params.pages, mr->umem, pgsz);
	err = vstellar_cmd_reg_mr(dev, mr->ucontext, &params, &res);
	if (err)
		return err;
	mr->mrn = res.mrn;
	mr->ibmr.lkey = res.lkey;
	mr->ibmr.rkey = res.rkey;
	return 0;
}

/*
 * An on-demand MR (F_ODP): REG_MR without pages; the device asks for them
 * as it meets them (vstellar_odp.c). start 0 and length U64_MAX make an
 * implicit MR, the whole address space, whose iovas are the addresses.
 */
static struct ib_mr *vstellar_reg_odp_mr(struct ib_pd *ibpd, u64 start,
					 u64 length, u64 virt_addr,
					 int access_flags,
					 struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibpd->device);
	bool implicit = !start && length == U64_MAX;
	struct vstellar_reg_mr_result res;
	struct vstellar_mr *mr;
	int err;

	mr = vstellar_new_user_mr(dev, udata, &access_flags, length, implicit);
	if (IS_ERR(mr))
		return ERR_CAST(mr);
	err = vstellar_odp_mr_init(mr, ibpd, start, length, virt_addr,
				   access_flags);
	if (err)
		goto err_free;
	err = vstellar_cmd_reg_odp_mr(dev, mr->ucontext, to_vpd(ibpd)->pdn,
				      access_flags & VSTELLAR_ACCESS_VALID,
				      implicit ? 0 : virt_addr,
				      implicit ? VSTELLAR_ODP_IMPLICIT_LENGTH :
						 length, &res);
	if (err)
		goto err_umem;
	mr->mrn = res.mrn;
	mr->ibmr.lkey = res.lkey;
	mr->ibmr.rkey = res.rkey;
	err = vstellar_odp_publish(mr);
	if (err)
		goto err_dereg;
	return &mr->ibmr;

err_dereg:
	vstellar_cmd_dereg_mr(dev, mr->ucontext, mr->mrn);
err_umem:
	vstellar_odp_mr_release(mr);
err_free:
	kfree(mr);
	return ERR_PTR(err);
}

struct ib_mr *vstellar_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length,
				   u64 virt_addr, int access_flags,
				   struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibpd->device);
	struct vstellar_mr *mr;
	int err;

	if (access_flags & IB_ACCESS_ON_DEMAND)
		return vstellar_reg_odp_mr(ibpd, start, length, virt_addr,
					   access_flags, udata);
	mr = vstellar_new_user_mr(dev, udata, &access_flags, length, false);
	if (IS_ERR(mr))
		return ERR_CAST(mr);
	mr->umem = ib_umem_get(ibpd->device, start, length, access_flags);
	if (IS_ERR(mr->umem)) {
		err = PTR_ERR(mr->umem);
		goto err_free;
	}
	err = vstellar_mr_register(dev, ibpd, mr, virt_addr, length,
				   access_flags);
	if (err)
		goto err_umem;
	return &mr->ibmr;

err_umem:
	ib_umem_release(mr->umem);
err_free:
	kfree(mr);
	return ERR_PTR(err);
}

/* ---------------------------------------------------------------- */
/* MRs over dmabufs (F_DMABUF)                                       */
/* ---------------------------------------------------------------- */

/*
 * The exporter is about to move the buffer (called with its reservation
 * lock held). The device must reach none of the old pages once we return,
 * so INVALIDATE_MR goes first, then the mapping. The MR stays invalid:
 * without on-demand paging the device cannot fault the new place in, so
 * every access through it fails (remote access error, local protection
 * error) until the consumer registers the buffer again. That is never
 * stale memory, which is what matters: the old range may already belong
 * to someone else.
 */
static void vstellar_dmabuf_move_notify(struct dma_buf_attachment *attach)
{
	struct ib_umem_dmabuf *umem_dmabuf = attach->importer_priv;
	struct vstellar_mr *mr = umem_dmabuf->private;
	int err;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (!umem_dmabuf->sgt)
		return;	/* not mapped: registration failed or already moved */
	err = vstellar_cmd_invalidate_mr(mr->dev, mr->ucontext, mr->mrn);
	if (err)
		ibdev_warn_ratelimited(&mr->dev->ibdev,
				       "MR %u: INVALIDATE_MR failed (%d) as its dmabuf moves\n",
				       mr->mrn, err);
	ib_umem_dmabuf_unmap_pages(umem_dmabuf);
}

static const struct dma_buf_attach_ops vstellar_dmabuf_attach_ops = {
	/* the exporter's memory may be another device's (a GPU's BAR) */
	.allow_peer2peer = true,
	.move_notify = vstellar_dmabuf_move_notify,
};

/*
 * ibv_reg_dmabuf_mr: [offset, offset + length) of the dmabuf fd, seen at
 * virt_addr. The pages are the exporter's DMA addresses, which with no
 * vIOMMU are guest-physical: RAM, or device memory that QEMU backs with
 * an fd and so hands vstellard in the memory table. Dynamic attachment,
 * as mlx5's: the exporter may move the buffer (move_notify above).
 */
struct ib_mr *vstellar_reg_user_mr_dmabuf(struct ib_pd *ibpd, u64 offset,
					  u64 length, u64 virt_addr, int fd,
					  int access_flags,
					  vstellar_uverbs_arg_t *arg)
{
	struct ib_udata *udata = vstellar_uverbs_udata(arg);
	struct vstellar_dev *dev = to_vdev(ibpd->device);
	struct ib_umem_dmabuf *umem_dmabuf;
	struct dma_resv *resv;
	struct vstellar_mr *mr;
	int err;

	/* the exporter's pages are not the process's: nothing to fault in */
	if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_DMABUF)) ||
	    (access_flags & IB_ACCESS_ON_DEMAND))
		return ERR_PTR(-EOPNOTSUPP);
	mr = vstellar_new_user_mr(dev, udata, &access_flags, length, false);
	if (IS_ERR(mr))
		return ERR_CAST(mr);
	umem_dmabuf = ib_umem_dmabuf_get(ibpd->device, offset, length, fd,
					 access_flags,
					 &vstellar_dmabuf_attach_ops);
	if (IS_ERR(umem_dmabuf)) {
		err = PTR_ERR(umem_dmabuf);
		goto err_free;
	}
	umem_dmabuf->private = mr;
	mr->umem = &umem_dmabuf->umem;

	/* Held until the MR exists, so move_notify sees it whole or unmapped. */
	resv = umem_dmabuf->attach->dmabuf->resv;
	dma_resv_lock(resv, NULL);
	err = ib_umem_dmabuf_map_pages(umem_dmabuf);
	if (!err) {
		err = vstellar_mr_register(dev, ibpd, mr, virt_addr, length,
					   access_flags);
		if (err)
			ib_umem_dmabuf_unmap_pages(umem_dmabuf);
	}
	dma_resv_unlock(resv);
	if (err)
		goto err_umem;
	return &mr->ibmr;

err_umem:
	ib_umem_release(mr->umem);
err_free:
	kfree(mr);
	return ERR_PTR(err);
}

/*
 * Faults and prefetches are done and no new ones start before DEREG_MR,
 * so none maps pages into an MRN the device may give to another MR; the
 * umems go after it, when the device uses none of their pages.
 */
static int vstellar_dereg_odp_mr(struct vstellar_mr *mr)
{
	int err;

	vstellar_odp_retire(mr);
	err = vstellar_cmd_dereg_mr(mr->dev, mr->ucontext, mr->mrn);
	if (err) {
		vstellar_odp_unretire(mr);
		return err;
	}
	vstellar_odp_unpublish(mr);
	vstellar_odp_mr_release(mr);
	kfree(mr);
	return 0;
}

int vstellar_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct vstellar_mr *mr = to_vmr(ibmr);
	int err;

	if (mr->dma) {
		kfree(mr);
		return 0;
	}
	if (mr->on_demand)
		return vstellar_dereg_odp_mr(mr);
	if (mr->umem && mr->umem->is_dmabuf) {
		struct ib_umem_dmabuf *umem_dmabuf = to_ib_umem_dmabuf(mr->umem);
		struct dma_resv *resv = umem_dmabuf->attach->dmabuf->resv;

		/*
		 * Under the lock move_notify takes, and unmapped before it is
		 * dropped, so that move_notify never names a freed handle.
		 */
		dma_resv_lock(resv, NULL);
		err = vstellar_cmd_dereg_mr(to_vdev(ibmr->device), mr->ucontext,
					    mr->mrn);
		if (!err)
			ib_umem_dmabuf_unmap_pages(umem_dmabuf);
		dma_resv_unlock(resv);
	} else {
		err = vstellar_cmd_dereg_mr(to_vdev(ibmr->device), mr->ucontext,
					    mr->mrn);
	}
	if (err)
		return err;
	ib_umem_release(mr->umem);
	vstellar_kring_free(to_vdev(ibmr->device), &mr->plist);
	kfree(mr);
	return 0;
}

/* ---------------------------------------------------------------- */
/* DMA MRs                                                           */
/* ---------------------------------------------------------------- */

/*
 * The core counts a device as a kernel verbs provider only with
 * get_dma_mr. Local access is the local DMA lkey; a DMA MR with remote
 * access (an rkey over all memory) is refused.
 */
struct ib_mr *vstellar_get_dma_mr(struct ib_pd *ibpd, int access_flags)
{
	struct vstellar_mr *mr;

	if (!to_vdev(ibpd->device)->kdb)
		return ERR_PTR(-EOPNOTSUPP);
	if (access_flags & ~IB_ACCESS_LOCAL_WRITE)
		return ERR_PTR(-EOPNOTSUPP);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->dma = true;
	mr->ibmr.lkey = VSTELLAR_LOCAL_DMA_LKEY;
	return &mr->ibmr;
}

/* ---------------------------------------------------------------- */
/* Fast-registration MRs (F_MEM_MGT)                                 */
/* ---------------------------------------------------------------- */

/*
 * An MR the device creates FREE (ALLOC_MR); IB_WR_REG_MR maps it to the
 * pages map_mr_sg listed, IB_WR_LOCAL_INV or a received SEND_WITH_INV
 * invalidates it. The page list is DMA-coherent memory the device reads
 * when it executes the REG_MR WQE.
 */
struct ib_mr *vstellar_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type mr_type,
			       u32 max_num_sg)
{
	struct vstellar_dev *dev = to_vdev(ibpd->device);
	struct vstellar_reg_mr_result res;
	struct vstellar_mr *mr;
	int err;

	if (!dev->kdb || !(dev->features & BIT(VIRTIO_VSTELLAR_F_MEM_MGT)) ||
	    mr_type != IB_MR_TYPE_MEM_REG)
		return ERR_PTR(-EOPNOTSUPP);
	if (!max_num_sg || max_num_sg > le32_to_cpu(dev->cfg.max_fast_reg_pages))
		return ERR_PTR(-EINVAL);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	err = vstellar_kring_alloc(dev, &mr->plist,
				   sizeof(__le64) * max_num_sg);
	if (err)
		goto err_free;
	err = vstellar_cmd_alloc_mr(dev, to_vpd(ibpd)->pdn, max_num_sg, &res);
	if (err)
		goto err_plist;
	mr->mrn = res.mrn;
	mr->max_pages = max_num_sg;
	mr->ibmr.lkey = res.lkey;
	mr->ibmr.rkey = res.rkey;
	return &mr->ibmr;

err_plist:
	vstellar_kring_free(dev, &mr->plist);
err_free:
	kfree(mr);
	return ERR_PTR(err);
}

static int vstellar_set_page(struct ib_mr *ibmr, u64 addr)
{
	struct vstellar_mr *mr = to_vmr(ibmr);
	__le64 *list = mr->plist.buf;

	if (mr->npages == mr->max_pages)
		return -ENOMEM;
	list[mr->npages++] = cpu_to_le64(addr);
	return 0;
}

/*
 * ib_map_mr_sg set ibmr->page_size; the device takes the page sizes of
 * page_size_cap. The list is only read by a later REG_MR WQE, whose
 * doorbell store orders it.
 */
int vstellar_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
		       unsigned int *sg_offset)
{
	struct vstellar_dev *dev = to_vdev(ibmr->device);
	struct vstellar_mr *mr = to_vmr(ibmr);
	u64 cap = le64_to_cpu(dev->cfg.page_size_cap);

	if (!mr->plist.buf)
		return -EINVAL;
	if (!is_power_of_2(ibmr->page_size) ||
	    !(cap & BIT_ULL(ilog2(ibmr->page_size))))
		return -EINVAL;
	mr->npages = 0;
	return ib_sg_to_pages(ibmr, sg, sg_nents, sg_offset, vstellar_set_page);
}

/* ---------------------------------------------------------------- */
/* Memory windows (F_MW)                                             */
/* ---------------------------------------------------------------- */

/*
 * The device keeps the window and checks every bind and access; binding
 * happens in the send queue (the provider's BIND_MW WQEs), so only
 * allocation goes through the kernel.
 */
int vstellar_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibmw->device);
	struct vstellar_mw *mw = to_vmw(ibmw);
	u32 type;

	if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_MW)))
		return -EOPNOTSUPP;
	switch (ibmw->type) {
	case IB_MW_TYPE_1:
		type = VSTELLAR_MW_TYPE_1;
		break;
	case IB_MW_TYPE_2:
		type = VSTELLAR_MW_TYPE_2;
		break;
	default:
		return -EINVAL;
	}
	mw->ucontext = vstellar_uctx_handle(udata);
	return vstellar_cmd_alloc_mw(dev, mw->ucontext, to_vpd(ibmw->pd)->pdn,
				     type, &mw->mwn, &ibmw->rkey);
}

int vstellar_dealloc_mw(struct ib_mw *ibmw)
{
	struct vstellar_mw *mw = to_vmw(ibmw);

	return vstellar_cmd_dealloc_mw(to_vdev(ibmw->device), mw->ucontext,
				       mw->mwn);
}
