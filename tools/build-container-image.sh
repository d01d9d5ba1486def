#!/usr/bin/env bash
# Build the perftest container image, offline, from Debian packages and our
# rdma-core build: a root filesystem with busybox (the shell), perftest
# (from its .deb), UCX 1.13 (libucx0, ucx-utils: ucx_perftest), libibverbs,
# librdmacm and the providers (vstellar, rxe and the others) with rdma-core's utilities (ibv_devinfo, ibv_rc_pingpong,
# rping), and the shared libraries all of them need. No registry is
# involved: the image is a tarball (`rootfs.tar`, the layout `podman
# import`/`docker import` take) and its default command (`cmd`).
#
# Usage: build-container-image.sh RDMA_CORE_STAGE
# Cached in $VSTELLAR_CACHE/ctrimg-<key>; prints that directory.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

stage=${1:?usage: build-container-image.sh RDMA_CORE_STAGE}
[[ -d $stage/usr/lib ]] || die "$stage is not an rdma-core stage (run tools/build-rdma-core.sh)"

perftest_ver=$(apt-cache policy perftest | sed -n 's/ *Candidate: //p')
[[ -n $perftest_ver && $perftest_ver != "(none)" ]] || die "no perftest package known to apt (run: make deps)"
pdeb=$(getdeb perftest "$perftest_ver")
# UCX (ucx_perftest) with the closure of its Depends, less what the image
# has already (our rdma-core) or copy_needed_libs brings from the host
# (libc and the compiler's runtime).
declare -A DEB_STOP=()
for p in libibverbs1 librdmacm1 ibverbs-providers libc6 libgcc-s1 gcc-12-base libstdc++6 zlib1g; do
	DEB_STOP[$p]=1
done
ucx_debs=()
while read -r p ver arch; do
	ucx_debs+=("$(getdeb "$p" "$ver" "$arch")")
done < <(deb_closure libucx0 ucx-utils)

cache_begin ctrimg . "$pdeb" "${ucx_debs[@]}" "$(dpkg-query -W busybox-static libc6 libpci3)" \
	"$stage/usr/lib" "$stage/usr/bin"
out=$CACHE_ENTRY
root=$out/root
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,root,usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,lib64}
ln -s usr/lib "$root/lib"
dpkg-deb -x "$pdeb" "$root"
for d in "${ucx_debs[@]}"; do dpkg-deb -x "$d" "$root"; done
cp -a "$stage/etc/libibverbs.d" "$stage/etc/rdma" "$root/etc/"
cp -a "$stage/usr/lib/x86_64-linux-gnu/." "$root/usr/lib/x86_64-linux-gnu/"
rm -rf "$root/usr/lib/x86_64-linux-gnu/pkgconfig" "$root/usr/lib/x86_64-linux-gnu/"*.a
for t in ibv_devices ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong rping; do
	cp -a "$stage/usr/bin/$t" "$root/usr/bin/"
done
cp /bin/busybox "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list-full); do
	[[ -e $root/$applet ]] || ln -s /bin/busybox "$root/$applet"
done
rm -rf "$root/usr/share"

# Shared libraries of every ELF file, from the root first (our rdma-core),
# then from the host (libc, libpci, libnl).
copy_needed_libs "$root" "$root/usr/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/libibverbs"
[[ -e $root/lib64/ld-linux-x86-64.so.2 ]] || ln -s ../usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$root/lib64/"
echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
echo "root:x:0:" > "$root/etc/group"
printf '127.0.0.1 localhost\n' > "$root/etc/hosts"
ldconfig -r "$root" 2>/dev/null || true

tar -C "$root" --numeric-owner --sort=name -cf "$out/rootfs.tar" .
echo "ib_write_bw" > "$out/cmd"
rm -rf "$root"
log "container image: $(du -h "$out/rootfs.tar" | cut -f1) rootfs.tar"
cache_commit
