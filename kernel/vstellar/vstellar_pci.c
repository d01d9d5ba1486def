// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar: what the driver needs from the virtio-PCI function under the
 * virtio device. The virtio core hides the transport, but two things are
 * PCI's: the device that does DMA, and the address of the kick page, which
 * user contexts and the kernel map to notify the device without a
 * syscall. Nothing else in the driver looks below the virtio device.
 */
#include <linux/pci.h>
#include <linux/virtio.h>
#include <linux/virtio_pci.h>

#include "vstellar.h"

/* The device that maps memory for the device: the PCI function. */
struct device *vstellar_dma_device(struct virtio_device *vdev)
{
	return vdev->dev.parent;
}

/*
 * The kick page: the kick queue's notify address. The device runs with
 * page-per-vq, so it sits alone in its page; QEMU places queue i's notify
 * address at notify_off_multiplier * i in the notify capability's window.
 * Returns 0 when there is no such page (not PCI, or not page sized).
 */
u64 vstellar_find_kick_page(struct virtio_device *vdev)
{
	struct device *parent = vdev->dev.parent;
	struct pci_dev *pdev;
	u32 offset, mult;
	u8 type, bar;
	u64 addr;
	int pos;

	if (!dev_is_pci(parent))
		return 0;
	pdev = to_pci_dev(parent);
	for (pos = pci_find_capability(pdev, PCI_CAP_ID_VNDR); pos;
	     pos = pci_find_next_capability(pdev, pos, PCI_CAP_ID_VNDR)) {
		pci_read_config_byte(pdev, pos +
				     offsetof(struct virtio_pci_cap, cfg_type),
				     &type);
		if (type != VIRTIO_PCI_CAP_NOTIFY_CFG)
			continue;
		pci_read_config_byte(pdev, pos +
				     offsetof(struct virtio_pci_cap, bar), &bar);
		pci_read_config_dword(pdev, pos +
				      offsetof(struct virtio_pci_cap, offset),
				      &offset);
		pci_read_config_dword(pdev, pos +
				      offsetof(struct virtio_pci_notify_cap,
					       notify_off_multiplier), &mult);
		if (bar > PCI_STD_RESOURCE_END || mult < PAGE_SIZE)
			return 0;
		addr = pci_resource_start(pdev, bar) + offset +
		       (u64)mult * VSTELLAR_VQ_KICK;
		if (!PAGE_ALIGNED(addr) ||
		    addr + PAGE_SIZE > pci_resource_end(pdev, bar) + 1)
			return 0;
		return addr;
	}
	return 0;
}
