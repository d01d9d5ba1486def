// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar memory keys: MRs over user memory (REG_MR), the kernel's DMA MR
 * (the local DMA lkey, no device object), fast-registration MRs (F_MEM_MGT:
 * ALLOC_MR, then REG_MR WQEs from the page list map_mr_sg fills) and
 * memory windows (F_MW).
 */
#include <linux/log2.h>
#include <rdma/ib_umem.h>

#include "vstellar.h"

/* ---------------------------------------------------------------- */
/* MRs over user memory                                              */
/* ---------------------------------------------------------------- */

struct ib_mr *vstellar_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length,
				   u64 virt_addr, int access_flags,
				   struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibpd->device);
	struct vstellar_reg_mr_params params = {};
	struct vstellar_reg_mr_result res;
	struct vstellar_mr *mr;
	unsigned long pgsz;
	int err;

	BUILD_BUG_ON(VSTELLAR_ACCESS_MW_BIND != IB_ACCESS_MW_BIND);
	access_flags &= ~IB_ACCESS_OPTIONAL;
	if (access_flags & ~(VSTELLAR_ACCESS_VALID |
			     (dev->features & BIT(VIRTIO_VSTELLAR_F_MW) ?
			      VSTELLAR_ACCESS_MW_BIND : 0)))
		return ERR_PTR(-EOPNOTSUPP);
	if (!length || length > le64_to_cpu(dev->attr.max_mr_size))
		return ERR_PTR(-EINVAL);

	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->ucontext = vstellar_uctx_handle(udata);
	mr->umem = ib_umem_get(ibpd->device, start, length, access_flags);
	if (IS_ERR(mr->umem)) {
		err = PTR_ERR(mr->umem);
		goto err_free;
	}
	pgsz = ib_umem_find_best_pgsz(mr->umem, vstellar_pgsz_bitmap(dev),
				      virt_addr);
	if (!pgsz) {
		err = -EINVAL;
		goto err_umem;
	}

	params.pdn = to_vpd(ibpd)->pdn;
	params.access_flags = access_flags;
	params.iova = virt_addr;
	params.length = length;
	vstellar_pages_of_umem(&params.pages, mr->umem, pgsz);
	err = vstellar_cmd_reg_mr(dev, mr->ucontext, &params, &res);
	if (err)
		goto err_umem;
	mr->mrn = res.mrn;
	mr->ibmr.lkey = res.lkey;
	mr->ibmr.rkey = res.rkey;
	return &mr->ibmr;

err_umem:
	ib_umem_release(mr->umem);
err_free:
	kfree(mr);
	return ERR_PTR(err);
}

int vstellar_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct vstellar_mr *mr = to_vmr(ibmr);
	int err;

	if (mr->dma) {
		kfree(mr);
		return 0;
	}
	err = vstellar_cmd_dereg_mr(to_vdev(ibmr->device), mr->ucontext,
				    mr->mrn);
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
