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
#include <memory>
#include <unordered_map>
#include <vector>

#include "vstellar/cc.h"
#include "vstellar/cq.h"
#include "vstellar/link.h"
#include "vstellar/mr.h"
#include "vstellar/path.h"
#include "vstellar/pd.h"
#include "vstellar/qp.h"
#include "vstellar/types.h"
#include "vstellar/wire.h"

namespace vstellar {

struct EngineConfig {
  uint32_t mtu = 4096;            // payload bytes per packet (upper bound; QP path_mtu can lower it)
  uint16_t num_paths = 128;       // 1..256
  PathAlgo path_algo = PathAlgo::OBS;
  uint16_t single_path = 0;       // the path PathAlgo::SINGLE uses
  uint64_t rto_ns = 250'000;      // minimum RTO (Stellar: 250 us)
  uint64_t rto_max_ns = 50'000'000;
  uint32_t window_pkts = 4096;    // PSN window per QP, power of two
  uint32_t read_chunk_pkts = 64;  // a READ is requested in chunks of this many response packets
  uint32_t ack_every = 32;        // ACK at least every N data packets
  uint64_t ack_delay_ns = 10'000; // otherwise at most one ACK per QP per this interval
  uint32_t tx_budget = 64;        // packets per QP per progress() call (fairness)
  uint64_t seed = 1;
  CcConfig cc;
  bool validate();  // clamps/normalizes; false if unusable
};

struct PathCounters {
  uint64_t tx_pkts = 0;
  uint64_t tx_bytes = 0;
  uint64_t retx_pkts = 0;  // retransmissions sent on this path
  uint64_t timeouts = 0;   // RTO expiries of packets last sent on this path
  uint64_t rx_pkts = 0;    // packets that arrived with this path id
};

struct EngineStats {
  uint64_t tx_pkts = 0, rx_pkts = 0, tx_bytes = 0, rx_bytes = 0;
  uint64_t data_pkts_sent = 0, retx_pkts = 0, timeouts = 0;
  uint64_t acks_sent = 0, acks_rcvd = 0, naks_sent = 0, naks_rcvd = 0, rnr_naks_sent = 0;
  uint64_t dup_pkts = 0, out_of_window = 0, pending_rd_drops = 0;
  uint64_t bad_parse = 0, bad_qpn = 0, bad_peer = 0, bad_state = 0, bad_ack = 0;
  uint64_t ce_marks = 0;
  uint64_t ud_sent = 0, ud_rcvd = 0;
  uint64_t ud_drops = 0;  // datagrams with no QP, wrong Q_Key, spoofed source or no receive WQE
  std::vector<PathCounters> paths;
};

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
  int dereg_mr(Mr* mr);
  Cq* create_cq(uint32_t cqe);
  int destroy_cq(Cq* cq);
  Qp* create_qp(Pd* pd, const QpInitAttr& init);  // nullptr on bad attributes
  int modify_qp(Qp* qp, const QpAttr& attr, uint32_t mask);
  int query_qp(Qp* qp, QpAttr& attr, QpInitAttr& init);
  int destroy_qp(Qp* qp);
  int post_send(Qp* qp, const SendWr& wr);
  int post_recv(Qp* qp, const RecvWr& wr);
  int poll_cq(Cq* cq, Wc* wc, int n) { return cq->poll(wc, n); }
  Qp* find_qp(uint32_t qpn);
  Mr* find_mr(uint32_t key);

  // ---- driving ----
  // One datagram from the network. `from` is the sender's IP (port unused);
  // `ce` tells whether the IP header carried a CE mark. Never trusts it.
  void receive(const uint8_t* data, size_t len, const Endpoint& from, bool ce);
  // Transmit what windows allow, fire due timers, send ACKs, flush the link.
  // Returns true if work is left that needs no new input (call again soon).
  bool progress();
  // Earliest timer deadline (ns, clock time); UINT64_MAX if none.
  uint64_t next_deadline();

  const EngineConfig& config() const { return cfg_; }
  const EngineStats& stats() const { return stats_; }
  std::vector<AsyncEvent> take_async_events() { return std::move(events_); }
  Clock& clock() { return clock_; }

 private:
  friend struct EngineTestPeer;
  // qp.cc: state machine
  int check_modify(Qp& qp, const QpAttr& a, uint32_t mask, QpState cur, QpState next);
  void reset_qp(Qp& qp);
  void init_transport(Qp& qp);
  void qp_to_error(Qp& qp);
  // requester.cc
  bool req_progress(Qp& qp, uint64_t now);
  bool req_start(Qp& qp, uint64_t idx, SendWqe& w);
  bool req_send(Qp& qp, uint32_t psn, uint32_t npsn, bool retx, uint64_t now);
  size_t gather(Qp& qp, SendWqe& w, uint32_t off, uint32_t len, HostSpan* out, size_t max);
  void req_timers(Qp& qp, uint64_t now);
  uint64_t rto(const Qp& qp, unsigned retries) const;
  // responder.cc
  void resp_receive(Qp& qp, const wire::Packet& p, bool ce, uint64_t now);
  void resp_data(Qp& qp, const wire::Packet& p);
  bool resp_read(Qp& qp, const wire::Packet& p);
  bool resp_atomic(Qp& qp, const wire::Packet& p);
  void send_atomic_resp(Qp& qp, uint32_t psn, uint32_t echo_ts, uint64_t orig);
  void resp_mark(Qp& qp, uint32_t psn, uint32_t n);
  void resp_advance(Qp& qp);
  void resp_complete_recvs(Qp& qp);
  void resp_nak(Qp& qp, wire::Syndrome s, uint32_t psn, WcStatus local);
  void send_ack(Qp& qp);
  // completer.cc
  void comp_ack(Qp& qp, const wire::Packet& p, uint64_t now);
  // READ data flows to the requester: its CE marks are this QP's own signal.
  void comp_read_resp(Qp& qp, const wire::Packet& p, uint64_t now, bool ce);
  void comp_atomic_resp(Qp& qp, const wire::Packet& p, uint64_t now);
  void comp_pkt_done(Qp& qp, uint32_t psn, uint64_t now, bool rtt_sample, uint64_t& acked_bytes);
  void comp_fail_wqe(Qp& qp, uint64_t wqe, WcStatus st);
  void comp_retire(Qp& qp);
  void comp_rtt(Qp& qp, uint64_t rtt_ns);
  // datagram.cc: UD and GSI QPs (one packet per message, no transport state)
  bool ud_progress(Qp& qp);
  void ud_receive(const wire::Packet& p, const Endpoint& from);
  Qp* find_gsi(const Gid& dgid);

  // engine.cc: shared by the responder (RECV data) and the completer (READ
  // and atomic responses).
  bool scatter(Qp& qp, const Sge* sge, uint32_t nsge, uint64_t off, const uint8_t* src, size_t len,
               WcStatus& st);

  void emit(Cq* cq, const Wc& wc);
  void xmit(Qp& qp, uint16_t path, const uint8_t* hdr, size_t hlen, const HostSpan* pl,
            size_t nspans, size_t plen, bool retx) {
    xmit_to(qp.attr.ah, path, hdr, hlen, pl, nspans, plen, retx);
  }
  void xmit_to(const Endpoint& dst, uint16_t path, const uint8_t* hdr, size_t hlen,
               const HostSpan* pl, size_t nspans, size_t plen, bool retx);
  uint32_t now_us() { return uint32_t(clock_.now_ns() / 1000); }

  EngineConfig cfg_;
  Link& link_;
  Clock& clock_;
  EngineStats stats_;
  std::vector<AsyncEvent> events_;
  uint32_t next_handle_ = 1;
  uint32_t next_qpn_ = 0x11;
  uint32_t key_tag_ = 0x5a;
  std::vector<std::unique_ptr<Pd>> pds_;
  std::vector<std::unique_ptr<Mr>> mrs_;  // slot (key >> 8) - 1
  std::vector<std::unique_ptr<Cq>> cqs_;
  std::unordered_map<uint32_t, std::unique_ptr<Qp>> qps_;
  std::vector<Qp*> qp_list_;
  std::vector<Qp*> ack_list_;
  std::vector<Qp*> ack_later_;
};

}  // namespace vstellar
