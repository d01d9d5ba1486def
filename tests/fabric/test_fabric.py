#!/usr/bin/python3
"""Fabric test: a small Clos (2 ToRs, 4 uplinks), spray over it, check
behaviour, never timing or throughput:
  1. the ECMP path follows the UDP source port (route lookups of different
     source ports land on more than one uplink; one port always on one);
  2. one connection with 1 path loads exactly one uplink;
  3. one connection with 128 paths (OBS) puts traffic on every uplink;
  4. with one uplink dropping 5% of UDP packets, every posted message
     completes, none fails, and the engine retransmitted.
Exits 77 (skipped) without root or network namespaces.
"""
import os
import sys

import fabtest


def main():
    env = fabtest.begin()
    if env is None:
        return fabtest.SKIP
    vsfabric, harness, check = env

    A = 4
    with vsfabric.Fabric(tors=2, hosts=1, aggs=A) as fab:
        src, dst = fab.host_ip(0, 0), fab.host_ip(1, 0)
        sp, cp, _ = harness.ports(0)
        devs = harness.route_dev(fab, fab.tor(0), [(cp + i, sp) for i in range(64)], src, dst)
        check(len(set(devs)) > 1, f"source ports hash onto several uplinks: {sorted(set(devs))}")
        again = harness.route_dev(fab, fab.tor(0), [(cp + 3, sp)] * 8, src, dst)
        check(len(set(again)) == 1, "one source port always takes one uplink")

        args = ["--size", "64K", "--depth", 8, "--no-path-detail"]
        b0 = fab.uplink_bytes(0)
        r = harness.run_pairs(fab, [((0, 0), (1, 0))], ["--paths", 1, "--path-algo", "single"] + args, 0.5)
        d = [x - y for x, y in zip(fab.uplink_bytes(0), b0)]
        busy = [x for x in d if x > 1_000_000]
        check(harness.summarize(r)["all_completed"], "single path: all messages completed")
        check(len(busy) == 1, f"single path loads one uplink: {d}")

        b0 = fab.uplink_bytes(0)
        r = harness.run_pairs(fab, [((0, 0), (1, 0))], ["--paths", 128] + args, 0.5)
        d = [x - y for x, y in zip(fab.uplink_bytes(0), b0)]
        s = harness.summarize(r)
        check(s["all_completed"], f"128 paths: all messages completed ({s['posted']} posted)")
        check(all(x > 0 for x in d), f"128 paths: every uplink carries traffic: {d}")

        fab.set_loss(0, 1, 0.05)
        r = harness.run_pairs(fab, [((0, 0), (1, 0))], ["--paths", 128] + args, 0.5)
        s = harness.summarize(r)
        check(s["all_clients_ok"], "lossy uplink: the client ran to the end")
        check(s["failed_messages"] == 0, f"lossy uplink: no failed message ({s['failed_messages']})")
        check(s["posted"] > 0 and s["posted"] == s["completed"],
              f"lossy uplink: every posted message completed ({s['completed']}/{s['posted']})")
        check(s["retx_pkts"] > 0, f"lossy uplink: the engine retransmitted ({s['retx_pkts']})")
        fab.set_loss(0, 1, 0)
    check(not vsfabric.list_namespaces(f"vsf{os.getpid()}-"), "all namespaces removed")
    return check.result()


if __name__ == "__main__":
    sys.exit(main())
