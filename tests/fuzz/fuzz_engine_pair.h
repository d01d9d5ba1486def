// The fixture of the engine fuzzers (fuzz_wire.cc, fuzz_roce_engine.cc):
// two engines on a SimNet with one connected RC QP each, as in
// tests/engine/sim_pair.h, and an MR on each between guard bytes that must
// stay zero. With roce=true each engine takes the other for a plain RoCE
// v2 peer (EngineConfig::roce).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "vstellar/engine.h"
#include "vstellar/memory.h"
#include "vstellar/sim_net.h"

namespace fuzz {

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
  bool roce_;

  explicit FuzzPair(bool roce = false) : roce_(roce) {
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
    if (roce_) {
      c.roce.peers = {IpPrefix{IpAddr(0x0a000000), 8}};
      c.roce.local = IpAddr(ip);
    }
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

inline void put_be32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 24);
  p[1] = uint8_t(v >> 16);
  p[2] = uint8_t(v >> 8);
  p[3] = uint8_t(v);
}
inline uint64_t get_be64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | p[i];
  return v;
}
inline void put_be64(uint8_t* p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) p[i] = uint8_t(v);
}

}  // namespace fuzz
