/* SPDX-License-Identifier: ((GPL-2.0 WITH Linux-syscall-note) OR BSD-2-Clause) */
/*
 * vstellar-accel: an emulated accelerator with device memory and nothing
 * else (no compute), so that RDMA into "GPU memory" (GPU Direct RDMA,
 * dmabuf MRs) can be exercised without a GPU.
 *
 * The PCI device (QEMU: -device vstellar-accel,memdev=ID) has one BAR,
 * VSTELLAR_ACCEL_MEM_BAR: 64-bit, prefetchable, its size that of the
 * memory backend (a power of two), backed by the backend's shareable
 * memfd, so that vhost-user backends (vstellard) see it in their memory
 * table like guest RAM and the RNIC can reach it.
 *
 * The guest driver (vstellar_accel.ko) makes a character device per
 * accelerator, /dev/vstellar-accelN, with the ioctls below. Buffers are
 * dmabufs: ALLOC returns a dmabuf fd that can be mmapped (to fill and
 * check it from the CPU) and handed to importers such as
 * ibv_reg_dmabuf_mr(). Closing every reference frees the buffer's memory.
 *
 * The PCI ID 1234:5354 is in the range QEMU's own example devices use
 * (vendor 0x1234, not allocated by the PCI-SIG to anyone who ships
 * hardware); it is not a registered ID.
 */
#ifndef VSTELLAR_ACCEL_ABI_H
#define VSTELLAR_ACCEL_ABI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define VSTELLAR_ACCEL_PCI_VENDOR_ID	0x1234
#define VSTELLAR_ACCEL_PCI_DEVICE_ID	0x5354
#define VSTELLAR_ACCEL_MEM_BAR		2

struct vstellar_accel_info {
	__aligned_u64 mem_size;		/* out: bytes of device memory */
	__aligned_u64 free_bytes;	/* out: not allocated */
};

struct vstellar_accel_alloc {
	__aligned_u64 size;		/* in: bytes, rounded up to pages */
	__u32 flags;			/* in: 0 */
	__s32 fd;			/* out: dmabuf, O_RDWR | O_CLOEXEC */
};

/*
 * A buffer named by its dmabuf fd, which must be one this driver
 * exported (EINVAL otherwise).
 */
struct vstellar_accel_buf {
	__s32 fd;			/* in: dmabuf fd */
	__u32 flags;			/* in: 0 */
	__aligned_u64 offset;		/* out: where it lies in device memory */
	__aligned_u64 size;		/* out: bytes */
};

#define VSTELLAR_ACCEL_IOC_MAGIC	'V'
/* Size and free space of the device memory. */
#define VSTELLAR_ACCEL_IOC_INFO \
	_IOR(VSTELLAR_ACCEL_IOC_MAGIC, 0x40, struct vstellar_accel_info)
/* A new zeroed buffer (ENOMEM: no free range large enough). */
#define VSTELLAR_ACCEL_IOC_ALLOC \
	_IOWR(VSTELLAR_ACCEL_IOC_MAGIC, 0x41, struct vstellar_accel_alloc)
/* Where a buffer lies now. */
#define VSTELLAR_ACCEL_IOC_QUERY \
	_IOWR(VSTELLAR_ACCEL_IOC_MAGIC, 0x42, struct vstellar_accel_buf)
/*
 * Move a buffer to another free range of device memory, as a GPU driver
 * evicts or compacts VRAM: importers are told first (dma_buf_move_notify)
 * and must drop their mappings; CPU mappings are zapped and fault in at
 * the new place; the contents are copied; the old range is freed. EBUSY
 * if an importer keeps the buffer pinned, ENOMEM if no range is free.
 */
#define VSTELLAR_ACCEL_IOC_MOVE \
	_IOWR(VSTELLAR_ACCEL_IOC_MAGIC, 0x43, struct vstellar_accel_buf)

#endif /* VSTELLAR_ACCEL_ABI_H */
