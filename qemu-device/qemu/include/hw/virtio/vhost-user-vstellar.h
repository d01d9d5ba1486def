/*
 * vhost-user vStellar RDMA device (virtio ID 42), served by vstellard.
 *
 * The device interface (config space, queues, doorbell region) is defined
 * in vStellar's include/vstellar/virtio_vstellar.h, which hook.sh copies
 * into QEMU's include/vstellar/; the spec is docs/virtio-vstellar.md.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#ifndef QEMU_VHOST_USER_VSTELLAR_H
#define QEMU_VHOST_USER_VSTELLAR_H

#include "hw/virtio/virtio.h"
#include "hw/virtio/vhost.h"
#include "hw/virtio/vhost-user.h"
#include "chardev/char-fe.h"
#include "exec/memory.h"
#include "vstellar/virtio_vstellar.h"

#define TYPE_VHOST_USER_VSTELLAR "vhost-user-vstellar-device"
OBJECT_DECLARE_SIMPLE_TYPE(VHostUserVstellar, VHOST_USER_VSTELLAR)

/* BAR of the doorbell shared-memory region (BAR 1 is MSI-X, 4 modern) */
#define VHOST_USER_VSTELLAR_DB_BAR 2

struct VHostUserVstellar {
    /*< private >*/
    VirtIODevice parent_obj;

    /* properties */
    CharBackend chardev;
    uint32_t cq_queues;
    uint32_t doorbell_pages;

    /* what the guest reads: backend's config, our fields patched in */
    struct virtio_vstellar_config config;
    struct vhost_virtqueue *vhost_vqs;
    struct vhost_dev vhost_dev;
    VhostUserState vhost_user;
    VirtQueue **vqs;
    uint32_t nvqs;

    /*
     * the doorbell region: a shared memfd, so it reaches the backend;
     * db_region_id names it apart from the guest's other vStellar devices'
     */
    MemoryRegion db_mr;
    /* the region's memory and size, for the migration stream */
    uint8_t *db_ptr;
    uint32_t db_size;
    uint32_t db_region_id;

    /*
     * @connected: vhost-user session up (connect/disconnect)
     * @started_vu: rings running in the backend (start/stop)
     * @lost: the backend went away while the driver was using the
     *        device; stays set until the guest resets the device, so a
     *        new backend never inherits rings whose state died
     */
    bool connected;
    bool started_vu;
    bool lost;
    uint32_t epoch;
    /* why this device cannot migrate now, if it cannot (a blocker) */
    Error *migration_blocker;
    /*< public >*/
};

#endif /* QEMU_VHOST_USER_VSTELLAR_H */
