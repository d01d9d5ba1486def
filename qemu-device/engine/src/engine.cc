// Engine: object tables, packet dispatch and the progress loop. The verbs
// state machine is in qp.cc, the transport in requester.cc / responder.cc /
// completer.cc.
#include "engine_internal.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace vstellar {

const char* to_string(WcStatus s) {
  static const char* names[] = {"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR",
                                "LOC_PROT_ERR", "WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR",
                                "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR",
                                "REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR",
                                "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR",
                                "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR",
                                "RESP_TIMEOUT_ERR", "GENERAL_ERR"};
  unsigned i = unsigned(s);
  return i < sizeof(names) / sizeof(names[0]) ? names[i] : "?";
}

const char* to_string(QpState s) {
  static const char* names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  unsigned i = unsigned(s);
  return i < 7 ? names[i] : "?";
}

bool EngineConfig::validate() {
  if (mtu < 256 || mtu > 16384) return false;
  if (num_paths < 1 || num_paths > 256) return false;
  if (window_pkts < 64 || window_pkts > (1u << 20) || (window_pkts & (window_pkts - 1))) return false;
  if (read_chunk_pkts < 1) read_chunk_pkts = 1;
  if (read_chunk_pkts > window_pkts / 4) read_chunk_pkts = window_pkts / 4;
  if (ack_every < 1) ack_every = 1;
  if (tx_budget < 1) tx_budget = 1;
  if (rto_ns < 1000) return false;
  if (rto_max_ns < rto_ns) rto_max_ns = rto_ns;
  if (single_path >= num_paths) return false;
  // Integrity mode drops every packet without our MAC; a RoCE v2 peer
  // cannot send one.
  if (integrity && !roce.peers.empty()) return false;
  if (path_burst < 1 || path_burst > 64) return false;
  if (!(cc.delay_percentile >= 0 && cc.delay_percentile <= 1)) return false;
  if (max_qpn > DeviceLimits::kMaxQpn || max_qpn < DeviceLimits::kFirstQpn + 15) return false;
  if (qpn_shards < 1 || qpn_shards > 256 || qpn_shard >= qpn_shards) return false;
  if ((max_qpn - DeviceLimits::kFirstQpn + 1) / qpn_shards < 16) return false;
  if (integrity && !PacketMac::Usable(integrity_alg)) return false;
  return true;
}

EngineCore::EngineCore(const EngineConfig& cfg, Link& link, Clock& clock)
    : cfg_(cfg), link_(link), clock_(clock) {
  if (!cfg_.validate()) cfg_ = EngineConfig{};
  qpn_random_.Seed(cfg_.qpn_seed);
  key_random_.Seed(cfg_.key_seed);
  // Handles (PD, CQ) and SRQNs of an engine among several are its shard's
  // too, like QPNs and keys: objects moving to another engine of the
  // process (move.cc) keep their numbers and never meet one of the same.
  next_handle_ = next_srqn_ = cfg_.qpn_shard ? cfg_.qpn_shard : cfg_.qpn_shards;
  stats_.paths.resize(cfg_.num_paths);
  if (cfg_.integrity) {
    // libsodium starts (it only fails without a random source, and then
    // nothing safe remains), and this engine's nonces get a salt of their
    // own (integrity.h).
    if (!PacketMac::Init()) std::abort();
    mac_ = PacketMac(cfg_.integrity_alg, PacketMac::RandomSalt());
    ud_mac_key_ = PacketMac::DatagramKey(cfg_.integrity_key);
    ud_mac_tx_ = {ud_mac_key_, PacketMac::FirstCounter()};
  }
}

Pd* EngineCore::alloc_pd() {
  pds_.push_back(std::make_unique<Pd>(next_handle_));
  next_handle_ += cfg_.qpn_shards;
  return pds_.back().get();
}

int EngineCore::dealloc_pd(Pd* pd) {
  auto it = std::find_if(pds_.begin(), pds_.end(), [&](auto& p) { return p.get() == pd; });
  if (it == pds_.end()) return EINVAL;
  if (pd->refs) return EBUSY;
  pds_.erase(it);
  return 0;
}

Mr* EngineCore::reg_mr(Pd* pd, uint64_t iova, uint64_t length, uint32_t access,
                   std::shared_ptr<MemoryTranslator> mem) {
  if (!pd || !mem || length == 0) return nullptr;
  if (access & ~ACCESS_MR_SUPPORTED) return nullptr;
  if (iova + length < iova) return nullptr;  // wraps
  // IB: remote write/atomic need local write.
  if ((access & (ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC)) && !(access & ACCESS_LOCAL_WRITE))
    return nullptr;
  const uint32_t key = alloc_key();
  if (!key) return nullptr;
  auto& mr = mrs_[key >> 8];
  mr = std::make_unique<Mr>(pd, iova, length, access, key, std::move(mem));
  pd->refs++;
  return mr.get();
}

Mr* EngineCore::alloc_mr(Pd* pd, uint32_t max_pages) {
  if (!pd || max_pages == 0) return nullptr;
  const uint32_t key = alloc_key();
  if (!key) return nullptr;
  auto& mr = mrs_[key >> 8];
  mr = std::make_unique<Mr>(pd, key, max_pages);
  pd->refs++;
  return mr.get();
}

Mr* EngineCore::mr_by_index(uint32_t key) {
  auto it = mrs_.find(key >> 8);
  return it == mrs_.end() ? nullptr : it->second.get();
}

Mr* EngineCore::find_mr(uint32_t key) {
  Mr* mr = mr_by_index(key);
  return (mr && mr->lkey() == key) ? mr : nullptr;
}

int EngineCore::dereg_mr(Mr* mr) {
  if (!mr || mr_by_index(mr->lkey()) != mr) return EINVAL;
  if (mr->bound_windows_) return EBUSY;  // IB: windows are bound to it
  mr->pd()->refs--;
  forget_key(mr->lkey() >> 8);
  mrs_.erase(mr->lkey() >> 8);
  return 0;
}

// Windows bound to it stay bound (the IB rules for LOCAL_INV do not apply:
// the memory is gone, not handed back by the consumer); every access
// through them checks the MR's state and fails.
void EngineCore::pages_mapped() {
  for (QpImpl* qp : qp_list_) {
    if (!qp->fault_retry_ns) continue;
    qp->fault_retry_ns = 1;  // due now
    activate(*qp);
  }
}

int EngineCore::invalidate_mr(Mr* mr) {
  if (!mr || mr_by_index(mr->lkey()) != mr || mr->fast_reg_) return EINVAL;
  mr->state_ = MrState::INVALID;
  mr->mem_.reset();
  return 0;
}

Mw* EngineCore::alloc_mw(Pd* pd, uint8_t type) {
  if (!pd || (type != 1 && type != 2)) return nullptr;
  const uint32_t key = alloc_key();
  if (!key) return nullptr;
  auto& mw = mws_[key >> 8];
  mw = std::make_unique<Mw>(pd, type, key);
  pd->refs++;
  return mw.get();
}

int EngineCore::dealloc_mw(Mw* mw) {
  if (!mw) return EINVAL;
  auto it = mws_.find(mw->rkey() >> 8);
  if (it == mws_.end() || it->second.get() != mw) return EINVAL;
  unbind(*mw);
  mw->pd()->refs--;
  forget_key(it->first);
  mws_.erase(it);
  return 0;
}

Cq* EngineCore::create_cq(uint32_t cqe) {
  if (cqe < 1 || cqe > DeviceLimits::kMaxCqe) return nullptr;
  cqs_.push_back(std::make_unique<Cq>(next_handle_, cqe));
  next_handle_ += cfg_.qpn_shards;
  return cqs_.back().get();
}

int EngineCore::destroy_cq(Cq* cq) {
  auto it = std::find_if(cqs_.begin(), cqs_.end(), [&](auto& c) { return c.get() == cq; });
  if (it == cqs_.end()) return EINVAL;
  if (cq->refs) return EBUSY;
  cqs_.erase(it);
  return 0;
}

QpImpl* EngineCore::find_qp(uint32_t qpn) {
  auto it = qps_.find(qpn);
  return it == qps_.end() ? nullptr : it->second.get();
}

void EngineCore::emit(Cq* cq, const Wc& wc) {
  if (!cq->push(wc)) events_.push_back({AsyncEventType::CQ_ERR, cq->cqn()});
  if (cq->on_completion) cq->on_completion(*cq);
}

void EngineCore::xmit_to(const IpAddr& src, const Endpoint& dst, uint16_t path, const uint8_t* hdr, size_t hlen,
                     const HostSpan* pl, size_t nspans, size_t plen, bool retx, MacSender* tx) {
  if (cfg_.integrity) {
    // The prefix goes in front of the header; the link copies both.
    uint8_t buf[PacketMac::kPrefixLen + wire::kMaxHeaderLen + 8 * wire::kMaxSackWords];
    if (hlen > sizeof(buf) - PacketMac::kPrefixLen) return;
    std::memcpy(buf + PacketMac::kPrefixLen, hdr, hlen);
    mac_.Sign(tx ? *tx : ud_mac_tx_, hdr, hlen, pl, nspans, buf);
    link_.send(path, src, dst, buf, PacketMac::kPrefixLen + hlen, pl, nspans);
    hlen += PacketMac::kPrefixLen;
  } else {
    link_.send(path, src, dst, hdr, hlen, pl, nspans);
  }
  stats_.tx_pkts++;
  stats_.tx_bytes += hlen + plen;
  if (path < stats_.paths.size()) {
    PathCounters& pc = stats_.paths[path];
    pc.tx_pkts++;
    pc.tx_bytes += hlen + plen;
    if (retx) pc.retx_pkts++;
  }
}

PathHealth* EngineCore::health_of(QpImpl& qp, uint16_t path) {
  if (path >= cfg_.num_paths) return nullptr;
  if (!qp.health || qp.health_peer != qp.attr.ah) {
    qp.health_peer = qp.attr.ah;
    auto it = peer_health_.find(qp.attr.ah);
    if (it == peer_health_.end()) {
      if (peer_health_.size() >= Engine::kMaxHealthPeers) {
        qp.health = nullptr;
        return nullptr;
      }
      it = peer_health_.emplace(qp.attr.ah, std::vector<PathHealth>(cfg_.num_paths)).first;
    }
    qp.health = &it->second;  // std::map nodes never move
  }
  return &(*qp.health)[path];
}

void EngineCore::receive(const uint8_t* data, size_t len, const Endpoint& from, const IpAddr& to, bool ce) {
  wire::Packet p;
  if (wire::is_trace_probe(data, len)) {
    stats_.trace_probes++;
    return;
  }
  if (!cfg_.roce.peers.empty() && roce_peer(from.ip)) {  // a peer that speaks plain RoCE v2
    roce_receive(data, len, from, to, ce);
    return;
  }
  stats_.rx_pkts++;
  stats_.rx_bytes += len;
  // Integrity mode: the packet follows its prefix; the prefix is checked
  // (below, once the key is known) before the packet touches any state.
  const uint8_t* const signed_pkt = data;
  const size_t signed_len = len;
  if (cfg_.integrity) {
    if (len < PacketMac::kPrefixLen) {
      stats_.bad_mac++;
      return;
    }
    data += PacketMac::kPrefixLen;
    len -= PacketMac::kPrefixLen;
  }
  if (wire::parse(data, len, p) != wire::ParseError::OK) {
    stats_.bad_parse++;
    return;
  }
  // A packet that verifies is taken once (integrity.h): `admit` decides
  // from its counter.
  auto authentic = [&](const MacKey& key, auto admit) {
    if (!cfg_.integrity) return true;
    if (PacketMac::AlgorithmOf(signed_pkt) != cfg_.integrity_alg) {
      stats_.wrong_mac_alg++;
      return false;
    }
    if (!PacketMac::Verify(cfg_.integrity_alg, key, signed_pkt, signed_len)) {
      stats_.bad_mac++;
      return false;
    }
    if (admit(PacketMac::Salt(signed_pkt), PacketMac::Counter(signed_pkt))) return true;
    stats_.replayed++;
    return false;
  };
  if (p.base.path < stats_.paths.size()) stats_.paths[p.base.path].rx_pkts++;
  if (ce) stats_.ce_marks++;
  if (wire::is_ud(p.base.op)) {
    if (authentic(ud_mac_key_, [&](uint32_t salt, uint64_t c) {
          return ud_seen_.Admit(from.ip, p.base.src_qpn, salt, c);
        }))
      ud_receive(p, from, to);
    return;
  }
  QpImpl* qp = find_qp(p.base.dst_qpn);
  if (!qp || qp->is_ud()) {
    stats_.bad_qpn++;
    return;
  }
  // Only the connected peer may talk to an RC or UC QP, and only at the
  // address the QP is reached at (a daemon serving several devices'
  // addresses takes a QPN only at its own device's).
  if (p.base.src_qpn != qp->attr.dest_qp_num || from.ip != qp->attr.ah.ip ||
      (!to.unspecified() && !qp->attr.local.unspecified() && to != qp->attr.local)) {
    stats_.bad_peer++;
    return;
  }
  if (!authentic(qp->mac_rx, [&](uint32_t, uint64_t c) { return qp->mac_rx_seen.Admit(c); })) return;
  // An ACK, a NAK or a response may let it send (or arm a timer).
  activate(*qp);
  if (qp->is_uc()) {  // requests only: a UC responder answers nothing
    if (!wire::is_data(p.base.op) || qp->state_ == QpState::RESET || qp->state_ == QpState::INIT ||
        qp->state_ == QpState::ERR) {
      stats_.bad_state++;
      return;
    }
    resp_uc(*qp, p);
    return;
  }
  uint64_t now = clock_.now_ns();
  switch (p.base.op) {
    case wire::Op::ACK:
    case wire::Op::READ_RESP:
    case wire::Op::ATOMIC_RESP:
      // The peer's notices about itself (live migration) come to a QP that
      // only receives too.
      if (p.base.op == wire::Op::ACK &&
          (p.ack.syndrome == wire::Syndrome::PAUSED || p.ack.syndrome == wire::Syndrome::RESUMED)) {
        comp_peer_notice(*qp, p.ack.syndrome, now);
        return;
      }
      if (!sends(qp->state_)) {
        stats_.bad_state++;
        return;
      }
      if (p.base.op == wire::Op::ACK) comp_ack(*qp, p, now);
      else if (p.base.op == wire::Op::READ_RESP) comp_read_resp(*qp, p, now, ce);
      else comp_atomic_resp(*qp, p, now);
      return;
    default:
      if (qp->state_ == QpState::RESET || qp->state_ == QpState::INIT ||
          qp->state_ == QpState::ERR) {
        stats_.bad_state++;
        return;
      }
      resp_receive(*qp, p, ce, now);
  }
}

// Timers of packets acknowledged (or sent again) since are dropped from
// the top, so an idle QP does not look busy, nor an idle engine wake.
void EngineCore::drop_stale_timers(QpImpl& qp) {
  while (!qp.timers.empty()) {
    const RetxTimer& t = qp.timers.top();
    const uint32_t psn = t.psn;
    const bool live = t.quiet || t.overdue ? seq_lt(qp.snd_una, qp.snd_nxt)
                              : !seq_lt(psn, qp.snd_una) && seq_lt(psn, qp.snd_nxt) && !qp.rec(psn).acked &&
                                    qp.rec(psn).tx_seq == t.tx_seq;
    if (live) break;
    if (t.quiet) qp.quiet_armed = false;
    if (t.overdue && t.deadline == qp.overdue_armed_ns) qp.overdue_armed_ns = 0;
    qp.timers.pop();
  }
}

// Whether a pass has nothing to do for qp until it gets work again
// (EngineCore::activate): not sending, nothing left in its SQ to start or
// send, no timer armed, and (UD, UC) nothing left to retire.
bool EngineCore::idle_qp(QpImpl& qp) {
  if (!sends(qp.state_)) return true;
  if (qp.sq_next != qp.sq_tail) return false;
  if ((qp.is_ud() || qp.is_uc()) && qp.sq_head != qp.sq_next) return false;
  drop_stale_timers(qp);
  return qp.timers.empty() && !qp.fault_retry_ns && !qp.rnr_wake_ns;
}

// A pass that comes much later than the deadline the engine asked for
// means its thread did not run meanwhile (descheduled on a loaded host,
// or the daemon busy elsewhere): ACKs may be waiting in its socket, and
// its timers fire late. The retry limit counts the peer's silence
// (retry_exceeded), and that time was not the peer's: every connection's
// clock moves on by it. Without this, a daemon descheduled for longer
// than a QP's retry limit (8 x 67 ms at perftest's timeout 14) failed
// QPs whose peers had answered all along.
void EngineCore::forgive_lateness(uint64_t now) {
  const uint64_t asked = asked_wake_ns_;
  asked_wake_ns_ = UINT64_MAX;
  if (asked == UINT64_MAX || now <= asked + kLatePassNs) return;
  const uint64_t late = now - asked;
  late_pass_ns_ = now;
  stats_.late_passes++;
  stats_.late_max_us = std::max(stats_.late_max_us, late / 1000);
  for (QpImpl* qp : qp_list_)
    if (qp->last_progress_ns) qp->last_progress_ns = std::min(now, qp->last_progress_ns + late);
}

bool EngineCore::progress() {
  uint64_t now = clock_.now_ns();
  forgive_lateness(now);
  bool more = false;
  // By index: a completion handler may give another QP work (appended,
  // and visited in this pass too). Entries stay in the order they came.
  size_t keep = 0;
  for (size_t i = 0; i < active_qps_.size(); i++) {
    QpImpl* qp = active_qps_[i];
    if (!qp) continue;
    if (sends(qp->state_)) {
      if (qp->is_ud()) {
        if (ud_progress(*qp, now)) more = true;
      } else if (qp->is_uc()) {
        if (req_uc_progress(*qp, now)) more = true;
      } else {
        req_timers(*qp, now);
        if (req_progress(*qp, now)) more = true;
      }
    }
    qp = active_qps_[i];  // destroyed meanwhile: nullptr
    if (!qp) continue;
    if (idle_qp(*qp)) qp->active = false;
    else active_qps_[keep++] = qp;
  }
  active_qps_.resize(keep);
  // ACK coalescing: an ACK goes out once ack_every packets arrived or
  // ack_delay after the previous one. Without it a receiver that keeps up
  // would ACK every tiny batch, and the ACK traffic itself would slow both
  // sides down.
  ack_later_.clear();
  for (QpImpl* qp : ack_list_) {
    if (!qp->ack_pending) continue;
    if (now - qp->last_ack_ns >= cfg_.ack_delay_ns || qp->rx_since_ack >= cfg_.ack_every) {
      send_ack(*qp);
    } else if (std::find(ack_later_.begin(), ack_later_.end(), qp) == ack_later_.end()) {
      ack_later_.push_back(qp);
    }
  }
  ack_list_.swap(ack_later_);
  link_.flush();
  // Datagrams and UC messages complete once the link has them (such a QP
  // stays active until they have).
  for (size_t i = 0; i < active_qps_.size(); i++) {
    QpImpl* qp = active_qps_[i];
    if (qp && (qp->is_ud() || qp->is_uc()) && qp->sq_head < qp->sq_next) comp_retire(*qp);
  }
  if (cfg_.audit) {
    std::string bad = audit(!more);
    if (!bad.empty()) {
      stats_.audit_failures++;
      if (audit_log_.size() < 64 * 1024) audit_log_ += bad;
    }
  }
  // The watchdog: a few times per second at most, every QP.
  if (now >= next_stall_scan_ns_) {
    scan_stalls(now);
    next_stall_scan_ns_ = now + std::max<uint64_t>(10 * cfg_.rto_ns, 100'000'000);
  }
  return more;
}

// Only active QPs have timers armed: a timer is armed while sending or
// when a packet arrives, and both make the QP active.
uint64_t EngineCore::next_deadline() {
  uint64_t d = UINT64_MAX;
  for (QpImpl* qp : ack_list_)
    if (qp->ack_pending) d = std::min(d, qp->last_ack_ns + cfg_.ack_delay_ns);
  for (QpImpl* qp : active_qps_) {
    if (!qp || !sends(qp->state_)) continue;
    drop_stale_timers(*qp);
    if (!qp->timers.empty()) d = std::min(d, qp->timers.top().deadline);
    if (qp->fault_retry_ns) d = std::min(d, qp->fault_retry_ns);
    if (qp->rnr_wake_ns) d = std::min(d, qp->rnr_wake_ns);
  }
  asked_wake_ns_ = d;
  return d;
}

Mr* EngineCore::sge_mr(const Pd* pd, uint32_t lkey, uint64_t addr, uint64_t length,
                       uint32_t access) {
  Mr* mr = find_mr(lkey);
  return mr && mr->pd() == pd && mr->allows(addr, length, access) ? mr : nullptr;
}

// Scatter len bytes from src into the SGE list at message offset off, checking
// each SGE's lkey, PD and local-write access. On failure st says why:
// LOC_PROT_ERR for a bad SGE, LOC_LEN_ERR when the SGEs are too short.
// With `fault` given, a failure on pages an on-demand MR has not mapped
// yet sets *fault instead of st: the caller retries later.
bool EngineCore::scatter(QpImpl& qp, const Sge* sge, uint32_t nsge, uint64_t off, const uint8_t* src,
                     size_t len, WcStatus& st, bool* fault) {
  if (fault) *fault = false;
  uint64_t pos = 0;
  size_t left = len;
  for (uint32_t i = 0; i < nsge && left > 0; i++) {
    const Sge& s = sge[i];
    if (off >= pos + s.length) {
      pos += s.length;
      continue;
    }
    uint64_t in = off - pos;
    uint64_t take = std::min<uint64_t>(s.length - in, left);
    Mr* mr = sge_mr(qp, s.lkey, s.addr + in, take, ACCESS_LOCAL_WRITE);
    bool missing = false;
    if (!mr || !mem_write(mr->mem(), s.addr + in, src, take, &missing)) {
      if (missing && fault) {
        *fault = true;
        return false;
      }
      st = WcStatus::LOC_PROT_ERR;
      return false;
    }
    src += take;
    left -= take;
    off += take;
    pos += s.length;
  }
  if (left) {
    st = WcStatus::LOC_LEN_ERR;
    return false;
  }
  return true;
}

// ---- Engine: the public face, forwarding to EngineCore ----

Engine::Engine(const EngineConfig& cfg, Link& link, Clock& clock)
    : core_(std::make_unique<EngineCore>(cfg, link, clock)) {}
Engine::~Engine() = default;

Pd* Engine::alloc_pd() { return core_->alloc_pd(); }
int Engine::dealloc_pd(Pd* pd) { return core_->dealloc_pd(pd); }
Mr* Engine::reg_mr(Pd* pd, uint64_t iova, uint64_t length, uint32_t access,
                   std::shared_ptr<MemoryTranslator> mem) {
  return core_->reg_mr(pd, iova, length, access, std::move(mem));
}
int Engine::dereg_mr(Mr* mr) { return core_->dereg_mr(mr); }
int Engine::invalidate_mr(Mr* mr) { return core_->invalidate_mr(mr); }
void Engine::pages_mapped() { core_->pages_mapped(); }
Mr* Engine::alloc_mr(Pd* pd, uint32_t max_pages) { return core_->alloc_mr(pd, max_pages); }
Mr* Engine::mr_by_index(uint32_t key) { return core_->mr_by_index(key); }
Mw* Engine::alloc_mw(Pd* pd, uint8_t type) { return core_->alloc_mw(pd, type); }
int Engine::dealloc_mw(Mw* mw) { return core_->dealloc_mw(mw); }
Cq* Engine::create_cq(uint32_t cqe) { return core_->create_cq(cqe); }
int Engine::destroy_cq(Cq* cq) { return core_->destroy_cq(cq); }
Qp* Engine::create_qp(Pd* pd, const QpInitAttr& init) { return core_->create_qp(pd, init); }
int Engine::modify_qp(Qp* qp, const QpAttr& attr, uint32_t mask) {
  return core_->modify_qp(impl(qp), attr, mask);
}
ModifyQpCheck Engine::check_modify_qp(Qp* qp, const QpAttr& attr, uint32_t mask) {
  return core_->check_modify_qp(impl(qp), attr, mask);
}
int Engine::query_qp(Qp* qp, QpAttr& attr, QpInitAttr& init) {
  return core_->query_qp(impl(qp), attr, init);
}
int Engine::destroy_qp(Qp* qp) { return core_->destroy_qp(impl(qp)); }
int Engine::post_send(Qp* qp, const SendWr& wr, WcStatus* why) {
  return core_->post_send(impl(qp), wr, why);
}
int Engine::post_recv(Qp* qp, const RecvWr& wr, WcStatus* why) {
  return core_->post_recv(impl(qp), wr, why);
}
Srq* Engine::create_srq(Pd* pd, const SrqInitAttr& init) { return core_->create_srq(pd, init); }
int Engine::modify_srq(Srq* srq, uint32_t limit) { return core_->modify_srq(impl(srq), limit); }
int Engine::resize_srq(Srq* srq, uint32_t max_wr) { return core_->resize_srq(impl(srq), max_wr); }
int Engine::destroy_srq(Srq* srq) { return core_->destroy_srq(impl(srq)); }
int Engine::post_srq_recv(Srq* srq, const RecvWr& wr, WcStatus* why) {
  return core_->post_srq_recv(impl(srq), wr, why);
}
void Engine::set_recv_refill(RecvRefill hook) { core_->recv_refill_ = std::move(hook); }
int Engine::set_gsi_gids(Qp* qp, const std::vector<Gid>& gids) {
  return core_->set_gsi_gids(impl(qp), gids);
}
size_t Engine::qp_footprint(const QpInitAttr& init) const { return core_->qp_footprint(init); }
size_t Engine::footprint(const Qp* qp) const { return core_->qp_footprint(*impl(qp)); }
size_t Engine::srq_footprint(const SrqInitAttr& init) const {
  return sizeof(SrqImpl) + size_t(init.max_wr) * sizeof(RecvWqe);
}
size_t Engine::cq_footprint(uint32_t cqe) const { return sizeof(Cq) + size_t(cqe) * sizeof(Wc); }

int Engine::attach_mcast(Qp* qp, const Gid& mgid) { return core_->attach_mcast(impl(qp), mgid); }
int Engine::detach_mcast(Qp* qp, const Gid& mgid) { return core_->detach_mcast(impl(qp), mgid); }
Qp* Engine::find_qp(uint32_t qpn) { return core_->find_qp(qpn); }
Mr* Engine::find_mr(uint32_t key) { return core_->find_mr(key); }
void Engine::receive(const uint8_t* data, size_t len, const Endpoint& from, const IpAddr& to, bool ce) {
  core_->receive(data, len, from, to, ce);
}
bool Engine::progress() { return core_->progress(); }
uint64_t Engine::next_deadline() { return core_->next_deadline(); }
size_t Engine::active_qps() const { return core_->active_qps_.size(); }
std::string Engine::audit(bool quiescent) { return core_->audit(quiescent); }
const std::string& Engine::audit_log() const { return core_->audit_log_; }
std::vector<uint32_t> Engine::take_stalled() { return std::move(core_->stalled_); }
std::vector<std::string> Engine::describe_qps() { return core_->describe_all(); }
std::string Engine::describe_qp(uint32_t qpn) {
  QpImpl* qp = core_->find_qp(qpn);
  return qp ? core_->describe(*qp) : std::string();
}
const EngineConfig& Engine::config() const { return core_->cfg_; }
const EngineStats& Engine::stats() const { return core_->stats_; }
void Engine::for_each_peer_health(
    const std::function<void(const Endpoint&, const std::vector<PathHealth>&)>& f) const {
  // The counters are kept as they happen; `down` is each QP's path
  // selector's state, gathered here, from the QPs holding any path aside.
  std::map<const std::vector<PathHealth>*, std::vector<uint32_t>> down;
  for (const auto& [qpn, qp] : core_->qps_) {
    if (!qp->health || qp->paths.down_count() == 0) continue;
    std::vector<uint32_t>& d = down[qp->health];
    d.resize(qp->health->size());
    for (uint16_t p = 0; p < qp->paths.num_paths() && p < d.size(); p++) d[p] += qp->paths.is_down(p);
  }
  for (const auto& [peer, paths] : core_->peer_health_) {
    auto it = down.find(&paths);
    if (it == down.end()) {
      f(peer, paths);
      continue;
    }
    std::vector<PathHealth> now = paths;
    for (size_t p = 0; p < now.size(); p++) now[p].down = it->second[p];
    f(peer, now);
  }
}
std::vector<AsyncEvent> Engine::take_async_events() { return std::move(core_->events_); }
Clock& Engine::clock() { return core_->clock_; }

}  // namespace vstellar
