"""OpenMPI across two vStellar guests: mpirun starts its daemons through
dropbear (vstellar-mpi), then allreduce_bench checks every element of
MPI_Allreduce from 8 B to 64 MiB, with OpenMPI's UCX PML over vstellar0.

Settings a user needs, and why: `--mca pml ucx`, because OpenMPI 4.1 picks
UCX by itself only for devices whose name matches opal_common_ucx_devices
(mlx*); `-x UCX_NET_DEVICES=vstellar0:1`, so UCX uses the RDMA device and
not its TCP transport on eth0; the TCP BTL is excluded (`--mca btl
self`), so no MPI data can take it. OpenMPI's launcher (orted over
dropbear) still uses TCP on eth0, as it does on any cluster.

The vstellard counters prove the data crossed the device: each daemon sent
more bytes than one 64 MiB allreduce moves.

On rxe the same run does not work: UCX's ud_verbs drops every datagram
whose completion does not say "IPv4" in ibv_wc.sl (rxe says 0), so UCX's
connection setup times out; vStellar reports it (docs/virtio-vstellar.md).
"""
import json
import unittest

from vstellar import guest as vg
from vstellar import ulp as ulp

MPIRUN = ulp.MPIRUN  # the settings, and why: tools/python/vstellar/ulp.py
BENCH = "allreduce_bench -b 8 -e 64M -n 3 -w 1 -J /tmp/allreduce.json"

HEAD = f"""\
vstellar-mpi wait $VSTELLAR_PEER_IP 2>/dev/null || exit 1
echo '== hostname'
mpirun -np 2 --host $VSTELLAR_SELF_IP,$VSTELLAR_PEER_IP hostname; rc=$?
if [ $rc = 0 ]; then
	echo '== allreduce'
	{MPIRUN} {BENCH}; rc=$?
	echo '== json'
	cat /tmp/allreduce.json
	echo '== end'
fi
vstellar-mpi release $VSTELLAR_PEER_IP
exit $rc
"""
SERVE = "vstellar-mpi serve 840\n"


def sections(lines):
    """Output lines split at '== name' markers."""
    out, name = {}, None
    for line in lines:
        if line.startswith("== "):
            name = line[3:]
            out[name] = []
        elif name:
            out[name].append(line)
    return out


class MpiTest(unittest.TestCase):
    def test_allreduce_between_two_guests(self):
        daemons = []
        results = vg.run_guests([HEAD, SERVE], mem=1024, timeout=850, vstellar=True,
                                daemons_out=daemons)
        for i, (status, out, console) in enumerate(results):
            self.assertEqual(status, 0, f"guest{i}:\n" + "\n".join(console))
        s = sections(results[0][1])
        # dbclient's warning about the unknown host key shares the output.
        names = sorted(line for line in s["hostname"] if line.startswith("guest"))
        self.assertEqual(names, ["guest0", "guest1"], s)
        report = json.loads("\n".join(s["json"]))
        self.assertEqual(report["ranks"], 2)
        self.assertEqual(report["wrong"], 0)
        sizes = [r["bytes"] for r in report["results"]]
        self.assertEqual(sizes, [8 << k for k in range(24)])  # 8 B .. 64 MiB
        for r in report["results"]:
            self.assertEqual(r["wrong"], 0, r)
            self.assertGreater(r["busbw_gbps"], 0.0, r)
            self.assertAlmostEqual(r["busbw_gbps"], r["algbw_gbps"], places=6)  # 2*(n-1)/n = 1
        # Every 64 MiB allreduce sends 64 MiB each way, at least: the daemons
        # moved the data (the TCP BTL was excluded).
        for i, d in enumerate(daemons):
            tx = ((d.get("stats") or {}).get("engine") or {}).get("tx_bytes", 0)
            self.assertGreater(tx, 64 << 20, f"vstellard {i}: {d.get('log', '')[-1500:]}")


if __name__ == "__main__":
    unittest.main()
