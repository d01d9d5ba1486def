// RC queue pair: verbs state plus the transport state of its connection.
// The requester side (send queue, PSN window, retransmission timers) and the
// responder side (receive queue, arrival bitmap, ACK state) live together, as
// in an RC QP on hardware. Engine code operates on it; applications only use
// the Engine API.
#pragma once
#include <cstdint>
#include <queue>
#include <vector>

#include "vstellar/cc.h"
#include "vstellar/cq.h"
#include "vstellar/path.h"
#include "vstellar/pd.h"
#include "vstellar/types.h"
#include "vstellar/wire.h"

namespace vstellar {

// A send WQE, copied out of the caller's WR at post time (no double fetch).
struct SendWqe {
  uint64_t wr_id = 0;
  WrOpcode op = WrOpcode::SEND;
  uint32_t flags = 0;
  uint32_t imm = 0;
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  uint64_t cmp_add = 0, swap = 0;
  uint32_t nsge = 0;
  Sge sge[DeviceLimits::kMaxSge];
  bool is_inline = false;
  uint64_t len = 0;
  bool signaled = false;
  // transport
  bool started = false;
  bool done = false;
  WcStatus status = WcStatus::SUCCESS;
  uint32_t first_psn = 0;
  uint32_t npkts = 0;      // PSNs this WQE uses
  uint32_t pkts_sent = 0;  // PSNs given a first transmission
  uint32_t pkts_done = 0;  // PSNs acknowledged (or answered, for READ/atomic)
  uint32_t seg = 0;        // payload bytes per packet
  uint32_t rsn = 0;        // receive sequence number (SEND*, WRITE_IMM)
  uint8_t rnr_left = 0;
  uint64_t rnr_hold_until = 0;
  bool rd_counted = false;  // counts against max_rd_atomic until retired
  UdDest ud;                // UD/GSI QPs: where the datagram goes
};

enum class PktKind : uint8_t { DATA, READ, ATOMIC };

// One PSN in flight. Records are indexed by PSN modulo the window.
struct PktRec {
  uint64_t wqe = 0;  // send queue index (monotonic) of the owning WQE
  uint32_t off = 0;  // offset in the message
  uint32_t len = 0;
  uint32_t tx_seq = 0;  // bumps on every (re)transmission; stale timers compare it
  uint16_t path = 0;
  uint8_t retries = 0;
  PktKind kind = PktKind::DATA;
  bool acked = false;
  uint64_t sent_ns = 0;
};

struct RetxTimer {
  uint64_t deadline;
  uint32_t psn;
  uint32_t tx_seq;
  bool rnr;  // an RNR wait, not a loss: does not count as a transport retry
  bool operator>(const RetxTimer& o) const { return deadline > o.deadline; }
};

struct RecvWqe {
  uint64_t wr_id = 0;
  uint32_t nsge = 0;
  Sge sge[DeviceLimits::kMaxSge];
  uint64_t cap = 0;  // sum of SGE lengths
  // filled by the responder
  bool have_last = false;
  uint32_t last_psn = 0;
  uint32_t byte_len = 0;
  uint32_t imm = 0;
  bool with_imm = false;
  bool write_imm = false;
  WcStatus status = WcStatus::SUCCESS;
};

class Qp {
 public:
  uint32_t qpn() const { return qpn_; }
  QpState state() const { return state_; }

  // ---- verbs state ----
  uint32_t qpn_ = 0;
  QpState state_ = QpState::RESET;
  Pd* pd = nullptr;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  QpInitAttr init;
  QpAttr attr;
  uint32_t seg = 4096;  // payload bytes per packet: min(engine MTU, path MTU)

  // ---- send queue (requester) ----
  std::vector<SendWqe> sq;
  std::vector<uint8_t> inline_buf;  // max_inline_data bytes per SQ slot
  uint64_t sq_head = 0;  // oldest WQE not yet completed
  uint64_t sq_next = 0;  // next WQE to (continue to) transmit
  uint64_t sq_tail = 0;  // next free slot
  uint32_t rd_atomic_outstanding = 0;
  uint32_t next_rsn = 0;

  uint32_t snd_una = 0;  // oldest PSN not acknowledged
  uint32_t snd_nxt = 0;  // next new PSN
  std::vector<PktRec> recs;  // window-sized ring
  std::priority_queue<RetxTimer, std::vector<RetxTimer>, std::greater<RetxTimer>> timers;
  uint64_t last_progress_ns = 0;  // last time the peer acknowledged anything new
  uint32_t cum_seen = 0;  // highest cumulative ACK processed
  bool drained_reported = false;
  uint64_t inflight = 0;  // payload bytes sent (or requested) and not yet acknowledged
  uint64_t srtt = 0, rttvar = 0;
  CongestionControl cc;
  PathSelector paths{PathAlgo::OBS, 1, 1};

  // ---- receive queue (responder) ----
  std::vector<RecvWqe> rq;
  uint64_t rq_head = 0;  // == rsn of the oldest uncompleted receive WQE
  uint64_t rq_tail = 0;
  uint32_t epsn = 0;           // every PSN before it has arrived
  std::vector<uint64_t> rbits;  // arrival bitmap over [epsn, epsn+window)
  std::vector<wire::Packet> pending_rd;  // READ/atomic requests waiting for epsn
  struct AtomicReplay { uint32_t psn; uint64_t orig; bool valid; };
  AtomicReplay atomic_replay[32] = {};
  unsigned atomic_replay_next = 0;

  // ACK state: what arrived since the last ACK
  bool ack_pending = false;
  uint64_t last_ack_ns = 0;
  uint32_t ack_lo = 0, ack_hi = 0;  // PSN range to cover with SACK bits
  uint32_t rx_since_ack = 0, ce_since_ack = 0;
  uint32_t last_ts = 0;
  uint16_t last_path = 0;

  // ---- datagram QPs (UD, GSI) ----
  std::vector<Gid> local_gids;  // GSI: the GIDs it answers QP 1 for (set by its owner)
  uint32_t ud_next_path = 0;    // datagrams go round-robin over the paths
  bool is_ud() const { return init.qp_type != QpType::RC; }
  bool is_gsi() const { return init.qp_type == QpType::GSI; }

  uint32_t window() const { return uint32_t(recs.size()); }
  PktRec& rec(uint32_t psn) { return recs[psn & (recs.size() - 1)]; }
  SendWqe& sq_at(uint64_t i) { return sq[i % sq.size()]; }
  RecvWqe& rq_at(uint64_t i) { return rq[i % rq.size()]; }
  bool rbit(uint32_t psn) const {
    uint32_t i = psn & (window() - 1);
    return (rbits[i / 64] >> (i % 64)) & 1;
  }
  void set_rbit(uint32_t psn, bool v) {
    uint32_t i = psn & (window() - 1);
    if (v) rbits[i / 64] |= 1ull << (i % 64);
    else rbits[i / 64] &= ~(1ull << (i % 64));
  }
};

}  // namespace vstellar
