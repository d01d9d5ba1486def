"""Experiment 8: failure localization over random single faults.

Fabric: 2 ToRs x 1 host, 4 aggs, 200 Mbit/s links (tbf). One harness pair
h0.0 -> h1.0 sprays 128 paths with --locate-faults (docs/fabric.md,
"Failure localization"). Each run breaks one link, chosen at random among
the 8 ToR-agg links, with a kind chosen at random: a black hole (all UDP
dropped both ways), 2% loss, or a tenth of the link's rate; the fault
starts at --fault-at seconds and lasts to the end of the run.

Reported: precision (faults named that were the broken link with the right
kind, over all faults named), recall (runs whose fault was named rightly),
the median and p95 time from the fault to its naming, per kind too; and
the cost: the tracer's bytes against the data bytes, and the CPU the
locator adds (harness cpu_s with --locate-faults against without, 64 QPs,
clean runs interleaved, medians).
"""
import random
import statistics
import sys
import time

import vsfabric
from vsfabric import exp, harness

RATE = "200mbit"
KINDS = ("black_hole", "lossy", "slow")


def one_run(fab, args, dur, fault_at, fault):
    tor, agg, kind = fault
    marks = {}

    def during(t_start):
        time.sleep(max(0, t_start + fault_at - time.time()))
        marks["fault"] = time.time()
        if kind == "black_hole":
            fab.set_loss(tor, agg, 1.0)
        elif kind == "lossy":
            fab.set_loss(tor, agg, 0.02)
        else:
            fab.set_link_rate(tor, agg, "20mbit")

    r = harness.run_pairs(fab, [((0, 0), (1, 0))], args, dur, during=during)[0]
    if kind == "slow":
        fab.set_link_rate(tor, agg, RATE)
    else:
        fab.set_loss(tor, agg, 0)
    return r, marks.get("fault")


def pct(v, q):
    return round(exp.pct(v, q / 100), 3) if v else None


def main():
    p = exp.parser("exp_localization", __doc__)
    p.add_argument("--faults", type=int, default=50)
    p.add_argument("--fault-at", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cost-runs", type=int, default=3)
    a = p.parse_args()
    t0 = exp.start(a)
    dur = a.duration or (7.0 if a.quick else 10.0)
    rng = random.Random(a.seed)
    args = ["--paths", 128, "--size", "64K", "--depth", 16, "--no-path-detail", "--locate-faults",
            "--stall-ms", 60000]
    res = {"runs": []}
    with vsfabric.Fabric(tors=2, hosts=1, aggs=4, uplink_rate=RATE, host_rate="400mbit",
                         queue=200_000) as fab:
        res["fabric"] = fab.describe()
        for k in range(a.faults):
            fault = (rng.randrange(2), rng.randrange(4), rng.choice(KINDS))
            r, t_fault = one_run(fab, args, dur, a.fault_at, fault)
            c = r.get("client") or {}
            tele = c.get("telemetry") or {}
            ends = fab.link_ends(fault[0], fault[1])
            named = tele.get("history", [])
            right = [f for f in named if f.get("link") and f["link"]["to"] in ends and f["kind"] == fault[2]]
            run = {"tor": fault[0], "agg": fault[1], "kind": fault[2], "ends": ends,
                   "named": len(named), "right": len(right),
                   "time_s": round(right[0]["found"] - t_fault, 3) if right and t_fault else None,
                   "wrong": [{"link": f.get("link"), "kind": f["kind"]} for f in named if f not in right],
                   "probe_bytes": (tele.get("tracer") or {}).get("probe_bytes", 0),
                   "data_bytes": c.get("bytes", 0), "client_rc": r.get("client_rc")}
            res["runs"].append(run)
            print(f"{k + 1:2d}/{a.faults} {fault[2]:10s} tor {fault[0]} agg {fault[1]}: "
                  f"{'named in %.2f s' % run['time_s'] if run['time_s'] is not None else 'NOT named'}"
                  f"{', wrong: %s' % run['wrong'] if run['wrong'] else ''}", file=sys.stderr)

        # Cost: clean runs with 64 QPs, with and without the locator, interleaved.
        base = ["--paths", 128, "--size", "64K", "--depth", 4, "--qps", 64, "--no-path-detail",
                "--stall-ms", 60000]
        cost = {"with": [], "without": []}
        for _ in range(a.cost_runs):
            for mode in ("without", "with"):
                r = harness.run_pairs(fab, [((0, 0), (1, 0))],
                                      base + (["--locate-faults"] if mode == "with" else []), 5.0)[0]
                c = r.get("client") or {}
                tele = c.get("telemetry") or {}
                cost[mode].append({"cpu_s": c.get("cpu_s"), "wall_s": c.get("wall_s"),
                                   "bytes": c.get("bytes"),
                                   "probe_bytes": (tele.get("tracer") or {}).get("probe_bytes", 0)})
    runs = res["runs"]
    named = sum(r["named"] for r in runs)
    right_named = sum(1 for r in runs for _ in range(r["right"]))
    times = [r["time_s"] for r in runs if r["time_s"] is not None]
    res["summary"] = {
        "faults": len(runs),
        "precision": round(right_named / named, 3) if named else None,
        "recall": round(sum(1 for r in runs if r["right"]) / len(runs), 3) if runs else None,
        "median_s": pct(times, 50), "p95_s": pct(times, 95),
        "per_kind": {k: {"faults": sum(1 for r in runs if r["kind"] == k),
                         "recall": round(sum(1 for r in runs if r["kind"] == k and r["right"]) /
                                         max(1, sum(1 for r in runs if r["kind"] == k)), 3),
                         "median_s": pct([r["time_s"] for r in runs
                                          if r["kind"] == k and r["time_s"] is not None], 50)}
                     for k in KINDS},
    }

    def med(mode, key):
        v = [x[key] for x in cost[mode] if x.get(key) is not None]
        return statistics.median(v) if v else None

    cpu_w, cpu_wo, wall = med("with", "cpu_s"), med("without", "cpu_s"), med("with", "wall_s")
    res["cost"] = {"runs": cost, "qps": 64, "paths": 128,
                   "cpu_share_of_core": round((cpu_w - cpu_wo) / wall, 4) if cpu_w and cpu_wo and wall else None,
                   "probe_bytes_vs_data": round(med("with", "probe_bytes") / med("with", "bytes"), 6)
                   if med("with", "bytes") else None}
    res["meta"] = exp.meta(t0, duration_s=dur, fault_at_s=a.fault_at, seed=a.seed,
                           note="precision/recall over named (link, kind); time from fault to found")
    exp.write(a, "localization", res)
    s = res["summary"]
    print(f"precision {s['precision']}, recall {s['recall']}, median {s['median_s']} s, p95 {s['p95_s']} s; "
          f"locator CPU {res['cost']['cpu_share_of_core']} of a core, probe bytes "
          f"{res['cost']['probe_bytes_vs_data']} of data", file=sys.stderr)
    fig, ax = exp.plt.subplots(figsize=(6.4, 4.2))
    for k in KINDS:
        v = sorted(r["time_s"] for r in runs if r["kind"] == k and r["time_s"] is not None)
        if v:
            ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], drawstyle="steps-post", label=k)
    ax.axvline(2.0, color="k", ls="--", lw=1, label="2 s target (median)")
    ax.set_xlabel("time from fault to naming (s)")
    ax.set_ylabel("CDF of faults named rightly")
    ax.set_title(f"{len(runs)} random single faults: precision {s['precision']}, recall {s['recall']}")
    ax.legend(fontsize=8)
    exp.save(fig, a, "localization")


if __name__ == "__main__":
    main()
