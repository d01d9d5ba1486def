"""make bench: plain RoCE v2 (issue 28), vStellar against rxe beside rxe
against rxe, on the same guest image and test network.

Two runs, one after the other: a vStellar guest and an rxe guest (run_guests
rxe_guests; the vStellar side's vstellard speaks RoCE v2 to the rxe side),
each program with vStellar serving and with rxe serving; then two rxe
guests (Soft-RoCE on eth0, as the rxe baseline of `vstellar.bench.guest`).
ib_write_bw at 64 KiB and ib_write_lat at 8 B, path MTU 1024 everywhere
(rxe's over a 1500-byte Ethernet), REPEATS times each per boot. Writes
OUTDIR/roce.json (every run, medians, and the ratios mixed/rxe-rxe: above
1 for bandwidth and below 1 for latency means the mixed pair is faster),
OUTDIR/roce.png and the raw perftest output. Environment:
VSTELLAR_BENCH_REPEATS (3).
"""
import json
import os
import platform
import statistics
import sys
import time

from vstellar import guest as vg, perftest as pt

REPEATS = int(os.environ.get("VSTELLAR_BENCH_REPEATS", "3"))
BW = ("ib_write_bw", "-m 1024 -s 65536 -n 300 -F --report_gbits")
LAT = ("ib_write_lat", "-m 1024 -s 8 -n 500 -F")


def measure(sections_list):
    """{"bw_gbps": [...], "lat_typical_us": [...]} from (tool, lines) pairs,
    leaving out runs whose clock calibration failed (no rate printed)."""
    out = {"bw_gbps": [], "lat_typical_us": [], "uncalibrated": 0}
    for tool, lines in sections_list:
        if pt.clock_uncalibrated(lines):
            out["uncalibrated"] += 1
            continue
        if tool == "ib_write_bw":
            rows = pt.parse_bw(lines)
            if len(rows) != 1:
                sys.exit(f"roce bench: no result row from ib_write_bw:\n" + "\n".join(lines))
            out["bw_gbps"].append(rows[0]["bw_avg_gbps"])
        else:
            rows = pt.parse_lat(lines)
            if len(rows) != 1:
                sys.exit(f"roce bench: no result row from ib_write_lat:\n" + "\n".join(lines))
            out["lat_typical_us"].append(rows[0]["t_typical_us"])
    out["median_bw_gbps"] = statistics.median(out["bw_gbps"]) if out["bw_gbps"] else None
    out["median_lat_typical_us"] = statistics.median(out["lat_typical_us"]) if out["lat_typical_us"] else None
    return out


def check(results, name, outdir):
    with open(os.path.join(outdir, f"roce-{name}-raw.txt"), "w") as f:
        for i, (_status, out, _console) in enumerate(results):
            f.write(f"### guest{i}\n" + "\n".join(out) + "\n")
    for i, (status, _out, console) in enumerate(results):
        if status:
            print("\n".join(console[-80:]), file=sys.stderr)
            sys.exit(f"roce bench ({name}): guest{i} failed with status {status}")


def run_mixed(outdir):
    """vStellar <-> rxe: the client's results per direction."""
    programs = [BW, LAT] * REPEATS
    results = vg.run_guests(list(pt.interop_pair(programs)), vstellar=True, rxe_guests={pt.INTEROP_RXE},
                            timeout=3000)
    check(results, "mixed", outdir)
    by_dir = {}
    for serving, client in (("vstellar", pt.INTEROP_RXE), ("rxe", pt.INTEROP_VST)):
        pairs = [(header.split()[0], lines) for header, lines in pt.sections_in_order(results[client][1])
                 if header.endswith(f"server={serving}")]
        by_dir[f"{serving}_serves"] = measure(pairs)
    return by_dir


def run_rxe(outdir):
    """rxe <-> rxe on eth0: the client's (guest 1's) results."""
    tests = [BW, LAT] * REPEATS
    server, client = pt.perftest_pair(tests, "rxe0", setup=pt.RXE_SETUP)
    results = vg.run_guests([server, client], modules=pt.RXE_MODULES, timeout=3000)
    check(results, "rxe", outdir)
    pairs = [(tool, lines) for (tool, _args), (_h, lines) in zip(tests, pt.sections_in_order(results[1][1]))]
    return measure(pairs)


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    started = time.time()
    doc = {"benchmark": "plain RoCE v2: vStellar<->rxe against rxe<->rxe, same guests and network",
           "accel": "kvm" if vg.kvm_usable() else "tcg", "host": platform.node(), "cpus": os.cpu_count(),
           "repeats": REPEATS, "ib_write_bw": BW[1], "ib_write_lat": LAT[1],
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))}
    doc["mixed"] = run_mixed(outdir)
    doc["rxe_rxe"] = run_rxe(outdir)
    base = doc["rxe_rxe"]
    doc["ratio_mixed_to_rxe_rxe"] = {}
    for d, m in doc["mixed"].items():
        bw = m["median_bw_gbps"] / base["median_bw_gbps"] if m["median_bw_gbps"] and base["median_bw_gbps"] else None
        lat = (m["median_lat_typical_us"] / base["median_lat_typical_us"]
               if m["median_lat_typical_us"] and base["median_lat_typical_us"] else None)
        doc["ratio_mixed_to_rxe_rxe"][d] = {"ib_write_bw_64k": bw and round(bw, 2),
                                           "ib_write_lat_8b_typical": lat and round(lat, 2)}
    doc["seconds"] = round(time.time() - started, 1)
    with open(os.path.join(outdir, "roce.json"), "w") as f:
        json.dump(doc, f, indent=2)
    plot(doc, os.path.join(outdir, "roce.png"))
    for name, m in list(doc["mixed"].items()) + [("rxe<->rxe", base)]:
        print(f"{name:16} ib_write_bw 64 KiB median {m['median_bw_gbps']} Gb/s, "
              f"ib_write_lat 8 B median typical {m['median_lat_typical_us']} us")
    print("mixed / rxe<->rxe:", json.dumps(doc["ratio_mixed_to_rxe_rxe"]))


def plot(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = ["vstellar_serves", "rxe_serves"]
    labels = ["vStellar serves\n(rxe client)", "rxe serves\n(vStellar client)", "rxe <-> rxe"]
    rows = [doc["mixed"][n] for n in names] + [doc["rxe_rxe"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.bar(labels, [r["median_bw_gbps"] or 0 for r in rows], color=["C0", "C0", "C1"])
    a.set_ylabel("ib_write_bw 64 KiB, Gb/s (median)")
    b.bar(labels, [r["median_lat_typical_us"] or 0 for r in rows], color=["C0", "C0", "C1"])
    b.set_ylabel("ib_write_lat 8 B, typical us (median)")
    fig.suptitle(f"plain RoCE v2, {doc['accel']} guests, median of {doc['repeats']}")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join("out", "bench"))
