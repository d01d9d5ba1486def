"""make bench: start-up of a guest with its vStellar device, and hot-plug.

Start-up (the shape of the Stellar paper's Figure 6): from launch (test
network, vstellard and QEMU started, the device created for this guest) to
the first completed send: ibv_rc_pingpong -n 1 in the guest, client and
server on its own vstellar0 (loopback through the daemon), exits once its
one send has completed. At 1, 4 and 16 GiB of guest memory, with lazy
pinning (PVDMA: 2 MiB blocks pinned on first DMA) and eager pinning
(vstellard --pin=eager: all guest memory pinned when QEMU hands it over,
as VFIO does). One guest at a time; a size is skipped (and says so in the
JSON) when the machine lacks the memory to pin it.

Hot-plug: one running guest; QMP device_add of vhost-user-vstellar-pci
(a new connection to its running vstellard) until the guest sees vstellar1
ACTIVE (a shell loop polling sysfs every 10 ms), then device_del; HOTPLUGS
times.

Writes OUTDIR/startup.json and OUTDIR/startup.png. TCG guests unless
VSTELLAR_ACCEL=kvm; the times are dominated by the emulated CPU.
"""
import json
import os
import platform
import statistics
import sys
import time

from vstellar import guest as vg, perftest as pt

REPEATS = int(os.environ.get("VSTELLAR_BENCH_REPEATS", "3"))
SIZES_MIB = [int(s) for s in os.environ.get("VSTELLAR_STARTUP_SIZES", "1024,4096,16384").split(",")]
MODES = ["lazy", "eager"]
HOTPLUGS = int(os.environ.get("VSTELLAR_HOTPLUGS", "5"))

FIRST_SEND = pt.VSTELLAR_SETUP + pt.client_retry("Couldn't connect", tries=100) + """\
echo mark-gid
ibv_rc_pingpong -d vstellar0 -g $GIDX -n 1 -s 64 > /tmp/server.out 2>&1 &
run_client ibv_rc_pingpong -d vstellar0 -g $GIDX -n 1 -s 64 $VSTELLAR_SELF_IP || exit 1
echo mark-first-send
wait
"""

HOTPLUG = """\
echo mark-ready
i=0
while [ $i -lt {n} ]; do
  i=$((i + 1))
  until grep -q ACTIVE /sys/class/infiniband/vstellar1/ports/1/state 2>/dev/null; do sleep 0.01; done
  echo "mark-up $i"
  until [ ! -e /sys/class/infiniband/vstellar1 ]; do sleep 0.01; done
done
until [ "$(cat /sys/class/net/eth0/carrier)" = 0 ]; do sleep 0.2; done
"""


class Marks:
    """Arrival times of the guest's mark-* lines (time.monotonic())."""

    def __init__(self):
        self.t = {}

    def __call__(self, line):
        text = line.split("] ", 1)[-1]
        if text.startswith("mark-"):
            self.t.setdefault(text[5:], time.monotonic())


def mem_available_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def start_once(mem, mode):
    marks = Marks()
    daemons = []
    t0 = time.monotonic()
    results = vg.run_guests([FIRST_SEND], vstellar=True, mem=mem, timeout=900, echo=marks,
                            vstellard_args=[f"--pin={mode}"], daemons_out=daemons)
    status, _out, console = results[0]
    if status or "first-send" not in marks.t:
        print("\n".join(console[-60:]), file=sys.stderr)
        sys.exit(f"startup bench: {mem} MiB {mode}: guest failed with status {status}")
    dev = (daemons[0]["stats"] or {}).get("devices", [{}])[0]
    return {"launch_to_first_send_s": round(marks.t["first-send"] - t0, 3),
            "launch_to_gid_s": round(marks.t["gid"] - t0, 3),
            "attach_ms": round(dev.get("attach_ns", 0) / 1e6, 1),
            "bytes_pinned": dev.get("bytes_pinned")}


def hotplug_times():
    marks = Marks()
    times = []

    def during(s):
        g, d = s.guests[0], s.daemons[0]
        while "ready" not in marks.t:
            if g.proc.poll() is not None:
                raise vg.GuestError("the guest stopped:\n" + "\n".join(g.console[-60:]))
            time.sleep(0.05)
        q = g.connect()
        for i in range(1, HOTPLUGS + 1):
            t0 = time.monotonic()
            vg.plug_vstellar(q, d.sock, "hp")
            while f"up {i}" not in marks.t:
                if g.proc.poll() is not None:
                    raise vg.GuestError("the guest stopped:\n" + "\n".join(g.console[-60:]))
                time.sleep(0.002)
            times.append(round(marks.t[f"up {i}"] - t0, 3))
            vg.unplug_vstellar(q, "hp")
        q.execute("set_link", name="n0", up=False)

    results = vg.run_guests([HOTPLUG.format(n=HOTPLUGS)], vstellar=True, qmp=True, during=during,
                            timeout=600, echo=marks)
    if results[0][0]:
        sys.exit(f"hot-plug bench: guest failed with status {results[0][0]}")
    return times


def main(outdir):
    started = time.time()
    doc = {"what": "launch (network, vstellard, QEMU) to the first completed send in the guest "
                   "(ibv_rc_pingpong -n 1 over its vstellar0); hot-plug: QMP device_add to vstellar1 "
                   "ACTIVE in the guest",
           "accel": "kvm" if vg.kvm_usable() else "tcg", "host": platform.node(),
           "date": time.strftime("%Y-%m-%d"), "repeats": REPEATS, "startup": []}
    for mem in SIZES_MIB:
        for mode in MODES:
            entry = {"mem_mib": mem, "pin": mode, "runs": []}
            need = mem + 2048 if mode == "eager" else 2048
            if mem_available_mib() < need:
                entry["skipped"] = f"needs {need} MiB available, {mem_available_mib()} MiB are"
                print(f"{mem} MiB {mode}: skipped ({entry['skipped']})")
                doc["startup"].append(entry)
                continue
            for _ in range(REPEATS):
                entry["runs"].append(start_once(mem, mode))
            entry["median_s"] = statistics.median(r["launch_to_first_send_s"] for r in entry["runs"])
            entry["median_attach_ms"] = statistics.median(r["attach_ms"] for r in entry["runs"])
            print(f"{mem:6} MiB {mode:5}: launch -> first send median {entry['median_s']:.2f} s "
                  f"(device attach {entry['median_attach_ms']:.1f} ms)")
            doc["startup"].append(entry)
    h = hotplug_times()
    doc["hotplug"] = {"runs_s": h, "median_s": statistics.median(h)}
    print(f"hot-plug to vstellar1 ACTIVE: median {doc['hotplug']['median_s']:.3f} s of {h}")
    doc["seconds"] = round(time.time() - started, 1)
    with open(os.path.join(outdir, "startup.json"), "w") as f:
        json.dump(doc, f, indent=2)
    plot(doc, os.path.join(outdir, "startup.png"))


def plot(doc, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    sizes = sorted({e["mem_mib"] for e in doc["startup"]})
    width = 0.38
    for j, mode in enumerate(MODES):
        ys = []
        for mem in sizes:
            e = next(e for e in doc["startup"] if e["mem_mib"] == mem and e["pin"] == mode)
            ys.append(e.get("median_s", 0.0))
        bars = ax.bar([i + j * width for i in range(len(sizes))], ys, width,
                      label=f"{mode} pinning" + (" (PVDMA)" if mode == "lazy" else ""))
        for b, y in zip(bars, ys):
            ax.annotate(f"{y:.1f}" if y else "skipped", (b.get_x() + b.get_width() / 2, y),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks([i + width / 2 for i in range(len(sizes))], [f"{m // 1024} GiB" for m in sizes])
    ax.set_ylabel("launch to first completed send (s)")
    ax.set_title(f"start-up with a vStellar device ({doc['accel'].upper()}, median of {doc['repeats']}); "
                 f"hot-plug {doc['hotplug']['median_s']:.2f} s", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tools/bench/startup/run OUTDIR")
    main(sys.argv[1])
