"""OpenMPI across two guests over rxe: mpirun starts its daemons through
dropbear (vstellar-mpi), then allreduce_bench checks every element of
MPI_Allreduce from 8 B to 64 MiB over UCX on rxe."""
import json
import unittest

from guestlib import vstellar_guest as vg, vstellar_perftest as pt

# UCX on rxe0's RC and UD verbs transports only (no TCP, no shared memory
# between the two ranks, which sit in different guests anyway), so the bytes
# go through the RDMA device.
MPIRUN = ("mpirun -np 2 --host $VSTELLAR_SELF_IP,$VSTELLAR_PEER_IP "
          "--mca pml ucx -x UCX_NET_DEVICES=rxe0:1 -x UCX_TLS=rc_verbs,ud_verbs,self")
BENCH = "allreduce_bench -b 8 -e 64M -n 3 -w 1 -J /tmp/allreduce.json"

HEAD = pt.RXE_SETUP + f"""\
vstellar-mpi wait $VSTELLAR_PEER_IP || exit 1
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
SERVE = pt.RXE_SETUP + "vstellar-mpi serve 840\n"


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


class MpiRxeTest(unittest.TestCase):
    def test_allreduce_between_two_guests(self):
        results = vg.run_guests([HEAD, SERVE], modules=pt.RXE_MODULES, mem=1024, timeout=850)
        for i, (status, out, console) in enumerate(results):
            self.assertEqual(status, 0, f"guest{i}:\n" + "\n".join(console))
        s = sections(results[0][1])
        self.assertEqual(sorted(s["hostname"]), ["guest0", "guest1"], s)
        report = json.loads("\n".join(s["json"]))
        self.assertEqual(report["ranks"], 2)
        self.assertEqual(report["wrong"], 0)
        sizes = [r["bytes"] for r in report["results"]]
        self.assertEqual(sizes, [8 << k for k in range(24)])  # 8 B .. 64 MiB
        for r in report["results"]:
            self.assertEqual(r["wrong"], 0, r)
            self.assertGreater(r["busbw_gbps"], 0.0, r)
            self.assertAlmostEqual(r["busbw_gbps"], r["algbw_gbps"], places=6)  # 2*(n-1)/n = 1


if __name__ == "__main__":
    unittest.main()
