"""Experiment 5: ECN marking on congested uplinks, off vs on, single path vs
128 paths.

Fabric: 2 ToRs x 4 hosts, 4 aggregation switches; host links 200 Mbit/s,
fabric links 150 Mbit/s (tbf, 1 MB queue), so a permutation h0.i -> h1.p(i)
(800 Mbit/s offered) overloads the ToR-0 uplinks however it is spread (4 x
150 = 600 Mbit/s), and a single-path flow set that hashes onto fewer uplinks
overloads those more. Marking "on" puts the eBPF phantom-queue CE marker
(vsfabric bpf.py; HULL) on every shaped switch port (ToR uplinks and host
ports, agg ports), drained at --fraction x the link rate, threshold --k
bytes; "off" has no marker (the engine still sets ECT(0)). Each run samples
the tbf backlog of every ToR-0 uplink with `tc -s -j qdisc show` every
--sample-ms after a 0.3 s warm-up (as exp_queues does), and reads the CE
marks the markers set and the engines counted (EngineStats::ce_marks).
Configurations are interleaved, --runs repetitions each; the report gives
medians over runs.
"""
import random
import statistics
import sys

import vsfabric
from vsfabric import exp, harness


def med(v):
    return statistics.median(v) if v else 0


def one_run(fab, a, pairs, alg, cfg, mark, rep, dur, frac):
    """One configuration once: markers on or off on every switch port, a
    sampled run, and what the markers and engines counted."""
    A, tor = fab.A, fab.tor(0)
    for ns, dev, rate in fab.switch_ports():
        fab.set_marking(ns, dev, vsfabric.rate_bps(rate) * frac[rate] if mark else 0,
                        a.k)
    r, samples, drops, d = exp.uplink_queue_run(fab, pairs, cfg, dur, a.sample_ms)
    mc = fab.mark_counters()
    up_marks = [mc.get((tor, f"u{x}"), {}).get("marked", 0) for x in range(A)]
    s = harness.summarize(r)
    ce_srv = sum(((x.get("server") or {}).get("engine") or {}).get("ce_marks", 0) for x in r)
    ce_cli = sum(((x.get("client") or {}).get("engine") or {}).get("ce_marks", 0) for x in r)
    s.update({
        "config": alg, "marking": mark, "rep": rep,
        "backlog_bytes": exp.backlog_summary(samples),
        "tbf_drops": sum(drops.values()),
        "uplink_bytes": d,
        "uplink_marks": up_marks,
        "marks_all_ports": sum(m["marked"] for m in mc.values()),
        "pkts_uplinks": sum(mc.get((tor, f"u{x}"), {}).get("pkts", 0) for x in range(A)),
        "phantom_max_backlog": max((m["max_backlog"] for m in mc.values()), default=0),
        "engine_ce_marks_servers": ce_srv, "engine_ce_marks_clients": ce_cli,
        "samples": samples})
    bl = s["backlog_bytes"]
    print(f"[{rep}] {alg:13s} marking {'on ' if mark else 'off'}: backlog mean "
          f"{bl['mean']} B p99 {bl['p99']} B; uplink marks {sum(up_marks)} (all ports "
          f"{s['marks_all_ports']}), engine ce {ce_srv}+{ce_cli}; goodput "
          f"{s['goodput_gbps']:.3f} Gb/s; retx {s['retx_pkts']}; failed "
          f"{s['failed_messages']}", file=sys.stderr)
    return s


def summary(runs, alg, mark, A):
    """Medians over the runs of one configuration."""
    rs = [r for r in runs if r["config"] == alg and r["marking"] == mark]
    pk = [r["pkts_uplinks"] for r in rs]
    summ = {
        "config": alg, "marking": mark, "runs": len(rs),
        "backlog_mean_bytes": med([r["backlog_bytes"]["mean"] for r in rs]),
        "backlog_p99_bytes": med([r["backlog_bytes"]["p99"] for r in rs]),
        "backlog_max_bytes": med([r["backlog_bytes"]["max"] for r in rs]),
        "tbf_drops": med([r["tbf_drops"] for r in rs]),
        "uplink_marks": med([sum(r["uplink_marks"]) for r in rs]),
        "uplink_mark_fraction": round(med([sum(r["uplink_marks"]) / x if x else 0
                                           for r, x in zip(rs, pk)]), 4),
        "marks_all_ports": med([r["marks_all_ports"] for r in rs]),
        "engine_ce_marks": med([r["engine_ce_marks_servers"] + r["engine_ce_marks_clients"]
                                for r in rs]),
        "goodput_gbps": round(med([r["goodput_gbps"] for r in rs]), 4),
        "retx_pkts": med([r["retx_pkts"] for r in rs]),
        "failed_messages": sum(r["failed_messages"] for r in rs),
        "all_completed": all(r["all_completed"] for r in rs),
        "uplink_bytes_mb": [round(med([r["uplink_bytes"][x] for r in rs]) / 1e6, 1)
                            for x in range(A)]}
    print(f"median {alg:13s} marking {'on ' if mark else 'off'}: backlog mean "
          f"{summ['backlog_mean_bytes']} B p99 {summ['backlog_p99_bytes']} B max "
          f"{summ['backlog_max_bytes']} B; uplink marks {summ['uplink_marks']} "
          f"({summ['uplink_mark_fraction']:.2f} of pkts), engine ce "
          f"{summ['engine_ce_marks']}; goodput {summ['goodput_gbps']:.3f} Gb/s; "
          f"uplink MB {summ['uplink_bytes_mb']}; all completed {summ['all_completed']}",
          file=sys.stderr)
    return summ


def plot(a, res, configs, H, A):
    """Left: the CDF of uplink backlog samples per configuration; right:
    goodput and mean backlog per configuration."""
    fig, (ax1, ax2) = exp.plt.subplots(1, 2, figsize=(10, 4.2))
    for alg, cfg, mark in configs:
        v = sorted(x / 1000 for r in res["runs"] if r["config"] == alg and r["marking"] == mark
                   for s in r["samples"].values() for x in s)
        if v:
            ax1.plot(v, [(i + 1) / len(v) for i in range(len(v))],
                     label=f"{alg}, marking {'on' if mark else 'off'}",
                     linestyle="-" if mark else "--")
    ax1.set_xscale("symlog", linthresh=1)
    ax1.set_xlabel("ToR-0 uplink queue backlog (kB, symlog)")
    ax1.set_ylabel("CDF of samples (all uplinks, all runs)")
    ax1.set_title(f"permutation, {H} flows over {A} uplinks ({a.uplink_rate})")
    ax1.legend(fontsize=8)
    ax1.grid(True, alpha=0.3)
    labels = [f"{s['config'].replace(' 128 paths', '').replace(' path', '')}, "
              f"{'on' if s['marking'] else 'off'}\n"
              f"{s['uplink_mark_fraction'] * 100:.0f}% CE" for s in res["summary"]]
    x = range(len(labels))
    ax2.bar([i - 0.2 for i in x], [s["goodput_gbps"] for s in res["summary"]], 0.4,
            label="goodput (Gb/s)", color="tab:blue")
    ax2.set_ylabel("goodput, Gb/s (median)")
    ax2.set_xticks(list(x))
    ax2.set_xticklabels(labels, fontsize=8)
    ax3 = ax2.twinx()
    bl = [max(0.1, s["backlog_mean_bytes"] / 1000) for s in res["summary"]]
    ax3.bar([i + 0.2 for i in x], bl, 0.4, label="mean uplink backlog (kB, log)", color="tab:orange")
    ax3.set_yscale("log")
    ax3.set_ylim(0.1, 3000)
    ax3.set_ylabel("mean ToR-0 uplink backlog, kB (median, log)")
    for i, v in enumerate(bl):
        ax3.annotate(f"{v:.1f}", (i + 0.2, v), textcoords="offset points", xytext=(0, 2),
                     ha="center", fontsize=7)
    ax2.set_title(f"phantom queue K={a.k // 1000} kB at {a.fraction:.2f} x rate")
    h1, l1 = ax2.get_legend_handles_labels()
    h2, l2 = ax3.get_legend_handles_labels()
    ax2.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    exp.save(fig, a, "ecn")


def main():
    p = exp.parser("exp_ecn", __doc__)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--aggs", type=int, default=4)
    p.add_argument("--host-rate", default="200mbit")
    p.add_argument("--uplink-rate", default="150mbit")
    p.add_argument("--k", type=int, default=20_000, help="marking threshold K, bytes (20000)")
    p.add_argument("--fraction", type=float, default=0.95,
                   help="phantom queue drain rate / link rate (0.95)")
    p.add_argument("--runs", type=int, help="repetitions per configuration (5; 3 quick)")
    p.add_argument("--sample-ms", type=float, default=20)
    p.add_argument("--seed", type=int, default=7, help="permutation seed")
    p.add_argument("--hash-seed", type=int,
                   help="the switches' fib_multipath_hash_seed (default: the kernel's own)")
    a = p.parse_args()
    t0 = exp.start(a)
    dur = a.duration or (1.5 if a.quick else 3.0)
    runs = a.runs or (3 if a.quick else 5)
    H, A = a.hosts, a.aggs
    perm = list(range(H))
    random.Random(a.seed).shuffle(perm)
    pairs = [((0, i), (1, perm[i])) for i in range(H)]
    algos = [("single path", ["--paths", 1, "--path-algo", "single"]),
             ("obs 128 paths", ["--paths", 128, "--path-algo", "obs"]),
             # As in exp_queues: runs of 16 packets per path (the harness's
             # default) and Stellar's spraying of every packet.
             ("obs 128 paths per packet", ["--paths", 128, "--path-algo", "obs", "--path-burst", 1])]
    configs = [(alg, cfg, mark) for alg, cfg in algos for mark in (False, True)]
    res = {"permutation": perm, "runs": [], "summary": []}
    with vsfabric.Fabric(tors=2, hosts=H, aggs=A, uplink_rate=a.uplink_rate,
                         host_rate=a.host_rate, queue=1_000_000, hash_seed=a.hash_seed) as fab:
        res["fabric"] = fab.describe()
        frac = {a.host_rate: a.fraction, a.uplink_rate: a.fraction}
        for rep in range(runs):
            for alg, cfg, mark in configs:
                res["runs"].append(one_run(fab, a, pairs, alg, cfg, mark, rep, dur, frac))
        for alg, cfg, mark in configs:
            res["summary"].append(summary(res["runs"], alg, mark, A))
    res["meta"] = exp.meta(t0, duration_s=dur, runs=runs, sample_ms=a.sample_ms, k_bytes=a.k,
                           rate_fraction=a.fraction,
                           note="backlog = tbf qdisc backlog on ToR-0 uplinks, sampled; marks = "
                                "CE set by the eBPF phantom-queue markers; engine ce = "
                                "EngineStats::ce_marks of servers + clients; medians over runs")
    exp.write(a, "ecn", res)
    plot(a, res, configs, H, A)


if __name__ == "__main__":
    main()
