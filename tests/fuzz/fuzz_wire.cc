// Fuzz target: wire packets into the engine.
//
// Two engines on a SimNet with one connected RC QP each, as in
// tests/engine/sim_pair.h. The input is a list of datagrams, each injected
// into one engine as if it came from the other, and the simulated network
// then runs so that the engine's answers (ACKs, NAKs, READ responses,
// retransmissions) are exchanged too.
//
// Input: records of  ctl(1) len(2, big-endian) bytes(len).  ctl bits:
//   1  direction: 0 A->B, 1 B->A
//   2  put the real destination and source QPNs into the base header, so
//      the packet reaches the QP (random QPNs almost never would)
//   4  put the receiver's rkey into the extension and make va point into
//      its MR (va modulo the MR's size), so WRITE/READ/atomics get past the
//      key check and into memory placement
//   8  the IP header carried a CE mark
//  16  run the network for 1 ms of virtual time after this packet
//
// What counts as a bug: a sanitizer report (out-of-bounds, use after free,
// undefined behaviour), a crash, or a byte written outside the registered
// MR (the guard bytes around it must stay zero).
#include <algorithm>

#include "fuzz_engine_pair.h"
#include "vstellar/wire.h"

using namespace fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzPair t;
  size_t pos = 0;
  while (pos + 3 <= size) {
    uint8_t ctl = data[pos];
    size_t len = size_t(data[pos + 1]) << 8 | data[pos + 2];
    pos += 3;
    len = std::min(len, size - pos);
    std::vector<uint8_t> pkt(data + pos, data + pos + len);
    pos += len;

    // The decoder on its own first: it must take any bytes.
    wire::Packet parsed;
    (void)wire::parse(pkt.data(), pkt.size(), parsed);

    Side& from = ctl & 1 ? t.b : t.a;
    Side& to = ctl & 1 ? t.a : t.b;
    if (ctl & 2 && pkt.size() >= wire::kBaseLen) {
      put_be32(&pkt[4], to.qp->qpn());    // Base::dst_qpn
      put_be32(&pkt[8], from.qp->qpn());  // Base::src_qpn
    }
    // DataExt, ReadReqExt and AtomicExt all start with va(8) rkey(4).
    if (ctl & 4 && pkt.size() >= wire::kBaseLen + 12) {
      uint64_t off = get_be64(&pkt[24]) % kMrSize;
      put_be64(&pkt[24], to.mr_addr() + off);
      put_be32(&pkt[32], to.mr->rkey());
    }
    t.net.inject(from.ip, to.ip, std::move(pkt), ctl & 8);
    if (ctl & 16) t.net.run_for(1'000'000);
  }
  t.net.run_for(10'000'000);
  if (!t.a.guards_clean() || !t.b.guards_clean()) abort();  // wrote outside the MR
  return 0;
}
