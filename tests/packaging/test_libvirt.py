#!/usr/bin/env python3
"""packaging.libvirt: libvirt starts a vStellar guest (docs/own-vms.md).

The packaged QEMU (vstellar-qemu) and vstellard (vstellard), unpacked as
they install; libvirtd (started here unless one already runs) defines and
starts a domain whose XML has the three things a vStellar guest needs (our
QEMU as <emulator>, memfd shared memory backing, the vhost-user chardev and
device in <qemu:commandline>); the guest, the project's test image, sees
vstellar0 with its port ACTIVE.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from debs import unpack_installed

from vstellar import guest as vg

URI = "qemu:///system"
DOMAIN = """<domain type='{virt}' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <memory unit='MiB'>1024</memory>
  <memoryBacking>
    <source type='memfd'/>
    <access mode='shared'/>
  </memoryBacking>
  <vcpu current='1'>2</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{dir}/vmlinuz</kernel>
    <initrd>{dir}/initrd.cpio</initrd>
    <cmdline>console=ttyS0 loglevel=3 panic=-1 vsguest.modules=vstellar,ib_uverbs</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>{qemu}</emulator>
    <serial type='file'>
      <source path='{dir}/console.log'/>
      <target port='0'/>
    </serial>
    <controller type='usb' model='none'/>
    <video><model type='none'/></video>
    <memballoon model='none'/>
  </devices>
  <qemu:commandline>
    <qemu:arg value='-chardev'/>
    <qemu:arg value='socket,id=vstellar0,path={dir}/vstellard.sock'/>
    <qemu:arg value='-device'/>
    <qemu:arg value='vhost-user-vstellar-pci,chardev=vstellar0'/>
    <qemu:arg value='-fw_cfg'/>
    <qemu:arg value='name=opt/vstellar/cmd,file={dir}/cmd.sh'/>
  </qemu:commandline>
</domain>
"""


def virsh(*args, check=True):
    r = subprocess.run(["virsh", "-c", URI] + list(args), capture_output=True, text=True, timeout=300)
    if check and r.returncode:
        raise AssertionError(f"virsh {' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout.strip()


class Libvirt(unittest.TestCase):
    def setUp(self):
        self.art = vg.Artifacts()
        # libvirt runs QEMU as libvirt-qemu: everything it opens lives in a
        # directory it can read (copies, so libvirt's relabelling never
        # touches the shared image cache).
        self.dir = tempfile.mkdtemp(prefix="vstellar-libvirt-", dir="/var/tmp")
        self.addCleanup(shutil.rmtree, self.dir, True)
        os.chmod(self.dir, 0o755)
        self.root = os.path.join(self.dir, "root")
        for p in ("vstellar-qemu", "vstellard"):
            unpack_installed(p, self.root)
        shutil.copy(self.art.kernel, os.path.join(self.dir, "vmlinuz"))
        shutil.copy(self.art.initrd, os.path.join(self.dir, "initrd.cpio"))
        with open(os.path.join(self.dir, "cmd.sh"), "w", encoding="utf-8") as f:
            f.write("ibv_devinfo -d vstellar0\n")
        self.start_libvirtd()
        self.start_vstellard()

    def start_libvirtd(self):
        if subprocess.run(["virsh", "-c", URI, "uri"], capture_output=True).returncode == 0:
            return  # one runs already (a systemd host)
        for daemon in ("virtlogd", "libvirtd"):
            pidfile = os.path.join(self.dir, f"{daemon}.pid")
            subprocess.run([daemon, "--daemon", "--pid-file", pidfile], check=True, timeout=60)
            self.addCleanup(self.stop_pidfile, pidfile)
        for _ in range(600):
            if subprocess.run(["virsh", "-c", URI, "uri"], capture_output=True).returncode == 0:
                return
            time.sleep(0.1)
        self.fail("libvirtd did not answer")

    @staticmethod
    def stop_pidfile(pidfile):
        try:
            with open(pidfile, encoding="utf-8") as f:
                os.kill(int(f.read()), signal.SIGTERM)
        except (OSError, ValueError):
            pass

    def start_vstellard(self):
        sock = os.path.join(self.dir, "vstellard.sock")
        self.vslog = os.path.join(self.dir, "vstellard.log")
        # Socket for QEMU's libvirt-qemu user.
        with open(self.vslog, "w", encoding="utf-8") as log:
            self.vstellard = subprocess.Popen([os.path.join(self.root, "usr/sbin/vstellard"), "--socket", sock],
                                              stderr=log, preexec_fn=lambda: os.umask(0))
        self.addCleanup(self.vstellard.wait, 30)
        self.addCleanup(self.vstellard.terminate)
        for _ in range(600):
            if os.path.exists(sock) or self.vstellard.poll() is not None:
                break
            time.sleep(0.05)
        self.assertTrue(os.path.exists(sock), open(self.vslog, encoding="utf-8").read())

    def test_domain_sees_vstellar0_active(self):
        name = f"vstellar-test-{os.getpid()}"
        xml = os.path.join(self.dir, "domain.xml")
        with open(xml, "w", encoding="utf-8") as f:
            f.write(DOMAIN.format(name=name, dir=self.dir, virt="kvm" if vg.kvm_usable() else "qemu",
                                  qemu=os.path.join(self.root, "usr/lib/vstellar/qemu/bin/qemu-system-x86_64")))
        virsh("define", xml)
        self.addCleanup(virsh, "undefine", name, check=False)
        self.addCleanup(virsh, "destroy", name, check=False)
        virsh("start", name)
        # The guest runs its command and powers off; the domain stops.
        for _ in range(6000):
            if virsh("domstate", name) == "shut off":
                break
            time.sleep(0.1)
        with open(os.path.join(self.dir, "console.log"), encoding="utf-8", errors="replace") as f:
            console = f.read()
        self.assertIn("VSTELLAR-EXIT 0", console, console[-3000:])
        self.assertRegex(console, r"hca_id:\s+vstellar0")
        self.assertRegex(console, r"state:\s+PORT_ACTIVE \(4\)")
        with open(f"/var/log/libvirt/qemu/{name}.log", encoding="utf-8", errors="replace") as f:
            qemu_log = f.read()
        self.assertIn('"qom-type":"memory-backend-memfd"', qemu_log)
        self.assertIn('"share":true', qemu_log)
        with open(self.vslog, encoding="utf-8") as f:
            self.assertIn("device 0: created", f.read())


if __name__ == "__main__":
    unittest.main()
