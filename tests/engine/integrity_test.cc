// Integrity mode: with a shared key, every packet carries a MAC;
// nothing forged, altered or keyed differently gets through, and the
// transport repairs what was dropped for it.
#include "engine_internal.h"  // white box: a QP's PSNs for forging
#include "sim_pair.h"

#include <sodium.h>

namespace vstellar::test {
namespace {

PairOptions Keyed(uint8_t key_byte = 7, MacAlgorithm alg = MacAlgorithm::CHACHA20_POLY1305) {
  PairOptions o;
  o.cfg.integrity = true;
  o.cfg.integrity_alg = alg;
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

// One byte changed anywhere in a packet (prefix, header or payload): the
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
  std::vector<uint8_t> v(PacketMac::kPrefixLen + wire::kMaxHeaderLen + 128);
  v.resize(PacketMac::kPrefixLen + wire::encode(b, a, v.data() + PacketMac::kPrefixLen));
  v[0] = uint8_t(MacAlgorithm::CHACHA20_POLY1305);  // the right algorithm, a made-up tag
  t.net.inject(kIpB, kIpA, v);
  t.net.run_for(2'000'000);
  Wc wc;
  EXPECT_EQ(t.a.eng->poll_cq(t.a.scq, &wc, 1), 0) << "the WRITE was completed by a forged ACK";
  EXPECT_EQ(t.a.eng->stats().bad_mac, 1u);
}

// A 4 KiB WRITE from a to b that b must refuse: it fails after its
// retries as on a dead link, and not one byte of it is placed.
void ExpectWriteRefused(Pair& t) {
  fill_random(t.a.buf.data(), 4096, 5);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 5, 0, 4096, 8192), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::RETRY_EXC_ERR);
  for (size_t i = 8192; i < 8192 + 4096; i++) ASSERT_EQ(t.b.buf[i], 0) << i;
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
    ExpectWriteRefused(t);
    const EngineStats& s = t.b.eng->stats();
    EXPECT_GT(b_keyed ? s.bad_mac : s.bad_parse, 0u) << b_keyed;
  }
}

TEST(Integrity, GmacCarriesOperationsAndDropsAlteredPackets) {
  if (!PacketMac::Usable(MacAlgorithm::AES_GMAC)) GTEST_SKIP() << "no AES-NI/PCLMUL on this CPU";
  Pair t(Keyed(7, MacAlgorithm::AES_GMAC));
  WriteAndCheck(t, 1, 100'000);
  EXPECT_EQ(t.a.eng->stats().bad_mac + t.b.eng->stats().bad_mac, 0u);
  // Any byte of a GMAC-signed packet changed: the tag no longer verifies.
  MacKey key;
  key.fill(3);
  MacSender tx{key, 1000};
  PacketMac mac(MacAlgorithm::AES_GMAC, 0x123456);
  uint8_t hdr[40] = {0x10, 3};
  std::vector<uint8_t> payload(3000, 0x5a);
  const HostSpan span{payload.data(), payload.size()};
  std::vector<uint8_t> pkt(PacketMac::kPrefixLen + sizeof(hdr) + payload.size());
  std::memcpy(pkt.data() + PacketMac::kPrefixLen, hdr, sizeof(hdr));
  std::memcpy(pkt.data() + PacketMac::kPrefixLen + sizeof(hdr), payload.data(), payload.size());
  mac.Sign(tx, hdr, sizeof(hdr), &span, 1, pkt.data());
  ASSERT_TRUE(PacketMac::Verify(MacAlgorithm::AES_GMAC, key, pkt.data(), pkt.size()));
  for (size_t i : {size_t(1), size_t(13), PacketMac::kPrefixLen + 2, pkt.size() - 1}) {
    pkt[i] ^= 0x40;
    EXPECT_FALSE(PacketMac::Verify(MacAlgorithm::AES_GMAC, key, pkt.data(), pkt.size())) << i;
    pkt[i] ^= 0x40;
  }
}

// GMAC's wire bytes do not depend on the library behind PacketMac: a tag
// PacketMac signs (header and payload in pieces, split anywhere) is the one
// libsodium's AES-256-GCM computes over the whole packet as associated data
// with nothing encrypted, and a tag libsodium computes verifies in
// PacketMac. Many keys in turn, so PacketMac's cache of keyed contexts is
// filled, evicted and reused on the way.
TEST(Integrity, GmacTagIsLibsodiumsAes256GcmTag) {
  if (!PacketMac::Usable(MacAlgorithm::AES_GMAC)) GTEST_SKIP() << "no AES-NI/PCLMUL on this CPU";
  std::mt19937 rng(26);
  std::vector<MacKey> keys(300);
  for (size_t i = 0; i < keys.size(); i++) {
    MacKey shared;
    shared.fill(uint8_t(i));
    keys[i] = PacketMac::ConnectionKey(shared, uint32_t(i), 0x456);
  }
  keys.push_back(keys[0]);  // one key again, after its context was evicted
  PacketMac mac(MacAlgorithm::AES_GMAC, 0xabcdef);
  for (size_t round = 0; round < 2 * keys.size(); round++) {
    const MacKey& key = keys[round % keys.size()];
    MacSender tx{key, PacketMac::FirstCounter() + round};
    const size_t hdr_len = 12 + rng() % 60, len = rng() % 3 == 0 ? rng() % 64 : rng() % 9000;
    std::vector<uint8_t> pkt(PacketMac::kPrefixLen + hdr_len + len);
    for (size_t i = PacketMac::kPrefixLen; i < pkt.size(); i++) pkt[i] = uint8_t(rng());
    const uint8_t* hdr = pkt.data() + PacketMac::kPrefixLen;
    // The payload in up to four pieces of any length, empty ones too.
    std::vector<HostSpan> spans;
    size_t at = 0;
    for (int i = 0; i < 3 && at < len; i++) {
      const size_t n = rng() % (len - at + 1);
      spans.push_back(HostSpan{const_cast<uint8_t*>(hdr + hdr_len + at), n});
      at += n;
    }
    spans.push_back(HostSpan{const_cast<uint8_t*>(hdr + hdr_len + at), len - at});
    mac.Sign(tx, hdr, hdr_len, spans.data(), spans.size(), pkt.data());
    ASSERT_EQ(PacketMac::AlgorithmOf(pkt.data()), MacAlgorithm::AES_GMAC);

    const uint8_t* ad = pkt.data() + PacketMac::kPrefixLen;
    const size_t ad_len = pkt.size() - PacketMac::kPrefixLen;
    uint8_t none[1] = {0}, tag[PacketMac::kTagLen];
    unsigned long long tag_len = 0;
    ASSERT_EQ(crypto_aead_aes256gcm_encrypt_detached(none, tag, &tag_len, none, 0, ad, ad_len, nullptr, pkt.data(),
                                                     key.data()),
              0);
    ASSERT_EQ(std::memcmp(tag, pkt.data() + PacketMac::kNonceLen, sizeof(tag)), 0)
        << "round " << round << ", " << hdr_len << " + " << len << " bytes in " << spans.size() << " pieces";
    EXPECT_EQ(crypto_aead_aes256gcm_decrypt_detached(none, nullptr, none, 0, pkt.data() + PacketMac::kNonceLen, ad,
                                                     ad_len, pkt.data(), key.data()),
              0);

    // The other way: libsodium's tag under a nonce of its own.
    pkt[11] ^= 0x5a;
    ASSERT_EQ(crypto_aead_aes256gcm_encrypt_detached(none, pkt.data() + PacketMac::kNonceLen, &tag_len, none, 0, ad,
                                                     ad_len, nullptr, pkt.data(), key.data()),
              0);
    EXPECT_TRUE(PacketMac::Verify(MacAlgorithm::AES_GMAC, key, pkt.data(), pkt.size())) << round;
    pkt[pkt.size() - 1] ^= 1;
    EXPECT_FALSE(PacketMac::Verify(MacAlgorithm::AES_GMAC, key, pkt.data(), pkt.size())) << round;
    EXPECT_FALSE(PacketMac::Verify(MacAlgorithm::AES_GMAC, keys[(round + 1) % keys.size()], pkt.data(),
                                   pkt.size()) &&
                 keys[(round + 1) % keys.size()] != key)
        << round;
  }
}

// Peers with the same key but different MACs: nothing gets through, and
// the receiver counts it as the other algorithm, not as a forgery.
TEST(Integrity, AlgorithmMismatchIsRejectedAndNamed) {
  if (!PacketMac::Usable(MacAlgorithm::AES_GMAC)) GTEST_SKIP() << "no AES-NI/PCLMUL on this CPU";
  PairOptions o = Keyed(7, MacAlgorithm::CHACHA20_POLY1305);
  o.cfg_b = Keyed(7, MacAlgorithm::AES_GMAC).cfg;
  o.retry_cnt = 1;
  Pair t(o);
  ExpectWriteRefused(t);
  EXPECT_GT(t.b.eng->stats().wrong_mac_alg, 0u);
  EXPECT_EQ(t.b.eng->stats().bad_mac, 0u);
}

// A UD QP on each side of `t`, ready, and a SEND of 64 bytes from A's to B's.
struct UdQps {
  Qp* ua = nullptr;
  Qp* ub = nullptr;
  Sge ss;
  SendWr w;
};

void MakeUd(Pair& t, UdQps& u) {
  QpInitAttr ia;
  ia.send_cq = t.a.scq;
  ia.recv_cq = t.a.rcq;
  ia.qp_type = QpType::UD;
  u.ua = t.a.eng->create_qp(t.a.pd, ia);
  ia.send_cq = t.b.scq;
  ia.recv_cq = t.b.rcq;
  u.ub = t.b.eng->create_qp(t.b.pd, ia);
  ASSERT_TRUE(u.ua && u.ub);
  for (auto [s, q] : {std::pair{&t.a, u.ua}, std::pair{&t.b, u.ub}}) {
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
  u.ss = Sge{t.a.addr(0), 64, t.a.mr->lkey()};
  SendWr& w = u.w;
  w.wr_id = 2;
  w.opcode = WrOpcode::SEND;
  w.sg_list = &u.ss;
  w.num_sge = 1;
  w.send_flags = SEND_SIGNALED;
  w.ud.peer = Endpoint{kIpB, 4791};
  w.ud.remote_qpn = u.ub->qpn();
  w.ud.remote_qkey = 0x11;
  w.ud.sgid[10] = w.ud.sgid[11] = 0xff;
  w.ud.dgid = w.ud.sgid;
  for (int i = 0; i < 4; i++) {
    w.ud.sgid[12 + i] = uint8_t(kIpA >> (24 - 8 * i));
    w.ud.dgid[12 + i] = uint8_t(kIpB >> (24 - 8 * i));
  }
}

void PostUdRecv(Pair& t, Qp* q, uint64_t wr_id) {
  Sge rs{t.b.addr(wr_id * 1024), 1024, t.b.mr->lkey()};
  RecvWr r;
  r.wr_id = wr_id;
  r.sg_list = &rs;
  r.num_sge = 1;
  ASSERT_EQ(t.b.eng->post_recv(q, r), 0);
}

// The opcode of a sealed packet, behind its prefix.
wire::Op SealedOp(const std::vector<uint8_t>& bytes) {
  return bytes.size() > PacketMac::kPrefixLen + 1 ? wire::Op(bytes[PacketMac::kPrefixLen + 1]) : wire::Op(0);
}

// Datagrams (UD, GSI) carry the fabric-wide datagram MAC.
TEST(Integrity, DatagramsAreSignedToo) {
  PairOptions o = Keyed();
  o.connect = false;
  Pair t(o);
  UdQps u;
  MakeUd(t, u);
  PostUdRecv(t, u.ub, 0);
  fill_random(t.a.buf.data(), 64, 6);
  ASSERT_EQ(t.a.eng->post_send(u.ua, u.w), 0);
  auto wc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.b.buf.data() + 40, t.a.buf.data(), 64), 0);
  EXPECT_EQ(t.b.eng->stats().bad_mac, 0u);
}

// A sealed packet captured and sent again verified as well as
// the first time. A READ request replayed 10 s later was executed again
// (the responder re-reads a READ it executed); now its counter is one B has
// seen, and nothing goes back.
TEST(Integrity, ReplayedReadRequestIsDropped) {
  Pair t(Keyed());
  std::vector<uint8_t> captured;
  uint32_t responses = 0;
  t.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>& bytes) {
    if (from == kIpA && SealedOp(bytes) == wire::Op::READ_REQ && captured.empty()) captured = bytes;
    if (from == kIpB && SealedOp(bytes) == wire::Op::READ_RESP) responses++;
    return true;
  };
  fill_random(t.b.buf.data(), 8192, 7);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 1, 0, 8192, 0), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  ASSERT_FALSE(captured.empty());
  const uint32_t answered = responses;
  t.net.run_for(10'000'000'000ull);
  t.net.inject(kIpA, kIpB, captured);
  t.net.run_for(2'000'000);
  EXPECT_EQ(responses, answered) << "the replayed READ was executed again";
  EXPECT_EQ(t.b.eng->stats().replayed, 1u);
  EXPECT_EQ(t.b.eng->stats().bad_mac, 0u);
}

// ... and a replayed datagram is not delivered a second time.
TEST(Integrity, ReplayedDatagramIsDropped) {
  PairOptions o = Keyed();
  o.connect = false;
  Pair t(o);
  UdQps u;
  MakeUd(t, u);
  PostUdRecv(t, u.ub, 0);
  PostUdRecv(t, u.ub, 1);
  std::vector<uint8_t> captured;
  t.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>& bytes) {
    if (from == kIpA && SealedOp(bytes) == wire::Op::UD_SEND) captured = bytes;
    return true;
  };
  ASSERT_EQ(t.a.eng->post_send(u.ua, u.w), 0);
  ASSERT_EQ(t.wait(t.b, t.b.rcq, 1).size(), 1u);
  ASSERT_FALSE(captured.empty());
  t.net.run_for(10'000'000'000ull);
  t.net.inject(kIpA, kIpB, captured);
  t.net.run_for(2'000'000);
  Wc wc;
  EXPECT_EQ(t.b.eng->poll_cq(t.b.rcq, &wc, 1), 0) << "the replayed datagram was delivered again";
  EXPECT_EQ(t.b.eng->stats().replayed, 1u);
  // The sender's next datagram still gets through.
  ASSERT_EQ(t.a.eng->post_send(u.ua, u.w), 0);
  EXPECT_EQ(t.wait(t.b, t.b.rcq, 1).size(), 1u);
}

// Packets reordered within the window all get through; what the network
// duplicated, and only that, is refused as a replay.
TEST(Integrity, ReorderedAndDuplicatedPacketsGetThroughOnce) {
  PairOptions o = Keyed();
  o.cfg.ack_every = 4;
  Pair t(o);
  t.net.impairment.reorder = 0.2;
  t.net.impairment.jitter_ns = 20'000;
  t.net.impairment.dup = 0.05;
  WriteAndCheck(t, 8, 512 << 10);
  fill_random(t.b.buf.data() + 600000, 300'000, 9);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 9, 200000, 300'000, 600000), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data() + 200000, t.b.buf.data() + 600000, 300'000), 0);
  // The copies still on their way (the last answers' duplicates) arrive.
  t.net.run_for(10'000'000);
  const uint64_t replayed = t.a.eng->stats().replayed + t.b.eng->stats().replayed;
  EXPECT_GT(t.net.stats.reordered, 0u);
  EXPECT_GT(replayed, 0u);
  EXPECT_EQ(replayed, t.net.stats.duplicated);
  EXPECT_EQ(t.a.eng->stats().bad_mac + t.b.eng->stats().bad_mac, 0u);
}

TEST(Integrity, ReplayWindowSlides) {
  ReplayWindow w;
  EXPECT_TRUE(w.Admit(5000));
  EXPECT_FALSE(w.Admit(5000));
  EXPECT_TRUE(w.Admit(5000 - 1023));
  EXPECT_FALSE(w.Admit(5000 - 1023));
  EXPECT_FALSE(w.Admit(5000 - 1024)) << "older than the window";
  EXPECT_TRUE(w.Admit(5002));
  EXPECT_TRUE(w.Admit(5001));
  EXPECT_FALSE(w.Admit(5001));
  EXPECT_TRUE(w.Admit(5000 + 1023));  // slides: [5000, 6023]
  EXPECT_FALSE(w.Admit(5001));
  EXPECT_TRUE(w.Admit(5003));
  EXPECT_FALSE(w.Admit(4999));
  EXPECT_TRUE(w.Admit(1'000'000));  // a jump past the window
  EXPECT_FALSE(w.Admit(6023));
  EXPECT_TRUE(w.Admit(999'999));
  EXPECT_FALSE(w.Admit(999'999));
}

TEST(Integrity, DatagramSendersAreBoundedAndEvictedOldestFirst) {
  DatagramReplay r;
  for (uint32_t q = 0; q < DatagramReplay::kMaxSources; q++) ASSERT_TRUE(r.Admit(kIpA, q, 1, 100));
  EXPECT_FALSE(r.Admit(kIpA, 0, 1, 100));  // heard again: now the most recent
  EXPECT_TRUE(r.Admit(kIpA, 5, 2, 100)) << "another engine's salt is another sender";
  EXPECT_EQ(r.sources(), DatagramReplay::kMaxSources);
  EXPECT_FALSE(r.Admit(kIpA, 0, 1, 100)) << "the most recent sender was evicted";
  EXPECT_TRUE(r.Admit(kIpA, 1, 1, 100)) << "the least recent sender is forgotten";
}

}  // namespace
}  // namespace vstellar::test
