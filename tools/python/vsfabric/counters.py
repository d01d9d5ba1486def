"""What a fabric counted: per-device bytes, packets and drops, the CE
markers' counters and the tbf queues' backlog."""
import json

from . import bpf
from .command import run
from .netns import Netns


class Counters:
    """Counter reads of a Fabric. Uses its namespaces, tor names and markers."""

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

    def forwarded(self, ns):
        """{4: IPv4 datagrams, 6: IPv6 datagrams} that ns forwarded so far
        (ForwDatagrams of /proc/net/snmp, Ip6OutForwDatagrams of snmp6)."""
        with Netns(ns):
            with open("/proc/thread-self/net/snmp") as f:
                ip = [l.split() for l in f if l.startswith("Ip:")]
            six = 0
            try:
                with open("/proc/thread-self/net/snmp6") as f:
                    for l in f:
                        if l.startswith("Ip6OutForwDatagrams"):
                            six = int(l.split()[1])
            except FileNotFoundError:  # no IPv6 in this kernel
                pass
        return {4: int(ip[1][ip[0].index("ForwDatagrams")]), 6: six}

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
        p = run(["tc", "-n", ns, "-s", "-j", "qdisc", "show"], check=False)
        out = {}
        try:
            for q in json.loads(p.stdout or "[]"):
                if q.get("kind") == "tbf":
                    out[q["dev"]] = {k: q.get(k, 0) for k in ("backlog", "qlen", "drops", "bytes")}
        except json.JSONDecodeError:
            pass
        return out
