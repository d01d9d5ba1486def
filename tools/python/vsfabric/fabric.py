"""The Fabric: its settings, building and tearing it down, and the
processes run in its namespaces. What it is made of is in the mixins:
Topology (names, addresses, links, ECMP routes), Shaping (tbf, netem),
Impairments (loss, ECN marking) and Counters."""
import os
import shutil
import subprocess
import time

from . import cleanup
from .command import run
from .counters import Counters
from .impairments import Impairments, check_marking
from .netns import list_namespaces
from .shaping import Shaping
from .topology import Topology


class Fabric(Topology, Shaping, Impairments, Counters):
    """A two-tier Clos: `tors` ToRs with `hosts` hosts each, `aggs` aggregation
    switches, every ToR linked to every agg.

    uplink_rate / host_rate: tbf rate strings ("200mbit") or None (unshaped);
    queue: tbf queue limit in bytes; delay: netem delay (needs sch_netem).
    mark_k: ECN marking off (None, the default) or the phantom queue's
    threshold K in bytes: every shaped switch port (ToR and agg egress, not
    the hosts' own ports) then gets a CE marker whose virtual queue drains at
    mark_fraction x the link's rate (set_marking); mark_cap caps its backlog
    (default: the queue limit).
    ipv6: also give every host and link an IPv6 address (fd76:7366::/32, a
    ULA) with the same ECMP routes and the L4 hash for IPv6
    (net.ipv6.fib_multipath_hash_policy=1); host_ip6 / host_addr(t, i, 6)
    name the hosts. Off by default: IPv4 alone needs no IPv6 in the kernel.
    """

    def __init__(self, tors=2, hosts=1, aggs=4, uplink_rate=None, host_rate=None,
                 queue=200_000, delay=None, mtu=9000, hash_seed=None, prefix=None,
                 verbose=False, mark_k=None, mark_fraction=0.95, mark_cap=None, ipv6=False):
        if aggs < 1 or tors < 1 or hosts < 1 or hosts > 127 or tors > 63 or aggs > 511:
            raise ValueError("need 1..63 ToRs, 1..127 hosts per ToR, 1..511 aggs")
        if mark_k is not None:
            check_marking(mark_k, mark_fraction, mark_cap or queue)
            if not uplink_rate and not host_rate:
                raise ValueError("ECN marking (mark_k) needs a link rate: the phantom queue "
                                 "drains at mark_fraction x the link's tbf rate")
        self.T, self.H, self.A = tors, hosts, aggs
        self.uplink_rate, self.host_rate = uplink_rate, host_rate
        self.queue, self.delay, self.mtu = queue, delay, mtu
        self.hash_seed = hash_seed
        self.ipv6 = bool(ipv6)
        self.prefix = prefix or f"vsf{os.getpid()}-"
        self.verbose = verbose
        self.namespaces = []
        self.procs = []
        self.bpffs = None
        self.lossy = {}
        self.mark_k, self.mark_fraction, self.mark_cap = mark_k, mark_fraction, mark_cap
        self.marking = {}  # (ns, dev) -> {rate_bps, k, cap, prog, map}
        self.build_s = None
        cleanup.live.append(self)

    def build(self):
        t0 = time.monotonic()
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise
        self.build_s = time.monotonic() - t0
        return self

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

    def destroy(self):
        self.kill_procs()
        self.lossy, self.marking = {}, {}
        if self.namespaces:
            existing = set(list_namespaces(self.prefix))
            dels = [f"netns del {n}" for n in self.namespaces if n in existing]
            if dels:
                run(["ip", "-force", "-batch", "-"], "\n".join(dels) + "\n", check=False)
            self.namespaces = []
        if self.bpffs:
            run(["umount", self.bpffs], check=False)
            shutil.rmtree(self.bpffs, ignore_errors=True)
            self.bpffs = None
        if self in cleanup.live:
            cleanup.live.remove(self)

    def __enter__(self):
        return self.build()

    def __exit__(self, *a):
        self.destroy()

    def describe(self):
        return {"tors": self.T, "hosts_per_tor": self.H, "aggs": self.A,
                "uplink_rate": self.uplink_rate, "host_rate": self.host_rate,
                "queue_bytes": self.queue, "delay": self.delay, "mtu": self.mtu,
                "ecmp": "fib_multipath_hash_policy=1 (L4 5-tuple)" +
                        (", IPv4 and IPv6" if self.ipv6 else ""),
                "ipv6": "fd76:7366::/32" if self.ipv6 else None,
                "hash_seed": self.hash_seed, "namespaces": len(self.namespaces),
                "ecn_marking": None if self.mark_k is None else
                {"kind": "phantom queue (eBPF)", "k_bytes": self.mark_k,
                 "rate_fraction": self.mark_fraction,
                 "cap_bytes": self.mark_cap or self.queue},
                "build_s": round(self.build_s or 0, 3)}
