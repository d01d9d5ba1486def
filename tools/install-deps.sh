#!/usr/bin/env bash
# make deps: install every Debian package that vStellar's build, tests and
# guests need, and the deb-src entries that `apt-get source` needs.
# Idempotent and silent when nothing is missing.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# Host build: engine, vstellard, tests, benchmarks (libssl-dev: integrity
# mode's AES-GMAC; zlib1g-dev: RoCE v2's ICRC; libpcap-dev: the RoCE v2
# codec's test reads packets rxe wrote).
pkgs_build=(build-essential cmake ninja-build pkg-config git liburing-dev libsodium-dev
	libssl-dev zlib1g-dev libpcap-dev libgtest-dev libgmock-dev libbenchmark-dev)
# The engine on ns-3 (qemu-device/ns3, vstellar-ns3 and its ns3-labelled
# tests): Debian's ns-3 3.37 (its headers and libraries are found directly:
# the package's ns3Config.cmake names a file the package lacks).
pkgs_ns3=(libns3-dev)
# Fuzz targets (tests/fuzz, tools/fuzz.sh): clang, and libFuzzer with the
# sanitizer runtimes (libclang_rt.fuzzer), which Debian ships in
# libclang-rt-14-dev.
pkgs_fuzz=(clang libclang-rt-14-dev)
# QEMU 7.2 from source (tools/build-qemu.sh); seabios is the guest BIOS,
# since Debian's dfsg source tarball carries no firmware blobs.
pkgs_qemu=(meson libfdt-dev gcc-multilib libglib2.0-dev libpixman-1-dev zlib1g-dev dpkg-dev seabios)
# rdma-core 56.1 from source with pyverbs (tools/build-rdma-core.sh).
pkgs_rdma=(libnl-3-dev libnl-route-3-dev libudev-dev cython3 python3-dev
	python3-docutils)
# Guest kernel headers (our module builds against these, never against the
# host's running kernel) and what the image builder copies into guests
# (libpci3 for perftest, whose own .deb goes straight into the image).
pkgs_guest=("linux-headers-$GUEST_KERNEL_ABI" busybox-static kmod iproute2
	cpio file python3 python3-minimal libpci3)
# MPI programs that run in guests (tools/mpi), built with Debian's mpicc;
# the guest takes UCX, OpenMPI and libfabric from their .debs, not from here.
pkgs_mpi=(libopenmpi-dev)
# Debian packages (make deb, tools/build-debs.sh) and the stock-guest and
# DKMS tests: Debian's packaging tools, DKMS, mmdebstrap for Debian root
# trees; ipxe-qemu holds the virtio-net option ROM vstellar-qemu links; libvirt
# for the libvirt test.
pkgs_deb=(debhelper dh-dkms dkms lintian mmdebstrap ipxe-qemu libvirt-daemon-system
	libvirt-daemon-driver-qemu libvirt-clients)
# Test networks and benchmark plots; tcpdump and tshark record and decode
# the RoCE v2 interop test's packets (tshark's built-in InfiniBand
# dissector).
pkgs_run=(python3-matplotlib procps psmisc tcpdump tshark)

want=("${pkgs_build[@]}" "${pkgs_ns3[@]}" "${pkgs_fuzz[@]}" "${pkgs_qemu[@]}" "${pkgs_rdma[@]}" "${pkgs_guest[@]}" "${pkgs_mpi[@]}"
	"${pkgs_deb[@]}" "${pkgs_run[@]}")

[[ $(id -u) == 0 ]] || die "must run as root (apt-get install); try: sudo make deps"

# deb-src entries: bookworm for QEMU, trixie for rdma-core's 56.1 source.
src_list=/etc/apt/sources.list.d/vstellar-src.sources
need_update=
if ! grep -rqs '^Types: *deb-src' /etc/apt/sources.list.d/ ||
   ! grep -rqs 'trixie' "$src_list"; then
	log "adding deb-src entries for bookworm and trixie to $src_list"
	cat > "$src_list" <<'SRC'
# Added by vStellar's `make deps`: source packages only (QEMU 7.2 from
# bookworm, rdma-core 56.1 from trixie). No trixie binaries are used.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
	need_update=1
fi

missing=()
for p in "${want[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
		missing+=("$p")
done

if [[ -n $need_update || ${#missing[@]} -gt 0 ]]; then
	log "apt-get update"
	apt-get update -qq
fi
if [[ ${#missing[@]} -gt 0 ]]; then
	log "installing: ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		"${missing[@]}" >/dev/null
fi
