// Doorbells and the scan that reads them: each device's own doorbell
// pages, producer indices beyond the ring, the per-queue WQE budget, a WQE
// rewritten after its doorbell, need_kick and the recheck at going idle,
// and a daemon that sleeps when nothing is to do.
#include <gtest/gtest.h>

#include <mutex>

#include "vstellard/datapath_fixture.h"

namespace vstellard::datapath_test {

// Two devices of one guest: QEMU puts both doorbell regions into each
// device's memory table, the other's first. Each device must read and
// write only its own (it used to take the first: contexts of one device
// cleared the other's doorbell pages, and its QPs read the other's).
TEST_F(DataPath, DevicesOfOneGuestEachUseTheirOwnDoorbells) {
  StartDaemon();
  FrontendOptions oa, ob;
  oa.db_region_id = 1;
  oa.doorbell_gpa = 0xfe000000;
  ob.db_region_id = 2;
  ob.doorbell_gpa = 0xfd000000;
  fa_ = std::make_unique<Frontend>(oa);
  fb_ = std::make_unique<Frontend>(ob);
  std::string err;
  ASSERT_TRUE(fa_->Connect(sock_, &err, /*mem_table=*/false)) << err;
  ASSERT_TRUE(fb_->Connect(sock_, &err, /*mem_table=*/false)) << err;
  fa_->AddDoorbellOf(*fb_);
  fb_->AddDoorbellOf(*fa_);
  for (Frontend* f : {fa_.get(), fb_.get()}) {
    ASSERT_TRUE(f->SendMemTable(&err)) << err;
    ASSERT_TRUE(f->StartQueues(&err)) << err;
  }
  a_ = std::make_unique<Guest>(Guest{*fa_});
  b_ = std::make_unique<Guest>(Guest{*fb_});
  a_->Setup();
  b_->Setup();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  for (uint32_t i = 0; i < 20; i++) {
    *b_->Buf(0) = 0;
    *a_->Buf(4096) = uint8_t(i + 1);
    b_->PostRecv(qb, 1000 + i, {b_->Sge(0, 64)});
    a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, i), {a_->Sge(4096, 16)});
    auto ca = a_->Poll();
    ASSERT_TRUE(ca) << i;
    EXPECT_EQ(ca->status, 0u) << i;
    auto cb = b_->Poll();
    ASSERT_TRUE(cb) << i;
    EXPECT_EQ(*b_->Buf(0), uint8_t(i + 1));
  }
  EXPECT_EQ(StatsOf(0).bad_wqes + StatsOf(1).bad_wqes, 0u);
}

TEST_F(DataPath, ProducerIndexBeyondTheRingStopsOnlyThatQp) {
  StartDaemon();
  TwoGuests();
  GQp bad = a_->CreateQp(), qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(bad, 0x77);
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  bad.sq_pi = 1000;  // the ring has 64 slots
  a_->Ring(VSTELLAR_DB_SLOT_SIZE * bad.slot + offsetof(vstellar_db_qp, sq_pi), bad.sq_pi);
  EXPECT_TRUE(Has(fa_->Events(2000), VSTELLAR_EV_QP_FATAL, bad.qpn));
  EXPECT_EQ(a_->QpState(bad.qpn), VSTELLAR_QPS_ERR);
  EXPECT_FALSE(a_->Poll(20));  // nothing was fetched, nothing completes
  // Same for the RQ, on the healthy device B's side of things, with a
  // wrapped-around index.
  GQp bad_b = b_->CreateQp();
  b_->Connect(bad_b, 0x77);
  b_->Ring(VSTELLAR_DB_SLOT_SIZE * bad_b.slot + offsetof(vstellar_db_qp, rq_pi), 0xffffffffu);
  EXPECT_TRUE(Has(fb_->Events(2000), VSTELLAR_EV_QP_FATAL, bad_b.qpn));
  // The other QPs work.
  b_->PostRecv(qb, 1, {b_->Sge(0, 64)});
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 2), {a_->Sge(0, 64)});
  auto ca = a_->Poll(), cb = b_->Poll();
  ASSERT_TRUE(ca && cb);
  EXPECT_EQ(ca->status, 0);
  EXPECT_EQ(cb->status, 0);
  EXPECT_FALSE(StatsOf(0).fatal);
}

// A doorbell scan that takes every WQE a QP announced before it looks at
// the next QP (up to 1,024 QPs x 4,096 WQEs in one loop turn) lets one
// guest starve the others. Each queue gives at most --wqe-budget WQEs per
// turn and the scan goes round robin: a QP with one WQE is served after at most one budget's
// worth of a full QP's, and the full QP's rest follows in later turns.
TEST_F(DataPath, FullQueueGetsOnlyItsBudgetPerTurn) {
  constexpr uint32_t kBudget = 4;
  std::mutex mu;
  std::vector<uint32_t> order;  // QPN of each receive WQE fetched
  StartDaemon(
      50,
      [&](Daemon& d) {
        d.SetAfterWqeCopyHook([&](unsigned, uint32_t qpn, bool send, uint32_t) {
          std::lock_guard<std::mutex> g(mu);
          if (!send) order.push_back(qpn);
        });
      },
      [&](DaemonOptions& o) { o.wqe_budget_queue = kBudget; });
  TwoGuests();
  GQp x = a_->CreateQp(), y = a_->CreateQp();
  GQp& full = x.qpn < y.qpn ? x : y;  // scanned first
  GQp& one = x.qpn < y.qpn ? y : x;
  ASSERT_EQ(a_->Modify(full.qpn, kInitMask, VSTELLAR_QPS_INIT), 0);
  ASSERT_EQ(a_->Modify(one.qpn, kInitMask, VSTELLAR_QPS_INIT), 0);
  // Let the data path go idle, so it sees both doorbells in one scan.
  for (int i = 0; i < 5000 && !a_->NeedKick(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(a_->NeedKick());
  auto write_recv = [&](GQp& q) {
    vstellar_recv_wqe w{};
    w.wr_id = q.rq_pi;
    w.num_sge = 1;
    const vstellar_sge s = a_->Sge(0, 64);
    std::memcpy(a_->RqSlot(q, q.rq_pi), &w, sizeof(w));
    std::memcpy(a_->RqSlot(q, q.rq_pi) + sizeof(w), &s, sizeof(s));
    q.rq_pi++;
  };
  for (uint32_t i = 0; i < (1u << kRqLog); i++) write_recv(full);
  write_recv(one);
  a_->Ring(VSTELLAR_DB_SLOT_SIZE * full.slot + offsetof(vstellar_db_qp, rq_pi), full.rq_pi, false);
  a_->Ring(VSTELLAR_DB_SLOT_SIZE * one.slot + offsetof(vstellar_db_qp, rq_pi), one.rq_pi, false);
  fa_->Kick(VSTELLAR_VQ_KICK);
  for (int i = 0; i < 5000; i++) {
    {
      std::lock_guard<std::mutex> g(mu);
      if (order.size() == (1u << kRqLog) + 1) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard<std::mutex> g(mu);
  ASSERT_EQ(order.size(), (1u << kRqLog) + 1);  // nothing is lost: the rest came in later turns
  const size_t before_one = size_t(std::find(order.begin(), order.end(), one.qpn) - order.begin());
  EXPECT_LE(before_one, kBudget) << "the full QP gave " << before_one << " WQEs before the other QP got a turn";
}

TEST_F(DataPath, WqeRewrittenAfterTheDoorbellIsNotReadTwice) {
  std::atomic<uint8_t*> slot{nullptr};
  StartDaemon(50, [&](Daemon& d) {
    d.SetAfterWqeCopyHook([&](unsigned, uint32_t, bool send, uint32_t) {
      uint8_t* p = slot.load();
      if (!send || !p) return;
      // The guest rewrites the WQE it already rang for: opcode, SGE count,
      // lkey, length, address all turn hostile.
      vstellar_send_wqe w{};
      w.wr_id = 0xbad;
      w.opcode = 0xee;
      w.num_sge = 200;
      std::memcpy(p, &w, sizeof(w));
      vstellar_sge s{~0ull - 100, 1u << 30, 0xdead};
      std::memcpy(p + 64, &s, sizeof(s));
    });
  });
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  Fill(a_->Buf(0), 64, 42);
  std::memset(b_->Buf(0), 0, 256);
  b_->PostRecv(qb, 7, {b_->Sge(0, 256)});
  slot = a_->SqSlot(qa, qa.sq_pi);
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0x600d), {a_->Sge(0, 64)});
  auto ca = a_->Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 0x600du);
  EXPECT_EQ(ca->status, 0);
  auto cb = b_->Poll();
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->byte_len, 64u);
  EXPECT_EQ(std::memcmp(a_->Buf(0), b_->Buf(0), 64), 0);
  EXPECT_EQ(StatsOf(0).bad_wqes, 0u);
}

TEST_F(DataPath, NeedKickIsSetWhenIdleAndClearedWhilePolling) {
  StartDaemon(300'000);  // poll 300 ms after the last work
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  // A fresh context starts with need_kick set; after the modify commands
  // the device polls, then goes idle again and sets it.
  auto wait_kick = [&](Guest& g, uint32_t want) {
    for (int i = 0; i < 200 && g.NeedKick() != want; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return g.NeedKick() == want;
  };
  ASSERT_TRUE(wait_kick(*a_, 1));
  ASSERT_TRUE(wait_kick(*b_, 1));
  // ... and alive set, the word a provider reads as 0 once the device is gone
  EXPECT_EQ(le32toh(a_->DbWord(offsetof(vstellar_db_page_hdr, alive)).load()), VSTELLAR_DB_ALIVE);
  EXPECT_FALSE(StatsOf(0).polling);
  const uint64_t idle0 = StatsOf(0).idle_entries;
  EXPECT_GE(idle0, 1u);

  // Idle, once the look after going idle is over (DataPath::Recheck): a
  // doorbell without a kick is not seen (nobody polls).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  b_->PostRecv(qb, 1, {b_->Sge(0, 64)});
  const uint64_t wqes = StatsOf(0).wqes;
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 2), {a_->Sge(0, 64)}, {}, /*kick=*/false);
  EXPECT_FALSE(a_->Poll(100));
  EXPECT_EQ(StatsOf(0).wqes, wqes);
  EXPECT_EQ(a_->NeedKick(), 1u);
  // The kick wakes it: the WQE runs, need_kick is cleared while it polls.
  fa_->Kick(VSTELLAR_VQ_KICK);
  auto ca = a_->Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 2u);
  EXPECT_EQ(a_->NeedKick(), 0u);
  EXPECT_TRUE(StatsOf(0).polling);
  EXPECT_GE(StatsOf(0).db_kicks, 1u);
  // While it polls, the provider sees need_kick == 0 and does not kick.
  b_->PostRecv(qb, 3, {b_->Sge(0, 64)});
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 4), {a_->Sge(0, 64)});
  ca = a_->Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 4u);
  // Then it goes idle again.
  ASSERT_TRUE(wait_kick(*a_, 1));
  EXPECT_GT(StatsOf(0).idle_entries, idle0);
  EXPECT_FALSE(StatsOf(0).polling);
}

// A provider whose memory barrier did not hold (a TCG guest with one vCPU
// drops mfence) can publish a producer index and read need_kick as 0 just
// as the device goes idle: both miss each other, and the WQE would wait
// for ever. The one look after going idle finds it, counts it and polls.
TEST_F(DataPath, AWqeWithoutItsKickAtTheIdleMomentIsFoundByTheRecheck) {
  StartDaemon(50, {}, [](DaemonOptions& o) { o.idle_recheck_us = 200'000; });
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  auto idle = [&](Guest& g) {
    for (int i = 0; i < 200 && (g.NeedKick() != 1 || StatsOf(&g == a_.get() ? 0 : 1).polling); i++)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return g.NeedKick() == 1;
  };
  ASSERT_TRUE(idle(*b_));
  b_->PostRecv(qb, 1, {b_->Sge(0, 64)});  // kicked
  ASSERT_TRUE(idle(*a_));
  EXPECT_EQ(StatsOf(0).missed_kicks, 0u);
  // Just gone idle: a WQE whose kick is missing.
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 2), {a_->Sge(0, 64)}, {}, /*kick=*/false);
  auto ca = a_->Poll(2000);
  ASSERT_TRUE(ca) << "the WQE published without its kick was never fetched";
  EXPECT_EQ(ca->wr_id, 2u);
  EXPECT_EQ(StatsOf(0).missed_kicks, 1u);
}

// A receive the guest published before a message came, which the device
// has not fetched yet (here: no kick, and the look after going idle is
// 10 s away; under load: the scan ran just before the index was stored),
// must still take that message: the engine asks the device to look at
// the RQ doorbell when a message finds no receive WQE (recv_refill).
// Otherwise a UC or UD message is dropped (RC would cost an RNR wait).
// DataPathOnTwoThreads.UcQpsSendWriteAndDropBadMessagesAlone failed about
// once in 75 runs on a loaded host this way.
void DataPath::AReceivePublishedBeforeTheMessageTakesIt() {
  StartDaemon(50, {}, [](DaemonOptions& o) { o.idle_recheck_us = 10'000'000; });
  TwoGuests();
  GQp qa = a_->CreateQp(4, VSTELLAR_QPT_UC), qb = b_->CreateQp(4, VSTELLAR_QPT_UC);
  constexpr uint32_t kUcRtr =
      VSTELLAR_QP_STATE | VSTELLAR_QP_AV | VSTELLAR_QP_PATH_MTU | VSTELLAR_QP_DEST_QPN | VSTELLAR_QP_RQ_PSN;
  for (auto [g, q, peer] : {std::tuple{a_.get(), &qa, qb.qpn}, std::tuple{b_.get(), &qb, qa.qpn}}) {
    ASSERT_EQ(g->Modify(q->qpn, kInitMask, VSTELLAR_QPS_INIT), 0);
    ASSERT_EQ(g->Modify(q->qpn, kUcRtr, VSTELLAR_QPS_RTR, peer), 0);
    ASSERT_EQ(g->Modify(q->qpn, VSTELLAR_QP_STATE | VSTELLAR_QP_SQ_PSN, VSTELLAR_QPS_RTS), 0);
  }
  for (int i = 0; i < 2000 && (b_->NeedKick() != 1 || StatsOf(1).polling); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(b_->NeedKick(), 1);
  Fill(a_->Buf(0), 3000, 7);
  b_->PostRecv(qb, 0xb0, {b_->Sge(0, 4096)}, ~0u, /*kick=*/false);
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0xa0), {a_->Sge(0, 3000)});
  ASSERT_TRUE(a_->Poll());
  auto c = b_->Poll(5000);
  ASSERT_TRUE(c) << "the message was dropped: the receive posted before it was not looked for";
  EXPECT_EQ(c->wr_id, 0xb0u);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(c->byte_len, 3000u);
  EXPECT_EQ(std::memcmp(b_->Buf(0), a_->Buf(0), 3000), 0);
  EXPECT_EQ(StatsOf(1).missed_kicks, 0u);  // not the look after going idle
}
TEST_F(DataPath, AReceivePublishedBeforeTheMessageTakesIt) { AReceivePublishedBeforeTheMessageTakesIt(); }
TEST_F(DataPathOnTwoThreads, AReceivePublishedBeforeTheMessageTakesIt) { AReceivePublishedBeforeTheMessageTakesIt(); }

// With connected QPs and nothing to do, the daemon sleeps: datagrams wake
// it through the UDP link's eventfd and timers through the epoll timeout,
// so there is no periodic tick (it used to wake every millisecond).
void DataPath::IdleDaemonWithQpsSleeps() {
  StartDaemon();
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  b_->PostRecv(qb, 1, {b_->Sge(0, 64)});
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 2), {a_->Sge(0, 64)});
  ASSERT_TRUE(a_->Poll());
  ASSERT_TRUE(b_->Poll());
  // Let the delayed ACKs and the doorbell polling run out.
  for (int i = 0; i < 100 && (StatsOf(0).polling || StatsOf(1).polling); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const uint64_t w0 = d_->wakeups();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(d_->wakeups() - w0, 10u);
  // And it still answers at once when work comes.
  b_->PostRecv(qb, 3, {b_->Sge(0, 64)});
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 4), {a_->Sge(0, 64)});
  auto c = a_->Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
}

TEST_F(DataPath, IdleDaemonWithQpsSleeps) { IdleDaemonWithQpsSleeps(); }
TEST_F(DataPathOnTwoThreads, IdleDaemonWithQpsSleeps) { IdleDaemonWithQpsSleeps(); }

}  // namespace vstellard::datapath_test
