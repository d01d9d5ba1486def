#!/usr/bin/env bash
# A stock Debian guest: a root file system from Debian's archive (mmdebstrap,
# tools/build-debian-root.sh) with our packages installed by dpkg, DKMS
# building vstellar.ko here for the guest's kernel, not under emulation.
#
#   tools/build-stock-guest.sh SUITE DEBDIR    SUITE: bookworm or trixie
#   tools/build-stock-guest.sh --root-only SUITE
#
#   bookworm: Debian 12, kernel $GUEST_KERNEL_ABI (6.1), rdma-core 44,
#             perftest; vstellar-provider-rdma44
#   trixie:   Debian 13, kernel 6.12, rdma-core 56.1, perftest;
#             vstellar-provider-rdma56
#
# The result, cached in $VSTELLAR_CACHE/stock-SUITE-<key> (keyed by the
# root, the .debs, tools/guest/init and this script), is an image directory
# for the launcher (tools/python/vstellar/guest.py): vmlinuz and initrd.cpio (Debian's kernel and
# initramfs), root.img (ext4, booted read-only from virtio-blk) and cmdline
# (root=/dev/vda, init= the test guests' /init, which runs the launcher's
# command and powers off: no systemd under TCG). Prints the directory; with
# --root-only, builds and prints just the Debian root.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

root_only=
[[ ${1:-} == --root-only ]] && { root_only=1; shift; }
suite=${1:?usage: build-stock-guest.sh [--root-only] SUITE [DEBDIR]}
common=dkms,gcc,make,rdma-core,ibverbs-utils,rdmacm-utils,perftest,iproute2,kmod,mount
case $suite in
bookworm)
	packages=linux-image-$GUEST_KERNEL_ABI,linux-headers-$GUEST_KERNEL_ABI,$common
	provider=vstellar-provider-rdma44 ;;
trixie)
	packages=linux-image-amd64,linux-headers-amd64,$common
	provider=vstellar-provider-rdma56 ;;
*) die "unknown suite $suite (bookworm or trixie)" ;;
esac
root=$("$VSTELLAR_TOP/tools/build-debian-root.sh" "stock-$suite" "$suite" "$packages")
if [[ -n $root_only ]]; then
	echo "$root"
	exit 0
fi
debdir=${2:?usage: build-stock-guest.sh SUITE DEBDIR}
debs=("$debdir"/vstellar-dkms_*_all.deb "$debdir"/"$provider"_*_amd64.deb)
for d in "${debs[@]}"; do [[ -f $d ]] || die "no $d: run make deb"; done
init=$VSTELLAR_TOP/tools/guest/init
# The root entry's name carries its key (hashing 700 MB each time would not).
cache_begin "stock-$suite" . "stock-root:$(basename "$(dirname "$root")")" "${debs[@]}" "$init"
out=$CACHE_ENTRY

start=$SECONDS
tree=$out/tree
log "copying the $suite root"
cp -a "$root" "$tree"
kver=$(basename "$(ls -d "$tree"/lib/modules/*/ | tail -1)")
# in_root CMD...: run CMD in the tree with /proc, /sys and /dev (DKMS needs
# them), mounted in a mount namespace of its own so nothing outlives it.
in_root() {
	unshare --mount --propagation private sh -c '
		t=$1; shift
		mount -t proc proc "$t/proc" && mount -t sysfs sysfs "$t/sys" &&
		mount --rbind /dev "$t/dev" && exec chroot "$t" "$@"' in_root "$tree" "$@"
}
cp "${debs[@]}" "$tree/tmp/"
log "installing ${debs[*]##*/} (DKMS builds vstellar.ko for $kver)"
in_root sh -c 'dpkg -i /tmp/*.deb' > "$out/dpkg.log" 2>&1 ||
	die "dpkg -i failed; see $out/dpkg.log"
version=$(dpkg-deb -f "${debs[0]}" Version)
# The postinst builds for the kernels it finds; make sure of the guest's.
if ! in_root dkms status -m vstellar -v "$version" -k "$kver" | grep -q installed; then
	in_root dkms install -m vstellar -v "$version" -k "$kver" >> "$out/dpkg.log" 2>&1 ||
		die "dkms install failed; see $out/dpkg.log"
fi
[[ -n $(find "$tree/lib/modules/$kver" -name 'vstellar.ko*') ]] ||
	die "no vstellar.ko for $kver in the image; see $out/dpkg.log"
rm -f "$tree"/tmp/*.deb

install -D -m755 "$init" "$tree/usr/lib/vstellar/init"
cp "$tree/boot/vmlinuz-$kver" "$out/vmlinuz"
cp "$tree/boot/initrd.img-$kver" "$out/initrd.cpio"
# eth0 keeps its name (the initramfs's udev would rename it).
echo "root=/dev/vda ro net.ifnames=0 init=/usr/lib/vstellar/init" > "$out/cmdline"
rm -rf "$tree"/var/cache/apt/archives/*.deb "$tree"/var/lib/apt/lists/*
size=$(( $(du -sm "$tree" | cut -f1) * 12 / 10 + 64 ))
log "root.img: ext4, ${size} MiB"
mke2fs -q -t ext4 -L vstroot -d "$tree" "$out/root.img" "${size}M" >&2 ||
	die "mke2fs -d failed"
rm -rf "$tree"
log "$suite guest ($kver) made in $((SECONDS - start)) s"
cache_commit 2
