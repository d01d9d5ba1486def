"""What the guest tests share: kernel-splat counting, result fields and the
two-guest test case for kernel RDMA users."""
import unittest

from vstellar import guest as vg, perftest as pt

# The end of a guest script that used kernel RDMA users: how many kernel
# warnings, BUGs and oopses the run left in dmesg, as "kernel-splats N".
SPLATS = ("echo \"kernel-splats $(dmesg | grep -c -E "
          "'WARNING:|BUG:|Oops|general protection|blocked for more than')\"\n")


def splats(lines):
    """The count a SPLATS line printed, or None if there was none."""
    for line in lines:
        if line.startswith("kernel-splats "):
            return int(line.split()[1])
    return None


def field(lines, key):
    """The values of 'key VALUE...' lines (the first word after key)."""
    return [line.split()[1] for line in lines if line.startswith(key + " ")]


class KernelUlpCase(unittest.TestCase):
    """Two guests with the vStellar device, booted once per test class,
    each running its script (SCRIPTS) with SPLATS at the end; results,
    sections (split_sections of each output) and daemons (their logs and
    counters) for the tests. A subclass sets SCRIPTS and may set TIMEOUT,
    and override image() to boot another guest image."""
    SCRIPTS = ()
    TIMEOUT = 600

    @classmethod
    def image(cls):
        return None  # the test image `make guest` recorded

    @classmethod
    def setUpClass(cls):
        vg.Artifacts().vstellard  # missing pieces fail the test: `make test` builds them
        cls.daemons = []
        cls.results = vg.run_guests([s + SPLATS for s in cls.SCRIPTS], vstellar=True,
                                                timeout=cls.TIMEOUT, mem=1024, image=cls.image(),
                                                daemons_out=cls.daemons)
        cls.sections = [pt.split_sections(out) for _status, out, _console in cls.results]

    def assertDaemonsSent(self, min_bytes):
        """Each daemon's engine sent more than min_bytes: the data crossed
        vStellar, not some other path."""
        for i, d in enumerate(self.daemons):
            tx = ((d.get("stats") or {}).get("engine") or {}).get("tx_bytes", 0)
            self.assertGreater(tx, min_bytes, f"vstellard {i}: {d.get('log', '')[-1500:]}")

    def test_no_kernel_splats(self):
        for i, (_status, out, _console) in enumerate(self.results):
            self.assertEqual(splats(out), 0, f"guest{i}:\n" + "\n".join(out[-60:]))

    def test_guests_succeeded(self):
        for i, (status, out, console) in enumerate(self.results):
            self.assertEqual(status, 0, f"guest{i}:\n" + "\n".join(console[-100:]) +
                             "\n--- vstellard ---\n" + self.daemons[i]["log"][-3000:])
