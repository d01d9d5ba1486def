#!/usr/bin/env python3
"""packaging.stock_guests: stock Debian guests with our packages (docs/own-vms.md).

Two guests from Debian's archive (tools/build-stock-guest.sh: mmdebstrap,
then dpkg -i of vstellar-dkms and the provider, DKMS building vstellar.ko at
image build): Debian 12 with its kernel 6.1, rdma-core 44 and perftest, and
Debian 13 with kernel 6.12 and rdma-core 56.1. Each boots its own kernel and
root file system, loads the DKMS-built driver, and the two run ib_write_bw
and rping against each other over vStellar, on the distributions' own
libibverbs and librdmacm. Behaviour is asserted, never timings.
"""
import os
import re
import subprocess
import sys
import unittest

from debs import DEB_DIR, TOP

from vstellar import guest as vg, perftest as pt

DEV = pt.VSTELLAR_DEVICE
WRITE_BW = ("ib_write_bw", "-x $GIDX -s 65536 -n 100 -F --report_gbits")
STOCK = """\
echo '== stock'
echo "kernel $(uname -r)"
echo "libibverbs1 $(dpkg-query -W -f '${Version}' libibverbs1)"
echo "provider $(dpkg-query -W -f '${db:Status-Abbrev}${Package} ' 'vstellar-provider-*' | sed -n 's/.*ii *\\(vstellar-provider-[^ ]*\\).*/\\1/p')"
echo "module $(modinfo -n vstellar)"
"""
SUITES = (("bookworm", r"6\.1\.0-\d+-amd64", r"44\.", "vstellar-provider-rdma44"),
          ("trixie", r"6\.12\.\d+\+deb13-amd64", r"56\.", "vstellar-provider-rdma56"))


def image(suite):
    r = subprocess.run([os.path.join(TOP, "tools/build-stock-guest.sh"), suite, DEB_DIR],
                       capture_output=True, text=True, timeout=3000)
    if r.returncode:
        raise AssertionError(f"build-stock-guest.sh {suite}: {r.stderr}")
    return r.stdout.strip()


class StockGuests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        images = [image(s[0]) for s in SUITES]
        server, client = pt.perftest_pair([WRITE_BW], DEV, setup=pt.VSTELLAR_SETUP + STOCK)
        cls.daemons = []
        cls.results = vg.run_guests([server + pt.RPING_SERVER, client + pt.RPING_CLIENT],
                                    vstellar=True, images=images, timeout=900, daemons_out=cls.daemons)
        cls.sections = [pt.split_sections(out) for _status, out, _console in cls.results]

    def test_guests_succeeded(self):
        for i, (status, _out, console) in enumerate(self.results):
            self.assertEqual(status, 0, f"guest{i} ({SUITES[i][0]}):\n" + "\n".join(console[-80:]) +
                             "\n--- vstellard ---\n" + self.daemons[i]["log"][-3000:])

    def test_each_runs_its_distributions_kernel_rdma_core_and_our_packages(self):
        for i, (suite, kernel, rdma, provider) in enumerate(SUITES):
            with self.subTest(suite=suite):
                out = "\n".join(self.sections[i].get("stock", []))
                self.assertRegex(out, rf"(?m)^kernel {kernel}$")
                self.assertRegex(out, rf"(?m)^libibverbs1 {rdma}")
                self.assertRegex(out, rf"(?m)^provider {provider}$")
                self.assertRegex(out, r"(?m)^module /lib/modules/\S+/updates/dkms/vstellar\.ko")

    def test_ib_write_bw(self):
        out = self.sections[1].get(" ".join(WRITE_BW), [])
        rows = pt.parse_bw(out)
        self.assertEqual(len(rows), 1, self.sections[1])
        self.assertEqual((rows[0]["bytes"], rows[0]["iterations"]), (65536, 100))
        pt.check_rate(self, rows[0]["bw_avg_gbps"], out)
        print(f"\nib_write_bw Debian 12 <- Debian 13, 64 KiB: {rows[0]['bw_avg_gbps']} Gb/s", file=sys.stderr)

    def test_rping(self):
        for i in range(2):
            out = "\n".join(self.sections[i].get("rping", []))
            pings = re.findall(r"ping data: rdma-ping-(\d+): ", out)
            self.assertEqual([int(p) for p in pings], list(range(pt.RPING_PINGS)), out)


if __name__ == "__main__":
    unittest.main()
