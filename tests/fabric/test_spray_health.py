#!/usr/bin/python3
"""Spraying under failure and congestion on the namespace fabric,
behaviour only, across ECMP hash seeds:

1. an uplink black hole (both ways, mid-run) fails no message and leaves
   every connection running, for every multipath algorithm;
2. where single-path flows collide on one uplink, 128 sprayed paths keep
   the ToR's uplink queues shorter than single path does.
"""
import sys

import fabtest

SEEDS = (1, 2)
RUN_S = 1.2


def black_hole(vsfabric, harness, exp, check, seed):
    import time
    with vsfabric.Fabric(tors=2, hosts=2, aggs=4, uplink_rate="200mbit", host_rate="200mbit",
                         queue=1_000_000, hash_seed=seed) as fab:
        pairs = exp.ring_pairs(2, 2)
        hole = exp.lossy_uplink(fab)
        for algo in ("obs", "rr", "dwrr", "bestrtt"):
            fab.set_loss(0, hole, 0)

            def during(t_start):
                time.sleep(max(0, t_start + 0.3 - time.time()))
                fab.set_loss(0, hole, 1.0)

            r = harness.run_pairs(fab, pairs, ["--paths", 128, "--path-algo", algo, "--size", "64K",
                                               "--depth", 16, "--no-path-detail"], RUN_S,
                                  during=during)
            s = harness.summarize(r)
            aside = sum(((x.get("client") or {}).get("engine") or {}).get("paths_set_aside", 0)
                        for x in r)
            check(s["failed_messages"] == 0 and s["all_completed"],
                  f"seed {seed} {algo}: black hole on u{hole}, {s['failed_messages']} failed "
                  f"messages, all completed {s['all_completed']} (goodput "
                  f"{s['goodput_gbps']:.3f} Gb/s, {s['timeouts']} timeouts, {aside} paths set aside)")
            check(aside > 0, f"seed {seed} {algo}: the clients set dead paths aside ({aside})")


def colliding_seed(vsfabric, harness, start):
    """The first hash seed from `start` on with which the single-path flows
    h0.0 -> h1.0 and h0.1 -> h1.1 take the same ToR-0 uplink (of 2)."""
    for seed in range(start, start + 40):
        with vsfabric.Fabric(tors=2, hosts=2, aggs=2, hash_seed=seed) as fab:
            devs = []
            for k, (src, dst) in enumerate([((0, 0), (1, 0)), ((0, 1), (1, 1))]):
                sp, cp, _ = harness.ports(k)
                devs += harness.route_dev(fab, fab.tor(0), [(cp, sp)], fab.host_ip(*src),
                                          fab.host_ip(*dst))
            if devs[0] == devs[1]:
                return seed
    return None


def queues(vsfabric, harness, exp, check, seed):
    # Two 200 Mbit/s flows over two 250 Mbit/s uplinks: single path puts
    # both on one (overloaded 1.6x), spraying loads each to 80%.
    pairs = [((0, 0), (1, 0)), ((0, 1), (1, 1))]
    with vsfabric.Fabric(tors=2, hosts=2, aggs=2, uplink_rate="250mbit", host_rate="200mbit",
                         queue=1_000_000, hash_seed=seed) as fab:
        tor = fab.tor(0)
        res = {}
        for name, cfg in (("single", ["--paths", 1, "--path-algo", "single"]),
                          ("obs", ["--paths", 128, "--path-algo", "obs"])):
            during, samples = exp.backlog_sampler(fab, tor, ["u0", "u1"], RUN_S + 0.3)
            r = harness.run_pairs(fab, pairs, cfg + ["--size", "64K", "--depth", 16,
                                                     "--no-path-detail"], RUN_S + 0.3, during=during)
            res[name] = (exp.backlog_summary(samples), harness.summarize(r))
        (qs, ss), (qo, so) = res["single"], res["obs"]
        check(ss["all_completed"] and so["all_completed"],
              f"seed {seed}: every WR completed (single {ss['all_completed']}, obs "
              f"{so['all_completed']})")
        check(qo["mean"] < qs["mean"],
              f"seed {seed}: sprayed uplink backlog mean {qo['mean']} B < single path's "
              f"{qs['mean']} B (p99 {qo['p99']} vs {qs['p99']} B; goodput "
              f"{so['goodput_gbps']:.3f} vs {ss['goodput_gbps']:.3f} Gb/s)")


def main():
    b = fabtest.begin()
    if b is None:
        return fabtest.SKIP
    vsfabric, harness, check = b
    from vsfabric import exp
    for seed in SEEDS:
        black_hole(vsfabric, harness, exp, check, seed)
    start = 1
    for _ in SEEDS:
        seed = colliding_seed(vsfabric, harness, start)
        check(seed is not None, f"a hash seed from {start} on makes the single-path flows collide")
        if seed is None:
            break
        queues(vsfabric, harness, exp, check, seed)
        start = seed + 1
    return check.result()


if __name__ == "__main__":
    sys.exit(main())
