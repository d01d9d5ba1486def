"""Boot vStellar test guests under QEMU and run commands inside them.

The library behind tools/vstellar-guest. A guest is the pinned Debian 6.1
kernel with the initramfs of tools/build-guest-image.sh; the command to run
reaches it through QEMU's fw_cfg (opt/vstellar/cmd) and its output comes back
on the serial console, between two marker lines written by tools/guest/init.

Guests join a test network: one network namespace per guest ("host"), made
here, each holding a bridge with the guest's tap device and one end of a veth
pair that links the namespaces. Everything made is removed again on exit,
failure, timeout or Ctrl-C (see Session).
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_FILE = os.path.join(TOP, "build", "guest.env")

# Test-network addresses live only inside the namespaces made here.
NET_PREFIX = "10.77.0"
NS_PREFIX = "vst"


class GuestError(Exception):
    """A problem the user can act on; printed without a traceback."""


def read_env_file(path=ENV_FILE):
    """The artefact paths that `make guest` records (KEY=value lines)."""
    env = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                key, sep, value = line.strip().partition("=")
                if sep and not key.startswith("#"):
                    env[key] = value
    return env


class Artifacts:
    """Where the QEMU binary, its firmware and the guest image are."""

    def __init__(self, qemu=None, image=None):
        recorded = read_env_file()
        self.qemu = qemu or os.environ.get("VSTELLAR_QEMU") or recorded.get("QEMU")
        self.image = image or os.environ.get("VSTELLAR_GUEST_IMAGE") or recorded.get("GUEST_IMAGE")
        if not self.qemu or not os.access(self.qemu, os.X_OK):
            raise GuestError(f"no QEMU build found ({self.qemu or 'nothing recorded'}): run `make guest` first")
        if not self.image or not os.path.exists(os.path.join(self.image, "initrd.cpio")):
            raise GuestError(f"no guest image found ({self.image or 'nothing recorded'}): run `make guest` first")
        self.kernel = os.path.join(self.image, "vmlinuz")
        self.initrd = os.path.join(self.image, "initrd.cpio")
        # SeaBIOS comes from Debian's seabios package (the dfsg source has no
        # blobs); the option ROM for -kernel boot from our QEMU build.
        self.firmware_dirs = [d for d in ("/usr/share/seabios",
                                          os.path.join(os.path.dirname(self.qemu), "pc-bios", "optionrom"),
                                          os.path.join(os.path.dirname(self.qemu), "pc-bios"))
                              if os.path.isdir(d)]
        if not os.path.exists("/usr/share/seabios/bios-256k.bin"):
            raise GuestError("SeaBIOS is missing (/usr/share/seabios/bios-256k.bin): run `make deps`")


def run(cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def kvm_usable():
    """True when the user asked for KVM with VSTELLAR_ACCEL=kvm.

    TCG is the default because /dev/kvm can exist, open and even run a vCPU
    on machines where a guest then crawls (nested virtualisation without
    hardware help: this project's machines take minutes to decompress the
    kernel there), and no quick probe tells those apart from a working KVM.
    """
    accel = os.environ.get("VSTELLAR_ACCEL", "tcg")
    if accel not in ("tcg", "kvm"):
        raise GuestError(f"VSTELLAR_ACCEL={accel}: must be tcg or kvm")
    return accel == "kvm"


class TestNet:
    """Network namespaces for guests, linked into one L2 segment.

    Host i is namespace vst<id>h<i>; in it, bridge br0 joins tap0 (the
    guest's NIC) and the namespace's end of the veth link to the hub
    namespace vst<id>hub, whose bridge joins all hosts.
    """

    def __init__(self, hosts, tag=None):
        if os.geteuid() != 0:
            raise GuestError("test networks need root (network namespaces, tap devices)")
        self.tag = tag or f"{NS_PREFIX}{os.getpid()}"
        self.hub = f"{self.tag}hub"
        self.hosts = [f"{self.tag}h{i}" for i in range(hosts)]
        self.made = []

    def ns_exec(self, ns):
        return ["ip", "netns", "exec", ns]

    def _ip(self, *args, ns=None):
        cmd = (self.ns_exec(ns) if ns else []) + ["ip"] + list(args)
        r = run(cmd, check=False)
        if r.returncode:
            raise GuestError(f"`{' '.join(cmd)}` failed: {r.stderr.strip()}")

    def create(self):
        for ns in [self.hub] + self.hosts:
            if os.path.exists(f"/run/netns/{ns}"):
                raise GuestError(f"network namespace {ns} already exists: run `vstellar-guest cleanup`")
        self._ip("netns", "add", self.hub)
        self.made.append(self.hub)
        self._ip("link", "add", "br0", "type", "bridge", ns=self.hub)
        self._ip("link", "set", "br0", "up", ns=self.hub)
        for i, ns in enumerate(self.hosts):
            self._ip("netns", "add", ns)
            self.made.append(ns)
            # veth created inside the host namespace, peer moved to the hub.
            self._ip("link", "add", "uplink", "type", "veth", "peer", "name", f"h{i}", ns=ns)
            self._ip("link", "set", f"h{i}", "netns", self.hub, ns=ns)
            self._ip("link", "set", f"h{i}", "master", "br0", "up", ns=self.hub)
            self._ip("link", "add", "br0", "type", "bridge", ns=ns)
            self._ip("tuntap", "add", "dev", "tap0", "mode", "tap", ns=ns)
            for dev in ("tap0", "uplink"):
                self._ip("link", "set", dev, "master", "br0", "up", ns=ns)
            self._ip("link", "set", "br0", "up", ns=ns)
            self._ip("link", "set", "lo", "up", ns=ns)
        return self

    def destroy(self):
        # Deleting a namespace deletes the links, bridges and taps in it.
        for ns in reversed(self.made):
            run(["ip", "netns", "delete", ns], check=False)
        self.made.clear()


def guest_ip(index):
    return f"{NET_PREFIX}.{index + 1}"


class Guest:
    """One QEMU guest running one command."""

    def __init__(self, art, name, command, netns=None, index=0, mem=1024,
                 modules=(), qemu_args=(), timeout=600, echo=None):
        self.art, self.name, self.command = art, name, command
        self.netns, self.index, self.mem = netns, index, mem
        self.modules, self.qemu_args, self.timeout = list(modules), list(qemu_args), timeout
        self.echo = echo  # callable(line) for live output, or None
        self.proc = None
        self.output = []
        self.status = None
        self.timed_out = False
        self.console = []
        self._tmp = tempfile.mkdtemp(prefix=f"vstellar-{name}-")

    def argv(self):
        cmd_file = os.path.join(self._tmp, "cmd.sh")
        with open(cmd_file, "w") as f:
            f.write(self.command + "\n")
        append = ["console=ttyS0", "loglevel=3", "panic=-1", "mitigations=off",
                  f"vstellar.hostname={self.name}"]
        if self.modules:
            append.append("vstellar.modules=" + ",".join(self.modules))
        argv = [self.art.qemu, "-M", "pc", "-m", str(self.mem), "-smp", "1",
                "-display", "none", "-serial", "stdio", "-monitor", "none",
                "-no-reboot", "-nodefaults",
                "-kernel", self.art.kernel, "-initrd", self.art.initrd,
                "-fw_cfg", f"name=opt/vstellar/cmd,file={cmd_file}"]
        if kvm_usable():
            argv += ["-accel", "kvm", "-cpu", "host"]
        else:
            argv += ["-accel", "tcg", "-cpu", "max"]
        for d in self.art.firmware_dirs:
            argv += ["-L", d]
        if self.netns:
            append.append(f"vstellar.ip={guest_ip(self.index)}/24")
            mac = f"52:54:00:77:00:{self.index + 1:02x}"
            argv += ["-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
                     "-device", f"virtio-net-pci,netdev=n0,mac={mac},romfile="]
        argv += ["-append", " ".join(append)] + self.qemu_args
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns] + argv
        return argv

    def start(self):
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._deadline = time.monotonic() + self.timeout
        return self

    def _read(self):
        inside = False
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.console.append(line)
            m = re.match(r"^VSTELLAR-EXIT (\d+)$", line)
            if m:
                self.status = int(m.group(1))
                inside = False
            elif line == "VSTELLAR-BEGIN":
                inside = True
            elif inside:
                self.output.append(line)
                if self.echo:
                    self.echo(f"[{self.name}] {line}")

    def wait(self):
        """Wait for the guest to power off; kill it at its deadline."""
        while self.proc.poll() is None:
            if time.monotonic() > self._deadline:
                self.timed_out = True
                self.kill()
                break
            time.sleep(0.1)
        self._reader.join(timeout=5)
        return self.result()

    def result(self):
        if self.timed_out:
            return 124
        if self.status is None:
            return 125  # the guest died before the command finished
        return self.status

    def kill(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def close(self):
        self.kill()
        if self.proc:
            self.proc.stdout.close()
        shutil.rmtree(self._tmp, ignore_errors=True)


class Session:
    """Owns everything a run makes, and removes it on any exit path."""

    def __init__(self):
        self.guests = []
        self.net = None
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._old[sig] = signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    def __exit__(self, *exc):
        for g in self.guests:
            g.close()
        if self.net:
            self.net.destroy()
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


def run_guests(commands, modules=(), mem=1024, timeout=600, network=True, qemu_args=(),
               echo=None, qemu=None, image=None):
    """Boot one guest per command, all on one test network; wait for all.

    Each command sees $VSTELLAR_INDEX, $VSTELLAR_SELF_IP and $VSTELLAR_PEER_IP
    (the next guest's address, cyclically). Returns a list of
    (status, output_lines, console_lines), status 124 on timeout and 125 when
    the guest stopped without finishing the command.
    """
    art = Artifacts(qemu, image)
    n = len(commands)
    with Session() as s:
        if network:
            s.net = TestNet(n)
            s.net.create()
        for i, cmd in enumerate(commands):
            prologue = (f"export VSTELLAR_INDEX={i} VSTELLAR_SELF_IP={guest_ip(i)} "
                        f"VSTELLAR_PEER_IP={guest_ip((i + 1) % n)}\n")
            g = Guest(art, f"guest{i}", prologue + cmd, netns=s.net.hosts[i] if network else None,
                      index=i, mem=mem, modules=modules, qemu_args=qemu_args, timeout=timeout, echo=echo)
            s.guests.append(g)
            g.start()
        results = []
        for g in s.guests:
            status = g.wait()
            results.append((status, list(g.output), list(g.console)))
        return results


def cleanup_stale():
    """Remove namespaces (and the QEMUs in them) left by runs that died."""
    removed = []
    for ns in sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []:
        m = re.match(rf"^{NS_PREFIX}(\d+)(hub|h\d+)$", ns)
        if not m:
            continue
        pid = int(m.group(1))
        if os.path.exists(f"/proc/{pid}"):
            continue  # its run is still alive
        pids = run(["ip", "netns", "pids", ns], check=False).stdout.split()
        for p in pids:
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        run(["ip", "netns", "delete", ns], check=False)
        removed.append(ns)
    return removed

