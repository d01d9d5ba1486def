// Standard RoCE v2 (IBTA Annex A17) packets: the UDP payload on port 4791,
// base transport header (BTH), the extended headers each opcode carries,
// payload, pad and the invariant CRC (ICRC). This is the codec of the
// plain RoCE v2 wire mode (issue 28), in which a vStellar engine talks to
// peers that do not spray (rxe, RoCE NICs); vStellar's own format between
// engines is vstellar/wire.h.
//
// Parsing copies every field out of the datagram into host structs and
// checks every length before anything else looks at the packet, as
// wire::parse does. Multi-byte fields are big-endian on the wire; the ICRC
// is the one exception (below).
//
// tests/engine/roce_wire_test.cc checks this codec against packets that
// Linux's rxe wrote (tools/roce/capture-rxe), ICRC included.
#pragma once
#include <cstddef>
#include <cstdint>

#include "vstellar/memory.h"
#include "vstellar/types.h"

namespace vstellar::roce {

constexpr uint16_t kUdpPort = 4791;
constexpr size_t kBthLen = 12;
constexpr size_t kIcrcLen = 4;
// P_Key of the default partition, full membership: what RoCE v2 sends.
constexpr uint16_t kDefaultPkey = 0xffff;
// Q_Key of the GSI QP (QP 1), on which rdma_cm's MADs travel.
constexpr uint32_t kGsiQkey = 0x80010000;

// IBTA opcodes: the transport in the top 3 bits (RC 000, UC 001, UD 011),
// the operation below. Only those vStellar speaks are listed.
enum Opcode : uint8_t {
  RC_SEND_FIRST = 0x00,
  RC_SEND_MIDDLE = 0x01,
  RC_SEND_LAST = 0x02,
  RC_SEND_LAST_IMM = 0x03,
  RC_SEND_ONLY = 0x04,
  RC_SEND_ONLY_IMM = 0x05,
  RC_WRITE_FIRST = 0x06,
  RC_WRITE_MIDDLE = 0x07,
  RC_WRITE_LAST = 0x08,
  RC_WRITE_LAST_IMM = 0x09,
  RC_WRITE_ONLY = 0x0a,
  RC_WRITE_ONLY_IMM = 0x0b,
  RC_READ_REQUEST = 0x0c,
  RC_READ_RESPONSE_FIRST = 0x0d,
  RC_READ_RESPONSE_MIDDLE = 0x0e,
  RC_READ_RESPONSE_LAST = 0x0f,
  RC_READ_RESPONSE_ONLY = 0x10,
  RC_ACK = 0x11,
  RC_ATOMIC_ACK = 0x12,
  RC_CMP_SWAP = 0x13,
  RC_FETCH_ADD = 0x14,
  RC_SEND_LAST_INV = 0x16,
  RC_SEND_ONLY_INV = 0x17,
  UC_SEND_FIRST = 0x20,
  UC_SEND_MIDDLE = 0x21,
  UC_SEND_LAST = 0x22,
  UC_SEND_LAST_IMM = 0x23,
  UC_SEND_ONLY = 0x24,
  UC_SEND_ONLY_IMM = 0x25,
  UC_WRITE_FIRST = 0x26,
  UC_WRITE_MIDDLE = 0x27,
  UC_WRITE_LAST = 0x28,
  UC_WRITE_LAST_IMM = 0x29,
  UC_WRITE_ONLY = 0x2a,
  UC_WRITE_ONLY_IMM = 0x2b,
  UD_SEND_ONLY = 0x64,
  UD_SEND_ONLY_IMM = 0x65,
};

// The extended headers after the BTH, in the order they appear.
enum Header : uint16_t {
  H_DETH = 1,        // 8: Q_Key, source QP (UD)
  H_RETH = 2,        // 16: virtual address, R_Key, DMA length
  H_ATOMIC_ETH = 4,  // 28: virtual address, R_Key, swap (add) and compare data
  H_AETH = 8,        // 4: syndrome, MSN
  H_ATOMIC_ACK = 16, // 8: the original remote data
  H_IMM = 32,        // 4: immediate data
  H_IETH = 64,       // 4: the R_Key to invalidate
  H_PAYLOAD = 128,   // the opcode carries payload (possibly empty)
};

struct OpcodeInfo {
  const char* name;  // IBTA's, e.g. "RC RDMA WRITE First"; nullptr: not spoken here
  uint16_t headers;  // Header bits
};
// Every opcode has an entry; unknown ones have name == nullptr.
const OpcodeInfo& opcode_info(uint8_t opcode);
// Bytes of the extended headers (not the BTH) the opcode carries.
size_t ext_len(uint16_t headers);

// AETH syndromes: the top 3 bits say what, the low 5 a credit count, an
// RNR timer code or a NAK code.
enum AethType : uint8_t { AETH_ACK = 0, AETH_RNR_NAK = 1, AETH_NAK = 3 };
enum NakCode : uint8_t {
  NAK_PSN_SEQUENCE_ERROR = 0,
  NAK_INVALID_REQUEST = 1,
  NAK_REMOTE_ACCESS_ERROR = 2,
  NAK_REMOTE_OPERATIONAL_ERROR = 3,
  NAK_INVALID_RD_REQUEST = 4,
};
constexpr uint8_t aeth_syndrome(AethType type, uint8_t value) { return uint8_t(type << 5 | (value & 0x1f)); }

struct Bth {
  uint8_t opcode = 0;
  bool solicited = false;    // SE
  bool migreq = false;       // M
  uint8_t pad = 0;           // PadCnt: bytes after the payload to a 4-byte boundary
  uint16_t pkey = kDefaultPkey;
  bool fecn = false, becn = false;
  uint32_t dest_qp = 0;      // 24 bits
  bool ack_req = false;      // A
  uint32_t psn = 0;          // 24 bits
};

struct Packet {
  Bth bth;
  // Each valid when opcode_info(bth.opcode).headers says so.
  struct {
    uint32_t qkey = 0;
    uint32_t src_qp = 0;  // 24 bits
  } deth;
  struct {
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint32_t dma_len = 0;
  } reth;
  struct {
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint64_t swap_add = 0;
    uint64_t compare = 0;
  } atomic;
  struct {
    uint8_t syndrome = 0;
    uint32_t msn = 0;  // 24 bits
  } aeth;
  uint64_t atomic_ack = 0;
  uint32_t imm = 0;        // as on the wire (ImmDt is opaque, big-endian)
  uint32_t invalidate_rkey = 0;
  // Parsed: points into the datagram; built: the bytes to send.
  const uint8_t* payload = nullptr;
  size_t payload_len = 0;  // without pad
};

// What the ICRC covers beyond the UDP payload: the IP and UDP headers'
// invariant fields. An IPv4 sender that sets DF on an unconnected socket
// gets identification 0 from Linux; rxe numbers its packets, so a receiver
// needs the identification the packet arrived with.
struct IpFields {
  IpAddr src, dst;
  uint16_t src_port = 0, dst_port = kUdpPort;
  uint16_t ipv4_id = 0;
  uint16_t ipv4_frag = 0x4000;  // flags and fragment offset: DF
  // false: the receiver cannot see a field the ICRC covers (an IPv4
  // identification, on a UDP socket), and parse() does not check it.
  bool check_icrc = true;
};

// ICRC of a UDP payload whose last 4 bytes are (or will be) the ICRC: the
// CRC-32 of IEEE 802.3 over 8 bytes of ones (RoCE v2's stand-in for the
// LRH), the IP header with its variant fields set to ones (IPv4: type of
// service, TTL, checksum; IPv6: traffic class, flow label, hop limit), the
// UDP header with its checksum set to ones, the BTH with its FECN, BECN
// and reserved bits set to ones, and the rest up to the ICRC.
uint32_t icrc(const IpFields& ip, const uint8_t* udp_payload, size_t len);

enum class ParseError {
  NONE,
  SHORT,       // shorter than its opcode's headers and the ICRC
  OPCODE,      // an opcode not spoken here
  VERSION,     // BTH transport header version not 0
  LENGTH,      // not a multiple of 4, payload where none belongs, or pad > payload
  ICRC,        // the ICRC does not match
};
const char* to_string(ParseError e);

// Parse one UDP payload (BTH to ICRC). The payload pointer refers into
// `data`. ip: the fields of the headers it arrived with (for the ICRC).
ParseError parse(const uint8_t* data, size_t len, const IpFields& ip, Packet* out);

// Bytes build() writes for p: headers, payload, pad and ICRC.
size_t packet_len(const Packet& p);
// Build the UDP payload of p into out (cap bytes): headers from p, the
// payload, the pad (zeros; p.bth.pad is set from payload_len) and the
// ICRC. Returns the length, or 0 when p's opcode is not spoken here or
// cap is too small.
size_t build(const Packet& p, const IpFields& ip, uint8_t* out, size_t cap);

// The same in pieces, for a sender whose payload stays where it is (a
// link sends header, payload spans and trailer as one datagram):
// build_headers() writes the BTH and extended headers (returns their
// length, 0 as build() does); seal() writes the pad and the ICRC of the
// datagram hdr + payload + trailer into trailer (kMaxTrailerLen bytes)
// and returns their length.
constexpr size_t kMaxTrailerLen = 3 + kIcrcLen;
size_t build_headers(const Packet& p, uint8_t* out, size_t cap);
size_t seal(const IpFields& ip, const uint8_t* hdr, size_t hdr_len, const HostSpan* payload, size_t nspans,
            uint8_t* trailer);

}  // namespace vstellar::roce
