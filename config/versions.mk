# The one place where every pinned external input of vStellar is recorded.
# Both the Makefile and the shell tools read this file (it is plain
# KEY = value so that `sh` can parse it too). Change a pin here and every
# cache keyed by it is rebuilt.

# Guest kernel: Debian bookworm's 6.1 kernel. Image and headers of one ABI.
# Debian drops old ABIs from the archive over time; when this one is gone,
# move both to the newest linux-image-6.1.0-*-amd64 that bookworm serves.
GUEST_KERNEL_ABI = 6.1.0-57-amd64
GUEST_KERNEL_VERSION = 6.1.192-3

# QEMU: bookworm's source package, built by tools/build-qemu.sh.
QEMU_SRC_VERSION = 1:7.2+dfsg-7+deb12u18

# rdma-core: trixie's source (bookworm's 44.0 tarball is not reachable from
# here), built by tools/build-rdma-core.sh with our provider inside it.
RDMA_CORE_SRC_VERSION = 56.1-1

# Where heavy, input-keyed builds live: outside the clone, so a fresh clone
# (and CI) reuses them. `make distclean-cache` removes it.
VSTELLAR_CACHE ?= /var/cache/vstellar
