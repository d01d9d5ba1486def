#!/usr/bin/env python3
"""Writes the seed corpora in tests/fuzz/corpus/<target>/: a handful of small
valid inputs per fuzz target, so that the fuzzer starts past the parsers'
first checks. The files are committed; rerun this after changing an input
format (python3 tests/fuzz/make_seeds.py)."""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "python"))  # run by hand, not through tools/python/run
from vstellar import pcap  # noqa: E402


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- wire: records ctl(1) len(2 BE) packet; see fuzz_wire.cc ----
SEND, SEND_IMM, WRITE, WRITE_IMM, READ_REQ, READ_RESP = 1, 2, 3, 4, 5, 6
CMP_SWAP, FETCH_ADD, ATOMIC_RESP, ACK, UD_SEND = 7, 8, 9, 10, 11
F_FIRST, F_LAST = 1, 2
TO_QP, TO_MR, RUN = 2, 4, 16
PSN = 1000  # both QPs start at PSN 1000 in the fuzz fixture


def base(op, psn=PSN, flags=F_FIRST | F_LAST, payload=0):
    # version<<4, op, flags, dst_qpn, src_qpn (patched), psn, path, payload_len, ts
    return struct.pack(">BBHIIIHHI", 1 << 4, op, flags, 0, 0, psn, 0, payload, 0)


def data_pkt(op, payload, va=0, msg_off=0, msg_len=None, rsn=0, psn=PSN, flags=F_FIRST | F_LAST):
    msg_len = len(payload) if msg_len is None else msg_len
    ext = struct.pack(">QIIIIII", va, 0, msg_off, msg_len, rsn, 0, 0)
    return base(op, psn, flags, len(payload)) + ext + payload


def read_req(va, length, psn=PSN):
    return base(READ_REQ, psn) + struct.pack(">QIIIHH", va, 0, length, 0, 1024, 0)


def atomic(op, va, swap, compare=0, psn=PSN):
    return base(op, psn) + struct.pack(">QIIQQ", va, 0, 0, swap, compare)


def ack(cum, sack_words=(), syndrome=0):
    ext = struct.pack(">IIBBHIHHII", cum, cum, len(sack_words), syndrome, 0, 0, 0, 1, cum, 0)
    return base(ACK, payload=0) + ext + b"".join(struct.pack(">Q", w) for w in sack_words)


def rec(ctl, pkt):
    return struct.pack(">BH", ctl, len(pkt)) + pkt


def wire():
    w = TO_QP | TO_MR | RUN
    write("wire", "write", rec(w, data_pkt(WRITE, b"\x11" * 64, va=128)))
    write("wire", "write_two_packets",
          rec(w, data_pkt(WRITE, b"\x22" * 32, va=0, msg_len=64, flags=F_FIRST)) +
          rec(w, data_pkt(WRITE, b"\x33" * 32, va=0, msg_off=32, msg_len=64, psn=PSN + 1,
                          flags=F_LAST)))
    write("wire", "read", rec(w, read_req(256, 4096)))
    write("wire", "atomics", rec(w, atomic(FETCH_ADD, 8, 5)) +
          rec(w, atomic(CMP_SWAP, 16, 7, 0, psn=PSN + 1)))
    write("wire", "send_no_recv", rec(TO_QP | RUN, data_pkt(SEND, b"hello")))
    write("wire", "ack_sack", rec(TO_QP | RUN | 1, ack(PSN, (0x5,))))
    write("wire", "nak", rec(TO_QP | RUN | 1, ack(PSN, (), syndrome=3)))
    write("wire", "read_resp_unasked",
          rec(TO_QP | RUN | 1, base(READ_RESP, payload=8) + struct.pack(">II", 0, 0) + b"x" * 8))
    ud = base(UD_SEND, payload=4) + struct.pack(">IIIBBH", 0x80010000, 0, 0, 0, 64, 0) + \
        bytes(32) + b"abcd"
    write("wire", "ud", rec(RUN, ud))


wire()


# ---- commands: records type(1) len(2 LE) bytes; see fuzz_commands.cc ----
QUERY_DEVICE, QUERY_PORT, ALLOC_UCONTEXT, DEALLOC_UCONTEXT, ALLOC_PD, DEALLOC_PD = 1, 2, 3, 4, 5, 6
CREATE_CQ, RESIZE_CQ, DESTROY_CQ, REQ_NOTIFY_CQ, CREATE_QP, MODIFY_QP = 7, 8, 9, 10, 11, 12
QUERY_QP, DESTROY_QP, REG_MR, DEREG_MR, ADD_GID = 13, 14, 15, 16, 17
KERNEL_DB, ALLOC_MR, ALLOC_MW, DEALLOC_MW = 0x15, 0x1a, 0x1b, 0x1c
WR_LOCAL_INV, WR_SEND_WITH_INV, WR_REG_MR, WR_BIND_MW = 7, 8, 9, 10


def cmd(op, body=b"", uctx=0):
    req = struct.pack("<HHIII", op, 0, 7, uctx, len(body)) + body
    return struct.pack("<BH", 0, len(req)) + req


def ram(gpa, data):
    payload = struct.pack("<I", gpa) + data
    return struct.pack("<BH", 1, len(payload)) + payload


def pages(*gpas):
    return b"".join(struct.pack("<Q", g) for g in gpas)


def commands():
    handle = lambda h: struct.pack("<II", h, 0)
    write("commands", "query", cmd(QUERY_DEVICE) + cmd(QUERY_PORT, struct.pack("<II", 1, 0)))
    write("commands", "pd", cmd(ALLOC_PD) + cmd(DEALLOC_PD, handle(1)))
    write("commands", "ucontext", cmd(ALLOC_UCONTEXT) + cmd(ALLOC_PD, uctx=1) +
          cmd(DEALLOC_UCONTEXT, handle(1)))
    # A CQ of 64 CQEs in the page at 1 MiB, then destroyed.
    cq = struct.pack("<IIIIQ", 6, 0, 12, 1, 0) + pages(1 << 20)
    write("commands", "cq", cmd(CREATE_CQ, cq) + cmd(REQ_NOTIFY_CQ, struct.pack("<II", 1, 0)) +
          cmd(DESTROY_CQ, handle(1)))
    # An MR over two pages given by a page list.
    mr = struct.pack("<IIQQII", 1, 0x7, 0x10000, 8192, 12, 2) + pages(2 << 20, (2 << 20) + 4096)
    write("commands", "mr", cmd(ALLOC_PD) + cmd(REG_MR, mr) + cmd(DEREG_MR, handle(1)))
    # An RC QP: PD, two CQs, rings of 16 WQEs (stride 2^7 SQ, 2^5 RQ) in one page each.
    qp = struct.pack("<IIIBBBBBBBBIIIIIQQ", 1, 1, 2, 2, 0, 4, 7, 4, 5, 12, 0,
                     1, 1, 0, 1, 1, 0, 0) + pages(3 << 20, (3 << 20) + 4096)
    write("commands", "qp", cmd(ALLOC_PD) + cmd(CREATE_CQ, cq) +
          cmd(CREATE_CQ, struct.pack("<IIIIQ", 6, 0, 12, 1, 0) + pages((1 << 20) + 4096)) +
          cmd(CREATE_QP, qp) + cmd(QUERY_QP, handle(1)) + cmd(DESTROY_QP, handle(1)))
    write("commands", "gid", cmd(ADD_GID, bytes(32)))
    write("commands", "ram_then_bad", ram(4096, b"\xff" * 64) + cmd(0x7f) + cmd(QUERY_DEVICE, b"x"))


commands()


# ---- vhost_user: records ctl(1) len(2 LE) bytes; see fuzz_vhost_user.cc ----
GET_FEATURES, SET_FEATURES, SET_OWNER, SET_MEM_TABLE = 1, 2, 3, 5
SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE, GET_VRING_BASE = 8, 9, 10, 11
SET_VRING_KICK, SET_VRING_CALL = 12, 13
GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES, GET_QUEUE_NUM, SET_VRING_ENABLE = 15, 16, 17, 18
GET_CONFIG = 24
VERSION = 1


def vmsg(req, payload=b"", flags=VERSION):
    return struct.pack("<III", req, flags, len(payload)) + payload


def chunk(data, nfds=0, doorbell=False, sparse_log=None):
    # sparse_log: the memfds are sparse, of 2^sparse_log bytes (20 + 3k)
    ctl = nfds | (4 if doorbell else 0)
    if sparse_log is not None:
        ctl |= 8 | ((sparse_log - 20) // 3) << 4
    return struct.pack("<BH", ctl, len(data)) + data


def vhost_user():
    u64 = lambda v: struct.pack("<Q", v)
    hello = (vmsg(GET_FEATURES) + vmsg(SET_FEATURES, u64(1 << 32 | 1 << 30)) +
             vmsg(GET_PROTOCOL_FEATURES) + vmsg(SET_PROTOCOL_FEATURES, u64(0)) + vmsg(SET_OWNER))
    write("vhost_user", "handshake", chunk(hello))
    # One 64 KiB RAM region at GPA 0 (its memfd rides along), then ring 0.
    table = struct.pack("<II", 1, 0) + struct.pack("<QQQQ", 0, 64 << 10, 0x7f0000000000, 0)
    base = 0x7f0000000000
    ring = (vmsg(SET_VRING_NUM, struct.pack("<II", 0, 64)) +
            vmsg(SET_VRING_ADDR, struct.pack("<IIQQQQ", 0, 0, base, base + 0x2000, base + 0x1000, 0)) +
            vmsg(SET_VRING_BASE, struct.pack("<II", 0, 0)) +
            vmsg(SET_VRING_ENABLE, struct.pack("<II", 0, 1)) +
            vmsg(GET_VRING_BASE, struct.pack("<II", 0, 0)))
    write("vhost_user", "memory_and_ring",
          chunk(hello) + chunk(vmsg(SET_MEM_TABLE, table), nfds=1) + chunk(ring))
    # A frontend that lies: one region of 2^59 bytes on a sparse memfd, then
    # three of 32 TiB; the daemon must refuse the table, not try to pin it
    # (--guest-memory-limit).
    huge = struct.pack("<II", 1, 0) + struct.pack("<QQQQ", 0, 1 << 59, 0x7f0000000000, 0)
    write("vhost_user", "huge_region", chunk(hello) + chunk(vmsg(SET_MEM_TABLE, huge), nfds=1, sparse_log=59))
    six = struct.pack("<II", 3, 0) + b"".join(
        struct.pack("<QQQQ", i << 45, 1 << 45, (i + 1) << 46, 0) for i in range(3))
    write("vhost_user", "huge_regions", chunk(hello) + chunk(vmsg(SET_MEM_TABLE, six), nfds=3, sparse_log=50))
    kick = vmsg(SET_VRING_KICK, u64(0))
    write("vhost_user", "kick_fd", chunk(hello) + chunk(kick, nfds=1))
    write("vhost_user", "config", chunk(hello + vmsg(GET_QUEUE_NUM) +
                                        vmsg(GET_CONFIG, struct.pack("<III", 0, 16, 0) + bytes(16))))
    # A message split in three reads: header in two parts, then the payload.
    m = vmsg(SET_FEATURES, u64(1 << 32))
    write("vhost_user", "split", chunk(m[:5]) + chunk(m[5:12]) + chunk(m[12:]))
    write("vhost_user", "need_reply", chunk(vmsg(SET_OWNER, flags=VERSION | 8)))


vhost_user()


# ---- datapath: records type(1) len(2 LE) bytes; see fuzz_datapath.cc ----
def datapath():
    def rec(t, data):
        return struct.pack("<BH", t, len(data)) + data
    kick = rec(3, b"")
    handle = lambda h: struct.pack("<II", h, 0)
    # Every commands seed, with a kick after it.
    for name in sorted(os.listdir(os.path.join(HERE, "corpus", "commands"))):
        with open(os.path.join(HERE, "corpus", "commands", name), "rb") as f:
            write("datapath", "cmds_" + name, f.read() + kick)
    # A user context, its PD, two CQs, an RC QP with its rings in RAM, an
    # MR; a send WQE in the SQ and sq_pi = 1 in QP slots 8..15 of doorbell
    # page 0 and 1; a receive WQE and rq_pi = 1 likewise.
    cq = lambda gpa: struct.pack("<IIIIQ", 6, 0, 12, 1, 0) + pages(gpa)
    # Handles: context 1, PD 2, CQs 3 and 4 (one counter for all objects).
    qp = struct.pack("<IIIBBBBBBBBIIIIIQQ", 2, 3, 4, 2, 0, 4, 7, 4, 5, 12, 0,
                     1, 1, 0, 1, 1, 0, 0) + pages(3 << 20, (3 << 20) + 4096)
    mr = struct.pack("<IIQQII", 2, 0x7, 0x10000, 8192, 12, 2) + pages(2 << 20, (2 << 20) + 4096)
    # MODIFY_QP to INIT (state, access, pkey index, port); the QPN is what
    # the fuzz fixture's fixed QPN sequence gives the first QP.
    attr = struct.pack("<IBBBBIIIIIHBBBBBBI", 0x39, 1, 0, 0, 1, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0)
    to_init = struct.pack("<II", 0xb2ce68, 0) + attr + bytes(32)
    setup = (cmd(ALLOC_UCONTEXT) + cmd(ALLOC_PD, uctx=1) + cmd(CREATE_CQ, cq(1 << 20), uctx=1) +
             cmd(CREATE_CQ, cq((1 << 20) + 4096), uctx=1) + cmd(CREATE_QP, qp, uctx=1) +
             cmd(REG_MR, mr, uctx=1) + cmd(MODIFY_QP, to_init, uctx=1))
    send_wqe = struct.pack("<QBBBBIII", 0x1234, 0, 1, 1, 0, 0, 0, 0) + bytes(32) + \
        struct.pack("<QII", 0x10000, 64, 0)
    recv_wqe = struct.pack("<QBBBBIII", 0x5678, 0, 0, 1, 0, 0, 0, 0) + struct.pack("<QII", 0x10000, 64, 0)
    doorbells = b"".join(rec(2, struct.pack("<I", page * 4096 + slot * 8) + struct.pack("<II", 1, 1))
                         for page in (0, 1) for slot in range(8, 16))
    write("datapath", "send_recv", setup + rec(1, struct.pack("<I", 3 << 20) + send_wqe) +
          rec(1, struct.pack("<I", (3 << 20) + 4096) + recv_wqe) + doorbells + kick)
    write("datapath", "kick_only", doorbells + kick)

    # Memory keys (minor 3): the kernel's doorbell page, a kernel PD, two
    # CQs, a kernel RC QP taken to RTS, a fast-registration MR, an MR with
    # MW_BIND and a type 2 window; then REG_MR, BIND_MW, two LOCAL_INVs and
    # a SEND_WITH_INV in the SQ. Keys follow the fixture's fixed key
    # sequence (EngineConfig::key_seed 1): the kernel PD's DMA MR takes the
    # first, then ALLOC_MR, REG_MR and ALLOC_MW.
    keys = []
    state = 1
    while len(keys) < 4:
        state = (state + 0x9E3779B97F4A7C15) & (2**64 - 1)
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        z ^= z >> 31
        index = (z >> 8) & 0xFFFFFF
        if index and index not in [k >> 8 for k in keys]:
            keys.append(index << 8 | (z & 0xFF))
    fr_key, bind_lkey, mw_rkey = keys[1], keys[2], keys[3]
    bump = lambda k: (k & ~0xFF) | ((k + 1) & 0xFF)
    kqp = struct.pack("<IIIBBBBBBBBIIIIIQQ", 1, 2, 3, 2, 0, 4, 7, 4, 5, 12, 0,
                      1, 1, 0, 1, 1, 0, 0) + pages(3 << 20, (3 << 20) + 4096)

    def modify(mask, state, **kw):
        a = struct.pack("<IBBBBIIIIIHBBBBBBI", mask, state, 0, kw.get("mtu", 0), 1, 0, 0, 0,
                        kw.get("dest", 0), 7, 0, 4, 4, 0, 14, 7, 7, 0)
        av = bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 2]) + bytes(4) + bytes([0, 64, 0, 0]) + bytes(8)
        return struct.pack("<II", 0xb2ce68, 0) + a + av
    ksetup = (cmd(KERNEL_DB) + cmd(ALLOC_PD) + cmd(CREATE_CQ, cq(1 << 20)) +
              cmd(CREATE_CQ, cq((1 << 20) + 4096)) + cmd(CREATE_QP, kqp) +
              cmd(MODIFY_QP, modify(0x39, 1)) +
              cmd(MODIFY_QP, modify(0x129181, 2, mtu=3, dest=0x123456)) +
              cmd(MODIFY_QP, modify(0x12E01, 3)) +
              cmd(ALLOC_MR, struct.pack("<IIII", 1, 4, 0, 0)) +
              cmd(REG_MR, struct.pack("<IIQQII", 1, 0x17, 0x10000, 8192, 12, 2) +
                  pages(2 << 20, (2 << 20) + 4096)) +
              cmd(ALLOC_MW, struct.pack("<II", 1, 2)))
    hdr = lambda wr_id, op, inv=0: struct.pack("<QBBBBIII", wr_id, op, 1, 0, 0, 0, inv, 0)
    plist = (2 << 20) + 0x8000
    wqes = [
        hdr(1, WR_REG_MR) + struct.pack("<QQQIIIB3x", 0x7f0000001000, 8000, plist, 2, bump(fr_key), 7, 12),
        hdr(2, WR_BIND_MW) + struct.pack("<QQIIIIB7x", 0x10000, 4096, mw_rkey, bump(mw_rkey),
                                          bind_lkey, 4, 2),
        hdr(3, WR_LOCAL_INV, bump(mw_rkey)) + bytes(40),
        hdr(4, WR_LOCAL_INV, bump(fr_key)) + bytes(40),
        hdr(5, WR_SEND_WITH_INV, 0x1234500) + bytes(40),
    ]
    ring = b"".join(w + bytes(128 - len(w)) for w in wqes)
    # The kernel's page is page 0; the CQs took slots 8 and 9, the QP 10.
    kdoorbells = rec(2, struct.pack("<I", 10 * 8) + struct.pack("<II", 5, 0))
    write("datapath", "keys", ksetup + rec(1, struct.pack("<I", plist) + pages((1 << 20) + 0x10000, (1 << 20) + 0x11000)) +
          rec(1, struct.pack("<I", 3 << 20) + ring) + kdoorbells + kick)


datapath()


# ---- roce_wire: flags(1) UDP payload; see fuzz_roce_wire.cc ----
def rxe_packets():
    """(UDP payload, is IPv6) of every RoCE v2 packet in the capture of rxe
    (tests/engine/data/rxe-rocev2.pcap, classic pcap, Ethernet)."""
    out = []
    for frame in pcap.frames(os.path.join(HERE, "..", "engine", "data", "rxe-rocev2.pcap")):
        ethertype = struct.unpack(">H", frame[12:14])[0]
        if ethertype == 0x0800:
            udp, v6 = 14 + (frame[14] & 0x0f) * 4, False
        elif ethertype == 0x86dd:
            udp, v6 = 14 + 40, True
        else:
            continue
        udp_len = struct.unpack(">H", frame[udp + 4:udp + 6])[0]
        out.append((frame[udp + 8:udp + udp_len], v6))
    return out


def roce_wire():
    """One packet per opcode from the capture of rxe's RoCE v2
    (tests/engine/data/rxe-rocev2.pcap, classic pcap, Ethernet), with flag 2
    (the fuzz target fixes the ICRC up for its own addresses) and flag 1 for
    IPv6 ones."""
    seen = set()
    for payload, v6 in rxe_packets():
        key = (payload[0], v6)
        if key in seen:
            continue
        seen.add(key)
        write("roce_wire", f"op{payload[0]:02x}{'-v6' if v6 else ''}", bytes([2 | v6]) + payload)


roce_wire()


# ---- roce_engine: records ctl(1) len(2 BE) UDP payload; see fuzz_roce_engine.cc ----
def roce_engine():
    """rxe's IPv4 packets aimed at the fixture's QP (and MR, where a RETH or
    AtomicETH names one): one seed per opcode, and one with the capture's
    first 64 packets in a row, so that multi-packet messages and their
    answers are in the corpus."""
    with_key = {0x06, 0x0a, 0x0b, 0x0c, 0x13, 0x14}
    packets = [p for p, v6 in rxe_packets() if not v6]

    def record(p):
        ctl = TO_QP | RUN | (TO_MR if p[0] in with_key else 0)
        return bytes([ctl]) + struct.pack(">H", len(p)) + p

    seen = set()
    for p in packets:
        if p[0] not in seen:
            seen.add(p[0])
            write("roce_engine", f"op{p[0]:02x}", record(p))
    write("roce_engine", "first64", b"".join(record(p) for p in packets[:64]))


roce_engine()


# ---- engine_state: records off(2 BE) byte(1) editing a saved engine state; see fuzz_engine_state.cc ----
def engine_state():
    """The state as saved (the empty input) and the state cut in half; the
    target builds the state itself, so the edits start from a valid one."""
    write("engine_state", "intact", b"")
    write("engine_state", "cut_half", bytes([0x80]))


engine_state()
