#!/usr/bin/env bash
# Build QEMU 7.2 from Debian bookworm's source package with vStellar's own
# files (qemu-device/qemu/) laid over it, for x86_64-softmmu with only the
# devices we need.
#
# Two cache levels, because our files change often and QEMU's never do:
#  - $VSTELLAR_CACHE/qemutree-<base>: the unpacked, configured QEMU tree and
#    its build directory, keyed by what makes a cold build (source version,
#    configure flags, hook.sh and the patches it applies, this script). It
#    is reused: a change to our device files or to include/vstellar/
#    rebuilds only what includes them (about a minute instead of five on 2
#    cores).
#  - $VSTELLAR_CACHE/qemu-<key>: the finished binary and its firmware
#    directory, keyed by every input, so a result never changes under a
#    recorded build/guest.env.
#
# Prints the path of the qemu-system-x86_64 binary on stdout.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

overlay=$VSTELLAR_TOP/qemu-device/qemu
configure_flags=(
	--target-list=x86_64-softmmu
	--without-default-features --without-default-devices
	--with-devices-x86_64=vstellar
	--enable-tcg --enable-kvm --enable-vhost-user --enable-fdt=system
	--disable-docs --disable-install-blobs --disable-werror
)
# The device-interface header is shared with the driver, provider and
# vstellard; QEMU's copy comes from include/vstellar, so it keys the build.
abi_headers=$VSTELLAR_TOP/include/vstellar
cache_begin qemu build/qemu-system-x86_64 "$QEMU_SRC_VERSION" "${configure_flags[*]}" \
	"$overlay" "$abi_headers"
out=$CACHE_ENTRY
bin=$out/build/qemu-system-x86_64
# hook.sh runs once per tree and applies patches/: both key it.
tree=$VSTELLAR_CACHE/qemutree-$(key_of "$QEMU_SRC_VERSION" "${configure_flags[*]}" "$overlay/hook.sh" \
	"$overlay/patches" "$0")

# The shared tree: one build at a time (fd 8; cache_begin holds fd 9).
exec 8> "$tree.lock"
flock 8
start=$SECONDS
if [[ ! -e $tree/.configured ]]; then
	fetch_source qemu "$QEMU_SRC_VERSION"
	dsc=$(ls "$VSTELLAR_CACHE"/src/qemu_"${QEMU_SRC_VERSION#*:}".dsc)
	# Built in place (meson records absolute paths).
	rm -rf "$tree" && mkdir -p "$tree"
	log "unpacking $dsc (Debian's patches applied) into $tree"
	# apt-get checked the tarballs against the signed index when it fetched them.
	dpkg-source -q --no-check -x "$dsc" "$tree/src" >/dev/null

	# The dfsg tarball has no edk2 firmware blobs to unpack; QEMU would try
	# whenever bzip2 is installed. We boot with SeaBIOS, so never unpack them.
	sed -i 's/^\( *unpack_edk2_blobs = \)bzip2.found()/\1false/' "$tree/src/meson.build"
	grep -q 'unpack_edk2_blobs = false$' "$tree/src/meson.build" ||
		die "could not turn off unpack_edk2_blobs in QEMU's meson.build"
	cp -a "$overlay/." "$tree/src/"
	(cd "$tree/src" && ./hook.sh) || die "qemu-device/qemu/hook.sh failed"

	mkdir -p "$tree/build"
	log "configuring: ${configure_flags[*]}"
	(cd "$tree/build" && ../src/configure "${configure_flags[@]}" > configure.log 2>&1) ||
		die "QEMU configure failed; see $tree/build/configure.log"
	touch "$tree/.configured"
	log "building (2 jobs; about 5 minutes cold)"
else
	log "rebuilding what our files touch in $tree"
fi

# Our files over QEMU's: copy only those whose bytes differ, so that ninja
# sees new mtimes just there and rebuilds only what depends on them.
sync_into() {
	local from=$1 to=$2 f
	while IFS= read -r -d '' f; do
		cmp -s "$from/$f" "$to/$f" || install -D -m644 "$from/$f" "$to/$f"
	done < <(cd "$from" && find . -type f -print0)
}
sync_into "$overlay" "$tree/src"
chmod +x "$tree/src/hook.sh"
sync_into "$abi_headers" "$tree/src/include/vstellar"

ninja -C "$tree/build" -j"$(nproc)" qemu-system-x86_64 > "$tree/build/build.log" 2>&1 ||
	die "QEMU build failed; see $tree/build/build.log"
# The option ROM for -kernel boot (linuxboot_dma.bin) is built by make, not
# ninja, with the host gcc in 32-bit mode (gcc-multilib).
make -C "$tree/build/pc-bios/optionrom" > "$tree/build/optionrom.log" 2>&1 &&
	[[ -f $tree/build/pc-bios/optionrom/linuxboot_dma.bin ]] ||
	die "QEMU option ROMs failed to build; see $tree/build/optionrom.log"

# The result: the binary and the firmware directory the launcher passes
# with -L (symlinks into the source resolved), nothing that points back
# into the tree, which the next build changes.
mkdir -p "$out/build"
cp "$tree/build/qemu-system-x86_64" "$bin"
cp -rL "$tree/build/pc-bios" "$out/build/pc-bios"
touch "$tree/.complete"
flock -u 8
# Trees are about 500 MB; keep the newest two (two QEMU pins in flight).
VSTELLAR_CACHE_KEEP=2 prune_cache qemutree
log "QEMU built in $((SECONDS - start)) s: $bin"
cache_commit
