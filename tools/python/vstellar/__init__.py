"""vStellar's host-side Python.

The library: guest (boot test guests under QEMU, the launcher behind
tools/vstellar-guest), perftest (perftest runs and their output) and ulp
(kernel RDMA users: NVMe-oF, NFS, RDS, iSER scripts for guests). The
commands in tools/ that are written in Python run a module here through
tools/python/run: guest_cli, demo, soak and bench.*.
"""
import os

# The repository's top directory: this file is tools/python/vstellar/__init__.py.
TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
