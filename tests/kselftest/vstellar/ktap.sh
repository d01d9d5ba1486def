#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# Minimal KTAP helpers for the vstellar selftests (busybox sh compatible).
KSFT_PASS=0
KSFT_FAIL=1
KSFT_SKIP=4
ktap_n=0
ktap_fail=0
ktap_skip=0

ktap_plan() { echo "TAP version 13"; echo "1..$1"; }
ktap_ok() { ktap_n=$((ktap_n + 1)); echo "ok $ktap_n $*"; }
ktap_not_ok() { ktap_n=$((ktap_n + 1)); ktap_fail=$((ktap_fail + 1)); echo "not ok $ktap_n $*"; }
ktap_skip() { ktap_n=$((ktap_n + 1)); ktap_skip=$((ktap_skip + 1)); echo "ok $ktap_n # SKIP $*"; }
ktap_check() {  # ktap_check NAME COMMAND...
	name=$1; shift
	if "$@"; then ktap_ok "$name"; else ktap_not_ok "$name"; fi
}
ktap_finish() {
	echo "# totals: $ktap_n tests, $ktap_fail failed, $ktap_skip skipped"
	[ "$ktap_fail" -eq 0 ] || exit $KSFT_FAIL
	[ "$ktap_skip" -lt "$ktap_n" ] || exit $KSFT_SKIP
	exit $KSFT_PASS
}

# The kernel log since the mark, without the lines that are expected.
dmesg_mark() { dmesg | wc -l > /tmp/vstellar-ksft.mark; }
dmesg_since_mark() { dmesg | tail -n +$(($(cat /tmp/vstellar-ksft.mark) + 1)); }
# No oops, warning, lockdep splat or hung task since the mark.
dmesg_clean() {
	! dmesg_since_mark | grep -E "BUG:|WARNING:|Oops|Call Trace|hung_task|INFO: task|circular locking|refcount_t" >&2
}

vstellar_ibdev() {  # name of the vstellar ib device, empty if none
	for d in /sys/class/infiniband/*; do
		[ -e "$d" ] || continue
		case $(readlink -f "$d/device/driver") in
		*/vstellar) basename "$d"; return 0 ;;
		esac
	done
	return 1
}

vstellar_has_device() {  # the virtio device with ID 42 is present
	grep -qs "^0x002a$" /sys/bus/virtio/devices/*/device
}
