#!/usr/bin/python3
"""Fabric ECN test: the phantom-queue CE marker (tools/python/vsfabric/bpf.py)
on a small Clos (2 ToRs, 1 host each, 2 uplinks of 100 Mbit/s). Behaviour
only, never timing or throughput:
  1. at a marker whose phantom queue is always above K, ECT(0) and ECT(1)
     datagrams arrive CE-marked, not-ECT and CE ones arrive unchanged, none
     is dropped, and the map counts them (marked, over_not_ect, over_ce);
  2. marking on (Fabric(mark_k=...)): a single-path connection that
     saturates its uplink gets CE marks on that uplink, the receiving
     engine counts CE marks (ce_marks > 0, never more than the link set);
  3. loss and marking on the same uplink: both filters run (drops make the
     engine retransmit, marks are still set), every message completes;
  4. marking off: no marker left on any port, the engine sees no CE mark;
  5. everything is removed: namespaces and the bpffs mount.
Exits 77 (skipped) without root or network namespaces.
"""
import os
import socket
import subprocess
import sys

import fabtest


def udp_tos_check(fab, vsfabric, n=20):
    """Send n datagrams each of TOS 0 (not ECT), 2 (ECT(0)), 1 (ECT(1)), 3 (CE)
    from h0.0 to h1.0; return {sent_tos: [received tos, ...]}."""
    with vsfabric.Netns(fab.host(1, 0)):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with vsfabric.Netns(fab.host(0, 0)):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind((fab.host_ip(1, 0), 20000))
        rx.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
        rx.settimeout(2.0)
        tx.bind((fab.host_ip(0, 0), 20001))
        order = [0, 2, 1, 3] * n
        for tos in order:
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            tx.sendto(bytes([tos]) * 100, (fab.host_ip(1, 0), 20000))
        got = {0: [], 2: [], 1: [], 3: []}
        for _ in order:
            try:
                data, anc, _, _ = rx.recvmsg(2000, socket.CMSG_SPACE(4))
            except socket.timeout:
                break
            tos = [c[2][0] for c in anc if c[0] == socket.IPPROTO_IP and c[1] == socket.IP_TOS]
            got[data[0]].append(tos[0] if tos else None)
        return got
    finally:
        rx.close()
        tx.close()


def main():
    env = fabtest.begin()
    if env is None:
        return fabtest.SKIP
    vsfabric, harness, check = env

    A, K = 2, 20_000
    args = ["--paths", 1, "--path-algo", "single", "--size", "64K", "--depth", 16,
            "--no-path-detail"]
    with vsfabric.Fabric(tors=2, hosts=1, aggs=A, uplink_rate="100mbit", queue=1_000_000,
                         mark_k=K, mark_fraction=0.95) as fab:
        bpffs = fab.bpffs
        # Host links are unshaped: markers on the 2 x A uplink ends only.
        check(len(fab.marking) == 4 * A, f"a marker on every shaped switch port ({len(fab.marking)})")

        # 1. ECT vs not-ECT at a marker that is always over K (1 kB/s drain,
        # K = 100 B: every datagram of 142 B is over it). The 80 datagrams
        # (11 kB) stay below the uplinks' K, so nothing is marked upstream.
        fab.set_marking(fab.tor(1), "d0", 8000, 100, cap=1_000_000)
        got = udp_tos_check(fab, vsfabric)
        m = fab.mark_counters()[(fab.tor(1), "d0")]
        check(all(len(v) == 20 for v in got.values()),
              f"no datagram dropped: {[len(v) for v in got.values()]} of 20 each")
        check(got[0] == [0] * len(got[0]), f"not-ECT arrives unchanged: {set(got[0])}")
        check(got[2] == [3] * len(got[2]) and got[1] == [3] * len(got[1]),
              f"ECT(0) and ECT(1) arrive CE: {set(got[2])}, {set(got[1])}")
        check(got[3] == [3] * len(got[3]), f"CE arrives CE: {set(got[3])}")
        check(m["marked"] == 40 and m["over_ce"] == 20 and m["over_not_ect"] >= 20,
              f"marker counts 40 marked, 20 CE and 20 not-ECT over K: {m['marked']}, "
              f"{m['over_ce']}, {m['over_not_ect']}")
        fab.set_marking(fab.tor(1), "d0", 0, 0)
        check((fab.tor(1), "d0") not in fab.marking, "a marker can be removed")

        # 2. Marking on, one path saturating its uplink.
        up0 = fab.uplink_marks(0)
        r = harness.run_pairs(fab, [((0, 0), (1, 0))], args, 1.0)
        s = harness.summarize(r)
        marks = [x - y for x, y in zip(fab.uplink_marks(0), up0)]
        ce = (r[0].get("server") or {}).get("engine", {}).get("ce_marks", -1)
        check(s["all_completed"], f"marking on: all messages completed ({s['posted']} posted)")
        check(sum(marks) > 0, f"marking on: the loaded uplink marked CE: {marks}")
        allm = sum(m["marked"] for m in fab.mark_counters().values())
        check(0 < ce <= allm, f"marking on: the engine counted CE marks ({ce}, "
                              f"all ports marked {allm})")

        # 3. Loss and marking on the same uplink (the one path 0 takes).
        lossy = int(harness.route_dev(fab, fab.tor(0), [(harness.ports(0)[1], harness.ports(0)[0])],
                                      fab.host_ip(0, 0), fab.host_ip(1, 0))[0][1:])
        fab.set_loss(0, lossy, 0.05)
        filt = subprocess.run(["tc", "-n", fab.tor(0), "filter", "show", "dev", f"u{lossy}",
                               "egress"], capture_output=True, text=True).stdout
        check("pref 1 " in filt and "pref 2 " in filt, "loss (pref 1) and marker (pref 2) both attached")
        up0 = fab.uplink_marks(0)
        r = harness.run_pairs(fab, [((0, 0), (1, 0))], args, 1.0)
        s = harness.summarize(r)
        marks = [x - y for x, y in zip(fab.uplink_marks(0), up0)]
        check(s["all_completed"] and s["failed_messages"] == 0,
              f"loss + marking: every message completed ({s['completed']}/{s['posted']})")
        check(s["retx_pkts"] > 0, f"loss + marking: the engine retransmitted ({s['retx_pkts']})")
        check(marks[lossy] > 0, f"loss + marking: the lossy uplink still marks: {marks}")
        fab.set_loss(0, lossy, 0)

        # 4. Marking off.
        for a in range(A):
            for t in range(2):
                fab.set_link_marking(t, a, None)
        check(not fab.marking, "marking off: no marker left")
        filt = "".join(subprocess.run(["tc", "-n", ns, "filter", "show", "dev", dev, "egress"],
                                      capture_output=True, text=True).stdout
                       for ns, dev, _ in fab.switch_ports())
        check("bpf" not in filt, "marking off: no bpf filter attached")
        r = harness.run_pairs(fab, [((0, 0), (1, 0))], args, 1.0)
        s = harness.summarize(r)
        ce = (r[0].get("server") or {}).get("engine", {}).get("ce_marks", -1)
        check(s["all_completed"], "marking off: all messages completed")
        check(ce == 0, f"marking off: the engine saw no CE mark ({ce})")
    check(not vsfabric.list_namespaces(f"vsf{os.getpid()}-"), "all namespaces removed")
    with open("/proc/mounts") as f:
        check(bpffs not in f.read() and not os.path.exists(bpffs), "bpffs unmounted and removed")
    return check.result()


if __name__ == "__main__":
    sys.exit(main())
