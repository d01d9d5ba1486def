"""NFS over RDMA on vStellar: the kernel's NFS server (nfsd with its RDMA
transport, svcrdma) and client (xprtrdma), unmodified, between two guests.

Guest 1 serves a tmpfs over NFSv4.2 on the RDMA port, 20049 (rpc.nfsd
--rdma, rpc.mountd for the export cache; NFSv4 needs no rpcbind, and the
grace period is cut to its minimum so that the first OPEN is served). The
image has no /etc/services, so rpc.nfsd opens no TCP listener ("unable to
resolve ANYADDR:nfs"): RDMA is the server's only transport.
Guest 0 mounts it with proto=rdma, writes files (one large, written and
read with O_DIRECT, so every byte crosses the mount; many small ones),
reads them back after a remount (no client cache), compares checksums,
and the server compares them with the files in its tmpfs.

What runs on vstellar0: the CM over its GSI QP, kernel RC QPs, RPC-over-
RDMA sends with several SGEs, the client's fast registrations (REG_MR and
LOCAL_INV or remote invalidation by SEND_WITH_INV), and the server's RDMA
READs and WRITEs through rdma_rw. The vstellard counters prove the bytes
crossed the device. Asserts behaviour, never timings.
"""
import unittest

import guestlib
from vstellar import perftest as pt

MIB = 16
SMALL = 32
SERVER = pt.VSTELLAR_SETUP + f"""\
trap 'rc=$?; [ $rc = 0 ] || {{ echo "== dmesg"; dmesg | tail -n 80; }}; exit $rc' EXIT
set -e
modprobe rpcrdma
modprobe nfsd
mkdir -p /export /var/lib/nfs/v4recovery /run/rpc_pipefs
mount -t tmpfs -o size=256m tmpfs /export
mount -t nfsd nfsd /proc/fs/nfsd
mount -t rpc_pipefs rpc_pipefs /run/rpc_pipefs 2>/dev/null || true
echo 10 > /proc/fs/nfsd/nfsv4leasetime
echo 10 > /proc/fs/nfsd/nfsv4gracetime
echo '/export *(rw,fsid=0,no_root_squash,insecure,no_subtree_check)' > /etc/exports
exportfs -ra
rpc.mountd -N 3
rpc.nfsd -N 3 --rdma=20049 1
cat /proc/fs/nfsd/portlist
echo "== served"
timeout 500 nc -l -p 5000 > /dev/null
echo "server-big $(md5sum < /export/big)"
echo "server-small $(cat $(for i in $(seq {SMALL}); do echo /export/small/$i; done) | md5sum)"
rpc.nfsd 0
"""
CLIENT = pt.VSTELLAR_SETUP + f"""\
# a failed client lets the server go on (and fail) at once
trap 'rc=$?; if [ $rc != 0 ]; then echo "== dmesg"; dmesg | tail -n 80
  echo fail | nc $VSTELLAR_PEER_IP 5000; fi; exit $rc' EXIT
set -e
modprobe rpcrdma
modprobe nfsv4
mkdir -p /mnt/nfs
dd if=/dev/urandom of=/tmp/big bs=1M count={MIB} 2>/dev/null
mkdir -p /tmp/small
for i in $(seq {SMALL}); do head -c $((i * 1000)) /dev/urandom > /tmp/small/$i; done
echo "pattern-big $(md5sum < /tmp/big)"
echo "pattern-small $(cat $(for i in $(seq {SMALL}); do echo /tmp/small/$i; done) | md5sum)"
OPTS=vers=4.2,proto=rdma,port=20049
i=0
until mount.nfs4 $VSTELLAR_PEER_IP:/ /mnt/nfs -o $OPTS 2> /tmp/mount.err; do
  i=$((i + 1)); [ $i -lt 30 ] || {{ cat /tmp/mount.err; exit 1; }}
  sleep 1
done
echo "== mounted"
grep /mnt/nfs /proc/mounts
dd if=/tmp/big of=/mnt/nfs/big bs=1M oflag=direct 2>/dev/null
mkdir /mnt/nfs/small
cp /tmp/small/* /mnt/nfs/small/
umount /mnt/nfs
mount.nfs4 $VSTELLAR_PEER_IP:/ /mnt/nfs -o $OPTS
echo "client-big $(dd if=/mnt/nfs/big bs=1M iflag=direct 2>/dev/null | md5sum)"
echo "client-small $(cat $(for i in $(seq {SMALL}); do echo /mnt/nfs/small/$i; done) | md5sum)"
umount /mnt/nfs
i=0; until echo done | nc $VSTELLAR_PEER_IP 5000; do i=$((i + 1)); [ $i -lt 60 ] || exit 1; sleep 1; done
"""


class NfsRdmaTest(guestlib.KernelUlpCase):
    SCRIPTS = (CLIENT, SERVER)
    TIMEOUT = 600

    def test_mounted_over_rdma(self):
        mounted = pt.split_sections(self.results[0][1]).get("mounted", [])
        self.assertTrue(any("proto=rdma" in line and "port=20049" in line for line in mounted), mounted)
        served = pt.split_sections(self.results[1][1])
        self.assertIn("rdma 20049", self.results[1][1], served)

    def test_files_intact(self):
        client, server = self.results[0][1], self.results[1][1]
        for kind in ("big", "small"):
            with self.subTest(kind=kind):
                pattern = guestlib.field(client, f"pattern-{kind}")
                self.assertEqual(len(pattern), 1, client)
                self.assertEqual(guestlib.field(client, f"client-{kind}"), pattern, client)
                self.assertEqual(guestlib.field(server, f"server-{kind}"), pattern, server)

    def test_bytes_crossed_vstellar(self):
        # The large file went to the server and came back once each.
        self.assertDaemonsSent(MIB << 20)


if __name__ == "__main__":
    unittest.main()
