"""Experiment 4: ToR queue occupancy, single path vs 128 paths, permutation.

Fabric: 2 ToRs x 4 hosts, 4 aggregation switches; host links 200 Mbit/s,
fabric links 250 Mbit/s (tbf, 1 MB queue), so a permutation h0.i -> h1.p(i)
loads the ToR-0 uplinks to 80% if spread evenly, and two flows that hash onto
one uplink overload it. Each run samples the tbf backlog (bytes) of every
ToR-0 uplink with `tc -s -j qdisc show` every --sample-ms while the clients
run (after a 0.3 s warm-up; --marking: with exp_ecn's CE marker on every
switch port), for --path-algo single (1 path) and obs with
128 paths, in runs of 16 packets per path (the harness's default
--path-burst, one UDP_SEGMENT send per run) and per packet (Stellar's
spraying). Reported: backlog mean/p50/p99/max over all samples and per
uplink, tbf drops, uplink byte shares, goodput, failed messages.
"""
import random
import statistics
import sys

import vsfabric
from vsfabric import exp, harness


def main():
    p = exp.parser("exp_queues", __doc__)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--aggs", type=int, default=4)
    p.add_argument("--host-rate", default="200mbit")
    p.add_argument("--uplink-rate", default="250mbit")
    p.add_argument("--sample-ms", type=float, default=20)
    p.add_argument("--seed", type=int, default=7, help="permutation seed")
    p.add_argument("--marking", action="store_true",
                   help="CE marking on every switch port (exp_ecn's phantom-queue marker, K 20 kB "
                        "at 0.95 x the link rate)")
    p.add_argument("--hash-seed", type=int, default=1,
                   help="the switches' fib_multipath_hash_seed (default 1), one draw of the ECMP "
                        "hash: whether single-path flows share an uplink depends on it (with its own "
                        "seed, kernel 6.18 put the 4 flows on 4 uplinks)")
    a = p.parse_args()
    t0 = exp.start(a)
    dur = a.duration or (2.0 if a.quick else 4.0)
    H, A = a.hosts, a.aggs
    perm = list(range(H))
    random.Random(a.seed).shuffle(perm)
    pairs = [((0, i), (1, perm[i])) for i in range(H)]
    res = {"runs": [], "permutation": perm}
    configs = [("single path", ["--paths", 1, "--path-algo", "single"]),
               ("obs 128 paths", ["--paths", 128, "--path-algo", "obs"]),
               # The harness's default sends runs of 16 packets per path (one
               # UDP_SEGMENT send each); Stellar sprays every packet.
               ("obs 128 paths per packet", ["--paths", 128, "--path-algo", "obs", "--path-burst", 1])]
    with vsfabric.Fabric(tors=2, hosts=H, aggs=A, uplink_rate=a.uplink_rate,
                         host_rate=a.host_rate, queue=1_000_000, hash_seed=a.hash_seed) as fab:
        res["fabric"] = fab.describe()
        res["marking"] = a.marking
        if a.marking:
            for ns, dev, rate in fab.switch_ports():
                fab.set_marking(ns, dev, vsfabric.rate_bps(rate) * 0.95, 20_000)
        for name, cfg in configs:
            r, samples, drops, d = exp.uplink_queue_run(fab, pairs, cfg, dur, a.sample_ms)
            s = harness.summarize(r)
            s.update({"config": name,
                      "backlog_bytes": exp.backlog_summary(samples),
                      "per_uplink": {dev: {"mean": round(statistics.mean(v)) if v else 0,
                                           "p99": exp.pct(v, .99), "max": max(v or [0]),
                                           "drops": drops[dev]}
                                     for dev, v in samples.items()},
                      "uplink_bytes": d, "samples": samples})
            res["runs"].append(s)
            bl = s["backlog_bytes"]
            print(f"{name:24s}: uplink backlog mean {bl['mean']} B p99 {bl['p99']} B max "
                  f"{bl['max']} B; uplink bytes {d}; goodput {s['goodput_gbps']:.3f} Gb/s; "
                  f"failed {s['failed_messages']}", file=sys.stderr)
    res["meta"] = exp.meta(t0, duration_s=dur, sample_ms=a.sample_ms,
                           note="backlog = tbf qdisc backlog on ToR-0 uplinks, sampled")
    exp.write(a, "queues", res)
    fig, ax = exp.plt.subplots(figsize=(6.4, 4.2))
    for r in res["runs"]:
        v = sorted(x / 1000 for s in r["samples"].values() for x in s)
        if v:
            ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=r["config"])
    ax.set_xlabel("ToR-0 uplink queue backlog (kB)")
    ax.set_ylabel("CDF of samples (all uplinks)")
    ax.set_title(f"permutation, {H} flows over {A} uplinks ({a.uplink_rate})")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    exp.save(fig, a, "queues")


if __name__ == "__main__":
    main()
