/* SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause */
/*
 * vStellar: driver for the virtio RDMA device (virtio ID 42).
 */
#ifndef _VSTELLAR_H_
#define _VSTELLAR_H_

#include <linux/completion.h>
#include <linux/mutex.h>
#include <linux/netdevice.h>
#include <linux/refcount.h>
#include <linux/virtio.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include <vstellar/virtio_vstellar.h>
#include <vstellar/vstellar-abi.h>

#include "vstellar_cmd.h"
#include "vstellar_compat.h"
#include "vstellar_com.h"

#define DRV_MODULE_NAME		"vstellar"
#define VSTELLAR_PORT		1

/* A device-to-driver queue whose buffers the driver keeps posted. */
struct vstellar_rxq {
	struct virtqueue *vq;
	void *bufs;
	unsigned int nbufs;
	unsigned int buf_size;
};

/* A ring of a kernel CQ or QP: one DMA-coherent buffer. */
struct vstellar_kring {
	void *buf;
	dma_addr_t dma;
	size_t size;
};

struct vstellar_dev {
	struct ib_device ibdev;
	struct virtio_device *vdev;
	struct vstellar_com com;

	struct virtio_vstellar_config cfg;	/* as read at probe */
	struct vstellar_resp_query_device attr;	/* QUERY_DEVICE answer */
	u32 features;				/* VIRTIO_VSTELLAR_F_* */

	struct vstellar_rxq eventq;
	spinlock_t eventq_lock;			/* eventq buffers */
	struct work_struct event_work;
	unsigned int num_cqnq;
	struct vstellar_rxq *cqnq;		/* [num_cqnq] */
	spinlock_t *cqnq_lock;			/* [num_cqnq] */

	struct work_struct config_work;
	bool registered;
	unsigned long lost;			/* bit 0: loss handled (once) */

	/* user doorbell pages (shm region 0) and the kick notify page */
	u64 db_base;
	u64 db_len;
	u64 kick_addr;				/* 0 if it cannot be mapped */

	/* kernel verbs (vstellar_datapath.c): the kernel's doorbell page */
	void *kdb;				/* NULL: no kernel verbs */
	void __iomem *kkick;

	/*
	 * cqn -> vstellar_cq, qpn -> vstellar_qp, srqn -> vstellar_srq
	 * (events, notifications)
	 */
	struct xarray cqs;
	struct xarray qps;
	struct xarray srqs;

	/*
	 * On-demand MRs (F_ODP, vstellar_odp.c): MRN -> vstellar_mr for page
	 * faults, lkey -> vstellar_mr for advise_mr; the work queue that
	 * serves the faults.
	 */
	struct xarray odp_mrs;
	struct xarray odp_lkeys;
	struct workqueue_struct *odp_wq;

	struct notifier_block nb;		/* netdevice events */
	struct work_struct rescan_work;		/* GID table from a new netdev */
	bool removing;
	struct net_device *netdev;		/* the one we are bound to */
	struct mutex netdev_lock;		/* protects netdev */
};

struct vstellar_ucontext {
	struct ib_ucontext ibucontext;
	u32 handle;
	u32 db_page;
	struct rdma_user_mmap_entry *db_entry;
	struct rdma_user_mmap_entry *kick_entry;
};

enum vstellar_mmap_kind {
	VSTELLAR_MMAP_DB,	/* doorbell page: ordinary write-back memory */
	VSTELLAR_MMAP_KICK,	/* kick notify page: MMIO, uncached */
};

struct vstellar_user_mmap_entry {
	struct rdma_user_mmap_entry rdma_entry;
	u64 address;
	enum vstellar_mmap_kind kind;
};

struct vstellar_pd {
	struct ib_pd ibpd;
	u32 pdn;
};

struct vstellar_cq {
	struct ib_cq ibcq;
	u32 cqn;
	u32 ucontext;
	u32 db_slot;
	u32 log_cqe;
	struct ib_umem *umem;		/* user CQs */
	struct mutex resize_mutex;	/* user CQs: RESIZE_CQ and umem swap */
	/* kernel CQs */
	struct vstellar_kring kring;
	spinlock_t lock;		/* ci, arm_seq */
	u32 ci;
	u32 arm_seq;
};

struct vstellar_qp {
	struct ib_qp ibqp;
	u32 qpn;
	u32 ucontext;
	u32 db_slot;
	u8 sq_sig_all;
	struct ib_qp_cap cap;		/* as granted at create */
	struct ib_umem *sq_umem;	/* user QPs */
	struct ib_umem *rq_umem;
	/* kernel QPs: rings, producer indices, WQEs completed (free-running) */
	struct vstellar_kring sq, rq;
	spinlock_t sq_lock, rq_lock;
	u32 sq_pi, rq_pi;
	u32 sq_done, rq_done;
	u8 sq_log_wqe, sq_log_stride, rq_log_wqe, rq_log_stride;
};

/*
 * A shared receive queue (F_SRQ): a receive ring many QPs take their
 * receives from, in posting order; they complete out of order.
 */
struct vstellar_srq {
	struct ib_srq ibsrq;
	u32 srqn;
	u32 ucontext;
	u32 db_slot;
	u32 max_sge;			/* as granted at create */
	u8 log_wqe, log_stride;
	struct ib_umem *umem;		/* user SRQs */
	struct mutex resize_mutex;	/* user SRQs: RESIZE_SRQ and umem swap */
	/*
	 * Kernel SRQs: the ring, WQEs posted and WQEs completed (both
	 * free-running). Completions arrive on the CQs of every QP on the
	 * SRQ, polled under different locks, hence an atomic count.
	 */
	struct vstellar_kring kring;
	spinlock_t lock;		/* pi and the ring's slots */
	u32 pi;
	atomic_t done;
};

/*
 * What an on-demand MR (F_ODP) adds. The device names the MR's bytes by
 * iova; the process by its virtual address va = iova - delta (0 for an
 * implicit MR, which covers the whole address space).
 */
struct vstellar_odp_mr {
	struct ib_pd *pd;		/* advise_mr names MRs of its PD only */
	u64 iova;			/* explicit MRs: the MR's first byte */
	u64 length;
	u64 delta;			/* iova - va, a multiple of PAGE_SIZE */
	bool implicit;
	/*
	 * DEREG_MR is done: invalidations unmap locally only (the device
	 * may have given the MRN to another MR by now).
	 */
	bool dead;
	/*
	 * Faults and prefetches in flight, plus one while the MR may be
	 * looked up; dereg drops that one and waits for idle before
	 * DEREG_MR, so no MAP_MR_PAGES follows it.
	 */
	refcount_t users;
	struct completion idle;
	/* implicit MRs: chunk index -> child ib_umem_odp, made on demand */
	struct xarray children;
	struct mutex children_lock;	/* creating children */
};

struct vstellar_mr {
	struct ib_mr ibmr;
	u32 mrn;
	u32 ucontext;
	struct ib_umem *umem;	/* a dmabuf MR's is an ib_umem_dmabuf's */
	struct vstellar_dev *dev;	/* user MRs; a dmabuf MR's move_notify may run before the core sets ibmr.device */
	bool dma;		/* get_dma_mr: the local DMA lkey, no device object */
	/*
	 * Fast-registration MRs (alloc_mr, F_MEM_MGT): the page list that
	 * map_mr_sg fills and the device reads at each REG_MR WQE.
	 */
	struct vstellar_kring plist;
	u32 max_pages;
	u32 npages;
	/* on-demand MRs (F_ODP): umem is the root ib_umem_odp */
	bool on_demand;
	struct vstellar_odp_mr odp;
};

/* Memory windows (F_MW), allocated for user space through uverbs. */
struct vstellar_mw {
	struct ib_mw ibmw;
	u32 mwn;
	u32 ucontext;
};

static inline struct vstellar_mw *to_vmw(struct ib_mw *mw)
{
	return container_of(mw, struct vstellar_mw, ibmw);
}

/* Kernel AHs only: the address vector copied into each UD WQE. */
struct vstellar_ah {
	struct ib_ah ibah;
	struct vstellar_av av;
};

static inline struct vstellar_dev *to_vdev(struct ib_device *ibdev)
{
	return container_of(ibdev, struct vstellar_dev, ibdev);
}

static inline struct vstellar_ucontext *to_vuctx(struct ib_ucontext *uctx)
{
	return container_of(uctx, struct vstellar_ucontext, ibucontext);
}

static inline struct vstellar_pd *to_vpd(struct ib_pd *pd)
{
	return container_of(pd, struct vstellar_pd, ibpd);
}

static inline struct vstellar_cq *to_vcq(struct ib_cq *cq)
{
	return container_of(cq, struct vstellar_cq, ibcq);
}

static inline struct vstellar_qp *to_vqp(struct ib_qp *qp)
{
	return container_of(qp, struct vstellar_qp, ibqp);
}

static inline struct vstellar_srq *to_vsrq(struct ib_srq *srq)
{
	return container_of(srq, struct vstellar_srq, ibsrq);
}

static inline struct vstellar_mr *to_vmr(struct ib_mr *mr)
{
	return container_of(mr, struct vstellar_mr, ibmr);
}

static inline struct vstellar_ah *to_vah(struct ib_ah *ah)
{
	return container_of(ah, struct vstellar_ah, ibah);
}

/*
 * The driver's files, top down; each calls only the ones below it:
 *   vstellar_main.c       probe and remove, queues, events, device loss,
 *                         net device association, the ib_device ops table
 *   vstellar_device.c     device and port queries, GIDs
 *   vstellar_pd.c         protection domains
 *   vstellar_ah.c         address handles
 *   vstellar_cq.c         CQs      \  one create/modify/destroy each, for
 *   vstellar_qp.c         QPs       > user and kernel objects alike; they
 *   vstellar_srq.c        SRQs     /  differ only in where the rings live
 *   vstellar_mr.c         MRs, fast registration, memory windows
 *   vstellar_odp.c        on-demand paging: faults, invalidation, prefetch
 *   vstellar_ucontext.c   user contexts, their mmap, rings in user memory
 *   vstellar_datapath.c   the kernel data path: post, poll, arm, on kernel
 *                         rings and the kernel's doorbell page
 *   vstellar_cmd.c        one typed function per device command
 *   vstellar_com.c        the control-queue transport
 *   vstellar_pci.c        the virtio-PCI function: DMA device, kick page
 */

/* The caller's device context, or 0 for the kernel's objects. */
static inline u32 vstellar_uctx_handle(struct ib_udata *udata)
{
	struct vstellar_ucontext *uctx = rdma_udata_to_drv_context(udata,
				struct vstellar_ucontext, ibucontext);

	return uctx ? uctx->handle : 0;
}

/* Page sizes the device takes for rings and MRs, as a bitmap. */
static inline unsigned long vstellar_pgsz_bitmap(struct vstellar_dev *dev)
{
	return le64_to_cpu(dev->attr.page_size_cap) &
	       GENMASK_ULL(30, PAGE_SHIFT);
}

/* vstellar_device.c */
int vstellar_query_device(struct ib_device *ibdev, struct ib_device_attr *props,
			  struct ib_udata *udata);
int vstellar_query_port(struct ib_device *ibdev, u32 port,
			struct ib_port_attr *props);
int vstellar_query_pkey(struct ib_device *ibdev, u32 port, u16 index,
			u16 *pkey);
int vstellar_get_port_immutable(struct ib_device *ibdev, u32 port,
				struct ib_port_immutable *immutable);
enum rdma_link_layer vstellar_get_link_layer(struct ib_device *ibdev,
					     u32 port);
void vstellar_get_dev_fw_str(struct ib_device *ibdev, char *str);
int vstellar_add_gid(const struct ib_gid_attr *attr, void **context);
int vstellar_del_gid(const struct ib_gid_attr *attr, void **context);

/* vstellar_pd.c */
int vstellar_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata);
int vstellar_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata);

/* vstellar_ah.c */
int vstellar_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *init_attr,
		       struct ib_udata *udata);
int vstellar_destroy_ah(struct ib_ah *ibah, u32 flags);

/* vstellar_cq.c */
int vstellar_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
		       vstellar_uverbs_arg_t *arg);
int vstellar_resize_cq(struct ib_cq *ibcq, int cqe, struct ib_udata *udata);
int vstellar_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata);

/* vstellar_qp.c */
int vstellar_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *init,
		       struct ib_udata *udata);
int vstellar_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
		       int attr_mask, struct ib_udata *udata);
int vstellar_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr,
		      int attr_mask, struct ib_qp_init_attr *init_attr);
int vstellar_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata);
int vstellar_attach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid);
int vstellar_detach_mcast(struct ib_qp *ibqp, union ib_gid *gid, u16 lid);

/* vstellar_srq.c */
int vstellar_create_srq(struct ib_srq *ibsrq,
			struct ib_srq_init_attr *init_attr,
			struct ib_udata *udata);
int vstellar_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
			enum ib_srq_attr_mask attr_mask,
			struct ib_udata *udata);
int vstellar_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr);
int vstellar_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata);

/* vstellar_mr.c */
struct ib_mr *vstellar_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length,
				   u64 virt_addr, int access_flags,
				   struct ib_udata *udata);
struct ib_mr *vstellar_get_dma_mr(struct ib_pd *ibpd, int access_flags);
struct ib_mr *vstellar_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type mr_type,
			       u32 max_num_sg);
int vstellar_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
		       unsigned int *sg_offset);
struct ib_mr *vstellar_reg_user_mr_dmabuf(struct ib_pd *ibpd, u64 offset,
					  u64 length, u64 virt_addr, int fd,
					  int access_flags,
					  vstellar_uverbs_arg_t *arg);
int vstellar_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata);
int vstellar_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata);
int vstellar_dealloc_mw(struct ib_mw *ibmw);

/* vstellar_odp.c (F_ODP, with CONFIG_INFINIBAND_ON_DEMAND_PAGING) */
static inline bool vstellar_odp_on(const struct vstellar_dev *dev)
{
	return IS_ENABLED(CONFIG_INFINIBAND_ON_DEMAND_PAGING) &&
	       (dev->features & BIT(VIRTIO_VSTELLAR_F_ODP));
}

#if IS_ENABLED(CONFIG_INFINIBAND_ON_DEMAND_PAGING)
int vstellar_odp_init(struct vstellar_dev *dev);
void vstellar_odp_fini(struct vstellar_dev *dev);
int vstellar_odp_mr_init(struct vstellar_mr *mr, struct ib_pd *ibpd,
			 u64 start, u64 length, u64 virt_addr,
			 int access_flags);
void vstellar_odp_mr_release(struct vstellar_mr *mr);
int vstellar_odp_publish(struct vstellar_mr *mr);
void vstellar_odp_retire(struct vstellar_mr *mr);
void vstellar_odp_unretire(struct vstellar_mr *mr);
void vstellar_odp_unpublish(struct vstellar_mr *mr);
void vstellar_odp_page_fault(struct vstellar_dev *dev,
			     const struct vstellar_event_page_fault *pf);
int vstellar_advise_mr(struct ib_pd *ibpd,
		       enum ib_uverbs_advise_mr_advice advice, u32 flags,
		       struct ib_sge *sg_list, u32 num_sge,
		       struct uverbs_attr_bundle *attrs);
#else
static inline int vstellar_odp_init(struct vstellar_dev *dev)
{
	return 0;
}

static inline void vstellar_odp_fini(struct vstellar_dev *dev) {}

static inline int vstellar_odp_mr_init(struct vstellar_mr *mr,
				       struct ib_pd *ibpd, u64 start,
				       u64 length, u64 virt_addr,
				       int access_flags)
{
	return -EOPNOTSUPP;
}

static inline void vstellar_odp_mr_release(struct vstellar_mr *mr) {}

static inline int vstellar_odp_publish(struct vstellar_mr *mr)
{
	return -EOPNOTSUPP;
}

static inline void vstellar_odp_retire(struct vstellar_mr *mr) {}
static inline void vstellar_odp_unretire(struct vstellar_mr *mr) {}
static inline void vstellar_odp_unpublish(struct vstellar_mr *mr) {}

static inline void
vstellar_odp_page_fault(struct vstellar_dev *dev,
			const struct vstellar_event_page_fault *pf) {}
#endif

/* vstellar_ucontext.c */
int vstellar_alloc_ucontext(struct ib_ucontext *uctx, struct ib_udata *udata);
void vstellar_dealloc_ucontext(struct ib_ucontext *uctx);
void vstellar_disassociate_ucontext(struct ib_ucontext *uctx);
int vstellar_mmap(struct ib_ucontext *uctx, struct vm_area_struct *vma);
void vstellar_mmap_free(struct rdma_user_mmap_entry *rdma_entry);
struct ib_umem *vstellar_user_ring_get(struct vstellar_dev *dev, u64 addr,
				       size_t size, unsigned long *pgsz);

/* vstellar_datapath.c */
int vstellar_kernel_db_init(struct vstellar_dev *dev);
void vstellar_kernel_db_fini(struct vstellar_dev *dev);
bool vstellar_kdb_slot_ok(u32 slot);
int vstellar_kring_alloc(struct vstellar_dev *dev, struct vstellar_kring *r,
			 size_t size);
void vstellar_kring_free(struct vstellar_dev *dev, struct vstellar_kring *r);
void vstellar_kqp_reset(struct vstellar_qp *qp);
int vstellar_poll_cq(struct ib_cq *ibcq, int num_entries, struct ib_wc *wc);
int vstellar_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags);
int vstellar_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
		       const struct ib_send_wr **bad_wr);
int vstellar_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
		       const struct ib_recv_wr **bad_wr);
int vstellar_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr,
			   const struct ib_recv_wr **bad_wr);

/* vstellar_pci.c */
struct device *vstellar_dma_device(struct virtio_device *vdev);
u64 vstellar_find_kick_page(struct virtio_device *vdev);

#endif /* _VSTELLAR_H_ */
