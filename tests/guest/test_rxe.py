"""The rxe baseline end to end: two guests, Soft-RoCE on virtio-net, perftest."""
import unittest

from vstellar import guest as vg, perftest as pt

TESTS = [("ib_write_bw", "-s 65536 -n 100 -F --report_gbits"),
         ("ib_write_lat", "-s 8 -n 200 -F")]


class RxeTest(unittest.TestCase):
    def test_write_bw_and_lat_between_two_guests(self):
        server, client = pt.perftest_pair(TESTS, "rxe0", setup=pt.RXE_SETUP)
        results = vg.run_guests([server, client], modules=pt.RXE_MODULES, timeout=600)
        for i, (status, out, console) in enumerate(results):
            self.assertEqual(status, 0, f"guest{i}:\n" + "\n".join(console))
        sections = pt.split_sections(results[1][1])
        out = sections["ib_write_bw " + TESTS[0][1]]
        bw = pt.parse_bw(out)
        self.assertEqual(len(bw), 1, sections)
        self.assertEqual((bw[0]["bytes"], bw[0]["iterations"]), (65536, 100))
        pt.check_rate(self, bw[0]["bw_avg_gbps"], out)
        lat = pt.parse_lat(sections["ib_write_lat " + TESTS[1][1]])
        self.assertEqual(len(lat), 1, sections)
        self.assertEqual((lat[0]["bytes"], lat[0]["iterations"]), (8, 200))
        self.assertGreater(lat[0]["t_typical_us"], 0.0)
        self.assertLessEqual(lat[0]["t_min_us"], lat[0]["t_typical_us"])


if __name__ == "__main__":
    unittest.main()
