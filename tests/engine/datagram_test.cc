// UD and GSI QPs: one datagram per message, the GRH area of a RoCE UD
// receive, QP 1 routing by destination GID, and what a receiver refuses.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "sim_pair.h"
#include "vstellar/roce_wire.h"

namespace vstellar::test {
namespace {

Gid gid_of(uint32_t ip) {
  Gid g{};
  g[10] = g[11] = 0xff;
  g[12] = uint8_t(ip >> 24);
  g[13] = uint8_t(ip >> 16);
  g[14] = uint8_t(ip >> 8);
  g[15] = uint8_t(ip);
  return g;
}

constexpr uint32_t kQkey = 0x11111111;

// A 64-byte SEND from `from` to QP qpn at `to`, claiming source GID `sgid`.
SendWr ud_send_wr(Side& from, Sge& sg, uint32_t to_ip, uint32_t qpn, uint32_t qkey, uint32_t sgid_ip) {
  sg = Sge{from.addr(), 64, from.mr->lkey()};
  SendWr wr;
  wr.opcode = WrOpcode::SEND;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.ud.peer = Endpoint{to_ip, 4791};
  wr.ud.remote_qpn = qpn;
  wr.ud.remote_qkey = qkey;
  wr.ud.sgid = gid_of(sgid_ip);
  wr.ud.dgid = gid_of(to_ip);
  return wr;
}

// RESET -> INIT -> RTR -> RTS with the UD attributes (GSI: no port).
int to_rts(Engine& eng, Qp* qp, uint32_t qkey) {
  QpAttr at;
  at.qp_state = QpState::INIT;
  at.qkey = qkey;
  const uint32_t port = qp->is_gsi() ? 0u : uint32_t(QP_PORT);
  if (int e = eng.modify_qp(qp, at, QP_STATE | QP_PKEY_INDEX | QP_QKEY | port)) return e;
  at.qp_state = QpState::RTR;
  if (int e = eng.modify_qp(qp, at, QP_STATE)) return e;
  at.qp_state = QpState::RTS;
  return eng.modify_qp(qp, at, QP_STATE | QP_SQ_PSN);
}

class Datagram : public ::testing::Test {
 protected:
  static PairOptions opts() {
    PairOptions o;
    o.connect = false;
    o.cfg.mtu = 1024;
    return o;
  }
  explicit Datagram(const PairOptions& o = opts()) : p(o) {}

  Qp* make(Side& s, QpType t) {
    QpInitAttr ia;
    ia.qp_type = t;
    ia.send_cq = s.scq;
    ia.recv_cq = s.rcq;
    Qp* qp = s.eng->create_qp(s.pd, ia);
    if (!qp) return nullptr;
    if (t == QpType::GSI) {
      EXPECT_EQ(s.eng->set_gsi_gids(qp, {gid_of(s.ip)}), 0);
    }
    EXPECT_EQ(to_rts(*s.eng, qp, t == QpType::GSI ? 0x80010000u : kQkey), 0);
    return qp;
  }

  int send(Side& s, Qp* qp, Side& to, uint32_t qpn, uint32_t qkey, uint64_t off, uint32_t len,
           uint32_t imm_flag = 0) {
    Sge sg{s.addr(off), len, s.mr->lkey()};
    SendWr wr;
    wr.wr_id = off;
    wr.opcode = imm_flag ? WrOpcode::SEND_WITH_IMM : WrOpcode::SEND;
    wr.imm_data = imm_flag;
    wr.send_flags = SEND_SIGNALED;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.ud.peer = Endpoint{to.ip, 4791};
    wr.ud.remote_qpn = qpn;
    wr.ud.remote_qkey = qkey;
    wr.ud.sgid = gid_of(s.ip);
    wr.ud.dgid = gid_of(to.ip);
    wr.ud.hop_limit = 64;
    return s.eng->post_send(qp, wr);
  }
  int recv(Side& s, Qp* qp, uint64_t off, uint32_t len) {
    Sge sg{s.addr(off), len, s.mr->lkey()};
    RecvWr wr;
    wr.wr_id = off;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    return s.eng->post_recv(qp, wr);
  }
  // Runs the network until nothing moves any more.
  void settle() {
    p.net.run_until([] { return false; }, 20'000'000);
  }
  std::vector<Wc> poll(Side& s, Cq* cq) {
    std::vector<Wc> out;
    Wc wc[16];
    for (int k; (k = s.eng->poll_cq(cq, wc, 16)) > 0;) out.insert(out.end(), wc, wc + k);
    return out;
  }

  Pair p;
};

// A daemon bound to the wildcard hears datagrams for every address of its
// host; the link says where each arrived. A datagram whose destination GID
// is not the address it arrived at (one device's QP 1 asked for at another
// device's address) is dropped; the same bytes at the right address are
// taken.
TEST_F(Datagram, AUnicastDatagramIsTakenOnlyAtItsDestinationGid) {
  Qp* qa = make(p.a, QpType::UD);
  Qp* qb = make(p.b, QpType::UD);
  ASSERT_TRUE(qa && qb);
  std::vector<uint8_t> captured;
  p.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>& bytes) {
    if (from == p.a.ip && captured.empty()) captured = bytes;
    return false;  // not delivered by the network: by hand, below
  };
  ASSERT_EQ(send(p.a, qa, p.b, qb->qpn(), kQkey, 0, 64), 0);
  settle();
  ASSERT_FALSE(captured.empty());
  ASSERT_EQ(recv(p.b, qb, 4096, 512), 0);
  const uint64_t drops = p.b.eng->stats().ud_drops;
  p.b.eng->receive(captured.data(), captured.size(), Endpoint{p.a.ip, 0}, IpAddr(p.b.ip + 1), false);
  EXPECT_EQ(p.b.eng->stats().ud_drops, drops + 1) << "arrived at another address than its destination GID";
  EXPECT_TRUE(poll(p.b, p.b.rcq).empty());
  p.b.eng->receive(captured.data(), captured.size(), Endpoint{p.a.ip, 0}, IpAddr(p.b.ip), false);
  auto rc = poll(p.b, p.b.rcq);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::SUCCESS);
}

TEST_F(Datagram, UdSendCarriesGrhAndPayload) {
  Qp* qa = make(p.a, QpType::UD);
  Qp* qb = make(p.b, QpType::UD);
  ASSERT_TRUE(qa && qb);
  fill_random(p.a.buf.data(), 300, 7);
  ASSERT_EQ(recv(p.b, qb, 4096, 512), 0);
  ASSERT_EQ(send(p.a, qa, p.b, qb->qpn(), kQkey, 0, 300, 0xabcd), 0);
  auto rc = p.wait(p.b, p.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(rc[0].byte_len, 40u + 300u);
  EXPECT_EQ(rc[0].src_qp, qa->qpn());
  EXPECT_EQ(rc[0].wc_flags, uint32_t(WC_GRH | WC_WITH_IMM | WC_GRH_IPV4)) << "IPv4 GIDs: an IPv4 header";
  EXPECT_EQ(rc[0].imm_data, 0xabcdu);
  const uint8_t* grh = p.b.buf.data() + 4096;
  for (int i = 0; i < 20; i++) EXPECT_EQ(grh[i], 0) << i;
  const uint8_t* ip = grh + 20;
  EXPECT_EQ(ip[0], 0x45);
  EXPECT_EQ(ip[9], 17);
  EXPECT_EQ(std::memcmp(ip + 12, gid_of(p.a.ip).data() + 12, 4), 0);
  EXPECT_EQ(std::memcmp(ip + 16, gid_of(p.b.ip).data() + 12, 4), 0);
  uint32_t sum = 0;  // a valid header sums to 0xffff
  for (int i = 0; i < 20; i += 2) sum += uint32_t(ip[i]) << 8 | ip[i + 1];
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  EXPECT_EQ(sum, 0xffffu);
  EXPECT_EQ(std::memcmp(grh + 40, p.a.buf.data(), 300), 0);
  auto sc = p.wait(p.a, p.a.scq, 1);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(sc[0].wr_id, 0u);
}

TEST_F(Datagram, GsiAnswersQp1ForItsGidsAndSendsFromQp1) {
  Qp* ga = make(p.a, QpType::GSI);
  Qp* gb = make(p.b, QpType::GSI);
  ASSERT_TRUE(ga && gb);
  EXPECT_NE(gb->qpn(), 1u);  // the engine's own number; QP 1 on the wire
  ASSERT_EQ(recv(p.b, gb, 0, 512), 0);
  ASSERT_EQ(send(p.a, ga, p.b, 1, 0x80000000u, 1024, 256), 0);  // "use my Q_Key"
  auto rc = p.wait(p.b, p.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(rc[0].src_qp, 1u);
  EXPECT_EQ(rc[0].qp_num, gb->qpn());
  // Its engine-internal number is not an address: datagrams to it are dropped.
  ASSERT_EQ(recv(p.b, gb, 0, 512), 0);
  const uint64_t drops = p.b.eng->stats().ud_drops;
  ASSERT_EQ(send(p.a, ga, p.b, gb->qpn(), 0x80010000u, 1024, 256), 0);
  settle();
  EXPECT_TRUE(poll(p.b, p.b.rcq).empty());
  EXPECT_EQ(p.b.eng->stats().ud_drops, drops + 1);
  // Nor does QP 1 answer for a GID that is not its own.
  ASSERT_EQ(p.b.eng->set_gsi_gids(gb, {}), 0);
  ASSERT_EQ(send(p.a, ga, p.b, 1, 0x80010000u, 1024, 256), 0);
  settle();
  EXPECT_TRUE(poll(p.b, p.b.rcq).empty());
  EXPECT_EQ(p.b.eng->stats().ud_drops, drops + 2);
}

// Toward a plain RoCE v2 peer (EngineConfig::roce) a UD datagram is UD
// SEND Only with a DETH and a good ICRC, and QP 1's MADs too (rdma_cm);
// one that arrives as RoCE v2 is received with the GRH area built from the
// IP addresses.
class DatagramRoce : public Datagram {
 protected:
  static PairOptions roce_opts() {
    PairOptions o = opts();
    o.cfg.roce.peers = {IpPrefix{IpAddr(0x0a000000), 8}};
    o.cfg_b = o.cfg;
    o.cfg.roce.local = IpAddr(kIpA);
    o.cfg_b->roce.local = IpAddr(kIpB);
    return o;
  }
  DatagramRoce() : Datagram(roce_opts()) {}
};

TEST_F(DatagramRoce, UdAndGsiDatagramsAreRoceV2) {
  Qp* qa = make(p.a, QpType::UD);
  Qp* qb = make(p.b, QpType::UD);
  Qp* ga = make(p.a, QpType::GSI);
  Qp* gb = make(p.b, QpType::GSI);
  ASSERT_TRUE(qa && qb && ga && gb);
  std::vector<roce::Packet> seen;
  std::vector<std::vector<uint8_t>> kept;
  int bad = 0;
  p.net.tap = [&](uint32_t from, uint32_t to, uint16_t path, std::vector<uint8_t>& bytes) {
    roce::IpFields ip;
    ip.src = IpAddr(from);
    ip.dst = IpAddr(to);
    ip.src_port = path;
    roce::Packet rp;
    kept.push_back(bytes);
    if (roce::parse(kept.back().data(), kept.back().size(), ip, &rp) != roce::ParseError::NONE) bad++;
    else seen.push_back(rp);
    return true;
  };
  fill_random(p.a.buf.data(), 300, 9);
  ASSERT_EQ(recv(p.b, qb, 4096, 512), 0);
  ASSERT_EQ(send(p.a, qa, p.b, qb->qpn(), kQkey, 0, 300, 0x1234), 0);
  auto rc = p.wait(p.b, p.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(rc[0].byte_len, 40u + 300u);
  EXPECT_EQ(rc[0].src_qp, qa->qpn());
  EXPECT_EQ(rc[0].imm_data, 0x1234u);
  EXPECT_EQ(std::memcmp(p.b.buf.data() + 4096 + 40, p.a.buf.data(), 300), 0);
  const uint8_t* ip = p.b.buf.data() + 4096 + 20;
  EXPECT_EQ(std::memcmp(ip + 12, gid_of(p.a.ip).data() + 12, 4), 0);
  EXPECT_EQ(std::memcmp(ip + 16, gid_of(p.b.ip).data() + 12, 4), 0);

  ASSERT_EQ(recv(p.b, gb, 0, 512), 0);
  ASSERT_EQ(send(p.a, ga, p.b, 1, 0x80000000u, 1024, 256), 0);
  rc = p.wait(p.b, p.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(rc[0].src_qp, 1u);
  EXPECT_EQ(rc[0].qp_num, gb->qpn());

  EXPECT_EQ(bad, 0);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].bth.opcode, roce::UD_SEND_ONLY_IMM);
  EXPECT_EQ(seen[0].bth.dest_qp, qb->qpn());
  EXPECT_EQ(seen[0].deth.qkey, kQkey);
  EXPECT_EQ(seen[0].deth.src_qp, qa->qpn());
  EXPECT_EQ(seen[1].bth.opcode, roce::UD_SEND_ONLY);
  EXPECT_EQ(seen[1].bth.dest_qp, 1u);
  EXPECT_EQ(seen[1].deth.qkey, roce::kGsiQkey);
  EXPECT_EQ(seen[1].deth.src_qp, 1u);
  EXPECT_EQ(p.a.eng->stats().roce_tx, 2u);
  EXPECT_EQ(p.b.eng->stats().roce_rx, 2u);
}

TEST_F(Datagram, ReceiverDropsWrongQkeyAndNoReceive) {
  Qp* qa = make(p.a, QpType::UD);
  Qp* qb = make(p.b, QpType::UD);
  ASSERT_TRUE(qa && qb);
  ASSERT_EQ(send(p.a, qa, p.b, qb->qpn(), kQkey + 1, 0, 64), 0);  // wrong Q_Key
  ASSERT_EQ(send(p.a, qa, p.b, qb->qpn(), kQkey, 0, 64), 0);      // no receive posted
  settle();
  EXPECT_TRUE(poll(p.b, p.b.rcq).empty());
  EXPECT_EQ(p.b.eng->stats().ud_drops, 2u);
  EXPECT_EQ(qb->state(), QpState::RTS);
  // Both sends still completed: UD has no delivery guarantee.
  EXPECT_EQ(poll(p.a, p.a.scq).size(), 2u);
}

TEST_F(Datagram, SpoofedSourceGidIsDropped) {
  Qp* qa = make(p.a, QpType::UD);
  Qp* qb = make(p.b, QpType::UD);
  ASSERT_TRUE(qa && qb);
  ASSERT_EQ(recv(p.b, qb, 0, 512), 0);
  Sge sg;
  SendWr wr = ud_send_wr(p.a, sg, p.b.ip, qb->qpn(), kQkey, 0x0a0000ff);  // not a's address
  ASSERT_EQ(p.a.eng->post_send(qa, wr), 0);
  settle();
  EXPECT_TRUE(poll(p.b, p.b.rcq).empty());
  EXPECT_EQ(p.b.eng->stats().ud_drops, 1u);
}

TEST_F(Datagram, ShortReceiveFailsAloneAndQpStaysUsable) {
  Qp* qa = make(p.a, QpType::UD);
  Qp* qb = make(p.b, QpType::UD);
  ASSERT_TRUE(qa && qb);
  ASSERT_EQ(recv(p.b, qb, 0, 100), 0);     // too small for GRH + 200 bytes
  ASSERT_EQ(recv(p.b, qb, 4096, 512), 0);  // fits
  ASSERT_EQ(send(p.a, qa, p.b, qb->qpn(), kQkey, 0, 200), 0);
  ASSERT_EQ(send(p.a, qa, p.b, qb->qpn(), kQkey, 0, 200), 0);
  auto rc = p.wait(p.b, p.b.rcq, 2);
  ASSERT_EQ(rc.size(), 2u);
  EXPECT_EQ(rc[0].status, WcStatus::LOC_LEN_ERR);
  EXPECT_EQ(rc[1].status, WcStatus::SUCCESS);
  EXPECT_EQ(qb->state(), QpState::RTS);
}

TEST_F(Datagram, VerbsRulesOfUdQps) {
  QpInitAttr ia;
  ia.qp_type = QpType::UD;
  ia.send_cq = p.a.scq;
  ia.recv_cq = p.a.rcq;
  Qp* qp = p.a.eng->create_qp(p.a.pd, ia);
  ASSERT_TRUE(qp);
  QpAttr at;
  at.qp_state = QpState::INIT;
  at.qkey = kQkey;
  // UD needs the Q_Key and the port (GSI only the Q_Key); RC attributes are refused.
  EXPECT_EQ(p.a.eng->modify_qp(qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT), EINVAL);
  EXPECT_EQ(p.a.eng->modify_qp(qp, at, QP_STATE | QP_PKEY_INDEX | QP_QKEY), EINVAL);
  EXPECT_EQ(p.a.eng->modify_qp(qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY | QP_ACCESS_FLAGS),
            EINVAL);
  ASSERT_EQ(p.a.eng->modify_qp(qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_QKEY), 0);
  at.qp_state = QpState::RTR;
  EXPECT_EQ(p.a.eng->modify_qp(qp, at, QP_STATE | QP_AV), EINVAL);
  ASSERT_EQ(p.a.eng->modify_qp(qp, at, QP_STATE), 0);
  at.qp_state = QpState::RTS;
  EXPECT_EQ(p.a.eng->modify_qp(qp, at, QP_STATE), EINVAL);  // SQ_PSN is required
  ASSERT_EQ(p.a.eng->modify_qp(qp, at, QP_STATE | QP_SQ_PSN), 0);
  // One packet per datagram, SENDs only.
  Sge sg{p.a.addr(), 2048, p.a.mr->lkey()};
  SendWr wr;
  wr.opcode = WrOpcode::SEND;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  EXPECT_EQ(p.a.eng->post_send(qp, wr), EINVAL);  // larger than the 1024-byte MTU
  sg.length = 64;
  wr.opcode = WrOpcode::RDMA_WRITE;
  EXPECT_EQ(p.a.eng->post_send(qp, wr), EINVAL);
  wr.opcode = WrOpcode::SEND;
  EXPECT_EQ(p.a.eng->post_send(qp, wr), 0);
}

TEST_F(Datagram, RcQpIgnoresDatagrams) {
  PairOptions o;  // connected RC pair
  Pair rc(o);
  QpInitAttr ia;
  ia.qp_type = QpType::UD;
  ia.send_cq = rc.a.scq;
  ia.recv_cq = rc.a.rcq;
  ASSERT_EQ(rc.post_recv(rc.b, 1, 0, 4096), 0);
  Qp* ud = rc.a.eng->create_qp(rc.a.pd, ia);
  ASSERT_EQ(to_rts(*rc.a.eng, ud, 0), 0);
  Sge sg;
  SendWr wr = ud_send_wr(rc.a, sg, rc.b.ip, rc.b.qp->qpn(), 0, rc.a.ip);
  ASSERT_EQ(rc.a.eng->post_send(ud, wr), 0);
  rc.net.run_until([] { return false; }, 20'000'000);
  Wc wc[4];
  EXPECT_EQ(rc.b.eng->poll_cq(rc.b.rcq, wc, 4), 0);
  EXPECT_EQ(rc.b.eng->stats().ud_drops, 1u);
}

// UD multicast: a send to a group's GID reaches every QP attached to it, on
// both engines (the sender's own included), and nothing else.
TEST_F(Datagram, MulticastReachesEveryAttachedQp) {
  Qp* qa = make(p.a, QpType::UD);
  Qp* qb = make(p.b, QpType::UD);
  Qp* qb2 = make(p.b, QpType::UD);
  Qp* other = make(p.b, QpType::UD);  // not attached
  ASSERT_TRUE(qa && qb && qb2 && other);
  const Gid group = gid_of(0xe6010203);  // 230.1.2.3
  ASSERT_EQ(p.a.eng->attach_mcast(qa, group), 0);
  ASSERT_EQ(p.b.eng->attach_mcast(qb, group), 0);
  ASSERT_EQ(p.b.eng->attach_mcast(qb2, group), 0);
  ASSERT_EQ(p.b.eng->attach_mcast(qb2, group), 0) << "attaching twice is no error";
  for (Qp* q : {qb, qb2, other}) ASSERT_EQ(recv(p.b, q, 4096 * (1 + (q == qb2) + 2 * (q == other)), 512), 0);
  ASSERT_EQ(recv(p.a, qa, 4096, 512), 0);
  fill_random(p.a.buf.data(), 100, 3);
  Sge sg{p.a.addr(0), 100, p.a.mr->lkey()};
  SendWr wr;
  wr.opcode = WrOpcode::SEND;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.ud.peer = Endpoint{0xe6010203, 4792};
  wr.ud.remote_qpn = 0xffffff;
  wr.ud.remote_qkey = kQkey;
  wr.ud.sgid = gid_of(p.a.ip);
  wr.ud.dgid = group;
  ASSERT_EQ(p.a.eng->post_send(qa, wr), 0);
  settle();
  auto rb = poll(p.b, p.b.rcq);
  ASSERT_EQ(rb.size(), 2u);
  std::set<uint32_t> got;
  for (auto& c : rb) {
    EXPECT_EQ(c.status, WcStatus::SUCCESS);
    EXPECT_EQ(c.byte_len, 140u);
    EXPECT_EQ(c.src_qp, qa->qpn());
    got.insert(c.qp_num);
  }
  EXPECT_EQ(got, (std::set<uint32_t>{qb->qpn(), qb2->qpn()}));
  EXPECT_EQ(std::memcmp(p.b.buf.data() + 4096 + 40, p.a.buf.data(), 100), 0);
  EXPECT_EQ(std::memcmp(p.b.buf.data() + 8192 + 40, p.a.buf.data(), 100), 0);
  ASSERT_EQ(poll(p.a, p.a.rcq).size(), 1u) << "the sender's own attached QP gets its copy";
  // Detached, and after the last QP of an engine left, nothing arrives.
  ASSERT_EQ(p.b.eng->detach_mcast(qb, group), 0);
  ASSERT_EQ(p.b.eng->destroy_qp(qb2), 0);
  ASSERT_EQ(recv(p.b, qb, 4096, 512), 0);
  ASSERT_EQ(p.a.eng->post_send(qa, wr), 0);
  settle();
  EXPECT_EQ(poll(p.b, p.b.rcq).size(), 0u);
}

TEST_F(Datagram, MulticastAttachRefusesWhatIsNotAGroupOrNotUd) {
  Qp* ud = make(p.a, QpType::UD);
  Qp* gsi = make(p.a, QpType::GSI);
  QpInitAttr ia;
  ia.send_cq = p.a.scq;
  ia.recv_cq = p.a.rcq;
  Qp* rc = p.a.eng->create_qp(p.a.pd, ia);
  ASSERT_TRUE(ud && gsi && rc);
  const Gid group = gid_of(0xe0000001);
  Gid v6{};
  v6[0] = 0xfd;  // an IPv6 unicast GID: not a group
  v6[15] = 1;
  Gid v6_group{};
  v6_group[0] = 0xff;
  v6_group[1] = 0x15;
  v6_group[15] = 1;
  EXPECT_EQ(p.a.eng->attach_mcast(ud, gid_of(0x0a000001)), EINVAL);
  EXPECT_EQ(p.a.eng->attach_mcast(ud, v6), EINVAL);
  // An IPv6 group is one, but the simulated network's nodes are IPv4 only:
  // their link cannot join it, as a link on a host without IPv6 cannot.
  EXPECT_EQ(p.a.eng->attach_mcast(ud, v6_group), EIO);
  EXPECT_EQ(p.a.eng->attach_mcast(rc, group), EINVAL);
  EXPECT_EQ(p.a.eng->attach_mcast(gsi, group), EINVAL);
  EXPECT_EQ(p.a.eng->detach_mcast(ud, group), EINVAL) << "not attached";
  // Limits: QPs per group, groups per engine.
  std::vector<Qp*> qps;
  for (uint32_t i = 0; i < DeviceLimits::kMaxMcastQpAttach; i++) {
    qps.push_back(make(p.a, QpType::UD));
    ASSERT_EQ(p.a.eng->attach_mcast(qps.back(), group), 0);
  }
  EXPECT_EQ(p.a.eng->attach_mcast(ud, group), ENOSPC);
  for (uint32_t i = 1; i < DeviceLimits::kMaxMcastGroups; i++)
    ASSERT_EQ(p.a.eng->attach_mcast(ud, gid_of(0xe0000001 + i)), 0);
  EXPECT_EQ(p.a.eng->attach_mcast(ud, gid_of(0xe0001001)), ENOSPC);
}

}  // namespace
}  // namespace vstellar::test
