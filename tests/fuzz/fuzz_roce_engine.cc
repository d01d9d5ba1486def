// Fuzz target: RoCE v2 packets into engines in plain RoCE v2 mode
// (EngineConfig::roce; qemu-device/engine/src/roce_mode.cc).
//
// Two engines on a SimNet, each taking the other for a RoCE v2 peer, with
// one connected RC QP each (fuzz_engine_pair.h). The input is a list of
// UDP payloads, each injected into one engine as if the other sent it;
// the network then runs, so that the answers (ACKs, sequence NAKs, READ
// responses, go-back-N resends) are exchanged too. Over IPv4 the engine
// does not check the ICRC (a UDP socket cannot see the identification it
// covers), so any bytes reach the translation into the engine's packets.
//
// Input: records of  ctl(1) len(2, big-endian) bytes(len).  ctl bits:
//   1  direction: 0 A->B, 1 B->A
//   2  put the receiver's QPN into the BTH (random ones almost never match)
//   4  put the receiver's rkey into a RETH or AtomicETH (both follow the
//      BTH) and make its va point into the MR (modulo its size)
//   8  the IP header carried a CE mark
//  16  run the network for 1 ms of virtual time after this packet
//
// What counts as a bug: a sanitizer report, a crash, or a byte written
// outside the registered MR.
#include <algorithm>

#include "fuzz_engine_pair.h"
#include "vstellar/roce_wire.h"

using namespace fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzPair t(/*roce=*/true);
  size_t pos = 0;
  while (pos + 3 <= size) {
    const uint8_t ctl = data[pos];
    size_t len = size_t(data[pos + 1]) << 8 | data[pos + 2];
    pos += 3;
    len = std::min(len, size - pos);
    std::vector<uint8_t> pkt(data + pos, data + pos + len);
    pos += len;
    Side& from = ctl & 1 ? t.b : t.a;
    Side& to = ctl & 1 ? t.a : t.b;
    if (ctl & 2 && pkt.size() >= roce::kBthLen) {
      const uint32_t q = to.qp->qpn();
      pkt[5] = uint8_t(q >> 16);
      pkt[6] = uint8_t(q >> 8);
      pkt[7] = uint8_t(q);
    }
    if (ctl & 4 && pkt.size() >= roce::kBthLen + 12) {
      const uint64_t off = get_be64(&pkt[roce::kBthLen]) % kMrSize;
      put_be64(&pkt[roce::kBthLen], to.mr_addr() + off);
      put_be32(&pkt[roce::kBthLen + 8], to.mr->rkey());
    }
    t.net.inject(from.ip, to.ip, std::move(pkt), ctl & 8);
    if (ctl & 16) t.net.run_for(1'000'000);
  }
  t.net.run_for(10'000'000);
  if (!t.a.guards_clean() || !t.b.guards_clean()) abort();  // wrote outside the MR
  return 0;
}
