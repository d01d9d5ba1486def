"""Boot vStellar test guests under QEMU and run commands inside them.

The library behind tools/vstellar-guest. A guest is the pinned Debian 6.1
kernel with the initramfs of tools/build-guest-image.sh; the command to run
reaches it through QEMU's fw_cfg (opt/vstellar/cmd) and its output comes back
on the serial console, between two marker lines written by tools/guest/init.

Guests join a test network: one network namespace per guest ("host"), made
here, each holding a bridge with the guest's tap device and one end of a veth
pair that links the namespaces. Everything made is removed again on exit,
failure, timeout or Ctrl-C (see Session).

With vstellar=True every guest also gets the vStellar device: a vstellard
per host namespace (Vstellard), or one daemon serving a group of guests
(shared_daemons=), QEMU with shared memfd RAM and vhost-user-vstellar-pci,
and vstellar.ko loaded in the guest. The daemons talk UDP over a second,
separate network (see TestNet) or over namespaces the caller made
(vstellar_hosts=, e.g. a tools/fabric Clos). With ipv6=True every guest
also gets an IPv6 address, fd77::<i+1>/64, beside its IPv4 one.
With accel="64M" every guest also gets the emulated accelerator
(vstellar-accel, docs/accelerator.md) with that much device memory.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import json
import threading
import time

from vstellar import TOP

ENV_FILE = os.path.join(TOP, "build", "guest.env")

# Test-network addresses live only inside the namespaces made here.
NET_PREFIX = "10.77.0"
OOB_PREFIX = "10.79.0"
# The IPv6 ones (ipv6=True): a ULA prefix, guest i being fd77::<i+1>/64.
NET6_PREFIX = "fd77::"
NET6_LEN = 64
NS_PREFIX = "vst"

# What a guest with the vStellar device loads, and the daemon's UDP base port.
VSTELLAR_MODULES = ["vstellar", "ib_uverbs", "rdma_ucm"]
# Soft-RoCE, the baseline and the plain RoCE v2 peer: rxe needs
# crc32_generic present (`rdma link add` fails with "No such file or
# directory" without it).
RXE_MODULES = ["crc32_generic", "rdma_rxe", "ib_uverbs", "rdma_ucm"]
VSTELLAR_PORT = 47000
# Engine packets are up to 4 KiB: the daemons' network must not fragment them.
FABRIC_MTU = 9000
# The emulated accelerator (accel=): its driver, and its memory backend's id.
ACCEL_MODULES = ["vstellar_accel"]
ACCEL_MEMDEV = "vsaccel0"


class GuestError(Exception):
    """A problem the user can act on; printed without a traceback."""


class Qmp:
    """A QMP client on a QEMU's monitor socket (-qmp unix:PATH,server=on).

    execute() sends one command and returns its "return" value, raising
    QmpError with QEMU's own message on an "error" reply; events that
    arrive meanwhile are kept for wait_event().
    """

    def __init__(self, path, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.sock.connect(path)
                break
            except OSError as e:
                self.sock.close()
                if time.monotonic() > deadline:
                    raise GuestError(f"QMP socket {path}: {e}")
                time.sleep(0.05)
        self.sock.settimeout(timeout)
        self.file = self.sock.makefile("rb")
        self.events = []
        greeting = self._read()
        if "QMP" not in greeting:
            raise GuestError(f"QMP {path}: unexpected greeting {greeting}")
        self.execute("qmp_capabilities")

    def _read(self):
        line = self.file.readline()
        if not line:
            raise GuestError("QMP: QEMU closed its monitor")
        return json.loads(line)

    def execute(self, command, **arguments):
        msg = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            r = self._read()
            if "event" in r:
                self.events.append(r)
            elif "error" in r:
                raise QmpError(command, r["error"].get("desc", str(r["error"])))
            elif "return" in r:
                return r["return"]

    def wait_event(self, name, timeout, match=lambda data: True):
        """The first event `name` whose data satisfies match, or None after
        timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e["event"] == name and match(e.get("data", {})):
                    return self.events.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                self.events.append(self._read())
            except socket.timeout:
                return None

    def close(self):
        self.file.close()
        self.sock.close()


class QmpError(GuestError):
    """QEMU refused a QMP command; str() is QEMU's message."""

    def __init__(self, command, desc):
        super().__init__(f"{command}: {desc}")
        self.command, self.desc = command, desc


def plug_vstellar(qmp, sock, dev_id, addr=None):
    """Hot-plug a vhost-user-vstellar-pci device, id dev_id, whose backend
    is the vstellard listening on sock: a new chardev (id dev_id + "-chr")
    connected to it, then the device (in PCI slot addr if given). Raises
    QmpError with QEMU's message (no socket, nobody listening, not a
    vstellard), leaving nothing behind."""
    chardev = dev_id + "-chr"
    qmp.execute("chardev-add", id=chardev,
                backend={"type": "socket", "data": {"addr": {"type": "unix", "data": {"path": sock}},
                                                    "server": False}})
    try:
        qmp.execute("device_add", driver="vhost-user-vstellar-pci", id=dev_id, chardev=chardev,
                    **({"addr": addr} if addr else {}))
    except QmpError:
        qmp.execute("chardev-remove", id=chardev)
        raise


def vstellar_device_args(sock, dev_id, addr):
    """QEMU options for the device plug_vstellar(qmp, sock, dev_id, addr)
    plugs: what a migration's destination starts with, since it must have
    the source's devices at the same addresses."""
    return ["-chardev", f"socket,id={dev_id}-chr,path={sock}",
            "-device", f"vhost-user-vstellar-pci,chardev={dev_id}-chr,id={dev_id},addr={addr}"]


def unplug_vstellar(qmp, dev_id, timeout=60):
    """Unplug what plug_vstellar plugged: device_del, then, once the guest
    has let go of it (DEVICE_DELETED), its chardev. Raises GuestError if the
    guest does not release the device within timeout seconds."""
    qmp.execute("device_del", id=dev_id)
    if not qmp.wait_event("DEVICE_DELETED", timeout, lambda d: d.get("device") == dev_id):
        raise GuestError(f"the guest did not release {dev_id} within {timeout} s")
    # The device lets go of its chardev when it is finalized, which QEMU
    # may do after DEVICE_DELETED (its memory regions are freed after an
    # RCU grace period): until then the chardev is "busy".
    deadline = time.monotonic() + 10
    while True:
        try:
            qmp.execute("chardev-remove", id=dev_id + "-chr")
            return
        except QmpError as e:
            if "busy" not in e.desc or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


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
        # A stock Debian guest (tools/build-stock-guest.sh) boots its root
        # from root.img with the kernel arguments in cmdline.
        self.disk = os.path.join(self.image, "root.img")
        if not os.path.exists(self.disk):
            self.disk = None
        self.append = []
        if os.path.exists(os.path.join(self.image, "cmdline")):
            with open(os.path.join(self.image, "cmdline")) as f:
                self.append = f.read().split()
        # SeaBIOS comes from Debian's seabios package (the dfsg source has no
        # blobs); the option ROM for -kernel boot from our QEMU build.
        self.firmware_dirs = [d for d in ("/usr/share/seabios",
                                          os.path.join(os.path.dirname(self.qemu), "pc-bios", "optionrom"),
                                          os.path.join(os.path.dirname(self.qemu), "pc-bios"))
                              if os.path.isdir(d)]
        if not os.path.exists("/usr/share/seabios/bios-256k.bin"):
            raise GuestError("SeaBIOS is missing (/usr/share/seabios/bios-256k.bin): run `make deps`")

    @property
    def vstellard(self):
        """The vstellard binary (VSTELLARD overrides build/'s)."""
        p = os.environ.get("VSTELLARD") or os.path.join(TOP, "build", "qemu-device", "vstellard", "vstellard")
        if not os.access(p, os.X_OK):
            raise GuestError(f"vstellard not built ({p}): run `make host`")
        return p


def container_image(path=None):
    """The container image directory (rootfs.tar, cmd): path, or the one
    `make guest` recorded (tools/build-container-image.sh)."""
    path = path or read_env_file().get("CONTAINER_IMAGE")
    if not path or not os.path.exists(os.path.join(path, "rootfs.tar")):
        raise GuestError(f"no container image ({path or 'nothing recorded'}): run `make guest`")
    return path


def microvm_image(container, guest_image=None):
    """A boot image that runs commands inside the container image
    (tools/build-microvm.sh: our kernel and initramfs with the image's root
    appended as /rootfs): a directory to pass as run_guests(image=...).
    Returns (directory, the image's default command)."""
    guest_image = guest_image or os.environ.get("VSTELLAR_GUEST_IMAGE") or read_env_file().get("GUEST_IMAGE")
    r = run([os.path.join(TOP, "tools", "build-microvm.sh"), str(guest_image), container_image(container)],
            check=False)
    if r.returncode:
        raise GuestError(f"build-microvm.sh failed: {r.stderr.strip()}")
    d = r.stdout.strip().splitlines()[-1]
    with open(os.path.join(d, "cmd")) as f:
        return d, f.read().strip()


OCI_IMAGE_TAR = "/usr/share/vstellar/images/perftest.tar"


def oci_image(container=None, guest_image=None):
    """The guest image with an OCI runtime (Debian's crun), our bundle maker
    (tools/oci/vstellar-oci-bundle) and the perftest container image as a
    tarball at OCI_IMAGE_TAR: tools/build-guest-overlay.sh over the guest
    image (cached by its inputs), so that other boots keep the small one."""
    guest_image = guest_image or os.environ.get("VSTELLAR_GUEST_IMAGE") or read_env_file().get("GUEST_IMAGE")
    with tempfile.TemporaryDirectory(prefix="vstellar-oci-") as extra:
        os.chmod(extra, 0o755)  # it becomes the guest's /
        tar = os.path.join(extra, OCI_IMAGE_TAR.lstrip("/"))
        os.makedirs(os.path.dirname(tar))
        shutil.copyfile(os.path.join(container_image(container), "rootfs.tar"), tar)
        os.makedirs(os.path.join(extra, "usr/local/bin"))
        shutil.copy(os.path.join(TOP, "tools", "oci", "vstellar-oci-bundle"),
                    os.path.join(extra, "usr/local/bin"))
        return overlay_image("oci", "crun", extra=extra, base=guest_image)


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

    With fabric=True each host namespace also gets a veth "fab" into a
    second bridge of the hub, fbr0, carrying the guest's own address
    10.77.0.<i+1>/24: the network of the hosts' vstellards. br0 has no
    address, so the guests' L2 (br0) and the daemons' network (fbr0) never
    mix although both use 10.77.0.0/24. This is what RoCE-style GIDs need:
    the driver makes the GID from the guest's IP, and vstellard sends to
    the IPv4 in the destination GID, which must therefore be the peer
    host's vstellard.

    ipv6=True adds fd77::<i+1>/64 beside each IPv4 address on fab (the
    guests give it to their eth0 themselves: run_guests). IPv6 needs no
    arp_ignore: Linux answers a neighbour solicitation only on the link
    that carries the address. fab_addrs=[[ADDR/LEN, ...] per host] puts
    exactly these addresses on the hosts' fab veths instead (a shared
    vstellard: all addresses of a group on its first host, none on the
    others).

    rxe_hosts={i, ...}: host i's guest sits on the fabric network itself,
    through a second tap device (tap1, bridged with its fab veth, which
    then carries no address): a guest with Soft-RoCE on that NIC is a
    plain RoCE v2 peer of the other hosts' vstellards.
    """

    def __init__(self, hosts, tag=None, fabric=False, ipv6=False, fab_addrs=None, rxe_hosts=()):
        if os.geteuid() != 0:
            raise GuestError("test networks need root (network namespaces, tap devices)")
        self.tag = tag or f"{NS_PREFIX}{os.getpid()}"
        self.hub = f"{self.tag}hub"
        self.hosts = [f"{self.tag}h{i}" for i in range(hosts)]
        self.fabric = fabric
        self.ipv6 = ipv6
        if fab_addrs is None:
            fab_addrs = [[f"{guest_ip(i)}/24"] + ([f"{guest_ip6(i)}/{NET6_LEN}"] if ipv6 else [])
                         for i in range(hosts)]
        if len(fab_addrs) != hosts:
            raise GuestError(f"fab_addrs needs one entry per host ({hosts})")
        self.fab_addrs = [list(a) for a in fab_addrs]
        self.rxe_hosts = set(rxe_hosts)
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
        # With IPv6, the bridges flood multicast as a plain switch does
        # (neighbour solicitations go to solicited-node groups, and nothing
        # here sends MLD queries that would keep snooped entries fresh).
        snoop = ["mcast_snooping", "0"] if self.ipv6 else []
        self._ip("link", "add", "br0", "type", "bridge", *snoop, ns=self.hub)
        self._ip("link", "set", "br0", "up", ns=self.hub)
        for i, ns in enumerate(self.hosts):
            self._ip("netns", "add", ns)
            self.made.append(ns)
            # veth created inside the host namespace, peer moved to the hub.
            self._ip("link", "add", "uplink", "type", "veth", "peer", "name", f"h{i}", ns=ns)
            self._ip("link", "set", f"h{i}", "netns", self.hub, ns=ns)
            self._ip("link", "set", f"h{i}", "master", "br0", "up", ns=self.hub)
            self._ip("link", "add", "br0", "type", "bridge", *snoop, ns=ns)
            self._ip("tuntap", "add", "dev", "tap0", "mode", "tap", ns=ns)
            for dev in ("tap0", "uplink"):
                self._ip("link", "set", dev, "master", "br0", "up", ns=ns)
            self._ip("link", "set", "br0", "up", ns=ns)
            self._ip("link", "set", "lo", "up", ns=ns)
        if self.fabric:
            self._ip("link", "add", "fbr0", "type", "bridge", *snoop, ns=self.hub)
            self._ip("link", "set", "fbr0", "mtu", str(FABRIC_MTU), "up", ns=self.hub)
            for i, ns in enumerate(self.hosts):
                # The host namespace owns the guest's address (on fab): its
                # br0, which sees the guests' ARP requests, must not answer
                # them for it (Linux answers for any local address by default).
                r = run(self.ns_exec(ns) + ["sysctl", "-qw", "net.ipv4.conf.br0.arp_ignore=8"], check=False)
                if r.returncode:
                    raise GuestError(f"arp_ignore on br0 in {ns}: {r.stderr.strip()}")
                self._ip("link", "add", "fab", "mtu", str(FABRIC_MTU), "type", "veth",
                         "peer", "name", f"f{i}", "mtu", str(FABRIC_MTU), ns=ns)
                self._ip("link", "set", f"f{i}", "netns", self.hub, ns=ns)
                self._ip("link", "set", f"f{i}", "master", "fbr0", "up", ns=self.hub)
                if i in self.rxe_hosts:
                    self._ip("link", "add", "fbr1", "type", "bridge", *snoop, ns=ns)
                    self._ip("tuntap", "add", "dev", "tap1", "mode", "tap", ns=ns)
                    for dev in ("fab", "tap1"):
                        self._ip("link", "set", dev, "master", "fbr1", "up", ns=ns)
                    self._ip("link", "set", "fbr1", "up", ns=ns)
                    continue
                for a in self.fab_addrs[i]:
                    # nodad: usable at once, not after a second of duplicate detection
                    self._ip("addr", "add", a, "dev", "fab", *(["nodad"] if ":" in a else []), ns=ns)
                self._ip("link", "set", "fab", "up", ns=ns)
        return self

    def destroy(self):
        # Deleting a namespace deletes the links, bridges and taps in it.
        for ns in reversed(self.made):
            run(["ip", "netns", "delete", ns], check=False)
        self.made.clear()


def guest_ip(index):
    return f"{NET_PREFIX}.{index + 1}"


def oob_ip(index):
    """A guest's out-of-band address beside plain RoCE v2 peers
    (run_guests rxe_guests)."""
    return f"{OOB_PREFIX}.{index + 1}"


def guest_ip6(index):
    return f"{NET6_PREFIX}{index + 1:x}"


def daemon_groups(n, k):
    """Guests 0..n-1 split into k contiguous groups of sizes differing by
    at most one (the first ones larger): [[0, 1], [2, 3]] for n=4, k=2."""
    if not 1 <= k <= n:
        raise GuestError(f"{k} shared daemons for {n} guests: need 1..{n}")
    groups, start = [], 0
    for g in range(k):
        size = n // k + (1 if g < n % k else 0)
        groups.append(list(range(start, start + size)))
        start += size
    return groups


class Vstellard:
    """One vstellard, run in a network namespace, serving one guest
    (`--socket --ip`) or several (devices=).

    devices=[[ADDR, ...], ...]: one vhost-user socket per entry, `--device
    SOCK,ip=ADDR...`, whose device may hold exactly those addresses (IPv4
    and IPv6) as GIDs; socks[k] is entry k's socket and qemu_args(mem, k)
    attaches a QEMU to it. Without devices the daemon serves its one
    socket with --ip (the daemon of one guest, as before).

    Its sockets, log and --stats-json file live in a private temporary
    directory. stop() sends SIGTERM (the daemon writes its counters at
    exit), then SIGKILL after a grace period; close() also removes the
    directory. stats holds the parsed counters after stop().
    """

    def __init__(self, art, name, netns=None, ip="127.0.0.1", port=VSTELLAR_PORT, args=(), devices=None):
        self.binary = art.vstellard
        self.netns, self.ip, self.port, self.args = netns, ip, port, list(args)
        self.devices = [list(d) for d in devices] if devices is not None else None
        self.dir = tempfile.mkdtemp(prefix=f"vstellard-{name}-")
        if self.devices is None:
            self.socks = [os.path.join(self.dir, "vstellard.sock")]
        else:
            self.socks = [os.path.join(self.dir, f"device{k}.sock") for k in range(len(self.devices))]
        self.sock = self.socks[0]
        self.log = os.path.join(self.dir, "vstellard.log")
        self.stats_file = os.path.join(self.dir, "stats.json")
        self.proc = None
        self.stats = None
        self.log_text = ""

    def argv(self):
        argv = [self.binary]
        if self.devices is None:
            argv += ["--socket", self.sock, "--ip", self.ip]
        else:
            for sock, addrs in zip(self.socks, self.devices):
                argv += ["--device", ",".join([sock] + [f"ip={a}" for a in addrs])]
        argv += ["--port", str(self.port), "--stats-json", self.stats_file] + self.args
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns] + argv
        return argv

    def start(self, timeout=10):
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        # The socket file appears when vstellard binds it, before its workers
        # have opened their path sockets; "listening on" is printed once all
        # of that is done (and its signal handlers are in place). Waiting for
        # the line means a caller that counts the daemon's fds or signals it
        # sees the daemon as it runs, not half-started.
        while not (all(os.path.exists(p) for p in self.socks) and "vstellard: listening on" in self.text()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise GuestError(f"vstellard did not start ({' '.join(self.argv())}): {self.text()[-2000:]}")
            time.sleep(0.05)
        return self

    def text(self):
        try:
            with open(self.log) as f:
                return f.read()
        except OSError:
            return self.log_text

    def counters(self, timeout=10):
        """The daemon's counters now: SIGUSR1 has it write them to its
        --stats-json file; waits for the file to change and parses it.
        Raises GuestError if it has not within timeout seconds."""
        before = os.stat(self.stats_file).st_mtime_ns if os.path.exists(self.stats_file) else 0
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if os.stat(self.stats_file).st_mtime_ns != before:
                    with open(self.stats_file) as f:
                        return json.load(f)
            except (OSError, ValueError):
                pass  # not there yet, or half written
            time.sleep(0.05)
        raise GuestError(f"vstellard {self.sock} wrote no counters within {timeout} s of SIGUSR1")

    def qemu_args(self, mem, device=0):
        return ["-object", f"memory-backend-memfd,id=mem,size={mem}M,share=on",
                "-machine", "memory-backend=mem",
                "-chardev", f"socket,id=vst,path={self.socks[device]}",
                "-device", "vhost-user-vstellar-pci,chardev=vst"]

    def stop(self, grace=3):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        if self.stats is None and os.path.exists(self.stats_file):
            try:
                with open(self.stats_file) as f:
                    self.stats = json.load(f)
            except (OSError, ValueError):
                pass
        self.log_text = self.text()

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Guest:
    """One QEMU guest running one command."""

    def __init__(self, art, name, command, netns=None, index=0, mem=1024,
                 modules=(), qemu_args=(), timeout=600, echo=None, addr=None, qmp=False,
                 incoming=None, console_input=False):
        self.art, self.name, self.command = art, name, command
        # A migration's destination: QEMU waits (-incoming URI, -S) for the
        # guest's state instead of booting, and stays paused after it until
        # told to go on (QMP cont); its console carries on the command's
        # output from where the source left it.
        self.incoming = incoming
        # The host may type lines into the guest's serial console
        # (type_line): the command reads them from /dev/ttyS0.
        self.console_input = console_input
        self.addr = addr  # eth0's "A.B.C.D/LEN"; default 10.77.0.<index+1>/24
        self.netns, self.index, self.mem = netns, index, mem
        self.modules, self.qemu_args, self.timeout = list(modules), list(qemu_args), timeout
        self.echo = echo  # callable(line) for live output, or None
        self.proc = None
        self.output = []
        self.status = None
        self.timed_out = False
        self.console = []
        self._tmp = tempfile.mkdtemp(prefix=f"vstellar-{name}-")
        # QEMU's monitor (QMP) for hot-plug, when asked for: connect() it
        self.qmp_path = os.path.join(self._tmp, "qmp.sock") if qmp else None
        self.qmp = None

    def type_line(self, text):
        """Type text and a newline into the guest's serial console (a guest
        made with console_input=True)."""
        self.proc.stdin.write((text + "\n").encode())
        self.proc.stdin.flush()

    def connect(self, timeout=30):
        """The guest's QMP client (made on first use)."""
        if not self.qmp:
            self.qmp = Qmp(self.qmp_path, timeout)
        return self.qmp

    def argv(self):
        cmd_file = os.path.join(self._tmp, "cmd.sh")
        with open(cmd_file, "w") as f:
            f.write(self.command + "\n")
        append = ["console=ttyS0", "loglevel=3", "panic=-1", "mitigations=off",
                  f"vsguest.hostname={self.name}"]
        if self.modules:
            append.append("vsguest.modules=" + ",".join(self.modules))
        append += self.art.append
        # maxcpus=2: TCG keeps the guest's memory barriers only when it
        # translates for parallel vCPUs, and the doorbell protocol with
        # vstellard needs them (docs/running-guests.md).
        argv = [self.art.qemu, "-M", "pc", "-m", str(self.mem), "-smp", "1,maxcpus=2",
                "-display", "none", "-serial", "stdio", "-monitor", "none",
                "-no-reboot", "-nodefaults",
                "-kernel", self.art.kernel, "-initrd", self.art.initrd,
                "-fw_cfg", f"name=opt/vstellar/cmd,file={cmd_file}"]
        if self.art.disk:
            argv += ["-drive", f"file={self.art.disk},if=virtio,format=raw,readonly=on"]
        if kvm_usable():
            argv += ["-accel", "kvm", "-cpu", "host"]
        else:
            argv += ["-accel", "tcg,thread=multi", "-cpu", "max"]
        for d in self.art.firmware_dirs:
            argv += ["-L", d]
        if self.netns:
            append.append(f"vsguest.ip={self.addr or guest_ip(self.index) + '/24'}")
            mac = f"52:54:00:77:00:{self.index + 1:02x}"
            argv += ["-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
                     "-device", f"virtio-net-pci,netdev=n0,mac={mac},romfile="]
        if self.qmp_path:
            argv += ["-qmp", f"unix:{self.qmp_path},server=on,wait=off"]
        if self.incoming:
            argv += ["-incoming", self.incoming, "-S"]
        argv += ["-append", " ".join(append)] + self.qemu_args
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns] + argv
        return argv

    def start(self):
        stdin = subprocess.PIPE if self.console_input else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.argv(), stdin=stdin, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._deadline = time.monotonic() + self.timeout
        return self

    def _read(self):
        inside = bool(self.incoming)
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
        if self.qmp:
            self.qmp.close()
        self.kill()
        if self.proc:
            self.proc.stdout.close()
        shutil.rmtree(self._tmp, ignore_errors=True)


class Session:
    """Owns everything a run makes, and removes it on any exit path."""

    def __init__(self):
        self.guests = []
        self.daemons = []
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
        for d in self.daemons:
            d.close()
        if self.net:
            self.net.destroy()
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


def run_guests(commands, modules=(), mem=1024, timeout=600, network=True, qemu_args=(),
               echo=None, qemu=None, image=None, vstellar=False, vstellar_hosts=None,
               guest_addrs=None, vstellard_args=(), daemons_out=None, images=None, qmp=False,
               during=None, ipv6=False, shared_daemons=None, rxe_guests=(), accel=None):
    """Boot one guest per command, all on one test network; wait for all.

    Each command sees $VSTELLAR_INDEX, $VSTELLAR_SELF_IP and $VSTELLAR_PEER_IP
    (the next guest's address, cyclically). Returns a list of
    (status, output_lines, console_lines), status 124 on timeout and 125 when
    the guest stopped without finishing the command.

    vstellar=True: each guest gets the vStellar device, served by its own
    vstellard, and loads VSTELLAR_MODULES. By default the daemons run in the
    guests' host namespaces on TestNet's separate fabric network (vstellard
    i on 10.77.0.<i+1>, the guest's own address). vstellar_hosts=[(netns,
    ip)] puts daemon i in netns on ip instead (a network the caller made,
    e.g. tools/fabric); guest_addrs=["A.B.C.D/LEN"] then gives the guests
    the same addresses (the GID is the guest's IP, and vstellard sends to
    the GID's IPv4), with a prefix long enough to reach each other over
    the guests' own L2. vstellard_args: extra daemon options (--paths 8).
    daemons_out: a list that receives, per daemon, a dict with its
    counters at exit ("stats", from --stats-json), its log ("log") and
    the guests it served ("guests", their indexes).
    images: one image directory per guest instead of `image` for all (e.g.
    a Debian 12 and a Debian 13 guest from tools/build-stock-guest.sh).
    qmp=True: each guest has a QMP monitor (Guest.connect()). during: a
    callable(session) run once every guest has started, while they run
    (hot-plug from the host); what it raises ends the run like a failure.

    ipv6=True: each guest's eth0 also gets fd77::<i+1>/64 (added without
    duplicate address detection before the command starts; the command
    sees $VSTELLAR_SELF_IP6 and $VSTELLAR_PEER_IP6), and with vstellar=True
    its device may hold it as a GID: RoCE v2 over IPv6.

    shared_daemons=K (with vstellar=True): K vstellards, daemon g serving
    the g-th of K contiguous groups of guests (daemon_groups). It runs in
    the host namespace of its group's first guest, which carries all the
    group's fabric addresses (the others carry none), with one `--device
    SOCK,ip=...` per guest of the group; each guest's QEMU, in its own
    namespace, attaches to its socket (a file). Default: one daemon per
    guest with `--socket --ip` (with ipv6, a `--device` with both
    addresses).

    rxe_guests={i, ...} (with vstellar=True): these guests get no vStellar
    device but a second NIC, eth1, on the daemons' fabric network with
    their address 10.77.0.<i+1>/24 (TestNet rxe_hosts), on which the
    command adds Soft-RoCE: plain RoCE v2 peers, which every daemon is
    told to speak RoCE v2 to (--roce-peers). A guest's GID and its
    daemon's address are one, so out-of-band traffic (perftest's TCP
    exchange) needs other addresses: every guest's eth0 also has
    10.79.0.<i+1>/24 (an rxe guest's eth0 only that), seen by the command
    as $VSTELLAR_OOB_SELF_IP and $VSTELLAR_OOB_PEER_IP.

    accel=SIZE ("64M" or bytes, a power of two): every guest also gets an
    emulated accelerator with SIZE bytes of device memory
    (-device vstellar-accel, docs/accelerator.md) and loads ACCEL_MODULES,
    so /dev/vstellar-accel0 is there when the command starts.
    """
    n = len(commands)
    if images is not None and len(images) != n:
        raise GuestError(f"images needs one entry per guest ({n})")
    arts = [Artifacts(qemu, im) for im in images] if images else [Artifacts(qemu, image)] * n
    if (vstellar_hosts or guest_addrs) and not vstellar:
        raise GuestError("vstellar_hosts/guest_addrs need vstellar=True")
    if vstellar and not network:
        raise GuestError("the vStellar device needs the test network (its GID is eth0's address)")
    if ipv6 and not network:
        raise GuestError("ipv6 needs the test network")
    if shared_daemons is not None and not vstellar:
        raise GuestError("shared_daemons needs vstellar=True")
    rxe = set(rxe_guests)
    if rxe and (not vstellar or shared_daemons is not None or ipv6 or vstellar_hosts or guest_addrs):
        raise GuestError("rxe_guests needs vstellar=True on the launcher's own IPv4 test network, "
                         "one daemon per guest")
    if (shared_daemons is not None or ipv6) and (vstellar_hosts or guest_addrs):
        raise GuestError("shared_daemons and ipv6 work on the launcher's own test network, "
                         "not with vstellar_hosts/guest_addrs")
    for lst, what in ((vstellar_hosts, "vstellar_hosts"), (guest_addrs, "guest_addrs")):
        if lst is not None and len(lst) != n:
            raise GuestError(f"{what} needs one entry per guest ({n})")
    addrs = list(guest_addrs) if guest_addrs else [f"{guest_ip(i)}/24" for i in range(n)]
    ips = [a.split("/")[0] for a in addrs]
    ip6s = [guest_ip6(i) for i in range(n)] if ipv6 else None
    groups = daemon_groups(n, shared_daemons) if shared_daemons is not None else [[i] for i in range(n)
                                                                                  if i not in rxe]
    modules = list(modules)
    accel_args = accel_qemu_args(accel_size(accel)) if accel is not None else []
    if accel is not None:
        modules += [m for m in ACCEL_MODULES if m not in modules]
    if vstellar:
        modules += [m for m in VSTELLAR_MODULES if m not in modules]
    if rxe:
        vstellard_args = list(vstellard_args) + ["--roce-peers", ",".join(f"{ips[i]}/32" for i in sorted(rxe))]
        modules += [m for m in RXE_MODULES if m not in modules]
    fab_addrs = None
    if shared_daemons is not None:
        fab_addrs = [[] for _ in range(n)]
        for group in groups:
            for i in group:
                fab_addrs[group[0]] += [f"{ips[i]}/24"] + ([f"{ip6s[i]}/{NET6_LEN}"] if ipv6 else [])
    with Session() as s:
        try:
            if network:
                s.net = TestNet(n, fabric=vstellar and not vstellar_hosts, ipv6=ipv6, fab_addrs=fab_addrs,
                                rxe_hosts=rxe)
                s.net.create()
            attach = {}  # guest index: (daemon, its device socket)
            if vstellar:
                for g, group in enumerate(groups):
                    name = f"guest{group[0]}" if len(group) == 1 else f"guests{group[0]}-{group[-1]}"
                    if vstellar_hosts:
                        ns, ip = vstellar_hosts[group[0]]
                    else:
                        ns, ip = s.net.hosts[group[0]], ips[group[0]]
                    devices = None
                    if shared_daemons is not None or ipv6:
                        devices = [[ips[i]] + ([ip6s[i]] if ipv6 else []) for i in group]
                    d = Vstellard(arts[group[0]], name, netns=ns, ip=ip, args=vstellard_args,
                                  devices=devices)
                    d.guests = list(group)
                    s.daemons.append(d)
                    d.start()
                    for k, i in enumerate(group):
                        attach[i] = (d, k)
            for i, cmd in enumerate(commands):
                prologue = (f"export VSTELLAR_INDEX={i} VSTELLAR_SELF_IP={ips[i]} "
                            f"VSTELLAR_PEER_IP={ips[(i + 1) % n]}\n")
                if ipv6:
                    # /bin/ip: busybox's own ip, which the shell prefers,
                    # knows no nodad
                    prologue += (f"export VSTELLAR_SELF_IP6={ip6s[i]} VSTELLAR_PEER_IP6={ip6s[(i + 1) % n]}\n"
                                 f"/bin/ip -6 addr add {ip6s[i]}/{NET6_LEN} dev eth0 nodad || exit 1\n")
                extra = list(qemu_args) + accel_args
                addr = addrs[i] if network else None
                if rxe:
                    prologue += (f"export VSTELLAR_OOB_SELF_IP={oob_ip(i)} "
                                 f"VSTELLAR_OOB_PEER_IP={oob_ip((i + 1) % n)}\n")
                if i in rxe:
                    addr = f"{oob_ip(i)}/24"
                    extra += ["-netdev", "tap,id=n1,ifname=tap1,script=no,downscript=no",
                              "-device", f"virtio-net-pci,netdev=n1,mac=52:54:00:78:00:{i + 1:02x},romfile="]
                    prologue += f"ip addr add {ips[i]}/24 dev eth1 && ip link set eth1 up || exit 1\n"
                elif vstellar:
                    d, k = attach[i]
                    extra = d.qemu_args(mem, k) + extra
                    if rxe:
                        prologue += f"ip addr add {oob_ip(i)}/24 dev eth0 || exit 1\n"
                g = Guest(arts[i], f"guest{i}", prologue + cmd, netns=s.net.hosts[i] if network else None,
                          index=i, mem=mem, modules=modules, qemu_args=extra, timeout=timeout,
                          echo=echo, addr=addr, qmp=qmp)
                s.guests.append(g)
                g.start()
            if during:
                during(s)
            results = []
            for g in s.guests:
                status = g.wait()
                results.append((status, list(g.output), list(g.console)))
            return results
        finally:
            for d in s.daemons:
                d.stop()
            if daemons_out is not None:
                daemons_out.extend({"stats": d.stats, "log": d.log_text, "guests": d.guests} for d in s.daemons)
            # A guest that timed out: both daemons' per-QP state, so that a
            # hang shows which side owes what (vstellar-stat --qps).
            if any(g.timed_out for g in s.guests):
                print(daemon_report({"stats": d.stats, "log": d.log_text} for d in s.daemons),
                      file=sys.stderr)


def accel_size(size):
    """Bytes of accelerator memory from an int or "64M"-style text (K, M,
    G suffixes, powers of 1024): a power of two of at least a page, as the
    device's BAR must be."""
    text = str(size).strip()
    m = re.fullmatch(r"(\d+)([KMG]?)i?B?", text, re.I)
    if not m:
        raise GuestError(f"accelerator size {text!r}: want e.g. 64M")
    n = int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]
    if n < 4096 or n & (n - 1):
        raise GuestError(f"accelerator size {text!r}: must be a power of two of 4K or more")
    return n


def accel_qemu_args(size):
    """QEMU options for one vstellar-accel with size bytes of memory: a
    shared memfd backend, so that vhost-user backends can map it too."""
    return ["-object", f"memory-backend-memfd,id={ACCEL_MEMDEV},size={size},share=on",
            "-device", f"vstellar-accel,memdev={ACCEL_MEMDEV}"]


def daemon_report(daemons, log_tail=2000):
    """Each daemon's per-QP state dump (engine and data path, from the
    counters it wrote at exit) and the end of its log, as text."""
    parts = []
    for i, d in enumerate(daemons):
        stats = d.get("stats") or {}
        qps = stats.get("qps", [])
        eng = stats.get("engine", {})
        parts.append(f"--- vstellard {i}: stalled_qps={eng.get('stalled_qps', '?')} "
                     f"timeouts={eng.get('timeouts', '?')} retx={eng.get('retx_pkts', '?')}")
        parts.extend("  " + q for q in qps)
        parts.append("  log: " + (d.get("log") or "")[-log_tail:].replace("\n", "\n  "))
    return "\n".join(parts)


def overlay_image(name, *packages, extra=None, base=None):
    """The test image (or base) plus Debian packages (fio, open-iscsi, ...)
    and the files of directory extra: an image variant built, or found in
    the cache, by tools/build-guest-overlay.sh. Returns its directory."""
    tool = os.path.join(TOP, "tools", "build-guest-overlay.sh")
    r = run([tool] + (["-x", extra] if extra else []) + [str(base or Artifacts().image), name, *packages],
            check=False)
    if r.returncode != 0:
        raise GuestError(f"build-guest-overlay.sh {name} failed: {r.stderr.strip()[-2000:]}")
    return r.stdout.strip().splitlines()[-1]


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

