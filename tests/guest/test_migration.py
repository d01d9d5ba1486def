"""Live migration of a guest whose RDMA keeps running (issue 29;
docs/running-guests.md, "Live migration").

Two guests with vStellar: guest 0, the peer, stays on host 0; guest 1
starts on host 1 with one device, vstellar0, and gets a second one,
vstellar1, hot-plugged from the same vstellard (QMP device_add) once it
has booted, for a second address of its eth0. On each device guest 1 runs migrate_rdma.py's
initiator against a target of its own in guest 0: RDMA WRITEs checked by
READs, and SENDs checked for order, all the time. While both run, guest
1 is migrated (QEMU's `migrate`) first to host 3, whose vstellard has
another engine shape (--paths) and must refuse the devices' state: the
migration fails and the guest runs on at host 1; then ROUND_TRIPS times
to host 2 and back to host 1, each time with the RDMA state of both
devices in the migration stream, its address moving with it; then the
host types "stop-traffic" into guest 1's console and the programs end.
The test wants no failed completion, every byte and every SEND on both
devices, every program exiting 0, the refused migration failed and the
others completed, no kernel warnings, and nothing leaked by either
daemon: after the last round trip each has the open files, about the
mappings and exactly the memory charge it had after the first. It prints
each migration's downtime and the longest gap in the traffic.
"""
import os
import time
import unittest

from guestlib import MAPS_SLACK, SPLATS, settled_usage, splats
from vstellar import guest as vg, migration as vm, perftest as pt

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {}
for name in ("rdma_pair.py", "migrate_rdma.py"):
    with open(os.path.join(HERE, name)) as f:
        SCRIPTS[name] = f.read()
PORT = 18530
ROUND_TRIPS = 10
# The traffic stops when the host says so; this only bounds it.
SECONDS = 900
STOP = "/tmp/stop-traffic"
# Guest RAM (MiB): under TCG a migration takes about 8 s a GiB (the dirty
# log re-arms the TLB's traps at each sync); the programs need far less.
MEM = 512


FILES = "".join(f"cat > /tmp/{n} <<'EOF'\n{SCRIPTS[n]}EOF\n" for n in SCRIPTS)


def rdma_side(name, args):
    """Shell: migrate_rdma.py with args in the background, each line of its
    output prefixed with name (the device it runs on)."""
    return (f"( python3 /tmp/migrate_rdma.py {args} 2>&1 || echo migrate_rdma-failed ) | "
            f"while IFS= read -r l; do echo \"{name} $l\"; done &\n")


# Guest 0: a target per device of guest 1, both on its one device.
TARGET = pt.VSTELLAR_SETUP + FILES + rdma_side("dev0", f"target {pt.VSTELLAR_DEVICE} $GIDX {PORT}") + \
    rdma_side("dev1", f"target {pt.VSTELLAR_DEVICE} $GIDX {PORT + 1}") + "wait\n"
# Guest 1: "plug-now" (the host hot-plugs vstellar1), then an initiator
# on each device once vstellar1 has its GID, each until the host types a
# line into the console.
INITIATOR = pt.VSTELLAR_SETUP + FILES + f"ip addr add {vm.PLUG_IP}/24 dev eth0\necho plug-now\n" + \
    f"(read -r _ < /dev/ttyS0; touch {STOP}) &\n" + pt.wait_roce_gid("vstellar1", "GIDX1", seconds=120) + \
    rdma_side("dev0", f"initiator {pt.VSTELLAR_DEVICE} $GIDX $VSTELLAR_PEER_IP {PORT} {SECONDS} {STOP}") + \
    "p0=$!\n" + \
    rdma_side("dev1", f"initiator vstellar1 $GIDX1 $VSTELLAR_PEER_IP {PORT + 1} {SECONDS} {STOP}") + \
    "wait $p0 $!\n"


def footprint(d, destroyed):
    """A daemon's footprint once it has destroyed `destroyed` devices
    (its log says so as it starts freeing one) and its fds and mappings
    have stopped changing, with the memory it charges its devices."""
    deadline = time.monotonic() + 30
    while d.text().count(": destroyed") < destroyed:
        if time.monotonic() > deadline:
            raise vg.GuestError(f"vstellard {d.sock} destroyed fewer than {destroyed} devices:\n{d.text()[-2000:]}")
        time.sleep(0.05)
    u = settled_usage(d.proc.pid, timeout=max(1, deadline - time.monotonic()))
    u["charged"] = d.counters()["memory"]["used"]
    return u


class MigrationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        vg.Artifacts().vstellard
        cls.daemons, cls.migrations = [], []
        # Hosts 1 and 2's footprints each time guest 1 is back on host 1
        cls.footprints = []

        def after_each(record, daemons):
            if record["status"] == "completed" and record["to"] == 1:
                # k round trips: guest 1 left each host k times, with its two devices
                k = len(cls.footprints) + 1
                cls.footprints.append({h: footprint(daemons[h], 2 * k) for h in (1, 2)})

        # The migrations start once the program on the hot-plugged device runs.
        cls.results = vm.run_migration([TARGET + SPLATS, INITIATOR + SPLATS], "dev1 migrate-progress",
                                       plan=(3,) + (2, 1) * ROUND_TRIPS, refusing_args=["--paths", "8"],
                                       mem=MEM, timeout=1200, daemons_out=cls.daemons, migrations_out=cls.migrations,
                                       plug="plug-now", after_each=after_each, finish="stop-traffic")
        for m in cls.migrations:
            print(f"migration {m['round']}: host {m['from']} -> {m['to']}: {m['status']}, "
                  f"downtime {m.get('downtime_ms')} ms, total {m.get('total_ms')} ms, "
                  f"address moved in {m.get('address_ms')} ms {m.get('error') or ''}")
        for k, f in enumerate(cls.footprints, 1):
            print(f"after round trip {k}: " + ", ".join(
                f"host {h}: {f[h]['fds']} fds, {f[h]['maps']} mappings, {f[h]['charged']} bytes charged"
                for h in (1, 2)))

    def output(self, i):
        return "\n".join(self.results[i][2][-80:]) + "\n" + vg.daemon_report(self.daemons)

    def test_guests_succeeded(self):
        for i, (status, out, _console) in enumerate(self.results):
            self.assertEqual(status, 0, f"guest{i}:\n" + self.output(i))
            self.assertFalse([l for l in out if "migrate_rdma-failed" in l], f"guest{i}:\n" + self.output(i))

    def test_traffic_went_on_across_the_migrations(self):
        for dev in ("dev0", "dev1"):
            self.assertTrue(any(l.startswith(f"{dev} migrate-target ok") for l in self.results[0][1]),
                            self.output(0))
            done = [l for l in self.results[1][1] if l.startswith(f"{dev} migrate-traffic ok")]
            self.assertTrue(done, self.output(1))
            print(done[0])

    def test_migrations(self):
        self.assertEqual([m["status"] for m in self.migrations], ["failed"] + ["completed"] * 2 * ROUND_TRIPS,
                         [(m["status"], m.get("error")) for m in self.migrations])

    def test_round_trips_leak_nothing(self):
        self.assertEqual(len(self.footprints), ROUND_TRIPS)
        first, last = self.footprints[0], self.footprints[-1]
        for h in (1, 2):
            what = f"host {h}: after the first round trip {first[h]}, after the last {last[h]}"
            self.assertEqual(last[h]["fds"], first[h]["fds"], what)
            self.assertLessEqual(last[h]["maps"] - first[h]["maps"], MAPS_SLACK, what)
            self.assertEqual(last[h]["charged"], first[h]["charged"], what)
        # Host 2 holds no device of the guest then: nothing charged at all.
        self.assertEqual(last[2]["charged"], 0, last[2])

    def test_no_kernel_splats(self):
        for i, (_status, out, _console) in enumerate(self.results):
            self.assertEqual(splats(out), 0, f"guest{i}:\n" + "\n".join(out[-60:]))


if __name__ == "__main__":
    unittest.main()
