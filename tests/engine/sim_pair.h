// Two engines joined by a SimNet, each with a PD, CQs, one RC QP and a
// buffer registered as an MR. The building block of the engine tests.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "vstellar/engine.h"
#include "vstellar/sim_net.h"
#include "vstellar/wire.h"

namespace vstellar::test {

constexpr uint32_t kIpA = 0x0a000001, kIpB = 0x0a000002;

struct Side {
  std::unique_ptr<Engine> eng;
  Pd* pd = nullptr;
  Cq* scq = nullptr;
  Cq* rcq = nullptr;
  Qp* qp = nullptr;
  std::vector<uint8_t> buf;
  Mr* mr = nullptr;
  uint32_t ip = 0;
  uint64_t addr(size_t off = 0) { return uint64_t(uintptr_t(buf.data() + off)); }
};

struct PairOptions {
  EngineConfig cfg;
  std::optional<EngineConfig> cfg_b;  // b's, if it differs from a's
  uint64_t seed = 1;
  uint64_t block = 0;  // HostMemory split size (0 = none)
  size_t buf_size = 1 << 20;
  QpCap cap;
  uint32_t access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;
  uint8_t retry_cnt = 7, rnr_retry = 7, min_rnr_timer = 1, max_rd_atomic = 16;
  uint8_t timeout = 14;  // IB local ACK timeout: 4.096 us * 2^timeout
  bool connect = true;
  QpType qp_type = QpType::RC;  // RC or UC
  uint32_t path_mtu = MTU_4096;  // MTU_*
};

class Pair {
 public:
  explicit Pair(const PairOptions& o = {}) : net(o.seed), opt(o) {
    setup(a, kIpA);
    setup(b, kIpB);
    if (o.connect) connect();
  }

  void setup(Side& s, uint32_t ip) {
    s.ip = ip;
    Link& l = net.add_node(ip);
    EngineConfig c = ip == kIpB && opt.cfg_b ? *opt.cfg_b : opt.cfg;
    c.seed = opt.seed * 31 + ip;
    c.audit = true;  // every pass checks the liveness rules (Engine::audit)
    if (!c.qpn_seed) c.qpn_seed = c.seed;  // QPNs repeat from run to run, as the network does
    s.eng = std::make_unique<Engine>(c, l, net);
    net.attach(ip, s.eng.get());
    s.pd = s.eng->alloc_pd();
    s.scq = s.eng->create_cq(65536);
    s.rcq = s.eng->create_cq(65536);
    QpInitAttr ia;
    ia.send_cq = s.scq;
    ia.recv_cq = s.rcq;
    ia.cap = opt.cap;
    ia.qp_type = opt.qp_type;
    s.qp = s.eng->create_qp(s.pd, ia);
    s.buf.assign(opt.buf_size, 0);
    s.mr = s.eng->reg_mr(s.pd, s.addr(), s.buf.size(), opt.access,
                         std::make_shared<HostMemory>(opt.block));
  }

  static int to_init(Side& s, uint32_t access) {
    QpAttr at;
    at.qp_state = QpState::INIT;
    at.pkey_index = 0;
    at.port_num = 1;
    at.qp_access_flags = access;
    return s.eng->modify_qp(s.qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS);
  }
  int to_rtr(Side& s, Side& peer) {
    QpAttr at;
    at.qp_state = QpState::RTR;
    at.path_mtu = opt.path_mtu;
    at.dest_qp_num = peer.qp->qpn();
    at.rq_psn = 1000 + peer.ip % 7;
    at.max_dest_rd_atomic = 16;
    at.min_rnr_timer = opt.min_rnr_timer;
    at.ah = Endpoint{peer.ip, 4791};
    if (s.qp->is_uc())  // no rd_atomic depth and no RNR timer on UC
      return s.eng->modify_qp(s.qp, at, QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN);
    return s.eng->modify_qp(s.qp, at,
                            QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN |
                                QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER);
  }
  int to_rts(Side& s) {
    QpAttr at;
    at.qp_state = QpState::RTS;
    at.sq_psn = 1000 + s.ip % 7;
    at.timeout = opt.timeout;
    at.retry_cnt = opt.retry_cnt;
    at.rnr_retry = opt.rnr_retry;
    at.max_rd_atomic = opt.max_rd_atomic;
    if (s.qp->is_uc()) return s.eng->modify_qp(s.qp, at, QP_STATE | QP_SQ_PSN);
    return s.eng->modify_qp(s.qp, at,
                            QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY |
                                QP_MAX_QP_RD_ATOMIC);
  }
  void connect() {
    ASSERT_EQ(to_init(a, opt.access), 0);
    ASSERT_EQ(to_init(b, opt.access), 0);
    ASSERT_EQ(to_rtr(a, b), 0);
    ASSERT_EQ(to_rtr(b, a), 0);
    ASSERT_EQ(to_rts(a), 0);
    ASSERT_EQ(to_rts(b), 0);
  }

  // Poll `n` completions from cq, running the network as needed.
  std::vector<Wc> wait(Side& s, Cq* cq, size_t n, uint64_t max_ns = 5'000'000'000ull) {
    std::vector<Wc> out;
    net.run_until(
        [&] {
          Wc wc[64];
          int k;
          while ((k = s.eng->poll_cq(cq, wc, 64)) > 0) out.insert(out.end(), wc, wc + k);
          return out.size() >= n;
        },
        max_ns);
    return out;
  }

  int post_send(Side& s, WrOpcode op, uint64_t wr_id, uint64_t loff, uint32_t len, uint64_t roff,
                uint32_t flags = SEND_SIGNALED, uint32_t imm = 0, Side* peer = nullptr) {
    Side& p = peer ? *peer : (&s == &a ? b : a);
    Sge sg{s.addr(loff), len, s.mr->lkey()};
    SendWr wr;
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.send_flags = flags;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.imm_data = imm;
    wr.remote_addr = p.addr(roff);
    wr.rkey = p.mr->rkey();
    return s.eng->post_send(s.qp, wr);
  }
  // A FETCH_AND_ADD of `add` to the peer's word at roff; the original
  // value lands at loff.
  int post_fetch_add(Side& s, uint64_t wr_id, uint64_t loff, uint64_t roff, uint64_t add,
                     uint32_t flags = SEND_SIGNALED) {
    Side& p = &s == &a ? b : a;
    Sge sg{s.addr(loff), 8, s.mr->lkey()};
    SendWr wr;
    wr.wr_id = wr_id;
    wr.opcode = WrOpcode::ATOMIC_FETCH_AND_ADD;
    wr.send_flags = flags;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.remote_addr = p.addr(roff);
    wr.rkey = p.mr->rkey();
    wr.compare_add = add;
    return s.eng->post_send(s.qp, wr);
  }
  // The network loses the n-th (from 0) packet of opcode op that node
  // `from` sends; *seen counts all of them.
  void drop_nth(uint32_t from, wire::Op op, int n, int* seen) {
    net.tap = [from, op, n, seen](uint32_t src, uint32_t, uint16_t, std::vector<uint8_t>& bytes) {
      wire::Packet p;
      if (src != from || wire::parse(bytes.data(), bytes.size(), p) != wire::ParseError::OK || p.base.op != op)
        return true;
      return (*seen)++ != n;
    };
  }
  int post_recv(Side& s, uint64_t wr_id, uint64_t off, uint32_t len) {
    Sge sg{s.addr(off), len, s.mr->lkey()};
    RecvWr wr;
    wr.wr_id = wr_id;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    return s.eng->post_recv(s.qp, wr);
  }

  // Every test over a Pair ends with the liveness rules held throughout.
  ~Pair() { EXPECT_EQ(audit_log(), "") << "the engines' liveness audit failed"; }

  // What the engines' audits found (empty: the liveness rules held).
  std::string audit_log() const { return a.eng->audit_log() + b.eng->audit_log(); }

  SimNet net;
  PairOptions opt;
  Side a, b;
};

inline void fill_random(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 r(seed);
  for (size_t i = 0; i < n; i++) p[i] = uint8_t(r() >> 13);
}

}  // namespace vstellar::test
