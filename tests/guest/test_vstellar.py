"""The vStellar device end to end: two guests, each with vhost-user-vstellar-pci
served by its own vstellard (tools/vstellar-guest --vstellar), unmodified
verbs programs between them over the daemons' UDP transport.

One boot of two guests runs everything (TCG boots are the cost): the device
listing, ibv_rc_pingpong, ibv_ud_pingpong and ibv_uc_pingpong, perftest (one run connected through rdma_cm, -R)
and rping (rdma_cm only: its CM messages travel on the device's QP1).
Asserts behaviour (exit status, rows parsed, sizes and iterations as asked,
the pings' payloads), never timings.
"""
import re
import unittest

from vstellar import guest as vg, perftest as pt

DEV = pt.VSTELLAR_DEVICE
PINGPONG = ("ibv_rc_pingpong", "-g $GIDX -s 4096 -n 50")
# UD: one datagram per message, within the port's active MTU (1024 here)
UD_PINGPONG = ("ibv_ud_pingpong", "-g $GIDX -s 512 -n 50")
# UC: no acknowledgements; 4 packets per message at MTU 1024, on one path
UC_PINGPONG = ("ibv_uc_pingpong", "-g $GIDX -s 4096 -n 50")
# perftest's -x: the IPv4-mapped GID (pt.VSTELLAR_SETUP finds its index).
TESTS = [PINGPONG, UD_PINGPONG, UC_PINGPONG,
         ("ib_write_bw", "-x $GIDX -s 65536 -n 100 -F --report_gbits"),
         ("ib_read_bw", "-x $GIDX -s 65536 -n 100 -F --report_gbits"),
         ("ib_send_bw", "-x $GIDX -s 65536 -n 100 -F --report_gbits"),
         # connected by rdma_cm: the CM's REQ/REP/RTU over the GSI QP
         ("ib_write_bw", "-R -s 65536 -n 100 -F --report_gbits"),
         ("ib_write_lat", "-x $GIDX -s 8 -n 100 -F"),
         ("ib_atomic_bw", "-x $GIDX -n 100 -F")]
BW_TESTS = [t for t in TESTS if t[0].endswith("_bw") and t[0] != "ib_atomic_bw"]


INFO = f"""\
echo '== info'
ibv_devices
ibv_devinfo -d {DEV}
echo "GIDX=$GIDX"
cat /sys/class/infiniband/{DEV}/ports/1/gids/$GIDX
"""


class VstellarTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        vg.Artifacts().vstellard  # missing pieces fail the test: `make test` builds them
        server, client = pt.perftest_pair(TESTS, DEV, setup=pt.VSTELLAR_SETUP + INFO)
        server += pt.RPING_SERVER
        client += pt.RPING_CLIENT
        cls.daemons = []
        cls.results = vg.run_guests([server, client], vstellar=True, timeout=500,
                                    daemons_out=cls.daemons)
        cls.sections = [pt.split_sections(out) for _status, out, _console in cls.results]

    def test_guests_succeeded(self):
        for i, (status, out, console) in enumerate(self.results):
            self.assertEqual(status, 0, f"guest{i}:\n" + "\n".join(console[-80:]) +
                             "\n--- vstellard ---\n" + self.daemons[i]["log"][-3000:])

    def test_device_listed_with_true_values(self):
        for i in range(2):
            info = "\n".join(self.sections[i].get("info", []))
            self.assertRegex(info, rf"(?m)^\s+{DEV}\s+[0-9a-f]{{16}}$")      # ibv_devices
            self.assertRegex(info, rf"hca_id:\s+{DEV}")
            self.assertRegex(info, r"transport:\s+InfiniBand \(0\)")
            self.assertRegex(info, r"state:\s+PORT_ACTIVE \(4\)")
            self.assertRegex(info, r"link_layer:\s+Ethernet")
            self.assertRegex(info, r"vendor_id:\s+0x1af4")
            self.assertRegex(info, r"phys_port_cnt:\s+1")
            # The GID perftest uses is the guest's IPv4 address, 10.77.0.<i+1>.
            self.assertIn(f"0000:0000:0000:0000:0000:ffff:0a4d:000{i + 1}", info)

    def test_pingpongs(self):
        for tool, size in ((PINGPONG, 4096), (UD_PINGPONG, 512), (UC_PINGPONG, 4096)):
            for i in range(2):
                with self.subTest(tool=tool[0], guest=i):
                    out = "\n".join(self.sections[i].get(" ".join(tool), []))
                    # size x iterations x 2 (each iteration is a send and a receive)
                    self.assertRegex(out, rf"(?m)^{size * 50 * 2} bytes in [\d.]+ seconds", out)
                    self.assertRegex(out, r"(?m)^50 iters in [\d.]+ seconds", out)
                    self.assertRegex(out, r"GID ::ffff:10\.77\.0\.\d", out)

    def test_bandwidth(self):
        for tool, args in BW_TESTS:
            with self.subTest(tool=tool):
                out = self.sections[1].get(f"{tool} {args}", [])
                rows = pt.parse_bw(out)
                self.assertEqual(len(rows), 1, self.sections[1])
                self.assertEqual((rows[0]["bytes"], rows[0]["iterations"]), (65536, 100))
                pt.check_rate(self, rows[0]["bw_avg_gbps"], out)

    def test_atomic_bw(self):
        tool, args = TESTS[-1]
        out = self.sections[1].get(f"{tool} {args}", [])
        rows = pt.parse_bw(out)
        self.assertEqual(len(rows), 1, self.sections[1])
        self.assertEqual((rows[0]["bytes"], rows[0]["iterations"]), (8, 100))  # 8-byte atomics
        pt.check_rate(self, rows[0]["msg_rate_mpps"], out)

    def test_write_lat(self):
        tool, args = TESTS[-2]
        rows = pt.parse_lat(self.sections[1].get(f"{tool} {args}", []))
        self.assertEqual(len(rows), 1, self.sections[1])
        self.assertEqual((rows[0]["bytes"], rows[0]["iterations"]), (8, 100))

    def test_rping(self):
        for i in range(2):
            out = "\n".join(self.sections[i].get("rping", []))
            pings = re.findall(r"ping data: rdma-ping-(\d+): ", out)
            self.assertEqual([int(p) for p in pings], list(range(pt.RPING_PINGS)), out)

    def test_daemons_stopped_and_served_one_device_each(self):
        for d in self.daemons:
            self.assertIn("device 0: created", d["log"])
            self.assertIsNotNone(d["stats"])


if __name__ == "__main__":
    unittest.main()
