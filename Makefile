# vStellar top-level Makefile.
#
#   make demo    two guests run ib_write_bw against each other (README)
#   make test    build everything, then run every test (unit, host, guest)
#   make bench   run the benchmarks; JSON and PNG land in out/bench/
#   make fuzz    run each fuzz target FUZZ_SECONDS (1800); crashes in out/fuzz/
#   make soak    100,000 simulated scenarios, then a 30-minute two-guest soak
#   make deps    install the Debian packages the rest needs (run first by all)
#   make deb     Debian packages for bookworm in build/deb/ (docs/packages.md)
#
# Host C++ (engine, vstellard, tests) builds with CMake/Ninja in build/.
# QEMU, rdma-core and the guest image are built by tools/build-*.sh into
# $(VSTELLAR_CACHE), keyed by their inputs, and recorded in build/guest.env.

include config/versions.mk
export VSTELLAR_CACHE

BUILD := build
OUT := out
NINJA_JOBS ?= $(shell nproc)

.PHONY: all deps host guest kmod deb demo test test-unit test-guest bench fuzz soak clean distclean-cache help

all: deps host guest

help:
	@sed -n '3,10p' Makefile | sed 's/^# *//'

deps:
	@tools/install-deps.sh

$(BUILD)/build.ninja: CMakeLists.txt
	@cmake -S . -B $(BUILD) -G Ninja -Wno-dev > /dev/null

host: deps $(BUILD)/build.ninja
	@cmake $(BUILD) > /dev/null
	@ninja -C $(BUILD) -j$(NINJA_JOBS) --quiet

# Our guest kernel module, built against the pinned guest kernel's headers
# (never the host's running kernel), staged as a tree the image builder
# copies over the guest's root.
KDIR := /usr/src/linux-headers-$(GUEST_KERNEL_ABI)
GUEST_EXTRA := $(BUILD)/guest-extra
KMOD_DIR := kernel/vstellar
# The emulated accelerator's driver (docs/accelerator.md)
KMOD_ACCEL_DIR := kernel/vstellar-accel
# The driver's selftests (tools/testing/selftests style) run inside guests.
KSELFTEST_DIR := tests/kselftest/vstellar
KSELFTEST_PROGS := run_tests.sh ktap.sh vstellar_sysfs.sh vstellar_kverbs.sh vstellar_load.sh vstellar_uverbs

kmod: deps
	@test -d $(KDIR) || { echo "no guest kernel headers in $(KDIR): run make deps" >&2; exit 1; }
	@rm -rf $(GUEST_EXTRA) && mkdir -p $(GUEST_EXTRA)
	@$(MAKE) --no-print-directory -C $(KDIR) M=$(CURDIR)/$(KMOD_DIR) modules > $(BUILD)/kmod.log 2>&1 || \
		{ cat $(BUILD)/kmod.log >&2; exit 1; }
	@install -D -m644 $(KMOD_DIR)/vstellar.ko \
		$(GUEST_EXTRA)/lib/modules/$(GUEST_KERNEL_ABI)/extra/vstellar.ko
	@$(MAKE) --no-print-directory -C $(KDIR) M=$(CURDIR)/$(KMOD_ACCEL_DIR) modules > $(BUILD)/kmod-accel.log 2>&1 || \
		{ cat $(BUILD)/kmod-accel.log >&2; exit 1; }
	@install -D -m644 $(KMOD_ACCEL_DIR)/vstellar_accel.ko \
		$(GUEST_EXTRA)/lib/modules/$(GUEST_KERNEL_ABI)/extra/vstellar_accel.ko
	@$(MAKE) --no-print-directory -s -C $(KSELFTEST_DIR) TOP=$(CURDIR) all
	@mkdir -p $(GUEST_EXTRA)/usr/lib/vstellar-kselftest
	@cp -a $(addprefix $(KSELFTEST_DIR)/,$(KSELFTEST_PROGS)) \
		$(GUEST_EXTRA)/usr/lib/vstellar-kselftest/
	@# MPI programs for guests (tools/mpi), built with Debian's mpicc.
	@$(MAKE) --no-print-directory -s -C tools/mpi OUT=$(CURDIR)/$(BUILD)/mpi all
	@install -D -m755 $(BUILD)/mpi/allreduce_bench $(GUEST_EXTRA)/usr/bin/allreduce_bench

# The guest side: QEMU, rdma-core (with our provider), the guest image. Each
# script prints its cached result; guest.env records them for the launcher.
guest: deps kmod
	@qemu=$$(tools/build-qemu.sh) && \
	 stage=$$(tools/build-rdma-core.sh) && \
	 image=$$(tools/build-guest-image.sh "$$stage" $(GUEST_EXTRA)) && \
	 ctrimg=$$(tools/build-container-image.sh "$$stage") && \
	 printf 'QEMU=%s\nRDMA_CORE_STAGE=%s\nGUEST_IMAGE=%s\nCONTAINER_IMAGE=%s\n' \
		"$$qemu" "$$stage" "$$image" "$$ctrimg" > $(BUILD)/guest.env
	@cat $(BUILD)/guest.env

# Debian packages (dpkg-buildpackage, lintian-checked): the DKMS driver, the
# providers for Debian's rdma-core, vstellard with its systemd unit, and our
# QEMU beside the system's.
deb: deps
	@tools/build-debs.sh $(BUILD)/deb

demo: all
	@tools/demo.sh

# One ctest run covers unit, host and guest tests, so CI reads one summary.
# Leftovers of killed runs (guest and fabric namespaces) are removed first.
#
# What is mostly download and unpacking starts in the background, so that
# a cold run does not wait for it: the guest image's Debian packages
# (fetched while the host code compiles), and the two stock Debian roots the
# packaging tests install into (tools/build-stock-guest.sh --root-only).
# The roots are made at nice 19: they cost minutes of CPU (unpacking, the
# kernel's initramfs), which they take from the cores the compilers and the
# guests leave idle; the packaging tests, which run last, wait on the
# cache's lock if they are not done yet. Both are only a head start: what
# is missing when needed is made by the build or the test itself, which
# reports any failure, so a failed head start is only noted here.
#
# ctest runs CTEST_JOBS tests at a time: the tests that boot guests or
# build a namespace fabric hold a resource lock each (tests/*/CMakeLists.txt),
# so one of them runs at a time and the rest (unit, fuzz, ns-3) fill the
# core a guest under TCG leaves idle. The Debian packages are not built
# before the tests: the packaging tests' fixture, packaging.build, builds
# them beside the guest tests (tests/packaging/CMakeLists.txt).
CTEST_JOBS ?= $(NINJA_JOBS)
test: deps
	@mkdir -p $(BUILD)
	@tools/build-guest-image.sh --fetch-only > $(BUILD)/fetch-debs.log 2>&1 & debs=$$!; \
	 nice -n 19 sh -c 'tools/build-stock-guest.sh --root-only bookworm && tools/build-stock-guest.sh --root-only trixie' \
		> $(BUILD)/stock-roots.log 2>&1 & roots=$$!; \
	 $(MAKE) --no-print-directory all && \
	 tools/vstellar-guest cleanup > /dev/null && \
	 tools/fabric/vsfabric-cli cleanup > /dev/null && \
	 ctest --test-dir $(BUILD) --output-on-failure -j$(CTEST_JOBS) $(CTEST_ARGS); rc=$$?; \
	 wait $$debs || echo "make test: note: fetching the guest image's packages ahead failed ($(BUILD)/fetch-debs.log)" >&2; \
	 wait $$roots || echo "make test: note: making the stock Debian roots ahead failed ($(BUILD)/stock-roots.log)" >&2; \
	 exit $$rc

# Long runs, not in make test (docs/testing.md): the property test over
# SOAK_SCENARIOS seeded scenarios (a failing one prints the command that
# replays it), then tools/soak/guest-soak for SOAK_MINUTES.
SOAK_SCENARIOS ?= 100000
SOAK_MINUTES ?= 30
soak: all
	@VSTELLAR_SCENARIOS=$(SOAK_SCENARIOS) $(BUILD)/tests/engine/vstellar_engine_tests --gtest_filter='Scenarios.*'
	@SOAK_MINUTES=$(SOAK_MINUTES) tools/soak/guest-soak

test-unit: all
	@ctest --test-dir $(BUILD) --output-on-failure -j$(CTEST_JOBS) -LE guest $(CTEST_ARGS)

test-guest: all
	@ctest --test-dir $(BUILD) --output-on-failure -j$(CTEST_JOBS) -L guest $(CTEST_ARGS)

bench: all
	@mkdir -p $(OUT)/bench
	@for b in tools/bench/*/run; do echo "== $$b"; BUILD_DIR=$(BUILD) $$b $(OUT)/bench || exit 1; done
	@echo "results: $(OUT)/bench/"

# libFuzzer targets (tests/fuzz), built with clang in $(BUILD)/fuzz; each
# grows its corpus and keeps what it finds in $(OUT)/fuzz/<target>/.
FUZZ_SECONDS ?= 1800
fuzz: deps
	@FUZZ_BUILD=$(BUILD)/fuzz FUZZ_OUT=$(OUT)/fuzz tools/fuzz.sh all $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(OUT)

# Removes QEMU, rdma-core and guest-image builds and the downloaded sources.
distclean-cache:
	rm -rf $(VSTELLAR_CACHE)
