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
migration fails and the guest runs on at host 1; then to host 2 and back
to host 1, each time with the RDMA state of both devices in the
migration stream, its address moving with it. The test wants no failed
completion, every byte and every SEND on both devices, every program
exiting 0, the refused migration failed and the other two completed, and
no kernel warnings; it prints each migration's downtime and the longest
gap in the traffic.
"""
import os
import unittest

from guestlib import SPLATS, splats
from vstellar import guest as vg, migration as vm, perftest as pt

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {}
for name in ("rdma_pair.py", "migrate_rdma.py"):
    with open(os.path.join(HERE, name)) as f:
        SCRIPTS[name] = f.read()
PORT = 18530
SECONDS = 60


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
# on each device once vstellar1 has its GID.
INITIATOR = pt.VSTELLAR_SETUP + FILES + f"ip addr add {vm.PLUG_IP}/24 dev eth0\necho plug-now\n" + pt.wait_roce_gid("vstellar1", "GIDX1", seconds=120) + \
    rdma_side("dev0", f"initiator {pt.VSTELLAR_DEVICE} $GIDX $VSTELLAR_PEER_IP {PORT} {SECONDS}") + \
    rdma_side("dev1", f"initiator vstellar1 $GIDX1 $VSTELLAR_PEER_IP {PORT + 1} {SECONDS}") + "wait\n"


class MigrationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        vg.Artifacts().vstellard
        cls.daemons, cls.migrations = [], []
        # The migrations start once the program on the hot-plugged device runs.
        cls.results = vm.run_migration([TARGET + SPLATS, INITIATOR + SPLATS], "dev1 migrate-progress",
                                       plan=(3, 2, 1), refusing_args=["--paths", "8"], timeout=600,
                                       daemons_out=cls.daemons, migrations_out=cls.migrations,
                                       plug="plug-now")
        for m in cls.migrations:
            print(f"migration {m['round']}: host {m['from']} -> {m['to']}: {m['status']}, "
                  f"downtime {m.get('downtime_ms')} ms, total {m.get('total_ms')} ms, "
                  f"address moved in {m.get('address_ms')} ms {m.get('error') or ''}")

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
        self.assertEqual([m["status"] for m in self.migrations], ["failed", "completed", "completed"],
                         self.migrations)

    def test_no_kernel_splats(self):
        for i, (_status, out, _console) in enumerate(self.results):
            self.assertEqual(splats(out), 0, f"guest{i}:\n" + "\n".join(out[-60:]))


if __name__ == "__main__":
    unittest.main()
