"""Memory beyond pinned RAM: the emulated accelerator (vstellar-accel,
docs/accelerator.md) and RDMA into its memory through dmabuf MRs (GPU
Direct RDMA's shape), and on-demand paging (ODP) MRs.

One boot of two guests, each with the vStellar device and a 64 MiB
accelerator. Guest 0 first runs ACCEL_CHECK against /dev/vstellar-accel0
by itself (the driver's ioctls and the dmabufs' CPU mappings), then is the
target of accel_rdma.py: its accelerator buffer, registered with
ibv_reg_dmabuf_mr, takes guest 1's RDMA WRITEs and READs (every byte
checked), is moved by its exporter (the MR is invalidated: WRITE and READ
get remote access errors and the old range stays untouched), registered
again, and bad registrations are refused. Each step prints
"accel-<step> ok" or raises; the test wants every step, zero exit statuses
and no kernel warnings. Then the same two guests run odp_rdma.py: WRITEs
and READs into ODP MRs whose pages were never touched, refaults after
MADV_DONTNEED, an address outside the MR, a fault the driver cannot
answer (the access fails after the device's timeout), an implicit MR and
a prefetch (steps "odp-<step> ok").
"""
import os
import unittest

from guestlib import SPLATS, splats
from vstellar import guest as vg, perftest as pt

ACCEL_SIZE = 64 << 20

# Runs in the guest (python3 is in the image).
ACCEL_CHECK = r'''
import errno, fcntl, mmap, os, struct

MEM = %(size)d
PAGE = mmap.PAGESIZE
# include/vstellar/vstellar-accel-abi.h
def ioc(d, nr, size):
    return (d << 30) | (size << 16) | (ord("V") << 8) | nr
INFO, ALLOC = ioc(2, 0x40, 16), ioc(3, 0x41, 16)
QUERY, MOVE = ioc(3, 0x42, 24), ioc(3, 0x43, 24)

dev = os.open("/dev/vstellar-accel0", os.O_RDWR)

def info():
    return struct.unpack("QQ", fcntl.ioctl(dev, INFO, bytes(16)))

def alloc(size):
    return struct.unpack("QIi", fcntl.ioctl(dev, ALLOC, struct.pack("QIi", size, 0, -1)))[2]

def buf_ioctl(req, fd):
    _fd, _flags, off, size = struct.unpack("iIQQ", fcntl.ioctl(dev, req, struct.pack("iIQQ", fd, 0, 0, 0)))
    return off, size

def errno_of(f, *a):
    try:
        f(*a)
    except OSError as e:
        return e.errno
    return 0

def pattern(seed, n):
    return bytes((seed * 131 + i * 7) & 0xff for i in range(256)) * (n // 256)

def ok(step):
    print(f"accel-{step} ok", flush=True)

size, free = info()
assert (size, free) == (MEM, MEM), (size, free)
ok("info")

# Page-rounded, first fit from offset 0, zeroed
sizes = [1 << 20, 2 * PAGE + 1, 2 << 20]
fds = [alloc(s) for s in sizes]
places = [buf_ioctl(QUERY, fd) for fd in fds]
want, off = [], 0
for s in sizes:
    r = (s + PAGE - 1) // PAGE * PAGE
    want.append((off, r))
    off += r
assert places == want, (places, want)
assert info()[1] == MEM - off, info()
ok("alloc")

maps = [mmap.mmap(fd, r, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        for fd, (_o, r) in zip(fds, places)]
for m in maps:
    assert m[:] == bytes(len(m)), "a new buffer is not zeroed"
for i, m in enumerate(maps):
    m[:] = pattern(i, len(m))
for i, m in enumerate(maps):
    assert m[:] == pattern(i, len(m)), f"buffer {i} does not read back"
ok("mmap")

# MOVE buffer 0: its contents follow it, the existing mapping refaults at
# the new place, and the old range is free again (first fit hands it out)
old = places[0]
new = buf_ioctl(MOVE, fds[0])
assert new[1] == old[1] and new[0] != old[0] and new[0] >= off, (old, new)
assert buf_ioctl(QUERY, fds[0]) == new
assert maps[0][:] == pattern(0, len(maps[0])), "contents did not follow the move"
fresh = mmap.mmap(fds[0], new[1], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
assert fresh[:] == pattern(0, new[1])
maps[0][:] = pattern(9, len(maps[0]))
assert fresh[:] == pattern(9, new[1]), "old and new mappings disagree after the move"
fresh.close()
reuse = alloc(old[1])
assert buf_ioctl(QUERY, reuse) == old, buf_ioctl(QUERY, reuse)
m = mmap.mmap(reuse, old[1])
assert m[:] == bytes(old[1]), "the old range still receives the moved buffer's writes"
m.close()
os.close(reuse)
for i in (1, 2):
    assert maps[i][:] == pattern(i, len(maps[i])), f"buffer {i} changed"
ok("move")

# Not ours: a plain file, an fd that is not open; flags must be 0
with open("/proc/self/stat", "rb") as f:
    assert errno_of(buf_ioctl, QUERY, f.fileno()) == errno.EINVAL
    assert errno_of(buf_ioctl, MOVE, f.fileno()) == errno.EINVAL
assert errno_of(buf_ioctl, QUERY, 999) == errno.EINVAL
assert errno_of(fcntl.ioctl, dev, QUERY, struct.pack("iIQQ", fds[0], 1, 0, 0)) == errno.EINVAL
assert errno_of(fcntl.ioctl, dev, ALLOC, struct.pack("QIi", PAGE, 1, -1)) == errno.EINVAL
assert errno_of(alloc, 0) == errno.EINVAL
ok("einval")

# No room: ALLOC and MOVE say ENOMEM and change nothing
assert errno_of(alloc, 2 * MEM) == errno.ENOMEM
big = alloc(MEM // 2)
assert errno_of(alloc, MEM // 2) == errno.ENOMEM
assert errno_of(buf_ioctl, MOVE, big) == errno.ENOMEM
assert maps[1][:] == pattern(1, len(maps[1]))
os.close(big)
ok("enomem")

# A buffer lives while its fd or a mapping does; then its memory is free
for fd in fds:
    os.close(fd)
assert maps[2][:] == pattern(2, len(maps[2])), "a mapping outlived by its fd lost its buffer"
assert info()[1] < MEM
for m in maps:
    m.close()
assert info() == (MEM, MEM), info()
os.close(dev)
ok("free")
'''

STEPS = ("info", "alloc", "mmap", "move", "einval", "enomem", "free")
# accel_rdma.py's steps on each side
TARGET_STEPS = ("write", "rdma-move", "stale", "reregister", "refused")
INITIATOR_STEPS = ("read", "invalidated", "initiator")

# odp_rdma.py's steps on each side
ODP_TARGET_STEPS = ("register", "write", "refault", "unanswered", "implicit", "prefetch", "target")
ODP_INITIATOR_STEPS = ("read", "outside", "timeout", "initiator")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {}
for name in ("rdma_pair.py", "accel_rdma.py", "odp_rdma.py"):
    with open(os.path.join(HERE, name)) as f:
        SCRIPTS[name] = f.read()
PORT = 18515


def rdma_side(script, args):
    """Shell: write the script and rdma_pair.py into the guest's /tmp and
    run it with args."""
    files = "".join(f"cat > /tmp/{n} <<'EOF'\n{SCRIPTS[n]}EOF\n" for n in ("rdma_pair.py", script))
    return files + f"python3 /tmp/{script} {args} 2>&1 || echo {script[:-3]}-failed\n"


class AccelTest(unittest.TestCase):
    """Two guests with vStellar and a 64 MiB accelerator each."""

    @classmethod
    def setUpClass(cls):
        vg.Artifacts().vstellard  # missing pieces fail the test: `make test` builds them
        dev = pt.VSTELLAR_DEVICE
        target = ("python3 - <<'EOF'\n" + ACCEL_CHECK % {"size": ACCEL_SIZE} + "EOF\n" +
                  pt.VSTELLAR_SETUP + rdma_side("accel_rdma.py", f"target {dev} $GIDX {PORT}") +
                  rdma_side("odp_rdma.py", f"target {dev} $GIDX {PORT + 1}"))
        initiator = (pt.VSTELLAR_SETUP +
                     rdma_side("accel_rdma.py", f"initiator {dev} $GIDX $VSTELLAR_PEER_IP {PORT}") +
                     rdma_side("odp_rdma.py", f"initiator {dev} $GIDX $VSTELLAR_PEER_IP {PORT + 1}"))
        cls.daemons = []
        cls.results = vg.run_guests([s + SPLATS for s in (target, initiator)], vstellar=True,
                                    timeout=400, accel=ACCEL_SIZE, daemons_out=cls.daemons)

    def test_guests_succeeded(self):
        for i, (status, out, console) in enumerate(self.results):
            self.assertEqual(status, 0, f"guest{i}:\n" + "\n".join(console[-80:]) +
                             "\n--- vstellard ---\n" + self.daemons[i]["log"][-3000:])
            for failed in ("accel_rdma-failed", "odp_rdma-failed"):
                self.assertNotIn(failed, out, f"guest{i}:\n" + "\n".join(out[-60:]) +
                                 "\n" + vg.daemon_report(self.daemons))

    def test_accelerator_by_itself(self):
        out = self.results[0][1]
        for step in STEPS:
            with self.subTest(step=step):
                self.assertIn(f"accel-{step} ok", out, "\n".join(out[-40:]))

    def steps_done(self, prefix, target_steps, initiator_steps):
        """Every "<prefix>-<step> ok" line of the target (guest 0) and the
        initiator (guest 1)."""
        for i, steps in ((0, target_steps), (1, initiator_steps)):
            out = self.results[i][1]
            for step in steps:
                with self.subTest(guest=i, step=step):
                    self.assertTrue(any(line.startswith(f"{prefix}-{step} ok") for line in out),
                                    f"guest{i}:\n" + "\n".join(out[-60:]))

    def test_rdma_into_accelerator_memory(self):
        self.steps_done("accel", TARGET_STEPS, INITIATOR_STEPS)

    def test_rdma_into_on_demand_paging_mrs(self):
        self.steps_done("odp", ODP_TARGET_STEPS, ODP_INITIATOR_STEPS)
        for line in self.results[0][1] + self.results[1][1]:
            if line.startswith("odp-"):
                print(line)  # resident sizes, first-touch and timeout times

    def test_no_kernel_splats(self):
        for i, (_status, out, _console) in enumerate(self.results):
            self.assertEqual(splats(out), 0, f"guest{i}:\n" + "\n".join(out[-60:]))


if __name__ == "__main__":
    unittest.main()
