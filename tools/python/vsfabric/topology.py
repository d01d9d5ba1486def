"""The fabric's topology: the names of its namespaces, their addresses,
the veth links between them and the routes, ECMP from each ToR over all its
uplinks (addressing plan in the package docstring and docs/fabric.md). With
ipv6 the same links carry IPv6 too: the same plan in the ULA prefix
fd76:7366::/32, the same ECMP routes."""
import os

from . import shaping
from .command import run
from .netns import Netns

# The IPv6 plan mirrors the IPv4 one: 198.18 -> V6:18, 198.19 -> V6:19
# (fd76:7366 is "vsf" after the ULA's fd: a ULA prefix, not routed anywhere).
V6 = "fd76:7366"


class Topology:
    """Names, addresses, links and routes of a Fabric. Uses the Fabric's
    T, H, A, prefix, mtu, hash_seed, link rates and marking settings, and
    its shaping and marking (_shape, set_marking)."""

    def tor(self, t):
        return f"{self.prefix}t{t}"

    def agg(self, a):
        return f"{self.prefix}a{a}"

    def host(self, t, i):
        return f"{self.prefix}h{t}.{i}"

    def host_ip(self, t, i):
        return f"198.18.{t + 1}.{2 * i + 1}"

    def host_ip6(self, t, i):
        """Host i under ToR t's IPv6 address (the fabric needs ipv6=True)."""
        if not self.ipv6:
            raise ValueError("this fabric has no IPv6 underlay: build it with ipv6=True")
        return f"{V6}:18:{t + 1:x}::{2 * i + 1:x}"

    def host_addr(self, t, i, family=4):
        """Host i under ToR t's address of IP version `family` (4 or 6)."""
        if family not in (4, 6):
            raise ValueError(f"IP version {family}: 4 or 6")
        return self.host_ip6(t, i) if family == 6 else self.host_ip(t, i)

    def _link_ip(self, t, a, side):  # side 0: ToR, 1: agg
        n = 2 * a + side
        return f"198.19.{4 * t + n // 256}.{n % 256}"

    def _tor_port_ip6(self, t, i):
        return f"{V6}:18:{t + 1:x}::{2 * i:x}"

    def _link_ip6(self, t, a, side):
        return f"{V6}:19:{t:x}::{2 * a + side:x}"

    def _tor_net6(self, t):
        return f"{V6}:18:{t + 1:x}::/64"

    def link_ends(self, t, a):
        """The IPv4 addresses of the ToR t - agg a link's two ends,
        (ToR end, agg end). A router answering a probe that came in over
        this link answers from the end it came in at (the fault locator
        names a link by them)."""
        return self._link_ip(t, a, 0), self._link_ip(t, a, 1)

    def uplinks(self, t=0):
        """(namespace, device) of ToR t's uplinks, index = agg."""
        return [(self.tor(t), f"u{a}") for a in range(self.A)]

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
        run(["ip", "-batch", "-"], "\n".join(root) + "\n")

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
                if self.ipv6:
                    hip6, tip6 = self.host_ip6(t, i), self._tor_port_ip6(t, i)
                    per[hn] += [f"addr add {hip6}/127 dev h0 nodad",
                                f"route add ::/0 via {tip6} dev h0"]
                    per[tn].append(f"addr add {tip6}/127 dev d{i} nodad")
            for a in range(A):
                an = self.agg(a)
                tip, aip = self._link_ip(t, a, 0), self._link_ip(t, a, 1)
                per[tn] += [f"link set u{a} mtu {self.mtu} up", f"addr add {tip}/31 dev u{a}"]
                per[an] += [f"link set d{t} mtu {self.mtu} up", f"addr add {aip}/31 dev d{t}",
                            f"route add 198.18.{t + 1}.0/24 via {tip} dev d{t}"]
                if self.ipv6:
                    tip6, aip6 = self._link_ip6(t, a, 0), self._link_ip6(t, a, 1)
                    per[tn].append(f"addr add {tip6}/127 dev u{a} nodad")
                    per[an] += [f"addr add {aip6}/127 dev d{t} nodad",
                                f"route add {self._tor_net6(t)} via {tip6} dev d{t}"]
            # ECMP to every other ToR's hosts over all uplinks.
            for u in range(T):
                if u == t:
                    continue
                hops = " ".join(f"nexthop via {self._link_ip(t, a, 1)} dev u{a}"
                                for a in range(A))
                per[tn].append(f"route add 198.18.{u + 1}.0/24 {hops}")
                if self.ipv6:
                    hops6 = " ".join(f"nexthop via {self._link_ip6(t, a, 1)} dev u{a}"
                                     for a in range(A))
                    per[tn].append(f"route add {self._tor_net6(u)} {hops6}")
        for n in names:
            self._sysctls(n, forward=not n.startswith(self.prefix + "h"))
        for n, cmds in per.items():
            run(["ip", "-n", n, "-batch", "-"], "\n".join(cmds) + "\n")
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
                self.set_marking(ns, dev, shaping.rate_bps(rate) * self.mark_fraction, self.mark_k,
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
        if forward:
            # Switches answer every TTL-limited probe (the fault locator's
            # route traces, docs/fabric.md) from the interface it came in
            # on, so that a hop's address names the link it arrived by.
            # Linux's default, one answer per second per destination, is
            # a policer a real switch sets in its own control plane.
            vals.update({"net/ipv4/icmp_errors_use_inbound_ifaddr": 1,
                         "net/ipv4/icmp_ratelimit": 0,
                         "net/ipv4/icmp_msgs_per_sec": 100000,
                         "net/ipv4/icmp_msgs_burst": 10000})
        with Netns(ns):
            if self.ipv6:
                vals.update(self._sysctls6(forward))
            for k, v in vals.items():
                try:
                    with open(f"/proc/sys/{k}", "w") as f:
                        f.write(str(v))
                except OSError:
                    if "hash_seed" not in k and "rmem" not in k and "icmp_msgs" not in k:
                        raise

    def _sysctls6(self, forward):
        """The IPv6 sysctls of the namespace this thread is in. Written before
        the links come up, so no device starts DAD or router solicitations;
        `all` does not reach existing devices for most keys, so each device
        gets them too. fib_multipath_hash_seed (IPv4's) seeds IPv6 ECMP too.

        auto_flowlabels 0: with automatic flow labels a host's UDP stack
        computes each packet's flow hash (skb->hash, marked as an L4 hash) to
        derive the label, the hash crosses the veth with the packet, and the
        ToR's ECMP (policy 1) takes that hash as it is instead of hashing the
        headers: the uplink would not depend on fib_multipath_hash_seed nor
        be the one `ip route get` names. A wire carries no skb hash; without
        labels the ToR hashes the 5-tuple, seeded, as for IPv4."""
        vals = {"net/ipv6/conf/all/forwarding": 1 if forward else 0,
                "net/ipv6/fib_multipath_hash_policy": 1,
                "net/ipv6/auto_flowlabels": 0}
        for dev in ["all", "default"] + sorted(os.listdir("/proc/sys/net/ipv6/conf")):
            for k, v in (("disable_ipv6", 0), ("accept_ra", 0), ("accept_dad", 0),
                         ("dad_transmits", 0), ("router_solicitations", 0),
                         ("accept_redirects", 0)):
                vals[f"net/ipv6/conf/{dev}/{k}"] = v
        return vals
