#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# Run every vstellar selftest inside a guest; exit 1 if any failed.
dir=$(dirname "$0")
rc=0
run() {
	echo "# selftest: $*"
	"$@"
	r=$?
	[ $r -eq 0 ] || [ $r -eq 4 ] || rc=1
}
run sh "$dir/vstellar_sysfs.sh"
run sh "$dir/vstellar_kverbs.sh"
if [ -x "$dir/vstellar_uverbs" ]; then
	dev=$(. "$dir/ktap.sh"; vstellar_ibdev)
	uv=$(ls /sys/class/infiniband/"$dev"/device/infiniband_verbs 2>/dev/null | head -n1)
	run "$dir/vstellar_uverbs" "/dev/infiniband/${uv:-uverbs0}" "${dev:-vstellar0}"
else
	echo "# selftest: vstellar_uverbs not built (make -C tests/kselftest/vstellar)"
fi
run sh "$dir/vstellar_load.sh"
exit $rc
