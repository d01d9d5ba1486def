#!/usr/bin/env bash
# Build the guest image: the pinned Debian 6.1 kernel and one uncompressed
# initramfs (uncompressed because TCG decompresses slowly) made from Debian
# packages: busybox, kmod, iproute2, perftest, python3, UCX, OpenMPI,
# libfabric, dropbear, nvme-cli, the NFS utilities, the kernel modules for
# RDMA, virtio, NVMe over Fabrics, NFS over RDMA and RDS, and our
# rdma-core build (libibverbs, librdmacm, the rxe and vstellar providers,
# utilities, pyverbs and rdma-core's tests/), which UCX, OpenMPI, libfabric
# and perftest run on. Our kernel module, tests and MPI programs, when built,
# go in too.
#
# Usage: build-guest-image.sh RDMA_CORE_STAGE [EXTRA_DIR...]
#        build-guest-image.sh --fetch-only
#   EXTRA_DIR trees are copied over the root last (our module, selftests).
#   --fetch-only downloads the image's Debian packages into the cache and
#   stops (make test runs it in the background while the code compiles).
# Cached in $VSTELLAR_CACHE/guest-<key>; prints that directory, which holds
# vmlinuz and initrd.cpio.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

fetch_only=
if [[ ${1:-} == --fetch-only ]]; then
	fetch_only=1
else
	stage=${1:?usage: build-guest-image.sh RDMA_CORE_STAGE [EXTRA_DIR...]}; shift
	[[ -d $stage/usr/lib ]] || die "$stage is not an rdma-core stage (run tools/build-rdma-core.sh)"
	extras=("$@")
fi

abi=$GUEST_KERNEL_ABI
# Modules the tests load, with their dependencies resolved from modules.dep.
root_modules=(virtio_pci virtio_net virtio_console qemu_fw_cfg configfs
	ib_core ib_uverbs ib_umad rdma_ucm rdma_rxe crc32_generic
	nvme-rdma nvmet-rdma nvme-tcp nvmet-tcp nvme-fabrics nvmet null_blk
	rpcrdma nfsd nfs nfsv4 rds_rdma
	ib_iser ib_isert iscsi_target_mod target_core_mod sd_mod crc32c_generic)
# Packages whose files are copied (from the host, where `make deps` put
# them); perftest comes straight from its .deb so that the host keeps no
# second libibverbs beside ours.
host_packages=(busybox-static kmod iproute2)

kdeb=$(getdeb "linux-image-$abi" "$GUEST_KERNEL_VERSION")
perftest_ver=$(apt-cache policy perftest | sed -n 's/ *Candidate: //p')
[[ -n $perftest_ver && $perftest_ver != "(none)" ]] || die "no perftest package known to apt (run: make deps)"
pdeb=$(getdeb perftest "$perftest_ver")

# MPI and friends from their .debs, with the runtime closure of their
# Depends: UCX, OpenMPI 4.1, libfabric, and dropbear (the ssh server and
# client that mpirun starts its remote daemons with); nvme-cli and the
# NFS server and client utilities (NVMe over RDMA, NFS over RDMA). The
# walk stops at packages the image must not carry or does not need:
#  - libibverbs1, librdmacm1, ibverbs-providers: our rdma-core build provides
#    libibverbs.so.1, librdmacm.so.1 and the providers (ABI compatible);
#  - openssh-client: dropbear's dbclient is mpirun's launcher here;
#  - libhwloc-plugins: optional hwloc plugins (X11, OpenCL, CUDA), dlopened;
#  - the base libraries the image already copies from the host (below);
#  - what only maintainer scripts and init systems use (uuid-runtime makes
#    nvme-cli's host NQN at install time; adduser, ucf, lsb-base, netbase,
#    init-system-helpers), python3 (copied from the host below) and rpcbind
#    (NFSv4 needs none).
mpi_roots=(libucx0 ucx-utils openmpi-bin libfabric1 libfabric-bin dropbear-bin
	nvme-cli nfs-kernel-server nfs-common)
declare -A DEB_STOP=()
for p in libibverbs1 librdmacm1 ibverbs-providers openssh-client libhwloc-plugins \
	libc6 libgcc-s1 gcc-12-base libstdc++6 zlib1g libcrypt1 \
	uuid-runtime adduser ucf lsb-base netbase init-system-helpers python3 rpcbind; do
	DEB_STOP[$p]=1
done
mpi_debs=() mpi_packages=()
while read -r p ver arch; do
	mpi_packages+=("$p")
	mpi_debs+=("$(getdeb "$p" "$ver" "$arch")")
done < <(deb_closure "${mpi_roots[@]}")
[[ -z $fetch_only ]] || exit 0

host_versions=$(dpkg-query -W "${host_packages[@]}" python3.11-minimal libpython3.11-stdlib)
cache_begin guest . "$kdeb" "$pdeb" "${mpi_debs[@]}" "$host_versions" "${root_modules[*]}" \
	"$stage" "$VSTELLAR_TOP/tools/guest" "${extras[@]}"
out=$CACHE_ENTRY

start=$SECONDS
root=$out/root
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,root,usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,lib64}

log "kernel $abi from $(basename "$kdeb")"
kx=$out/kernel-deb
dpkg-deb -x "$kdeb" "$kx"
cp "$kx/boot/vmlinuz-$abi" "$out/vmlinuz"
moddir=$kx/lib/modules/$abi
[[ -f $moddir/modules.dep ]] || depmod -b "$kx" "$abi"

# Resolve the module closure from modules.dep.
declare -A want=()
add_module() {
	local name=$1 line path dep
	line=$(grep -E "(^|/)${name}\.ko(\.[a-z]+)?:" "$moddir/modules.dep" | head -n1) ||
		die "module $name is not in $abi"
	path=${line%%:*}
	[[ -n ${want[$path]:-} ]] && return
	want[$path]=1
	for dep in ${line#*:}; do
		dep=${dep##*/}; add_module "${dep%%.ko*}"
	done
}
for m in "${root_modules[@]}"; do add_module "$m"; done
for path in "${!want[@]}"; do
	install -D -m644 "$moddir/$path" "$root/lib/modules/$abi/$path"
done
cp "$moddir"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$abi/" 2>/dev/null || true

log "Debian packages from the host: ${host_packages[*]}, python3"
copy_path() {  # copy a host file or symlink into the root, keeping its path
	local f=$1
	[[ -e $f || -L $f ]] || return 0
	[[ -d $f && ! -L $f ]] && return 0
	mkdir -p "$root$(dirname "$f")"
	cp -a "$f" "$root$f"
}
for p in "${host_packages[@]}"; do
	while read -r f; do
		case $f in /usr/share/*) continue ;; esac
		copy_path "$f"
	done < <(dpkg -L "$p")
done
# busybox provides the shell and the small tools; kmod the module tools.
for applet in $("$root/bin/busybox" --list-full); do
	[[ -e $root/$applet ]] || ln -s /bin/busybox "$root/$applet"
done
for t in modprobe insmod rmmod lsmod depmod modinfo; do
	ln -sf /bin/kmod "$root/sbin/$t"
done
# Python for pyverbs and rdma-core's tests: the interpreter and its standard
# library, without what only a desktop or a developer uses.
copy_path /usr/bin/python3.11
ln -sf python3.11 "$root/usr/bin/python3"
mkdir -p "$root/usr/lib/python3.11" "$root/usr/lib/python3/dist-packages"
tar -C /usr/lib/python3.11 --exclude=__pycache__ --exclude='./test' --exclude=./idlelib \
	--exclude=./tkinter --exclude=./turtledemo --exclude=./ensurepip --exclude=./lib2to3 \
	--exclude=./pydoc_data --exclude='./config-3.11-*' --exclude=./site-packages \
	--exclude=./dist-packages -cf - . | tar -C "$root/usr/lib/python3.11" -xf -

log "perftest from $(basename "$pdeb"), rdma-core from $stage"
dpkg-deb -x "$pdeb" "$root"
log "UCX, OpenMPI, libfabric, dropbear, nvme-cli, NFS: ${#mpi_debs[@]} .debs"
for d in "${mpi_debs[@]}"; do dpkg-deb -x "$d" "$root"; done
# No postinst runs here: make the links their update-alternatives calls
# would (mpirun, mpiexec, libpsm_infinipath.so.1, which libfabric and
# OpenMPI link), to targets in the image, relative so that the host's own
# alternatives never answer for the image's.
for d in "${mpi_debs[@]}"; do
	{ dpkg-deb -I "$d" postinst 2>/dev/null || true; } | sed -e ':a' -e '/\\$/{N;s/\\\n//;ba}' |
		{ grep -oE -- '--(install|slave) +[^ ]+ +[^ ]+ +[^ ]+' || true; } |
		while read -r _ link _ target; do
			[[ -e $root$target ]] || continue
			mkdir -p "$(dirname "$root$link")"
			ln -sfnr "$root$target" "$root$link"
		done
done
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/lintian" "$root/usr/include"
cp -a "$stage/." "$root/"
for d in "${extras[@]}"; do cp -a "$d/." "$root/"; done

# Shared libraries of every ELF file in the root, resolved against the root
# first (so our libibverbs wins), then the host.
copy_needed_libs "$root" "$root/usr/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/libibverbs"
# glibc dlopens libgcc_s for pthread_exit/pthread_cancel (stack unwinding):
# no ELF names it, yet rping's threads need it.
[[ -e $root/usr/lib/x86_64-linux-gnu/libgcc_s.so.1 ]] ||
	copy_path /usr/lib/x86_64-linux-gnu/libgcc_s.so.1
merge_usr_lib "$root"
ln -sfn ../usr/lib/x86_64-linux-gnu "$root/lib/x86_64-linux-gnu"

echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
echo "root:x:0:" > "$root/etc/group"
printf '127.0.0.1 localhost\n' > "$root/etc/hosts"
install -m755 "$VSTELLAR_TOP/tools/guest/init" "$root/init"
# mpirun across guests: dropbear serves ssh (host keys made on first use,
# -R), dbclient is OpenMPI's launcher; one client key, made here, is in every
# guest of this image and authorized by every guest. Test guests only: the
# key lets anyone on the test network in, which is the point.
install -m755 "$VSTELLAR_TOP/tools/guest/vstellar-mpi" "$root/usr/bin/vstellar-mpi"
cat "$VSTELLAR_TOP/tools/guest/openmpi-mca-params.conf" >> "$root/etc/openmpi/openmpi-mca-params.conf"
mkdir -p -m700 "$root/root/.ssh" && mkdir -p "$root/etc/dropbear"
LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu "$root/usr/bin/dropbearkey" -t ed25519 \
	-f "$root/root/.ssh/id_dropbear" 2>/dev/null | grep '^ssh-' > "$root/root/.ssh/authorized_keys"
[[ -s $root/root/.ssh/authorized_keys ]] || die "dropbearkey made no client key"
chmod 600 "$root/root/.ssh/authorized_keys" "$root/root/.ssh/id_dropbear"
depmod -b "$root" "$abi"
cp -a /etc/ld.so.conf /etc/ld.so.conf.d "$root/etc/"
ldconfig -r "$root"

(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) > "$out/initrd.cpio"
rm -rf "$kx"
# What the image has, or has on purpose left out: where the package walk of
# an overlay (tools/build-guest-overlay.sh) stops.
printf '%s\n' "${host_packages[@]}" perftest "${mpi_packages[@]}" "${!DEB_STOP[@]}" |
	sort -u > "$out/packages"
log "guest image built in $((SECONDS - start)) s: $(du -h "$out/initrd.cpio" | cut -f1) initramfs"
cache_commit
