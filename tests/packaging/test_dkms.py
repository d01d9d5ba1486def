#!/usr/bin/env python3
"""packaging.dkms: DKMS builds vstellar.ko from the vstellar-dkms package
against Debian 12's 6.1 and Debian 13's 6.12 kernel headers, both from
Debian's archive, and refuses a kernel outside 6.1..6.12 with DKMS's own
message (docs/packages.md).

6.1: bookworm's dkms on this host, with private DKMS trees (the host's
/var/lib/dkms is not touched), against the pinned guest kernel's headers.
6.12: the package installed with dpkg into the Debian 13 stock guest's root
(mmdebstrap, tools/build-stock-guest.sh --root-only trixie), whose dkms, gcc
14 and kbuild tools run there; its postinst adds the module, and dkms builds
it for 6.12.
"""
import glob
import os
import shutil
import subprocess
import tempfile
import unittest

from debs import TOP, deb, field, unpack

GUEST_KERNEL_ABI = None
with open(os.path.join(TOP, "config", "versions.mk"), encoding="utf-8") as f:
    for line in f:
        if line.startswith("GUEST_KERNEL_ABI"):
            GUEST_KERNEL_ABI = line.split("=", 1)[1].strip()


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=1200, **kw)


class HostDkms(unittest.TestCase):
    """bookworm's dkms, private trees, the 6.1 headers `make deps` installed."""

    def setUp(self):
        self.version = field("vstellar-dkms", "Version")
        self.dir = tempfile.mkdtemp(prefix="vstellar-dkms-")
        self.addCleanup(shutil.rmtree, self.dir)
        unpack("vstellar-dkms", os.path.join(self.dir, "pkg"))
        self.trees = ["--sourcetree", os.path.join(self.dir, "pkg/usr/src"),
                      "--dkmstree", os.path.join(self.dir, "dkms"),
                      "--installtree", os.path.join(self.dir, "modules")]
        os.makedirs(os.path.join(self.dir, "dkms"))
        r = run(["dkms", "add", "-m", "vstellar", "-v", self.version] + self.trees)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_builds_for_debian12_6_1(self):
        kernel = GUEST_KERNEL_ABI
        r = run(["dkms", "build", "-m", "vstellar", "-v", self.version, "-k", kernel,
                 "--kernelsourcedir", f"/usr/src/linux-headers-{kernel}"] + self.trees)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        ko = glob.glob(os.path.join(self.dir, "dkms/vstellar", self.version, kernel, "x86_64/module/vstellar.ko*"))
        self.assertEqual(len(ko), 1, r.stdout)
        info = run(["modinfo", "-F", "vermagic", ko[0]]).stdout
        self.assertTrue(info.startswith(kernel + " "), info)

    def test_refuses_a_kernel_outside_6_1_to_6_12(self):
        for kernel in ("6.13.0-1-amd64", "5.10.0-30-amd64"):
            r = run(["dkms", "build", "-m", "vstellar", "-v", self.version, "-k", kernel,
                     "--kernelsourcedir", f"/usr/src/linux-headers-{GUEST_KERNEL_ABI}"] + self.trees)
            self.assertNotEqual(r.returncode, 0, kernel)
            out = r.stdout + r.stderr
            self.assertIn("BUILD_EXCLUSIVE directive which does not match this kernel", out)
            self.assertFalse(glob.glob(os.path.join(self.dir, "dkms/vstellar", self.version, kernel,
                                                    "x86_64/module/*.ko*")))


class TrixieDkms(unittest.TestCase):
    """The package as a Debian 13 user installs it: dpkg, then dkms for 6.12."""

    def test_builds_for_debian13_6_12(self):
        # The Debian 13 stock guest's root (one download for both tests).
        root = run([os.path.join(TOP, "tools/build-stock-guest.sh"), "--root-only", "trixie"])
        self.assertEqual(root.returncode, 0, root.stderr)
        root = root.stdout.strip()
        headers = sorted(glob.glob(os.path.join(root, "usr/src/linux-headers-6.12.*-amd64")))
        self.assertTrue(headers, "no 6.12 headers in the trixie root")
        kernel = os.path.basename(headers[-1])[len("linux-headers-"):]
        version = field("vstellar-dkms", "Version")

        def chroot(*argv):
            return run(["chroot", root] + list(argv))

        # The cached root is reused: take out what an earlier run left.
        chroot("dpkg", "--purge", "vstellar-dkms")
        self.addCleanup(chroot, "dpkg", "--purge", "vstellar-dkms")
        shutil.copy(deb("vstellar-dkms"), os.path.join(root, "tmp", "vstellar-dkms.deb"))
        r = chroot("dpkg", "-i", "/tmp/vstellar-dkms.deb")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = chroot("dkms", "build", "-m", "vstellar", "-v", version, "-k", kernel)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        ko = glob.glob(os.path.join(root, "var/lib/dkms/vstellar", version, kernel, "x86_64/module/vstellar.ko*"))
        self.assertEqual(len(ko), 1, r.stdout)
        info = chroot("modinfo", "-F", "vermagic", ko[0][len(root):]).stdout
        self.assertTrue(info.startswith(kernel + " "), info)


if __name__ == "__main__":
    unittest.main()
