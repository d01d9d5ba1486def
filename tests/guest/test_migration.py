"""Live migration of a guest whose RDMA keeps running (issue 29;
docs/running-guests.md, "Live migration").

Two guests with vStellar: guest 0, the peer, stays on host 0; guest 1
starts on host 1 and runs migrate_rdma.py's initiator against guest 0's
target: RDMA WRITEs checked by READs, and SENDs checked for order, all
the time. While it runs, guest 1 is migrated (QEMU's `migrate`) first to
host 3, whose vstellard has another engine shape (--paths) and must
refuse the device's state: the migration fails and the guest runs on at
host 1; then to host 2 and back to host 1, each time with its RDMA state
in the migration stream, its address moving with it. The test wants no
failed completion, every byte and every SEND, both programs exiting 0,
the refused migration failed and the other two completed, and no kernel
warnings; it prints each migration's downtime and the longest gap in
the traffic.
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


def rdma_side(args):
    files = "".join(f"cat > /tmp/{n} <<'EOF'\n{SCRIPTS[n]}EOF\n" for n in SCRIPTS)
    return files + f"python3 /tmp/migrate_rdma.py {args} 2>&1 || echo migrate_rdma-failed\n"


class MigrationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        vg.Artifacts().vstellard
        dev = pt.VSTELLAR_DEVICE
        target = pt.VSTELLAR_SETUP + rdma_side(f"target {dev} $GIDX {PORT}")
        initiator = pt.VSTELLAR_SETUP + rdma_side(f"initiator {dev} $GIDX $VSTELLAR_PEER_IP {PORT} {SECONDS}")
        cls.daemons, cls.migrations = [], []
        cls.results = vm.run_migration([target + SPLATS, initiator + SPLATS], "migrate-progress",
                                       plan=(3, 2, 1), refusing_args=["--paths", "8"], timeout=600,
                                       daemons_out=cls.daemons, migrations_out=cls.migrations)
        for m in cls.migrations:
            print(f"migration {m['round']}: host {m['from']} -> {m['to']}: {m['status']}, "
                  f"downtime {m.get('downtime_ms')} ms, total {m.get('total_ms')} ms, "
                  f"address moved in {m.get('address_ms')} ms {m.get('error') or ''}")

    def output(self, i):
        return "\n".join(self.results[i][2][-80:]) + "\n" + vg.daemon_report(self.daemons)

    def test_guests_succeeded(self):
        for i, (status, out, _console) in enumerate(self.results):
            self.assertEqual(status, 0, f"guest{i}:\n" + self.output(i))
            self.assertNotIn("migrate_rdma-failed", out, f"guest{i}:\n" + self.output(i))

    def test_traffic_went_on_across_the_migrations(self):
        self.assertTrue(any(l.startswith("migrate-target ok") for l in self.results[0][1]), self.output(0))
        done = [l for l in self.results[1][1] if l.startswith("migrate-traffic ok")]
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
