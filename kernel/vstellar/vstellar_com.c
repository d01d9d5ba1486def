// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar control-queue transport.
 *
 * Every command is one descriptor chain: [cmd_hdr + body] [page list]
 * readable, [resp_hdr + response body] writable. A command's buffers belong
 * to a reference-counted context: one reference for the waiter, one for
 * the device while the chain sits in the ring. So a waiter that gives up
 * (timeout, device lost) never frees memory the device may still write;
 * the device's reference is dropped when the chain comes back, or when the
 * ring is torn down after a reset.
 */
#include <linux/kref.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/virtio_config.h>

#include "vstellar_com.h"

#define VSTELLAR_COM_POLL_MS	100

struct vstellar_cmd_ctx {
	struct kref ref;
	struct list_head node;		/* on com->pending while waited for */
	struct completion done;
	int result;
	u32 used_len;
	size_t body_len;
	size_t resp_len;
	__le64 *pages;
	u32 num_pages;
	struct vstellar_cmd_hdr *hdr;	/* hdr + body */
	struct vstellar_resp_hdr *rhdr;	/* rhdr + response body */
	u8 buf[];
};

/* Device status -> positive errno, from the interface's X-macro. */
#define VSTELLAR_STATUS_ERRNO_(name, val, err) \
	[val] = (err),
static const int vstellar_status_errno[] = {
	VSTELLAR_STATUS_LIST(VSTELLAR_STATUS_ERRNO_)
};

#undef VSTELLAR_STATUS_ERRNO_

static int vstellar_status_to_errno(u16 status)
{
	if (status < ARRAY_SIZE(vstellar_status_errno))
		return -vstellar_status_errno[status];
	return -EIO;
}

static void vstellar_cmd_ctx_free(struct kref *ref)
{
	struct vstellar_cmd_ctx *ctx =
		container_of(ref, struct vstellar_cmd_ctx, ref);

	kfree(ctx->pages);
	kfree(ctx);
}

static void vstellar_cmd_ctx_put(struct vstellar_cmd_ctx *ctx)
{
	kref_put(&ctx->ref, vstellar_cmd_ctx_free);
}

int vstellar_com_init(struct vstellar_com *com, struct virtio_device *vdev,
		      struct virtqueue *vq, unsigned int timeout_ms)
{
	unsigned int room = virtqueue_get_vring_size(vq) / 3;

	if (!room)
		return -EINVAL;
	com->vdev = vdev;
	com->vq = vq;
	spin_lock_init(&com->lock);
	INIT_LIST_HEAD(&com->pending);
	sema_init(&com->slots, room);
	com->next_id = 1;
	com->dead = 0;
	com->timeout_ms = timeout_ms;
	return 0;
}

/* Check an answered command; called under com->lock. */
static int vstellar_cmd_result(struct vstellar_com *com,
			       struct vstellar_cmd_ctx *ctx)
{
	struct vstellar_resp_hdr *rhdr = ctx->rhdr;
	u16 status;

	if (ctx->used_len < sizeof(*rhdr) ||
	    le32_to_cpu(rhdr->cmd_id) != le32_to_cpu(ctx->hdr->cmd_id) ||
	    le16_to_cpu(rhdr->opcode) != le16_to_cpu(ctx->hdr->opcode)) {
		dev_err_ratelimited(&com->vdev->dev,
				    "malformed response to %s (used %u)\n",
				    vstellar_cmd_name(le16_to_cpu(ctx->hdr->opcode)),
				    ctx->used_len);
		return -EIO;
	}
	status = le16_to_cpu(rhdr->status);
	if (status != VSTELLAR_STATUS_OK)
		return vstellar_status_to_errno(status);
	if (le32_to_cpu(rhdr->length) != ctx->resp_len ||
	    ctx->used_len < sizeof(*rhdr) + ctx->resp_len) {
		dev_err_ratelimited(&com->vdev->dev,
				    "%s: response of %u bytes, expected %zu\n",
				    vstellar_cmd_name(le16_to_cpu(ctx->hdr->opcode)),
				    le32_to_cpu(rhdr->length), ctx->resp_len);
		return -EIO;
	}
	return 0;
}

/* Control queue interrupt: complete every answered command. */
void vstellar_com_complete(struct vstellar_com *com)
{
	struct vstellar_cmd_ctx *ctx;
	unsigned long flags;
	unsigned int len;

	spin_lock_irqsave(&com->lock, flags);
	do {
		virtqueue_disable_cb(com->vq);
		while ((ctx = virtqueue_get_buf(com->vq, &len))) {
			ctx->used_len = len;
			if (!list_empty(&ctx->node)) {
				list_del_init(&ctx->node);
				ctx->result = vstellar_cmd_result(com, ctx);
				complete(&ctx->done);
			}
			up(&com->slots);
			vstellar_cmd_ctx_put(ctx);
		}
	} while (!virtqueue_enable_cb(com->vq));
	spin_unlock_irqrestore(&com->lock, flags);
}

/*
 * The device is gone (or stopped answering): fail every waiter with @err
 * and every later command too. The buffers stay with the ring until
 * vstellar_com_release().
 */
void vstellar_com_abort(struct vstellar_com *com, int err)
{
	struct vstellar_cmd_ctx *ctx, *tmp;
	unsigned long flags;

	spin_lock_irqsave(&com->lock, flags);
	if (!com->dead)
		com->dead = err;
	list_for_each_entry_safe(ctx, tmp, &com->pending, node) {
		list_del_init(&ctx->node);
		ctx->result = err;
		complete(&ctx->done);
	}
	spin_unlock_irqrestore(&com->lock, flags);
}

/* After the device was reset: drop the ring's references. */
void vstellar_com_release(struct vstellar_com *com)
{
	struct vstellar_cmd_ctx *ctx;

	vstellar_com_abort(com, -ENODEV);
	while ((ctx = virtqueue_detach_unused_buf(com->vq)))
		vstellar_cmd_ctx_put(ctx);
}

static int vstellar_com_post(struct vstellar_com *com,
			     struct vstellar_cmd_ctx *ctx)
{
	struct scatterlist out, pages, in, *sgs[3];
	unsigned int nout = 0;
	unsigned long flags;
	int err;

	sg_init_one(&out, ctx->hdr, sizeof(*ctx->hdr) + ctx->body_len);
	sgs[nout++] = &out;
	if (ctx->num_pages) {
		sg_init_one(&pages, ctx->pages, ctx->num_pages * sizeof(__le64));
		sgs[nout++] = &pages;
	}
	sg_init_one(&in, ctx->rhdr, sizeof(*ctx->rhdr) + ctx->resp_len);
	sgs[nout] = &in;

	spin_lock_irqsave(&com->lock, flags);
	err = com->dead;
	if (err)
		goto out;
	ctx->hdr->cmd_id = cpu_to_le32(com->next_id++);
	kref_get(&ctx->ref);		/* the ring's reference */
	err = virtqueue_add_sgs(com->vq, sgs, nout, 1, ctx, GFP_ATOMIC);
	if (err) {
		kref_put(&ctx->ref, vstellar_cmd_ctx_free);
		goto out;
	}
	list_add_tail(&ctx->node, &com->pending);
	if (!virtqueue_kick(com->vq)) {
		/* the transport is broken: nothing will come back */
		err = -EIO;
		list_del_init(&ctx->node);
		com->dead = err;
	}
out:
	spin_unlock_irqrestore(&com->lock, flags);
	return err;
}

/*
 * Whether the transport says the device is gone: the frontend sets
 * BACKEND_LOST and NEEDS_RESET when vstellard disconnects. Config-change
 * interrupts are held back by the virtio core while probe runs, so the
 * waiter also looks for itself.
 */
bool vstellar_com_device_lost(struct vstellar_com *com)
{
	struct virtio_device *vdev = com->vdev;
	u32 status;

	if (vdev->config->get_status(vdev) & VIRTIO_CONFIG_S_NEEDS_RESET)
		return true;
	status = virtio_cread32(vdev, offsetof(struct virtio_vstellar_config,
					       device_status));
	return status & (VSTELLAR_DEV_S_FATAL | VSTELLAR_DEV_S_BACKEND_LOST);
}

/*
 * Wait for an answer for up to @timeout, looking at the device's status
 * every VSTELLAR_COM_POLL_MS. Returns false on timeout.
 */
static bool vstellar_com_wait(struct vstellar_com *com,
			      struct vstellar_cmd_ctx *ctx,
			      unsigned long timeout)
{
	unsigned long slice = msecs_to_jiffies(VSTELLAR_COM_POLL_MS);
	unsigned long deadline = jiffies + timeout;

	for (;;) {
		if (wait_for_completion_timeout(&ctx->done, slice))
			return true;
		if (vstellar_com_device_lost(com)) {
			vstellar_com_abort(com, -ENODEV);
			return true;
		}
		if (time_after_eq(jiffies, deadline))
			return false;
	}
}

/*
 * A request the device would refuse for its shape alone is a driver bug:
 * the sizes must be the interface's (VSTELLAR_CMD_LIST), a page list only
 * where the command takes one, and no reserved opcode.
 */
static bool vstellar_com_request_ok(u16 opcode, size_t body_len,
				    u32 num_pages, size_t resp_len)
{
	const struct vstellar_cmd_info *info = vstellar_cmd_info(opcode);

	return info && !(info->flags & VSTELLAR_CMDF_RESERVED) &&
	       body_len == info->req_len && resp_len == info->resp_len &&
	       (!num_pages || (info->flags & VSTELLAR_CMDF_PAGES));
}

int vstellar_com_exec(struct vstellar_com *com, u16 opcode, u32 ucontext,
		      const void *body, size_t body_len,
		      __le64 *pages, u32 num_pages,
		      void *resp, size_t resp_len)
{
	unsigned long timeout = msecs_to_jiffies(com->timeout_ms);
	struct vstellar_cmd_ctx *ctx;
	unsigned long flags;
	int err;

	if (WARN_ONCE(!vstellar_com_request_ok(opcode, body_len, num_pages,
					       resp_len),
		      "vstellar: malformed %s request\n",
		      vstellar_cmd_name(opcode))) {
		kfree(pages);
		return -EINVAL;
	}
	ctx = kzalloc(struct_size(ctx, buf, sizeof(struct vstellar_cmd_hdr) +
				  body_len + sizeof(struct vstellar_resp_hdr) +
				  resp_len), GFP_KERNEL);
	if (!ctx) {
		kfree(pages);
		return -ENOMEM;
	}
	kref_init(&ctx->ref);
	INIT_LIST_HEAD(&ctx->node);
	init_completion(&ctx->done);
	ctx->pages = pages;
	ctx->num_pages = num_pages;
	ctx->body_len = body_len;
	ctx->resp_len = resp_len;
	ctx->hdr = (void *)ctx->buf;
	ctx->rhdr = (void *)(ctx->buf + sizeof(*ctx->hdr) + body_len);
	ctx->hdr->opcode = cpu_to_le16(opcode);
	ctx->hdr->ucontext = cpu_to_le32(ucontext);
	ctx->hdr->length = cpu_to_le32(body_len + num_pages * sizeof(__le64));
	if (body_len)
		memcpy(ctx->hdr + 1, body, body_len);

	if (down_timeout(&com->slots, timeout)) {
		err = com->dead ?: -ETIMEDOUT;
		goto out;
	}
	err = vstellar_com_post(com, ctx);
	if (err) {
		up(&com->slots);
		goto out;
	}

	if (!vstellar_com_wait(com, ctx, timeout)) {
		spin_lock_irqsave(&com->lock, flags);
		if (!list_empty(&ctx->node)) {
			list_del_init(&ctx->node);
			ctx->result = -ETIMEDOUT;
			/* commands run in order: later ones would wait too */
			if (!com->dead)
				com->dead = -EIO;
		}
		spin_unlock_irqrestore(&com->lock, flags);
		if (ctx->result == -ETIMEDOUT)
			dev_err(&com->vdev->dev,
				"command %s (id %u) timed out after %u ms (virtio status %#x, device_status %#x); device disabled\n",
				vstellar_cmd_name(opcode),
				le32_to_cpu(ctx->hdr->cmd_id), com->timeout_ms,
				com->vdev->config->get_status(com->vdev),
				virtio_cread32(com->vdev,
					       offsetof(struct virtio_vstellar_config,
							device_status)));
	}
	err = ctx->result;
	if (!err && resp_len)
		memcpy(resp, ctx->rhdr + 1, resp_len);
	else if (err && !vstellar_com_is_dead_err(err))
		dev_dbg(&com->vdev->dev, "command %s failed: %d\n",
			vstellar_cmd_name(opcode), err);
out:
	vstellar_cmd_ctx_put(ctx);
	return err;
}
