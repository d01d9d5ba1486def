"""Unmodified RDMA programs across live migrations of both guests (issue 29;
docs/running-guests.md, "Live migration").

Guest 0 serves and guest 1 is the client of three jobs that run at once,
each on vstellar0:
- perftest's `ib_write_bw` for 90 s (RC WRITEs, -D);
- UCX's `ucx_perftest` rc_verbs active-message bandwidth (RC SENDs into the
  shared receive queue rc_verbs makes), as many messages as take about
  105 s at the rate a short first run measured;
- the kernel's NVMe-oF host (nvme-rdma) against guest 0's nvmet-rdma
  target: `fio` writes for 90 s, reading every block back and checking
  it (crc32c) within 32 blocks of writing it (verify_backlog).
Once all three run, guest 1 is migrated (host 1 to host 2) and then guest
0 (host 0 to host 3), each with its RDMA state in QEMU's migration
stream and its address following it. The test wants every program to
exit 0 with its own report (perftest's bandwidth row, UCX's "Final:"
row, fio's run with no error), each still running when the second
migration ended, both migrations completed, and no kernel warnings.

The guests boot the "fio" image variant (fio is not in the test image:
tools/build-guest-overlay.sh, as the NVMe-oF benchmark uses).
"""
import unittest

from guestlib import SPLATS, splats
from vstellar import guest as vg, migration as vm, perftest as pt, ulp

SECONDS = 90
UCX_SECONDS = 105  # UCX's long run: it starts a few seconds before the others
DEV = "vstellar0"
UCX = f"-d {DEV}:1 -x rc_verbs -t am_bw -D bcopy -s 4096"
CAL = 20000  # messages of UCX's first, measuring run
NVME_PORT = 4420

# Guest 0 serves: nvmet exports a null_blk disk, then ib_write_bw's and
# ucx_perftest's servers (two UCX runs: the measuring one and the long one)
# run in the background; it waits for all, and for the host's word that it
# is done with the disk.
SERVER = pt.VSTELLAR_SETUP + ulp.NVMET + f"""\
set -e
{ulp.NULL_BLK}modprobe nvmet
modprobe nvmet-rdma
nvmet_up $VSTELLAR_SELF_IP {NVME_PORT}
set +e
ib_write_bw -d {DEV} -p 18515 -x $GIDX -D {SECONDS} -s 65536 -F --report_gbits > /tmp/wbw.out 2>&1 &
w=$!
(ucx_perftest -p 13337 && ucx_perftest -p 13338) > /tmp/ucx.out 2>&1 &
u=$!
wait $w; r=$?; echo "ib_write_bw-server rc=$r"; [ $r = 0 ] || sed 's/^/wbw-server: /' /tmp/wbw.out
wait $u; r=$?; echo "ucx-server rc=$r"; [ $r = 0 ] || sed 's/^/ucx-server: /' /tmp/ucx.out
timeout 600 nc -l -p 5001 > /dev/null
echo "nvme-target rc=0"
nvmet_down
"""

# Guest 1: the three clients in the background, each writing its output
# to a file and its exit status to another; "apps-running" once all three
# run (the host migrates then); each file printed at the end.
CLIENT = pt.VSTELLAR_SETUP + ulp.NVME_ATTACH + pt.client_retry(
    pt.PERFTEST_NOT_LISTENING + "\\|connect() failed\\|Connection refused") + f"""\
modprobe nvme-rdma
# The NVMe-oF disk first (the slowest to come: the target sets up nvmet),
# so that the three jobs start together.
nvme_attach $VSTELLAR_PEER_IP {NVME_PORT} > /tmp/attach.out 2>&1 || {{ cat /tmp/attach.out; exit 1; }}
# (run_client's output meanwhile: /tmp/jobs/NAME.try)
mkdir -p /tmp/jobs
job() {{ name=$1; shift; ( CLIENT_OUT=/tmp/jobs/$name.try; "$@" > /tmp/jobs/$name.out 2>&1; echo $? > /tmp/jobs/$name.rc ) & }}
fio_job() {{
  cat /tmp/attach.out
  echo "fio-started"
  fio --name=migrate --filename=$dev --ioengine=libaio --direct=1 --rw=write --bs=64k --iodepth=4 \\
    --size=32M --time_based --runtime={SECONDS} --verify=crc32c --verify_backlog=32 --verify_fatal=1 \\
    --do_verify=1 || return 1
  echo "fio-write-done"
  nvme disconnect -n {ulp.NQN}
}}
job fio fio_job
job wbw run_client ib_write_bw -d {DEV} -p 18515 -x $GIDX -D {SECONDS} -s 65536 -F --report_gbits $VSTELLAR_PEER_IP
ms() {{ python3 -c 'import time; print(time.monotonic_ns() // 1000000)'; }}
# UCX runs a number of messages: as many as take UCX_SECONDS at the rate
# of a first run (under this load).
ucx_job() {{
  t0=$(ms)
  run_client ucx_perftest $VSTELLAR_PEER_IP -p 13337 {UCX} -n {CAL} || return 1
  n=$(( {CAL} * {UCX_SECONDS} * 1000 / ($(ms) - t0 + 1) ))
  echo "ucx-messages $n"
  run_client ucx_perftest $VSTELLAR_PEER_IP -p 13338 {UCX} -n $n
}}
job ucx ucx_job
# All three run: fio writes, perftest's QP is connected (its output comes
# at its end: not a tty), UCX's long run has begun. (If one ends first, or they do not start in 4 minutes, there is
# no "apps-running": the host migrates nothing and the test fails with the
# reports.)
i=0
until rdma resource show qp link {DEV}/1 | grep ib_write_bw | grep -q RTS && grep -q "^ucx-messages" /tmp/jobs/ucx.out 2>/dev/null &&
    grep -q "^fio-started" /tmp/jobs/fio.out 2>/dev/null; do
  i=$((i + 1))
  if [ $i -gt 480 ] || ls /tmp/jobs/*.rc > /dev/null 2>&1; then echo "apps-did-not-start $i $(ls /tmp/jobs)"; break; fi
  sleep 0.5
done
[ $i -gt 480 ] || ls /tmp/jobs/*.rc > /dev/null 2>&1 || echo "apps-running"
# Until all three end; a job still running after 4 minutes says every 30 s
# what it is doing (a stall explains itself), and after 6 minutes it is
# ended (the test fails on its report, with the guests still up).
t=0
while [ "$(ls /tmp/jobs/*.rc 2>/dev/null | wc -l)" -lt 3 ]; do
  t=$((t + 1))
  if [ $t -ge 240 ] && [ $((t % 30)) = 0 ]; then
    for name in wbw ucx fio; do
      [ -e /tmp/jobs/$name.rc ] && continue
      echo "still-running $name after $t s:"; tail -n 3 /tmp/jobs/$name.out /tmp/jobs/$name.try 2>/dev/null
    done
    rdma resource show qp link {DEV}/1
    rdma statistic show link {DEV}/1 2>/dev/null | head -n 5
  fi
  if [ $t -ge 360 ]; then
    # (no pkill in the image: the processes by their /proc names)
    echo "jobs-killed"
    for p in /proc/[0-9]*; do
      case "$(cat $p/comm 2>/dev/null)" in ib_write_bw|ucx_perftest|fio) kill -9 ${{p#/proc/}};; esac
    done
    sleep 5; break
  fi
  sleep 1
done
wait
for name in wbw ucx fio; do
  echo "== $name rc=$(cat /tmp/jobs/$name.rc 2>/dev/null)"
  cat /tmp/jobs/$name.out
done
# (the target may not listen yet: it waits for its servers first)
n=0
until echo done | nc $VSTELLAR_PEER_IP 5001; do n=$((n + 1)); [ $n -lt 60 ] || break; sleep 1; done
for name in wbw ucx fio; do [ "$(cat /tmp/jobs/$name.rc 2>/dev/null)" = 0 ] || exit 1; done
"""


class MigrationAppsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        image = vg.overlay_image("fio", "fio")
        cls.daemons, cls.migrations = [], []
        cls.results = vm.run_migration([SERVER + "echo == end\n" + SPLATS, CLIENT + SPLATS], "apps-running",
                                       plan=[(1, 2), (0, 3)], peer_host=True, image=image, timeout=800,
                                       daemons_out=cls.daemons, migrations_out=cls.migrations)
        for m in cls.migrations:
            print(f"migration {m['round']}: guest {m['guest']} host {m['from']} -> {m['to']}: {m['status']}, "
                  f"downtime {m.get('downtime_ms')} ms, total {m.get('total_ms')} ms")
        cls.sections = [pt.split_sections(out) for _status, out, _console in cls.results]

    def output(self, i):
        return "\n".join(self.results[i][2][-100:]) + "\n" + vg.daemon_report(self.daemons)

    def section(self, name):
        """Guest 1's section of job `name` and its exit status."""
        for header, lines in self.sections[1].items():
            if header.startswith(f"{name} rc="):
                return header.split("rc=")[1], lines
        self.fail(f"no section {name}:\n" + self.output(1))

    def test_guests_succeeded(self):
        for i, (status, _out, _console) in enumerate(self.results):
            self.assertEqual(status, 0, f"guest{i}:\n" + self.output(i))
        for line in ("ib_write_bw-server rc=0", "ucx-server rc=0", "nvme-target rc=0"):
            self.assertIn(line, self.results[0][1], self.output(0))

    def test_ib_write_bw(self):
        rc, lines = self.section("wbw")
        self.assertEqual(rc, "0", "\n".join(lines))
        rows = pt.parse_bw(lines)
        self.assertEqual(len(rows), 1, "\n".join(lines))
        self.assertEqual(rows[0]["bytes"], 65536, "\n".join(lines))
        # (its rates may read 0.00 on a busy TCG host: pt.CLOCK_UNCALIBRATED)
        self.assertGreater(rows[0]["iterations"], 0, "\n".join(lines))

    def test_ucx_active_messages(self):
        rc, lines = self.section("ucx")
        self.assertEqual(rc, "0", "\n".join(lines))
        self.assertEqual(len([l for l in lines if l.strip().startswith("Final:")]), 2, "\n".join(lines))

    def test_nvmeof_fio(self):
        rc, lines = self.section("fio")
        text = "\n".join(lines)
        self.assertEqual(rc, "0", text)
        self.assertIn("fio-write-done", lines, text)
        self.assertEqual(text.count("err= 0"), 1, text)
        self.assertNotIn("verify:", text)  # fio's words for a block that does not check

    def test_migrations_of_both_guests(self):
        self.assertEqual([(m["guest"], m["status"]) for m in self.migrations],
                         [(1, "completed"), (0, "completed")],
                         [{k: v for k, v in m.items() if k != "output"} for m in self.migrations])

    def test_every_job_ran_across_both_migrations(self):
        # When the second migration ended, no job had ended yet.
        guest0, guest1 = self.migrations[-1]["output"]
        for line in guest1:
            self.assertFalse(line.startswith("== ") or line == "fio-write-done", line)
        for line in guest0:
            self.assertFalse(line.startswith(("ib_write_bw-server", "ucx-server")), line)

    def test_no_kernel_splats(self):
        for i, (_status, out, _console) in enumerate(self.results):
            self.assertEqual(splats(out), 0, f"guest{i}:\n" + "\n".join(out[-60:]))


if __name__ == "__main__":
    unittest.main()
