"""Host-side guest tests of vstellar.ko (run as root; needs `make guest`
with the module in the image and vstellard built: `make host`).

- the selftests of this directory, when the image carries them
  (/usr/lib/vstellar-kselftest, see docs/driver.md)
- vstellard dies while the ib_device is registered: the driver reports the
  loss, the port goes DOWN, new verbs fail at once, and the module unloads.

VSTELLAR_GUEST_IMAGE, VSTELLAR_QEMU and VSTELLARD override the paths.
"""
import os
import subprocess
import sys
import tempfile
import time
import unittest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(TOP, "tools"))
import vstellar_guest  # noqa: E402


def vstellard_path():
    p = os.environ.get("VSTELLARD") or os.path.join(TOP, "build", "qemu-device", "vstellard", "vstellard")
    if not os.access(p, os.X_OK):
        raise unittest.SkipTest(f"vstellard not built ({p}): run `make host`")
    return p


class Backend:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="vstellard-")
        self.sock = os.path.join(self.dir, "vstellard.sock")
        self.log = open(os.path.join(self.dir, "vstellard.log"), "w")
        self.proc = subprocess.Popen([vstellard_path(), "--socket", self.sock],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 10
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("vstellard did not start")
            time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self):
        self.stop()
        self.log.close()
        subprocess.run(["rm", "-rf", self.dir])


def device_args(sock, mem=512):
    return ["-object", f"memory-backend-memfd,id=mem,size={mem}M,share=on",
            "-machine", "memory-backend=mem",
            "-chardev", f"socket,id=vst,path={sock}",
            "-device", "vhost-user-vstellar-pci,chardev=vst"]


LOSS = r"""
modprobe vstellar || exit 1
[ -e /sys/class/infiniband/vstellar0 ] || { dmesg | tail; exit 2; }
echo "STATE-BEFORE $(cat /sys/class/infiniband/vstellar0/ports/1/state)"
echo READY
i=0; while ! dmesg | grep -q "device lost" && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
dmesg | grep "vstellar virtio"
echo "STATE-AFTER $(cat /sys/class/infiniband/vstellar0/ports/1/state)"
t0=$(date +%s); rmmod vstellar; echo "RMMOD $? $(( $(date +%s) - t0 ))"
dmesg | grep -cE "BUG:|WARNING:|Call Trace|INFO: task" | sed 's/^/SPLATS /'
"""


class VstellarDriverTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        try:
            cls.art = vstellar_guest.Artifacts()
        except vstellar_guest.GuestError as e:
            raise unittest.SkipTest(str(e))
        vstellard_path()

    def run_guest(self, command, backend, on_ready=None, timeout=300):
        g = vstellar_guest.Guest(self.art, "vstellar-drv", command, mem=512,
                                 qemu_args=device_args(backend.sock), timeout=timeout)
        try:
            g.start()
            if on_ready:
                deadline = time.monotonic() + timeout
                while "READY" not in g.output and g.proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.1)
                on_ready()
            status = g.wait()
            return status, list(g.output), list(g.console)
        finally:
            g.close()

    def test_selftests(self):
        b = Backend()
        try:
            cmd = ("[ -d /usr/lib/vstellar-kselftest ] || { echo NO-SELFTESTS; exit 0; }; "
                   "sh /usr/lib/vstellar-kselftest/run_tests.sh")
            status, out, console = self.run_guest(cmd, b)
            if "NO-SELFTESTS" in out:
                self.skipTest("the guest image carries no selftests")
            self.assertEqual(status, 0, "\n".join(out or console[-60:]))
        finally:
            b.close()

    def test_backend_loss_while_registered(self):
        b = Backend()
        try:
            status, out, console = self.run_guest(LOSS, b, on_ready=b.stop)
            text = "\n".join(out or console[-60:])
            self.assertEqual(status, 0, text)
            self.assertIn("STATE-BEFORE 4: ACTIVE", out, text)
            self.assertTrue(any("device lost" in line for line in out), text)
            self.assertIn("STATE-AFTER 1: DOWN", out, text)
            rm = [line.split() for line in out if line.startswith("RMMOD ")]
            self.assertEqual(rm[0][1], "0", text)
            self.assertLess(int(rm[0][2]), 10, text)
            self.assertIn("SPLATS 0", out, text)
        finally:
            b.close()


if __name__ == "__main__":
    unittest.main()
