// QP creation, the verbs state machine (the attribute rules ibv_modify_qp
// applies, taken from the IB spec table that the kernel's
// ib_modify_qp_is_ok() encodes, RC column), and posting.
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "engine_internal.h"

namespace vstellar {
namespace {

struct Transition {
  bool valid;
  uint32_t req;
  uint32_t opt;
};

constexpr int kStates = 7;

const Transition& transition(QpState cur, QpState next) {
  // Built once, thread-safely (engines of vstellard's workers run at once).
  struct Table {
    Transition t[kStates][kStates]{};
  };
  static const Table table = [] {
    Table built;
    auto& t = built.t;
    auto S = [](QpState s) { return int(s); };
    for (int c = 0; c < kStates; c++) {
      t[c][S(QpState::RESET)] = {true, 0, 0};
      t[c][S(QpState::ERR)] = {true, 0, 0};
    }
    t[S(QpState::RESET)][S(QpState::INIT)] = {true, QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS, 0};
    t[S(QpState::INIT)][S(QpState::INIT)] = {true, 0, QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS};
    t[S(QpState::INIT)][S(QpState::RTR)] = {
        true,
        QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER,
        QP_ALT_PATH | QP_ACCESS_FLAGS | QP_PKEY_INDEX};
    t[S(QpState::RTR)][S(QpState::RTS)] = {
        true, QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC,
        QP_CUR_STATE | QP_ALT_PATH | QP_ACCESS_FLAGS | QP_MIN_RNR_TIMER | QP_PATH_MIG_STATE};
    t[S(QpState::RTS)][S(QpState::RTS)] = {
        true, 0,
        QP_CUR_STATE | QP_ACCESS_FLAGS | QP_ALT_PATH | QP_PATH_MIG_STATE | QP_MIN_RNR_TIMER};
    t[S(QpState::RTS)][S(QpState::SQD)] = {true, 0, QP_EN_SQD_ASYNC_NOTIFY};
    t[S(QpState::SQD)][S(QpState::RTS)] = {
        true, 0,
        QP_CUR_STATE | QP_ACCESS_FLAGS | QP_ALT_PATH | QP_MIN_RNR_TIMER | QP_PATH_MIG_STATE};
    t[S(QpState::SQD)][S(QpState::SQD)] = {
        true, 0,
        QP_PORT | QP_AV | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC |
            QP_MAX_DEST_RD_ATOMIC | QP_ALT_PATH | QP_ACCESS_FLAGS | QP_PKEY_INDEX |
            QP_MIN_RNR_TIMER | QP_PATH_MIG_STATE};
    t[S(QpState::SQE)][S(QpState::RTS)] = {true, 0,
                                            QP_CUR_STATE | QP_ACCESS_FLAGS | QP_MIN_RNR_TIMER};
    return built;
  }();
  return table.t[int(cur)][int(next)];
}

// The UC column: RC's without the attributes of acknowledgement,
// retransmission and RDMA READ/atomics (timeout, retry counts, RNR timer,
// rd_atomic depths), and with no port change in SQD->SQD (as the kernel's
// ib_modify_qp_is_ok table has it).
const Transition& uc_transition(QpState cur, QpState next) {
  // Built once, thread-safely (engines of vstellard's workers run at once).
  struct Table {
    Transition t[kStates][kStates]{};
  };
  static const Table table = [] {
    Table built;
    auto& t = built.t;
    constexpr uint32_t kRcOnly = QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC |
                                 QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER;
    for (int c = 0; c < kStates; c++)
      for (int n = 0; n < kStates; n++) {
        t[c][n] = transition(QpState(c), QpState(n));
        t[c][n].req &= ~kRcOnly;
        t[c][n].opt &= ~kRcOnly;
      }
    t[int(QpState::SQD)][int(QpState::SQD)].opt &= ~uint32_t(QP_PORT);
    return built;
  }();
  return table.t[int(cur)][int(next)];
}

// The UD column of the same table (GSI: the port is implied, not set).
const Transition& ud_transition(QpState cur, QpState next, bool gsi) {
  // Built once, thread-safely (engines of vstellard's workers run at once).
  struct Table {
    Transition t[2][kStates][kStates]{};
  };
  static const Table table = [] {
    Table built;
    auto& t = built.t;
    auto S = [](QpState s) { return int(s); };
    for (int g = 0; g < 2; g++) {
      const uint32_t port = g ? 0u : uint32_t(QP_PORT);
      auto& u = t[g];
      for (int c = 0; c < kStates; c++) {
        u[c][S(QpState::RESET)] = {true, 0, 0};
        u[c][S(QpState::ERR)] = {true, 0, 0};
      }
      u[S(QpState::RESET)][S(QpState::INIT)] = {true, QP_PKEY_INDEX | port | QP_QKEY, 0};
      u[S(QpState::INIT)][S(QpState::INIT)] = {true, 0, QP_PKEY_INDEX | port | QP_QKEY};
      u[S(QpState::INIT)][S(QpState::RTR)] = {true, 0, QP_PKEY_INDEX | QP_QKEY};
      u[S(QpState::RTR)][S(QpState::RTS)] = {true, QP_SQ_PSN, QP_CUR_STATE | QP_QKEY};
      u[S(QpState::RTS)][S(QpState::RTS)] = {true, 0, QP_CUR_STATE | QP_QKEY};
      u[S(QpState::RTS)][S(QpState::SQD)] = {true, 0, QP_EN_SQD_ASYNC_NOTIFY};
      u[S(QpState::SQD)][S(QpState::RTS)] = {true, 0, QP_CUR_STATE | QP_QKEY};
      u[S(QpState::SQD)][S(QpState::SQD)] = {true, 0, QP_PKEY_INDEX | QP_QKEY};
      u[S(QpState::SQE)][S(QpState::RTS)] = {true, 0, QP_CUR_STATE | QP_QKEY};
    }
    return built;
  }();
  return table.t[gsi ? 1 : 0][int(cur)][int(next)];
}


}  // namespace

QpImpl* EngineCore::create_qp(Pd* pd, const QpInitAttr& init) {
  const QpCap& c = init.cap;
  if (!pd || !init.send_cq || !init.recv_cq) return nullptr;
  if (c.max_send_wr < 1 || c.max_send_wr > DeviceLimits::kMaxQpWr) return nullptr;
  SrqImpl* srq = init.srq ? impl(init.srq) : nullptr;
  if (srq && (!owns_srq(srq) || init.qp_type == QpType::GSI || srq->pd() != pd)) return nullptr;
  if (!srq && (c.max_recv_wr < 1 || c.max_recv_wr > DeviceLimits::kMaxQpWr)) return nullptr;
  if (c.max_send_sge > DeviceLimits::kMaxSge || (!srq && c.max_recv_sge > DeviceLimits::kMaxSge))
    return nullptr;
  if (c.max_inline_data > DeviceLimits::kMaxInline) return nullptr;
  if (init.qp_type != QpType::RC && init.qp_type != QpType::UC && init.qp_type != QpType::UD &&
      init.qp_type != QpType::GSI)
    return nullptr;
  const uint32_t qpn = alloc_qpn();
  if (!qpn) return nullptr;
  auto qp = std::make_unique<QpImpl>();
  qp->qpn_ = qpn;
  if (cfg_.integrity) qp->mac_tx.next = PacketMac::FirstCounter();
  qp->pd_ = pd;
  qp->type_ = init.qp_type;
  qp->send_cq = init.send_cq;
  qp->recv_cq = init.recv_cq;
  qp->init = init;
  qp->sq.resize(c.max_send_wr);
  qp->inline_buf.resize(size_t(c.max_send_wr) * c.max_inline_data);
  // On an SRQ the QP can hold at most all of the SRQ's WQEs at once.
  qp->srq = srq;
  qp->rq.resize(srq ? srq->max_wr() : c.max_recv_wr);
  if (srq) srq->refs++;
  if (init.qp_type == QpType::RC) {  // UC and datagram QPs keep no transport window
    qp->recs.resize(cfg_.window_pkts);
    qp->rbits.assign(cfg_.window_pkts / 64, 0);
  }
  pd->refs++;
  init.send_cq->refs++;
  init.recv_cq->refs++;
  QpImpl* raw = qp.get();
  qps_[raw->qpn_] = std::move(qp);
  qp_list_.push_back(raw);
  return raw;
}

// What create_qp allocates for these attributes, and what the QP's bounded
// side tables (held READs, READs done, atomic replays, timers) can grow to.
size_t EngineCore::qp_footprint(const QpInitAttr& init) const {
  const QpCap& c = init.cap;
  size_t n = sizeof(QpImpl) + size_t(c.max_send_wr) * (sizeof(SendWqe) + c.max_inline_data);
  n += size_t(init.srq ? init.srq->max_wr() : c.max_recv_wr) * sizeof(RecvWqe);
  if (init.qp_type == QpType::RC) {
    const size_t w = cfg_.window_pkts;
    n += w * sizeof(PktRec) + w / 8;
    n += size_t(cfg_.num_paths) * sizeof(QpImpl::PathOrder);
    n += w * (sizeof(RetxTimer) + sizeof(QpImpl::ReadDone));
    n += kMaxPendingReads * sizeof(wire::Packet);
  }
  return n;
}

size_t EngineCore::qp_footprint(const QpImpl& q) const {
  const size_t rq = q.init.srq ? q.init.srq->max_wr() : q.init.cap.max_recv_wr;
  return qp_footprint(q.init) + (q.rq.size() > rq ? (q.rq.size() - rq) * sizeof(RecvWqe) : 0);
}

int EngineCore::destroy_qp(QpImpl* qp) {
  if (!qp || find_qp(qp->qpn_) != qp) return EINVAL;
  qp->pd_->refs--;
  qp->send_cq->refs--;
  qp->recv_cq->refs--;
  if (qp->srq) qp->srq->refs--;
  invalidate_qp_windows(*qp);
  mcast_forget(qp);
  qp_list_.erase(std::find(qp_list_.begin(), qp_list_.end(), qp));
  if (qp->active) *std::find(active_qps_.begin(), active_qps_.end(), qp) = nullptr;
  ack_list_.erase(std::remove(ack_list_.begin(), ack_list_.end(), qp), ack_list_.end());
  const uint32_t qpn = qp->qpn_;
  qps_.erase(qpn);
  // A QPN of another engine's shard (the QP moved here, move.cc) goes
  // back to that engine, which quarantines it.
  if (!own_shard(qpn)) returned_.qpns.push_back(qpn);
  else free_qpn(qpn);
  return 0;
}

uint64_t IdRandom::Next() {
  if (fixed_) {  // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  if (left_ == 0) {
    size_t got = 0;
    auto* b = reinterpret_cast<uint8_t*>(buf_);
    while (got < sizeof(buf_)) {
      const ssize_t n = getrandom(b + got, sizeof(buf_) - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) std::abort();  // no kernel CSPRNG: nothing safe to fall back to
      got += size_t(n);
    }
    left_ = sizeof(buf_) / sizeof(buf_[0]);
  }
  return buf_[--left_];
}

// A QPN at random among those neither live nor quarantined; 0 if none is
// left. QPNs below DeviceLimits::kFirstQpn (0 and 1 among them: QP0, QP1) are never
// handed out.
uint32_t EngineCore::alloc_qpn() {
  const uint64_t now = clock_.now_ns();
  // Only QPNs of this engine's shard (EngineConfig::qpn_shards) are ours:
  // draw among them, the n-th one being first + n * shards.
  const uint32_t shards = cfg_.qpn_shards;
  const uint32_t first = DeviceLimits::kFirstQpn + (cfg_.qpn_shard + shards - DeviceLimits::kFirstQpn % shards) % shards;
  const uint32_t ours = (cfg_.max_qpn - first) / shards + 1;
  const size_t cap = std::min<size_t>(65536, ours / 2);
  while (!qpn_quarantine_.empty() &&
         (now - qpn_quarantine_.front().freed_ns >= cfg_.qpn_quarantine_ns || qpn_quarantine_.size() > cap)) {
    quarantined_qpns_.erase(qpn_quarantine_.front().qpn);
    qpn_quarantine_.pop_front();
  }
  auto taken = [&](uint32_t q) { return qps_.count(q) || quarantined_qpns_.count(q) || lent_qpns_.count(q); };
  for (int i = 0; i < 64; i++) {
    const uint32_t q = first + uint32_t(qpn_random_.Next() % ours) * shards;
    if (!taken(q)) return q;
  }
  // Nearly every QPN is taken: look at each once, from a random start.
  const uint32_t start = uint32_t(qpn_random_.Next() % ours);
  for (uint32_t k = 0; k < ours; k++) {
    const uint32_t q = first + (start + k) % ours * shards;
    if (!taken(q)) return q;
  }
  return 0;
}

void EngineCore::free_qpn(uint32_t qpn) {
  qpn_quarantine_.push_back({qpn, clock_.now_ns()});
  quarantined_qpns_.insert(qpn);
}

int EngineCore::query_qp(QpImpl* qp, QpAttr& attr, QpInitAttr& init) {
  if (!qp) return EINVAL;
  attr = qp->attr;
  attr.qp_state = attr.cur_qp_state = qp->state_;
  attr.sq_draining = qp->state_ == QpState::SQD && qp->sq_head != qp->sq_next;
  init = qp->init;
  return 0;
}

const char* to_string(ModifyQpCheck c) {
  switch (c) {
    case ModifyQpCheck::OK: return "ok";
    case ModifyQpCheck::NO_SUCH_QP: return "no such QP";
    case ModifyQpCheck::WRONG_CUR_STATE: return "the QP is not in the current state given";
    case ModifyQpCheck::BAD_TRANSITION: return "no such transition";
    case ModifyQpCheck::MISSING_ATTR: return "a required attribute is missing";
    case ModifyQpCheck::ATTR_NOT_ALLOWED: return "an attribute this transition does not take";
    case ModifyQpCheck::BAD_ATTR_VALUE: return "an attribute value out of range";
  }
  return "?";
}

ModifyQpCheck EngineCore::check_modify_qp(QpImpl* qp, const QpAttr& a, uint32_t mask) {
  if (!qp || find_qp(qp->qpn_) != qp) return ModifyQpCheck::NO_SUCH_QP;
  const QpState cur = qp->state_;
  if ((mask & QP_CUR_STATE) && a.cur_qp_state != cur) return ModifyQpCheck::WRONG_CUR_STATE;
  const QpState next = (mask & QP_STATE) ? a.qp_state : cur;
  if (int(next) >= kStates) return ModifyQpCheck::BAD_TRANSITION;
  return check_transition(*qp, a, mask, cur, next);
}

// The transition cur -> next for the QP's type, the attributes in `mask`
// against those it requires and allows, and their values.
ModifyQpCheck EngineCore::check_transition(const QpImpl& qp, const QpAttr& a, uint32_t mask, QpState cur,
                                           QpState next) const {
  using C = ModifyQpCheck;
  const Transition& t = qp.is_ud()   ? ud_transition(cur, next, qp.is_gsi())
                        : qp.is_uc() ? uc_transition(cur, next)
                                     : transition(cur, next);
  if (!t.valid) return C::BAD_TRANSITION;
  uint32_t extra = mask & ~(QP_STATE | QP_CUR_STATE);
  if ((extra & t.req) != t.req) return C::MISSING_ATTR;
  if (extra & ~(t.req | t.opt | QP_CUR_STATE)) return C::ATTR_NOT_ALLOWED;
  if ((mask & QP_CUR_STATE) && !(t.opt & QP_CUR_STATE) && next != QpState::RESET &&
      next != QpState::ERR)
    return C::ATTR_NOT_ALLOWED;
  const bool out_of_range =
      ((mask & QP_PORT) && a.port_num != 1) || ((mask & QP_PKEY_INDEX) && a.pkey_index != 0) ||
      ((mask & QP_ACCESS_FLAGS) && (a.qp_access_flags & ~ACCESS_ALL_SUPPORTED)) ||
      ((mask & QP_PATH_MTU) && mtu_bytes(a.path_mtu) == 0) ||
      ((mask & QP_DEST_QPN) && a.dest_qp_num > DeviceLimits::kMaxQpn) ||
      ((mask & QP_RQ_PSN) && a.rq_psn > 0xFFFFFF) || ((mask & QP_SQ_PSN) && a.sq_psn > 0xFFFFFF) ||
      ((mask & QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > DeviceLimits::kMaxRdAtomic) ||
      ((mask & QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > DeviceLimits::kMaxRdAtomic) ||
      ((mask & QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31) || ((mask & QP_TIMEOUT) && a.timeout > 31) ||
      ((mask & QP_RETRY_CNT) && a.retry_cnt > 7) || ((mask & QP_RNR_RETRY) && a.rnr_retry > 7) ||
      ((mask & QP_AV) && (a.ah.port == 0 || a.ah.ip.unspecified() || a.ah.ip.is_multicast() ||
                          (!a.local.unspecified() && a.local.is_v4() != a.ah.ip.is_v4())));
  return out_of_range ? C::BAD_ATTR_VALUE : C::OK;
}

int EngineCore::modify_qp(QpImpl* qp, const QpAttr& a, uint32_t mask) {
  if (check_modify_qp(qp, a, mask) != ModifyQpCheck::OK) return EINVAL;
  const QpState cur = qp->state_;
  const QpState next = (mask & QP_STATE) ? a.qp_state : cur;

  QpAttr& s = qp->attr;
  if (mask & QP_ACCESS_FLAGS) s.qp_access_flags = a.qp_access_flags;
  if (mask & QP_PKEY_INDEX) s.pkey_index = a.pkey_index;
  if (mask & QP_PORT) s.port_num = a.port_num;
  if (mask & QP_AV) {
    s.ah = a.ah;
    s.local = a.local;
  }
  if (mask & QP_PATH_MTU) s.path_mtu = a.path_mtu;
  if (mask & QP_TIMEOUT) s.timeout = a.timeout;
  if (mask & QP_RETRY_CNT) s.retry_cnt = a.retry_cnt;
  if (mask & QP_RNR_RETRY) s.rnr_retry = a.rnr_retry;
  if (mask & QP_RQ_PSN) s.rq_psn = a.rq_psn;
  if (mask & QP_SQ_PSN) s.sq_psn = a.sq_psn;
  if (mask & QP_MAX_QP_RD_ATOMIC) s.max_rd_atomic = a.max_rd_atomic;
  if (mask & QP_MAX_DEST_RD_ATOMIC) s.max_dest_rd_atomic = a.max_dest_rd_atomic;
  if (mask & QP_MIN_RNR_TIMER) s.min_rnr_timer = a.min_rnr_timer;
  if (mask & QP_DEST_QPN) s.dest_qp_num = a.dest_qp_num;
  if (mask & QP_QKEY) s.qkey = a.qkey;
  if (mask & QP_EN_SQD_ASYNC_NOTIFY) s.en_sqd_async_notify = a.en_sqd_async_notify;

  if (next == QpState::RESET) {
    reset_qp(*qp);
    qp->state_ = QpState::RESET;
    return 0;
  }
  if (next == QpState::ERR) {
    qp_to_error(*qp);
    return 0;
  }
  if (qp->is_ud()) {
    if (next == QpState::RTR) qp->seg = cfg_.mtu;
    qp->state_ = next;
    if (next == QpState::SQD) comp_retire(*qp);
    activate(*qp);  // WRs posted before RTS go out now
    return 0;
  }
  if (cur == QpState::INIT && next == QpState::RTR) {
    if (cfg_.integrity) {  // the peer is known from here on (integrity.h)
      qp->mac_tx.key = PacketMac::ConnectionKey(cfg_.integrity_key, qp->qpn_, s.dest_qp_num);
      const MacKey rx = PacketMac::ConnectionKey(cfg_.integrity_key, s.dest_qp_num, qp->qpn_);
      // The same peer again (a reconnect after RESET) keeps counting where
      // it was, so what it sent before stays refused.
      if (rx != qp->mac_rx) qp->mac_rx_seen = ReplayWindow{};
      qp->mac_rx = rx;
    }
    // The responder starts here: expect rq_psn first.
    uint32_t path_bytes = mtu_bytes(s.path_mtu);
    // IB's largest MTU enum is 4096; a larger engine MTU applies when the QP
    // asks for the largest.
    qp->seg = s.path_mtu == MTU_4096 ? cfg_.mtu : std::min(cfg_.mtu, path_bytes);
    qp->epsn = s.rq_psn;
    qp->uc_in_msg = false;
    // The responder sprays its ACKs too, from RTR on: a QP that only
    // receives (perftest's servers stay in RTR) never reaches RTS.
    qp->paths = PathSelector(cfg_.path_algo, cfg_.num_paths,
                             cfg_.seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(qp->qpn_) << 17),
                             cfg_.single_path, cfg_.path_burst);
    // A path set aside after a timeout is probed again after a few RTOs.
    qp->paths.set_probe_hold(4 * cfg_.rto_ns);
    // A peer that speaks plain RoCE v2 (roce_mode.cc): one path, and
    // packets of exactly the path MTU, as RoCE's responders require.
    qp->roce = qp->type_ == QpType::RC && roce_peer(s.ah.ip);
    qp->roce_in_msg = qp->roce_nak_sent = false;
    qp->roce_msn = 0;
    if (qp->roce) {
      qp->seg = path_bytes;
      qp->paths = PathSelector(PathAlgo::SINGLE, 1, 0, 0, 1);
      // The link path its packets take: one per QP, which a SimNet makes
      // the source port (UdpLink sends them all from its RoCE socket).
      qp->roce_sport_path = uint16_t((qp->qpn_ * 0x9E3779B1u) >> 16) % cfg_.num_paths;
    }
    std::fill(qp->rbits.begin(), qp->rbits.end(), 0);
    qp->pending_rd.clear();
    qp->reads_done.clear();
    for (auto& r : qp->atomic_replay) r.valid = false;
  }
  if (cur == QpState::RTR && next == QpState::RTS) {
    if (qp->is_uc()) qp->snd_nxt = s.sq_psn;  // no window, no ACKs: only the PSNs
    else init_transport(*qp);
  }
  if (next == QpState::SQD && cur != QpState::SQD) qp->drained_reported = false;
  qp->state_ = next;
  if (next == QpState::SQD) comp_retire(*qp);  // reports SQ_DRAINED if already drained
  activate(*qp);  // WRs posted before RTS (or held in SQD) go out now
  return 0;
}

namespace {

// The quiet timer's and the overdue rule's state, as a new connection has
// it (after snd_una is set).
void reset_loss_rules(QpImpl& qp) {
  qp.last_data_tx_ns = qp.newest_arrived_sent_ns = 0;
  qp.quiet_armed = false;
  qp.quiet_acted_at = UINT64_MAX;
  qp.overdue_next = qp.snd_una;
  qp.overdue_armed_ns = 0;
  qp.overdue_slack = qp.overdue_right = 0;
}

}  // namespace

// Requester side of the connection, set up on RTR->RTS.
void EngineCore::init_transport(QpImpl& qp) {
  qp.snd_una = qp.snd_nxt = qp.attr.sq_psn;
  qp.read_fence = qp.attr.sq_psn;
  qp.cum_seen = qp.attr.sq_psn;  // no ACK of this connection seen yet
  for (auto& r : qp.recs) r = PktRec{};
  qp.timers = {};
  qp.inflight = 0;
  qp.srtt = qp.rttvar = 0;
  qp.cc.reset(cfg_.cc, qp.seg);
  qp.resend.clear();
  qp.read_reruns.clear();
  qp.path_order.clear();
  reset_loss_rules(qp);
  qp.backoff = 0;
}

void EngineCore::reset_qp(QpImpl& qp) {
  // WQEs a QP took from its SRQ are not the QP's to drop silently: the
  // SRQ's owner counts completions to reuse its slots, so they flush.
  for (; qp.srq && qp.rq_head < qp.rq_tail; qp.rq_head++) {
    Wc wc;
    wc.wr_id = qp.rq_at(qp.rq_head).wr_id;
    wc.status = WcStatus::WR_FLUSH_ERR;
    wc.opcode = WcOpcode::RECV;
    wc.qp_num = qp.qpn_;
    wc.wc_flags = WC_SRQ;
    emit(qp.recv_cq, wc);
  }
  qp.sq_head = qp.sq_next = qp.sq_tail = 0;
  qp.rq_head = qp.rq_tail = 0;
  qp.rd_atomic_outstanding = 0;
  qp.next_rsn = 0;
  // Every field of the connection goes back to its initial value (see
  // QpImpl): a later connection must not inherit ACK, RTT or window state
  // of this one (a stale cum_seen would leave the new connection's WQEs
  // uncompleted).
  qp.snd_una = qp.snd_nxt = 0;
  qp.read_fence = 0;
  for (auto& r : qp.recs) r = PktRec{};
  qp.path_order.clear();
  reset_loss_rules(qp);
  qp.timers = {};
  qp.rnr_wake_ns = 0;
  qp.last_progress_ns = 0;
  qp.cum_seen = 0;
  qp.drained_reported = false;
  qp.inflight = 0;
  qp.srtt = qp.rttvar = 0;
  qp.cc = CongestionControl{};
  qp.resend.clear();
  qp.read_reruns.clear();
  qp.backoff = 0;
  qp.paths = PathSelector{PathAlgo::OBS, 1, 1};
  qp.seg = 4096;
  qp.epsn = 0;
  qp.uc_in_msg = false;
  std::fill(qp.rbits.begin(), qp.rbits.end(), 0);
  qp.pending_rd.clear();
  qp.reads_done.clear();
  for (auto& r : qp.atomic_replay) r = QpImpl::AtomicReplay{};
  qp.atomic_replay_next = 0;
  qp.ack_pending = false;
  qp.last_ack_ns = 0;
  qp.ack_lo = qp.ack_hi = 0;
  qp.rx_since_ack = qp.ce_since_ack = 0;
  qp.last_ts = 0;
  qp.last_path = 0;
  qp.attr = QpAttr{};
  qp.ud_next_path = 0;
}

// Enter ERR: every outstanding WQE completes, in order, with its status or
// WR_FLUSH_ERR; the transport stops.
void EngineCore::qp_to_error(QpImpl& qp) {
  qp.state_ = QpState::ERR;
  qp.timers = {};
  qp.quiet_armed = false;
  qp.overdue_armed_ns = 0;
  qp.pending_rd.clear();
  qp.ack_pending = false;
  resp_complete_recvs(qp);  // those that finished normally first
  while (qp.rq_head < qp.rq_tail) {
    RecvWqe& r = qp.rq_at(qp.rq_head++);
    Wc wc;
    wc.wr_id = r.wr_id;
    wc.status = r.status != WcStatus::SUCCESS ? r.status : WcStatus::WR_FLUSH_ERR;
    wc.opcode = WcOpcode::RECV;
    wc.qp_num = qp.qpn_;
    wc.src_qp = qp.attr.dest_qp_num;
    if (r.from_srq) wc.wc_flags |= WC_SRQ;
    emit(qp.recv_cq, wc);
  }
  // IB: a QP on an SRQ that enters ERR will take no more of its WQEs.
  if (qp.srq) events_.push_back({AsyncEventType::QP_LAST_WQE_REACHED, qp.qpn_});
  comp_retire(qp);
}

// The verbs rules of a send WR, checked once, at post time: what the QP's
// type allows, SGE count, inline and atomic shapes, lengths, and (with
// lkeys_at_post) that every SGE names an MR of the QP's PD that allows the
// access. The status is the one the WR completes with when a device
// (vstellard) turns the refusal into a completion.
WcStatus EngineCore::check_send(const QpImpl& qp, const SendWr& wr) {
  if (unsigned(wr.opcode) > unsigned(WrOpcode::SEND_WITH_INV) && wr.opcode != WrOpcode::REG_MR)
    return WcStatus::LOC_QP_OP_ERR;
  if (is_local_op(wr.opcode)) {
    // No data: the work request is the key operation (RC QPs only).
    if (qp.is_ud() || wr.num_sge || (wr.send_flags & SEND_INLINE)) return WcStatus::LOC_QP_OP_ERR;
    return WcStatus::SUCCESS;
  }
  if (wr.num_sge > qp.init.cap.max_send_sge) return WcStatus::LOC_LEN_ERR;
  if (wr.num_sge && !wr.sg_list) return WcStatus::LOC_QP_OP_ERR;
  const bool inl = (wr.send_flags & SEND_INLINE) != 0;
  const bool rd_atomic = is_rd_atomic(wr.opcode);
  const bool atomic = is_atomic(wr.opcode);
  if (inl && rd_atomic) return WcStatus::LOC_QP_OP_ERR;
  uint64_t len = 0;
  for (uint32_t i = 0; i < wr.num_sge; i++) len += wr.sg_list[i].length;
  if (inl && len > qp.init.cap.max_inline_data) return WcStatus::LOC_LEN_ERR;
  if (!inl && cfg_.lkeys_at_post) {
    // READ and atomic results are written into the local buffer.
    const uint32_t need = rd_atomic ? uint32_t(ACCESS_LOCAL_WRITE) : 0u;
    for (uint32_t i = 0; i < wr.num_sge; i++) {
      const Sge& s = wr.sg_list[i];
      if (s.length && !post_sge_ok(qp.pd(), s, need)) return WcStatus::LOC_PROT_ERR;
    }
  }
  if (len > DeviceLimits::kMaxMsgSize) return WcStatus::LOC_LEN_ERR;
  if (qp.is_ud()) {
    // A datagram is one SEND of at most one packet.
    if (wr.opcode != WrOpcode::SEND && wr.opcode != WrOpcode::SEND_WITH_IMM)
      return WcStatus::LOC_QP_OP_ERR;
    if (len > cfg_.mtu) return WcStatus::LOC_LEN_ERR;
    return WcStatus::SUCCESS;
  }
  if (qp.is_uc() && rd_atomic) return WcStatus::LOC_QP_OP_ERR;  // UC: SEND and WRITE only
  if (atomic) {
    if (wr.num_sge != 1 || wr.sg_list[0].length != 8) return WcStatus::LOC_LEN_ERR;
    if (wr.remote_addr % 8) return WcStatus::LOC_QP_OP_ERR;  // IB: atomics are 8-byte aligned
    return WcStatus::SUCCESS;
  }
  const bool remote = wr.opcode != WrOpcode::SEND && wr.opcode != WrOpcode::SEND_WITH_IMM &&
                      wr.opcode != WrOpcode::SEND_WITH_INV;
  if (remote && wr.remote_addr + len < wr.remote_addr) return WcStatus::LOC_LEN_ERR;  // wraps
  return WcStatus::SUCCESS;
}

int EngineCore::post_send(QpImpl* qp, const SendWr& wr, WcStatus* why) {
  if (!qp) return EINVAL;
  QpState st = qp->state_;
  if (st == QpState::RESET || st == QpState::INIT || st == QpState::RTR) {
    if (why) *why = WcStatus::LOC_QP_OP_ERR;
    return EINVAL;
  }
  if (qp->sq_room() == 0) return ENOMEM;
  if (WcStatus bad = check_send(*qp, wr); bad != WcStatus::SUCCESS) {
    if (why) *why = bad;
    return EINVAL;
  }
  const bool inl = (wr.send_flags & SEND_INLINE) != 0;
  uint64_t len = 0;
  for (uint32_t i = 0; i < wr.num_sge; i++) len += wr.sg_list[i].length;

  uint64_t idx = qp->sq_tail;
  SendWqe& w = qp->sq_at(idx);
  w = SendWqe{};
  w.wr_id = wr.wr_id;
  w.op = wr.opcode;
  w.flags = wr.send_flags;
  w.imm = wr.imm_data;
  w.raddr = wr.remote_addr;
  w.rkey = wr.opcode == WrOpcode::LOCAL_INV || wr.opcode == WrOpcode::SEND_WITH_INV ? wr.invalidate_rkey : wr.rkey;
  if (wr.opcode == WrOpcode::REG_MR) w.reg = wr.reg;
  if (wr.opcode == WrOpcode::BIND_MW) w.bind = wr.bind;
  w.cmp_add = wr.compare_add;
  w.swap = wr.swap;
  w.len = len;
  w.is_inline = inl;
  w.signaled = qp->init.sq_sig_all || (wr.send_flags & SEND_SIGNALED);
  if (qp->is_ud()) w.ud = wr.ud;
  if (inl) {
    // Inline SGE addresses are host pointers readable now (the virtio
    // backend passes its own copy of the WQE's inline bytes).
    // (No element access: a QP without inline data has an empty buffer and
    // may still post an empty inline WQE.)
    uint8_t* dst = qp->inline_buf.data() + (idx % qp->sq.size()) * qp->init.cap.max_inline_data;
    for (uint32_t i = 0; i < wr.num_sge; i++) {
      const Sge& s = wr.sg_list[i];
      if (s.length) std::memcpy(dst, reinterpret_cast<const void*>(uintptr_t(s.addr)), s.length);
      dst += s.length;
    }
  } else {
    w.nsge = wr.num_sge;
    for (uint32_t i = 0; i < wr.num_sge; i++) w.sge[i] = wr.sg_list[i];
  }
  qp->sq_tail++;
  qp->last_post_ns = clock_.now_ns();
  activate(*qp);
  if (st == QpState::ERR || st == QpState::SQE) {
    w.started = w.done = true;
    w.status = WcStatus::WR_FLUSH_ERR;
    w.signaled = true;
    qp->sq_next = qp->sq_tail;
    comp_retire(*qp);
  }
  return 0;
}

// An SGE at post time (lkeys_at_post). A fast-registration MR of the PD
// passes whatever its state and key: a REG_MR queued before this WR may
// (re)register it under the key the SGE names, as iSER does with the data
// it sends along with a command. Its key, state, range and access are
// checked when the WR runs (req_start, gather, scatter), as IB specifies.
bool EngineCore::post_sge_ok(const Pd* pd, const Sge& s, uint32_t need) {
  if (const Mr* mr = mr_by_index(s.lkey); mr && mr->fast_reg() && mr->pd() == pd) return true;
  return sge_mr(pd, s.lkey, s.addr, s.length, need) != nullptr;
}

// The verbs rules of a receive WR: SGE count, total length (a receive
// completion counts bytes in 32 bits) and (with lkeys_at_post) that every
// SGE names an MR of the QP's PD with local write.
WcStatus EngineCore::check_recv(const Pd* pd, uint32_t max_sge, const RecvWr& wr) {
  if (wr.num_sge > max_sge) return WcStatus::LOC_LEN_ERR;
  if (wr.num_sge && !wr.sg_list) return WcStatus::LOC_QP_OP_ERR;
  uint64_t len = 0;
  for (uint32_t i = 0; i < wr.num_sge; i++) {
    const Sge& s = wr.sg_list[i];
    if (s.length && cfg_.lkeys_at_post && !post_sge_ok(pd, s, ACCESS_LOCAL_WRITE)) return WcStatus::LOC_PROT_ERR;
    len += s.length;
  }
  if (len > (uint64_t{1} << 32)) return WcStatus::LOC_LEN_ERR;
  return WcStatus::SUCCESS;
}

int EngineCore::post_recv(QpImpl* qp, const RecvWr& wr, WcStatus* why) {
  if (!qp) return EINVAL;
  if (qp->state_ == QpState::RESET) {
    if (why) *why = WcStatus::LOC_QP_OP_ERR;
    return EINVAL;
  }
  if (qp->srq) {  // IB: a QP on an SRQ has no receive queue to post to
    if (why) *why = WcStatus::LOC_QP_OP_ERR;
    return EINVAL;
  }
  if (qp->rq_room() == 0) return ENOMEM;
  if (WcStatus bad = check_recv(qp->pd(), qp->init.cap.max_recv_sge, wr);
      bad != WcStatus::SUCCESS) {
    if (why) *why = bad;
    return EINVAL;
  }
  if (qp->state_ == QpState::ERR) {
    Wc wc;
    wc.wr_id = wr.wr_id;
    wc.status = WcStatus::WR_FLUSH_ERR;
    wc.opcode = WcOpcode::RECV;
    wc.qp_num = qp->qpn_;
    emit(qp->recv_cq, wc);
    return 0;
  }
  RecvWqe& r = qp->rq_at(qp->rq_tail);
  r = RecvWqe{};
  r.wr_id = wr.wr_id;
  r.nsge = wr.num_sge;
  for (uint32_t i = 0; i < wr.num_sge; i++) {
    r.sge[i] = wr.sg_list[i];
    r.cap += wr.sg_list[i].length;
  }
  qp->rq_tail++;
  return 0;
}

int EngineCore::set_gsi_gids(QpImpl* qp, const std::vector<Gid>& gids) {
  if (!qp || !qp->is_gsi()) return EINVAL;
  qp->local_gids = gids;
  return 0;
}

uint32_t Qp::sq_room() const {
  const QpImpl& q = impl(*this);
  return uint32_t(q.sq.size() - (q.sq_tail - q.sq_head));
}

uint32_t Qp::rq_room() const {
  const QpImpl& q = impl(*this);
  if (q.srq) return 0;  // receives are posted to the SRQ
  return uint32_t(q.rq.size() - (q.rq_tail - q.rq_head));
}

}  // namespace vstellar
