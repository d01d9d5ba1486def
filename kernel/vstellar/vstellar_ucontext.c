// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar user contexts: one device context per process (ALLOC_UCONTEXT),
 * its doorbell page and the kick page mapped into the process, and the
 * rings of user CQs, QPs and SRQs, which the process allocates and the
 * driver pins for the device.
 */
#include <rdma/ib_umem.h>
#include <rdma/ib_user_verbs.h>

#include "vstellar.h"

static struct rdma_user_mmap_entry *
vstellar_mmap_entry_insert(struct ib_ucontext *uctx, u64 address,
			   enum vstellar_mmap_kind kind, u64 *key)
{
	struct vstellar_user_mmap_entry *entry;
	int err;

	entry = kzalloc(sizeof(*entry), GFP_KERNEL);
	if (!entry)
		return NULL;
	entry->address = address;
	entry->kind = kind;
	err = rdma_user_mmap_entry_insert(uctx, &entry->rdma_entry, PAGE_SIZE);
	if (err) {
		kfree(entry);
		return NULL;
	}
	*key = rdma_user_mmap_get_offset(&entry->rdma_entry);
	return &entry->rdma_entry;
}

int vstellar_alloc_ucontext(struct ib_ucontext *ibuctx, struct ib_udata *udata)
{
	struct vstellar_ucontext *uctx = to_vuctx(ibuctx);
	struct vstellar_dev *dev = to_vdev(ibuctx->device);
	struct vstellar_alloc_ucontext_resp uresp = {};
	struct vstellar_alloc_ucontext_result res;
	u64 db_pages = dev->db_len / VSTELLAR_DB_PAGE_SIZE;
	u64 db_addr;
	int err;

	if (!db_pages || PAGE_SIZE != VSTELLAR_DB_PAGE_SIZE)
		return -EOPNOTSUPP;
	err = vstellar_cmd_alloc_ucontext(dev, &res);
	if (err)
		return err;
	uctx->handle = res.ucontext;
	uctx->db_page = res.db_page;
	if (!uctx->handle || uctx->db_page >= db_pages) {
		dev_err_ratelimited(&dev->vdev->dev,
				    "ALLOC_UCONTEXT: bad handle %u or doorbell page %u\n",
				    uctx->handle, uctx->db_page);
		err = -EIO;
		goto err_dealloc;
	}

	err = -ENOMEM;
	db_addr = dev->db_base + (u64)uctx->db_page * VSTELLAR_DB_PAGE_SIZE;
	uctx->db_entry = vstellar_mmap_entry_insert(ibuctx, db_addr,
						    VSTELLAR_MMAP_DB,
						    &uresp.db_mmap_key);
	if (!uctx->db_entry)
		goto err_dealloc;
	if (dev->kick_addr) {
		uctx->kick_entry = vstellar_mmap_entry_insert(ibuctx,
							      dev->kick_addr,
							      VSTELLAR_MMAP_KICK,
							      &uresp.kick_mmap_key);
		if (!uctx->kick_entry)
			goto err_remove;
		uresp.comp_mask |= VSTELLAR_UCTX_KICK_PAGE;
	}

	uresp.ucontext = uctx->handle;
	uresp.db_page_size = VSTELLAR_DB_PAGE_SIZE;
	uresp.db_first_slot = VSTELLAR_DB_FIRST_SLOT;
	uresp.db_slots = min_t(u32, le32_to_cpu(dev->cfg.db_slots),
			       VSTELLAR_DB_SLOTS_PER_PAGE);
	uresp.device_features = dev->features;
	uresp.max_qp_wr = le32_to_cpu(dev->attr.max_qp_wr);
	uresp.max_cqe = le32_to_cpu(dev->attr.max_cqe);
	uresp.max_send_sge = le32_to_cpu(dev->attr.max_send_sge);
	uresp.max_recv_sge = le32_to_cpu(dev->attr.max_recv_sge);
	uresp.max_inline_data = le32_to_cpu(dev->attr.max_inline_data);
	uresp.num_cq_queues = dev->num_cqnq;
	uresp.cqe_size = sizeof(struct vstellar_cqe);
	uresp.min_sq_log_stride = VSTELLAR_MIN_SQ_LOG_STRIDE;
	uresp.min_rq_log_stride = VSTELLAR_MIN_RQ_LOG_STRIDE;
	err = ib_copy_to_udata(udata, &uresp, min(sizeof(uresp), udata->outlen));
	if (err)
		goto err_remove;
	return 0;

err_remove:
	rdma_user_mmap_entry_remove(uctx->kick_entry);
	rdma_user_mmap_entry_remove(uctx->db_entry);
err_dealloc:
	vstellar_cmd_dealloc_ucontext(dev, uctx->handle);
	return err;
}

void vstellar_dealloc_ucontext(struct ib_ucontext *ibuctx)
{
	struct vstellar_ucontext *uctx = to_vuctx(ibuctx);
	struct vstellar_dev *dev = to_vdev(ibuctx->device);
	int err;

	rdma_user_mmap_entry_remove(uctx->kick_entry);
	rdma_user_mmap_entry_remove(uctx->db_entry);
	err = vstellar_cmd_dealloc_ucontext(dev, uctx->handle);
	if (err)
		dev_warn_ratelimited(&dev->vdev->dev,
				     "DEALLOC_UCONTEXT %u failed: %d\n",
				     uctx->handle, err);
}

/* The core zaps our mmaps itself (rdma_user_mmap_io); nothing else. */
void vstellar_disassociate_ucontext(struct ib_ucontext *ibuctx)
{
}

int vstellar_mmap(struct ib_ucontext *ibuctx, struct vm_area_struct *vma)
{
	struct rdma_user_mmap_entry *rdma_entry;
	struct vstellar_user_mmap_entry *entry;
	pgprot_t prot;
	int err;

	rdma_entry = rdma_user_mmap_entry_get(ibuctx, vma);
	if (!rdma_entry)
		return -EINVAL;
	entry = container_of(rdma_entry, struct vstellar_user_mmap_entry,
			     rdma_entry);
	/*
	 * The doorbell region is RAM in the host (a shared memfd): cacheable.
	 * The kick page is a virtio notify register: uncached MMIO.
	 */
	if (entry->kind == VSTELLAR_MMAP_DB)
		prot = vma->vm_page_prot;
	else
		prot = pgprot_noncached(vma->vm_page_prot);
	err = rdma_user_mmap_io(ibuctx, vma, PHYS_PFN(entry->address),
				rdma_entry->npages * PAGE_SIZE, prot,
				rdma_entry);
	rdma_user_mmap_entry_put(rdma_entry);
	return err;
}

void vstellar_mmap_free(struct rdma_user_mmap_entry *rdma_entry)
{
	kfree(container_of(rdma_entry, struct vstellar_user_mmap_entry,
			   rdma_entry));
}

/*
 * A ring in the process's memory: pinned for the device, with the largest
 * page size the device takes that the pinned pages allow (*pgsz).
 */
struct ib_umem *vstellar_user_ring_get(struct vstellar_dev *dev, u64 addr,
				       size_t size, unsigned long *pgsz)
{
	struct ib_umem *umem;

	if (!addr || !PAGE_ALIGNED(addr))
		return ERR_PTR(-EINVAL);
	umem = ib_umem_get(&dev->ibdev, addr, size, IB_ACCESS_LOCAL_WRITE);
	if (IS_ERR(umem))
		return umem;
	*pgsz = ib_umem_find_best_pgsz(umem, vstellar_pgsz_bitmap(dev), addr);
	if (!*pgsz) {
		ib_umem_release(umem);
		return ERR_PTR(-EINVAL);
	}
	return umem;
}
