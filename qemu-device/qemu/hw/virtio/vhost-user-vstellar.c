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
#include <poll.h>
#include "qapi/error.h"
#include "qemu/error-report.h"
#include "qemu/memfd.h"
#include "qemu/timer.h"
#include "qemu/units.h"
#include "hw/boards.h"
#include "hw/core/cpu.h"
#include "sysemu/tcg.h"
#include "hw/qdev-properties.h"
#include "hw/qdev-properties-system.h"
#include "hw/virtio/virtio-bus.h"
#include "hw/virtio/vhost-user-vstellar.h"
#include "exec/cpu-common.h"
#include "migration/blocker.h"
#include "migration/qemu-file-types.h"
#include "migration/vmstate.h"
#include "standard-headers/linux/vhost_types.h"
#include "standard-headers/linux/virtio_ids.h"

#define REALIZE_CONNECTION_RETRIES 3
#define VSTELLAR_QUEUE_SIZE 256

/*
 * The backend's state in the migration stream: at most this much (far
 * above any device, whose engine state is a few KiB per QP; vstellard
 * refuses more too), in chunks of at most VSTELLAR_STATE_CHUNK bytes.
 */
#define VSTELLAR_STATE_MAX (256 * MiB)
#define VSTELLAR_STATE_CHUNK (1 * MiB)
/*
 * How long a state transfer through the pipe may take. vstellard gives
 * up on its side after 30 s; this only keeps a backend that neither
 * writes nor closes its end from holding QEMU (and the VM, stopped for
 * the switch-over) forever.
 */
#define VSTELLAR_STATE_TIMEOUT_MS 60000

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

/*
 * The device's reset: the guest's (status 0) and a system reset.
 * virtio_reset() has stopped the rings already (set_status(0), which
 * sends GET_VRING_BASE). That stop is all a VM stop does too (`stop`,
 * migration), and vstellard keeps the device's RDMA objects across it;
 * only RESET_DEVICE drops them. So the guest's reset must reach the
 * backend as RESET_DEVICE.
 * Only when negotiated: without VHOST_USER_PROTOCOL_F_RESET_DEVICE,
 * QEMU 7.2's vhost_reset_device sends RESET_OWNER, which ends the session
 * of a vstellard that does not know it; such a vstellard resets the device
 * at GET_VRING_BASE instead (and cannot migrate).
 */
static void vu_vstellar_reset(VirtIODevice *vdev)
{
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(vdev);
    struct vhost_dev *hdev = &s->vhost_dev;
    int ret;

    if (!s->connected || !vhost_user_has_reset_device(hdev)) {
        return;
    }
    ret = hdev->vhost_ops->vhost_reset_device(hdev);
    if (ret < 0) {
        /* The socket is gone; the disconnect path reports the loss. */
        error_report("vhost-user-vstellar: RESET_DEVICE failed: %s",
                     strerror(-ret));
    }
}

static void vu_vstellar_del_blocker(VHostUserVstellar *s)
{
    if (s->migration_blocker) {
        migrate_del_blocker(s->migration_blocker);
        error_free(s->migration_blocker);
        s->migration_blocker = NULL;
    }
}

/*
 * Migration needs the backend: its state comes through
 * SET_DEVICE_STATE_FD (VHOST_USER_PROTOCOL_F_DEVICE_STATE), and what it
 * writes into guest memory while RAM is copied must reach the dirty log
 * (VHOST_F_LOG_ALL, with the log shared through LOG_SHMFD). vhost and
 * vhost-user block migration without the last two already, but in words
 * that name neither the device nor the remedy; an older vstellard lacks
 * all three. Without a backend there is no state to send at all.
 * Called at every connection and disconnection; the newest blocker is the
 * one `migrate` reports, so this message is the one users see.
 * Returns -1 with @errp set only if the device must not run this way
 * (--only-migratable); a migration already running cannot take a new
 * blocker, and then the device's save fails with the same reason instead.
 */
static int vu_vstellar_update_blocker(VHostUserVstellar *s, Error **errp)
{
    struct vhost_dev *hdev = &s->vhost_dev;
    const char *chr = s->chardev.chr ? s->chardev.chr->label : "?";
    g_autoptr(GString) lacks = g_string_new(NULL);
    Error *local_err = NULL;
    int ret;

    vu_vstellar_del_blocker(s);
    if (!s->connected) {
        error_setg(&s->migration_blocker, "vhost-user-vstellar (chardev "
                   "'%s'): cannot migrate while no backend (vstellard) is "
                   "connected: the device's state is in the backend", chr);
    } else {
        if (!(hdev->features & (1ULL << VHOST_F_LOG_ALL))) {
            g_string_append(lacks, ", VHOST_F_LOG_ALL (dirty logging)");
        }
        if (!hdev->vhost_ops->vhost_requires_shm_log ||
            !hdev->vhost_ops->vhost_requires_shm_log(hdev)) {
            g_string_append(lacks, ", VHOST_USER_PROTOCOL_F_LOG_SHMFD");
        }
        if (!vhost_user_has_device_state(hdev)) {
            g_string_append(lacks, ", VHOST_USER_PROTOCOL_F_DEVICE_STATE "
                            "(device state transfer)");
        }
        if (lacks->len) {
            error_setg(&s->migration_blocker, "vhost-user-vstellar (chardev "
                       "'%s'): cannot migrate: its backend (vstellard) "
                       "lacks %s; run a vstellard that supports live "
                       "migration", chr, lacks->str + 2);
        }
    }
    if (!s->migration_blocker) {
        return 0;
    }
    ret = migrate_add_blocker(s->migration_blocker, &local_err);
    if (ret == 0) {
        return 0;
    }
    error_free(s->migration_blocker);
    s->migration_blocker = NULL;
    if (ret == -EBUSY) {
        warn_report_err(local_err);
        return 0;
    }
    error_propagate(errp, local_err);
    return -1;
}

/* Wait until @fd can be read (@events POLLIN) or written (POLLOUT). */
static int vu_vstellar_state_poll(int fd, short events, int64_t deadline_ms,
                                  Error **errp)
{
    struct pollfd pfd = { .fd = fd, .events = events };
    int64_t left;
    int ret;

    for (;;) {
        left = deadline_ms - qemu_clock_get_ms(QEMU_CLOCK_REALTIME);
        if (left <= 0) {
            error_setg(errp, "the backend did not finish the state "
                       "transfer within %d s",
                       VSTELLAR_STATE_TIMEOUT_MS / 1000);
            return -ETIMEDOUT;
        }
        ret = poll(&pfd, 1, MIN(left, INT_MAX));
        if (ret > 0) {
            return 0;
        }
        if (ret < 0 && errno != EINTR) {
            error_setg_errno(errp, errno, "poll on the state pipe");
            return -errno;
        }
    }
}

/*
 * Source: the backend's state into the stream, as upstream QEMU's
 * vhost_save_backend_state() writes it: chunks of (be32 length, bytes),
 * then a chunk of length 0.
 *
 * When this runs, the VM is stopped and so are the backend's rings: in
 * QEMU 7.2's migration_completion() the migration thread, holding the
 * BQL, calls vm_stop_force_state(RUN_STATE_FINISH_MIGRATE) (the vmstate
 * change handler virtio_vmstate_change() -> set_status() ->
 * vu_vstellar_stop() -> vhost_dev_stop(): GET_VRING_BASE on every ring,
 * the last dirty log sync) and only then
 * qemu_savevm_state_complete_precopy(), which saves RAM's last dirty
 * pages and then the devices' vmstate, ours included. The backend, its
 * rings stopped, has written its last byte into guest memory.
 * If anything fails the migration fails, and migration_iteration_finish()
 * restarts the VM (vm_start() -> vhost_dev_start()): the backend kept its
 * state and runs on.
 */
static int vu_vstellar_save_backend_state(VHostUserVstellar *s, QEMUFile *f,
                                          Error **errp)
{
    struct vhost_dev *hdev = &s->vhost_dev;
    g_autofree uint8_t *buf = NULL;
    int64_t deadline;
    uint64_t total = 0;
    int fds[2], read_fd, reply_fd = -1;
    ssize_t n;
    int ret;

    if (!s->connected) {
        error_setg(errp, "no backend (vstellard) is connected");
        return -ENOTCONN;
    }
    if (!vhost_user_has_device_state(hdev)) {
        error_setg(errp, "the backend (vstellard) cannot save its state: it "
                   "lacks VHOST_USER_PROTOCOL_F_DEVICE_STATE");
        return -ENOTSUP;
    }
    if (s->started_vu || vhost_dev_is_started(hdev)) {
        /* Cannot happen (see above); a running device has no fixed state */
        error_setg(errp, "the device's rings are still running");
        return -EBUSY;
    }

    if (!g_unix_open_pipe(fds, FD_CLOEXEC, NULL)) {
        error_setg_errno(errp, errno, "cannot make the state pipe");
        return -errno;
    }
    ret = vhost_user_set_device_state_fd(hdev,
                                         VHOST_TRANSFER_STATE_DIRECTION_SAVE,
                                         VHOST_TRANSFER_STATE_PHASE_STOPPED,
                                         fds[1], &reply_fd, errp);
    /* Ours closed, the backend's end is the only writer: its close is EOF */
    close(fds[1]);
    if (ret < 0) {
        close(fds[0]);
        return ret;
    }
    read_fd = fds[0];
    if (reply_fd >= 0) {
        close(read_fd);
        read_fd = reply_fd;
    }
    if (!g_unix_set_fd_nonblocking(read_fd, true, NULL)) {
        error_setg_errno(errp, errno, "cannot set up the state pipe");
        ret = -errno;
        goto out;
    }

    buf = g_malloc(VSTELLAR_STATE_CHUNK);
    deadline = qemu_clock_get_ms(QEMU_CLOCK_REALTIME) +
               VSTELLAR_STATE_TIMEOUT_MS;
    for (;;) {
        n = read(read_fd, buf, VSTELLAR_STATE_CHUNK);
        if (n == 0) {
            break;
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno != EAGAIN) {
                error_setg_errno(errp, errno, "reading the backend's state");
                ret = -errno;
                goto out;
            }
            ret = vu_vstellar_state_poll(read_fd, POLLIN, deadline, errp);
            if (ret < 0) {
                goto out;
            }
            continue;
        }
        total += n;
        if (total > VSTELLAR_STATE_MAX) {
            error_setg(errp, "the backend's state is larger than %d MiB",
                       (int)(VSTELLAR_STATE_MAX / MiB));
            ret = -EFBIG;
            goto out;
        }
        qemu_put_be32(f, n);
        qemu_put_buffer(f, buf, n);
    }
    qemu_put_be32(f, 0);
    close(read_fd);
    read_fd = -1;

    /* Whether the backend wrote all of it (EOF alone does not say) */
    ret = vhost_user_check_device_state(hdev, errp);
    if (ret == 0) {
        ret = qemu_file_get_error(f);
        if (ret < 0) {
            error_setg_errno(errp, -ret, "writing the migration stream");
        }
    }
out:
    if (read_fd >= 0) {
        close(read_fd);
    }
    return ret;
}

/*
 * Destination: the state from the stream into the backend.
 * This QEMU runs with -incoming: realize connected the backend (vhost
 * session set up, config read, no memory table yet: the backend needs no
 * guest memory to load), the system reset at startup sent RESET_DEVICE,
 * and the VM has not run. The rings start at vm_start() after the
 * migration (set_status() -> vu_vstellar_start()), here with the vring
 * bases VMSTATE_VIRTIO_DEVICE loaded.
 */
static int vu_vstellar_load_backend_state(VHostUserVstellar *s, QEMUFile *f,
                                          Error **errp)
{
    struct vhost_dev *hdev = &s->vhost_dev;
    g_autofree uint8_t *buf = NULL;
    int64_t deadline;
    uint64_t total = 0;
    int fds[2], write_fd, reply_fd = -1;
    uint32_t len, piece, done;
    ssize_t n;
    int ret;

    if (!s->connected) {
        error_setg(errp, "no backend (vstellard) is connected here");
        return -ENOTCONN;
    }
    if (!vhost_user_has_device_state(hdev)) {
        error_setg(errp, "the backend (vstellard) here cannot load a "
                   "device's state: it lacks "
                   "VHOST_USER_PROTOCOL_F_DEVICE_STATE");
        return -ENOTSUP;
    }
    if (s->started_vu || vhost_dev_is_started(hdev)) {
        error_setg(errp, "the device's rings are already running here");
        return -EBUSY;
    }

    if (!g_unix_open_pipe(fds, FD_CLOEXEC, NULL)) {
        error_setg_errno(errp, errno, "cannot make the state pipe");
        return -errno;
    }
    ret = vhost_user_set_device_state_fd(hdev,
                                         VHOST_TRANSFER_STATE_DIRECTION_LOAD,
                                         VHOST_TRANSFER_STATE_PHASE_STOPPED,
                                         fds[0], &reply_fd, errp);
    close(fds[0]);
    if (ret < 0) {
        close(fds[1]);
        return ret;
    }
    write_fd = fds[1];
    if (reply_fd >= 0) {
        close(write_fd);
        write_fd = reply_fd;
    }
    if (!g_unix_set_fd_nonblocking(write_fd, true, NULL)) {
        error_setg_errno(errp, errno, "cannot set up the state pipe");
        ret = -errno;
        goto out;
    }

    buf = g_malloc(VSTELLAR_STATE_CHUNK);
    deadline = qemu_clock_get_ms(QEMU_CLOCK_REALTIME) +
               VSTELLAR_STATE_TIMEOUT_MS;
    for (;;) {
        len = qemu_get_be32(f);
        ret = qemu_file_get_error(f);
        if (ret < 0) {
            error_setg_errno(errp, -ret, "reading the migration stream");
            goto out;
        }
        if (len == 0) {
            break;
        }
        total += len;
        if (total > VSTELLAR_STATE_MAX) {
            error_setg(errp, "the backend's state in the stream is larger "
                       "than %d MiB", (int)(VSTELLAR_STATE_MAX / MiB));
            ret = -EFBIG;
            goto out;
        }
        while (len) {
            piece = MIN(len, VSTELLAR_STATE_CHUNK);
            if (qemu_get_buffer(f, buf, piece) != piece) {
                ret = qemu_file_get_error(f) ?: -EIO;
                error_setg_errno(errp, -ret, "reading the migration stream");
                goto out;
            }
            len -= piece;
            for (done = 0; done < piece; done += n) {
                n = write(write_fd, buf + done, piece - done);
                if (n >= 0) {
                    continue;
                }
                n = 0;
                if (errno == EINTR) {
                    continue;
                }
                if (errno != EAGAIN) {
                    /* EPIPE: the backend stopped reading (refused it) */
                    error_setg_errno(errp, errno, "sending the state to the "
                                     "backend (see vstellard's log)");
                    ret = -errno;
                    goto out;
                }
                ret = vu_vstellar_state_poll(write_fd, POLLOUT, deadline,
                                             errp);
                if (ret < 0) {
                    goto out;
                }
            }
        }
    }
    /* EOF for the backend, which then checks and takes the state */
    close(write_fd);
    write_fd = -1;

    ret = vhost_user_check_device_state(hdev, errp);
    if (ret < 0) {
        error_append_hint(errp, "vstellard's log says why\n");
        goto out;
    }

    /*
     * The config the driver sees may follow the loaded state (the node
     * GUID comes with it): read it again. epoch and lost came from the
     * source in the stream before this field, and patch_config keeps
     * them: the state moved, it was not lost, so the driver must not see
     * a new backend.
     */
    ret = vu_vstellar_fetch_config(s, errp);
out:
    if (write_fd >= 0) {
        close(write_fd);
    }
    return ret;
}

static int vu_vstellar_put_backend(QEMUFile *f, void *pv, size_t size,
                                   const VMStateField *field,
                                   JSONWriter *vmdesc)
{
    Error *local_err = NULL;
    int ret;

    ret = vu_vstellar_save_backend_state(pv, f, &local_err);
    if (ret < 0) {
        error_prepend(&local_err, "vhost-user-vstellar: migration: saving "
                      "the backend's state: ");
        error_report_err(local_err);
    }
    return ret;
}

static int vu_vstellar_get_backend(QEMUFile *f, void *pv, size_t size,
                                   const VMStateField *field)
{
    Error *local_err = NULL;
    int ret;

    ret = vu_vstellar_load_backend_state(pv, f, &local_err);
    if (ret < 0) {
        error_prepend(&local_err, "vhost-user-vstellar: migration: loading "
                      "the backend's state: ");
        error_report_err(local_err);
    }
    return ret;
}

static const VMStateInfo vu_vstellar_backend_info = {
    .name = "vstellard-state",
    .get = vu_vstellar_get_backend,
    .put = vu_vstellar_put_backend,
};

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
    vu_vstellar_del_blocker(s);
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
    if (ret == 0) {
        ret = vu_vstellar_update_blocker(s, errp);
    }
    if (ret < 0) {
        s->connected = false;
        vu_vstellar_del_blocker(s);
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
    /* Cannot fail: only --only-migratable refuses, and it ignores this */
    vu_vstellar_update_blocker(s, NULL);

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
    /*
     * Not registered as migratable RAM: the region goes whole in the
     * device's own section, in the stop-and-copy phase (vu_vstellar_vmstate),
     * after the guest's last store, whatever dirty tracking did. (As RAM,
     * under TCG, the destination got producer indices older than the WQEs
     * vstellard had taken: 7.2's bitmap sync did not re-arm TCG's dirty
     * traps, patches/0002-tcg-migration-dirty-tlb.patch.)
     * 256 KiB by default.
     */
    s->db_ptr = memory_region_get_ram_ptr(&s->db_mr);
    s->db_size = size;
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
    vmstate_unregister_ram(&s->db_mr, DEVICE(s));
    do_vhost_user_cleanup(vdev, s);
}

static struct vhost_dev *vu_vstellar_get_vhost(VirtIODevice *vdev)
{
    VHostUserVstellar *s = VHOST_USER_VSTELLAR(vdev);

    return &s->vhost_dev;
}

/*
 * The stream (docs/virtio-vstellar.md, "Live migration (frontend)"): the
 * properties both sides must agree on, the virtio state (status,
 * features, queues with their last_avail_idx from GET_VRING_BASE, the PCI
 * transport's config and MSI-X), what this frontend adds to the config
 * space the guest sees, the doorbell region (the driver's and providers'
 * doorbell records, the backend's alive and need_kick words: written
 * while the VM is stopped, so after the last of the guest's stores), then
 * vstellard's state.
 */
static const VMStateDescription vu_vstellar_vmstate = {
    .name = "vhost-user-vstellar",
    .version_id = 2,
    .minimum_version_id = 2,
    .fields = (VMStateField[]) {
        VMSTATE_UINT32_EQUAL(cq_queues, VHostUserVstellar,
                             "vhost-user-vstellar: cq-queues differs between "
                             "the source and the destination"),
        VMSTATE_UINT32_EQUAL(doorbell_pages, VHostUserVstellar,
                             "vhost-user-vstellar: doorbell-pages differs "
                             "between the source and the destination"),
        VMSTATE_VIRTIO_DEVICE,
        VMSTATE_UINT32(epoch, VHostUserVstellar),
        VMSTATE_BOOL(lost, VHostUserVstellar),
        VMSTATE_VBUFFER_UINT32(db_ptr, VHostUserVstellar, 2, NULL, db_size),
        {
            .name = "backend",
            .info = &vu_vstellar_backend_info,
            .flags = VMS_SINGLE,
        },
        VMSTATE_END_OF_LIST()
    },
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
    vdc->reset = vu_vstellar_reset;
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
