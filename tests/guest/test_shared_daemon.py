"""One vstellard serving several guests (issue 26): each guest's device
attaches through its own `--device SOCK,ip=V4,ip=V6` socket of a shared
daemon and holds its own IPv4 and IPv6 addresses as RoCE v2 GIDs
(vstellar-guest run --shared-daemon / --daemons K --ipv6).

- SharedDaemonTest: two guests on one daemon run rping, ib_write_bw,
  ibv_ud_pingpong and librdmacm's ucmatose over IPv4 and over IPv6 between
  them. bookworm's perftest (4.5-0.17) resolves rdma_cm addresses as
  IPv4 only, so `ib_write_bw -R` runs over IPv4 and the IPv6 ib_write_bw
  is connected over TCP with the IPv6 GID (`-x $GIDX6`).
- TwoDaemonsTest: four guests on two daemons (guests 0 and 1 on one, 2 and
  3 on the other) run rping across every pair, over IPv4 and IPv6, in
  three rounds of two disjoint pairs per address family. Then guest 1 puts
  guest 0's addresses (the other device of its own daemon) on its eth0:
  the daemon refuses them as GIDs (the kernel logs "GID add failed" and
  the table does not list them), an rping from them fails, and a
  wildcard rping listener on guest 1 hears nothing while guest 2 connects
  to guest 0 at those addresses on its port: QP 1 traffic for guest 0's
  addresses reaches guest 0 only.

Each scenario is one boot (TCG boots are the cost); every exchange is
synchronised by its client retrying until the server listens, never by
sleeping. Asserts behaviour (exit statuses, the pings' payloads, rows
parsed, which GIDs are listed), never timings.
"""
import re
import unittest

from vstellar import guest as vg, perftest as pt

from guestlib import SPLATS, splats

DEV = pt.VSTELLAR_DEVICE
SETUP = pt.VSTELLAR_SETUP + pt.wait_roce_gid6(DEV)
PINGS = 5

# Print the GID table as "gid INDEX VALUE" lines (empty entries left out).
GIDS = f"""\
for g in /sys/class/infiniband/{DEV}/ports/1/gids/*; do
  v=$(cat $g 2>/dev/null)
  case "$v" in ""|0000:0000:0000:0000:0000:0000:0000:0000) ;; *) echo "gid ${{g##*/}} $v" ;; esac
done
"""


def gid_of(addr):
    """How sysfs prints the RoCE v2 GID of an address."""
    import ipaddress
    a = ipaddress.ip_address(addr)
    if a.version == 4:
        a = ipaddress.IPv6Address("::ffff:" + addr)
    return a.exploded


def rping_server(addr, port, pings=PINGS):
    return f"timeout 120 rping -s -a {addr} -p {port} -C {pings} -v || exit 1\n"


def rping_client(addr, port, pings=PINGS, tries=60):
    """rping to addr, retried once a second (at most tries times) while the
    server does not listen yet; prints the last try's output. A try that
    got as far as pinging is not retried: its failure is the test's, and
    every try's output is printed with it."""
    return f"""\
i=0
: > /tmp/rping.all
until timeout 60 rping -c -a {addr} -p {port} -C {pings} -v > /tmp/rping.out 2>&1; do
  echo "try $i: status $?" >> /tmp/rping.all; cat /tmp/rping.out >> /tmp/rping.all
  i=$((i + 1))
  if grep -q 'ping data' /tmp/rping.out || [ $i -ge {tries} ]; then cat /tmp/rping.all; exit 1; fi
  sleep 1
done
cat /tmp/rping.out
"""


# ucmatose's client when nobody listens: the CM's REJ (invalid service id).
UCMA_CLIENT = """\
ucma_client() {
  i=0
  while [ $i -lt 60 ]; do
    timeout 60 ucmatose "$@" > /tmp/ucma.out 2>&1 && { cat /tmp/ucma.out; return 0; }
    grep -q "REJECTED" /tmp/ucma.out || { cat /tmp/ucma.out; return 1; }
    i=$((i + 1)); sleep 1
  done
  cat /tmp/ucma.out; return 1
}
"""

# (name, server side, client side) of the two-guest scenario, in order.
# ucmatose: one connection, 10 messages each way (its defaults).
PAIR_TESTS = [
    ("rping v4", rping_server("$VSTELLAR_SELF_IP", 7174), rping_client("$VSTELLAR_PEER_IP", 7174)),
    ("rping v6", rping_server("$VSTELLAR_SELF_IP6", 7175), rping_client("$VSTELLAR_PEER_IP6", 7175)),
    ("ucmatose v4", "timeout 120 ucmatose -b $VSTELLAR_SELF_IP -p 7471 || exit 1\n",
     "ucma_client -s $VSTELLAR_PEER_IP -p 7471 || exit 1\n"),
    ("ucmatose v6", "timeout 120 ucmatose -b $VSTELLAR_SELF_IP6 -p 7472 || exit 1\n",
     "ucma_client -s $VSTELLAR_PEER_IP6 -p 7472 || exit 1\n"),
]
# Through perftest_pair (its own retrying client): connected by rdma_cm over
# IPv4, by TCP with the IPv6 GID, and UD datagrams on either GID.
VERBS_TESTS = [("ib_write_bw", "-R -s 65536 -n 100 -F --report_gbits"),
               ("ib_write_bw", "-x $GIDX6 -s 65536 -n 100 -F --report_gbits"),
               ("ibv_ud_pingpong", "-g $GIDX -s 512 -n 50"),
               ("ibv_ud_pingpong", "-g $GIDX6 -s 512 -n 50")]

REPORT = "echo '== gids'\n" + GIDS + "echo \"gid-add-failed $(dmesg | grep -c 'GID add failed')\"\n"


def pair_scripts():
    server, client = [SETUP, REPORT], [SETUP, UCMA_CLIENT]
    for name, s, c in PAIR_TESTS:
        server += [f"echo '== {name}'\n", s]
        client += [f"echo '== {name}'\n", c]
    vs, vc = pt.perftest_pair(VERBS_TESTS, DEV)
    return ("".join(server) + vs + SPLATS, "".join(client) + vc + REPORT + SPLATS)


def daemon_of(daemons, guest):
    return next(d for d in daemons if guest in d["guests"])


class SharedDaemonCase(unittest.TestCase):
    def assertGuestsSucceeded(self):
        for i, (status, out, console) in enumerate(self.results):
            with self.subTest(guest=i):
                self.assertEqual(status, 0, f"guest{i}:\n" + "\n".join(out[-60:] + console[-60:]) +
                                 "\n--- vstellard ---\n" + daemon_of(self.daemons, i)["log"][-3000:])

    def assertPings(self, lines, what):
        pings = re.findall(r"ping data: rdma-ping-(\d+): ", "\n".join(lines))
        self.assertEqual([int(p) for p in pings], list(range(PINGS)), f"{what}:\n" + "\n".join(lines))

    def assertNoSplats(self):
        for i, (_status, out, _console) in enumerate(self.results):
            self.assertEqual(splats(out), 0, f"guest{i}:\n" + "\n".join(out[-60:]))


class SharedDaemonTest(SharedDaemonCase):
    """Two guests, one vstellard."""

    @classmethod
    def setUpClass(cls):
        vg.Artifacts().vstellard  # missing pieces fail the test: `make test` builds them
        cls.daemons = []
        # Two worker threads: the guests' devices are accepted on different
        # workers, and the first QP to connect moves one to the other's.
        cls.results = vg.run_guests(list(pair_scripts()), vstellar=True, ipv6=True, shared_daemons=1,
                                    vstellard_args=["--threads", "2"], timeout=400, daemons_out=cls.daemons)
        cls.sections = [pt.split_sections(out) for _status, out, _console in cls.results]

    def test_guests_succeeded(self):
        self.assertGuestsSucceeded()
        self.assertNoSplats()

    def test_one_daemon_served_both_devices(self):
        self.assertEqual(len(self.daemons), 1)
        d = self.daemons[0]
        self.assertEqual(d["guests"], [0, 1])
        self.assertIn("device 0: created", d["log"])
        self.assertIn("device 1: created", d["log"])
        self.assertIsNotNone(d["stats"], d["log"][-2000:])
        self.assertGreater(d["stats"]["engine"]["tx_bytes"], 2 * 65536 * 100, d["stats"]["engine"])

    def test_devices_placed_on_one_worker(self):
        # The guests' devices talk only to each other: one moved to the
        # other's worker when their first QP connected, and stayed there
        # (rping, ucmatose, perftest and QP 1 all ran after the move).
        d = self.daemons[0]
        self.assertEqual(d["stats"]["threads"], 2)
        self.assertEqual(d["stats"]["device_moves"], 1, d["log"][-3000:])
        self.assertRegex(d["log"], r"device [01]: moved from worker [01] to worker [01], where its peers are")

    def test_each_device_holds_its_own_addresses(self):
        for i in range(2):
            with self.subTest(guest=i):
                out = self.sections[i].get("gids", [])
                gids = [line.split()[2] for line in out if line.startswith("gid ")]
                self.assertIn(gid_of(vg.guest_ip(i)), gids, out)
                self.assertIn(gid_of(vg.guest_ip6(i)), gids, out)
                self.assertTrue(any(g.startswith("fe80:") for g in gids), out)
                self.assertNotIn(gid_of(vg.guest_ip(1 - i)), gids, out)
                self.assertIn("gid-add-failed 0", out)

    def test_rping(self):
        for fam in ("v4", "v6"):
            for i in range(2):
                with self.subTest(family=fam, guest=i):
                    self.assertPings(self.sections[i].get(f"rping {fam}", []), f"guest{i}")

    def test_ucmatose(self):
        for fam in ("v4", "v6"):
            for i in range(2):
                with self.subTest(family=fam, guest=i):
                    out = self.sections[i].get(f"ucmatose {fam}", [])
                    self.assertIn("data transfers complete", out, out)
                    self.assertIn("return status 0", out, out)

    def test_ib_write_bw(self):
        for args, gid in (("-R -s 65536 -n 100 -F --report_gbits", r"GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:0\d"),
                          ("-x $GIDX6 -s 65536 -n 100 -F --report_gbits", r"GID: 253:119:00:00:00:00:00:00:00:00:00:00:00:00:00:0\d")):
            with self.subTest(args=args):
                out = self.sections[1].get(f"ib_write_bw {args}", [])
                rows = pt.parse_bw(out)
                self.assertEqual(len(rows), 1, out)
                self.assertEqual((rows[0]["bytes"], rows[0]["iterations"]), (65536, 100))
                pt.check_rate(self, rows[0]["bw_avg_gbps"], out)
                self.assertRegex("\n".join(out), gid)

    def test_ud_pingpong(self):
        for args, gid in (("-g $GIDX -s 512 -n 50", r"GID ::ffff:10\.77\.0\.\d"), ("-g $GIDX6 -s 512 -n 50", r"GID fd77::\d")):
            for i in range(2):
                with self.subTest(args=args, guest=i):
                    out = "\n".join(self.sections[i].get(f"ibv_ud_pingpong {args}", []))
                    self.assertRegex(out, rf"(?m)^{512 * 50 * 2} bytes in [\d.]+ seconds", out)
                    self.assertRegex(out, r"(?m)^50 iters in [\d.]+ seconds", out)
                    self.assertRegex(out, gid, out)


# Four guests on two daemons: every pair once per address family, in rounds
# of two disjoint pairs, the lower index serving.
ROUNDS = [[(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 3), (1, 2)]]
FAMILIES = (("v4", vg.guest_ip), ("v6", vg.guest_ip6))

# Guest 1 takes guest 0's addresses (same daemon, the other device): port
# of the wildcard listener and of guest 0's servers, and the gates.
QP1_PORT, READY_PORT, DONE_PORT = 7300, 7301, 7302
THIEF, VICTIM, CALLER = 1, 0, 2


def matrix_script(me):
    out = [SETUP]
    for fam, addr in FAMILIES:
        for r, pairs in enumerate(ROUNDS):
            port = 7200 + 10 * r + (fam == "v6")
            for a, b in pairs:
                if me == a:
                    out += [f"echo '== rping {a}-{b} {fam}'\n", rping_server(addr(a), port)]
                elif me == b:
                    out += [f"echo '== rping {a}-{b} {fam}'\n", rping_client(addr(a), port)]
    return "".join(out)


def foreign_script(me):
    """Scenario (c): what guest `me` does once the matrix is done."""
    v4, v6 = vg.guest_ip(VICTIM), vg.guest_ip6(VICTIM)
    if me == THIEF:
        return f"""\
echo '== foreign'
timeout 200 rping -s -a :: -p {QP1_PORT} -C 1 -v > /tmp/wild.out 2>&1 &
wild=$!
/bin/ip addr add {v4}/32 dev eth0 || exit 1
/bin/ip -6 addr add {v6}/128 dev eth0 nodad || exit 1
# the kernel adds (tries to add) a netdev address's GID from a work queue
n=0
until [ $(dmesg | grep -c 'GID add failed') -ge 2 ] || [ $n -ge 100 ]; do sleep 0.1; n=$((n + 1)); done
{GIDS}dmesg | grep 'GID add failed'
echo "gid-add-failed $(dmesg | grep -c 'GID add failed')"
/bin/ip -br addr show dev eth0
echo '== rping from foreign v4'
timeout 60 rping -c -a {vg.guest_ip(CALLER)} -I {v4} -p {READY_PORT} -C 1 -v; echo "status $?"
echo '== rping from foreign v6'
timeout 60 rping -c -a {vg.guest_ip6(CALLER)} -I {v6} -p {READY_PORT} -C 1 -v; echo "status $?"
echo '== ready'
{rping_client(vg.guest_ip(CALLER), READY_PORT, pings=1)}echo '== done'
{rping_server(vg.guest_ip(THIEF), DONE_PORT, pings=1)}echo '== wildcard'
kill $wild; wait $wild; echo "status $?"
cat /tmp/wild.out
"""
    if me == VICTIM:
        return (f"echo '== qp1 v4'\n{rping_server(v4, QP1_PORT)}"
                f"echo '== qp1 v6'\n{rping_server(v6, QP1_PORT)}")
    if me == CALLER:
        return (f"echo '== ready'\n{rping_server(vg.guest_ip(CALLER), READY_PORT, pings=1)}"
                f"echo '== qp1 v4'\n{rping_client(v4, QP1_PORT)}"
                f"echo '== qp1 v6'\n{rping_client(v6, QP1_PORT)}"
                f"echo '== done'\n{rping_client(vg.guest_ip(THIEF), DONE_PORT, pings=1)}")
    return ""


class TwoDaemonsTest(SharedDaemonCase):
    """Four guests, two vstellards serving two each."""

    @classmethod
    def setUpClass(cls):
        vg.Artifacts().vstellard
        cls.daemons = []
        scripts = [matrix_script(i) + foreign_script(i) + SPLATS for i in range(4)]
        cls.results = vg.run_guests(scripts, vstellar=True, ipv6=True, shared_daemons=2,
                                    timeout=400, daemons_out=cls.daemons)
        cls.sections = [pt.split_sections(out) for _status, out, _console in cls.results]

    def test_guests_succeeded(self):
        self.assertGuestsSucceeded()
        self.assertNoSplats()

    def test_two_daemons_two_devices_each(self):
        self.assertEqual([d["guests"] for d in self.daemons], [[0, 1], [2, 3]])
        for d in self.daemons:
            self.assertIn("device 1: created", d["log"])
            self.assertIsNotNone(d["stats"], d["log"][-2000:])

    def test_rping_every_pair(self):
        for fam, _addr in FAMILIES:
            for pairs in ROUNDS:
                for a, b in pairs:
                    for i in (a, b):
                        with self.subTest(pair=(a, b), family=fam, guest=i):
                            self.assertPings(self.sections[i].get(f"rping {a}-{b} {fam}", []), f"guest{i}")

    def test_foreign_address_is_not_a_gid(self):
        out = self.sections[THIEF].get("foreign", [])
        gids = [line.split()[2] for line in out if line.startswith("gid ")]
        self.assertIn(gid_of(vg.guest_ip(THIEF)), gids, out)
        self.assertIn(gid_of(vg.guest_ip6(THIEF)), gids, out)
        self.assertNotIn(gid_of(vg.guest_ip(VICTIM)), gids, out)
        self.assertNotIn(gid_of(vg.guest_ip6(VICTIM)), gids, out)
        # both addresses are on eth0, and both were refused
        self.assertRegex("\n".join(out), rf"eth0 .*{re.escape(vg.guest_ip(VICTIM))}/32", out)
        failed = [int(line.split()[1]) for line in out if line.startswith("gid-add-failed ")]
        self.assertEqual(len(failed), 1, out)
        self.assertGreaterEqual(failed[0], 2, out)

    def test_rping_from_foreign_address_fails(self):
        for fam in ("v4", "v6"):
            with self.subTest(family=fam):
                out = self.sections[THIEF].get(f"rping from foreign {fam}", [])
                status = [line for line in out if line.startswith("status ")]
                self.assertEqual(len(status), 1, out)
                self.assertNotEqual(status[0], "status 0", out)
                # refused before any packet: no device holds the source address
                self.assertIn("rdma_resolve_addr: No such device", out)
                self.assertNotRegex("\n".join(out), r"ping data", out)

    def test_qp1_traffic_reaches_its_device_only(self):
        for fam in ("v4", "v6"):
            with self.subTest(family=fam):
                self.assertPings(self.sections[VICTIM].get(f"qp1 {fam}", []), f"guest{VICTIM}")
                self.assertPings(self.sections[CALLER].get(f"qp1 {fam}", []), f"guest{CALLER}")
        out = self.sections[THIEF].get("wildcard", [])
        # killed while still listening (SIGTERM: 143), having heard nothing
        self.assertIn("status 143", out, out)
        self.assertNotRegex("\n".join(out), r"ping data|connect|error", out)


if __name__ == "__main__":
    unittest.main()
