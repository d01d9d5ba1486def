/*
 * vhost-user vStellar RDMA device (virtio ID 42)
 *
 * The control, event, kick and CQ notification queues all live in the
 * backend (vstellard); QEMU only sets them up, owns the config space
 * fields that describe the frontend (doorbell region, queue count,
 * backend status) and the doorbell region itself: a shared memfd that
 * vhost-user's memory table hands to the backend like guest RAM, so guest
 * stores to a doorbell page reach vstellard with no exit.
 * Spec: docs/virtio-vstellar.md of vStellar. Modelled on vhost-user-gpio.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qapi/error.h"
#include "qemu/error-report.h"
#include "qemu/memfd.h"
#include "hw/boards.h"
#include "hw/core/cpu.h"
#include "sysemu/tcg.h"
#include "hw/qdev-properties.h"
#include "hw/qdev-properties-system.h"
#include "hw/virtio/virtio-bus.h"
#include "hw/virtio/vhost-user-vstellar.h"
#include "exec/cpu-common.h"
#include "standard-headers/linux/virtio_ids.h"

#define REALIZE_CONNECTION_RETRIES 3
#define VSTELLAR_QUEUE_SIZE 256

/* Features passed through between the guest and the backend */
static const int feature_bits[] = {
    VIRTIO_F_VERSION_1,
    VIRTIO_F_NOTIFY_ON_EMPTY,
    VIRTIO_RING_F_INDIRECT_DESC,
    VIRTIO_RING_F_EVENT_IDX,
    VIRTIO_F_RING_RESET,
#define VU_VSTELLAR_FEATURE(bit) bit,
    VSTELLAR_FEATURE_LIST(VU_VSTELLAR_FEATURE)
#undef VU_VSTELLAR_FEATURE
    VHOST_INVALID_FEATURE_BIT
};

/* Overlay what this frontend owns on the config the backend gave us. */
static void vu_vstellar_patch_config(VHostUserVstellar *s)
{
    struct virtio_vstellar_config *c = &s->config;
    uint32_t status = le32_to_cpu(c->device_status);

    status &= ~VSTELLAR_DEV_S_BACKEND_LOST;
    if (s->lost || !s->connected) {
        status |= VSTELLAR_DEV_S_BACKEND_LOST;
    }
    c->device_status = cpu_to_le32(status);
    c->epoch = cpu_to_le32(s->epoch);
    c->num_cq_queues = cpu_to_le32(s->cq_queues);
    c->db_page_count = cpu_to_le32(s->doorbell_pages);
    c->db_page_size = cpu_to_le32(VSTELLAR_DB_PAGE_SIZE);
    c->db_region_id = 0;    /* between us and the backend */
    if (le32_to_cpu(c->max_ucontext) > s->doorbell_pages) {
        c->max_ucontext = cpu_to_le32(s->doorbell_pages);
    }
}

/* Read the config from the backend and check that we speak its version. */
static int vu_vstellar_fetch_config(VHostUserVstellar *s, Error **errp)
{
    struct virtio_vstellar_config c;
    uint32_t version;
    int ret;

    ret = vhost_dev_get_config(&s->vhost_dev, (uint8_t *)&c, sizeof(c), errp);
    if (ret < 0) {
        error_prepend(errp, "vhost-user-vstellar: GET_CONFIG failed: ");
        return ret;
    }
    version = le32_to_cpu(c.abi_version);
    /* 1.4: the backend must know db_region_id to tell the doorbells apart */
    if (VSTELLAR_ABI_VERSION_MAJOR(version) != VSTELLAR_ABI_MAJOR ||
        (version & 0xffff) < 4) {
        error_setg(errp, "vhost-user-vstellar: backend speaks interface "
                   "%u.%u, this QEMU needs %u.4 or later", version >> 16,
                   version & 0xffff, VSTELLAR_ABI_MAJOR);
        return -EPROTO;
    }
    s->config = c;
    vu_vstellar_patch_config(s);
    return 0;
}

/*
 * Every vhost-user device of the guest gets every doorbell region in its
 * memory table (they are RAM with an fd): tell the backend which is ours.
 */
static int vu_vstellar_send_db_region_id(VHostUserVstellar *s, Error **errp)
{
    uint32_t id = cpu_to_le32(s->db_region_id);
    int ret;

    ret = vhost_dev_set_config(&s->vhost_dev, (uint8_t *)&id,
                               offsetof(struct virtio_vstellar_config,
                                        db_region_id),
                               sizeof(id), VHOST_SET_CONFIG_TYPE_MASTER);
    if (ret < 0) {
        error_setg_errno(errp, -ret, "vhost-user-vstellar: SET_CONFIG of "
                         "db_region_id failed");
    }
    return ret;
}

static void vu_vstellar_get_config(VirtIODevice *vdev, uint8_t *config)
{
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(vdev);

    memcpy(config, &s->config, sizeof(s->config));
}

/* The backend told us its config changed (VHOST_USER_SLAVE_CONFIG_CHANGE) */
static int vu_vstellar_config_notifier(struct vhost_dev *dev)
{
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(dev->vdev);
    Error *local_err = NULL;

    if (vu_vstellar_fetch_config(s, &local_err) < 0) {
        error_report_err(local_err);
        return -EPROTO;
    }
    virtio_notify_config(dev->vdev);
    return 0;
}

static const VhostDevConfigOps vstellar_config_ops = {
    .vhost_dev_config_notifier = vu_vstellar_config_notifier,
};

/*
 * Tell the driver the device cannot go on: config says why, status gets
 * DEVICE_NEEDS_RESET and a config interrupt is raised (virtio_error).
 */
static void vu_vstellar_backend_lost(VHostUserVstellar *s, const char *why)
{
    VirtIODevice *vdev = VIRTIO_DEVICE(s);

    s->lost = true;
    vu_vstellar_patch_config(s);
    virtio_error(vdev, "vhost-user-vstellar: %s", why);
}

static int vu_vstellar_start(VirtIODevice *vdev)
{
    BusState *qbus = BUS(qdev_get_parent_bus(DEVICE(vdev)));
    VirtioBusClass *k = VIRTIO_BUS_GET_CLASS(qbus);
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(vdev);
    struct vhost_dev *vhost_dev = &s->vhost_dev;
    int ret, i;

    if (!k->set_guest_notifiers) {
        error_report("vhost-user-vstellar: binding does not support "
                     "guest notifiers");
        return -ENOSYS;
    }

    ret = vhost_dev_enable_notifiers(vhost_dev, vdev);
    if (ret < 0) {
        error_report("vhost-user-vstellar: enabling host notifiers: %d", ret);
        return ret;
    }

    ret = k->set_guest_notifiers(qbus->parent, vhost_dev->nvqs, true);
    if (ret < 0) {
        error_report("vhost-user-vstellar: binding guest notifiers: %d", ret);
        goto err_host_notifiers;
    }

    vhost_ack_features(vhost_dev, feature_bits, vdev->guest_features);

    ret = vhost_dev_start(vhost_dev, vdev, false);
    if (ret < 0) {
        error_report("vhost-user-vstellar: starting: %d", ret);
        goto err_guest_notifiers;
    }
    s->started_vu = true;

    /* virtio-pci decides between irqfd and its own path; unmask all */
    for (i = 0; i < vhost_dev->nvqs; i++) {
        vhost_virtqueue_mask(vhost_dev, vdev, i, false);
    }

    /*
     * With VHOST_USER_F_PROTOCOL_FEATURES (needed for GET_CONFIG) rings
     * start disabled; enable them explicitly.
     */
    ret = vhost_dev->vhost_ops->vhost_set_vring_enable(vhost_dev, true);
    if (ret == 0) {
        return 0;
    }
    error_report("vhost-user-vstellar: enabling vrings: %d", ret);
    vhost_dev_stop(vhost_dev, vdev, false);
    s->started_vu = false;

err_guest_notifiers:
    k->set_guest_notifiers(qbus->parent, vhost_dev->nvqs, false);
err_host_notifiers:
    vhost_dev_disable_notifiers(vhost_dev, vdev);
    return ret;
}

static void vu_vstellar_stop(VirtIODevice *vdev)
{
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(vdev);
    BusState *qbus = BUS(qdev_get_parent_bus(DEVICE(vdev)));
    VirtioBusClass *k = VIRTIO_BUS_GET_CLASS(qbus);
    struct vhost_dev *vhost_dev = &s->vhost_dev;
    int ret;

    if (!s->started_vu) {
        return;
    }
    s->started_vu = false;

    if (!k->set_guest_notifiers) {
        return;
    }

    vhost_dev_stop(vhost_dev, vdev, false);

    ret = k->set_guest_notifiers(qbus->parent, vhost_dev->nvqs, false);
    if (ret < 0) {
        error_report("vhost-user-vstellar: guest notifier cleanup: %d", ret);
        return;
    }
    vhost_dev_disable_notifiers(vhost_dev, vdev);
}

static void vu_vstellar_set_status(VirtIODevice *vdev, uint8_t status)
{
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(vdev);
    bool should_start = virtio_device_should_start(vdev, status);

    if (status == 0 && s->lost) {
        /* The guest reset the device after a backend loss. */
        s->lost = false;
        vu_vstellar_patch_config(s);
    }

    if (!s->connected || s->lost) {
        /*
         * Nobody would serve the queues: say so instead of letting the
         * driver wait for command completions that never come.
         */
        if (should_start && !s->lost) {
            vu_vstellar_backend_lost(s, "no backend connected");
        }
        return;
    }

    if (vhost_dev_is_started(&s->vhost_dev) == should_start) {
        return;
    }

    if (should_start) {
        if (vu_vstellar_start(vdev)) {
            qemu_chr_fe_disconnect(&s->chardev);
        }
    } else {
        vu_vstellar_stop(vdev);
    }
}

static uint64_t vu_vstellar_get_features(VirtIODevice *vdev,
                                         uint64_t features, Error **errp)
{
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(vdev);
    int i;

    /* Offer every device bit; vhost_get_features keeps the backend's. */
    for (i = 0; feature_bits[i] != VHOST_INVALID_FEATURE_BIT; i++) {
        if (feature_bits[i] < 24) {
            virtio_add_feature(&features, feature_bits[i]);
        }
    }
    return vhost_get_features(&s->vhost_dev, feature_bits, features);
}

static void vu_vstellar_handle_output(VirtIODevice *vdev, VirtQueue *vq)
{
    /*
     * The backend handles every queue; QEMU only gets here when the
     * host notifiers are not set up (device not started).
     */
}

static void vu_vstellar_guest_notifier_mask(VirtIODevice *vdev, int idx,
                                            bool mask)
{
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(vdev);

    /* The config interrupt (idx -1) is QEMU's own, not the backend's. */
    if (idx < 0) {
        return;
    }
    vhost_virtqueue_mask(&s->vhost_dev, vdev, idx, mask);
}

static bool vu_vstellar_guest_notifier_pending(VirtIODevice *vdev, int idx)
{
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(vdev);

    if (idx < 0) {
        return false;
    }
    return vhost_virtqueue_pending(&s->vhost_dev, idx);
}

static void do_vhost_user_cleanup(VirtIODevice *vdev, VHostUserVstellar *s)
{
    uint32_t i;

    for (i = 0; i < s->nvqs; i++) {
        virtio_delete_queue(s->vqs[i]);
    }
    g_free(s->vqs);
    s->vqs = NULL;
    g_free(s->vhost_vqs);
    s->vhost_vqs = NULL;
    virtio_cleanup(vdev);
    vhost_user_cleanup(&s->vhost_user);
}

static int vu_vstellar_connect(DeviceState *dev, Error **errp)
{
    VirtIODevice *vdev = VIRTIO_DEVICE(dev);
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(vdev);
    struct vhost_dev *vhost_dev = &s->vhost_dev;
    int ret;

    if (s->connected) {
        return 0;
    }

    vhost_dev_set_config_notifier(vhost_dev, &vstellar_config_ops);
    s->vhost_user.supports_config = true;
    vhost_dev->nvqs = s->nvqs;
    vhost_dev->vqs = s->vhost_vqs;
    /* A backend with VHOST_USER_PROTOCOL_F_MQ must serve all our queues. */
    vhost_dev->num_queues = s->nvqs;

    ret = vhost_dev_init(vhost_dev, &s->vhost_user, VHOST_BACKEND_TYPE_USER,
                         0, errp);
    if (ret < 0) {
        return ret;
    }
    s->connected = true;
    s->epoch++;

    ret = vu_vstellar_fetch_config(s, errp);
    if (ret == 0) {
        ret = vu_vstellar_send_db_region_id(s, errp);
    }
    if (ret < 0) {
        s->connected = false;
        vhost_dev_cleanup(vhost_dev);
        return ret;
    }

    /*
     * A backend that reconnects while the driver runs the device without
     * having lost it (e.g. the socket came up late) gets the rings; after
     * a loss the driver resets first (see vu_vstellar_set_status).
     */
    if (!s->lost && virtio_device_started(vdev, vdev->status)) {
        vu_vstellar_start(vdev);
    }
    return 0;
}

static void vu_vstellar_event(void *opaque, QEMUChrEvent event);

static void vu_vstellar_disconnect(DeviceState *dev)
{
    VirtIODevice *vdev = VIRTIO_DEVICE(dev);
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(vdev);
    bool was_running = s->started_vu ||
                       (vdev->status & VIRTIO_CONFIG_S_DRIVER_OK);

    if (!s->connected) {
        return;
    }
    s->connected = false;

    vu_vstellar_stop(vdev);
    vhost_dev_cleanup(&s->vhost_dev);

    if (was_running && !s->lost) {
        vu_vstellar_backend_lost(s, "backend disconnected; device needs "
                                 "reset");
    } else {
        vu_vstellar_patch_config(s);
    }

    /* Re-instate the event handler for new connections */
    qemu_chr_fe_set_handlers(&s->chardev, NULL, NULL, vu_vstellar_event,
                             NULL, dev, NULL, true);
}

static void vu_vstellar_event(void *opaque, QEMUChrEvent event)
{
    DeviceState *dev = opaque;
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(dev);
    Error *local_err = NULL;

    switch (event) {
    case CHR_EVENT_OPENED:
        if (vu_vstellar_connect(dev, &local_err) < 0) {
            error_report_err(local_err);
            qemu_chr_fe_disconnect(&s->chardev);
            return;
        }
        break;
    case CHR_EVENT_CLOSED:
        /* defer close until later to avoid circular close */
        vhost_user_async_close(dev, &s->chardev, &s->vhost_dev,
                               vu_vstellar_disconnect);
        break;
    case CHR_EVENT_BREAK:
    case CHR_EVENT_MUX_IN:
    case CHR_EVENT_MUX_OUT:
        break;
    }
}

static int vu_vstellar_realize_connect(VHostUserVstellar *s, Error **errp)
{
    DeviceState *dev = DEVICE(s);
    int ret;

    ret = qemu_chr_fe_wait_connected(&s->chardev, errp);
    if (ret < 0) {
        return ret;
    }

    /* The event callback may have connected already; then this is a no-op */
    ret = vu_vstellar_connect(dev, errp);
    if (ret < 0) {
        qemu_chr_fe_disconnect(&s->chardev);
        return ret;
    }
    g_assert(s->connected);
    return 0;
}

/* The backend maps guest RAM through vhost-user: it must have a shared fd */
static bool vu_vstellar_check_guest_ram(Error **errp)
{
    MachineState *ms = MACHINE(qdev_get_machine());

    if (!ms->ram || memory_region_get_fd(ms->ram) < 0 ||
        !qemu_ram_is_shared(ms->ram->ram_block)) {
        error_setg(errp, "vhost-user-vstellar: guest RAM must be shared "
                   "with vstellard: use -object memory-backend-memfd,"
                   "id=mem,size=<RAM size>,share=on -machine "
                   "memory-backend=mem; with libvirt, put <memoryBacking>"
                   "<source type='memfd'/><access mode='shared'/>"
                   "</memoryBacking> in the domain XML");
        return false;
    }
    return true;
}

/*
 * vstellard reads the guest's doorbell records while the guest runs, and
 * the two meet through memory barriers (the provider stores a producer
 * index, fences, then reads need_kick; the daemon the other way round).
 * TCG emits a guest's barriers (mfence, locked instructions) only when it
 * translates for parallel vCPUs, that is with multi-threaded TCG and
 * maxcpus > 1; otherwise the guest's store can pass its load and a
 * doorbell is lost for good.
 */
static bool vu_vstellar_check_barriers(Error **errp)
{
    if (tcg_enabled() &&
        (!qemu_tcg_mttcg_enabled() || current_machine->smp.max_cpus < 2)) {
        error_setg(errp, "vhost-user-vstellar: under TCG this device needs "
                   "the guest's memory barriers, which TCG keeps only with "
                   "-accel tcg,thread=multi and maxcpus of 2 or more "
                   "(for one vCPU: -smp 1,maxcpus=2; with libvirt, "
                   "<vcpu current='1'>2</vcpu>)");
        return false;
    }
    return true;
}

static bool vu_vstellar_init_doorbells(VHostUserVstellar *s, Error **errp)
{
    ERRP_GUARD();
    static uint32_t last_db_region_id;
    uint64_t size = (uint64_t)s->doorbell_pages * VSTELLAR_DB_PAGE_SIZE;
    g_autofree char *name = NULL;
    int fd;

    /*
     * vstellard finds the region in its memory table by this name, with
     * an id unique in this QEMU (all devices' doorbells are in each
     * device's table).
     * Sealed so that nobody can shrink it under vstellard's mappings (a
     * daemon touching a truncated page would fault); vstellard refuses
     * memory it cannot trust this way.
     */
    s->db_region_id = ++last_db_region_id;
    name = g_strdup_printf(VSTELLAR_DB_MEMFD_NAME "-%u", s->db_region_id);
    fd = qemu_memfd_create(name, size, false, 0,
                           F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL, errp);
    if (fd < 0) {
        return false;
    }
    memory_region_init_ram_from_fd(&s->db_mr, OBJECT(s), "vstellar-doorbell",
                                   size, RAM_SHARED, fd, 0, errp);
    if (*errp) {
        close(fd);
        return false;
    }
    return true;
}

static void vu_vstellar_device_realize(DeviceState *dev, Error **errp)
{
    ERRP_GUARD();
    VirtIODevice *vdev = VIRTIO_DEVICE(dev);
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(dev);
    int retries, ret;
    uint32_t i;

    if (!s->chardev.chr) {
        error_setg(errp, "vhost-user-vstellar: chardev is mandatory");
        return;
    }
    if (s->cq_queues < 1 || s->cq_queues > VSTELLAR_MAX_CQ_QUEUES) {
        error_setg(errp, "vhost-user-vstellar: cq-queues must be 1..%d",
                   VSTELLAR_MAX_CQ_QUEUES);
        return;
    }
    if (s->doorbell_pages < 1 || s->doorbell_pages > 4096 ||
        !is_power_of_2(s->doorbell_pages)) {
        error_setg(errp, "vhost-user-vstellar: doorbell-pages must be a "
                   "power of two in 1..4096");
        return;
    }
    if (!vu_vstellar_check_guest_ram(errp) || !vu_vstellar_check_barriers(errp)) {
        return;
    }
    if (!vu_vstellar_init_doorbells(s, errp)) {
        return;
    }
    if (!vhost_user_init(&s->vhost_user, &s->chardev, errp)) {
        return;
    }

    /*
     * QEMU 7.2's virtio_init() asserts that the ID has a name in its own
     * table, which stops at 41 (GPIO). Initialise under a named ID, then
     * set ours: device_id is only read later (virtio-pci's PCI device ID,
     * legacy checks). Only the experimental x-query-virtio-status QMP
     * command does not know ID 42.
     */
    virtio_init(vdev, VIRTIO_ID_GPIO, sizeof(struct virtio_vstellar_config));
    vdev->device_id = VIRTIO_ID_VSTELLAR;
    vdev->name = "virtio-rdma";

    s->nvqs = VSTELLAR_VQ_CQN0 + s->cq_queues;
    s->vqs = g_new0(VirtQueue *, s->nvqs);
    for (i = 0; i < s->nvqs; i++) {
        s->vqs[i] = virtio_add_queue(vdev, VSTELLAR_QUEUE_SIZE,
                                     vu_vstellar_handle_output);
    }
    s->vhost_vqs = g_new0(struct vhost_virtqueue, s->nvqs);
    s->connected = false;
    s->lost = false;

    qemu_chr_fe_set_handlers(&s->chardev, NULL, NULL, vu_vstellar_event,
                             NULL, dev, NULL, true);

    retries = REALIZE_CONNECTION_RETRIES;
    g_assert(!*errp);
    do {
        if (*errp) {
            error_prepend(errp, "Reconnecting after error: ");
            error_report_err(*errp);
            *errp = NULL;
        }
        ret = vu_vstellar_realize_connect(s, errp);
    } while (ret < 0 && retries--);

    if (ret < 0) {
        qemu_chr_fe_set_handlers(&s->chardev, NULL, NULL, NULL, NULL, NULL,
                                 NULL, false);
        do_vhost_user_cleanup(vdev, s);
    }
}

static void vu_vstellar_device_unrealize(DeviceState *dev)
{
    VirtIODevice *vdev = VIRTIO_DEVICE(dev);
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(dev);

    vu_vstellar_set_status(vdev, 0);
    qemu_chr_fe_set_handlers(&s->chardev, NULL, NULL, NULL, NULL, NULL, NULL,
                             false);
    vhost_dev_cleanup(&s->vhost_dev);
    do_vhost_user_cleanup(vdev, s);
}

static struct vhost_dev *vu_vstellar_get_vhost(VirtIODevice *vdev)
{
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(vdev);

    return &s->vhost_dev;
}

static const VMStateDescription vu_vstellar_vmstate = {
    .name = "vhost-user-vstellar",
    .unmigratable = 1,
};

static Property vu_vstellar_properties[] = {
    DEFINE_PROP_CHR("chardev", VHostUserVstellar, chardev),
    DEFINE_PROP_UINT32("cq-queues", VHostUserVstellar, cq_queues, 1),
    DEFINE_PROP_UINT32("doorbell-pages", VHostUserVstellar, doorbell_pages,
                       64),
    DEFINE_PROP_END_OF_LIST(),
};

static void vu_vstellar_class_init(ObjectClass *klass, void *data)
{
    DeviceClass *dc = DEVICE_CLASS(klass);
    VirtioDeviceClass *vdc = VIRTIO_DEVICE_CLASS(klass);

    device_class_set_props(dc, vu_vstellar_properties);
    dc->vmsd = &vu_vstellar_vmstate;
    set_bit(DEVICE_CATEGORY_NETWORK, dc->categories);
    vdc->realize = vu_vstellar_device_realize;
    vdc->unrealize = vu_vstellar_device_unrealize;
    vdc->get_features = vu_vstellar_get_features;
    vdc->get_config = vu_vstellar_get_config;
    vdc->set_status = vu_vstellar_set_status;
    vdc->guest_notifier_mask = vu_vstellar_guest_notifier_mask;
    vdc->guest_notifier_pending = vu_vstellar_guest_notifier_pending;
    vdc->get_vhost = vu_vstellar_get_vhost;
}

static const TypeInfo vu_vstellar_info = {
    .name = TYPE_VHOST_USER_VSTELLAR,
    .parent = TYPE_VIRTIO_DEVICE,
    .instance_size = sizeof(VHostUserVstellar),
    .class_init = vu_vstellar_class_init,
};

static void vu_vstellar_register_types(void)
{
    type_register_static(&vu_vstellar_info);
}

type_init(vu_vstellar_register_types)
