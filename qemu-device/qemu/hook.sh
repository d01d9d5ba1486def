#!/bin/sh
# Run by tools/build-qemu.sh in the unpacked QEMU source, after our files
# were copied over it: wire them into QEMU's build without editing QEMU's
# own files by hand. (tools/build-qemu.sh copies the repository's
# include/vstellar/ into the tree first, and keys the build by it.)
set -eu

# Our few changes to QEMU's own files, as patches (patches/*.patch, in
# order). Each is applied once and skipped when it already is (the tree
# may be reused); one that does not apply stops the build, and is tried
# first (--dry-run) so that it leaves no file half-patched.
# tools/build-qemu.sh keys the tree by patches/: a changed patch makes a
# fresh tree.
for p in patches/*.patch; do
	[ -e "$p" ] || continue
	if patch -p1 --dry-run --reverse --force --silent < "$p" > /dev/null 2>&1; then
		continue
	fi
	if ! patch -p1 --dry-run --forward --batch --silent < "$p" > /dev/null 2>&1; then
		echo "hook.sh: $p does not apply to this QEMU:" >&2
		patch -p1 --dry-run --forward --batch < "$p" >&2 || true
		exit 1
	fi
	patch -p1 --forward --batch --silent --no-backup-if-mismatch < "$p"
done

# Kconfig symbol and meson sources, appended once (the tree may be reused).
if ! grep -q '^config VHOST_USER_VSTELLAR$' hw/virtio/Kconfig; then
	cat >> hw/virtio/Kconfig <<'KCONFIG'

config VHOST_USER_VSTELLAR
    bool
    default y
    depends on VIRTIO && VHOST_USER
KCONFIG
fi
# Inserted before virtio_ss is frozen (add_all) at the end of the file.
if ! grep -q 'vhost-user-vstellar.c' hw/virtio/meson.build; then
	anchor="virtio_ss.add_all(when: 'CONFIG_VIRTIO_PCI', if_true: virtio_pci_ss)"
	grep -qF "$anchor" hw/virtio/meson.build ||
		{ echo "hook.sh: hw/virtio/meson.build changed; cannot add our files" >&2; exit 1; }
	awk -v anchor="$anchor" '
		$0 == anchor {
			print "# vStellar (added by qemu-device/qemu/hook.sh)"
			print "virtio_ss.add(when: \x27CONFIG_VHOST_USER_VSTELLAR\x27, if_true: files(\x27vhost-user-vstellar.c\x27))"
			print "virtio_ss.add(when: [\x27CONFIG_VIRTIO_PCI\x27, \x27CONFIG_VHOST_USER_VSTELLAR\x27], if_true: files(\x27vhost-user-vstellar-pci.c\x27))"
			print ""
		}
		{ print }' hw/virtio/meson.build > hw/virtio/meson.build.new
	mv hw/virtio/meson.build.new hw/virtio/meson.build
fi

# The emulated accelerator (hw/misc/vstellar-accel.c): hw/misc's
# softmmu_ss is not frozen in its own meson.build, so appending is enough.
if ! grep -q '^config VSTELLAR_ACCEL$' hw/misc/Kconfig; then
	cat >> hw/misc/Kconfig <<'KCONFIG'

config VSTELLAR_ACCEL
    bool
    default y
    depends on PCI
KCONFIG
fi
if ! grep -q 'vstellar-accel.c' hw/misc/meson.build; then
	cat >> hw/misc/meson.build <<'MESON'

# vStellar (added by qemu-device/qemu/hook.sh)
softmmu_ss.add(when: 'CONFIG_VSTELLAR_ACCEL', if_true: files('vstellar-accel.c'))
MESON
fi
