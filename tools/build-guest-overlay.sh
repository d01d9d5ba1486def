#!/usr/bin/env bash
# Build a guest image variant: an existing guest image (tools/build-guest-
# image.sh) plus Debian packages that only some runs need, so that every
# other boot keeps the small initramfs. Debian 12's fio, for one, depends on
# the Ceph and GlusterFS client libraries; the benchmarks need it, the tests
# do not.
#
# The variant's initramfs is the base's followed by a second cpio archive
# with the extra packages (the kernel unpacks concatenated archives in
# order, later files replacing earlier ones), so building one costs only the
# new packages.
#
# Usage: build-guest-overlay.sh [-x EXTRA_DIR]... GUEST_IMAGE NAME PACKAGE...
#   GUEST_IMAGE  a directory printed by build-guest-image.sh
#   NAME         names the variant in the cache (overlay-NAME-<key>)
#   PACKAGE      Debian packages, installed with the closure of their
#                dependencies that the base image does not already have
#   -x DIR       a tree copied over the overlay's root last
# Prints the variant's directory, which holds vmlinuz and initrd.cpio like
# a base image does.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

extras=()
while getopts x: opt; do
	case $opt in
	x) extras+=("$(realpath "$OPTARG")") ;;
	*) die "usage: build-guest-overlay.sh [-x EXTRA_DIR]... GUEST_IMAGE NAME PACKAGE..." ;;
	esac
done
shift $((OPTIND - 1))
base=${1:?usage: build-guest-overlay.sh [-x EXTRA_DIR]... GUEST_IMAGE NAME PACKAGE...}
name=${2:?no variant NAME given}; shift 2
(($#)) || die "no PACKAGE given"
[[ -e $base/.complete && -f $base/packages ]] ||
	die "$base is not a guest image of this version of build-guest-image.sh (run: make guest)"
[[ $name =~ ^[a-z0-9]+$ ]] || die "NAME must be lower-case letters and digits: $name"

declare -A DEB_STOP=()
while read -r p; do DEB_STOP[$p]=1; done < "$base/packages"
debs=() packages=()
while read -r p ver arch; do
	packages+=("$p")
	debs+=("$(getdeb "$p" "$ver" "$arch")")
done < <(deb_closure "$@")

# A use of the variant is a use of its base too (prune_cache).
touch "$base/.complete"
# The base image's directory name carries its key (hashing its 150 MB
# initramfs on every call would not).
cache_begin "overlay-$name" . "base:$(basename "$base")" "${debs[@]}" "${extras[@]}"
out=$CACHE_ENTRY

start=$SECONDS
root=$out/root
mkdir -p "$root"
log "$name: ${#debs[@]} .debs over $(basename "$base"): ${packages[*]}"
for d in "${debs[@]}"; do dpkg-deb -x "$d" "$root"; done
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/lintian" \
	"$root/usr/include" "$root/usr/share/locale"
for d in "${extras[@]}"; do cp -a "$d/." "$root/"; done
# Libraries in private directories (Ceph's) are found through their RUNPATH
# in the guest; ldd on the host needs them named.
lib=usr/lib/x86_64-linux-gnu
libpath=$(find "$root/$lib" -name '*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd:)
copy_needed_libs "$root" "$libpath:$base/root/$lib:$base/root/$lib/libibverbs" "$base/root"
# Last, as libraries copied from the host may come from /lib too: the base
# links /lib/x86_64-linux-gnu to /usr/lib/x86_64-linux-gnu, and a directory
# of that name in the overlay would replace the link.
merge_usr_lib "$root"

# Cache entries are immutable: the variant holds its own copy of the kernel.
cp "$base/vmlinuz" "$out/vmlinuz"
{
	cat "$base/initrd.cpio"
	(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet)
} > "$out/initrd.cpio"
printf '%s\n' "${packages[@]}" | cat - "$base/packages" | sort -u > "$out/packages"
log "$name built in $((SECONDS - start)) s: $(du -h "$out/initrd.cpio" | cut -f1) initramfs"
cache_commit
