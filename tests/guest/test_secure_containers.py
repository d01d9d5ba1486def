"""Secure containers: the perftest container image run as microVMs.

`make guest` builds the container image offline (tools/build-container-
image.sh: busybox, perftest from its .deb, our rdma-core build) and
tools/build-microvm.sh appends its root filesystem to our initramfs; /init
then runs the command chrooted into the image. Two such microVMs, each with
its own vstellard and vStellar device created when it starts, run
ib_write_bw and ib_send_bw against each other.
"""
import unittest

from vstellar import guest as vg, perftest as pt

TESTS = [("ib_write_bw", "-x $GIDX -s 65536 -n 200 -F --report_gbits"),
         ("ib_send_bw", "-x $GIDX -s 4096 -n 200 -F --report_gbits")]

# Inside the image: its own root (no python3, which the guest's initramfs
# has), the device node passed in, memlock limits as the guest set them.
WHERE = """\
echo '== where'
command -v python3 || echo no-python3
command -v ib_write_bw
ls /dev/infiniband
ulimit -l
"""


class SecureContainerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        image, cls.default_cmd = vg.microvm_image(None)
        server, client = pt.perftest_pair(TESTS, pt.VSTELLAR_DEVICE, setup=pt.VSTELLAR_SETUP + WHERE)
        cls.daemons = []
        cls.results = vg.run_guests([server, client], image=image, vstellar=True, timeout=500,
                                    daemons_out=cls.daemons)
        cls.sections = [pt.split_sections(out) for _status, out, _console in cls.results]

    def test_containers_succeeded(self):
        for i, (status, _out, console) in enumerate(self.results):
            self.assertEqual(status, 0, f"container{i}:\n" + "\n".join(console[-80:]) +
                             "\n--- vstellard ---\n" + self.daemons[i]["log"][-3000:])

    def test_ran_inside_the_image(self):
        self.assertEqual(self.default_cmd, "ib_write_bw")
        for i in range(2):
            where = self.sections[i].get("where", [])
            self.assertIn("no-python3", where)
            self.assertIn("/usr/bin/ib_write_bw", where)
            self.assertIn("uverbs0", " ".join(where))
            self.assertIn("unlimited", where)

    def test_perftest_between_containers(self):
        for tool, args in TESTS:
            with self.subTest(tool=tool):
                out = self.sections[1].get(f"{tool} {args}", [])
                rows = pt.parse_bw(out)
                self.assertEqual(len(rows), 1, self.sections[1])
                self.assertEqual(rows[0]["iterations"], 200)
                pt.check_rate(self, rows[0]["bw_avg_gbps"], out)

    def test_one_device_per_container(self):
        for d in self.daemons:
            self.assertEqual(d["log"].count(": created in"), 1, d["log"])
            self.assertGreater(d["stats"]["devices"][0]["wqes"], 0)


if __name__ == "__main__":
    unittest.main()
