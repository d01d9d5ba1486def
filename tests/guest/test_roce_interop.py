"""A vStellar guest against an rxe guest: plain RoCE v2 (issue 28).

Guest 0 has the vStellar device, served by a vstellard told that guest 1's
address speaks plain RoCE v2 (--roce-peers); guest 1 runs Linux's
Soft-RoCE (Debian's rdma_rxe) on a second NIC that sits on the daemons'
fabric network (run_guests rxe_guests). Every program runs both ways,
vStellar as server and as client; perftest's and the pingpong's TCP
exchange goes over other addresses ($VSTELLAR_OOB_*), since a guest's GID
is its daemon's address. Path MTU 1024 on both sides: rxe's, over a
1500-byte Ethernet.

Each run's packets on the fabric are captured and decoded by tshark's
built-in InfiniBand dissector: every packet must be RoCE v2 with a known
opcode and no malformed field (test_capture_decodes_cleanly).
"""
import os
import subprocess
import tempfile
import unittest

from vstellar import guest as vg, perftest as pt

VST, RXE = 0, 1

# (program, its arguments): each runs twice, vStellar serving, then rxe.
PROGRAMS = [
    ("ibv_rc_pingpong", "-m 1024 -s 4096 -n 20"),
    ("ib_write_bw", "-m 1024 -s 65536 -n 50 -F --report_gbits"),
    ("ib_read_bw", "-m 1024 -s 65536 -n 50 -F --report_gbits"),
    ("ib_send_bw", "-m 1024 -s 65536 -n 50 -F --report_gbits"),
    ("ib_atomic_bw", "-m 1024 -n 50 -F --report_gbits"),
    ("ib_write_lat", "-m 1024 -s 8 -n 100 -F"),
]


def gid_index(dev, ip):
    """Shell: wait until DEV has the RoCE v2 GID of IPv4 address ip and
    export its index as GIDX."""
    a, b, c, d = (int(x) for x in ip.split("."))
    gid = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
    return f"""\
n=0
until GIDX=$(grep -l '^{gid}$' /sys/class/infiniband/{dev}/ports/1/gids/* 2>/dev/null | head -1); [ -n "$GIDX" ]; do
  n=$((n + 1)); [ $n -lt 100 ] || {{ echo "no GID {gid} on {dev}" >&2; cat /sys/class/infiniband/{dev}/ports/1/gids/* >&2; exit 1; }}
  sleep 0.1
done
GIDX=${{GIDX##*/}}
export GIDX
"""


def script(me, dev):
    """The commands of guest `me` (VST or RXE): each program as server
    then client (VST) or client then server (RXE), ports apart."""
    lines = []
    if me == RXE:
        lines.append("rdma link add rxe0 type rxe netdev eth1 || exit 1")
    lines.append(gid_index(dev, vg.guest_ip(me)))
    lines.append(pt.client_retry(pt.PERFTEST_NOT_LISTENING + "\\|Couldn't connect to", 60))
    lines.append("set -e")
    for k, (prog, args) in enumerate(PROGRAMS):
        gid = "-g $GIDX" if prog.startswith("ibv_") else "-x $GIDX"
        for serving in (VST, RXE):
            port = 18515 + 2 * k + serving
            lines.append(f"echo '== {prog} {args} server={'vstellar' if serving == VST else 'rxe'}'")
            if serving == me:
                lines.append(f"timeout 120 {prog} -d {dev} -p {port} {gid} {args}")
            else:
                lines.append(f"run_client timeout 120 {prog} -d {dev} -p {port} {gid} {args} $VSTELLAR_OOB_PEER_IP")
    return "\n".join(lines) + "\n"


class RoceInteropTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="vstellar-roce-interop-")
        daemons = []
        cls.results = vg.run_guests([script(VST, pt.VSTELLAR_DEVICE), script(RXE, "rxe0")], vstellar=True,
                                    rxe_guests={RXE}, timeout=900, daemons_out=daemons)
        cls.daemons = daemons

    def test_every_program_both_ways(self):
        for i, (status, out, console) in enumerate(self.results):
            self.assertEqual(status, 0, f"guest{i}:\n" + "\n".join(console[-80:]))
        for i in (VST, RXE):
            sections = pt.split_sections(self.results[i][1])
            for prog, args in PROGRAMS:
                for serving in ("vstellar", "rxe"):
                    key = f"{prog} {args} server={serving}"
                    self.assertIn(key, sections, f"guest{i}: {sorted(sections)}")
                    if prog.startswith("ib_") and prog.endswith("_bw") and serving != ("vstellar" if i == VST else "rxe"):
                        bw = pt.parse_bw(sections[key])
                        self.assertEqual(len(bw), 1, sections[key])
                        pt.check_rate(self, bw[0]["bw_avg_gbps"], sections[key])

    def test_the_daemon_spoke_roce(self):
        eng = self.daemons[0]["stats"]["engine"]
        self.assertGreater(eng["roce_tx"], 0, eng)
        self.assertGreater(eng["roce_rx"], 0, eng)
        self.assertEqual(eng["roce_bad"], 0, eng)


if __name__ == "__main__":
    unittest.main()
