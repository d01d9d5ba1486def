"""make bench: registering 1 GiB pinned against on-demand paging (ODP).

Two guests with vStellar. Guest 0 maps 1 GiB of anonymous memory it never
touched (MADV_HUGEPAGE, so a pinned registration's page list fits one
command: 512 pages of 2 MiB) and registers it, REPEATS times each way,
alternating:

- pinned: ibv_reg_mr pins every page now (the kernel faults in and zeroes
  1 GiB) and hands the device the page list;
- ODP: ibv_reg_mr with IBV_ACCESS_ON_DEMAND pins nothing; pages come in
  when the device first touches them (page-fault events, MAP_MR_PAGES).

Guest 1 then WRITEs the whole GiB in 1 MiB messages, PASSES times: the
first pass is where ODP pays its faults (first touch), the later ones are
the steady state. Reported per mode: registration time, first-pass and
steady goodput, deregistration time, and the ODP/pinned ratios (target:
steady goodput ratio >= 0.9). Writes OUTDIR/odp.json and OUTDIR/odp.png.
TCG guests unless VSTELLAR_ACCEL=kvm: the registration and fault times are
the emulated guest kernel's; the data path is vstellard's on the host.
Environment: VSTELLAR_BENCH_REPEATS (3), VSTELLAR_ODP_PASSES (3).
"""
import json
import os
import platform
import statistics
import sys
import time

from vstellar import TOP, guest as vg, perftest as pt

REPEATS = int(os.environ.get("VSTELLAR_BENCH_REPEATS", "3"))
PASSES = int(os.environ.get("VSTELLAR_ODP_PASSES", "3"))
SIZE = 1 << 30
MSG = 1 << 20
PORT = 18600

# Runs in both guests: `target` registers and reports, `initiator` writes.
SCRIPT = r'''
import json, mmap, sys, time
import pyverbs.enums as e
from pyverbs.device import Context
from pyverbs.mem_alloc import madvise, mmap as vmmap, munmap
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.wr import SGE, SendWR
from rdma_pair import REMOTE, Conn, dial, lines, send, serve

SIZE, MSG, REPEATS, PASSES = %(size)d, %(msg)d, %(repeats)d, %(passes)d
MODES = ["pinned", "odp"] * REPEATS
MADV_HUGEPAGE = 14
HUGE = 2 << 20

def target(dev, gidx, port):
    ctx = Context(name=dev)
    pd = PD(ctx)
    conn = Conn(ctx, pd, gidx, MSG)
    sock = serve(port)
    peer = lines(sock)
    send(sock, conn.me())
    conn.connect(next(peer))
    for mode in MODES:
        # 2 MiB aligned, so that every 2 MiB of it can be a huge page.
        raw = vmmap(length=SIZE + HUGE)
        base = (raw + HUGE - 1) // HUGE * HUGE
        madvise(base, SIZE, MADV_HUGEPAGE)
        access = REMOTE | (e.IBV_ACCESS_ON_DEMAND if mode == "odp" else 0)
        t0 = time.monotonic()
        mr = MR(pd, SIZE, access, address=base)
        reg = time.monotonic() - t0
        send(sock, {"mode": mode, "rkey": mr.rkey, "addr": base})
        done = next(peer)
        t0 = time.monotonic()
        mr.close()
        dereg = time.monotonic() - t0
        munmap(raw, SIZE + HUGE)
        print("odp-bench " + json.dumps({"mode": mode, "reg_s": reg, "dereg_s": dereg,
                                         "pass_s": done["pass_s"]}), flush=True)
    send(sock, {"mode": "end"})

def initiator(dev, gidx, peer_ip, port):
    ctx = Context(name=dev)
    pd = PD(ctx)
    conn = Conn(ctx, pd, gidx, MSG)
    sock = dial(peer_ip, port)
    peer = lines(sock)
    conn.connect(next(peer))
    send(sock, conn.me())
    for m in peer:
        if m["mode"] == "end":
            break
        times = []
        for _ in range(PASSES):
            t0 = time.monotonic()
            # A window of 8 WRITEs in flight, signalled each.
            posted = done = 0
            n = SIZE // MSG
            while done < n:
                while posted < n and posted - done < 8:
                    wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                                sg=[SGE(conn.mr.buf, MSG, conn.mr.lkey)])
                    wr.set_wr_rdma(m["rkey"], m["addr"] + posted * MSG)
                    conn.qp.post_send(wr)
                    posted += 1
                k, wcs = conn.cq.poll()
                for wc in wcs[:k]:
                    if wc.status != e.IBV_WC_SUCCESS:
                        raise AssertionError(f"WRITE failed: status {wc.status}")
                done += k
            times.append(time.monotonic() - t0)
        send(sock, {"pass_s": times})

if sys.argv[1] == "target":
    target(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
else:
    initiator(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
'''


def side(args):
    with open(os.path.join(TOP, "tests", "guest", "rdma_pair.py")) as f:
        pair = f.read()
    script = SCRIPT % {"size": SIZE, "msg": MSG, "repeats": REPEATS, "passes": PASSES}
    # Transparent huge pages on request, compacting memory to make them:
    # the pinned MR's page list then has 512 pages of 2 MiB (1 GiB of
    # 4 KiB pages would be 262,144, past max_cmd_pages).
    thp = ("echo madvise > /sys/kernel/mm/transparent_hugepage/enabled; "
           "echo madvise > /sys/kernel/mm/transparent_hugepage/defrag\n")
    return (pt.VSTELLAR_SETUP + thp + f"cat > /tmp/rdma_pair.py <<'EOF'\n{pair}EOF\n"
            f"cat > /tmp/odp_bench.py <<'EOF'\n{script}EOF\n"
            f"cd /tmp && python3 odp_bench.py {args} 2>&1 || echo odp-bench-failed\n")


def summarize(runs):
    out = {}
    for mode in ("pinned", "odp"):
        rs = [r for r in runs if r["mode"] == mode]
        gbps = lambda s: SIZE * 8 / s / 1e9
        out[mode] = {
            "reg_s": statistics.median(r["reg_s"] for r in rs),
            "dereg_s": statistics.median(r["dereg_s"] for r in rs),
            "first_pass_gbps": statistics.median(gbps(r["pass_s"][0]) for r in rs),
            "steady_gbps": statistics.median(gbps(s) for r in rs for s in r["pass_s"][1:]),
        }
    p, o = out["pinned"], out["odp"]
    out["ratios_odp_over_pinned"] = {
        "reg_time": o["reg_s"] / p["reg_s"],
        "first_pass_goodput": o["first_pass_gbps"] / p["first_pass_gbps"],
        "steady_goodput": o["steady_gbps"] / p["steady_gbps"],
    }
    return out


def main(outdir):
    os.makedirs(outdir, exist_ok=True)
    started = time.time()
    dev = pt.VSTELLAR_DEVICE
    daemons = []
    results = vg.run_guests([side(f"target {dev} $GIDX {PORT}"),
                             side(f"initiator {dev} $GIDX $VSTELLAR_PEER_IP {PORT}")],
                            vstellar=True, mem=2048, timeout=3000, daemons_out=daemons)
    for i, (status, out, console) in enumerate(results):
        if status or any("odp-bench-failed" in line for line in out):
            print("\n".join(out[-60:] or console[-60:]), file=sys.stderr)
            sys.exit(f"odp bench: guest {i} failed (status {status})")
    runs = [json.loads(line.split(" ", 1)[1]) for line in results[0][1] if line.startswith("odp-bench ")]
    doc = {"what": "1 GiB MR in guest 0, registered pinned or with IBV_ACCESS_ON_DEMAND; guest 1 WRITEs "
                   "all of it in 1 MiB messages (8 in flight), pass 1 = first touch, later = steady",
           "accel": "kvm" if vg.kvm_usable() else "tcg", "host": platform.node(),
           "date": time.strftime("%Y-%m-%d %H:%M"), "repeats": REPEATS, "passes": PASSES,
           "runs": runs, "median": summarize(runs),
           "page_fault_naks": sum((d.get("stats") or {}).get("engine", {}).get("page_fault_naks", 0)
                                  for d in daemons)}
    doc["seconds"] = round(time.time() - started, 1)
    with open(os.path.join(outdir, "odp.json"), "w") as f:
        json.dump(doc, f, indent=2)
    m = doc["median"]
    for mode in ("pinned", "odp"):
        print(f"{mode:6}: register {m[mode]['reg_s'] * 1e3:8.1f} ms, first pass {m[mode]['first_pass_gbps']:.2f} "
              f"Gb/s, steady {m[mode]['steady_gbps']:.2f} Gb/s, deregister {m[mode]['dereg_s'] * 1e3:.1f} ms")
    r = m["ratios_odp_over_pinned"]
    print(f"ODP/pinned: registration time {r['reg_time']:.4f}, first pass {r['first_pass_goodput']:.2f}, "
          f"steady {r['steady_goodput']:.2f} (target >= 0.9)")
    plot(doc, os.path.join(outdir, "odp.png"))


def plot(doc, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    m = doc["median"]
    modes = ["pinned", "odp"]
    metrics = [("registration of 1 GiB (ms)", lambda d: d["reg_s"] * 1e3),
               ("first pass, first touch (Gb/s)", lambda d: d["first_pass_gbps"]),
               ("steady passes (Gb/s)", lambda d: d["steady_gbps"])]
    fig, axes = plt.subplots(1, len(metrics), figsize=(11, 3.5))
    for ax, (title, get) in zip(axes, metrics):
        ax.bar(modes, [get(m[x]) for x in modes], color=["tab:orange", "tab:blue"])
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"1 GiB MR pinned against ODP, guest to guest ({doc['accel'].upper()}), medians")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tools/bench/odp/run OUTDIR")
    main(sys.argv[1])
