// The small API the engine's users (vstellard, the harness) have on a QP:
// sq_room/rq_room, set_gsi_gids, and the reason post_send/post_recv give
// for a WR that breaks a verbs rule.
#include "sim_pair.h"

namespace {

using namespace vstellar;
using namespace vstellar::test;

SendWr one_sge_wr(WrOpcode op, Sge* sg, uint64_t raddr, uint32_t rkey) {
  SendWr wr;
  wr.opcode = op;
  wr.sg_list = sg;
  wr.num_sge = 1;
  wr.remote_addr = raddr;
  wr.rkey = rkey;
  return wr;
}

TEST(QpApi, RoomShrinksWithPostsAndGrowsWithCompletions) {
  PairOptions o;
  o.cap.max_send_wr = 4;
  o.cap.max_recv_wr = 3;
  Pair t(o);
  EXPECT_EQ(t.a.qp->sq_room(), 4u);
  EXPECT_EQ(t.b.qp->rq_room(), 3u);
  for (int i = 0; i < 4; i++) ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, i, 0, 64, 0), 0);
  EXPECT_EQ(t.a.qp->sq_room(), 0u);
  EXPECT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 9, 0, 64, 0), ENOMEM);
  ASSERT_EQ(t.post_recv(t.b, 1, 0, 64), 0);
  EXPECT_EQ(t.b.qp->rq_room(), 2u);
  ASSERT_EQ(t.wait(t.a, t.a.scq, 4).size(), 4u);
  EXPECT_EQ(t.a.qp->sq_room(), 4u);
}

TEST(QpApi, PostSendSaysWhyAWrIsRefused) {
  Pair t;
  Sge sg{t.a.addr(), 8, t.a.mr->lkey()};
  WcStatus why = WcStatus::SUCCESS;
  // An atomic must target an 8-byte aligned address.
  SendWr wr = one_sge_wr(WrOpcode::ATOMIC_FETCH_AND_ADD, &sg, t.b.addr(4), t.b.mr->rkey());
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr, &why), EINVAL);
  EXPECT_EQ(why, WcStatus::LOC_QP_OP_ERR);
  // ... and move exactly 8 bytes.
  sg.length = 16;
  wr.remote_addr = t.b.addr(8);
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr, &why), EINVAL);
  EXPECT_EQ(why, WcStatus::LOC_LEN_ERR);
  // More SGEs than the QP was created with.
  sg.length = 8;
  Sge many[5] = {sg, sg, sg, sg, sg};
  wr = one_sge_wr(WrOpcode::SEND, many, 0, 0);
  wr.num_sge = 5;
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr, &why), EINVAL);
  EXPECT_EQ(why, WcStatus::LOC_LEN_ERR);
  // A WRITE whose remote range wraps the address space.
  wr = one_sge_wr(WrOpcode::RDMA_WRITE, &sg, ~0ull - 4, t.b.mr->rkey());
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr, &why), EINVAL);
  EXPECT_EQ(why, WcStatus::LOC_LEN_ERR);
  // Nothing was queued.
  EXPECT_EQ(t.a.qp->sq_room(), t.opt.cap.max_send_wr);
}

TEST(QpApi, LkeysAtPostRefusesABadKeyAtOnce) {
  PairOptions o;
  o.cfg.lkeys_at_post = true;
  Pair t(o);
  WcStatus why = WcStatus::SUCCESS;
  Sge bad{t.a.addr(), 64, t.a.mr->lkey() + 0x100};
  SendWr wr = one_sge_wr(WrOpcode::SEND, &bad, 0, 0);
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr, &why), EINVAL);
  EXPECT_EQ(why, WcStatus::LOC_PROT_ERR);
  RecvWr rw;
  rw.sg_list = &bad;
  rw.num_sge = 1;
  why = WcStatus::SUCCESS;
  EXPECT_EQ(t.a.eng->post_recv(t.a.qp, rw, &why), EINVAL);
  EXPECT_EQ(why, WcStatus::LOC_PROT_ERR);
  // A good key still goes through.
  EXPECT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 64, 0), 0);
  ASSERT_EQ(t.wait(t.a, t.a.scq, 1).size(), 1u);
}

TEST(QpApi, GsiGidsOnlyOnAGsiQp) {
  Pair t;
  EXPECT_EQ(t.a.eng->set_gsi_gids(t.a.qp, {Gid{}}), EINVAL);  // an RC QP
  EXPECT_EQ(t.a.eng->set_gsi_gids(nullptr, {}), EINVAL);
  QpInitAttr ia;
  ia.qp_type = QpType::GSI;
  ia.send_cq = t.a.scq;
  ia.recv_cq = t.a.rcq;
  Qp* gsi = t.a.eng->create_qp(t.a.pd, ia);
  ASSERT_NE(gsi, nullptr);
  EXPECT_TRUE(gsi->is_gsi());
  EXPECT_TRUE(gsi->is_ud());
  EXPECT_EQ(gsi->type(), QpType::GSI);
  EXPECT_EQ(gsi->pd(), t.a.pd);
  EXPECT_EQ(t.a.eng->set_gsi_gids(gsi, {Gid{}}), 0);
  EXPECT_EQ(t.a.eng->destroy_qp(gsi), 0);
}

}  // namespace

namespace vstellar::test {
namespace {

// Hostile scale: progress() visits a QP while it has work or an
// armed timer, and not once it is idle, however many idle QPs there are.
TEST(QpApi, OnlyQpsWithWorkAreVisited) {
  Pair t;
  std::vector<Qp*> idle;
  for (int i = 0; i < 64; i++) {  // in RTS, and never sending: idle
    QpInitAttr ia;
    ia.send_cq = t.a.scq;
    ia.recv_cq = t.a.rcq;
    Qp* q = t.a.eng->create_qp(t.a.pd, ia);
    ASSERT_NE(q, nullptr);
    std::swap(t.a.qp, q);  // the pair's helpers take a's QP: this one for now
    ASSERT_EQ(Pair::to_init(t.a, ACCESS_REMOTE_WRITE), 0);
    ASSERT_EQ(t.to_rtr(t.a, t.b), 0);
    ASSERT_EQ(t.to_rts(t.a), 0);
    std::swap(t.a.qp, q);
    idle.push_back(q);
  }
  t.net.run_for(10'000'000);
  EXPECT_EQ(t.a.eng->active_qps(), 0u);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 64 << 10, 0), 0);
  EXPECT_EQ(t.a.eng->active_qps(), 1u);
  ASSERT_EQ(t.wait(t.a, t.a.scq, 1).size(), 1u);
  t.net.run_for(10'000'000);  // the last ACKs, then the timers lapse
  EXPECT_EQ(t.a.eng->active_qps(), 0u);
  EXPECT_EQ(t.b.eng->active_qps(), 0u);
  EXPECT_EQ(t.a.eng->next_deadline(), UINT64_MAX);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 2, 0, 4096, 0), 0);
  ASSERT_EQ(t.wait(t.a, t.a.scq, 1).size(), 1u);
  for (Qp* q : idle) EXPECT_EQ(t.a.eng->destroy_qp(q), 0);
}

}  // namespace
}  // namespace vstellar::test
