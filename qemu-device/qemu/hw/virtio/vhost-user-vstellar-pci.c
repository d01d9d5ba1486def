/*
 * vhost-user vStellar RDMA device, PCI glue
 *
 * Adds what the virtio device cannot: the doorbell BAR with its virtio
 * shared-memory capability (id VSTELLAR_SHM_DOORBELL), and page-per-vq,
 * so that the kick queue's notify page can be mapped into a user process
 * without exposing the other queues' notify addresses.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qapi/error.h"
#include "hw/qdev-properties.h"
#include "hw/pci/pci.h"
#include "hw/virtio/vhost-user-vstellar.h"
#include "hw/virtio/virtio-pci.h"
#include "standard-headers/linux/virtio_pci.h"

struct VHostUserVstellarPCI {
    VirtIOPCIProxy parent_obj;
    VHostUserVstellar vdev;
};

typedef struct VHostUserVstellarPCI VHostUserVstellarPCI;

#define TYPE_VHOST_USER_VSTELLAR_PCI "vhost-user-vstellar-pci-base"

DECLARE_INSTANCE_CHECKER(VHostUserVstellarPCI, VHOST_USER_VSTELLAR_PCI,
                         TYPE_VHOST_USER_VSTELLAR_PCI)

/* A virtio PCI capability of type VIRTIO_PCI_CAP_SHARED_MEMORY_CFG */
static bool vu_vstellar_pci_add_shm_cap(VirtIOPCIProxy *proxy, uint8_t bar,
                                        uint64_t offset, uint64_t length,
                                        uint8_t id, Error **errp)
{
    PCIDevice *pci_dev = &proxy->pci_dev;
    struct virtio_pci_cap64 cap = {
        .cap.cap_len = sizeof(cap),
        .cap.cfg_type = VIRTIO_PCI_CAP_SHARED_MEMORY_CFG,
        .cap.bar = bar,
        .cap.id = id,
        .cap.offset = cpu_to_le32(offset),
        .cap.length = cpu_to_le32(length),
        .offset_hi = cpu_to_le32(offset >> 32),
        .length_hi = cpu_to_le32(length >> 32),
    };
    int pos;

    pos = pci_add_capability(pci_dev, PCI_CAP_ID_VNDR, 0, cap.cap.cap_len,
                             errp);
    if (pos < 0) {
        return false;
    }
    /* pci_add_capability wrote the id and next pointer; the rest is ours */
    memcpy(pci_dev->config + pos + PCI_CAP_FLAGS, &cap.cap.cap_len,
           cap.cap.cap_len - PCI_CAP_FLAGS);
    return true;
}

static void vhost_user_vstellar_pci_realize(VirtIOPCIProxy *vpci_dev,
                                            Error **errp)
{
    VHostUserVstellarPCI *dev = VHOST_USER_VSTELLAR_PCI(vpci_dev);
    VHostUserVstellar *vs = &dev->vdev;
    DeviceState *vdev = DEVICE(vs);

    if (!(vpci_dev->flags & VIRTIO_PCI_FLAG_PAGE_PER_VQ)) {
        error_setg(errp, "vhost-user-vstellar-pci: page-per-vq must stay on "
                   "(the kick page is mapped into user space)");
        return;
    }
    if (vpci_dev->flags & VIRTIO_PCI_FLAG_MODERN_PIO_NOTIFY) {
        error_setg(errp, "vhost-user-vstellar-pci: modern-pio-notify is not "
                   "supported (BAR %d holds the doorbells)",
                   VHOST_USER_VSTELLAR_DB_BAR);
        return;
    }
    /*
     * virtio-pci uses BAR 1 (MSI-X), 4-5 (modern registers) and, with
     * modern-pio-notify only, 2: so 2-3 are ours. Refuse if that changes.
     */
    if (vpci_dev->msix_bar_idx >> 1 == VHOST_USER_VSTELLAR_DB_BAR >> 1 ||
        vpci_dev->modern_mem_bar_idx >> 1 == VHOST_USER_VSTELLAR_DB_BAR >> 1) {
        error_setg(errp, "vhost-user-vstellar-pci: BAR %d is taken",
                   VHOST_USER_VSTELLAR_DB_BAR);
        return;
    }

    /* one vector per queue, plus config changes (backend loss) */
    vpci_dev->nvectors = VSTELLAR_VQ_CQN0 + vs->cq_queues + 1;

    if (!qdev_realize(vdev, BUS(&vpci_dev->bus), errp)) {
        return;
    }

    pci_register_bar(&vpci_dev->pci_dev, VHOST_USER_VSTELLAR_DB_BAR,
                     PCI_BASE_ADDRESS_SPACE_MEMORY |
                     PCI_BASE_ADDRESS_MEM_PREFETCH |
                     PCI_BASE_ADDRESS_MEM_TYPE_64,
                     &vs->db_mr);
    vu_vstellar_pci_add_shm_cap(vpci_dev, VHOST_USER_VSTELLAR_DB_BAR, 0,
                                memory_region_size(&vs->db_mr),
                                VSTELLAR_SHM_DOORBELL, errp);
}

static void vhost_user_vstellar_pci_class_init(ObjectClass *klass, void *data)
{
    DeviceClass *dc = DEVICE_CLASS(klass);
    VirtioPCIClass *k = VIRTIO_PCI_CLASS(klass);
    PCIDeviceClass *pcidev_k = PCI_DEVICE_CLASS(klass);

    k->realize = vhost_user_vstellar_pci_realize;
    set_bit(DEVICE_CATEGORY_NETWORK, dc->categories);
    pcidev_k->vendor_id = PCI_VENDOR_ID_REDHAT_QUMRANET;
    pcidev_k->device_id = 0; /* virtio-pci sets 0x1040 + virtio id */
    pcidev_k->revision = 0x00;
    pcidev_k->class_id = PCI_CLASS_NETWORK_OTHER;
}

static void vhost_user_vstellar_pci_instance_init(Object *obj)
{
    VHostUserVstellarPCI *dev = VHOST_USER_VSTELLAR_PCI(obj);
    VirtIOPCIProxy *proxy = VIRTIO_PCI(obj);

    virtio_instance_init_common(obj, &dev->vdev, sizeof(dev->vdev),
                                TYPE_VHOST_USER_VSTELLAR);
    /* Property defaults are set by now; page-per-vq=off is refused later */
    proxy->flags |= VIRTIO_PCI_FLAG_PAGE_PER_VQ;
}

static const VirtioPCIDeviceTypeInfo vhost_user_vstellar_pci_info = {
    .base_name = TYPE_VHOST_USER_VSTELLAR_PCI,
    .non_transitional_name = "vhost-user-vstellar-pci",
    .instance_size = sizeof(VHostUserVstellarPCI),
    .instance_init = vhost_user_vstellar_pci_instance_init,
    .class_init = vhost_user_vstellar_pci_class_init,
};

static void vhost_user_vstellar_pci_register(void)
{
    virtio_pci_types_register(&vhost_user_vstellar_pci_info);
}

type_init(vhost_user_vstellar_pci_register);
