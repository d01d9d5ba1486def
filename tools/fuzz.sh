#!/usr/bin/env bash
# The libFuzzer targets in tests/fuzz (what a peer or a guest can send us:
# wire packets, control commands, vhost-user messages, WQEs and doorbells),
# built with clang in their own CMake tree, since the main build uses gcc.
#
#   tools/fuzz.sh build                  configure (once) and build the fuzzers
#   tools/fuzz.sh run TARGET SECONDS     fuzz one target for SECONDS
#   tools/fuzz.sh all SECONDS            every target, one after the other
#   tools/fuzz.sh list                   the targets
#
# A run starts from the seed corpus in tests/fuzz/corpus/TARGET (never
# written to) and the corpus grown by earlier runs in OUT/TARGET/corpus.
# Crashes, leaks and timeouts are kept as OUT/TARGET/crash-* (etc.); replay
# one with  BUILD/fuzz_TARGET FILE.  Exit status: 0 if nothing was found.
#
# FUZZ_BUILD  the clang build tree   (default: build/fuzz in the checkout)
# FUZZ_OUT    grown corpora, crashes (default: out/fuzz in the checkout)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

src=$VSTELLAR_TOP/tests/fuzz
build=${FUZZ_BUILD:-$VSTELLAR_TOP/build/fuzz}
out=${FUZZ_OUT:-$VSTELLAR_TOP/out/fuzz}

targets() {
	local f
	for f in "$src"/fuzz_*.cc; do
		f=${f##*/fuzz_}
		echo "${f%.cc}"
	done
}

build() {
	mkdir -p "$build"
	# ctest may start several runs at once: one builds, the others wait.
	exec 9>"$build/.lock"
	flock 9
	# Configure once, and again when a target was added (CMake lists the
	# fuzz_*.cc files when it configures).
	if [[ ! -f $build/build.ninja ]] || ! targets | cmp -s - "$build/.targets"; then
		command -v clang++ >/dev/null || die "clang++ not found (make deps)"
		log "configuring $build with clang"
		CC=clang CXX=clang++ cmake -S "$src" -B "$build" -G Ninja -Wno-dev \
			-DVSTELLAR_FUZZ=ON >/dev/null
		targets > "$build/.targets"
	fi
	ninja -C "$build" -j2 fuzzers >/dev/null || ninja -C "$build" -j1 fuzzers
	flock -u 9
}

run() {
	local t=$1 secs=$2
	[[ -f $src/fuzz_$t.cc ]] || die "no such target: $t (tools/fuzz.sh list)"
	build
	mkdir -p "$out/$t/corpus"
	log "fuzz_$t for ${secs}s (crashes go to $out/$t/)"
	# -timeout: one input taking longer than 10 s is a hang worth keeping.
	"$build/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
		-print_final_stats=1 -artifact_prefix="$out/$t/" \
		"$out/$t/corpus" "$src/corpus/$t"
}

case ${1:-} in
build) build ;;
list) targets ;;
run) [[ $# == 3 ]] || die "usage: $0 run TARGET SECONDS"; run "$2" "$3" ;;
all)
	[[ $# == 2 ]] || die "usage: $0 all SECONDS"
	status=0
	for t in $(targets); do run "$t" "$2" || status=1; done
	exit $status
	;;
*) die "usage: $0 build | list | run TARGET SECONDS | all SECONDS" ;;
esac
