// RoCE v2 codec: see vstellar/roce_wire.h.
#include "vstellar/roce_wire.h"

#include <zlib.h>

#include <array>
#include <cstring>

namespace vstellar::roce {
namespace {

constexpr uint16_t kSend = H_PAYLOAD;
constexpr uint16_t kSendImm = H_PAYLOAD | H_IMM;
constexpr uint16_t kSendInv = H_PAYLOAD | H_IETH;
constexpr uint16_t kWriteFirst = H_RETH | H_PAYLOAD;
constexpr uint16_t kWriteImmOnly = H_RETH | H_IMM | H_PAYLOAD;
constexpr uint16_t kReadResp = H_AETH | H_PAYLOAD;

// IBTA vol. 1, table 38 (opcodes) and 9.2-9.5 (which headers each carries).
std::array<OpcodeInfo, 256> make_table() {
  std::array<OpcodeInfo, 256> t{};
  auto set = [&t](uint8_t op, const char* name, uint16_t headers) { t[op] = {name, headers}; };
  set(RC_SEND_FIRST, "RC SEND First", kSend);
  set(RC_SEND_MIDDLE, "RC SEND Middle", kSend);
  set(RC_SEND_LAST, "RC SEND Last", kSend);
  set(RC_SEND_LAST_IMM, "RC SEND Last with Immediate", kSendImm);
  set(RC_SEND_ONLY, "RC SEND Only", kSend);
  set(RC_SEND_ONLY_IMM, "RC SEND Only with Immediate", kSendImm);
  set(RC_WRITE_FIRST, "RC RDMA WRITE First", kWriteFirst);
  set(RC_WRITE_MIDDLE, "RC RDMA WRITE Middle", kSend);
  set(RC_WRITE_LAST, "RC RDMA WRITE Last", kSend);
  set(RC_WRITE_LAST_IMM, "RC RDMA WRITE Last with Immediate", kSendImm);
  set(RC_WRITE_ONLY, "RC RDMA WRITE Only", kWriteFirst);
  set(RC_WRITE_ONLY_IMM, "RC RDMA WRITE Only with Immediate", kWriteImmOnly);
  set(RC_READ_REQUEST, "RC RDMA READ Request", H_RETH);
  set(RC_READ_RESPONSE_FIRST, "RC RDMA READ response First", kReadResp);
  set(RC_READ_RESPONSE_MIDDLE, "RC RDMA READ response Middle", kSend);
  set(RC_READ_RESPONSE_LAST, "RC RDMA READ response Last", kReadResp);
  set(RC_READ_RESPONSE_ONLY, "RC RDMA READ response Only", kReadResp);
  set(RC_ACK, "RC Acknowledge", H_AETH);
  set(RC_ATOMIC_ACK, "RC ATOMIC Acknowledge", H_AETH | H_ATOMIC_ACK);
  set(RC_CMP_SWAP, "RC CmpSwap", H_ATOMIC_ETH);
  set(RC_FETCH_ADD, "RC FetchAdd", H_ATOMIC_ETH);
  set(RC_SEND_LAST_INV, "RC SEND Last with Invalidate", kSendInv);
  set(RC_SEND_ONLY_INV, "RC SEND Only with Invalidate", kSendInv);
  set(UC_SEND_FIRST, "UC SEND First", kSend);
  set(UC_SEND_MIDDLE, "UC SEND Middle", kSend);
  set(UC_SEND_LAST, "UC SEND Last", kSend);
  set(UC_SEND_LAST_IMM, "UC SEND Last with Immediate", kSendImm);
  set(UC_SEND_ONLY, "UC SEND Only", kSend);
  set(UC_SEND_ONLY_IMM, "UC SEND Only with Immediate", kSendImm);
  set(UC_WRITE_FIRST, "UC RDMA WRITE First", kWriteFirst);
  set(UC_WRITE_MIDDLE, "UC RDMA WRITE Middle", kSend);
  set(UC_WRITE_LAST, "UC RDMA WRITE Last", kSend);
  set(UC_WRITE_LAST_IMM, "UC RDMA WRITE Last with Immediate", kSendImm);
  set(UC_WRITE_ONLY, "UC RDMA WRITE Only", kWriteFirst);
  set(UC_WRITE_ONLY_IMM, "UC RDMA WRITE Only with Immediate", kWriteImmOnly);
  set(UD_SEND_ONLY, "UD SEND Only", H_DETH | kSend);
  set(UD_SEND_ONLY_IMM, "UD SEND Only with Immediate", H_DETH | kSendImm);
  return t;
}
const std::array<OpcodeInfo, 256> kOpcodes = make_table();

uint16_t get16(const uint8_t* p) { return uint16_t(p[0] << 8 | p[1]); }
uint32_t get24(const uint8_t* p) { return uint32_t(p[0]) << 16 | uint32_t(p[1]) << 8 | p[2]; }
uint32_t get32(const uint8_t* p) { return uint32_t(get16(p)) << 16 | get16(p + 2); }
uint64_t get64(const uint8_t* p) { return uint64_t(get32(p)) << 32 | get32(p + 4); }
void put16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v >> 8); p[1] = uint8_t(v); }
void put24(uint8_t* p, uint32_t v) { p[0] = uint8_t(v >> 16); p[1] = uint8_t(v >> 8); p[2] = uint8_t(v); }
void put32(uint8_t* p, uint32_t v) { put16(p, uint16_t(v >> 16)); put16(p + 2, uint16_t(v)); }
void put64(uint8_t* p, uint64_t v) { put32(p, uint32_t(v >> 32)); put32(p + 4, uint32_t(v)); }

uint32_t crc(uint32_t c, const uint8_t* p, size_t n) {
  // zlib's crc32 is IEEE 802.3's CRC-32 (initial value and final
  // complement included), which the ICRC is; it takes uInt lengths.
  while (n) {
    const uInt chunk = n > (1u << 30) ? (1u << 30) : uInt(n);
    c = uint32_t(::crc32(c, p, chunk));
    p += chunk;
    n -= chunk;
  }
  return c;
}

}  // namespace

const OpcodeInfo& opcode_info(uint8_t opcode) { return kOpcodes[opcode]; }

size_t ext_len(uint16_t h) {
  return (h & H_DETH ? 8 : 0) + (h & H_RETH ? 16 : 0) + (h & H_ATOMIC_ETH ? 28 : 0) + (h & H_AETH ? 4 : 0) +
         (h & H_ATOMIC_ACK ? 8 : 0) + (h & H_IMM ? 4 : 0) + (h & H_IETH ? 4 : 0);
}

namespace {

// The ICRC's CRC register after the pseudo-header (masked LRH, IP header,
// UDP header) and the masked BTH of a UDP payload of len bytes.
uint32_t icrc_head(const IpFields& ip, const uint8_t* bth, size_t len) {
  uint8_t h[8 + 40 + 8 + kBthLen];
  size_t n = 0;
  std::memset(h, 0xff, 8);  // the LRH RoCE v2 does not have
  n = 8;
  const uint16_t udp_len = uint16_t(8 + len);
  if (ip.src.is_v4()) {
    uint8_t* v4 = h + n;
    v4[0] = 0x45;
    v4[1] = 0xff;  // type of service (DSCP, ECN): variant
    put16(v4 + 2, uint16_t(20 + udp_len));
    put16(v4 + 4, ip.ipv4_id);
    put16(v4 + 6, ip.ipv4_frag);
    v4[8] = 0xff;  // TTL: variant
    v4[9] = 17;    // UDP
    put16(v4 + 10, 0xffff);  // header checksum: variant
    std::memcpy(v4 + 12, ip.src.b.data() + 12, 4);
    std::memcpy(v4 + 16, ip.dst.b.data() + 12, 4);
    n += 20;
  } else {
    uint8_t* v6 = h + n;
    put32(v6, 0x6fffffff);  // version 6; traffic class and flow label: variant
    put16(v6 + 4, udp_len);
    v6[6] = 17;    // next header: UDP
    v6[7] = 0xff;  // hop limit: variant
    std::memcpy(v6 + 8, ip.src.b.data(), 16);
    std::memcpy(v6 + 24, ip.dst.b.data(), 16);
    n += 40;
  }
  put16(h + n, ip.src_port);
  put16(h + n + 2, ip.dst_port);
  put16(h + n + 4, udp_len);
  put16(h + n + 6, 0xffff);  // UDP checksum: variant
  n += 8;
  std::memcpy(h + n, bth, kBthLen);
  h[n + 4] = 0xff;  // FECN, BECN and reserved bits: variant
  n += kBthLen;
  return crc(::crc32(0, nullptr, 0), h, n);
}

}  // namespace

uint32_t icrc(const IpFields& ip, const uint8_t* udp_payload, size_t len) {
  const uint32_t c = icrc_head(ip, udp_payload, len);
  return crc(c, udp_payload + kBthLen, len - kIcrcLen - kBthLen);
}

size_t seal(const IpFields& ip, const uint8_t* hdr, size_t hdr_len, const HostSpan* payload, size_t nspans,
            uint8_t* trailer) {
  size_t payload_len = 0;
  for (size_t i = 0; i < nspans; i++) payload_len += payload[i].len;
  const uint8_t pad = uint8_t((4 - payload_len % 4) % 4);
  const size_t len = hdr_len + payload_len + pad + kIcrcLen;
  uint32_t c = icrc_head(ip, hdr, len);
  c = crc(c, hdr + kBthLen, hdr_len - kBthLen);
  for (size_t i = 0; i < nspans; i++) c = crc(c, payload[i].ptr, payload[i].len);
  std::memset(trailer, 0, pad);
  c = crc(c, trailer, pad);
  for (int i = 0; i < 4; i++) trailer[pad + i] = uint8_t(c >> (8 * i));
  return pad + kIcrcLen;
}

const char* to_string(ParseError e) {
  switch (e) {
    case ParseError::NONE: return "ok";
    case ParseError::SHORT: return "shorter than its headers";
    case ParseError::OPCODE: return "opcode not spoken";
    case ParseError::VERSION: return "BTH version not 0";
    case ParseError::LENGTH: return "bad length or pad";
    case ParseError::ICRC: return "ICRC mismatch";
  }
  return "?";
}

ParseError parse(const uint8_t* data, size_t len, const IpFields& ip, Packet* out) {
  if (len < kBthLen + kIcrcLen) return ParseError::SHORT;
  Packet p;
  p.bth.opcode = data[0];
  const OpcodeInfo& info = opcode_info(p.bth.opcode);
  if (!info.name) return ParseError::OPCODE;
  if ((data[1] & 0x0f) != 0) return ParseError::VERSION;
  const size_t hdr = kBthLen + ext_len(info.headers);
  if (len < hdr + kIcrcLen) return ParseError::SHORT;
  if (len % 4) return ParseError::LENGTH;
  p.bth.solicited = data[1] & 0x80;
  p.bth.migreq = data[1] & 0x40;
  p.bth.pad = (data[1] >> 4) & 3;
  p.bth.pkey = get16(data + 2);
  p.bth.fecn = data[4] & 0x80;
  p.bth.becn = data[4] & 0x40;
  p.bth.dest_qp = get24(data + 5);
  p.bth.ack_req = data[8] & 0x80;
  p.bth.psn = get24(data + 9);
  const size_t body = len - hdr - kIcrcLen;  // payload and pad
  if (!(info.headers & H_PAYLOAD) ? body != 0 || p.bth.pad != 0 : p.bth.pad > body) return ParseError::LENGTH;
  // The ICRC is the one field not in network order: the CRC register's
  // bytes as they come out, least significant first (as rxe and RoCE NICs
  // put it on the wire).
  const uint8_t* tail = data + len - kIcrcLen;
  const uint32_t got = uint32_t(tail[0]) | uint32_t(tail[1]) << 8 | uint32_t(tail[2]) << 16 | uint32_t(tail[3]) << 24;
  if (ip.check_icrc && icrc(ip, data, len) != got) return ParseError::ICRC;

  const uint8_t* x = data + kBthLen;
  if (info.headers & H_DETH) {
    p.deth.qkey = get32(x);
    p.deth.src_qp = get24(x + 5);
    x += 8;
  }
  if (info.headers & H_RETH) {
    p.reth.va = get64(x);
    p.reth.rkey = get32(x + 8);
    p.reth.dma_len = get32(x + 12);
    x += 16;
  }
  if (info.headers & H_ATOMIC_ETH) {
    p.atomic.va = get64(x);
    p.atomic.rkey = get32(x + 8);
    p.atomic.swap_add = get64(x + 12);
    p.atomic.compare = get64(x + 20);
    x += 28;
  }
  if (info.headers & H_AETH) {
    p.aeth.syndrome = x[0];
    p.aeth.msn = get24(x + 1);
    x += 4;
  }
  if (info.headers & H_ATOMIC_ACK) {
    p.atomic_ack = get64(x);
    x += 8;
  }
  if (info.headers & H_IMM) {
    p.imm = get32(x);
    x += 4;
  }
  if (info.headers & H_IETH) {
    p.invalidate_rkey = get32(x);
    x += 4;
  }
  p.payload = x;
  p.payload_len = body - p.bth.pad;
  *out = p;
  return ParseError::NONE;
}

size_t packet_len(const Packet& p) {
  const OpcodeInfo& info = opcode_info(p.bth.opcode);
  const size_t payload = info.headers & H_PAYLOAD ? (p.payload_len + 3) / 4 * 4 : 0;
  return kBthLen + ext_len(info.headers) + payload + kIcrcLen;
}

size_t build_headers(const Packet& p, uint8_t* out, size_t cap) {
  const OpcodeInfo& info = opcode_info(p.bth.opcode);
  if (!info.name) return 0;
  const size_t hlen = kBthLen + ext_len(info.headers);
  if (hlen > cap) return 0;
  const size_t payload = info.headers & H_PAYLOAD ? p.payload_len : 0;
  const uint8_t pad = uint8_t((4 - payload % 4) % 4);
  out[0] = p.bth.opcode;
  out[1] = uint8_t((p.bth.solicited ? 0x80 : 0) | (p.bth.migreq ? 0x40 : 0) | pad << 4);  // TVer 0
  put16(out + 2, p.bth.pkey);
  out[4] = uint8_t((p.bth.fecn ? 0x80 : 0) | (p.bth.becn ? 0x40 : 0));
  put24(out + 5, p.bth.dest_qp);
  out[8] = p.bth.ack_req ? 0x80 : 0;
  put24(out + 9, p.bth.psn);
  uint8_t* x = out + kBthLen;
  if (info.headers & H_DETH) {
    put32(x, p.deth.qkey);
    x[4] = 0;
    put24(x + 5, p.deth.src_qp);
    x += 8;
  }
  if (info.headers & H_RETH) {
    put64(x, p.reth.va);
    put32(x + 8, p.reth.rkey);
    put32(x + 12, p.reth.dma_len);
    x += 16;
  }
  if (info.headers & H_ATOMIC_ETH) {
    put64(x, p.atomic.va);
    put32(x + 8, p.atomic.rkey);
    put64(x + 12, p.atomic.swap_add);
    put64(x + 20, p.atomic.compare);
    x += 28;
  }
  if (info.headers & H_AETH) {
    x[0] = p.aeth.syndrome;
    put24(x + 1, p.aeth.msn);
    x += 4;
  }
  if (info.headers & H_ATOMIC_ACK) {
    put64(x, p.atomic_ack);
    x += 8;
  }
  if (info.headers & H_IMM) {
    put32(x, p.imm);
    x += 4;
  }
  if (info.headers & H_IETH) {
    put32(x, p.invalidate_rkey);
    x += 4;
  }
  return hlen;
}

size_t build(const Packet& p, const IpFields& ip, uint8_t* out, size_t cap) {
  const OpcodeInfo& info = opcode_info(p.bth.opcode);
  if (!info.name) return 0;
  const size_t len = packet_len(p);
  if (len > cap) return 0;
  const size_t hlen = build_headers(p, out, cap);
  const size_t payload = info.headers & H_PAYLOAD ? p.payload_len : 0;
  if (payload) std::memcpy(out + hlen, p.payload, payload);
  const HostSpan span{const_cast<uint8_t*>(out + hlen), payload};
  uint8_t trailer[kMaxTrailerLen];
  const size_t tl = seal(ip, out, hlen, &span, payload ? 1 : 0, trailer);
  std::memcpy(out + hlen + payload, trailer, tl);
  return len;
}

}  // namespace vstellar::roce
