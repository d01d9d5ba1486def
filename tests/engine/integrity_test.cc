// Integrity mode (issue 13): with a shared key, every packet carries a MAC;
// nothing forged, altered or keyed differently gets through, and the
// transport repairs what was dropped for it.
#include "engine_internal.h"  // white box: a QP's PSNs for forging
#include "sim_pair.h"

namespace vstellar::test {
namespace {

PairOptions Keyed(uint8_t key_byte = 7) {
  PairOptions o;
  o.cfg.integrity = true;
  o.cfg.integrity_key.fill(key_byte);
  return o;
}

void WriteAndCheck(Pair& t, uint64_t wr_id, uint32_t len) {
  fill_random(t.a.buf.data(), len, wr_id);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, wr_id, 0, len, 4096), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data() + 4096, len), 0);
}

TEST(Integrity, OperationsWorkWithAKey) {
  Pair t(Keyed());
  WriteAndCheck(t, 1, 100'000);
  fill_random(t.b.buf.data() + 300000, 50'000, 2);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 2, 200000, 50'000, 300000), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data() + 200000, t.b.buf.data() + 300000, 50'000), 0);
  EXPECT_EQ(t.a.eng->stats().bad_mac + t.b.eng->stats().bad_mac, 0u);
}

// One byte changed anywhere in a packet (trailer, header or payload): the
// packet is dropped, and the transport resends it.
TEST(Integrity, AlteredPacketsAreDroppedAndResent) {
  Pair t(Keyed());
  uint32_t n = 0;
  t.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>& bytes) {
    if (from == kIpA && bytes.size() > 100 && n++ % 3 == 0) bytes[(n * 37) % bytes.size()] ^= 0x10;
    return true;
  };
  WriteAndCheck(t, 3, 200'000);
  EXPECT_GT(t.b.eng->stats().bad_mac, 0u);
  EXPECT_EQ(t.b.eng->stats().naks_sent, 0u);
}

// A forged ACK with the right QPNs and PSNs, as a blind spoofer who guessed
// them would send, is dropped: it has no valid MAC, so it cannot complete
// a WRITE that never arrived.
TEST(Integrity, ForgedAckCannotCompleteAWrite) {
  Pair t(Keyed());
  t.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>&) { return from != kIpA; };
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 4, 0, 4096, 8192), 0);
  const uint32_t next = impl(t.a.qp)->snd_nxt;
  wire::Base b;
  b.op = wire::Op::ACK;
  b.dst_qpn = t.a.qp->qpn();
  b.src_qpn = t.b.qp->qpn();
  b.psn = next;
  wire::AckExt a;
  a.cum_psn = next;
  a.sack_base = next;
  std::vector<uint8_t> v(PacketMac::kTrailerLen + wire::kMaxHeaderLen + 128);
  v.resize(PacketMac::kTrailerLen + wire::encode(b, a, v.data() + PacketMac::kTrailerLen));
  t.net.inject(kIpB, kIpA, v);
  t.net.run_for(2'000'000);
  Wc wc;
  EXPECT_EQ(t.a.eng->poll_cq(t.a.scq, &wc, 1), 0) << "the WRITE was completed by a forged ACK";
  EXPECT_EQ(t.a.eng->stats().bad_mac, 1u);
}

// Peers with different keys, or one without integrity, exchange nothing:
// every packet is dropped, no byte is placed, and the WRITE fails after its
// retries as on a dead link.
TEST(Integrity, AnotherKeyOrNoKeyGetsNothingThrough) {
  for (bool b_keyed : {true, false}) {
    PairOptions o = Keyed();
    o.cfg_b = Keyed(9).cfg;
    o.cfg_b->integrity = b_keyed;
    o.retry_cnt = 1;
    Pair t(o);
    fill_random(t.a.buf.data(), 4096, 5);
    ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 5, 0, 4096, 8192), 0);
    auto wc = t.wait(t.a, t.a.scq, 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, WcStatus::RETRY_EXC_ERR);
    const EngineStats& s = t.b.eng->stats();
    EXPECT_GT(b_keyed ? s.bad_mac : s.bad_parse, 0u) << b_keyed;
    for (size_t i = 8192; i < 8192 + 4096; i++) ASSERT_EQ(t.b.buf[i], 0) << b_keyed;
  }
}

// Datagrams (UD, GSI) carry the fabric-wide datagram MAC.
TEST(Integrity, DatagramsAreSignedToo) {
  PairOptions o = Keyed();
  o.connect = false;
  Pair t(o);
  QpInitAttr ia;
  ia.send_cq = t.a.scq;
  ia.recv_cq = t.a.rcq;
  ia.qp_type = QpType::UD;
  Qp* ua = t.a.eng->create_qp(t.a.pd, ia);
  ia.send_cq = t.b.scq;
  ia.recv_cq = t.b.rcq;
  Qp* ub = t.b.eng->create_qp(t.b.pd, ia);
  ASSERT_TRUE(ua && ub);
  for (auto [s, q] : {std::pair{&t.a, ua}, std::pair{&t.b, ub}}) {
    QpAttr at;
    at.qp_state = QpState::INIT;
    at.port_num = 1;
    at.qkey = 0x11;
    ASSERT_EQ(s->eng->modify_qp(q, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY), 0);
    at.qp_state = QpState::RTR;
    ASSERT_EQ(s->eng->modify_qp(q, at, QP_STATE), 0);
    at.qp_state = QpState::RTS;
    at.sq_psn = 0;
    ASSERT_EQ(s->eng->modify_qp(q, at, QP_STATE | QP_SQ_PSN), 0);
  }
  Sge rs{t.b.addr(0), 1024, t.b.mr->lkey()};
  RecvWr r;
  r.wr_id = 1;
  r.sg_list = &rs;
  r.num_sge = 1;
  ASSERT_EQ(t.b.eng->post_recv(ub, r), 0);
  fill_random(t.a.buf.data(), 64, 6);
  Sge ss{t.a.addr(0), 64, t.a.mr->lkey()};
  SendWr w;
  w.wr_id = 2;
  w.opcode = WrOpcode::SEND;
  w.sg_list = &ss;
  w.num_sge = 1;
  w.send_flags = SEND_SIGNALED;
  w.ud.peer = Endpoint{kIpB, 4791};
  w.ud.remote_qpn = ub->qpn();
  w.ud.remote_qkey = 0x11;
  w.ud.sgid[10] = w.ud.sgid[11] = 0xff;
  w.ud.dgid = w.ud.sgid;
  for (int i = 0; i < 4; i++) {
    w.ud.sgid[12 + i] = uint8_t(kIpA >> (24 - 8 * i));
    w.ud.dgid[12 + i] = uint8_t(kIpB >> (24 - 8 * i));
  }
  ASSERT_EQ(t.a.eng->post_send(ua, w), 0);
  auto wc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.b.buf.data() + 40, t.a.buf.data(), 64), 0);
  EXPECT_EQ(t.b.eng->stats().bad_mac, 0u);
}

}  // namespace
}  // namespace vstellar::test
