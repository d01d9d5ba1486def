// The verbs state machine and error completions.
#include "engine_internal.h"  // white box: outstanding READ/atomic count
#include "sim_pair.h"

namespace vstellar::test {
namespace {

PairOptions unconnected() {
  PairOptions o;
  o.connect = false;
  return o;
}

TEST(QpState, ModifyRequiresTheRightAttributes) {
  Pair t(unconnected());
  Engine& e = *t.a.eng;
  Qp* qp = t.a.qp;
  QpAttr at;
  // RESET -> INIT without the required PKEY/PORT/ACCESS: rejected.
  at.qp_state = QpState::INIT;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE), EINVAL);
  // RESET -> RTR: not a legal transition.
  at.qp_state = QpState::RTR;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS), EINVAL);
  // Bad values.
  at.qp_state = QpState::INIT;
  at.port_num = 2;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS), EINVAL);
  at.port_num = 1;
  at.qp_access_flags = 0x100;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS), EINVAL);
  at.qp_access_flags = ACCESS_REMOTE_WRITE;
  // An attribute not allowed on this transition.
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS | QP_SQ_PSN),
            EINVAL);
  EXPECT_EQ(qp->state(), QpState::RESET);
  EXPECT_EQ(Pair::to_init(t.a, ACCESS_REMOTE_WRITE), 0);
  EXPECT_EQ(qp->state(), QpState::INIT);
  // INIT -> RTS skips RTR: rejected.
  at = QpAttr{};
  at.qp_state = QpState::RTS;
  at.sq_psn = 1;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY |
                                    QP_MAX_QP_RD_ATOMIC),
            EINVAL);
  // INIT -> RTR missing DEST_QPN.
  at = QpAttr{};
  at.qp_state = QpState::RTR;
  at.ah = {kIpB, 1};
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE | QP_AV | QP_PATH_MTU | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC |
                                    QP_MIN_RNR_TIMER),
            EINVAL);
  // Out-of-range values on INIT -> RTR.
  uint32_t full = QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN |
                  QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER;
  at.dest_qp_num = 1 << 24;
  EXPECT_EQ(e.modify_qp(qp, at, full), EINVAL);
  at.dest_qp_num = t.b.qp->qpn();
  at.path_mtu = 6;
  EXPECT_EQ(e.modify_qp(qp, at, full), EINVAL);
  at.path_mtu = MTU_1024;
  at.rq_psn = 1 << 24;
  EXPECT_EQ(e.modify_qp(qp, at, full), EINVAL);
  at.rq_psn = 5;
  at.max_dest_rd_atomic = 200;
  EXPECT_EQ(e.modify_qp(qp, at, full), EINVAL);
  at.max_dest_rd_atomic = 4;
  at.min_rnr_timer = 32;
  EXPECT_EQ(e.modify_qp(qp, at, full), EINVAL);
  at.min_rnr_timer = 3;
  EXPECT_EQ(e.modify_qp(qp, at, full), 0);
  EXPECT_EQ(qp->state(), QpState::RTR);
  // cur_qp_state must match when given.
  at = QpAttr{};
  at.qp_state = QpState::RTS;
  at.cur_qp_state = QpState::INIT;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE | QP_CUR_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT |
                                    QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC),
            EINVAL);
  at.retry_cnt = 8;
  at.cur_qp_state = QpState::RTR;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE | QP_CUR_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT |
                                    QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC),
            EINVAL);
  at.retry_cnt = 7;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE | QP_CUR_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT |
                                    QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC),
            0);
  EXPECT_EQ(qp->state(), QpState::RTS);
  // RTS -> RTS may change MIN_RNR_TIMER but not the PATH_MTU.
  at = QpAttr{};
  at.min_rnr_timer = 5;
  EXPECT_EQ(e.modify_qp(qp, at, QP_MIN_RNR_TIMER), 0);
  EXPECT_EQ(e.modify_qp(qp, at, QP_PATH_MTU), EINVAL);
  // RTS -> SQD -> RTS, then to ERR and back to RESET.
  at.qp_state = QpState::SQD;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE), 0);
  EXPECT_EQ(qp->state(), QpState::SQD);
  at.qp_state = QpState::RTS;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE), 0);
  at.qp_state = QpState::ERR;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE), 0);
  EXPECT_EQ(qp->state(), QpState::ERR);
  at.qp_state = QpState::RTS;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE), EINVAL);
  at.qp_state = QpState::RESET;
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE), 0);
  QpAttr q;
  QpInitAttr qi;
  EXPECT_EQ(e.query_qp(qp, q, qi), 0);
  EXPECT_EQ(q.qp_state, QpState::RESET);
}

// check_modify_qp names the first rule a modify breaks (what vstellard
// turns into BAD_STATE or BAD_FIELD), and modify_qp refuses exactly those.
TEST(QpState, CheckModifySaysWhy) {
  Pair t(unconnected());
  Engine& e = *t.a.eng;
  Qp* qp = t.a.qp;
  constexpr uint32_t kInit = QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS;
  QpAttr at;
  at.qp_state = QpState::INIT;
  at.port_num = 1;
  EXPECT_EQ(e.check_modify_qp(qp, at, kInit), ModifyQpCheck::OK);
  EXPECT_EQ(e.check_modify_qp(qp, at, QP_STATE), ModifyQpCheck::MISSING_ATTR);
  EXPECT_EQ(e.check_modify_qp(qp, at, kInit | QP_SQ_PSN), ModifyQpCheck::ATTR_NOT_ALLOWED);
  at.cur_qp_state = QpState::RTS;
  EXPECT_EQ(e.check_modify_qp(qp, at, kInit | QP_CUR_STATE), ModifyQpCheck::WRONG_CUR_STATE);
  at.port_num = 2;
  EXPECT_EQ(e.check_modify_qp(qp, at, kInit), ModifyQpCheck::BAD_ATTR_VALUE);
  EXPECT_EQ(e.modify_qp(qp, at, kInit), EINVAL);
  at.port_num = 1;
  at.qp_state = QpState::RTS;  // RESET -> RTS skips INIT and RTR
  EXPECT_EQ(e.check_modify_qp(qp, at, QP_STATE), ModifyQpCheck::BAD_TRANSITION);
  EXPECT_EQ(e.modify_qp(qp, at, QP_STATE), EINVAL);
  EXPECT_EQ(qp->state(), QpState::RESET);
  at.qp_state = QpState::INIT;
  EXPECT_EQ(e.modify_qp(qp, at, kInit), 0);
  EXPECT_EQ(qp->state(), QpState::INIT);
  EXPECT_STREQ(to_string(ModifyQpCheck::BAD_TRANSITION), "no such transition");
}

TEST(QpState, PostingDependsOnState) {
  Pair t(unconnected());
  Sge sg{t.a.addr(), 8, t.a.mr->lkey()};
  SendWr wr;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  RecvWr rr;
  rr.sg_list = &sg;
  rr.num_sge = 1;
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr), EINVAL);  // RESET
  EXPECT_EQ(t.a.eng->post_recv(t.a.qp, rr), EINVAL);  // RESET
  Pair::to_init(t.a, 0);
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr), EINVAL);  // INIT: no sends
  EXPECT_EQ(t.a.eng->post_recv(t.a.qp, rr), 0);       // INIT: receives are fine
  wr.num_sge = 5;                                     // more than max_send_sge
  t.to_rtr(t.a, t.b);
  t.to_rts(t.a);
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr), EINVAL);
  wr.num_sge = 1;
  wr.opcode = WrOpcode(42);
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr), EINVAL);
  wr.opcode = WrOpcode::ATOMIC_CMP_AND_SWP;
  sg.length = 4;  // atomics need exactly 8 bytes
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr), EINVAL);
  // Fill the send queue (peer is not connected, nothing completes).
  sg.length = 8;
  wr.opcode = WrOpcode::RDMA_WRITE;
  int ok = 0;
  while (t.a.eng->post_send(t.a.qp, wr) == 0) ok++;
  EXPECT_EQ(ok, int(t.opt.cap.max_send_wr));
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr), ENOMEM);
}

TEST(QpState, ErrorFlushesEverythingInOrder) {
  Pair t;
  for (int i = 0; i < 5; i++) ASSERT_EQ(t.post_recv(t.b, 100 + i, 0, 64), 0);
  QpAttr at;
  at.qp_state = QpState::ERR;
  ASSERT_EQ(t.b.eng->modify_qp(t.b.qp, at, QP_STATE), 0);
  Wc wc[8];
  ASSERT_EQ(t.b.eng->poll_cq(t.b.rcq, wc, 8), 5);
  for (int i = 0; i < 5; i++) {
    EXPECT_EQ(wc[i].wr_id, uint64_t(100 + i));
    EXPECT_EQ(wc[i].status, WcStatus::WR_FLUSH_ERR);
  }
  // Posting in ERR completes at once with a flush error.
  ASSERT_EQ(t.post_recv(t.b, 7, 0, 64), 0);
  ASSERT_EQ(t.post_send(t.b, WrOpcode::RDMA_WRITE, 8, 0, 64, 0, 0), 0);
  ASSERT_EQ(t.b.eng->poll_cq(t.b.rcq, wc, 8), 1);
  EXPECT_EQ(wc[0].status, WcStatus::WR_FLUSH_ERR);
  ASSERT_EQ(t.b.eng->poll_cq(t.b.scq, wc, 8), 1);
  EXPECT_EQ(wc[0].wr_id, 8u);
  EXPECT_EQ(wc[0].status, WcStatus::WR_FLUSH_ERR);
}

TEST(QpErrors, BadRkeyIsRemoteAccessError) {
  Pair t;
  Sge sg{t.a.addr(), 64, t.a.mr->lkey()};
  SendWr wr;
  wr.wr_id = 1;
  wr.opcode = WrOpcode::RDMA_WRITE;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.remote_addr = t.b.addr();
  wr.rkey = t.b.mr->rkey() ^ 0x100;
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 2, 0, 64, 0), 0);  // flushed after the error
  auto wc = t.wait(t.a, t.a.scq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].status, WcStatus::REM_ACCESS_ERR);
  EXPECT_EQ(wc[1].status, WcStatus::WR_FLUSH_ERR);
  EXPECT_EQ(t.a.qp->state(), QpState::ERR);
}

TEST(QpErrors, OutOfBoundsAndMissingPermission) {
  for (int which = 0; which < 4; which++) {
    PairOptions o;
    if (which == 3) o.access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE;  // no remote read
    Pair t(o);
    WrOpcode op = WrOpcode::RDMA_WRITE;
    uint64_t roff = 0;
    uint32_t len = 64;
    if (which == 0) roff = t.b.buf.size() - 32;  // runs off the end
    if (which == 1) {                            // READ past the end
      op = WrOpcode::RDMA_READ;
      roff = t.b.buf.size() - 10;
    }
    if (which == 2) {  // address below the MR
      Sge sg{t.a.addr(), 64, t.a.mr->lkey()};
      SendWr wr;
      wr.opcode = WrOpcode::RDMA_WRITE;
      wr.send_flags = SEND_SIGNALED;
      wr.sg_list = &sg;
      wr.num_sge = 1;
      wr.remote_addr = t.b.addr() - 4096;
      wr.rkey = t.b.mr->rkey();
      ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
    } else {
      if (which == 3) op = WrOpcode::RDMA_READ;
      ASSERT_EQ(t.post_send(t.a, op, 1, 0, len, roff), 0);
    }
    auto wc = t.wait(t.a, t.a.scq, 1);
    ASSERT_EQ(wc.size(), 1u) << which;
    EXPECT_EQ(wc[0].status, WcStatus::REM_ACCESS_ERR) << which;
    EXPECT_EQ(t.b.eng->stats().naks_sent, 1u);
  }
}

TEST(QpErrors, BadLkeyIsLocalProtectionError) {
  Pair t;
  Sge sg{t.a.addr(), 64, t.a.mr->lkey() + 0x100};
  SendWr wr;
  wr.opcode = WrOpcode::SEND;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::LOC_PROT_ERR);
  // A READ into an MR without local write is a protection error too.
  PairOptions o;
  o.access = ACCESS_REMOTE_READ;
  Pair u(o);
  ASSERT_EQ(u.post_send(u.a, WrOpcode::RDMA_READ, 3, 0, 64, 0), 0);
  wc = u.wait(u.a, u.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::LOC_PROT_ERR);
}

TEST(QpErrors, ReceiveTooSmall) {
  Pair t;
  ASSERT_EQ(t.post_recv(t.b, 1, 0, 100), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 2, 0, 5000, 0), 0);
  auto rc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::LOC_LEN_ERR);
  auto sc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, WcStatus::REM_INV_REQ_ERR);
}

TEST(QpErrors, RnrRetryExceeded) {
  PairOptions o;
  o.rnr_retry = 2;
  Pair t(o);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 1, 0, 64, 0), 0);  // no receive posted
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::RNR_RETRY_EXC_ERR);
  EXPECT_EQ(t.b.eng->stats().rnr_naks_sent, 3u);  // first try + 2 retries
}

TEST(QpErrors, RnrThenReceiveArrives) {
  PairOptions o;
  o.rnr_retry = 7;  // infinite
  Pair t(o);
  fill_random(t.a.buf.data(), 20000, 2);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 1, 0, 20000, 0), 0);
  t.net.run_for(2'000'000);
  EXPECT_GT(t.b.eng->stats().rnr_naks_sent, 0u);
  ASSERT_EQ(t.post_recv(t.b, 9, 0, 20000), 0);
  auto rc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 20000), 0);
  auto sc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, WcStatus::SUCCESS);
}

TEST(QpErrors, LongRnrWaitIsNotATransportRetry) {
  // The RNR wait (1.28 ms) is far longer than the RTO and retry_cnt is 1:
  // the packets of the message must wait for the receiver, not time out.
  PairOptions o;
  o.retry_cnt = 1;
  o.rnr_retry = 7;
  o.min_rnr_timer = 14;
  Pair t(o);
  // Only the NAKs for the message's first packet get through: the others
  // must wait because their message waits, not because each was NAKed.
  uint32_t first = 0;
  t.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>& bytes) {
    wire::Packet p;
    if (from != kIpB || wire::parse(bytes.data(), bytes.size(), p) != wire::ParseError::OK ||
        p.base.op != wire::Op::ACK || p.ack.syndrome != wire::Syndrome::RNR_NAK)
      return true;
    if (!first) first = p.ack.nak_psn;
    return p.ack.nak_psn == first;
  };
  fill_random(t.a.buf.data(), 40000, 5);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 1, 0, 40000, 0), 0);
  t.net.run_for(20'000'000);
  EXPECT_GT(t.b.eng->stats().rnr_naks_sent, 1u);
  EXPECT_EQ(t.a.eng->stats().timeouts, 0u);
  ASSERT_EQ(t.post_recv(t.b, 9, 0, 40000), 0);
  auto sc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 40000), 0);
}

TEST(QpErrors, TransportRetryExceeded) {
  // A dead peer: the QP fails once a packet has timed out more than
  // retry_cnt times and nothing was acknowledged for IB's (retry_cnt + 1)
  // local ACK timeouts of 4.096 us * 2^timeout (here 4 x 67 ms), not
  // before, and not much later (at most one maximum RTO, 50 ms).
  PairOptions o;
  o.retry_cnt = 3;
  o.timeout = 14;
  Pair t(o);
  t.net.impairment.loss = 1.0;  // the peer is gone
  const uint64_t t0 = t.net.now_ns();
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 64, 0), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 2, 0, 64, 0), 0);
  auto wc = t.wait(t.a, t.a.scq, 2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, WcStatus::RETRY_EXC_ERR);
  EXPECT_EQ(wc[1].status, WcStatus::WR_FLUSH_ERR);
  const uint64_t limit = 4 * (4096ull << 14);
  EXPECT_GE(t.net.now_ns() - t0, limit);
  EXPECT_LE(t.net.now_ns() - t0, limit + 50'000'000);
  EXPECT_GE(t.a.eng->stats().timeouts, 4u);
}

TEST(QpErrors, TimeoutZeroRetriesForEver) {
  // IB: a local ACK timeout of 0 means the requester never gives up.
  PairOptions o;
  o.retry_cnt = 1;
  o.timeout = 0;
  Pair t(o);
  t.net.impairment.loss = 1.0;
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 64, 0), 0);
  EXPECT_TRUE(t.wait(t.a, t.a.scq, 1, 2'000'000'000).empty());
  EXPECT_EQ(t.a.qp->state(), QpState::RTS);
  t.net.impairment.loss = 0;  // the peer comes back
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
}

TEST(QpErrors, SqdDrainsAndReportsIt) {
  Pair t;
  QpAttr at;
  at.qp_state = QpState::SQD;
  at.en_sqd_async_notify = 1;
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 100000, 0), 0);
  t.a.eng->progress();  // WR 1 starts; SQD lets started WQEs finish
  ASSERT_EQ(t.a.eng->modify_qp(t.a.qp, at, QP_STATE | QP_EN_SQD_ASYNC_NOTIFY), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 2, 0, 64, 0), 0);  // waits for RTS
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  t.net.run_for(5'000'000);
  Wc more;
  EXPECT_EQ(t.a.eng->poll_cq(t.a.scq, &more, 1), 0);  // WR 2 did not start in SQD
  auto ev = t.a.eng->take_async_events();
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().type, AsyncEventType::SQ_DRAINED);
  at.qp_state = QpState::RTS;
  ASSERT_EQ(t.a.eng->modify_qp(t.a.qp, at, QP_STATE), 0);
  wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 2u);
}

TEST(QpErrors, MaxRdAtomicLimitsOutstandingReads) {
  PairOptions o;
  o.max_rd_atomic = 1;
  Pair t(o);
  int max_pending = 0;
  t.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>&) {
    max_pending = std::max<int>(max_pending, int(impl(t.a.qp)->rd_atomic_outstanding));
    return true;
  };
  for (int i = 0; i < 8; i++) ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, i, i * 8192, 8192, 0), 0);
  auto wc = t.wait(t.a, t.a.scq, 8);
  ASSERT_EQ(wc.size(), 8u);
  EXPECT_EQ(max_pending, 1);
}

TEST(Objects, PdCqMrLifetimes) {
  Pair t(unconnected());
  Engine& e = *t.a.eng;
  EXPECT_EQ(e.dealloc_pd(t.a.pd), EBUSY);   // MR and QP use it
  EXPECT_EQ(e.destroy_cq(t.a.scq), EBUSY);  // QP uses it
  uint32_t key = t.a.mr->lkey();
  EXPECT_EQ(e.find_mr(key), t.a.mr);
  EXPECT_EQ(e.dereg_mr(t.a.mr), 0);
  EXPECT_EQ(e.find_mr(key), nullptr);
  Mr* again = e.reg_mr(t.a.pd, t.a.addr(), 4096, ACCESS_LOCAL_WRITE, std::make_shared<HostMemory>());
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again->lkey(), key);  // a stale key does not find the new MR
  EXPECT_EQ(e.reg_mr(t.a.pd, t.a.addr(), 4096, ACCESS_REMOTE_WRITE, std::make_shared<HostMemory>()),
            nullptr);  // remote write without local write
  EXPECT_EQ(e.reg_mr(t.a.pd, ~0ull - 10, 4096, ACCESS_LOCAL_WRITE, std::make_shared<HostMemory>()),
            nullptr);  // wraps around
  EXPECT_EQ(e.destroy_qp(t.a.qp), 0);
  EXPECT_EQ(e.destroy_cq(t.a.scq), 0);
  EXPECT_EQ(e.dereg_mr(again), 0);
  EXPECT_EQ(e.dealloc_pd(t.a.pd), 0);
  QpInitAttr bad;
  EXPECT_EQ(e.create_qp(e.alloc_pd(), bad), nullptr);  // no CQs
}

}  // namespace
}  // namespace vstellar::test
