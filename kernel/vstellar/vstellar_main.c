// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar: virtio probe and remove, the device-to-driver queues (events,
 * CQ notifications), device loss and re-probing, the net device whose
 * addresses become the GIDs, and the ib_device with its ops table. The
 * verbs themselves are in one file per object (see vstellar.h).
 */
#include <linux/delay.h>
#include <linux/if_arp.h>
#include <linux/module.h>
#include <linux/rtnetlink.h>
#include <linux/virtio_config.h>
#include <rdma/ib_cache.h>

#include "vstellar.h"

MODULE_AUTHOR("vStellar project");
MODULE_DESCRIPTION("vStellar virtio RDMA device driver");
MODULE_LICENSE("Dual BSD/GPL");

static unsigned int cmd_timeout_ms = 5000;
module_param(cmd_timeout_ms, uint, 0444);
MODULE_PARM_DESC(cmd_timeout_ms,
		 "Time the device has to answer a command, in ms (default 5000)");

static char *netdev;
module_param(netdev, charp, 0444);
MODULE_PARM_DESC(netdev,
		 "Net device whose addresses become the GIDs (default: the first virtio-net device)");

static unsigned int recover_delay_ms = 2000;
module_param(recover_delay_ms, uint, 0644);
MODULE_PARM_DESC(recover_delay_ms,
		 "After a device loss, re-probe the device after this many ms (0: never; default 2000)");

#define VSTELLAR_EVENTQ_BUFS	64
#define VSTELLAR_REPROBE_TRIES	5

/* Re-probes run here; module exit drains it before the driver goes. */
static struct workqueue_struct *vstellar_wq;
static bool vstellar_exiting;

struct vstellar_reprobe {
	struct work_struct work;
	struct virtio_device *vdev;
	unsigned int delay_ms;
};

static const struct virtio_device_id vstellar_id_table[] = {
	{ VIRTIO_ID_VSTELLAR, VIRTIO_DEV_ANY_ID },
	{ 0 },
};
MODULE_DEVICE_TABLE(virtio, vstellar_id_table);

static unsigned int vstellar_features[] = {
	VIRTIO_VSTELLAR_F_RC,
	VIRTIO_VSTELLAR_F_UD,
	VIRTIO_VSTELLAR_F_DB_SUPPRESS,
	VIRTIO_VSTELLAR_F_MULTI_CQNQ,
	VIRTIO_VSTELLAR_F_ATOMIC,
	VIRTIO_VSTELLAR_F_INLINE,
	VIRTIO_VSTELLAR_F_SRQ,
	VIRTIO_VSTELLAR_F_MW,
	VIRTIO_VSTELLAR_F_MEM_MGT,
	VIRTIO_VSTELLAR_F_UC,
	VIRTIO_VSTELLAR_F_RESIZE_CQ,
	VIRTIO_VSTELLAR_F_MCAST,
	VIRTIO_VSTELLAR_F_RESIZE_SRQ,
	VIRTIO_VSTELLAR_F_DMABUF,
#if IS_ENABLED(CONFIG_INFINIBAND_ON_DEMAND_PAGING) && PAGE_SHIFT == 12
	/* the device's ODP pages are of 4 KiB, and so must the umem's be */
	VIRTIO_VSTELLAR_F_ODP,
#endif
};

/* ---------------------------------------------------------------- */
/* Device-to-driver queues: event queue and CQ notification queues   */
/* ---------------------------------------------------------------- */

static int vstellar_rxq_post(struct vstellar_rxq *q, void *buf, gfp_t gfp)
{
	struct scatterlist sg;

	sg_init_one(&sg, buf, q->buf_size);
	return virtqueue_add_inbuf(q->vq, &sg, 1, buf, gfp);
}

static int vstellar_rxq_init(struct vstellar_rxq *q, struct virtqueue *vq,
			     unsigned int max_bufs, unsigned int buf_size)
{
	unsigned int i;
	int err;

	q->vq = vq;
	q->buf_size = buf_size;
	q->nbufs = min(virtqueue_get_vring_size(vq), max_bufs);
	q->bufs = kcalloc(q->nbufs, buf_size, GFP_KERNEL);
	if (!q->bufs)
		return -ENOMEM;
	for (i = 0; i < q->nbufs; i++) {
		err = vstellar_rxq_post(q, q->bufs + i * buf_size, GFP_KERNEL);
		if (err)
			return err;
	}
	virtqueue_kick(vq);
	return 0;
}

static void vstellar_rxq_free(struct vstellar_rxq *q)
{
	if (q->vq)
		while (virtqueue_detach_unused_buf(q->vq))
			;
	kfree(q->bufs);
	q->bufs = NULL;
}

static void vstellar_dispatch_port_event(struct vstellar_dev *dev,
					 enum ib_event_type type)
{
	struct ib_event ev = {
		.device = &dev->ibdev,
		.event = type,
		.element.port_num = VSTELLAR_PORT,
	};

	if (dev->registered)
		ib_dispatch_event(&ev);
}

static void vstellar_reprobe_work(struct work_struct *work)
{
	struct vstellar_reprobe *r =
		container_of(work, struct vstellar_reprobe, work);
	unsigned int i;
	int err;

	/* the backend may take a while to come back: try a few times */
	for (i = 0; i < VSTELLAR_REPROBE_TRIES; i++) {
		msleep(r->delay_ms);
		if (READ_ONCE(vstellar_exiting))
			break;
		/* remove (ib_device gone, device reset), then probe anew */
		err = device_reprobe(&r->vdev->dev);
		if (!err && READ_ONCE(r->vdev->dev.driver))
			break;
		dev_warn(&r->vdev->dev, "re-probe %u of %u failed\n", i + 1,
			 VSTELLAR_REPROBE_TRIES);
	}
	put_device(&r->vdev->dev);
	kfree(r);
}

/*
 * After a loss the device must be reset and initialised again, and the
 * ib_device with it (its users saw DEVICE_FATAL): unbind and bind the
 * driver, from a work item of our own since remove waits for ours.
 */
static void vstellar_schedule_reprobe(struct vstellar_dev *dev)
{
	unsigned int delay = READ_ONCE(recover_delay_ms);
	struct vstellar_reprobe *r;

	if (!delay)
		return;
	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return;
	INIT_WORK(&r->work, vstellar_reprobe_work);
	r->vdev = dev->vdev;
	r->delay_ms = delay;
	get_device(&r->vdev->dev);
	queue_work(vstellar_wq, &r->work);
}

/*
 * The device lost its state (backend gone, or it said so): fail every
 * pending and later command, tell the users, and re-probe. Once.
 */
static void vstellar_device_lost(struct vstellar_dev *dev)
{
	struct virtio_device *vdev = dev->vdev;
	u32 status;
	u8 vstatus;

	vstellar_com_abort(&dev->com, -ENODEV);
	if (test_and_set_bit(0, &dev->lost))
		return;
	status = virtio_cread32(vdev, offsetof(struct virtio_vstellar_config,
					       device_status));
	vstatus = vdev->config->get_status(vdev);
	dev_err(&vdev->dev, "device lost (device_status %#x%s%s); verbs fail from now on, re-probe in %u ms\n",
		status, status & VSTELLAR_DEV_S_BACKEND_LOST ? ", backend gone" : "",
		vstatus & VIRTIO_CONFIG_S_NEEDS_RESET ? ", needs reset" : "",
		READ_ONCE(recover_delay_ms));
	vstellar_dispatch_port_event(dev, IB_EVENT_DEVICE_FATAL);
	vstellar_schedule_reprobe(dev);
}

/* The device numbers its events as IB does: ev.event is the type. */
static_assert((int)VSTELLAR_EV_SRQ_ERR == (int)IB_EVENT_SRQ_ERR);
static_assert((int)VSTELLAR_EV_SRQ_LIMIT_REACHED ==
	      (int)IB_EVENT_SRQ_LIMIT_REACHED);
static_assert((int)VSTELLAR_EV_QP_LAST_WQE_REACHED ==
	      (int)IB_EVENT_QP_LAST_WQE_REACHED);

/*
 * An event buffer: with F_ODP, the device writes 32-byte page faults and
 * 16-byte other events into buffers of 32 bytes.
 */
union vstellar_event_buf {
	struct vstellar_event ev;
	struct vstellar_event_page_fault pf;
};

static unsigned int vstellar_event_buf_size(struct vstellar_dev *dev)
{
	return vstellar_odp_on(dev) ? sizeof(struct vstellar_event_page_fault) :
				      sizeof(struct vstellar_event);
}

/* The bytes the device must have written for an event of @type. */
static unsigned int vstellar_event_len(u16 type)
{
	return type == VSTELLAR_EV_PAGE_FAULT ?
	       sizeof(struct vstellar_event_page_fault) :
	       sizeof(struct vstellar_event);
}

static void vstellar_handle_event(struct vstellar_dev *dev,
				  const union vstellar_event_buf *buf)
{
	const struct vstellar_event *e = &buf->ev;
	u16 type = le16_to_cpu(e->type);
	u32 obj = le32_to_cpu(e->object);
	u32 uctx = le32_to_cpu(e->ucontext);
	struct ib_event ev = { .device = &dev->ibdev, .event = type };
	struct vstellar_srq *srq;
	struct vstellar_qp *qp;
	struct vstellar_cq *cq;

	switch (type) {
	case VSTELLAR_EV_CQ_ERR:
		xa_lock_irq(&dev->cqs);
		cq = xa_load(&dev->cqs, obj);
		if (cq && cq->ucontext == uctx && cq->ibcq.event_handler) {
			ev.element.cq = &cq->ibcq;
			cq->ibcq.event_handler(&ev, cq->ibcq.cq_context);
		}
		xa_unlock_irq(&dev->cqs);
		break;
	case VSTELLAR_EV_QP_FATAL:
	case VSTELLAR_EV_QP_REQ_ERR:
	case VSTELLAR_EV_QP_ACCESS_ERR:
	case VSTELLAR_EV_COMM_EST:
	case VSTELLAR_EV_SQ_DRAINED:
	case VSTELLAR_EV_QP_LAST_WQE_REACHED:
		xa_lock_irq(&dev->qps);
		qp = xa_load(&dev->qps, obj);
		if (qp && qp->ucontext == uctx && qp->ibqp.event_handler) {
			ev.element.qp = &qp->ibqp;
			qp->ibqp.event_handler(&ev, qp->ibqp.qp_context);
		}
		xa_unlock_irq(&dev->qps);
		break;
	case VSTELLAR_EV_SRQ_ERR:
	case VSTELLAR_EV_SRQ_LIMIT_REACHED:
		xa_lock_irq(&dev->srqs);
		srq = xa_load(&dev->srqs, obj);
		if (srq && srq->ucontext == uctx && srq->ibsrq.event_handler) {
			ev.element.srq = &srq->ibsrq;
			srq->ibsrq.event_handler(&ev, srq->ibsrq.srq_context);
		}
		xa_unlock_irq(&dev->srqs);
		break;
	case VSTELLAR_EV_DEVICE_FATAL:
		dev_err(&dev->vdev->dev, "device reported a fatal error (info %u)\n",
			le32_to_cpu(e->info));
		vstellar_device_lost(dev);
		break;
	case VSTELLAR_EV_PORT_ACTIVE:
	case VSTELLAR_EV_PORT_ERR:
	case VSTELLAR_EV_GID_CHANGE:
		vstellar_dispatch_port_event(dev, type);
		break;
	case VSTELLAR_EV_PAGE_FAULT:
		/* queued to the ODP work queue: faulting in may take long */
		vstellar_odp_page_fault(dev, &buf->pf);
		break;
	default:
		dev_warn_ratelimited(&dev->vdev->dev, "unknown event type %u\n",
				     type);
	}
}

static void vstellar_event_work(struct work_struct *work)
{
	struct vstellar_dev *dev =
		container_of(work, struct vstellar_dev, event_work);
	union vstellar_event_buf e;
	unsigned int len;
	void *buf;

	for (;;) {
		spin_lock_irq(&dev->eventq_lock);
		buf = virtqueue_get_buf(dev->eventq.vq, &len);
		if (buf) {
			/* the length the device wrote, within the buffer */
			len = min(len, dev->eventq.buf_size);
			memset(&e, 0, sizeof(e));
			memcpy(&e, buf, len);
			vstellar_rxq_post(&dev->eventq, buf, GFP_ATOMIC);
			virtqueue_kick(dev->eventq.vq);
		}
		spin_unlock_irq(&dev->eventq_lock);
		if (!buf)
			break;
		if (len < sizeof(e.ev) ||
		    len < vstellar_event_len(le16_to_cpu(e.ev.type))) {
			dev_warn_ratelimited(&dev->vdev->dev,
					     "short event (%u bytes)\n", len);
			continue;
		}
		vstellar_handle_event(dev, &e);
	}
}

static void vstellar_eventq_done(struct virtqueue *vq)
{
	struct vstellar_dev *dev = vq->vdev->priv;

	schedule_work(&dev->event_work);
}

static void vstellar_ctrlq_done(struct virtqueue *vq)
{
	struct vstellar_dev *dev = vq->vdev->priv;

	vstellar_com_complete(&dev->com);
}

/* CQ notification queue interrupt: run the CQs' completion handlers. */
static void vstellar_cqnq_done(struct virtqueue *vq)
{
	struct vstellar_dev *dev = vq->vdev->priv;
	unsigned int i = vq->index - VSTELLAR_VQ_CQN0;
	struct vstellar_rxq *q = &dev->cqnq[i];
	struct vstellar_cq_notify n;
	struct vstellar_cq *cq;
	unsigned long flags;
	unsigned int len;
	void *buf;

	spin_lock_irqsave(&dev->cqnq_lock[i], flags);
	do {
		virtqueue_disable_cb(vq);
		while ((buf = virtqueue_get_buf(vq, &len))) {
			memcpy(&n, buf, sizeof(n));
			vstellar_rxq_post(q, buf, GFP_ATOMIC);
			if (len < sizeof(n))
				continue;
			xa_lock(&dev->cqs);
			cq = xa_load(&dev->cqs, le32_to_cpu(n.cqn));
			if (cq && cq->ucontext == le32_to_cpu(n.ucontext) &&
			    cq->ibcq.comp_handler)
				cq->ibcq.comp_handler(&cq->ibcq,
						      cq->ibcq.cq_context);
			xa_unlock(&dev->cqs);
		}
		virtqueue_kick(vq);
	} while (!virtqueue_enable_cb(vq));
	spin_unlock_irqrestore(&dev->cqnq_lock[i], flags);
}

/* ---------------------------------------------------------------- */
/* Device loss                                                       */
/* ---------------------------------------------------------------- */

static void vstellar_config_work(struct work_struct *work)
{
	struct vstellar_dev *dev =
		container_of(work, struct vstellar_dev, config_work);

	if (vstellar_com_device_lost(&dev->com))
		vstellar_device_lost(dev);
}

static void vstellar_config_changed(struct virtio_device *vdev)
{
	struct vstellar_dev *dev = vdev->priv;

	schedule_work(&dev->config_work);
}

/* ---------------------------------------------------------------- */
/* Net device association (GIDs come from its addresses)             */
/* ---------------------------------------------------------------- */

/*
 * The net device is ours by what it is (the guest's virtio-net, or the one
 * named by the netdev parameter), not by where it is: a container may take
 * it into its own network namespace, and with RDMA's exclusive netns mode
 * the ib_device follows it there (`rdma dev set vstellar0 netns NAME`).
 * So every namespace is looked at. Moving a net device between namespaces
 * unregisters it in the old one and registers it in the new one; the
 * binding follows, and the core rebuilds the GIDs from the addresses the
 * device gets there. With the netdev parameter, the first device of that
 * name in any namespace is taken while we hold none.
 */
static bool vstellar_netdev_fits(struct net_device *ndev)
{
	struct device *parent = ndev->dev.parent;

	if (netdev)
		return !strcmp(ndev->name, netdev);
	if (ndev->type != ARPHRD_ETHER || (ndev->flags & IFF_LOOPBACK))
		return false;
	return parent && parent->driver &&
	       !strcmp(parent->driver->name, "virtio_net");
}

static void vstellar_bind_netdev(struct vstellar_dev *dev,
				 struct net_device *ndev)
{
	int err;

	mutex_lock(&dev->netdev_lock);
	if (dev->netdev == ndev)
		goto out;
	err = ib_device_set_netdev(&dev->ibdev, ndev, VSTELLAR_PORT);
	if (err) {
		dev_warn(&dev->vdev->dev, "cannot bind net device: %d\n", err);
		goto out;
	}
	dev->netdev = ndev;
	if (ndev)
		dev_info(&dev->vdev->dev, "GIDs from net device %s (netns %u)\n",
			 ndev->name, dev_net(ndev)->ns.inum);
	/* the rescan takes RTNL, which a netdev notifier holds */
	if (dev->registered && ndev)
		schedule_work(&dev->rescan_work);
out:
	mutex_unlock(&dev->netdev_lock);
}

static void vstellar_rescan_work(struct work_struct *work)
{
	struct vstellar_dev *dev =
		container_of(work, struct vstellar_dev, rescan_work);

	rdma_roce_rescan_device(&dev->ibdev);
}

static int vstellar_netdev_event(struct notifier_block *nb,
				 unsigned long event, void *ptr)
{
	struct net_device *ndev = netdev_notifier_info_to_dev(ptr);
	struct vstellar_dev *dev = container_of(nb, struct vstellar_dev, nb);

	/* unregistering the notifier replays NETDEV_UNREGISTER: ignore it */
	if (READ_ONCE(dev->removing))
		return NOTIFY_DONE;
	switch (event) {
	case NETDEV_REGISTER:
		/* a new device, or ours arriving in another namespace */
		if (!READ_ONCE(dev->netdev) && vstellar_netdev_fits(ndev))
			vstellar_bind_netdev(dev, ndev);
		break;
	case NETDEV_UNREGISTER:
		/* going away, or leaving its namespace: let go of it either way */
		if (READ_ONCE(dev->netdev) == ndev)
			vstellar_bind_netdev(dev, NULL);
		break;
	}
	return NOTIFY_DONE;
}

/*
 * The first fitting net device in any namespace; the caller holds RTNL,
 * which keeps it registered (and in its namespace) until released.
 */
static struct net_device *vstellar_find_netdev(void)
{
	struct net_device *ndev;
	struct net *net;

	ASSERT_RTNL();
	rcu_read_lock();
	for_each_net_rcu(net)
		for_each_netdev_rcu(net, ndev)
			if (vstellar_netdev_fits(ndev))
				goto out;
	ndev = NULL;
out:
	rcu_read_unlock();
	return ndev;
}

/* ---------------------------------------------------------------- */
/* ib_device                                                         */
/* ---------------------------------------------------------------- */

static const struct ib_device_ops vstellar_dev_ops = {
	.owner = THIS_MODULE,
	.driver_id = RDMA_DRIVER_UNKNOWN,
	.uverbs_abi_ver = VSTELLAR_UVERBS_ABI_VERSION,

	.add_gid = vstellar_add_gid,
	.alloc_mr = vstellar_alloc_mr,
	.alloc_mw = vstellar_alloc_mw,
	.attach_mcast = vstellar_attach_mcast,
	.alloc_pd = vstellar_alloc_pd,
	.alloc_ucontext = vstellar_alloc_ucontext,
	.create_ah = vstellar_create_ah,
	.create_cq = vstellar_create_cq,
	.create_qp = vstellar_create_qp,
	.create_srq = vstellar_create_srq,
	.create_user_ah = vstellar_create_ah,
	.dealloc_mw = vstellar_dealloc_mw,
	.dealloc_pd = vstellar_dealloc_pd,
	.dealloc_ucontext = vstellar_dealloc_ucontext,
	.del_gid = vstellar_del_gid,
	.dereg_mr = vstellar_dereg_mr,
	.destroy_ah = vstellar_destroy_ah,
	.destroy_cq = vstellar_destroy_cq,
	.destroy_qp = vstellar_destroy_qp,
	.destroy_srq = vstellar_destroy_srq,
	.detach_mcast = vstellar_detach_mcast,
	.disassociate_ucontext = vstellar_disassociate_ucontext,
	.get_dev_fw_str = vstellar_get_dev_fw_str,
	.get_dma_mr = vstellar_get_dma_mr,
	.get_link_layer = vstellar_get_link_layer,
	.get_port_immutable = vstellar_get_port_immutable,
	.map_mr_sg = vstellar_map_mr_sg,
	.mmap = vstellar_mmap,
	.mmap_free = vstellar_mmap_free,
	.modify_qp = vstellar_modify_qp,
	.modify_srq = vstellar_modify_srq,
	.poll_cq = vstellar_poll_cq,
	.post_recv = vstellar_post_recv,
	.post_send = vstellar_post_send,
	.post_srq_recv = vstellar_post_srq_recv,
	.query_device = vstellar_query_device,
	.query_pkey = vstellar_query_pkey,
	.query_port = vstellar_query_port,
	.query_qp = vstellar_query_qp,
	.query_srq = vstellar_query_srq,
	.reg_user_mr = vstellar_reg_user_mr,
	.reg_user_mr_dmabuf = vstellar_reg_user_mr_dmabuf,
	.req_notify_cq = vstellar_req_notify_cq,
	.resize_cq = vstellar_resize_cq,

	INIT_RDMA_OBJ_SIZE(ib_ah, vstellar_ah, ibah),
	INIT_RDMA_OBJ_SIZE(ib_cq, vstellar_cq, ibcq),
	INIT_RDMA_OBJ_SIZE(ib_mw, vstellar_mw, ibmw),
	INIT_RDMA_OBJ_SIZE(ib_pd, vstellar_pd, ibpd),
	INIT_RDMA_OBJ_SIZE(ib_qp, vstellar_qp, ibqp),
	INIT_RDMA_OBJ_SIZE(ib_srq, vstellar_srq, ibsrq),
	INIT_RDMA_OBJ_SIZE(ib_ucontext, vstellar_ucontext, ibucontext),
};

#if IS_ENABLED(CONFIG_INFINIBAND_ON_DEMAND_PAGING)
/* With F_ODP: the core offers ibv_advise_mr only to a device with it. */
static const struct ib_device_ops vstellar_odp_ops = {
	.advise_mr = vstellar_advise_mr,
};
#endif

static int vstellar_find_vqs(struct vstellar_dev *dev)
{
	unsigned int nvqs = VSTELLAR_VQ_CQN0 + dev->num_cqnq, i;
	vq_callback_t **callbacks;
	struct virtqueue **vqs;
	const char **names;
	char (*cqn_names)[16];
	int err = -ENOMEM;

	vqs = kcalloc(nvqs, sizeof(*vqs), GFP_KERNEL);
	callbacks = kcalloc(nvqs, sizeof(*callbacks), GFP_KERNEL);
	names = kcalloc(nvqs, sizeof(*names), GFP_KERNEL);
	cqn_names = kcalloc(dev->num_cqnq, sizeof(*cqn_names), GFP_KERNEL);
	if (!vqs || !callbacks || !names || !cqn_names)
		goto out;

	callbacks[VSTELLAR_VQ_CONTROL] = vstellar_ctrlq_done;
	names[VSTELLAR_VQ_CONTROL] = "control";
	callbacks[VSTELLAR_VQ_EVENT] = vstellar_eventq_done;
	names[VSTELLAR_VQ_EVENT] = "event";
	callbacks[VSTELLAR_VQ_KICK] = NULL;
	names[VSTELLAR_VQ_KICK] = "kick";
	for (i = 0; i < dev->num_cqnq; i++) {
		snprintf(cqn_names[i], sizeof(cqn_names[i]), "cqn%u", i);
		callbacks[VSTELLAR_VQ_CQN0 + i] = vstellar_cqnq_done;
		names[VSTELLAR_VQ_CQN0 + i] = cqn_names[i];
	}
	/* the names are copied into the interrupt names by the transport */
	err = vstellar_compat_find_vqs(dev->vdev, nvqs, vqs, callbacks, names);
	if (err)
		goto out;

	err = vstellar_com_init(&dev->com, dev->vdev, vqs[VSTELLAR_VQ_CONTROL],
				cmd_timeout_ms);
	if (err)
		goto out;
	dev->eventq.vq = vqs[VSTELLAR_VQ_EVENT];
	for (i = 0; i < dev->num_cqnq; i++)
		dev->cqnq[i].vq = vqs[VSTELLAR_VQ_CQN0 + i];
out:
	kfree(cqn_names);
	kfree(names);
	kfree(callbacks);
	kfree(vqs);
	return err;
}

static void vstellar_free_queues(struct vstellar_dev *dev)
{
	unsigned int i;

	vstellar_rxq_free(&dev->eventq);
	for (i = 0; dev->cqnq && i < dev->num_cqnq; i++)
		vstellar_rxq_free(&dev->cqnq[i]);
	if (dev->com.vq)
		vstellar_com_release(&dev->com);
	dev->vdev->config->del_vqs(dev->vdev);
}

static int vstellar_start_queues(struct vstellar_dev *dev)
{
	unsigned int i;
	int err;

	err = vstellar_rxq_init(&dev->eventq, dev->eventq.vq,
				VSTELLAR_EVENTQ_BUFS,
				vstellar_event_buf_size(dev));
	if (err)
		return err;
	for (i = 0; i < dev->num_cqnq; i++) {
		spin_lock_init(&dev->cqnq_lock[i]);
		err = vstellar_rxq_init(&dev->cqnq[i], dev->cqnq[i].vq, UINT_MAX,
					sizeof(struct vstellar_cq_notify));
		if (err)
			return err;
	}
	return 0;
}

static void vstellar_setup_ibdev(struct vstellar_dev *dev)
{
	struct ib_device *ibdev = &dev->ibdev;

	ibdev->node_type = RDMA_NODE_IB_CA;
	ibdev->phys_port_cnt = 1;
	ibdev->num_comp_vectors = dev->num_cqnq;
	ibdev->dev.parent = &dev->vdev->dev;
	ibdev->local_dma_lkey = VSTELLAR_LOCAL_DMA_LKEY;
	memcpy(&ibdev->node_guid, dev->cfg.node_guid, sizeof(ibdev->node_guid));
	strscpy(ibdev->node_desc, "vStellar virtio RDMA device",
		sizeof(ibdev->node_desc));
	ib_set_device_ops(ibdev, &vstellar_dev_ops);
#if IS_ENABLED(CONFIG_INFINIBAND_ON_DEMAND_PAGING)
	if (vstellar_odp_on(dev))
		ib_set_device_ops(ibdev, &vstellar_odp_ops);
#endif
}

/* The driver's state, before the device is touched. */
static struct vstellar_dev *vstellar_alloc_dev(struct virtio_device *vdev)
{
	struct vstellar_dev *dev;

	dev = ib_alloc_device(vstellar_dev, ibdev);
	if (!dev)
		return NULL;
	dev->vdev = vdev;
	vdev->priv = dev;
	xa_init_flags(&dev->cqs, XA_FLAGS_LOCK_IRQ);
	xa_init_flags(&dev->qps, XA_FLAGS_LOCK_IRQ);
	xa_init_flags(&dev->srqs, XA_FLAGS_LOCK_IRQ);
	xa_init(&dev->odp_mrs);
	xa_init(&dev->odp_lkeys);
	spin_lock_init(&dev->eventq_lock);
	mutex_init(&dev->netdev_lock);
	INIT_WORK(&dev->event_work, vstellar_event_work);
	INIT_WORK(&dev->config_work, vstellar_config_work);
	INIT_WORK(&dev->rescan_work, vstellar_rescan_work);
	return dev;
}

static void vstellar_free_dev(struct vstellar_dev *dev)
{
	vstellar_odp_fini(dev);
	kfree(dev->cqnq_lock);
	kfree(dev->cqnq);
	dev->vdev->priv = NULL;
	ib_dealloc_device(&dev->ibdev);
}

/*
 * The config space: the interface version must be ours; the negotiated
 * features and the number of CQ notification queues follow from it.
 */
static int vstellar_read_config(struct vstellar_dev *dev)
{
	struct virtio_device *vdev = dev->vdev;
	unsigned int i;
	u32 abi;

	virtio_cread_bytes(vdev, 0, &dev->cfg, sizeof(dev->cfg));
	abi = le32_to_cpu(dev->cfg.abi_version);
	if (VSTELLAR_ABI_VERSION_MAJOR(abi) != VSTELLAR_ABI_MAJOR) {
		dev_err(&vdev->dev, "device interface %u.%u, driver speaks %u.x\n",
			abi >> 16, abi & 0xffff, VSTELLAR_ABI_MAJOR);
		return -ENODEV;
	}
	for (i = 0; i < ARRAY_SIZE(vstellar_features); i++)
		if (virtio_has_feature(vdev, vstellar_features[i]))
			dev->features |= BIT(vstellar_features[i]);
	dev->num_cqnq = clamp_t(u32, le32_to_cpu(dev->cfg.num_cq_queues), 1,
				VSTELLAR_MAX_CQ_QUEUES);
	if (!(dev->features & BIT(VIRTIO_VSTELLAR_F_MULTI_CQNQ)))
		dev->num_cqnq = 1;
	dev->cqnq = kcalloc(dev->num_cqnq, sizeof(*dev->cqnq), GFP_KERNEL);
	dev->cqnq_lock = kcalloc(dev->num_cqnq, sizeof(*dev->cqnq_lock),
				 GFP_KERNEL);
	if (!dev->cqnq || !dev->cqnq_lock)
		return -ENOMEM;
	return 0;
}

/*
 * Quiesces the device and undoes vstellar_start_device: commands fail,
 * the device forgets everything, no work item of ours runs any more.
 */
static void vstellar_stop_device(struct vstellar_dev *dev)
{
	vstellar_com_abort(&dev->com, -ENODEV);
	virtio_reset_device(dev->vdev);
	vstellar_kernel_db_fini(dev);
	cancel_work_sync(&dev->event_work);
	cancel_work_sync(&dev->config_work);
	vstellar_free_queues(dev);
}

/*
 * The virtqueues, DRIVER_OK, and the first command (QUERY_DEVICE), which
 * also tells whether anybody serves the device. Undoes itself on failure.
 */
static int vstellar_start_device(struct vstellar_dev *dev)
{
	struct virtio_device *vdev = dev->vdev;
	int err;

	err = vstellar_find_vqs(dev);
	if (err) {
		dev_err(&vdev->dev, "cannot set up %u virtqueues: %d\n",
			VSTELLAR_VQ_CQN0 + dev->num_cqnq, err);
		return err;
	}
	err = vstellar_start_queues(dev);
	if (err) {
		vstellar_free_queues(dev);
		return err;
	}
	virtio_device_ready(vdev);

	err = vstellar_cmd_query_device(dev, &dev->attr);
	if (err) {
		dev_err(&vdev->dev, "QUERY_DEVICE failed: %d%s\n", err,
			err == -ETIMEDOUT ?
			" (no answer on the control queue: is vstellard serving it?)" : "");
		vstellar_stop_device(dev);
		return err;
	}
	return 0;
}

/*
 * The doorbell region (user contexts), the kick page and the kernel's
 * doorbell page (kernel verbs). Each is optional: without it the device
 * serves less, so probing goes on.
 */
static void vstellar_map_doorbells(struct vstellar_dev *dev)
{
	struct virtio_device *vdev = dev->vdev;
	struct virtio_shm_region shm;
	int err;

	if (virtio_get_shm_region(vdev, &shm, VSTELLAR_SHM_DOORBELL)) {
		dev->db_base = shm.addr;
		dev->db_len = shm.len;
	} else {
		dev_warn(&vdev->dev, "no doorbell region: user contexts unavailable\n");
	}
	dev->kick_addr = vstellar_find_kick_page(vdev);
	/* kernel verbs: the MAD layer's QP1, and so the CM and rdma_cm */
	err = vstellar_kernel_db_init(dev);
	if (err)
		dev_warn(&vdev->dev, "no kernel verbs (%d): rdma_cm will not work\n",
			 err);
}

/*
 * The ib_device, bound to its net device, registered, and following net
 * devices from then on. Undoes itself on failure.
 */
static int vstellar_register(struct vstellar_dev *dev)
{
	int err;

	vstellar_setup_ibdev(dev);
	rtnl_lock();
	vstellar_bind_netdev(dev, vstellar_find_netdev());
	rtnl_unlock();

	err = ib_register_device(&dev->ibdev, "vstellar%d",
				 vstellar_dma_device(dev->vdev));
	if (err) {
		dev_err(&dev->vdev->dev, "ib_register_device failed: %d\n", err);
		goto err_netdev;
	}
	dev->registered = true;

	dev->nb.notifier_call = vstellar_netdev_event;
	err = register_netdevice_notifier(&dev->nb);
	if (err)
		goto err_unregister;
	return 0;

err_unregister:
	dev->registered = false;
	cancel_work_sync(&dev->rescan_work);
	ib_unregister_device(&dev->ibdev);
err_netdev:
	vstellar_bind_netdev(dev, NULL);
	return err;
}

static int vstellar_probe(struct virtio_device *vdev)
{
	struct vstellar_dev *dev;
	u32 abi;
	int err;

	if (!virtio_has_feature(vdev, VIRTIO_F_VERSION_1)) {
		dev_err(&vdev->dev, "the device lacks VIRTIO_F_VERSION_1\n");
		return -ENODEV;
	}
	dev = vstellar_alloc_dev(vdev);
	if (!dev)
		return -ENOMEM;
	err = vstellar_read_config(dev);
	if (err)
		goto err_free;
	err = vstellar_odp_init(dev);
	if (err)
		goto err_free;
	err = vstellar_start_device(dev);
	if (err)
		goto err_free;
	vstellar_map_doorbells(dev);
	err = vstellar_register(dev);
	if (err)
		goto err_stop;

	abi = le32_to_cpu(dev->cfg.abi_version);
	dev_info(&vdev->dev, "%s: interface %u.%u, %u CQ queue(s), %llu doorbell pages, features %#x, kernel verbs %s\n",
		 dev_name(&dev->ibdev.dev), abi >> 16, abi & 0xffff,
		 dev->num_cqnq, dev->db_len / VSTELLAR_DB_PAGE_SIZE,
		 dev->features, dev->kdb ? "on" : "off");
	return 0;

err_stop:
	vstellar_stop_device(dev);
err_free:
	vstellar_free_dev(dev);
	return err;
}

static void vstellar_remove(struct virtio_device *vdev)
{
	struct vstellar_dev *dev = vdev->priv;

	WRITE_ONCE(dev->removing, true);
	unregister_netdevice_notifier(&dev->nb);
	cancel_work_sync(&dev->rescan_work);
	/* destroys what users still hold, through the device if it lives */
	ib_unregister_device(&dev->ibdev);
	dev->registered = false;
	dev->netdev = NULL;	/* released by the unregistration */

	vstellar_stop_device(dev);
	WARN_ON(!xa_empty(&dev->cqs) || !xa_empty(&dev->qps) ||
		!xa_empty(&dev->srqs));
	vstellar_free_dev(dev);
}

static struct virtio_driver vstellar_driver = {
	.driver.name = KBUILD_MODNAME,
	.driver.owner = THIS_MODULE,
	.id_table = vstellar_id_table,
	.feature_table = vstellar_features,
	.feature_table_size = ARRAY_SIZE(vstellar_features),
	.probe = vstellar_probe,
	.remove = vstellar_remove,
	.config_changed = vstellar_config_changed,
};

static int __init vstellar_init(void)
{
	int err;

	vstellar_wq = alloc_workqueue("vstellar", WQ_UNBOUND, 0);
	if (!vstellar_wq)
		return -ENOMEM;
	err = register_virtio_driver(&vstellar_driver);
	if (err)
		destroy_workqueue(vstellar_wq);
	return err;
}

static void __exit vstellar_exit(void)
{
	WRITE_ONCE(vstellar_exiting, true);
	destroy_workqueue(vstellar_wq);	/* waits for pending re-probes */
	unregister_virtio_driver(&vstellar_driver);
}

module_init(vstellar_init);
module_exit(vstellar_exit);
