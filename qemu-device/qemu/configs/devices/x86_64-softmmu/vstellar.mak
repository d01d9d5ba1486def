# QEMU device set for vStellar guests (configure --with-devices-x86_64=vstellar
# together with --without-default-devices): a PC machine, virtio over PCI,
# virtio-net for the test network and the baseline rxe, virtio-blk and
# virtio-rng for users' own VMs, and our RNIC.
# Everything else QEMU can emulate stays out, to keep the build small.
CONFIG_I440FX=y
CONFIG_VIRTIO_PCI=y
CONFIG_VIRTIO_NET=y
CONFIG_VIRTIO_SERIAL=y
# Disks and entropy for users' own VMs (the vstellar-qemu package)
CONFIG_VIRTIO_BLK=y
CONFIG_VIRTIO_RNG=y
# The vStellar RNIC frontend (qemu-device/qemu/hw/virtio/vhost-user-vstellar*.c)
CONFIG_VHOST_USER_VSTELLAR=y
# The emulated accelerator with device memory (qemu-device/qemu/hw/misc/vstellar-accel.c)
CONFIG_VSTELLAR_ACCEL=y
