// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * vStellar rdma-core provider.
 *
 * Control verbs go through the kernel (vstellar.ko) with the udata of
 * include/vstellar/vstellar-abi.h. The data path never enters the kernel:
 * WQEs are written into rings in this process's memory, producer indices
 * into the context's doorbell page (mmapped; RAM on the host side), and the
 * kick page (a virtio notify register) is touched only when the device set
 * need_kick. CQEs are polled from the CQ ring by their owner (phase) bit;
 * CQs are armed through their doorbell slot. See docs/provider.md.
 */
#include <config.h>

#include <endian.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <ccan/minmax.h>
#include <util/util.h>

#include "vstellar.h"

static const struct verbs_match_ent vstellar_match_table[] = {
	/* the ib_device's parent is the virtio device, ID 42 ("RDMA device") */
	VERBS_MODALIAS_MATCH("virtio:d0000002Av*", NULL),
	/* fallback: the name vstellar.ko registers ("vstellar%d") */
	VERBS_NAME_MATCH("vstellar", NULL),
	{},
};

/* ------------------------------------------------------------------ */
/* Device and port                                                      */
/* ------------------------------------------------------------------ */

static int vstellar_query_device_ex(struct ibv_context *context,
				    const struct ibv_query_device_ex_input *input,
				    struct ibv_device_attr_ex *attr,
				    size_t attr_size)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);
	uint64_t fw;
	int ret;

	ret = ibv_cmd_query_device_any(context, input, attr, attr_size, &resp,
				       &resp_size);
	if (ret)
		return ret;
	fw = resp.base.fw_ver;
	snprintf(attr->orig_attr.fw_ver, sizeof(attr->orig_attr.fw_ver),
		 "%u.%u.%u", (unsigned int)(fw >> 32) & 0xffff,
		 (unsigned int)(fw >> 16) & 0xffff, (unsigned int)fw & 0xffff);
	return 0;
}

static int vstellar_query_port(struct ibv_context *context, uint8_t port,
			       struct ibv_port_attr *attr)
{
	struct ibv_query_port cmd;

	return ibv_cmd_query_port(context, port, attr, &cmd, sizeof(cmd));
}
/* ------------------------------------------------------------------ */
/* Context and device                                                   */
/* ------------------------------------------------------------------ */

static void vstellar_free_context(struct ibv_context *ibctx);

static const struct verbs_context_ops vstellar_ctx_ops = {
	.advise_mr = vstellar_advise_mr,
	.alloc_mw = vstellar_alloc_mw,
	.alloc_pd = vstellar_alloc_pd,
	.bind_mw = vstellar_bind_mw,
	.attach_mcast = ibv_cmd_attach_mcast,
	.create_ah = vstellar_create_ah,
	.create_cq = vstellar_create_cq,
	.create_cq_ex = vstellar_create_cq_ex,
	.create_qp = vstellar_create_qp,
	.create_qp_ex = vstellar_create_qp_ex,
	.create_srq = vstellar_create_srq,
	.dealloc_mw = vstellar_dealloc_mw,
	.dealloc_pd = vstellar_dealloc_pd,
	.dereg_mr = vstellar_dereg_mr,
	.destroy_ah = vstellar_destroy_ah,
	.destroy_cq = vstellar_destroy_cq,
	.destroy_qp = vstellar_destroy_qp,
	.destroy_srq = vstellar_destroy_srq,
	.detach_mcast = ibv_cmd_detach_mcast,
	.free_context = vstellar_free_context,
	.modify_qp = vstellar_modify_qp,
	.modify_srq = vstellar_modify_srq,
	.poll_cq = vstellar_poll_cq,
	.post_recv = vstellar_post_recv,
	.post_send = vstellar_post_send,
	.post_srq_recv = vstellar_post_srq_recv,
	.query_device_ex = vstellar_query_device_ex,
	.query_port = vstellar_query_port,
	.query_qp = vstellar_query_qp,
	.query_srq = vstellar_query_srq,
	.reg_dmabuf_mr = vstellar_reg_dmabuf_mr,
	.reg_mr = vstellar_reg_mr,
	.req_notify_cq = vstellar_req_notify_cq,
	.resize_cq = vstellar_resize_cq,
};

/*
 * rdma-core has kept the provider ABI name (IBVERBS_PRIVATE_34, the -rdmav34
 * suffix) from 36 to 56 while struct ibv_qp_ex grew at its end (44 added
 * wr_atomic_write, 45 wr_flush). struct verbs_qp puts comp_mask after it, so
 * a provider compiled against other headers than the running libibverbs'
 * sets VERBS_QP_EX where libibverbs does not look, and ibv_qp_to_qp_ex()
 * returns NULL for its QPs. Ask libibverbs where it looks.
 */
static bool vstellar_qp_layout_matches(void)
{
	struct {
		struct verbs_qp vqp;
		uint64_t beyond[4];	/* a larger layout reads here: zero */
	} probe = {};

	probe.vqp.comp_mask = VERBS_QP_EX;
	return ibv_qp_to_qp_ex(&probe.vqp.qp) == &probe.vqp.qp_ex;
}

static struct verbs_context *vstellar_alloc_context(struct ibv_device *ibdev,
						    int cmd_fd,
						    void *private_data)
{
	struct vstellar_get_context_cmd_resp resp = {};
	struct vstellar_get_context_cmd cmd = {};
	struct vstellar_alloc_ucontext_resp *u = &resp.drv;
	struct vstellar_context *ctx;

	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx,
					   RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;
	vstellar_qp_table_init(ctx);

	if (!vstellar_qp_layout_matches()) {
		verbs_err(&ctx->ibv_ctx,
			  "vstellar: this provider was built for another rdma-core release than the running libibverbs (struct verbs_qp differs); install the vstellar provider package made for this rdma-core\n");
		errno = EPROTO;
		goto err;
	}
	if (ibv_cmd_get_context(&ctx->ibv_ctx, &cmd.ibv_cmd, sizeof(cmd),
				&resp.ibv_resp, sizeof(resp)))
		goto err;
	if (u->db_page_size != VSTELLAR_DB_PAGE_SIZE ||
	    u->cqe_size != sizeof(struct vstellar_cqe) ||
	    u->db_first_slot != VSTELLAR_DB_FIRST_SLOT ||
	    u->db_slots > VSTELLAR_DB_SLOTS_PER_PAGE) {
		verbs_err(&ctx->ibv_ctx,
			  "vstellar: unexpected alloc_ucontext response (db page %u, cqe %u, first slot %u, slots %u)\n",
			  u->db_page_size, u->cqe_size, u->db_first_slot,
			  u->db_slots);
		errno = EPROTO;
		goto err;
	}
	ctx->ucontext = u->ucontext;
	ctx->features = u->device_features;
	ctx->max_qp_wr = u->max_qp_wr;
	ctx->max_cqe = u->max_cqe;
	ctx->max_send_sge = u->max_send_sge;
	ctx->max_recv_sge = u->max_recv_sge;
	ctx->max_inline_data = u->max_inline_data;
	ctx->num_cq_queues = u->num_cq_queues;
	ctx->min_sq_log_stride = max_t(uint32_t, u->min_sq_log_stride, 6);
	ctx->min_rq_log_stride = max_t(uint32_t, u->min_rq_log_stride, 4);
	ctx->db_slots = u->db_slots;
	ctx->db_page_size = u->db_page_size;
	ctx->db_suppress = ctx->features & (1U << VIRTIO_VSTELLAR_F_DB_SUPPRESS);

	ctx->db_page = mmap(NULL, ctx->db_page_size, PROT_READ | PROT_WRITE,
			    MAP_SHARED, cmd_fd, u->db_mmap_key);
	if (ctx->db_page == MAP_FAILED) {
		verbs_err(&ctx->ibv_ctx, "vstellar: mmap of the doorbell page failed: %m\n");
		ctx->db_page = NULL;
		goto err;
	}
	/* a device older than 1.4 leaves the alive word 0: never checked then */
	ctx->db_alive = le32toh(((struct vstellar_db_page_hdr *)ctx->db_page)->alive) ==
			VSTELLAR_DB_ALIVE;
	if (u->comp_mask & VSTELLAR_UCTX_KICK_PAGE) {
		ctx->kick_page = mmap(NULL, VSTELLAR_DB_PAGE_SIZE, PROT_WRITE,
				      MAP_SHARED, cmd_fd, u->kick_mmap_key);
		if (ctx->kick_page == MAP_FAILED) {
			verbs_err(&ctx->ibv_ctx, "vstellar: mmap of the kick page failed: %m\n");
			ctx->kick_page = NULL;
			goto err;
		}
	} else {
		verbs_warn(&ctx->ibv_ctx,
			   "vstellar: no kick page; doorbells rely on the device polling\n");
	}

	verbs_set_ops(&ctx->ibv_ctx, &vstellar_ctx_ops);
	return &ctx->ibv_ctx;

err:
	if (ctx->db_page)
		munmap(ctx->db_page, ctx->db_page_size);
	vstellar_qp_table_fini(ctx);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
	return NULL;
}

static void vstellar_free_context(struct ibv_context *ibctx)
{
	struct vstellar_context *ctx = to_vctx(ibctx);

	if (ctx->kick_page)
		munmap(ctx->kick_page, VSTELLAR_DB_PAGE_SIZE);
	if (ctx->db_page)
		munmap(ctx->db_page, ctx->db_page_size);
	vstellar_qp_table_fini(ctx);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

static struct verbs_device *vstellar_device_alloc(struct verbs_sysfs_dev *unused)
{
	struct vstellar_device *dev;

	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return NULL;
	return &dev->ibv_dev;
}

static void vstellar_uninit_device(struct verbs_device *verbs_device)
{
	free(container_of(verbs_device, struct vstellar_device, ibv_dev));
}

static const struct verbs_device_ops vstellar_dev_ops = {
	.name = "vstellar",
	.match_min_abi_version = VSTELLAR_UVERBS_ABI_VERSION,
	.match_max_abi_version = VSTELLAR_UVERBS_ABI_VERSION,
	.match_table = vstellar_match_table,
	.alloc_device = vstellar_device_alloc,
	.uninit_device = vstellar_uninit_device,
	.alloc_context = vstellar_alloc_context,
};
PROVIDER_DRIVER(vstellar, vstellar_dev_ops);

