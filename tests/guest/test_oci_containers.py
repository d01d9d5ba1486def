"""OCI containers in guests: perftest in crun containers over vStellar.

The guests boot the OCI image variant (vstellar.guest.oci_image: Debian's
crun, tools/oci/vstellar-oci-bundle and the perftest container image as a
tarball, a second cpio over the test image). Each container is a bundle
made from the tarball, with /dev/infiniband passed in, the host's network
and RLIMIT_MEMLOCK as given, run by `crun run --no-pivot` (the guest's
root is its initramfs, which pivot_root cannot leave).

- one container per guest: ib_write_bw between them;
- two containers per guest at once on the one vstellar0, each pair on its
  own port;
- while those run, a container whose memlock limit is 64 KiB (no
  CAP_IPC_LOCK) registers a 1 MiB buffer (ibv_rc_pingpong -s 1048576,
  which registers before it connects; perftest connects first): the kernel
  refuses the pinning (ENOMEM), the program says "Couldn't register MR"
  and exits, and the two running pairs finish unharmed.
- UCX: ucx_perftest (tag_bw, 64 KiB) between containers on the two
  guests, UCP choosing its transport on vstellar0;
- rootless: an unprivileged user runs crun (a user namespace mapping the
  container's root to that user, device nodes bind mounted, no device
  cgroup) with ib_write_bw between two such containers on guest 0; and
  crun refuses a memlock limit above the user's hard limit.

No timings are asserted: perftest's bandwidth needs its CPU-clock estimate,
which fails (reports 0) on a loaded TCG guest.
"""
import unittest

from guestlib import KernelUlpCase, splats
from vstellar import guest as vg, perftest as pt

DEV = pt.VSTELLAR_DEVICE
ARGS = f"-d {DEV} -x $GIDX -s 65536 -n 500 -F --report_gbits"

COMMON = pt.VSTELLAR_SETUP + f"""\
mount -t cgroup2 cgroup2 /sys/fs/cgroup || exit 1
crun --version | head -n 1
# mk NAME [bundle options] -- COMMAND...: a bundle from the image tarball
mk() {{ n=$1; shift; rm -rf /run/oci/$n; vstellar-oci-bundle --image {vg.OCI_IMAGE_TAR} --dir /run/oci/$n --hostname $n "$@"; }}
ctr() {{ crun run --no-pivot --bundle /run/oci/$1 $1; }}
# report SECTION PID OUT: wait for a background container, print its output
report() {{ echo "== $1"; wait $2; r=$?; cat $3; echo "container-exit $r"; return $r; }}
"""

SERVER = COMMON + f"""\
echo '== where'
mk where -- sh -c 'hostname; ls -1 /dev/infiniband; ulimit -l; command -v ib_write_bw; command -v python3 || echo no-python3; ibv_devices' || exit 1
ctr where || exit 1
echo '== single'
mk s1 -- ib_write_bw {ARGS} -p 18515 || exit 1
ctr s1 || exit 1
mk s2 -- ib_write_bw {ARGS} -p 18516 || exit 1
mk s3 -- ib_write_bw {ARGS} -p 18517 || exit 1
mk nomem --memlock 65536 -- sh -c "ulimit -l; ibv_rc_pingpong -d {DEV} -g $GIDX -s 1048576 -p 18518; echo exit \\$?" || exit 1
ctr s2 > /tmp/s2.out 2>&1 & p2=$!
ctr s3 > /tmp/s3.out 2>&1 & p3=$!
echo '== nomemlock'
ctr nomem
report shared-a $p2 /tmp/s2.out; r2=$?
report shared-b $p3 /tmp/s3.out || exit 1
[ $r2 = 0 ] || exit 1
echo '== ucx'
mk us -- sh -c "UCX_NET_DEVICES={DEV}:1 UCX_LOG_LEVEL=info timeout 300 ucx_perftest -p 13337" || exit 1
ctr us || exit 1
echo '== rootless'
echo "u:x:1000:1000::/tmp/u:/bin/sh" >> /etc/passwd
echo "u:x:1000:" >> /etc/group
mkdir -p /tmp/u/run && chown -R 1000:1000 /tmp/u && chmod 700 /tmp/u/run
cat > /tmp/u/go.sh <<EOF
export XDG_RUNTIME_DIR=/tmp/u/run HOME=/tmp/u
run() {{ crun --cgroup-manager=disabled run --no-pivot --bundle /tmp/u/\$1 \$1; }}
mk() {{ n=\$1; shift; vstellar-oci-bundle --rootless --image {vg.OCI_IMAGE_TAR} --dir /tmp/u/\$n "\$@"; }}
mk who -- sh -c 'echo "inside \$(id -u) \$(cat /proc/self/uid_map)"; ulimit -l' || exit 1
mk rs -- ib_write_bw {ARGS} -p 18519 || exit 1
mk rc -- ib_write_bw {ARGS} -p 18519 $VSTELLAR_SELF_IP || exit 1
echo "outside \$(id -u)"
run who || exit 1
run rs > /tmp/u/rs.out 2>&1 & p=\$!
i=0
until run rc > /tmp/u/rc.out 2>&1; do
  grep -q "{pt.PERFTEST_NOT_LISTENING}" /tmp/u/rc.out && [ \$i -lt 60 ] || {{ cat /tmp/u/rc.out; exit 1; }}
  i=\$((i + 1)); sleep 1
done
wait \$p || {{ cat /tmp/u/rs.out; exit 1; }}
cat /tmp/u/rc.out
echo '== rootless-over-limit'
ulimit -l 64
run who; echo "exit \$?"
EOF
su u -s /bin/sh -c 'sh /tmp/u/go.sh' || exit 1
echo '== after'
"""

CLIENT = COMMON + f"""\
# run_client OUT NAME: run container NAME until its perftest finds the server
run_client() {{
  i=0
  while [ $i -lt 120 ]; do
    ctr $2 > $1 2>&1 && return 0
    grep -q "{pt.PERFTEST_NOT_LISTENING}" $1 || return 1
    i=$((i + 1)); sleep 1
  done
  return 1
}}
echo '== single'
mk c1 -- ib_write_bw {ARGS} -p 18515 $VSTELLAR_PEER_IP || exit 1
run_client /tmp/c1.out c1; r=$?; cat /tmp/c1.out; [ $r = 0 ] || exit 1
mk c2 -- ib_write_bw {ARGS} -p 18516 $VSTELLAR_PEER_IP || exit 1
mk c3 -- ib_write_bw {ARGS} -p 18517 $VSTELLAR_PEER_IP || exit 1
run_client /tmp/c2.out c2 & p2=$!
run_client /tmp/c3.out c3 & p3=$!
report shared-a $p2 /tmp/c2.out; r2=$?
report shared-b $p3 /tmp/c3.out || exit 1
[ $r2 = 0 ] || exit 1
echo '== ucx'
# UCX between containers: UCP picks its transport on the device it is given
mk uc -- sh -c "UCX_NET_DEVICES={DEV}:1 UCX_LOG_LEVEL=info ucx_perftest $VSTELLAR_PEER_IP -p 13337 -t tag_bw -s 65536 -n 200" || exit 1
i=0
until ctr uc > /tmp/uc.out 2>&1; do
  grep -q "connect() failed\|Connection refused" /tmp/uc.out && [ $i -lt 120 ] || {{ cat /tmp/uc.out; exit 1; }}
  i=$((i + 1)); sleep 1
done
cat /tmp/uc.out
echo '== after'
"""


class OciContainerTest(KernelUlpCase):
    SCRIPTS = (SERVER, CLIENT)

    @classmethod
    def image(cls):
        return vg.oci_image()

    def test_container_sees_the_device_and_its_own_root(self):
        where = self.sections[0].get("where", [])
        self.assertEqual(where[0], "where", where)             # its own UTS namespace
        self.assertIn("rdma_cm", where)
        self.assertTrue(any(w.startswith("uverbs") for w in where), where)
        self.assertIn("unlimited", where)
        self.assertIn("/usr/bin/ib_write_bw", where)
        self.assertIn("no-python3", where)                      # the image's root, not the guest's
        self.assertRegex("\n".join(where), rf"(?m)^\s+{DEV}\s+[0-9a-f]{{16}}$")

    def test_perftest_between_containers(self):
        for section in ("single", "shared-a", "shared-b"):
            with self.subTest(section=section):
                rows = pt.parse_bw(self.sections[1].get(section, []))
                self.assertEqual(len(rows), 1, self.sections[1].get(section))
                self.assertEqual((rows[0]["bytes"], rows[0]["iterations"]), (65536, 500))
                for i in range(2):
                    if section != "single":
                        self.assertIn("container-exit 0", self.sections[i][section])

    def test_ucx_between_containers(self):
        out = self.sections[1].get("ucx", [])
        text = "\n".join(out)
        self.assertTrue(any(line.strip().startswith("Final:") for line in out), text[-2000:])
        self.assertRegex(text, rf"(rc_verbs|ud_verbs)/{DEV}:1", text[-2000:])  # UCP's choice, on vStellar

    def test_container_without_memlock_fails_clearly(self):
        out = self.sections[0].get("nomemlock", [])
        text = "\n".join(out)
        self.assertEqual(out[0], "64", text)                    # ulimit -l, in KiB
        self.assertIn("Couldn't register MR", text)
        self.assertRegex(text, r"(?m)^exit [1-9]", text)

    def test_rootless(self):
        # crun as an unprivileged user: the container's root is that user
        out = self.sections[0].get("rootless", [])
        self.assertIn("outside 1000", out)
        self.assertIn("inside 0 0 1000 1", [" ".join(x.split()) for x in out], out)
        self.assertIn("unlimited", out)
        rows = pt.parse_bw(out)
        self.assertEqual(len(rows), 1, out)
        self.assertEqual((rows[0]["bytes"], rows[0]["iterations"]), (65536, 500))
        # no memlock above the user's hard limit: crun refuses to start it
        over = "\n".join(self.sections[0].get("rootless-over-limit", []))
        self.assertRegex(over, r"(?m)^exit [1-9]", over)
        self.assertNotIn("inside", over)

    def test_no_kernel_splats(self):
        for i in range(2):
            self.assertEqual(splats(self.results[i][1]), 0, self.sections[i].get("after"))

    def test_one_device_shared(self):
        # one device per guest served all its containers
        for d in self.daemons:
            self.assertEqual(len(d["stats"]["devices"]), 1, d["stats"])
            self.assertGreater(d["stats"]["devices"][0]["wqes"], 0)


if __name__ == "__main__":
    unittest.main()
