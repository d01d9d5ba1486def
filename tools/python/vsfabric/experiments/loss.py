"""Experiment 2 (Stellar Figure 11): goodput with one lossy uplink.

Fabric: 2 ToRs x 2 hosts, 8 aggregation switches, every link shaped with tbf
(default 200 Mbit/s, so the fabric and not the CPU is the bottleneck).
Workload: ring-allreduce-like WRITEs, h0.0 -> h1.0 -> h0.1 -> h1.1 -> h0.0,
every hop crossing the fabric, 128 paths per connection. One ToR-0 uplink
(both directions) drops 0, 1% and 3% of UDP packets (eBPF tc classifier, the
kernel has no netem); it is the uplink that path 0 of the first connection
hashes onto, so single-path crosses it. Path algorithms: single, rr, dwrr,
bestrtt, obs. Goodput = the sum of the clients' goodput; also reported
against the same algorithm without loss, retransmissions and failed messages.
"""
import sys

import vsfabric
from vsfabric import exp, harness


def main():
    p = exp.parser("exp_loss", __doc__)
    p.add_argument("--aggs", type=int, default=8)
    p.add_argument("--rate", default="200mbit")
    p.add_argument("--paths", type=int, default=128)
    p.add_argument("--algos", default="single,rr,dwrr,bestrtt,obs")
    p.add_argument("--losses", default="0,0.01,0.03")
    a = p.parse_args()
    t0 = exp.start(a)
    dur = a.duration or (1.2 if a.quick else 2.5)
    algos = a.algos.split(",")
    losses = [float(x) for x in a.losses.split(",")]
    res = {"runs": []}
    with vsfabric.Fabric(tors=2, hosts=2, aggs=a.aggs, uplink_rate=a.rate, host_rate=a.rate,
                         queue=1_000_000) as fab:
        res["fabric"] = fab.describe()
        pairs = exp.ring_pairs(2, 2)
        lossy = exp.lossy_uplink(fab)
        res["lossy_uplink"] = {"tor": 0, "agg": lossy}
        for loss in losses:
            fab.set_loss(0, lossy, loss)
            for algo in algos:
                r = harness.run_pairs(fab, pairs, ["--paths", a.paths, "--path-algo", algo,
                                                   "--size", "64K", "--depth", 16,
                                                   "--no-path-detail"], dur)
                s = harness.summarize(r)
                s.update({"loss": loss, "algo": algo,
                          "per_pair_gbps": [(x.get("client") or {}).get("goodput_gbps") for x in r]})
                res["runs"].append(s)
                print(f"loss {loss:.0%} {algo:8s}: {s['goodput_gbps']:.3f} Gb/s  retx "
                      f"{s['retx_pkts']}  failed {s['failed_messages']}  all completed "
                      f"{s['all_completed']}", file=sys.stderr)
        fab.set_loss(0, lossy, 0)
    base = {r["algo"]: r["goodput_gbps"] for r in res["runs"] if r["loss"] == 0}
    for r in res["runs"]:
        b = base.get(r["algo"])
        r["vs_lossless"] = round(r["goodput_gbps"] / b, 3) if b else None
    res["meta"] = exp.meta(t0, duration_s=dur, paths=a.paths, workload="ring WRITE 64 KiB x depth 16, 4 connections")
    exp.write(a, "loss", res)
    fig, ax = exp.plt.subplots(figsize=(6.4, 4.2))
    w = 0.8 / len(losses)
    for j, loss in enumerate(losses):
        ys = [next((r["goodput_gbps"] for r in res["runs"] if r["algo"] == al and r["loss"] == loss), 0)
              for al in algos]
        ax.bar([i + j * w for i in range(len(algos))], ys, w,
               label="lossless" if loss == 0 else f"{loss:.0%} loss on one uplink")
    ax.set_xticks([i + w * (len(losses) - 1) / 2 for i in range(len(algos))])
    ax.set_xticklabels([al if al == "single" else f"{al}\n{a.paths} paths" for al in algos])
    ax.set_ylabel("total goodput (Gb/s)")
    ax.set_title(f"ring WRITE, one lossy uplink of {a.aggs}, links {a.rate}")
    ax.legend(fontsize=8)
    exp.save(fig, a, "loss")


if __name__ == "__main__":
    main()
