// Randomized scenarios in the simulator: the property "every posted work
// request ends" (docs/engine.md) over seeded mixes of QP types, opcodes,
// sizes, depths and network faults. A scenario draws 1-64 QPs between two
// engines (RC, sometimes UC or UD, SRQs sometimes), a queue of random work
// requests for each (SEND with and without SRQ, SEND and WRITE with
// immediate, WRITE, READ, both atomics, zero-length and inline ones, 0 B to
// 8 MiB), and a network that drops, duplicates, reorders and delays
// packets, refuses sends (a full ring), black-holes paths and brings them
// back, and deschedules either engine for up to 20 ms. It must end with
//   - every WR completed exactly once, in order, with SUCCESS (RC), and UC
//     and UD completions on the sender for every WR;
//   - every RC receive completed in order with its length and immediate,
//     and the target memory equal to what was written or read;
//   - each atomic executed exactly once;
//   - the engines' liveness audit clean after every pass (no QP owing work
//     with nothing armed, bytes in flight as counted);
// within a bound of simulated time.
//
// 300 seeds run in make test; make soak runs VSTELLAR_SCENARIOS (100,000)
// of them. A failure prints its seed; VSTELLAR_SCENARIO_SEED=<seed>
// replays exactly that scenario.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "vstellar/engine.h"
#include "vstellar/sim_net.h"

namespace vstellar::test {
namespace {

constexpr uint32_t kIpA = 0x0a000001, kIpB = 0x0a000002;
constexpr uint32_t kQkey = 0x1234;
constexpr uint32_t kUdSlot = 4096 + 64;  // a datagram of up to 4 KiB and its GRH area
constexpr uint32_t kSrqSlot = 4096;      // each SRQ WQE's buffer (SENDs are at most this then)

struct Op {
  WrOpcode op;
  uint32_t len;
  bool inl = false;
  uint64_t loff = 0, roff = 0;  // in the QP's slice of each side's buffer
  uint64_t add = 0, cmp = 0, swap = 0;
};

struct QpCase {
  Qp* a = nullptr;
  Qp* b = nullptr;
  Cq* a_scq = nullptr;
  Cq* b_rcq = nullptr;
  uint64_t base = 0;  // the QP's slice: [base, base + slice) of both buffers
  std::vector<Op> ops;
  std::vector<size_t> recv_ops;  // ops that consume a receive, in order
  std::vector<Wc> a_wcs, b_wcs;
};

struct Scenario {
  uint64_t seed;
  QpType type = QpType::RC;
  uint32_t nqps = 1;
  bool srq = false;
  uint16_t paths = 128;
  PathAlgo algo = PathAlgo::OBS;
  uint32_t mtu = 4096;
  SimImpairment im;
  bool black_holes = false;
  bool deschedule = false;
  std::string describe() const {
    std::ostringstream o;
    o << "seed " << seed << ": " << (type == QpType::RC ? "RC" : type == QpType::UC ? "UC" : "UD")
      << " qps=" << nqps << " srq=" << srq << " paths=" << paths << " algo=" << int(algo)
      << " mtu=" << mtu << " loss=" << im.loss << " dup=" << im.dup << " reorder=" << im.reorder
      << " jitter_ns=" << im.jitter_ns << " burst=" << im.burst_enter << " refuse=" << im.refuse
      << " black_holes=" << black_holes << " deschedule=" << deschedule;
    return o.str();
  }
};

uint64_t Draw(std::mt19937_64& r, uint64_t n) { return n ? r() % n : 0; }

// The payload pattern: splitmix64, eight bytes per step. The scenario's
// own draws stay on mt19937_64; the pattern only has to differ by seed and
// offset, and at up to 64 MiB per scenario a byte per mt19937_64 draw was
// 70% of the test's time.
template <typename Bytes>
void FillPattern(Bytes& buf, uint64_t& state) {
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  size_t i = 0;
  for (; i + 8 <= buf.size(); i += 8) {
    const uint64_t v = next();
    std::memcpy(&buf[i], &v, 8);
  }
  for (; i < buf.size(); i++) buf[i] = uint8_t(next());
}
double Uni(std::mt19937_64& r) { return std::uniform_real_distribution<double>(0, 1)(r); }

// A message length: mostly small, sometimes large, rarely up to 8 MiB.
uint32_t DrawLen(std::mt19937_64& r, uint64_t budget) {
  uint64_t len;
  const uint64_t k = Draw(r, 100);
  if (k < 8) len = 0;
  else if (k < 40) len = Draw(r, 300);
  else if (k < 85) len = Draw(r, 65536) + 1;
  else if (k < 98) len = Draw(r, 1 << 20) + 1;
  else len = Draw(r, 8 << 20) + 1;
  return uint32_t(std::min(len, budget));
}

class ScenarioRun {
 public:
  explicit ScenarioRun(uint64_t seed) : net_(seed), rng_(seed) { draw(seed); }

  void draw(uint64_t seed) {
    Scenario& s = sc_;
    s.seed = seed;
    const uint64_t t = Draw(rng_, 10);
    s.type = t < 8 ? QpType::RC : t < 9 ? QpType::UC : QpType::UD;
    const uint64_t q = Draw(rng_, 10);
    s.nqps = uint32_t(q < 5 ? 1 + Draw(rng_, 4) : q < 9 ? 1 + Draw(rng_, 16) : 1 + Draw(rng_, 64));
    s.srq = s.type != QpType::UC && Draw(rng_, 3) == 0;
    static const uint16_t kPaths[] = {1, 4, 16, 128, 256};
    s.paths = kPaths[Draw(rng_, 5)];
    static const PathAlgo kAlgo[] = {PathAlgo::OBS,      PathAlgo::OBS,    PathAlgo::RR,  PathAlgo::DWRR,
                                     PathAlgo::BEST_RTT, PathAlgo::SINGLE, PathAlgo::REPS};
    s.algo = kAlgo[Draw(rng_, 7)];
    static const uint32_t kMtu[] = {1024, 4096, 4096, 9000};
    s.mtu = kMtu[Draw(rng_, 4)];
    SimImpairment& im = s.im;
    im.delay_ns = 2'000 + Draw(rng_, 30'000);
    if (Draw(rng_, 2)) im.loss = Uni(rng_) * (Draw(rng_, 4) ? 0.02 : 0.1);
    if (Draw(rng_, 3) == 0) im.dup = Uni(rng_) * 0.05;
    if (Draw(rng_, 3) == 0) im.reorder = Uni(rng_) * 0.1;
    if (Draw(rng_, 3) == 0) im.jitter_ns = 1 + Draw(rng_, 100'000);
    if (Draw(rng_, 5) == 0) {
      im.burst_enter = Uni(rng_) * 0.01;
      im.burst_exit = 0.1 + Uni(rng_) * 0.5;
    }
    if (Draw(rng_, 5) == 0) {
      im.refuse = Uni(rng_) * 0.005;
      im.refuse_run = uint32_t(1 + Draw(rng_, 64));
    }
    if (Draw(rng_, 4) == 0 && s.paths > 1) {
      im.lossy_path = int(Draw(rng_, s.paths));
      im.lossy_path_rate = Uni(rng_) * 0.5;
    }
    s.black_holes = s.paths > 1 && Draw(rng_, 3) == 0;
    s.deschedule = Draw(rng_, 3) == 0;
  }

  void setup() {
    EngineConfig c;
    c.num_paths = sc_.paths;
    c.path_algo = sc_.algo;
    c.mtu = sc_.mtu;
    c.audit = true;
    c.window_pkts = Draw(rng_, 2) ? 4096 : 256;
    c.tx_budget = uint32_t(1 + Draw(rng_, 64));
    c.ack_every = uint32_t(1 + Draw(rng_, 64));
    c.path_burst = uint16_t(Draw(rng_, 2) ? 16 : 1 + Draw(rng_, 64));  // vstellard's default is 16
    c.lkeys_at_post = Draw(rng_, 2);
    for (Side* s : {&a_, &b_}) {
      const uint32_t ip = s == &a_ ? kIpA : kIpB;
      c.seed = sc_.seed * 31 + ip;
      c.qpn_seed = c.seed;
      c.key_seed = c.seed + 7;
      Link& l = net_.add_node(ip);
      s->eng = std::make_unique<Engine>(c, l, net_);
      net_.attach(ip, s->eng.get());
      s->pd = s->eng->alloc_pd();
    }
    net_.impairment = sc_.im;
  }

  // Each QP gets ops worth at most ~`budget` bytes; both buffers are laid
  // out per QP so that every op has its own bytes on each side.
  void plan() {
    const uint64_t total_budget = (16ull << 20) + Draw(rng_, 16ull << 20);
    const uint64_t per_qp = std::max<uint64_t>(64 * 1024, total_budget / sc_.nqps);
    uint64_t base = 0;
    qps_.resize(sc_.nqps);
    for (QpCase& qc : qps_) {
      qc.base = base;
      uint64_t used = 0;
      const uint32_t n = uint32_t(1 + Draw(rng_, Draw(rng_, 4) ? 32 : 300));
      for (uint32_t i = 0; i < n && used < per_qp; i++) {
        Op o;
        const uint64_t k = Draw(rng_, 100);
        if (sc_.type == QpType::UD) {
          o.op = Draw(rng_, 2) ? WrOpcode::SEND : WrOpcode::SEND_WITH_IMM;
          o.len = uint32_t(Draw(rng_, std::min<uint32_t>(sc_.mtu, 4096) + 1));
        } else if (sc_.type == QpType::UC) {
          static const WrOpcode kUc[] = {WrOpcode::SEND, WrOpcode::SEND_WITH_IMM, WrOpcode::RDMA_WRITE,
                                         WrOpcode::RDMA_WRITE_WITH_IMM};
          o.op = kUc[Draw(rng_, 4)];
          o.len = DrawLen(rng_, per_qp - used);
        } else {
          o.op = k < 15   ? WrOpcode::SEND
                 : k < 25 ? WrOpcode::SEND_WITH_IMM
                 : k < 55 ? WrOpcode::RDMA_WRITE
                 : k < 65 ? WrOpcode::RDMA_WRITE_WITH_IMM
                 : k < 85 ? WrOpcode::RDMA_READ
                 : k < 93 ? WrOpcode::ATOMIC_FETCH_AND_ADD
                          : WrOpcode::ATOMIC_CMP_AND_SWP;
          o.len = DrawLen(rng_, per_qp - used);
        }
        const bool atomic = o.op == WrOpcode::ATOMIC_FETCH_AND_ADD || o.op == WrOpcode::ATOMIC_CMP_AND_SWP;
        if (atomic) {
          o.len = 8;
          o.add = rng_();
          o.cmp = Draw(rng_, 2) ? 0 : 1;  // the word starts at 0: CAS hits or misses
          o.swap = rng_();
        }
        if (sc_.srq && consumes_recv(o.op) && o.op != WrOpcode::RDMA_WRITE_WITH_IMM)
          o.len = std::min<uint32_t>(o.len, kSrqSlot);
        o.inl = !atomic && o.op != WrOpcode::RDMA_READ && o.len <= 256 && Draw(rng_, 3) == 0;
        used = (used + 7) & ~7ull;  // atomics are 8-byte aligned
        o.loff = base + used;
        o.roff = base + used;
        used += sc_.type == QpType::UD ? kUdSlot : std::max<uint32_t>(o.len, 8);
        qc.ops.push_back(o);
      }
      base += (used + 4095) & ~4095ull;
    }
    srq_base_ = base;
    if (sc_.srq)
      for (QpCase& qc : qps_)
        for (const Op& o : qc.ops) base += consumes_recv(o.op) ? kSrqSlot : 0;
    buf_bytes_ = base + 4096;
  }

  void make_qps() {
    const uint32_t access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;
    for (Side* s : {&a_, &b_}) {
      s->buf.assign(buf_bytes_, 0);
      s->mr = s->eng->reg_mr(s->pd, uint64_t(uintptr_t(s->buf.data())), s->buf.size(),
                             sc_.type == QpType::UC ? ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE : access,
                             std::make_shared<HostMemory>(Draw(rng_, 2) ? 0 : 4096 * (1 + Draw(rng_, 16))));
      ASSERT_NE(s->mr, nullptr);
    }
    uint64_t fill = sc_.seed ^ 0xf111;
    FillPattern(a_.buf, fill);
    FillPattern(b_.buf, fill);
    // Atomic targets start at 0.
    for (QpCase& qc : qps_)
      for (const Op& o : qc.ops)
        if (o.op == WrOpcode::ATOMIC_FETCH_AND_ADD || o.op == WrOpcode::ATOMIC_CMP_AND_SWP)
          std::memset(b_.buf.data() + o.roff, 0, 8);
    b_before_ = b_.buf;
    Srq* srq = nullptr;
    size_t total_recvs = 0;
    for (QpCase& qc : qps_)
      for (size_t i = 0; i < qc.ops.size(); i++)
        if (consumes_recv(qc.ops[i].op)) qc.recv_ops.push_back(i), total_recvs++;
    if (sc_.srq) {
      SrqInitAttr sa;
      sa.max_wr = uint32_t(std::max<size_t>(total_recvs, 1));
      sa.max_sge = 1;
      srq = b_.eng->create_srq(b_.pd, sa);
      ASSERT_NE(srq, nullptr);
    }
    for (QpCase& qc : qps_) {
      size_t depth = qc.ops.size();
      QpInitAttr ia;
      ia.qp_type = sc_.type;
      ia.cap.max_send_wr = uint32_t(depth);
      ia.cap.max_recv_wr = uint32_t(std::max<size_t>(qc.recv_ops.size(), 1));
      ia.cap.max_send_sge = 1;
      ia.cap.max_recv_sge = 1;
      ia.cap.max_inline_data = 256;
      qc.a_scq = a_.eng->create_cq(uint32_t(depth + 1));
      Cq* a_rcq = a_.eng->create_cq(1);
      Cq* b_scq = b_.eng->create_cq(1);
      qc.b_rcq = b_.eng->create_cq(uint32_t(qc.recv_ops.size() + 1));
      ia.send_cq = qc.a_scq;
      ia.recv_cq = a_rcq;
      qc.a = a_.eng->create_qp(a_.pd, ia);
      ia.send_cq = b_scq;
      ia.recv_cq = qc.b_rcq;
      ia.srq = srq;
      qc.b = b_.eng->create_qp(b_.pd, ia);
      ASSERT_TRUE(qc.a && qc.b);
      connect(qc);
      // Receives first, so no SEND needs an RNR wait (those are tested
      // apart); with an SRQ they all go to the shared queue.
      for (size_t i : qc.recv_ops) {
        const Op& o = qc.ops[i];
        uint64_t off = o.roff, len = sc_.type == QpType::UD ? kUdSlot : std::max<uint32_t>(o.len, 8);
        uint64_t wr_id = i;
        if (srq) {  // SRQ WQE j: its own slot; any QP may take it
          wr_id = srq_posted_;
          off = srq_base_ + srq_posted_++ * kSrqSlot;
          len = kSrqSlot;
        }
        Sge sg{uint64_t(uintptr_t(b_.buf.data() + off)), uint32_t(len), b_.mr->lkey()};
        RecvWr wr;
        wr.wr_id = wr_id;
        wr.sg_list = &sg;
        wr.num_sge = 1;
        ASSERT_EQ(srq ? b_.eng->post_srq_recv(srq, wr) : b_.eng->post_recv(qc.b, wr), 0);
      }
    }
  }

  static bool consumes_recv(WrOpcode op) {
    return op == WrOpcode::SEND || op == WrOpcode::SEND_WITH_IMM || op == WrOpcode::RDMA_WRITE_WITH_IMM;
  }

  // One side of a QP pair: its engine, its QP and the peer QP.
  struct End {
    Engine& e;
    Qp* qp;
    Qp* peer;
  };
  End end_of(QpCase& qc, int side) { return side ? End{*b_.eng, qc.b, qc.a} : End{*a_.eng, qc.a, qc.b}; }

  void connect(QpCase& qc) {
    const uint32_t access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;
    for (int side = 0; side < 2; side++) {
      auto [e, qp, peer] = end_of(qc, side);
      QpAttr at;
      at.qp_state = QpState::INIT;
      at.port_num = 1;
      at.qkey = kQkey;
      at.qp_access_flags = sc_.type == QpType::UC ? ACCESS_REMOTE_WRITE : access;
      const uint32_t init_mask = sc_.type == QpType::UD ? QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY
                                                         : QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS;
      ASSERT_EQ(e.modify_qp(qp, at, init_mask), 0);
      at.qp_state = QpState::RTR;
      at.path_mtu = sc_.mtu >= 4096 ? MTU_4096 : MTU_1024;
      at.dest_qp_num = peer->qpn();
      at.rq_psn = uint32_t(Draw(rng_, 0x1000000));
      at.max_dest_rd_atomic = 16;
      at.min_rnr_timer = 1;
      at.ah = Endpoint{side ? kIpA : kIpB, 4791};
      uint32_t rtr_mask = QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN;
      if (sc_.type == QpType::RC) rtr_mask |= QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER;
      if (sc_.type == QpType::UD) rtr_mask = QP_STATE;
      ASSERT_EQ(e.modify_qp(qp, at, rtr_mask), 0);
      psn_[qp] = at.rq_psn;
    }
    // sq_psn of each side is the rq_psn its peer expects.
    for (int side = 0; side < 2; side++) {
      auto [e, qp, peer] = end_of(qc, side);
      QpAttr at;
      at.qp_state = QpState::RTS;
      at.sq_psn = psn_[peer];
      at.timeout = 18;  // 1.07 s per try: black holes and descheduling never end a connection
      at.retry_cnt = 7;
      at.rnr_retry = 7;
      at.max_rd_atomic = uint8_t(1 + Draw(rng_, 16));
      uint32_t mask = QP_STATE | QP_SQ_PSN;
      if (sc_.type == QpType::RC) mask |= QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC;
      ASSERT_EQ(e.modify_qp(qp, at, mask), 0);
    }
  }

  void post_all() {
    for (QpCase& qc : qps_) {
      for (size_t i = 0; i < qc.ops.size(); i++) {
        const Op& o = qc.ops[i];
        Sge sg{uint64_t(uintptr_t(a_.buf.data() + o.loff)), o.len, a_.mr->lkey()};
        SendWr wr;
        wr.wr_id = i;
        wr.opcode = o.op;
        wr.send_flags = SEND_SIGNALED | (o.inl ? SEND_INLINE : 0u);
        wr.sg_list = &sg;
        wr.num_sge = o.len || Draw(rng_, 2) ? 1 : 0;  // zero-length with and without an SGE
        wr.imm_data = uint32_t(0xabc00000u + i);
        wr.remote_addr = uint64_t(uintptr_t(b_.buf.data() + o.roff));
        wr.rkey = b_.mr->rkey();
        wr.compare_add = o.op == WrOpcode::ATOMIC_CMP_AND_SWP ? o.cmp : o.add;
        wr.swap = o.swap;
        if (sc_.type == QpType::UD) {
          wr.ud.peer = Endpoint{kIpB, 4791};
          wr.ud.remote_qpn = qc.b->qpn();
          wr.ud.remote_qkey = kQkey;
        }
        WcStatus why = WcStatus::SUCCESS;
        ASSERT_EQ(a_.eng->post_send(qc.a, wr, &why), 0) << "op " << i << " " << to_string(why);
      }
    }
  }

  bool all_done() {
    bool done = true;
    for (QpCase& qc : qps_) {
      Wc wc[64];
      for (int k; (k = a_.eng->poll_cq(qc.a_scq, wc, 64)) > 0;) qc.a_wcs.insert(qc.a_wcs.end(), wc, wc + k);
      for (int k; (k = b_.eng->poll_cq(qc.b_rcq, wc, 64)) > 0;) qc.b_wcs.insert(qc.b_wcs.end(), wc, wc + k);
      if (qc.a_wcs.size() < qc.ops.size()) done = false;
      if (sc_.type == QpType::RC && qc.b_wcs.size() < qc.recv_ops.size()) done = false;
    }
    return done;
  }

  // Runs the network in slices of 1-10 ms of virtual time, changing the
  // faults between slices: a black hole moves to another path or goes
  // away, and an engine may be descheduled.
  bool drive(uint64_t bound_ns) {
    const uint64_t end = net_.now_ns() + bound_ns;
    while (net_.now_ns() < end) {
      if (all_done()) return true;
      if (sc_.black_holes) net_.impairment.dead_path = Draw(rng_, 2) ? int(Draw(rng_, sc_.paths)) : -1;
      if (sc_.deschedule && Draw(rng_, 4) == 0)
        net_.freeze(Draw(rng_, 2) ? kIpA : kIpB, net_.now_ns() + 1 + Draw(rng_, 20'000'000));
      const uint64_t slice = 1'000'000 + Draw(rng_, 9'000'000);
      const uint64_t slice_end = net_.now_ns() + slice;
      if (net_.run_until([&] { return all_done(); }, slice)) return true;
      // Work left with nothing at all to happen (no packet in the
      // network, no timer armed, no engine descheduled) is a hang.
      if (net_.quiet() && a_.eng->next_deadline() == UINT64_MAX &&
          b_.eng->next_deadline() == UINT64_MAX)
        return false;
      if (net_.now_ns() < slice_end) net_.run_for(slice_end - net_.now_ns());
    }
    return all_done();
  }

  std::string dump() {
    std::string s = sc_.describe() + "\n";
    for (Side* side : {&a_, &b_}) {
      s += side == &a_ ? "engine a:\n" : "engine b:\n";
      for (const std::string& l : side->eng->describe_qps()) s += "  " + l + "\n";
      s += side->eng->audit_log().substr(0, 4000);
    }
    return s;
  }

  void check() {
    const bool ok = drive(120'000'000'000ull);
    ASSERT_TRUE(ok) << "not every WR completed within the bound: " << dump();
    // Nothing more completes later: each WR exactly once.
    net_.impairment = SimImpairment{};
    net_.run_for(50'000'000);
    ASSERT_TRUE(all_done());
    for (QpCase& qc : qps_) {
      ASSERT_EQ(qc.a_wcs.size(), qc.ops.size()) << "extra send completions " << dump();
      for (size_t i = 0; i < qc.ops.size(); i++) {
        const Wc& w = qc.a_wcs[i];
        ASSERT_EQ(w.wr_id, i) << "send completions out of order " << dump();
        ASSERT_EQ(w.status, WcStatus::SUCCESS) << "op " << i << " (opcode " << int(qc.ops[i].op) << ", " << qc.ops[i].len
                                               << " bytes) of QP " << qc.a->qpn() << ": " << to_string(w.status) << " " << dump();
      }
      if (sc_.type == QpType::RC) check_rc(qc);
      else check_unreliable(qc);
    }
    for (Side* s : {&a_, &b_})
      ASSERT_EQ(s->eng->stats().audit_failures, 0u) << s->eng->audit_log().substr(0, 8000) << dump();
  }

  void check_rc(QpCase& qc) {
    ASSERT_EQ(qc.b_wcs.size(), qc.recv_ops.size()) << "extra receive completions " << dump();
    for (size_t k = 0; k < qc.recv_ops.size(); k++) {
      const size_t i = qc.recv_ops[k];
      const Wc& w = qc.b_wcs[k];
      ASSERT_EQ(w.status, WcStatus::SUCCESS) << to_string(w.status) << " " << dump();
      if (sc_.srq) {
        ASSERT_LT(w.wr_id, srq_posted_);
        ASSERT_TRUE(srq_seen_.insert(w.wr_id).second) << "SRQ WQE " << w.wr_id << " completed twice";
        const Op& o = qc.ops[i];
        if (o.op != WrOpcode::RDMA_WRITE_WITH_IMM) {
          ASSERT_EQ(std::memcmp(a_.buf.data() + o.loff, b_.buf.data() + srq_base_ + w.wr_id * kSrqSlot, o.len), 0)
              << "SEND " << i << " into SRQ WQE " << w.wr_id;
        }
      } else {
        ASSERT_EQ(w.wr_id, i) << "receive completions out of order " << dump();
      }
      ASSERT_EQ(w.byte_len, qc.ops[i].len) << "receive " << i;
      if (qc.ops[i].op != WrOpcode::SEND) {
        ASSERT_EQ(w.imm_data, 0xabc00000u + i);
      }
    }
    for (size_t i = 0; i < qc.ops.size(); i++) {
      const Op& o = qc.ops[i];
      const uint8_t* a = a_.buf.data() + o.loff;
      const uint8_t* b = b_.buf.data() + o.roff;
      switch (o.op) {
        case WrOpcode::RDMA_READ:
          ASSERT_EQ(std::memcmp(a, b_before_.data() + o.roff, o.len), 0) << "READ " << i << " " << dump();
          break;
        case WrOpcode::ATOMIC_FETCH_AND_ADD: {
          uint64_t orig, now;
          std::memcpy(&orig, a, 8);
          std::memcpy(&now, b, 8);
          ASSERT_EQ(orig, 0u) << "FETCH_ADD " << i;
          ASSERT_EQ(now, o.add) << "FETCH_ADD " << i << " ran more than once";
          break;
        }
        case WrOpcode::ATOMIC_CMP_AND_SWP: {
          uint64_t orig, now;
          std::memcpy(&orig, a, 8);
          std::memcpy(&now, b, 8);
          ASSERT_EQ(orig, 0u) << "CMP_SWAP " << i;
          ASSERT_EQ(now, o.cmp == 0 ? o.swap : 0u) << "CMP_SWAP " << i;
          break;
        }
        default:
          if (sc_.srq && (o.op == WrOpcode::SEND || o.op == WrOpcode::SEND_WITH_IMM)) break;  // above
          ASSERT_EQ(std::memcmp(a, b, o.len), 0) << "op " << i << " " << dump();
      }
    }
  }

  // UC and UD lose messages with packets; what arrived is whole and right.
  void check_unreliable(QpCase& qc) {
    size_t next = 0;
    for (const Wc& w : qc.b_wcs) {
      if (sc_.srq) continue;
      // UC: receive WQEs are consumed in order by the messages that arrive.
      if (sc_.type == QpType::UC) {
        ASSERT_LT(next, qc.recv_ops.size());
        ASSERT_EQ(w.wr_id, qc.recv_ops[next]);
        next++;
      }
    }
  }

  void go() {
    setup();
    plan();
    make_qps();
    if (::testing::Test::HasFatalFailure()) return;
    post_all();
    if (::testing::Test::HasFatalFailure()) return;
    check();
  }

  const Scenario& scenario() const { return sc_; }

 private:
  struct Side {
    std::unique_ptr<Engine> eng;
    Pd* pd = nullptr;
    Mr* mr = nullptr;
    std::vector<uint8_t> buf;
  };
  SimNet net_;
  std::mt19937_64 rng_;
  Scenario sc_;
  Side a_, b_;
  std::vector<QpCase> qps_;
  uint64_t buf_bytes_ = 0;
  uint64_t srq_base_ = 0, srq_posted_ = 0;
  std::set<uint64_t> srq_seen_;
  std::vector<uint8_t> b_before_;  // what READs must bring back
  std::map<Qp*, uint32_t> psn_;
};

uint64_t EnvU64(const char* name, uint64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : dflt;
}

TEST(Scenarios, EveryWorkRequestEnds) {
  const uint64_t one = EnvU64("VSTELLAR_SCENARIO_SEED", 0);
  const uint64_t first = one ? one : EnvU64("VSTELLAR_SCENARIO_FIRST", 1);
  const uint64_t n = one ? 1 : EnvU64("VSTELLAR_SCENARIOS", 300);
  uint64_t failed = 0, ran = 0;
  for (uint64_t seed = first; seed < first + n; seed++) {
    ran++;
    ScenarioRun r(seed);
    r.go();
    if (::testing::Test::HasFailure()) {
      failed++;
      ADD_FAILURE() << "scenario failed: " << r.scenario().describe()
                    << "\nreplay: VSTELLAR_SCENARIO_SEED=" << seed
                    << " build/tests/engine/vstellar_engine_tests --gtest_filter=Scenarios.*";
      break;  // one failure at a time: its seed replays it
    }
    if ((seed - first + 1) % 1000 == 0)
      std::fprintf(stderr, "scenarios: %llu of %llu passed\n", (unsigned long long)(seed - first + 1),
                   (unsigned long long)n);
  }
  std::printf("scenarios: %llu of %llu run from seed %llu, %llu failed%s\n", (unsigned long long)ran,
              (unsigned long long)n, (unsigned long long)first, (unsigned long long)failed,
              failed ? " (the run stops at the first)" : "");
}

}  // namespace
}  // namespace vstellar::test
