// UC QPs: SEND, SEND_WITH_IMM, RDMA_WRITE(_WITH_IMM) without ACKs or
// retransmission. A lost packet loses its message and nothing else; the
// QP stays in RTS through every loss and every bad message.
#include <algorithm>
#include <map>
#include <set>

#include "sim_pair.h"

namespace vstellar::test {
namespace {

PairOptions UcOptions() {
  PairOptions o;
  o.qp_type = QpType::UC;
  o.path_mtu = MTU_1024;  // messages of several packets
  o.access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE;
  return o;
}

// The parsed header of a packet the tap sees.
wire::Packet Parse(const std::vector<uint8_t>& bytes) {
  wire::Packet p;
  EXPECT_EQ(wire::parse(bytes.data(), bytes.size(), p), wire::ParseError::OK);
  return p;
}

TEST(Uc, AllOperationsAreByteExact) {
  Pair t(UcOptions());
  const uint32_t len = 10000;  // 10 packets of 1 KiB
  fill_random(t.a.buf.data(), 3 * len, 5);
  uint32_t packets = 0;
  t.net.tap = [&](uint32_t, uint32_t, uint16_t, std::vector<uint8_t>& b) {
    EXPECT_NE(Parse(b).base.op, wire::Op::ACK);  // UC answers nothing
    packets++;
    return true;
  };
  ASSERT_EQ(t.post_recv(t.b, 71, 0, len), 0);
  ASSERT_EQ(t.post_recv(t.b, 72, 0, 0), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND_WITH_IMM, 1, 0, len, 0, SEND_SIGNALED, 0xabcd), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 2, len, len, 2 * len), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE_WITH_IMM, 3, 2 * len, len, 4 * len, SEND_SIGNALED, 7), 0);
  auto sc = t.wait(t.a, t.a.scq, 3);
  ASSERT_EQ(sc.size(), 3u);
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(sc[i].status, WcStatus::SUCCESS);
    EXPECT_EQ(sc[i].wr_id, uint64_t(i + 1));
  }
  EXPECT_EQ(sc[0].opcode, WcOpcode::SEND);
  EXPECT_EQ(sc[1].opcode, WcOpcode::RDMA_WRITE);
  auto rc = t.wait(t.b, t.b.rcq, 2);
  ASSERT_EQ(rc.size(), 2u);
  EXPECT_EQ(rc[0].wr_id, 71u);
  EXPECT_EQ(rc[0].opcode, WcOpcode::RECV);
  EXPECT_EQ(rc[0].byte_len, len);
  EXPECT_EQ(rc[0].imm_data, 0xabcdu);
  EXPECT_TRUE(rc[0].wc_flags & WC_WITH_IMM);
  EXPECT_EQ(rc[1].wr_id, 72u);
  EXPECT_EQ(rc[1].opcode, WcOpcode::RECV_RDMA_WITH_IMM);
  EXPECT_EQ(rc[1].byte_len, len);
  EXPECT_EQ(rc[1].imm_data, 7u);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), len), 0);
  EXPECT_EQ(std::memcmp(t.a.buf.data() + len, t.b.buf.data() + 2 * len, len), 0);
  EXPECT_EQ(std::memcmp(t.a.buf.data() + 2 * len, t.b.buf.data() + 4 * len, len), 0);
  EXPECT_EQ(packets, 30u);
  EXPECT_EQ(t.b.eng->stats().uc_rcvd, 3u);
  EXPECT_EQ(t.b.eng->stats().uc_drops, 0u);
}

TEST(Uc, APacketOfAMessageTakesOnePath) {
  PairOptions o = UcOptions();
  o.cfg.num_paths = 128;
  Pair t(o);
  std::map<uint32_t, std::set<uint16_t>> paths;  // by message (msg_len distinguishes them)
  t.net.tap = [&](uint32_t, uint32_t, uint16_t path, std::vector<uint8_t>& b) {
    paths[Parse(b).data.msg_len].insert(path);
    return true;
  };
  for (uint32_t m = 0; m < 8; m++)
    ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, m, 0, 8000 + m, 0), 0);
  ASSERT_EQ(t.wait(t.a, t.a.scq, 8).size(), 8u);
  ASSERT_EQ(paths.size(), 8u);
  for (auto& [len, p] : paths) EXPECT_EQ(p.size(), 1u) << "message of " << len << " bytes";
}

// IB: a PSN gap drops the message in progress; the receive WQE it had
// begun to fill takes the next message.
TEST(Uc, ALostPacketLosesOnlyItsMessage) {
  Pair t(UcOptions());
  fill_random(t.a.buf.data(), 8192, 9);
  int n = 0;
  t.net.tap = [&](uint32_t, uint32_t, uint16_t, std::vector<uint8_t>&) { return ++n != 2; };
  ASSERT_EQ(t.post_recv(t.b, 1, 0, 4096), 0);
  ASSERT_EQ(t.post_recv(t.b, 2, 4096, 4096), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 10, 0, 3000, 0), 0);     // packets 1-3: loses 2
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 11, 4096, 2500, 0), 0);  // packets 4-6
  auto sc = t.wait(t.a, t.a.scq, 2);
  ASSERT_EQ(sc.size(), 2u);  // the sender cannot know
  EXPECT_EQ(sc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(sc[1].status, WcStatus::SUCCESS);
  auto rc = t.wait(t.b, t.b.rcq, 2, 10'000'000);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].wr_id, 1u);
  EXPECT_EQ(rc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(rc[0].byte_len, 2500u);
  EXPECT_EQ(std::memcmp(t.a.buf.data() + 4096, t.b.buf.data(), 2500), 0);
  EXPECT_EQ(t.b.qp->state(), QpState::RTS);
  EXPECT_EQ(t.b.eng->stats().uc_rcvd, 1u);
  EXPECT_GE(t.b.eng->stats().uc_drops, 1u);
  // Receive WQE 2 is still there for the next message.
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 12, 0, 100, 0), 0);
  rc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].wr_id, 2u);
  EXPECT_EQ(rc[0].byte_len, 100u);
}

// A message overtaken by a later one (different paths) arrives behind the
// expected PSN and is dropped, like a lost one (docs/transport.md).
TEST(Uc, AnOvertakenMessageIsDropped) {
  Pair t(UcOptions());
  fill_random(t.a.buf.data(), 4096, 3);
  std::vector<uint8_t> held;
  t.net.tap = [&](uint32_t, uint32_t, uint16_t, std::vector<uint8_t>& b) {
    if (held.empty() && Parse(b).data.msg_len == 100) {
      held = b;
      return false;
    }
    return true;
  };
  ASSERT_EQ(t.post_recv(t.b, 1, 0, 4096), 0);
  ASSERT_EQ(t.post_recv(t.b, 2, 0, 4096), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 10, 0, 100, 0), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 11, 200, 200, 0), 0);
  auto rc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].wr_id, 1u);
  EXPECT_EQ(rc[0].byte_len, 200u);
  ASSERT_FALSE(held.empty());
  t.net.inject(kIpA, kIpB, held);
  t.net.run_for(1'000'000);
  Wc extra;
  EXPECT_EQ(t.b.eng->poll_cq(t.b.rcq, &extra, 1), 0);
  EXPECT_EQ(t.b.eng->stats().uc_drops, 1u);
  EXPECT_EQ(t.b.qp->state(), QpState::RTS);
}

// Responder errors are silent drops: no receive WQE, a message longer than
// its receive WQE, a WRITE with a bad R_Key or out of its MR. Each loses
// only its message; the next good one lands.
TEST(Uc, BadMessagesAreDroppedAlone) {
  Pair t(UcOptions());
  fill_random(t.a.buf.data(), 4096, 4);
  // No receive WQE posted.
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 1, 0, 64, 0), 0);
  ASSERT_EQ(t.wait(t.a, t.a.scq, 1).size(), 1u);
  t.net.run_for(1'000'000);
  EXPECT_EQ(t.b.eng->stats().uc_drops, 1u);
  // Longer than the receive WQE.
  ASSERT_EQ(t.post_recv(t.b, 7, 0, 100), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 2, 0, 200, 0), 0);
  // A bad R_Key, and a WRITE past the end of the MR.
  Sge sg{t.a.addr(0), 64, t.a.mr->lkey()};
  SendWr wr;
  wr.wr_id = 3;
  wr.opcode = WrOpcode::RDMA_WRITE;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.remote_addr = t.b.addr(0);
  wr.rkey = t.b.mr->rkey() ^ 0x100;
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  wr.wr_id = 4;
  wr.rkey = t.b.mr->rkey();
  wr.remote_addr = t.b.addr(t.b.buf.size() - 32);
  ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
  // Then a good one: it takes receive WQE 7.
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 5, 0, 50, 0), 0);
  auto sc = t.wait(t.a, t.a.scq, 4);
  ASSERT_EQ(sc.size(), 4u);
  for (auto& c : sc) EXPECT_EQ(c.status, WcStatus::SUCCESS);
  auto rc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].wr_id, 7u);
  EXPECT_EQ(rc[0].byte_len, 50u);
  EXPECT_EQ(t.b.eng->stats().uc_drops, 4u);
  EXPECT_EQ(std::count(t.b.buf.end() - 32, t.b.buf.end(), 0), 32);
  EXPECT_EQ(t.b.qp->state(), QpState::RTS);
  EXPECT_EQ(t.a.qp->state(), QpState::RTS);
}

// Forged packets: a middle packet with no start, and one that claims to
// continue a message with another opcode or length, change nothing.
TEST(Uc, PacketsThatDoNotContinueTheirMessageAreDropped) {
  Pair t(UcOptions());
  fill_random(t.a.buf.data(), 4096, 6);
  std::vector<std::vector<uint8_t>> seen;
  t.net.tap = [&](uint32_t, uint32_t, uint16_t, std::vector<uint8_t>& b) {
    seen.push_back(b);
    return seen.size() != 2;  // message 1 loses its middle packet
  };
  ASSERT_EQ(t.post_recv(t.b, 1, 0, 4096), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 1, 0, 3000, 0), 0);
  ASSERT_EQ(t.wait(t.a, t.a.scq, 1).size(), 1u);
  t.net.run_for(1'000'000);
  ASSERT_EQ(seen.size(), 3u);
  // Replay the lost middle packet: it is behind the expected PSN now.
  t.net.inject(kIpA, kIpB, seen[1]);
  t.net.run_for(1'000'000);
  Wc extra;
  EXPECT_EQ(t.b.eng->poll_cq(t.b.rcq, &extra, 1), 0);
  EXPECT_EQ(t.b.qp->state(), QpState::RTS);
}

TEST(Uc, ReadAndAtomicsAreRefused) {
  Pair t(UcOptions());
  WcStatus why = WcStatus::SUCCESS;
  Sge sg{t.a.addr(0), 8, t.a.mr->lkey()};
  SendWr wr;
  wr.opcode = WrOpcode::RDMA_READ;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.remote_addr = t.b.addr(0);
  wr.rkey = t.b.mr->rkey();
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr, &why), EINVAL);
  EXPECT_EQ(why, WcStatus::LOC_QP_OP_ERR);
  wr.opcode = WrOpcode::ATOMIC_FETCH_AND_ADD;
  EXPECT_EQ(t.a.eng->post_send(t.a.qp, wr, &why), EINVAL);
  EXPECT_EQ(why, WcStatus::LOC_QP_OP_ERR);
}

// The UC column of the modify table: no retry, RNR or rd_atomic attributes.
TEST(Uc, ModifyTakesTheUcAttributes) {
  PairOptions o = UcOptions();
  o.connect = false;
  Pair t(o);
  ASSERT_EQ(Pair::to_init(t.a, ACCESS_REMOTE_WRITE), 0);
  QpAttr at;
  at.qp_state = QpState::RTR;
  at.path_mtu = MTU_1024;
  at.dest_qp_num = t.b.qp->qpn();
  at.rq_psn = 5;
  at.ah = Endpoint{kIpB, 4791};
  at.min_rnr_timer = 3;
  const uint32_t rtr = QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN;
  EXPECT_EQ(t.a.eng->modify_qp(t.a.qp, at, rtr & ~QP_RQ_PSN), EINVAL);
  EXPECT_EQ(t.a.eng->modify_qp(t.a.qp, at, rtr | QP_MIN_RNR_TIMER), EINVAL);
  ASSERT_EQ(t.a.eng->modify_qp(t.a.qp, at, rtr), 0);
  at.qp_state = QpState::RTS;
  at.sq_psn = 9;
  at.retry_cnt = 3;
  EXPECT_EQ(t.a.eng->modify_qp(t.a.qp, at, QP_STATE | QP_SQ_PSN | QP_RETRY_CNT), EINVAL);
  EXPECT_EQ(t.a.eng->modify_qp(t.a.qp, at, QP_STATE | QP_SQ_PSN), 0);
  EXPECT_EQ(t.a.qp->state(), QpState::RTS);
}

}  // namespace
}  // namespace vstellar::test
