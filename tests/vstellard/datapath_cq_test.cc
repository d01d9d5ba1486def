// Completion queues: a full CQ, the notification backlog, RESIZE_CQ and its
// hostile requests.
#include <gtest/gtest.h>

#include "vstellard/datapath_fixture.h"

namespace vstellard::datapath_test {

TEST_F(DataPath, FullCqRaisesCqErr) {
  StartDaemon();
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  // 64 receives fill B's 64-entry CQ if B never polls; the 65th is lost
  // and the CQ is in error.
  for (uint32_t round = 0; round < 65; round++) {
    b_->PostRecv(qb, round, {b_->Sge(0, 64)});
    a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, round), {a_->Sge(0, 8)});
    ASSERT_TRUE(a_->Poll()) << round;
  }
  std::vector<vstellar_event> ev;
  for (int i = 0; i < 20 && !Has(ev, VSTELLAR_EV_CQ_ERR, b_->cq); i++) {
    auto more = fb_->Events(100);
    ev.insert(ev.end(), more.begin(), more.end());
  }
  EXPECT_TRUE(Has(ev, VSTELLAR_EV_CQ_ERR, b_->cq));
  EXPECT_EQ(StatsOf(1).cq_overflows, 1u);
  EXPECT_EQ(StatsOf(1).cqes, 64u);
}

// A guest that never takes its CQ notifications cannot grow
// the daemon's backlog of them: a CQ already waiting is not queued again.
TEST_F(DataPath, CqNotificationBacklogIsOnePerCq) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  // More armed completions than the notification queue has buffers
  // (FrontendOptions::ring_num), none of them taken.
  for (uint32_t i = 1; i <= 150; i++) {
    B.DbWord(VSTELLAR_DB_SLOT_SIZE * B.cq_slot + offsetof(vstellar_db_cq, arm)).store(htole32(i));
    B.PostRecv(qb, i, {B.Sge(0, 64)});
    A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, i), {A.Sge(0, 64)});
    ASSERT_TRUE(A.Poll());
    ASSERT_TRUE(B.Poll());
  }
  const std::string js = d_->StatsJson();
  size_t at = js.find("\"cq_notify_backlog\":");
  ASSERT_NE(at, std::string::npos);
  uint32_t most = 0;
  for (; at != std::string::npos; at = js.find("\"cq_notify_backlog\":", at + 1))
    most = std::max<uint32_t>(most, uint32_t(std::stoul(js.substr(at + 20))));
  EXPECT_LE(most, 1u) << js;
}

// RESIZE_CQ: the CQEs not yet polled move to the start of the new ring, in
// order, none lost and none twice; the slot's ci is reset; new CQEs follow,
// also across the new ring's wrap.
TEST_F(DataPath, ResizeCqMovesTheUnpolledCqes) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  for (uint64_t i = 0; i < 5; i++) B.PostRecv(qb, 0x100 + i, {B.Sge(64 * i, 64)});
  for (uint64_t i = 0; i < 5; i++) A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0x200 + i), {A.Sge(0, 16)});
  for (uint64_t i = 0; i < 2; i++) {
    auto c = B.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->wr_id, 0x100 + i);
  }
  // Wait until all five are in B's ring (the sender's completions say the
  // receiver has them), then move the three unpolled ones to a bigger ring.
  for (int i = 0; i < 5; i++) ASSERT_TRUE(A.Poll());
  uint8_t* old = B.f.mem() + kCqGpa;
  CmdResult r = B.ResizeCq(0x201000, 7);
  ASSERT_EQ(r.status(), 0);
  EXPECT_EQ(As<vstellar_resp_resize_cq>(r).cqe_moved, 3u);
  EXPECT_EQ(B.DbWord(VSTELLAR_DB_SLOT_SIZE * B.cq_slot + offsetof(vstellar_db_cq, ci)).load(), 0u);
  std::vector<uint8_t> before(old, old + 4096);
  for (uint64_t i = 2; i < 5; i++) {
    auto c = B.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->wr_id, 0x100 + i);
    EXPECT_EQ(c->status, 0);
    EXPECT_EQ(c->byte_len, 16u);
  }
  EXPECT_FALSE(B.Poll(50));
  // New completions go to the new ring; shrink it to 4 CQEs and wrap it.
  r = B.ResizeCq(0x203000, 2);
  ASSERT_EQ(r.status(), 0);
  EXPECT_EQ(As<vstellar_resp_resize_cq>(r).cqe_moved, 0u);
  for (uint64_t i = 0; i < 10; i++) {
    B.PostRecv(qb, 0x300 + i, {B.Sge(0, 64)});
    A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0x400 + i), {A.Sge(0, 8)});
    auto c = B.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->wr_id, 0x300 + i);
    ASSERT_TRUE(A.Poll());
  }
  // The old ring was not written after the resize.
  EXPECT_EQ(std::memcmp(before.data(), old, 4096), 0);
}

// Hostile RESIZE_CQ requests each fail alone with a clear status and leave
// the CQ as it was; the other device keeps being served.
TEST_F(DataPath, BadResizeCqFailsAloneAndTheCqKeepsWorking) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  for (uint64_t i = 0; i < 6; i++) B.PostRecv(qb, 0x10 + i, {B.Sge(0, 64)});
  for (uint64_t i = 0; i < 6; i++) A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0x20 + i), {A.Sge(0, 8)});
  for (int i = 0; i < 6; i++) ASSERT_TRUE(A.Poll());
  // Six CQEs outstanding: a ring of four cannot take them (IB: EINVAL).
  EXPECT_EQ(B.ResizeCq(0x201000, 2).status(), VSTELLAR_STATUS_LIMIT);
  // Larger than max_cqe, a log beyond the ABI.
  EXPECT_EQ(B.ResizeCq(0x201000, 21).status(), VSTELLAR_STATUS_LIMIT);
  // No such CQ; B's CQ named by another context (the kernel's) of B.
  EXPECT_EQ(B.ResizeCq(0x201000, 7, 0xdead).status(), VSTELLAR_STATUS_BAD_HANDLE);
  {
    vstellar_cmd_resize_cq k{};
    k.cqn = B.cq;
    k.log_cqe = 7;
    k.page_shift = 12;
    k.num_pages = 1;
    auto kb = WithPages(&k, sizeof(k), {0x201000});
    CmdResult r = B.f.Command(VSTELLAR_CMD_RESIZE_CQ, 0, kb.data(), kb.size(), 8);
    ASSERT_TRUE(r.done);
    EXPECT_EQ(r.status(), VSTELLAR_STATUS_BAD_HANDLE);
  }
  // Page list: too short, an address outside guest RAM, a bad offset.
  vstellar_cmd_resize_cq c{};
  c.cqn = B.cq;
  c.log_cqe = 8;  // 8 KiB: two pages
  c.page_shift = 12;
  c.num_pages = 1;
  auto body = WithPages(&c, sizeof(c), {0x201000});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_RESIZE_CQ, body.data(), body.size(), 8).status(), VSTELLAR_STATUS_BAD_FIELD);
  c.num_pages = 2;
  body = WithPages(&c, sizeof(c), {0x201000});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_RESIZE_CQ, body.data(), body.size(), 8).status(), VSTELLAR_STATUS_BAD_LENGTH);
  body = WithPages(&c, sizeof(c), {0x201000, 1ull << 40});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_RESIZE_CQ, body.data(), body.size(), 8).status(), VSTELLAR_STATUS_BAD_ADDRESS);
  c.ring_offset = 16;
  body = WithPages(&c, sizeof(c), {0x201000, 0x202000});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_RESIZE_CQ, body.data(), body.size(), 8).status(), VSTELLAR_STATUS_BAD_FIELD);
  c.ring_offset = 0;
  c.page_shift = 13;  // not in page_size_cap
  c.num_pages = 1;
  body = WithPages(&c, sizeof(c), {0x201000});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_RESIZE_CQ, body.data(), body.size(), 8).status(), VSTELLAR_STATUS_BAD_FIELD);
  // A consumer index ahead of the producer: the driver is broken.
  auto ci = B.DbWord(VSTELLAR_DB_SLOT_SIZE * B.cq_slot + offsetof(vstellar_db_cq, ci));
  ci.store(htole32(100));
  EXPECT_EQ(B.ResizeCq(0x201000, 7).status(), VSTELLAR_STATUS_BAD_STATE);
  ci.store(htole32(B.cq_ci));
  // The CQ is as it was: the six CQEs are in the old ring, in order.
  for (uint64_t i = 0; i < 6; i++) {
    auto e = B.Poll();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->wr_id, 0x10 + i);
  }
  // Device A was served throughout, and B's CQ still takes completions.
  A.PostRecv(qa, 0x30, {A.Sge(0, 64)});
  B.PostSend(qb, Wqe(VSTELLAR_WR_SEND, 0x31), {B.Sge(0, 8)});
  auto e = A.Poll();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->wr_id, 0x30u);
  e = B.Poll();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->wr_id, 0x31u);
}

}  // namespace vstellard::datapath_test
