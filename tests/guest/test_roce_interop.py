"""A vStellar guest against an rxe guest: plain RoCE v2 (issue 28).

Guest 0 has the vStellar device, served by a vstellard told that guest 1's
address speaks plain RoCE v2 (--roce-peers); guest 1 runs Linux's
Soft-RoCE (Debian's rdma_rxe) on a second NIC that sits on the daemons'
fabric network (run_guests rxe_guests). Every program runs both ways,
vStellar as server and as client: RC SEND, WRITE, READ and atomics, UD,
and rdma_cm (rping, perftest's -R), whose MADs travel between the two QP
1s. The TCP exchange of perftest and the pingpongs goes over other
addresses ($VSTELLAR_OOB_*), since a guest's GID is its daemon's address. Path MTU 1024 on both sides (rxe's, over a
1500-byte Ethernet); READ and atomic depth 16 (-o 16: vStellar's
max_qp_rd_atom; perftest would ask the client's QP for rxe's 128).

The packets of the clean run are recorded on the fabric and decoded by
tshark's built-in InfiniBand dissector (RRoCE): none may be malformed or
anything but RoCE v2. Debian 12's tshark (Wireshark 4.0) has no ICRC
verification, so the ICRC of every packet, either direction, is checked
here in Python (zlib's CRC-32) with the IPv4 identification the packet
carried.

NVMe over RDMA runs both ways too (RoceInteropNvmeTest).

With 1% loss each way (the namespace fabric's eBPF loss on both hosts'
fabric links), WRITE and READ
complete both ways and go-back-N shows on both sides: the daemon's
sequence NAKs sent and received, rxe's out-of-sequence and sequence-error
counters.
"""
import os
import shutil
import struct
import subprocess
import tempfile
import unittest
import zlib

from vsfabric import bpf
from vstellar import guest as vg, pcap, perftest as pt, ulp

VST, RXE = pt.INTEROP_VST, pt.INTEROP_RXE

# (program, its arguments): each runs twice, vStellar serving, then rxe.
PROGRAMS = [
    ("ibv_rc_pingpong", "-m 1024 -s 4096 -n 20"),
    ("ib_write_bw", "-m 1024 -s 65536 -n 50 -F --report_gbits"),
    ("ib_read_bw", "-m 1024 -s 65536 -n 50 -o 16 -F --report_gbits"),
    ("ib_send_bw", "-m 1024 -s 65536 -n 50 -F --report_gbits"),
    ("ib_atomic_bw", "-m 1024 -n 50 -o 16 -F --report_gbits"),
    ("ib_write_lat", "-m 1024 -s 8 -n 100 -F"),
    ("ibv_ud_pingpong", "-s 512 -n 20"),
    # rdma_cm: the CM's MADs on QP 1, as UD SEND Only to the peer's QP 1
    ("rping", "-C 10 -v"),
    ("ib_write_bw", "-R -m 1024 -s 65536 -n 50 -F --report_gbits"),
]
LOSSY_PROGRAMS = [
    ("ib_write_bw", "-m 1024 -s 65536 -n 100 -F --report_gbits"),
    ("ib_read_bw", "-m 1024 -s 65536 -n 100 -o 16 -F --report_gbits"),
]
def run_pair(programs, capture=None, loss=None, scripts=None):
    """Both guests, one daemon. capture: a pcap file to record the fabric
    link of the vStellar host into; loss: the probability that a UDP
    datagram leaving either host's fabric link is dropped; scripts: the
    guests' commands instead of the programs'. Returns (results,
    daemons)."""
    daemons, procs, mounts = [], [], []

    def during(session):
        if loss:
            # The namespace fabric's UDP loss (an eBPF classifier on the
            # link's egress, tools/python/vsfabric): netem is not in every
            # kernel (this project's machines lack it).
            bpffs = tempfile.mkdtemp(prefix="vstellar-roce-bpf-")
            subprocess.run(["mount", "-t", "bpf", "bpf", bpffs], check=True)
            mounts.append(bpffs)
            for k, ns in enumerate(session.net.hosts):
                pin = os.path.join(bpffs, f"loss{k}")
                bpf.load_and_pin(loss, pin)
                for cmd in (["qdisc", "replace", "dev", "fab", "clsact"],
                            ["filter", "add", "dev", "fab", "egress", "prio", "1", "bpf", "object-pinned", pin, "da"]):
                    subprocess.run(["tc", "-n", ns] + cmd, check=True)
        if capture:
            procs.append(subprocess.Popen(["ip", "netns", "exec", session.net.hosts[VST], "tcpdump", "-i", "fab",
                                           "-U", "-s", "0", "-w", capture, "udp port 4791"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    try:
        results = vg.run_guests(list(scripts or pt.interop_pair(programs)),
                                vstellar=True, rxe_guests={RXE}, timeout=900, daemons_out=daemons, during=during)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        for m in mounts:
            subprocess.run(["umount", m], check=False)
            shutil.rmtree(m, ignore_errors=True)
    return results, daemons


def udp_payloads(path):
    """(IPv4 header fields, UDP ports, payload) of every IPv4/UDP frame of
    a classic little-endian Ethernet pcap."""
    out = []
    for frame in pcap.frames(path):
        if struct.unpack(">H", frame[12:14])[0] != 0x0800:
            continue
        ip = frame[14:14 + (frame[14] & 0x0f) * 4]
        udp = frame[14 + len(ip):]
        sport, dport, ulen = struct.unpack(">HHH", udp[:6])
        out.append((ip, sport, dport, udp[8:ulen]))
    return out


def icrc(ip, sport, dport, payload):
    """RoCE v2's ICRC of a UDP payload (IBTA Annex A17): CRC-32 over 8 bytes
    of ones, the IPv4 header with TOS, TTL and checksum set to ones, the
    UDP header with its checksum set to ones, the BTH with byte 4 set to
    ones, and the rest up to the ICRC. Written from the spec, apart from
    the engine's C++."""
    v4 = bytearray(ip[:20])
    v4[1] = 0xff
    v4[8] = 0xff
    v4[10:12] = b"\xff\xff"
    udp = struct.pack(">HHHH", sport, dport, 8 + len(payload), 0xffff)
    bth = bytearray(payload[:12])
    bth[4] = 0xff
    return zlib.crc32(b"\xff" * 8 + bytes(v4) + udp + bytes(bth) + payload[12:-4]) & 0xffffffff


class RoceInteropTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="vstellar-roce-interop-")
        cls.pcap = os.path.join(cls.tmp, "fabric.pcap")
        cls.results, cls.daemons = run_pair(PROGRAMS, capture=cls.pcap)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_every_program_both_ways(self):
        for i, (status, out, console) in enumerate(self.results):
            self.assertEqual(status, 0, f"guest{i}:\n" + "\n".join(console[-80:]) + "\n" +
                             vg.daemon_report(self.daemons))
        for i in (VST, RXE):
            sections = pt.split_sections(self.results[i][1])
            for prog, args in PROGRAMS:
                for serving in ("vstellar", "rxe"):
                    key = f"{prog} {args} server={serving}"
                    self.assertIn(key, sections, f"guest{i}: {sorted(sections)}")
                    client = serving != ("vstellar" if i == VST else "rxe")
                    if prog.endswith("_bw") and client:
                        bw = pt.parse_bw(sections[key])
                        self.assertEqual(len(bw), 1, sections[key])
                        pt.check_rate(self, bw[0]["bw_avg_gbps"], sections[key])
                    if prog == "rping" and client:
                        self.assertEqual(sum("ping data: rdma-ping-" in l for l in sections[key]), 10,
                                         sections[key])
                    if prog.endswith("_lat") and client:
                        lat = pt.parse_lat(sections[key])
                        self.assertEqual(len(lat), 1, sections[key])
                        self.assertGreater(lat[0]["t_typical_us"], 0.0)

    def test_the_daemon_spoke_roce(self):
        eng = self.daemons[0]["stats"]["engine"]
        self.assertGreater(eng["roce_tx"], 0, eng)
        self.assertGreater(eng["roce_rx"], 0, eng)
        self.assertEqual(eng["roce_bad"], 0, eng)
        self.assertEqual(eng["stalled_qps"], 0, eng)

    def test_capture_decodes_cleanly(self):
        packets = udp_payloads(self.pcap)
        self.assertGreater(len(packets), 1000, "the capture holds the runs' packets")
        bad = [k for k, (ip, sp, dp, pl) in enumerate(packets)
               if len(pl) < 16 or icrc(ip, sp, dp, pl) != struct.unpack("<I", pl[-4:])[0]]
        self.assertEqual(bad, [], f"{len(bad)} of {len(packets)} packets with a wrong ICRC")
        senders = {ip[12:16] for ip, _, _, _ in packets}
        self.assertEqual(len(senders), 2, "both sides' packets are in the capture")

        def count(display_filter):
            # Without the RPC-over-RDMA dissector: its heuristic takes the
            # short SENDs of perftest's rdma_cm exchange (-R) for RPC
            # messages and throws "Malformed Packet: RPCoRDMA" on them,
            # on rxe's own as on vStellar's (Wireshark 4.0).
            r = subprocess.run(["tshark", "-n", "--disable-protocol", "rpcordma", "-r", self.pcap,
                                "-Y", display_filter], capture_output=True, text=True, check=True)
            return len(r.stdout.splitlines())

        self.assertEqual(count("udp.port == 4791"), len(packets))
        self.assertEqual(count("udp.port == 4791 && !infiniband"), 0, "packets tshark does not take for RoCE")
        self.assertEqual(count("_ws.malformed || _ws.expert.severity >= error"), 0, "malformed packets")


class RoceInteropLossTest(unittest.TestCase):
    def test_go_back_n_under_loss(self):
        results, daemons = run_pair(LOSSY_PROGRAMS, loss=0.01)
        for i, (status, out, console) in enumerate(results):
            self.assertEqual(status, 0, f"guest{i}:\n" + "\n".join(console[-80:]) + "\n" +
                             vg.daemon_report(daemons))
        eng = daemons[0]["stats"]["engine"]
        self.assertGreater(eng["roce_seq_naks_sent"], 0, eng)
        self.assertGreater(eng["roce_seq_naks_rcvd"], 0, eng)
        self.assertGreater(eng["roce_goback_pkts"], 0, eng)
        counters = {}
        for line in pt.split_sections(results[RXE][1])["rxe counters"]:
            name, _, value = line.partition(":")
            if value.strip().isdigit():
                counters[name] = int(value)
        # rxe: out_of_seq_request counts requests that arrived ahead of the
        # PSN it expected (it NAKs them); rcvd_seq_err counts the sequence
        # NAKs its requester received.
        self.assertGreater(counters.get("out_of_seq_request", 0), 0, counters)
        self.assertGreater(counters.get("rcvd_seq_err", 0), 0, counters)


# NVMe over RDMA across the pair, both ways: the kernel's target (nvmet-rdma)
# on one side, its host (nvme-rdma) on the other, connected through
# rdma_cm; 16 MiB of random data written with O_DIRECT, read back and
# compared on the host, and read by the target from its own null_blk. Round
# 1: rxe serves, vStellar is the host; round 2 the other way. The sides
# say "done" over TCP on their out-of-band addresses.
MIB = 16
NVME_COMMON = ulp.NVMET + ulp.NVME_ATTACH + f"""\
tell() {{ i=0; until echo done | nc "$1" "$2"; do i=$((i + 1)); [ $i -lt 60 ] || return 1; sleep 1; done; }}
nvme_round() {{
  nvme_attach "$1" "$2" || return 1
  dd if=/tmp/pattern of=$dev bs=1M count={MIB} oflag=direct 2>/dev/null || return 1
  dd if=$dev of=/tmp/back bs=1M count={MIB} iflag=direct 2>/dev/null || return 1
  echo "host-read $(md5sum < /tmp/back)"
  nvme disconnect -n {ulp.NQN} || return 1
}}
serve() {{
  nvmet_up $VSTELLAR_SELF_IP "$1"
  timeout 500 nc -l -p "$2" > /dev/null
  echo "target-read $(dd if=/dev/nullb0 bs=1M count={MIB} 2>/dev/null | md5sum)"
  nvmet_down
}}
trap 'rc=$?; [ $rc = 0 ] || {{ echo "== dmesg"; dmesg | tail -n 60; }}; exit $rc' EXIT
set -e
{ulp.NULL_BLK}modprobe nvmet
modprobe nvmet-rdma
modprobe nvme-rdma
dd if=/dev/urandom of=/tmp/pattern bs=1M count={MIB} 2>/dev/null
echo "pattern $(md5sum < /tmp/pattern)"
"""
NVME_VST = pt.gid_index(pt.VSTELLAR_DEVICE, vg.guest_ip(VST)) + NVME_COMMON + """\
echo "== round 1"
nvme_round $VSTELLAR_PEER_IP 4421
tell $VSTELLAR_OOB_PEER_IP 5001
echo "== round 2"
serve 4422 5002
"""
NVME_RXE = ("rdma link add rxe0 type rxe netdev eth1 || exit 1\n" + pt.gid_index("rxe0", vg.guest_ip(RXE)) +
            NVME_COMMON + """\
echo "== round 1"
serve 4421 5001
echo "== round 2"
nvme_round $VSTELLAR_PEER_IP 4422
tell $VSTELLAR_OOB_PEER_IP 5002
""")


class RoceInteropNvmeTest(unittest.TestCase):
    def test_nvme_over_rdma_both_ways(self):
        results, daemons = run_pair([], scripts=[NVME_VST, NVME_RXE])
        for i, (status, out, console) in enumerate(results):
            self.assertEqual(status, 0, f"guest{i}:\n" + "\n".join(out[-60:]) + "\n" + vg.daemon_report(daemons))
        vst, rxe = (pt.split_sections(results[i][1]) for i in (VST, RXE))

        def field(lines, name):
            return [line.split(" ", 1)[1] for line in lines if line.startswith(name + " ")]

        pattern = {i: field(results[i][1], "pattern") for i in (VST, RXE)}
        self.assertTrue(len(pattern[VST]) == len(pattern[RXE]) == 1, pattern)
        # Round 1: vStellar host, rxe target; round 2 the other way.
        self.assertEqual(field(vst["round 1"], "host-read"), pattern[VST], vst)
        self.assertEqual(field(rxe["round 1"], "target-read"), pattern[VST], rxe)
        self.assertEqual(field(rxe["round 2"], "host-read"), pattern[RXE], rxe)
        self.assertEqual(field(vst["round 2"], "target-read"), pattern[RXE], vst)
        eng = daemons[0]["stats"]["engine"]
        self.assertGreater(eng["roce_tx"], 0, eng)
        self.assertEqual(eng["roce_bad"], 0, eng)


if __name__ == "__main__":
    unittest.main()
