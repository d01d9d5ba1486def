// SPDX-License-Identifier: GPL-2.0-only
/*
 * vstellar_accel: driver for vStellar's emulated accelerator, a PCI device
 * whose only feature is device memory (one prefetchable BAR), so that RDMA
 * into "GPU memory" through dmabuf MRs can be tested without a GPU.
 *
 * Each accelerator gets a misc device, /dev/vstellar-accelN, whose
 * ioctls (include/vstellar/vstellar-accel-abi.h) allocate buffers in the
 * BAR and hand them out as dmabufs. The exporter is dynamic, like a GPU's
 * VRAM exporter: importers that do not pin must let the buffer move
 * (VSTELLAR_ACCEL_IOC_MOVE), which is what the RDMA side is tested with.
 *
 * It is a misc device and not a DRM driver on purpose: rdma-core's pyverbs
 * dmabuf allocator only knows amdgpu's and i915's GEM ioctls, so DRM
 * would not help it, and DRM is a lot of code for "allocate a range".
 *
 * Locking:
 *  - vdev->lock protects the buffer list and vdev->gone against ALLOC;
 *  - each buffer's offset and pin count are protected by its dmabuf's
 *    reservation lock, which the dma-buf core already holds around
 *    pin/unpin and map/unmap for dynamic importers; MOVE and the CPU
 *    fault handler take it too;
 *  - order: mmap_lock -> vdev->lock -> resv (remove), mmap_lock -> resv
 *    (fault), as dma_resv_lockdep() primes.
 *
 * Lifetime: buffers may outlive the PCI device (an fd kept open across an
 * unbind), so the device state is refcounted: the probe, every open file
 * and every buffer hold a reference. On remove the BAR is given back and
 * every buffer becomes dead: importers are told to unmap, CPU mappings are
 * zapped and fault with SIGBUS, new DMA mappings fail.
 */
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/genalloc.h>
#include <linux/idr.h>
#include <linux/io.h>
#include <linux/kref.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/version.h>

#include "vstellar/vstellar-accel-abi.h"

#define DRV_NAME "vstellar_accel"
/* Largest DMA segment of a mapping; sg lengths are 32-bit. */
#define VSACCEL_SEG_MAX SZ_1G

struct vsaccel_dev {
	struct kref ref;
	struct pci_dev *pdev;
	struct miscdevice misc;
	char name[32];
	int id;
	phys_addr_t bar_phys;
	resource_size_t bar_size;
	/* BAR physical addresses: never 0, which genalloc means as failure */
	struct gen_pool *pool;
	struct mutex lock;
	struct list_head bufs;
	bool gone;		/* removed: set under lock, then each resv taken */
};

struct vsaccel_buf {
	struct vsaccel_dev *vdev;
	struct dma_buf *dmabuf;
	struct list_head node;	/* in vdev->bufs, under vdev->lock */
	/*
	 * The dmabuf's inode, whose mapping holds the CPU mappings to zap,
	 * held so that remove() can reach it even while the dmabuf's file
	 * is being freed and its release waits for vdev->lock.
	 */
	struct inode *inode;
	size_t size;
	u64 offset;		/* in the BAR; under dmabuf->resv */
	unsigned int pins;	/* under dmabuf->resv */
};

static DEFINE_IDA(vsaccel_ida);
static const struct dma_buf_ops vsaccel_dmabuf_ops;

static void vsaccel_dev_free(struct kref *ref)
{
	struct vsaccel_dev *vdev = container_of(ref, struct vsaccel_dev, ref);

	gen_pool_destroy(vdev->pool);
	ida_free(&vsaccel_ida, vdev->id);
	pci_dev_put(vdev->pdev);
	kfree(vdev);
}

static void vsaccel_dev_put(struct vsaccel_dev *vdev)
{
	kref_put(&vdev->ref, vsaccel_dev_free);
}

/*
 * The CPU reaches device memory only for zeroing and copying, through a
 * temporary mapping: nothing else needs it, and a buffer's range changes.
 */
static int vsaccel_zero(struct vsaccel_dev *vdev, u64 offset, size_t size)
{
	void *p = memremap(vdev->bar_phys + offset, size, MEMREMAP_WC);

	if (!p)
		return -ENOMEM;
	memset(p, 0, size);
	memunmap(p);
	return 0;
}

static int vsaccel_copy(struct vsaccel_dev *vdev, u64 to, u64 from,
			size_t size)
{
	void *dst, *src;

	dst = memremap(vdev->bar_phys + to, size, MEMREMAP_WC);
	if (!dst)
		return -ENOMEM;
	src = memremap(vdev->bar_phys + from, size, MEMREMAP_WC);
	if (!src) {
		memunmap(dst);
		return -ENOMEM;
	}
	memcpy(dst, src, size);
	memunmap(src);
	memunmap(dst);
	return 0;
}

/* dmabuf exporter ------------------------------------------------------- */

static int vsaccel_attach(struct dma_buf *dmabuf,
			  struct dma_buf_attachment *attach)
{
	/*
	 * Device memory has no struct pages: only importers that map it by
	 * DMA address alone (peer2peer) can use it. Without PCI_P2PDMA in
	 * the guest kernel there is no distance check to make beyond that.
	 */
	if (!attach->peer2peer)
		return -EOPNOTSUPP;
	return 0;
}

static int vsaccel_pin(struct dma_buf_attachment *attach)
{
	struct vsaccel_buf *buf = attach->dmabuf->priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	buf->pins++;
	return 0;
}

static void vsaccel_unpin(struct dma_buf_attachment *attach)
{
	struct vsaccel_buf *buf = attach->dmabuf->priv;

	dma_resv_assert_held(attach->dmabuf->resv);
	WARN_ON(!buf->pins);
	buf->pins--;
}

static void vsaccel_unmap_sgt(struct device *dev, struct sg_table *sgt,
			      unsigned int mapped,
			      enum dma_data_direction dir)
{
	struct scatterlist *sg;
	unsigned int i;

	for_each_sgtable_dma_sg(sgt, sg, i) {
		if (i >= mapped)
			break;
		dma_unmap_resource(dev, sg_dma_address(sg), sg_dma_len(sg),
				   dir, DMA_ATTR_SKIP_CPU_SYNC);
	}
	sg_free_table(sgt);
	kfree(sgt);
}

static struct sg_table *vsaccel_map(struct dma_buf_attachment *attach,
				    enum dma_data_direction dir)
{
	struct vsaccel_buf *buf = attach->dmabuf->priv;
	struct vsaccel_dev *vdev = buf->vdev;
	struct scatterlist *sg;
	struct sg_table *sgt;
	phys_addr_t phys;
	size_t left;
	unsigned int i;
	int ret;

	/* The dma-buf core holds it: the offset cannot change under us */
	dma_resv_assert_held(attach->dmabuf->resv);
	if (vdev->gone)
		return ERR_PTR(-ENODEV);

	sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	if (!sgt)
		return ERR_PTR(-ENOMEM);
	ret = sg_alloc_table(sgt, DIV_ROUND_UP(buf->size, VSACCEL_SEG_MAX),
			     GFP_KERNEL);
	if (ret) {
		kfree(sgt);
		return ERR_PTR(ret);
	}

	phys = vdev->bar_phys + buf->offset;
	left = buf->size;
	for_each_sgtable_sg(sgt, sg, i) {
		size_t len = min_t(size_t, left, VSACCEL_SEG_MAX);
		dma_addr_t addr;

		addr = dma_map_resource(attach->dev, phys, len, dir,
					DMA_ATTR_SKIP_CPU_SYNC);
		if (dma_mapping_error(attach->dev, addr)) {
			vsaccel_unmap_sgt(attach->dev, sgt, i, dir);
			return ERR_PTR(-EIO);
		}
		/* No pages: importers use the DMA addresses only */
		sg_set_page(sg, NULL, len, 0);
		sg_dma_address(sg) = addr;
		sg_dma_len(sg) = len;
		phys += len;
		left -= len;
	}
	return sgt;
}

static void vsaccel_unmap(struct dma_buf_attachment *attach,
			  struct sg_table *sgt, enum dma_data_direction dir)
{
	vsaccel_unmap_sgt(attach->dev, sgt, sgt->nents, dir);
}

static vm_fault_t vsaccel_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct vsaccel_buf *buf = vma->vm_private_data;
	struct dma_resv *resv = buf->dmabuf->resv;
	vm_fault_t ret;
	unsigned long pfn;

	if (vmf->pgoff >= buf->size >> PAGE_SHIFT)
		return VM_FAULT_SIGBUS;
	/*
	 * Insert the page where the buffer is now; MOVE holds the same lock
	 * while it zaps the mappings and changes the offset. Interrupted,
	 * the access simply faults again.
	 */
	if (dma_resv_lock_interruptible(resv, NULL))
		return VM_FAULT_NOPAGE;
	if (buf->vdev->gone) {
		ret = VM_FAULT_SIGBUS;
	} else {
		pfn = PHYS_PFN(buf->vdev->bar_phys + buf->offset) + vmf->pgoff;
		ret = vmf_insert_pfn_prot(vma, vmf->address, pfn,
					  vma->vm_page_prot);
	}
	dma_resv_unlock(resv);
	return ret;
}

static const struct vm_operations_struct vsaccel_vm_ops = {
	.fault = vsaccel_fault,
};

static int vsaccel_mmap(struct dma_buf *dmabuf, struct vm_area_struct *vma)
{
	/* A private (copy-on-write) mapping of PFNMAP memory makes no sense */
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	/* The dma-buf core has checked that the range is inside the buffer */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	vm_flags_set(vma, VM_PFNMAP | VM_IO | VM_DONTEXPAND | VM_DONTDUMP);
#else	/* 6.1: vm_flags is written directly */
	vma->vm_flags |= VM_PFNMAP | VM_IO | VM_DONTEXPAND | VM_DONTDUMP;
#endif
	vma->vm_page_prot =
		pgprot_writecombine(vm_get_page_prot(vma->vm_flags));
	vma->vm_ops = &vsaccel_vm_ops;
	vma->vm_private_data = dmabuf->priv;
	return 0;
}

static void vsaccel_release(struct dma_buf *dmabuf)
{
	struct vsaccel_buf *buf = dmabuf->priv;
	struct vsaccel_dev *vdev = buf->vdev;

	mutex_lock(&vdev->lock);
	list_del(&buf->node);
	mutex_unlock(&vdev->lock);
	gen_pool_free(vdev->pool, vdev->bar_phys + buf->offset, buf->size);
	iput(buf->inode);
	kfree(buf);
	vsaccel_dev_put(vdev);
}

static const struct dma_buf_ops vsaccel_dmabuf_ops = {
	.attach = vsaccel_attach,
	.pin = vsaccel_pin,
	.unpin = vsaccel_unpin,
	.map_dma_buf = vsaccel_map,
	.unmap_dma_buf = vsaccel_unmap,
	.release = vsaccel_release,
	.mmap = vsaccel_mmap,
};

/* character device ------------------------------------------------------ */

static int vsaccel_ioc_info(struct vsaccel_dev *vdev, void __user *uarg)
{
	struct vstellar_accel_info info = {
		.mem_size = vdev->bar_size,
		.free_bytes = gen_pool_avail(vdev->pool),
	};

	return copy_to_user(uarg, &info, sizeof(info)) ? -EFAULT : 0;
}

static int vsaccel_ioc_alloc(struct vsaccel_dev *vdev, void __user *uarg)
{
	DEFINE_DMA_BUF_EXPORT_INFO(exp);
	struct vstellar_accel_alloc args;
	struct vsaccel_buf *buf;
	struct dma_buf *dmabuf;
	unsigned long addr;
	int fd, ret;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (args.flags || !args.size)
		return -EINVAL;
	if (args.size > vdev->bar_size)
		return -ENOMEM;	/* and PAGE_ALIGN cannot overflow */

	buf = kzalloc(sizeof(*buf), GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	buf->vdev = vdev;
	buf->size = PAGE_ALIGN(args.size);

	fd = get_unused_fd_flags(O_CLOEXEC);
	if (fd < 0) {
		ret = fd;
		goto err_free;
	}

	/* Under the lock: remove() sees every buffer, and none comes after */
	mutex_lock(&vdev->lock);
	if (vdev->gone) {
		ret = -ENODEV;
		goto err_unlock;
	}
	addr = gen_pool_alloc(vdev->pool, buf->size);
	if (!addr) {
		ret = -ENOMEM;
		goto err_unlock;
	}
	buf->offset = addr - vdev->bar_phys;
	ret = vsaccel_zero(vdev, buf->offset, buf->size);
	if (ret)
		goto err_range;

	exp.ops = &vsaccel_dmabuf_ops;
	exp.size = buf->size;
	exp.flags = O_RDWR | O_CLOEXEC;
	exp.priv = buf;
	dmabuf = dma_buf_export(&exp);
	if (IS_ERR(dmabuf)) {
		ret = PTR_ERR(dmabuf);
		goto err_range;
	}
	buf->dmabuf = dmabuf;
	buf->inode = file_inode(dmabuf->file);
	ihold(buf->inode);
	kref_get(&vdev->ref);
	list_add_tail(&buf->node, &vdev->bufs);
	mutex_unlock(&vdev->lock);

	args.fd = fd;
	if (copy_to_user(uarg, &args, sizeof(args))) {
		put_unused_fd(fd);
		dma_buf_put(dmabuf);	/* release frees range and buf */
		return -EFAULT;
	}
	/* From here the fd owns the dmabuf's file reference */
	fd_install(fd, dmabuf->file);
	return 0;

err_range:
	gen_pool_free(vdev->pool, addr, buf->size);
err_unlock:
	mutex_unlock(&vdev->lock);
	put_unused_fd(fd);
err_free:
	kfree(buf);
	return ret;
}

/* The buffer behind a dmabuf fd, if this accelerator exported it. */
static struct dma_buf *vsaccel_get_buf(struct vsaccel_dev *vdev, int fd,
				       struct vsaccel_buf **bufp)
{
	struct dma_buf *dmabuf = dma_buf_get(fd);

	if (IS_ERR(dmabuf))
		return ERR_PTR(-EINVAL);
	if (dmabuf->ops != &vsaccel_dmabuf_ops ||
	    ((struct vsaccel_buf *)dmabuf->priv)->vdev != vdev) {
		dma_buf_put(dmabuf);
		return ERR_PTR(-EINVAL);
	}
	*bufp = dmabuf->priv;
	return dmabuf;
}

/*
 * Move a buffer as a GPU driver evicts VRAM: tell importers, which must
 * drop their mappings (with CONFIG_DMABUF_MOVE_NOTIFY unset the dma-buf
 * core pins a dynamic exporter's buffer for as long as it is mapped, so
 * their unmapping is also what unpins it), then, if nobody pins it any
 * more, copy it and zap the CPU mappings, which fault in at the new place.
 */
static int vsaccel_move(struct vsaccel_dev *vdev, struct vsaccel_buf *buf)
{
	struct dma_buf *dmabuf = buf->dmabuf;
	unsigned long to;
	u64 from;
	int ret;

	to = gen_pool_alloc(vdev->pool, buf->size);
	if (!to)
		return -ENOMEM;
	ret = dma_resv_lock_interruptible(dmabuf->resv, NULL);
	if (ret)
		goto err_free;
	if (vdev->gone) {
		ret = -ENODEV;
		goto err_unlock;
	}
	dma_buf_move_notify(dmabuf);
	if (buf->pins) {
		ret = -EBUSY;
		goto err_unlock;
	}
	unmap_mapping_range(buf->inode->i_mapping, 0, 0, 1);
	from = buf->offset;
	ret = vsaccel_copy(vdev, to - vdev->bar_phys, from, buf->size);
	if (ret)
		goto err_unlock;
	buf->offset = to - vdev->bar_phys;
	gen_pool_free(vdev->pool, vdev->bar_phys + from, buf->size);
	dma_resv_unlock(dmabuf->resv);
	return 0;

err_unlock:
	dma_resv_unlock(dmabuf->resv);
err_free:
	gen_pool_free(vdev->pool, to, buf->size);
	return ret;
}

static int vsaccel_ioc_buf(struct vsaccel_dev *vdev, unsigned int cmd,
			   void __user *uarg)
{
	struct vstellar_accel_buf args;
	struct vsaccel_buf *buf;
	struct dma_buf *dmabuf;
	int ret = 0;

	if (copy_from_user(&args, uarg, sizeof(args)))
		return -EFAULT;
	if (args.flags)
		return -EINVAL;
	dmabuf = vsaccel_get_buf(vdev, args.fd, &buf);
	if (IS_ERR(dmabuf))
		return PTR_ERR(dmabuf);

	if (cmd == VSTELLAR_ACCEL_IOC_MOVE)
		ret = vsaccel_move(vdev, buf);
	if (!ret)
		ret = dma_resv_lock_interruptible(dmabuf->resv, NULL);
	if (!ret) {
		args.offset = buf->offset;
		args.size = buf->size;
		dma_resv_unlock(dmabuf->resv);
	}
	dma_buf_put(dmabuf);
	if (ret)
		return ret;
	return copy_to_user(uarg, &args, sizeof(args)) ? -EFAULT : 0;
}

static long vsaccel_ioctl(struct file *file, unsigned int cmd,
			  unsigned long arg)
{
	struct vsaccel_dev *vdev = file->private_data;
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case VSTELLAR_ACCEL_IOC_INFO:
		return vsaccel_ioc_info(vdev, uarg);
	case VSTELLAR_ACCEL_IOC_ALLOC:
		return vsaccel_ioc_alloc(vdev, uarg);
	case VSTELLAR_ACCEL_IOC_QUERY:
	case VSTELLAR_ACCEL_IOC_MOVE:
		return vsaccel_ioc_buf(vdev, cmd, uarg);
	default:
		return -ENOTTY;
	}
}

static int vsaccel_open(struct inode *inode, struct file *file)
{
	/* misc_open set private_data; misc_deregister waits for us */
	struct vsaccel_dev *vdev = container_of(file->private_data,
						struct vsaccel_dev, misc);

	kref_get(&vdev->ref);
	file->private_data = vdev;
	return 0;
}

static int vsaccel_close(struct inode *inode, struct file *file)
{
	vsaccel_dev_put(file->private_data);
	return 0;
}

static const struct file_operations vsaccel_fops = {
	.owner = THIS_MODULE,
	.open = vsaccel_open,
	.release = vsaccel_close,
	.unlocked_ioctl = vsaccel_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.llseek = noop_llseek,
};

/* PCI ------------------------------------------------------------------- */

static int vsaccel_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct vsaccel_dev *vdev;
	int ret;

	if (!(pci_resource_flags(pdev, VSTELLAR_ACCEL_MEM_BAR) &
	      IORESOURCE_MEM) ||
	    !pci_resource_len(pdev, VSTELLAR_ACCEL_MEM_BAR)) {
		dev_err(&pdev->dev, "BAR %d is not assigned memory\n",
			VSTELLAR_ACCEL_MEM_BAR);
		return -ENODEV;
	}

	vdev = kzalloc(sizeof(*vdev), GFP_KERNEL);
	if (!vdev)
		return -ENOMEM;
	kref_init(&vdev->ref);
	mutex_init(&vdev->lock);
	INIT_LIST_HEAD(&vdev->bufs);
	vdev->pdev = pci_dev_get(pdev);
	vdev->bar_phys = pci_resource_start(pdev, VSTELLAR_ACCEL_MEM_BAR);
	vdev->bar_size = pci_resource_len(pdev, VSTELLAR_ACCEL_MEM_BAR);

	vdev->id = ida_alloc(&vsaccel_ida, GFP_KERNEL);
	if (vdev->id < 0) {
		ret = vdev->id;
		pci_dev_put(pdev);
		kfree(vdev);
		return ret;
	}
	/* From here on vsaccel_dev_free() undoes the above */

	vdev->pool = gen_pool_create(PAGE_SHIFT, dev_to_node(&pdev->dev));
	if (!vdev->pool) {
		ret = -ENOMEM;
		goto err_put;
	}
	gen_pool_set_algo(vdev->pool, gen_pool_first_fit, NULL);
	ret = gen_pool_add(vdev->pool, vdev->bar_phys, vdev->bar_size,
			   dev_to_node(&pdev->dev));
	if (ret)
		goto err_put;

	ret = pci_enable_device_mem(pdev);
	if (ret)
		goto err_put;
	ret = pci_request_region(pdev, VSTELLAR_ACCEL_MEM_BAR, DRV_NAME);
	if (ret)
		goto err_disable;
	/* Write-combined CPU mappings, as for a GPU's VRAM aperture */
	arch_io_reserve_memtype_wc(vdev->bar_phys, vdev->bar_size);
	pci_set_drvdata(pdev, vdev);

	snprintf(vdev->name, sizeof(vdev->name), "vstellar-accel%d", vdev->id);
	vdev->misc.minor = MISC_DYNAMIC_MINOR;
	vdev->misc.name = vdev->name;
	vdev->misc.fops = &vsaccel_fops;
	vdev->misc.parent = &pdev->dev;
	ret = misc_register(&vdev->misc);
	if (ret)
		goto err_release;

	dev_info(&pdev->dev, "%s: %llu MiB of device memory at %pa\n",
		 vdev->name, (unsigned long long)vdev->bar_size >> 20,
		 &vdev->bar_phys);
	return 0;

err_release:
	arch_io_free_memtype_wc(vdev->bar_phys, vdev->bar_size);
	pci_release_region(pdev, VSTELLAR_ACCEL_MEM_BAR);
err_disable:
	pci_disable_device(pdev);
err_put:
	vsaccel_dev_put(vdev);
	return ret;
}

static void vsaccel_remove(struct pci_dev *pdev)
{
	struct vsaccel_dev *vdev = pci_get_drvdata(pdev);
	struct vsaccel_buf *buf;

	misc_deregister(&vdev->misc);

	/*
	 * Buffers still open lose their memory: importers must unmap (those
	 * that pin cannot be made to; their DMA addresses go stale), CPU
	 * mappings fault with SIGBUS from now on. A buffer being released
	 * waits for vdev->lock in vsaccel_release(), so its dmabuf (not its
	 * file) is still valid, and its inode is ours.
	 */
	mutex_lock(&vdev->lock);
	vdev->gone = true;
	list_for_each_entry(buf, &vdev->bufs, node) {
		dma_resv_lock(buf->dmabuf->resv, NULL);
		dma_buf_move_notify(buf->dmabuf);
		unmap_mapping_range(buf->inode->i_mapping, 0, 0, 1);
		dma_resv_unlock(buf->dmabuf->resv);
	}
	mutex_unlock(&vdev->lock);

	arch_io_free_memtype_wc(vdev->bar_phys, vdev->bar_size);
	pci_release_region(pdev, VSTELLAR_ACCEL_MEM_BAR);
	pci_disable_device(pdev);
	vsaccel_dev_put(vdev);
}

static const struct pci_device_id vsaccel_ids[] = {
	{ PCI_DEVICE(VSTELLAR_ACCEL_PCI_VENDOR_ID,
		     VSTELLAR_ACCEL_PCI_DEVICE_ID) },
	{ }
};
MODULE_DEVICE_TABLE(pci, vsaccel_ids);

static struct pci_driver vsaccel_driver = {
	.name = DRV_NAME,
	.id_table = vsaccel_ids,
	.probe = vsaccel_probe,
	.remove = vsaccel_remove,
};
module_pci_driver(vsaccel_driver);

MODULE_DESCRIPTION("vStellar emulated accelerator: device memory as dmabufs");
MODULE_LICENSE("GPL");
MODULE_IMPORT_NS(DMA_BUF);
