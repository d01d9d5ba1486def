/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/*
 * vStellar control-queue transport: typed commands over virtqueue 0.
 */
#ifndef _VSTELLAR_COM_H_
#define _VSTELLAR_COM_H_

#include <linux/list.h>
#include <linux/semaphore.h>
#include <linux/spinlock.h>
#include <linux/virtio.h>

#include <vstellar/virtio_vstellar.h>

struct vstellar_com {
	struct virtio_device *vdev;
	struct virtqueue *vq;
	/* serialises every use of vq and the fields below */
	spinlock_t lock;
	/* commands posted and not yet answered, aborted or timed out */
	struct list_head pending;
	/* free ring room, in commands (each takes at most 3 descriptors) */
	struct semaphore slots;
	u32 next_id;
	/* 0 while the device answers; else what new commands fail with */
	int dead;
	unsigned int timeout_ms;
};

int vstellar_com_init(struct vstellar_com *com, struct virtio_device *vdev,
		      struct virtqueue *vq, unsigned int timeout_ms);
void vstellar_com_abort(struct vstellar_com *com, int err);
void vstellar_com_release(struct vstellar_com *com);
void vstellar_com_complete(struct vstellar_com *com);
bool vstellar_com_device_lost(struct vstellar_com *com);

/*
 * Run one command and wait for its answer. @body (@body_len bytes) and the
 * page list @pages (@num_pages guest-physical addresses, a kmalloc buffer
 * that this function always frees) are copied or owned by the command, so
 * they may live on the stack. @resp receives exactly @resp_len bytes of
 * response body on success. The lengths are the interface's for @opcode
 * (vstellar_cmd_info()); a request of another shape is refused (-EINVAL)
 * before it reaches the device.
 *
 * Returns 0, the errno of the device status, -ETIMEDOUT when the device
 * did not answer in time, -ENODEV or -EIO when the device is lost.
 */
int vstellar_com_exec(struct vstellar_com *com, u16 opcode, u32 ucontext,
		      const void *body, size_t body_len,
		      __le64 *pages, u32 num_pages,
		      void *resp, size_t resp_len);

/* Whether commands still reach the device (a lost one fails them at once). */
static inline bool vstellar_com_alive(struct vstellar_com *com)
{
	return !READ_ONCE(com->dead);
}

static inline bool vstellar_com_is_dead_err(int err)
{
	return err == -ENODEV || err == -EIO || err == -ETIMEDOUT;
}

#endif /* _VSTELLAR_COM_H_ */
