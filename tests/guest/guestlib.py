"""What the guest tests share: kernel-splat counting, result fields and the
two-guest test case for kernel RDMA users."""
import os
import re
import time
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


def proc_usage(pid):
    """vstellard's footprint: open fds, mappings, VmSize and RssAnon (kB)."""
    with open(f"/proc/{pid}/status") as f:
        st = dict(line.split(":", 1) for line in f)
    with open(f"/proc/{pid}/maps") as f:
        lines = f.readlines()
    maps = len(lines)
    # What each fd is (socket, eventfd, memfd, ...), so that a count that
    # differs names the kind of fd left behind.
    kinds = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            k = re.sub(r"[:\[].*", "", os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        kinds[k] = kinds.get(k, 0) + 1
    # Each mapping's size and name, so that growth names what grew.
    regions = {}
    for line in lines:
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        name = f[5] if len(f) > 5 else "[anon]"
        regions[name] = regions.get(name, 0) + (hi - lo) // 1024
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "fd_kinds": kinds, "maps": maps, "map_kb": regions,
            "vm_kb": int(st["VmSize"].split()[0]), "rss_anon_kb": int(st["RssAnon"].split()[0])}


# Mappings a freed device may leave behind: malloc's arenas and the like.
MAPS_SLACK = 8


def settled_usage(pid, before=None, timeout=5):
    """proc_usage once the daemon has finished freeing: with `before`, once
    the fd count and the mappings are back to its (the daemon logs a
    device's end just before it frees it, and frees its fds before it
    unmaps its doorbell page and the guest's RAM: a reading taken when only
    the fds were back saw the last device still mapped); without, once
    three readings 0.1 s apart agree. After timeout seconds, whatever is
    left is a leak, and that reading is returned."""
    deadline = time.monotonic() + timeout
    last, same = None, 0
    while True:
        u = proc_usage(pid)
        if before is not None:
            settled = u["fds"] <= before["fds"] and u["maps"] - before["maps"] <= MAPS_SLACK
        else:
            same = same + 1 if (u["fds"], u["maps"]) == last else 0
            last = (u["fds"], u["maps"])
            settled = same >= 2
        if settled or time.monotonic() > deadline:
            return u
        time.sleep(0.05 if before is not None else 0.1)


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
