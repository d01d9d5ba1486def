"""RDMA that keeps running while one of the two guests is live-migrated
(tests/guest/test_migration.py).

  python3 migrate_rdma.py target DEV GIDX PORT
  python3 migrate_rdma.py initiator DEV GIDX PEER_IP PORT SECONDS [STOP_FILE]

One RC QP each way of the pair. For SECONDS, or until STOP_FILE exists,
the initiator loops: an RDMA
WRITE of 64 KiB with a pattern of its own into the target's MR, a READ of
it back, checked byte for byte, and a SEND of a sequence number that the
target checks arrives once and in order. Any completion that is not a
success, any byte that differs, and any sequence number missing or twice
ends the run with an error. It prints "migrate-progress" once a second
(the host migrates a guest meanwhile) and at the end "migrate-traffic ok"
with the iterations and the longest gap between two completions (the
traffic gap a migration made). The target prints "migrate-target ok" with
the SENDs it received.
"""
import os
import select
import sys
import time

import pyverbs.enums as e
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.wr import RecvWR, SGE, SendWR

from rdma_pair import REMOTE, Conn, initiator_side, lines, pattern, send, serve

CHUNK = 64 << 10
SLOTS = 16
RECVS = 8
SEQ = 8  # bytes of a SEND: the sequence number


def wait(cq, timeout=60):
    """The next completion of cq (status checked by the caller)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        n, wcs = cq.poll()
        if n:
            return wcs[0]
    raise TimeoutError("no completion within %d s" % timeout)


def target(dev, gidx, port):
    ctx = Context(name=dev)
    pd = PD(ctx)
    c = Conn(ctx, pd, gidx, SEQ * RECVS)
    mr = MR(pd, CHUNK * SLOTS, REMOTE)
    sock = serve(port)
    peer = lines(sock)
    send(sock, {"conns": [c.me()], "addr": mr.buf, "rkey": mr.rkey})
    c.connect(next(peer)["conns"][0])
    for i in range(RECVS):
        c.qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(c.mr.buf + SEQ * i, SEQ, c.mr.lkey)]))
    send(sock, {"step": "connected"})
    got = 0
    # The initiator's SENDs until it says it is done (it waits for our
    # answer, so no SEND is in flight then). It says nothing else after
    # "connected", so a readable socket means that line.
    done = None
    while done is None:
        n, wcs = c.cq.poll()
        for wc in wcs[:n]:
            if wc.status != e.IBV_WC_SUCCESS:
                raise RuntimeError(f"receive {got}: status {wc.status}")
            seq = int.from_bytes(c.mr.read(SEQ, SEQ * wc.wr_id), "little")
            if seq != got:
                raise RuntimeError(f"SEND {seq} arrived where {got} was due")
            got += 1
            c.qp.post_recv(RecvWR(wr_id=wc.wr_id, num_sge=1,
                                  sg=[SGE(c.mr.buf + SEQ * wc.wr_id, SEQ, c.mr.lkey)]))
        if not n:
            if select.select([sock], [], [], 0.001)[0]:
                done = next(peer, None)
                if done is None:
                    raise RuntimeError("the initiator went away")
    if done.get("sends") != got:
        raise RuntimeError(f"{got} SENDs received, the initiator sent {done.get('sends')}")
    send(sock, {"step": "bye", "received": got})
    print(f"migrate-target ok received={got}", flush=True)


def initiator(dev, gidx, peer_ip, port, seconds, stop_file=None):
    ctx = Context(name=dev)
    pd = PD(ctx)
    conns, peer, hello, sock = initiator_side(ctx, pd, gidx, peer_ip, port, 1, CHUNK)
    c = conns[0]
    back = MR(pd, CHUNK, e.IBV_ACCESS_LOCAL_WRITE)
    seq = MR(pd, SEQ, e.IBV_ACCESS_LOCAL_WRITE)
    it = 0
    last = time.monotonic()
    gap = 0.0
    start = last
    shown = start

    def complete(what):
        nonlocal last, gap
        wc = wait(c.cq)
        if wc.status != e.IBV_WC_SUCCESS:
            raise RuntimeError(f"iteration {it}: {what} failed with status {wc.status}")
        now = time.monotonic()
        gap = max(gap, now - last)
        last = now

    # Until `seconds` have passed or stop_file exists (the host's word,
    # through the console, that it has migrated the guest enough).
    while time.monotonic() - start < seconds and not (stop_file and os.path.exists(stop_file)):
        slot = it % SLOTS
        data = pattern(CHUNK, it & 0xFF)
        c.mr.write(data, CHUNK)
        wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(c.mr.buf, CHUNK, c.mr.lkey)])
        wr.set_wr_rdma(hello["rkey"], hello["addr"] + CHUNK * slot)
        c.qp.post_send(wr)
        complete("WRITE")
        wr = SendWR(opcode=e.IBV_WR_RDMA_READ, num_sge=1, sg=[SGE(back.buf, CHUNK, back.lkey)])
        wr.set_wr_rdma(hello["rkey"], hello["addr"] + CHUNK * slot)
        c.qp.post_send(wr)
        complete("READ")
        if back.read(CHUNK, 0) != data:
            raise RuntimeError(f"iteration {it}: the READ did not return what was written")
        seq.write(it.to_bytes(SEQ, "little"), SEQ)
        c.qp.post_send(SendWR(opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(seq.buf, SEQ, seq.lkey)]))
        complete("SEND")
        it += 1
        if time.monotonic() - shown >= 1:
            shown = time.monotonic()
            print(f"migrate-progress iterations={it} max_gap_ms={gap * 1000:.0f}", flush=True)
    send(sock, {"step": "done", "sends": it})
    bye = next(peer)
    if bye.get("received") != it:
        raise RuntimeError(f"the target received {bye.get('received')} SENDs of {it}")
    print(f"migrate-traffic ok iterations={it} max_gap_ms={gap * 1000:.0f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "target":
        target(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        initiator(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), float(sys.argv[6]),
                  sys.argv[7] if len(sys.argv) > 7 else None)
