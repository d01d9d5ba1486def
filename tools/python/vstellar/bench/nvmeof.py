"""make bench: NVMe over Fabrics between two guests, vStellar against rxe and
NVMe/TCP, measured with fio.

The same two guests (TCG unless VSTELLAR_ACCEL=kvm) boot three times, one
transport each: NVMe over RDMA on the vStellar device, NVMe over RDMA on
Soft-RoCE (rxe on virtio-net), and NVMe/TCP on virtio-net. Guest 1 is the
target (nvmet over configfs, a memory-backed null_blk namespace), guest 0
the host (nvme-rdma or nvme-tcp), which runs Debian 12's fio (libaio,
O_DIRECT) on the namespace, REPEATS times each:
  - 1 MiB sequential writes over SIZE_MIB (this also fills the namespace, so
    that the reads after it read memory, not null_blk's unwritten zeros);
  - 1 MiB sequential reads, queue depth 8: bandwidth;
  - 4 KiB random reads, queue depth 32: IOPS;
  - 4 KiB random reads, queue depth 1: completion latency, median and p99.
Writes OUTDIR/nvmeof.json (every run, medians, the vStellar/rxe and
vStellar/TCP ratios), OUTDIR/nvmeof.png and the raw output.

Debian's fio pulls in the Ceph and GlusterFS client libraries, so it is not
in the test image: the guests boot the "fio" variant that
tools/build-guest-overlay.sh makes (built here, cached).
"""
import json
import os
import platform
import statistics
import sys
import time

from vstellar import TOP, guest as vg, perftest as pt

REPEATS = int(os.environ.get("VSTELLAR_BENCH_REPEATS", "3"))
SIZE_MIB = int(os.environ.get("VSTELLAR_BENCH_NVME_MIB", "64"))
SECONDS_PER_JOB = int(os.environ.get("VSTELLAR_BENCH_FIO_SECONDS", "10"))
NQN = "nqn.2026-12.org.vstellar:bench"

TRANSPORTS = {
    "vstellar": dict(trtype="rdma", setup=pt.VSTELLAR_SETUP, run=dict(vstellar=True)),
    "rxe": dict(trtype="rdma", setup=pt.RXE_SETUP, run=dict(modules=pt.RXE_MODULES)),
    "tcp": dict(trtype="tcp", setup="", run=dict()),
}

# The fio jobs, in order: (name, options). Reads run for SECONDS_PER_JOB.
FIO_JOBS = [
    ("write1m", f"--rw=write --bs=1M --iodepth=8 --size={SIZE_MIB}M"),
    ("read1m", f"--rw=read --bs=1M --iodepth=8 --size={SIZE_MIB}M --time_based --runtime={SECONDS_PER_JOB}"),
    ("randread4k", f"--rw=randread --bs=4k --iodepth=32 --size={SIZE_MIB}M --time_based --runtime={SECONDS_PER_JOB}"),
    ("randread4k_qd1", f"--rw=randread --bs=4k --iodepth=1 --size={SIZE_MIB}M --time_based --runtime={SECONDS_PER_JOB}"),
]

# In the host guest: run the jobs, print one JSON line of results per repeat.
FIO_PY = f"""\
import json, shlex, subprocess, sys
dev, repeats = sys.argv[1], int(sys.argv[2])
jobs = {FIO_JOBS!r}
def fio(name, opts):
    out = subprocess.run(["fio", "--name=" + name, "--filename=" + dev, "--ioengine=libaio",
                          "--direct=1", "--output-format=json"] + shlex.split(opts),
                         check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{{"):])["jobs"][0]
    if job["error"]:
        sys.exit(f"fio {{name}}: error {{job['error']}}")
    return job["write" if "write" in name else "read"]
for _ in range(repeats):
    r = {{}}
    for name, opts in jobs:
        io = fio(name, opts)
        if name.endswith("1m"):
            r[name[:-2] + "_mbps"] = io["bw_bytes"] / 1e6
        elif name == "randread4k":
            r["randread4k_iops"] = io["iops"]
        else:
            pct = io["clat_ns"]["percentile"]
            r["read4k_median_us"] = pct["50.000000"] / 1e3
            r["read4k_p99_us"] = pct["99.000000"] / 1e3
    print("NVBENCH " + json.dumps(r), flush=True)
"""


def scripts(tr):
    t = tr["trtype"]
    target = f"""{tr['setup']}
set -e
modprobe null_blk nr_devices=1 gb=1 memory_backed=1
modprobe nvmet-{t}
grep -q ' /sys/kernel/config ' /proc/mounts || mount -t configfs configfs /sys/kernel/config
c=/sys/kernel/config/nvmet
mkdir -p $c/subsystems/{NQN}/namespaces/1 $c/ports/1
echo 1 > $c/subsystems/{NQN}/attr_allow_any_host
echo /dev/nullb0 > $c/subsystems/{NQN}/namespaces/1/device_path
echo 1 > $c/subsystems/{NQN}/namespaces/1/enable
echo {t} > $c/ports/1/addr_trtype
echo ipv4 > $c/ports/1/addr_adrfam
echo $VSTELLAR_SELF_IP > $c/ports/1/addr_traddr
echo 4420 > $c/ports/1/addr_trsvcid
ln -s $c/subsystems/{NQN} $c/ports/1/subsystems/{NQN}
timeout 1500 nc -l -p 5000 > /dev/null
"""
    host = f"""{tr['setup']}
trap 'rc=$?; echo done | nc $VSTELLAR_PEER_IP 5000; exit $rc' EXIT
set -e
modprobe nvme-{t}
cat > /tmp/fio_jobs.py <<'EOF'
{FIO_PY}EOF
i=0
until nvme connect -t {t} -a $VSTELLAR_PEER_IP -s 4420 -n {NQN} > /tmp/connect.out 2>&1; do
  i=$((i + 1)); [ $i -lt 300 ] || {{ cat /tmp/connect.out; exit 1; }}
  sleep 1
done
i=0
until [ -b /dev/nvme0n1 ]; do i=$((i + 1)); [ $i -lt 100 ] || exit 1; sleep 0.1; done
cat /sys/class/nvme/nvme0/transport
fio --version
python3 /tmp/fio_jobs.py /dev/nvme0n1 {REPEATS}
nvme disconnect -n {NQN}
"""
    return host, target


def fio_image():
    """The guest image with Debian's fio (an overlay variant)."""
    return vg.overlay_image("fio", "fio")


def run_transport(name, outdir, image):
    tr = TRANSPORTS[name]
    host, target = scripts(tr)
    results = vg.run_guests([host, target], timeout=1800, mem=1024, image=image, **tr["run"])
    with open(os.path.join(outdir, f"nvmeof-{name}-raw.txt"), "w") as f:
        for i, role in enumerate(("host", "target")):
            f.write(f"### guest{i} ({role})\n" + "\n".join(results[i][1]) + "\n")
    for i, (status, _out, console) in enumerate(results):
        if status:
            print("\n".join(console[-60:]), file=sys.stderr)
            sys.exit(f"nvmeof bench ({name}): guest{i} failed with status {status}; "
                     f"see {outdir}/nvmeof-{name}-raw.txt")
    runs = [json.loads(line.split(" ", 1)[1]) for line in results[0][1] if line.startswith("NVBENCH ")]
    if len(runs) != REPEATS:
        sys.exit(f"nvmeof bench ({name}): {len(runs)} results, expected {REPEATS}")
    med = {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
    return {"trtype": tr["trtype"], "runs": runs, "median": med}


def plot(doc, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    names = list(TRANSPORTS)
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 4))
    x = range(len(names))
    for off, key, label in ((-0.2, "write_mbps", "1 MiB write"), (0.2, "read_mbps", "1 MiB read")):
        ax1.bar([i + off for i in x], [doc[n]["median"][key] for n in names], 0.4, label=label)
    ax1.set_xticks(list(x), names)
    ax1.set_ylabel("MB/s (fio, QD8, O_DIRECT)")
    ax1.legend()
    ax2.bar(list(x), [doc[n]["median"]["randread4k_iops"] for n in names], 0.5)
    ax2.set_xticks(list(x), names)
    ax2.set_ylabel("4 KiB random read IOPS (QD32)")
    ax3.bar(list(x), [doc[n]["median"]["read4k_median_us"] for n in names], 0.5, label="median")
    ax3.errorbar(list(x), [doc[n]["median"]["read4k_median_us"] for n in names],
                 yerr=[[0] * len(names), [doc[n]["median"]["read4k_p99_us"] - doc[n]["median"]["read4k_median_us"]
                                          for n in names]], fmt="none", ecolor="black", capsize=4, label="to p99")
    ax3.set_xticks(list(x), names)
    ax3.set_ylabel("4 KiB random read latency, QD1 (us)")
    ax3.legend()
    fig.suptitle(f"NVMe-oF between two {doc['accel'].upper()} guests, fio "
                 f"({SIZE_MIB} MiB, {SECONDS_PER_JOB} s per read job, medians of {REPEATS})")
    fig.tight_layout()
    fig.savefig(path)


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    started = time.time()
    doc = {"benchmark": "NVMe-oF guest to guest: NVMe/RDMA on vStellar vs on rxe vs NVMe/TCP, same guests",
           "accel": "kvm" if vg.kvm_usable() else "tcg", "host": platform.node(),
           "cpus": os.cpu_count(), "repeats": REPEATS, "size_mib": SIZE_MIB,
           "seconds_per_job": SECONDS_PER_JOB, "fio_jobs": dict(FIO_JOBS),
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))}
    image = fio_image()
    for name in TRANSPORTS:
        doc[name] = run_transport(name, outdir, image)

    def ratio(a, b):
        return round(a / b, 2) if a and b else None
    v = doc["vstellar"]["median"]
    for other in ("rxe", "tcp"):
        o = doc[other]["median"]
        # above 1: vStellar is faster; latency below 1: vStellar is faster
        doc[f"ratio_vstellar_to_{other}"] = {k: ratio(v[k], o[k]) for k in v}
    doc["seconds"] = round(time.time() - started, 1)
    with open(os.path.join(outdir, "nvmeof.json"), "w") as f:
        json.dump(doc, f, indent=2)
    plot(doc, os.path.join(outdir, "nvmeof.png"))
    for name in TRANSPORTS:
        m = doc[name]["median"]
        print(f"{name:8} write {m['write_mbps']:.1f} MB/s, read {m['read_mbps']:.1f} MB/s, "
              f"4 KiB randread {m['randread4k_iops']:.0f} IOPS (QD32), "
              f"{m['read4k_median_us']:.0f} us (QD1, p99 {m['read4k_p99_us']:.0f})")


if __name__ == "__main__":
    try:
        main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(TOP, "out", "bench"))
    except vg.GuestError as e:
        sys.exit(f"nvmeof bench: {e}")
