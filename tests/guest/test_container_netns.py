"""A container's own network namespace: the vStellar device moved into it.

Guest 0 does what a container runtime does for a container with its own
network and an RDMA device: RDMA's exclusive netns mode, a namespace
"ctr", the guest's virtio-net device moved into it and addressed there, and
vstellar0 moved after it (`rdma dev set vstellar0 netns ctr`). The driver
binds the device's GIDs to that net device in whatever namespace it is, so
the GID table follows it; rdma_cm then connects in the namespace (rping and
ib_write_bw -R, served from inside it, clients in guest 1). Deleting the
namespace sends both devices home: the driver binds again, the GID comes
back with the address, and rping works from the initial namespace.
"""
import re
import unittest

from guestlib import KernelUlpCase, splats
from vstellar import perftest as pt

DEV = pt.VSTELLAR_DEVICE
PINGS = 10
BW = "-R -s 65536 -n 100 -F --report_gbits"

# Up to 60 s: a namespace's devices go home when its last user is gone and
# the kernel's cleanup work has run, which takes a while under TCG.
WAIT_HOME = f"""\
n=0
until [ -e /sys/class/net/eth0 ] && [ -e /sys/class/infiniband/{DEV} ]; do
  n=$((n + 1)); [ $n -lt 600 ] || {{ echo "eth0/{DEV} did not come back" >&2; exit 1; }}
  sleep 0.1
done
"""

SERVER = f"""\
# iproute2's ip (the guest's busybox shell prefers its own applet, which
# knows no namespaces)
ip() {{ /bin/ip "$@"; }}
echo '== move'
rdma system set netns exclusive || exit 1
rdma system show
ip netns add ctr || exit 1
ip link set eth0 netns ctr || exit 1
ip -n ctr link set lo up
ip -n ctr addr add $VSTELLAR_SELF_IP/24 dev eth0 || exit 1
ip -n ctr link set eth0 up
rdma dev set {DEV} netns ctr || exit 1
echo "initial-ns: [$(rdma dev show | grep -c {DEV})] [$(ls /sys/class/infiniband)]"
ip netns exec ctr sh -e -c '
{pt.wait_roce_gid(DEV)}
echo "== in-ctr"
echo "ctr: [$(rdma dev show | grep -c {DEV})] GID $GIDX $(cat /sys/class/infiniband/{DEV}/ports/1/gids/$GIDX) $(cat /sys/class/infiniband/{DEV}/ports/1/gid_attrs/ndevs/$GIDX)"
ibv_devices
echo "== rping ctr"
{pt.rping_server(PINGS)}
echo "== ib_write_bw {BW}"
timeout 200 ib_write_bw -d {DEV} -p 18515 {BW}
' || exit 1
echo '== home'
ip netns del ctr
{WAIT_HOME}
ip addr add $VSTELLAR_SELF_IP/24 dev eth0 || exit 1
ip link set eth0 up
{pt.wait_roce_gid(DEV)}
echo "home: GID $GIDX $(cat /sys/class/infiniband/{DEV}/ports/1/gids/$GIDX)"
echo "== rping home"
{pt.rping_server(PINGS)} || exit 1
echo '== dmesg'
dmesg | grep 'GIDs from net device'
"""

RPING_CLIENT = pt.rping_client(PINGS, 60)

CLIENT = (pt.VSTELLAR_SETUP + pt.client_retry(pt.PERFTEST_NOT_LISTENING, 120) +
          "echo '== rping ctr'\n" + RPING_CLIENT +
          f"echo '== ib_write_bw {BW}'\n"
          f"run_client ib_write_bw -d {DEV} -p 18515 {BW} $VSTELLAR_PEER_IP || exit 1\n"
          "echo '== rping home'\n" + RPING_CLIENT)


class ContainerNetnsTest(KernelUlpCase):
    SCRIPTS = (SERVER, CLIENT)
    TIMEOUT = 400

    def test_device_left_the_initial_namespace(self):
        move = "\n".join(self.sections[0].get("move", []))
        self.assertIn("netns exclusive", move)
        self.assertRegex(move, r"initial-ns: \[0\] \[\]", move)

    def test_gid_follows_the_net_device_into_the_namespace(self):
        ctr = "\n".join(self.sections[0].get("in-ctr", []))
        self.assertRegex(ctr, r"ctr: \[1\] GID \d+ 0000:0000:0000:0000:0000:ffff:0a4d:0001 eth0", ctr)
        self.assertIn(DEV, ctr)  # ibv_devices in the namespace

    def test_rdma_cm_in_the_namespace_and_back_home(self):
        for where in ("ctr", "home"):
            for i in range(2):
                with self.subTest(where=where, guest=i):
                    out = "\n".join(self.sections[i].get(f"rping {where}", []))
                    pings = re.findall(r"ping data: rdma-ping-(\d+): ", out)
                    self.assertEqual([int(p) for p in pings], list(range(PINGS)), out)

    def test_write_bw_through_rdma_cm_in_the_namespace(self):
        rows = pt.parse_bw(self.sections[1].get(f"ib_write_bw {BW}", []))
        self.assertEqual(len(rows), 1, self.sections[1])
        self.assertEqual((rows[0]["bytes"], rows[0]["iterations"]), (65536, 100))

    def test_no_kernel_splats(self):
        for i in range(2):
            self.assertEqual(splats(self.results[i][1]), 0, self.results[i][1][-30:])

    def test_binding_followed_the_net_device(self):
        # bound at probe, in the namespace, at home again: three namespaces'
        # worth of bindings, the first and last the same (the initial one)
        lines = self.sections[0].get("dmesg", [])
        inums = [int(m.group(1)) for m in
                 (re.search(r"GIDs from net device eth0 \(netns (\d+)\)", ln) for ln in lines) if m]
        self.assertEqual(len(inums), 3, lines)
        self.assertEqual(inums[0], inums[2], lines)
        self.assertNotEqual(inums[0], inums[1], lines)


if __name__ == "__main__":
    unittest.main()
