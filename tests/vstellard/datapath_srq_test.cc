// Shared receive queues: two QPs fed by one SRQ, the commands' checks, a
// bad SRQ WQE, RESIZE_SRQ.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "vstellard/datapath_fixture.h"

namespace vstellard::datapath_test {

// Shared receive queues: two QPs of device B take their receives from one
// SRQ; the CQEs name the SRQ's slots and carry its wr_ids; the limit event
// reaches the guest's event queue; the verbs rules of the commands.
TEST_F(DataPath, SrqFeedsTwoQpsAndCqesNameItsSlots) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GSrq srq = B.CreateSrq(/*srq_limit=*/3);
  ASSERT_NE(srq.srqn, 0u);
  GQp qa0 = A.CreateQp(), qa1 = A.CreateQp();
  GQp qb0 = B.CreateQpOnSrq(srq.srqn), qb1 = B.CreateQpOnSrq(srq.srqn);
  A.Connect(qa0, qb0.qpn);
  B.Connect(qb0, qa0.qpn);
  A.Connect(qa1, qb1.qpn);
  B.Connect(qb1, qa1.qpn);

  // Five receives of 1 KiB each, wr_ids 0x50..0x54.
  for (uint32_t i = 0; i < 5; i++) B.PostSrqRecv(srq, 0x50 + i, {B.Sge(1024 * i, 1024)});
  // QP0 sends tags 1 and 2, QP1 tag 3: 600 bytes each, all bytes = tag.
  auto send = [&](GQp& q, uint8_t tag) {
    std::memset(A.Buf(4096 * tag), tag, 600);
    A.PostSend(q, Wqe(VSTELLAR_WR_SEND, tag), {A.Sge(4096 * tag, 600)});
    auto c = A.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->status, 0);
  };
  send(qa0, 1);
  send(qa1, 3);
  send(qa0, 2);
  std::map<uint32_t, std::vector<uint8_t>> by_qp;
  std::set<uint64_t> wr_ids;
  for (int i = 0; i < 3; i++) {
    auto c = B.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->status, 0);
    EXPECT_EQ(c->opcode, VSTELLAR_WC_RECV);
    EXPECT_TRUE(c->wc_flags & VSTELLAR_CQE_SRQ);
    EXPECT_EQ(c->byte_len, 600u);
    ASSERT_GE(c->wr_id, 0x50u);
    ASSERT_LE(c->wr_id, 0x54u);
    EXPECT_EQ(c->wqe_idx, c->wr_id - 0x50) << "wqe_idx names the SRQ slot";
    EXPECT_TRUE(wr_ids.insert(c->wr_id).second);
    by_qp[c->qpn].push_back(B.Buf(1024 * (c->wr_id - 0x50))[599]);
  }
  EXPECT_EQ(by_qp[qb0.qpn], (std::vector<uint8_t>{1, 2}));
  EXPECT_EQ(by_qp[qb1.qpn], (std::vector<uint8_t>{3}));
  EXPECT_EQ(wr_ids, (std::set<uint64_t>{0x50, 0x51, 0x52})) << "taken in posting order";
  // 2 left, below the limit of 3: one event for the guest's SRQN.
  EXPECT_TRUE(Has(fb_->Events(2000), VSTELLAR_EV_SRQ_LIMIT_REACHED, srq.srqn));
  vstellar_cmd_handle h{srq.srqn, 0};
  CmdResult r = B.Cmd(VSTELLAR_CMD_QUERY_SRQ, &h, sizeof(h), sizeof(vstellar_resp_query_srq));
  ASSERT_EQ(r.status(), 0);
  EXPECT_EQ(As<vstellar_resp_query_srq>(r).max_wr, 16u);
  EXPECT_EQ(As<vstellar_resp_query_srq>(r).max_sge, 2u);
  EXPECT_EQ(As<vstellar_resp_query_srq>(r).srq_limit, 0u) << "disarmed once it fired";
  // In use by QPs: BUSY; another context's device cannot name it.
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_DESTROY_SRQ, &h, sizeof(h), 0).status(), VSTELLAR_STATUS_BUSY);
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_DESTROY_SRQ, &h, sizeof(h), 0).status(), VSTELLAR_STATUS_BAD_HANDLE);
}

TEST_F(DataPath, SrqCommandsCheckEveryField) {
  StartDaemon();
  TwoGuests();
  Guest& B = *b_;
  auto create = [&](auto change) {
    vstellar_cmd_create_srq c{};
    c.pdn = B.pd;
    c.log_wqe = kSrqLog;
    c.log_stride = 6;
    c.page_shift = 12;
    c.max_sge = 2;
    c.num_pages = 1;
    change(c);
    auto body = WithPages(&c, sizeof(c), {kSrqGpa});
    return B.Cmd(VSTELLAR_CMD_CREATE_SRQ, body.data(), body.size(), sizeof(vstellar_resp_create_srq)).status();
  };
  EXPECT_EQ(create([](auto& c) { c.pdn = 999; }), VSTELLAR_STATUS_BAD_HANDLE);
  EXPECT_EQ(create([](auto& c) { c.log_wqe = 17; }), VSTELLAR_STATUS_LIMIT);
  EXPECT_EQ(create([](auto& c) { c.max_sge = 1000; }), VSTELLAR_STATUS_LIMIT);
  EXPECT_EQ(create([](auto& c) { c.log_stride = 3; }), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(create([](auto& c) { c.max_sge = 4; }), VSTELLAR_STATUS_BAD_FIELD) << "4 SGEs do not fit 64 bytes";
  EXPECT_EQ(create([](auto& c) { c.srq_limit = 16; }), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(create([](auto& c) { c.reserved1 = 1; }), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(create([](auto& c) { c.num_pages = 2; }), VSTELLAR_STATUS_BAD_LENGTH);
  EXPECT_EQ(create([](auto& c) { c.ring_offset = 8; }), VSTELLAR_STATUS_BAD_FIELD);
  GSrq srq = B.CreateSrq();
  ASSERT_NE(srq.srqn, 0u);
  // A QP on it may not also bring an RQ, and must be of the SRQ's PD.
  vstellar_cmd_create_qp c{};
  c.pdn = B.pd;
  c.send_cqn = c.recv_cqn = B.cq;
  c.qp_type = VSTELLAR_QPT_RC;
  c.create_flags = VSTELLAR_QP_CREATE_USE_SRQ;
  c.srq.srqn = srq.srqn;
  c.sq_log_wqe = kSqLog;
  c.sq_log_stride = 7;
  c.rq_log_wqe = 2;
  c.page_shift = 12;
  c.sq_pages = 2;
  auto body = WithPages(&c, sizeof(c), {kRingGpa, kRingGpa + 4096});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24).status(), VSTELLAR_STATUS_BAD_FIELD);
  c.rq_log_wqe = 0;
  c.srq.srqn = 12345;
  body = WithPages(&c, sizeof(c), {kRingGpa, kRingGpa + 4096});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24).status(), VSTELLAR_STATUS_BAD_HANDLE);
  c.create_flags = 0x80;
  body = WithPages(&c, sizeof(c), {kRingGpa, kRingGpa + 4096});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24).status(), VSTELLAR_STATUS_BAD_FIELD);
  // MODIFY_SRQ: the limit only; no resizing.
  vstellar_cmd_modify_srq m{};
  m.srqn = srq.srqn;
  m.attr_mask = VSTELLAR_SRQ_MAX_WR;
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_MODIFY_SRQ, &m, sizeof(m), 0).status(), VSTELLAR_STATUS_UNSUPPORTED);
  m.attr_mask = VSTELLAR_SRQ_LIMIT;
  m.srq_limit = 16;
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_MODIFY_SRQ, &m, sizeof(m), 0).status(), VSTELLAR_STATUS_BAD_FIELD);
  m.srq_limit = 4;
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_MODIFY_SRQ, &m, sizeof(m), 0).status(), 0);
  vstellar_cmd_handle h{srq.srqn, 0};
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_DESTROY_SRQ, &h, sizeof(h), 0).status(), 0);
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_DESTROY_SRQ, &h, sizeof(h), 0).status(), VSTELLAR_STATUS_BAD_HANDLE);
}

TEST_F(DataPath, ABadSrqWqeFailsTheSrqAloneAndTheDaemonServesOthers) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GSrq srq = B.CreateSrq();
  // An SGE count beyond the slot, then a producer index beyond the ring.
  vstellar_recv_wqe w{};
  w.wr_id = 0x60;
  w.num_sge = htole32(200);
  std::memcpy(B.f.mem() + kSrqGpa, &w, sizeof(w));
  B.Ring(VSTELLAR_DB_SLOT_SIZE * srq.slot + offsetof(vstellar_db_srq, pi), ++srq.pi);
  EXPECT_TRUE(Has(fb_->Events(2000), VSTELLAR_EV_SRQ_ERR, srq.srqn));
  GSrq srq2 = B.CreateSrq();
  B.Ring(VSTELLAR_DB_SLOT_SIZE * srq2.slot + offsetof(vstellar_db_srq, pi), 1000);
  EXPECT_TRUE(Has(fb_->Events(2000), VSTELLAR_EV_SRQ_ERR, srq2.srqn));
  // Device A's ordinary traffic is untouched.
  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  B.PostRecv(qb, 0x70, {B.Sge(0, 64)});
  A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0x71), {A.Sge(0, 64)});
  auto c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0x70u);
  EXPECT_EQ(c->status, 0);
}

// RESIZE_SRQ: the WQEs posted in the old ring are taken first, later ones
// come from the new ring at the same free-running indices; every receive
// completes once, in posting order. Hostile requests fail alone.
TEST_F(DataPath, ResizeSrqKeepsEveryPostedWqe) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GSrq srq = B.CreateSrq();
  ASSERT_NE(srq.srqn, 0u);
  GQp qa = A.CreateQp(), qb = B.CreateQpOnSrq(srq.srqn);
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  for (uint32_t i = 0; i < 14; i++) B.PostSrqRecv(srq, 0x60 + i, {B.Sge(256 * i, 256)});
  auto resize = [&](uint32_t srqn, uint8_t log, uint64_t gpa, uint32_t pages, uint8_t shift = 12) {
    std::memset(B.f.mem() + gpa, 0, 4096ull * pages);
    vstellar_cmd_resize_srq c{};
    c.srqn = srqn;
    c.log_wqe = log;
    c.page_shift = shift;
    c.num_pages = pages;
    std::vector<uint64_t> pl;
    for (uint32_t i = 0; i < pages; i++) pl.push_back(gpa + 4096ull * i);
    auto body = WithPages(&c, sizeof(c), pl);
    return B.Cmd(VSTELLAR_CMD_RESIZE_SRQ, body.data(), body.size(), 0).status();
  };
  // Hostile: smaller than the 14 WQEs posted, beyond max_srq_wr, a page
  // list of the wrong size, another context's SRQ, reserved bits.
  EXPECT_EQ(resize(srq.srqn, 3, 0x3f1000, 1), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(resize(srq.srqn, 17, 0x3f1000, 1), VSTELLAR_STATUS_LIMIT);
  EXPECT_EQ(resize(srq.srqn, 7, 0x3f1000, 1), VSTELLAR_STATUS_BAD_FIELD);  // 8 KiB: two pages
  EXPECT_EQ(resize(0xbad, 6, 0x3f1000, 1), VSTELLAR_STATUS_BAD_HANDLE);
  {
    vstellar_cmd_resize_srq c{};
    c.srqn = srq.srqn;
    c.log_wqe = 6;
    c.page_shift = 12;
    c.num_pages = 1;
    c.reserved1 = 1;
    auto body = WithPages(&c, sizeof(c), {0x3f1000});
    EXPECT_EQ(B.Cmd(VSTELLAR_CMD_RESIZE_SRQ, body.data(), body.size(), 0).status(), VSTELLAR_STATUS_BAD_FIELD);
    c.reserved1 = 0;
    body = WithPages(&c, sizeof(c), {0x3f1000});
    EXPECT_EQ(A.Cmd(VSTELLAR_CMD_RESIZE_SRQ, body.data(), body.size(), 0).status(), VSTELLAR_STATUS_BAD_HANDLE);
  }
  // 64 slots: WQEs 14..19 go into the new ring, slots 14..19 of it.
  ASSERT_EQ(resize(srq.srqn, 6, 0x3f1000, 1), 0);
  srq.gpa = 0x3f1000;
  srq.log = 6;
  for (uint32_t i = 14; i < 20; i++) B.PostSrqRecv(srq, 0x60 + i, {B.Sge(256 * i, 256)});
  vstellar_cmd_handle h{srq.srqn, 0};
  CmdResult r = B.Cmd(VSTELLAR_CMD_QUERY_SRQ, &h, sizeof(h), sizeof(vstellar_resp_query_srq));
  ASSERT_EQ(r.status(), 0);
  EXPECT_EQ(As<vstellar_resp_query_srq>(r).max_wr, 64u);
  for (uint32_t i = 0; i < 20; i++) {
    A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, i), {A.Sge(0, 100)});
    auto c = B.Poll();
    ASSERT_TRUE(c) << i;
    EXPECT_EQ(c->status, 0);
    EXPECT_EQ(c->wr_id, 0x60u + i);
    EXPECT_TRUE(c->wc_flags & VSTELLAR_CQE_SRQ);
    ASSERT_TRUE(A.Poll());
  }
}

}  // namespace vstellard::datapath_test
