// Objects moving between two engines of one process (Engine::detach,
// Engine::attach), as vstellard moves a device to its peer's worker: a QP
// moved in the middle of a lossy transfer finishes it, in order, with the
// data intact; numbers stay unique across the engines; a set that is not
// closed, or an engine of another shape, is refused and nothing changes.
#include <gtest/gtest.h>

#include <set>

#include "engine_internal.h"
#include "retries_used.h"
#include "sim_pair.h"

namespace vstellar::test {
namespace {

EngineConfig Shard(uint32_t shard) {
  EngineConfig c;
  c.qpn_shards = 2;
  c.qpn_shard = shard;
  return c;
}

// Pair's side a is worker 0 of a two-worker daemon; `other` is worker 1,
// behind the same address (and link).
struct MovePair {
  explicit MovePair(double loss = 0.0) : p(Options()) {
    p.net.impairment.loss = loss;
    EngineConfig c = Shard(1);
    c.seed = 77;
    c.audit = true;
    other = std::make_unique<Engine>(c, link_of_a(), p.net);
  }
  static PairOptions Options() {
    PairOptions o;
    o.cfg = Shard(0);
    o.cfg_b = EngineConfig{};
    o.cfg.qpn_seed = 5;
    return o;
  }
  // SimNet keeps one link per node; a second engine of node a sends on it.
  Link& link_of_a() { return p.net.link_of(kIpA); }
  EngineObjects ObjectsOfA() {
    EngineObjects o;
    o.pds = {p.a.pd};
    o.cqs = {p.a.scq, p.a.rcq};
    o.mrs = {p.a.mr};
    o.qps = {p.a.qp};
    return o;
  }
  // Move side a's objects to `other` and deliver node a's datagrams there.
  void MoveA() {
    Detached d;
    ASSERT_EQ(p.a.eng->detach(ObjectsOfA(), &d), 0);
    ASSERT_EQ(other->attach(&d), 0);
    std::swap(p.a.eng, other);
    p.net.attach(kIpA, p.a.eng.get());
  }
  Pair p;
  std::unique_ptr<Engine> other;
};

TEST(EngineMove, AQpMovedMidTransferFinishesInOrderWithItsData) {
  MovePair m(0.02);  // packets in flight and timers armed when it moves
  Pair& p = m.p;
  fill_random(p.a.buf.data(), p.a.buf.size(), 3);
  constexpr int kWrs = 64;
  constexpr uint32_t kLen = 8192;
  // SEND k (WR 2k+1) lands in receive WQE k, after the WRITEs' range.
  auto recv_off = [&](int k) { return size_t(kWrs + k) * kLen; };
  for (int k = 0; k < kWrs / 2; k++) ASSERT_EQ(p.post_recv(p.b, 1000 + k, recv_off(k), kLen), 0);
  for (int i = 0; i < kWrs; i++) {
    const WrOpcode op = i % 2 ? WrOpcode::SEND : WrOpcode::RDMA_WRITE;
    ASSERT_EQ(p.post_send(p.a, op, i, uint64_t(i) * kLen, kLen, uint64_t(i) * kLen), 0);
  }
  // Run until a quarter have completed, then move mid-flight.
  std::vector<Wc> got;
  p.net.run_until([&] {
    Wc wc;
    while (got.size() < kWrs / 4 && p.a.eng->poll_cq(p.a.scq, &wc, 1) == 1) got.push_back(wc);
    return got.size() >= kWrs / 4;
  });
  ASSERT_EQ(got.size(), size_t(kWrs / 4));
  ASSERT_LT(impl(*p.a.qp).sq_head, impl(*p.a.qp).sq_tail) << "moves with work outstanding";
  const uint32_t qpn = p.a.qp->qpn();
  m.MoveA();
  EXPECT_EQ(p.a.eng->find_qp(qpn), p.a.qp);
  EXPECT_EQ(m.other->find_qp(qpn), nullptr);
  std::vector<Wc> rest = p.wait(p.a, p.a.scq, kWrs - got.size());
  got.insert(got.end(), rest.begin(), rest.end());
  ASSERT_EQ(got.size(), size_t(kWrs));
  for (int i = 0; i < kWrs; i++) {
    EXPECT_EQ(got[i].wr_id, uint64_t(i)) << "completions out of order";
    EXPECT_EQ(got[i].status, WcStatus::SUCCESS) << i;
  }
  // WRITEs land at their offsets, SENDs in their receive WQEs, in order.
  for (int i = 0; i < kWrs; i += 2)
    EXPECT_EQ(std::memcmp(p.b.buf.data() + size_t(i) * kLen, p.a.buf.data() + size_t(i) * kLen, kLen), 0) << i;
  std::vector<Wc> recvs = p.wait(p.b, p.b.rcq, kWrs / 2);
  ASSERT_EQ(recvs.size(), size_t(kWrs / 2));
  for (int k = 0; k < kWrs / 2; k++) {
    EXPECT_EQ(recvs[k].wr_id, uint64_t(1000 + k));
    EXPECT_EQ(std::memcmp(p.b.buf.data() + recv_off(k), p.a.buf.data() + size_t(2 * k + 1) * kLen, kLen), 0) << k;
  }
  // The moved QP answers its peer's READ too (responder state moved).
  ASSERT_EQ(p.post_send(p.b, WrOpcode::RDMA_READ, 9, 0, 65536, 0), 0);
  auto r = p.wait(p.b, p.b.scq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(p.b.buf.data(), p.a.buf.data(), 65536), 0);
}

TEST(EngineMove, NumbersStayUniqueAndComeHomeWhenTheObjectDies) {
  MovePair m;
  Pair& p = m.p;
  const uint32_t qpn = p.a.qp->qpn();
  const uint32_t key = p.a.mr->lkey();
  EXPECT_EQ(qpn % 2, 0u);
  EXPECT_EQ((key >> 8) % 2, 0u);
  EXPECT_EQ(p.a.scq->cqn() % 2, 0u);
  Engine* home = p.a.eng.get();
  m.MoveA();
  // The new engine hands out only its own shard's numbers; the old one
  // never hands out the moved QP's or MR's while they live.
  Pd* pd = p.a.eng->alloc_pd();
  Cq* cq = p.a.eng->create_cq(16);
  EXPECT_EQ(cq->cqn() % 2, 1u);
  Pd* hpd = home->alloc_pd();
  Cq* hcq = home->create_cq(16);
  std::set<uint32_t> home_qpns, home_keys;
  for (int i = 0; i < 200; i++) {
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = hcq;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
    Qp* q = home->create_qp(hpd, ia);
    ASSERT_NE(q, nullptr);
    EXPECT_NE(q->qpn(), qpn);
    home_qpns.insert(q->qpn());
    Mr* mr = home->reg_mr(hpd, 0x1000, 4096, ACCESS_LOCAL_WRITE, std::make_shared<HostMemory>());
    ASSERT_NE(mr, nullptr);
    EXPECT_NE(mr->lkey() >> 8, key >> 8);
  }
  // The moved QP dies where it lives now; its QPN and the MR's key go home.
  ASSERT_EQ(p.a.eng->dereg_mr(p.a.mr), 0);
  ASSERT_EQ(p.a.eng->destroy_qp(p.a.qp), 0);
  ReturnedIds ids = p.a.eng->take_returned_ids();
  EXPECT_EQ(ids.qpns, std::vector<uint32_t>{qpn});
  EXPECT_EQ(ids.key_indices, std::vector<uint32_t>{key >> 8});
  EXPECT_TRUE(p.a.eng->take_returned_ids().empty());
  home->ids_returned(ids);
  p.a.qp = nullptr;
  p.a.mr = nullptr;
  (void)pd;
}

TEST(EngineMove, OpenSetsAndOtherShapesAreRefusedAndNothingChanges) {
  MovePair m;
  Pair& p = m.p;
  Detached d;
  EngineObjects o = m.ObjectsOfA();
  o.cqs = {p.a.scq};  // the QP's receive CQ stays behind
  EXPECT_EQ(p.a.eng->detach(o, &d), EINVAL);
  o = m.ObjectsOfA();
  o.mrs.clear();  // an MR of the moving PD stays behind
  EXPECT_EQ(p.a.eng->detach(o, &d), EINVAL);
  o = m.ObjectsOfA();
  o.qps.push_back(p.b.qp);  // another engine's
  EXPECT_EQ(p.a.eng->detach(o, &d), EINVAL);
  EXPECT_FALSE(d);
  EXPECT_EQ(p.a.eng->find_qp(p.a.qp->qpn()), p.a.qp);

  // An engine with another window size cannot take a QP's ring.
  EngineConfig c = Shard(1);
  c.window_pkts = 1024;
  Engine narrow(c, m.link_of_a(), p.net);
  ASSERT_EQ(p.a.eng->detach(m.ObjectsOfA(), &d), 0);
  EXPECT_EQ(narrow.attach(&d), EINVAL);
  ASSERT_TRUE(d);  // kept: back where they came from
  ASSERT_EQ(p.a.eng->attach(&d), 0);
  EXPECT_EQ(p.a.eng->find_qp(p.a.qp->qpn()), p.a.qp);
}

// A device stopped (a VM paused, a migration's stop and copy, objects
// loaded at a destination that starts later) keeps its QPs out of the
// engine for as long as the stop lasts: that time is not the peer's
// silence. A QP whose oldest packet has already used up its retries
// (the network dropped everything for a while) and that is taken back
// after longer than its retry limit (8 x 67 ms here) resends and goes
// on; counted from before the stop, it failed with RETRY_EXC at its
// first timer.
TEST(EngineMove, AQpTakenBackAfterALongStopIsNotTimedOutForIt) {
  MovePair m;
  Pair& p = m.p;
  bool drop;
  ASSERT_TRUE(write_until_retries_used(p, 5, &drop));
  Wc wc;
  ASSERT_EQ(p.a.eng->poll_cq(p.a.scq, &wc, 1), 0);
  Detached d;
  ASSERT_EQ(p.a.eng->detach(m.ObjectsOfA(), &d), 0);
  p.net.run_for(2'000'000'000);  // stopped for 2 s
  drop = false;
  ASSERT_EQ(p.a.eng->attach(&d), 0);
  auto done = p.wait(p.a, p.a.scq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(p.b.buf.data(), p.a.buf.data(), 65536), 0);
}

}  // namespace
}  // namespace vstellar::test
