"""UCX between two guests over vStellar: Debian 12's UCX 1.13 (ucx_perftest),
unmodified, on the vstellar0 device of each guest, each served by its own
vstellard.

UCT level: rc_verbs put/get/active-message bandwidth and put latency (RC
QPs on a shared receive queue: rc_verbs creates an SRQ when it opens its
interface), ud_verbs active messages (UD, whose receives UCX accepts only
if the completion says the GRH holds IPv4: ibv_wc.sl = 2). UCP level:
tag_bw and tag_lat with UCX's default transport selection, restricted to
the device by UCX_NET_DEVICES the way a user names the NIC to use.

Asserts behaviour (exit status, UCX's final report row, the transport UCX
says it uses, and that vstellard moved the bytes), never timings.
"""
import re
import sys
import unittest

from vstellar import guest as vg, perftest as pt

DEV = "vstellar0:1"
# (name, ucx_perftest arguments after the server address). The UCT tests
# name device and transport; the UCP ones let UCX choose on the device.
TESTS = [
    # Large messages go zero-copy (-D zcopy: RDMA from the registered
    # buffer) or through bounce buffers (bcopy); 8-byte ones inline (short).
    ("rc put_bw", f"-d {DEV} -x rc_verbs -t put_bw -D zcopy -s 65536 -n 200"),
    ("rc get", f"-d {DEV} -x rc_verbs -t get -D zcopy -s 65536 -n 200"),
    ("rc am_bw", f"-d {DEV} -x rc_verbs -t am_bw -D bcopy -s 4096 -n 500"),
    ("rc put_lat", f"-d {DEV} -x rc_verbs -t put_lat -s 8 -n 200"),
    # A UD message is one datagram: within the port MTU (1024) less UCX's header.
    ("ud am_bw", f"-d {DEV} -x ud_verbs -t am_bw -D bcopy -s 512 -n 500"),
    ("ud am_lat", f"-d {DEV} -x ud_verbs -t am_lat -s 8 -n 200"),
    ("tag_bw", "-t tag_bw -s 65536 -n 200"),
    ("tag_lat", "-t tag_lat -s 8 -n 200"),
]
ENV = f"export UCX_NET_DEVICES={DEV} UCX_LOG_LEVEL=info"

# ucx_perftest's server takes the test parameters from its client and
# serves one test; the client retries until the server listens (bounded).
# The client may start before the server listens.
CLIENT_RETRY = pt.client_retry("connect() failed\\|Connection refused")


def scripts():
    server = [pt.VSTELLAR_SETUP, ENV, "set -e"]
    client = [pt.VSTELLAR_SETUP, ENV, CLIENT_RETRY, "set -e"]
    for i, (name, args) in enumerate(TESTS):
        port = 13337 + i
        server.append(f"echo '== {name}'")
        server.append(f"timeout 300 ucx_perftest -p {port}")
        client.append(f"echo '== {name}'")
        client.append(f"run_client timeout 300 ucx_perftest $VSTELLAR_PEER_IP -p {port} {args}")
    return "\n".join(server) + "\n", "\n".join(client) + "\n"


def final_row(lines):
    """The numbers of ucx_perftest's 'Final:' row, or None."""
    for line in lines:
        if line.strip().startswith("Final:"):
            return [float(x) for x in re.findall(r"[-+]?\d+(?:\.\d+)?", line)]
    return None


class UcxTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        vg.Artifacts().vstellard  # missing pieces fail the test: `make test` builds them
        server, client = scripts()
        cls.daemons = []
        cls.results = vg.run_guests([server, client], vstellar=True, timeout=800,
                                    daemons_out=cls.daemons)
        cls.sections = [pt.split_sections(out) for _status, out, _console in cls.results]
        # The figures, for the log (ctest -V): UCX's own final rows.
        for name, _args in TESTS:
            rows = [l.strip() for l in cls.sections[1].get(name, []) if l.strip().startswith("Final:")]
            print(f"ucx_perftest {name}: {rows[0] if rows else 'no final row'}", file=sys.stderr)

    def test_guests_succeeded(self):
        # Each guest on its own: when one hangs, the other's output and
        # both daemons' logs say why.
        for i, (status, out, console) in enumerate(self.results):
            with self.subTest(guest=i):
                self.assertEqual(status, 0, f"guest{i} output:\n" + "\n".join(out[-60:]) +
                                 "\nconsole:\n" + "\n".join(console[-30:]) +
                                 "\n" + vg.daemon_report(self.daemons))

    def test_every_test_reports_a_final_row(self):
        client = self.sections[1]
        for name, _args in TESTS:
            with self.subTest(test=name):
                self.assertIn(name, client, f"ran only: {list(client)}")
                row = final_row(client[name])
                self.assertIsNotNone(row, "\n".join(client[name][-20:]))
                self.assertGreater(len(row), 3)

    def test_ucp_picks_the_device(self):
        # UCX_LOG_LEVEL=info makes UCP print the transports it chose.
        for name in ("tag_bw", "tag_lat"):
            text = "\n".join(self.sections[1].get(name, []))
            with self.subTest(test=name):
                self.assertRegex(text, r"(rc_verbs|ud_verbs)/vstellar0:1", text[-2000:])

    def test_bytes_went_through_vstellard(self):
        # 200 puts of 64 KiB leave the client's daemon, 200 gets of 64 KiB
        # the server's: 13 MB each, whatever else UCX sends.
        for i, d in enumerate(self.daemons):
            stats = d.get("stats") or {}
            engine = stats.get("engine", {})
            with self.subTest(daemon=i):
                self.assertGreater(engine.get("tx_bytes", 0), 13_000_000, d.get("log", "")[-2000:])


if __name__ == "__main__":
    unittest.main()
