// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar verbs: the control path, each verb one or two device commands
 * (vstellar_cmd.c), and the CQs, QPs and SRQs of user space, whose rings
 * are in the process's memory. The data path (posting WQEs, polling CQEs, arming
 * CQs) runs in user space on those rings and the context's doorbell page;
 * kernel CQs, QPs and SRQs and their data path are in vstellar_kverbs.c.
 * See docs/driver.md.
 */
#include <rdma/ib_addr.h>
#include <rdma/ib_mad.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "vstellar.h"

static u32 vstellar_uctx_handle(struct ib_udata *udata)
{
	struct vstellar_ucontext *uctx = rdma_udata_to_drv_context(udata,
				struct vstellar_ucontext, ibucontext);

	return uctx ? uctx->handle : 0;
}

/* Page sizes the device takes for rings and MRs, as a bitmap. */
static unsigned long vstellar_pgsz_bitmap(struct vstellar_dev *dev)
{
	return le64_to_cpu(dev->attr.page_size_cap) &
	       GENMASK_ULL(30, PAGE_SHIFT);
}

/* ---------------------------------------------------------------- */
/* Device and port                                                   */
/* ---------------------------------------------------------------- */

int vstellar_query_device(struct ib_device *ibdev, struct ib_device_attr *props,
			  struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibdev);
	const struct vstellar_resp_query_device *a = &dev->attr;
	u32 caps = le32_to_cpu(a->device_cap_flags);

	if (udata && udata->inlen &&
	    !ib_is_udata_cleared(udata, 0, udata->inlen))
		return -EINVAL;

	memset(props, 0, sizeof(*props));
	props->fw_ver = le64_to_cpu(a->fw_version);
	memcpy(&props->sys_image_guid, a->sys_image_guid,
	       sizeof(props->sys_image_guid));
	props->vendor_id = le32_to_cpu(a->vendor_id);
	props->vendor_part_id = le32_to_cpu(a->vendor_part_id);
	props->hw_ver = le32_to_cpu(a->hw_version);
	props->max_mr_size = le64_to_cpu(a->max_mr_size);
	props->page_size_cap = vstellar_pgsz_bitmap(dev);
	props->max_qp = le32_to_cpu(a->max_qp);
	props->max_qp_wr = le32_to_cpu(a->max_qp_wr);
	props->max_send_sge = le32_to_cpu(a->max_send_sge);
	props->max_recv_sge = le32_to_cpu(a->max_recv_sge);
	props->max_sge_rd = props->max_send_sge;
	props->max_cq = le32_to_cpu(a->max_cq);
	props->max_cqe = le32_to_cpu(a->max_cqe);
	props->max_mr = le32_to_cpu(a->max_mr);
	props->max_pd = le32_to_cpu(a->max_pd);
	props->max_ah = le32_to_cpu(a->max_ah);
	props->max_qp_rd_atom = le32_to_cpu(a->max_qp_rd_atom);
	props->max_qp_init_rd_atom = le32_to_cpu(a->max_qp_init_rd_atom);
	props->max_res_rd_atom = props->max_qp * props->max_qp_rd_atom;
	props->max_pkeys = 1;
	/* a device without F_SRQ answers 0; a driver without it must too */
	if (dev->features & BIT(VIRTIO_VSTELLAR_F_SRQ)) {
		props->max_srq = le32_to_cpu(a->max_srq);
		props->max_srq_wr = le32_to_cpu(a->max_srq_wr);
		props->max_srq_sge = le32_to_cpu(a->max_srq_sge);
	}
	if (dev->features & BIT(VIRTIO_VSTELLAR_F_MCAST)) {
		/* minor 5 says what the device allows; before, the maxima */
		props->max_mcast_grp = le16_to_cpu(dev->cfg.max_mcast_grp) ?:
				       VSTELLAR_MAX_MCAST_GRP;
		props->max_mcast_qp_attach =
			le16_to_cpu(dev->cfg.max_mcast_qp_attach) ?:
			VSTELLAR_MAX_MCAST_QP_ATTACH;
		props->max_total_mcast_qp_attach =
			props->max_mcast_grp * props->max_mcast_qp_attach;
	}
	props->atomic_cap = dev->features & BIT(VIRTIO_VSTELLAR_F_ATOMIC) ?
			    IB_ATOMIC_HCA : IB_ATOMIC_NONE;
	if (caps & VSTELLAR_DEVCAP_RC_RNR_NAK_GEN)
		props->device_cap_flags |= IB_DEVICE_RC_RNR_NAK_GEN;
	if (caps & VSTELLAR_DEVCAP_SYS_IMAGE_GUID)
		props->device_cap_flags |= IB_DEVICE_SYS_IMAGE_GUID;
	props->device_cap_flags |= IB_DEVICE_PORT_ACTIVE_EVENT;
	if (dev->features & BIT(VIRTIO_VSTELLAR_F_RESIZE_SRQ))
		props->device_cap_flags |= IB_DEVICE_SRQ_RESIZE;
	if (dev->kdb)
		props->kernel_cap_flags |= IBK_LOCAL_DMA_LKEY;
	if (dev->features & BIT(VIRTIO_VSTELLAR_F_MW)) {
		props->device_cap_flags |= IB_DEVICE_MEM_WINDOW |
					   IB_DEVICE_MEM_WINDOW_TYPE_2B;
		props->max_mw = le32_to_cpu(a->max_mw);
	}
	/* fast registration: kernel QPs only, so only with kernel verbs */
	if (dev->kdb && (dev->features & BIT(VIRTIO_VSTELLAR_F_MEM_MGT))) {
		props->device_cap_flags |= IB_DEVICE_MEM_MGT_EXTENSIONS;
		props->max_fast_reg_page_list_len =
			le32_to_cpu(dev->cfg.max_fast_reg_pages);
	}
	return 0;
}

int vstellar_query_port(struct ib_device *ibdev, u32 port,
			struct ib_port_attr *props)
{
	struct vstellar_dev *dev = to_vdev(ibdev);
	struct net_device *ndev;
	int err;

	props->gid_tbl_len = le32_to_cpu(dev->cfg.gid_table_len);
	props->pkey_tbl_len = 1;
	props->ip_gids = true;
	props->max_msg_sz = le32_to_cpu(dev->cfg.max_msg_size);
	props->port_cap_flags = IB_PORT_CM_SUP;

	err = vstellar_cmd_query_port(dev, port, props);
	if (vstellar_com_is_dead_err(err)) {
		/* a lost device still answers queries: its port is down */
		props->state = IB_PORT_DOWN;
		props->phys_state = IB_PORT_PHYS_STATE_DISABLED;
		props->max_mtu = IB_MTU_1024;
		props->active_mtu = IB_MTU_1024;
		props->active_speed = IB_SPEED_SDR;
		props->active_width = IB_WIDTH_1X;
		return 0;
	}
	if (err)
		return err;

	/* RoCE: the path MTU also fits the net device's MTU */
	rcu_read_lock();
	ndev = READ_ONCE(dev->netdev);
	if (ndev)
		props->active_mtu = min_t(int, props->active_mtu,
					  iboe_get_mtu(READ_ONCE(ndev->mtu)));
	rcu_read_unlock();
	return 0;
}

int vstellar_query_pkey(struct ib_device *ibdev, u32 port, u16 index,
			u16 *pkey)
{
	if (index)
		return -EINVAL;
	*pkey = IB_DEFAULT_PKEY_FULL;
	return 0;
}

int vstellar_get_port_immutable(struct ib_device *ibdev, u32 port,
				struct ib_port_immutable *immutable)
{
	struct vstellar_dev *dev = to_vdev(ibdev);

	immutable->pkey_tbl_len = 1;
	immutable->gid_tbl_len = max_t(u32, 1,
				       le32_to_cpu(dev->cfg.gid_table_len));
	immutable->core_cap_flags = RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP;
	immutable->max_mad_size = IB_MGMT_MAD_SIZE;
	return 0;
}

enum rdma_link_layer vstellar_get_link_layer(struct ib_device *ibdev,
					     u32 port)
{
	return IB_LINK_LAYER_ETHERNET;
}

void vstellar_get_dev_fw_str(struct ib_device *ibdev, char *str)
{
	u64 fw = le64_to_cpu(to_vdev(ibdev)->attr.fw_version);

	snprintf(str, IB_FW_VERSION_NAME_MAX, "%u.%u.%u",
		 (u32)(fw >> 32) & 0xffff, (u32)(fw >> 16) & 0xffff,
		 (u32)fw & 0xffff);
}

/* GIDs are RoCE v2 only: the core's cache fills them from the netdev. */
int vstellar_add_gid(const struct ib_gid_attr *attr, void **context)
{
	if (attr->gid_type != IB_GID_TYPE_ROCE_UDP_ENCAP)
		return -EINVAL;
	return vstellar_cmd_add_gid(to_vdev(attr->device), attr->port_num,
				    attr->index, &attr->gid);
}

int vstellar_del_gid(const struct ib_gid_attr *attr, void **context)
{
	if (attr->gid_type != IB_GID_TYPE_ROCE_UDP_ENCAP)
		return -EINVAL;
	return vstellar_cmd_del_gid(to_vdev(attr->device), attr->port_num,
				    attr->index);
}

/* ---------------------------------------------------------------- */
/* User contexts and mmap                                            */
/* ---------------------------------------------------------------- */

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

/* ---------------------------------------------------------------- */
/* PDs                                                               */
/* ---------------------------------------------------------------- */

int vstellar_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	return vstellar_cmd_alloc_pd(to_vdev(ibpd->device),
				     vstellar_uctx_handle(udata),
				     &to_vpd(ibpd)->pdn);
}

int vstellar_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	return vstellar_cmd_dealloc_pd(to_vdev(ibpd->device),
				       vstellar_uctx_handle(udata),
				       to_vpd(ibpd)->pdn);
}

/* ---------------------------------------------------------------- */
/* CQs                                                               */
/* ---------------------------------------------------------------- */

/* A user ring: pinned process memory and the page size it is sent in. */
struct vstellar_ring {
	struct ib_umem *umem;
	unsigned long pgsz;
};

static int vstellar_ring_get(struct vstellar_dev *dev, struct vstellar_ring *r,
			     u64 addr, size_t size)
{
	if (!addr || !PAGE_ALIGNED(addr))
		return -EINVAL;
	r->umem = ib_umem_get(&dev->ibdev, addr, size, IB_ACCESS_LOCAL_WRITE);
	if (IS_ERR(r->umem))
		return PTR_ERR(r->umem);
	r->pgsz = ib_umem_find_best_pgsz(r->umem, vstellar_pgsz_bitmap(dev),
					 addr);
	if (!r->pgsz) {
		ib_umem_release(r->umem);
		return -EINVAL;
	}
	return 0;
}

int vstellar_create_user_cq(struct ib_cq *ibcq,
			    const struct ib_cq_init_attr *attr,
			    struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibcq->device);
	struct vstellar_cq *cq = to_vcq(ibcq);
	struct vstellar_create_cq_resp uresp = {};
	struct vstellar_create_cq_params params = {};
	struct vstellar_create_cq_result res;
	struct vstellar_create_cq ucmd;
	struct vstellar_ring r;
	int err;

	if (udata->inlen < offsetofend(typeof(ucmd), log_cqe))
		return -EINVAL;
	err = ib_copy_from_udata(&ucmd, udata, min(sizeof(ucmd), udata->inlen));
	if (err)
		return err;
	if (ucmd.comp_mask || ucmd.log_cqe > VSTELLAR_MAX_LOG_CQE ||
	    (1U << ucmd.log_cqe) < attr->cqe ||
	    (1U << ucmd.log_cqe) > le32_to_cpu(dev->attr.max_cqe))
		return -EINVAL;
	err = vstellar_ring_get(dev, &r, ucmd.buf_addr,
				sizeof(struct vstellar_cqe) << ucmd.log_cqe);
	if (err)
		return err;

	cq->ucontext = vstellar_uctx_handle(udata);
	cq->log_cqe = ucmd.log_cqe;
	mutex_init(&cq->resize_mutex);
	params.log_cqe = cq->log_cqe;
	params.cq_queue = attr->comp_vector % dev->num_cqnq;
	vstellar_pages_of_umem(&params.ring, r.umem, r.pgsz);
	err = vstellar_cmd_create_cq(dev, cq->ucontext, &params, &res);
	if (err)
		goto err_umem;
	cq->cqn = res.cqn;
	cq->db_slot = res.db_slot;
	cq->umem = r.umem;
	ibcq->cqe = 1 << cq->log_cqe;

	err = xa_insert_irq(&dev->cqs, cq->cqn, cq, GFP_KERNEL);
	if (err) {
		dev_err_ratelimited(&dev->vdev->dev,
				    "CREATE_CQ: CQN %u already in use\n", cq->cqn);
		goto err_destroy;
	}
	uresp.cqn = cq->cqn;
	uresp.db_slot = cq->db_slot;
	uresp.log_cqe = cq->log_cqe;
	err = ib_copy_to_udata(udata, &uresp, min(sizeof(uresp), udata->outlen));
	if (err)
		goto err_xa;
	return 0;

err_xa:
	xa_erase_irq(&dev->cqs, cq->cqn);
err_destroy:
	vstellar_cmd_destroy_cq(dev, cq->ucontext, cq->cqn);
	err = err == -EBUSY ? -EIO : err;
err_umem:
	ib_umem_release(r.umem);
	return err;
}

/*
 * F_RESIZE_CQ, user CQs: the provider hands a new zeroed ring; the device
 * moves the CQEs not yet polled to its start. The provider holds its CQ
 * lock throughout, so nothing polls meanwhile; resize_mutex keeps two
 * resizes of one CQ (a hostile process) from pinning one ring while the
 * device writes another. Kernel CQs cannot be resized (no kernel ULP we
 * serve asks for it).
 */
int vstellar_resize_cq(struct ib_cq *ibcq, int cqe, struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibcq->device);
	struct vstellar_cq *cq = to_vcq(ibcq);
	struct vstellar_resize_cq_resp uresp = {};
	struct vstellar_resize_cq ucmd;
	struct vstellar_pages pages;
	struct ib_umem *old;
	struct vstellar_ring r;
	u32 moved;
	int err;

	if (!udata || !cq->umem ||
	    !(dev->features & BIT(VIRTIO_VSTELLAR_F_RESIZE_CQ)))
		return -EOPNOTSUPP;
	if (udata->inlen < offsetofend(typeof(ucmd), log_cqe))
		return -EINVAL;
	err = ib_copy_from_udata(&ucmd, udata, min(sizeof(ucmd), udata->inlen));
	if (err)
		return err;
	if (ucmd.comp_mask || cqe < 1 || ucmd.log_cqe > VSTELLAR_MAX_LOG_CQE ||
	    (1U << ucmd.log_cqe) < cqe ||
	    (1U << ucmd.log_cqe) > le32_to_cpu(dev->attr.max_cqe))
		return -EINVAL;
	err = vstellar_ring_get(dev, &r, ucmd.buf_addr,
				sizeof(struct vstellar_cqe) << ucmd.log_cqe);
	if (err)
		return err;
	vstellar_pages_of_umem(&pages, r.umem, r.pgsz);

	mutex_lock(&cq->resize_mutex);
	err = vstellar_cmd_resize_cq(dev, cq->ucontext, cq->cqn, ucmd.log_cqe,
				     &pages, &moved);
	if (err) {
		mutex_unlock(&cq->resize_mutex);
		ib_umem_release(r.umem);
		/* LIMIT: more CQEs outstanding than the new ring holds */
		return err == -ENOSPC ? -EINVAL : err;
	}
	old = cq->umem;
	cq->umem = r.umem;
	cq->log_cqe = ucmd.log_cqe;
	ibcq->cqe = 1 << cq->log_cqe;
	mutex_unlock(&cq->resize_mutex);
	ib_umem_release(old);

	uresp.cqe_moved = moved;
	uresp.log_cqe = ucmd.log_cqe;
	return ib_copy_to_udata(udata, &uresp, min(sizeof(uresp), udata->outlen));
}

/* User and kernel CQs: whichever memory the CQ has is freed. */
int vstellar_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibcq->device);
	struct vstellar_cq *cq = to_vcq(ibcq);
	int err;

	err = vstellar_cmd_destroy_cq(dev, cq->ucontext, cq->cqn);
	if (err)
		return err;
	/* after this, no notification still queued runs the CQ's handler */
	xa_erase_irq(&dev->cqs, cq->cqn);
	ib_umem_release(cq->umem);
	vstellar_kring_free(dev, &cq->kring);
	return 0;
}

/* ---------------------------------------------------------------- */
/* QPs                                                               */
/* ---------------------------------------------------------------- */

/* A QP on an SRQ has no RQ: its RQ fields must be 0 (the ABI says so). */
static int vstellar_check_qp_ucmd(struct vstellar_dev *dev,
				  const struct vstellar_create_qp *u,
				  const struct ib_qp_init_attr *init_attr)
{
	u32 max_wr = le32_to_cpu(dev->attr.max_qp_wr);

	if (u->comp_mask)
		return -EINVAL;
	if (u->sq_log_wqe > VSTELLAR_MAX_LOG_WQE ||
	    (1U << u->sq_log_wqe) > max_wr ||
	    (1U << u->sq_log_wqe) < init_attr->cap.max_send_wr ||
	    u->sq_log_stride < VSTELLAR_MIN_SQ_LOG_STRIDE ||
	    u->sq_log_stride > VSTELLAR_MAX_LOG_STRIDE)
		return -EINVAL;
	if (init_attr->srq)
		return u->rq_buf_addr || u->rq_log_wqe || u->rq_log_stride ?
		       -EINVAL : 0;
	if (u->rq_log_wqe > VSTELLAR_MAX_LOG_WQE ||
	    (1U << u->rq_log_wqe) > max_wr ||
	    (1U << u->rq_log_wqe) < init_attr->cap.max_recv_wr ||
	    u->rq_log_stride < VSTELLAR_MIN_RQ_LOG_STRIDE ||
	    u->rq_log_stride > VSTELLAR_MAX_LOG_STRIDE)
		return -EINVAL;
	return 0;
}

int vstellar_create_user_qp(struct ib_qp *ibqp,
			    struct ib_qp_init_attr *init_attr,
			    struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);
	struct vstellar_create_qp_resp uresp = {};
	struct vstellar_create_qp_params params = {};
	struct vstellar_create_qp_result res;
	struct vstellar_create_qp ucmd;
	struct vstellar_ring sq, rq = {};
	unsigned long pgsz;
	int err;

	switch (init_attr->qp_type) {
	case IB_QPT_RC:
		if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_RC)))
			return -EOPNOTSUPP;
		params.qp_type = VSTELLAR_QPT_RC;
		break;
	case IB_QPT_UC:
		if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_UC)))
			return -EOPNOTSUPP;
		params.qp_type = VSTELLAR_QPT_UC;
		break;
	case IB_QPT_UD:
		if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_UD)))
			return -EOPNOTSUPP;
		params.qp_type = VSTELLAR_QPT_UD;
		break;
	default:
		return -EOPNOTSUPP;
	}
	if (udata->inlen < offsetofend(typeof(ucmd), rq_log_stride))
		return -EINVAL;
	err = ib_copy_from_udata(&ucmd, udata, min(sizeof(ucmd), udata->inlen));
	if (err)
		return err;
	err = vstellar_check_qp_ucmd(dev, &ucmd, init_attr);
	if (err)
		return err;

	err = vstellar_ring_get(dev, &sq, ucmd.sq_buf_addr,
				(size_t)1 << (ucmd.sq_log_wqe + ucmd.sq_log_stride));
	if (err)
		return err;
	if (!init_attr->srq) {
		err = vstellar_ring_get(dev, &rq, ucmd.rq_buf_addr,
					(size_t)1 << (ucmd.rq_log_wqe +
						      ucmd.rq_log_stride));
		if (err)
			goto err_sq;
	}

	qp->ucontext = vstellar_uctx_handle(udata);
	qp->sq_sig_all = init_attr->sq_sig_type == IB_SIGNAL_ALL_WR;
	params.pdn = to_vpd(ibqp->pd)->pdn;
	params.send_cqn = to_vcq(init_attr->send_cq)->cqn;
	params.recv_cqn = to_vcq(init_attr->recv_cq)->cqn;
	params.sq_sig_all = qp->sq_sig_all;
	params.sq_log_wqe = ucmd.sq_log_wqe;
	params.sq_log_stride = ucmd.sq_log_stride;
	params.rq_log_wqe = ucmd.rq_log_wqe;
	params.rq_log_stride = ucmd.rq_log_stride;
	params.max_send_sge = init_attr->cap.max_send_sge;
	params.max_inline_data = init_attr->cap.max_inline_data;
	if (init_attr->srq) {
		/* IB: the SRQ's limits apply, the QP's receive caps are 0 */
		params.use_srq = true;
		params.srqn = to_vsrq(init_attr->srq)->srqn;
		vstellar_pages_of_umem(&params.sq, sq.umem, sq.pgsz);
	} else {
		params.max_recv_sge = init_attr->cap.max_recv_sge;
		/* one page size for both rings: the smaller one fits both */
		pgsz = min(sq.pgsz, rq.pgsz);
		vstellar_pages_of_umem(&params.sq, sq.umem, pgsz);
		vstellar_pages_of_umem(&params.rq, rq.umem, pgsz);
	}
	err = vstellar_cmd_create_qp(dev, qp->ucontext, &params, &res);
	if (err)
		goto err_rq;

	qp->qpn = res.qpn;
	qp->db_slot = res.db_slot;
	qp->sq_umem = sq.umem;
	qp->rq_umem = rq.umem;
	ibqp->qp_num = qp->qpn;
	init_attr->cap.max_send_wr = 1U << ucmd.sq_log_wqe;
	init_attr->cap.max_recv_wr = init_attr->srq ? 0 :
				     1U << ucmd.rq_log_wqe;
	init_attr->cap.max_send_sge = res.max_send_sge;
	init_attr->cap.max_recv_sge = init_attr->srq ? 0 : res.max_recv_sge;
	init_attr->cap.max_inline_data = res.max_inline_data;
	qp->cap = init_attr->cap;

	err = xa_insert_irq(&dev->qps, qp->qpn, qp, GFP_KERNEL);
	if (err) {
		dev_err_ratelimited(&dev->vdev->dev,
				    "CREATE_QP: QPN %u already in use\n", qp->qpn);
		err = -EIO;
		goto err_destroy;
	}
	uresp.qpn = qp->qpn;
	uresp.db_slot = qp->db_slot;
	uresp.max_send_sge = init_attr->cap.max_send_sge;
	uresp.max_recv_sge = init_attr->cap.max_recv_sge;
	uresp.max_inline_data = init_attr->cap.max_inline_data;
	err = ib_copy_to_udata(udata, &uresp, min(sizeof(uresp), udata->outlen));
	if (err)
		goto err_xa;
	return 0;

err_xa:
	xa_erase_irq(&dev->qps, qp->qpn);
err_destroy:
	vstellar_cmd_destroy_qp(dev, qp->ucontext, qp->qpn);
err_rq:
	ib_umem_release(rq.umem);
err_sq:
	ib_umem_release(sq.umem);
	return err;
}

/*
 * F_MCAST, user and kernel UD QPs: the device checks the QP's type and
 * that gid is a RoCEv2 IPv4 group (ib_attach_mcast checks it too, uverbs
 * does not).
 */
int vstellar_attach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);

	if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_MCAST)))
		return -EOPNOTSUPP;
	return vstellar_cmd_mcast(dev, qp->ucontext, true, qp->qpn, gid, lid);
}

int vstellar_detach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);
	int err;

	if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_MCAST)))
		return -EOPNOTSUPP;
	err = vstellar_cmd_mcast(dev, qp->ucontext, false, qp->qpn, gid, lid);
	/* a lost device keeps no groups: leaving always works then */
	return vstellar_com_is_dead_err(err) ? 0 : err;
}

/* User and kernel QPs; a kernel QP's ring indices follow a RESET. */
int vstellar_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
		       int attr_mask, struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);
	int err;

	if (attr_mask & ~VSTELLAR_QP_ATTR_MASK_VALID)
		return -EOPNOTSUPP;
	if (udata && udata->inlen &&
	    !ib_is_udata_cleared(udata, 0, udata->inlen))
		return -EINVAL;
	err = vstellar_cmd_modify_qp(dev, qp->ucontext, qp->qpn, attr,
				     attr_mask);
	if (!err && qp->sq.buf && (attr_mask & IB_QP_STATE) &&
	    attr->qp_state == IB_QPS_RESET)
		vstellar_kqp_reset(qp);
	return err;
}

int vstellar_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
		      int attr_mask, struct ib_qp_init_attr *init_attr)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);
	int err;

	err = vstellar_cmd_query_qp(dev, qp->ucontext, qp->qpn,
				    ibqp->qp_type == IB_QPT_RC ||
				    ibqp->qp_type == IB_QPT_UC, attr);
	if (err)
		return err;
	attr->cap = qp->cap;

	memset(init_attr, 0, sizeof(*init_attr));
	init_attr->qp_type = ibqp->qp_type;
	init_attr->send_cq = ibqp->send_cq;
	init_attr->recv_cq = ibqp->recv_cq;
	init_attr->srq = ibqp->srq;
	init_attr->cap = qp->cap;
	init_attr->sq_sig_type = qp->sq_sig_all ? IB_SIGNAL_ALL_WR :
						  IB_SIGNAL_REQ_WR;
	return 0;
}

/* User and kernel QPs: whichever memory the QP has is freed. */
int vstellar_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibqp->device);
	struct vstellar_qp *qp = to_vqp(ibqp);
	int err;

	err = vstellar_cmd_destroy_qp(dev, qp->ucontext, qp->qpn);
	if (err)
		return err;
	xa_erase_irq(&dev->qps, qp->qpn);
	ib_umem_release(qp->rq_umem);
	ib_umem_release(qp->sq_umem);
	vstellar_kring_free(dev, &qp->rq);
	vstellar_kring_free(dev, &qp->sq);
	return 0;
}

/* ---------------------------------------------------------------- */
/* SRQs                                                              */
/* ---------------------------------------------------------------- */

static int vstellar_check_srq_ucmd(struct vstellar_dev *dev,
				   const struct vstellar_create_srq *u,
				   const struct ib_srq_attr *attr)
{
	u32 max_wr = le32_to_cpu(dev->attr.max_srq_wr);
	u32 max_sge = le32_to_cpu(dev->attr.max_srq_sge);

	if (u->comp_mask || u->reserved[0] || u->reserved[1])
		return -EINVAL;
	if (u->log_wqe > VSTELLAR_MAX_LOG_WQE ||
	    (1U << u->log_wqe) > max_wr || (1U << u->log_wqe) < attr->max_wr ||
	    attr->srq_limit >= (1U << u->log_wqe))
		return -EINVAL;
	/* a WQE with its SGEs must fit one slot */
	if (u->log_stride < VSTELLAR_MIN_RQ_LOG_STRIDE ||
	    u->log_stride > VSTELLAR_MAX_LOG_STRIDE || attr->max_sge > max_sge ||
	    sizeof(struct vstellar_recv_wqe) +
	    sizeof(struct vstellar_sge) * attr->max_sge > (1U << u->log_stride))
		return -EINVAL;
	return 0;
}

int vstellar_create_user_srq(struct ib_srq *ibsrq,
			     struct ib_srq_init_attr *init_attr,
			     struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibsrq->device);
	struct vstellar_srq *srq = to_vsrq(ibsrq);
	struct ib_srq_attr *attr = &init_attr->attr;
	struct vstellar_create_srq_resp uresp = {};
	struct vstellar_create_srq_params params = {};
	struct vstellar_create_srq_result res;
	struct vstellar_create_srq ucmd = {};
	struct vstellar_ring r;
	int err;

	if (udata->inlen < offsetofend(typeof(ucmd), log_stride))
		return -EINVAL;
	if (udata->inlen > sizeof(ucmd) &&
	    !ib_is_udata_cleared(udata, sizeof(ucmd),
				 udata->inlen - sizeof(ucmd)))
		return -EINVAL;
	err = ib_copy_from_udata(&ucmd, udata, min(sizeof(ucmd), udata->inlen));
	if (err)
		return err;
	err = vstellar_check_srq_ucmd(dev, &ucmd, attr);
	if (err)
		return err;
	err = vstellar_ring_get(dev, &r, ucmd.buf_addr,
				(size_t)1 << (ucmd.log_wqe + ucmd.log_stride));
	if (err)
		return err;

	srq->ucontext = vstellar_uctx_handle(udata);
	srq->log_wqe = ucmd.log_wqe;
	srq->log_stride = ucmd.log_stride;
	mutex_init(&srq->resize_mutex);
	params.pdn = to_vpd(ibsrq->pd)->pdn;
	params.log_wqe = srq->log_wqe;
	params.log_stride = srq->log_stride;
	params.max_sge = attr->max_sge;
	params.srq_limit = attr->srq_limit;
	vstellar_pages_of_umem(&params.ring, r.umem, r.pgsz);
	err = vstellar_cmd_create_srq(dev, srq->ucontext, &params, &res);
	if (err)
		goto err_umem;
	srq->srqn = res.srqn;
	srq->db_slot = res.db_slot;
	srq->max_sge = res.max_sge;
	srq->umem = r.umem;
	attr->max_wr = 1U << srq->log_wqe;
	attr->max_sge = srq->max_sge;

	err = xa_insert_irq(&dev->srqs, srq->srqn, srq, GFP_KERNEL);
	if (err) {
		dev_err_ratelimited(&dev->vdev->dev,
				    "CREATE_SRQ: SRQN %u already in use\n",
				    srq->srqn);
		err = -EIO;
		goto err_destroy;
	}
	uresp.srqn = srq->srqn;
	uresp.db_slot = srq->db_slot;
	uresp.max_sge = srq->max_sge;
	err = ib_copy_to_udata(udata, &uresp, min(sizeof(uresp), udata->outlen));
	if (err)
		goto err_xa;
	return 0;

err_xa:
	xa_erase_irq(&dev->srqs, srq->srqn);
err_destroy:
	vstellar_cmd_destroy_srq(dev, srq->ucontext, srq->srqn);
err_umem:
	ib_umem_release(r.umem);
	return err;
}

/* User and kernel SRQs: only the limit changes (no resizing). */
/*
 * IB_SRQ_MAX_WR (F_RESIZE_SRQ, user SRQs): the provider hands a new zeroed
 * ring of the same stride; the device takes what the old ring holds and
 * reads the new one from then on. resize_mutex keeps the ring the device
 * reads the pinned one when a process races two resizes.
 */
static int vstellar_resize_user_srq(struct vstellar_srq *srq,
				    struct ib_srq_attr *attr,
				    struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(srq->ibsrq.device);
	struct vstellar_modify_srq ucmd;
	struct vstellar_pages pages;
	struct vstellar_ring r;
	struct ib_umem *old;
	int err;

	if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_RESIZE_SRQ)) || !srq->umem)
		return -EOPNOTSUPP;
	if (!udata || udata->inlen < offsetofend(typeof(ucmd), log_wqe))
		return -EINVAL;
	err = ib_copy_from_udata(&ucmd, udata, min(sizeof(ucmd), udata->inlen));
	if (err)
		return err;
	if (ucmd.comp_mask || ucmd.reserved[0] || ucmd.reserved[1] ||
	    ucmd.reserved[2] || ucmd.log_wqe > VSTELLAR_MAX_LOG_WQE ||
	    (1U << ucmd.log_wqe) < attr->max_wr ||
	    (1U << ucmd.log_wqe) > le32_to_cpu(dev->attr.max_srq_wr))
		return -EINVAL;
	err = vstellar_ring_get(dev, &r, ucmd.buf_addr,
				(size_t)1 << (ucmd.log_wqe + srq->log_stride));
	if (err)
		return err;
	vstellar_pages_of_umem(&pages, r.umem, r.pgsz);

	mutex_lock(&srq->resize_mutex);
	err = vstellar_cmd_resize_srq(dev, srq->ucontext, srq->srqn,
				      ucmd.log_wqe, &pages);
	if (err) {
		mutex_unlock(&srq->resize_mutex);
		ib_umem_release(r.umem);
		return err == -ENOSPC ? -EINVAL : err;
	}
	old = srq->umem;
	srq->umem = r.umem;
	srq->log_wqe = ucmd.log_wqe;
	mutex_unlock(&srq->resize_mutex);
	ib_umem_release(old);
	return 0;
}

int vstellar_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
			enum ib_srq_attr_mask attr_mask,
			struct ib_udata *udata)
{
	struct vstellar_srq *srq = to_vsrq(ibsrq);
	int err;

	if (attr_mask & ~(IB_SRQ_MAX_WR | IB_SRQ_LIMIT))
		return -EINVAL;
	if (attr_mask & IB_SRQ_MAX_WR) {
		err = vstellar_resize_user_srq(srq, attr, udata);
		if (err)
			return err;
	} else if (udata && udata->inlen &&
		   !ib_is_udata_cleared(udata, 0, udata->inlen)) {
		return -EINVAL;
	}
	if (!(attr_mask & IB_SRQ_LIMIT))
		return 0;
	if (attr->srq_limit >= (1U << srq->log_wqe))
		return -EINVAL;
	return vstellar_cmd_modify_srq(to_vdev(ibsrq->device), srq->ucontext,
				       srq->srqn, attr->srq_limit);
}

int vstellar_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr)
{
	struct vstellar_srq *srq = to_vsrq(ibsrq);

	return vstellar_cmd_query_srq(to_vdev(ibsrq->device), srq->ucontext,
				      srq->srqn, attr);
}

/* User and kernel SRQs: whichever memory the SRQ has is freed. */
int vstellar_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata)
{
	struct vstellar_dev *dev = to_vdev(ibsrq->device);
	struct vstellar_srq *srq = to_vsrq(ibsrq);
	int err;

	err = vstellar_cmd_destroy_srq(dev, srq->ucontext, srq->srqn);
	if (err)
		return err;
	/* after this, no event still queued runs the SRQ's handler */
	xa_erase_irq(&dev->srqs, srq->srqn);
	ib_umem_release(srq->umem);
	vstellar_kring_free(dev, &srq->kring);
	return 0;
}

/* ---------------------------------------------------------------- */
/* MRs                                                               */
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

/* ---------------------------------------------------------------- */
/* AHs (UD)                                                          */
/* ---------------------------------------------------------------- */

int vstellar_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *init_attr,
		       struct ib_udata *udata)
{
	struct rdma_ah_attr *ah_attr = init_attr->ah_attr;

	/*
	 * The device keeps no AHs: UD WQEs carry the address vector, which
	 * the provider builds itself for user AHs. So no command, and kernel
	 * callers in atomic context are served too.
	 */
	if (!(to_vdev(ibah->device)->features & BIT(VIRTIO_VSTELLAR_F_UD)))
		return -EOPNOTSUPP;
	if (!(rdma_ah_get_ah_flags(ah_attr) & IB_AH_GRH))
		return -EINVAL;
	vstellar_av_from_ah_attr(&to_vah(ibah)->av, ah_attr);
	return 0;
}

int vstellar_destroy_ah(struct ib_ah *ibah, u32 flags)
{
	return 0;
}
