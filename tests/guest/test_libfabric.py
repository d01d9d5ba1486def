"""libfabric between two vStellar guests: Debian 12's libfabric 1.17
(fi_pingpong, unmodified) over its verbs provider on vstellar0, connected
endpoints (FI_EP_MSG: rdma_cm and RC QPs) and reliable datagrams through
the rxm utility provider (`verbs;ofi_rxm`, FI_EP_RDM: RC connections made
on demand, receives on a shared receive queue, a CQ sized for the universe:
rxm asks for ~99K CQEs with its defaults).

Asserts behaviour (exit status, the transfer row with every message
acknowledged), never timings.
"""
import re
import unittest

from vstellar import guest as vg, perftest as pt

# (name, fi_pingpong arguments); -I iterations, -S message size.
TESTS = [
    ("verbs msg", "-p verbs -e msg -I 100 -S 4096"),
    ("verbs rxm rdm", "-p 'verbs;ofi_rxm' -e rdm -I 100 -S 4096"),
]
# The client may start before the server listens.
CLIENT_RETRY = pt.client_retry("Connection refused\\|ctrl/connect\\|ctrl_init")


def scripts():
    server = [pt.VSTELLAR_SETUP, "set -e"]
    client = [pt.VSTELLAR_SETUP, CLIENT_RETRY, "set -e"]
    for i, (name, args) in enumerate(TESTS):
        port = 47592 + i  # the control connection: server listens (-B), client dials (-P)
        server.append(f"echo '== {name}'")
        server.append(f"timeout 120 fi_pingpong {args} -B {port}")
        client.append(f"echo '== {name}'")
        client.append(f"run_client timeout 120 fi_pingpong {args} -P {port} $VSTELLAR_PEER_IP")
    return "\n".join(server) + "\n", "\n".join(client) + "\n"


class LibfabricTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        vg.Artifacts().vstellard  # missing pieces fail the test: `make test` builds them
        server, client = scripts()
        cls.results = vg.run_guests([server, client], vstellar=True, timeout=400)
        cls.sections = [pt.split_sections(out) for _status, out, _console in cls.results]

    def test_guests_succeeded(self):
        for i, (status, out, console) in enumerate(self.results):
            self.assertEqual(status, 0, f"guest{i} output:\n" + "\n".join(out[-40:]))

    def test_every_message_acknowledged(self):
        for side in (0, 1):
            for name, _args in TESTS:
                with self.subTest(side=side, test=name):
                    text = "\n".join(self.sections[side].get(name, []))
                    # bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
                    m = re.search(r"^4k\s+100\s+=100\s", text, re.M)
                    self.assertIsNotNone(m, text[-1500:])


if __name__ == "__main__":
    unittest.main()
