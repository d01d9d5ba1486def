#!/usr/bin/env bash
# A Debian root tree from Debian's archive, made by mmdebstrap, for the
# packaging tests (docs/packages.md).
#
#   tools/build-debian-root.sh NAME SUITE PACKAGE,PACKAGE,...
#
# Cached in $VSTELLAR_CACHE/root-NAME-<key>, keyed by the suite, the
# package list and mmdebstrap's options (the archive moves on: remove the
# entry to take newer packages). Prints the directory.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

name=${1:?usage: build-debian-root.sh NAME SUITE PACKAGES}
suite=${2:?usage: build-debian-root.sh NAME SUITE PACKAGES}
packages=${3:?usage: build-debian-root.sh NAME SUITE PACKAGES}
# Keyed by what mmdebstrap is asked for; bump the tag when its options change.
cache_begin "root-$name" root "$suite" "$packages" "mmdebstrap --variant=apt, no doc/man/locale: 1"
out=$CACHE_ENTRY

start=$SECONDS
log "mmdebstrap $suite with $packages into $out/root"
# No documentation, manual pages or translations: the roots are for builds
# and tests, and they are smaller and quicker to make without.
mmdebstrap --mode=root --variant=apt --include="$packages" \
	--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
	"$suite" "$out/root" > "$out/mmdebstrap.log" 2>&1 ||
	die "mmdebstrap failed; see $out/mmdebstrap.log"
log "$suite root made in $((SECONDS - start)) s"
cache_commit 2
