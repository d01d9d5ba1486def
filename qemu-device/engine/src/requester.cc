// Requester: turns send WQEs into packets. Each packet gets its own PSN and a
// path from the connection's PathSelector; the window (PSN span) and the
// congestion window (bytes in flight) bound what is outstanding. Packets are
// never stored: a retransmission rebuilds the packet from the WQE, reading
// the payload from the MR again (IRN-style).
#include <algorithm>

#include "engine_internal.h"

namespace vstellar {
namespace {


wire::Op data_op(WrOpcode op) {
  switch (op) {
    case WrOpcode::SEND: return wire::Op::SEND;
    case WrOpcode::SEND_WITH_IMM: return wire::Op::SEND_IMM;
    case WrOpcode::SEND_WITH_INV: return wire::Op::SEND_INV;
    case WrOpcode::RDMA_WRITE: return wire::Op::WRITE;
    default: return wire::Op::WRITE_IMM;
  }
}

}  // namespace

uint64_t EngineCore::rto(const QpImpl& qp, unsigned retries) const {
  // At least the configured RTO (Stellar: 250 us). Above it, srtt plus
  // headroom: a smooth RTT has a tiny rttvar, and srtt + 4*rttvar alone
  // fires on every small queue build-up; srtt/2 of slack absorbs that.
  // With spraying, srtt is mostly the fast paths' while one path queues:
  // the RTO also stays above the slowest round trip of the last epochs
  // (with the same headroom), or every packet on that path times out.
  const uint64_t slowest = qp.cc.max_rtt_ns();
  uint64_t base = std::max({cfg_.rto_ns, qp.srtt + std::max(4 * qp.rttvar, qp.srtt / 2),
                            slowest + slowest / 2});
  // A plain RoCE v2 peer (roce_mode.cc) recovers by go-back-N: a resend
  // the peer did not need costs every PSN after it, and its software
  // stacks answer late at times (rxe on a busy host). Its timer is IB's
  // local ACK timeout, 4.096 us * 2^timeout (0: none), as the QP's owner
  // set it; a lost packet followed by others is found sooner by the
  // peer's sequence NAK.
  if (qp.roce && qp.attr.timeout) base = std::max(base, uint64_t(4096) << std::min<uint8_t>(qp.attr.timeout, 31));
  else if (qp.roce) base = std::max(base, cfg_.rto_max_ns);
  // Exponential backoff per packet, but only while the connection is
  // stalled (QpImpl::backoff): a packet's own losses under random loss say
  // nothing about the peer, and backing them off compounds (a 1 MiB READ
  // of 256 packets at 5% loss waited out 8-64 RTOs for its unluckiest).
  uint64_t r = base << std::min({retries, unsigned(qp.backoff), 16u});
  return std::min(r, cfg_.rto_max_ns);
}

// Whether a packet that has timed out retry_cnt times (and again now) ends
// the connection. Retries count per packet, and each resend goes to another
// path (a healthy one while there is one), so the count alone would kill a
// connection that still has working paths; the time alone would keep one
// to a dead peer for ever. IB's rule gives the time: the QP fails after
// (retry_cnt + 1) local ACK timeouts of 4.096 us * 2^timeout without an
// acknowledgement; timeout 0 means no limit. Here the clock is the time
// since the peer last acknowledged anything new, so while any path
// delivers, ACKs keep coming and nothing fails.
bool EngineCore::retry_exceeded(const QpImpl& qp, uint64_t now) const {
  if (qp.attr.timeout == 0) return false;
  if (qp.peer_paused_ns && now - qp.peer_paused_ns < kPeerPauseMaxNs) return false;  // migrating
  const uint64_t limit = (uint64_t(qp.attr.retry_cnt) + 1) * (4096ull << qp.attr.timeout);
  return now - qp.last_progress_ns >= limit;
}

// First look at a WQE: check its local SGEs (keys, PD, bounds, access) once
// more, since an MR may have been deregistered after post_send checked
// them, and number its packets.
//
// Buffers in on-demand MRs must have every page mapped before the first
// packet leaves (so a message does not stop half sent): if some are
// missing, their owner has been asked for them, and the WQE waits without
// starting; req_progress looks again when they are mapped or after
// kFaultPollNs (an owner that never maps them makes the translator fail
// the access, and the WQE fails with a local protection error).
bool EngineCore::req_start(QpImpl& qp, uint64_t idx, SendWqe& w, uint64_t now) {
  bool rd_atomic = is_rd_atomic(w.op);
  uint32_t need = rd_atomic ? uint32_t(ACCESS_LOCAL_WRITE) : 0u;
  if (!w.is_inline) {
    for (uint32_t i = 0; i < w.nsge; i++) {
      const Sge& s = w.sge[i];
      if (s.length == 0) continue;
      if (!sge_mr(qp, s.lkey, s.addr, s.length, need)) {
        w.started = true;
        comp_fail_wqe(qp, idx, WcStatus::LOC_PROT_ERR);
        return false;
      }
    }
    switch (req_local_pages(qp, w)) {
      case MemCheck::kOk:
        qp.fault_retry_ns = 0;
        break;
      case MemCheck::kFault:
        if (!qp.fault_retry_ns) stats_.page_fault_waits++;
        qp.fault_retry_ns = now + kFaultPollNs;
        return false;
      case MemCheck::kError:
        qp.fault_retry_ns = 0;
        w.started = true;
        comp_fail_wqe(qp, idx, WcStatus::LOC_PROT_ERR);
        return false;
    }
  }
  w.started = true;
  w.seg = qp.seg;
  if (w.op == WrOpcode::ATOMIC_CMP_AND_SWP || w.op == WrOpcode::ATOMIC_FETCH_AND_ADD)
    w.npkts = 1;
  else
    w.npkts = std::max<uint32_t>(1, uint32_t((w.len + w.seg - 1) / w.seg));
  w.first_psn = qp.snd_nxt;
  // A READ may be answered ahead of earlier READs, never ahead of anything
  // else (ReadReqExt::reads_before).
  if (w.op == WrOpcode::RDMA_READ) w.read_fence = qp.read_fence;
  else if (!is_local_op(w.op)) qp.read_fence = w.first_psn + w.npkts;
  if (w.op == WrOpcode::SEND || w.op == WrOpcode::SEND_WITH_IMM || w.op == WrOpcode::SEND_WITH_INV ||
      w.op == WrOpcode::RDMA_WRITE_WITH_IMM)
    w.rsn = qp.next_rsn++;
  w.rnr_left = qp.attr.rnr_retry;
  if (rd_atomic) {
    qp.rd_atomic_outstanding++;
    w.rd_counted = true;
  }
  return true;
}

// Whether the WQE's buffers in on-demand MRs have all their pages (for
// writing, where the answer lands there: READ, atomics). Keys and bounds
// were checked by the caller.
MemCheck EngineCore::req_local_pages(QpImpl& qp, const SendWqe& w) {
  const bool wr = is_rd_atomic(w.op);
  MemCheck worst = MemCheck::kOk;
  for (uint32_t i = 0; i < w.nsge; i++) {
    const Sge& s = w.sge[i];
    if (s.length == 0) continue;
    Mr* mr = find_mr(s.lkey);
    if (!mr || !mr->mem().on_demand()) continue;
    // Every SGE is asked, so one fault round serves the whole WQE.
    MemCheck c = mem_probe(mr->mem(), s.addr, s.length, wr);
    if (c == MemCheck::kError) return c;
    if (c == MemCheck::kFault) worst = c;
  }
  return worst;
}

// A QP whose next WQE waits for pages (req_start) does nothing until they
// come or its poll time is due.
bool EngineCore::fault_wait(QpImpl& qp, uint64_t now) {
  return qp.fault_retry_ns && now < qp.fault_retry_ns;
}

bool EngineCore::req_progress(QpImpl& qp, uint64_t now) {
  uint32_t budget = cfg_.tx_budget;
  if (qp.rnr_wake_ns <= now) qp.rnr_wake_ns = 0;  // due: this pass looks again
  if (!req_resend(qp, now)) return false;  // lost packets first
  while (budget > 0) {
    if (!sends(qp.state_)) return false;
    if (qp.sq_next == qp.sq_tail) return false;
    uint64_t idx = qp.sq_next;
    SendWqe& w = qp.sq_at(idx);
    if (!w.started) {
      if (qp.state_ == QpState::SQD) return false;  // SQD: finish what started, start nothing
      uint32_t max_rd = std::max<uint32_t>(1, qp.attr.max_rd_atomic);
      if (is_rd_atomic(w.op) && qp.rd_atomic_outstanding >= max_rd) return false;
      // Fence: wait until every earlier READ/atomic has completed.
      if ((w.flags & SEND_FENCE) && qp.rd_atomic_outstanding > 0) return false;
      if (is_local_op(w.op)) {
        // An invalidation waits for every earlier WQE to complete: their
        // retransmissions may still read the MR it takes away.
        if (w.op == WrOpcode::LOCAL_INV && qp.sq_head != idx) return false;
        w.started = true;
        uint32_t vendor = 0;
        WcStatus st = exec_local(qp, w, &vendor);
        if (st != WcStatus::SUCCESS) {
          w.vendor_err = vendor;
          comp_fail_wqe(qp, idx, st);
          return false;
        }
        w.done = true;
        comp_retire(qp);
        budget--;
        continue;
      }
      if (fault_wait(qp, now) || !req_start(qp, idx, w, now)) return false;
    }
    if (w.done || w.pkts_sent >= w.npkts) {
      qp.sq_next++;
      continue;
    }
    if (now < w.rnr_hold_until) {
      qp.rnr_wake_ns = w.rnr_hold_until;
      return false;
    }
    if (qp.inflight >= qp.cc.cwnd()) return false;
    uint32_t n = 1;
    if (w.op == WrOpcode::RDMA_READ) {
      // A READ asks for no more response bytes than the window has room
      // for: the responder answers a request at once, so the request size
      // is what paces the data (at least one packet, as for a WRITE).
      uint64_t room = (qp.cc.cwnd() - qp.inflight) / w.seg + 1;
      n = uint32_t(std::min<uint64_t>({cfg_.read_chunk_pkts, w.npkts - w.pkts_sent, room}));
      // A RoCE v2 peer gets one request per READ, as IB requesters send:
      // it keeps only max_dest_rd_atomic READs to answer again, and
      // chunks would count against that each. (One larger than the PSNs a
      // RoCE QP may have unanswered is still cut.)
      if (qp.roce) n = std::min(w.npkts - w.pkts_sent, kRoceMaxUnackedPsns);
    }
    if (qp.snd_nxt + n - qp.snd_una > (qp.roce ? kRoceMaxUnackedPsns : qp.window())) return false;
    uint32_t psn = qp.snd_nxt;
    PktKind kind = w.op == WrOpcode::RDMA_READ ? PktKind::READ
                   : is_rd_atomic(w.op)        ? PktKind::ATOMIC
                                               : PktKind::DATA;
    for (uint32_t k = 0; k < n; k++) {
      PktRec& r = qp.rec(psn + k);
      qp.path_unlink(psn + k - qp.window());  // the slot's last PSN: acknowledged, so never listed
      uint32_t tx_seq = r.tx_seq;  // keep counting so old timers stay stale
      r = PktRec{};
      r.tx_seq = tx_seq;
      r.wqe = idx;
      r.kind = kind;
      uint64_t off = uint64_t(w.pkts_sent + k) * w.seg;
      r.off = uint32_t(off);
      r.len = kind == PktKind::ATOMIC ? 8 : uint32_t(std::min<uint64_t>(w.seg, w.len - off));
      qp.inflight += r.len;
    }
    if (qp.snd_una == qp.snd_nxt) qp.last_progress_ns = now;  // idle until now is no stall
    qp.snd_nxt += n;
    w.pkts_sent += n;
    if (!req_send(qp, psn, n, false, now)) return false;
    if (w.pkts_sent == w.npkts) qp.sq_next++;
    budget--;
  }
  return true;
}

// Host spans of [off, off+len) of a WQE's gather list.
// SIZE_MAX if some byte cannot be reached; *fault (when given) then says
// whether that was pages an on-demand MR has not mapped (yet again).
size_t EngineCore::gather(QpImpl& qp, SendWqe& w, uint32_t off, uint32_t len, HostSpan* out, size_t max,
                          bool* fault) {
  if (fault) *fault = false;
  if (len == 0) return 0;
  if (w.is_inline) {
    size_t slot = size_t(&w - qp.sq.data());
    uint8_t* base = &qp.inline_buf[slot * qp.init.cap.max_inline_data];
    out[0] = {base + off, len};
    return 1;
  }
  size_t n = 0;
  uint64_t pos = 0, want = off, left = len;
  for (uint32_t i = 0; i < w.nsge && left > 0; i++) {
    const Sge& s = w.sge[i];
    if (want >= pos + s.length) {
      pos += s.length;
      continue;
    }
    uint64_t in = want - pos;
    uint64_t take = std::min<uint64_t>(s.length - in, left);
    Mr* mr = sge_mr(qp, s.lkey, s.addr + in, take, 0);  // again: it may have been deregistered
    if (!mr) return SIZE_MAX;
    uint64_t done = 0;
    while (done < take) {
      if (n == max) return SIZE_MAX;
      TranslateResult tr = mr->mem().translate(s.addr + in + done, take - done, false, out + n, max - n);
      if (!tr.ok || tr.covered == 0) {
        if (fault) *fault = tr.fault;
        return SIZE_MAX;
      }
      n += tr.count;
      done += tr.covered;
    }
    left -= take;
    want += take;
    pos += s.length;
  }
  return left == 0 ? n : SIZE_MAX;
}

namespace {

// The header of the READ request that asks for PSNs [psn, psn + n), `total`
// bytes from the WQE's offset r.off on.
size_t encode_read_req(const SendWqe& w, const PktRec& r, uint32_t psn, uint32_t total, wire::Base& b,
                       uint8_t* hdr) {
  b.op = wire::Op::READ_REQ;
  wire::ReadReqExt e;
  e.va = w.raddr + r.off;
  e.rkey = w.rkey;
  e.len = total;
  e.msg_off = r.off;
  e.seg = uint16_t(w.seg);
  e.reads_before = uint16_t(std::min<uint32_t>(psn - w.read_fence, UINT16_MAX));
  return wire::encode(b, e, hdr);
}

size_t encode_atomic(const SendWqe& w, wire::Base& b, uint8_t* hdr) {
  const bool cas = w.op == WrOpcode::ATOMIC_CMP_AND_SWP;
  b.op = cas ? wire::Op::CMP_SWAP : wire::Op::FETCH_ADD;
  wire::AtomicExt e;
  e.va = w.raddr;
  e.rkey = w.rkey;
  e.swap_add = cas ? w.swap : w.cmp_add;
  e.compare = cas ? w.cmp_add : 0;
  return wire::encode(b, e, hdr);
}

}  // namespace

// (Re)transmit the packet(s) of PSNs [psn, psn+npsn); npsn > 1 only for the
// first request of a READ chunk.
bool EngineCore::req_send(QpImpl& qp, uint32_t psn, uint32_t npsn, bool retx, uint64_t now) {
  PktRec& r = qp.rec(psn);
  uint64_t idx = r.wqe;
  SendWqe& w = qp.sq_at(idx);
  uint32_t total = 0;
  for (uint32_t k = 0; k < npsn; k++) total += qp.rec(psn + k).len;
  uint16_t path = retx ? qp.paths.pick_retx(r.path, total) : qp.paths.pick(total);
  // A path set aside is probed by a new packet whose hold is over: a data
  // packet goes on a healthy path and a copy of it on the probe path, so a
  // still dead path costs nothing (the responder drops the duplicate, and
  // the ACK of either names the path it came by); a READ or atomic request
  // goes on the probe path itself (a copy would be executed twice).
  uint16_t probe = retx ? qp.paths.num_paths() : qp.paths.probe(now);
  if (probe < qp.paths.num_paths() && r.kind != PktKind::DATA) {
    path = probe;
    probe = qp.paths.num_paths();
  }

  wire::Base b;
  b.dst_qpn = qp.attr.dest_qp_num;
  b.src_qpn = qp.qpn_;
  b.psn = psn;
  b.path = path;
  b.ts = uint32_t(now / 1000);  // as sent_ns below: an answer names its request by it
  b.flags = retx ? wire::F_RETX : 0;
  uint8_t hdr[wire::kMaxHeaderLen];
  size_t hlen = 0;
  HostSpan spans[64];
  size_t nspans = 0;
  size_t plen = 0;
  wire::DataExt de;
  bool dropped = false;
  switch (r.kind) {
    case PktKind::DATA: {
      b.op = data_op(w.op);
      if (r.off == 0) b.flags |= wire::F_FIRST;
      if (uint64_t(r.off) + r.len == w.len) {
        b.flags |= wire::F_LAST;
        if (w.flags & SEND_SOLICITED) b.flags |= wire::F_SOLICITED;
      }
      bool fault = false;
      nspans = gather(qp, w, r.off, r.len, spans, 64, &fault);
      if (nspans == SIZE_MAX && fault) {
        // Its pages went away since the WQE started (the owner took them
        // back): the packet is not sent, as if the network lost it, and
        // goes again at its timeout, by when they are mapped again.
        stats_.page_fault_drops++;
        dropped = true;
        nspans = 0;
      } else if (nspans == SIZE_MAX) {
        comp_fail_wqe(qp, idx, WcStatus::LOC_PROT_ERR);
        return false;
      }
      plen = r.len;
      b.payload_len = uint16_t(plen);
      de.va = w.raddr;
      de.rkey = w.rkey;
      de.msg_off = r.off;
      de.msg_len = uint32_t(w.len);
      de.rsn = w.rsn;
      de.imm = w.imm;
      hlen = wire::encode(b, de, hdr);
      break;
    }
    case PktKind::READ:
      hlen = encode_read_req(w, r, psn, total, b, hdr);
      break;
    case PktKind::ATOMIC:
      hlen = encode_atomic(w, b, hdr);
      break;
  }
  for (uint32_t k = 0; k < npsn; k++) {
    PktRec& x = qp.rec(psn + k);
    qp.path_unlink(psn + k);  // an earlier transmission, if still listed
    x.run = k == 0 ? uint16_t(npsn) : 0;
    x.tx_seq++;
    if (retx) x.prev_path = x.path;
    x.path = path;
    x.sent_ns = now;
    x.held_ns = 0;
    qp.timers.push({now + rto(qp, x.retries), psn + k, x.tx_seq, false});
  }
  if (dropped) return true;
  xmit(qp, path, hdr, hlen, spans, nspans, plen, retx);
  health_sent(qp, path);
  // Data joins its path's list, whose order the network keeps
  // (comp_path_gaps_before). A plain RoCE v2 peer has one path and answers
  // a hole with a sequence NAK of its own.
  if (r.kind == PktKind::DATA && !qp.roce) {
    if (retx || probe < qp.paths.num_paths()) r.copies = true;
    qp.path_link(psn);
    qp.last_data_tx_ns = now;
    arm_quiet(qp, now);
  }
  if (retx && r.kind == PktKind::READ) {
    if (qp.read_reruns.size() == QpImpl::kMaxReadReruns) qp.read_reruns.pop_front();
    qp.read_reruns.push_back({psn, npsn, path, now});
  }
  if (probe < qp.paths.num_paths()) {
    b.path = probe;
    b.flags |= wire::F_PROBE;
    hlen = wire::encode(b, de, hdr);
    xmit(qp, probe, hdr, hlen, spans, nspans, plen, false);
    health_sent(qp, probe);
    stats_.path_probes++;
  }
  if (r.kind == PktKind::DATA) stats_.data_pkts_sent++;
  if (retx) stats_.retx_pkts++;
  return true;
}

// UC: nothing comes back (no ACK, no NAK), so there is no PSN window, no
// congestion window and no timer; packets leave as fast as tx_budget lets
// them, and a WQE completes once its last packet is on the link (progress()
// retires it after the flush, as for datagrams). Every packet of a message
// takes the one path picked at its first packet: a path keeps its packets
// in order, so only loss, not spraying, breaks a message (resp_uc).
bool EngineCore::req_uc_progress(QpImpl& qp, uint64_t now) {
  uint32_t budget = cfg_.tx_budget;
  while (budget > 0) {
    if (!sends(qp.state_)) return false;
    if (qp.sq_next == qp.sq_tail) return false;
    const uint64_t idx = qp.sq_next;
    SendWqe& w = qp.sq_at(idx);
    if (!w.started) {
      if (qp.state_ == QpState::SQD) return false;
      if (fault_wait(qp, now) || !req_start(qp, idx, w, now)) return false;
      qp.snd_nxt += w.npkts;
      w.path = qp.paths.pick(uint32_t(std::min<uint64_t>(w.len, UINT32_MAX)));
    }
    while (w.pkts_sent < w.npkts && budget > 0) {
      if (!req_uc_send(qp, idx, w, now)) return false;
      budget--;
    }
    if (w.pkts_sent < w.npkts) return true;
    w.done = true;
    stats_.uc_sent++;
    qp.sq_next++;
  }
  return true;
}

// The next packet of UC WQE w.
bool EngineCore::req_uc_send(QpImpl& qp, uint64_t idx, SendWqe& w, uint64_t now) {
  const uint32_t k = w.pkts_sent;
  const uint64_t off = uint64_t(k) * w.seg;
  const uint32_t len = uint32_t(std::min<uint64_t>(w.seg, w.len - off));
  wire::Base b;
  b.op = data_op(w.op);
  b.dst_qpn = qp.attr.dest_qp_num;
  b.src_qpn = qp.qpn_;
  b.psn = w.first_psn + k;
  b.path = w.path;
  b.ts = uint32_t(now / 1000);
  if (k == 0) b.flags |= wire::F_FIRST;
  if (k + 1 == w.npkts) {
    b.flags |= wire::F_LAST;
    if (w.flags & SEND_SOLICITED) b.flags |= wire::F_SOLICITED;
  }
  HostSpan spans[64];
  const size_t nspans = gather(qp, w, uint32_t(off), len, spans, 64);
  if (nspans == SIZE_MAX) {
    comp_fail_wqe(qp, idx, WcStatus::LOC_PROT_ERR);
    return false;
  }
  b.payload_len = uint16_t(len);
  wire::DataExt e;
  e.va = w.raddr;
  e.rkey = w.rkey;
  e.msg_off = uint32_t(off);
  e.msg_len = uint32_t(w.len);
  e.imm = w.imm;
  uint8_t hdr[wire::kMaxHeaderLen];
  const size_t hlen = wire::encode(b, e, hdr);
  xmit(qp, b.path, hdr, hlen, spans, nspans, len, false);
  stats_.data_pkts_sent++;
  w.pkts_sent++;
  return true;
}

// A packet last sent on `path` was found lost by a timer (its RTO, or the
// quiet timer): the path's counts, its health, and with `set_aside` the
// selector's verdict (a second path set aside within one of the window's
// epochs makes that epoch's cut the largest).
void EngineCore::timer_lost(QpImpl& qp, uint16_t path, bool set_aside, uint64_t now) {
  if (path < stats_.paths.size()) stats_.paths[path].timeouts++;
  health_lost(qp, path);
  if (!set_aside) return;
  const uint64_t downs = qp.paths.downs();
  qp.paths.on_timeout(path, now);
  if (qp.paths.downs() != downs) {
    stats_.paths_set_aside++;
    qp.cc.on_path_down();
  }
}

// Retransmission timers. A timer is live only if its PSN is still in the
// window, unacknowledged, and was not sent again since (tx_seq matches).
void EngineCore::req_timers(QpImpl& qp, uint64_t now) {
  while (!qp.timers.empty()) {
    RetxTimer t = qp.timers.top();
    if (t.deadline > now) break;
    qp.timers.pop();
    if (t.quiet) {
      qp.quiet_armed = false;
      req_quiet(qp, now);
      continue;
    }
    if (t.overdue) {
      if (t.deadline == qp.overdue_armed_ns) qp.overdue_armed_ns = 0;
      comp_overdue(qp, now, /*act=*/true);
      continue;
    }
    if (seq_lt(t.psn, qp.snd_una) || !seq_lt(t.psn, qp.snd_nxt)) continue;
    PktRec& r = qp.rec(t.psn);
    if (r.acked || r.tx_seq != t.tx_seq) continue;
    // Lost already: it waits in the resend queue, which sends it and arms
    // its timer (req_resend). An RNR NAK re-arms every packet of its
    // message, lost ones too; losing one twice would take its bytes out of
    // flight twice.
    if (r.lost) continue;
    SendWqe& w = qp.sq_at(r.wqe);
    if (w.done) continue;
    // The RTO is taken when the timer fires, not when the packet left: a
    // packet sent before the RTT estimate grew (an initial burst, a queue
    // building up) gets the current, larger timeout.
    if (!t.rnr) {
      // A request the responder holds is answered once the PSN it waits
      // for is repaired (that resend's round trip), and then as any other:
      // two RTOs from the notice.
      const uint64_t t_rto = rto(qp, r.retries);
      uint64_t due = std::max(r.sent_ns + t_rto, r.held_ns ? r.held_ns + 2 * t_rto : 0);
      if (due > now) {
        qp.timers.push({due, t.psn, t.tx_seq, false});
        continue;
      }
    }
    // Stall guard: if the peer has acknowledged nothing for a whole RTO, the
    // likely cause is a stalled receiver (a descheduled process, a dead
    // peer), not one loss per packet. Resend only the oldest packet as a
    // probe, with backoff, and defer the other timers; once the probe is
    // answered, the deferred timers resend whatever is still missing. With a
    // lossy or dead path, ACKs keep coming over the other paths, so this
    // never slows normal loss recovery.
    if (!t.rnr && t.psn != qp.snd_una && now - qp.last_progress_ns >= rto(qp, 0)) {
      qp.timers.push({now + rto(qp, 0), t.psn, t.tx_seq, false});
      continue;
    }
    if (!t.rnr) {
      stats_.timeouts++;
      // A READ or atomic executes only when every earlier PSN has arrived,
      // so its answer may be late because the responder waits for a
      // resend, not because its path lost it: it blames its path only when
      // it is the oldest PSN outstanding.
      timer_lost(qp, r.path, r.kind == PktKind::DATA || t.psn == qp.snd_una, now);
      // Nothing acknowledged for a whole RTO, on any path: every packet in
      // flight was lost (a queue overflowed, as at the start of an
      // incast, or the peer is gone), and no ACK will come to end the
      // epoch and shrink the window. Start again from the smallest one.
      // A READ or atomic, though, stalls the connection whenever its own
      // request was lost: the responder holds every later one until it
      // has it (in order, as IB requires). That is one loss, not an
      // overflow, and it is repaired by this very resend; the window
      // stays as it is.
      if (t.psn == qp.snd_una && now - qp.last_progress_ns >= rto(qp, 0)) {
        if (r.kind == PktKind::DATA || qp.backoff > 0) qp.cc.on_stall();
        if (qp.backoff < 16) qp.backoff++;
      }
      if (r.retries >= qp.attr.retry_cnt && retry_exceeded(qp, now)) {
        comp_fail_wqe(qp, r.wqe, WcStatus::RETRY_EXC_ERR);
        return;
      }
      if (r.retries < UINT8_MAX) r.retries++;
    }
    // Lost: out of flight, and the resend waits for room in the window
    // (req_resend), so that after a burst of losses the resends do not
    // overflow again the queue that dropped them. The oldest PSN goes at
    // once, as the stall guard's probe.
    if (!t.rnr && t.psn != qp.snd_una) {
      lose_for_resend(qp, t.psn);
      continue;
    }
    if (qp.roce && r.kind == PktKind::READ) {
      if (!roce_read_rerun(qp, t.psn, now)) return;
      continue;
    }
    if (!req_send(qp, t.psn, 1, true, now)) return;
  }
}

// The quiet timer (issue 30). The path rule (comp_path_gaps_before) finds
// a loss only once a later packet of the same path arrives; with many
// paths and a few dozen packets in flight, the packets behind a loss may
// all take other paths, and the connection, its completions held by the
// hole, sends nothing more: the loss waits for its RTO (>= 250 us; at
// 100 Gb/s, 3 MB of idle link). So when a connection with data in flight
// has heard no progress and sent no data for a quiet timeout (the RTO's
// terms without its 250 us floor, and tighter: a round trip and twice
// its variation, or a quarter more than the slowest round trip of the
// last epochs), every packet still missing that left before one known to
// have arrived is taken as lost, blamed on its path as a timeout would
// be, and resent; if there is none (the loss is the tail), the newest
// packet goes again on another path, to draw an ACK that tells. Once per
// progress: if that brings nothing, the RTOs decide, and so they do when
// nothing was acknowledged for a whole RTO (a stalled peer: the RTO's
// stall guard probes it without blaming paths). While any path delivers
// (a slow path queueing beside fast ones), ACKs keep coming and the timer
// does not act: it acts when the whole connection has gone quiet.
uint64_t EngineCore::quiet_timeout(const QpImpl& qp) const {
  const uint64_t slowest = qp.cc.max_rtt_ns();
  return std::max({qp.srtt + 2 * qp.rttvar, slowest + slowest / 4, uint64_t{2000}});
}

void EngineCore::arm_quiet(QpImpl& qp, uint64_t now) {
  if (qp.quiet_armed || qp.srtt == 0 || qp.quiet_acted_at == qp.last_progress_ns) return;
  qp.timers.push(RetxTimer{now + quiet_timeout(qp), 0, 0, false, true});
  qp.quiet_armed = true;
}

void EngineCore::req_quiet(QpImpl& qp, uint64_t now) {
  if (!seq_lt(qp.snd_una, qp.snd_nxt) || qp.quiet_acted_at == qp.last_progress_ns) return;
  const uint64_t since = std::max(qp.last_progress_ns, qp.last_data_tx_ns);
  if (now < since + quiet_timeout(qp)) {  // heard or sent since it was armed
    qp.timers.push(RetxTimer{since + quiet_timeout(qp), 0, 0, false, true});
    qp.quiet_armed = true;
    return;
  }
  // Nothing acknowledged for a whole RTO: the peer may be stalled (a
  // descheduled host), and the RTO's stall guard probes it without
  // blaming any path.
  if (now - qp.last_progress_ns >= rto(qp, 0)) return;
  qp.quiet_acted_at = qp.last_progress_ns;
  uint32_t newest = qp.snd_nxt;
  bool lost = false;
  for (uint32_t psn = qp.snd_una; seq_lt(psn, qp.snd_nxt); psn++) {
    const PktRec& r = qp.rec(psn);
    if (r.kind != PktKind::DATA || r.acked || r.lost || !r.on_path || qp.sq_at(r.wqe).done) continue;
    if (now < qp.sq_at(r.wqe).rnr_hold_until) continue;  // the RNR wait decides
    if (r.sent_ns < qp.newest_arrived_sent_ns) {
      stats_.quiet_losses++;
      timer_lost(qp, r.path, /*set_aside=*/true, now);  // as by a timeout: a dead path is set aside
      lose_for_resend(qp, psn);
      lost = true;
    } else if (newest == qp.snd_nxt || r.sent_ns >= qp.rec(newest).sent_ns) {
      newest = psn;
    }
  }
  if (lost || newest == qp.snd_nxt) return;
  stats_.quiet_probes++;
  req_send(qp, newest, 1, true, now);
}

// A READ re-request asks again for the lost PSNs that follow `psn` in the
// same READ (contiguous in the message, at most read_chunk_pkts, within
// `cwnd` bytes in flight) in one request: a lost request loses a whole
// chunk, and asking for it PSN by PSN would cost a request and a
// responder turn each. Takes those PSNs back into flight; returns how
// many PSNs the request covers (1: psn alone).
uint32_t EngineCore::read_run(QpImpl& qp, uint32_t psn, uint64_t cwnd) {
  const PktRec& first = qp.rec(psn);
  if (first.kind != PktKind::READ) return 1;
  uint32_t n = 1;
  while (n < cfg_.read_chunk_pkts) {
    const uint32_t next = psn + n;
    if (!seq_lt(next, qp.snd_nxt)) break;
    PktRec& x = qp.rec(next);
    if (x.kind != PktKind::READ || x.wqe != first.wqe || !x.lost || x.acked ||
        x.off != first.off + n * qp.sq_at(first.wqe).seg)
      break;
    if (qp.inflight + x.len > cwnd) break;
    x.lost = false;  // its entry in `resend` is skipped later
    qp.inflight += x.len;
    n++;
  }
  return n;
}

// Resend lost packets, oldest first, while the window has room: each
// takes its bytes back into flight. A packet acknowledged (or whose WQE
// ended) while it waited is skipped.
bool EngineCore::req_resend(QpImpl& qp, uint64_t now) {
  if (qp.resend.empty()) return true;
  // The oldest PSN goes at once, whatever the window: everything after it
  // waits for it, and while nothing is acknowledged the stall guard holds
  // back the other timers, whose packets keep the window full.
  if (seq_lt(qp.snd_una, qp.snd_nxt) && qp.rec(qp.snd_una).lost) {
    PktRec& r = qp.rec(qp.snd_una);
    r.lost = false;  // its entry in `resend` is skipped below
    qp.inflight += r.len;
    if (qp.roce && r.kind == PktKind::READ) {
      if (!roce_read_rerun(qp, qp.snd_una, now)) return false;
    } else {
      const uint32_t n = read_run(qp, qp.snd_una, UINT64_MAX);
      if (!req_send(qp, qp.snd_una, n, true, now)) return false;
    }
  }
  while (!qp.resend.empty()) {
    const uint32_t psn = qp.resend.front();
    PktRec& r = qp.rec(psn);
    if (seq_lt(psn, qp.snd_una) || !seq_lt(psn, qp.snd_nxt) || r.acked || !r.lost ||
        qp.sq_at(r.wqe).done) {
      if (!seq_lt(psn, qp.snd_una) && seq_lt(psn, qp.snd_nxt)) r.lost = false;
      qp.resend.pop_front();
      continue;
    }
    if (qp.inflight + r.len > qp.cc.cwnd() && qp.inflight > 0) return false;
    qp.resend.pop_front();
    r.lost = false;
    qp.inflight += r.len;
    if (qp.roce && r.kind == PktKind::READ) {
      if (!roce_read_rerun(qp, psn, now)) return false;
      continue;
    }
    const uint32_t n = read_run(qp, psn, qp.cc.cwnd());
    if (!req_send(qp, psn, n, true, now)) return false;
  }
  return true;
}

}  // namespace vstellar
