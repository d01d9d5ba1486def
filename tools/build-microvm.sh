#!/usr/bin/env bash
# A secure container's boot image: our guest kernel and initramfs (its
# modules, vstellar.ko, /init) with the container image's root filesystem
# appended as /rootfs (Linux unpacks concatenated cpio archives in turn), so
# that /init runs the command chrooted into the image (tools/guest/init).
#
# Usage: build-microvm.sh GUEST_IMAGE_DIR CONTAINER_IMAGE_DIR
# Cached in $VSTELLAR_CACHE/microvm-<key>; prints that directory (vmlinuz,
# initrd.cpio, cmd: the image's default command).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

guest=${1:?usage: build-microvm.sh GUEST_IMAGE_DIR CONTAINER_IMAGE_DIR}
image=${2:?usage: build-microvm.sh GUEST_IMAGE_DIR CONTAINER_IMAGE_DIR}
[[ -f $guest/initrd.cpio && -f $guest/vmlinuz ]] || die "$guest is not a guest image (run: make guest)"
[[ -f $image/rootfs.tar ]] || die "$image has no rootfs.tar (tools/build-container-image.sh makes one)"

# The guest image and container image directories are named by their keys.
cache_begin microvm . "${guest##*/}" "${image##*/}" "$image/rootfs.tar"
out=$CACHE_ENTRY
mkdir -p "$out/tree/rootfs"
tar -C "$out/tree/rootfs" -xf "$image/rootfs.tar"
{
	cat "$guest/initrd.cpio"
	(cd "$out/tree" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet)
} > "$out/initrd.cpio"
cp "$guest/vmlinuz" "$out/vmlinuz"
cp "$image/cmd" "$out/cmd"
rm -rf "$out/tree"
cache_commit
