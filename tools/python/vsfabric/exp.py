"""Shared bits of the experiment scripts: arguments, output, plots."""
import argparse
import json
import os
import statistics
import sys
import time

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .cleanup import cleanup_stale


def parser(prog, doc):
    """The arguments every experiment takes; prog is its command's name
    (tools/fabric/PROG), which python3 -m would not give argparse."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/fabric", help="output directory (default out/fabric)")
    p.add_argument("--quick", action="store_true", help="short configuration (make bench)")
    p.add_argument("--duration", type=float, help="seconds per traffic run")
    return p


def start(args):
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    cleanup_stale()
    os.makedirs(args.out, exist_ok=True)
    return time.time()


def meta(t0, **kw):
    m = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
         "wall_s": round(time.time() - t0, 1), "host_cpus": os.cpu_count(),
         "kernel": os.uname().release}
    m.update(kw)
    return m


def write(args, name, result):
    path = os.path.join(args.out, f"fabric-{name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}", file=sys.stderr)
    return path


def save(fig, args, name):
    path = os.path.join(args.out, f"fabric-{name}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}", file=sys.stderr)
    return path


def ring_pairs(tors, hosts):
    """Ring-allreduce-like neighbours with every hop crossing the fabric:
    h0.0 -> h1.0 -> ... -> h(T-1).0 -> h0.1 -> h1.1 -> ... -> h0.0."""
    order = [(t, i) for i in range(hosts) for t in range(tors)]
    return [(order[j], order[(j + 1) % len(order)]) for j in range(len(order))]


def lossy_uplink(fab, pair_index=0, src=(0, 0), dst=(1, 0)):
    """The ToR-0 uplink that path 0 of pair `pair_index` hashes onto, so a
    single-path connection crosses the lossy link (as the harness's own
    --loss-link default does)."""
    from . import harness
    sp, cp, _ = harness.ports(pair_index)
    dev = harness.route_dev(fab, fab.tor(src[0]), [(cp, sp)], fab.host_ip(*src),
                            fab.host_ip(*dst))[0]
    return int(dev[1:])


def total_series(results, t_ref=None, iv_ms=None):
    """Sum the clients' per-interval goodput. With t_ref (wall clock), each
    client's series is shifted by its start time so the sum is on one clock;
    intervals are put into bins of iv_ms (a client's samples in one bin are
    averaged) and the bins summed over clients."""
    acc = {}
    for r in results:
        c = r.get("client") or {}
        ivs = c.get("intervals", [])
        if not ivs:
            continue
        off = 0 if t_ref is None else (r["t_start"] - t_ref) * 1000
        step = iv_ms or (ivs[1]["t_ms"] - ivs[0]["t_ms"] if len(ivs) > 1 else 100)
        mine = {}
        for iv in ivs:
            b = int((iv["t_ms"] + off) // step) * step
            mine.setdefault(b, []).append(iv["gbps"])
        for b, v in mine.items():
            acc[b] = acc.get(b, 0) + sum(v) / len(v)
    return sorted((t, round(g, 4)) for t, g in acc.items())


def pct(v, q):
    """The q-quantile (0..1) of v, nearest rank below; 0 for no samples."""
    v = sorted(v)
    return v[min(len(v) - 1, int(q * (len(v) - 1)))] if v else 0


def backlog_sampler(fab, ns, devs, dur, warmup=0.3, period_ms=20):
    """A `during` callback for harness.run_pairs that samples the tbf backlog
    (bytes, `tc -s -j qdisc show`) of the devices `devs` of namespace ns
    every period_ms, from `warmup` seconds after the clients started until
    `dur`. Returns (during, samples), samples = {dev: [bytes, ...]}."""
    samples = {d: [] for d in devs}

    def during(t_start):
        end = t_start + dur
        while time.time() < end:
            t = time.time()
            if t - t_start >= warmup:
                for dev, st in fab.qdisc_stats(ns).items():
                    if dev in samples:
                        samples[dev].append(st["backlog"])
            time.sleep(max(0, period_ms / 1000 - (time.time() - t)))
    return during, samples


def backlog_summary(samples):
    """mean/p50/p99/max over all devices' samples, in bytes."""
    allv = [v for s in samples.values() for v in s]
    return {"mean": round(statistics.mean(allv)) if allv else 0, "p50": pct(allv, .5),
            "p99": pct(allv, .99), "max": max(allv or [0]), "samples": len(allv)}


def uplink_queue_run(fab, pairs, cfg, dur, sample_ms):
    """One harness.run_pairs of `pairs` (transport options cfg, 64 KiB
    WRITEs, 16 deep) with ToR 0's uplink queues sampled every sample_ms.
    Returns (results, samples, drops, uplink_bytes): samples as
    backlog_sampler's, drops = {dev: tbf drops during the run}, uplink_bytes
    = bytes each uplink sent during the run."""
    from . import harness
    tor = fab.tor(0)
    during, samples = backlog_sampler(fab, tor, [f"u{x}" for x in range(fab.A)], dur,
                                      period_ms=sample_ms)
    q0 = fab.qdisc_stats(tor)
    b0 = fab.uplink_bytes(0)
    r = harness.run_pairs(fab, pairs, cfg + ["--size", "64K", "--depth", 16, "--no-path-detail"],
                          dur, during=during)
    q1 = fab.qdisc_stats(tor)
    sent = [x - y for x, y in zip(fab.uplink_bytes(0), b0)]
    drops = {dev: q1.get(dev, {}).get("drops", 0) - q0.get(dev, {}).get("drops", 0)
             for dev in samples}
    return r, samples, drops, sent
