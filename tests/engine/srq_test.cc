// Shared receive queues: several RC QPs take receives from one SRQ, in
// posting order, with completions in message order per QP; the limit
// event; RNR while the SRQ is empty; the verbs rules.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "engine_internal.h"  // white box: the QPs' receive state
#include "sim_pair.h"

namespace vstellar::test {
namespace {

constexpr uint32_t kMsg = 4096;

// A pair whose B side receives through an SRQ on `nqp` connected QP pairs
// (a.qps[i] <-> b.qps[i]). A posts SENDs, B's SRQ takes them.
struct SrqPair {
  explicit SrqPair(unsigned nqp, SrqInitAttr sattr = {}) : p(options()) {
    sattr.max_sge = 1;
    srq = p.b.eng->create_srq(p.b.pd, sattr);
    EXPECT_NE(srq, nullptr);
    for (unsigned i = 0; i < nqp; i++) {
      Qp* qa = i == 0 ? p.a.qp : make_qp(p.a, nullptr);
      Qp* qb = make_qp(p.b, srq);
      a_qps.push_back(qa);
      b_qps.push_back(qb);
      p.a.qp = qa;
      p.b.qp = qb;
      p.connect();
    }
  }
  static PairOptions options() {
    PairOptions o;
    o.connect = false;
    o.rnr_retry = 7;
    return o;
  }
  static Qp* make_qp(Side& s, Srq* srq) {
    QpInitAttr ia;
    ia.send_cq = s.scq;
    ia.recv_cq = s.rcq;
    ia.srq = srq;
    return s.eng->create_qp(s.pd, ia);
  }
  int post_srq(uint64_t wr_id, uint64_t off) {
    Sge sg{p.b.addr(off), kMsg, p.b.mr->lkey()};
    RecvWr wr;
    wr.wr_id = wr_id;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    return p.b.eng->post_srq_recv(srq, wr);
  }
  // SEND message `tag` (its bytes are all `tag`) on A's QP i.
  int send(unsigned i, uint8_t tag) {
    std::memset(p.a.buf.data() + tag * kMsg, tag, kMsg);
    p.a.qp = a_qps[i];
    return p.post_send(p.a, WrOpcode::SEND, tag, tag * kMsg, kMsg, 0);
  }

  Pair p;
  Srq* srq = nullptr;
  std::vector<Qp*> a_qps, b_qps;
};

TEST(Srq, TwoRcQpsTakeReceivesInPostingOrderAndCompleteInMessageOrder) {
  SrqPair s(2, SrqInitAttr{16, 1, 0});
  for (unsigned i = 0; i < 8; i++) ASSERT_EQ(s.post_srq(100 + i, i * kMsg), 0);
  EXPECT_EQ(s.srq->room(), 8u);
  // QP0 sends tags 1, 2, 3 and QP1 tags 4, 5, interleaved.
  ASSERT_EQ(s.send(0, 1), 0);
  ASSERT_EQ(s.send(1, 4), 0);
  ASSERT_EQ(s.send(0, 2), 0);
  ASSERT_EQ(s.send(1, 5), 0);
  ASSERT_EQ(s.send(0, 3), 0);
  auto wcs = s.p.wait(s.p.b, s.p.b.rcq, 5);
  ASSERT_EQ(wcs.size(), 5u);
  std::map<uint32_t, std::vector<uint8_t>> tags_by_qp;
  std::set<uint64_t> used;
  for (const Wc& wc : wcs) {
    EXPECT_EQ(wc.status, WcStatus::SUCCESS);
    EXPECT_TRUE(wc.wc_flags & WC_SRQ);
    EXPECT_EQ(wc.byte_len, kMsg);
    ASSERT_GE(wc.wr_id, 100u);
    ASSERT_LT(wc.wr_id, 108u);
    EXPECT_TRUE(used.insert(wc.wr_id).second) << "one SRQ WQE completed twice";
    const uint8_t* got = s.p.b.buf.data() + (wc.wr_id - 100) * kMsg;
    for (uint32_t k = 1; k < kMsg; k++) ASSERT_EQ(got[k], got[0]);
    tags_by_qp[wc.qp_num].push_back(got[0]);
  }
  EXPECT_EQ(tags_by_qp[s.b_qps[0]->qpn()], (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(tags_by_qp[s.b_qps[1]->qpn()], (std::vector<uint8_t>{4, 5}));
  // The five taken WQEs were the five oldest, whatever QP took them.
  EXPECT_EQ(used, (std::set<uint64_t>{100, 101, 102, 103, 104}));
  EXPECT_EQ(s.srq->room(), 13u);
}

TEST(Srq, LimitEventFiresOnceWhenFewerWqesThanTheLimitAreLeft) {
  SrqPair s(1, SrqInitAttr{16, 1, 3});
  for (unsigned i = 0; i < 5; i++) ASSERT_EQ(s.post_srq(i, i * kMsg), 0);
  for (uint8_t tag = 1; tag <= 2; tag++) {
    ASSERT_EQ(s.send(0, tag), 0);
    ASSERT_EQ(s.p.wait(s.p.b, s.p.b.rcq, 1).size(), 1u);
    EXPECT_TRUE(s.p.b.eng->take_async_events().empty()) << "not below the limit of 3 yet";
  }
  ASSERT_EQ(s.send(0, 3), 0);
  ASSERT_EQ(s.p.wait(s.p.b, s.p.b.rcq, 1).size(), 1u);
  auto ev = s.p.b.eng->take_async_events();
  ASSERT_EQ(ev.size(), 1u) << "2 left, below 3";
  EXPECT_EQ(ev[0].type, AsyncEventType::SRQ_LIMIT_REACHED);
  EXPECT_EQ(ev[0].qpn_or_cqn, s.srq->srqn());
  EXPECT_EQ(s.srq->limit(), 0u) << "the limit disarms when it fires";
  // Armed again at 2, it fires again when 1 is left.
  EXPECT_EQ(s.p.b.eng->modify_srq(s.srq, 2), 0);
  ASSERT_EQ(s.send(0, 4), 0);
  ASSERT_EQ(s.p.wait(s.p.b, s.p.b.rcq, 1).size(), 1u);
  ev = s.p.b.eng->take_async_events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].type, AsyncEventType::SRQ_LIMIT_REACHED);
  // Disarmed: the last one raises nothing.
  ASSERT_EQ(s.send(0, 5), 0);
  ASSERT_EQ(s.p.wait(s.p.b, s.p.b.rcq, 1).size(), 1u);
  EXPECT_TRUE(s.p.b.eng->take_async_events().empty());
}

TEST(Srq, AnEmptySrqIsReceiverNotReadyUntilAReceiveIsPosted) {
  SrqPair s(1);
  ASSERT_EQ(s.send(0, 7), 0);
  s.p.net.run_until([] { return false; }, 2'000'000);  // RNR NAKs, retries
  Wc wc;
  EXPECT_EQ(s.p.b.eng->poll_cq(s.p.b.rcq, &wc, 1), 0);
  ASSERT_EQ(s.post_srq(42, 0), 0);
  auto wcs = s.p.wait(s.p.b, s.p.b.rcq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 42u);
  EXPECT_EQ(wcs[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(s.p.b.buf[0], 7);
  auto sent = s.p.wait(s.p.a, s.p.a.scq, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::SUCCESS);
}

TEST(Srq, VerbsRules) {
  Pair p;
  Engine& e = *p.b.eng;
  EXPECT_EQ(e.create_srq(p.b.pd, SrqInitAttr{0, 1, 0}), nullptr) << "no entries";
  EXPECT_EQ(e.create_srq(p.b.pd, SrqInitAttr{8, 1, 8}), nullptr) << "limit >= max_wr";
  EXPECT_EQ(e.create_srq(p.b.pd, SrqInitAttr{8, DeviceLimits::kMaxSge + 1, 0}), nullptr);
  EXPECT_EQ(e.create_srq(nullptr, SrqInitAttr{}), nullptr);
  Srq* srq = e.create_srq(p.b.pd, SrqInitAttr{4, 1, 0});
  ASSERT_NE(srq, nullptr);
  EXPECT_EQ(e.modify_srq(srq, 4), EINVAL);

  // More SGEs than the SRQ holds: refused, and why.
  Sge sg[2] = {{p.b.addr(0), 16, p.b.mr->lkey()}, {p.b.addr(16), 16, p.b.mr->lkey()}};
  RecvWr wr;
  wr.sg_list = sg;
  wr.num_sge = 2;
  WcStatus why = WcStatus::SUCCESS;
  EXPECT_EQ(e.post_srq_recv(srq, wr, &why), EINVAL);
  EXPECT_EQ(why, WcStatus::LOC_LEN_ERR);
  wr.num_sge = 1;
  for (int i = 0; i < 4; i++) EXPECT_EQ(e.post_srq_recv(srq, wr), 0);
  EXPECT_EQ(e.post_srq_recv(srq, wr), ENOMEM) << "full";

  // A QP on it: no receives of its own, and it pins the SRQ.
  QpInitAttr ia;
  ia.send_cq = p.b.scq;
  ia.recv_cq = p.b.rcq;
  ia.srq = srq;
  Qp* qp = e.create_qp(p.b.pd, ia);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(qp->rq_room(), 0u);
  Qp* own = p.b.qp;
  p.b.qp = qp;
  ASSERT_EQ(Pair::to_init(p.b, ACCESS_LOCAL_WRITE), 0);
  why = WcStatus::SUCCESS;
  EXPECT_EQ(e.post_recv(qp, wr, &why), EINVAL);
  EXPECT_EQ(why, WcStatus::LOC_QP_OP_ERR);
  EXPECT_EQ(e.destroy_srq(srq), EBUSY);
  ia.qp_type = QpType::GSI;
  EXPECT_EQ(e.create_qp(p.b.pd, ia), nullptr) << "the GSI QP has its own receives";
  ia.qp_type = QpType::RC;
  Pd* other = e.alloc_pd();
  EXPECT_EQ(e.create_qp(other, ia), nullptr) << "an SRQ of another PD";
  EXPECT_EQ(e.destroy_qp(qp), 0);
  EXPECT_EQ(e.destroy_srq(srq), 0);
  EXPECT_EQ(e.destroy_srq(srq), EINVAL) << "gone";
  p.b.qp = own;
}

TEST(Srq, AQpEnteringErrorFlushesWhatItTookAndReportsItsLastWqe) {
  SrqPair s(1);
  for (unsigned i = 0; i < 4; i++) ASSERT_EQ(s.post_srq(10 + i, i * kMsg), 0);
  ASSERT_EQ(s.send(0, 1), 0);
  ASSERT_EQ(s.p.wait(s.p.b, s.p.b.rcq, 1).size(), 1u);
  QpAttr at;
  at.qp_state = QpState::ERR;
  ASSERT_EQ(s.p.b.eng->modify_qp(s.b_qps[0], at, QP_STATE), 0);
  auto ev = s.p.b.eng->take_async_events();
  bool last_wqe = false;
  for (auto& e : ev)
    if (e.type == AsyncEventType::QP_LAST_WQE_REACHED && e.qpn_or_cqn == s.b_qps[0]->qpn())
      last_wqe = true;
  EXPECT_TRUE(last_wqe);
  // The QP held no other WQE, so the rest stay in the SRQ for other QPs.
  EXPECT_EQ(s.srq->room(), s.srq->max_wr() - 3);
}

// resize_srq keeps the WQEs posted and not yet taken, in order, and gives
// the new number of slots; it refuses sizes below them or the armed limit.
TEST(Srq, ResizeKeepsPostedWqesInOrder) {
  SrqPair t(1, SrqInitAttr{4, 1, 0});
  Engine& e = *t.p.b.eng;
  for (uint64_t i = 0; i < 4; i++) ASSERT_EQ(t.post_srq(0x10 + i, i * kMsg), 0);
  EXPECT_EQ(t.srq->room(), 0u);
  EXPECT_EQ(e.resize_srq(t.srq, 3), EINVAL) << "fewer slots than WQEs posted";
  EXPECT_EQ(e.resize_srq(t.srq, DeviceLimits::kMaxQpWr + 1), EINVAL);
  ASSERT_EQ(e.resize_srq(t.srq, 16), 0);
  EXPECT_EQ(t.srq->max_wr(), 16u);
  EXPECT_EQ(t.srq->room(), 12u);
  for (uint64_t i = 4; i < 8; i++) ASSERT_EQ(t.post_srq(0x10 + i, i * kMsg), 0);
  for (uint8_t tag = 1; tag <= 8; tag++) ASSERT_EQ(t.send(0, tag), 0);
  auto rc = t.p.wait(t.p.b, t.p.b.rcq, 8);
  ASSERT_EQ(rc.size(), 8u);
  for (uint64_t i = 0; i < 8; i++) {
    EXPECT_EQ(rc[i].status, WcStatus::SUCCESS);
    EXPECT_EQ(rc[i].wr_id, 0x10 + i);
  }
  ASSERT_EQ(e.modify_srq(t.srq, 5), 0);
  EXPECT_EQ(e.resize_srq(t.srq, 4), EINVAL) << "the armed limit must stay below max_wr";
}

// One SEND whose rsn was head + 4095 moved every WQE of the
// shared SRQ into its QP (the only bound was the PSN window), and the other
// QPs got RNR from then on. A receive no earlier PSN could have led up to
// is not taken now.
TEST(Srq, ASendFarAheadInRsnDoesNotDrainTheSharedSrq) {
  SrqPair s(2, SrqInitAttr{16, 1, 0});
  for (unsigned i = 0; i < 8; i++) ASSERT_EQ(s.post_srq(100 + i, i * kMsg), 0);
  const QpImpl& victim = impl(*s.b_qps[0]);
  auto hostile = [&](uint32_t ahead, uint32_t rsn_ahead) {
    wire::Base b;
    b.op = wire::Op::SEND;
    b.flags = wire::F_FIRST | wire::F_LAST;
    b.dst_qpn = s.b_qps[0]->qpn();
    b.src_qpn = s.a_qps[0]->qpn();
    b.psn = victim.epsn + ahead;
    b.payload_len = 64;
    wire::DataExt e;
    e.msg_len = 64;
    e.rsn = uint32_t(victim.rq_head) + rsn_ahead;
    std::vector<uint8_t> v(wire::kMaxHeaderLen + 64, 0xAB);
    v.resize(wire::encode(b, e, v.data()) + 64);
    s.p.net.inject(kIpA, kIpB, v);
    s.p.net.run_for(100'000);
  };
  hostile(1, 4095);
  hostile(100, 4095);
  EXPECT_EQ(s.srq->room(), 8u) << "a far-ahead rsn took SRQ WQEs";
  // One PSN ahead per message ahead is possible: that many and no more.
  hostile(2, 2);
  EXPECT_LE(victim.rq_tail - victim.rq_head, 3u);
  // The honest QP on the same SRQ still receives.
  ASSERT_EQ(s.send(1, 9), 0);
  auto wcs = s.p.wait(s.p.b, s.p.b.rcq, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(wcs[0].qp_num, s.b_qps[1]->qpn());
  auto sent = s.p.wait(s.p.a, s.p.a.scq, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::SUCCESS);
}

}  // namespace
}  // namespace vstellar::test
