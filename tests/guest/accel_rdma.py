"""RDMA into an emulated accelerator's memory, run inside two guests by
test_accel.py: GPU Direct RDMA's shape without a GPU.

  python3 accel_rdma.py target DEV GIDX PORT
  python3 accel_rdma.py initiator DEV GIDX PEER_IP PORT

The target allocates a buffer in /dev/vstellar-accel0's memory (a dmabuf),
registers it with ibv_reg_dmabuf_mr (pyverbs DmaBufMR) and offers it to the
initiator, whose RDMA WRITEs put a pattern there and whose RDMA READs take
it back; the target checks every byte through the dmabuf's CPU mapping.
Then the target moves the buffer (VSTELLAR_ACCEL_IOC_MOVE: the exporter's
move_notify invalidates the MR), gives the old range to a new zeroed
buffer, and the initiator's WRITE and READ through the old rkey must fail
with a remote access error while the new buffer stays zero; the moved
buffer, registered again, takes WRITEs once more. Last, registrations that
must fail: a file that is not a dmabuf, an fd that is not open, a range
past the buffer's end, and NCCL's probe for DMA-BUF support (which wants
any error but EOPNOTSUPP). Each step prints "accel-<step> ok" or raises.

The two sides talk over TCP (one JSON line each way per step; rdma_pair.py).
"""
import errno
import fcntl
import mmap
import os
import struct
import sys

import pyverbs.enums as e
from pyverbs.device import Context
from pyverbs.mr import DmaBufMR
from pyverbs.pd import PD

from rdma_pair import REMOTE, Conn, initiator_side, lines, must_fail, pattern, send, serve

# include/vstellar/vstellar-accel-abi.h
_IOC_WRITE, _IOC_READ = 1, 2


def _ioc(d, nr, size):
    return (d << 30) | (size << 16) | (ord("V") << 8) | nr


IOC_ALLOC = _ioc(_IOC_READ | _IOC_WRITE, 0x41, 16)
IOC_QUERY = _ioc(_IOC_READ | _IOC_WRITE, 0x42, 24)
IOC_MOVE = _ioc(_IOC_READ | _IOC_WRITE, 0x43, 24)

BUF = 4 << 20          # the accelerator buffer
MSG = 1 << 20          # one WRITE / READ
class Accel:
    def __init__(self, path="/dev/vstellar-accel0"):
        self.fd = os.open(path, os.O_RDWR)

    def alloc(self, size):
        a = bytearray(struct.pack("QIi", size, 0, -1))
        fcntl.ioctl(self.fd, IOC_ALLOC, a)
        return struct.unpack("QIi", a)[2]

    def _buf(self, req, dmabuf):
        a = bytearray(struct.pack("iIQQ", dmabuf, 0, 0, 0))
        fcntl.ioctl(self.fd, req, a)
        return struct.unpack("iIQQ", a)[2]

    def offset(self, dmabuf):
        return self._buf(IOC_QUERY, dmabuf)

    def move(self, dmabuf):
        return self._buf(IOC_MOVE, dmabuf)


def target(dev, gidx, port):
    ctx = Context(name=dev)
    pd = PD(ctx)
    accel = Accel()
    conns = [Conn(ctx, pd, gidx, MSG) for _ in range(3)]
    buf = accel.alloc(BUF)
    cpu = mmap.mmap(buf, BUF)
    mr = DmaBufMR(pd, BUF, REMOTE, dmabuf=buf, offset=0)
    print(f"accel-buffer offset {accel.offset(buf):#x} rkey {mr.rkey:#x}", flush=True)
    sock = serve(port)
    peer = lines(sock)
    send(sock, {"conns": [c.me() for c in conns], "rkey": mr.rkey, "addr": 0})
    hello = next(peer)
    for c, p in zip(conns, hello["conns"]):
        c.connect(p)
    send(sock, {"step": "connected"})

    # 1. WRITEs and READs between the initiator's RAM and our device memory.
    assert next(peer)["step"] == "written"
    want = pattern(MSG, 3)
    for k in range(BUF // MSG):
        if cpu[k * MSG:(k + 1) * MSG] != want:
            raise AssertionError(f"accelerator memory differs from the WRITE at MiB {k}")
    print("accel-write ok", flush=True)
    send(sock, {"step": "checked"})
    assert next(peer)["step"] == "read"

    # 2. The exporter moves the buffer: the MR must reach nothing any more.
    old = accel.offset(buf)
    new = accel.move(buf)
    assert new != old, (old, new)
    other = accel.alloc(BUF)
    assert accel.offset(other) == old, "first fit should reuse the old range"
    other_cpu = mmap.mmap(other, BUF)
    assert cpu[0:MSG] == want, "contents did not follow the moved buffer"
    print(f"accel-rdma-move ok {old:#x} -> {new:#x}", flush=True)
    send(sock, {"step": "moved"})
    assert next(peer)["step"] == "stale-tried"
    if other_cpu[0:BUF] != bytes(BUF):
        raise AssertionError("a WRITE through the invalidated MR reached the old range")
    print("accel-stale ok", flush=True)

    # 3. The moved buffer registered again works.
    mr2 = DmaBufMR(pd, BUF, REMOTE, dmabuf=buf, offset=0)
    send(sock, {"step": "registered", "rkey": mr2.rkey})
    assert next(peer)["step"] == "rewritten"
    if cpu[0:MSG] != pattern(MSG, 9):
        raise AssertionError("the WRITE after registering the moved buffer again did not land")
    print("accel-reregister ok", flush=True)

    # 4. Registrations that must fail, and the device still works after.
    with open("/proc/self/exe", "rb") as f:
        must_fail("a file that is not a dmabuf", errno.EINVAL,
                  lambda: DmaBufMR(pd, 4096, REMOTE, dmabuf=f.fileno(), offset=0))
    closed = os.dup(buf)
    os.close(closed)
    must_fail("an fd that is not open", errno.EBADF,
              lambda: DmaBufMR(pd, 4096, REMOTE, dmabuf=closed, offset=0))
    must_fail("a range past the buffer's end", errno.EINVAL,
              lambda: DmaBufMR(pd, BUF, REMOTE, dmabuf=buf, offset=4096))
    # NCCL's probe (net_ib gdr.cc): fd -1, length 0; anything but
    # EOPNOTSUPP/EPROTONOSUPPORT tells it DMA-BUF registration is there.
    must_fail("NCCL's DMA-BUF probe", errno.EINVAL, lambda: DmaBufMR(pd, 0, 0, dmabuf=-1, offset=0))
    print("accel-refused ok", flush=True)
    send(sock, {"step": "done"})
    mr2.close()
    mr.close()
    other_cpu.close()
    cpu.close()


def initiator(dev, gidx, peer_ip, port):
    ctx = Context(name=dev)
    pd = PD(ctx)
    conns, peer, hello, sock = initiator_side(ctx, pd, gidx, peer_ip, port, 3, MSG)
    rkey = hello["rkey"]

    c = conns[0]
    c.mr.write(pattern(MSG, 3), MSG)
    for k in range(BUF // MSG):
        st = c.rdma(e.IBV_WR_RDMA_WRITE, k * MSG, rkey)
        assert st == e.IBV_WC_SUCCESS, f"WRITE {k}: status {st}"
    send(sock, {"step": "written"})
    assert next(peer)["step"] == "checked"
    for k in range(BUF // MSG):
        c.mr.write(bytes(MSG), MSG)
        st = c.rdma(e.IBV_WR_RDMA_READ, k * MSG, rkey)
        assert st == e.IBV_WC_SUCCESS, f"READ {k}: status {st}"
        if c.mr.read(MSG, 0) != pattern(MSG, 3):
            raise AssertionError(f"READ {k} brought back other bytes")
    print("accel-read ok", flush=True)
    send(sock, {"step": "read"})

    assert next(peer)["step"] == "moved"
    # An RC QP that got a remote access error is in the error state: one each.
    c.mr.write(pattern(MSG, 5), MSG)
    st = conns[0].rdma(e.IBV_WR_RDMA_WRITE, 0, rkey)
    assert st == e.IBV_WC_REM_ACCESS_ERR, f"WRITE through the invalidated MR: status {st}"
    st = conns[1].rdma(e.IBV_WR_RDMA_READ, 0, rkey)
    assert st == e.IBV_WC_REM_ACCESS_ERR, f"READ through the invalidated MR: status {st}"
    print("accel-invalidated ok", flush=True)
    send(sock, {"step": "stale-tried"})

    m = next(peer)
    assert m["step"] == "registered"
    conns[2].mr.write(pattern(MSG, 9), MSG)
    st = conns[2].rdma(e.IBV_WR_RDMA_WRITE, 0, m["rkey"])
    assert st == e.IBV_WC_SUCCESS, f"WRITE into the moved buffer registered again: status {st}"
    send(sock, {"step": "rewritten"})
    assert next(peer)["step"] == "done"
    print("accel-initiator ok", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "target":
        target(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        initiator(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
