#!/usr/bin/env bash
# Build QEMU 7.2 from Debian bookworm's source package with vStellar's own
# files (qemu-device/qemu/) laid over it, for x86_64-softmmu with only the
# devices we need. The result is cached in $VSTELLAR_CACHE/qemu-<key>, where
# <key> hashes every input: source version, our files, this script.
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
key=$(key_of "$QEMU_SRC_VERSION" "${configure_flags[*]}" "$overlay" "$abi_headers" "$0")
out=$VSTELLAR_CACHE/qemu-$key
bin=$out/build/qemu-system-x86_64

if [[ -x $bin && -e $out/.complete ]]; then
	touch "$out/.complete"
	echo "$bin"
	exit 0
fi
lock_entry "$out"
if [[ -x $bin && -e $out/.complete ]]; then
	touch "$out/.complete"
	echo "$bin"
	exit 0
fi

fetch_source qemu "$QEMU_SRC_VERSION"
dsc=$(ls "$VSTELLAR_CACHE"/src/qemu_"${QEMU_SRC_VERSION#*:}".dsc)
start=$SECONDS
# Built in place (meson records absolute paths); .complete marks success.
rm -rf "$out" && mkdir -p "$out"
log "unpacking $dsc (Debian's patches applied) into $out"
# apt-get checked the tarballs against the signed index when it fetched them.
dpkg-source -q --no-check -x "$dsc" "$out/src" >/dev/null

# The dfsg tarball has no edk2 firmware blobs to unpack; QEMU would try
# whenever bzip2 is installed. We boot with SeaBIOS, so never unpack them.
sed -i 's/^\( *unpack_edk2_blobs = \)bzip2.found()/\1false/' "$out/src/meson.build"
grep -q 'unpack_edk2_blobs = false$' "$out/src/meson.build" ||
	die "could not turn off unpack_edk2_blobs in QEMU's meson.build"

# Our files: added, never editing QEMU's own except through hook.sh.
cp -a "$overlay/." "$out/src/"
mkdir -p "$out/src/include/vstellar"
cp -a "$abi_headers/." "$out/src/include/vstellar/"
if [[ -x $out/src/hook.sh ]]; then
	(cd "$out/src" && ./hook.sh) || die "qemu-device/qemu/hook.sh failed"
fi

mkdir -p "$out/build"
log "configuring: ${configure_flags[*]}"
(cd "$out/build" && ../src/configure "${configure_flags[@]}" > configure.log 2>&1) ||
	die "QEMU configure failed; see $out/build/configure.log"
log "building (2 jobs; about 5 minutes cold)"
ninja -C "$out/build" -j"$(nproc)" qemu-system-x86_64 > "$out/build/build.log" 2>&1 ||
	die "QEMU build failed; see $out/build/build.log"
# The option ROM for -kernel boot (linuxboot_dma.bin) is built by make, not
# ninja, with the host gcc in 32-bit mode (gcc-multilib).
make -C "$out/build/pc-bios/optionrom" > "$out/build/optionrom.log" 2>&1 &&
	[[ -f $out/build/pc-bios/optionrom/linuxboot_dma.bin ]] ||
	die "QEMU option ROMs failed to build; see $out/build/optionrom.log"
touch "$out/.complete"
prune_cache qemu
log "QEMU built in $((SECONDS - start)) s: $bin"
echo "$bin"
