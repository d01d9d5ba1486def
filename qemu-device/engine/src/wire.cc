#include "vstellar/wire.h"

#include <cstring>

#include "vstellar/types.h"

namespace vstellar::wire {
namespace {

struct Writer {
  uint8_t* p;
  void u8(uint8_t v) { *p++ = v; }
  void u16(uint16_t v) { u8(uint8_t(v >> 8)); u8(uint8_t(v)); }
  void u32(uint32_t v) { u16(uint16_t(v >> 16)); u16(uint16_t(v)); }
  void u64(uint64_t v) { u32(uint32_t(v >> 32)); u32(uint32_t(v)); }
};

// Reads from a private copy of the header bytes, never from the datagram
// buffer twice.
struct Reader {
  const uint8_t* p;
  uint8_t u8() { return *p++; }
  uint16_t u16() { uint16_t h = u8(); return uint16_t(h << 8 | u8()); }
  uint32_t u32() { uint32_t h = u16(); return h << 16 | u16(); }
  uint64_t u64() { uint64_t h = u32(); return h << 32 | u32(); }
};

uint8_t* put_base(const Base& b, uint8_t* out) {
  Writer w{out};
  w.u8(uint8_t(b.version << 4));
  w.u8(uint8_t(b.op));
  w.u16(b.flags);
  w.u32(b.dst_qpn);
  w.u32(b.src_qpn);
  w.u32(b.psn);
  w.u16(b.path);
  w.u16(b.payload_len);
  w.u32(b.ts);
  return w.p;
}

}  // namespace

const char* to_string(Op op) {
  switch (op) {
    case Op::SEND: return "SEND";
    case Op::SEND_IMM: return "SEND_IMM";
    case Op::WRITE: return "WRITE";
    case Op::WRITE_IMM: return "WRITE_IMM";
    case Op::READ_REQ: return "READ_REQ";
    case Op::READ_RESP: return "READ_RESP";
    case Op::CMP_SWAP: return "CMP_SWAP";
    case Op::FETCH_ADD: return "FETCH_ADD";
    case Op::ATOMIC_RESP: return "ATOMIC_RESP";
    case Op::ACK: return "ACK";
    case Op::UD_SEND: return "UD_SEND";
    case Op::UD_SEND_IMM: return "UD_SEND_IMM";
    case Op::SEND_INV: return "SEND_INV";
  }
  return "?";
}

size_t encode(const Base& b, const DataExt& e, uint8_t* out) {
  Writer w{put_base(b, out)};
  w.u64(e.va); w.u32(e.rkey); w.u32(e.msg_off); w.u32(e.msg_len); w.u32(e.rsn); w.u32(e.imm); w.u32(0);
  return size_t(w.p - out);
}
size_t encode(const Base& b, const ReadReqExt& e, uint8_t* out) {
  Writer w{put_base(b, out)};
  w.u64(e.va); w.u32(e.rkey); w.u32(e.len); w.u32(e.msg_off); w.u16(e.seg); w.u16(e.reads_before);
  return size_t(w.p - out);
}
size_t encode(const Base& b, const ReadRespExt& e, uint8_t* out) {
  Writer w{put_base(b, out)};
  w.u32(e.msg_off); w.u32(e.held_us);
  return size_t(w.p - out);
}
size_t encode(const Base& b, const AtomicExt& e, uint8_t* out) {
  Writer w{put_base(b, out)};
  w.u64(e.va); w.u32(e.rkey); w.u32(0); w.u64(e.swap_add); w.u64(e.compare);
  return size_t(w.p - out);
}
size_t encode(const Base& b, const AtomicRespExt& e, uint8_t* out) {
  Writer w{put_base(b, out)};
  w.u64(e.orig);
  return size_t(w.p - out);
}
size_t encode(const Base& b, const AckExt& e, uint8_t* out) {
  Writer w{put_base(b, out)};
  uint8_t words = e.sack_words > kMaxSackWords ? kMaxSackWords : e.sack_words;
  w.u32(e.cum_psn); w.u32(e.sack_base); w.u8(words); w.u8(uint8_t(e.syndrome));
  w.u16(e.ce_count); w.u32(e.echo_ts); w.u16(e.echo_path); w.u16(e.rx_count);
  w.u32(e.nak_psn); w.u32(e.rnr_us);
  for (unsigned i = 0; i < words; i++) w.u64(e.sack[i]);
  return size_t(w.p - out);
}

size_t encode(const Base& b, const UdExt& e, uint8_t* out) {
  Writer w{put_base(b, out)};
  w.u32(e.qkey); w.u32(e.imm); w.u32(e.flow_label & 0xFFFFF); w.u8(e.traffic_class);
  w.u8(e.hop_limit); w.u16(0);
  for (uint8_t v : e.sgid) w.u8(v);
  for (uint8_t v : e.dgid) w.u8(v);
  return size_t(w.p - out);
}

namespace {
ParseError parse_impl(const uint8_t* buf, size_t len, Packet& out, bool header_only) {
  if (len < kBaseLen) return ParseError::TRUNCATED;
  uint8_t hdr[kMaxHeaderLen + 8 * kMaxSackWords];
  size_t copy = len < sizeof(hdr) ? len : sizeof(hdr);
  std::memcpy(hdr, buf, copy);  // validate the copy, never the shared buffer
  Reader r{hdr};
  Base& b = out.base;
  b.version = uint8_t(r.u8() >> 4);
  uint8_t op = r.u8();
  b.flags = r.u16();
  b.dst_qpn = r.u32();
  b.src_qpn = r.u32();
  b.psn = r.u32();
  b.path = r.u16();
  b.payload_len = r.u16();
  b.ts = r.u32();
  if (b.version != kVersion) return ParseError::BAD_VERSION;
  if (op < uint8_t(Op::SEND) || op > uint8_t(Op::SEND_INV)) return ParseError::BAD_OPCODE;
  b.op = Op(op);
  size_t hl = kBaseLen + ext_len(b.op);
  if (len < hl) return ParseError::TRUNCATED;
  switch (b.op) {
    case Op::SEND: case Op::SEND_IMM: case Op::WRITE: case Op::WRITE_IMM: case Op::SEND_INV: {
      DataExt& e = out.data;
      e.va = r.u64(); e.rkey = r.u32(); e.msg_off = r.u32(); e.msg_len = r.u32();
      e.rsn = r.u32(); e.imm = r.u32(); e.rsvd = r.u32();
      break;
    }
    case Op::READ_REQ: {
      ReadReqExt& e = out.rreq;
      e.va = r.u64(); e.rkey = r.u32(); e.len = r.u32(); e.msg_off = r.u32(); e.seg = r.u16();
      e.reads_before = r.u16();
      break;
    }
    case Op::READ_RESP: out.rresp.msg_off = r.u32(); out.rresp.held_us = r.u32(); break;
    case Op::CMP_SWAP: case Op::FETCH_ADD: {
      AtomicExt& e = out.atomic;
      e.va = r.u64(); e.rkey = r.u32(); e.rsvd = r.u32(); e.swap_add = r.u64(); e.compare = r.u64();
      break;
    }
    case Op::ATOMIC_RESP: out.aresp.orig = r.u64(); break;
    case Op::UD_SEND: case Op::UD_SEND_IMM: {
      UdExt& e = out.ud;
      e.qkey = r.u32(); e.imm = r.u32(); e.flow_label = r.u32() & 0xFFFFF;
      e.traffic_class = r.u8(); e.hop_limit = r.u8(); e.rsvd = r.u16();
      for (uint8_t& v : e.sgid) v = r.u8();
      for (uint8_t& v : e.dgid) v = r.u8();
      break;
    }
    case Op::ACK: {
      AckExt& e = out.ack;
      e.cum_psn = r.u32(); e.sack_base = r.u32(); e.sack_words = r.u8();
      uint8_t syn = r.u8();
      e.ce_count = r.u16(); e.echo_ts = r.u32(); e.echo_path = r.u16(); e.rx_count = r.u16();
      e.nak_psn = r.u32(); e.rnr_us = r.u32();
      if (syn > uint8_t(Syndrome::RESUMED)) return ParseError::BAD_OPCODE;
      e.syndrome = Syndrome(syn);
      if (e.sack_words > kMaxSackWords) return ParseError::BAD_LENGTH;
      hl += 8u * e.sack_words;
      if (len < hl) return ParseError::TRUNCATED;
      for (unsigned i = 0; i < e.sack_words; i++) e.sack[i] = r.u64();
      break;
    }
  }
  if (header_only) {
    if (len != hl) return ParseError::BAD_LENGTH;
    out.payload = nullptr;
    out.payload_len = b.payload_len;
    return ParseError::OK;
  }
  if (len - hl != b.payload_len) return ParseError::BAD_LENGTH;
  out.payload = buf + hl;
  out.payload_len = b.payload_len;
  return ParseError::OK;
}
}  // namespace

ParseError parse(const uint8_t* buf, size_t len, Packet& out) { return parse_impl(buf, len, out, false); }
ParseError parse_header(const uint8_t* hdr, size_t len, Packet& out) { return parse_impl(hdr, len, out, true); }

bool is_v4_mapped_gid(const uint8_t* gid) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid, prefix, sizeof(prefix)) == 0;
}

bool is_multicast_gid(const uint8_t* gid) { return vstellar::IpAddr::from_bytes(gid).is_multicast(); }

RouteKey route_key(const uint8_t* data, size_t len, bool integrity) {
  RouteKey k;
  const size_t off = integrity ? kIntegrityPrefixLen : 0;
  if (len < off + kBaseLen) return k;
  const uint8_t* h = data + off;
  k.dst_qpn = Reader{h + 4}.u32();
  k.kind = RouteKey::Kind::kQpn;
  if (!is_ud(Op(h[1]))) return k;
  // UdExt on the wire: qkey, imm, flow label, class, hop limit, rsvd (16
  // bytes), sgid, dgid.
  constexpr size_t kDgidAt = kBaseLen + 32;
  if (len < off + kDgidAt + 16) return RouteKey{};
  std::memcpy(k.dgid.data(), h + kDgidAt, 16);
  if (is_multicast_gid(k.dgid.data())) k.kind = RouteKey::Kind::kMulticast;
  else if (k.dst_qpn == 1) k.kind = RouteKey::Kind::kGsi;
  return k;
}

}  // namespace vstellar::wire
