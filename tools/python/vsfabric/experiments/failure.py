"""Experiment 3: an uplink goes black (100% loss, routing unaware).

Fabric and workload as in exp_loss (2 ToRs x 2 hosts, 8 aggs, tbf-shaped
links, ring WRITEs, 128 paths). After --fail-at seconds one ToR-0 uplink
(both directions) drops every UDP packet; routes stay. Goodput is the sum of
the clients' 10 ms intervals on one clock (each client's series shifted by
its start time; resolution one interval). Reported per path algorithm:
pre-failure goodput, recovery time = time from the failure until the first
interval from which 5 consecutive ones (50 ms) average >= 90% of the
pre-failure goodput (null if never; resolution 10 ms), goodput after the
failure relative to before,
retransmissions, timeouts, failed messages and whether every posted WR
completed.

With --control, each algorithm also runs once without the hole (the uplink
stays healthy; the same moment is marked as the failure) and the same rule
is applied to it: the recovery time of a run where nothing failed is what
this machine's noise alone gives (goodput per interval swings by a fifth on
2 shared cores), the floor under which a recovery time means nothing.
"""
import sys
import time

import vsfabric
from vsfabric import exp, harness


def recovery(series, t_fail_ms, iv_ms, frac=0.9, win=None):
    win = win or max(3, 50 // iv_ms)  # at least 50 ms
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


def one_run(a, fab, pairs, hole, algo, dur, loss):
    """One run of `algo`: the uplink `hole` starts dropping `loss` of its
    packets --fail-at seconds in (0: the control run, nothing fails)."""
    fab.set_loss(0, hole, 0)
    marks = {}

    def during(t_start):
        time.sleep(max(0, t_start + a.fail_at - time.time()))
        fab.set_loss(0, hole, loss)
        marks["fail"] = time.time()

    r = harness.run_pairs(fab, pairs, ["--paths", a.paths, "--path-algo", algo,
                                       "--size", "64K", "--depth", 16, "--no-path-detail",
                                       "--interval-ms", a.interval_ms, "--path-burst", a.path_burst],
                          dur, during=during)
    fab.set_loss(0, hole, 0)
    t_ref = min(x["t_start"] for x in r)
    series = exp.total_series(r, t_ref, a.interval_ms)
    t_fail = (marks["fail"] - t_ref) * 1000
    pre, rec, after = recovery(series, t_fail, a.interval_ms)
    s = harness.summarize(r)
    s.update({"algo": algo, "control": loss == 0, "fail_ms": round(t_fail, 1), "pre_gbps": round(pre, 4),
              "recovery_ms": rec, "after_vs_before": after and round(after, 3),
              "series": series})
    print(f"{algo:8s}{' (control, no hole)' if loss == 0 else ''}: before {pre:.3f} Gb/s, recovered in "
          f"{'never' if rec is None else f'{rec:.0f} ms'}, after/before "
          f"{after if after is None else round(after, 2)}, retx {s['retx_pkts']}, "
          f"failed {s['failed_messages']}, all completed {s['all_completed']}",
          file=sys.stderr)
    return s


def main():
    p = exp.parser("exp_failure", __doc__)
    p.add_argument("--aggs", type=int, default=8)
    p.add_argument("--rate", default="200mbit")
    p.add_argument("--paths", type=int, default=128)
    p.add_argument("--algos", help="default the four multipath ones (quick) or all five")
    p.add_argument("--fail-at", type=float, default=1.0)
    p.add_argument("--interval-ms", type=int, default=10)
    p.add_argument("--path-burst", type=int, default=16,
                   help="obs/rr: packets a path carries before the next pick (the harness's --path-burst)")
    p.add_argument("--control", action="store_true",
                   help="also run each algorithm without the hole (the noise floor of the recovery time)")
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
            for loss in ((1.0, 0.0) if a.control else (1.0,)):
                res["runs"].append(one_run(a, fab, pairs, hole, algo, dur, loss))
    res["meta"] = exp.meta(t0, duration_s=dur, paths=a.paths, interval_ms=a.interval_ms,
                           note="recovery: >=90% of pre-failure goodput over max(3, 50 ms / interval) intervals")
    exp.write(a, "failure", res)
    fig, ax = exp.plt.subplots(figsize=(6.4, 4.2))
    for r in res["runs"]:
        if r["control"]:
            continue
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
