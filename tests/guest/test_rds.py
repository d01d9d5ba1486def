"""RDS over RDMA on vStellar: the kernel's Reliable Datagram Sockets with
their RDMA transport (rds_rdma: kernel RC QPs set up by rdma_cm, fast
registrations), unmodified, between two guests.

Python's socket module speaks AF_RDS: guest 1 echoes every datagram it
gets on an RDS socket; guest 0 sends random payloads of several sizes
(up to 64 KiB, beyond one RDS fragment) and checks each echo byte for
byte. The transport is RDMA, not RDS over TCP: rds_tcp is not loaded, and
each vstellard sent more bytes than the payloads. Asserts behaviour, never
timings.
"""
import unittest

import guestlib
from vstellar import perftest as pt

PORT = 18634
COUNT = 200
SIZES = (1, 100, 4096, 9000, 65536)

ECHO = f"""\
import socket, sys
s = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET, 0)
s.bind((sys.argv[1], {PORT}))
s.settimeout(300)
n = 0
while n < {COUNT} * {len(SIZES)}:
    data, addr = s.recvfrom(1 << 17)
    s.sendto(data, addr)
    if not data.startswith(b"hello "):  # the sender's handshake does not count
        n += 1
print("echoed", n)
"""
SEND = f"""\
import os, socket, sys
s = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET, 0)
s.bind((sys.argv[1], 0))
peer = (sys.argv[2], {PORT})
# A handshake first: it may reach the peer before it listens, so it is
# resent until one comes back; RDS is reliable, so later copies of it may
# still be echoed, and they are told from the payloads by their prefix.
hello = b"hello " + os.urandom(16).hex().encode()
s.settimeout(1)
for attempt in range(60):
    s.sendto(hello, peer)
    try:
        if s.recvfrom(1 << 17)[0] == hello:
            break
    except socket.timeout:
        pass
else:
    raise SystemExit("no echo of the handshake")
s.settimeout(120)
ok = 0
for size in {SIZES}:
    for i in range({COUNT}):
        p = os.urandom(size)
        s.sendto(p, peer)
        back, addr = s.recvfrom(1 << 17)
        while back.startswith(b"hello "):
            back, addr = s.recvfrom(1 << 17)
        assert addr == peer and back == p, (size, i, len(back))
        ok += 1
print("verified", ok)
"""

SERVER = pt.VSTELLAR_SETUP + f"""\
set -e
modprobe rds_rdma
cat > /tmp/echo.py <<'EOF'
{ECHO}EOF
echo "== echo"
python3 /tmp/echo.py $VSTELLAR_SELF_IP
"""
CLIENT = pt.VSTELLAR_SETUP + f"""\
set -e
modprobe rds_rdma
cat > /tmp/send.py <<'EOF'
{SEND}EOF
echo "== send"
python3 /tmp/send.py $VSTELLAR_SELF_IP $VSTELLAR_PEER_IP
echo "== transports"
lsmod | grep -c '^rds_tcp' || true
"""


class RdsTest(guestlib.KernelUlpCase):
    SCRIPTS = (CLIENT, SERVER)
    TIMEOUT = 500

    def test_every_datagram_echoed_intact(self):
        n = COUNT * len(SIZES)
        self.assertIn(f"verified {n}", self.sections[0].get("send", []), self.results[0][1])
        self.assertIn(f"echoed {n}", self.sections[1].get("echo", []), self.results[1][1])

    def test_rdma_transport(self):
        self.assertEqual(self.sections[0].get("transports", ["?"])[0].strip(), "0")  # no rds_tcp
        payload = COUNT * sum(SIZES)
        self.assertDaemonsSent(payload)


if __name__ == "__main__":
    unittest.main()
