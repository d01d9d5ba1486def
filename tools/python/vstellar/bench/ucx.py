"""make bench: UCX and MPI between two guests, vStellar against rxe.

The same two guests (TCG unless VSTELLAR_ACCEL=kvm) run, once over the
vStellar device and once over Soft-RoCE (rxe on virtio-net), one after the
other in this run: ucx_perftest UCT rc_verbs put_bw at 64 KiB (zero-copy)
and UCP tag_lat at 8 B, REPEATS times each, then allreduce_bench
(MPI_Allreduce of floats, OpenMPI's UCX PML, every element checked) from
1 MiB to 64 MiB. Writes OUTDIR/ucx.json (every run, medians, the
vStellar/rxe ratios), OUTDIR/ucx.png and the raw output.

rxe needs one UCX setting vStellar does not: UCX_UD_VERBS_ETH_DGID_CHECK=n.
rxe's UD completions leave ibv_wc.sl at 0, so UCX reads the GRH as IPv6,
finds no address of its own in it and drops every datagram, which kills
UCX's connection setup (docs/provider.md). With the check off UCX runs on
rxe, which makes the comparison possible at all.
"""
import json
import os
import platform
import statistics
import sys
import time

from vstellar import guest as vg, perftest as pt

REPEATS = int(os.environ.get("VSTELLAR_BENCH_REPEATS", "3"))

TRANSPORTS = {
    "vstellar": dict(setup=pt.VSTELLAR_SETUP, env="export UCX_NET_DEVICES=vstellar0:1",
                     run=dict(vstellar=True)),
    "rxe": dict(setup=pt.RXE_SETUP,
                env="export UCX_NET_DEVICES=rxe0:1 UCX_UD_VERBS_ETH_DGID_CHECK=n",
                run=dict(modules=pt.RXE_MODULES)),
}


def ucx_tests(dev):
    t = []
    for _ in range(REPEATS):
        t.append(("put_bw", f"-d {dev} -x rc_verbs -t put_bw -D zcopy -s 65536 -n 300"))
        t.append(("tag_lat", "-t tag_lat -s 8 -n 500"))
    return t


# The client may start before the server listens.
CLIENT_RETRY = pt.client_retry("connect() failed\\|Connection refused")


def scripts(tr, dev):
    server = [tr["setup"], tr["env"], "set -e"]
    client = [tr["setup"], tr["env"], CLIENT_RETRY, "set -e"]
    for i, (name, args) in enumerate(ucx_tests(dev)):
        port = 13337 + i
        server.append(f"echo '== {name}'")
        server.append(f"timeout 300 ucx_perftest -p {port}")
        client.append(f"echo '== {name}'")
        client.append(f"run_client timeout 300 ucx_perftest $VSTELLAR_PEER_IP -p {port} {args}")
    server.append("vstellar-mpi serve 1500")
    client.append(f"""\
vstellar-mpi wait $VSTELLAR_PEER_IP
echo '== allreduce'
mpirun -np 2 --host $VSTELLAR_SELF_IP,$VSTELLAR_PEER_IP --mca pml ucx --mca btl self \\
    -x UCX_NET_DEVICES -x UCX_UD_VERBS_ETH_DGID_CHECK \\
    allreduce_bench -b 1M -e 64M -n 5 -w 1 -J /tmp/allreduce.json || rc=$?
echo '== json'
cat /tmp/allreduce.json
vstellar-mpi release $VSTELLAR_PEER_IP
exit ${{rc:-0}}
""")
    return "\n".join(server) + "\n", "\n".join(client) + "\n"


def final_row(lines):
    """ucx_perftest's 'Final:' row: iterations, typical, average and overall
    latency (us), average and overall bandwidth (MB/s), average and overall
    message rate. A column UCX cannot compute reads -nan."""
    for line in lines:
        if line.strip().startswith("Final:"):
            return [float(x) for x in line.split()[1:]]
    return None


def run_transport(name, outdir):
    tr = TRANSPORTS[name]
    dev = "vstellar0:1" if name == "vstellar" else "rxe0:1"
    server, client = scripts(tr, dev)
    results = vg.run_guests([server, client], timeout=1800, mem=1024, **tr["run"])
    with open(os.path.join(outdir, f"ucx-{name}-raw.txt"), "w") as f:
        for i, role in enumerate(("server", "client")):
            f.write(f"### guest{i} ({role})\n" + "\n".join(results[i][1]) + "\n")
    for i, (status, _out, console) in enumerate(results):
        if status:
            print("\n".join(console[-60:]), file=sys.stderr)
            sys.exit(f"ucx bench ({name}): guest{i} failed with status {status}; see {outdir}/ucx-{name}-raw.txt")
    sections = list(pt.sections_in_order(results[1][1]))
    put_bw, tag_lat = [], []
    json_lines = []
    for header, lines in sections:
        if header in ("put_bw", "tag_lat"):
            row = final_row(lines)
            if not row:
                sys.exit(f"ucx bench ({name}): no final row for {header}")
            (put_bw if header == "put_bw" else tag_lat).append(
                {"iterations": row[0], "typical_us": row[1], "overall_us": row[3], "bw_mbps": row[5]})
        elif header == "json":
            json_lines = lines
    report = json.loads("\n".join(json_lines))
    if report.get("wrong"):
        sys.exit(f"ucx bench ({name}): allreduce results were wrong")
    busbw = {str(r["bytes"]): r["busbw_gbps"] for r in report["results"]}
    return {
        "put_bw_64KiB": {"runs": put_bw, "median_mbps": statistics.median(r["bw_mbps"] for r in put_bw)},
        "tag_lat_8B": {"runs": tag_lat, "median_typical_us": statistics.median(r["typical_us"] for r in tag_lat)},
        "allreduce_busbw_gbps": {"1MiB": busbw.get(str(1 << 20)), "64MiB": busbw.get(str(64 << 20)),
                                 "all": busbw},
    }


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    started = time.time()
    doc = {"benchmark": "UCX and MPI guest to guest: vStellar vs rxe, same guests and network",
           "accel": "kvm" if vg.kvm_usable() else "tcg", "host": platform.node(),
           "cpus": os.cpu_count(), "repeats": REPEATS,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))}
    for name in TRANSPORTS:
        doc[name] = run_transport(name, outdir)
    v, r = doc["vstellar"], doc["rxe"]

    def ratio(a, b):
        return round(a / b, 2) if a and b else None
    doc["ratio_vstellar_to_rxe"] = {
        "put_bw_64KiB": ratio(v["put_bw_64KiB"]["median_mbps"], r["put_bw_64KiB"]["median_mbps"]),
        # below 1: vStellar is faster
        "tag_lat_8B": ratio(v["tag_lat_8B"]["median_typical_us"], r["tag_lat_8B"]["median_typical_us"]),
        "allreduce_busbw_1MiB": ratio(v["allreduce_busbw_gbps"]["1MiB"], r["allreduce_busbw_gbps"]["1MiB"]),
        "allreduce_busbw_64MiB": ratio(v["allreduce_busbw_gbps"]["64MiB"], r["allreduce_busbw_gbps"]["64MiB"]),
    }
    doc["seconds"] = round(time.time() - started, 1)
    with open(os.path.join(outdir, "ucx.json"), "w") as f:
        json.dump(doc, f, indent=2)
    plot(doc, os.path.join(outdir, "ucx.png"))
    for name in TRANSPORTS:
        d = doc[name]
        print(f"{name:8} put_bw 64 KiB {d['put_bw_64KiB']['median_mbps']:.1f} MB/s, "
              f"tag_lat 8 B {d['tag_lat_8B']['median_typical_us']:.1f} us, allreduce busbw "
              f"1 MiB {d['allreduce_busbw_gbps']['1MiB']} GB/s, 64 MiB {d['allreduce_busbw_gbps']['64MiB']} GB/s")
    print("vStellar/rxe:", json.dumps(doc["ratio_vstellar_to_rxe"]))


def plot(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(TRANSPORTS)
    metrics = [("put_bw 64 KiB (MB/s)", lambda d: d["put_bw_64KiB"]["median_mbps"]),
               ("tag_lat 8 B (us)", lambda d: d["tag_lat_8B"]["median_typical_us"]),
               ("allreduce busbw 1 MiB (GB/s)", lambda d: d["allreduce_busbw_gbps"]["1MiB"] or 0),
               ("allreduce busbw 64 MiB (GB/s)", lambda d: d["allreduce_busbw_gbps"]["64MiB"] or 0)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(14, 3.5))
    for ax, (title, get) in zip(axes, metrics):
        ax.bar(names, [get(doc[n]) for n in names], color=["tab:blue", "tab:orange"])
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"UCX 1.13 and OpenMPI 4.1 guest to guest ({doc['accel'].upper()}), medians")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tools/bench/ucx/run OUTDIR")
    main(sys.argv[1])
