"""The fabric's topology: the names of its namespaces, their addresses,
the veth links between them and the routes, ECMP from each ToR over all its
uplinks (addressing plan in the package docstring and docs/fabric.md)."""
from . import shaping
from .command import run
from .netns import Netns


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

    def _link_ip(self, t, a, side):  # side 0: ToR, 1: agg
        n = 2 * a + side
        return f"198.19.{4 * t + n // 256}.{n % 256}"

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
        with Netns(ns):
            for k, v in vals.items():
                try:
                    with open(f"/proc/sys/{k}", "w") as f:
                        f.write(str(v))
                except OSError:
                    if "hash_seed" not in k and "rmem" not in k:
                        raise
