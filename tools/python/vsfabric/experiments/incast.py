"""Experiment 6: incast, N connections into one host, sprayed and single path.

Fabric: 2 ToRs x 4 hosts, 4 aggregation switches, every link tbf-shaped
(--rate, 200 Mbit/s, 1 MB queue). N connections (--n, default 8,16,32)
from the hosts under ToR 0 (connection k from h0.(k mod 4)) all WRITE to
h1.0, so ToR 1's port to h1.0 is the bottleneck N connections share. Run
once with --path-algo single (1 path) and once with OBS over 128 paths.
Reported per run: the tbf backlog of that port (sampled every --sample-ms
after a 0.3 s warm-up: mean, p99, max), its tail drops, total goodput, Jain's fairness index over the
connections' goodputs ((sum x)^2 / (N sum x^2)), failed messages, and
whether every posted WR completed.
"""
import sys

import vsfabric
from vsfabric import exp, harness


def jain(xs):
    return (sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))) if xs and any(xs) else 0


def main():
    p = exp.parser("exp_incast", __doc__)
    p.add_argument("--n", default="8,16,32", help="connection counts")
    p.add_argument("--rate", default="200mbit")
    p.add_argument("--sample-ms", type=float, default=20)
    a = p.parse_args()
    t0 = exp.start(a)
    dur = a.duration or (2.0 if a.quick else 4.0)
    H, A = 4, 4
    res = {"runs": []}
    configs = [("single path", ["--paths", 1, "--path-algo", "single"]),
               ("obs 128 paths", ["--paths", 128, "--path-algo", "obs"])]
    with vsfabric.Fabric(tors=2, hosts=H, aggs=A, uplink_rate=a.rate, host_rate=a.rate,
                         queue=1_000_000) as fab:
        res["fabric"] = fab.describe()
        t1 = fab.tor(1)
        for n in [int(x) for x in a.n.split(",")]:
            pairs = [((0, k % H), (1, 0)) for k in range(n)]
            for name, cfg in configs:
                during, samples = exp.backlog_sampler(fab, t1, ["d0"], dur, period_ms=a.sample_ms)
                q0 = fab.qdisc_stats(t1)
                r = harness.run_pairs(fab, pairs, cfg + ["--size", "64K", "--depth", 16,
                                                         "--no-path-detail"], dur, during=during)
                q1 = fab.qdisc_stats(t1)
                s = harness.summarize(r)
                g = [((x.get("client") or {}).get("goodput_gbps", 0)) for x in r]
                s.update({"config": name, "n": n,
                          "backlog_bytes": exp.backlog_summary(samples),
                          "drops": q1.get("d0", {}).get("drops", 0) - q0.get("d0", {}).get("drops", 0),
                          "jain": round(jain(g), 4), "goodputs_gbps": g})
                res["runs"].append(s)
                bl = s["backlog_bytes"]
                print(f"N={n:2d} {name:14s}: port backlog mean {bl['mean']} B p99 {bl['p99']} B "
                      f"max {bl['max']} B, drops {s['drops']}, goodput {s['goodput_gbps']:.3f} "
                      f"Gb/s, Jain {s['jain']:.3f}, failed {s['failed_messages']}, all completed "
                      f"{s['all_completed']}", file=sys.stderr)
    res["meta"] = exp.meta(t0, duration_s=dur, sample_ms=a.sample_ms,
                           note="backlog = tbf backlog of ToR 1's port to the receiver, sampled")
    exp.write(a, "incast", res)
    fig, ax = exp.plt.subplots(1, 2, figsize=(9, 3.8))
    for name, _ in configs:
        rs = [r for r in res["runs"] if r["config"] == name]
        ns = [r["n"] for r in rs]
        ax[0].plot(ns, [r["backlog_bytes"]["p99"] / 1000 for r in rs], "o-", label=f"{name} p99")
        ax[0].plot(ns, [r["backlog_bytes"]["mean"] / 1000 for r in rs], "x--", label=f"{name} mean")
        ax[1].plot(ns, [r["jain"] for r in rs], "o-", label=name)
    ax[0].set_xlabel("connections into one host")
    ax[0].set_ylabel("bottleneck port backlog (kB)")
    ax[1].set_xlabel("connections into one host")
    ax[1].set_ylabel("Jain's fairness index")
    ax[1].set_ylim(0, 1.05)
    for x in ax:
        x.legend(fontsize=7)
        x.grid(True, alpha=0.3)
    fig.suptitle(f"incast into one host ({a.rate}, 1 MB queue)")
    exp.save(fig, a, "incast")


if __name__ == "__main__":
    main()
