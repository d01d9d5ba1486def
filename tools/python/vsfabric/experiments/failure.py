"""Experiment 3: an uplink goes black (100% loss, routing unaware).

Fabric and workload as in exp_loss (2 ToRs x 2 hosts, 8 aggs, tbf-shaped
links, ring WRITEs, 128 paths). After --fail-at seconds one ToR-0 uplink
(both directions) drops every UDP packet; routes stay. Goodput is the sum of
the clients' 50 ms intervals on one clock (each client's series shifted by
its start time; resolution one interval). Reported per path algorithm:
pre-failure goodput, recovery time = time from the failure until the first
point from which 3 consecutive intervals average >= 90% of the pre-failure
goodput (null if never), goodput after the failure relative to before,
retransmissions, timeouts, failed messages and whether every posted WR
completed.
"""
import sys
import time

import vsfabric
from vsfabric import exp, harness


def recovery(series, t_fail_ms, iv_ms, frac=0.9, win=3):
    pre = [g for t, g in series if 300 <= t < t_fail_ms - iv_ms]
    pre_mean = sum(pre) / len(pre) if pre else 0
    post = [(t, g) for t, g in series if t >= t_fail_ms]
    rec = None
    for j in range(len(post) - win + 1):
        if sum(g for _, g in post[j:j + win]) / win >= frac * pre_mean:
            rec = max(0, post[j][0] - t_fail_ms)
            break
    tail = [g for t, g in post if t >= t_fail_ms + 300]
    return pre_mean, rec, (sum(tail) / len(tail) / pre_mean if tail and pre_mean else None)


def main():
    p = exp.parser("exp_failure", __doc__)
    p.add_argument("--aggs", type=int, default=8)
    p.add_argument("--rate", default="200mbit")
    p.add_argument("--paths", type=int, default=128)
    p.add_argument("--algos", help="default the four multipath ones (quick) or all five")
    p.add_argument("--fail-at", type=float, default=1.0)
    p.add_argument("--interval-ms", type=int, default=50)
    a = p.parse_args()
    t0 = exp.start(a)
    dur = a.duration or (3.0 if a.quick else 4.0)
    algos = (a.algos or ("obs,rr,dwrr,bestrtt" if a.quick else "obs,rr,dwrr,bestrtt,single")).split(",")
    res = {"runs": [], "fail_at_s": a.fail_at}
    with vsfabric.Fabric(tors=2, hosts=2, aggs=a.aggs, uplink_rate=a.rate, host_rate=a.rate,
                         queue=1_000_000) as fab:
        res["fabric"] = fab.describe()
        pairs = exp.ring_pairs(2, 2)
        hole = exp.lossy_uplink(fab)
        res["black_hole"] = {"tor": 0, "agg": hole}
        for algo in algos:
            fab.set_loss(0, hole, 0)
            marks = {}

            def during(t_start):
                time.sleep(max(0, t_start + a.fail_at - time.time()))
                fab.set_loss(0, hole, 1.0)
                marks["fail"] = time.time()

            r = harness.run_pairs(fab, pairs, ["--paths", a.paths, "--path-algo", algo,
                                               "--size", "64K", "--depth", 16, "--no-path-detail",
                                               "--interval-ms", a.interval_ms], dur, during=during)
            fab.set_loss(0, hole, 0)
            t_ref = min(x["t_start"] for x in r)
            series = exp.total_series(r, t_ref, a.interval_ms)
            t_fail = (marks["fail"] - t_ref) * 1000
            pre, rec, after = recovery(series, t_fail, a.interval_ms)
            s = harness.summarize(r)
            s.update({"algo": algo, "fail_ms": round(t_fail, 1), "pre_gbps": round(pre, 4),
                      "recovery_ms": rec, "after_vs_before": after and round(after, 3),
                      "series": series})
            res["runs"].append(s)
            print(f"{algo:8s}: before {pre:.3f} Gb/s, recovered in "
                  f"{'never' if rec is None else f'{rec:.0f} ms'}, after/before "
                  f"{after if after is None else round(after, 2)}, retx {s['retx_pkts']}, "
                  f"failed {s['failed_messages']}, all completed {s['all_completed']}",
                  file=sys.stderr)
    res["meta"] = exp.meta(t0, duration_s=dur, paths=a.paths, interval_ms=a.interval_ms,
                           note="recovery: >=90% of pre-failure goodput over 3 intervals")
    exp.write(a, "failure", res)
    fig, ax = exp.plt.subplots(figsize=(6.4, 4.2))
    for r in res["runs"]:
        ax.plot([t / 1000 for t, _ in r["series"]], [g for _, g in r["series"]], label=r["algo"])
    if res["runs"]:
        ax.axvline(res["runs"][0]["fail_ms"] / 1000, color="k", ls="--", lw=1, label="uplink black hole")
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"total goodput per {a.interval_ms} ms (Gb/s)")
    ax.set_title(f"one of {a.aggs} uplinks goes black, {a.paths} paths")
    ax.legend(fontsize=8)
    exp.save(fig, a, "failure")


if __name__ == "__main__":
    main()
