#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# Kernel verbs: the RDMA core counts the device as a kernel verbs provider,
# the MAD layer's GSI QP (QP1) runs on it, and rdma_cm attaches to it (the
# connection manager's messages travel on that QP).
. "$(dirname "$0")/ktap.sh"

ktap_plan 4
modprobe vstellar 2>/dev/null
dev=$(vstellar_ibdev)
if [ -z "$dev" ]; then
	for i in 1 2 3 4; do ktap_skip "no vstellar ib device (no device or no backend)"; done
	ktap_finish
fi
dmesg_mark
ktap_check "driver says kernel verbs are on" sh -c "dmesg | grep -q '$dev: .*kernel verbs on'"
ktap_check "QP1 of $dev is the MAD layer's GSI QP, in RTS" \
	sh -c "rdma resource show qp link $dev/1 | grep -qE 'lqpn 1 .*type GSI .*state RTS'"
modprobe rdma_cm 2>/dev/null
grep -q configfs /proc/mounts || mount -t configfs configfs /sys/kernel/config
# rdma_cm's configfs takes a directory only for a device its client attached to
ktap_check "rdma_cm attached to $dev" \
	sh -c "mkdir /sys/kernel/config/rdma_cm/$dev && rmdir /sys/kernel/config/rdma_cm/$dev"
ktap_check "no kernel warnings" dmesg_clean
ktap_finish
