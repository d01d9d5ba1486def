/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/*
 * vStellar: the kernel interfaces that differ between the kernels the
 * driver builds against, in one place. Supported: Linux 6.1 (Debian 12)
 * through 6.12 (Debian 13); the DKMS package refuses other kernels
 * (BUILD_EXCLUSIVE_KERNEL in dkms.conf) before this header could.
 */
#ifndef _VSTELLAR_COMPAT_H_
#define _VSTELLAR_COMPAT_H_

#include <linux/slab.h>
#include <linux/version.h>
#include <linux/virtio_config.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 1, 0)
#error "vstellar needs Linux 6.1 or newer (the ib_device_ops of 6.1)"
#endif

/*
 * 6.10 hands ib_device_ops.create_cq and .reg_user_mr_dmabuf the whole
 * uverbs attribute bundle (NULL for kernel CQs) instead of the driver's
 * udata.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 10, 0)
typedef struct uverbs_attr_bundle vstellar_uverbs_arg_t;

static inline struct ib_udata *
vstellar_uverbs_udata(struct uverbs_attr_bundle *attrs)
{
	return attrs ? &attrs->driver_udata : NULL;
}
#else
typedef struct ib_udata vstellar_uverbs_arg_t;

static inline struct ib_udata *vstellar_uverbs_udata(struct ib_udata *udata)
{
	return udata;
}
#endif

/*
 * 6.11 takes each virtqueue's name and callback as one struct
 * virtqueue_info array instead of two parallel arrays.
 */
static inline int vstellar_compat_find_vqs(struct virtio_device *vdev,
					   unsigned int nvqs,
					   struct virtqueue *vqs[],
					   vq_callback_t *callbacks[],
					   const char * const names[])
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 11, 0)
	struct virtqueue_info *info;
	unsigned int i;
	int err;

	info = kcalloc(nvqs, sizeof(*info), GFP_KERNEL);
	if (!info)
		return -ENOMEM;
	for (i = 0; i < nvqs; i++) {
		info[i].name = names[i];
		info[i].callback = callbacks[i];
	}
	err = virtio_find_vqs(vdev, nvqs, vqs, info, NULL);
	kfree(info);
	return err;
#else
	return virtio_find_vqs(vdev, nvqs, vqs, callbacks, names, NULL);
#endif
}

#endif /* _VSTELLAR_COMPAT_H_ */
