"""RDMA into on-demand paging (ODP) MRs, run inside two guests by
test_accel.py.

  python3 odp_rdma.py target DEV GIDX PORT
  python3 odp_rdma.py initiator DEV GIDX PEER_IP PORT

The target maps 16 MiB of anonymous memory it never touches and registers
it with IBV_ACCESS_ON_DEMAND: the driver pins nothing (the mapping's
resident size stays 0). The initiator's RDMA WRITEs put a pattern there,
page faults bringing the pages in, and the target checks every byte; the
initiator READs it back. The target then drops its pages (madvise
MADV_DONTNEED: the driver's mmu notifier unmaps them from the device) and
a new WRITE faults them in again. An access past the MR's end gets a
remote access error; an access to the MR where the process has no memory
any more (munmap'ed) is never answered by the driver and fails with a
remote operational error after the device's fault timeout, while the rest
of the MR keeps working. Then an implicit MR (the whole address space)
takes a WRITE into memory the target maps afterwards, and ibv_advise_mr
prefetches pages before any access (resident before, no fault after).
Each step prints "odp-<step> ok" or raises.
"""
import ctypes
import sys
import time

import pyverbs.enums as e
from pyverbs.device import Context
from pyverbs.mem_alloc import madvise, mmap, munmap
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.wr import SGE

from rdma_pair import REMOTE, Conn, initiator_side, lines, pattern, send, serve

BUF = 16 << 20
MSG = 1 << 20
ODP = REMOTE | e.IBV_ACCESS_ON_DEMAND


LIBC = ctypes.CDLL(None, use_errno=True)
PAGE = 4096


def resident(addr, length):
    """KiB of [addr, addr+length) in memory (mincore(2); a mapping's Rss in
    smaps would count its neighbours too when the kernel merged them)."""
    vec = (ctypes.c_ubyte * (length // PAGE))()
    if LIBC.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(length), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(b & 1 for b in vec) * PAGE // 1024


def peek(addr, n):
    return ctypes.string_at(addr, n)


def ok(step, extra=""):
    print(f"odp-{step} ok{extra}", flush=True)


def target(dev, gidx, port):
    ctx = Context(name=dev)
    pd = PD(ctx)
    caps = ctx.query_device_ex().odp_caps
    assert caps.general_caps & e.IBV_ODP_SUPPORT, "no ODP support advertised"
    conns = [Conn(ctx, pd, gidx, MSG) for _ in range(4)]
    base = mmap(length=BUF)
    mr = MR(pd, BUF, ODP, address=base)
    assert resident(base, BUF) == 0, f"registration touched {resident(base, BUF)} KiB"
    ok("register", f" resident {resident(base, BUF)} KiB")
    sock = serve(port)
    peer = lines(sock)
    send(sock, {"conns": [c.me() for c in conns], "rkey": mr.rkey, "addr": base})
    for c, p in zip(conns, next(peer)["conns"]):
        c.connect(p)
    send(sock, {"step": "connected"})

    # 1. Pages that were never touched fault in under the WRITEs.
    assert next(peer)["step"] == "written"
    want = pattern(MSG, 3)
    for k in range(BUF // MSG):
        if peek(base + k * MSG, MSG) != want:
            raise AssertionError(f"ODP memory differs from the WRITE at MiB {k}")
    ok("write", f" resident {resident(base, BUF)} KiB")
    send(sock, {"step": "checked"})
    assert next(peer)["step"] == "read"

    # 2. The kernel takes the pages back; the next WRITE faults again.
    madvise(base, BUF)
    assert resident(base, BUF) == 0
    send(sock, {"step": "dropped"})
    assert next(peer)["step"] == "rewritten"
    if peek(base, MSG) != pattern(MSG, 9) or peek(base + MSG, MSG) != bytes(MSG):
        raise AssertionError("the WRITE after MADV_DONTNEED did not land where the process sees it")
    ok("refault")

    # 3. The last MiB stops being memory of the process: faults there go
    # unanswered and the access fails after the device's timeout.
    munmap(base + BUF - MSG, MSG)
    send(sock, {"step": "unmapped"})
    assert next(peer)["step"] == "unanswered"
    if peek(base + 2 * MSG, MSG) != pattern(MSG, 11):
        raise AssertionError("a WRITE into the mapped part failed to land after the unanswered fault")
    ok("unanswered")

    # 4. An implicit MR: the whole address space, memory mapped afterwards.
    imr = MR(pd, MSG, ODP, implicit=True)
    later = mmap(length=4 * MSG)
    send(sock, {"step": "implicit", "rkey": imr.rkey, "addr": later + MSG})
    assert next(peer)["step"] == "implicit-written"
    if peek(later + MSG, MSG) != pattern(MSG, 13):
        raise AssertionError("the WRITE through the implicit MR did not land")
    ok("implicit")

    # 5. Prefetch: pages are there before anyone touches them.
    pre = mmap(length=4 * MSG)
    pmr = MR(pd, 4 * MSG, ODP, address=pre)
    assert resident(pre, 4 * MSG) == 0
    pd.advise_mr(e._IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, e._IBV_ADVISE_MR_FLAG_FLUSH,
                 [SGE(pre, 2 * MSG, pmr.lkey)])
    got = resident(pre, 4 * MSG)
    assert got >= 2 * MSG // 1024, f"prefetch made {got} KiB resident"
    ok("prefetch", f" resident {got} KiB")
    send(sock, {"step": "prefetched", "rkey": pmr.rkey, "addr": pre})
    assert next(peer)["step"] == "prefetch-written"
    if peek(pre, MSG) != pattern(MSG, 15):
        raise AssertionError("the WRITE into prefetched pages did not land")
    send(sock, {"step": "done"})
    ok("target")


def initiator(dev, gidx, peer_ip, port):
    ctx = Context(name=dev)
    pd = PD(ctx)
    conns, peer, hello, sock = initiator_side(ctx, pd, gidx, peer_ip, port, 4, MSG)
    rkey, base = hello["rkey"], hello["addr"]

    c = conns[0]
    c.mr.write(pattern(MSG, 3), MSG)
    t0 = time.monotonic()
    for k in range(BUF // MSG):
        st = c.rdma(e.IBV_WR_RDMA_WRITE, base + k * MSG, rkey)
        assert st == e.IBV_WC_SUCCESS, f"WRITE {k}: status {st}"
    first = time.monotonic() - t0
    send(sock, {"step": "written"})
    assert next(peer)["step"] == "checked"
    t0 = time.monotonic()
    for k in range(BUF // MSG):
        c.mr.write(bytes(MSG), MSG)
        st = c.rdma(e.IBV_WR_RDMA_READ, base + k * MSG, rkey)
        assert st == e.IBV_WC_SUCCESS, f"READ {k}: status {st}"
        if c.mr.read(MSG, 0) != pattern(MSG, 3):
            raise AssertionError(f"READ {k} brought back other bytes")
    ok("read", f" first-touch WRITEs {first:.2f} s, READs {time.monotonic() - t0:.2f} s")
    send(sock, {"step": "read"})

    assert next(peer)["step"] == "dropped"
    c.mr.write(pattern(MSG, 9), MSG)
    st = c.rdma(e.IBV_WR_RDMA_WRITE, base, rkey)
    assert st == e.IBV_WC_SUCCESS, f"WRITE after the pages were dropped: status {st}"
    send(sock, {"step": "rewritten"})

    # Past the end of the MR: the key does not reach there.
    st = conns[1].rdma(e.IBV_WR_RDMA_WRITE, base + BUF, rkey, length=4096)
    assert st == e.IBV_WC_REM_ACCESS_ERR, f"WRITE past the MR: status {st}"
    ok("outside")

    assert next(peer)["step"] == "unmapped"
    t0 = time.monotonic()
    st = conns[2].rdma(e.IBV_WR_RDMA_WRITE, base + BUF - MSG, rkey)
    waited = time.monotonic() - t0
    assert st == e.IBV_WC_REM_OP_ERR, f"WRITE where the process has no memory: status {st}"
    c.mr.write(pattern(MSG, 11), MSG)
    st = c.rdma(e.IBV_WR_RDMA_WRITE, base + 2 * MSG, rkey)
    assert st == e.IBV_WC_SUCCESS, f"WRITE into the mapped part afterwards: status {st}"
    ok("timeout", f" after {waited:.1f} s")
    send(sock, {"step": "unanswered"})

    m = next(peer)
    assert m["step"] == "implicit"
    c.mr.write(pattern(MSG, 13), MSG)
    st = c.rdma(e.IBV_WR_RDMA_WRITE, m["addr"], m["rkey"])
    assert st == e.IBV_WC_SUCCESS, f"WRITE through the implicit MR: status {st}"
    send(sock, {"step": "implicit-written"})

    m = next(peer)
    assert m["step"] == "prefetched"
    conns[3].mr.write(pattern(MSG, 15), MSG)
    st = conns[3].rdma(e.IBV_WR_RDMA_WRITE, m["addr"], m["rkey"])
    assert st == e.IBV_WC_SUCCESS, f"WRITE into prefetched pages: status {st}"
    send(sock, {"step": "prefetch-written"})
    assert next(peer)["step"] == "done"
    ok("initiator")


if __name__ == "__main__":
    if sys.argv[1] == "target":
        target(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        initiator(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
