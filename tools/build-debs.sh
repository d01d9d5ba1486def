#!/usr/bin/env bash
# make deb: vStellar's Debian packages for bookworm, built with
# dpkg-buildpackage from packaging/debian (docs/packages.md).
#
#   tools/build-debs.sh OUTDIR
#
# The QEMU with our device and the two provider builds come from the cached
# builds of Debian's qemu and rdma-core sources (tools/build-qemu.sh,
# tools/build-provider.sh); debian/rules builds vstellard itself. Lintian
# checks the result: any error or warning fails the build (the overrides in
# packaging/debian/*.lintian-overrides say why each is there). The packages
# are cached in $VSTELLAR_CACHE/debs-<key>, keyed by what goes into them.
# Prints the .deb files.
set -euo pipefail
# build_packages runs in a command substitution, which must stop at a failure too.
shopt -s inherit_errexit
. "$(dirname "$0")/lib.sh"

out=${1:?usage: build-debs.sh OUTDIR}
qemu=$("$VSTELLAR_TOP/tools/build-qemu.sh")
provider44=$("$VSTELLAR_TOP/tools/build-provider.sh" 44)
provider56=$("$VSTELLAR_TOP/tools/build-provider.sh" 56)

version=$(dpkg-parsechangelog -l "$VSTELLAR_TOP/packaging/debian/changelog" -S Version)
rm -rf "$out" && mkdir -p "$out"
tree=$out/vstellar-$version
mkdir -p "$tree"
# The repository's files as git knows them (tracked, and new ones not
# ignored), never build products lying in the clone.
git -C "$VSTELLAR_TOP" ls-files -z --cached --others --exclude-standard |
	(cd "$VSTELLAR_TOP" && xargs -0 cp --parents -t "$tree" 2>/dev/null || true)
[[ -f $tree/CMakeLists.txt && -f $tree/kernel/vstellar/Kbuild ]] ||
	die "could not copy the repository's files (is $VSTELLAR_TOP a git clone?)"
cp -a "$VSTELLAR_TOP/packaging/debian" "$tree/debian"

mkdir -p "$tree/prebuilt/qemu/optionrom" "$tree/prebuilt/provider-44" "$tree/prebuilt/provider-56"
cp "$qemu" "$tree/prebuilt/qemu/"
cp "$(dirname "$qemu")"/pc-bios/optionrom/*.bin "$tree/prebuilt/qemu/optionrom/"
[[ -f $tree/prebuilt/qemu/optionrom/linuxboot_dma.bin ]] ||
	die "no linuxboot_dma.bin next to $qemu"
cp "$provider44" "$tree/prebuilt/provider-44/"
cp "$provider56" "$tree/prebuilt/provider-56/"

# build_packages: the cache entry holding the packages and the build and
# lintian logs, built from $tree if no entry has them yet. Run in a
# subshell: cache_begin ends it on a hit.
build_packages() {
	# Keyed by what goes into the packages (not docs or tests).
	cache_begin debs . "$tree"/{CMakeLists.txt,qemu-device,include,kernel/vstellar,packaging,debian,prebuilt}
	local start=$SECONDS changes
	log "dpkg-buildpackage in $tree"
	(cd "$tree" && dpkg-buildpackage -b -us -uc -j"$(nproc)") > "$out/build.log" 2>&1 ||
		die "dpkg-buildpackage failed; see $out/build.log"
	changes=$(ls "$out"/vstellar_"$version"_*.changes)
	log "lintian $changes"
	lintian --fail-on error,warning --info "$changes" > "$out/lintian.log" 2>&1 || {
		cat "$out/lintian.log" >&2
		die "lintian found problems; see $out/lintian.log"
	}
	cp "$out"/*.deb "$out/build.log" "$out/lintian.log" "$CACHE_ENTRY/"
	log "packages built in $((SECONDS - start)) s"
	cache_commit
}
cache=$(build_packages)
cp "$cache"/*.deb "$cache/build.log" "$cache/lintian.log" "$out/"
rm -rf "$tree"
ls "$out"/*.deb
