"""UD multicast between two guests through rdma_cm: librdmacm's mckey.

Each guest's vstellard runs in its own host namespace on the fabric
bridge; a group's datagrams cross it as IP multicast (docs/transport.md).
Guest 0 joins 230.7.7.7 (rdma_join_multicast, then librdmacm attaches its
UD QP: ibv_attach_mcast) and waits for 5 messages. Guest 1 joins the same
group and sends 5 messages per round until guest 0 answers on a second
group, 230.7.7.8, which guest 1 listens to between its rounds: so both
directions and both kinds of member (sender and receiver) are exercised,
and no side waits a fixed time for the other. Guest 0 answers in rounds
until guest 1 says on TCP (busybox nc) that an answer arrived: each
mckey pauses 3 s after joining, so answering a fixed 12 rounds kept guest
0 running half a minute after guest 1 was done. The test asserts both
exit statuses and that the datagrams went through the daemons (their UD
counters), never timings.
"""
import unittest

from vstellar import guest as vg, perftest as pt

MESSAGES = 5
HEARD_PORT = 5002  # TCP: the sender tells the receiver its answer arrived
RECEIVER = f"""\
echo '== mckey'
timeout 300 mckey -m 230.7.7.7 -b $VSTELLAR_SELF_IP -C {MESSAGES} || exit 1
echo '== answer'
timeout 300 nc -l -p {HEARD_PORT} > /tmp/heard &
i=0
while [ $i -lt 12 ] && [ ! -s /tmp/heard ]; do
  timeout 60 mckey -m 230.7.7.8 -b $VSTELLAR_SELF_IP -s -C 3 > /tmp/answer.out 2>&1 || {{ cat /tmp/answer.out; exit 1; }}
  i=$((i + 1))
done
echo "answered in $i rounds"
"""
SENDER = f"""\
echo '== mckey'
i=0
until timeout 20 mckey -m 230.7.7.8 -b $VSTELLAR_SELF_IP -C 1 > /tmp/answer.out 2>&1; do
  timeout 60 mckey -m 230.7.7.7 -b $VSTELLAR_SELF_IP -s -C {MESSAGES} > /tmp/send.out 2>&1 || {{ cat /tmp/send.out; exit 1; }}
  i=$((i + 1)); [ $i -lt 30 ] || {{ echo 'no answer from the receiver'; cat /tmp/answer.out; exit 1; }}
done
# The receiver answers until told; if telling fails, it stops after its rounds.
echo heard | nc -w 5 $VSTELLAR_PEER_IP {HEARD_PORT} || echo 'could not tell the receiver'
cat /tmp/send.out /tmp/answer.out
"""


class MulticastTest(unittest.TestCase):
    def test_mckey_between_two_guests(self):
        daemons = []
        results = vg.run_guests([pt.VSTELLAR_SETUP + RECEIVER, pt.VSTELLAR_SETUP + SENDER],
                                vstellar=True, timeout=900, daemons_out=daemons)
        for i, (status, out, console) in enumerate(results):
            self.assertEqual(status, 0, f"guest{i}:\n" + "\n".join(out[-40:] + console[-40:]))
        self.assertIn("mckey: joining", "\n".join(results[0][1]))
        self.assertEqual(len(daemons), 2)
        for i, d in enumerate(daemons):
            eng = d["stats"]["engine"]
            # each side sent datagrams to a group and got the other's
            self.assertGreater(eng["ud_sent"], 0, f"daemon {i}: {eng}")
            self.assertGreaterEqual(eng["ud_rcvd"], MESSAGES if i == 0 else 1, f"daemon {i}: {eng}")


if __name__ == "__main__":
    unittest.main()
