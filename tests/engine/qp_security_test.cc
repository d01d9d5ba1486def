// Security regressions of the engine's QPs.
#include <gtest/gtest.h>

#include <set>
#include <unordered_map>

#include "engine_internal.h"
#include "sim_pair.h"

namespace vstellar::test {
namespace {

void ToReset(Side& s) {
  QpAttr at;
  at.qp_state = QpState::RESET;
  ASSERT_EQ(s.eng->modify_qp(s.qp, at, QP_STATE), 0);
}

// A QP taken to RESET and connected again with the same PSNs
// must not keep the cumulative-ACK state of its first connection; with it,
// the new connection's first ACKs completed nothing and its WQEs never
// finished.
TEST(QpSecurity, ResetForgetsTheOldConnectionsTransportState) {
  PairOptions o;
  o.retry_cnt = 2;
  Pair t(o);
  constexpr int kWrites = 40;
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < kWrites; i++)
      ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, i, 0, 4096, 0), 0) << "round " << round;
    auto wc = t.wait(t.a, t.a.scq, kWrites, 2'000'000'000ull);
    ASSERT_EQ(wc.size(), size_t(kWrites)) << "round " << round;
    for (const Wc& w : wc) EXPECT_EQ(w.status, WcStatus::SUCCESS) << "round " << round;
    ToReset(t.a);
    ToReset(t.b);
    const QpImpl& qa = impl(*t.a.qp);
    EXPECT_EQ(qa.cum_seen, 0u);
    EXPECT_EQ(qa.snd_una, 0u);
    EXPECT_EQ(qa.ack_lo, 0u);
    EXPECT_EQ(qa.ack_hi, 0u);
    EXPECT_EQ(qa.last_progress_ns, 0u);
    t.connect();
  }
}

struct QpnBench {
  SimNet net;
  std::unique_ptr<Engine> eng;
  Pd* pd = nullptr;
  Cq* cq = nullptr;
  explicit QpnBench(EngineConfig c) {
    eng = std::make_unique<Engine>(c, net.add_node(kIpA), net);
    net.attach(kIpA, eng.get());
    pd = eng->alloc_pd();
    cq = eng->create_cq(64);
  }
  Qp* Create() {
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = cq;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
    return eng->create_qp(pd, ia);
  }
};

// QPNs were never reused, so creating and destroying QPs used
// the space up and then no QP could be created by anyone. Here the space
// is shrunk to 4,096 QPNs; 20,000 create/destroy cycles must all succeed,
// and a freed QPN must not come back at once (quarantine).
TEST(QpSecurity, QpnsAreReusedAfterAQuarantine) {
  EngineConfig c;
  c.max_qpn = DeviceLimits::kFirstQpn + 4095;
  c.qpn_seed = 7;
  QpnBench t(c);
  Qp* keep = t.Create();  // one live QP the others must never collide with
  ASSERT_NE(keep, nullptr);
  std::unordered_map<uint32_t, int> freed_at;
  size_t reused = 0;
  for (int i = 0; i < 20000; i++) {
    Qp* qp = t.Create();
    ASSERT_NE(qp, nullptr) << "QP " << i << ": no QPN left";
    const uint32_t qpn = qp->qpn();
    ASSERT_GE(qpn, DeviceLimits::kFirstQpn);
    ASSERT_LE(qpn, c.max_qpn);
    ASSERT_NE(qpn, keep->qpn());
    if (auto it = freed_at.find(qpn); it != freed_at.end()) {
      reused++;
      EXPECT_GT(i - it->second, 1000) << "QPN " << qpn << " reused right after it was freed";
    }
    ASSERT_EQ(t.eng->destroy_qp(qp), 0);
    freed_at[qpn] = i;
  }
  EXPECT_GT(reused, 0u);
}

// An engine of a multi-threaded vstellard hands out only QPNs of
// its shard (qpn % shards), which is what steers arriving datagrams to it;
// the rest of the space (and its quarantine) works as before.
TEST(QpSecurity, ShardedEnginesHandOutOnlyTheirQpns) {
  for (uint32_t shard : {0u, 1u, 2u}) {
    EngineConfig c;
    c.max_qpn = DeviceLimits::kFirstQpn + 3 * 200;
    c.qpn_seed = 11;
    c.qpn_shards = 3;
    c.qpn_shard = shard;
    QpnBench t(c);
    std::set<uint32_t> live;
    for (int i = 0; i < 150; i++) {
      Qp* qp = t.Create();
      ASSERT_NE(qp, nullptr) << shard << ": QP " << i;
      EXPECT_EQ(qp->qpn() % 3, shard);
      EXPECT_GE(qp->qpn(), DeviceLimits::kFirstQpn);
      EXPECT_LE(qp->qpn(), c.max_qpn);
      EXPECT_TRUE(live.insert(qp->qpn()).second);
    }
  }
  EngineConfig bad;
  bad.qpn_shards = 2;
  bad.qpn_shard = 2;
  EXPECT_FALSE(bad.validate());
}

// QPNs were sequential from 0x11, so a host on the fabric
// could guess the peer QPN of a connection. They are random now: two
// daemons (engines with the kernel's CSPRNG) give different sequences, and
// consecutive QPNs are not neighbours.
TEST(QpSecurity, QpnsAreUnpredictable) {
  QpnBench a(EngineConfig{}), b(EngineConfig{});
  std::vector<uint32_t> qa, qb;
  for (int i = 0; i < 64; i++) {
    Qp* x = a.Create();
    Qp* y = b.Create();
    ASSERT_TRUE(x && y);
    qa.push_back(x->qpn());
    qb.push_back(y->qpn());
    EXPECT_GE(x->qpn(), DeviceLimits::kFirstQpn);  // QP0, QP1 stay reserved
  }
  EXPECT_NE(qa, qb);
  int neighbours = 0;
  for (size_t i = 1; i < qa.size(); i++) neighbours += qa[i] == qa[i - 1] + 1;
  EXPECT_LT(neighbours, 3);
  EXPECT_EQ(std::set<uint32_t>(qa.begin(), qa.end()).size(), qa.size());
}

// A forged fatal NAK whose cumulative PSN equals its NAK PSN
// passed for any outstanding PSN. Here a READ is still unanswered when
// the forged NAK names the WRITE behind it: no responder could have
// expected that WRITE's PSN yet, so the NAK is ignored.
TEST(QpSecurity, ForgedFatalNakBeyondTheOldestOutstandingPsnIsIgnored) {
  Pair t;
  fill_random(t.b.buf.data(), 8192, 4);
  bool hold = true;  // B's answers are held back while the NAK is forged
  t.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>&) { return !(hold && from == kIpB); };
  const uint32_t psn = impl(t.a.qp)->snd_nxt;
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 1, 0, 4096, 0), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 2, 4096, 4096, 4096), 0);
  t.net.run_for(20'000);
  ASSERT_EQ(impl(t.a.qp)->snd_nxt, psn + 2);
  wire::Base b;
  b.op = wire::Op::ACK;
  b.dst_qpn = t.a.qp->qpn();
  b.src_qpn = t.b.qp->qpn();
  b.psn = psn + 1;
  wire::AckExt a;
  a.syndrome = wire::Syndrome::NAK_REM_ACCESS;
  a.nak_psn = a.cum_psn = a.sack_base = psn + 1;
  std::vector<uint8_t> v(wire::kMaxHeaderLen + 128);
  v.resize(wire::encode(b, a, v.data()));
  t.net.inject(kIpB, kIpA, v);
  t.net.run_for(20'000);
  EXPECT_EQ(t.a.qp->state(), QpState::RTS);
  EXPECT_EQ(t.a.eng->stats().bad_ack, 1u);
  hold = false;
  auto wc = t.wait(t.a, t.a.scq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(wc[1].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 4096), 0);
  EXPECT_EQ(t.a.qp->state(), QpState::RTS);
}

// ... and a real one still fails its WR: a bad rkey right behind a WRITE
// and a READ whose answers the NAK may overtake.
TEST(QpSecurity, RealRemoteAccessNakStillFailsTheWr) {
  Pair t;
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 3 * 4096, 0), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 2, 0, 4096, 0), 0);
  Sge sg{t.a.addr(0), 4096, t.a.mr->lkey()};
  SendWr wr;
  wr.wr_id = 3;
  wr.opcode = WrOpcode::RDMA_WRITE;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.remote_addr = t.b.addr(0);
  wr.rkey = t.b.mr->rkey() ^ 0x100;  // no such key
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  auto wc = t.wait(t.a, t.a.scq, 3);
  ASSERT_EQ(wc.size(), 3u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(wc[1].status, WcStatus::SUCCESS);
  EXPECT_EQ(wc[2].wr_id, 3u);
  EXPECT_EQ(wc[2].status, WcStatus::REM_ACCESS_ERR);
  EXPECT_EQ(t.a.qp->state(), QpState::ERR);
  EXPECT_EQ(t.a.eng->stats().bad_ack, 0u);
}

}  // namespace
}  // namespace vstellar::test
