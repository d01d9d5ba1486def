// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar device and port: what QUERY_DEVICE answered at probe, in the
 * core's terms, the port's state (QUERY_PORT), and the RoCE v2 GIDs the
 * core's cache fills from the bound net device.
 */
#include <rdma/ib_addr.h>
#include <rdma/ib_mad.h>

#include "vstellar.h"

/*
 * F_ODP: what an on-demand MR serves. The device faults for every access
 * of an RC QP (both ends of SEND, WRITE, READ, atomics with F_ATOMIC, SRQ
 * receives with F_SRQ) and for UD sends; UD receives and UC are not
 * claimed. Implicit MRs too. Their size limit is max_mr_size.
 */
static void vstellar_query_odp(struct vstellar_dev *dev,
			       struct ib_device_attr *props)
{
	struct ib_odp_caps *odp = &props->odp_caps;

	props->kernel_cap_flags |= IBK_ON_DEMAND_PAGING;
	odp->general_caps = IB_ODP_SUPPORT | IB_ODP_SUPPORT_IMPLICIT;
	odp->per_transport_caps.rc_odp_caps = IB_ODP_SUPPORT_SEND |
					      IB_ODP_SUPPORT_RECV |
					      IB_ODP_SUPPORT_WRITE |
					      IB_ODP_SUPPORT_READ;
	if (dev->features & BIT(VIRTIO_VSTELLAR_F_ATOMIC))
		odp->per_transport_caps.rc_odp_caps |= IB_ODP_SUPPORT_ATOMIC;
	if (dev->features & BIT(VIRTIO_VSTELLAR_F_SRQ))
		odp->per_transport_caps.rc_odp_caps |= IB_ODP_SUPPORT_SRQ_RECV;
	if (dev->features & BIT(VIRTIO_VSTELLAR_F_UD))
		odp->per_transport_caps.ud_odp_caps = IB_ODP_SUPPORT_SEND;
}

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
	if (vstellar_odp_on(dev))
		vstellar_query_odp(dev, props);
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
