"""A tiny eBPF tc classifier that drops IPv4 UDP packets with a given
probability: this kernel has no netem, so packet loss on a link is made here.

The program is assembled by hand (no clang needed), loaded with the bpf(2)
system call through ctypes, pinned into a private bpffs mount and attached
with `tc filter ... bpf object-pinned PATH da` on a clsact egress hook.
Only UDP is dropped: the harness's TCP control connection, ARP and ICMP pass,
so a "black hole" eats the data path (the RDMA tunnels are all UDP) but the
out-of-band handshake survives.
"""
import ctypes
import os
import struct

BPF_PROG_LOAD = 5
BPF_OBJ_PIN = 6
BPF_PROG_TYPE_SCHED_CLS = 3
NR_BPF = 321  # x86_64

_libc = ctypes.CDLL(None, use_errno=True)


def _insn(code, dst=0, src=0, off=0, imm=0):
    return struct.pack("<BBhI", code, (src << 4) | dst, off, imm & 0xffffffff)


def drop_program(prob):
    """Bytecode: drop IPv4/UDP with probability prob (0..1), else TC_ACT_UNSPEC."""
    thr = min(1 << 32, max(0, int(round(prob * (1 << 32)))))
    p = [
        _insn(0xbf, 6, 1),                 # r6 = r1 (ctx, for ld_abs)
        _insn(0x61, 0, 1, 16),             # r0 = skb->protocol
        _insn(0x55, 0, 0, 8, 0x0008),      # if r0 != htons(ETH_P_IP) goto pass
        _insn(0x30, 0, 0, 0, 14 + 9),      # r0 = ip->protocol (ld_abs b)
        _insn(0x55, 0, 0, 6, 17),          # if r0 != UDP goto pass
        _insn(0x85, 0, 0, 0, 7),           # call bpf_get_prandom_u32
        _insn(0x18, 1, 0, 0, thr & 0xffffffff),  # r1 = thr (ld_imm64, 2 slots)
        _insn(0x00, 0, 0, 0, thr >> 32),
        _insn(0x3d, 0, 1, 2),              # if r0 >= r1 goto pass
        _insn(0xb7, 0, 0, 0, 2),           # r0 = TC_ACT_SHOT
        _insn(0x95),                       # exit
        _insn(0xb7, 0, 0, 0, -1),          # pass: r0 = TC_ACT_UNSPEC
        _insn(0x95),
    ]
    return b"".join(p)


def _bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 128)
    r = _libc.syscall(NR_BPF, cmd, buf, 128)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bpf({cmd}): {os.strerror(e)}")
    return r


def load_and_pin(prob, path):
    code = drop_program(prob)
    insns = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(65536)
    attr = struct.pack("<IIQQIIQI", BPF_PROG_TYPE_SCHED_CLS, len(code) // 8,
                       ctypes.addressof(insns), ctypes.addressof(lic),
                       1, len(log), ctypes.addressof(log), 0)
    try:
        fd = _bpf(BPF_PROG_LOAD, attr)
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror}: {log.value.decode(errors='replace')}")
    try:
        p = ctypes.create_string_buffer(path.encode())
        _bpf(BPF_OBJ_PIN, struct.pack("<QI", ctypes.addressof(p), fd))
    finally:
        os.close(fd)
