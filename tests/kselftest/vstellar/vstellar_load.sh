#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# Load and unload vstellar.ko repeatedly: the module probes (or fails its
# probe cleanly when no backend answers), registers the ib_device when the
# backend serves it, unloads with nothing held, and leaves no splat.
. "$(dirname "$0")/ktap.sh"
ROUNDS=${VSTELLAR_KSFT_ROUNDS:-5}

ktap_plan 5
if ! vstellar_has_device; then
	for i in 1 2 3 4 5; do ktap_skip "no virtio device 42 in this guest"; done
	ktap_finish
fi
rmmod vstellar 2>/dev/null
dmesg_mark

ok=1; registered=0
i=0
while [ $i -lt "$ROUNDS" ]; do
	modprobe vstellar || ok=0
	[ -n "$(vstellar_ibdev)" ] && registered=$((registered + 1))
	rmmod vstellar || ok=0
	i=$((i + 1))
done
ktap_check "load and unload $ROUNDS times" [ $ok -eq 1 ]
if [ $registered -eq 0 ]; then
	ktap_skip "ib_device registered every time (backend does not serve commands)"
else
	ktap_check "ib_device registered every time" [ $registered -eq "$ROUNDS" ]
fi
ktap_check "module gone after unload" sh -c '! grep -q "^vstellar " /proc/modules'
ktap_check "no ib device left behind" sh -c '[ -z "$(ls /sys/class/infiniband 2>/dev/null | grep ^vstellar)" ]'
ktap_check "no oops, warning or hung task" dmesg_clean
ktap_finish
