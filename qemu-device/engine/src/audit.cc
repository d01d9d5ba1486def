// The engine's liveness rules, checked: "every posted work request ends"
// (docs/engine.md). A QP that still owes work must be on the active list
// with a timer armed or with something it can do now, and its bytes in
// flight must be what it really has in flight. audit() checks that in full
// (tests and debug builds, after every pass); scan_stalls() is the cheap
// release-build watchdog behind EngineStats::stalled_qps; describe() is
// the per-QP state dump an operator reads (vstellar-stat --qps).
#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "engine_internal.h"

namespace vstellar {

// Whether a live timer is armed for qp (after dropping stale ones).
// A WQE waiting for on-demand pages has its poll time (fault_retry_ns), one
// on RNR hold its wake time (rnr_wake_ns).
bool EngineCore::timer_armed(QpImpl& qp) {
  drop_stale_timers(qp);
  return !qp.timers.empty() || qp.fault_retry_ns || qp.rnr_wake_ns;
}

// What the requester side of an RC QP owes: WQEs started and not retired,
// PSNs not acknowledged, resends queued. In SQD, WQEs not started wait for
// the QP's owner (a move back to RTS), not for the engine.
bool EngineCore::owes_work(const QpImpl& qp) const {
  if (!sends(qp.state_)) return false;
  if (qp.snd_una != qp.snd_nxt) return true;
  if (qp.sq_head == qp.sq_tail) return false;
  if (qp.state_ == QpState::SQD) {
    // Only WQEs that started are the engine's to finish.
    for (uint64_t i = qp.sq_head; i < qp.sq_tail; i++) {
      const SendWqe& w = qp.sq[i % qp.sq.size()];
      if (w.started) return true;
    }
    return false;
  }
  return true;
}

// The bytes qp really has in flight: PSNs sent and neither acknowledged nor
// waiting in the resend queue. QpImpl::inflight must equal it.
uint64_t EngineCore::inflight_truth(QpImpl& qp) {
  uint64_t sum = 0;
  for (uint32_t psn = qp.snd_una; seq_lt(psn, qp.snd_nxt); psn++) {
    const PktRec& r = qp.rec(psn);
    if (!r.acked && !r.lost) sum += r.len;
  }
  return sum;
}

std::string EngineCore::audit(bool quiescent) {
  std::string bad;
  auto fail = [&](QpImpl& qp, const char* what) {
    bad += "qp " + std::to_string(qp.qpn_) + ": " + what + " [" + describe(qp) + "]\n";
  };
  for (QpImpl* q : qp_list_) {
    QpImpl& qp = *q;
    if (qp.is_ud() || qp.is_uc()) {
      if (sends(qp.state_) && qp.sq_head != qp.sq_tail && !qp.active && quiescent)
        fail(qp, "datagram/UC WQEs left with the QP inactive");
      continue;
    }
    if (qp.ack_pending && std::find(ack_list_.begin(), ack_list_.end(), q) == ack_list_.end())
      fail(qp, "an ACK owed but the QP is not on the ACK list");
    if (!sends(qp.state_)) continue;
    const uint64_t truth = inflight_truth(qp);
    if (qp.inflight != truth) fail(qp, ("inflight " + std::to_string(qp.inflight) + " != " +
                                        std::to_string(truth) + " really in flight").c_str());
    // Every lost PSN is queued for its resend.
    for (uint32_t psn = qp.snd_una; seq_lt(psn, qp.snd_nxt); psn++) {
      if (!qp.rec(psn).lost || qp.rec(psn).acked) continue;
      if (std::find(qp.resend.begin(), qp.resend.end(), psn) == qp.resend.end()) {
        fail(qp, ("PSN " + std::to_string(psn) + " lost but not queued for resend").c_str());
        break;
      }
    }
    // Each path's list holds exactly the DATA PSNs in flight listed on it,
    // oldest transmission first (comp_path_gaps_before).
    uint32_t listed = 0, marked = 0;
    for (uint32_t psn = qp.snd_una; seq_lt(psn, qp.snd_nxt); psn++) marked += qp.rec(psn).on_path;
    for (const QpImpl::PathOrder& l : qp.path_order) listed += l.n;
    if (listed != marked)
      fail(qp, (std::to_string(marked) + " PSNs marked on a path, " + std::to_string(listed) + " listed").c_str());
    for (size_t pi = 0; pi < qp.path_order.size(); pi++) {
      const QpImpl::PathOrder& l = qp.path_order[pi];
      uint32_t n = 0, psn = l.head, prev = 0;
      for (; n < l.n; n++, prev = psn, psn = qp.rec(psn).path_next) {
        const PktRec& r = qp.rec(psn);
        if (!r.on_path || r.path != pi || r.acked || r.lost || r.kind != PktKind::DATA ||
            seq_lt(psn, qp.snd_una) || !seq_lt(psn, qp.snd_nxt) || (n && r.path_prev != prev) ||
            (n && r.sent_ns < qp.rec(prev).sent_ns))
          break;
      }
      if (n != l.n || (l.n && prev != l.tail)) {
        fail(qp, ("path " + std::to_string(pi) + "'s list broken at PSN " + std::to_string(psn)).c_str());
        break;
      }
    }
    if (!quiescent || !owes_work(qp)) continue;
    // The pass found nothing more to do: what qp owes must come from a
    // timer (its own) or an answer to a packet in flight (which has one).
    if (!qp.active) fail(qp, "owes work but is not on the active list");
    else if (!timer_armed(qp)) fail(qp, "owes work, can do nothing now and has no timer armed");
  }
  return bad;
}

// A QP that owes work, made no progress for 10 RTOs and has nothing that
// will move it (not active, or no timer armed): the hang the audit
// forbids, caught in a release build. Each is counted and reported once
// (take_stalled) until it moves again.
void EngineCore::scan_stalls(uint64_t now) {
  for (QpImpl* q : qp_list_) {
    QpImpl& qp = *q;
    if (qp.is_ud() || qp.is_uc()) continue;
    const bool owes = owes_work(qp);
    const uint64_t since = std::max(qp.last_progress_ns, qp.last_post_ns);
    const bool stuck = owes && now - since >= 10 * rto(qp, 0) && (!qp.active || !timer_armed(qp));
    if (stuck && !qp.stalled) {
      qp.stalled = true;
      stats_.stalled_qps++;
      stalled_.push_back(qp.qpn_);
    } else if (!stuck) {
      qp.stalled = false;
    }
  }
}

std::string EngineCore::describe(QpImpl& qp) {
  const uint64_t now = clock_.now_ns();
  char buf[512];
  const uint64_t next = qp.timers.empty() ? 0 : qp.timers.top().deadline;
  std::snprintf(
      buf, sizeof buf,
      "qpn=%u type=%s state=%s active=%d sq=%" PRIu64 "/%" PRIu64 "/%" PRIu64
      " snd_una=%u snd_nxt=%u inflight=%" PRIu64 " cwnd=%" PRIu64 " resend=%zu timers=%zu"
      " next_timer_us=%" PRId64 " rd_atomic=%u srtt_us=%" PRIu64 " rto_us=%" PRIu64
      " epsn=%u ack_pending=%d rq=%" PRIu64 "/%" PRIu64 " paths_down=%u/%u"
      " idle_ms=%" PRIu64,
      qp.qpn_, qp.is_ud() ? "UD" : qp.is_uc() ? "UC" : "RC", to_string(qp.state_), int(qp.active),
      qp.sq_head, qp.sq_next, qp.sq_tail, qp.snd_una, qp.snd_nxt, qp.inflight,
      qp.cc.cwnd() == UINT64_MAX ? 0 : qp.cc.cwnd(), qp.resend.size(), qp.timers.size(),
      next ? (int64_t(next) - int64_t(now)) / 1000 : int64_t(-1), qp.rd_atomic_outstanding,
      qp.srtt / 1000, rto(qp, 0) / 1000, qp.epsn, int(qp.ack_pending), qp.rq_head, qp.rq_tail,
      unsigned(qp.paths.down_count()), unsigned(qp.paths.num_paths()),
      (now - std::max(qp.last_progress_ns, qp.last_post_ns)) / 1'000'000);
  return buf;
}

std::vector<std::string> EngineCore::describe_all() {
  std::vector<std::string> out;
  out.reserve(qp_list_.size());
  for (QpImpl* qp : qp_list_) out.push_back(describe(*qp));
  return out;
}

}  // namespace vstellar
