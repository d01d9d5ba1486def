// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar on-demand paging (F_ODP): MRs whose pages the device asks for.
 *
 * An on-demand MR is registered without pages. When the device meets a
 * page it has not got, it posts a PAGE_FAULT event; a work item faults
 * the range in through the core's ODP umem (hmm_range_fault underneath)
 * and sends MAP_MR_PAGES while it still holds the umem's umem_mutex. The
 * umem's interval notifier takes the pages back: under the same mutex it
 * sends UNMAP_MR_PAGES and waits for the answer before the core unmaps
 * them, so the device never reaches a page the kernel reuses. advise_mr
 * maps ranges ahead of the traffic the same way.
 *
 * An implicit MR (start 0, length U64_MAX) covers the whole address
 * space. The core gives it a root umem with no pages; the pages live in
 * child umems of VSTELLAR_ODP_CHUNK_SHIFT bytes each, made when a fault or
 * prefetch first reaches their chunk and kept until dereg.
 */
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/uaccess.h>
#include <rdma/ib_umem_odp.h>

#include "vstellar.h"

/*
 * Chunk of an implicit MR's child umems: 64 MiB. The child keeps two
 * arrays of one word per page (pfn_list, dma_list: 256 KiB, 0.4% of the
 * chunk) from its creation to dereg, and each child is one interval
 * notifier, so one invalidate call and at most one UNMAP_MR_PAGES per
 * chunk an munmap touches. 2 MiB children would cost 512 notifiers and
 * commands per GiB unmapped; 1 GiB children (mlx5's) 4 MiB of arrays for
 * a process that touches one page of the chunk.
 */
#define VSTELLAR_ODP_CHUNK_SHIFT	26
#define VSTELLAR_ODP_CHUNK_SIZE		BIT_ULL(VSTELLAR_ODP_CHUNK_SHIFT)

/*
 * Pages one fault or one piece of a prefetch maps (2 MiB): bounds the
 * time umem_mutex is held and the command's page list. The device asks
 * again for pages of an access still missing.
 */
#define VSTELLAR_ODP_MAX_PAGES		512

/* How to map a range */
#define VSTELLAR_ODP_FAULT	BIT(0)	/* fault in pages not present */
#define VSTELLAR_ODP_WRITE	BIT(1)	/* writable, if the MR is */

struct vstellar_odp_fault {
	struct work_struct work;
	struct vstellar_mr *mr;		/* holds a reference (odp.users) */
	u64 iova;
	u32 npages;
	bool write;
};

static const struct mmu_interval_notifier_ops vstellar_odp_mn_ops;

static u32 vstellar_odp_max_pages(struct vstellar_dev *dev)
{
	return min_t(u32, le32_to_cpu(dev->cfg.max_cmd_pages),
		     VSTELLAR_ODP_MAX_PAGES);
}

/* ---------------------------------------------------------------- */
/* Lookup and lifetime                                               */
/* ---------------------------------------------------------------- */

/* The MR under @key with a reference, or NULL (none, or being freed). */
static struct vstellar_mr *vstellar_odp_get(struct xarray *xa,
					    unsigned long key)
{
	struct vstellar_mr *mr;

	xa_lock(xa);
	mr = xa_load(xa, key);
	if (mr && !refcount_inc_not_zero(&mr->odp.users))
		mr = NULL;
	xa_unlock(xa);
	return mr;
}

static void vstellar_odp_put(struct vstellar_mr *mr)
{
	if (refcount_dec_and_test(&mr->odp.users))
		complete(&mr->odp.idle);
}

/*
 * After REG_MR: faults (by MRN) and advise_mr (by lkey) find the MR. An
 * entry already there is an MR whose DEREG_MR is done (the device gave
 * its MRN or key to this one) and that is about to leave: it is retired,
 * so no lookup takes it any more, and it removes only itself.
 */
int vstellar_odp_publish(struct vstellar_mr *mr)
{
	struct vstellar_dev *dev = mr->dev;
	int err;

	refcount_set(&mr->odp.users, 1);
	reinit_completion(&mr->odp.idle);
	err = xa_err(xa_store(&dev->odp_mrs, mr->mrn, mr, GFP_KERNEL));
	if (err)
		return err;
	err = xa_err(xa_store(&dev->odp_lkeys, mr->ibmr.lkey, mr, GFP_KERNEL));
	if (err)
		xa_cmpxchg(&dev->odp_mrs, mr->mrn, mr, NULL, 0);
	return err;
}

/*
 * Before DEREG_MR: lookups fail from now on (the count is 0 for them) and
 * the faults and prefetches in flight are done, so none sends
 * MAP_MR_PAGES for an MRN the device may give to a new MR.
 */
void vstellar_odp_retire(struct vstellar_mr *mr)
{
	vstellar_odp_put(mr);
	wait_for_completion(&mr->odp.idle);
}

/* DEREG_MR failed: the MR lives on and serves faults again. */
void vstellar_odp_unretire(struct vstellar_mr *mr)
{
	reinit_completion(&mr->odp.idle);
	refcount_set(&mr->odp.users, 1);
}

void vstellar_odp_unpublish(struct vstellar_mr *mr)
{
	xa_cmpxchg(&mr->dev->odp_lkeys, mr->ibmr.lkey, mr, NULL, 0);
	xa_cmpxchg(&mr->dev->odp_mrs, mr->mrn, mr, NULL, 0);
}

/* ---------------------------------------------------------------- */
/* Registration                                                      */
/* ---------------------------------------------------------------- */

/*
 * The umem of a new on-demand MR: the pages of [start, start + length),
 * which the device names from virt_addr on (the core checked that both
 * have the same offset in their page), or the root of an implicit MR.
 */
int vstellar_odp_mr_init(struct vstellar_mr *mr, struct ib_pd *ibpd,
			 u64 start, u64 length, u64 virt_addr,
			 int access_flags)
{
	struct vstellar_odp_mr *odp = &mr->odp;
	struct ib_umem_odp *umem_odp;

	odp->implicit = !start && length == U64_MAX;
	/* iova and address share the offset in the page (uverbs checks it) */
	if ((start ^ virt_addr) & ~PAGE_MASK)
		return -EINVAL;
	if (odp->implicit) {
		if (virt_addr)
			return -EINVAL;
		umem_odp = ib_umem_odp_alloc_implicit(ibpd->device,
						      access_flags);
	} else {
		umem_odp = ib_umem_odp_get(ibpd->device, start, length,
					   access_flags, &vstellar_odp_mn_ops);
	}
	if (IS_ERR(umem_odp))
		return PTR_ERR(umem_odp);
	/* the device's pages are of 4 KiB: so must the umem's be */
	if (umem_odp->page_shift != VSTELLAR_ODP_PAGE_SHIFT) {
		ib_umem_odp_release(umem_odp);
		return -EOPNOTSUPP;
	}
	umem_odp->private = mr;
	mr->umem = &umem_odp->umem;
	mr->on_demand = true;
	odp->pd = ibpd;
	odp->iova = virt_addr;
	odp->length = length;
	odp->delta = odp->implicit ? 0 : virt_addr - start;
	refcount_set(&odp->users, 1);
	init_completion(&odp->idle);
	xa_init(&odp->children);
	mutex_init(&odp->children_lock);
	return 0;
}

/*
 * After DEREG_MR (the device uses none of the pages any more) or a
 * failed REG_MR: the children, then the root. Releasing a umem unmaps
 * its pages and removes its notifier, waiting for an invalidation that
 * runs.
 */
void vstellar_odp_mr_release(struct vstellar_mr *mr)
{
	struct ib_umem_odp *child;
	unsigned long idx;

	WRITE_ONCE(mr->odp.dead, true);
	xa_for_each(&mr->odp.children, idx, child)
		ib_umem_odp_release(child);
	xa_destroy(&mr->odp.children);
	mutex_destroy(&mr->odp.children_lock);
	ib_umem_odp_release(to_ib_umem_odp(mr->umem));
	mr->umem = NULL;
}

/* ---------------------------------------------------------------- */
/* Invalidation                                                      */
/* ---------------------------------------------------------------- */

/*
 * Narrows [*start, *end) of @umem_odp to the pages in it that are mapped;
 * false if none is. munmap of memory the device never saw then costs no
 * command. Called with umem_mutex held.
 */
static bool vstellar_odp_mapped_span(struct ib_umem_odp *umem_odp,
				     u64 *start, u64 *end)
{
	u64 base = ib_umem_start(umem_odp);
	size_t first = (*start - base) >> PAGE_SHIFT;
	size_t last = (*end - base - 1) >> PAGE_SHIFT;

	if (!umem_odp->npages)
		return false;
	while (first <= last && !umem_odp->dma_list[first])
		first++;
	if (first > last)
		return false;
	while (!umem_odp->dma_list[last])
		last--;
	*start = base + ((u64)first << PAGE_SHIFT);
	*end = base + ((u64)(last + 1) << PAGE_SHIFT);
	return true;
}

/* UNMAP_MR_PAGES of [start, end) (user addresses), unless nobody listens. */
static void vstellar_odp_unmap_device(struct vstellar_mr *mr, u64 start,
				      u64 end)
{
	struct vstellar_dev *dev = mr->dev;
	unsigned int noio;
	int err;

	/* a lost device reaches no memory: do not wait for its commands */
	if (READ_ONCE(mr->odp.dead) || !vstellar_com_alive(&dev->com))
		return;
	/* reclaim may call us: its allocations must not call it again */
	noio = memalloc_noio_save();
	err = vstellar_cmd_unmap_mr_pages(dev, mr->ucontext, mr->mrn,
					  start + mr->odp.delta, end - start);
	memalloc_noio_restore(noio);
	if (err && !vstellar_com_is_dead_err(err))
		ibdev_warn_ratelimited(&dev->ibdev,
				       "MR %u: UNMAP_MR_PAGES failed (%d)\n",
				       mr->mrn, err);
}

/*
 * The kernel is about to reuse or move pages of the umem. The device lets
 * go of them before we return (UNMAP_MR_PAGES is answered only then),
 * and only then are they unmapped for DMA. A fault that mapped them holds
 * umem_mutex until its MAP_MR_PAGES is answered, so it cannot come
 * between; one that faulted them before sees the sequence change and
 * retries.
 */
static bool vstellar_odp_invalidate(struct mmu_interval_notifier *mni,
				    const struct mmu_notifier_range *range,
				    unsigned long cur_seq)
{
	struct ib_umem_odp *umem_odp =
		container_of(mni, struct ib_umem_odp, notifier);
	u64 start, end;

	if (!mmu_notifier_range_blockable(range))
		return false;

	mutex_lock(&umem_odp->umem_mutex);
	mmu_interval_set_seq(mni, cur_seq);
	start = max_t(u64, ib_umem_start(umem_odp), range->start);
	end = min_t(u64, ib_umem_end(umem_odp), range->end);
	/* with no page mapped, private may not be set yet */
	if (start < end && vstellar_odp_mapped_span(umem_odp, &start, &end)) {
		vstellar_odp_unmap_device(umem_odp->private, start, end);
		ib_umem_odp_unmap_dma_pages(umem_odp, start, end);
	}
	mutex_unlock(&umem_odp->umem_mutex);
	return true;
}

static const struct mmu_interval_notifier_ops vstellar_odp_mn_ops = {
	.invalidate = vstellar_odp_invalidate,
};

/* ---------------------------------------------------------------- */
/* Mapping                                                           */
/* ---------------------------------------------------------------- */

/*
 * MAP_MR_PAGES for the @npages pages of @umem_odp from index @first, the
 * mapped ones: a prefetch that does not fault leaves holes, which split
 * the range into commands. Called with umem_mutex held.
 */
static int vstellar_odp_send_map(struct vstellar_mr *mr,
				 struct ib_umem_odp *umem_odp, size_t first,
				 u32 npages)
{
	const dma_addr_t *pages = umem_odp->dma_list + first;
	u64 va = ib_umem_start(umem_odp) + ((u64)first << PAGE_SHIFT);
	u32 i = 0, n;
	int err;

	while (i < npages) {
		if (!pages[i]) {
			i++;
			continue;
		}
		for (n = 1; i + n < npages && pages[i + n]; n++)
			;
		err = vstellar_cmd_map_mr_pages(mr->dev, mr->ucontext, mr->mrn,
						va + ((u64)i << PAGE_SHIFT) +
						mr->odp.delta, pages + i, n);
		if (err)
			return err;
		i += n;
	}
	return 0;
}

/*
 * Maps [va, va + len) of @umem_odp (inside it, at most
 * vstellar_odp_max_pages()) for DMA and for the device. Writable only if
 * asked for and the MR is: a read fault of a writable MR may ask too, so
 * that a later write needs no second fault.
 */
static int vstellar_odp_map_umem(struct vstellar_mr *mr,
				 struct ib_umem_odp *umem_odp, u64 va, u64 len,
				 unsigned int how)
{
	u64 access = ODP_READ_ALLOWED_BIT;
	size_t first = (va - ib_umem_start(umem_odp)) >> PAGE_SHIFT;
	unsigned int noio;
	int npages, err;

	if ((how & VSTELLAR_ODP_WRITE) && umem_odp->umem.writable)
		access |= ODP_WRITE_ALLOWED_BIT;
	npages = ib_umem_odp_map_dma_and_lock(umem_odp, va, len, access,
					      how & VSTELLAR_ODP_FAULT);
	if (npages < 0)
		return npages;
	/*
	 * umem_mutex is held: an invalidation of these pages waits for the
	 * device to have them, then takes them back. Reclaim may invalidate,
	 * so the command's allocations must not enter it.
	 */
	noio = memalloc_noio_save();
	err = vstellar_odp_send_map(mr, umem_odp, first, npages);
	memalloc_noio_restore(noio);
	mutex_unlock(&umem_odp->umem_mutex);
	return err;
}

/*
 * An implicit MR's child for the chunk of @va, made if the process has
 * memory in [va, va + len): a child costs memory until dereg, so an
 * address with nothing behind it makes none.
 */
static struct ib_umem_odp *vstellar_odp_child(struct vstellar_mr *mr, u64 va,
					      u64 len)
{
	struct ib_umem_odp *root = to_ib_umem_odp(mr->umem), *child;
	unsigned long idx = va >> VSTELLAR_ODP_CHUNK_SHIFT;
	struct mm_struct *mm = root->umem.owning_mm;
	bool present;
	int err;

	child = xa_load(&mr->odp.children, idx);
	if (child)
		return child;
	if (!mmget_not_zero(mm))
		return ERR_PTR(-EFAULT);
	mmap_read_lock(mm);
	present = find_vma_intersection(mm, va, va + len);
	mmap_read_unlock(mm);
	mmput(mm);
	if (!present)
		return ERR_PTR(-EFAULT);

	mutex_lock(&mr->odp.children_lock);
	child = xa_load(&mr->odp.children, idx);
	if (child)
		goto out;
	child = ib_umem_odp_alloc_child(root,
					(u64)idx << VSTELLAR_ODP_CHUNK_SHIFT,
					VSTELLAR_ODP_CHUNK_SIZE,
					&vstellar_odp_mn_ops);
	if (IS_ERR(child))
		goto out;
	/* before any page is mapped: invalidate reads it only then */
	child->private = mr;
	err = xa_err(xa_store(&mr->odp.children, idx, child, GFP_KERNEL));
	if (err) {
		ib_umem_odp_release(child);
		child = ERR_PTR(err);
	}
out:
	mutex_unlock(&mr->odp.children_lock);
	return child;
}

/* The MR's pages as iovas, [*lo, *hi), page aligned. */
static void vstellar_odp_bounds(struct vstellar_mr *mr, u64 *lo, u64 *hi)
{
	if (mr->odp.implicit) {
		*lo = 0;
		*hi = TASK_SIZE_MAX & PAGE_MASK;
		return;
	}
	*lo = ALIGN_DOWN(mr->odp.iova, PAGE_SIZE);
	*hi = ALIGN(mr->odp.iova + mr->odp.length, PAGE_SIZE);
}

/*
 * Maps the pages [start, end) of the MR (page-aligned iovas inside it),
 * in pieces of at most vstellar_odp_max_pages() and, for an implicit MR,
 * chunk by chunk.
 */
static int vstellar_odp_map(struct vstellar_mr *mr, u64 start, u64 end,
			    unsigned int how)
{
	u64 max_len = (u64)vstellar_odp_max_pages(mr->dev) << PAGE_SHIFT;
	struct ib_umem_odp *umem_odp = to_ib_umem_odp(mr->umem);
	u64 len, va;
	int err;

	if (!max_len)
		return -EINVAL;
	while (start < end) {
		va = start - mr->odp.delta;
		len = min(end - start, max_len);
		if (mr->odp.implicit) {
			len = min(len, ALIGN_DOWN(va, VSTELLAR_ODP_CHUNK_SIZE) +
				       VSTELLAR_ODP_CHUNK_SIZE - va);
			umem_odp = vstellar_odp_child(mr, va, len);
			if (IS_ERR(umem_odp))
				return PTR_ERR(umem_odp);
		}
		err = vstellar_odp_map_umem(mr, umem_odp, va, len, how);
		if (err)
			return err;
		start += len;
		if (start < end && fatal_signal_pending(current))
			return -EINTR;
	}
	return 0;
}

/* ---------------------------------------------------------------- */
/* Page faults                                                       */
/* ---------------------------------------------------------------- */

/*
 * After a fault: the pages the process already has in the 2 MiB blocks
 * around it, without faulting any in (so no memory is allocated and holes
 * in the address space are skipped), as the kernel's own fault-around
 * does. The device asks only for what one request needs, and a READ
 * request covers a few pages: pages taken back by an invalidation (say
 * khugepaged collapsing them into a huge page) would otherwise come back
 * a few pages per round trip. Best effort: errors are ignored.
 */
static void vstellar_odp_fault_around(struct vstellar_mr *mr, u64 start,
				      u64 end, u64 lo, u64 hi)
{
	u64 a = max(ALIGN_DOWN(start, SZ_2M), lo);
	u64 b = min(ALIGN(end, SZ_2M), hi);

	if (a < start)
		vstellar_odp_map(mr, a, start, VSTELLAR_ODP_WRITE);
	if (end < b)
		vstellar_odp_map(mr, end, b, VSTELLAR_ODP_WRITE);
}

/*
 * A fault's pages, clipped to the MR and to one command. A writable MR is
 * mapped writable (as mlx5 does) unless the memory is read-only for the
 * process: then a read still gets its pages. When the process has no
 * such memory, nothing is sent and the device fails the access after its
 * fault timeout.
 */
static void vstellar_odp_fault_work(struct work_struct *work)
{
	struct vstellar_odp_fault *f =
		container_of(work, struct vstellar_odp_fault, work);
	struct vstellar_mr *mr = f->mr;
	u32 npages = clamp_t(u32, f->npages, 1,
			     vstellar_odp_max_pages(mr->dev));
	u64 start = ALIGN_DOWN(f->iova, PAGE_SIZE), end = start, lo, hi;
	int err = -EFAULT;

	vstellar_odp_bounds(mr, &lo, &hi);
	if (start < hi)
		end = start + min_t(u64, hi - start, (u64)npages << PAGE_SHIFT);
	start = max(start, lo);
	if (start < end) {
		err = vstellar_odp_map(mr, start, end,
				       VSTELLAR_ODP_FAULT | VSTELLAR_ODP_WRITE);
		if (err == -EPERM && !f->write)
			err = vstellar_odp_map(mr, start, end,
					       VSTELLAR_ODP_FAULT);
	}
	if (!err)
		vstellar_odp_fault_around(mr, start, end, lo, hi);
	if (err)
		dev_dbg_ratelimited(&mr->dev->vdev->dev,
				    "MR %u: fault at iova %#llx (%u pages%s) not served: %d\n",
				    mr->mrn, f->iova, f->npages,
				    f->write ? ", write" : "", err);
	vstellar_odp_put(mr);
	kfree(f);
}

/*
 * PAGE_FAULT event (from the event work): served in a work item of its
 * own, since faulting pages in may sleep for long (swap, the process's
 * mmap_lock) and other events must not wait for it.
 */
void vstellar_odp_page_fault(struct vstellar_dev *dev,
			     const struct vstellar_event_page_fault *pf)
{
	struct vstellar_odp_fault *f;
	struct vstellar_mr *mr;

	if (!dev->odp_wq)
		return;
	mr = vstellar_odp_get(&dev->odp_mrs, le32_to_cpu(pf->object));
	if (mr && mr->ucontext != le32_to_cpu(pf->ucontext)) {
		vstellar_odp_put(mr);
		mr = NULL;
	}
	if (!mr) {
		dev_dbg_ratelimited(&dev->vdev->dev,
				    "page fault for unknown MR %u (context %u)\n",
				    le32_to_cpu(pf->object),
				    le32_to_cpu(pf->ucontext));
		return;
	}
	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f) {
		vstellar_odp_put(mr);
		return;
	}
	INIT_WORK(&f->work, vstellar_odp_fault_work);
	f->mr = mr;
	f->iova = le64_to_cpu(pf->iova);
	f->npages = le32_to_cpu(pf->num_pages);
	f->write = le16_to_cpu(pf->flags) & VSTELLAR_FAULT_WRITE;
	queue_work(dev->odp_wq, &f->work);
}

/* ---------------------------------------------------------------- */
/* advise_mr                                                         */
/* ---------------------------------------------------------------- */

/* The SGE's pages as iovas of the MR, or -EFAULT if it leaves the MR. */
static int vstellar_odp_sge_range(struct vstellar_mr *mr,
				  const struct ib_sge *sge, u64 *start,
				  u64 *end)
{
	u64 last, lo, hi;

	if (check_add_overflow(sge->addr, (u64)sge->length, &last))
		return -EFAULT;
	if (!mr->odp.implicit &&
	    (sge->addr < mr->odp.iova ||
	     last > mr->odp.iova + mr->odp.length))
		return -EFAULT;
	vstellar_odp_bounds(mr, &lo, &hi);
	*start = ALIGN_DOWN(sge->addr, PAGE_SIZE);
	*end = min(ALIGN(last, PAGE_SIZE), hi);
	return *start < *end ? 0 : -EFAULT;
}

/*
 * ibv_advise_mr: map the SGEs' ranges of on-demand MRs of @ibpd now.
 * PREFETCH maps for reading, PREFETCH_WRITE writable (if the MR is),
 * PREFETCH_NO_FAULT only the pages the process has present. It runs
 * synchronously even without IB_UVERBS_ADVISE_MR_FLAG_FLUSH: the caller
 * waits somewhat longer than with a queued prefetch, which is allowed,
 * and the SGE list needs no copy. As mlx5's, only FLUSH reports a range
 * that could not be mapped; a key that names no on-demand MR of the PD
 * fails either way.
 */
int vstellar_advise_mr(struct ib_pd *ibpd,
		       enum ib_uverbs_advise_mr_advice advice, u32 flags,
		       struct ib_sge *sg_list, u32 num_sge,
		       struct uverbs_attr_bundle *attrs)
{
	struct vstellar_dev *dev = to_vdev(ibpd->device);
	bool flush = flags & IB_UVERBS_ADVISE_MR_FLAG_FLUSH;
	struct vstellar_mr *mr;
	unsigned int how;
	u64 start, end;
	int err = 0;
	u32 i;

	switch (advice) {
	case IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH:
		how = VSTELLAR_ODP_FAULT;
		break;
	case IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE:
		how = VSTELLAR_ODP_FAULT | VSTELLAR_ODP_WRITE;
		break;
	case IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT:
		how = 0;
		break;
	default:
		return -EOPNOTSUPP;
	}
	if (!vstellar_odp_on(dev))
		return -EOPNOTSUPP;

	for (i = 0; i < num_sge && !err; i++) {
		mr = vstellar_odp_get(&dev->odp_lkeys, sg_list[i].lkey);
		/* as mlx5: PREFETCH_WRITE needs a writable MR */
		if (mr && (mr->odp.pd != ibpd ||
			   ((how & VSTELLAR_ODP_WRITE) &&
			    !mr->umem->writable))) {
			vstellar_odp_put(mr);
			mr = NULL;
		}
		if (!mr)
			return flush ? -ENOENT : -EINVAL;
		if (sg_list[i].length) {
			err = vstellar_odp_sge_range(mr, &sg_list[i], &start,
						     &end);
			if (!err)
				err = vstellar_odp_map(mr, start, end, how);
			if (err && !flush && err != -EINTR)
				err = 0;
		}
		vstellar_odp_put(mr);
	}
	return err;
}

/* ---------------------------------------------------------------- */
/* Device                                                            */
/* ---------------------------------------------------------------- */

/* With F_ODP: the work queue that serves page faults. */
int vstellar_odp_init(struct vstellar_dev *dev)
{
	if (!vstellar_odp_on(dev))
		return 0;
	dev->odp_wq = alloc_workqueue("vstellar-odp-%s", WQ_UNBOUND, 0,
				      dev_name(&dev->vdev->dev));
	return dev->odp_wq ? 0 : -ENOMEM;
}

/* Every on-demand MR is gone (so is every fault work item of theirs). */
void vstellar_odp_fini(struct vstellar_dev *dev)
{
	if (dev->odp_wq)
		destroy_workqueue(dev->odp_wq);
	dev->odp_wq = NULL;
	WARN_ON(!xa_empty(&dev->odp_mrs) || !xa_empty(&dev->odp_lkeys));
}
