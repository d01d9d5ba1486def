"""Host-side guest tests of vstellar.ko (run as root; needs `make guest`
with the module in the image and vstellard built: `make host`).

- the selftests of this directory, which `make guest` installs in the image
  (/usr/lib/vstellar-kselftest, see docs/driver.md)
- vstellard dies while the ib_device is registered: the driver reports the
  loss, the port goes DOWN, and the module unloads at once.
- vstellard restarts (the chardev reconnects): the driver re-probes by
  itself and vstellar0 comes back ACTIVE on the new backend.

VSTELLAR_GUEST_IMAGE, VSTELLAR_QEMU and VSTELLARD override the paths.
"""
import os
import subprocess
import tempfile
import time
import unittest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from vstellar import guest as vg


def vstellard_path():
    p = os.environ.get("VSTELLARD") or os.path.join(TOP, "build", "qemu-device", "vstellard", "vstellard")
    if not os.access(p, os.X_OK):
        raise vg.GuestError(f"vstellard not built ({p}): run `make host`")
    return p


class Backend:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="vstellard-")
        self.sock = os.path.join(self.dir, "vstellard.sock")
        self.log = open(os.path.join(self.dir, "vstellard.log"), "w")
        self.start()

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
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


def device_args(sock, mem=512, reconnect=False):
    return ["-object", f"memory-backend-memfd,id=mem,size={mem}M,share=on",
            "-machine", "memory-backend=mem",
            "-chardev", f"socket,id=vst,path={sock}" + (",reconnect=1" if reconnect else ""),
            "-device", "vhost-user-vstellar-pci,chardev=vst"]


LOSS = r"""
modprobe vstellar recover_delay_ms=0 || exit 1
[ -e /sys/class/infiniband/vstellar0 ] || { dmesg | tail; exit 2; }
echo "STATE-BEFORE $(cat /sys/class/infiniband/vstellar0/ports/1/state)"
echo READY
i=0; while ! dmesg | grep -q "device lost" && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
dmesg | grep "vstellar virtio"
echo "STATE-AFTER $(cat /sys/class/infiniband/vstellar0/ports/1/state)"
t0=$(date +%s); rmmod vstellar; echo "RMMOD $? $(( $(date +%s) - t0 ))"
dmesg | grep -cE "BUG:|WARNING:|Call Trace|INFO: task" | sed 's/^/SPLATS /'
"""

RECOVER = r"""
modprobe vstellar recover_delay_ms=2000 || exit 1
echo READY
i=0; while ! dmesg | grep -q "device lost" && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
i=0; while ! grep -qs ACTIVE /sys/class/infiniband/vstellar*/ports/1/state && [ $i -lt 600 ]; do
	sleep 0.1; i=$((i+1))
done
dmesg | grep "vstellar virtio"
echo "STATE-AFTER $(cat /sys/class/infiniband/vstellar*/ports/1/state)"
rmmod vstellar; echo "RMMOD $?"
dmesg | grep -cE "BUG:|WARNING:|Call Trace|INFO: task" | sed 's/^/SPLATS /'
"""


class VstellarDriverTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Missing artefacts are a failure, not a skip: `make test` builds them.
        cls.art = vg.Artifacts()
        vstellard_path()

    def run_guest(self, command, backend, on_ready=None, timeout=300, reconnect=False):
        g = vg.Guest(self.art, "vstellar-drv", command, mem=512,
                                 qemu_args=device_args(backend.sock, reconnect=reconnect),
                                 timeout=timeout)
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
            # `make guest` installs the suite in the image (Makefile: kmod).
            cmd = "sh /usr/lib/vstellar-kselftest/run_tests.sh"
            status, out, console = self.run_guest(cmd, b)
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

    def test_backend_restart_recovers(self):
        b = Backend()

        def restart():
            b.stop()
            time.sleep(3)
            b.start()

        try:
            status, out, console = self.run_guest(RECOVER, b, on_ready=restart, reconnect=True)
            text = "\n".join(out or console[-60:])
            self.assertEqual(status, 0, text)
            self.assertTrue(any("device lost" in line for line in out), text)
            self.assertIn("STATE-AFTER 4: ACTIVE", out, text)
            self.assertIn("RMMOD 0", out, text)
            self.assertIn("SPLATS 0", out, text)
        finally:
            b.close()


if __name__ == "__main__":
    unittest.main()
