"""NVMe over RDMA on vStellar: the kernel's own NVMe-oF target (nvmet-rdma)
and host (nvme-rdma) on vstellar0, unmodified, between two guests and in one.

One boot of two guests runs everything. Guest 1 is the target: nvmet over
configfs exports a memory-backed null_blk namespace on its IPv4 address
(port 4421, then 4422). Guest 0 is the host: `nvme connect -t rdma`, 16 MiB of random
data written with O_DIRECT, read back, compared by checksum (on the host,
and on the target from its own null_blk), `nvme disconnect`. Then the
target reloads nvmet-rdma with use_srq=1 (its receives on kernel SRQs) and
the host runs the same round again. Last, guest 0 exports its own null_blk
and connects to itself (loopback: both ends of every RC QP on one device).

What runs on vstellar0: the CM over its GSI QP, kernel RC QPs on both
sides, the host's fast registrations (IB_WR_REG_MR with a new key byte per
I/O, rkeys sent in the commands), the target's RDMA READs (writes) and
RDMA WRITEs (reads) through rdma_rw with the local DMA lkey, and
SEND_WITH_INV responses (remote invalidation of the host's MRs). The
vstellard counters prove the bytes crossed the device: each daemon sent
more than the data it had to move.

The guests coordinate with busybox nc: the host says "done" on a TCP port
of the target when a round is over, so the target can change its setup.
Asserts behaviour (exit status, checksums, devices seen, counters), never
timings.
"""
import unittest

import guestlib
from vstellar import perftest as pt
from vstellar import ulp as ulp

NQN = ulp.NQN
MIB = 16
# Each round uses a port of its own, so that a host can never reach the
# previous round's target.
NVMET = ulp.NVMET
# Host helpers: attach, write and read back, disconnect.
NVME_HOST = ulp.NVME_ATTACH + f"""\
nvme_round() {{
  nvme_attach "$1" "$2" || return 1
  nvme list
  echo "rc-qps $(rdma resource show qp | grep -c 'type RC')"
  dd if=/tmp/pattern of=$dev bs=1M count={MIB} oflag=direct 2>/dev/null || return 1
  # small writes too: their data travels inline in the command capsule
  dd if=/tmp/pattern of=$dev bs=4k count=16 seek=8 skip=8 oflag=direct conv=notrunc 2>/dev/null || return 1
  dd if=$dev of=/tmp/back bs=1M count={MIB} iflag=direct 2>/dev/null || return 1
  echo "host-read $(md5sum < /tmp/back)"
  nvme disconnect -n {NQN} || return 1
  [ ! -b $dev ] || {{ sleep 1; [ ! -b $dev ] || {{ echo "$dev still there"; return 1; }}; }}
}}
"""
# The target waits for the host's "done" on a TCP port; the host retries
# until the target listens.
TELL = """\
tell() { i=0; until echo done | nc "$1" "$2"; do i=$((i + 1)); [ $i -lt 60 ] || return 1; sleep 1; done; }
"""

# On failure: the kernel's messages (the guests log at loglevel 3).
DMESG_ON_FAILURE = """\
trap 'rc=$?; [ $rc = 0 ] || { echo "== dmesg"; dmesg | tail -n 80; }; exit $rc' EXIT
"""

TARGET = pt.VSTELLAR_SETUP + NVMET + DMESG_ON_FAILURE + f"""\
set -e
{ulp.NULL_BLK}modprobe nvmet
modprobe nvmet-rdma
for round in 1 2; do
  echo "== target $round"
  echo "use_srq $(cat /sys/module/nvmet_rdma/parameters/use_srq)"
  nvmet_up $VSTELLAR_SELF_IP 442$round
  # the SRQs exist while a host is connected: look for them meanwhile
  (for i in $(seq 600); do
    rdma resource show srq dev vstellar0 > /tmp/srq 2>&1; grep -q srqn /tmp/srq && break; sleep 0.2
  done) &
  watch=$!
  timeout 500 nc -l -p 500$round > /dev/null
  kill $watch 2>/dev/null || true
  echo "srqs $(grep -c srqn /tmp/srq)"
  echo "target-read $(dd if=/dev/nullb0 bs=1M count={MIB} 2>/dev/null | md5sum)"
  nvmet_down
  rmmod nvmet-rdma
  [ $round = 2 ] || modprobe nvmet-rdma use_srq=1
done
"""

HOST = pt.VSTELLAR_SETUP + NVME_HOST + NVMET + TELL + f"""\
# a failed host lets the target go on (and fail) at once
trap 'rc=$?; if [ $rc != 0 ]; then echo "== dmesg"; dmesg | tail -n 80
  for p in 5001 5002; do echo fail | nc $VSTELLAR_PEER_IP $p; done; fi; exit $rc' EXIT
set -e
modprobe nvme-rdma
dd if=/dev/urandom of=/tmp/pattern bs=1M count={MIB} 2>/dev/null
echo "pattern $(md5sum < /tmp/pattern)"
for round in 1 2; do
  echo "== host $round"
  nvme_round $VSTELLAR_PEER_IP 442$round
  tell $VSTELLAR_PEER_IP 500$round
done
echo "== loopback"
{ulp.NULL_BLK}modprobe nvmet
modprobe nvmet-rdma
nvmet_up $VSTELLAR_SELF_IP 4423
nvme_round $VSTELLAR_SELF_IP 4423
echo "target-read $(dd if=/dev/nullb0 bs=1M count={MIB} 2>/dev/null | md5sum)"
nvmet_down
"""


class NvmeofTest(guestlib.KernelUlpCase):
    SCRIPTS = (HOST, TARGET)
    TIMEOUT = 600

    def test_data_read_back_intact(self):
        host, target = self.sections
        pattern = guestlib.field(self.results[0][1], "pattern")
        self.assertEqual(len(pattern), 1, self.results[0][1])
        for r, srq in ((1, "N"), (2, "Y")):
            with self.subTest(round=r):
                rc_qps = guestlib.field(host.get(f"host {r}", []), "rc-qps")
                self.assertEqual(len(rc_qps), 1, host)
                self.assertGreaterEqual(int(rc_qps[0]), 2, host)  # admin and I/O queue
                srqs = guestlib.field(target.get(f"target {r}", []), "srqs")
                self.assertEqual(len(srqs), 1, target)
                self.assertEqual(int(srqs[0]) > 0, srq == "Y", target)
                self.assertEqual(guestlib.field(host.get(f"host {r}", []), "host-read"), pattern, host)
                self.assertEqual(guestlib.field(target.get(f"target {r}", []), "target-read"), pattern, target)
                self.assertEqual(guestlib.field(target.get(f"target {r}", []), "use_srq"), [srq], target)
                self.assertTrue(any(line.startswith("namespace /dev/nvme")
                                    for line in host[f"host {r}"]), host)

    def test_loopback(self):
        lines = self.sections[0].get("loopback", [])
        pattern = guestlib.field(self.results[0][1], "pattern")
        self.assertEqual(len(pattern), 1, self.results[0][1])
        self.assertEqual(guestlib.field(lines, "host-read"), pattern, lines)
        self.assertEqual(guestlib.field(lines, "target-read"), pattern, lines)

    def test_bytes_crossed_vstellar(self):
        # Writes: the target READs from the host (the host's daemon sends);
        # reads: the target WRITEs to the host (the target's daemon sends).
        # Two rounds of MIB each way; the loopback round adds to daemon 0.
        self.assertDaemonsSent(2 * MIB << 20)


if __name__ == "__main__":
    unittest.main()
