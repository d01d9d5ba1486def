"""Shared bits of the experiment scripts: arguments, output, plots."""
import argparse
import json
import os
import sys
import time

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from . import cleanup_stale


def parser(doc):
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
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
