"""guest-soak: two guests over the namespace ECMP fabric run bulk RDMA
work for SOAK_MINUTES (default 30) while the fabric fails: every
SOAK_TOGGLE_S seconds (default 5) one uplink becomes a black hole or heals
and another toggles 1% loss. Each guest loops over its share of:
  UCX   ucx_perftest rc_verbs put_bw (64 KiB zero-copy) and UCP tag_bw
  perftest  ib_write_bw -q 8 and ib_read_bw (64 KiB), over rdma_cm-free
            verbs with the RoCE GID
  MPI   OpenMPI allreduce over UCX, 8 B to 4 MiB, every element checked
  NVMe-oF  fio writes 32 MiB and reads it back verified (crc32c) through
            nvme-rdma, from guest 0's nvmet-rdma target (a null_blk disk)
Every run inside a guest has its own `timeout` (SOAK_HANG_S, default 60 s
of no progress shows as a timed-out run): any timed-out or failed run, and
any guest that stops, fails the soak, which then prints both daemons'
per-QP state dumps (vstellar-stat --qps) and logs.

Usage: tools/soak/guest-soak   (as root, after make guest)
Prints one summary line per guest and the daemons' counters (WRs
completed, timeouts, spurious timeouts, paths set aside, stalled QPs,
missed kicks) at the end; exit status 0 only if nothing hung or failed.
"""
import os
import sys
import threading
import time

import vsfabric
from vstellar import guest as vg, perftest as pt, ulp

MINUTES = float(os.environ.get("SOAK_MINUTES", "30"))
TOGGLE_S = float(os.environ.get("SOAK_TOGGLE_S", "5"))
HANG_S = int(os.environ.get("SOAK_HANG_S", "60"))
AGGS = int(os.environ.get("SOAK_AGGS", "4"))
DEV = pt.VSTELLAR_DEVICE

# perftest runs with -F: in a guest starved of CPU its clock calibration
# (r^2 of TSC samples) fails and, without -F, it exits 1 with "Can't
# produce a report" before it moves a byte. The soak reads no number from
# its report; a failed completion still exits non-zero.
#
# The server side (guest 0) serves, the client (guest 1) runs the rounds.
# Each server listens on a port of its own, again and again, until the
# client says it has finished (on TCP port 5099): it waits for its client
# as long as it takes, since on a loaded host the client may be busy with
# the other steps for a while; hangs are the client's `timeout` to find
# (status 124, which the round reports and the soak counts as a failure).
ROUND_SERVER = ulp.NVMET + f"""\
# The NVMe-oF target and mpirun's way in stay up for the whole soak.
{ulp.NULL_BLK}modprobe nvmet && modprobe nvmet-rdma && nvmet_up $VSTELLAR_SELF_IP 4430 || echo "SOAK FAIL: nvmet"
vstellar-mpi serve {int(MINUTES * 60) + 20 * HANG_S} &
serve() {{ while :; do "$@" > /dev/null 2>&1; done; }}
serve ucx_perftest -p 13337 &
serve ucx_perftest -p 13338 &
serve ib_write_bw -d {DEV} $GIDX_OPT -q 8 -s 65536 -n 2000 -F -p 18515 &
serve ib_read_bw -d {DEV} $GIDX_OPT -s 65536 -n 2000 -F -p 18516 &
timeout {int(MINUTES * 60) + 20 * HANG_S} nc -l -p 5099 > /dev/null
# The target's side of any NVMe-oF trouble (keep-alive, disconnects).
dmesg | grep -E "nvmet|rdma|vstellar" | head -n 30 | sed 's/^/SOAK server: /'
"""

ROUND_CLIENT = ulp.NVME_ATTACH + f"""\
fails=0; runs=0
modprobe nvme-rdma && nvme_attach $VSTELLAR_PEER_IP 4430 || {{ echo "SOAK FAIL: nvme attach"; fails=1; }}
vstellar-mpi wait $VSTELLAR_PEER_IP 2>/dev/null || {{ echo "SOAK FAIL: mpi wait"; fails=1; }}
# MPI: every element of every allreduce is checked (allreduce_bench's
# "wrong"). A script, so that `timeout` can run it.
cat > /tmp/allreduce.sh <<EOF
{ulp.MPIRUN} allreduce_bench -b 8 -e 4M -n 2 -w 1 -J /tmp/ar.json > /dev/null || exit 1
python3 -c 'import json, sys; r = json.load(open("/tmp/ar.json")); sys.exit(1 if r["wrong"] else 0)'
EOF
end=$(( $(date +%s) + {int(MINUTES * 60)} ))
step() {{
  runs=$((runs+1)); t0=$(date +%s)
  out=$(run_client timeout {HANG_S} "$@" 2>&1); rc=$?
  if [ $rc -ne 0 ]; then
    fails=$((fails+1)); echo "SOAK FAIL rc=$rc after $(( $(date +%s) - t0 )) s: $*"; echo "$out" | tail -40
    echo "== dmesg (RDMA and NVMe, first 40)"; dmesg | grep -E "nvme|rdma|vstellar|infiniband" | grep -v requeuing | head -n 40
  fi
}}
while [ $(date +%s) -lt $end ]; do
  step ucx_perftest $VSTELLAR_PEER_IP -p 13337 -d {DEV}:1 -x rc_verbs -t put_bw -D zcopy -s 65536 -n 2000
  step ucx_perftest $VSTELLAR_PEER_IP -p 13338 -t tag_bw -s 65536 -n 2000
  step ib_write_bw -d {DEV} $GIDX_OPT -q 8 -s 65536 -n 2000 -F -p 18515 $VSTELLAR_PEER_IP
  step ib_read_bw -d {DEV} $GIDX_OPT -s 65536 -n 2000 -F -p 18516 $VSTELLAR_PEER_IP
  step sh /tmp/allreduce.sh
  step fio --name=soak --filename=$dev --ioengine=libaio --direct=1 --rw=write --bs=64k --iodepth=8 \
    --size=32M --verify=crc32c --do_verify=1 --verify_fatal=1
  echo "SOAK round done: runs=$runs fails=$fails at $(( $(date +%s) - end + {int(MINUTES * 60)} )) s"
  [ $fails -gt 0 ] && break
done
echo "SOAK client: runs=$runs fails=$fails"
nvme disconnect -n {ulp.NQN} > /dev/null
vstellar-mpi release $VSTELLAR_PEER_IP
i=0; until echo done | nc $VSTELLAR_PEER_IP 5099; do i=$((i + 1)); [ $i -lt 30 ] || break; sleep 1; done
[ $fails -eq 0 ]
"""


def main():
    env = f'export UCX_NET_DEVICES={DEV}:1 GIDX_OPT="{pt.VSTELLAR_COMMON}"'
    retry = pt.client_retry("connect() failed\\|Connection refused\\|Couldn't connect")
    server = "\n".join([pt.VSTELLAR_SETUP, env, ROUND_SERVER]) + "\n"
    client = "\n".join([pt.VSTELLAR_SETUP, env, retry, ROUND_CLIENT]) + "\n"
    fab = vsfabric.Fabric(tors=2, hosts=1, aggs=AGGS)
    stop = threading.Event()
    toggles = [0]

    def faults(_session):
        # One uplink of the sender's ToR toggles between a black hole and
        # healthy, another between 1% loss and none.
        def run():
            hole = False
            while not stop.wait(TOGGLE_S):
                hole = not hole
                fab.set_loss(1, 0, 1.0 if hole else 0.0)
                fab.set_loss(1, 1 % AGGS, 0.01 if hole else 0.0)
                toggles[0] += 1
        threading.Thread(target=run, daemon=True).start()

    try:
        fab.build()
        hosts = [(fab.host(t, 0), fab.host_ip(t, 0)) for t in range(2)]
        addrs = [f"{ip}/16" for _ns, ip in hosts]
        print(f"guest-soak: {MINUTES:g} min, faults every {TOGGLE_S:g} s on ToR t1's uplinks, "
              f"hang = {HANG_S} s without progress", flush=True)
        daemons = []
        t0 = time.monotonic()
        # fio is in the guest image's "fio" variant (tools/build-guest-overlay.sh).
        results = vg.run_guests([server, client], vstellar=True, vstellar_hosts=hosts,
                                image=vg.overlay_image("fio", "fio"),
                                guest_addrs=addrs, timeout=int(MINUTES * 60) + 10 * HANG_S,
                                daemons_out=daemons, during=faults,
                                echo=lambda line: line.startswith("SOAK") and print(line, flush=True))
        stop.set()
        took = time.monotonic() - t0
    finally:
        stop.set()
        fab.destroy()
    ok = results[1][0] == 0
    for i, d in enumerate(daemons):
        e = (d.get("stats") or {}).get("engine", {})
        devs = (d.get("stats") or {}).get("devices", [])
        print(f"guest-soak: vstellard {i}: cqes={sum(x.get('cqes', 0) for x in devs)} "
              f"timeouts={e.get('timeouts')} spurious={e.get('spurious_timeouts')} "
              f"retx={e.get('retx_pkts')} paths_set_aside={e.get('paths_set_aside')} "
              f"read_gap_losses={e.get('read_gap_losses')} path_gap_losses={e.get('path_gap_losses')} "
              f"stalled_qps={e.get('stalled_qps')} "
              f"missed_kicks={sum(x.get('missed_kicks', 0) for x in devs)}")
    for line in results[0][1] + results[1][1]:
        if line.startswith("SOAK"):
            print(line)
    print(f"guest-soak: {took / 60:.1f} min, {toggles[0]} fault toggles, client status {results[1][0]}")
    if not ok:
        print("\n".join(results[1][1][-40:]))
        print(vg.daemon_report(daemons))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
