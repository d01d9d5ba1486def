// Completer: ACKs, READ responses and atomic responses come back here. It
// marks PSNs done, feeds RTT/ECN to the congestion window and path selector,
// and retires WQEs strictly in order (verbs ordering), producing CQEs.
#include <algorithm>
#include <cstring>

#include "engine_internal.h"

namespace vstellar {
namespace {


WcOpcode wc_opcode(WrOpcode op) {
  switch (op) {
    case WrOpcode::RDMA_WRITE:
    case WrOpcode::RDMA_WRITE_WITH_IMM: return WcOpcode::RDMA_WRITE;
    case WrOpcode::SEND:
    case WrOpcode::SEND_WITH_IMM: return WcOpcode::SEND;
    case WrOpcode::RDMA_READ: return WcOpcode::RDMA_READ;
    case WrOpcode::ATOMIC_CMP_AND_SWP: return WcOpcode::COMP_SWAP;
    case WrOpcode::ATOMIC_FETCH_AND_ADD: return WcOpcode::FETCH_ADD;
    case WrOpcode::SEND_WITH_INV: return WcOpcode::SEND;
    case WrOpcode::LOCAL_INV: return WcOpcode::LOCAL_INV;
    case WrOpcode::BIND_MW: return WcOpcode::BIND_MW;
    case WrOpcode::REG_MR: return WcOpcode::REG_MR;
  }
  return WcOpcode::SEND;
}

bool in_window(const QpImpl& qp, uint32_t psn) {
  return !seq_lt(psn, qp.snd_una) && seq_lt(psn, qp.snd_nxt);
}

}  // namespace

// An RTT sample from an echoed microsecond timestamp (0: none).
uint64_t EngineCore::echo_rtt(uint32_t echo_ts) {
  const uint32_t us = now_us() - echo_ts;
  return us < 10'000'000 ? uint64_t(us) * 1000 + 1 : 0;
}

void EngineCore::comp_rtt(QpImpl& qp, uint64_t r) {
  if (r == 0) return;
  if (qp.srtt == 0) {
    qp.srtt = r;
    qp.rttvar = r / 2;
  } else {
    uint64_t d = qp.srtt > r ? qp.srtt - r : r - qp.srtt;
    qp.rttvar = (3 * qp.rttvar + d) / 4;
    qp.srtt = (7 * qp.srtt + r) / 8;
  }
}

// echo_us: the timestamp the answer echoes (the transmission it answers;
// for an ACK, the newest packet it covers). A packet that timed out and is
// answered for a transmission older than its resend was not lost: the
// timeout was spurious (EngineStats::spurious_timeouts).
void EngineCore::comp_pkt_done(QpImpl& qp, uint32_t psn, uint64_t now, uint32_t echo_us, uint64_t& acked_bytes) {
  PktRec& r = qp.rec(psn);
  if (r.acked) return;
  qp.path_unlink(psn);
  r.acked = true;
  // A timeout that was no loss: the answer is to a transmission older than
  // the resend, or came while the resend still waited for the window.
  const bool answered_before_latest_tx = int32_t(echo_us - uint32_t(r.sent_ns / 1000)) < 0;
  const bool answered_before_resend = r.retries > 0 && answered_before_latest_tx;
  if (answered_before_resend) stats_.spurious_timeouts++;
  if (answered_before_resend || r.lost)
    if (PathHealth* h = health_of(qp, answered_before_resend ? r.prev_path : r.path)) h->not_lost++;
  if (r.overdue) comp_overdue_verdict(qp, r.lost || answered_before_latest_tx);
  acked_bytes += r.len;
  // Sent once, on one path, and acknowledged: that path delivers. (After
  // a resend nobody can tell which transmission got through.)
  if (r.retries == 0)
    if (PathHealth* h = health_of(qp, r.path)) h->delivered++;
  if (r.retries == 0 && !r.copies && r.sent_ns > qp.newest_arrived_sent_ns) qp.newest_arrived_sent_ns = r.sent_ns;
  if (r.retries == 0 && !r.copies && r.path < qp.path_order.size())
    qp.path_order[r.path].answered_in_ns = now - r.sent_ns;
  qp.last_progress_ns = now;
  qp.backoff = 0;
  if (!r.lost) qp.inflight -= std::min<uint64_t>(qp.inflight, r.len);  // a lost one left already
  r.lost = false;
  SendWqe& w = qp.sq_at(r.wqe);
  if (w.done) return;
  w.pkts_done++;
  if (w.pkts_done >= w.npkts) w.done = true;
}

void EngineCore::comp_ack(QpImpl& qp, const wire::Packet& p, uint64_t now) {
  const wire::AckExt& a = p.ack;
  if (seq_lt(qp.snd_nxt, a.cum_psn)) {  // acknowledges what was never sent
    stats_.bad_ack++;
    return;
  }
  stats_.acks_rcvd++;
  const uint64_t rtt = p.no_rtt ? 0 : echo_rtt(a.echo_ts);
  uint64_t acked = 0;
  // A data packet acknowledged: first, if it tells which path delivered it
  // and when it was sent, what its path lost before it.
  auto ack_data = [&](uint32_t psn) {
    const PktRec& r = qp.rec(psn);
    if (r.kind != PktKind::DATA || r.acked) return;
    if (r.on_path && !r.copies) comp_path_gaps_before(qp, psn, a, now);
    comp_pkt_done(qp, psn, now, a.echo_ts, acked);
  };
  // Cumulative part. READ and atomic PSNs are only done when their response
  // arrives, so the ACK skips them.
  uint32_t from = seq_lt(qp.cum_seen, qp.snd_una) ? qp.snd_una : qp.cum_seen;
  for (uint32_t psn = from; seq_lt(psn, a.cum_psn); psn++) ack_data(psn);
  if (seq_lt(qp.cum_seen, a.cum_psn)) qp.cum_seen = a.cum_psn;
  // Selective part.
  for (unsigned wi = 0; wi < a.sack_words; wi++) {
    uint64_t bits = a.sack[wi];
    while (bits) {
      unsigned b = unsigned(__builtin_ctzll(bits));
      bits &= bits - 1;
      uint32_t psn = a.sack_base + wi * 64 + b;
      if (in_window(qp, psn)) ack_data(psn);
    }
  }
  // The packet that arrived last before the ACK left (the one it echoes)
  // shows what its path lost too, even when it was a resend or a probe.
  comp_path_gaps_echo(qp, a, now);
  while (seq_lt(qp.snd_una, qp.snd_nxt) && qp.rec(qp.snd_una).acked) qp.snd_una++;
  comp_rtt(qp, rtt);
  comp_overdue(qp, now, /*act=*/false);
  qp.paths.on_ack(a.echo_path, rtt, a.ce_count > 0);
  health_answered(qp, a.echo_path, rtt);
  // A plain RoCE v2 peer's window is ECN's alone: its round trips are a
  // software stack's (rxe answers in milliseconds on a busy host), which
  // the delay target would take for a queue and hold the window at its
  // smallest. RoCE itself has no delay signal; the RTO still uses them.
  qp.cc.on_ack(acked, a.rx_count, a.ce_count, qp.roce ? 0 : rtt, qp.snd_una, qp.snd_nxt);

  if (a.syndrome == wire::Syndrome::HELD) {
    comp_held(qp, a, now);
    comp_retire(qp);
    return;
  }
  if (a.syndrome != wire::Syndrome::ACK) {
    stats_.naks_rcvd++;
    // A responder NAKs fatally only the PSN it expects next, its cumulative
    // one (resp_error_now), and it can expect that PSN only once everything
    // before it arrived; so once the cumulative part is applied, that PSN
    // must be the oldest one still outstanding here. A forged NAK that
    // names any later outstanding PSN as both cum and nak fails this.
    const bool fatal = a.syndrome != wire::Syndrome::RNR_NAK;
    if (!in_window(qp, a.nak_psn) || (fatal && (a.nak_psn != a.cum_psn || a.nak_psn != qp.snd_una))) {
      if (fatal) stats_.bad_ack++;
      comp_retire(qp);
      return;
    }
    PktRec& r = qp.rec(a.nak_psn);
    SendWqe& w = qp.sq_at(r.wqe);
    switch (a.syndrome) {
      case wire::Syndrome::RNR_NAK: {
        if (r.acked || w.done) break;
        // One RNR retry per hold period, however many packets got NAKed.
        if (now >= w.rnr_hold_until) {
          if (qp.attr.rnr_retry != 7) {
            if (w.rnr_left == 0) {
              comp_fail_wqe(qp, r.wqe, WcStatus::RNR_RETRY_EXC_ERR);
              return;
            }
            w.rnr_left--;
          }
          uint64_t wait = std::max<uint64_t>(uint64_t(std::min(a.rnr_us, 1'000'000u)) * 1000, 1000);
          w.rnr_hold_until = now + wait;
          // Every unacknowledged packet of the message waits out the RNR
          // time instead of its RTO: the receiver is not ready for any of
          // them, and a long RNR wait must not count as transport retries.
          for (uint32_t k = 0; k < w.pkts_sent; k++) {
            uint32_t psn = w.first_psn + k;
            if (!in_window(qp, psn)) continue;
            PktRec& x = qp.rec(psn);
            if (x.acked) continue;
            x.tx_seq++;
            qp.timers.push({w.rnr_hold_until, psn, x.tx_seq, true});
          }
        } else {
          r.tx_seq++;
          qp.timers.push({w.rnr_hold_until, a.nak_psn, r.tx_seq, true});
        }
        break;
      }
      case wire::Syndrome::NAK_REM_ACCESS:
        comp_fail_wqe(qp, r.wqe, WcStatus::REM_ACCESS_ERR);
        return;
      case wire::Syndrome::NAK_INV_REQ:
        comp_fail_wqe(qp, r.wqe, WcStatus::REM_INV_REQ_ERR);
        return;
      case wire::Syndrome::NAK_REM_OP:
        comp_fail_wqe(qp, r.wqe, WcStatus::REM_OP_ERR);
        return;
      case wire::Syndrome::ACK:
      case wire::Syndrome::HELD: break;  // handled above
      case wire::Syndrome::PAUSED:
      case wire::Syndrome::RESUMED: break;  // taken before (EngineCore::comp_peer_notice)
    }
  }
  comp_retire(qp);
}

void EngineCore::comp_read_resp(QpImpl& qp, const wire::Packet& p, uint64_t now, bool ce) {
  uint32_t psn = p.base.psn;
  if (!in_window(qp, psn)) {
    stats_.dup_pkts++;
    return;
  }
  PktRec& r = qp.rec(psn);
  if (r.kind != PktKind::READ || r.acked) {
    stats_.dup_pkts++;
    return;
  }
  if (p.payload_len != r.len || p.rresp.msg_off != r.off) {  // not the answer we asked for
    stats_.bad_ack++;
    return;
  }
  SendWqe& w = qp.sq_at(r.wqe);
  WcStatus st;
  bool fault = false;
  if (!scatter(qp, w.sge, w.nsge, r.off, p.payload, p.payload_len, st, &fault)) {
    // Pages of an on-demand MR went away since the READ started: the
    // response is dropped as if lost, and asked for again at its timeout.
    if (fault) stats_.page_fault_drops++;
    else comp_fail_wqe(qp, r.wqe, WcStatus::LOC_PROT_ERR);
    return;
  }
  // The response echoes the timestamp of the request it answers, a
  // re-request's too, so every response is an RTT sample (no ambiguity
  // after a resend); a READ that only got through after resends must slow
  // the window like any other late packet.
  uint64_t rtt = echo_rtt(p.base.ts);
  const uint64_t held_ns = uint64_t(p.rresp.held_us) * 1000;
  rtt = rtt > held_ns ? rtt - held_ns : rtt ? 1 : 0;
  uint16_t path = r.path;
  // An answer to the latest request for psn shows what its path lost
  // before it; one to an older request (sent again since) does not.
  if (p.base.path == r.path && p.base.ts == uint32_t(r.sent_ns / 1000)) {
    comp_read_gaps(qp, psn);
    comp_read_reruns(qp, psn);
  }
  uint64_t acked = 0;
  comp_pkt_done(qp, psn, now, p.base.ts, acked);
  while (seq_lt(qp.snd_una, qp.snd_nxt) && qp.rec(qp.snd_una).acked) qp.snd_una++;
  comp_rtt(qp, rtt);
  qp.paths.on_ack(path, rtt, ce);
  health_answered(qp, path, rtt);
  qp.cc.on_ack(acked, 1, ce ? 1 : 0, qp.roce ? 0 : rtt, qp.snd_una, qp.snd_nxt);  // as in comp_ack
  comp_retire(qp);
}

// A HELD notice: the responder holds the request at a.nak_psn, sent at
// a.echo_ts over a.echo_path, because cum_psn has not arrived. If the
// latest transmission of cum_psn went over that same path no later, it
// was lost (a path keeps order), and everything after it waits for it: it
// goes again now, whatever the window, with the rest of its request (a
// READ asked for as one run is asked for again as one). A notice for a
// PSN sent again since, or over another path, proves nothing: the other
// holds a request sent earlier, or the request is still on its way.
void EngineCore::comp_held(QpImpl& qp, const wire::AckExt& a, uint64_t now) {
  const uint32_t e = a.cum_psn;
  if (!in_window(qp, e) || !in_window(qp, a.nak_psn) || !seq_lt(e, a.nak_psn)) {
    stats_.bad_ack++;
    return;
  }
  // The held request arrived: its PSNs wait for e, and their timers count
  // from now (a hold is one loss's repair long, often longer than an RTO).
  const PktRec& y = qp.rec(a.nak_psn);
  if (y.path == a.echo_path && uint32_t(y.sent_ns / 1000) == a.echo_ts)
    for (uint32_t k = 0; k < y.run && in_window(qp, a.nak_psn + k); k++) qp.rec(a.nak_psn + k).held_ns = now;
  PktRec& r = qp.rec(e);
  if (r.acked || qp.sq_at(r.wqe).done) return;
  if (r.path != a.echo_path || int32_t(a.echo_ts - uint32_t(r.sent_ns / 1000)) < 0) return;
  // The whole request went missing: every PSN it asked for. e goes now
  // (if it waited in `resend`, that entry is skipped), the rest with it as
  // far as read_run takes them, or after it.
  const uint32_t n = std::max<uint32_t>(1, r.run);
  for (uint32_t x = e + 1; x != e + n && in_window(qp, x); x++) {
    PktRec& h = qp.rec(x);
    if (!h.acked && !h.lost) lose_for_resend(qp, x);
  }
  if (r.lost) {
    r.lost = false;
    qp.inflight += r.len;
  }
  stats_.held_resends++;
  req_send(qp, e, read_run(qp, e, UINT64_MAX), true, now);
}

// Fast loss detection for READ responses, without waiting for a timeout.
// A responder answers the READ requests that reach it over one path in the
// order they arrive (each in PSN order, a held one when its turn comes,
// and every PSN before it was answered first), and puts the answer on the
// path of the request; a path is one UDP 5-tuple, which the network keeps
// in order. So when the answer to `psn` arrives, a PSN before it whose
// request went out on the same path no later than psn's and that is still
// unanswered was lost, and is asked for again now (req_resend, coalesced
// by read_run). Answers on other paths, or to later requests (a re-request
// of an older PSN), prove nothing and are skipped; what this misses (the
// last answer before a pause, a hole far behind on a sprayed QP) is found
// by its timer.
//
// The scan stops at an answered PSN of the same path sent no later (the
// holes before it were looked for when it arrived), and after two READ
// chunks' worth of PSNs, so that a sprayed QP pays a bounded cost for the
// first answer of each request and about one step for the others.
void EngineCore::comp_read_gaps(QpImpl& qp, uint32_t psn) {
  const PktRec& q = qp.rec(psn);
  auto evidence = [&](const PktRec& h) {
    return h.kind == PktKind::READ && h.path == q.path && h.sent_ns <= q.sent_ns;
  };
  // Back to where to look from, then forward: the resends queue oldest
  // first, so that read_run can ask for neighbours in one request.
  uint32_t lo = psn;
  for (uint32_t steps = 2 * cfg_.read_chunk_pkts; lo != qp.snd_una && steps > 0; steps--) {
    const PktRec& h = qp.rec(lo - 1);
    if (evidence(h) && h.acked) break;
    lo--;
  }
  for (uint32_t x = lo; x != psn; x++) {
    PktRec& h = qp.rec(x);
    if (!evidence(h) || h.acked || h.lost || qp.sq_at(h.wqe).done) continue;
    health_lost(qp, h.path);
    lose_for_resend(qp, x);
    stats_.read_gap_losses++;
  }
}

// The same for the READ re-requests in flight (QpImpl::read_reruns), which
// ask for PSNs far behind the newest ones and so lie beyond that scan: an
// answer to a request sent later over the same path shows that a re-request
// still unanswered, request or answer, was lost.
void EngineCore::comp_read_reruns(QpImpl& qp, uint32_t psn) {
  const PktRec& q = qp.rec(psn);
  for (auto it = qp.read_reruns.begin(); it != qp.read_reruns.end();) {
    if (it->path != q.path || it->sent_ns >= q.sent_ns) {
      ++it;
      continue;
    }
    for (uint32_t x = it->psn; x != it->psn + it->n; x++) {
      if (!in_window(qp, x)) continue;
      PktRec& h = qp.rec(x);
      if (h.kind != PktKind::READ || h.sent_ns != it->sent_ns || h.acked || h.lost || qp.sq_at(h.wqe).done)
        continue;
      health_lost(qp, h.path);
      lose_for_resend(qp, x);
      stats_.read_gap_losses++;
    }
    it = qp.read_reruns.erase(it);
  }
}

// PSN psn is lost (by its timer, or found without it): out of flight,
// queued for its resend, any timer still armed for it void (the resend
// arms a new one), out of its path's list (the resend puts it in its new
// path's).
void EngineCore::lose_for_resend(QpImpl& qp, uint32_t psn) {
  PktRec& h = qp.rec(psn);
  qp.path_unlink(psn);
  h.lost = true;
  h.tx_seq++;
  qp.inflight -= std::min<uint64_t>(qp.inflight, h.len);
  qp.resend.push_back(psn);
}

// Fast loss detection for WRITE and SEND data (issue 30), the READ rule
// applied to the packets themselves. With spraying, packets of one QP
// arrive out of order across paths, so a hole in the SACK bitmap means
// nothing by itself; but a path is one UDP 5-tuple, which the network
// keeps in order. So once a packet is known to have arrived over path p,
// every data packet whose latest transmission went over p before it, and
// that the ACK saying so does not acknowledge, was lost: it is resent at
// once (through `resend`, within the window, as a timed-out one), not
// one RTO (>= 250 us) later. At 100 Gb/s an RTO is 3 MB: the WQEs behind
// the hole completed long before, and the connection stood idle.
//
// Each path keeps its unacknowledged transmissions in the order they left
// (QpImpl::path_order), so a verdict costs one step per packet judged,
// whatever the window and the number of paths. What counts as arrival:
//  - a packet the ACK acknowledges that went out once (comp_path_gaps_before):
//    its arrival is its one transmission's, on its path; a packet resent
//    or copied to a probe path may have arrived by either copy;
//  - the transmission the ACK echoes, the last that arrived before the
//    ACK left (comp_path_gaps_echo): path and microsecond timestamp name
//    one transmission, a resend or a probe copy too. A packet sent in the
//    same microsecond may have left after it, and gets no verdict.
// What is not evidence of loss: a packet the ACK does not report on. An
// ACK covers its cumulative PSN, its bitmap, and no more than a window
// past its cumulative PSN; after a lost ACK, or one split in several
// packets, a packet reported before may lie outside this one's bitmap.
// The walk stops at such a packet (the timer, or a later ACK, decides).
// READ and atomic requests are not in the lists: their answers have rules
// of their own (comp_read_gaps, comp_held).
namespace {

// Whether ACK `a` says if psn had arrived when it left.
bool ack_reports(const wire::AckExt& a, uint32_t psn, uint32_t window) {
  if (seq_lt(psn, a.cum_psn)) return true;
  return seq_lt(psn, a.cum_psn + window) && !seq_lt(psn, a.sack_base) &&
         seq_lt(psn, a.sack_base + 64 * uint32_t(a.sack_words));
}

}  // namespace

// Appends psn's latest transmission to the list of its path.
void QpImpl::path_link(uint32_t psn) {
  PktRec& r = rec(psn);
  if (path_order.size() <= r.path) path_order.resize(std::max<size_t>(paths.num_paths(), size_t(r.path) + 1));
  PathOrder& l = path_order[r.path];
  r.on_path = true;
  r.path_prev = l.tail;
  if (l.n) rec(l.tail).path_next = psn;
  else l.head = psn;
  l.tail = psn;
  l.n++;
}

// Takes psn out of its path's list (acknowledged, lost, or sent again).
void QpImpl::path_unlink(uint32_t psn) {
  PktRec& r = rec(psn);
  if (!r.on_path) return;
  r.on_path = false;
  PathOrder& l = path_order[r.path];
  if (l.head == psn) l.head = r.path_next;
  else rec(r.path_prev).path_next = r.path_next;
  if (l.tail == psn) l.tail = r.path_prev;
  else rec(r.path_next).path_prev = r.path_prev;
  l.n--;
}

// psn, at the head of its path's list, was lost on that path.
void EngineCore::path_gap_lose(QpImpl& qp, uint32_t psn, uint64_t now) {
  qp.path_unlink(psn);
  const PktRec& h = qp.rec(psn);
  const SendWqe& w = qp.sq_at(h.wqe);
  if (h.acked || h.lost || w.done) return;  // not in a list: for safety only
  // The responder refused its message for now (RNR): the RNR wait, not
  // the window, decides when it goes again (its RNR timer is armed).
  if (now < w.rnr_hold_until) return;
  // A loss on its path as much as a timeout is: the fault locator
  // (telemetry) reads these counts to name a lossy link.
  health_lost(qp, h.path);
  lose_for_resend(qp, psn);
  stats_.path_gap_losses++;
}

// psn, sent once, is acknowledged by `a`: what went over its path before it
// and `a` reports as missing was lost.
void EngineCore::comp_path_gaps_before(QpImpl& qp, uint32_t psn, const wire::AckExt& a, uint64_t now) {
  const QpImpl::PathOrder& l = qp.path_order[qp.rec(psn).path];
  while (l.head != psn) {  // psn is in the list, so the walk ends there
    if (!ack_reports(a, l.head, qp.window())) return;
    path_gap_lose(qp, l.head, now);
  }
}

// `a` echoes the transmission that arrived last before it left: what its
// path carried before that microsecond and `a` reports as missing was lost.
void EngineCore::comp_path_gaps_echo(QpImpl& qp, const wire::AckExt& a, uint64_t now) {
  if (a.echo_path >= qp.path_order.size()) return;
  const QpImpl::PathOrder& l = qp.path_order[a.echo_path];
  while (l.n) {
    const PktRec& h = qp.rec(l.head);
    if (int32_t(uint32_t(h.sent_ns / 1000) - a.echo_ts) >= 0) return;  // sent with it, or after
    if (!ack_reports(a, l.head, qp.window())) return;
    path_gap_lose(qp, l.head, now);
  }
}

// The overdue rule (issue 30): a WRITE or SEND packet sent once is lost
// when a packet sent after it has arrived and it is itself overdue: twice
// the slowest round trip of the last epochs (at least a quiet timeout;
// longer after the rule was wrong, comp_overdue_verdict), plus the peer's
// longest ACK delay, have passed since it left. That is TCP's RACK (RFC
// 8985), which times losses from departures. With 128 paths the packets
// behind a loss seldom take its path, so the path-gap rule has nothing to
// go on; and the connection, its completions held by the hole, goes quiet
// only a round trip after the loss's answer was due, so the quiet timer
// resends a round trip later than this rule. Paths differ in delay, and a
// packet sent later on a short path arrives first; the slowest round trip
// bounds that spread. A quarter above it was not enough: on ns-3,
// lossless sprayed runs then resent 66-134 packets in 2 ms that had
// arrived (their answers came later). Blamed on its path as a timeout is.
//
// First transmissions leave in PSN order, so one pass over the window
// suffices: `overdue_next` is the oldest PSN not judged yet. A packet sent
// again, or copied to a probe path, is left to the path-gap, quiet and RTO
// rules (which copy arrived is unknown). An ACK only arms the timer, so
// that the rule acts in the pass after a batch of datagrams, with every
// ACK of the batch read; and a packet in flight across a late pass (the
// engine descheduled, its ACKs waiting in the socket) is not judged by
// its departure at all (EngineCore::forgive_lateness).
uint64_t EngineCore::overdue_timeout(const QpImpl& qp, uint16_t path) const {
  uint64_t slowest = qp.cc.max_rtt_ns();
  if (path < qp.path_order.size()) slowest = std::max(slowest, qp.path_order[path].answered_in_ns);
  return std::max(quiet_timeout(qp), (2 + qp.overdue_slack) * slowest) + cfg_.ack_delay_ns;
}

// A packet the overdue rule took for lost is acknowledged: `wrong` when for
// its first transmission (or while its resend still waited). A path that
// queues far beyond the slowest round trip measured (a slow link filling
// up) makes the rule wrong; as RACK widens its reordering window on a
// DSACK, the rule then waits one slowest round trip more, up to eight in
// all, and narrows again by one after 16 verdicts proved right.
void EngineCore::comp_overdue_verdict(QpImpl& qp, bool wrong) {
  if (wrong) {
    stats_.overdue_wrong++;
    qp.overdue_right = 0;
    if (qp.overdue_slack < 6) qp.overdue_slack++;
  } else if (++qp.overdue_right >= 16) {
    qp.overdue_right = 0;
    if (qp.overdue_slack) qp.overdue_slack--;
  }
}

void EngineCore::comp_overdue(QpImpl& qp, uint64_t now, bool act) {
  uint32_t& psn = qp.overdue_next;
  if (seq_lt(psn, qp.snd_una) || seq_lt(qp.snd_nxt, psn)) psn = qp.snd_una;
  if (qp.roce || qp.srtt == 0) return;
  // Nothing acknowledged for a whole RTO: the RTO's stall guard decides.
  if (act && now - qp.last_progress_ns >= rto(qp, 0)) return;
  for (; seq_lt(psn, qp.snd_nxt); psn++) {
    const PktRec& r = qp.rec(psn);
    if (r.kind != PktKind::DATA || r.acked || r.lost || r.retries || r.copies || !r.on_path) continue;
    const SendWqe& w = qp.sq_at(r.wqe);
    if (w.done || now < w.rnr_hold_until) continue;  // the RNR wait decides
    if (r.sent_ns <= late_pass_ns_) continue;
    if (r.sent_ns >= qp.newest_arrived_sent_ns) return;  // and every later PSN
    const uint64_t due = act ? r.sent_ns + overdue_timeout(qp, r.path) : now;
    if (now < due || !act) {
      if (qp.overdue_armed_ns == 0 || due < qp.overdue_armed_ns) {
        RetxTimer t{due, 0, 0, false};
        t.overdue = true;
        qp.timers.push(t);
        qp.overdue_armed_ns = due;
      }
      return;
    }
    stats_.overdue_losses++;
    qp.rec(psn).overdue = true;
    timer_lost(qp, r.path, /*set_aside=*/true, now);
    lose_for_resend(qp, psn);
  }
}

void EngineCore::comp_atomic_resp(QpImpl& qp, const wire::Packet& p, uint64_t now) {
  uint32_t psn = p.base.psn;
  if (!in_window(qp, psn)) {
    stats_.dup_pkts++;
    return;
  }
  PktRec& r = qp.rec(psn);
  if (r.kind != PktKind::ATOMIC || r.acked) {
    stats_.dup_pkts++;
    return;
  }
  SendWqe& w = qp.sq_at(r.wqe);
  uint64_t orig = p.aresp.orig;
  WcStatus st;
  bool fault = false;
  if (!scatter(qp, w.sge, w.nsge, 0, reinterpret_cast<const uint8_t*>(&orig), 8, st, &fault)) {
    // As for a READ response; the responder answers the resent request
    // from its replay cache, so the atomic does not run twice.
    if (fault) stats_.page_fault_drops++;
    else comp_fail_wqe(qp, r.wqe, WcStatus::LOC_PROT_ERR);
    return;
  }
  uint64_t acked = 0;
  comp_pkt_done(qp, psn, now, p.base.ts, acked);
  while (seq_lt(qp.snd_una, qp.snd_nxt) && qp.rec(qp.snd_una).acked) qp.snd_una++;
  comp_retire(qp);
}

void EngineCore::comp_fail_wqe(QpImpl& qp, uint64_t idx, WcStatus st) {
  SendWqe& w = qp.sq_at(idx);
  if (!w.done || w.status == WcStatus::SUCCESS) {
    w.done = true;
    w.status = st;
  }
  qp.sq_next = qp.sq_tail;
  events_.push_back({AsyncEventType::QP_FATAL, qp.qpn_});
  qp_to_error(qp);
}

void EngineCore::comp_retire(QpImpl& qp) {
  while (qp.sq_head < qp.sq_tail) {
    SendWqe& w = qp.sq_at(qp.sq_head);
    if (!w.done) {
      if (qp.state_ != QpState::ERR) break;
      w.done = true;
      w.status = WcStatus::WR_FLUSH_ERR;
    }
    if (w.rd_counted) {
      w.rd_counted = false;
      qp.rd_atomic_outstanding--;
    }
    if (w.signaled || w.status != WcStatus::SUCCESS) {
      Wc wc;
      wc.wr_id = w.wr_id;
      wc.status = w.status;
      wc.opcode = wc_opcode(w.op);
      wc.vendor_err = w.vendor_err;
      wc.byte_len = w.op == WrOpcode::RDMA_READ ? uint32_t(w.len)
                    : is_rd_atomic(w.op)        ? 8
                                                : uint32_t(w.len);
      wc.qp_num = qp.qpn_;
      wc.src_qp = qp.attr.dest_qp_num;
      emit(qp.send_cq, wc);
    }
    qp.sq_head++;
  }
  if (qp.sq_next < qp.sq_head) qp.sq_next = qp.sq_head;
  if (qp.state_ == QpState::SQD && qp.sq_head == qp.sq_next && !qp.drained_reported &&
      qp.attr.en_sqd_async_notify) {
    qp.drained_reported = true;
    events_.push_back({AsyncEventType::SQ_DRAINED, qp.qpn_});
  }
}

}  // namespace vstellar
