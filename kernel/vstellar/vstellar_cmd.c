// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar device commands, one function each: encode the request, run it
 * (vstellar_com_exec), decode the answer. See vstellar_cmd.h.
 */
#include <rdma/ib_umem.h>
#include <rdma/ib_umem_odp.h>
#include <rdma/iter.h>

#include "vstellar.h"

/* ---------------------------------------------------------------- */
/* Page lists                                                        */
/* ---------------------------------------------------------------- */

void vstellar_pages_of_umem(struct vstellar_pages *p, struct ib_umem *umem,
			    unsigned long pgsz)
{
	p->umem = umem;
	p->dma = 0;
	p->pgsz = pgsz;
	p->npages = ib_umem_num_dma_blocks(umem, pgsz);
	p->offset = ib_umem_dma_offset(umem, pgsz);
}

/* A kernel ring is DMA-contiguous and page aligned: its pages in order. */
void vstellar_pages_of_kring(struct vstellar_pages *p,
			     const struct vstellar_kring *r)
{
	p->umem = NULL;
	p->dma = r->dma;
	p->pgsz = PAGE_SIZE;
	p->npages = r->size / PAGE_SIZE;
	p->offset = 0;
}

static void vstellar_pages_fill(const struct vstellar_pages *p, __le64 *list)
{
	struct ib_block_iter biter;
	size_t i = 0;

	if (!p->umem) {
		for (i = 0; i < p->npages; i++)
			list[i] = cpu_to_le64(p->dma + i * p->pgsz);
		return;
	}
	rdma_umem_for_each_dma_block(p->umem, &biter, p->pgsz)
		list[i++] = cpu_to_le64(rdma_block_iter_dma_address(&biter));
}

/*
 * The page list of a command: the pages of @n rings (or of one MR), one
 * after the other, in a buffer the transport frees. At most max_cmd_pages
 * addresses fit one command.
 */
static __le64 *vstellar_page_list(struct vstellar_dev *dev, u16 opcode,
				  const struct vstellar_pages *const *parts,
				  unsigned int n, u32 *num_pages)
{
	size_t total = 0, at = 0;
	unsigned int i;
	__le64 *list;

	for (i = 0; i < n; i++)
		total += parts[i]->npages;
	if (!total || total > le32_to_cpu(dev->cfg.max_cmd_pages)) {
		dev_dbg(&dev->vdev->dev, "%s: %zu pages, the device takes 1 to %u\n",
			vstellar_cmd_name(opcode), total,
			le32_to_cpu(dev->cfg.max_cmd_pages));
		return ERR_PTR(-EINVAL);
	}
	list = kmalloc_array(total, sizeof(*list), GFP_KERNEL | __GFP_NOWARN);
	if (!list)
		return ERR_PTR(-ENOMEM);
	for (i = 0; i < n; i++) {
		vstellar_pages_fill(parts[i], list + at);
		at += parts[i]->npages;
	}
	*num_pages = total;
	return list;
}

/* A command that carries the pages of @n rings (or of one MR). */
static int vstellar_exec_with_pages(struct vstellar_dev *dev, u16 opcode,
				    u32 uctx, const void *cmd, size_t cmd_len,
				    const struct vstellar_pages *const *parts,
				    unsigned int n, void *resp, size_t resp_len)
{
	u32 num_pages;
	__le64 *pages;

	pages = vstellar_page_list(dev, opcode, parts, n, &num_pages);
	if (IS_ERR(pages))
		return PTR_ERR(pages);
	return vstellar_com_exec(&dev->com, opcode, uctx, cmd, cmd_len, pages,
				 num_pages, resp, resp_len);
}

/* ---------------------------------------------------------------- */
/* Commands that release an object                                   */
/* ---------------------------------------------------------------- */

/*
 * A device that is gone took its objects with it, so the driver's side is
 * released anyway: these commands succeed when the device is lost. Only a
 * live device's refusal (BUSY and the like) is passed on.
 */
static int vstellar_cmd_release(struct vstellar_dev *dev, u16 opcode,
				u32 uctx, u32 handle)
{
	struct vstellar_cmd_handle cmd = { .handle = cpu_to_le32(handle) };
	int err;

	err = vstellar_com_exec(&dev->com, opcode, uctx, &cmd, sizeof(cmd),
				NULL, 0, NULL, 0);
	return vstellar_com_is_dead_err(err) ? 0 : err;
}

int vstellar_cmd_dealloc_ucontext(struct vstellar_dev *dev, u32 ucontext)
{
	/* the context names itself; the header's ucontext is 0 */
	return vstellar_cmd_release(dev, VSTELLAR_CMD_DEALLOC_UCONTEXT, 0,
				    ucontext);
}

int vstellar_cmd_dealloc_pd(struct vstellar_dev *dev, u32 uctx, u32 pdn)
{
	return vstellar_cmd_release(dev, VSTELLAR_CMD_DEALLOC_PD, uctx, pdn);
}

int vstellar_cmd_destroy_cq(struct vstellar_dev *dev, u32 uctx, u32 cqn)
{
	return vstellar_cmd_release(dev, VSTELLAR_CMD_DESTROY_CQ, uctx, cqn);
}

int vstellar_cmd_destroy_qp(struct vstellar_dev *dev, u32 uctx, u32 qpn)
{
	return vstellar_cmd_release(dev, VSTELLAR_CMD_DESTROY_QP, uctx, qpn);
}

int vstellar_cmd_dereg_mr(struct vstellar_dev *dev, u32 uctx, u32 mrn)
{
	return vstellar_cmd_release(dev, VSTELLAR_CMD_DEREG_MR, uctx, mrn);
}

/* F_DMABUF: the MR's pages go away; a lost device reaches none anyway. */
int vstellar_cmd_invalidate_mr(struct vstellar_dev *dev, u32 uctx, u32 mrn)
{
	return vstellar_cmd_release(dev, VSTELLAR_CMD_INVALIDATE_MR, uctx, mrn);
}

int vstellar_cmd_dealloc_mw(struct vstellar_dev *dev, u32 uctx, u32 mwn)
{
	return vstellar_cmd_release(dev, VSTELLAR_CMD_DEALLOC_MW, uctx, mwn);
}

int vstellar_cmd_destroy_srq(struct vstellar_dev *dev, u32 uctx, u32 srqn)
{
	return vstellar_cmd_release(dev, VSTELLAR_CMD_DESTROY_SRQ, uctx, srqn);
}

/* ---------------------------------------------------------------- */
/* Device, port, GIDs                                                */
/* ---------------------------------------------------------------- */

int vstellar_cmd_query_device(struct vstellar_dev *dev,
			      struct vstellar_resp_query_device *attr)
{
	return vstellar_com_exec(&dev->com, VSTELLAR_CMD_QUERY_DEVICE, 0,
				 NULL, 0, NULL, 0, attr, sizeof(*attr));
}

int vstellar_cmd_query_port(struct vstellar_dev *dev, u32 port,
			    struct ib_port_attr *props)
{
	struct vstellar_cmd_query_port cmd = { .port = cpu_to_le32(port) };
	struct vstellar_resp_query_port resp;
	int err;

	err = vstellar_com_exec(&dev->com, VSTELLAR_CMD_QUERY_PORT, 0,
				&cmd, sizeof(cmd), NULL, 0,
				&resp, sizeof(resp));
	if (err)
		return err;
	props->state = resp.state;
	props->phys_state = resp.phys_state;
	props->max_mtu = resp.max_mtu;
	props->active_mtu = resp.active_mtu;
	props->active_speed = resp.active_speed;
	props->active_width = resp.active_width;
	props->gid_tbl_len = le32_to_cpu(resp.gid_table_len);
	props->port_cap_flags |= le32_to_cpu(resp.port_cap_flags);
	props->max_msg_sz = le32_to_cpu(resp.max_msg_size);
	return 0;
}

static int vstellar_cmd_gid(struct vstellar_dev *dev, u16 opcode, u32 port,
			    u32 index, const union ib_gid *gid)
{
	struct vstellar_cmd_gid cmd = {
		.port = cpu_to_le32(port),
		.index = cpu_to_le32(index),
		.gid_type = cpu_to_le32(VSTELLAR_GID_TYPE_ROCE_V2),
	};

	if (gid)
		memcpy(cmd.gid, gid->raw, sizeof(cmd.gid));
	return vstellar_com_exec(&dev->com, opcode, 0, &cmd, sizeof(cmd),
				 NULL, 0, NULL, 0);
}

int vstellar_cmd_add_gid(struct vstellar_dev *dev, u32 port, u32 index,
			 const union ib_gid *gid)
{
	return vstellar_cmd_gid(dev, VSTELLAR_CMD_ADD_GID, port, index, gid);
}

/* Releases an entry: succeeds when the device is lost (see above). */
int vstellar_cmd_del_gid(struct vstellar_dev *dev, u32 port, u32 index)
{
	int err = vstellar_cmd_gid(dev, VSTELLAR_CMD_DEL_GID, port, index,
				   NULL);

	return vstellar_com_is_dead_err(err) ? 0 : err;
}

/* F_MCAST: attach UD QP qpn to (or detach it from) group gid */
int vstellar_cmd_mcast(struct vstellar_dev *dev, u32 uctx, bool attach,
		       u32 qpn, const union ib_gid *gid, u16 lid)
{
	struct vstellar_cmd_mcast cmd = {
		.qpn = cpu_to_le32(qpn),
		.mlid = cpu_to_le16(lid),
	};

	memcpy(cmd.mgid, gid->raw, sizeof(cmd.mgid));
	return vstellar_com_exec(&dev->com,
				 attach ? VSTELLAR_CMD_ATTACH_MCAST :
					  VSTELLAR_CMD_DETACH_MCAST,
				 uctx, &cmd, sizeof(cmd), NULL, 0, NULL, 0);
}

int vstellar_cmd_kernel_db(struct vstellar_dev *dev, u32 *db_page)
{
	struct vstellar_resp_kernel_db resp;
	int err;

	err = vstellar_com_exec(&dev->com, VSTELLAR_CMD_KERNEL_DB, 0, NULL, 0,
				NULL, 0, &resp, sizeof(resp));
	if (err)
		return err;
	*db_page = le32_to_cpu(resp.db_page);
	return 0;
}

/* ---------------------------------------------------------------- */
/* User contexts and PDs                                             */
/* ---------------------------------------------------------------- */

int vstellar_cmd_alloc_ucontext(struct vstellar_dev *dev,
				struct vstellar_alloc_ucontext_result *res)
{
	struct vstellar_resp_alloc_ucontext resp;
	int err;

	err = vstellar_com_exec(&dev->com, VSTELLAR_CMD_ALLOC_UCONTEXT, 0,
				NULL, 0, NULL, 0, &resp, sizeof(resp));
	if (err)
		return err;
	res->ucontext = le32_to_cpu(resp.ucontext);
	res->db_page = le32_to_cpu(resp.db_page);
	return 0;
}

int vstellar_cmd_alloc_pd(struct vstellar_dev *dev, u32 uctx, u32 *pdn)
{
	struct vstellar_resp_alloc_pd resp;
	int err;

	err = vstellar_com_exec(&dev->com, VSTELLAR_CMD_ALLOC_PD, uctx,
				NULL, 0, NULL, 0, &resp, sizeof(resp));
	if (err)
		return err;
	*pdn = le32_to_cpu(resp.pdn);
	return 0;
}

int vstellar_cmd_alloc_mw(struct vstellar_dev *dev, u32 uctx, u32 pdn,
			  u32 type, u32 *mwn, u32 *rkey)
{
	struct vstellar_cmd_alloc_mw cmd = {
		.pdn = cpu_to_le32(pdn),
		.type = cpu_to_le32(type),
	};
	struct vstellar_resp_alloc_mw resp;
	int err;

	err = vstellar_com_exec(&dev->com, VSTELLAR_CMD_ALLOC_MW, uctx,
				&cmd, sizeof(cmd), NULL, 0, &resp, sizeof(resp));
	if (err)
		return err;
	*mwn = le32_to_cpu(resp.mwn);
	*rkey = le32_to_cpu(resp.rkey);
	return 0;
}

/* ---------------------------------------------------------------- */
/* CQs                                                               */
/* ---------------------------------------------------------------- */

int vstellar_cmd_create_cq(struct vstellar_dev *dev, u32 uctx,
			   const struct vstellar_create_cq_params *params,
			   struct vstellar_create_cq_result *res)
{
	const struct vstellar_pages *ring = &params->ring;
	struct vstellar_cmd_create_cq cmd = {
		.log_cqe = cpu_to_le32(params->log_cqe),
		.cq_queue = cpu_to_le32(params->cq_queue),
		.page_shift = cpu_to_le32(__ffs(ring->pgsz)),
		.num_pages = cpu_to_le32(ring->npages),
		.ring_offset = cpu_to_le64(ring->offset),
	};
	struct vstellar_resp_create_cq resp;
	int err;

	err = vstellar_exec_with_pages(dev, VSTELLAR_CMD_CREATE_CQ, uctx,
				       &cmd, sizeof(cmd), &ring, 1,
				       &resp, sizeof(resp));
	if (err)
		return err;
	res->cqn = le32_to_cpu(resp.cqn);
	res->db_slot = le32_to_cpu(resp.db_slot);
	return 0;
}

int vstellar_cmd_resize_cq(struct vstellar_dev *dev, u32 uctx, u32 cqn,
			   u32 log_cqe, const struct vstellar_pages *ring,
			   u32 *moved)
{
	struct vstellar_cmd_resize_cq cmd = {
		.cqn = cpu_to_le32(cqn),
		.log_cqe = cpu_to_le32(log_cqe),
		.page_shift = cpu_to_le32(__ffs(ring->pgsz)),
		.num_pages = cpu_to_le32(ring->npages),
		.ring_offset = cpu_to_le64(ring->offset),
	};
	struct vstellar_resp_resize_cq resp;
	int err;

	err = vstellar_exec_with_pages(dev, VSTELLAR_CMD_RESIZE_CQ, uctx,
				       &cmd, sizeof(cmd), &ring, 1,
				       &resp, sizeof(resp));
	if (err)
		return err;
	*moved = le32_to_cpu(resp.cqe_moved);
	return 0;
}

/* ---------------------------------------------------------------- */
/* QPs                                                               */
/* ---------------------------------------------------------------- */

int vstellar_cmd_create_qp(struct vstellar_dev *dev, u32 uctx,
			   const struct vstellar_create_qp_params *params,
			   struct vstellar_create_qp_result *res)
{
	const struct vstellar_pages *rings[] = { &params->sq, &params->rq };
	/* a QP on an SRQ sends the SQ's pages only */
	unsigned int nrings = params->use_srq ? 1 : ARRAY_SIZE(rings);
	struct vstellar_cmd_create_qp cmd = {
		.pdn = cpu_to_le32(params->pdn),
		.send_cqn = cpu_to_le32(params->send_cqn),
		.recv_cqn = cpu_to_le32(params->recv_cqn),
		.qp_type = params->qp_type,
		.sq_sig_all = params->sq_sig_all,
		.sq_log_wqe = params->sq_log_wqe,
		.sq_log_stride = params->sq_log_stride,
		.rq_log_wqe = params->rq_log_wqe,
		.rq_log_stride = params->rq_log_stride,
		.page_shift = __ffs(params->sq.pgsz),
		.max_send_sge = cpu_to_le32(params->max_send_sge),
		.max_recv_sge = cpu_to_le32(params->max_recv_sge),
		.max_inline_data = cpu_to_le32(params->max_inline_data),
		.sq_pages = cpu_to_le32(params->sq.npages),
		.sq_offset = cpu_to_le64(params->sq.offset),
	};
	struct vstellar_resp_create_qp resp;
	int err;

	if (params->use_srq) {
		/* no RQ: its fields stay 0, the union names the SRQ */
		cmd.create_flags = VSTELLAR_QP_CREATE_USE_SRQ;
		cmd.srq.srqn = cpu_to_le32(params->srqn);
	} else {
		/* the command has one page_shift for both rings */
		if (WARN_ON_ONCE(params->sq.pgsz != params->rq.pgsz))
			return -EINVAL;
		cmd.rq_pages = cpu_to_le32(params->rq.npages);
		cmd.rq_offset = cpu_to_le64(params->rq.offset);
	}
	err = vstellar_exec_with_pages(dev, VSTELLAR_CMD_CREATE_QP, uctx,
				       &cmd, sizeof(cmd), rings, nrings,
				       &resp, sizeof(resp));
	if (err)
		return err;
	res->qpn = le32_to_cpu(resp.qpn);
	res->db_slot = le32_to_cpu(resp.db_slot);
	res->max_send_sge = le32_to_cpu(resp.max_send_sge);
	res->max_recv_sge = le32_to_cpu(resp.max_recv_sge);
	res->max_inline_data = le32_to_cpu(resp.max_inline_data);
	return 0;
}

/* The address vector of a RoCE ah_attr with a GRH. */
void vstellar_av_from_ah_attr(struct vstellar_av *av,
			      const struct rdma_ah_attr *ah)
{
	const struct ib_global_route *grh = rdma_ah_read_grh(ah);

	memset(av, 0, sizeof(*av));
	memcpy(av->dgid, grh->dgid.raw, sizeof(av->dgid));
	av->flow_label = cpu_to_be32(grh->flow_label & 0xfffff);
	av->sgid_index = grh->sgid_index;
	av->hop_limit = grh->hop_limit;
	av->traffic_class = grh->traffic_class;
	av->sl = rdma_ah_get_sl(ah);
	memcpy(av->dmac, ah->roce.dmac, sizeof(av->dmac));
}

static void vstellar_av_to_ah_attr(struct rdma_ah_attr *ah,
				   const struct vstellar_av *av)
{
	union ib_gid dgid;

	memset(ah, 0, sizeof(*ah));
	ah->type = RDMA_AH_ATTR_TYPE_ROCE;
	memcpy(dgid.raw, av->dgid, sizeof(dgid.raw));
	rdma_ah_set_grh(ah, &dgid, be32_to_cpu(av->flow_label),
			av->sgid_index, av->hop_limit, av->traffic_class);
	rdma_ah_set_sl(ah, av->sl);
	rdma_ah_set_port_num(ah, VSTELLAR_PORT);
	memcpy(ah->roce.dmac, av->dmac, sizeof(ah->roce.dmac));
}

int vstellar_cmd_modify_qp(struct vstellar_dev *dev, u32 uctx, u32 qpn,
			   const struct ib_qp_attr *attr, int attr_mask)
{
	struct vstellar_cmd_modify_qp cmd = { .qpn = cpu_to_le32(qpn) };
	struct vstellar_qp_attr *a = &cmd.attr;

	a->attr_mask = cpu_to_le32(attr_mask);
	a->qp_state = attr->qp_state;
	a->cur_qp_state = attr->cur_qp_state;
	a->path_mtu = attr->path_mtu;
	a->port = attr->port_num;
	a->qkey = cpu_to_le32(attr->qkey);
	a->rq_psn = cpu_to_le32(attr->rq_psn & 0xffffff);
	a->sq_psn = cpu_to_le32(attr->sq_psn & 0xffffff);
	a->dest_qpn = cpu_to_le32(attr->dest_qp_num & 0xffffff);
	a->access_flags = cpu_to_le32(attr->qp_access_flags &
				      VSTELLAR_ACCESS_VALID);
	a->pkey_index = cpu_to_le16(attr->pkey_index);
	a->max_rd_atomic = attr->max_rd_atomic;
	a->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	a->min_rnr_timer = attr->min_rnr_timer;
	a->timeout = attr->timeout;
	a->retry_cnt = attr->retry_cnt;
	a->rnr_retry = attr->rnr_retry;
	if (attr_mask & IB_QP_AV) {
		/* RoCE: every address vector has a GRH */
		if (!(rdma_ah_get_ah_flags(&attr->ah_attr) & IB_AH_GRH))
			return -EINVAL;
		vstellar_av_from_ah_attr(&a->av, &attr->ah_attr);
	}
	return vstellar_com_exec(&dev->com, VSTELLAR_CMD_MODIFY_QP, uctx,
				 &cmd, sizeof(cmd), NULL, 0, NULL, 0);
}

int vstellar_cmd_query_qp(struct vstellar_dev *dev, u32 uctx, u32 qpn,
			  bool has_av, struct ib_qp_attr *attr)
{
	struct vstellar_cmd_handle cmd = { .handle = cpu_to_le32(qpn) };
	struct vstellar_resp_query_qp resp;
	const struct vstellar_qp_attr *a = &resp.attr;
	int err;

	err = vstellar_com_exec(&dev->com, VSTELLAR_CMD_QUERY_QP, uctx,
				&cmd, sizeof(cmd), NULL, 0,
				&resp, sizeof(resp));
	if (err)
		return err;

	memset(attr, 0, sizeof(*attr));
	attr->qp_state = a->qp_state;
	attr->cur_qp_state = a->qp_state;
	attr->path_mtu = a->path_mtu;
	attr->path_mig_state = IB_MIG_MIGRATED;
	attr->qkey = le32_to_cpu(a->qkey);
	attr->rq_psn = le32_to_cpu(a->rq_psn);
	attr->sq_psn = le32_to_cpu(a->sq_psn);
	attr->dest_qp_num = le32_to_cpu(a->dest_qpn);
	attr->qp_access_flags = le32_to_cpu(a->access_flags);
	attr->pkey_index = le16_to_cpu(a->pkey_index);
	attr->port_num = VSTELLAR_PORT;
	attr->max_rd_atomic = a->max_rd_atomic;
	attr->max_dest_rd_atomic = a->max_dest_rd_atomic;
	attr->min_rnr_timer = a->min_rnr_timer;
	attr->timeout = a->timeout;
	attr->retry_cnt = a->retry_cnt;
	attr->rnr_retry = a->rnr_retry;
	attr->sq_draining = !!le32_to_cpu(resp.sq_draining);
	if (has_av)
		vstellar_av_to_ah_attr(&attr->ah_attr, &a->av);
	return 0;
}

/* ---------------------------------------------------------------- */
/* SRQs                                                              */
/* ---------------------------------------------------------------- */

int vstellar_cmd_create_srq(struct vstellar_dev *dev, u32 uctx,
			    const struct vstellar_create_srq_params *params,
			    struct vstellar_create_srq_result *res)
{
	const struct vstellar_pages *ring = &params->ring;
	struct vstellar_cmd_create_srq cmd = {
		.pdn = cpu_to_le32(params->pdn),
		.log_wqe = params->log_wqe,
		.log_stride = params->log_stride,
		.page_shift = __ffs(ring->pgsz),
		.max_sge = cpu_to_le32(params->max_sge),
		.srq_limit = cpu_to_le32(params->srq_limit),
		.num_pages = cpu_to_le32(ring->npages),
		.ring_offset = cpu_to_le64(ring->offset),
	};
	struct vstellar_resp_create_srq resp;
	int err;

	err = vstellar_exec_with_pages(dev, VSTELLAR_CMD_CREATE_SRQ, uctx,
				       &cmd, sizeof(cmd), &ring, 1,
				       &resp, sizeof(resp));
	if (err)
		return err;
	res->srqn = le32_to_cpu(resp.srqn);
	res->db_slot = le32_to_cpu(resp.db_slot);
	res->max_sge = le32_to_cpu(resp.max_sge);
	return 0;
}

int vstellar_cmd_modify_srq(struct vstellar_dev *dev, u32 uctx, u32 srqn,
			    u32 srq_limit)
{
	struct vstellar_cmd_modify_srq cmd = {
		.srqn = cpu_to_le32(srqn),
		.attr_mask = cpu_to_le32(VSTELLAR_SRQ_LIMIT),
		.srq_limit = cpu_to_le32(srq_limit),
	};

	return vstellar_com_exec(&dev->com, VSTELLAR_CMD_MODIFY_SRQ, uctx,
				 &cmd, sizeof(cmd), NULL, 0, NULL, 0);
}

int vstellar_cmd_resize_srq(struct vstellar_dev *dev, u32 uctx, u32 srqn,
			    u8 log_wqe, const struct vstellar_pages *ring)
{
	struct vstellar_cmd_resize_srq cmd = {
		.srqn = cpu_to_le32(srqn),
		.log_wqe = log_wqe,
		.page_shift = __ffs(ring->pgsz),
		.num_pages = cpu_to_le32(ring->npages),
		.ring_offset = cpu_to_le64(ring->offset),
	};

	return vstellar_exec_with_pages(dev, VSTELLAR_CMD_RESIZE_SRQ, uctx,
					&cmd, sizeof(cmd), &ring, 1,
					NULL, 0);
}

int vstellar_cmd_query_srq(struct vstellar_dev *dev, u32 uctx, u32 srqn,
			   struct ib_srq_attr *attr)
{
	struct vstellar_cmd_handle cmd = { .handle = cpu_to_le32(srqn) };
	struct vstellar_resp_query_srq resp;
	int err;

	err = vstellar_com_exec(&dev->com, VSTELLAR_CMD_QUERY_SRQ, uctx,
				&cmd, sizeof(cmd), NULL, 0,
				&resp, sizeof(resp));
	if (err)
		return err;
	attr->max_wr = le32_to_cpu(resp.max_wr);
	attr->max_sge = le32_to_cpu(resp.max_sge);
	attr->srq_limit = le32_to_cpu(resp.srq_limit);
	return 0;
}

/* ---------------------------------------------------------------- */
/* MRs                                                               */
/* ---------------------------------------------------------------- */

static void vstellar_reg_mr_result(const struct vstellar_resp_reg_mr *resp,
				   struct vstellar_reg_mr_result *res)
{
	res->mrn = le32_to_cpu(resp->mrn);
	res->lkey = le32_to_cpu(resp->lkey);
	res->rkey = le32_to_cpu(resp->rkey);
}

int vstellar_cmd_reg_mr(struct vstellar_dev *dev, u32 uctx,
			const struct vstellar_reg_mr_params *params,
			struct vstellar_reg_mr_result *res)
{
	const struct vstellar_pages *mem = &params->pages;
	struct vstellar_cmd_reg_mr cmd = {
		.pdn = cpu_to_le32(params->pdn),
		.access_flags = cpu_to_le32(params->access_flags),
		.iova = cpu_to_le64(params->iova),
		.length = cpu_to_le64(params->length),
		.page_shift = cpu_to_le32(__ffs(mem->pgsz)),
		.num_pages = cpu_to_le32(mem->npages),
	};
	struct vstellar_resp_reg_mr resp;
	int err;

	err = vstellar_exec_with_pages(dev, VSTELLAR_CMD_REG_MR, uctx,
				       &cmd, sizeof(cmd), &mem, 1,
				       &resp, sizeof(resp));
	if (err)
		return err;
	vstellar_reg_mr_result(&resp, res);
	return 0;
}

/*
 * F_ODP: REG_MR without pages. The device takes pages of 4 KiB for an
 * on-demand MR, whatever page sizes it offers otherwise.
 */
int vstellar_cmd_reg_odp_mr(struct vstellar_dev *dev, u32 uctx, u32 pdn,
			    u32 access_flags, u64 iova, u64 length,
			    struct vstellar_reg_mr_result *res)
{
	struct vstellar_cmd_reg_mr cmd = {
		.pdn = cpu_to_le32(pdn),
		.access_flags = cpu_to_le32(access_flags |
					    VSTELLAR_ACCESS_ON_DEMAND),
		.iova = cpu_to_le64(iova),
		.length = cpu_to_le64(length),
		.page_shift = cpu_to_le32(VSTELLAR_ODP_PAGE_SHIFT),
	};
	struct vstellar_resp_reg_mr resp;
	int err;

	err = vstellar_com_exec(&dev->com, VSTELLAR_CMD_REG_MR, uctx,
				&cmd, sizeof(cmd), NULL, 0,
				&resp, sizeof(resp));
	if (err)
		return err;
	vstellar_reg_mr_result(&resp, res);
	return 0;
}

/*
 * F_ODP: @n pages of an on-demand MR from @iova on, as the core's ODP
 * umem lists them: a DMA address with ODP_*_ALLOWED_BIT in its low bits.
 * Called with the umem's umem_mutex held, so that no invalidation comes
 * between the mapping and the device's view of it; the caller keeps the
 * allocations here from recursing into reclaim (memalloc_noio_save).
 */
int vstellar_cmd_map_mr_pages(struct vstellar_dev *dev, u32 uctx, u32 mrn,
			      u64 iova, const dma_addr_t *odp_pages, u32 n)
{
	struct vstellar_cmd_map_mr_pages cmd = {
		.mrn = cpu_to_le32(mrn),
		.num_pages = cpu_to_le32(n),
		.iova = cpu_to_le64(iova),
	};
	__le64 *list;
	u32 i;

	if (!n || n > le32_to_cpu(dev->cfg.max_cmd_pages))
		return -EINVAL;
	list = kmalloc_array(n, sizeof(*list), GFP_KERNEL | __GFP_NOWARN);
	if (!list)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		u64 page = odp_pages[i] & ODP_DMA_ADDR_MASK;

		if (odp_pages[i] & ODP_WRITE_ALLOWED_BIT)
			page |= VSTELLAR_ODP_PAGE_WRITABLE;
		list[i] = cpu_to_le64(page);
	}
	return vstellar_com_exec(&dev->com, VSTELLAR_CMD_MAP_MR_PAGES, uctx,
				 &cmd, sizeof(cmd), list, n, NULL, 0);
}

/* F_ODP: the device stops using [iova, iova + length) before it answers. */
int vstellar_cmd_unmap_mr_pages(struct vstellar_dev *dev, u32 uctx, u32 mrn,
				u64 iova, u64 length)
{
	struct vstellar_cmd_unmap_mr_pages cmd = {
		.mrn = cpu_to_le32(mrn),
		.iova = cpu_to_le64(iova),
		.length = cpu_to_le64(length),
	};

	return vstellar_com_exec(&dev->com, VSTELLAR_CMD_UNMAP_MR_PAGES, uctx,
				 &cmd, sizeof(cmd), NULL, 0, NULL, 0);
}

int vstellar_cmd_alloc_mr(struct vstellar_dev *dev, u32 pdn, u32 max_num_pages,
			  struct vstellar_reg_mr_result *res)
{
	struct vstellar_cmd_alloc_mr cmd = {
		.pdn = cpu_to_le32(pdn),
		.max_num_pages = cpu_to_le32(max_num_pages),
	};
	struct vstellar_resp_reg_mr resp;
	int err;

	err = vstellar_com_exec(&dev->com, VSTELLAR_CMD_ALLOC_MR, 0,
				&cmd, sizeof(cmd), NULL, 0,
				&resp, sizeof(resp));
	if (err)
		return err;
	vstellar_reg_mr_result(&resp, res);
	return 0;
}
