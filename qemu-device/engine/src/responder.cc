// Responder: requests from the peer. Data packets are placed directly where
// they belong (each carries its address/key or receive sequence number and
// offset), in any order inside the PSN window; an arrival bitmap drops
// duplicates and yields the SACK. READ and atomic requests execute when every
// earlier PSN has arrived (so they see earlier WRITEs, as IB's in-order
// responder does). Receive completions are produced in order once the
// cumulative PSN passes a message's last packet.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "engine_internal.h"

namespace vstellar {
void EngineCore::resp_receive(QpImpl& qp, const wire::Packet& p, bool ce, uint64_t now) {
  const uint32_t psn = p.base.psn;
  const uint32_t d = psn - qp.epsn;
  const bool old = seq_lt(psn, qp.epsn);
  const bool in_win = !old && d < qp.window();
  auto note_ack = [&] {
    // A duplicate from behind epsn asks for the cumulative ACK only: its
    // PSN, which may lie anywhere in the other half of the sequence space,
    // must not stretch the range the SACK bitmaps cover.
    const uint32_t at = in_win ? psn : qp.epsn;
    if (!qp.ack_pending) {
      qp.ack_pending = true;
      qp.ack_lo = qp.ack_hi = at;
      ack_list_.push_back(&qp);
    } else {
      if (seq_lt(at, qp.ack_lo)) qp.ack_lo = at;
      if (seq_lt(qp.ack_hi, at)) qp.ack_hi = at;
    }
    qp.rx_since_ack++;
    if (ce) qp.ce_since_ack++;
    qp.last_ts = p.base.ts;
    qp.last_path = p.base.path;
    // A probe copy is answered at once, so that the ACK names its path
    // (wire::F_PROBE): the requester takes that path back.
    if (qp.rx_since_ack >= cfg_.ack_every || (p.base.flags & wire::F_PROBE)) send_ack(qp);
  };

  switch (p.base.op) {
    case wire::Op::SEND:
    case wire::Op::SEND_IMM:
    case wire::Op::SEND_INV:
    case wire::Op::WRITE:
    case wire::Op::WRITE_IMM:
      if (old || (in_win && qp.rbit(psn))) {
        stats_.dup_pkts++;
        note_ack();  // the ACK for it may have been lost
        return;
      }
      if (!in_win) {
        stats_.out_of_window++;
        return;
      }
      resp_data(qp, p);
      if (qp.state_ == QpState::ERR) return;
      note_ack();
      return;
    case wire::Op::READ_REQ:
    case wire::Op::CMP_SWAP:
    case wire::Op::FETCH_ADD: {
      bool is_read = p.base.op == wire::Op::READ_REQ;
      if (old || (in_win && qp.rbit(psn))) {
        if (is_read) {
          resp_reread(qp, p);  // a re-request of (part of) a READ it executed
        } else {
          // A duplicate atomic must not execute twice: answer from the replay cache.
          for (auto& r : qp.atomic_replay)
            if (r.valid && r.psn == psn) send_atomic_resp(qp, psn, p.base.path, p.base.ts, r.orig);
          stats_.dup_pkts++;
        }
        return;
      }
      if (!in_win) {
        stats_.out_of_window++;
        return;
      }
      if (d == 0) {
        bool ok = is_read ? resp_read(qp, p, true) : resp_atomic(qp, p);
        if (!ok) return;
        uint32_t n = is_read ? std::max<uint32_t>(1, (p.rreq.len + p.rreq.seg - 1) / p.rreq.seg) : 1;
        resp_mark(qp, psn, n);
        resp_advance(qp);
        return;
      }
      if (is_read && resp_read_early(qp, p)) return;
      // Earlier PSNs still missing: hold the request until they arrive,
      // and say so: on its path, the request for epsn went first, so it
      // is likely lost, and the requester need not wait for a timeout.
      send_held(qp, p);
      for (auto& q : qp.pending_rd)
        if (q.base.psn == psn) return;
      if (qp.pending_rd.size() >= kMaxPendingReads) {
        stats_.pending_rd_drops++;
        return;
      }
      qp.pending_rd.push_back(p);
      qp.pending_rd.back().payload = nullptr;
      qp.pending_rd.back().held_since_us = now_us();
      return;
    }
    default:
      stats_.bad_state++;
      return;
  }
}

// Answers (ACKs, NAKs, READ and atomic responses) go back on the path id
// of the request they answer (for an ACK, the newest data packet it
// covers), so they are sprayed as the requests are, and a path id names a
// round trip: the requester's timeout on a path sets aside the path that
// lost the request or its answer, and its ACKs then avoid it too (path.h).
uint16_t EngineCore::reply_path(QpImpl& qp, uint16_t req_path) {
  return req_path < qp.paths.num_paths() ? req_path : qp.paths.pick(0);
}

void EngineCore::resp_mark(QpImpl& qp, uint32_t psn, uint32_t n) {
  qp.fault_since_ns = 0;  // a request went through (resp_fault_nak)
  for (uint32_t k = 0; k < n; k++) {
    uint32_t x = psn + k;
    if (!seq_lt(x, qp.epsn) && x - qp.epsn < qp.window()) qp.set_rbit(x, true);
  }
}

void EngineCore::resp_advance(QpImpl& qp) {
  uint32_t start = qp.epsn;
  for (;;) {
    while (qp.rbit(qp.epsn)) {
      qp.set_rbit(qp.epsn, false);
      qp.epsn++;
    }
    // A held READ/atomic whose turn has come (stale ones are dropped first).
    if (qp.pending_rd.empty()) break;
    qp.pending_rd.erase(std::remove_if(qp.pending_rd.begin(), qp.pending_rd.end(),
                                       [&](const wire::Packet& q) {
                                         return seq_lt(q.base.psn, qp.epsn);
                                       }),
                        qp.pending_rd.end());
    auto it = std::find_if(qp.pending_rd.begin(), qp.pending_rd.end(),
                           [&](const wire::Packet& q) { return q.base.psn == qp.epsn; });
    if (it == qp.pending_rd.end()) break;
    wire::Packet q = *it;
    qp.pending_rd.erase(it);
    // The requester's RTT sample must leave out the time the request was
    // held here: it is the network's, not the wait for a lost earlier PSN
    // (which would inflate its RTO at every loss, and the next wait with
    // it). A READ answer says how long (ReadRespExt::held_us); an atomic
    // answer's echoed timestamp is moved on by as much.
    const uint32_t held_us = now_us() - q.held_since_us;
    bool is_read = q.base.op == wire::Op::READ_REQ;
    if (!is_read) q.base.ts += held_us;
    bool ok = is_read ? resp_read(qp, q, true, held_us) : resp_atomic(qp, q);
    if (!ok) return;
    uint32_t n = is_read ? std::max<uint32_t>(1, (q.rreq.len + q.rreq.seg - 1) / q.rreq.seg) : 1;
    resp_mark(qp, q.base.psn, n);
  }
  if (qp.epsn == start) return;
  // Held READs that the new epsn lets go ahead of the gap.
  for (size_t i = 0; i < qp.pending_rd.size();) {
    const wire::Packet q = qp.pending_rd[i];
    if (q.base.op == wire::Op::READ_REQ && resp_read_early(qp, q, now_us() - q.held_since_us)) {
      qp.pending_rd.erase(qp.pending_rd.begin() + ptrdiff_t(i));
    } else {
      i++;
    }
  }
  // Stopped at a new gap with requests still held: the newest of them
  // tells the requester which PSN it now waits for, as when it arrived
  // (send_held); with the window full, no new request would.
  if (!qp.pending_rd.empty()) {
    auto newest = std::max_element(qp.pending_rd.begin(), qp.pending_rd.end(),
                                   [](const wire::Packet& x, const wire::Packet& y) {
                                     return seq_lt(x.base.psn, y.base.psn);
                                   });
    send_held(qp, *newest);
  }
  resp_complete_recvs(qp);
}

void EngineCore::resp_data(QpImpl& qp, const wire::Packet& p) {
  const wire::DataExt& e = p.data;
  const uint32_t psn = p.base.psn;
  const uint64_t plen = p.payload_len;
  const bool last = p.base.flags & wire::F_LAST;
  const wire::Op op = p.base.op;
  if (uint64_t(e.msg_off) + plen > e.msg_len || e.msg_len > DeviceLimits::kMaxMsgSize ||
      (last && uint64_t(e.msg_off) + plen != e.msg_len)) {
    resp_nak(qp, wire::Syndrome::NAK_INV_REQ, psn, WcStatus::SUCCESS);
    return;
  }
  bool needs_rq = op != wire::Op::WRITE;
  RecvWqe* r = nullptr;
  if (needs_rq && (op != wire::Op::WRITE_IMM || last)) {
    uint32_t k = e.rsn - uint32_t(qp.rq_head);
    if (int32_t(k) < 0) {  // names a receive WQE that already completed: bogus
      resp_nak(qp, wire::Syndrome::NAK_INV_REQ, psn, WcStatus::SUCCESS);
      return;
    }
    // A message ahead of this one that has not completed still has its
    // last PSN in [epsn, psn), one PSN each at least, so k > psn - epsn
    // names a receive no sender could have reached yet. Checked on every
    // QP, not only on an SRQ's: it is also the bound on the WQEs one packet
    // may take from a shared SRQ.
    if (k > psn - qp.epsn) {
      resp_nak(qp, wire::Syndrome::NAK_INV_REQ, psn, WcStatus::SUCCESS);
      return;
    }
    const uint64_t held = recv_held(qp, uint64_t(k) + 1);
    if (k >= held) {  // not posted yet: receiver not ready
      resp_nak(qp, wire::Syndrome::RNR_NAK, psn, WcStatus::SUCCESS);
      return;
    }
    r = &qp.rq_at(qp.rq_head + k);
  }
  if (op == wire::Op::WRITE || op == wire::Op::WRITE_IMM) {
    // IB (C9-88): a zero-length RDMA WRITE checks no R_Key and touches no
    // memory; UCX's rc_verbs flushes with one whose rkey is 0.
    uint64_t va = e.va + e.msg_off;
    Mr* mr = e.msg_len && va >= e.va ? remote_mr(qp, e.rkey, va, plen, ACCESS_REMOTE_WRITE) : nullptr;
    if (e.msg_len && (!mr || !(qp.attr.qp_access_flags & ACCESS_REMOTE_WRITE))) {
      resp_nak(qp, wire::Syndrome::NAK_REM_ACCESS, psn, WcStatus::SUCCESS);
      return;
    }
    bool fault = false;
    if (plen && !mem_write(mr->mem(), va, p.payload, plen, &fault)) {
      if (fault) {
        // Ask for the rest of the message too (as mlx5 faults a WRITE's
        // whole length): its other packets need those pages next, and
        // one fault round trip per packet would be one per page.
        mem_probe(mr->mem(), va, e.msg_len - e.msg_off, true);
        resp_fault_nak(qp, psn);
      } else {
        resp_nak(qp, wire::Syndrome::NAK_REM_OP, psn, WcStatus::SUCCESS);
      }
      return;
    }
    if (r) {
      r->have_last = true;
      r->last_psn = psn;
      r->byte_len = e.msg_len;
      r->imm = e.imm;
      r->with_imm = true;
      r->write_imm = true;
    }
  } else {
    if (op == wire::Op::SEND_INV) {
      // The key must be one this QP may invalidate, from the first packet
      // on; it is invalidated when the SEND completes (resp_complete_recvs).
      uint32_t vendor = 0;
      if (invalidate(qp, e.rkey, /*remote=*/true, /*check_only=*/true, &vendor) != WcStatus::SUCCESS) {
        resp_nak(qp, wire::Syndrome::NAK_REM_ACCESS, psn, WcStatus::SUCCESS);
        return;
      }
    }
    if (e.msg_len > r->cap) {
      if (!resp_error_now(qp, psn)) return;
      r->status = WcStatus::LOC_LEN_ERR;
      resp_nak(qp, wire::Syndrome::NAK_INV_REQ, psn, WcStatus::LOC_LEN_ERR);
      return;
    }
    WcStatus st = WcStatus::SUCCESS;
    bool fault = false;
    if (plen && !scatter(qp, r->sge, r->nsge, e.msg_off, p.payload, plen, st, &fault)) {
      if (fault) {
        resp_fault_nak(qp, psn);
        return;
      }
      if (!resp_error_now(qp, psn)) return;
      r->status = st;
      resp_nak(qp, wire::Syndrome::NAK_REM_OP, psn, st);
      return;
    }
    if (last) {
      r->have_last = true;
      r->last_psn = psn;
      r->byte_len = e.msg_len;
      r->imm = e.imm;
      r->with_imm = op == wire::Op::SEND_IMM;
      r->with_inv = op == wire::Op::SEND_INV;
      if (r->with_inv) r->imm = e.rkey;
      r->write_imm = false;
    }
  }
  resp_mark(qp, psn, 1);
  resp_advance(qp);
}

// UC responder. Nothing goes back to the requester, so nothing can be
// resent: packets are taken strictly in PSN order, as IB's UC responder
// takes them. A PSN gap (a lost packet, or a message overtaken by a later
// one) drops the message in progress, whose receive WQE stays for the next
// message, and every packet up to the next FIRST or ONLY one. So are
// messages that do not fit their receive WQE, WRITEs with a bad R_Key and
// messages that find no receive WQE: the QP stays in its state (IB: UC
// responder errors are silent drops; there is no one to tell).
void EngineCore::resp_uc(QpImpl& qp, const wire::Packet& p) {
  const uint32_t psn = p.base.psn;
  if (seq_lt(psn, qp.epsn)) {  // behind what was taken: a duplicate or overtaken
    stats_.uc_drops++;
    return;
  }
  const bool first = p.base.flags & wire::F_FIRST;
  if (qp.uc_in_msg && (psn != qp.epsn || first)) resp_uc_drop(qp);  // the rest of it is lost
  qp.epsn = psn + 1;
  if (!qp.uc_in_msg) {
    if (!first) {  // the middle of a message whose start was lost
      stats_.uc_drops++;
      return;
    }
    qp.uc_in_msg = true;
    qp.uc_op = p.base.op;
    qp.uc_len = p.data.msg_len;
    qp.uc_va = p.data.va;
    qp.uc_rkey = p.data.rkey;
  } else if (p.base.op != qp.uc_op || p.data.msg_len != qp.uc_len || p.data.va != qp.uc_va ||
             p.data.rkey != qp.uc_rkey) {
    resp_uc_drop(qp);  // does not continue its message: malformed
    stats_.uc_drops++;
    return;
  }
  if (!resp_uc_place(qp, p)) {
    resp_uc_drop(qp);
    return;
  }
  if (!(p.base.flags & wire::F_LAST)) return;
  qp.uc_in_msg = false;
  stats_.uc_rcvd++;
  resp_complete_recvs(qp);
}

// Places one in-order UC packet; false if its message must be dropped.
bool EngineCore::resp_uc_place(QpImpl& qp, const wire::Packet& p) {
  const wire::DataExt& e = p.data;
  const uint64_t plen = p.payload_len;
  const bool first = p.base.flags & wire::F_FIRST;
  const bool last = p.base.flags & wire::F_LAST;
  const wire::Op op = p.base.op;
  if (e.msg_len > DeviceLimits::kMaxMsgSize || uint64_t(e.msg_off) + plen > e.msg_len ||
      (first && e.msg_off != 0) || (last != (uint64_t(e.msg_off) + plen == e.msg_len)) ||
      (!last && plen == 0))
    return false;
  RecvWqe* r = nullptr;
  if (op == wire::Op::SEND || op == wire::Op::SEND_IMM || (op == wire::Op::WRITE_IMM && last)) {
    const uint64_t held = recv_held(qp, 1);
    if (held == 0) return false;  // no receive WQE: UC has no RNR wait
    r = &qp.rq_at(qp.rq_head);
  }
  if (op == wire::Op::WRITE || op == wire::Op::WRITE_IMM) {
    // As for RC, a zero-length WRITE checks no R_Key (C9-88).
    if (e.msg_len) {
      Mr* mr = find_mr(e.rkey);
      const uint64_t va = e.va + e.msg_off;
      if (!mr || mr->pd() != qp.pd() || !(qp.attr.qp_access_flags & ACCESS_REMOTE_WRITE) || va < e.va ||
          !mr->allows(va, plen, ACCESS_REMOTE_WRITE))
        return false;
      if (plen && !mem_write(mr->mem(), va, p.payload, plen)) return false;
    }
    if (r) {
      r->have_last = true;
      r->last_psn = p.base.psn;
      r->byte_len = e.msg_len;
      r->imm = e.imm;
      r->with_imm = true;
      r->write_imm = true;
    }
    return true;
  }
  if (e.msg_len > r->cap) return false;
  WcStatus st = WcStatus::SUCCESS;
  if (plen && !scatter(qp, r->sge, r->nsge, e.msg_off, p.payload, plen, st)) return false;
  if (last) {
    r->have_last = true;
    r->last_psn = p.base.psn;
    r->byte_len = e.msg_len;
    r->imm = e.imm;
    r->with_imm = op == wire::Op::SEND_IMM;
    r->write_imm = false;
  }
  return true;
}

// The UC message in progress is lost. Its receive WQE, if it had begun to
// fill one, stays at rq_head for the next message.
void EngineCore::resp_uc_drop(QpImpl& qp) {
  if (qp.uc_in_msg) stats_.uc_drops++;
  qp.uc_in_msg = false;
}

bool EngineCore::resp_read(QpImpl& qp, const wire::Packet& p, bool first, uint32_t held_us) {
  const wire::ReadReqExt& e = p.rreq;
  const uint32_t psn = p.base.psn;
  if (e.seg == 0 || e.len > DeviceLimits::kMaxMsgSize ||
      (e.len + uint64_t(e.seg) - 1) / e.seg > qp.window() / 2) {
    resp_nak(qp, wire::Syndrome::NAK_INV_REQ, psn, WcStatus::SUCCESS);
    return false;
  }
  // As for WRITE, a zero-length READ checks no R_Key.
  Mr* mr = e.len ? remote_mr(qp, e.rkey, e.va, e.len, ACCESS_REMOTE_READ) : nullptr;
  if (e.len && (!mr || !(qp.attr.qp_access_flags & ACCESS_REMOTE_READ))) {
    resp_nak(qp, wire::Syndrome::NAK_REM_ACCESS, psn, WcStatus::SUCCESS);
    return false;
  }
  uint32_t n = std::max<uint32_t>(1, (e.len + e.seg - 1) / e.seg);
  const uint16_t path = reply_path(qp, p.base.path);
  // On-demand pages must all be there before the first response leaves.
  // In its turn the request is refused for now (RNR); ahead of its turn
  // (resp_read_early) it is held. A re-request (the pages were taken away
  // since the READ was answered, and a response was lost) is refused with
  // RNR too: unanswered, the requester would ask again only after its
  // backed-off RTO, counting each try against its retry limit, and a guest
  // that takes pages away now and then (reclaim, THP collapse) could fail
  // the QP although every request was heard.
  if (e.len && mr->mem().on_demand()) {
    MemCheck c = mem_probe(mr->mem(), e.va, e.len, false);
    if (c == MemCheck::kFault) {
      if (!first || psn == qp.epsn) resp_fault_nak(qp, psn);
      return false;
    }
    if (c == MemCheck::kError) {
      if (first) resp_nak(qp, wire::Syndrome::NAK_REM_OP, psn, WcStatus::SUCCESS);
      return false;
    }
  }
  if (first) {  // not a re-request (resp_reread)
    // Keep what a requester may still ask again: READs whose PSNs are
    // within one window behind epsn (or ahead of it: resp_read_early),
    // in PSN order.
    while (!qp.reads_done.empty() &&
           seq_lt(qp.reads_done.front().psn + qp.reads_done.front().npsn, qp.epsn) &&
           qp.epsn - (qp.reads_done.front().psn + qp.reads_done.front().npsn) > qp.window())
      qp.reads_done.pop_front();
    auto at = std::upper_bound(qp.reads_done.begin(), qp.reads_done.end(), psn,
                               [](uint32_t x, const QpImpl::ReadDone& r) { return seq_lt(x, r.psn); });
    qp.reads_done.insert(at, {psn, n, e.va, e.rkey, e.len, e.msg_off, e.seg});
    }
  for (uint32_t k = 0; k < n; k++) {
    uint64_t off = uint64_t(k) * e.seg;
    uint32_t l = uint32_t(std::min<uint64_t>(e.seg, e.len - off));
    HostSpan spans[64];
    size_t ns = 0;
    uint64_t done = 0;
    while (done < l) {
      TranslateResult tr =
          mr->mem().translate(e.va + off + done, l - done, false, spans + ns, 64 - ns);
      if (!tr.ok || tr.covered == 0) {
        resp_nak(qp, wire::Syndrome::NAK_REM_OP, psn, WcStatus::SUCCESS);
        return false;
      }
      ns += tr.count;
      done += tr.covered;
    }
    wire::Base b;
    b.op = wire::Op::READ_RESP;
    b.dst_qpn = qp.attr.dest_qp_num;
    b.src_qpn = qp.qpn_;
    b.psn = psn + k;
    b.path = path;
    b.ts = p.base.ts;
    b.payload_len = uint16_t(l);
    if (k == 0) b.flags |= wire::F_FIRST;
    if (k + 1 == n) b.flags |= wire::F_LAST;
    wire::ReadRespExt x;
    x.msg_off = uint32_t(e.msg_off + off);
    x.held_us = held_us;
    uint8_t hdr[wire::kMaxHeaderLen];
    size_t hl = wire::encode(b, x, hdr);
    xmit(qp, b.path, hdr, hl, spans, ns, l, false);
  }
  qp.fault_since_ns = 0;  // answered (a re-request is not marked: resp_mark)
  return true;
}

// A READ whose missing earlier PSNs are all READs (ReadReqExt::reads_before)
// is answered now instead of held: a READ changes nothing another READ
// sees, so the order among READs is not observable, and a lost READ
// request then delays its own answer only, not every READ after it. Its
// PSNs are marked arrived, so epsn passes them once the gap is filled, and
// it is kept for re-requests as the READs answered in order are.
bool EngineCore::resp_read_early(QpImpl& qp, const wire::Packet& p, uint32_t held_us) {
  const wire::ReadReqExt& e = p.rreq;
  const uint32_t d = p.base.psn - qp.epsn;
  if (e.seg == 0 || d > e.reads_before) return false;
  const uint64_t n = std::max<uint64_t>(1, (uint64_t(e.len) + e.seg - 1) / e.seg);
  if (d + n > qp.window()) return false;  // its PSNs must fit the receive bitmap
  if (!resp_read(qp, p, true, held_us)) return false;  // an error waits for its turn (resp_error_now)
  resp_mark(qp, p.base.psn, uint32_t(n));
  stats_.early_reads++;
  return true;
}

// A READ request behind epsn: the requester lost (part of) the response and
// asks again. Reads are idempotent, so it is executed again, but only if it
// names PSNs, bytes and key of a READ this QP executed: what comes back is
// at most what the peer asked for in the first place.
void EngineCore::resp_reread(QpImpl& qp, const wire::Packet& p) {
  const wire::ReadReqExt& e = p.rreq;
  const uint32_t psn = p.base.psn;
  // The nearest READ that starts at or before psn and covers it (the deque
  // is in PSN order; READs answered ahead of a gap can overlap a later
  // answer of a longer request over the same PSNs).
  auto it = std::upper_bound(qp.reads_done.begin(), qp.reads_done.end(), psn,
                             [&](uint32_t x, const QpImpl::ReadDone& r) { return seq_lt(x, r.psn); });
  bool ok = false;
  while (it != qp.reads_done.begin()) {
    --it;
    if (psn - it->psn >= qp.window()) break;
    if (psn - it->psn < it->npsn) {
      ok = true;
      break;
    }
  }
  if (ok) {
    const uint32_t k = psn - it->psn;
    const uint64_t skip = uint64_t(k) * it->seg;
    ok = k < it->npsn && e.seg == it->seg && e.rkey == it->rkey && skip <= it->len &&
         e.va == it->va + skip && e.msg_off == it->msg_off + skip;
    // A re-request may ask for the lost PSNs of several requests this
    // responder executed apart, or of some not executed yet (the
    // requester asks for a run of them at once): it is answered as far as
    // the READs it spans follow each other without a gap (PSNs, address,
    // message offset, key).
    uint64_t covered = ok ? it->len - skip : 0;
    for (auto prev = it, next = std::next(it); ok && covered < e.len && next != qp.reads_done.end();
         prev = next++) {
      if (next->psn != prev->psn + prev->npsn || next->va != prev->va + prev->len ||
          next->msg_off != prev->msg_off + prev->len || next->rkey != prev->rkey || next->seg != prev->seg)
        break;
      covered += next->len;
    }
    // Beyond that, it gets only what the READs it spans covered (never
    // more than the peer asked for before); the rest is asked for again.
    if (ok && e.len > covered) {
      wire::Packet q = p;
      q.rreq.len = uint32_t(covered);
      stats_.dup_pkts++;
      resp_read(qp, q, false);
      return;
    }
  }
  if (!ok) {
    stats_.bad_reread++;
    return;
  }
  stats_.dup_pkts++;
  resp_read(qp, p, false);
}

bool EngineCore::resp_atomic(QpImpl& qp, const wire::Packet& p) {
  const wire::AtomicExt& e = p.atomic;
  const uint32_t psn = p.base.psn;
  if (e.va % 8) {
    resp_nak(qp, wire::Syndrome::NAK_INV_REQ, psn, WcStatus::SUCCESS);
    return false;
  }
  Mr* mr = remote_mr(qp, e.rkey, e.va, 8, ACCESS_REMOTE_ATOMIC);
  if (!mr || !(qp.attr.qp_access_flags & ACCESS_REMOTE_ATOMIC)) {
    resp_nak(qp, wire::Syndrome::NAK_REM_ACCESS, psn, WcStatus::SUCCESS);
    return false;
  }
  HostSpan sp;
  TranslateResult tr = mr->mem().translate(e.va, 8, true, &sp, 1);
  if (tr.fault) {
    if (psn == qp.epsn) resp_fault_nak(qp, psn);
    return false;
  }
  if (!tr.ok || tr.covered != 8 || (reinterpret_cast<uintptr_t>(sp.ptr) % 8)) {
    resp_nak(qp, wire::Syndrome::NAK_REM_OP, psn, WcStatus::SUCCESS);
    return false;
  }
  // Atomic with respect to other host threads touching the same memory.
  std::atomic_ref<uint64_t> ref(*reinterpret_cast<uint64_t*>(sp.ptr));
  uint64_t orig;
  if (p.base.op == wire::Op::CMP_SWAP) {
    orig = e.compare;
    ref.compare_exchange_strong(orig, e.swap_add);
  } else {
    orig = ref.fetch_add(e.swap_add);
  }
  auto& slot = qp.atomic_replay[qp.atomic_replay_next++ % 32];
  slot = {psn, orig, true};
  send_atomic_resp(qp, psn, p.base.path, p.base.ts, orig);
  return true;
}

// The original value for the atomic at psn (first execution or replay).
void EngineCore::send_atomic_resp(QpImpl& qp, uint32_t psn, uint16_t path, uint32_t echo_ts,
                                  uint64_t orig) {
  wire::Base b;
  b.op = wire::Op::ATOMIC_RESP;
  b.dst_qpn = qp.attr.dest_qp_num;
  b.src_qpn = qp.qpn_;
  b.psn = psn;
  b.path = reply_path(qp, path);
  b.ts = echo_ts;
  wire::AtomicRespExt x{orig};
  uint8_t hdr[wire::kMaxHeaderLen];
  size_t hl = wire::encode(b, x, hdr);
  xmit(qp, b.path, hdr, hl, nullptr, 0, 0, false);
}

void EngineCore::resp_complete_recvs(QpImpl& qp) {
  while (qp.rq_head < qp.rq_tail) {
    RecvWqe& r = qp.rq_at(qp.rq_head);
    if (!r.have_last || !seq_lt(r.last_psn, qp.epsn) || r.status != WcStatus::SUCCESS) break;
    // A SEND with invalidate takes its key away in PSN order, once every
    // earlier request arrived, not when its own last packet did: a WRITE
    // before it that used the key and was lost is still to come (nvmet's
    // data, then its answer SEND_WITH_INV; at the loss, the resent WRITE
    // met an invalid key, and the connection ended with REM_ACCESS).
    if (r.with_inv) {
      uint32_t vendor = 0;
      invalidate(qp, r.imm, /*remote=*/true, /*check_only=*/false, &vendor);  // checked at arrival
    }
    Wc wc;
    wc.wr_id = r.wr_id;
    wc.status = WcStatus::SUCCESS;
    wc.opcode = r.write_imm ? WcOpcode::RECV_RDMA_WITH_IMM : WcOpcode::RECV;
    wc.byte_len = r.byte_len;
    wc.imm_data = r.imm;
    wc.wc_flags = (r.with_imm ? uint32_t(WC_WITH_IMM) : 0u) | (r.from_srq ? uint32_t(WC_SRQ) : 0u) |
                  (r.with_inv ? uint32_t(WC_WITH_INV) : 0u);
    wc.qp_num = qp.qpn_;
    wc.src_qp = qp.attr.dest_qp_num;
    emit(qp.recv_cq, wc);
    qp.rq_head++;
  }
}

// Whether a request that breaks the rules should end the connection now:
// only when it is the next one expected. One that arrived ahead of holes is
// dropped unanswered instead, so that a blind packet with a guessed QPN and
// a PSN anywhere in the window cannot kill the QP; if the peer really sent
// it, the peer resends it and it fails in order (IB reports responder
// errors in PSN order too).
bool EngineCore::resp_error_now(QpImpl& qp, uint32_t psn) {
  if (psn == qp.epsn) return true;
  stats_.early_errors++;
  return false;
}

// NAK a request. RNR is a wait; every other NAK is a fatal error for the
// connection (IB class B/C/D responder errors), so the QP goes to ERR.
void EngineCore::resp_nak(QpImpl& qp, wire::Syndrome s, uint32_t psn, WcStatus local, uint32_t rnr_us) {
  if (s != wire::Syndrome::RNR_NAK && !resp_error_now(qp, psn)) return;
  wire::Base b;
  b.op = wire::Op::ACK;
  b.dst_qpn = qp.attr.dest_qp_num;
  b.src_qpn = qp.qpn_;
  b.psn = psn;
  b.path = reply_path(qp, qp.last_path);
  b.ts = now_us();
  wire::AckExt a;
  a.cum_psn = qp.epsn;
  a.sack_base = qp.epsn;
  a.syndrome = s;
  a.nak_psn = psn;
  a.echo_ts = qp.last_ts;
  a.echo_path = qp.last_path;
  a.rnr_us = rnr_us ? rnr_us : kRnrUs[qp.attr.min_rnr_timer & 31];
  uint8_t hdr[wire::kMaxHeaderLen + 8 * wire::kMaxSackWords];
  size_t hl = wire::encode(b, a, hdr);
  xmit(qp, b.path, hdr, hl, nullptr, 0, 0, false);
  if (s == wire::Syndrome::RNR_NAK) {
    stats_.rnr_naks_sent++;
    return;
  }
  stats_.naks_sent++;
  (void)local;  // recorded in the receive WQE by the caller; flushed below
  events_.push_back({s == wire::Syndrome::NAK_REM_ACCESS ? AsyncEventType::QP_ACCESS_ERR
                                                         : AsyncEventType::QP_REQ_ERR,
                     qp.qpn_});
  qp_to_error(qp);
}

// A request met pages of an on-demand MR that are not mapped yet; their
// owner has been asked for them (MemoryTranslator::translate). The request
// is refused as "receiver not ready", as mlx5 answers a responder page
// fault: the requester resends after the RNR time, and nothing of the
// connection is lost. The wait starts at the QP's RNR timer, but no longer
// than a fault takes a guest on a real CPU (min_rnr_timer 0 means 655
// ms), and grows to half the time waited so far: a slow guest (emulated,
// or on a loaded host) is not flooded with resends of whole messages
// while it serves the fault.
void EngineCore::resp_fault_nak(QpImpl& qp, uint32_t psn) {
  stats_.page_fault_naks++;
  const uint64_t now = clock_.now_ns();
  if (!qp.fault_since_ns) qp.fault_since_ns = now;
  const uint32_t base = std::min(kRnrUs[qp.attr.min_rnr_timer & 31], kFaultRnrUs);
  const uint64_t half_waited_us = (now - qp.fault_since_ns) / 2000;
  resp_nak(qp, wire::Syndrome::RNR_NAK, psn, WcStatus::SUCCESS,
           uint32_t(std::clamp<uint64_t>(half_waited_us, base, kFaultRnrMaxUs)));
}

// Cumulative PSN plus a SACK bitmap over the PSNs that arrived since the last
// ACK (several ACK packets if they span more than one bitmap).
// The HELD notice for request p (Syndrome::HELD): a lone ACK, with no SACK
// and no data counts, so that it does not feed the congestion window.
void EngineCore::send_held(QpImpl& qp, const wire::Packet& p) {
  wire::AckExt a;
  a.cum_psn = qp.epsn;
  a.syndrome = wire::Syndrome::HELD;
  a.nak_psn = p.base.psn;
  a.echo_ts = p.base.ts;
  a.echo_path = p.base.path;
  wire::Base b;
  b.op = wire::Op::ACK;
  b.dst_qpn = qp.attr.dest_qp_num;
  b.src_qpn = qp.qpn_;
  b.psn = qp.epsn;
  b.path = reply_path(qp, p.base.path);
  b.ts = now_us();
  uint8_t hdr[wire::kMaxHeaderLen];
  const size_t hl = wire::encode(b, a, hdr);
  xmit(qp, b.path, hdr, hl, nullptr, 0, 0, false);
  stats_.held_notices_sent++;
}

void EngineCore::send_ack(QpImpl& qp) {
  if (!qp.ack_pending) return;
  const uint32_t W = qp.window();
  wire::AckExt a;
  a.cum_psn = qp.epsn;
  a.syndrome = wire::Syndrome::ACK;
  a.ce_count = uint16_t(std::min<uint32_t>(qp.ce_since_ack, 65535));
  a.rx_count = uint16_t(std::min<uint32_t>(qp.rx_since_ack, 65535));
  a.echo_ts = qp.last_ts;
  a.echo_path = qp.last_path;
  // Cover everything from the oldest hole when it fits in one bitmap, so a
  // lost ACK's information is repeated by the next one; otherwise only what
  // arrived since the last ACK.
  uint32_t lo = seq_lt(qp.ack_lo, qp.epsn) || qp.ack_hi - qp.epsn < wire::kMaxSackWords * 64 - 64
                    ? qp.epsn
                    : qp.ack_lo;
  uint32_t hi = qp.ack_hi;
  uint32_t base = lo & ~63u;
  bool first = true;
  do {
    a.sack_base = base;
    a.sack_words = 0;
    if (seq_le(qp.epsn, hi)) {
      uint32_t words = std::min<uint32_t>(wire::kMaxSackWords, (hi - base) / 64 + 1);
      for (uint32_t w = 0; w < words; w++) {
        uint32_t wb = base + w * 64;  // PSN of bit 0
        uint64_t v;
        if (seq_le(wb + 64, qp.epsn)) {
          v = ~0ull;
        } else if (!seq_lt(wb, qp.epsn + W)) {
          v = 0;
        } else {
          v = qp.rbits[(wb & (W - 1)) / 64];
          if (seq_lt(wb, qp.epsn)) v |= (1ull << (qp.epsn - wb)) - 1;  // below epsn: arrived
          uint32_t end = qp.epsn + W;                                  // beyond the window: unknown
          if (seq_lt(end, wb + 64)) v &= (1ull << (end - wb)) - 1;
        }
        a.sack[w] = v;
      }
      a.sack_words = uint8_t(words);
    }
    wire::Base b;
    b.op = wire::Op::ACK;
    b.dst_qpn = qp.attr.dest_qp_num;
    b.src_qpn = qp.qpn_;
    b.psn = qp.epsn;
    b.path = reply_path(qp, qp.last_path);
    b.ts = now_us();
    uint8_t hdr[wire::kMaxHeaderLen + 8 * wire::kMaxSackWords];
    size_t hl = wire::encode(b, a, hdr);
    xmit(qp, b.path, hdr, hl, nullptr, 0, 0, false);
    stats_.acks_sent++;
    if (first) {
      first = false;
      a.ce_count = 0;
      a.rx_count = 0;
    }
    base += wire::kMaxSackWords * 64;
  } while (seq_le(base, hi) && seq_le(qp.epsn, hi));
  qp.ack_pending = false;
  qp.rx_since_ack = qp.ce_since_ack = 0;
  qp.last_ack_ns = clock_.now_ns();
}

}  // namespace vstellar
