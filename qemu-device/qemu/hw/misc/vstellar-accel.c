/*
 * vstellar-accel: an emulated accelerator that has device memory and
 * nothing else (no registers, no compute), so that RDMA into "GPU memory"
 * (dmabuf MRs) can be tested without a GPU.
 *
 * The memory is a host memory backend exposed as a 64-bit prefetchable
 * BAR, like ivshmem-plain. It must be shared and have an fd (a
 * memory-backend-memfd with share=on): vhost-user backends (vstellard)
 * see only RAM regions that have an fd in their memory table, and the
 * RNIC has to reach this memory as it reaches guest RAM.
 *
 * The interface is include/vstellar/vstellar-accel-abi.h.
 *
 * SPDX-License-Identifier: GPL-2.0-or-later
 */

#include "qemu/osdep.h"
#include "qemu/host-utils.h"
#include "qapi/error.h"
#include "hw/pci/pci.h"
#include "hw/qdev-properties.h"
#include "migration/vmstate.h"
#include "sysemu/hostmem.h"
#include "qom/object.h"
#include "vstellar/vstellar-accel-abi.h"

#define TYPE_VSTELLAR_ACCEL "vstellar-accel"
OBJECT_DECLARE_SIMPLE_TYPE(VstellarAccelState, VSTELLAR_ACCEL)

struct VstellarAccelState {
    PCIDevice parent_obj;
    HostMemoryBackend *hostmem;
    MemoryRegion *mem;
};

static void vstellar_accel_realize(PCIDevice *dev, Error **errp)
{
    VstellarAccelState *s = VSTELLAR_ACCEL(dev);
    const char *name;
    uint64_t size;

    if (!s->hostmem) {
        error_setg(errp, "vstellar-accel: 'memdev' is required, e.g. "
                   "-object memory-backend-memfd,id=ID,size=64M,share=on "
                   "-device vstellar-accel,memdev=ID");
        return;
    }
    name = object_get_canonical_path_component(OBJECT(s->hostmem));
    if (host_memory_backend_is_mapped(s->hostmem)) {
        error_setg(errp, "vstellar-accel: memdev '%s' is already in use",
                   name);
        return;
    }
    s->mem = host_memory_backend_get_memory(s->hostmem);
    /* Without an fd, vhost-user cannot pass the memory to the backend. */
    if (!s->hostmem->share || memory_region_get_fd(s->mem) < 0) {
        error_setg(errp, "vstellar-accel: memdev '%s' must be shared and "
                   "fd-backed (memory-backend-memfd with share=on) so that "
                   "vhost-user backends can map it", name);
        return;
    }
    size = memory_region_size(s->mem);
    if (!is_power_of_2(size)) {
        error_setg(errp, "vstellar-accel: memdev '%s' size 0x%" PRIx64
                   " is not a power of two (a BAR's size must be)",
                   name, size);
        return;
    }

    pci_config_set_interrupt_pin(dev->config, 0);
    host_memory_backend_set_mapped(s->hostmem, true);
    /* Backend RAM is migrated only if someone registers it, as ivshmem does */
    vmstate_register_ram(s->mem, DEVICE(s));
    pci_register_bar(dev, VSTELLAR_ACCEL_MEM_BAR,
                     PCI_BASE_ADDRESS_SPACE_MEMORY |
                     PCI_BASE_ADDRESS_MEM_PREFETCH |
                     PCI_BASE_ADDRESS_MEM_TYPE_64,
                     s->mem);
}

static void vstellar_accel_exit(PCIDevice *dev)
{
    VstellarAccelState *s = VSTELLAR_ACCEL(dev);

    vmstate_unregister_ram(s->mem, DEVICE(s));
    host_memory_backend_set_mapped(s->hostmem, false);
}

/*
 * The device has no state of its own: the config space is migrated by the
 * PCI core fields below and the memory as RAM (vmstate_register_ram).
 */
static const VMStateDescription vstellar_accel_vmsd = {
    .name = TYPE_VSTELLAR_ACCEL,
    .version_id = 1,
    .minimum_version_id = 1,
    .fields = (VMStateField[]) {
        VMSTATE_PCI_DEVICE(parent_obj, VstellarAccelState),
        VMSTATE_END_OF_LIST()
    },
};

static Property vstellar_accel_properties[] = {
    DEFINE_PROP_LINK("memdev", VstellarAccelState, hostmem,
                     TYPE_MEMORY_BACKEND, HostMemoryBackend *),
    DEFINE_PROP_END_OF_LIST(),
};

static void vstellar_accel_class_init(ObjectClass *klass, void *data)
{
    DeviceClass *dc = DEVICE_CLASS(klass);
    PCIDeviceClass *k = PCI_DEVICE_CLASS(klass);

    k->realize = vstellar_accel_realize;
    k->exit = vstellar_accel_exit;
    k->vendor_id = VSTELLAR_ACCEL_PCI_VENDOR_ID;
    k->device_id = VSTELLAR_ACCEL_PCI_DEVICE_ID;
    k->revision = 1;
    k->class_id = PCI_CLASS_PROCESSOR_CO;
    dc->desc = "vStellar emulated accelerator (device memory only)";
    dc->vmsd = &vstellar_accel_vmsd;
    device_class_set_props(dc, vstellar_accel_properties);
    set_bit(DEVICE_CATEGORY_MISC, dc->categories);
}

static const TypeInfo vstellar_accel_info = {
    .name          = TYPE_VSTELLAR_ACCEL,
    .parent        = TYPE_PCI_DEVICE,
    .instance_size = sizeof(VstellarAccelState),
    .class_init    = vstellar_accel_class_init,
    .interfaces = (InterfaceInfo[]) {
        { INTERFACE_CONVENTIONAL_PCI_DEVICE },
        { },
    },
};

static void vstellar_accel_register_types(void)
{
    type_register_static(&vstellar_accel_info);
}

type_init(vstellar_accel_register_types)
