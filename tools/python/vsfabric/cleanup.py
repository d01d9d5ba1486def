"""Removing fabrics: every live Fabric is destroyed at exit and on
SIGINT/SIGTERM/SIGHUP (installed when vsfabric is imported), and
cleanup_stale removes what a killed run (SIGKILL) left behind."""
import atexit
import os
import re
import shutil
import signal
import sys
import tempfile

from .command import run
from .netns import list_namespaces

live = []  # fabrics to tear down at exit; Fabric adds and removes itself


def _cleanup_all(*_):
    for f in list(live):
        try:
            f.destroy()
        except Exception as e:  # keep going: remove as much as we can
            print(f"vsfabric: cleanup: {e}", file=sys.stderr)


def _on_signal(signum, frame):
    _cleanup_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(_cleanup_all)
for _s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_s, _on_signal)


def cleanup_stale(prefix="vsf"):
    """Remove namespaces vsf<pid>-* whose process is gone (a killed run)."""
    gone = []
    for n in list_namespaces(prefix):
        m = re.match(r"vsf(\d+)-", n)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            gone.append(n)
    if gone:
        run(["ip", "-force", "-batch", "-"], "".join(f"netns del {n}\n" for n in gone),
           check=False)
    for d in os.listdir(tempfile.gettempdir()):
        m = re.match(r"vsf(\d+)-bpf", d)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            p = os.path.join(tempfile.gettempdir(), d)
            run(["umount", p], check=False)
            shutil.rmtree(p, ignore_errors=True)
    return gone
