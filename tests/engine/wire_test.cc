#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "vstellar/wire.h"

using namespace vstellar::wire;

TEST(Wire, DataRoundTripIsBigEndian) {
  Base b;
  b.op = Op::WRITE_IMM;
  b.flags = F_FIRST | F_LAST;
  b.dst_qpn = 0x123456;
  b.src_qpn = 0x11;
  b.psn = 0xdeadbeef;
  b.path = 77;
  b.payload_len = 3;
  b.ts = 42;
  DataExt e;
  e.va = 0x1122334455667788ull;
  e.rkey = 0xabcd;
  e.msg_off = 4096;
  e.msg_len = 4099;
  e.rsn = 9;
  e.imm = 0xcafef00d;
  uint8_t buf[kMaxHeaderLen + 3];
  size_t hl = encode(b, e, buf);
  ASSERT_EQ(hl, kBaseLen + 32);
  EXPECT_EQ(buf[0], 0x10);
  EXPECT_EQ(buf[1], uint8_t(Op::WRITE_IMM));
  EXPECT_EQ(buf[12], 0xde);  // PSN, big-endian
  EXPECT_EQ(buf[15], 0xef);
  buf[hl] = 1; buf[hl + 1] = 2; buf[hl + 2] = 3;
  Packet p;
  ASSERT_EQ(parse(buf, hl + 3, p), ParseError::OK);
  EXPECT_EQ(p.base.op, Op::WRITE_IMM);
  EXPECT_EQ(p.base.psn, 0xdeadbeefu);
  EXPECT_EQ(p.base.path, 77);
  EXPECT_EQ(p.data.va, e.va);
  EXPECT_EQ(p.data.imm, e.imm);
  EXPECT_EQ(p.data.msg_len, 4099u);
  EXPECT_EQ(p.payload_len, 3u);
  EXPECT_EQ(p.payload[2], 3);
}

TEST(Wire, AckWithSack) {
  Base b;
  b.op = Op::ACK;
  AckExt a;
  a.cum_psn = 100;
  a.sack_base = 128;
  a.sack_words = 2;
  a.sack[0] = 0x8000000000000001ull;
  a.sack[1] = 5;
  a.syndrome = Syndrome::RNR_NAK;
  a.rnr_us = 640;
  uint8_t buf[kMaxHeaderLen + 8 * kMaxSackWords];
  size_t hl = encode(b, a, buf);
  EXPECT_EQ(hl, kBaseLen + 28 + 16);
  Packet p;
  ASSERT_EQ(parse(buf, hl, p), ParseError::OK);
  EXPECT_EQ(p.ack.cum_psn, 100u);
  EXPECT_EQ(p.ack.sack_words, 2);
  EXPECT_EQ(p.ack.sack[0], a.sack[0]);
  EXPECT_EQ(p.ack.sack[1], 5u);
  EXPECT_EQ(p.ack.syndrome, Syndrome::RNR_NAK);
  EXPECT_EQ(p.ack.rnr_us, 640u);
}

TEST(Wire, RejectsMalformed) {
  Base b;
  b.op = Op::READ_REQ;
  ReadReqExt e;
  uint8_t buf[kMaxHeaderLen];
  size_t hl = encode(b, e, buf);
  Packet p;
  for (size_t n = 0; n < hl; n++) EXPECT_NE(parse(buf, n, p), ParseError::OK) << n;
  EXPECT_EQ(parse(buf, hl, p), ParseError::OK);
  std::vector<uint8_t> v(buf, buf + hl);
  v.push_back(0);  // payload_len says 0
  EXPECT_EQ(parse(v.data(), v.size(), p), ParseError::BAD_LENGTH);
  v.pop_back();
  v[0] = 0x20;
  EXPECT_EQ(parse(v.data(), v.size(), p), ParseError::BAD_VERSION);
  v[0] = 0x10;
  v[1] = 99;
  EXPECT_EQ(parse(v.data(), v.size(), p), ParseError::BAD_OPCODE);
  // An ACK that claims more SACK words than it carries.
  Base ab;
  ab.op = Op::ACK;
  AckExt a;
  a.sack_words = 3;
  uint8_t abuf[kMaxHeaderLen + 8 * kMaxSackWords];
  size_t al = encode(ab, a, abuf);
  EXPECT_EQ(parse(abuf, al - 8, p), ParseError::TRUNCATED);
  abuf[kBaseLen + 8] = 200;  // sack_words beyond the maximum
  EXPECT_EQ(parse(abuf, al, p), ParseError::BAD_LENGTH);
}

// The route key names the engine that owns a datagram from its bytes: the
// destination QPN, QP 1's GID, or a multicast group every engine gets; with
// the integrity prefix in front, the same fields behind it.
TEST(Wire, RouteKeyFromTheBytes) {
  for (bool integrity : {false, true}) {
    const size_t off = integrity ? kIntegrityPrefixLen : 0;
    EXPECT_EQ(dst_qpn_offset(integrity), off + 4);
    Base b;
    b.op = Op::WRITE;
    b.dst_qpn = 0x123457;
    std::vector<uint8_t> v(off + kMaxHeaderLen);
    v.resize(off + encode(b, DataExt{}, v.data() + off));
    RouteKey k = route_key(v.data(), v.size(), integrity);
    EXPECT_EQ(k.kind, RouteKey::Kind::kQpn);
    EXPECT_EQ(k.dst_qpn, 0x123457u);
    EXPECT_EQ(route_key(v.data(), off + kBaseLen - 1, integrity).kind, RouteKey::Kind::kAny);

    UdExt ud;
    const uint8_t dgid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2};
    std::copy(dgid, dgid + 16, ud.dgid);
    b.op = Op::UD_SEND;
    b.dst_qpn = 1;
    v.assign(off + kMaxHeaderLen, 0);
    v.resize(off + encode(b, ud, v.data() + off));
    k = route_key(v.data(), v.size(), integrity);
    EXPECT_EQ(k.kind, RouteKey::Kind::kGsi);
    EXPECT_TRUE(std::equal(dgid, dgid + 16, k.dgid.begin()));
    EXPECT_EQ(route_key(v.data(), v.size() - 1, integrity).kind, RouteKey::Kind::kAny);

    ud.dgid[12] = 239;  // 239.0.0.2: a group
    v.assign(off + kMaxHeaderLen, 0);
    v.resize(off + encode(b, ud, v.data() + off));
    EXPECT_EQ(route_key(v.data(), v.size(), integrity).kind, RouteKey::Kind::kMulticast);
    EXPECT_TRUE(is_multicast_gid(ud.dgid));
    EXPECT_FALSE(is_multicast_gid(dgid));
  }
}
