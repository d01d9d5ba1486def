"""make bench: guest to guest, vStellar against the rxe baseline.

The same two guests (TCG unless VSTELLAR_ACCEL=kvm) on the same test network
run ib_write_bw at several message sizes and ib_write_lat at 8 B, each
REPEATS times per boot: once over the vStellar device (a vstellard per guest,
sprayed UDP transport) and once over Soft-RoCE (rxe on virtio-net), one after
the other in this run. Writes OUTDIR/guest.json (every run, medians and the
vStellar/rxe ratios), OUTDIR/guest.png and the raw perftest output.

Each QEMU and each vstellard is pinned to a core of its own where the machine
has enough (two per guest); with fewer, guest i's QEMU and its daemon share
core i, so that the two ends stay apart. The JSON says which. The same run
measures the host engine (vstellar-harness, WRITE, loopback) at the same
message sizes and reports the guest-to-guest bandwidth as a ratio of it.
Environment: VSTELLAR_BENCH_REPEATS (3), VSTELLAR_BENCH_PIN (1; 0: no
pinning), BUILD_DIR (build).
"""
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from vstellar import TOP, guest as vg, perftest as pt

REPEATS = int(os.environ.get("VSTELLAR_BENCH_REPEATS", "3"))
PIN = os.environ.get("VSTELLAR_BENCH_PIN", "1") != "0"
BUILD = os.environ.get("BUILD_DIR", os.path.join(TOP, "build"))
BW_SIZES = [4096, 65536, 1048576]
BW_ITERS = {4096: 500, 65536: 300, 1048576: 30}
LAT_ITERS = 500

# name -> how to run perftest over it
TRANSPORTS = {
    "vstellar": dict(device=pt.VSTELLAR_DEVICE, setup=pt.VSTELLAR_SETUP, common=pt.VSTELLAR_COMMON,
                     run=dict(vstellar=True)),
    "rxe": dict(device="rxe0", setup=pt.RXE_SETUP, common="",
                run=dict(modules=pt.RXE_MODULES)),
}


def tests():
    t = []
    for _ in range(REPEATS):
        for size in BW_SIZES:
            t.append(("ib_write_bw", f"-s {size} -n {BW_ITERS[size]} -F --report_gbits"))
        t.append(("ib_write_lat", f"-s 8 -n {LAT_ITERS} -F"))
    return t


def pin_plan(guests, cores):
    """{"qemu0": core, "vstellard0": core, ...}: a core each when there are
    two per guest, else guest i's QEMU and daemon on core i (mod cores)."""
    plan = {}
    for i in range(guests):
        if len(cores) >= 2 * guests:
            plan[f"qemu{i}"], plan[f"vstellard{i}"] = cores[2 * i], cores[2 * i + 1]
        else:
            plan[f"qemu{i}"] = plan[f"vstellard{i}"] = cores[i % len(cores)]
    return plan


def pin(pid, core):
    """Every thread of pid onto core; threads made later inherit it."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
        except ProcessLookupError:
            pass  # a thread that ended meanwhile


def pinner(plan):
    """run_guests' during(): pins the QEMUs and daemons as planned."""
    def during(s):
        for i, g in enumerate(s.guests):
            pin(g.proc.pid, plan[f"qemu{i}"])
        for i, d in enumerate(s.daemons):
            pin(d.proc.pid, plan[f"vstellard{i}"])
    return during


def engine_write(sizes, outdir):
    """The host engine's WRITE goodput at each size (median of REPEATS
    one-second loopback runs of vstellar-harness, the engine benchmark's
    queue depths), for the guest-to-engine ratio."""
    harness = os.path.join(BUILD, "qemu-device/harness/vstellar-harness")
    rows = []
    for size in sizes:
        depth = 64 if size <= 65536 else 16
        runs = []
        for k in range(REPEATS):
            port = 53000 + 1000 * k
            cmd = [harness, "--no-path-detail", "--ctrl-port", str(port - 1), "--base-port", str(port),
                   "--op", "write", "--size", str(size), "--duration", "1", "--depth", str(depth)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                sys.exit(f"guest bench: {' '.join(cmd)} failed: {p.stderr.strip()}")
            runs.append(json.loads(p.stdout)["client"]["goodput_gbps"])
        rows.append({"bytes": size, "runs_gbps": runs, "median_gbps": statistics.median(runs)})
    with open(os.path.join(outdir, "guest-engine-raw.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return rows


def run_transport(name, outdir, plan):
    tr = TRANSPORTS[name]
    plan_tests = tests()
    server, client = pt.perftest_pair(plan_tests, tr["device"], setup=tr["setup"], common=tr["common"])
    results = vg.run_guests([server, client], timeout=3000, during=pinner(plan) if plan else None,
                            **tr["run"])
    with open(os.path.join(outdir, f"guest-{name}-raw.txt"), "w") as f:
        for i, role in enumerate(("server", "client")):
            f.write(f"### guest{i} ({role})\n" + "\n".join(results[i][1]) + "\n")
    for i, (status, _out, console) in enumerate(results):
        if status:
            print("\n".join(console[-80:]), file=sys.stderr)
            sys.exit(f"guest bench ({name}): guest{i} failed with status {status}")
    # Repeated tests share a header, so pair sections with tests by order.
    sections = [lines for _header, lines in pt.sections_in_order(results[1][1])]
    bw = {s: [] for s in BW_SIZES}
    lat = []
    for (tool, args), lines in zip(plan_tests, sections):
        rows = pt.parse_bw(lines) if tool == "ib_write_bw" else pt.parse_lat(lines)
        if len(rows) != 1:
            sys.exit(f"guest bench ({name}): no result row from {tool} {args}; "
                     f"see {outdir}/guest-{name}-raw.txt")
        # A run whose clock calibration failed printed no rate at all: keep it
        # in the raw runs, leave it out of the medians.
        rows[0]["uncalibrated"] = pt.clock_uncalibrated(lines)
        (bw[rows[0]["bytes"]] if tool == "ib_write_bw" else lat).append(rows[0])

    def median(runs, key):
        values = [r[key] for r in runs if not r["uncalibrated"]]
        return statistics.median(values) if values else None
    return {
        "ib_write_bw": [{"bytes": s, "runs": bw[s],
                         "median_bw_avg_gbps": median(bw[s], "bw_avg_gbps"),
                         "median_msg_rate_mpps": median(bw[s], "msg_rate_mpps")}
                        for s in BW_SIZES],
        "ib_write_lat": {"bytes": 8, "runs": lat,
                         "median_t_typical_us": median(lat, "t_typical_us"),
                         "median_p99_us": median(lat, "p99_us")},
    }


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    started = time.time()
    doc = {"benchmark": "guest to guest: vStellar vs rxe, same guests and network",
           "accel": "kvm" if vg.kvm_usable() else "tcg", "host": platform.node(),
           "cpus": os.cpu_count(), "repeats": REPEATS,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))}
    cores = sorted(os.sched_getaffinity(0))
    plan = pin_plan(2, cores) if PIN else None
    doc["pinning"] = {"cores": cores, "plan": plan,
                      "separate_cores": bool(plan) and len(set(plan.values())) == len(plan)}
    doc["engine_write"] = engine_write(BW_SIZES, outdir)
    for name in TRANSPORTS:
        doc[name] = run_transport(name, outdir, plan)
    v, r = doc["vstellar"], doc["rxe"]
    doc["ratio_guest_to_engine"] = {
        str(a["bytes"]): round(a["median_bw_avg_gbps"] / e["median_gbps"], 3)
        for a, e in zip(v["ib_write_bw"], doc["engine_write"]) if a["median_bw_avg_gbps"] and e["median_gbps"] > 0}
    doc["ratio_vstellar_to_rxe"] = {
        "ib_write_bw": {str(a["bytes"]): round(a["median_bw_avg_gbps"] / b["median_bw_avg_gbps"], 2)
                        for a, b in zip(v["ib_write_bw"], r["ib_write_bw"])
                        if a["median_bw_avg_gbps"] and b["median_bw_avg_gbps"]},
        # Latency ratio below 1 means vStellar is faster.
        "ib_write_lat_8B_typical": (round(v["ib_write_lat"]["median_t_typical_us"] /
                                          r["ib_write_lat"]["median_t_typical_us"], 3)
                                    if v["ib_write_lat"]["median_t_typical_us"] and
                                    r["ib_write_lat"]["median_t_typical_us"] else None),
    }
    doc["seconds"] = round(time.time() - started, 1)
    with open(os.path.join(outdir, "guest.json"), "w") as f:
        json.dump(doc, f, indent=2)
    plot(doc, os.path.join(outdir, "guest.png"))
    for name in TRANSPORTS:
        for e in doc[name]["ib_write_bw"]:
            print(f"{name:8} ib_write_bw {e['bytes']:>8} B: median {e['median_bw_avg_gbps']} Gb/s")
        lt = doc[name]["ib_write_lat"]
        print(f"{name:8} ib_write_lat 8 B: median typical {lt['median_t_typical_us']} us, "
              f"p99 {lt['median_p99_us']} us")
    print("vStellar/rxe:", json.dumps(doc["ratio_vstellar_to_rxe"]))
    print("guest/engine (WRITE, same sizes):", json.dumps(doc["ratio_guest_to_engine"]),
          "pinning:", json.dumps(doc["pinning"]))


def plot(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for name in TRANSPORTS:
        rows = doc[name]["ib_write_bw"]
        a.plot([e["bytes"] for e in rows], [e["median_bw_avg_gbps"] for e in rows], marker="o",
               label=f"{name} (median of {doc['repeats']})")
    rows = doc["engine_write"]
    a.plot([e["bytes"] for e in rows], [e["median_gbps"] for e in rows], marker="s", linestyle="--",
           label="host engine WRITE (no guest)")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("message size (bytes)")
    a.set_ylabel("ib_write_bw average (Gb/s)")
    pinned = ("own cores" if doc["pinning"]["separate_cores"] else "QEMU+daemon per core") \
        if doc["pinning"]["plan"] else "unpinned"
    a.set_title(f"guest to guest, {doc['accel'].upper()}, {pinned}")
    a.legend()
    names = list(TRANSPORTS)
    keys = [("t_min_us", "t_min"), ("t_typical_us", "typical"), ("p99_us", "p99")]
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        runs = doc[name]["ib_write_lat"]["runs"]
        b.bar([i + j * width for i in range(len(keys))],
              [statistics.median(r[k] for r in runs) for k, _ in keys], width, label=name)
    b.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(keys))], [l for _, l in keys])
    b.set_ylabel("ib_write_lat 8 B (us, median of runs)")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tools/bench/guest/run OUTDIR")
    main(sys.argv[1])
