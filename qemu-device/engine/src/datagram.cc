// Datagram QPs: UD and GSI. A message is one packet (at most the engine
// MTU), sent once on the next path in turn, with no PSN, ACK or congestion
// window: IB's unreliable datagram service. The GSI QP is a UD QP that
// answers to QP number 1 for the GIDs its owner gives it; the connection
// manager's MADs travel on it, which is what rdma_cm needs.
//
// A receive starts with the 40-byte GRH area RoCE UD receives have: for
// IPv4 GIDs, 20 zero bytes and the IPv4 header (with a valid checksum: the
// kernel's ib_get_rdma_header_version() tells IPv4 from IPv6 by it), else
// an IPv6 header. Both are built here from the GIDs the datagram carries.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine_internal.h"

namespace vstellar {
namespace {

constexpr uint32_t kGsiQpn = 1;
constexpr size_t kGrhBytes = 40;
// What a RoCEv2 datagram carries after the IP header besides the payload:
// UDP (8), BTH (12), DETH (8), ICRC (4). Only used to fill length fields.
constexpr size_t kRoceOverhead = 8 + 12 + 8 + 4;

void put16(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}

void build_grh(const wire::UdExt& e, size_t payload, uint8_t* out) {
  std::memset(out, 0, kGrhBytes);
  if (wire::is_v4_mapped_gid(e.sgid) && wire::is_v4_mapped_gid(e.dgid)) {
    uint8_t* ip = out + 20;
    ip[0] = 0x45;  // version 4, 5 words
    ip[1] = e.traffic_class;
    put16(ip + 2, uint32_t(20 + kRoceOverhead + payload));
    ip[6] = 0x40;  // don't fragment
    ip[8] = e.hop_limit;
    ip[9] = 17;  // UDP
    std::memcpy(ip + 12, e.sgid + 12, 4);
    std::memcpy(ip + 16, e.dgid + 12, 4);
    uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2) sum += uint32_t(ip[i]) << 8 | ip[i + 1];
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    put16(ip + 10, ~sum & 0xffff);
    return;
  }
  const uint32_t vtf = 6u << 28 | uint32_t(e.traffic_class) << 20 | (e.flow_label & 0xFFFFF);
  out[0] = uint8_t(vtf >> 24);
  out[1] = uint8_t(vtf >> 16);
  out[2] = uint8_t(vtf >> 8);
  out[3] = uint8_t(vtf);
  put16(out + 4, uint32_t(kRoceOverhead + payload));
  out[6] = 17;  // next header: UDP (RoCEv2)
  out[7] = e.hop_limit;
  std::memcpy(out + 8, e.sgid, 16);
  std::memcpy(out + 24, e.dgid, 16);
}

}  // namespace

QpImpl* EngineCore::find_gsi(const Gid& dgid) {
  for (QpImpl* qp : qp_list_)
    if (qp->is_gsi() &&
        std::find(qp->local_gids.begin(), qp->local_gids.end(), dgid) != qp->local_gids.end())
      return qp;
  return nullptr;
}

// Sends what the SQ holds, one datagram per WQE. The WQEs complete after
// the link flushed them (EngineCore::progress), so a buffer is never reused
// while the link may still read it.
bool EngineCore::ud_progress(QpImpl& qp, uint64_t now) {
  if (qp.state_ != QpState::RTS) return false;  // SQD: nothing new leaves
  HostSpan spans[DeviceLimits::kMaxSge * 4];
  for (uint32_t budget = cfg_.tx_budget; budget && qp.sq_next < qp.sq_tail; budget--) {
    SendWqe& w = qp.sq_at(qp.sq_next);
    const uint32_t len = uint32_t(w.len);
    // A buffer in an on-demand MR waits for its pages (req_start).
    if (fault_wait(qp, now)) return false;
    bool fault = false;
    const size_t n = gather(qp, w, 0, len, spans, sizeof(spans) / sizeof(spans[0]), &fault);
    if (n == SIZE_MAX && fault) {
      if (!qp.fault_retry_ns) stats_.page_fault_waits++;
      qp.fault_retry_ns = now + kFaultPollNs;
      return false;
    }
    qp.fault_retry_ns = 0;
    w.started = true;
    qp.sq_next++;
    if (n == SIZE_MAX) {
      // A local protection error: this WQE fails, the QP goes to ERR.
      w.done = true;
      w.status = WcStatus::LOC_PROT_ERR;
      w.signaled = true;
      events_.push_back({AsyncEventType::QP_ACCESS_ERR, qp.qpn_});
      qp_to_error(qp);
      return false;
    }
    wire::Base b;
    b.op = w.op == WrOpcode::SEND_WITH_IMM ? wire::Op::UD_SEND_IMM : wire::Op::UD_SEND;
    b.flags = wire::F_FIRST | wire::F_LAST | ((w.flags & SEND_SOLICITED) ? wire::F_SOLICITED : 0);
    b.dst_qpn = w.ud.remote_qpn;
    b.src_qpn = qp.is_gsi() ? kGsiQpn : qp.qpn_;
    b.path = uint16_t(qp.ud_next_path++ % cfg_.num_paths);
    b.payload_len = uint16_t(len);
    b.ts = now_us();
    wire::UdExt e;
    // IB: a Q_Key with the high bit set means the QP's own (privileged) one.
    e.qkey = (w.ud.remote_qkey & 0x80000000u) ? qp.attr.qkey : w.ud.remote_qkey;
    e.imm = w.imm;
    e.flow_label = w.ud.flow_label;
    e.traffic_class = w.ud.traffic_class;
    e.hop_limit = w.ud.hop_limit;
    std::memcpy(e.sgid, w.ud.sgid.data(), 16);
    std::memcpy(e.dgid, w.ud.dgid.data(), 16);
    uint8_t hdr[wire::kMaxHeaderLen];
    const size_t hl = wire::encode(b, e, hdr);
    if (!cfg_.roce.peers.empty() && !w.ud.peer.ip.is_multicast() && roce_peer(w.ud.peer.ip))
      roce_ud_xmit(qp, b, e, spans, n, len);  // a plain RoCE v2 peer (roce_mode.cc)
    else
      xmit_to(IpAddr::from_bytes(w.ud.sgid.data()), w.ud.peer, b.path, hdr, hl, spans, n, len, false);
    stats_.ud_sent++;
    w.done = true;
  }
  return qp.sq_next < qp.sq_tail;
}

void EngineCore::ud_receive(const wire::Packet& p, const Endpoint& from, const IpAddr& to) {
  const wire::UdExt& e = p.ud;
  // The source GID must be the sending host's own address (no spoofing
  // another host's CM), and a unicast destination GID the address the
  // datagram reached (no asking, at one device's address, for QP 1 of
  // another device the daemon serves).
  Gid dgid;
  std::memcpy(dgid.data(), e.dgid, 16);
  if (IpAddr::from_bytes(e.sgid) != from.ip ||
      (!wire::is_multicast_gid(e.dgid) && !to.unspecified() && IpAddr::from_bytes(e.dgid) != to)) {
    stats_.ud_drops++;
    return;
  }
  if (wire::is_multicast_gid(e.dgid)) {  // a copy for every QP attached here
    auto it = mcast_.find(dgid);
    if (it == mcast_.end()) {
      stats_.ud_drops++;
      return;
    }
    const std::vector<QpImpl*> members = it->second;  // delivery may run callbacks
    for (QpImpl* qp : members) ud_deliver(qp, p, false);
    return;
  }
  QpImpl* qp = p.base.dst_qpn == kGsiQpn ? find_gsi(dgid) : find_qp(p.base.dst_qpn);
  ud_deliver(qp, p, p.base.dst_qpn == kGsiQpn);
}

// One datagram into one QP's next receive. A GSI QP is reached only as
// QP 1 (gsi_ok); RC and UC QPs take no datagrams; the Q_Key must match.
void EngineCore::ud_deliver(QpImpl* qp, const wire::Packet& p, bool gsi_ok) {
  const wire::UdExt& e = p.ud;
  const bool usable = qp && qp->is_ud() && (gsi_ok || !qp->is_gsi()) &&
                      (qp->state_ == QpState::RTR || qp->state_ == QpState::RTS ||
                       qp->state_ == QpState::SQD);
  if (!usable || e.qkey != qp->attr.qkey ||
      recv_held(*qp, 1) == 0) {
    stats_.ud_drops++;
    return;
  }
  RecvWqe& r = qp->rq_at(qp->rq_head++);
  uint8_t grh[kGrhBytes];
  build_grh(e, p.payload_len, grh);
  WcStatus st = WcStatus::SUCCESS;
  const bool ok = scatter(*qp, r.sge, r.nsge, 0, grh, kGrhBytes, st) &&
                  scatter(*qp, r.sge, r.nsge, kGrhBytes, p.payload, p.payload_len, st);
  // A receive that does not fit fails alone: a remote sender must not be
  // able to take the QP (the CM's, for GSI) down.
  Wc wc;
  wc.wr_id = r.wr_id;
  wc.status = ok ? WcStatus::SUCCESS : st;
  wc.opcode = WcOpcode::RECV;
  wc.byte_len = uint32_t(kGrhBytes + p.payload_len);
  wc.qp_num = qp->qpn_;
  wc.src_qp = p.base.src_qpn;
  wc.wc_flags = WC_GRH | (r.from_srq ? uint32_t(WC_SRQ) : 0u) |
                (wire::is_v4_mapped_gid(e.sgid) && wire::is_v4_mapped_gid(e.dgid) ? uint32_t(WC_GRH_IPV4) : 0u);
  if (p.base.op == wire::Op::UD_SEND_IMM) {
    wc.wc_flags |= WC_WITH_IMM;
    wc.imm_data = e.imm;
  }
  stats_.ud_rcvd++;
  emit(qp->recv_cq, wc);
}

int EngineCore::attach_mcast(QpImpl* qp, const Gid& mgid) {
  if (!qp || find_qp(qp->qpn_) != qp || qp->type_ != QpType::UD || !wire::is_multicast_gid(mgid.data()))
    return EINVAL;
  auto it = mcast_.find(mgid);
  if (it != mcast_.end()) {
    std::vector<QpImpl*>& v = it->second;
    if (std::find(v.begin(), v.end(), qp) != v.end()) return 0;
    if (v.size() >= DeviceLimits::kMaxMcastQpAttach) return ENOSPC;
    v.push_back(qp);
    return 0;
  }
  if (mcast_.size() >= DeviceLimits::kMaxMcastGroups) return ENOSPC;
  if (!link_.join_group(IpAddr::from_bytes(mgid.data()), true)) return EIO;
  mcast_[mgid] = {qp};
  return 0;
}

int EngineCore::detach_mcast(QpImpl* qp, const Gid& mgid) {
  if (!qp || find_qp(qp->qpn_) != qp) return EINVAL;
  auto it = mcast_.find(mgid);
  if (it == mcast_.end()) return EINVAL;
  std::vector<QpImpl*>& v = it->second;
  auto q = std::find(v.begin(), v.end(), qp);
  if (q == v.end()) return EINVAL;
  v.erase(q);
  if (v.empty()) {
    link_.join_group(IpAddr::from_bytes(mgid.data()), false);
    mcast_.erase(it);
  }
  return 0;
}

// A QP being destroyed leaves every group it is attached to.
void EngineCore::mcast_forget(QpImpl* qp) {
  for (auto it = mcast_.begin(); it != mcast_.end();) {
    std::vector<QpImpl*>& v = it->second;
    v.erase(std::remove(v.begin(), v.end(), qp), v.end());
    if (v.empty()) {
      link_.join_group(IpAddr::from_bytes(it->first.data()), false);
      it = mcast_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace vstellar
