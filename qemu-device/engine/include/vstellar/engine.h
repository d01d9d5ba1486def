// The vStellar RNIC engine: verbs objects, RC transport over sprayed UDP
// paths. Single-threaded and non-blocking: the owner feeds it datagrams
// (receive), calls progress() to transmit, run timers and send ACKs, and
// sleeps until next_deadline() or the next datagram. No QEMU, no I/O here:
// I/O comes through the Link given at construction (UdpLink or SimNet).
//
// Memory: an MR is registered with a MemoryTranslator; the engine reaches the
// MR's bytes only through it. The virtio backend passes its PVDMA/eMTT (or
// ATC) translator; the harness passes HostMemory.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "vstellar/congestion_control.h"
#include "vstellar/cq.h"
#include "vstellar/link.h"
#include "vstellar/mr.h"
#include "vstellar/path.h"
#include "vstellar/pd.h"
#include "vstellar/qp.h"
#include "vstellar/srq.h"
#include "vstellar/types.h"

namespace vstellar {

struct EngineConfig {
  uint32_t mtu = 4096;            // payload bytes per packet (upper bound; QP path_mtu can lower it)
  uint16_t num_paths = 128;       // 1..256
  PathAlgo path_algo = PathAlgo::OBS;
  uint16_t single_path = 0;       // the path PathAlgo::SINGLE uses
  // OBS/RR: packets sent on a path before the next pick. 1 sprays
  // every packet; 16 (64 KiB of 4 KiB packets) lets the UDP link's GSO mode
  // hand a run to the kernel as one send. 1..64.
  uint16_t path_burst = 1;
  uint64_t rto_ns = 250'000;      // minimum RTO (Stellar: 250 us)
  uint64_t rto_max_ns = 50'000'000;
  uint32_t window_pkts = 4096;    // PSN window per QP, power of two
  uint32_t read_chunk_pkts = 16;  // a READ request asks for at most this many response packets
  uint32_t ack_every = 32;        // ACK at least every N data packets
  uint64_t ack_delay_ns = 10'000; // otherwise at most one ACK per QP per this interval
  uint32_t tx_budget = 64;        // packets per QP per progress() call (fairness)
  uint64_t seed = 1;
  // QPNs. They are drawn at random from
  // [DeviceLimits::kFirstQpn, max_qpn], so
  // a host on the fabric cannot guess a live one, and a freed QPN is not
  // handed out again for qpn_quarantine_ns (stale packets of the old QP
  // cannot reach a new one) unless the quarantine is full (65,536 QPNs, or
  // half of a smaller space). qpn_seed 0: the numbers come from the
  // kernel's CSPRNG (getrandom); else from a fixed sequence of that seed,
  // for tests and simulations that must repeat. max_qpn below the 24-bit
  // limit only shrinks the space (tests).
  uint64_t qpn_seed = 0;
  uint32_t max_qpn = DeviceLimits::kMaxQpn;
  uint64_t qpn_quarantine_ns = 1'000'000'000;
  // Several engines behind one address (vstellard --threads):
  // this engine hands out only QPNs with qpn % qpn_shards == qpn_shard, so
  // the receive side can tell a packet's engine from its destination QPN
  // alone (UdpLinkConfig::shards). 1 and 0: the whole space.
  uint32_t qpn_shards = 1;
  uint32_t qpn_shard = 0;
  // Memory keys: the 24-bit index of every MR and window key is
  // drawn at random, so a host on the fabric cannot guess a live rkey; the
  // key byte of a new object is random too. key_seed 0: the kernel's
  // CSPRNG; else a fixed sequence of that seed (tests).
  uint64_t key_seed = 0;
  // When a bad lkey (unknown, another PD's, out of the MR, no access) is
  // found. false, as in libibverbs: post_send accepts the WR, and it
  // completes with LOC_PROT_ERR when it runs. true: post_send and post_recv
  // refuse it (EINVAL, why = LOC_PROT_ERR), for a device that reports a bad
  // WQE at once (vstellard's data-path rule). An MR deregistered after the
  // post is caught when the WR runs either way.
  bool lkeys_at_post = false;
  // Integrity mode: every packet carries a keyed MAC (a 28-byte
  // prefix in front of the header) made from this 32-byte key shared by
  // all daemons of the fabric; packets without a valid one are dropped
  // (EngineStats::bad_mac). Every peer must run with the same key.
  bool integrity = false;
  std::array<uint8_t, 32> integrity_key{};
  // Which MAC (docs/wire-format.md, "Integrity prefix"): every packet names
  // its algorithm and a receiver drops one that names another
  // (EngineStats::wrong_mac_alg), so every peer must choose the same.
  // AES_GMAC needs AES-NI and PCLMUL (validate() refuses it without them)
  // and costs about half of CHACHA20_POLY1305 per byte.
  enum class MacAlgorithm : uint8_t { CHACHA20_POLY1305 = 1, AES_GMAC = 2 };
  MacAlgorithm integrity_alg = MacAlgorithm::CHACHA20_POLY1305;
  // Check the engine's liveness rules after every progress() pass
  // (Engine::audit): a QP that owes work is active with a timer armed, and
  // its bytes in flight are what it really has in flight. What breaks them
  // is counted in EngineStats::audit_failures and kept for audit_log().
  // Costs a walk over every QP's window per pass: tests and debug builds.
#ifdef NDEBUG
  bool audit = false;
#else
  bool audit = true;
#endif
  CcConfig cc;
  // Plain RoCE v2 (docs/wire-format.md, "RoCE v2 mode"): an RC QP whose
  // peer address lies in one of these prefixes speaks standard RoCE v2 to
  // it from its first packet (one path, go-back-N, the peer's port 4791)
  // instead of the sprayed format: the peer is rxe or a RoCE NIC. The
  // ICRC covers the UDP source port and address, so the engine must know
  // them: every RoCE v2 packet leaves from src_port (UdpLink's RoCE
  // socket; 0: from path p's port, p, as on a SimNet), and from `local`
  // when the QP has no address of its own.
  struct Roce {
    std::vector<IpPrefix> peers;
    uint16_t src_port = 0;
    IpAddr local;
  } roce;
  bool validate();  // clamps/normalizes; false if unusable
};

struct PathCounters {
  uint64_t tx_pkts = 0;
  uint64_t tx_bytes = 0;
  uint64_t retx_pkts = 0;  // retransmissions sent on this path
  // Losses found by a timer of packets last sent on this path: their RTO,
  // or the connection's quiet timer (EngineStats::quiet_losses).
  uint64_t timeouts = 0;
  uint64_t rx_pkts = 0;    // packets that arrived with this path id
};

// What the requester saw of one path towards one peer (an address and
// its port), summed over the engine's RC QPs to that peer: the evidence a
// fault locator (qemu-device/telemetry) reads. Cumulative; a reader takes
// differences. A path is a route through the fabric for one peer only
// (the ECMP hash covers both addresses), so the counters of path 7 towards
// two peers say nothing about each other.
struct PathHealth {
  uint64_t sent = 0;        // requests sent on the path: first transmissions, resends, probe copies
  uint64_t lost = 0;        // requests last sent on it found lost: timeouts, and later packets of the path answered first
  uint64_t not_lost = 0;    // of them, answered after all (late, not lost: a descheduled peer, say)
  uint64_t delivered = 0;   // requests sent once, on it, and acknowledged
  uint64_t answered = 0;    // ACKs and responses that named it, each with an RTT sample
  uint64_t rtt_sum_ns = 0;  // the sum of those samples
  // Not a count but a state, filled in by for_each_peer_health: how many
  // of the engine's QPs to the peer hold the path set aside now, their
  // own verdict that it is down (transport.md: a timer found a packet on
  // it lost). With a path picked per packet one loss is enough for it,
  // and a path set aside carries only a probe copy now and then, so the
  // loss counts above come in slowly for a dead path.
  uint32_t down = 0;
};

struct EngineStats {
  uint64_t tx_pkts = 0, rx_pkts = 0, tx_bytes = 0, rx_bytes = 0;
  uint64_t data_pkts_sent = 0, retx_pkts = 0, timeouts = 0;
  // Timeouts of packets that were not lost: answered for a transmission
  // older than their resend (a late ACK or response).
  uint64_t spurious_timeouts = 0;
  // READ responses found lost without a timeout: a later answer came back
  // on the same path (EngineCore::comp_read_gaps).
  uint64_t read_gap_losses = 0;
  // WRITE and SEND packets found lost without a timeout: a packet sent
  // later over the same path arrived (EngineCore::comp_path_gaps_before).
  uint64_t path_gap_losses = 0;
  // A connection that heard nothing for a quiet timeout (a round trip
  // and its spread, far below the RTO): packets sent before one that
  // arrived, still missing, resent (quiet_losses); or, with none, its
  // newest packet sent again to draw an ACK (quiet_probes). req_quiet.
  uint64_t quiet_losses = 0, quiet_probes = 0;
  // WRITE and SEND packets found lost because one sent after them arrived
  // and they are overdue, twice the slowest round trip since they left
  // (EngineCore::comp_overdue); and of those, how many were answered for
  // their first transmission: not lost after all (the rule then waits
  // longer on that QP).
  uint64_t overdue_losses = 0, overdue_wrong = 0;
  // Requests found lost because the responder said it holds a later one
  // from the same path (Syndrome::HELD): sent, and acted on.
  uint64_t held_notices_sent = 0, held_resends = 0;
  // A migrating QP's notices to its peer (Syndrome::PAUSED and RESUMED,
  // each sent three times) and those heard from peers.
  uint64_t paused_sent = 0, resumed_sent = 0, peer_notices_rcvd = 0;
  // Passes that ran more than kLatePassNs after the deadline the engine
  // asked for: its thread was descheduled (a loaded host) or busy
  // elsewhere. That time is not counted as its peers' silence.
  uint64_t late_passes = 0;
  uint64_t late_max_us = 0;  // the latest of those passes: how long the engine did not run
  // READs answered ahead of a missing earlier READ (resp_read_early).
  uint64_t early_reads = 0;
  uint64_t paths_set_aside = 0;  // times a path of a QP went down after a timeout (path.h)
  uint64_t path_probes = 0;      // copies of data packets sent to probe a path set aside
  uint64_t acks_sent = 0, acks_rcvd = 0, naks_sent = 0, naks_rcvd = 0, rnr_naks_sent = 0;
  // On-demand paging (MemoryTranslator::on_demand): requests refused with
  // RNR because their pages were not mapped yet (of rnr_naks_sent), work
  // requests that waited before starting for their local pages, and
  // packets or answers dropped to be resent because pages went away
  // mid-message.
  uint64_t page_fault_naks = 0, page_fault_waits = 0, page_fault_drops = 0;
  uint64_t dup_pkts = 0, out_of_window = 0, pending_rd_drops = 0;
  // Requests that would end the connection (bad key, bad length) but came
  // ahead of the expected PSN: dropped unanswered, so one blind packet
  // cannot kill a QP; a real one is resent and then reported in order.
  uint64_t early_errors = 0;
  uint64_t bad_reread = 0;  // duplicate READs that match no READ executed
  uint64_t bad_mac = 0;     // integrity mode: packets whose MAC did not verify
  uint64_t wrong_mac_alg = 0;  // integrity mode: packets MACed with another algorithm than ours
  uint64_t replayed = 0;    // integrity mode: packets seen before, or older than the replay window
  uint64_t trace_probes = 0;  // path tracers' probes that reached us (wire::is_trace_probe): dropped
  uint64_t bad_parse = 0, bad_qpn = 0, bad_peer = 0, bad_state = 0, bad_ack = 0;
  uint64_t ce_marks = 0;
  uint64_t ud_sent = 0, ud_rcvd = 0;
  uint64_t uc_sent = 0;     // UC messages whose last packet went out
  uint64_t uc_rcvd = 0;     // UC messages that arrived whole
  uint64_t uc_drops = 0;    // UC messages dropped: a PSN gap, no receive WQE, a bad key or length
  uint64_t ud_drops = 0;  // datagrams with no QP, wrong Q_Key, spoofed source or no receive WQE
  // QPs found owing work with no progress for 10 RTOs and nothing armed
  // that would move them (a hang; each counted once per episode).
  uint64_t stalled_qps = 0;
  uint64_t audit_failures = 0;  // passes that broke the liveness rules (EngineConfig::audit)
  // RoCE v2 mode (EngineConfig::roce): packets each way; packets that did
  // not parse (a bad ICRC among them) or fit no state; PSN sequence error
  // NAKs sent (a packet arrived ahead of the expected PSN) and received;
  // PSNs resent because a sequence NAK named them (go-back-N).
  uint64_t roce_tx = 0, roce_rx = 0, roce_bad = 0;
  uint64_t roce_seq_naks_sent = 0, roce_seq_naks_rcvd = 0, roce_goback_pkts = 0;
  std::vector<PathCounters> paths;
};

class EngineCore;  // engine/src/engine_internal.h

// What Engine::detach takes: one owner's objects, all of one engine.
struct EngineObjects {
  std::vector<Pd*> pds;
  std::vector<Mr*> mrs;
  std::vector<Mw*> mws;
  std::vector<Cq*> cqs;
  std::vector<Srq*> srqs;
  std::vector<Qp*> qps;
};
// The objects between Engine::detach and Engine::attach (move.cc).
struct DetachedObjects;
struct DetachedObjectsDeleter {
  void operator()(DetachedObjects* d) const;
};
using Detached = std::unique_ptr<DetachedObjects, DetachedObjectsDeleter>;
struct ReturnedIds {
  std::vector<uint32_t> qpns, key_indices;
  bool empty() const { return qpns.empty() && key_indices.empty(); }
};

// What the QP state machine says of a modify_qp (Engine::check_modify_qp):
// OK, or the first rule it breaks, in the order the rules are checked.
enum class ModifyQpCheck : uint8_t {
  OK,
  NO_SUCH_QP,        // not a QP of this engine
  WRONG_CUR_STATE,   // QP_CUR_STATE given, and not the state the QP is in
  BAD_TRANSITION,    // no transition from the QP's state to the one asked for
  MISSING_ATTR,      // the transition requires an attribute the mask lacks
  ATTR_NOT_ALLOWED,  // the mask has an attribute this transition does not take
  BAD_ATTR_VALUE,    // an attribute in the mask has a value out of range
};
const char* to_string(ModifyQpCheck c);

class Engine {
 public:
  Engine(const EngineConfig& cfg, Link& link, Clock& clock);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // ---- verbs (return 0 or a positive errno, like libibverbs) ----
  Pd* alloc_pd();
  int dealloc_pd(Pd* pd);
  // Register [iova, iova+length) of the owner's address space. `mem`
  // translates those addresses to host memory.
  Mr* reg_mr(Pd* pd, uint64_t iova, uint64_t length, uint32_t access,
             std::shared_ptr<MemoryTranslator> mem);
  // EBUSY while windows are bound to it.
  int dereg_mr(Mr* mr);
  // An MR from reg_mr whose memory its exporter takes back (a dma-buf
  // move): it turns INVALID and drops its translation at once, whatever
  // is bound to it, so nothing reaches those pages through it again.
  // EINVAL for an unknown or fast-registration MR; 0 if already invalid.
  int invalidate_mr(Mr* mr);
  // Pages of an on-demand MR were mapped (its translator's owner answered
  // a fault): work requests waiting for their buffers look again at the
  // next progress() instead of at their poll time.
  void pages_mapped();
  // A fast-registration MR of at most max_pages pages, FREE (no access
  // works) until a REG_MR work request registers it. lkey == rkey.
  Mr* alloc_mr(Pd* pd, uint32_t max_pages);
  // The MR whose key has the index of `key`, whatever its key byte (what
  // a REG_MR names); nullptr if none.
  Mr* mr_by_index(uint32_t key);
  // Memory windows, type 1 or 2. Deallocating a bound window unbinds it.
  Mw* alloc_mw(Pd* pd, uint8_t type);
  int dealloc_mw(Mw* mw);
  Cq* create_cq(uint32_t cqe);
  int destroy_cq(Cq* cq);
  Qp* create_qp(Pd* pd, const QpInitAttr& init);  // nullptr on bad attributes
  // EINVAL unless check_modify_qp says OK.
  int modify_qp(Qp* qp, const QpAttr& attr, uint32_t mask);
  // Whether modify_qp(qp, attr, mask) passes the verbs state machine (the
  // transition from the QP's state for its type, the attributes that
  // transition requires and allows, their ranges), and if not, why. The
  // engine is the one place these rules are written; callers ask here.
  ModifyQpCheck check_modify_qp(Qp* qp, const QpAttr& attr, uint32_t mask);
  int query_qp(Qp* qp, QpAttr& attr, QpInitAttr& init);
  int destroy_qp(Qp* qp);
  // Post one WR. The engine checks it against the verbs rules (opcode for
  // the QP's type and state, SGE count, inline and atomic shapes, message
  // and datagram lengths; lkeys too with EngineConfig::lkeys_at_post) and
  // copies it. ENOMEM: the queue is full (see Qp::sq_room). EINVAL: the WR breaks
  // a rule; `why`, if given, gets the completion status the WR stands for
  // (LOC_QP_OP_ERR, LOC_LEN_ERR or LOC_PROT_ERR).
  int post_send(Qp* qp, const SendWr& wr, WcStatus* why = nullptr);
  int post_recv(Qp* qp, const RecvWr& wr, WcStatus* why = nullptr);
  int poll_cq(Cq* cq, Wc* wc, int n) { return cq->poll(wc, n); }
  // Shared receive queues. destroy_srq: EBUSY while a QP uses it.
  // post_srq_recv checks the WR like post_recv (SGE count against the
  // SRQ's max_sge, lkeys in the SRQ's PD with lkeys_at_post).
  Srq* create_srq(Pd* pd, const SrqInitAttr& init);  // nullptr on bad attributes
  int modify_srq(Srq* srq, uint32_t limit);  // limit < max_wr; 0 disarms
  // IB_SRQ_MAX_WR: max_wr slots from now on, the WQEs posted and not yet
  // taken kept in order. EINVAL below those WQEs, below or at the armed
  // limit, or beyond DeviceLimits::kMaxQpWr.
  int resize_srq(Srq* srq, uint32_t max_wr);
  int destroy_srq(Srq* srq);
  int post_srq_recv(Srq* srq, const RecvWr& wr, WcStatus* why = nullptr);
  // Host memory the engine holds for an object of these attributes (its
  // rings, windows and bounded side tables), so that a device can charge
  // it to the guest that asks before it creates the object.
  size_t qp_footprint(const QpInitAttr& init) const;
  size_t srq_footprint(const SrqInitAttr& init) const;
  size_t cq_footprint(uint32_t cqe) const;
  // A GSI QP answers to QP 1 for exactly these GIDs (its owner's).
  int set_gsi_gids(Qp* qp, const std::vector<Gid>& gids);
  // Called when an arriving message needs a receive WQE and the QP (or its
  // SRQ) has none: the owner (QpInitAttr::owner) posts the receives its
  // consumer has published and not yet handed over, as an RNIC sees a
  // doorbell rung before the packet came. Without it, a receive posted
  // just before a message but fetched after it is missed: a UC or UD
  // message is dropped, an RC one costs an RNR NAK and its wait. The hook
  // runs inside receive(): it may call post_recv or post_srq_recv for this
  // QP, nothing else. Unset: no refill.
  using RecvRefill = std::function<void(Qp& qp, uint64_t owner)>;
  void set_recv_refill(RecvRefill hook);
  // UD multicast: attach a UD QP to the group `mgid` (an IPv4-mapped GID in
  // 224.0.0.0/4) or detach it. Attaching twice is no error; EINVAL for a
  // QP that is not UD, a GID that is not a group, or a detach of a QP that
  // is not attached; ENOSPC beyond DeviceLimits::kMaxMcast*; EIO if the
  // link cannot join the group. UD sends to the group's GID reach every
  // attached QP with the right Q_Key, here and on every engine whose link
  // joined it. destroy_qp detaches.
  int attach_mcast(Qp* qp, const Gid& mgid);
  int detach_mcast(Qp* qp, const Gid& mgid);
  Qp* find_qp(uint32_t qpn);
  Mr* find_mr(uint32_t key);

  // ---- objects moving to another engine of this process (move.cc) ----
  // vstellard moves a device to the worker thread (and engine) of its
  // peers, so that traffic between two devices of one daemon stays on one
  // thread. detach() takes a device's objects out of this engine with all
  // their state: a QP's PSNs, packets in flight and timers (deadlines on
  // the one monotonic clock), its receive state and held requests, the
  // CQs' completions, the async events not yet taken. attach() makes them
  // another engine's. Numbers stay (QPNs, keys, CQNs, SRQNs): peers and
  // the device's tables keep using them. Engines of one process are built
  // with the same EngineConfig but for qpn_shard, so no number of one
  // shard is ever another's; a number that moved away is not handed out
  // again by its home engine until the object dies (take_returned_ids).
  // Both run on the thread of their engine; nothing else may run on
  // either engine meanwhile, and the objects between the two calls belong
  // to no engine.
  //
  // detach: EINVAL if an object is not this engine's, or the set is not
  // closed (an object in it uses a PD, CQ, SRQ or MR outside it, or one
  // outside uses one in it); EBUSY if a QP is in a multicast group (its
  // membership is this engine's link's). Nothing changes then.
  int detach(const EngineObjects& objs, Detached* out);
  // EINVAL: not detached from an engine of this one's shape (window,
  // paths, integrity), or a number taken here (a configuration error);
  // *objs keeps the objects then (attach them where they came from).
  int attach(Detached* objs);
  // ---- live migration: objects out of this process and into another
  // (save_restore.cc) ----
  // save() writes the whole state of one owner's objects (a closed set,
  // as detach() takes) as bytes, without changing them: PDs, MRs and
  // windows, CQs with the completions not yet polled, SRQs with their
  // WQEs, QPs whole (attributes, send and receive queues, PSNs, packets in
  // flight and their timers, the receive bitmap, held READ and atomic
  // requests, the atomic replay cache, READs done, ACK, UC, datagram and
  // RoCE state, integrity keys and counters) and the async events not yet
  // taken. A translator (an MR's, or a REG_MR work request's) is the
  // owner's: save_mem writes what the owner needs to build it again
  // (false: it cannot, and save fails with ENOTSUP). EINVAL / EBUSY as
  // detach().
  using SaveMem = std::function<bool(MemoryTranslator& mem, std::vector<uint8_t>* out)>;
  using RestoreMem = std::function<std::shared_ptr<MemoryTranslator>(const uint8_t* p, size_t n)>;
  int save(const EngineObjects& objs, const SaveMem& save_mem, std::vector<uint8_t>* out);
  // restore() makes those objects here, with the QPNs and keys they had
  // (PD, CQ and SRQ numbers are this engine's own), in *out in save()'s
  // order; every QP's owner becomes qp_owner. The state arrives from
  // another host: every count is bounded and every field and invariant
  // checked before anything is made. EPROTO: the bytes are not a state
  // (*err says what is wrong); EINVAL: an engine of another shape (window,
  // paths, integrity, MTU); EEXIST: a QPN or key in use here. Nothing is
  // made then. Timers are due at once (the packets in flight went to the
  // old host's network: they are resent as after an outage), the path
  // choice and congestion window start afresh (the paths are another
  // host's now), and the retry clock starts now.
  // ENOMEM: the objects would hold more than max_bytes of memory here (as
  // footprint() counts them; checked before each is made, so a state
  // cannot make the engine allocate more than that, whatever it says).
  int restore(const uint8_t* data, size_t len, const RestoreMem& restore_mem, uint64_t qp_owner,
              EngineObjects* out, std::string* err, size_t max_bytes = SIZE_MAX);
  // What an object holds of this process's memory, as create_qp,
  // create_srq and create_cq count it (qp_footprint and the others, of its
  // attributes now); restored objects are charged by it.
  size_t footprint(const Qp* qp) const;
  size_t footprint(const Srq* srq) const { return srq_footprint({srq->max_wr(), srq->max_sge(), 0}); }
  size_t footprint(const Cq* cq) const { return cq_footprint(cq->capacity()); }

  // Tells the peer of every connected RC QP of objs that the QP stops
  // for a while (resumed false: its device stops, a live migration
  // begins) or runs again (true: here, or at the destination, where its
  // peers may not have heard from it for the whole migration). The peer of
  // a paused QP does not count the pause against its retry limit (up to
  // 30 s); on RESUMED it resends what is outstanding at once. Three
  // copies each, over different paths. Peers in plain RoCE v2 mode are
  // told nothing (RoCE has no such notice).
  void notify_peers(const EngineObjects& objs, bool resumed);

  // QPNs and key indices of another engine's shard whose objects died
  // here: the caller hands them to their home engine (qpn or index %
  // qpn_shards), whose ids_returned() may hand them out again.
  ReturnedIds take_returned_ids();
  void ids_returned(const ReturnedIds& ids);

  // ---- driving ----
  // One datagram from the network. `from` is the sender's IP (port unused),
  // `to` the address it arrived at (unspecified when the link cannot say);
  // `ce` tells whether the IP header carried a CE mark. Never trusts it.
  void receive(const uint8_t* data, size_t len, const Endpoint& from, const IpAddr& to, bool ce);
  // Transmit what windows allow, fire due timers, send ACKs, flush the link.
  // Returns true if work is left that needs no new input (call again soon).
  bool progress();
  // Earliest timer deadline (ns, clock time); UINT64_MAX if none.
  uint64_t next_deadline();
  // QPs the next progress() visits: those with work or an armed timer
  // since the last pass (idle connected QPs cost nothing per pass).
  size_t active_qps() const;

  // The liveness rules, checked now (see EngineConfig::audit): empty if
  // they hold, else one line per QP that breaks them. `quiescent`: the
  // last progress() returned false, so every QP owing work must have a
  // timer armed.
  std::string audit(bool quiescent);
  // What the passes with EngineConfig::audit found so far.
  const std::string& audit_log() const;
  // QPNs found stalled (EngineStats::stalled_qps) since the last call.
  std::vector<uint32_t> take_stalled();
  // One line per QP: state, sequence numbers, bytes in flight, window,
  // resend queue, timers, paths set aside, time since its last progress.
  std::vector<std::string> describe_qps();
  std::string describe_qp(uint32_t qpn);

  const EngineConfig& config() const;
  const EngineStats& stats() const;
  // Path health per peer (PathHealth) for the first kMaxHealthPeers peers
  // the engine's RC QPs talked to; later peers are not tracked (a guest
  // choosing peers must not grow this without bound). The vectors have
  // num_paths entries, with `down` as the QPs' path selectors hold it now.
  static constexpr size_t kMaxHealthPeers = 256;
  void for_each_peer_health(
      const std::function<void(const Endpoint& peer, const std::vector<PathHealth>& paths)>& f) const;
  std::vector<AsyncEvent> take_async_events();
  Clock& clock();

 private:
  std::unique_ptr<EngineCore> core_;
};

}  // namespace vstellar
