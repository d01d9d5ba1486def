// Verbs-level types of the vStellar engine. Numeric values follow
// libibverbs (enum ibv_wr_opcode, ibv_wc_status, ibv_qp_state, ...), so the
// later provider and virtio backend can pass them through unchanged.
#pragma once
#include <array>
#include <compare>
#include <cstdint>
#include <memory>

namespace vstellar {

class Cq;
class Pd;
class Mr;
class Qp;

enum class WrOpcode : uint8_t {
  RDMA_WRITE = 0,
  RDMA_WRITE_WITH_IMM = 1,
  SEND = 2,
  SEND_WITH_IMM = 3,
  RDMA_READ = 4,
  ATOMIC_CMP_AND_SWP = 5,
  ATOMIC_FETCH_AND_ADD = 6,
  LOCAL_INV = 7,       // invalidate a fast-registration MR or a type 2 window
  BIND_MW = 8,         // bind a window (type 1 through the bind verb, type 2 as a WR)
  SEND_WITH_INV = 9,   // SEND; the responder invalidates invalidate_rkey
  REG_MR = 32,         // fast registration (no libibverbs number: kernel users only)
};

enum class WcStatus : uint8_t {
  SUCCESS = 0,
  LOC_LEN_ERR = 1,
  LOC_QP_OP_ERR = 2,
  LOC_EEC_OP_ERR = 3,
  LOC_PROT_ERR = 4,
  WR_FLUSH_ERR = 5,
  MW_BIND_ERR = 6,
  BAD_RESP_ERR = 7,
  LOC_ACCESS_ERR = 8,
  REM_INV_REQ_ERR = 9,
  REM_ACCESS_ERR = 10,
  REM_OP_ERR = 11,
  RETRY_EXC_ERR = 12,
  RNR_RETRY_EXC_ERR = 13,
  LOC_RDD_VIOL_ERR = 14,
  REM_INV_RD_REQ_ERR = 15,
  REM_ABORT_ERR = 16,
  INV_EECN_ERR = 17,
  INV_EEC_STATE_ERR = 18,
  FATAL_ERR = 19,
  RESP_TIMEOUT_ERR = 20,
  GENERAL_ERR = 21,
};
const char* to_string(WcStatus s);

enum class WcOpcode : uint8_t {
  SEND = 0,
  RDMA_WRITE = 1,
  RDMA_READ = 2,
  COMP_SWAP = 3,
  FETCH_ADD = 4,
  BIND_MW = 5,
  LOCAL_INV = 6,
  REG_MR = 64,  // no libibverbs number (see VSTELLAR_WC_REG_MR)
  RECV = 128,
  RECV_RDMA_WITH_IMM = 129,
};

enum class QpState : uint8_t { RESET = 0, INIT = 1, RTR = 2, RTS = 3, SQD = 4, SQE = 5, ERR = 6 };
const char* to_string(QpState s);

// ibv_access_flags
enum : uint32_t {
  ACCESS_LOCAL_WRITE = 1,
  ACCESS_REMOTE_WRITE = 2,
  ACCESS_REMOTE_READ = 4,
  ACCESS_REMOTE_ATOMIC = 8,
  ACCESS_ALL_SUPPORTED = 0xF,  // what a QP's qp_access_flags may hold
  ACCESS_MW_BIND = 16,         // MRs only: windows may be bound to it
  ACCESS_MR_SUPPORTED = 0x1F,  // what an MR's access may hold
};

// ibv_send_flags
enum : uint32_t {
  SEND_FENCE = 1,
  SEND_SIGNALED = 2,
  SEND_SOLICITED = 4,
  SEND_INLINE = 8,
};

// ibv_wc_flags
// WC_SRQ: a receive whose WQE came from the QP's SRQ (wr_id is the one
// given to post_srq_recv). WC_GRH_IPV4: the GRH area of a datagram holds
// an IPv4 header (RoCEv2 over IPv4), not an IPv6 one.
// WC_WITH_INV: a SEND_WITH_INV arrived and its key was invalidated; the
// key is in Wc::imm_data (ibv_wc.invalidated_rkey shares that word).
enum : uint32_t { WC_GRH = 1, WC_WITH_IMM = 2, WC_SRQ = 4, WC_GRH_IPV4 = 8, WC_WITH_INV = 16 };

// ibv_qp_attr_mask
enum : uint32_t {
  QP_STATE = 1u << 0,
  QP_CUR_STATE = 1u << 1,
  QP_EN_SQD_ASYNC_NOTIFY = 1u << 2,
  QP_ACCESS_FLAGS = 1u << 3,
  QP_PKEY_INDEX = 1u << 4,
  QP_PORT = 1u << 5,
  QP_QKEY = 1u << 6,
  QP_AV = 1u << 7,
  QP_PATH_MTU = 1u << 8,
  QP_TIMEOUT = 1u << 9,
  QP_RETRY_CNT = 1u << 10,
  QP_RNR_RETRY = 1u << 11,
  QP_RQ_PSN = 1u << 12,
  QP_MAX_QP_RD_ATOMIC = 1u << 13,
  QP_ALT_PATH = 1u << 14,
  QP_MIN_RNR_TIMER = 1u << 15,
  QP_SQ_PSN = 1u << 16,
  QP_MAX_DEST_RD_ATOMIC = 1u << 17,
  QP_PATH_MIG_STATE = 1u << 18,
  QP_CAP = 1u << 19,
  QP_DEST_QPN = 1u << 20,
};

// ibv_mtu: 1 = 256 ... 5 = 4096.
enum : uint32_t { MTU_256 = 1, MTU_512 = 2, MTU_1024 = 3, MTU_2048 = 4, MTU_4096 = 5 };
inline uint32_t mtu_bytes(uint32_t ibv_mtu) { return (ibv_mtu >= 1 && ibv_mtu <= 5) ? 128u << ibv_mtu : 0; }

// Device limits (what ibv_query_device would report).
struct DeviceLimits {
  static constexpr uint32_t kMaxQpWr = 16384;
  static constexpr uint32_t kMaxSge = 16;
  static constexpr uint32_t kMaxInline = 1024;
  static constexpr uint32_t kMaxCqe = 1 << 20;
  static constexpr uint8_t kMaxRdAtomic = 16;
  static constexpr uint64_t kMaxMsgSize = 1ull << 31;
  static constexpr uint32_t kMaxQpn = 0xFFFFFF;
  static constexpr uint32_t kFirstQpn = 0x11;  // lower QPNs are reserved (QP0, QP1)
  static constexpr uint32_t kMaxMcastGroups = 256;    // multicast groups with a QP attached
  static constexpr uint32_t kMaxMcastQpAttach = 64;   // QPs attached to one group
};

// An IP address as RoCE v2 GIDs write it: an IPv6 address, or an IPv4 one
// mapped into IPv6 (::ffff:a.b.c.d). One type for both families, so the
// engine, its links and the daemon carry addresses without asking which;
// the link turns it into a socket address at the last moment.
struct IpAddr {
  std::array<uint8_t, 16> b{};
  IpAddr() = default;
  // An IPv4 address in host byte order; 0 is unspecified. Implicit,
  // because most of the engine's callers and tests name IPv4 peers.
  IpAddr(uint32_t v4) {  // NOLINT(google-explicit-constructor)
    if (v4 == 0) return;
    b[10] = b[11] = 0xff;
    for (int i = 0; i < 4; i++) b[12 + i] = uint8_t(v4 >> (24 - 8 * i));
  }
  static IpAddr from_bytes(const uint8_t* p) {
    IpAddr a;
    for (int i = 0; i < 16; i++) a.b[i] = p[i];
    return a;
  }
  bool is_v4() const {
    for (int i = 0; i < 10; i++)
      if (b[i]) return false;
    return b[10] == 0xff && b[11] == 0xff;
  }
  // Host order; only meaningful when is_v4().
  uint32_t v4() const {
    return uint32_t(b[12]) << 24 | uint32_t(b[13]) << 16 | uint32_t(b[14]) << 8 | b[15];
  }
  // :: and 0.0.0.0 (as ::ffff:0.0.0.0) both mean "no address".
  bool unspecified() const {
    if (is_v4()) return v4() == 0;
    for (uint8_t x : b)
      if (x) return false;
    return true;
  }
  bool is_multicast() const { return is_v4() ? (b[12] & 0xf0) == 0xe0 : b[0] == 0xff; }
  // fe80::/10: meaningful only on one link, so never a peer of ours.
  bool is_link_local() const { return b[0] == 0xfe && (b[1] & 0xc0) == 0x80; }
  bool operator==(const IpAddr&) const = default;
  auto operator<=>(const IpAddr&) const = default;
};

// An address prefix (a subnet): 10.77.0.0/24, fd77::/64. An IPv4
// prefix's length counts the IPv4 bits (0..32).
struct IpPrefix {
  IpAddr addr;
  uint8_t len = 0;
  bool contains(const IpAddr& a) const {
    if (a.is_v4() != addr.is_v4()) return false;
    const unsigned first = addr.is_v4() ? 96 : 0;  // where the prefix's bits start in b
    const unsigned bits = first + len;
    for (unsigned i = first; i < bits; i++)
      if (((a.b[i / 8] ^ addr.b[i / 8]) >> (7 - i % 8)) & 1) return false;
    return true;
  }
  bool operator==(const IpPrefix&) const = default;
};

// Where a peer engine lives: its address and the UDP port its engine
// receives on (its base port). Paths are source ports, so the source port
// of arriving packets is not part of the peer's identity.
struct Endpoint {
  IpAddr ip;
  uint16_t port = 0;
  bool operator==(const Endpoint&) const = default;
  auto operator<=>(const Endpoint&) const = default;
};

// ibv_qp_type numbering; a GSI QP is a UD QP that answers to QP number 1.
enum class QpType : uint8_t { GSI = 1, RC = 2, UC = 3, UD = 4 };

using Gid = std::array<uint8_t, 16>;

// Where a UD send goes: the peer engine, its QP and Q_Key, and the GIDs and
// GRH fields the receiver is shown (its GRH area is built from them).
struct UdDest {
  Endpoint peer;
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;  // bit 31 set: use the sending QP's own Q_Key
  Gid sgid{};
  Gid dgid{};
  uint32_t flow_label = 0;
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 64;
};

struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

class MemoryTranslator;

// The memory-key operations of a send queue (WrOpcode::REG_MR, BIND_MW).
// Keys are index << 8 | key byte (see Engine::alloc_mr).
struct FastRegWr {
  uint32_t key = 0;  // names the MR by its index; its byte becomes the MR's
  uint64_t iova = 0;
  uint64_t length = 0;
  uint32_t access = 0;  // ACCESS_*, ACCESS_MW_BIND included
  // The new translation of [iova, iova + length), built by the caller from
  // the page list (vstellard: PVDMA/eMTT).
  std::shared_ptr<MemoryTranslator> mem;
};

struct BindMwWr {
  uint32_t mw_rkey = 0;   // the window's current rkey
  uint32_t new_rkey = 0;  // same index, the consumer's key byte
  uint32_t mr_lkey = 0;
  uint64_t addr = 0;
  uint64_t length = 0;    // 0: unbind (type 1)
  uint32_t access = 0;    // ACCESS_REMOTE_*
  uint8_t mw_type = 0;    // what the poster meant: 1 bind verb, 2 work request
};

struct SendWr {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::SEND;
  uint32_t send_flags = 0;
  const Sge* sg_list = nullptr;
  uint32_t num_sge = 0;
  uint32_t imm_data = 0;  // host order here; network order on the wire
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;  // atomics: compare (CAS) or add (FAA)
  uint64_t swap = 0;         // atomics: swap value (CAS)
  UdDest ud;                 // UD/GSI QPs only
  uint32_t invalidate_rkey = 0;  // LOCAL_INV, SEND_WITH_INV
  FastRegWr reg;                 // REG_MR
  BindMwWr bind;                 // BIND_MW
};

struct RecvWr {
  uint64_t wr_id = 0;
  const Sge* sg_list = nullptr;
  uint32_t num_sge = 0;
};

// Wc::vendor_err of a failed REG_MR, LOCAL_INV or BIND_MW: why, in the
// numbering of the device's status codes (VSTELLAR_STATUS_*).
enum : uint32_t {
  VENDOR_BAD_FIELD = 3,    // a value of the work request
  VENDOR_BAD_HANDLE = 4,   // the key names no object of this QP's PD
  VENDOR_BAD_STATE = 5,    // the object's state forbids it
  VENDOR_BAD_ADDRESS = 8,  // the page list or a page is not guest memory
  VENDOR_ACCESS = 9,       // access rights, key byte or bounds
  VENDOR_BUSY = 10,        // windows are bound to the MR
};

struct Wc {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::SUCCESS;
  WcOpcode opcode = WcOpcode::SEND;
  uint32_t vendor_err = 0;
  uint32_t byte_len = 0;
  uint32_t imm_data = 0;
  uint32_t qp_num = 0;
  uint32_t src_qp = 0;
  uint32_t wc_flags = 0;
};

struct QpCap {
  uint32_t max_send_wr = 128;
  uint32_t max_recv_wr = 128;
  uint32_t max_send_sge = 4;
  uint32_t max_recv_sge = 4;
  uint32_t max_inline_data = 256;
};

class Srq;

struct QpInitAttr {
  QpType qp_type = QpType::RC;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  // RC and UD: receives come from this SRQ (same PD); cap.max_recv_wr and
  // cap.max_recv_sge are then ignored and the QP has no RQ of its own.
  Srq* srq = nullptr;
  QpCap cap;
  bool sq_sig_all = false;
  // The engine user's name for whoever posts this QP's receives (vstellard:
  // the device), handed to the receive-refill hook (Engine::set_recv_refill).
  uint64_t owner = 0;
};

struct QpAttr {
  QpState qp_state = QpState::RESET;
  QpState cur_qp_state = QpState::RESET;
  uint32_t path_mtu = MTU_4096;
  uint32_t qp_access_flags = 0;
  uint16_t pkey_index = 0;
  uint8_t port_num = 1;
  Endpoint ah;  // the address vector: the peer engine
  // The address the QP sends from and is reached at (the address vector's
  // source GID), set with QP_AV. Unspecified: the link's own address.
  IpAddr local;
  uint32_t dest_qp_num = 0;
  uint32_t qkey = 0;  // UD/GSI
  uint32_t rq_psn = 0;
  uint32_t sq_psn = 0;
  uint8_t max_rd_atomic = 1;
  uint8_t max_dest_rd_atomic = 1;
  uint8_t min_rnr_timer = 0;
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t sq_draining = 0;
  uint8_t en_sqd_async_notify = 0;
};

enum class AsyncEventType : uint8_t {
  QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, SQ_DRAINED, CQ_ERR, COMM_EST,
  SRQ_LIMIT_REACHED,    // object: the SRQN
  QP_LAST_WQE_REACHED,  // a QP on an SRQ entered ERR; object: the QPN
};
struct AsyncEvent {
  AsyncEventType type;
  uint32_t qpn_or_cqn;  // or the SRQN, by type
};

// Serial-number comparison of 32-bit PSNs (RFC 1982 style).
inline bool seq_lt(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) < 0; }
inline bool seq_le(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) <= 0; }

}  // namespace vstellar
