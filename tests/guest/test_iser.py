"""iSCSI over RDMA (iSER) on vStellar: the kernel's LIO target (ib_isert)
and the open-iscsi initiator (ib_iser), unmodified, between two guests.

Guest 1 is the target: LIO set up through configfs (Debian's targetcli
wants a D-Bus daemon these guests do not run) exports a 64 MiB ramdisk LUN
on an iSER portal of its IPv4 address. Guest 0 is the initiator: iscsid,
SendTargets discovery and login over the iser interface, 16 MiB of random
data written to the disk with O_DIRECT and read back, compared by
checksum, logout. Both ends load crc32c: LIO's login sets up its digest
transform even when no digest is negotiated, and fails without it.

What runs on vstellar0: the CM over the GSI QP; the initiator's fast
registrations, with a SEND whose SGE names the key of the REG_MR queued
just before it (iSER's immediate data); the target's RDMA READs and
WRITEs. The daemons' counters show the bytes crossed the device.
Asserts behaviour (exit status, checksums, the session's transport,
counters), never timings.
"""
import unittest

import guestlib
from vstellar import guest as vg, perftest as pt

IQN = "iqn.2026-12.org.vstellar:iser"
MIB = 16

TARGET = pt.VSTELLAR_SETUP + f"""
modprobe crc32c_generic
modprobe target_core_mod
modprobe iscsi_target_mod
modprobe ib_isert || exit 1
grep -q ' /sys/kernel/config ' /proc/mounts || mount -t configfs configfs /sys/kernel/config
c=/sys/kernel/config/target
mkdir -p $c/core/rd_mcp_0/rd0 || exit 1
echo rd_pages=16384 > $c/core/rd_mcp_0/rd0/control
echo 1 > $c/core/rd_mcp_0/rd0/enable || exit 1
t=$c/iscsi/{IQN}/tpgt_1
mkdir -p $t/lun/lun_0 || exit 1
ln -s $c/core/rd_mcp_0/rd0 $t/lun/lun_0/rd0 || exit 1
mkdir $t/np/$VSTELLAR_SELF_IP:3260 || exit 1
echo 1 > $t/np/$VSTELLAR_SELF_IP:3260/iser || exit 1
echo 0 > $t/attrib/authentication
echo 1 > $t/attrib/generate_node_acls
echo 0 > $t/attrib/demo_mode_write_protect
echo 1 > $t/enable || exit 1
echo "== target"
echo "portal-iser $(cat $t/np/$VSTELLAR_SELF_IP:3260/iser)"
timeout 500 nc -l -p 5001 > /dev/null
"""

INITIATOR = pt.VSTELLAR_SETUP + f"""
tell() {{ i=0; until echo done | nc $VSTELLAR_PEER_IP 5001; do i=$((i + 1)); [ $i -lt 60 ] || return 1; sleep 1; done; }}
trap 'rc=$?; [ $rc = 0 ] || echo fail | nc $VSTELLAR_PEER_IP 5001; exit $rc' EXIT
modprobe crc32c_generic
modprobe sd_mod
modprobe ib_iser || exit 1
mkdir -p /etc/iscsi /run/lock/iscsi /var/lib/iscsi
echo "InitiatorName=iqn.2026-12.org.vstellar:initiator" > /etc/iscsi/initiatorname.iscsi
iscsid -f > /tmp/iscsid.log 2>&1 &
echo "== initiator"
# the target may not be listening yet
n=0
until iscsiadm -m discovery -t st -p $VSTELLAR_PEER_IP -I iser > /tmp/disc 2>&1; do
  n=$((n + 1)); [ $n -lt 30 ] || {{ cat /tmp/disc /tmp/iscsid.log; exit 1; }}
  sleep 2
done
cat /tmp/disc
iscsiadm -m node -T {IQN} -p $VSTELLAR_PEER_IP -I iser --login || {{ cat /tmp/iscsid.log; exit 1; }}
echo "session $(iscsiadm -m session | cut -d: -f1)"
n=0
until dev=$(ls -d /sys/block/sd* 2>/dev/null | head -n1) && [ -n "$dev" ]; do
  n=$((n + 1)); [ $n -lt 100 ] || {{ echo no-disk; exit 1; }}
  sleep 0.1
done
dev=/dev/$(basename $dev)
echo "disk $dev $(cat /sys/block/$(basename $dev)/size)"
dd if=/dev/urandom of=/tmp/pattern bs=1M count={MIB} 2>/dev/null
echo "pattern $(md5sum < /tmp/pattern)"
dd if=/tmp/pattern of=$dev bs=1M oflag=direct 2>/dev/null || exit 1
dd if=$dev of=/tmp/back bs=1M count={MIB} iflag=direct 2>/dev/null || exit 1
echo "read-back $(md5sum < /tmp/back)"
# small and unaligned to a page: 4 KiB at 3 sectors in, through the page cache
dd if=/tmp/pattern of=$dev bs=512 count=8 seek=3 conv=notrunc,fsync 2>/dev/null || exit 1
echo "small-read $(dd if=$dev bs=512 count=8 skip=3 iflag=direct 2>/dev/null | md5sum)"
echo "small-pattern $(dd if=/tmp/pattern bs=512 count=8 2>/dev/null | md5sum)"
iscsiadm -m node -T {IQN} -p $VSTELLAR_PEER_IP --logout || exit 1
tell
"""


class IserTest(guestlib.KernelUlpCase):
    SCRIPTS = (INITIATOR, TARGET)
    TIMEOUT = 600

    @classmethod
    def image(cls):
        return vg.overlay_image("iser", "open-iscsi")

    def test_data_read_back_intact(self):
        init = self.sections[0].get("initiator", [])
        pattern = guestlib.field(init, "pattern")
        self.assertEqual(len(pattern), 1, init)
        self.assertEqual(guestlib.field(init, "read-back"), pattern, init)
        small = guestlib.field(init, "small-read")
        self.assertEqual(len(small), 1, init)
        self.assertEqual(small, guestlib.field(init, "small-pattern"), init)

    def test_session_is_iser(self):
        init = self.sections[0].get("initiator", [])
        self.assertEqual(guestlib.field(init, "session"), ["iser"], init)
        self.assertEqual(guestlib.field(self.sections[1].get("target", []), "portal-iser"), ["1"],
                         self.sections[1])
        disk = [line for line in init if line.startswith("disk ")]
        self.assertEqual(len(disk), 1, init)
        self.assertEqual(disk[0].split()[2], str(64 << 11), init)  # 64 MiB in 512-byte sectors

    def test_bytes_crossed_vstellar(self):
        # Writes: the target READs from the initiator (the initiator's
        # daemon sends); reads: the target WRITEs (the target's daemon).
        self.assertDaemonsSent(MIB << 20)


if __name__ == "__main__":
    unittest.main()
