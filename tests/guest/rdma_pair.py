"""Two processes in two guests with RC QPs between them, for the guest
tests' RDMA scripts (accel_rdma.py, odp_rdma.py): the connections, a
pattern to write and check, and the one-JSON-line-per-step TCP talk.
"""
import json
import socket
import time

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GID, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

REMOTE = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
          e.IBV_ACCESS_REMOTE_READ)


def pattern(n, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(256)) * (n // 256)


class Conn:
    """One RC QP on DEV, its CQ, and a staging MR of `size` bytes in RAM."""

    def __init__(self, ctx, pd, gidx, size):
        self.ctx, self.pd, self.gidx = ctx, pd, gidx
        self.cq = CQ(ctx, 32)
        cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        self.size = size
        self.mr = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE)

    def me(self):
        return {"qpn": self.qp.qp_num, "gid": str(self.ctx.query_gid(1, self.gidx))}

    def connect(self, peer):
        attr = QPAttr(port_num=1, path_mtu=e.IBV_MTU_1024)
        attr.qp_access_flags = REMOTE
        attr.max_dest_rd_atomic = 4
        attr.max_rd_atomic = 4
        attr.min_rnr_timer = 12
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.dest_qp_num = peer["qpn"]
        attr.rq_psn = attr.sq_psn = 0
        gr = GlobalRoute(dgid=GID(peer["gid"]), sgid_index=self.gidx)
        attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=gr)
        self.qp.to_rts(attr)

    def rdma(self, opcode, addr, rkey, length=None, timeout=60):
        """One signalled WRITE or READ from/into the staging MR; returns
        the completion status."""
        wr = SendWR(opcode=opcode, num_sge=1, sg=[SGE(self.mr.buf, length or self.size, self.mr.lkey)])
        wr.set_wr_rdma(rkey, addr)
        self.qp.post_send(wr)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            n, wcs = self.cq.poll()
            if n:
                return wcs[0].status
        raise TimeoutError("no completion")


def lines(sock):
    f = sock.makefile("r")
    for line in f:
        yield json.loads(line)


def send(sock, obj):
    sock.sendall((json.dumps(obj) + "\n").encode())


def serve(port):
    """The target's end: waits for the initiator."""
    srv = socket.create_server(("0.0.0.0", port))
    sock, _ = srv.accept()
    return sock


def dial(peer_ip, port):
    """The initiator's end: the target may not listen yet."""
    for _ in range(600):
        try:
            sock = socket.create_connection((peer_ip, port), timeout=1)
            sock.settimeout(None)
            return sock
        except OSError:
            time.sleep(0.1)
    raise ConnectionError("target never listened")


def initiator_side(ctx, pd, gidx, peer_ip, port, nconns, size):
    """The initiator's start: nconns connections, each to its counterpart
    the target offered in its first line. Returns (conns, the target's
    line stream, its first line, the socket)."""
    conns = [Conn(ctx, pd, gidx, size) for _ in range(nconns)]
    sock = dial(peer_ip, port)
    peer = lines(sock)
    hello = next(peer)
    send(sock, {"conns": [c.me() for c in conns]})
    for c, p in zip(conns, hello["conns"]):
        c.connect(p)
    assert next(peer)["step"] == "connected"
    return conns, peer, hello, sock


def must_fail(what, want_errno, fn):
    try:
        fn()
    except PyverbsRDMAError as err:
        if err.error_code != want_errno:
            raise AssertionError(f"{what}: errno {err.error_code}, want {want_errno}") from err
        return
    raise AssertionError(f"{what}: registered")
