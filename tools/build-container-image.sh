#!/usr/bin/env bash
# Build the perftest container image, offline, from Debian packages and our
# rdma-core build: a root filesystem with busybox (the shell), perftest
# (from its .deb), libibverbs, librdmacm and the providers (vstellar, rxe
# and the others) with rdma-core's utilities (ibv_devinfo, ibv_rc_pingpong,
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

debs=$VSTELLAR_CACHE/debs
apt_download_dir "$debs"
perftest_ver=$(apt-cache policy perftest | sed -n 's/ *Candidate: //p')
[[ -n $perftest_ver && $perftest_ver != "(none)" ]] || die "no perftest package known to apt (run: make deps)"
pdeb=$debs/perftest_${perftest_ver/:/%3a}_$(dpkg --print-architecture).deb
[[ -f $pdeb ]] || (cd "$debs" && apt-get download -qq "perftest=$perftest_ver") ||
	die "apt-get download perftest=$perftest_ver failed (run: make deps)"

key=$(key_of "$pdeb" "$(dpkg-query -W busybox-static libc6 libpci3)" "$stage/usr/lib" "$stage/usr/bin" "$0")
out=$VSTELLAR_CACHE/ctrimg-$key
if [[ -e $out/.complete ]]; then
	touch "$out/.complete"
	echo "$out"
	exit 0
fi
lock_entry "$out"
if [[ -e $out/.complete ]]; then
	touch "$out/.complete"
	echo "$out"
	exit 0
fi

rm -rf "$out" && mkdir -p "$out"
root=$out/root
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,root,usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,lib64}
ln -s usr/lib "$root/lib"
dpkg-deb -x "$pdeb" "$root"
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
libpath=$root/usr/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/libibverbs
for _ in 1 2 3; do
	find "$root" -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
		xargs -0 file -N -F' ' | awk '/ ELF / && /dynamically linked|shared object/ {print $1}' |
		while read -r elf; do
			LD_LIBRARY_PATH=$libpath ldd "$elf" 2>/dev/null |
				awk -v elf="${elf#"$root"}" '/=> not found/ {print "MISSING " $1 " " elf}
					/=> \// {print $3} /^\t\/lib64/ {print $1}'
		done | sort -u | while read -r lib what needed_by; do
			[[ $lib == MISSING ]] && die "$needed_by needs $what, which no installed package provides"
			case $lib in "$root"/*) continue ;; esac
			real=$(readlink -f "$lib")
			for f in "$lib" "$real"; do
				f=${f#/usr}; f=/usr$f  # merged /usr: everything under /usr/lib
				[[ -e $root$f ]] || { mkdir -p "$root$(dirname "$f")"; cp -a "$f" "$root$f"; }
			done
		done
done
[[ -e $root/lib64/ld-linux-x86-64.so.2 ]] || ln -s ../usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$root/lib64/"
echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
echo "root:x:0:" > "$root/etc/group"
printf '127.0.0.1 localhost\n' > "$root/etc/hosts"
ldconfig -r "$root" 2>/dev/null || true

tar -C "$root" --numeric-owner --sort=name -cf "$out/rootfs.tar" .
echo "ib_write_bw" > "$out/cmd"
rm -rf "$root"
touch "$out/.complete"
prune_cache ctrimg
log "container image: $(du -h "$out/rootfs.tar" | cut -f1) rootfs.tar"
echo "$out"
