#!/usr/bin/python3
"""Fabric test over the IPv6 underlay (Fabric(ipv6=True): 2 ToRs, 4
uplinks, ECMP on the L4 hash for IPv6), behaviour only, never timing or
throughput:
  1. the IPv6 ECMP path follows the UDP source port: the 128 source ports of
     a connection land on every uplink (route lookups), one port always on
     one; the IPv4 routes of the same fabric still spread too;
  2. one connection with 1 path over IPv6 loads exactly one uplink, the one
     the route lookup of its source port names (not so when the hosts send
     with automatic flow labels: the ToR then takes the sender's skb hash,
     see Topology._sysctls6);
  3. one connection with 128 paths (OBS) over IPv6 completes every message
     with no error, every uplink carries at least 5% of the bytes, and the
     ToR forwarded IPv6 datagrams only (no IPv4);
  4. with one uplink dropping 5% of the (IPv6) UDP packets, every posted
     message completes, none fails, and the engine retransmitted.
Exits 77 (skipped) without root, network namespaces or IPv6.
"""
import os
import sys

import fabtest

A = 4
MIN_SHARE = 0.05  # of the uplinks' bytes, per uplink: a fair share is 1/A


def main():
    if not os.path.isdir("/proc/sys/net/ipv6"):
        print("SKIP: this kernel has no IPv6")
        return fabtest.SKIP
    env = fabtest.begin()
    if env is None:
        return fabtest.SKIP
    vsfabric, harness, check = env

    with vsfabric.Fabric(tors=2, hosts=1, aggs=A, ipv6=True) as fab:
        tor = fab.tor(0)
        sp, cp, _ = harness.ports(0)
        src, dst = fab.host_ip6(0, 0), fab.host_ip6(1, 0)
        devs = harness.route_dev(fab, tor, [(cp + i, sp) for i in range(128)], src, dst)
        per = {f"u{a}": devs.count(f"u{a}") for a in range(A)}
        check(all(per.values()), f"IPv6: the 128 source ports hash onto every uplink: {per}")
        again = harness.route_dev(fab, tor, [(cp + 3, sp)] * 8, src, dst)
        check(len(set(again)) == 1, "IPv6: one source port always takes one uplink")
        devs4 = harness.route_dev(fab, tor, [(cp + i, sp) for i in range(64)], fab.host_ip(0, 0),
                                  fab.host_ip(1, 0))
        check(len(set(devs4)) > 1, f"IPv4 beside it: source ports hash onto several uplinks: "
                                   f"{sorted(set(devs4))}")

        args = ["--size", "64K", "--depth", 8, "--no-path-detail"]
        b0 = fab.uplink_bytes(0)
        r = harness.run_pairs(fab, [((0, 0), (1, 0))], ["--paths", 1, "--path-algo", "single"]
                              + args, 0.5, family=6)
        d = [x - y for x, y in zip(fab.uplink_bytes(0), b0)]
        busy = [f"u{a}" for a, x in enumerate(d) if x > 1_000_000]
        check(harness.summarize(r)["all_completed"], "IPv6 single path: all messages completed")
        check(busy == [devs[0]], f"IPv6 single path loads one uplink, {devs[0]} (the route "
                                 f"lookup of its port): {d}")

        b0, f0 = fab.uplink_bytes(0), fab.forwarded(tor)
        r = harness.run_pairs(fab, [((0, 0), (1, 0))], ["--paths", 128] + args, 0.5, family=6)
        d = [x - y for x, y in zip(fab.uplink_bytes(0), b0)]
        f1 = fab.forwarded(tor)
        s = harness.summarize(r)
        c = r[0].get("client") or {}
        check(s["all_completed"] and s["failed_messages"] == 0,
              f"IPv6 128 paths: all messages completed, none failed ({s['completed']}/"
              f"{s['posted']}, {s['failed_messages']} failed)")
        check((c.get("link") or {}).get("tx_err", -1) == 0, "IPv6 128 paths: no send errors")
        total = sum(d)
        shares = [round(x / total, 3) if total else 0 for x in d]
        check(total > 1_000_000 and min(shares) >= MIN_SHARE,
              f"IPv6 128 paths: every uplink carries >= {MIN_SHARE:.0%} of the bytes: {shares} "
              f"of {total} B (ports per uplink {per})")
        # ToR 0 forwards the data one way and the ACKs the other; at least
        # half the data packets the client sent (a packet lost on the host
        # port is sent again and counted twice) tells the data went by IPv6.
        sent = (c.get("engine") or {}).get("data_pkts_sent", 0)
        check(f1[6] - f0[6] >= sent // 2 > 0 and f1[4] == f0[4],
              f"IPv6 128 paths: ToR 0 forwarded {f1[6] - f0[6]} IPv6 datagrams (client sent "
              f"{sent} data packets) and {f1[4] - f0[4]} IPv4")

        fab.set_loss(0, 1, 0.05)
        r = harness.run_pairs(fab, [((0, 0), (1, 0))], ["--paths", 128] + args, 0.5, family=6)
        s = harness.summarize(r)
        check(s["all_clients_ok"], "IPv6 lossy uplink: the client ran to the end")
        check(s["failed_messages"] == 0,
              f"IPv6 lossy uplink: no failed message ({s['failed_messages']})")
        check(s["posted"] > 0 and s["posted"] == s["completed"],
              f"IPv6 lossy uplink: every posted message completed ({s['completed']}/{s['posted']})")
        check(s["retx_pkts"] > 0, f"IPv6 lossy uplink: the engine retransmitted ({s['retx_pkts']})")
        fab.set_loss(0, 1, 0)
    check(not vsfabric.list_namespaces(f"vsf{os.getpid()}-"), "all namespaces removed")
    return check.result()


if __name__ == "__main__":
    sys.exit(main())
