// Wire format between two vStellar engines: one UDP datagram per packet,
// a 24-byte base header, an opcode-specific extension, then payload.
// All multi-byte fields are big-endian. docs/wire-format.md is the reference;
// tools/wireshark/vstellar.lua dissects it.
//
// Every packet is self-describing (IRN-style): a data packet carries its
// message's remote address/key or receive sequence number plus its offset, so
// the receiver places it without having seen any other packet.
//
// Parsing copies the header fields out of the datagram into host structs
// before anything looks at them (no double fetch), and checks every length.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

namespace vstellar::wire {

constexpr uint8_t kVersion = 1;
constexpr size_t kBaseLen = 24;
constexpr size_t kMaxSackWords = 16;  // 1024 PSNs per ACK
constexpr size_t kMaxHeaderLen = 128;
// Integrity mode (EngineConfig::integrity): every packet starts with this
// prefix (nonce and MAC tag, docs/wire-format.md), the base header after it.
constexpr size_t kIntegrityPrefixLen = 28;

// A path tracer's TTL-limited probe (qemu-device/telemetry/path_tracer.h)
// starts with these bytes instead of a header. One that outlives its TTL
// reaches the peer's engine port, and the engine drops it (counted in
// EngineStats::trace_probes): it is not a packet of ours and not an error.
constexpr uint8_t kTraceMagic[4] = {'V', 'S', 'T', 'R'};
constexpr size_t kTraceProbeLen = 16;
inline bool is_trace_probe(const uint8_t* data, size_t len) {
  return len == kTraceProbeLen && data[0] == kTraceMagic[0] && data[1] == kTraceMagic[1] &&
         data[2] == kTraceMagic[2] && data[3] == kTraceMagic[3];
}

enum class Op : uint8_t {
  SEND = 1,         // DataExt
  SEND_IMM = 2,     // DataExt
  WRITE = 3,        // DataExt
  WRITE_IMM = 4,    // DataExt
  READ_REQ = 5,     // ReadReqExt
  READ_RESP = 6,    // ReadRespExt + payload
  CMP_SWAP = 7,     // AtomicExt
  FETCH_ADD = 8,    // AtomicExt
  ATOMIC_RESP = 9,  // AtomicRespExt
  ACK = 10,         // AckExt + SACK bitmap words
  UD_SEND = 11,     // UdExt + payload: one unreliable datagram (UD/GSI QPs)
  UD_SEND_IMM = 12, // UdExt + payload
  SEND_INV = 13,    // DataExt: a SEND whose rkey the responder invalidates
};
const char* to_string(Op op);

enum Flags : uint16_t {
  F_FIRST = 1,      // first packet of a message
  F_LAST = 2,       // last packet of a message
  F_SOLICITED = 4,  // solicited event requested
  F_RETX = 8,       // a retransmission (diagnostics only)
  // A probe copy of a data packet over a path set aside: the responder
  // ACKs at once, naming it. An ACK names only the last packet to arrive
  // before it left, and with an ACK per 32 packets a copy was rarely the
  // one named, so a repaired path stayed aside (EngineCore::resp_receive).
  F_PROBE = 16,
};

// ACK syndromes (like the IB AETH).
enum class Syndrome : uint8_t {
  ACK = 0,
  RNR_NAK = 1,
  NAK_INV_REQ = 2,     // invalid request (bad opcode, length, alignment)
  NAK_REM_ACCESS = 3,  // bad rkey, bounds, or access flags
  NAK_REM_OP = 4,      // responder-side local error
  // Not a NAK: a READ or atomic request at nak_psn (sent at echo_ts over
  // echo_path) arrived and waits for cum_psn, which has not. The requester
  // uses it to find a lost request without a timeout (comp_held).
  HELD = 5,
  // Not a NAK: notices about the sending QP itself (live migration,
  // Engine::notify_peers). PAUSED: it stops for a while (its device is
  // stopped; it may come back from another host); its peer holds its
  // retry clock instead of failing the connection. RESUMED: it runs again
  // (perhaps at a new place): its peer resends what is outstanding now,
  // with its paths and backoff afresh.
  PAUSED = 6,
  RESUMED = 7,
};

struct Base {
  uint8_t version = kVersion;
  Op op = Op::ACK;
  uint16_t flags = 0;
  uint32_t dst_qpn = 0;
  uint32_t src_qpn = 0;
  uint32_t psn = 0;
  uint16_t path = 0;         // path id = sender's source port - its base port
  uint16_t payload_len = 0;  // bytes after the extension (and SACK words)
  uint32_t ts = 0;           // sender clock, microseconds, echoed in ACKs for RTT
};

struct DataExt {  // 32 bytes
  uint64_t va = 0;       // WRITE: message start address at the responder
  uint32_t rkey = 0;     // WRITE; SEND_INV: the key to invalidate
  uint32_t msg_off = 0;  // offset of this packet's payload in the message
  uint32_t msg_len = 0;  // total message length
  uint32_t rsn = 0;      // receive sequence number (SEND*, WRITE_IMM): which receive WQE
  uint32_t imm = 0;      // immediate data (SEND_IMM, WRITE_IMM), network order kept as a number
  uint32_t rsvd = 0;
};

struct ReadReqExt {  // 24 bytes. Asks for [va, va+len) as ceil(len/seg) response packets, PSNs psn..
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t len = 0;
  uint32_t msg_off = 0;  // offset of va within the requester's message (echoed back)
  uint16_t seg = 0;      // payload bytes per response packet
  // How many PSNs before psn belong to READs, back to the requester's last
  // other request (saturated): the responder may answer this READ as soon
  // as every request before those has arrived, even if some of those
  // READs have not (a READ changes nothing another READ sees). 0: in order.
  uint16_t reads_before = 0;
};

struct ReadRespExt {  // 8 bytes
  uint32_t msg_off = 0;
  // How long the responder held the request, waiting for an earlier PSN;
  // the base ts echoes the request's own, so that the requester knows
  // which transmission it answers.
  uint32_t held_us = 0;
};

struct AtomicExt {  // 32 bytes
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t rsvd = 0;
  uint64_t swap_add = 0;
  uint64_t compare = 0;
};

struct AtomicRespExt {  // 8 bytes
  uint64_t orig = 0;
};

struct AckExt {  // 28 bytes, then sack_words 64-bit words
  uint32_t cum_psn = 0;    // every PSN before this one has arrived
  uint32_t sack_base = 0;  // bit i of the bitmap: PSN sack_base + i arrived
  uint8_t sack_words = 0;
  Syndrome syndrome = Syndrome::ACK;
  uint16_t ce_count = 0;   // CE-marked data packets since the previous ACK
  uint32_t echo_ts = 0;    // ts of the newest data packet acknowledged
  uint16_t echo_path = 0;  // path that packet came on
  uint16_t rx_count = 0;   // data packets since the previous ACK
  uint32_t nak_psn = 0;    // PSN a NAK refers to
  uint32_t rnr_us = 0;     // RNR NAK: how long to wait
  uint64_t sack[kMaxSackWords] = {};
};

// UD datagram (48 bytes). No PSN, no ACK: the receiver takes the next
// receive WQE or drops it. The GIDs and GRH fields let the receiver build
// the GRH area a RoCE UD receive starts with.
struct UdExt {
  uint32_t qkey = 0;
  uint32_t imm = 0;         // UD_SEND_IMM
  uint32_t flow_label = 0;  // low 20 bits
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  uint16_t rsvd = 0;
  uint8_t sgid[16] = {};
  uint8_t dgid[16] = {};
};

constexpr size_t ext_len(Op op) {
  switch (op) {
    case Op::SEND: case Op::SEND_IMM: case Op::WRITE: case Op::WRITE_IMM: case Op::SEND_INV: return 32;
    case Op::READ_REQ: return 24;
    case Op::READ_RESP: return 8;
    case Op::CMP_SWAP: case Op::FETCH_ADD: return 32;
    case Op::ATOMIC_RESP: return 8;
    case Op::ACK: return 28;
    case Op::UD_SEND: case Op::UD_SEND_IMM: return 48;
  }
  return 0;
}
inline bool is_data(Op op) { return (op >= Op::SEND && op <= Op::WRITE_IMM) || op == Op::SEND_INV; }
inline bool is_ud(Op op) { return op == Op::UD_SEND || op == Op::UD_SEND_IMM; }

// A parsed packet: host-order copies of every header field, and a pointer
// into the datagram for the payload.
struct Packet {
  Base base;
  union {
    DataExt data;
    ReadReqExt rreq;
    ReadRespExt rresp;
    AtomicExt atomic;
    AtomicRespExt aresp;
    UdExt ud;
  };
  AckExt ack;
  const uint8_t* payload = nullptr;
  size_t payload_len = 0;
  // Not on the wire: when a responder began holding this request (a READ
  // or atomic waiting for earlier PSNs), in its clock's microseconds.
  uint32_t held_since_us = 0;
  // Not on the wire: an ACK made from a RoCE v2 packet whose echo_ts is
  // no RTT sample (RoCE echoes no timestamp; roce_mode.cc).
  bool no_rtt = false;
  Packet() : data() {}
};

enum class ParseError { OK, TRUNCATED, BAD_VERSION, BAD_OPCODE, BAD_LENGTH };
ParseError parse(const uint8_t* buf, size_t len, Packet& out);
// A header alone, as an encoder wrote it (exactly len bytes, base +
// extension [+ SACK words]); the payload's length is what it says.
ParseError parse_header(const uint8_t* hdr, size_t len, Packet& out);

// Encoders write the header (base + extension [+ SACK words]) into `out`
// (at least kMaxHeaderLen bytes) and return its length. base.payload_len must
// already be set.
size_t encode(const Base& b, const DataExt& e, uint8_t* out);
size_t encode(const Base& b, const ReadReqExt& e, uint8_t* out);
size_t encode(const Base& b, const ReadRespExt& e, uint8_t* out);
size_t encode(const Base& b, const AtomicExt& e, uint8_t* out);
size_t encode(const Base& b, const AtomicRespExt& e, uint8_t* out);
size_t encode(const Base& b, const AckExt& e, uint8_t* out);
size_t encode(const Base& b, const UdExt& e, uint8_t* out);

// RoCEv2 GIDs: an IPv4 address mapped into the GID (::ffff:a.b.c.d), and
// of those an IPv4 multicast group (224.0.0.0/4).
bool is_v4_mapped_gid(const uint8_t* gid);
// 224.0.0.0/4 (IPv4-mapped) or ff00::/8.
bool is_multicast_gid(const uint8_t* gid);

// Which of several engines behind one address (vstellard --threads; each
// hands out the QPNs of one residue, EngineConfig::qpn_shards) must take a
// received datagram, read from its bytes alone and before any check (the
// engine that takes it checks it). `integrity`: the datagram starts with
// the integrity prefix.
struct RouteKey {
  enum class Kind : uint8_t {
    kAny,        // too short to tell: any engine may take it (and drop it)
    kQpn,        // the engine that owns dst_qpn
    kGsi,        // a datagram for QP 1: the engine serving the GID dgid
    kMulticast,  // a datagram to a multicast group: every engine has a copy
  };
  Kind kind = Kind::kAny;
  uint32_t dst_qpn = 0;
  std::array<uint8_t, 16> dgid{};  // kGsi
};
RouteKey route_key(const uint8_t* data, size_t len, bool integrity);
// Where the big-endian dst_qpn sits in a datagram (what a link that steers
// datagrams by it reads, UdpLinkConfig::shard_qpn_offset).
constexpr size_t dst_qpn_offset(bool integrity) { return (integrity ? kIntegrityPrefixLen : 0) + 4; }

}  // namespace vstellar::wire
