"""Experiment 1 (Stellar Figure 12): ToR uplink imbalance vs paths per connection.

16 connections (16 harness pairs, each with its own UDP source ports) between
one host under ToR 0 and one under ToR 1, A = 60 aggregation switches, no
shaping. For each path count k the connections spray WRITEs (OBS) for a short
run; the imbalance is (max - min) / mean of the bytes each ToR-0 uplink sent
(veth tx_bytes deltas). Repeated with a few ECMP hash seeds
(fib_multipath_hash_seed on ToR 0) because one seed is one draw of the hash.
Beside it: the balls-in-bins model (C*k equal flows hashed uniformly onto A
uplinks, Monte Carlo of (max-min)/mean, and sqrt(A/(C*k)) for the relative
spread), the same statistic from the kernel's own hash (`ip route get` per
source port, no traffic), and the paper's points.
"""
import random
import statistics
import sys

import vsfabric
from vsfabric import exp, harness

PAPER = {4: 0.50, 8: 0.29, 16: 0.20, 64: 0.11, 128: 0.085, 256: 0.085}


def imbalance(v):
    m = sum(v) / len(v)
    return (max(v) - min(v)) / m if m else 0.0


def model_mc(n, A, trials=400, rng=random.Random(1)):
    vals = []
    for _ in range(trials):
        b = [0] * A
        for _ in range(n):
            b[rng.randrange(A)] += 1
        vals.append(imbalance(b))
    return statistics.mean(vals)


def main():
    p = exp.parser("exp_imbalance", __doc__)
    p.add_argument("--aggs", type=int, default=60)
    p.add_argument("--conns", type=int, default=16)
    p.add_argument("--paths", default="1,4,8,16,64,128,256")
    p.add_argument("--seeds", type=int, help="hash seeds per point with traffic")
    a = p.parse_args()
    t0 = exp.start(a)
    dur = a.duration or (0.8 if a.quick else 1.5)
    seeds = a.seeds or (1 if a.quick else 2)
    ks = [int(x) for x in a.paths.split(",")]
    C, A = a.conns, a.aggs
    res = {"points": []}
    with vsfabric.Fabric(tors=2, hosts=1, aggs=A) as fab:
        res["fabric"] = fab.describe()
        src, dst = fab.host_ip(0, 0), fab.host_ip(1, 0)
        for k in ks:
            pt = {"paths": k, "conns": C, "runs": []}
            for s in range(seeds):
                fab._sysctls(fab.tor(0), forward=True)
                with vsfabric.Netns(fab.tor(0)):
                    open("/proc/sys/net/ipv4/fib_multipath_hash_seed", "w").write(str(1000 + s))
                before = fab.uplink_bytes(0)
                r = harness.run_pairs(fab, [((0, 0), (1, 0))] * C,
                                      ["--paths", k, "--size", "64K", "--depth", 8,
                                       "--no-path-detail", "--interval-ms", 1000], dur)
                after = fab.uplink_bytes(0)
                d = [x - y for x, y in zip(after, before)]
                sm = harness.summarize(r)
                pt["runs"].append({"seed": 1000 + s, "uplink_bytes": d, "imbalance": imbalance(d),
                                   "goodput_gbps": sm["goodput_gbps"],
                                   "all_completed": sm["all_completed"]})
            # The kernel's hash alone: which uplink each (connection, path) maps to.
            hs = []
            for s in range(8):
                with vsfabric.Netns(fab.tor(0)):
                    open("/proc/sys/net/ipv4/fib_multipath_hash_seed", "w").write(str(2000 + s))
                pp = []
                for c in range(C):
                    sp, cp, _ = harness.ports(c)
                    pp += [(cp + i, sp) for i in range(k)]
                devs = harness.route_dev(fab, fab.tor(0), pp, src, dst)
                cnt = [devs.count(f"u{x}") for x in range(A)]
                hs.append(imbalance(cnt))
            pt["measured"] = statistics.mean(r["imbalance"] for r in pt["runs"])
            pt["kernel_hash"] = statistics.mean(hs)
            pt["model_mc"] = model_mc(C * k, A)
            pt["model_rel_spread"] = (A / (C * k)) ** 0.5
            pt["paper"] = PAPER.get(k)
            res["points"].append(pt)
            print(f"k={k:3d}: measured {pt['measured']:.3f}  kernel-hash {pt['kernel_hash']:.3f}  "
                  f"balls-in-bins {pt['model_mc']:.3f}  sqrt(A/Ck) {pt['model_rel_spread']:.3f}  "
                  f"paper {pt['paper']}", file=sys.stderr)
    res["meta"] = exp.meta(t0, duration_s=dur, seeds=seeds,
                           note="imbalance = (max-min)/mean of ToR-0 uplink tx bytes; "
                                "paper points normalise by port bandwidth (compare slopes)")
    exp.write(a, "imbalance", res)
    fig, ax = exp.plt.subplots(figsize=(6.4, 4.2))
    P = res["points"]
    x = [q["paths"] for q in P]
    ax.plot(x, [q["measured"] for q in P], "o-", label="measured (veth byte counters)")
    ax.plot(x, [q["kernel_hash"] for q in P], "s--", label="kernel ECMP hash, equal bytes/path")
    ax.plot(x, [q["model_mc"] for q in P], "k:", label="balls-in-bins (max-min)/mean")
    ax.plot(x, [q["model_rel_spread"] for q in P], color="gray", ls="-.", lw=1,
            label="sqrt(A/(C k))")
    px = [k for k in x if k in PAPER]
    ax.plot(px, [PAPER[k] for k in px], "r^", label="Stellar paper Fig. 12")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("paths per connection")
    ax.set_ylabel("uplink imbalance (max-min)/mean")
    ax.set_title(f"{C} connections over {A} ToR uplinks")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    exp.save(fig, a, "imbalance")


if __name__ == "__main__":
    main()
