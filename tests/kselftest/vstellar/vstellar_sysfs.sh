#!/bin/sh
# SPDX-License-Identifier: GPL-2.0-only
# The registered ib_device as the RDMA core shows it: RoCE v2 port bound
# to the guest's virtio-net, GIDs from its addresses, device attributes
# from QUERY_DEVICE, uverbs node for the provider.
. "$(dirname "$0")/ktap.sh"

ktap_plan 9
modprobe vstellar 2>/dev/null
dev=$(vstellar_ibdev)
if [ -z "$dev" ]; then
	for i in 1 2 3 4 5 6 7 8 9; do ktap_skip "no vstellar ib device (no device or no backend)"; done
	ktap_finish
fi
d=/sys/class/infiniband/$dev
ktap_check "node_type is CA" grep -q "^1: CA" $d/node_type
ktap_check "link layer is Ethernet" grep -qx Ethernet $d/ports/1/link_layer
ktap_check "port is ACTIVE" grep -q "ACTIVE" $d/ports/1/state
ktap_check "node_guid set" sh -c "! grep -qx '0000:0000:0000:0000' $d/node_guid"
if ! ls /sys/bus/virtio/drivers/virtio_net/ 2>/dev/null | grep -q virtio; then
	ktap_skip "GID types are RoCE v2: the guest has no virtio-net"
	ktap_skip "GID 0 bound to a net device: the guest has no virtio-net"
	ktap_skip "IPv4 address is a GID: the guest has no virtio-net"
	ktap_check "uverbs node exists" sh -c "ls /sys/class/infiniband_verbs/ | grep -q uverbs"
	ktap_check "rdma link shows the port" sh -c "rdma link show $dev/1 | grep -q 'state ACTIVE'"
	ktap_finish
fi
ndev=$(cat $d/ports/1/gid_attrs/ndevs/0 2>/dev/null)
ktap_check "GID types are RoCE v2" sh -c "grep -qx 'RoCE v2' $d/ports/1/gid_attrs/types/0"
ktap_check "GID 0 bound to a net device ($ndev)" [ -n "$ndev" ]
ip4=$(ip -4 -o addr show dev "$ndev" 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -n1)
if [ -n "$ip4" ]; then
	hex=$(echo "$ip4" | awk -F. '{printf "%02x%02x:%02x%02x", $1, $2, $3, $4}')
	ktap_check "IPv4 $ip4 is a GID" grep -qx "0000:0000:0000:0000:0000:ffff:$hex" $d/ports/1/gids/*
else
	ktap_skip "$ndev has no IPv4 address"
fi
ktap_check "uverbs node exists" sh -c "ls /sys/class/infiniband_verbs/ | grep -q uverbs"
ktap_check "rdma link shows the port" sh -c "rdma link show $dev/1 | grep -q 'state ACTIVE'"
ktap_finish
