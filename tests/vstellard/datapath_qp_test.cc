// Queue pairs through the data path: RC SEND/RECV, WRITE, READ and atomics
// between two devices, ring wrap, hostile WQEs that fail their QP alone, a
// peer failing many QPs at once, UC.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "vstellard/datapath_fixture.h"

namespace vstellard::datapath_test {

// Every RC operation in turn on one connected pair: SEND/RECV over several
// packets, inline SEND with immediate and a CQ notification, unsignaled
// WRITE then WRITE_IMM, READ, both atomics, a bad rkey. One piece because
// each step follows on the rings, CQ indices and QP state the ones before
// left.
void DataPath::SendRecvWriteReadAtomicsBetweenTwoDevices() {
  StartDaemon();
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  Guest& A = *a_;
  Guest& B = *b_;

  // SEND -> RECV, 3000 bytes in two SGEs, three packets at MTU 1024.
  Fill(A.Buf(0), 3000, 1);
  std::memset(B.Buf(0), 0, 8192);
  B.PostRecv(qb, 0xb0, {B.Sge(0, 1000), B.Sge(1000, 4000)});
  A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0xa0), {A.Sge(0, 1200), A.Sge(1200, 1800)});
  auto ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 0xa0u);
  EXPECT_EQ(ca->status, 0);
  EXPECT_EQ(ca->opcode, VSTELLAR_WC_SEND);
  EXPECT_EQ(ca->qpn, qa.qpn);
  EXPECT_EQ(ca->wqe_idx, 0);
  auto cb = B.Poll();
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->wr_id, 0xb0u);
  EXPECT_EQ(cb->status, 0);
  EXPECT_EQ(cb->opcode, VSTELLAR_WC_RECV);
  EXPECT_EQ(cb->byte_len, 3000u);
  EXPECT_EQ(cb->wqe_idx, 0);
  EXPECT_EQ(std::memcmp(A.Buf(0), B.Buf(0), 3000), 0);

  // Inline SEND with immediate; B's CQ is armed: one CQ notification.
  B.DbWord(VSTELLAR_DB_SLOT_SIZE * B.cq_slot + offsetof(vstellar_db_cq, arm)).store(htole32(1));
  B.PostRecv(qb, 0xb1, {B.Sge(8192, 256)});
  std::vector<uint8_t> inl(40);
  Fill(inl.data(), inl.size(), 9);
  auto w = Wqe(VSTELLAR_WR_SEND_IMM, 0xa1, VSTELLAR_WQE_SIGNALED | VSTELLAR_WQE_SOLICITED);
  w.imm_data = htobe32(0x12345678);
  A.PostSend(qa, w, {}, inl);
  ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 0xa1u);
  EXPECT_EQ(ca->status, 0);
  cb = B.Poll();
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->wr_id, 0xb1u);
  EXPECT_EQ(cb->byte_len, 40u);
  EXPECT_EQ(cb->wc_flags & VSTELLAR_CQE_WITH_IMM, VSTELLAR_CQE_WITH_IMM);
  EXPECT_EQ(be32toh(cb->imm_data), 0x12345678u);
  EXPECT_EQ(std::memcmp(B.Buf(8192), inl.data(), 40), 0);
  uint16_t head;
  uint32_t len;
  ASSERT_TRUE(fb_->WaitUsed(VSTELLAR_VQ_CQN0, &head, &len));
  EXPECT_EQ(len, 8u);
  vstellar_cq_notify nt;
  std::memcpy(&nt, fb_->mem() + Frontend::kCqnGpa + 8 * (head / 4), 8);
  EXPECT_EQ(le32toh(nt.cqn), B.cq);
  EXPECT_EQ(le32toh(nt.ucontext), B.uctx);

  // Unsignaled WRITE then signaled WRITE_IMM: one send CQE naming WQE 3.
  Fill(A.Buf(16384), 5000, 3);
  std::memset(B.Buf(32768), 0, 8192);
  w = Wqe(VSTELLAR_WR_RDMA_WRITE, 0xa2, 0);
  w.u.rdma.remote_addr = kMrGpa + 32768;
  w.u.rdma.rkey = B.rkey;
  A.WriteSend(qa, w, {A.Sge(16384, 4000)});
  B.PostRecv(qb, 0xb2, {});
  w = Wqe(VSTELLAR_WR_RDMA_WRITE_IMM, 0xa3);
  w.u.rdma.remote_addr = kMrGpa + 32768 + 4000;
  w.u.rdma.rkey = B.rkey;
  w.imm_data = htobe32(77);
  A.PostSend(qa, w, {A.Sge(20384, 1000)});
  ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 0xa3u);
  EXPECT_EQ(ca->wqe_idx, 3);
  EXPECT_EQ(ca->opcode, VSTELLAR_WC_RDMA_WRITE);
  cb = B.Poll();
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->wr_id, 0xb2u);
  EXPECT_EQ(cb->opcode, VSTELLAR_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(be32toh(cb->imm_data), 77u);
  EXPECT_EQ(std::memcmp(A.Buf(16384), B.Buf(32768), 5000), 0);

  // READ 6000 bytes of B into A.
  Fill(B.Buf(49152), 6000, 5);
  std::memset(A.Buf(65536), 0, 8192);
  w = Wqe(VSTELLAR_WR_RDMA_READ, 0xa4);
  w.u.rdma.remote_addr = kMrGpa + 49152;
  w.u.rdma.rkey = B.rkey;
  A.PostSend(qa, w, {A.Sge(65536, 6000)});
  ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->status, 0);
  EXPECT_EQ(ca->opcode, VSTELLAR_WC_RDMA_READ);
  EXPECT_EQ(ca->byte_len, 6000u);
  EXPECT_EQ(std::memcmp(A.Buf(65536), B.Buf(49152), 6000), 0);

  // Fetch-and-add, then compare-and-swap.
  uint64_t v = htole64(5);
  std::memcpy(B.Buf(90112), &v, 8);
  w = Wqe(VSTELLAR_WR_ATOMIC_FETCH_ADD, 0xa5);
  w.u.atomic.remote_addr = kMrGpa + 90112;
  w.u.atomic.rkey = B.rkey;
  w.u.atomic.compare_add = 7;
  A.PostSend(qa, w, {A.Sge(81920, 8)});
  ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->status, 0);
  EXPECT_EQ(ca->opcode, VSTELLAR_WC_FETCH_ADD);
  std::memcpy(&v, A.Buf(81920), 8);
  EXPECT_EQ(le64toh(v), 5u);
  std::memcpy(&v, B.Buf(90112), 8);
  EXPECT_EQ(le64toh(v), 12u);
  w = Wqe(VSTELLAR_WR_ATOMIC_CMP_SWP, 0xa6);
  w.u.atomic.remote_addr = kMrGpa + 90112;
  w.u.atomic.rkey = B.rkey;
  w.u.atomic.compare_add = 12;
  w.u.atomic.swap = 99;
  A.PostSend(qa, w, {A.Sge(81928, 8)});
  ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->status, 0);
  EXPECT_EQ(ca->opcode, VSTELLAR_WC_COMP_SWAP);
  std::memcpy(&v, A.Buf(81928), 8);
  EXPECT_EQ(le64toh(v), 12u);
  std::memcpy(&v, B.Buf(90112), 8);
  EXPECT_EQ(le64toh(v), 99u);

  // A bad rkey is the responder's verdict: remote access error, QP in ERR.
  w = Wqe(VSTELLAR_WR_RDMA_WRITE, 0xa7);
  w.u.rdma.remote_addr = kMrGpa;
  w.u.rdma.rkey = B.rkey ^ 0x100;
  A.PostSend(qa, w, {A.Sge(0, 64)});
  ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 0xa7u);
  EXPECT_EQ(ca->status, uint8_t(vstellar::WcStatus::REM_ACCESS_ERR));

  // More than a ring's worth of CQEs went by with the phase bit flipping.
  auto s = StatsOf(0);
  EXPECT_GE(s.wqes, 8u);
  EXPECT_EQ(s.bad_wqes, 0u);
}

TEST_F(DataPath, SendRecvWriteReadAtomicsBetweenTwoDevices) { SendRecvWriteReadAtomicsBetweenTwoDevices(); }
TEST_F(DataPathOnTwoThreads, SendRecvWriteReadAtomicsBetweenTwoDevices) { SendRecvWriteReadAtomicsBetweenTwoDevices(); }

TEST_F(DataPath, RingWrapsAndPhaseBitFlips) {
  StartDaemon();
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  // 150 SEND/RECV pairs: more than two passes over the 64-entry rings.
  for (uint32_t i = 0; i < 150; i++) {
    *b_->Buf(0) = 0;
    *a_->Buf(4096) = uint8_t(i + 1);
    b_->PostRecv(qb, 1000 + i, {b_->Sge(0, 64)});
    a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, i), {a_->Sge(4096, 16)});
    auto ca = a_->Poll();
    ASSERT_TRUE(ca) << i;
    EXPECT_EQ(ca->wr_id, i);
    EXPECT_EQ(ca->wqe_idx, uint16_t(i));
    auto cb = b_->Poll();
    ASSERT_TRUE(cb) << i;
    EXPECT_EQ(cb->wr_id, 1000 + i);
    EXPECT_EQ(*b_->Buf(0), uint8_t(i + 1));
  }
}

// Each kind of bad WQE on a fresh QP of one device: the error CQE and
// event, the flush of later WQEs, and the way back through RESET. A table
// of cases run by one loop, so every case is checked the same way.
TEST_F(DataPath, BadWqesMoveTheQpToErrWithAnErrorCqe) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  struct Case {
    const char* name;
    std::function<void(GQp&)> post;
    uint8_t status;
    uint16_t event;
  };
  const uint32_t other_lkey = b_->lkey;
  std::vector<Case> cases = {
      {"bad opcode", [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_BIND_MW + 1, 0xe0), {A.Sge(0, 8)}); },
       uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR), VSTELLAR_EV_QP_FATAL},
      {"unknown flag", [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xe0, 0x81), {A.Sge(0, 8)}); },
       uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR), VSTELLAR_EV_QP_FATAL},
      {"SGE count above the QP's",
       [&](GQp& q) {
         auto w = Wqe(VSTELLAR_WR_SEND, 0xe0);
         w.num_sge = 5;
         A.PostSend(q, w, {A.Sge(0, 8)});
       },
       uint8_t(vstellar::WcStatus::LOC_LEN_ERR), VSTELLAR_EV_QP_FATAL},
      {"SGE count beyond the slot",
       [&](GQp& q) {
         auto w = Wqe(VSTELLAR_WR_SEND, 0xe0);
         w.num_sge = 255;
         A.PostSend(q, w, {A.Sge(0, 8)});
       },
       uint8_t(vstellar::WcStatus::LOC_LEN_ERR), VSTELLAR_EV_QP_FATAL},
      {"unknown lkey", [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xe0), {{kMrGpa, 8, 0xdead00}}); },
       uint8_t(vstellar::WcStatus::LOC_PROT_ERR), VSTELLAR_EV_QP_ACCESS_ERR},
      {"another device's lkey", [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xe0), {{kMrGpa, 8, other_lkey}}); },
       uint8_t(vstellar::WcStatus::LOC_PROT_ERR), VSTELLAR_EV_QP_ACCESS_ERR},
      {"SGE past the MR's end", [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xe0), {A.Sge(kMrLen - 4, 64)}); },
       uint8_t(vstellar::WcStatus::LOC_PROT_ERR), VSTELLAR_EV_QP_ACCESS_ERR},
      {"SGE wrapping the address space",
       [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xe0), {{~0ull - 4, 64, A.lkey}}); },
       uint8_t(vstellar::WcStatus::LOC_PROT_ERR), VSTELLAR_EV_QP_ACCESS_ERR},
      {"inline above max_inline_data",
       [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xe0), {}, std::vector<uint8_t>(65, 1)); },
       uint8_t(vstellar::WcStatus::LOC_LEN_ERR), VSTELLAR_EV_QP_FATAL},
      {"inline READ",
       [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_RDMA_READ, 0xe0), {}, std::vector<uint8_t>(8, 1)); },
       uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR), VSTELLAR_EV_QP_FATAL},
      {"atomic of 16 bytes",
       [&](GQp& q) {
         auto w = Wqe(VSTELLAR_WR_ATOMIC_FETCH_ADD, 0xe0);
         w.u.atomic.remote_addr = 0x1000;
         A.PostSend(q, w, {A.Sge(0, 16)});
       },
       uint8_t(vstellar::WcStatus::LOC_LEN_ERR), VSTELLAR_EV_QP_FATAL},
      {"unaligned atomic",
       [&](GQp& q) {
         auto w = Wqe(VSTELLAR_WR_ATOMIC_CMP_SWP, 0xe0);
         w.u.atomic.remote_addr = 0x1004;
         A.PostSend(q, w, {A.Sge(0, 8)});
       },
       uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR), VSTELLAR_EV_QP_FATAL},
      {"recv with a bad lkey", [&](GQp& q) { A.PostRecv(q, 0xe0, {{kMrGpa, 8, 0xbad}}); },
       uint8_t(vstellar::WcStatus::LOC_PROT_ERR), VSTELLAR_EV_QP_ACCESS_ERR},
      {"recv with too many SGEs", [&](GQp& q) { A.PostRecv(q, 0xe0, {A.Sge(0, 8)}, 3); },
       uint8_t(vstellar::WcStatus::LOC_LEN_ERR), VSTELLAR_EV_QP_FATAL},
  };
  const uint8_t before[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    GQp q = A.CreateQp();
    A.Connect(q, 0x77);  // nobody: nothing is ever sent
    std::memcpy(A.Buf(0), before, 8);
    c.post(q);
    auto e = A.Poll();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->wr_id, 0xe0u);
    EXPECT_EQ(e->status, c.status);
    EXPECT_EQ(e->qpn, q.qpn);
    EXPECT_EQ(A.QpState(q.qpn), VSTELLAR_QPS_ERR);
    EXPECT_TRUE(Has(fa_->Events(1000), c.event, q.qpn));
    // Later WQEs of the QP are flushed, in order.
    A.PostRecv(q, 0xf1, {A.Sge(0, 8)});
    A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xf2), {A.Sge(0, 8)});
    auto f1 = A.Poll(), f2 = A.Poll();
    ASSERT_TRUE(f1 && f2);
    EXPECT_EQ(f1->wr_id, 0xf1u);
    EXPECT_EQ(f1->status, uint8_t(vstellar::WcStatus::WR_FLUSH_ERR));
    EXPECT_EQ(f1->opcode, VSTELLAR_WC_RECV);
    EXPECT_EQ(f2->wr_id, 0xf2u);
    EXPECT_EQ(f2->status, uint8_t(vstellar::WcStatus::WR_FLUSH_ERR));
    EXPECT_EQ(std::memcmp(A.Buf(0), before, 8), 0);
    // The QP comes back through RESET; indices restart at 0.
    ASSERT_EQ(A.Modify(q.qpn, VSTELLAR_QP_STATE, VSTELLAR_QPS_RESET), 0);
    q.sq_pi = q.rq_pi = 0;
    A.Connect(q, 0x77);
    A.PostRecv(q, 0xf3, {A.Sge(0, 8)});
    EXPECT_FALSE(A.Poll(50));  // accepted, waiting for a message
    ASSERT_EQ(A.Modify(q.qpn, VSTELLAR_QP_STATE, VSTELLAR_QPS_ERR), 0);
    auto f3 = A.Poll();
    ASSERT_TRUE(f3);
    EXPECT_EQ(f3->wr_id, 0xf3u);
    EXPECT_EQ(f3->status, uint8_t(vstellar::WcStatus::WR_FLUSH_ERR));
    vstellar_cmd_handle h{q.qpn, 0};
    ASSERT_EQ(A.Cmd(VSTELLAR_CMD_DESTROY_QP, &h, sizeof(h), 0).status(), 0);
    A.nqp--;
  }
  EXPECT_EQ(StatsOf(0).bad_wqes, cases.size());
  EXPECT_FALSE(StatsOf(0).fatal);
}

// A peer that fails many of a guest's connections at once
// (one bad-rkey WRITE each) raised more QP errors than the driver had event
// buffers and the device queue had room for, and the next one made the
// whole device FATAL, so the guest's connection to a third guest died too.
// Each QP's event now waits its turn; the device and its other QPs go on.
TEST_F(DataPath, PeerFailingManyQpsAtOnceDoesNotMakeTheDeviceFatal) {
  StartDaemon();
  TwoGuests();  // a_ attacks b_
  Guest& A = *a_;
  Guest& B = *b_;
  auto fc = std::make_unique<Frontend>();
  std::string err;
  ASSERT_TRUE(fc->Connect(sock_, &err)) << err;
  ASSERT_TRUE(fc->StartQueues(&err)) << err;
  Guest C{*fc};
  C.Setup();
  GQp bc = B.CreateQp(), cb = C.CreateQp();
  B.Connect(bc, cb.qpn);
  C.Connect(cb, bc.qpn);
  // The test driver has 8 event buffers; the device used to hold 64 more.
  constexpr int kQps = 100;
  ASSERT_EQ(A.ResizeCq(0x3c0000, 8).status(), 0);  // room for every error CQE
  std::vector<GQp> qa, qb;
  for (int i = 0; i < kQps; i++) {
    qa.push_back(A.CreateQp());
    qb.push_back(B.CreateQp());
  }
  for (int i = 0; i < kQps; i++) {
    A.Connect(qa[i], qb[i].qpn);
    B.Connect(qb[i], qa[i].qpn);
  }
  for (int i = 0; i < kQps; i++) {
    auto w = Wqe(VSTELLAR_WR_RDMA_WRITE, i);
    w.u.rdma.remote_addr = kMrGpa;
    w.u.rdma.rkey = B.rkey ^ 0x100;
    A.PostSend(qa[i], w, {A.Sge(0, 64)});
  }
  for (int i = 0; i < kQps; i++) {
    auto e = A.Poll();
    ASSERT_TRUE(e) << i;
    EXPECT_EQ(e->status, uint8_t(vstellar::WcStatus::REM_ACCESS_ERR));
  }
  for (int i = 0; i < kQps; i++) EXPECT_EQ(B.QpState(qb[i].qpn), VSTELLAR_QPS_ERR);
  EXPECT_FALSE(StatsOf(1).fatal);
  EXPECT_FALSE(StatsOf(0).fatal);
  EXPECT_EQ(StatsOf(1).events_dropped, 0u);
  // The victim's other connection works.
  EXPECT_EQ(B.QpState(bc.qpn), VSTELLAR_QPS_RTS);
  C.PostRecv(cb, 1, {C.Sge(0, 64)});
  B.PostSend(bc, Wqe(VSTELLAR_WR_SEND, 2), {B.Sge(0, 64)});
  auto sb = B.Poll(), rc = C.Poll();
  ASSERT_TRUE(sb && rc);
  EXPECT_EQ(sb->status, 0);
  EXPECT_EQ(rc->status, 0);
  // Every failed QP's event reaches the driver once buffers come back.
  // The driver has 8 buffers, and each call takes what is there now (often
  // one event): the wait is bounded by time, not by calls.
  std::set<uint32_t> told;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (told.size() < size_t(kQps) && std::chrono::steady_clock::now() < until)
    for (const vstellar_event& e : fb_->Events(100))
      if (le16toh(e.type) == VSTELLAR_EV_QP_ACCESS_ERR) told.insert(le32toh(e.object));
  for (int i = 0; i < kQps; i++) EXPECT_TRUE(told.count(qb[i].qpn)) << i;
  EXPECT_NE(d_->StatsJson().find("\"events_dropped\":0"), std::string::npos);
}

// UC QPs between two devices: SEND and WRITE_IMM land; a send longer than
// its receive WQE is dropped at the responder and the QP stays in RTS; an
// RDMA READ on UC fails that WQE; the other QPs keep working.
void DataPath::UcQpsSendWriteAndDropBadMessagesAlone() {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GQp qa = A.CreateQp(4, VSTELLAR_QPT_UC), qb = B.CreateQp(4, VSTELLAR_QPT_UC);
  constexpr uint32_t kUcRtr =
      VSTELLAR_QP_STATE | VSTELLAR_QP_AV | VSTELLAR_QP_PATH_MTU | VSTELLAR_QP_DEST_QPN | VSTELLAR_QP_RQ_PSN;
  for (auto [g, q, peer] : {std::tuple{&A, &qa, qb.qpn}, std::tuple{&B, &qb, qa.qpn}}) {
    ASSERT_EQ(g->Modify(q->qpn, kInitMask, VSTELLAR_QPS_INIT), 0);
    // RC's RTR attributes are refused on UC (no RNR timer, no rd_atomic).
    EXPECT_EQ(g->Modify(q->qpn, kRtrMask, VSTELLAR_QPS_RTR, peer), VSTELLAR_STATUS_BAD_FIELD);
    ASSERT_EQ(g->Modify(q->qpn, kUcRtr, VSTELLAR_QPS_RTR, peer), 0);
    ASSERT_EQ(g->Modify(q->qpn, VSTELLAR_QP_STATE | VSTELLAR_QP_SQ_PSN, VSTELLAR_QPS_RTS), 0);
  }
  Fill(A.Buf(0), 5000, 4);
  std::memset(B.Buf(0), 0, 16384);
  B.PostRecv(qb, 0xb0, {B.Sge(0, 100)});
  // Too long for 0xb0: dropped; 0xb0 takes the next message.
  A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0xa0), {A.Sge(0, 3000)});
  A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0xa1), {A.Sge(100, 60)});
  auto w = Wqe(VSTELLAR_WR_RDMA_WRITE_IMM, 0xa2);
  w.u.rdma.remote_addr = kMrGpa + 4096;
  w.u.rdma.rkey = B.rkey;
  w.imm_data = htobe32(5);
  A.PostSend(qa, w, {A.Sge(0, 5000)});
  for (uint64_t id = 0xa0; id <= 0xa2; id++) {
    auto c = A.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->wr_id, id);
    EXPECT_EQ(c->status, 0);  // UC: the sender cannot know what the responder did
  }
  auto c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0xb0u);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(c->byte_len, 60u);
  EXPECT_EQ(std::memcmp(B.Buf(0), A.Buf(100), 60), 0);
  B.PostRecv(qb, 0xb1, {});
  // The WRITE_IMM found no receive WQE when it arrived: dropped (no RNR on
  // UC); its bytes were placed. Once a WQE is posted, the next one lands.
  A.PostSend(qa, w, {A.Sge(0, 5000)});
  ASSERT_TRUE(A.Poll());
  c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0xb1u);
  EXPECT_EQ(c->opcode, VSTELLAR_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(c->byte_len, 5000u);
  EXPECT_EQ(be32toh(c->imm_data), 5u);
  EXPECT_EQ(std::memcmp(B.Buf(4096), A.Buf(0), 5000), 0);
  EXPECT_EQ(B.QpState(qb.qpn), VSTELLAR_QPS_RTS);
  // READ is not a UC operation: that WQE fails (and the QP with it).
  w = Wqe(VSTELLAR_WR_RDMA_READ, 0xa3);
  w.u.rdma.remote_addr = kMrGpa;
  w.u.rdma.rkey = B.rkey;
  A.PostSend(qa, w, {A.Sge(0, 64)});
  c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0xa3u);
  EXPECT_EQ(c->status, 2);  // IBV_WC_LOC_QP_OP_ERR
  // B's UC QP, and an RC pair next to them, still work.
  GQp ra = A.CreateQp(), rb = B.CreateQp();
  A.Connect(ra, rb.qpn);
  B.Connect(rb, ra.qpn);
  B.PostRecv(rb, 0xc0, {B.Sge(0, 64)});
  A.PostSend(ra, Wqe(VSTELLAR_WR_SEND, 0xc1), {A.Sge(0, 64)});
  c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0xc0u);
  EXPECT_EQ(B.QpState(qb.qpn), VSTELLAR_QPS_RTS);
}

TEST_F(DataPath, UcQpsSendWriteAndDropBadMessagesAlone) { UcQpsSendWriteAndDropBadMessagesAlone(); }
TEST_F(DataPathOnTwoThreads, UcQpsSendWriteAndDropBadMessagesAlone) { UcQpsSendWriteAndDropBadMessagesAlone(); }

}  // namespace vstellard::datapath_test
