// The RoCE v2 codec (vstellar/roce_wire.h) against packets Linux's rxe
// wrote: two Debian 12 guests with rxe ran ibv_{rc,uc,ud}_pingpong,
// perftest's WRITE, READ, atomic and SEND tests and rping (rdma_cm's MADs
// on QP 1), over IPv4 and IPv6, and tcpdump recorded UDP port 4791 between
// them (tools/roce/capture-rxe; data/rxe-rocev2.pcap). Every packet must
// parse, its ICRC must hold, and building it again from the parsed fields
// must give rxe's bytes exactly.
#include <gtest/gtest.h>
#include <pcap/pcap.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "vstellar/roce_wire.h"

namespace vstellar::roce {
namespace {

struct Frame {
  IpFields ip;
  std::vector<uint8_t> udp_payload;
};

uint16_t be16(const uint8_t* p) { return uint16_t(p[0] << 8 | p[1]); }

// The RoCE v2 datagrams of the capture, with the header fields the ICRC
// covers. Ethernet only (tcpdump on a Linux bridge), no VLAN tags.
std::vector<Frame> rxe_frames() {
  char err[PCAP_ERRBUF_SIZE];
  pcap_t* pc = pcap_open_offline(RXE_CAPTURE, err);
  if (!pc) {
    ADD_FAILURE() << RXE_CAPTURE << ": " << err;
    return {};
  }
  EXPECT_EQ(pcap_datalink(pc), DLT_EN10MB);
  std::vector<Frame> frames;
  pcap_pkthdr* h;
  const u_char* d;
  while (pcap_next_ex(pc, &h, &d) == 1) {
    EXPECT_EQ(h->caplen, h->len) << "the capture must hold whole packets";
    if (h->caplen < 14) continue;
    const uint16_t ethertype = be16(d + 12);
    const uint8_t* l3 = d + 14;
    const size_t l3len = h->caplen - 14;
    Frame f;
    const uint8_t* udp;
    if (ethertype == 0x0800 && l3len >= 20 && l3[9] == 17) {
      const size_t ihl = (l3[0] & 0x0f) * 4u;
      f.ip.src = IpAddr(uint32_t(be16(l3 + 12)) << 16 | be16(l3 + 14));
      f.ip.dst = IpAddr(uint32_t(be16(l3 + 16)) << 16 | be16(l3 + 18));
      f.ip.ipv4_id = be16(l3 + 4);
      f.ip.ipv4_frag = be16(l3 + 6);
      udp = l3 + ihl;
    } else if (ethertype == 0x86dd && l3len >= 40 && l3[6] == 17) {
      f.ip.src = IpAddr::from_bytes(l3 + 8);
      f.ip.dst = IpAddr::from_bytes(l3 + 24);
      udp = l3 + 40;
    } else {
      continue;
    }
    const size_t udp_len = be16(udp + 4);
    if (be16(udp + 2) != kUdpPort || udp_len < 8 || udp + udp_len > d + h->caplen) continue;
    f.ip.src_port = be16(udp);
    f.ip.dst_port = be16(udp + 2);
    f.udp_payload.assign(udp + 8, udp + udp_len);
    frames.push_back(std::move(f));
  }
  pcap_close(pc);
  return frames;
}

const std::vector<Frame>& frames() {
  static const std::vector<Frame> f = rxe_frames();
  return f;
}

TEST(RoceWire, EveryPacketRxeWroteParsesWithItsIcrc) {
  ASSERT_GE(frames().size(), 200u);
  size_t v4 = 0, v6 = 0;
  for (size_t i = 0; i < frames().size(); i++) {
    const Frame& f = frames()[i];
    Packet p;
    ParseError e = parse(f.udp_payload.data(), f.udp_payload.size(), f.ip, &p);
    EXPECT_EQ(e, ParseError::NONE) << "frame " << i << ": " << to_string(e) << ", opcode "
                                   << int(f.udp_payload[0]);
    (f.ip.src.is_v4() ? v4 : v6)++;
  }
  EXPECT_GT(v4, 0u);
  EXPECT_GT(v6, 0u);
}

TEST(RoceWire, BuildingFromTheParsedFieldsGivesRxesBytes) {
  for (size_t i = 0; i < frames().size(); i++) {
    const Frame& f = frames()[i];
    Packet p;
    ASSERT_EQ(parse(f.udp_payload.data(), f.udp_payload.size(), f.ip, &p), ParseError::NONE);
    std::vector<uint8_t> out(f.udp_payload.size() + 64);
    const size_t n = build(p, f.ip, out.data(), out.size());
    ASSERT_EQ(n, f.udp_payload.size()) << "frame " << i;
    out.resize(n);
    EXPECT_EQ(out, f.udp_payload) << "frame " << i << ", " << opcode_info(p.bth.opcode).name;
  }
}

TEST(RoceWire, TheCaptureCoversTheOpcodesItShould) {
  std::set<uint8_t> seen;
  for (const Frame& f : frames()) seen.insert(f.udp_payload[0]);
  for (uint8_t op : {RC_SEND_FIRST, RC_SEND_MIDDLE, RC_SEND_LAST, RC_SEND_ONLY, RC_WRITE_FIRST, RC_WRITE_MIDDLE,
                     RC_WRITE_LAST, RC_WRITE_ONLY, RC_READ_REQUEST, RC_READ_RESPONSE_FIRST,
                     RC_READ_RESPONSE_MIDDLE, RC_READ_RESPONSE_LAST, RC_READ_RESPONSE_ONLY, RC_ACK,
                     RC_ATOMIC_ACK, RC_CMP_SWAP, RC_FETCH_ADD, UC_SEND_FIRST, UC_SEND_MIDDLE, UC_SEND_LAST,
                     UD_SEND_ONLY})
    EXPECT_TRUE(seen.count(op)) << opcode_info(op).name;
}

// The fields say what the programs did (tools/roce/capture-rxe's list).
TEST(RoceWire, TheFieldsSayWhatTheProgramsDid) {
  std::map<uint8_t, std::vector<Packet>> by_op;
  for (const Frame& f : frames()) {
    Packet p;
    ASSERT_EQ(parse(f.udp_payload.data(), f.udp_payload.size(), f.ip, &p), ParseError::NONE);
    EXPECT_EQ(p.bth.pkey, kDefaultPkey);
    by_op[p.bth.opcode].push_back(p);
  }
  // ibv_rc_pingpong -s 3000 -m 1024: 1024 + 1024 + 952.
  for (const Packet& p : by_op[RC_SEND_FIRST]) EXPECT_EQ(p.payload_len, 1024u);
  for (const Packet& p : by_op[RC_SEND_MIDDLE]) EXPECT_EQ(p.payload_len, 1024u);
  for (const Packet& p : by_op[RC_SEND_LAST]) EXPECT_EQ(p.payload_len, 3000u - 2048u);
  // ib_write_bw -s 2500: the first packet's RETH names the whole message.
  for (const Packet& p : by_op[RC_WRITE_FIRST]) {
    EXPECT_EQ(p.reth.dma_len, 2500u);
    EXPECT_EQ(p.payload_len, 1024u);
    EXPECT_NE(p.reth.rkey, 0u);
  }
  std::set<uint32_t> read_lens;
  for (const Packet& p : by_op[RC_READ_REQUEST]) {
    read_lens.insert(p.reth.dma_len);
    EXPECT_EQ(p.payload_len, 0u);
  }
  EXPECT_EQ(read_lens, (std::set<uint32_t>{64, 2500}));
  for (const Packet& p : by_op[RC_READ_RESPONSE_ONLY]) EXPECT_EQ(p.payload_len, 64u);
  for (uint8_t op : {RC_ACK, RC_READ_RESPONSE_FIRST, RC_READ_RESPONSE_LAST, RC_READ_RESPONSE_ONLY})
    for (const Packet& p : by_op[op]) EXPECT_EQ(p.aeth.syndrome >> 5, AETH_ACK) << opcode_info(op).name;
  // Atomics are 8 bytes at an 8-byte aligned address.
  for (uint8_t op : {RC_CMP_SWAP, RC_FETCH_ADD})
    for (const Packet& p : by_op[op]) EXPECT_EQ(p.atomic.va % 8, 0u);
  // UD: ibv_ud_pingpong's Q_Key, and rping's connection management on
  // the GSI QP with the well-known Q_Key.
  std::set<uint32_t> qkeys;
  size_t to_gsi = 0;
  for (const Packet& p : by_op[UD_SEND_ONLY]) {
    qkeys.insert(p.deth.qkey);
    if (p.bth.dest_qp == 1) {
      to_gsi++;
      EXPECT_EQ(p.deth.qkey, kGsiQkey);
      EXPECT_EQ(p.payload_len, 256u);  // a MAD
    }
  }
  EXPECT_GE(to_gsi, 3u);  // REQ, REP, RTU at least
  EXPECT_TRUE(qkeys.count(0x11111111)) << "ibv_ud_pingpong's Q_Key";
}

// The ICRC leaves out exactly the fields routers may change.
TEST(RoceWire, TheIcrcLeavesOutTheVariantFieldsOnly) {
  const Frame* v4 = nullptr;
  for (const Frame& f : frames())
    if (f.ip.src.is_v4()) {
      v4 = &f;
      break;
    }
  ASSERT_NE(v4, nullptr);
  std::vector<uint8_t> b = v4->udp_payload;
  Packet p;
  b[4] ^= 0xc0;  // FECN and BECN: set by switches on the way
  EXPECT_EQ(parse(b.data(), b.size(), v4->ip, &p), ParseError::NONE);
  EXPECT_TRUE(p.bth.fecn || p.bth.becn);
  IpFields ip = v4->ip;
  ip.ipv4_id ^= 1;  // the identification is covered
  EXPECT_EQ(parse(v4->udp_payload.data(), v4->udp_payload.size(), ip, &p), ParseError::ICRC);
  ip = v4->ip;
  ip.src_port ^= 1;  // so are the ports and addresses
  EXPECT_EQ(parse(v4->udp_payload.data(), v4->udp_payload.size(), ip, &p), ParseError::ICRC);
  ip = v4->ip;
  ip.dst = IpAddr(ip.dst.v4() ^ 1);
  EXPECT_EQ(parse(v4->udp_payload.data(), v4->udp_payload.size(), ip, &p), ParseError::ICRC);
}

// Any other bit flipped, and any packet cut short, is refused.
TEST(RoceWire, AFlippedBitOrAShortPacketIsRefused) {
  std::set<uint8_t> done;
  for (const Frame& f : frames()) {
    if (!done.insert(f.udp_payload[0]).second) continue;  // one packet per opcode
    Packet p;
    for (size_t i = 0; i < f.udp_payload.size(); i++) {
      if (i == 4) continue;  // FECN, BECN, reserved: variant
      for (int bit = 0; bit < 8; bit++) {
        std::vector<uint8_t> b = f.udp_payload;
        b[i] ^= uint8_t(1 << bit);
        EXPECT_NE(parse(b.data(), b.size(), f.ip, &p), ParseError::NONE)
            << opcode_info(f.udp_payload[0]).name << ", byte " << i << " bit " << bit;
      }
    }
    for (size_t n = 0; n < f.udp_payload.size(); n++) {
      std::vector<uint8_t> b(f.udp_payload.begin(), f.udp_payload.begin() + long(n));  // exact size for ASan
      EXPECT_NE(parse(b.data(), b.size(), f.ip, &p), ParseError::NONE) << n;
    }
  }
  EXPECT_GE(done.size(), 20u);
}

// Opcodes the capture lacks (perftest 4.5 sends no immediate data, no
// program here sends with invalidate): built and parsed back.
TEST(RoceWire, ImmediateAndInvalidateRoundTrip) {
  IpFields ip;
  ip.src = frames().back().ip.src;
  ip.dst = frames().back().ip.dst;
  ip.src_port = 50000;
  const uint8_t data[7] = {1, 2, 3, 4, 5, 6, 7};
  for (uint8_t op : {RC_SEND_ONLY_IMM, RC_WRITE_ONLY_IMM, RC_SEND_LAST_INV, UD_SEND_ONLY_IMM, UC_WRITE_LAST_IMM}) {
    Packet p;
    p.bth.opcode = op;
    p.bth.dest_qp = 0x123456;
    p.bth.psn = 0xabcdef;
    p.bth.ack_req = true;
    p.reth = {0x1122334455667788ull, 0xdeadbeef, 7};
    p.deth = {0x11111111, 0x654321};
    p.imm = 0xcafef00d;
    p.invalidate_rkey = 0x42;
    p.payload = data;
    p.payload_len = sizeof(data);
    uint8_t buf[128];
    const size_t n = build(p, ip, buf, sizeof(buf));
    ASSERT_EQ(n, packet_len(p));
    ASSERT_EQ(n % 4, 0u);
    Packet q;
    ASSERT_EQ(parse(buf, n, ip, &q), ParseError::NONE) << opcode_info(op).name;
    const uint16_t h = opcode_info(op).headers;
    EXPECT_EQ(q.bth.pad, 1);
    EXPECT_EQ(q.bth.dest_qp, 0x123456u);
    EXPECT_EQ(q.bth.psn, 0xabcdefu);
    EXPECT_TRUE(q.bth.ack_req);
    EXPECT_EQ(q.payload_len, sizeof(data));
    EXPECT_EQ(std::memcmp(q.payload, data, sizeof(data)), 0);
    if (h & H_IMM) {
      EXPECT_EQ(q.imm, 0xcafef00du);
    }
    if (h & H_IETH) {
      EXPECT_EQ(q.invalidate_rkey, 0x42u);
    }
    if (h & H_RETH) {
      EXPECT_EQ(q.reth.va, 0x1122334455667788ull);
    }
    if (h & H_DETH) {
      EXPECT_EQ(q.deth.src_qp, 0x654321u);
    }
  }
  Packet bad;
  bad.bth.opcode = 0x15;  // not an opcode spoken here
  uint8_t buf[64];
  EXPECT_EQ(build(bad, ip, buf, sizeof(buf)), 0u);
}

}  // namespace
}  // namespace vstellar::roce
