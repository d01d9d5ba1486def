// What the engine's parts share and its users never see, in the spirit of
// rxe's rxe_loc.h: the whole QP (QpImpl, behind the public Qp), the records
// of WQEs and packets in flight, the helpers requester.cc, responder.cc,
// completer.cc and datagram.cc have in common, and EngineCore, the state and
// methods behind the public Engine. Only engine/src (and white-box tests)
// include it; vstellard, the harness and the benches use vstellar/engine.h.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "integrity.h"
#include "vstellar/engine.h"
#include "vstellar/roce_wire.h"
#include "vstellar/wire.h"

namespace vstellar {

// IB encoding of min_rnr_timer (and of an RNR NAK's timer field), in
// microseconds.
// The RNR wait a page fault asks for (resp_fault_nak): at first the QP's
// RNR timer, at most kFaultRnrUs; growing to kFaultRnrMaxUs while the
// fault lasts.
inline constexpr uint32_t kFaultRnrUs = 1280;
inline constexpr uint32_t kFaultRnrMaxUs = 20480;
// A pass later than this after its deadline finds the engine was not
// running (EngineCore::forgive_lateness).
inline constexpr uint64_t kLatePassNs = 5'000'000;
// How often a WQE waiting for on-demand pages looks again when no mapping
// wakes it (req_start): the translator's own timeout ends the wait.
inline constexpr uint64_t kFaultPollNs = 1'000'000;
// The longest a peer's PAUSED notice holds a connection's retry clock: a
// migration that never ends does not keep a dead connection forever.
inline constexpr uint64_t kPeerPauseMaxNs = 30'000'000'000;
inline constexpr uint32_t kRnrUs[32] = {655360, 10,    20,    30,    40,    60,     80,     120,
                                        160,    240,   320,   480,   640,   960,    1280,   1920,
                                        2560,   3840,  5120,  7680,  10240, 15360,  20480,  30720,
                                        40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};

// READ and the atomics: the responder answers them with data, and they count
// against max_rd_atomic while outstanding.
inline bool is_rd_atomic(WrOpcode op) {
  return op == WrOpcode::RDMA_READ || op == WrOpcode::ATOMIC_CMP_AND_SWP ||
         op == WrOpcode::ATOMIC_FETCH_AND_ADD;
}

// RTS and SQD: the states in which a QP's requester runs (SQD finishes
// what it started).
inline bool sends(QpState s) { return s == QpState::RTS || s == QpState::SQD; }

inline bool is_atomic(WrOpcode op) {
  return op == WrOpcode::ATOMIC_CMP_AND_SWP || op == WrOpcode::ATOMIC_FETCH_AND_ADD;
}

// A send WQE: the posted SendWr, copied at post time (no double fetch: the
// caller's SGE list and inline bytes are not read again), plus how far its
// transmission got. SendWr is what a caller hands over; this is what the SQ
// holds while the WR is in flight.
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
  uint32_t read_fence = 0;  // READ: the PSN after the last other request before it
  uint32_t npkts = 0;      // PSNs this WQE uses
  uint32_t pkts_sent = 0;  // PSNs given a first transmission
  uint32_t pkts_done = 0;  // PSNs acknowledged (or answered, for READ/atomic)
  uint32_t seg = 0;        // payload bytes per packet
  uint32_t rsn = 0;        // receive sequence number (SEND*, WRITE_IMM)
  uint8_t rnr_left = 0;
  uint64_t rnr_hold_until = 0;
  bool rd_counted = false;  // counts against max_rd_atomic until retired
  UdDest ud;                // UD/GSI QPs: where the datagram goes
  // REG_MR, BIND_MW (LOCAL_INV and SEND_WITH_INV keep their key in rkey)
  FastRegWr reg;
  BindMwWr bind;
  uint32_t vendor_err = 0;  // VENDOR_*, with a failed key operation
  uint16_t path = 0;        // UC: the path every packet of the message takes
};

// Work requests the requester executes itself, in send-queue order, with
// no packet.
inline bool is_local_op(WrOpcode op) {
  return op == WrOpcode::REG_MR || op == WrOpcode::LOCAL_INV || op == WrOpcode::BIND_MW;
}

enum class PktKind : uint8_t { DATA, READ, ATOMIC };

// One PSN in flight. Records are indexed by PSN modulo the window; the
// window is charged to the guest per QP (memory limits), so new fields go
// into the padding or the bits below.
struct PktRec {
  uint64_t wqe = 0;  // send queue index (monotonic) of the owning WQE
  uint32_t off = 0;  // offset in the message
  uint32_t len = 0;
  uint32_t tx_seq = 0;  // bumps on every (re)transmission; stale timers compare it
  uint16_t path = 0;
  uint8_t retries = 0;
  PktKind kind = PktKind::DATA;
  bool acked = false;
  bool lost = false;  // timed out, waiting in QpImpl::resend for room in the window
  // In the first PSN of a request's latest transmission: how many PSNs it
  // asked for (a READ run); 0 in the others. Requests sent in one pass
  // share sent_ns, so a run is not told apart by its time.
  uint16_t run = 0;
  // The path of the transmission before the latest resend: the one a
  // late answer older than the resend proves was not lost.
  uint16_t prev_path = 0;
  // DATA: more than one copy of this PSN went out (a resend, or a probe's
  // copy on another path), so an ACK for it does not say which arrived,
  // nor over which path (comp_path_gaps_before).
  bool copies : 1 = false;
  bool on_path : 1 = false;  // in its path's list (path_prev, path_next below)
  bool overdue : 1 = false;  // found lost by the overdue rule (comp_overdue)
  uint64_t sent_ns = 0;
  // The responder said it holds this request (Syndrome::HELD) at this
  // time: its answer waits for an earlier PSN, not for the network, and
  // its timer counts from here (req_timers).
  uint64_t held_ns = 0;
  // DATA: in its path's list of transmissions awaiting an ACK
  // (QpImpl::path_order), between the PSNs path_prev and path_next.
  uint32_t path_prev = 0, path_next = 0;
};

struct RetxTimer {
  uint64_t deadline;
  uint32_t psn;
  uint32_t tx_seq;
  bool rnr;  // an RNR wait, not a loss: does not count as a transport retry
  // The QP's quiet timer (req_quiet), not a packet's: psn and tx_seq unused.
  bool quiet = false;
  // The QP's overdue timer (comp_overdue), not a packet's: psn and tx_seq unused.
  bool overdue = false;
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
  bool from_srq = false;  // taken from the QP's SRQ (completes with WC_SRQ)
  bool with_inv = false;  // SEND_WITH_INV: imm holds the key it invalidated
  WcStatus status = WcStatus::SUCCESS;
};

// An SRQ: posted receive WQEs in posting order. A QP takes the oldest when
// a message needs one and keeps its own copy (QpImpl::rq), so a slot here
// frees as soon as it is taken.
class SrqImpl final : public Srq {
 public:
  using Srq::limit_;
  using Srq::max_sge_;
  using Srq::max_wr_;
  using Srq::pd_;
  using Srq::srqn_;

  std::vector<RecvWqe> ring;  // max_wr slots
  uint64_t head = 0;          // oldest WQE not yet taken by a QP
  uint64_t tail = 0;          // next free slot
  uint32_t refs = 0;          // QPs attached; destroy fails while non-zero
  RecvWqe& at(uint64_t i) { return ring[i % ring.size()]; }
  uint64_t posted() const { return tail - head; }
};

inline SrqImpl& impl(Srq& srq) { return static_cast<SrqImpl&>(srq); }
inline SrqImpl* impl(Srq* srq) { return static_cast<SrqImpl*>(srq); }
inline const SrqImpl& impl(const Srq& srq) { return static_cast<const SrqImpl&>(srq); }

// PSNs a QP in plain RoCE v2 mode may have sent and not had answered: what
// rxe allows itself (RXE_MAX_UNACKED_PSNS), so that a software peer's
// receive path, sized for that, is not flooded (a larger window against
// rxe on a busy host made its ACKs late enough to time out, spuriously).
constexpr uint32_t kRoceMaxUnackedPsns = 128;

// READ/atomic requests a responder holds until epsn reaches them, per QP.
constexpr size_t kMaxPendingReads = 1024;

// The whole QP: verbs state plus the transport state of its connection.
// The requester side (send queue, PSN window, retransmission timers) and
// the responder side (receive queue, arrival bitmap, ACK state) live
// together, as in an RC QP on hardware. The public Qp part (number, state,
// PD, type) is written only here, by the engine.
class QpImpl final : public Qp {
 public:
  using Qp::pd_;
  using Qp::qpn_;
  using Qp::state_;
  using Qp::type_;

  // ---- verbs state ----
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
  uint32_t read_fence = 0;  // the PSN after the last request that is not a READ
  std::vector<PktRec> recs;  // window-sized ring
  std::priority_queue<RetxTimer, std::vector<RetxTimer>, std::greater<RetxTimer>> timers;
  uint64_t last_progress_ns = 0;  // last time the peer acknowledged anything new
  // The quiet timer (req_quiet): when data last went out, whether the
  // timer is armed, the progress it last acted on, and the newest
  // transmission known to have arrived (sent once, acknowledged).
  uint64_t last_data_tx_ns = 0;
  bool quiet_armed = false;
  uint64_t quiet_acted_at = UINT64_MAX;
  uint64_t newest_arrived_sent_ns = 0;
  // The overdue rule (comp_overdue): the oldest PSN it has not judged yet,
  // and the deadline of its armed timer (0: none armed).
  uint32_t overdue_next = 0;
  uint64_t overdue_armed_ns = 0;
  // How many slowest round trips beyond two the rule waits: one more per
  // packet it took for lost that was answered for its first transmission,
  // one less per 16 it was right about (comp_overdue_verdict).
  uint8_t overdue_slack = 0, overdue_right = 0;
  uint64_t last_post_ns = 0;      // last time the owner posted a WR
  // The next WQE waits for pages of an on-demand MR (req_local_pages):
  // look again at this time, or when they are mapped (Engine::pages_mapped).
  uint64_t fault_retry_ns = 0;
  // The next packets to send belong to a WQE on RNR hold (its
  // rnr_hold_until): look again at this time. The RNR NAK armed timers
  // only for the packets it had sent, and answers to earlier transmissions
  // may acknowledge all of those meanwhile; without this, nothing would
  // wake the QP to send the rest of the message.
  uint64_t rnr_wake_ns = 0;
  // Responder: when the requests it refuses for missing on-demand pages
  // began (resp_fault_nak); 0 once a request succeeds again.
  uint64_t fault_since_ns = 0;
  // The peer said it is paused (Syndrome::PAUSED, a live migration) at
  // this time: its silence does not count against the retry limit until it
  // says it runs again, or kPeerPauseMaxNs have passed.
  uint64_t peer_paused_ns = 0;
  // RTO backoff of the connection: timeouts of its oldest PSN in a row with
  // nothing acknowledged in between (a stalled or dead peer). Packets back
  // off only as far as this: under random loss, ACKs keep coming and a
  // packet lost twice is resent after one RTO, not four.
  uint8_t backoff = 0;
  bool stalled = false;           // counted in EngineStats::stalled_qps (audit.cc)
  uint32_t cum_seen = 0;  // highest cumulative ACK processed
  // The path health entry of the peer `health_peer` (EngineCore::health_of).
  std::vector<PathHealth>* health = nullptr;
  Endpoint health_peer;
  bool drained_reported = false;
  uint64_t inflight = 0;  // payload bytes sent (or requested) and not yet acknowledged
  uint64_t srtt = 0, rttvar = 0;
  CongestionControl cc;
  // PSNs whose packet timed out, oldest first: a lost packet leaves the
  // bytes in flight, and its resend waits for room in the window as new
  // data does (after a burst of losses, resending all of them at once
  // would overflow the queue that dropped them again).
  std::deque<uint32_t> resend;
  // READ re-requests in flight, oldest first (comp_read_reruns): an
  // answer to a later request over the same path shows what of them was
  // lost again. At most kMaxReadReruns; the timer finds the rest.
  struct ReadRerun {
    uint32_t psn, n;
    uint16_t path;
    uint64_t sent_ns;
  };
  static constexpr size_t kMaxReadReruns = 64;
  std::deque<ReadRerun> read_reruns;
  // For each path, the DATA PSNs whose latest transmission went over it
  // and is not yet acknowledged, in the order they were sent: a doubly
  // linked list through the PSNs' records (PktRec::on_path). A path (one
  // UDP 5-tuple) keeps order, so once a packet of the path is known to
  // have arrived, those ahead of it in its list were lost
  // (comp_path_gaps_before, comp_path_gaps_echo). Sized on first use
  // (path_link).
  struct PathOrder {
    uint32_t head = 0, tail = 0;  // PSNs, valid while n > 0
    uint32_t n = 0;
    // The round trip of the path's latest packet acknowledged, sent once:
    // from its departure to the ACK that first reported it, so at most an
    // ACK delay above the truth (comp_overdue's measure of the path).
    uint64_t answered_in_ns = 0;
  };
  std::vector<PathOrder> path_order;
  // Appends psn's latest transmission to its path's list; takes it out
  // (acknowledged, lost, or sent again). Both in completer.cc.
  void path_link(uint32_t psn);
  void path_unlink(uint32_t psn);
  PathSelector paths{PathAlgo::OBS, 1, 1};

  // ---- receive queue (responder) ----
  // With an SRQ, rq holds the WQEs this QP took from it (take_srq_wqes)
  // until they complete, in message order.
  SrqImpl* srq = nullptr;
  std::vector<RecvWqe> rq;
  uint64_t rq_head = 0;  // == rsn of the oldest uncompleted receive WQE
  uint64_t rq_tail = 0;
  uint32_t epsn = 0;           // every PSN before it has arrived
  std::vector<uint64_t> rbits;  // arrival bitmap over [epsn, epsn+window)
  std::vector<wire::Packet> pending_rd;  // READ/atomic requests waiting for epsn
  struct AtomicReplay { uint32_t psn; uint64_t orig; bool valid; };
  AtomicReplay atomic_replay[32] = {};
  unsigned atomic_replay_next = 0;
  // READs executed whose PSNs are still within a window behind epsn, in
  // PSN order: a duplicate READ request is answered only if it asks again
  // for (a tail of) one of these, so a spoofed "retransmission" cannot make
  // the responder send what the peer never asked for.
  struct ReadDone { uint32_t psn, npsn; uint64_t va; uint32_t rkey, len, msg_off; uint16_t seg; };
  std::deque<ReadDone> reads_done;

  // ACK state: what arrived since the last ACK
  bool ack_pending = false;
  bool active = false;  // in EngineCore::active_qps_
  uint64_t last_ack_ns = 0;
  uint32_t ack_lo = 0, ack_hi = 0;  // PSN range to cover with SACK bits
  uint32_t rx_since_ack = 0, ce_since_ack = 0;
  uint32_t last_ts = 0;
  uint16_t last_path = 0;

  // ---- UC responder (resp_uc) ----
  // In a message: the next packet must be epsn and continue it; otherwise
  // only a FIRST or ONLY packet is taken. The message's WQE is rq_head's
  // (SEND) and its opcode and length come from its first packet.
  bool uc_in_msg = false;
  wire::Op uc_op = wire::Op::SEND;
  uint32_t uc_len = 0;
  uint64_t uc_va = 0;
  uint32_t uc_rkey = 0;

  // ---- datagram QPs (UD, GSI) ----
  std::vector<Gid> local_gids;  // GSI: the GIDs it answers QP 1 for (Engine::set_gsi_gids)
  uint32_t ud_next_path = 0;    // datagrams go round-robin over the paths

  // ---- RoCE v2 mode (roce_mode.cc) ----
  // Set at RTR for an RC QP whose peer is in EngineConfig::roce. The
  // responder takes packets in PSN order only; the message in progress
  // supplies what RoCE's middle and last packets do not carry.
  bool roce = false;
  bool roce_nak_sent = false;  // a NAK for epsn went out: no other until it arrives
  bool roce_in_msg = false;
  wire::Op roce_op = wire::Op::SEND;
  uint64_t roce_va = 0;
  uint32_t roce_rkey = 0, roce_len = 0, roce_off = 0;
  uint32_t roce_msn = 0;       // messages completed as responder (AETH MSN)
  uint16_t roce_sport_path = 0;  // the link path (UDP source port) of every packet

  // Integrity mode: the MAC keys of this connection, each way (set at RTR),
  // this side's packet counter and the peer's counters seen.
  MacSender mac_tx;
  MacKey mac_rx{};
  ReplayWindow mac_rx_seen;

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


inline QpImpl& impl(Qp& qp) { return static_cast<QpImpl&>(qp); }
inline QpImpl* impl(Qp* qp) { return static_cast<QpImpl*>(qp); }
inline const QpImpl* impl(const Qp* qp) { return static_cast<const QpImpl*>(qp); }
inline const QpImpl& impl(const Qp& qp) { return static_cast<const QpImpl&>(qp); }

// Random numbers for identifiers a peer must not guess (QPNs): from the
// kernel's CSPRNG (getrandom, read in blocks), or with a non-zero seed a
// fixed splitmix64 sequence (tests that must repeat).
class IdRandom {
 public:
  void Seed(uint64_t seed) {
    fixed_ = seed != 0;
    state_ = seed;
    left_ = 0;
  }
  uint64_t Next();

 private:
  bool fixed_ = false;
  uint64_t state_ = 0;
  uint64_t buf_[32];
  unsigned left_ = 0;
};

// The engine itself; Engine forwards its public methods here. The verbs
// return 0 or a positive errno, as Engine documents.
class EngineCore {
 public:
  EngineCore(const EngineConfig& cfg, Link& link, Clock& clock);

  // ---- verbs (engine.cc, qp.cc) ----
  Pd* alloc_pd();
  int dealloc_pd(Pd* pd);
  Mr* reg_mr(Pd* pd, uint64_t iova, uint64_t length, uint32_t access,
             std::shared_ptr<MemoryTranslator> mem);
  int dereg_mr(Mr* mr);
  int invalidate_mr(Mr* mr);
  void pages_mapped();
  Cq* create_cq(uint32_t cqe);
  int destroy_cq(Cq* cq);
  QpImpl* create_qp(Pd* pd, const QpInitAttr& init);
  int modify_qp(QpImpl* qp, const QpAttr& attr, uint32_t mask);
  ModifyQpCheck check_modify_qp(QpImpl* qp, const QpAttr& attr, uint32_t mask);
  int query_qp(QpImpl* qp, QpAttr& attr, QpInitAttr& init);
  int destroy_qp(QpImpl* qp);
  int post_send(QpImpl* qp, const SendWr& wr, WcStatus* why);
  int post_recv(QpImpl* qp, const RecvWr& wr, WcStatus* why);
  int set_gsi_gids(QpImpl* qp, const std::vector<Gid>& gids);
  SrqImpl* create_srq(Pd* pd, const SrqInitAttr& init);
  int modify_srq(SrqImpl* srq, uint32_t limit);
  int resize_srq(SrqImpl* srq, uint32_t max_wr);
  int destroy_srq(SrqImpl* srq);
  int post_srq_recv(SrqImpl* srq, const RecvWr& wr, WcStatus* why);
  // srq.cc: a QP on an SRQ takes WQEs until it holds `want` uncompleted
  // ones (or the SRQ or the QP's rq runs out); returns what it holds.
  uint64_t take_srq_wqes(QpImpl& qp, uint64_t want);
  // Receive WQEs the QP holds for arriving messages, at least `want` if it
  // can: its own, or taken from its SRQ, and if short after asking the
  // owner for what was published since (recv_refill_).
  uint64_t recv_held(QpImpl& qp, uint64_t want);
  Engine::RecvRefill recv_refill_;
  bool owns_srq(const SrqImpl* srq) const;  // made by this engine and not destroyed
  QpImpl* find_qp(uint32_t qpn);
  Mr* find_mr(uint32_t key);
  Mr* alloc_mr(Pd* pd, uint32_t max_pages);
  Mr* mr_by_index(uint32_t key);
  Mw* alloc_mw(Pd* pd, uint8_t type);
  int dealloc_mw(Mw* mw);

  // keys.cc: memory keys. A new random key whose index no live MR or
  // window has (0 if the space is full).
  uint32_t alloc_key();
  // The MR behind an rkey of a remote request to `qp`: an MR of the QP's
  // PD, or a window bound for this QP, granting `need` on [va, va+len);
  // nullptr if the key gives no such right.
  Mr* remote_mr(const QpImpl& qp, uint32_t rkey, uint64_t va, uint64_t len, uint32_t need);
  // REG_MR, LOCAL_INV, BIND_MW on `qp`; SUCCESS or the status, *vendor why.
  WcStatus exec_local(QpImpl& qp, SendWqe& w, uint32_t* vendor);
  // Invalidate `key` for `qp` (LOCAL_INV; remote: SEND_WITH_INV, which
  // also requires the object to be VALID). check_only: change nothing.
  WcStatus invalidate(QpImpl& qp, uint32_t key, bool remote, bool check_only, uint32_t* vendor);
  void unbind(Mw& mw);
  // A destroyed QP's type 2 windows become INVALID.
  void invalidate_qp_windows(const QpImpl& qp);

  // ---- driving (engine.cc) ----
  void receive(const uint8_t* data, size_t len, const Endpoint& from, const IpAddr& to, bool ce);
  bool progress();
  uint64_t next_deadline();

  // qp.cc: the state machine and the verbs rules of a posted WR
  ModifyQpCheck check_transition(const QpImpl& qp, const QpAttr& a, uint32_t mask, QpState cur,
                                 QpState next) const;
  WcStatus check_send(const QpImpl& qp, const SendWr& wr);
  WcStatus check_recv(const Pd* pd, uint32_t max_sge, const RecvWr& wr);
  void reset_qp(QpImpl& qp);
  void init_transport(QpImpl& qp);
  void qp_to_error(QpImpl& qp);
  // requester.cc
  bool req_progress(QpImpl& qp, uint64_t now);
  bool req_resend(QpImpl& qp, uint64_t now);
  uint32_t read_run(QpImpl& qp, uint32_t psn, uint64_t cwnd);
  bool req_start(QpImpl& qp, uint64_t idx, SendWqe& w, uint64_t now);
  MemCheck req_local_pages(QpImpl& qp, const SendWqe& w);
  bool fault_wait(QpImpl& qp, uint64_t now);
  bool req_send(QpImpl& qp, uint32_t psn, uint32_t npsn, bool retx, uint64_t now);
  bool req_uc_progress(QpImpl& qp, uint64_t now);
  bool req_uc_send(QpImpl& qp, uint64_t idx, SendWqe& w, uint64_t now);
  size_t gather(QpImpl& qp, SendWqe& w, uint32_t off, uint32_t len, HostSpan* out, size_t max,
                bool* fault = nullptr);
  void req_timers(QpImpl& qp, uint64_t now);
  void timer_lost(QpImpl& qp, uint16_t path, bool set_aside, uint64_t now);
  uint64_t quiet_timeout(const QpImpl& qp) const;
  void arm_quiet(QpImpl& qp, uint64_t now);
  void req_quiet(QpImpl& qp, uint64_t now);
  uint64_t overdue_timeout(const QpImpl& qp, uint16_t path) const;
  void comp_overdue(QpImpl& qp, uint64_t now, bool act);
  void comp_overdue_verdict(QpImpl& qp, bool wrong);
  uint64_t rto(const QpImpl& qp, unsigned retries) const;
  bool retry_exceeded(const QpImpl& qp, uint64_t now) const;
  // responder.cc
  void resp_receive(QpImpl& qp, const wire::Packet& p, bool ce, uint64_t now);
  void resp_uc(QpImpl& qp, const wire::Packet& p);
  bool resp_uc_place(QpImpl& qp, const wire::Packet& p);
  void resp_uc_drop(QpImpl& qp);
  void resp_data(QpImpl& qp, const wire::Packet& p);
  // first: an execution, not a re-request (resp_reread), so it is kept
  // for re-requests (QpImpl::reads_done).
  bool resp_read(QpImpl& qp, const wire::Packet& p, bool first, uint32_t held_us = 0);
  bool resp_read_early(QpImpl& qp, const wire::Packet& p, uint32_t held_us = 0);
  size_t qp_footprint(const QpInitAttr& init) const;
  // A QP's now: its receive queue may have outgrown its SRQ (resize_srq
  // made the SRQ smaller since the QP took its WQEs).
  size_t qp_footprint(const QpImpl& q) const;
  void resp_reread(QpImpl& qp, const wire::Packet& p);
  bool resp_error_now(QpImpl& qp, uint32_t psn);
  bool resp_atomic(QpImpl& qp, const wire::Packet& p);
  void send_atomic_resp(QpImpl& qp, uint32_t psn, uint16_t path, uint32_t echo_ts, uint64_t orig);
  uint16_t reply_path(QpImpl& qp, uint16_t req_path);
  void resp_mark(QpImpl& qp, uint32_t psn, uint32_t n);
  void resp_advance(QpImpl& qp);
  void resp_complete_recvs(QpImpl& qp);
  void resp_nak(QpImpl& qp, wire::Syndrome s, uint32_t psn, WcStatus local, uint32_t rnr_us = 0);
  void resp_fault_nak(QpImpl& qp, uint32_t psn);
  void send_ack(QpImpl& qp);
  void send_held(QpImpl& qp, const wire::Packet& p);
  // completer.cc
  void comp_ack(QpImpl& qp, const wire::Packet& p, uint64_t now);
  // READ data flows to the requester: its CE marks are this QP's own signal.
  void comp_read_resp(QpImpl& qp, const wire::Packet& p, uint64_t now, bool ce);
  void comp_read_gaps(QpImpl& qp, uint32_t psn);
  void comp_read_reruns(QpImpl& qp, uint32_t psn);
  void lose_for_resend(QpImpl& qp, uint32_t psn);
  // Path order of WRITE and SEND data (QpImpl::path_order).
  void path_gap_lose(QpImpl& qp, uint32_t psn, uint64_t now);
  void comp_path_gaps_before(QpImpl& qp, uint32_t psn, const wire::AckExt& a, uint64_t now);
  void comp_path_gaps_echo(QpImpl& qp, const wire::AckExt& a, uint64_t now);
  void comp_held(QpImpl& qp, const wire::AckExt& a, uint64_t now);
  void comp_atomic_resp(QpImpl& qp, const wire::Packet& p, uint64_t now);
  void comp_pkt_done(QpImpl& qp, uint32_t psn, uint64_t now, uint32_t echo_us, uint64_t& acked_bytes);
  void comp_fail_wqe(QpImpl& qp, uint64_t wqe, WcStatus st);
  void comp_retire(QpImpl& qp);
  void comp_rtt(QpImpl& qp, uint64_t rtt_ns);
  uint64_t echo_rtt(uint32_t echo_ts);
  // datagram.cc: UD and GSI QPs (one packet per message, no transport state)
  bool ud_progress(QpImpl& qp, uint64_t now);
  void ud_receive(const wire::Packet& p, const Endpoint& from, const IpAddr& to);
  void ud_deliver(QpImpl* qp, const wire::Packet& p, bool gsi_ok);
  int attach_mcast(QpImpl* qp, const Gid& mgid);
  int detach_mcast(QpImpl* qp, const Gid& mgid);
  void mcast_forget(QpImpl* qp);
  std::map<Gid, std::vector<QpImpl*>> mcast_;  // group -> attached UD QPs
  QpImpl* find_gsi(const Gid& dgid);

  // engine.cc: local SGE checks and copies, shared by the requester, the
  // responder and the completer.
  // The MR an SGE names, if it is in the QP's PD and allows `access` on
  // [addr, addr+length) (0: read only); else nullptr.
  Mr* sge_mr(const QpImpl& qp, uint32_t lkey, uint64_t addr, uint64_t length, uint32_t access) {
    return sge_mr(qp.pd(), lkey, addr, length, access);
  }
  Mr* sge_mr(const Pd* pd, uint32_t lkey, uint64_t addr, uint64_t length, uint32_t access);
  bool post_sge_ok(const Pd* pd, const Sge& s, uint32_t need);
  bool scatter(QpImpl& qp, const Sge* sge, uint32_t nsge, uint64_t off, const uint8_t* src, size_t len,
               WcStatus& st, bool* fault = nullptr);

  void emit(Cq* cq, const Wc& wc);
  // Path health towards the QP's peer (Engine::for_each_peer_health):
  // nullptr when the peer is not tracked.
  PathHealth* health_of(QpImpl& qp, uint16_t path);
  void health_sent(QpImpl& qp, uint16_t path) {
    if (PathHealth* h = health_of(qp, path)) h->sent++;
  }
  void health_lost(QpImpl& qp, uint16_t path) {
    if (PathHealth* h = health_of(qp, path)) h->lost++;
  }
  void health_answered(QpImpl& qp, uint16_t path, uint64_t rtt_ns) {
    if (PathHealth* h = health_of(qp, path); h && rtt_ns) {
      h->answered++;
      h->rtt_sum_ns += rtt_ns;
    }
  }
  std::map<Endpoint, std::vector<PathHealth>> peer_health_;
  void xmit(QpImpl& qp, uint16_t path, const uint8_t* hdr, size_t hlen, const HostSpan* pl,
            size_t nspans, size_t plen, bool retx) {
    if (qp.roce) roce_xmit(qp, hdr, hlen, pl, nspans, plen, retx);
    else xmit_to(qp.attr.local, qp.attr.ah, path, hdr, hlen, pl, nspans, plen, retx, &qp.mac_tx);
  }
  // roce_mode.cc: plain RoCE v2 towards peers in EngineConfig::roce. The
  // requester, responder and completer run unchanged: roce_xmit writes
  // each packet they send as its RoCE v2 equivalent, roce_receive turns
  // what arrives into the packet they expect, keeping in-order delivery
  // and go-back-N as RoCE's peers do.
  bool roce_peer(const IpAddr& ip) const;
  void roce_xmit(QpImpl& qp, const uint8_t* hdr, size_t hlen, const HostSpan* pl, size_t nspans, size_t plen,
                 bool retx);
  void roce_receive(const uint8_t* data, size_t len, const Endpoint& from, const IpAddr& to, bool ce);
  void roce_responder(QpImpl& qp, const roce::Packet& rp, uint32_t psn, bool ce, uint64_t now);
  void roce_completer(QpImpl& qp, const roce::Packet& rp, uint32_t psn, bool ce, uint64_t now);
  void roce_send_seq_nak(QpImpl& qp);
  size_t roce_emit(const roce::Packet& rp, const IpAddr& src, const IpAddr& icrc_src, const IpAddr& dst,
                   uint16_t path, const HostSpan* pl, size_t nspans);
  bool roce_read_rerun(QpImpl& qp, uint32_t psn, uint64_t now);
  void roce_ud_xmit(QpImpl& qp, const wire::Base& b, const wire::UdExt& e, const HostSpan* pl, size_t nspans,
                    size_t plen);
  void roce_ud_receive(const roce::Packet& rp, const Endpoint& from, const IpAddr& to);
  uint32_t roce_ud_psn_ = 0;  // PSNs of the datagrams sent (RoCE v2 numbers UD packets too)
  IpAddr roce_source(const QpImpl& qp) const {
    return qp.attr.local.unspecified() ? cfg_.roce.local : qp.attr.local;
  }
  // `tx`: the MAC key and counter of this packet in integrity mode (the
  // QP's, or the datagrams' when null).
  void xmit_to(const IpAddr& src, const Endpoint& dst, uint16_t path, const uint8_t* hdr, size_t hlen,
               const HostSpan* pl, size_t nspans, size_t plen, bool retx, MacSender* tx = nullptr);
  uint32_t now_us() { return uint32_t(clock_.now_ns() / 1000); }

  EngineConfig cfg_;
  Link& link_;
  Clock& clock_;
  EngineStats stats_;
  std::vector<AsyncEvent> events_;
  uint32_t next_handle_ = 1;
  // QPNs: random, a freed one quarantined (EngineConfig::qpn_*).
  uint32_t alloc_qpn();
  void free_qpn(uint32_t qpn);
  IdRandom qpn_random_;
  struct QuarantinedQpn {
    uint32_t qpn;
    uint64_t freed_ns;
  };
  std::deque<QuarantinedQpn> qpn_quarantine_;  // oldest first
  std::unordered_set<uint32_t> quarantined_qpns_;
  IdRandom key_random_;
  // Integrity mode (integrity.h): the packet signer, the datagram key and
  // counter, and the datagram senders' counters seen.
  PacketMac mac_{MacAlgorithm::CHACHA20_POLY1305, 0};
  MacKey ud_mac_key_{};
  MacSender ud_mac_tx_;
  DatagramReplay ud_seen_;
  std::vector<std::unique_ptr<Pd>> pds_;
  std::unordered_map<uint32_t, std::unique_ptr<Mr>> mrs_;  // by key index (key >> 8)
  std::unordered_map<uint32_t, std::unique_ptr<Mw>> mws_;  // by key index, never one of an MR's
  std::vector<std::unique_ptr<Cq>> cqs_;
  std::unordered_map<uint32_t, std::unique_ptr<QpImpl>> qps_;
  std::vector<std::unique_ptr<SrqImpl>> srqs_;
  uint32_t next_srqn_ = 1;
  std::vector<QpImpl*> qp_list_;
  // QPs progress() and next_deadline() visit:
  // those that may have something to send or an armed timer. A QP joins
  // when it is given work (post_send, modify_qp, a packet for it) and
  // leaves when a pass finds nothing (idle_qp), so a thousand idle
  // connected QPs cost nothing per pass. A destroyed QP's entry is
  // nullptr until the next pass drops it.
  std::vector<QpImpl*> active_qps_;
  void activate(QpImpl& qp) {
    if (qp.active) return;
    qp.active = true;
    active_qps_.push_back(&qp);
  }
  bool idle_qp(QpImpl& qp);
  // audit.cc: the liveness rules (every posted WR ends), checked.
  bool timer_armed(QpImpl& qp);
  bool owes_work(const QpImpl& qp) const;
  uint64_t inflight_truth(QpImpl& qp);
  std::string audit(bool quiescent);
  void scan_stalls(uint64_t now);
  std::string describe(QpImpl& qp);
  std::vector<std::string> describe_all();
  std::string audit_log_;           // what audit() found (EngineConfig::audit)
  std::vector<uint32_t> stalled_;   // QPNs newly found stalled, for take_stalled()
  uint64_t next_stall_scan_ns_ = 0;
  // The deadline next_deadline() last gave the caller (UINT64_MAX: none);
  // progress() compares its clock with it (EngineStats::late_passes).
  uint64_t asked_wake_ns_ = UINT64_MAX;
  // When the last late pass came: a packet in flight across it is not
  // judged by its departure time (comp_overdue).
  uint64_t late_pass_ns_ = 0;
  void forgive_lateness(uint64_t now);
  void drop_stale_timers(QpImpl& qp);
  // move.cc: numbers of this engine's shard whose objects live in another
  // engine now (not handed out here), and numbers of other shards whose
  // objects died here (Engine::take_returned_ids).
  int closed_set(const EngineObjects& objs);
  // Live migration's notices (Syndrome::PAUSED, RESUMED): sent by a QP to
  // its peer, taken by the peer.
  void notify_peer(QpImpl& qp, wire::Syndrome what);
  void comp_peer_notice(QpImpl& qp, wire::Syndrome what, uint64_t now);
  int detach(const EngineObjects& objs, Detached* out);
  int attach(Detached* objs);
  // save_restore.cc: one owner's objects as bytes and back (live migration).
  int save(const EngineObjects& objs, const Engine::SaveMem& save_mem, std::vector<uint8_t>* out);
  int restore(const uint8_t* data, size_t len, const Engine::RestoreMem& restore_mem, uint64_t qp_owner,
              EngineObjects* out, std::string* err, size_t max_bytes);
  std::unordered_set<uint32_t> lent_qpns_, lent_keys_;
  ReturnedIds returned_;
  bool own_shard(uint32_t n) const { return n % cfg_.qpn_shards == cfg_.qpn_shard; }
  // An MR's or window's key index is free again (dereg_mr, dealloc_mw).
  void forget_key(uint32_t index) {
    if (!own_shard(index)) returned_.key_indices.push_back(index);
  }
  std::vector<QpImpl*> ack_list_;
  std::vector<QpImpl*> ack_later_;
};

}  // namespace vstellar
