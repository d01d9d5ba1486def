#!/usr/bin/env python3
"""packaging.debs: what `make deb` made (docs/packages.md).

Each package installs what the docs say and nothing over Debian's own
files; the provider builds depend on the libibverbs layouts they were
compiled for; the packaged QEMU runs from where it is installed, finds its
firmware through its own data directory and has the device.
"""
import os
import shutil
import subprocess
import unittest

from debs import PACKAGES, contents, deb, field, unpack, unpack_installed


class Debs(unittest.TestCase):
    def test_all_packages_one_version(self):
        versions = {p: field(p, "Version") for p in PACKAGES}
        self.assertEqual(len(set(versions.values())), 1, versions)

    def test_dkms_source(self):
        v = field("vstellar-dkms", "Version")
        files = set(contents("vstellar-dkms"))
        src = f"/usr/src/vstellar-{v}/"
        for f in ("dkms.conf", "kernel/vstellar/Kbuild", "kernel/vstellar/vstellar_compat.h",
                  "kernel/vstellar/vstellar_main.c", "include/vstellar/virtio_vstellar.h",
                  "include/vstellar/vstellar-abi.h"):
            self.assertIn(src + f, files)
        self.assertFalse([f for f in files if f.endswith((".o", ".ko", ".cmd"))])
        d = unpack("vstellar-dkms")
        try:
            with open(os.path.join(d, src[1:], "dkms.conf"), encoding="utf-8") as f:
                conf = f.read()
        finally:
            shutil.rmtree(d)
        self.assertIn(f'PACKAGE_VERSION="{v}"', conf)
        self.assertIn('BUILD_EXCLUSIVE_KERNEL="^6\\.([1-9]|1[0-2])\\."', conf)

    def test_providers(self):
        for layout, depends in (("44", ("libibverbs1 (>= 44)", "libibverbs1 (<< 45)")),
                                ("56", ("libibverbs1 (>= 45)", "libibverbs1 (<< 57)"))):
            p = f"vstellar-provider-rdma{layout}"
            files = contents(p)
            self.assertIn("/usr/lib/x86_64-linux-gnu/libibverbs/libvstellar-rdmav34.so", files)
            self.assertIn("/etc/libibverbs.d/vstellar.driver", files)
            deps = field(p, "Depends")
            for d in depends:
                self.assertIn(d, deps)
            other = "vstellar-provider-rdma" + ("56" if layout == "44" else "44")
            self.assertIn(other, field(p, "Conflicts"))
            d = unpack(p)
            try:
                so = os.path.join(d, "usr/lib/x86_64-linux-gnu/libibverbs/libvstellar-rdmav34.so")
                dyn = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=True).stdout
                self.assertNotIn("RUNPATH", dyn)
                self.assertNotIn("RPATH", dyn)
                syms = subprocess.run(["objdump", "-T", so], capture_output=True, text=True, check=True).stdout
                self.assertIn("verbs_register_driver_34", syms)
                with open(os.path.join(d, "etc/libibverbs.d/vstellar.driver"), encoding="utf-8") as f:
                    self.assertEqual(f.read(), "driver vstellar\n")
            finally:
                shutil.rmtree(d)

    def test_vstellard(self):
        files = contents("vstellard")
        for f in ("/usr/sbin/vstellard", "/usr/bin/vstellar-stat", "/etc/vstellar/vstellard.conf",
                  "/lib/systemd/system/vstellard@.service"):
            self.assertIn(f, files)
        d = unpack("vstellard")
        try:
            # The example configuration is one the daemon accepts as it is.
            r = subprocess.run([os.path.join(d, "usr/sbin/vstellard"), "--config",
                                os.path.join(d, "etc/vstellar/vstellard.conf"), "--help"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(d, "lib/systemd/system/vstellard@.service"), encoding="utf-8") as f:
                unit = f.read()
            self.assertIn("--config /etc/vstellar/%i.conf", unit)
            self.assertIn("RestartPreventExitStatus=2", unit)
        finally:
            shutil.rmtree(d)

    def test_qemu_beside_the_system_one(self):
        files = contents("vstellar-qemu")
        self.assertIn("/usr/lib/vstellar/qemu/bin/qemu-system-x86_64", files)
        self.assertFalse([f for f in files if f.startswith("/usr/bin/qemu") or f.startswith("/usr/share/qemu")],
                         "vstellar-qemu must not install over the system's QEMU")
        d = unpack_installed("vstellar-qemu")
        try:
            # Installed layout, so QEMU's data directory (../share/qemu from
            # its binary) holds the option ROMs and links to Debian's
            # firmware, which must be there.
            root = os.path.join(d, "usr/lib/vstellar/qemu")
            share = os.path.join(root, "share/qemu")
            for f in ("linuxboot_dma.bin", "bios-256k.bin", "efi-virtio.rom"):
                self.assertTrue(os.path.exists(os.path.join(share, f)), f)
            qemu = os.path.join(root, "bin/qemu-system-x86_64")
            r = subprocess.run([qemu, "-device", "help"], capture_output=True, text=True, timeout=60)
            self.assertIn('"vhost-user-vstellar-pci"', r.stdout)
            self.assertIn('"virtio-blk-pci"', r.stdout)
            # A PC machine loads its BIOS and option ROMs at creation: it
            # must find them with no -L.
            r = subprocess.run([qemu, "-M", "pc", "-nodefaults", "-display", "none", "-S",
                                "-monitor", "stdio", "-device", "virtio-net-pci"],
                               input="quit\n", capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        finally:
            shutil.rmtree(d)

    def test_lintian_clean(self):
        log = os.path.join(os.path.dirname(deb("vstellard")), "lintian.log")
        with open(log, encoding="utf-8") as f:
            tags = [l for l in f if l[:2] in ("E:", "W:")]
        self.assertEqual(tags, [])


if __name__ == "__main__":
    unittest.main()
