// Plain RoCE v2 mode (issue 28): an RC QP whose peer is listed in
// EngineConfig::roce speaks standard IBTA RoCE v2 to it (rxe, a RoCE NIC)
// instead of vStellar's sprayed format.
//
// The requester, responder and completer are the same code in both modes,
// so a guest's keys, lengths and states are checked by the same rules.
// What differs is the wire and the delivery discipline:
//  - roce_xmit() writes every packet they send as its RoCE v2 equivalent
//    (BTH opcode FIRST/MIDDLE/LAST/ONLY, RETH on a WRITE's first packet,
//    AETH with the MSN, ICRC) to the peer's port 4791, on one path;
//  - roce_receive() parses RoCE v2 and rebuilds the self-describing packet
//    the engine expects: a middle packet gets its message's address, key
//    and offset from the message in progress, which is why the responder
//    takes packets in PSN order only, as IB's does: one ahead of the
//    expected PSN is dropped and answered with a single PSN sequence error
//    NAK, after which the requester goes back to that PSN (go-back-N);
//  - ACKs carry no SACK and no timestamp: RTT samples come from the send
//    time the requester recorded for the PSN an ACK covers.
#include <algorithm>
#include <cstring>

#include "engine_internal.h"

namespace vstellar {
namespace {

constexpr uint32_t kPsnMask = 0xffffff;

// The 32-bit PSN nearest `ref` whose low 24 bits are psn24 (the engine
// counts PSNs in 32 bits; the wire carries 24).
uint32_t expand_psn(uint32_t psn24, uint32_t ref) {
  const int32_t d = int32_t((psn24 - ref) << 8) >> 8;
  return ref + uint32_t(d);
}

// The RNR timer code of a wait: the shortest that is not shorter.
uint8_t rnr_code(uint32_t us) {
  for (uint8_t c = 1; c < 32; c++)
    if (kRnrUs[c] >= us) return c;
  return 0;  // 655.36 ms, the longest
}

// A packet with the opcode's FIRST/MIDDLE/LAST/ONLY form picked by flags.
uint8_t form(bool first, bool last, uint8_t only, uint8_t f, uint8_t mid, uint8_t l) {
  return first && last ? only : first ? f : last ? l : mid;
}

bool in_window(const QpImpl& qp, uint32_t psn) {
  return !seq_lt(psn, qp.snd_una) && seq_lt(psn, qp.snd_nxt);
}

}  // namespace

bool EngineCore::roce_peer(const IpAddr& ip) const {
  for (const IpPrefix& p : cfg_.roce.peers)
    if (p.contains(ip)) return true;
  return false;
}

void EngineCore::roce_xmit(QpImpl& qp, const uint8_t* hdr, size_t hlen, const HostSpan* pl, size_t nspans,
                           size_t plen, bool retx) {
  wire::Packet p;
  if (wire::parse_header(hdr, hlen, p) != wire::ParseError::OK) return;  // our own: cannot fail
  const bool first = p.base.flags & wire::F_FIRST, last = p.base.flags & wire::F_LAST;
  roce::Packet rp;
  rp.bth.dest_qp = qp.attr.dest_qp_num & kPsnMask;
  rp.bth.psn = p.base.psn & kPsnMask;
  rp.bth.solicited = p.base.flags & wire::F_SOLICITED;
  // A RoCE responder acknowledges only packets that ask (AckReq): the end
  // of every message, every 16th PSN so that a long message does not wait
  // for its end to open the window, a resend, and the packet after which
  // the window (congestion or PSN) lets nothing more leave: without that,
  // the requester waits for an ACK the responder never sends, and only
  // the timer ends the wait (one run of ib_write_bw lost 40 ms per
  // message so).
  const bool window_full = qp.inflight + qp.seg > qp.cc.cwnd() ||
                           p.base.psn + 1 - qp.snd_una >= kRoceMaxUnackedPsns;
  const bool ack_req = last || (p.base.psn & 15) == 15 || retx || window_full;
  switch (p.base.op) {
    case wire::Op::SEND:
      rp.bth.opcode = form(first, last, roce::RC_SEND_ONLY, roce::RC_SEND_FIRST, roce::RC_SEND_MIDDLE,
                           roce::RC_SEND_LAST);
      rp.bth.ack_req = ack_req;
      break;
    case wire::Op::SEND_IMM:
      rp.bth.opcode = form(first, last, roce::RC_SEND_ONLY_IMM, roce::RC_SEND_FIRST, roce::RC_SEND_MIDDLE,
                           roce::RC_SEND_LAST_IMM);
      rp.imm = p.data.imm;
      rp.bth.ack_req = ack_req;
      break;
    case wire::Op::SEND_INV:
      rp.bth.opcode = form(first, last, roce::RC_SEND_ONLY_INV, roce::RC_SEND_FIRST, roce::RC_SEND_MIDDLE,
                           roce::RC_SEND_LAST_INV);
      rp.invalidate_rkey = p.data.rkey;
      rp.bth.ack_req = ack_req;
      break;
    case wire::Op::WRITE:
    case wire::Op::WRITE_IMM: {
      const bool imm = p.base.op == wire::Op::WRITE_IMM;
      rp.bth.opcode = form(first, last, imm ? roce::RC_WRITE_ONLY_IMM : roce::RC_WRITE_ONLY, roce::RC_WRITE_FIRST,
                           roce::RC_WRITE_MIDDLE, imm ? roce::RC_WRITE_LAST_IMM : roce::RC_WRITE_LAST);
      rp.reth.va = p.data.va;
      rp.reth.rkey = p.data.rkey;
      rp.reth.dma_len = p.data.msg_len;
      rp.imm = p.data.imm;
      rp.bth.ack_req = ack_req;
      break;
    }
    case wire::Op::READ_REQ:
      rp.bth.opcode = roce::RC_READ_REQUEST;
      rp.reth.va = p.rreq.va;
      rp.reth.rkey = p.rreq.rkey;
      rp.reth.dma_len = p.rreq.len;
      rp.bth.ack_req = true;
      break;
    case wire::Op::CMP_SWAP:
    case wire::Op::FETCH_ADD:
      rp.bth.opcode = p.base.op == wire::Op::CMP_SWAP ? roce::RC_CMP_SWAP : roce::RC_FETCH_ADD;
      rp.atomic.va = p.atomic.va;
      rp.atomic.rkey = p.atomic.rkey;
      rp.atomic.swap_add = p.atomic.swap_add;
      rp.atomic.compare = p.atomic.compare;
      rp.bth.ack_req = true;
      break;
    case wire::Op::READ_RESP:
      rp.bth.opcode = form(first, last, roce::RC_READ_RESPONSE_ONLY, roce::RC_READ_RESPONSE_FIRST,
                           roce::RC_READ_RESPONSE_MIDDLE, roce::RC_READ_RESPONSE_LAST);
      rp.aeth.syndrome = roce::aeth_syndrome(roce::AETH_ACK, 31);
      rp.aeth.msn = qp.roce_msn & kPsnMask;
      break;
    case wire::Op::ATOMIC_RESP:
      rp.bth.opcode = roce::RC_ATOMIC_ACK;
      rp.aeth.syndrome = roce::aeth_syndrome(roce::AETH_ACK, 31);
      rp.aeth.msn = qp.roce_msn & kPsnMask;
      rp.atomic_ack = p.aresp.orig;
      break;
    case wire::Op::ACK: {
      const wire::AckExt& a = p.ack;
      rp.bth.opcode = roce::RC_ACK;
      rp.aeth.msn = qp.roce_msn & kPsnMask;
      switch (a.syndrome) {
        case wire::Syndrome::ACK:
          // Credit count 31: no end-to-end credits (what rxe sends too).
          rp.aeth.syndrome = roce::aeth_syndrome(roce::AETH_ACK, 31);
          rp.bth.psn = (a.cum_psn - 1) & kPsnMask;
          break;
        case wire::Syndrome::RNR_NAK:
          rp.aeth.syndrome = roce::aeth_syndrome(roce::AETH_RNR_NAK, rnr_code(a.rnr_us));
          rp.bth.psn = a.nak_psn & kPsnMask;
          qp.roce_nak_sent = true;  // the PSNs after it are dropped until it comes again
          break;
        case wire::Syndrome::NAK_INV_REQ:
        case wire::Syndrome::NAK_REM_ACCESS:
        case wire::Syndrome::NAK_REM_OP: {
          const roce::NakCode code = a.syndrome == wire::Syndrome::NAK_INV_REQ      ? roce::NAK_INVALID_REQUEST
                                     : a.syndrome == wire::Syndrome::NAK_REM_ACCESS ? roce::NAK_REMOTE_ACCESS_ERROR
                                                                                    : roce::NAK_REMOTE_OPERATIONAL_ERROR;
          rp.aeth.syndrome = roce::aeth_syndrome(roce::AETH_NAK, code);
          rp.bth.psn = a.nak_psn & kPsnMask;
          break;
        }
        case wire::Syndrome::HELD:
        case wire::Syndrome::PAUSED:
        case wire::Syndrome::RESUMED:
          return;  // RoCE has no such notices (and no HELD: nothing is held here)
      }
      break;
    }
    case wire::Op::UD_SEND:
    case wire::Op::UD_SEND_IMM:
      return;  // datagram QPs do not use this mode
  }
  rp.payload_len = plen;
  const size_t bytes = roce_emit(rp, qp.attr.local, roce_source(qp), qp.attr.ah.ip, qp.roce_sport_path, pl, nspans);
  if (bytes && !stats_.paths.empty()) {
    stats_.paths[0].tx_pkts++;
    stats_.paths[0].tx_bytes += bytes;
    if (retx) stats_.paths[0].retx_pkts++;
  }
}

// Headers, pad and ICRC of rp, sent with its payload spans to dst's port
// 4791: from `src` (unspecified: the link's address), whose address the
// ICRC covers as `icrc_src`, and from the link's RoCE port (or, on a
// SimNet, from `path`'s). Returns the bytes sent, 0 if rp did not build.
size_t EngineCore::roce_emit(const roce::Packet& rp, const IpAddr& src, const IpAddr& icrc_src, const IpAddr& dst,
                             uint16_t path, const HostSpan* pl, size_t nspans) {
  uint8_t rh[roce::kBthLen + 64];
  const size_t rhl = roce::build_headers(rp, rh, sizeof(rh));
  if (!rhl) return 0;
  roce::IpFields ip;
  ip.src = icrc_src;
  ip.dst = dst;
  ip.src_port = cfg_.roce.src_port ? cfg_.roce.src_port : path;
  uint8_t trailer[roce::kMaxTrailerLen];
  const size_t tl = roce::seal(ip, rh, rhl, pl, nspans, trailer);
  link_.send_trailed(path, src, Endpoint{dst, roce::kUdpPort}, rh, rhl, pl, nspans, trailer, tl);
  const size_t bytes = rhl + rp.payload_len + tl;
  stats_.tx_pkts++;
  stats_.roce_tx++;
  stats_.tx_bytes += bytes;
  return bytes;
}

// A READ answered only in part asks again, as IB's requester does, for
// everything from the WQE's first PSN still unanswered to its end, not
// for the lost PSNs alone: a RoCE responder (rxe) answers a re-request
// only if it lies within the READ and at or after the point the last
// re-request of it started, so the re-requests of one READ must never go
// backwards. Responses to PSNs already answered come again and are
// dropped as duplicates. Takes the lost PSNs of the range back into
// flight; false if the send failed the WQE (req_send).
bool EngineCore::roce_read_rerun(QpImpl& qp, uint32_t psn, uint64_t now) {
  const SendWqe& w = qp.sq_at(qp.rec(psn).wqe);
  const uint32_t end = w.first_psn + w.pkts_sent;
  uint32_t start = w.first_psn;
  while (seq_lt(start, end) && (seq_lt(start, qp.snd_una) || qp.rec(start).acked)) start++;
  if (!seq_lt(start, end)) return true;  // all answered meanwhile
  for (uint32_t x = start; x != end; x++) {
    PktRec& h = qp.rec(x);
    if (h.lost && !h.acked) {
      h.lost = false;  // its entry in `resend` is skipped later
      qp.inflight += h.len;
    }
  }
  return req_send(qp, start, end - start, true, now);
}

// A datagram of a UD or GSI QP to a plain RoCE v2 peer: UD SEND Only
// (with immediate), the DETH with the Q_Key and the source QP (1 for the
// GSI QP, so rdma_cm's MADs reach the peer's CM), no GRH: RoCE v2 carries
// the addresses in the IP header.
void EngineCore::roce_ud_xmit(QpImpl& qp, const wire::Base& b, const wire::UdExt& e, const HostSpan* pl,
                              size_t nspans, size_t plen) {
  roce::Packet rp;
  rp.bth.opcode = b.op == wire::Op::UD_SEND_IMM ? roce::UD_SEND_ONLY_IMM : roce::UD_SEND_ONLY;
  rp.bth.dest_qp = b.dst_qpn & kPsnMask;
  rp.bth.psn = roce_ud_psn_++ & kPsnMask;
  rp.bth.solicited = b.flags & wire::F_SOLICITED;
  rp.deth.qkey = e.qkey;
  rp.deth.src_qp = b.src_qpn & kPsnMask;
  rp.imm = e.imm;
  rp.payload_len = plen;
  const IpAddr src = IpAddr::from_bytes(e.sgid);
  roce_emit(rp, src, src.unspecified() ? roce_source(qp) : src, IpAddr::from_bytes(e.dgid), b.path, pl, nspans);
}

// A UD datagram from a plain RoCE v2 peer, as the datagram path expects
// it: the GIDs are the IP header's addresses (the source one is the
// sender's own by construction; the datagram path checks the destination
// against where it arrived). The IP header's traffic class and hop limit
// are not seen through a UDP socket: the GRH area shows 0 and 64.
void EngineCore::roce_ud_receive(const roce::Packet& rp, const Endpoint& from, const IpAddr& to) {
  wire::Packet p;
  p.base.op = rp.bth.opcode == roce::UD_SEND_ONLY_IMM ? wire::Op::UD_SEND_IMM : wire::Op::UD_SEND;
  p.base.flags = wire::F_FIRST | wire::F_LAST | (rp.bth.solicited ? wire::F_SOLICITED : 0);
  p.base.dst_qpn = rp.bth.dest_qp;
  p.base.src_qpn = rp.deth.src_qp;
  p.base.payload_len = uint16_t(rp.payload_len);
  p.payload = rp.payload;
  p.payload_len = rp.payload_len;
  p.ud.qkey = rp.deth.qkey;
  p.ud.imm = rp.imm;
  p.ud.hop_limit = 64;
  std::memcpy(p.ud.sgid, from.ip.b.data(), 16);
  const IpAddr dst = to.unspecified() ? cfg_.roce.local : to;
  std::memcpy(p.ud.dgid, dst.b.data(), 16);
  ud_receive(p, from, to);
}

void EngineCore::roce_send_seq_nak(QpImpl& qp) {
  roce::Packet rp;
  rp.bth.opcode = roce::RC_ACK;
  rp.bth.dest_qp = qp.attr.dest_qp_num & kPsnMask;
  rp.bth.psn = qp.epsn & kPsnMask;
  rp.aeth.syndrome = roce::aeth_syndrome(roce::AETH_NAK, roce::NAK_PSN_SEQUENCE_ERROR);
  rp.aeth.msn = qp.roce_msn & kPsnMask;
  roce_emit(rp, qp.attr.local, roce_source(qp), qp.attr.ah.ip, qp.roce_sport_path, nullptr, 0);
  qp.roce_nak_sent = true;
  stats_.roce_seq_naks_sent++;
}

void EngineCore::roce_receive(const uint8_t* data, size_t len, const Endpoint& from, const IpAddr& to, bool ce) {
  stats_.rx_pkts++;
  stats_.rx_bytes += len;
  roce::IpFields ip;
  ip.src = from.ip;
  ip.dst = to;
  ip.src_port = from.port;
  // The ICRC covers the IPv4 identification, which a UDP socket does not
  // see (rxe numbers its packets): over IPv4 the UDP checksum is what
  // checks the bytes. Over IPv6 the ICRC is checked.
  ip.check_icrc = !from.ip.is_v4() && !to.unspecified();
  roce::Packet rp;
  if (roce::parse(data, len, ip, &rp) != roce::ParseError::NONE) {
    stats_.roce_bad++;
    return;
  }
  stats_.roce_rx++;
  if (rp.bth.opcode == roce::UD_SEND_ONLY || rp.bth.opcode == roce::UD_SEND_ONLY_IMM) {
    roce_ud_receive(rp, from, to);
    return;
  }
  QpImpl* qp = find_qp(rp.bth.dest_qp);
  if (!qp || !qp->roce) {
    stats_.bad_qpn++;
    return;
  }
  // RC packets carry no source QPN: the peer is its address.
  if (from.ip != qp->attr.ah.ip || (!to.unspecified() && !qp->attr.local.unspecified() && to != qp->attr.local)) {
    stats_.bad_peer++;
    return;
  }
  if (!stats_.paths.empty()) stats_.paths[0].rx_pkts++;
  if (ce) stats_.ce_marks++;
  activate(*qp);
  const uint64_t now = clock_.now_ns();
  const uint8_t op = rp.bth.opcode;
  const bool response = (op >= roce::RC_READ_RESPONSE_FIRST && op <= roce::RC_ATOMIC_ACK);
  if (op >= roce::UC_SEND_FIRST) {  // UC: not in this mode
    stats_.roce_bad++;
    return;
  }
  if (response) {
    if (!sends(qp->state_)) {
      stats_.bad_state++;
      return;
    }
    roce_completer(*qp, rp, expand_psn(rp.bth.psn, qp->snd_una), ce, now);
    return;
  }
  if (qp->state_ == QpState::RESET || qp->state_ == QpState::INIT || qp->state_ == QpState::ERR) {
    stats_.bad_state++;
    return;
  }
  roce_responder(*qp, rp, expand_psn(rp.bth.psn, qp->epsn), ce, now);
}

void EngineCore::roce_responder(QpImpl& qp, const roce::Packet& rp, uint32_t psn, bool ce, uint64_t now) {
  const uint8_t op = rp.bth.opcode;
  const bool dup = seq_lt(psn, qp.epsn);
  if (!dup && psn != qp.epsn) {
    // Ahead of the expected PSN: one before it was lost. Dropped, and one
    // NAK says where to go back to (IB: no other until epsn arrives).
    if (!qp.roce_nak_sent) roce_send_seq_nak(qp);
    return;
  }
  wire::Packet p;
  p.base.dst_qpn = qp.qpn_;
  p.base.src_qpn = qp.attr.dest_qp_num;
  p.base.psn = psn;
  p.payload = rp.payload;
  p.payload_len = rp.payload_len;
  p.base.payload_len = uint16_t(rp.payload_len);
  if (rp.bth.solicited) p.base.flags |= wire::F_SOLICITED;
  const uint64_t plen = rp.payload_len;
  bool data = true;
  bool first = false, last = false;
  switch (op) {
    case roce::RC_SEND_FIRST: case roce::RC_SEND_MIDDLE: case roce::RC_SEND_LAST: case roce::RC_SEND_LAST_IMM:
    case roce::RC_SEND_ONLY: case roce::RC_SEND_ONLY_IMM: case roce::RC_SEND_LAST_INV: case roce::RC_SEND_ONLY_INV:
      first = op == roce::RC_SEND_FIRST || op == roce::RC_SEND_ONLY || op == roce::RC_SEND_ONLY_IMM ||
              op == roce::RC_SEND_ONLY_INV;
      last = op != roce::RC_SEND_FIRST && op != roce::RC_SEND_MIDDLE;
      p.base.op = op == roce::RC_SEND_LAST_IMM || op == roce::RC_SEND_ONLY_IMM   ? wire::Op::SEND_IMM
                  : op == roce::RC_SEND_LAST_INV || op == roce::RC_SEND_ONLY_INV ? wire::Op::SEND_INV
                                                                                 : wire::Op::SEND;
      p.data.imm = rp.imm;
      p.data.rkey = rp.invalidate_rkey;
      break;
    case roce::RC_WRITE_FIRST: case roce::RC_WRITE_MIDDLE: case roce::RC_WRITE_LAST: case roce::RC_WRITE_LAST_IMM:
    case roce::RC_WRITE_ONLY: case roce::RC_WRITE_ONLY_IMM:
      first = op == roce::RC_WRITE_FIRST || op == roce::RC_WRITE_ONLY || op == roce::RC_WRITE_ONLY_IMM;
      last = op != roce::RC_WRITE_FIRST && op != roce::RC_WRITE_MIDDLE;
      p.base.op = op == roce::RC_WRITE_LAST_IMM || op == roce::RC_WRITE_ONLY_IMM ? wire::Op::WRITE_IMM
                                                                                 : wire::Op::WRITE;
      p.data.imm = rp.imm;
      break;
    case roce::RC_READ_REQUEST: {
      data = false;
      p.base.op = wire::Op::READ_REQ;
      p.rreq.va = rp.reth.va;
      p.rreq.rkey = rp.reth.rkey;
      p.rreq.len = rp.reth.dma_len;
      p.rreq.seg = uint16_t(std::min<uint32_t>(qp.seg, 65535));
      // A re-request asks again for the tail of a READ executed: the
      // offset it had in the requester's message, as the check of
      // re-requests (resp_reread) compares it.
      if (dup)
        for (const QpImpl::ReadDone& r : qp.reads_done)
          if (!seq_lt(psn, r.psn) && seq_lt(psn, r.psn + r.npsn)) p.rreq.msg_off = r.msg_off + (psn - r.psn) * r.seg;
      break;
    }
    case roce::RC_CMP_SWAP:
    case roce::RC_FETCH_ADD:
      data = false;
      p.base.op = op == roce::RC_CMP_SWAP ? wire::Op::CMP_SWAP : wire::Op::FETCH_ADD;
      p.atomic.va = rp.atomic.va;
      p.atomic.rkey = rp.atomic.rkey;
      p.atomic.swap_add = rp.atomic.swap_add;
      p.atomic.compare = rp.atomic.compare;
      break;
    default:
      stats_.roce_bad++;  // a response opcode was sorted out before; the rest are not RC requests
      return;
  }
  if (data && dup) {
    // Taken before: the responder only acknowledges it again.
    p.data.msg_len = uint32_t(plen);
    resp_receive(qp, p, ce, now);
    return;
  }
  if (data) {
    if (first) {
      qp.roce_in_msg = true;
      qp.roce_op = p.base.op == wire::Op::WRITE || p.base.op == wire::Op::WRITE_IMM ? wire::Op::WRITE : wire::Op::SEND;
      qp.roce_off = 0;
      qp.roce_va = rp.reth.va;
      qp.roce_rkey = rp.reth.rkey;
      qp.roce_len = rp.reth.dma_len;
    }
    const bool is_write = p.base.op == wire::Op::WRITE || p.base.op == wire::Op::WRITE_IMM;
    // Every packet but a message's last carries exactly one MTU (IBTA
    // C9-84), and a middle or last one continues a message of its kind.
    if (!qp.roce_in_msg || (qp.roce_op == wire::Op::WRITE) != is_write || plen > qp.seg ||
        (!last && plen != qp.seg)) {
      resp_nak(qp, wire::Syndrome::NAK_INV_REQ, psn, WcStatus::SUCCESS);
      return;
    }
    p.data.msg_off = qp.roce_off;
    if (is_write) {
      p.data.va = qp.roce_va;
      p.data.rkey = qp.roce_rkey;
      p.data.msg_len = qp.roce_len;
    } else {
      // A SEND's length is known at its last packet only; before that,
      // "at least one byte more than so far", which is what the receive
      // WQE's size is checked against.
      p.data.msg_len = uint32_t(std::min<uint64_t>(uint64_t(qp.roce_off) + plen + (last ? 0 : 1), UINT32_MAX));
    }
    p.data.rsn = uint32_t(qp.rq_head);  // in order: the message's WQE is the oldest open one
    if (first) p.base.flags |= wire::F_FIRST;
    if (last) p.base.flags |= wire::F_LAST;
  }
  const uint32_t before = qp.epsn;
  const uint64_t rnr_before = stats_.rnr_naks_sent;
  resp_receive(qp, p, ce, now);
  if (stats_.rnr_naks_sent != rnr_before) qp.roce_nak_sent = true;
  if (dup || qp.epsn == before) return;  // not taken (RNR, an error, or a READ answered again)
  qp.roce_nak_sent = false;
  if (data) {
    qp.roce_off += uint32_t(plen);
    if (last) {
      qp.roce_in_msg = false;
      qp.roce_msn++;
    }
  } else {
    qp.roce_msn++;
  }
}

void EngineCore::roce_completer(QpImpl& qp, const roce::Packet& rp, uint32_t psn, bool ce, uint64_t now) {
  // An ACK made from what arrived: everything before `cum` arrived at the
  // peer. Its RTT sample is the send time recorded for the newest PSN it
  // covers, when that PSN is still waiting for it.
  auto ack = [&](uint32_t cum, wire::Syndrome syn, uint32_t nak_psn, uint32_t rnr_us) {
    wire::Packet a;
    a.base.op = wire::Op::ACK;
    a.base.psn = cum;
    a.ack.cum_psn = cum;
    a.ack.sack_base = cum;
    a.ack.syndrome = syn;
    a.ack.nak_psn = nak_psn;
    a.ack.rnr_us = rnr_us;
    const uint32_t from = seq_lt(qp.cum_seen, qp.snd_una) ? qp.snd_una : qp.cum_seen;
    a.ack.rx_count = uint16_t(std::min<uint32_t>(seq_lt(from, cum) ? cum - from : 0, 65535));
    const uint32_t newest = cum - 1;
    if (in_window(qp, newest) && !qp.rec(newest).acked && qp.rec(newest).retries == 0 && seq_lt(from, cum)) {
      a.ack.echo_ts = uint32_t(qp.rec(newest).sent_ns / 1000);
    } else {
      a.no_rtt = true;
    }
    comp_ack(qp, a, now);
  };
  const uint8_t op = rp.bth.opcode;
  if (op == roce::RC_ACK) {
    const uint8_t type = rp.aeth.syndrome >> 5, value = rp.aeth.syndrome & 31;
    switch (type) {
      case roce::AETH_ACK:
        ack(psn + 1, wire::Syndrome::ACK, 0, 0);
        return;
      case roce::AETH_RNR_NAK:
        ack(psn, wire::Syndrome::RNR_NAK, psn, kRnrUs[value]);
        return;
      case roce::AETH_NAK:
        if (value == roce::NAK_PSN_SEQUENCE_ERROR) {
          // Everything before psn arrived; psn and all after it were
          // dropped: go back to psn.
          stats_.roce_seq_naks_rcvd++;
          ack(psn, wire::Syndrome::ACK, 0, 0);
          if (!in_window(qp, psn)) return;
          for (uint32_t x = psn; seq_lt(x, qp.snd_nxt); x++) {
            PktRec& r = qp.rec(x);
            if (r.acked || r.lost) continue;
            lose_for_resend(qp, x);
            stats_.roce_goback_pkts++;
          }
          return;
        }
        ack(psn,
            value == roce::NAK_REMOTE_ACCESS_ERROR        ? wire::Syndrome::NAK_REM_ACCESS
            : value == roce::NAK_REMOTE_OPERATIONAL_ERROR ? wire::Syndrome::NAK_REM_OP
                                                          : wire::Syndrome::NAK_INV_REQ,
            psn, 0);
        return;
      default:
        stats_.roce_bad++;  // reserved syndrome
        return;
    }
  }
  // A response: in order, so it acknowledges every request before it.
  if (op != roce::RC_READ_RESPONSE_MIDDLE && seq_lt(qp.cum_seen, psn)) ack(psn, wire::Syndrome::ACK, 0, 0);
  if (!in_window(qp, psn)) {
    stats_.dup_pkts++;
    return;
  }
  const PktRec& r = qp.rec(psn);
  wire::Packet p;
  p.base.dst_qpn = qp.qpn_;
  p.base.src_qpn = qp.attr.dest_qp_num;
  p.base.psn = psn;
  p.base.path = r.path;
  // The response answers the latest transmission of its request (in
  // order, nothing older can still come), so that is its RTT sample.
  p.base.ts = uint32_t(r.sent_ns / 1000);
  if (op == roce::RC_ATOMIC_ACK) {
    p.base.op = wire::Op::ATOMIC_RESP;
    p.aresp.orig = rp.atomic_ack;
    comp_atomic_resp(qp, p, now);
    return;
  }
  p.base.op = wire::Op::READ_RESP;
  p.rresp.msg_off = r.off;
  p.payload = rp.payload;
  p.payload_len = rp.payload_len;
  p.base.payload_len = uint16_t(rp.payload_len);
  comp_read_resp(qp, p, now, ce);
}

}  // namespace vstellar
