#!/usr/bin/env bash
# Build the vStellar provider alone (libvstellar-rdmav34.so) for a
# distribution's own rdma-core, for the Debian packages (tools/build-debs.sh).
#
#   tools/build-provider.sh LAYOUT     LAYOUT: 44 or 56
#
# rdma-core kept the provider ABI name IBVERBS_PRIVATE_34 from release 36 to
# 56, but struct ibv_qp_ex grew at its end within that range (44 added
# wr_atomic_write, 45 wr_flush), and struct verbs_qp, which every provider
# embeds, puts comp_mask after it. A provider therefore has to be compiled
# against headers with the running libibverbs' layout (docs/packages.md):
#  56: rdma-core 45 to 56 (Debian 13's 56.1, Ubuntu 24.04's 50): 56.1's own
#      headers;
#  44: rdma-core 44 (Debian 12): 56.1's headers without wr_flush, the one
#      member 45 added to struct ibv_qp_ex. Bookworm's 44.0 source tarball is
#      not reachable from here; every other structure the provider shares
#      with libibverbs is the same in 44 and 56.1 (checked in the docs), and
#      the provider refuses to open a device if the layout still differs.
#
# The build is rdma-core 56.1's cmake with our provider linked into its
# providers/ tree, as in tools/build-rdma-core.sh, but only the provider's
# target (and libibverbs, which it links). Cached in
# $VSTELLAR_CACHE/provider-<key>; prints the path of the .so.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

layout=${1:-}
[[ $layout == 44 || $layout == 56 ]] || die "usage: ${0##*/} 44|56"
provider=$VSTELLAR_TOP/providers/vstellar
cmake_flags=(
	-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
	-DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu
	-DNO_MAN_PAGES=1 -DNO_PYVERBS=1 -DENABLE_STATIC=0
	# Installed into the system: no run path into this build tree.
	-DCMAKE_SKIP_BUILD_RPATH=ON
)
cache_begin provider build/lib/libvstellar-rdmav34.so "$RDMA_CORE_SRC_VERSION" "$layout" \
	"${cmake_flags[*]}" "$provider" "$VSTELLAR_TOP/include/vstellar"
out=$CACHE_ENTRY

fetch_source rdma-core "$RDMA_CORE_SRC_VERSION" --tar-only
upstream=${RDMA_CORE_SRC_VERSION%-*}
start=$SECONDS
mkdir -p "$out/src"
tar -xzf "$VSTELLAR_CACHE/src/rdma-core_$upstream.orig.tar.gz" -C "$out/src" --strip-components=1
# A copy, not a link: the entry must not change when the clone does.
cp -a "$provider" "$out/src/providers/vstellar"
cp -a "$VSTELLAR_TOP/include" "$out/include"
sed -i "s|\"\${VSTELLAR_PROVIDER_REAL}/../../include\"|\"$out/include\"|" \
	"$out/src/providers/vstellar/CMakeLists.txt"
sed -i 's|^add_subdirectory(providers/rxe)$|&\nadd_subdirectory(providers/vstellar)|' \
	"$out/src/CMakeLists.txt"
grep -q 'providers/vstellar' "$out/src/CMakeLists.txt" ||
	die "could not add providers/vstellar to rdma-core's CMakeLists.txt"

if [[ $layout == 44 ]]; then
	# struct ibv_qp_ex as rdma-core 44 has it: drop wr_flush (the member
	# and its inline wrapper ibv_wr_flush), nothing else.
	verbs_h=$out/src/libibverbs/verbs.h
	awk '
		/^\tvoid \(\*wr_flush\)\(/ { skip = 1 }
		/^static inline void ibv_wr_flush\(/ { skip = 2 }
		skip == 1 { if ($0 ~ /\);$/) skip = 0; next }
		skip == 2 { if ($0 ~ /^}$/) skip = 0; next }
		{ print }
	' "$verbs_h" > "$verbs_h.new" && mv "$verbs_h.new" "$verbs_h"
	! grep -q 'wr_flush' "$verbs_h" || die "could not remove wr_flush from $verbs_h"
	grep -q 'wr_atomic_write)' "$verbs_h" || die "$verbs_h lacks wr_atomic_write (not 56.1?)"
fi

log "building the provider for rdma-core layout $layout"
cmake -S "$out/src" -B "$out/build" "${cmake_flags[@]}" > "$out/cmake.log" 2>&1 ||
	die "rdma-core cmake failed; see $out/cmake.log"
ninja -C "$out/build" lib/libvstellar-rdmav34.so > "$out/build.log" 2>&1 ||
	die "provider build failed; see $out/build.log"
log "provider (layout $layout) built in $((SECONDS - start)) s"
cache_commit
