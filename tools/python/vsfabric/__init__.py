"""vsfabric: a two-tier Clos fabric in Linux network namespaces.

    hosts -- ToR switches -- A aggregation switches (A up to 60 and more)

Every switch and host is a network namespace named with a per-process prefix
(`vsf<pid>-`); links are veth pairs, shaped with tbf (rate, burst, queue
limit) where a rate is given; ToRs spread traffic to other ToRs over all
uplinks with Linux ECMP and the L4 hash (fib_multipath_hash_policy=1), so a
UDP source port picks the uplink. Loss on a link and ECN (CE) marking by a
phantom queue are eBPF tc classifiers (see bpf.py). Everything the fabric
made is removed by Fabric.destroy(), which also runs at exit and on
SIGINT/SIGTERM/SIGHUP.

Addressing (all in the benchmarking range 198.18.0.0/15):
  host i under ToR t       198.18.(t+1).(2i+1)/31, its ToR port 198.18.(t+1).(2i)/31
  ToR t <-> agg a link     n = 2a (ToR side) or 2a+1 (agg side):
                           198.19.(4t + n/256).(n%256)/31
See docs/fabric.md.
"""
import atexit
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from . import bpf

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_live = []  # fabrics to tear down at exit


def _run(cmd, input=None, check=True):
    p = subprocess.run(cmd, input=input, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip()[:2000]}")
    return p


def _cleanup_all(*_):
    for f in list(_live):
        try:
            f.destroy()
        except Exception as e:  # keep going: remove as much as we can
            print(f"vsfabric: cleanup: {e}", file=sys.stderr)


def _on_signal(signum, frame):
    _cleanup_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(_cleanup_all)
for _s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_s, _on_signal)


class Netns:
    """Enter a named namespace in this thread (used for /proc reads and sysctls)."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.old = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        fd = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {self.name}")
        finally:
            os.close(fd)
        return self

    def __exit__(self, *a):
        _libc.setns(self.old, CLONE_NEWNET)
        os.close(self.old)


def ip4(s):
    a = [int(x) for x in s.split(".")]
    return (a[0] << 24) | (a[1] << 16) | (a[2] << 8) | a[3]


class Fabric:
    """A two-tier Clos: `tors` ToRs with `hosts` hosts each, `aggs` aggregation
    switches, every ToR linked to every agg.

    uplink_rate / host_rate: tbf rate strings ("200mbit") or None (unshaped);
    queue: tbf queue limit in bytes; delay: netem delay (needs sch_netem).
    mark_k: ECN marking off (None, the default) or the phantom queue's
    threshold K in bytes: every shaped switch port (ToR and agg egress, not
    the hosts' own ports) then gets a CE marker whose virtual queue drains at
    mark_fraction x the link's rate (set_marking); mark_cap caps its backlog
    (default: the queue limit).
    """

    def __init__(self, tors=2, hosts=1, aggs=4, uplink_rate=None, host_rate=None,
                 queue=200_000, delay=None, mtu=9000, hash_seed=None, prefix=None,
                 verbose=False, mark_k=None, mark_fraction=0.95, mark_cap=None):
        if aggs < 1 or tors < 1 or hosts < 1 or hosts > 127 or tors > 63 or aggs > 511:
            raise ValueError("need 1..63 ToRs, 1..127 hosts per ToR, 1..511 aggs")
        if mark_k is not None:
            _check_marking(mark_k, mark_fraction, mark_cap or queue)
            if not uplink_rate and not host_rate:
                raise ValueError("ECN marking (mark_k) needs a link rate: the phantom queue "
                                 "drains at mark_fraction x the link's tbf rate")
        self.T, self.H, self.A = tors, hosts, aggs
        self.uplink_rate, self.host_rate = uplink_rate, host_rate
        self.queue, self.delay, self.mtu = queue, delay, mtu
        self.hash_seed = hash_seed
        self.prefix = prefix or f"vsf{os.getpid()}-"
        self.verbose = verbose
        self.namespaces = []
        self.procs = []
        self.bpffs = None
        self.lossy = {}
        self.mark_k, self.mark_fraction, self.mark_cap = mark_k, mark_fraction, mark_cap
        self.marking = {}  # (ns, dev) -> {rate_bps, k, cap, prog, map}
        self.build_s = None
        _live.append(self)

    # ---- names and addresses -------------------------------------------------
    def tor(self, t):
        return f"{self.prefix}t{t}"

    def agg(self, a):
        return f"{self.prefix}a{a}"

    def host(self, t, i):
        return f"{self.prefix}h{t}.{i}"

    def host_ip(self, t, i):
        return f"198.18.{t + 1}.{2 * i + 1}"

    def _link_ip(self, t, a, side):  # side 0: ToR, 1: agg
        n = 2 * a + side
        return f"198.19.{4 * t + n // 256}.{n % 256}"

    def uplinks(self, t=0):
        """(namespace, device) of ToR t's uplinks, index = agg."""
        return [(self.tor(t), f"u{a}") for a in range(self.A)]

    # ---- build -----------------------------------------------------------------
    def build(self):
        t0 = time.monotonic()
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise
        self.build_s = time.monotonic() - t0
        return self

    def _build(self):
        T, H, A = self.T, self.H, self.A
        names = [self.tor(t) for t in range(T)] + [self.agg(a) for a in range(A)] + \
            [self.host(t, i) for t in range(T) for i in range(H)]
        # Record before creating, so a half-built fabric is removed too.
        self.namespaces = names
        root = [f"netns add {n}" for n in names]
        for t in range(T):
            for i in range(H):
                root.append(f"link add h0 netns {self.host(t, i)} type veth "
                            f"peer name d{i} netns {self.tor(t)}")
            for a in range(A):
                root.append(f"link add u{a} netns {self.tor(t)} type veth "
                            f"peer name d{t} netns {self.agg(a)}")
        _run(["ip", "-batch", "-"], "\n".join(root) + "\n")

        per = {n: [] for n in names}
        for n in names:
            per[n].append("link set lo up")
        for t in range(T):
            tn = self.tor(t)
            for i in range(H):
                hn = self.host(t, i)
                hip, tip = self.host_ip(t, i), f"198.18.{t + 1}.{2 * i}"
                # gso_max_segs 1: the host's port cuts segmented sends
                # (UDP_SEGMENT, TSO) into packets, as a NIC does, so
                # switches queue, mark and drop packets, not 64 KiB bursts.
                per[hn] += [f"link set h0 mtu {self.mtu} gso_max_segs 1 up", f"addr add {hip}/31 dev h0",
                            f"route add default via {tip} dev h0"]
                per[tn] += [f"link set d{i} mtu {self.mtu} up", f"addr add {tip}/31 dev d{i}"]
            for a in range(A):
                an = self.agg(a)
                tip, aip = self._link_ip(t, a, 0), self._link_ip(t, a, 1)
                per[tn] += [f"link set u{a} mtu {self.mtu} up", f"addr add {tip}/31 dev u{a}"]
                per[an] += [f"link set d{t} mtu {self.mtu} up", f"addr add {aip}/31 dev d{t}",
                            f"route add 198.18.{t + 1}.0/24 via {tip} dev d{t}"]
            # ECMP to every other ToR's hosts over all uplinks.
            for u in range(T):
                if u == t:
                    continue
                hops = " ".join(f"nexthop via {self._link_ip(t, a, 1)} dev u{a}"
                                for a in range(A))
                per[tn].append(f"route add 198.18.{u + 1}.0/24 {hops}")
        for n in names:
            self._sysctls(n, forward=not n.startswith(self.prefix + "h"))
        for n, cmds in per.items():
            _run(["ip", "-n", n, "-batch", "-"], "\n".join(cmds) + "\n")
        # Shaping: tbf on both ends of every link (host links and fabric links).
        for t in range(T):
            tn = self.tor(t)
            for i in range(H):
                self._shape(self.host(t, i), "h0", self.host_rate)
                self._shape(tn, f"d{i}", self.host_rate)
            for a in range(A):
                self._shape(tn, f"u{a}", self.uplink_rate)
                self._shape(self.agg(a), f"d{t}", self.uplink_rate)
        if self.mark_k is not None:
            for ns, dev, rate in self.switch_ports():
                self.set_marking(ns, dev, _rate_bps(rate) * self.mark_fraction, self.mark_k,
                                 self.mark_cap)

    def switch_ports(self):
        """(namespace, device, tbf rate) of every shaped switch egress port:
        ToR ports to hosts and uplinks, agg ports down to ToRs."""
        out = []
        for t in range(self.T):
            if self.host_rate:
                out += [(self.tor(t), f"d{i}", self.host_rate) for i in range(self.H)]
            if self.uplink_rate:
                for a in range(self.A):
                    out += [(self.tor(t), f"u{a}", self.uplink_rate),
                            (self.agg(a), f"d{t}", self.uplink_rate)]
        return out

    def _sysctls(self, ns, forward):
        vals = {"net/ipv4/conf/all/rp_filter": 0, "net/ipv4/conf/default/rp_filter": 0,
                "net/ipv4/ip_forward": 1 if forward else 0,
                "net/ipv4/fib_multipath_hash_policy": 1,
                "net/ipv4/conf/all/accept_redirects": 0, "net/ipv4/conf/all/send_redirects": 0,
                "net/ipv4/conf/default/send_redirects": 0,
                "net/ipv4/udp_rmem_min": 4096}
        if self.hash_seed is not None:
            vals["net/ipv4/fib_multipath_hash_seed"] = self.hash_seed
        with Netns(ns):
            for k, v in vals.items():
                try:
                    with open(f"/proc/sys/{k}", "w") as f:
                        f.write(str(v))
                except OSError:
                    if "hash_seed" not in k and "rmem" not in k:
                        raise

    def _shape(self, ns, dev, rate):
        if not rate and not self.delay:
            return
        if self.delay:
            _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:",
                  "netem", "delay", self.delay, "limit", "100000"])
        if rate:
            bps = _rate_bps(rate)
            burst = max(32 * 1024, int(bps / 8 / 1000))  # >= 1 ms of line rate
            parent = ["parent", "1:"] if self.delay else ["root"]
            _run(["tc", "-n", ns, "qdisc", "add", "dev", dev] + parent +
                 ["handle", "10:", "tbf", "rate", rate, "burst", str(burst),
                  "limit", str(self.queue)])

    # ---- impairments -------------------------------------------------------------
    # Both are eBPF classifiers on the clsact egress hook of a link end, each
    # at its own priority, so one link can have both: the loss filter runs
    # first (a dropped packet never enters the phantom queue), a surviving
    # packet goes on to the marker (TC_ACT_UNSPEC continues to the next prio).
    PRIO_LOSS, PRIO_MARK = 1, 2

    def _clsact(self, ns, dev):
        if (ns, dev) not in self.lossy and (ns, dev) not in self.marking:
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "clsact"])

    def _del_filter(self, ns, dev, prio):
        _run(["tc", "-n", ns, "filter", "del", "dev", dev, "egress", "prio", str(prio)],
             check=False)

    def set_loss(self, tor, agg, prob, both=True):
        """Drop UDP on the link ToR `tor` <-> agg `agg` with probability prob
        (1.0 = black hole; 0 = remove). Routing does not know."""
        ends = [(self.tor(tor), f"u{agg}")] + ([(self.agg(agg), f"d{tor}")] if both else [])
        for ns, dev in ends:
            key = (ns, dev)
            if key in self.lossy:
                self._del_filter(ns, dev, self.PRIO_LOSS)
            if prob <= 0:
                self.lossy.pop(key, None)
                continue
            self._clsact(ns, dev)
            pin = os.path.join(self._bpffs(), f"loss-{ns}-{dev}-{int(prob * 1e6)}")
            if not os.path.exists(pin):
                bpf.load_and_pin(prob, pin)
            _run(["tc", "-n", ns, "filter", "add", "dev", dev, "egress", "prio",
                  str(self.PRIO_LOSS), "bpf", "object-pinned", pin, "da"])
            self.lossy[key] = prob

    def set_marking(self, ns, dev, rate_bps, k, cap=None):
        """ECN CE marking on the egress of device `dev` in namespace `ns`: a
        phantom queue drained at rate_bps (bits/s; a bit below the link's tbf
        rate) marks ECT packets CE while its backlog exceeds k bytes; its
        backlog is capped at `cap` bytes (default: the fabric's queue limit,
        as a real queue could not hold more). rate_bps 0 or None removes it
        (and its counters)."""
        key = (ns, dev)
        if key in self.marking:
            self._del_filter(ns, dev, self.PRIO_MARK)
            old = self.marking.pop(key)
            for f in (old["prog"], old["map"]):
                try:
                    os.unlink(f)
                except FileNotFoundError:
                    pass
        if not rate_bps:
            return
        cap = cap or self.queue
        _check_marking(k, None, cap)
        self._clsact(ns, dev)
        base = os.path.join(self._bpffs(), f"mark-{ns}-{dev}")
        prog, mp = base + "-prog", base + "-map"
        bpf.load_marker(rate_bps / 8, k, cap, prog, mp)
        self.marking[key] = {"rate_bps": rate_bps, "k": k, "cap": cap, "prog": prog, "map": mp}
        _run(["tc", "-n", ns, "filter", "add", "dev", dev, "egress", "prio",
              str(self.PRIO_MARK), "bpf", "object-pinned", prog, "da"])

    def set_link_marking(self, tor, agg, k, fraction=0.95, cap=None, both=True):
        """Marking on the link ToR `tor` <-> agg `agg` (k None: off), drained
        at fraction x uplink_rate; needs a shaped uplink."""
        if k is not None:
            if not self.uplink_rate:
                raise ValueError("marking needs a link rate (uplink_rate)")
            _check_marking(k, fraction, cap or self.queue)
        rate = _rate_bps(self.uplink_rate) * fraction if k is not None else 0
        ends = [(self.tor(tor), f"u{agg}")] + ([(self.agg(agg), f"d{tor}")] if both else [])
        for ns, dev in ends:
            self.set_marking(ns, dev, rate, k, cap)

    def _bpffs(self):
        if not self.bpffs:
            d = tempfile.mkdtemp(prefix=self.prefix + "bpf")
            _run(["mount", "-t", "bpf", self.prefix + "bpf", d])
            self.bpffs = d
        return self.bpffs

    # ---- counters ------------------------------------------------------------------
    def link_counters(self, ns):
        """{dev: {rx_bytes, rx_packets, rx_drop, tx_bytes, tx_packets, tx_drop}} of ns."""
        with Netns(ns):
            with open("/proc/thread-self/net/dev") as f:
                lines = f.read().splitlines()[2:]
        out = {}
        for l in lines:
            name, rest = l.split(":", 1)
            v = [int(x) for x in rest.split()]
            out[name.strip()] = {"rx_bytes": v[0], "rx_packets": v[1], "rx_drop": v[3],
                                 "tx_bytes": v[8], "tx_packets": v[9], "tx_drop": v[11]}
        return out

    def uplink_bytes(self, t=0):
        c = self.link_counters(self.tor(t))
        return [c[f"u{a}"]["tx_bytes"] for a in range(self.A)]

    def all_counters(self):
        return {ns: self.link_counters(ns) for ns in self.namespaces}

    def mark_counters(self):
        """{(ns, dev): {pkts, bytes, marked, over, over_not_ect, over_ce,
        backlog, max_backlog, last_ns}} of every marker: pkts/bytes = IPv4
        seen, marked = CE marks set, over = packets that found the phantom
        queue above K, of which over_not_ect were not ECT and over_ce were
        CE already (both passed unchanged), backlog = the virtual queue at the
        last packet (bytes)."""
        return {key: bpf.read_marker(m["map"]) for key, m in self.marking.items()}

    def uplink_marks(self, t=0):
        """CE marks set on ToR t's uplinks (0 where there is no marker)."""
        out = []
        for a in range(self.A):
            m = self.marking.get((self.tor(t), f"u{a}"))
            out.append(bpf.read_marker(m["map"])["marked"] if m else 0)
        return out

    def qdisc_stats(self, ns):
        """{dev: {backlog, qlen, drops, bytes}} of the tbf qdiscs in ns."""
        p = _run(["tc", "-n", ns, "-s", "-j", "qdisc", "show"], check=False)
        out = {}
        try:
            for q in json.loads(p.stdout or "[]"):
                if q.get("kind") == "tbf":
                    out[q["dev"]] = {k: q.get(k, 0) for k in ("backlog", "qlen", "drops", "bytes")}
        except json.JSONDecodeError:
            pass
        return out

    # ---- processes ---------------------------------------------------------------
    def popen(self, ns, argv, **kw):
        p = subprocess.Popen(["ip", "netns", "exec", ns] + [str(a) for a in argv],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        self.procs.append(p)
        return p

    def kill_procs(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.kill()  # by its own pid: we started it
                    p.wait(timeout=5)
                except Exception:
                    pass
        self.procs = []

    # ---- teardown ------------------------------------------------------------------
    def destroy(self):
        self.kill_procs()
        self.lossy, self.marking = {}, {}
        if self.namespaces:
            existing = set(list_namespaces(self.prefix))
            dels = [f"netns del {n}" for n in self.namespaces if n in existing]
            if dels:
                _run(["ip", "-force", "-batch", "-"], "\n".join(dels) + "\n", check=False)
            self.namespaces = []
        if self.bpffs:
            _run(["umount", self.bpffs], check=False)
            shutil.rmtree(self.bpffs, ignore_errors=True)
            self.bpffs = None
        if self in _live:
            _live.remove(self)

    def __enter__(self):
        return self.build()

    def __exit__(self, *a):
        self.destroy()

    def describe(self):
        return {"tors": self.T, "hosts_per_tor": self.H, "aggs": self.A,
                "uplink_rate": self.uplink_rate, "host_rate": self.host_rate,
                "queue_bytes": self.queue, "delay": self.delay, "mtu": self.mtu,
                "ecmp": "fib_multipath_hash_policy=1 (L4 5-tuple)",
                "hash_seed": self.hash_seed, "namespaces": len(self.namespaces),
                "ecn_marking": None if self.mark_k is None else
                {"kind": "phantom queue (eBPF)", "k_bytes": self.mark_k,
                 "rate_fraction": self.mark_fraction,
                 "cap_bytes": self.mark_cap or self.queue},
                "build_s": round(self.build_s or 0, 3)}


def _check_marking(k, fraction, cap):
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"mark fraction {fraction}: need 0 < f <= 1")
    if not 0 < k < cap:
        raise ValueError(f"mark K {k} B: need 0 < K < the queue limit ({cap} B)")


def _rate_bps(r):
    m = re.fullmatch(r"([\d.]+)\s*([kmg]?)bit", r.lower())
    if not m:
        raise ValueError(f"rate {r}: use e.g. 200mbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def list_namespaces(prefix="vsf"):
    try:
        return [n for n in os.listdir("/run/netns") if n.startswith(prefix)]
    except FileNotFoundError:
        return []


def cleanup_stale(prefix="vsf"):
    """Remove namespaces vsf<pid>-* whose process is gone (a killed run)."""
    gone = []
    for n in list_namespaces(prefix):
        m = re.match(r"vsf(\d+)-", n)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            gone.append(n)
    if gone:
        _run(["ip", "-force", "-batch", "-"], "".join(f"netns del {n}\n" for n in gone),
             check=False)
    for d in os.listdir(tempfile.gettempdir()):
        m = re.match(r"vsf(\d+)-bpf", d)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            p = os.path.join(tempfile.gettempdir(), d)
            _run(["umount", p], check=False)
            shutil.rmtree(p, ignore_errors=True)
    return gone
