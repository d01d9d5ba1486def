"""The guest launcher: boot, command, output, exit status, clean-up."""
import os
import re
import subprocess
import unittest

from vstellar import TOP, guest as vg

LAUNCHER = os.path.join(TOP, "tools", "vstellar-guest")


def launcher_namespaces(pid):
    """Namespaces made by the launcher run with process id pid."""
    names = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    return [ns for ns in names if re.match(rf"^{vg.NS_PREFIX}{pid}(hub|h\d+)$", ns)]


def qemu_processes(marker):
    """QEMUs whose command line carries marker (other runs may be going on)."""
    out = subprocess.run(["pgrep", "-af", "qemu-system-x86_64"], stdout=subprocess.PIPE, text=True).stdout
    return [line for line in out.splitlines() if marker in line]


class LauncherTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.art = vg.Artifacts()
        with open(os.path.join(TOP, "config", "versions.mk")) as f:
            cls.abi = re.search(r"^GUEST_KERNEL_ABI = (\S+)$", f.read(), re.M).group(1)

    def test_guest_runs_command_with_our_userspace(self):
        # One boot checks the pinned kernel, the exit status, our rdma-core
        # build (56.1, not the host's), pyverbs and perftest being there.
        script = ("uname -r; "
                  "ls /usr/lib/x86_64-linux-gnu/libibverbs.so.1.*; "
                  "python3 -c 'import pyverbs.device as d; print(\"pyverbs\", len(d.get_device_list()))'; "
                  "command -v ib_write_bw; "
                  "rdma link show; exit 7")
        results = vg.run_guests([script], timeout=300, network=False)
        status, out, console = results[0]
        self.assertEqual(status, 7, "\n".join(console))
        self.assertEqual(out[0], self.abi)
        self.assertRegex(out[1], r"libibverbs\.so\.1\.\d+\.56\.1$")
        self.assertIn("pyverbs 0", out)
        self.assertIn("/usr/bin/ib_write_bw", out)
        self.assertEqual(launcher_namespaces(os.getpid()), [])

    def test_timeout_kills_guest_and_removes_network(self):
        marker = f"vstellar-timeout-test-{os.getpid()}"
        p = subprocess.Popen([LAUNCHER, "run", "-n", "2", "--timeout", "20",
                              "--qemu-arg=-name", f"--qemu-arg={marker}", "--", "sleep 600"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _out, err = p.communicate()
        self.assertEqual(p.returncode, 124, err)
        self.assertIn("timed out after 20 s", err)
        self.assertEqual(launcher_namespaces(p.pid), [])
        self.assertEqual(qemu_processes(marker), [])

    def test_missing_image_is_a_clear_error(self):
        r = subprocess.run([LAUNCHER, "run", "--image", "/nonexistent", "--", "true"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no guest image found (/nonexistent): run `make guest` first", r.stderr)

    def test_shared_daemon_groups(self):
        # contiguous groups, the first ones larger; a bad count is a usage error
        self.assertEqual(vg.daemon_groups(4, 2), [[0, 1], [2, 3]])
        self.assertEqual(vg.daemon_groups(5, 2), [[0, 1, 2], [3, 4]])
        self.assertEqual(vg.daemon_groups(2, 1), [[0, 1]])
        for args, msg in ((["-n", "2", "--vstellar", "--daemons", "3"], "--daemons 3: need 1..2"),
                          (["--shared-daemon"], "--shared-daemon and --daemons need --vstellar")):
            r = subprocess.run([LAUNCHER, "run"] + args + ["--", "true"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(msg, r.stderr)


if __name__ == "__main__":
    unittest.main()
