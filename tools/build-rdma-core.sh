#!/usr/bin/env bash
# Build rdma-core from Debian's source (trixie's 56.1; bookworm's 44.0
# tarball is not reachable from here) with vStellar's provider inside its
# providers/ tree, the way every rdma-core provider lives: the private
# provider ABI (IBVERBS_PRIVATE_34, driver.h) exists only in that tree.
#
# The result is cached in $VSTELLAR_CACHE/rdma-core-<key>: build/ is the
# cmake/ninja tree (pyverbs included, man pages off) and stage/ the installed
# files (DESTDIR) that the guest image builder copies. Prints stage/.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

provider=$VSTELLAR_TOP/providers/vstellar
cmake_flags=(
	-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
	-DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_INSTALL_SYSCONFDIR=/etc
	-DCMAKE_INSTALL_RUNDIR=/run -DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu
	-DNO_MAN_PAGES=1 -DENABLE_STATIC=0
	-DCMAKE_INSTALL_PYTHON_ARCH_LIB=/usr/lib/python3/dist-packages
	# The python3 first on PATH may be another interpreter without Cython;
	# pyverbs must be built for the guest's Debian python3.
	-DPYTHON_EXECUTABLE=/usr/bin/python3
)
# The provider includes the device-interface and uverbs ABI headers.
cache_begin rdma-core stage "$RDMA_CORE_SRC_VERSION" "${cmake_flags[*]}" "$provider" \
	"$VSTELLAR_TOP/include/vstellar"
out=$CACHE_ENTRY

fetch_source rdma-core "$RDMA_CORE_SRC_VERSION" --tar-only
upstream=${RDMA_CORE_SRC_VERSION%-*}
tarball=$VSTELLAR_CACHE/src/rdma-core_$upstream.orig.tar.gz
start=$SECONDS
mkdir -p "$out/src"
log "unpacking $tarball into $out"
tar -xzf "$tarball" -C "$out/src" --strip-components=1

# Our provider joins the tree as a link, so its sources stay ours.
if [[ -f $provider/CMakeLists.txt ]]; then
	ln -s "$provider" "$out/src/providers/vstellar"
	sed -i 's|^add_subdirectory(providers/rxe)$|&\nadd_subdirectory(providers/vstellar)|' \
		"$out/src/CMakeLists.txt"
	grep -q 'providers/vstellar' "$out/src/CMakeLists.txt" ||
		die "could not add providers/vstellar to rdma-core's CMakeLists.txt"
fi

log "configuring and building (pyverbs on, man pages off)"
cmake -S "$out/src" -B "$out/build" "${cmake_flags[@]}" > "$out/cmake.log" 2>&1 ||
	die "rdma-core cmake failed; see $out/cmake.log"
ninja -C "$out/build" > "$out/build.log" 2>&1 ||
	die "rdma-core build failed; see $out/build.log"
DESTDIR=$out/stage ninja -C "$out/build" install > "$out/install.log" 2>&1 ||
	die "rdma-core install failed; see $out/install.log"
log "rdma-core $upstream built in $((SECONDS - start)) s"
cache_commit
