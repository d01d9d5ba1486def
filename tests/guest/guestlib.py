"""What the guest tests share: the launcher library on sys.path."""
import os
import sys

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "tools"))

import vstellar_guest  # noqa: E402,F401
import vstellar_perftest  # noqa: E402,F401

# The end of a guest script that used kernel RDMA users: how many kernel
# warnings, BUGs and oopses the run left in dmesg, as "kernel-splats N".
SPLATS = ("echo \"kernel-splats $(dmesg | grep -c -E "
          "'WARNING:|BUG:|Oops|general protection|blocked for more than')\"\n")


def splats(lines):
    """The count a SPLATS line printed, or None if there was none."""
    for line in lines:
        if line.startswith("kernel-splats "):
            return int(line.split()[1])
    return None
