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
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "vstellar/engine.h"
#include "vstellar/memory.h"
#include "vstellar/sim_net.h"
#include "vstellar/wire.h"

namespace {

using namespace vstellar;

constexpr uint32_t kIpA = 0x0a000001, kIpB = 0x0a000002;
constexpr size_t kGuard = 4096;     // bytes before and after the MR
constexpr size_t kMrSize = 64 << 10;

struct Side {
  std::unique_ptr<Engine> eng;
  Qp* qp = nullptr;
  Mr* mr = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(kGuard + kMrSize + kGuard, 0);
  uint32_t ip = 0;
  uint64_t mr_addr() { return uint64_t(uintptr_t(buf.data() + kGuard)); }
  bool guards_clean() const {
    for (size_t i = 0; i < kGuard; i++)
      if (buf[i] || buf[kGuard + kMrSize + i]) return false;
    return true;
  }
};

struct FuzzPair {
  SimNet net{1};
  Side a, b;

  FuzzPair() {
    setup(a, kIpA);
    setup(b, kIpB);
    if (!connect()) abort();  // the fixture itself is broken, not the input
  }

  void setup(Side& s, uint32_t ip) {
    s.ip = ip;
    EngineConfig c;
    c.seed = 31 + ip;
    c.qpn_seed = c.seed;  // the same QPNs and keys every run: inputs replay
    c.key_seed = c.seed;
    s.eng = std::make_unique<Engine>(c, net.add_node(ip), net);
    net.attach(ip, s.eng.get());
    Pd* pd = s.eng->alloc_pd();
    QpInitAttr ia;
    ia.send_cq = s.eng->create_cq(256);
    ia.recv_cq = s.eng->create_cq(256);
    s.qp = s.eng->create_qp(pd, ia);
    s.mr = s.eng->reg_mr(pd, s.mr_addr(), kMrSize,
                         ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ |
                             ACCESS_REMOTE_ATOMIC,
                         std::make_shared<HostMemory>());
  }

  bool connect() {
    for (Side* s : {&a, &b}) {
      QpAttr at;
      at.qp_state = QpState::INIT;
      at.port_num = 1;
      at.qp_access_flags = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ |
                           ACCESS_REMOTE_ATOMIC;
      if (s->eng->modify_qp(s->qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS))
        return false;
    }
    for (Side* s : {&a, &b}) {
      Side& peer = s == &a ? b : a;
      QpAttr at;
      at.qp_state = QpState::RTR;
      at.path_mtu = MTU_4096;
      at.dest_qp_num = peer.qp->qpn();
      at.rq_psn = 1000;
      at.max_dest_rd_atomic = 16;
      at.min_rnr_timer = 1;
      at.ah = Endpoint{peer.ip, 4791};
      if (s->eng->modify_qp(s->qp, at,
                            QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN |
                                QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER))
        return false;
    }
    for (Side* s : {&a, &b}) {
      QpAttr at;
      at.qp_state = QpState::RTS;
      at.sq_psn = 1000;
      at.timeout = 14;
      at.retry_cnt = 7;
      at.rnr_retry = 7;
      at.max_rd_atomic = 16;
      if (s->eng->modify_qp(s->qp, at,
                            QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY |
                                QP_MAX_QP_RD_ATOMIC))
        return false;
    }
    return true;
  }
};

void put_be32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 24);
  p[1] = uint8_t(v >> 16);
  p[2] = uint8_t(v >> 8);
  p[3] = uint8_t(v);
}
uint64_t get_be64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | p[i];
  return v;
}
void put_be64(uint8_t* p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) p[i] = uint8_t(v);
}

}  // namespace

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
