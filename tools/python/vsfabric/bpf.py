"""Tiny eBPF tc classifiers for the fabric's links: this kernel has no netem
and no ECN-marking qdisc (no red/codel/pie), so loss and CE marking are made
here.

* drop_program: drop UDP packets (IPv4 or IPv6) with a given probability.
* mark_program: a phantom queue (HULL, Alizadeh et al., NSDI 2012) that marks
  CE: a virtual queue per link, drained at a rate a bit below the link's, fed
  with every IPv4 packet's length; ECT packets that arrive while it holds more
  than K bytes are marked CE (bpf_skb_ecn_set_ce). Not-ECT packets and
  packets already CE are never touched, nothing is dropped. Its state and
  counters live in a one-entry BPF array map (read_marker).

The programs are assembled by hand (no clang needed), loaded with the bpf(2)
system call through ctypes, pinned into a private bpffs mount and attached
with `tc filter ... bpf object-pinned PATH da` on a clsact egress hook.
The drop program drops only UDP: the harness's TCP control connection, ARP and ICMP pass,
so a "black hole" eats the data path (the RDMA tunnels are all UDP) but the
out-of-band handshake survives.
"""
import ctypes
import os
import struct

BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_PROG_LOAD = 5
BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_MAP_TYPE_ARRAY = 2
BPF_PROG_TYPE_SCHED_CLS = 3
BPF_PSEUDO_MAP_FD = 1
# helpers
FN_MAP_LOOKUP_ELEM = 1
FN_KTIME_GET_NS = 5
FN_GET_PRANDOM_U32 = 7
FN_SKB_ECN_SET_CE = 97
NR_BPF = 321  # x86_64

_libc = ctypes.CDLL(None, use_errno=True)


def _insn(code, dst=0, src=0, off=0, imm=0):
    return struct.pack("<BBhI", code, (src << 4) | dst, off, imm & 0xffffffff)


def drop_program(prob):
    """Bytecode: drop UDP over IPv4 or IPv6 with probability prob (0..1),
    else TC_ACT_UNSPEC. An IPv6 packet is UDP when its first next header is
    (the engine's packets carry no extension headers)."""
    thr = min(1 << 32, max(0, int(round(prob * (1 << 32)))))
    prog = [
        _insn(0xbf, 6, 1),                 # r6 = r1 (ctx, for ld_abs)
        _insn(0x61, 0, 1, 16),             # r0 = skb->protocol
        ("jmp", 0x15, 0, 0, 0x0008, "v4"),  # if r0 == htons(ETH_P_IP) goto v4
        ("jmp", 0x55, 0, 0, 0xdd86, "pass"),  # if r0 != htons(ETH_P_IPV6) goto pass
        _insn(0x30, 0, 0, 0, 14 + 6),      # r0 = ip6->nexthdr (ld_abs b)
        ("jmp", 0x05, 0, 0, 0, "l4"),
        "v4",
        _insn(0x30, 0, 0, 0, 14 + 9),      # r0 = ip->protocol (ld_abs b)
        "l4",
        ("jmp", 0x55, 0, 0, 17, "pass"),   # if r0 != UDP goto pass
        _insn(0x85, 0, 0, 0, 7),           # call bpf_get_prandom_u32
        _insn(0x18, 1, 0, 0, thr & 0xffffffff),  # r1 = thr (ld_imm64, 2 slots)
        _insn(0x00, 0, 0, 0, thr >> 32),
        ("jmp", 0x3d, 0, 1, 0, "pass"),    # if r0 >= r1 goto pass
        _insn(0xb7, 0, 0, 0, 2),           # r0 = TC_ACT_SHOT
        _insn(0x95),                       # exit
        "pass",
        _insn(0xb7, 0, 0, 0, -1),          # r0 = TC_ACT_UNSPEC
        _insn(0x95),
    ]
    return _assemble(prog)


def _bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 128)
    r = _libc.syscall(NR_BPF, cmd, buf, 128)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bpf({cmd}): {os.strerror(e)}")
    return r


def _load(code):
    insns = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(65536)
    attr = struct.pack("<IIQQIIQI", BPF_PROG_TYPE_SCHED_CLS, len(code) // 8,
                       ctypes.addressof(insns), ctypes.addressof(lic),
                       1, len(log), ctypes.addressof(log), 0)
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror}: {log.value.decode(errors='replace')}")


def _pin(fd, path):
    p = ctypes.create_string_buffer(path.encode())
    _bpf(BPF_OBJ_PIN, struct.pack("<QI", ctypes.addressof(p), fd))


def load_and_pin(prob, path):
    """Load the drop program for prob and pin it at path."""
    fd = _load(drop_program(prob))
    try:
        _pin(fd, path)
    finally:
        os.close(fd)


# ---- phantom-queue CE marker --------------------------------------------------
# Map value (one entry, u64 each):
MARK_FIELDS = ("last_ns", "backlog", "pkts", "marked", "over_not_ect", "over", "bytes",
               "max_backlog", "over_ce")
_V = {n: 8 * i for i, n in enumerate(MARK_FIELDS)}
MAX_ELAPSED_NS = 1_000_000_000  # clamp, so elapsed * rate never overflows 64 bits


def _assemble(prog):
    """prog: list of instructions (bytes), label names (str) and jumps
    ("jmp", code, dst, src, imm, label). Returns the bytecode."""
    pos, n = {}, 0
    for x in prog:
        if isinstance(x, str):
            pos[x] = n
        else:
            n += 1
    out, n = [], 0
    for x in prog:
        if isinstance(x, str):
            continue
        if isinstance(x, tuple):
            _, code, dst, src, imm, label = x
            x = _insn(code, dst, src, pos[label] - n - 1, imm)
        out.append(x)
        n += 1
    return b"".join(out)


def mark_program(map_fd, rate_Bps, k_bytes, cap_bytes):
    """Bytecode: phantom queue drained at rate_Bps (bytes/s), CE mark above
    k_bytes, virtual backlog capped at cap_bytes. Always TC_ACT_UNSPEC (the
    packet continues: to the next filter, then the qdisc)."""
    rate = int(rate_Bps)
    if rate <= 0 or rate * MAX_ELAPSED_NS >= 1 << 63:
        raise ValueError(f"phantom queue rate {rate_Bps} B/s out of range")
    if not 0 < k_bytes < cap_bytes < 1 << 31:
        raise ValueError(f"need 0 < K ({k_bytes}) < cap ({cap_bytes}) < 2^31")

    def ld64(dst, imm, src=0):
        # the 2nd slot is a pseudo-instruction and is counted as one slot
        return [_insn(0x18, dst, src, 0, imm & 0xffffffff), _insn(0x00, 0, 0, 0, imm >> 32)]

    def count(field, reg=1):  # lock *(u64 *)(r9 + field) += reg
        return _insn(0xdb, 9, reg, _V[field], 0)

    one = _insn(0xb7, 1, 0, 0, 1)                # r1 = 1
    prog = [
        _insn(0xbf, 6, 1),                       # r6 = ctx (ld_abs needs it there)
        _insn(0x61, 0, 1, 16),                   # r0 = skb->protocol
        ("jmp", 0x55, 0, 0, 0x0008, "pass"),     # if r0 != htons(ETH_P_IP) goto pass
        _insn(0x61, 7, 1, 0),                    # r7 = skb->len
        _insn(0x62, 10, 0, -4, 0),               # *(u32 *)(fp - 4) = 0 (key)
        *ld64(1, map_fd, BPF_PSEUDO_MAP_FD),     # r1 = map
        _insn(0xbf, 2, 10),                      # r2 = fp
        _insn(0x07, 2, 0, 0, -4),                # r2 += -4
        _insn(0x85, 0, 0, 0, FN_MAP_LOOKUP_ELEM),
        ("jmp", 0x15, 0, 0, 0, "pass"),          # if r0 == NULL goto pass
        _insn(0xbf, 9, 0),                       # r9 = value
        _insn(0x85, 0, 0, 0, FN_KTIME_GET_NS),   # r0 = now
        _insn(0x79, 1, 9, _V["last_ns"]),        # r1 = last
        _insn(0x7b, 9, 0, _V["last_ns"]),        # last = now
        _insn(0xbf, 2, 0),                       # r2 = now
        _insn(0x1f, 2, 1),                       # r2 -= last (elapsed)
        _insn(0xb5, 2, 0, 1, MAX_ELAPSED_NS),    # if r2 <= MAX goto +1
        _insn(0xb7, 2, 0, 0, MAX_ELAPSED_NS),    # r2 = MAX
        *ld64(1, rate),                          # r1 = rate (bytes/s)
        _insn(0x2f, 2, 1),                       # r2 *= r1
        _insn(0x37, 2, 0, 0, 1_000_000_000),     # r2 /= 1e9   (drained bytes)
        _insn(0x79, 3, 9, _V["backlog"]),        # r3 = backlog
        _insn(0xbf, 4, 3),                       # r4 = r3
        _insn(0x1f, 4, 2),                       # r4 -= drained
        _insn(0x2d, 3, 2, 1),                    # if backlog > drained goto +1
        _insn(0xb7, 4, 0, 0, 0),                 # r4 = 0
        _insn(0x0f, 4, 7),                       # r4 += len
        _insn(0xb5, 4, 0, 1, cap_bytes),         # if r4 <= cap goto +1
        _insn(0xb7, 4, 0, 0, cap_bytes),         # r4 = cap
        _insn(0x7b, 9, 4, _V["backlog"]),        # backlog = r4
        _insn(0x79, 3, 9, _V["max_backlog"]),    # r3 = max_backlog
        _insn(0x3d, 3, 4, 1),                    # if r3 >= r4 goto +1
        _insn(0x7b, 9, 4, _V["max_backlog"]),    # max_backlog = r4 (racy, a statistic)
        one, count("pkts"),
        count("bytes", 7),
        ("jmp", 0xb5, 4, 0, k_bytes, "pass"),    # if backlog <= K goto pass
        one, count("over"),
        _insn(0x30, 0, 0, 0, 14 + 1),            # r0 = ip->tos (ld_abs b)
        _insn(0x57, 0, 0, 0, 3),                 # r0 &= INET_ECN_MASK
        ("jmp", 0x15, 0, 0, 0, "not_ect"),       # Not-ECT: leave it alone
        ("jmp", 0x15, 0, 0, 3, "ce"),            # already CE (marked upstream)
        _insn(0xbf, 1, 6),                       # r1 = ctx
        _insn(0x85, 0, 0, 0, FN_SKB_ECN_SET_CE),  # ECT(0)/ECT(1) -> CE, checksum fixed
        ("jmp", 0x15, 0, 0, 0, "pass"),          # 0: not marked (e.g. header not writable)
        one, count("marked"),
        ("jmp", 0x05, 0, 0, 0, "pass"),
        "ce", one, count("over_ce"),
        ("jmp", 0x05, 0, 0, 0, "pass"),
        "not_ect", one, count("over_not_ect"),
        "pass",
        _insn(0xb7, 0, 0, 0, -1),                # r0 = TC_ACT_UNSPEC
        _insn(0x95),                             # exit
    ]
    return _assemble(prog)


def create_mark_map():
    attr = struct.pack("<IIIII", BPF_MAP_TYPE_ARRAY, 4, 8 * len(MARK_FIELDS), 1, 0)
    return _bpf(BPF_MAP_CREATE, attr)


def load_marker(rate_Bps, k_bytes, cap_bytes, prog_path, map_path):
    """Create the state map and the marker program, pin both."""
    mfd = create_mark_map()
    try:
        pfd = _load(mark_program(mfd, rate_Bps, k_bytes, cap_bytes))
        try:
            _pin(mfd, map_path)
            _pin(pfd, prog_path)
        finally:
            os.close(pfd)
    finally:
        os.close(mfd)


def read_marker(map_path):
    """The marker's map entry as a dict of MARK_FIELDS."""
    p = ctypes.create_string_buffer(map_path.encode())
    fd = _bpf(BPF_OBJ_GET, struct.pack("<QII", ctypes.addressof(p), 0, 0))
    try:
        key = ctypes.create_string_buffer(4)
        val = ctypes.create_string_buffer(8 * len(MARK_FIELDS))
        _bpf(BPF_MAP_LOOKUP_ELEM, struct.pack("<IIQQQ", fd, 0, ctypes.addressof(key),
                                              ctypes.addressof(val), 0))
        return dict(zip(MARK_FIELDS, struct.unpack(f"<{len(MARK_FIELDS)}Q", val.raw)))
    finally:
        os.close(fd)
