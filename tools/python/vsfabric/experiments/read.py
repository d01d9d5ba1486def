"""Experiment 7: READ against WRITE on one slow, shallow-buffered path.

Fabric: 2 ToRs x 1 host, 1 aggregation switch, every link tbf-shaped at
--rate (100 Mbit/s) with a --queue byte queue (100 kB); single path. The
client runs 64 KiB WRITEs, then 64 KiB READs (depth 16) for --duration
seconds each, --runs times interleaved. Reported: goodput of each run, the
medians, READ/WRITE, timeouts and failed messages.
"""
import statistics
import sys

import vsfabric
from vsfabric import exp, harness


def main():
    p = exp.parser("exp_read", __doc__)
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--queue", type=int, default=100_000)
    p.add_argument("--runs", type=int, help="repetitions (5; 3 quick)")
    a = p.parse_args()
    t0 = exp.start(a)
    dur = a.duration or (1.5 if a.quick else 3.0)
    runs = a.runs or (3 if a.quick else 5)
    res = {"runs": []}
    with vsfabric.Fabric(tors=2, hosts=1, aggs=1, uplink_rate=a.rate, host_rate=a.rate,
                         queue=a.queue) as fab:
        res["fabric"] = fab.describe()
        for rep in range(runs):
            for op in ("write", "read"):
                r = harness.run_pairs(fab, [((0, 0), (1, 0))],
                                      ["--paths", 1, "--path-algo", "single", "--op", op,
                                       "--size", "64K", "--depth", 16, "--no-path-detail"], dur)
                s = harness.summarize(r)
                s.update({"op": op, "rep": rep})
                res["runs"].append(s)
                print(f"{op:5s} run {rep}: {s['goodput_gbps']:.4f} Gb/s, timeouts {s['timeouts']}, "
                      f"failed {s['failed_messages']}", file=sys.stderr)
    med = {op: statistics.median(r["goodput_gbps"] for r in res["runs"] if r["op"] == op)
           for op in ("write", "read")}
    res["summary"] = {"write_gbps": med["write"], "read_gbps": med["read"],
                      "read_vs_write": round(med["read"] / med["write"], 3) if med["write"] else None}
    print(f"medians: WRITE {med['write']:.4f} Gb/s, READ {med['read']:.4f} Gb/s, READ/WRITE "
          f"{res['summary']['read_vs_write']}", file=sys.stderr)
    res["meta"] = exp.meta(t0, duration_s=dur, rate=a.rate, queue=a.queue, runs=runs)
    exp.write(a, "read", res)
    fig, ax = exp.plt.subplots(figsize=(5, 3.6))
    for i, op in enumerate(("write", "read")):
        v = [r["goodput_gbps"] for r in res["runs"] if r["op"] == op]
        ax.plot([i] * len(v), v, "o", alpha=0.6)
        ax.bar(i, med[op], alpha=0.4, label=f"{op} median")
    ax.set_xticks([0, 1], ["WRITE", "READ"])
    ax.set_ylabel("goodput (Gb/s)")
    ax.set_title(f"64 KiB ops, one {a.rate} path, {a.queue // 1000} kB queue")
    exp.save(fig, a, "read")


if __name__ == "__main__":
    main()
