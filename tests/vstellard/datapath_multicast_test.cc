// UD multicast through the daemon: attach, send, detach, hostile requests,
// and the per-device quota of groups and of QPs in a group.
#include <gtest/gtest.h>

#include <array>

#include "vstellard/datapath_fixture.h"

namespace vstellard::datapath_test {

// UD multicast through the daemon: ATTACH_MCAST, a UD send to the group's
// GID over real UDP (IP multicast on the loopback), DETACH_MCAST; hostile
// requests (bogus groups, RC QPs, another context's QP, reserved bits,
// detaching what is not attached) each fail alone with their status.
void DataPath::MulticastGroupsThroughTheDaemon() {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GQp ua, ub;
  ASSERT_NO_FATAL_FAILURE(A.CreateUdQp(0x4242, &ua));
  ASSERT_NO_FATAL_FAILURE(B.CreateUdQp(0x4242, &ub));
  A.AddLoopbackGid(1);
  auto mc = [](uint32_t qpn, std::array<uint8_t, 4> ip) {
    vstellar_cmd_mcast m{};
    m.qpn = qpn;
    m.mgid[10] = m.mgid[11] = 0xff;
    std::memcpy(m.mgid + 12, ip.data(), 4);
    return m;
  };
  auto cmd = [](Guest& G, uint16_t op, const vstellar_cmd_mcast& m) { return G.Cmd(op, &m, sizeof(m), 0).status(); };
  vstellar_cmd_mcast m = mc(ub.qpn, {230, 9, 8, 7});
  ASSERT_EQ(cmd(B, VSTELLAR_CMD_ATTACH_MCAST, m), 0);
  // Hostile: a unicast GID, an IPv6 unicast GID, an RC QP, A naming B's QP, reserved bits.
  EXPECT_EQ(cmd(B, VSTELLAR_CMD_ATTACH_MCAST, mc(ub.qpn, {10, 0, 0, 1})), VSTELLAR_STATUS_BAD_FIELD);
  vstellar_cmd_mcast v6 = m;
  v6.mgid[0] = 0xfd;
  EXPECT_EQ(cmd(B, VSTELLAR_CMD_ATTACH_MCAST, v6), VSTELLAR_STATUS_BAD_FIELD);
  GQp rc = B.CreateQp();
  EXPECT_EQ(cmd(B, VSTELLAR_CMD_ATTACH_MCAST, mc(rc.qpn, {230, 9, 8, 7})), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(cmd(A, VSTELLAR_CMD_ATTACH_MCAST, m), VSTELLAR_STATUS_BAD_HANDLE);
  vstellar_cmd_mcast rsv = m;
  rsv.reserved = 1;
  EXPECT_EQ(cmd(B, VSTELLAR_CMD_ATTACH_MCAST, rsv), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(cmd(A, VSTELLAR_CMD_DETACH_MCAST, mc(ua.qpn, {230, 9, 8, 7})), VSTELLAR_STATUS_BAD_FIELD);
  // A sends to the group (not attached itself): B's QP gets it.
  Fetched(1, [&] { B.PostRecv(ub, 0x21, {B.Sge(0, 512)}); });
  Fill(A.Buf(0), 100, 6);
  vstellar_send_wqe w = UdWqe(0x11, 1, 0xffffff, 0x4242);
  w.u.ud.av.dgid[12] = 230;
  w.u.ud.av.dgid[13] = 9;
  w.u.ud.av.dgid[14] = 8;
  w.u.ud.av.dgid[15] = 7;
  A.PostSend(ua, w, {A.Sge(0, 100)});
  auto c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0x21u);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(le32toh(c->src_qp), ua.qpn);
  EXPECT_EQ(c->byte_len, VSTELLAR_GRH_BYTES + 100);
  EXPECT_EQ(std::memcmp(B.Buf(VSTELLAR_GRH_BYTES), A.Buf(0), 100), 0);
  // Detached: the next datagram to the group reaches no one.
  ASSERT_EQ(cmd(B, VSTELLAR_CMD_DETACH_MCAST, m), 0);
  EXPECT_EQ(cmd(B, VSTELLAR_CMD_DETACH_MCAST, m), VSTELLAR_STATUS_BAD_FIELD);
  Fetched(1, [&] { B.PostRecv(ub, 0x22, {B.Sge(0, 512)}); });
  A.PostSend(ua, w, {A.Sge(0, 100)});
  ASSERT_TRUE(A.Poll());
  EXPECT_FALSE(B.Poll(300));
  // The daemon serves both devices as before.
  GQp ra = A.CreateQp();
  A.Connect(ra, rc.qpn);
  B.Connect(rc, ra.qpn);
  B.PostRecv(rc, 0x30, {B.Sge(0, 64)});
  A.PostSend(ra, Wqe(VSTELLAR_WR_SEND, 0x31), {A.Sge(0, 64)});
  c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0x30u);
}

TEST_F(DataPath, MulticastGroupsThroughTheDaemon) { MulticastGroupsThroughTheDaemon(); }

TEST_F(DataPathOnTwoThreads, MulticastGroupsThroughTheDaemon) { MulticastGroupsThroughTheDaemon(); }

// Groups and a group's QP slots are the engine's, shared by
// every device; one guest could take them all (the kernel's 20 memberships
// of the group socket, the engine's 64 QPs of a group), and then every
// other guest's ATTACH_MCAST failed. Each device now has a quota of groups
// and of its QPs in one group; over it, LIMIT, and the others attach as
// before. Detaching and destroying give the quota back.
TEST_F(DataPath, MulticastIsQuotedPerDevice) {
  StartDaemon(50, {}, [](DaemonOptions& o) {
    o.mcast_groups_per_device = 4;
    o.mcast_qps_per_group = 3;
  });
  TwoGuests();
  // The device says so in its config space (what ibv_devinfo reports).
  std::vector<uint8_t> p(sizeof(ConfigHeader) + sizeof(virtio_vstellar_config), 0);
  const ConfigHeader ch{0, sizeof(virtio_vstellar_config), 0};
  std::memcpy(p.data(), &ch, sizeof(ch));
  std::vector<uint8_t> reply;
  std::string err;
  ASSERT_TRUE(fa_->Get(Request::kGetConfig, p.data(), p.size(), &reply, &err)) << err;
  ASSERT_GE(reply.size(), sizeof(virtio_vstellar_config));
  virtio_vstellar_config got;
  std::memcpy(&got, reply.data() + reply.size() - sizeof(got), sizeof(got));
  EXPECT_EQ(le16toh(got.max_mcast_grp), 4u);
  EXPECT_EQ(le16toh(got.max_mcast_qp_attach), 3u);
  Guest& A = *a_;
  Guest& B = *b_;
  uint16_t st = 0;
  std::vector<GQp> qa;
  for (int i = 0; i < 4; i++) qa.push_back(A.CreateQp(2, VSTELLAR_QPT_UD, &st));
  GQp qb = B.CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  auto mcast = [](Guest& G, uint16_t op, uint32_t qpn, uint8_t group) {
    vstellar_cmd_mcast m{};
    m.qpn = qpn;
    m.mgid[10] = m.mgid[11] = 0xff;
    m.mgid[12] = 230;
    m.mgid[13] = 24;
    m.mgid[15] = group;
    return G.Cmd(op, &m, sizeof(m), 0).status();
  };
  auto attach = [&](Guest& G, uint32_t qpn, uint8_t group) { return mcast(G, VSTELLAR_CMD_ATTACH_MCAST, qpn, group); };
  // Groups: A's fifth is refused, B still joins it; attaching again is no new join.
  for (uint8_t g = 0; g < 4; g++) EXPECT_EQ(attach(A, qa[0].qpn, g), VSTELLAR_STATUS_OK) << "group " << int(g);
  EXPECT_EQ(attach(A, qa[0].qpn, 3), VSTELLAR_STATUS_OK);
  EXPECT_EQ(attach(A, qa[1].qpn, 4), VSTELLAR_STATUS_LIMIT);
  EXPECT_EQ(attach(B, qb.qpn, 4), VSTELLAR_STATUS_OK);
  // Slots of one group: A's fourth QP in group 0 is refused, B's is taken.
  EXPECT_EQ(attach(A, qa[1].qpn, 0), VSTELLAR_STATUS_OK);
  EXPECT_EQ(attach(A, qa[2].qpn, 0), VSTELLAR_STATUS_OK);
  EXPECT_EQ(attach(A, qa[3].qpn, 0), VSTELLAR_STATUS_LIMIT);
  EXPECT_EQ(attach(B, qb.qpn, 0), VSTELLAR_STATUS_OK);
  // What a detach or a destroyed QP frees is A's again.
  EXPECT_EQ(mcast(A, VSTELLAR_CMD_DETACH_MCAST, qa[0].qpn, 3), VSTELLAR_STATUS_OK);
  EXPECT_EQ(attach(A, qa[1].qpn, 4), VSTELLAR_STATUS_OK);
  vstellar_cmd_handle h{};
  h.handle = qa[2].qpn;
  ASSERT_EQ(A.Cmd(VSTELLAR_CMD_DESTROY_QP, &h, sizeof(h), 0).status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(attach(A, qa[3].qpn, 0), VSTELLAR_STATUS_OK);
}

}  // namespace vstellard::datapath_test
