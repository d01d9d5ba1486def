// Bad wire packets: dropped or NAKed, never harmful.
#include "engine_internal.h"  // white box: the QP's PSN state
#include "sim_pair.h"

namespace vstellar::test {
namespace {

std::vector<uint8_t> write_pkt(Pair& t, uint32_t psn, uint64_t va, uint32_t rkey, uint32_t len,
                               uint32_t dst_qpn = 0) {
  wire::Base b;
  b.op = wire::Op::WRITE;
  b.flags = wire::F_FIRST | wire::F_LAST;
  b.dst_qpn = dst_qpn ? dst_qpn : t.b.qp->qpn();
  b.src_qpn = t.a.qp->qpn();
  b.psn = psn;
  b.payload_len = uint16_t(len);
  wire::DataExt e;
  e.va = va;
  e.rkey = rkey;
  e.msg_len = len;
  std::vector<uint8_t> v(wire::kMaxHeaderLen + len, 0xAB);
  size_t hl = wire::encode(b, e, v.data());
  v.resize(hl + len);
  std::fill(v.begin() + hl, v.end(), 0xAB);
  return v;
}

bool untouched(const std::vector<uint8_t>& v) {
  for (uint8_t c : v)
    if (c == 0xAB) return false;
  return true;
}

// A normal WRITE still works: the engine was not harmed.
void still_works(Pair& t) {
  fill_random(t.a.buf.data() + 200000, 5000, 77);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 42, 200000, 5000, 300000), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data() + 200000, t.b.buf.data() + 300000, 5000), 0);
}

TEST(BadPackets, TruncatedUnknownQpnWrongPeer) {
  Pair t;
  uint32_t epsn = impl(t.b.qp)->epsn;
  auto good = write_pkt(t, epsn, t.b.addr(0), t.b.mr->rkey(), 100);
  for (size_t n = 0; n < good.size(); n++) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + n);
    t.net.inject(kIpA, kIpB, cut);
  }
  t.net.inject(kIpA, kIpB, write_pkt(t, epsn, t.b.addr(0), t.b.mr->rkey(), 100, 0x777));
  t.net.inject(0x0a000099, kIpB, good);  // right QPN, wrong sender
  auto bad_src = good;
  bad_src[8 + 3] ^= 1;  // src_qpn does not match the connection
  t.net.inject(kIpA, kIpB, bad_src);
  t.net.run_for(1'000'000);
  const EngineStats& s = t.b.eng->stats();
  EXPECT_EQ(s.bad_parse, good.size());
  EXPECT_EQ(s.bad_qpn, 1u);
  EXPECT_EQ(s.bad_peer, 2u);
  EXPECT_TRUE(untouched(t.b.buf));
  EXPECT_EQ(t.b.qp->state(), QpState::RTS);
  still_works(t);
}

TEST(BadPackets, StaleAndFuturePsnAreDropped) {
  Pair t;
  still_works(t);  // move the PSNs on
  uint32_t epsn = impl(t.b.qp)->epsn;
  t.net.inject(kIpA, kIpB, write_pkt(t, epsn - 1, t.b.addr(0), t.b.mr->rkey(), 64));    // stale
  t.net.inject(kIpA, kIpB, write_pkt(t, epsn - 5000, t.b.addr(0), t.b.mr->rkey(), 64)); // very stale
  t.net.inject(kIpA, kIpB, write_pkt(t, epsn + 100000, t.b.addr(0), t.b.mr->rkey(), 64));  // beyond window
  t.net.run_for(1'000'000);
  EXPECT_EQ(t.b.eng->stats().dup_pkts, 2u);
  EXPECT_EQ(t.b.eng->stats().out_of_window, 1u);
  for (int i = 0; i < 64; i++) ASSERT_NE(t.b.buf[i], 0xAB);
  EXPECT_EQ(t.b.qp->state(), QpState::RTS);
  still_works(t);
}

TEST(BadPackets, OutOfBoundsRkeyOrAddressIsNaked) {
  for (int which = 0; which < 3; which++) {
    Pair t;
    // A small MR in the middle of b's buffer; the forged WRITE aims past it.
    Mr* small = t.b.eng->reg_mr(t.b.pd, t.b.addr(4096), 4096,
                                ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE, std::make_shared<HostMemory>());
    uint64_t va = which == 0 ? t.b.addr(8192 - 10) : which == 1 ? t.b.addr(0) : t.b.addr(4096);
    uint32_t rkey = which == 2 ? small->rkey() + 0x100 : small->rkey();
    uint32_t epsn = impl(t.b.qp)->epsn;
    t.net.inject(kIpA, kIpB, write_pkt(t, epsn, va, rkey, 64));
    t.net.run_for(1'000'000);
    EXPECT_TRUE(untouched(t.b.buf)) << which;
    EXPECT_EQ(t.b.eng->stats().naks_sent, 1u) << which;
    // IB: a remote access violation is fatal for the responder's QP.
    EXPECT_EQ(t.b.qp->state(), QpState::ERR);
  }
}

TEST(BadPackets, ForgedResponsesAreIgnored) {
  Pair t;
  // An ACK for PSNs never sent.
  wire::Base b;
  b.op = wire::Op::ACK;
  b.dst_qpn = t.a.qp->qpn();
  b.src_qpn = t.b.qp->qpn();
  wire::AckExt a;
  a.cum_psn = impl(t.a.qp)->snd_nxt + 10;
  std::vector<uint8_t> v(wire::kMaxHeaderLen + 128);
  v.resize(wire::encode(b, a, v.data()));
  t.net.inject(kIpB, kIpA, v);
  // A READ response nobody asked for, and an atomic response.
  b.op = wire::Op::READ_RESP;
  b.psn = impl(t.a.qp)->snd_nxt;
  b.payload_len = 16;
  wire::ReadRespExt r;
  std::vector<uint8_t> w(wire::kMaxHeaderLen + 16, 0xAB);
  size_t hl = wire::encode(b, r, w.data());
  w.resize(hl + 16);
  t.net.inject(kIpB, kIpA, w);
  b.op = wire::Op::ATOMIC_RESP;
  b.payload_len = 0;
  std::vector<uint8_t> x(wire::kMaxHeaderLen);
  x.resize(wire::encode(b, wire::AtomicRespExt{0xABABABABABABABABull}, x.data()));
  t.net.inject(kIpB, kIpA, x);
  t.net.run_for(1'000'000);
  EXPECT_EQ(t.a.eng->stats().bad_ack, 1u);
  EXPECT_EQ(t.a.eng->stats().dup_pkts, 2u);
  Wc wc;
  EXPECT_EQ(t.a.eng->poll_cq(t.a.scq, &wc, 1), 0);
  EXPECT_TRUE(untouched(t.a.buf));
  still_works(t);
}

TEST(BadPackets, RandomGarbageNeverCrashes) {
  Pair t;
  std::mt19937_64 rng(5);
  auto good = write_pkt(t, impl(t.b.qp)->epsn, t.b.addr(0), t.b.mr->rkey(), 200);
  for (int i = 0; i < 3000; i++) {
    std::vector<uint8_t> v = good;
    if (i % 3 == 0) {
      v.resize(rng() % 300);
      for (auto& c : v) c = uint8_t(rng());
      if (v.size() > 1) v[0] = 0x10;  // get past the version check
      if (v.size() > 8) {            // and to the right QP
        uint32_t q = t.b.qp->qpn();
        v[4] = uint8_t(q >> 24); v[5] = uint8_t(q >> 16); v[6] = uint8_t(q >> 8); v[7] = uint8_t(q);
      }
    } else {
      for (int k = 0; k < 4; k++) v[rng() % 52] = uint8_t(rng());  // corrupt header fields
    }
    t.net.inject(kIpA, kIpB, v);
    if (i % 100 == 0) t.net.run_for(100'000);
  }
  t.net.run_for(1'000'000);
  SUCCEED();  // no crash, no sanitizer report; the QP may legitimately be in ERR
}

}  // namespace
}  // namespace vstellar::test
