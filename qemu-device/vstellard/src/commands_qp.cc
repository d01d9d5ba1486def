// The commands on queue pairs: CREATE_QP, MODIFY_QP, QUERY_QP, DESTROY_QP.
#include "vstellard/commands.h"

#include <endian.h>

#include <cstring>
#include <iterator>

#include "commands_common.h"

namespace vstellard {

namespace {

// The rings a CREATE_QP describes: sizes within the device's limits, a WQE
// with its SGEs (or inline data) fitting one slot, offsets and page counts
// that match. A QP on an SRQ has no RQ to check.
uint16_t CheckQpRings(const vstellar_cmd_create_qp& cmd, const virtio_vstellar_config& c, bool has_rq) {
  const uint32_t sqp = le32toh(cmd.sq_pages), rqp = le32toh(cmd.rq_pages);
  const uint32_t shift = cmd.page_shift;
  if (!PageShiftSupported(c, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t ssge = le32toh(cmd.max_send_sge), rsge = le32toh(cmd.max_recv_sge);
  const uint32_t inl = le32toh(cmd.max_inline_data);
  if (cmd.sq_log_wqe > VSTELLAR_MAX_LOG_WQE || cmd.rq_log_wqe > VSTELLAR_MAX_LOG_WQE ||
      (1ull << cmd.sq_log_wqe) > cfg32(c.max_qp_wr) || (1ull << cmd.rq_log_wqe) > cfg32(c.max_qp_wr) ||
      ssge > cfg32(c.max_send_sge) || rsge > cfg32(c.max_recv_sge) || inl > cfg32(c.max_inline_data))
    return VSTELLAR_STATUS_LIMIT;
  if (cmd.sq_log_stride < VSTELLAR_MIN_SQ_LOG_STRIDE || cmd.sq_log_stride > VSTELLAR_MAX_LOG_STRIDE ||
      (has_rq && (cmd.rq_log_stride < VSTELLAR_MIN_RQ_LOG_STRIDE || cmd.rq_log_stride > VSTELLAR_MAX_LOG_STRIDE)))
    return VSTELLAR_STATUS_BAD_FIELD;
  const uint64_t sstride = 1ull << cmd.sq_log_stride, rstride = 1ull << cmd.rq_log_stride;
  if (sizeof(vstellar_send_wqe) + 16ull * ssge > sstride || sizeof(vstellar_send_wqe) + inl > sstride ||
      (has_rq && sizeof(vstellar_recv_wqe) + 16ull * rsge > rstride))
    return VSTELLAR_STATUS_BAD_FIELD;
  const uint64_t ps = 1ull << shift, soff = le64toh(cmd.sq_offset);
  const uint64_t roff = has_rq ? le64toh(cmd.rq_offset) : 0;
  if (soff >= ps || roff >= ps || soff % 64 || roff % 16) return VSTELLAR_STATUS_BAD_FIELD;
  if (uint64_t(sqp) + rqp > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  if (sqp != PagesFor(soff, sstride << cmd.sq_log_wqe, shift) ||
      (has_rq && rqp != PagesFor(roff, rstride << cmd.rq_log_wqe, shift)))
    return VSTELLAR_STATUS_BAD_FIELD;
  return VSTELLAR_STATUS_OK;
}

// The data path's view of a new QP's rings (checked by CheckQpRings): their
// geometry, the wr_id and opcode of each slot, the limits granted.
void SetQpRings(const vstellar_cmd_create_qp& cmd, bool has_rq, QpObj* o) {
  o->sq.shift = o->rq.shift = cmd.page_shift;
  o->sq.offset = le64toh(cmd.sq_offset);
  o->sq.log_n = cmd.sq_log_wqe;
  o->sq.log_stride = cmd.sq_log_stride;
  o->rq.offset = has_rq ? le64toh(cmd.rq_offset) : 0;
  o->rq.log_n = cmd.rq_log_wqe;
  o->rq.log_stride = cmd.rq_log_stride;
  o->sq_wrid.assign(size_t{1} << cmd.sq_log_wqe, 0);
  o->sq_op.assign(size_t{1} << cmd.sq_log_wqe, 0);
  o->rq_wrid.assign(size_t{1} << cmd.rq_log_wqe, 0);
  o->max_send_sge = le32toh(cmd.max_send_sge);
  o->max_recv_sge = le32toh(cmd.max_recv_sge);
  o->max_inline = le32toh(cmd.max_inline_data);
}

}  // namespace

// What a QP holds beyond its table entry: the engine's QP, its multicast
// groups and its doorbell slot.
void Commands::ReleaseQp(uint32_t qpn, QpObj& q) {
  sh_->engine->destroy_qp(q.qp);  // leaves its groups
  for (auto g = obj_.mcast.begin(); g != obj_.mcast.end();) {
    g->second.erase(qpn);
    g = g->second.empty() ? obj_.mcast.erase(g) : std::next(g);
  }
  FreeSlot(q.owner, q.slot);
}

// The objects a CREATE_QP names, each this context's: its PD, its CQs, and
// its SRQ if it receives from one (then it has no RQ: no ring, no receive
// SGEs, and the SRQ is in the same PD).
uint16_t Commands::FindQpObjects(uint32_t uctx, const vstellar_cmd_create_qp& cmd, QpObjects* out) {
  if (cmd.create_flags & VSTELLAR_QP_CREATE_USE_SRQ) {
    if (!SrqsOn()) return VSTELLAR_STATUS_UNSUPPORTED;
    out->srqh = le32toh(cmd.srq.srqn);
    out->srq = obj_.srqs.Owned(uctx, out->srqh);
    if (!out->srq) return VSTELLAR_STATUS_BAD_HANDLE;
    if (cmd.srq.reserved || cmd.rq_pages || cmd.rq_log_wqe || cmd.rq_log_stride || le32toh(cmd.max_recv_sge) ||
        cmd.qp_type == VSTELLAR_QPT_GSI || out->srq->pdn != le32toh(cmd.pdn))
      return VSTELLAR_STATUS_BAD_FIELD;
  }
  out->pdn = le32toh(cmd.pdn);
  out->send_cqn = le32toh(cmd.send_cqn);
  out->recv_cqn = le32toh(cmd.recv_cqn);
  out->pd = obj_.pds.Owned(uctx, out->pdn);
  out->send_cq = obj_.cqs.Owned(uctx, out->send_cqn);
  out->recv_cq = obj_.cqs.Owned(uctx, out->recv_cqn);
  if (!out->pd || !out->send_cq || !out->recv_cq) return VSTELLAR_STATUS_BAD_HANDLE;
  return VSTELLAR_STATUS_OK;
}

// Whether this context may make a QP of this type on this device.
uint16_t Commands::CheckQpType(uint32_t uctx, uint8_t type) const {
  if (type == VSTELLAR_QPT_UD || type == VSTELLAR_QPT_GSI) {
    if (!DatagramsOn()) return VSTELLAR_STATUS_UNSUPPORTED;
    if (type == VSTELLAR_QPT_GSI) {
      if (uctx != 0) return VSTELLAR_STATUS_UNSUPPORTED;  // QP 1 is the kernel's MAD layer's
      for (auto& [n, q] : obj_.qps)
        if (q.type == VSTELLAR_QPT_GSI) return VSTELLAR_STATUS_LIMIT;  // one QP 1 per device
    }
  } else if (type == VSTELLAR_QPT_UC) {
    if (!state_.HasFeature(VIRTIO_VSTELLAR_F_UC)) return VSTELLAR_STATUS_UNSUPPORTED;
  } else if (type != VSTELLAR_QPT_RC) {
    return VSTELLAR_STATUS_BAD_FIELD;
  }
  return VSTELLAR_STATUS_OK;
}

// Validate (the objects named, the type, the rings), read the page lists,
// charge the quota, create the engine's QP, reply.
// A wr_id and an opcode per send slot, a wr_id per receive slot, the page
// lists, and the engine's part.
uint64_t Commands::QpBytes(uint64_t pages, uint32_t sq_log_wqe, uint32_t rq_log_wqe, uint64_t engine_bytes) {
  return sizeof(QpObj) + 9 * (uint64_t{1} << sq_log_wqe) + 8 * (uint64_t{1} << rq_log_wqe) + 8 * pages + engine_bytes;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_CREATE_QP>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_create_qp>(b);
  const uint32_t sqp = le32toh(cmd.sq_pages), rqp = le32toh(cmd.rq_pages);
  if (uint64_t(len) != sizeof(cmd) + 8ull * (uint64_t(sqp) + rqp)) return VSTELLAR_STATUS_BAD_LENGTH;
  if (cmd.create_flags & ~VSTELLAR_QP_CREATE_VALID) return VSTELLAR_STATUS_BAD_FIELD;
  QpObjects on;
  if (uint16_t s = FindQpObjects(uctx, cmd, &on)) return s;
  const uint8_t type = cmd.qp_type;
  if (uint16_t s = CheckQpType(uctx, type)) return s;
  if (cmd.sq_sig_all > 1) return VSTELLAR_STATUS_BAD_FIELD;
  const bool has_rq = !on.srq;
  if (uint16_t s = CheckQpRings(cmd, config(), has_rq)) return s;
  if (obj_.qps.size() >= cfg32(config().max_qp)) return VSTELLAR_STATUS_LIMIT;

  QpObj o{};
  const uint8_t* pages = b + sizeof(cmd);
  if (uint16_t s = ReadPages(pages, sqp, cmd.page_shift, &o.sq.pages)) return s;
  if (uint16_t s = ReadPages(pages + 8ull * sqp, rqp, cmd.page_shift, &o.rq.pages)) return s;
  vstellar::QpInitAttr init;
  init.send_cq = on.send_cq->cq;
  init.recv_cq = on.recv_cq->cq;
  init.cap.max_send_wr = 1u << cmd.sq_log_wqe;
  init.cap.max_recv_wr = 1u << cmd.rq_log_wqe;
  init.cap.max_send_sge = le32toh(cmd.max_send_sge);
  init.cap.max_recv_sge = le32toh(cmd.max_recv_sge);
  init.cap.max_inline_data = le32toh(cmd.max_inline_data);
  init.sq_sig_all = cmd.sq_sig_all;
  init.qp_type = vstellar::QpType(type);
  init.srq = on.srq ? on.srq->srq : nullptr;
  init.owner = dp_.device_id();  // the receive-refill hook finds the device by it
  // The engine's rings and window, and our wr_id and opcode arrays.
  if (uint16_t s = Charge(QpBytes(uint64_t(sqp) + rqp, cmd.sq_log_wqe, cmd.rq_log_wqe, sh_->engine->qp_footprint(init)),
                          &o.charge))
    return s;
  if (uint16_t s = AllocSlot(uctx, &o.slot)) return s;
  o.qp = sh_->engine->create_qp(on.pd->pd, init);
  if (!o.qp) {
    FreeSlot(uctx, o.slot);
    return VSTELLAR_STATUS_NO_RESOURCES;
  }
  o.owner = uctx;
  o.type = type;
  o.srqh = on.srqh;
  o.pdn = on.pdn;
  o.send_cqn = on.send_cqn;
  o.recv_cqn = on.recv_cqn;
  SetQpRings(cmd, has_rq, &o);
  dp_.ResetDbSlot(uctx, o.slot);

  const uint32_t qpn = o.qp->qpn();
  vstellar_resp_create_qp r{};
  r.qpn = htole32(qpn);
  r.db_slot = htole32(o.slot);
  r.max_send_sge = htole32(o.max_send_sge);
  r.max_recv_sge = htole32(o.max_recv_sge);
  r.max_inline_data = htole32(o.max_inline);
  obj_.qps[qpn] = std::move(o);
  if (type == VSTELLAR_QPT_GSI) SyncGsiGids();
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

namespace {

// The peer host an address vector names: RoCE v2-style, its GID is its
// IPv6 address or its IPv4 one (IPv4-mapped). Unspecified when it names
// no host we can reach: no address, a group, or a link-local one (which
// means something only on the guest's own link).
vstellar::IpAddr PeerIp(const vstellar_av& av) {
  const vstellar::IpAddr a = vstellar::IpAddr::from_bytes(av.dgid);
  return a.is_multicast() || a.is_link_local() ? vstellar::IpAddr() : a;
}

// The attributes of a MODIFY_QP as the wire holds them: reserved bytes
// zero, known mask bits, each value given in its range (the rd_atomic
// depths within the device's limits). Which attributes a transition needs
// is the engine's check.
uint16_t CheckQpAttr(const vstellar_cmd_modify_qp& cmd, const virtio_vstellar_config& c) {
  const vstellar_qp_attr& a = cmd.attr;
  if (cmd.reserved || a.reserved || !IsZero(a.av.reserved, sizeof(a.av.reserved))) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t mask = le32toh(a.attr_mask);
  if (mask & ~VSTELLAR_QP_ATTR_MASK_VALID) return VSTELLAR_STATUS_BAD_FIELD;
  if ((mask & VSTELLAR_QP_STATE) && a.qp_state > VSTELLAR_QPS_ERR) return VSTELLAR_STATUS_BAD_FIELD;
  if ((mask & VSTELLAR_QP_CUR_STATE) && a.cur_qp_state > VSTELLAR_QPS_ERR) return VSTELLAR_STATUS_BAD_FIELD;
  if ((mask & VSTELLAR_QP_ACCESS_FLAGS) && (le32toh(a.access_flags) & ~VSTELLAR_ACCESS_VALID))
    return VSTELLAR_STATUS_BAD_FIELD;
  if ((mask & VSTELLAR_QP_PATH_MTU) && (a.path_mtu < 1 || a.path_mtu > 5)) return VSTELLAR_STATUS_BAD_FIELD;
  if ((mask & VSTELLAR_QP_PORT) && a.port != 1) return VSTELLAR_STATUS_BAD_FIELD;
  if ((mask & VSTELLAR_QP_PKEY_INDEX) && le16toh(a.pkey_index) != 0) return VSTELLAR_STATUS_BAD_FIELD;
  if (((mask & VSTELLAR_QP_RQ_PSN) && le32toh(a.rq_psn) > 0xffffff) ||
      ((mask & VSTELLAR_QP_SQ_PSN) && le32toh(a.sq_psn) > 0xffffff) ||
      ((mask & VSTELLAR_QP_DEST_QPN) && le32toh(a.dest_qpn) > 0xffffff))
    return VSTELLAR_STATUS_BAD_FIELD;
  if (((mask & VSTELLAR_QP_TIMEOUT) && a.timeout > 31) || ((mask & VSTELLAR_QP_RETRY_CNT) && a.retry_cnt > 7) ||
      ((mask & VSTELLAR_QP_RNR_RETRY) && a.rnr_retry > 7) ||
      ((mask & VSTELLAR_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31))
    return VSTELLAR_STATUS_BAD_FIELD;
  if (((mask & VSTELLAR_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > cfg32(c.max_qp_init_rd_atom)) ||
      ((mask & VSTELLAR_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > cfg32(c.max_qp_rd_atom)))
    return VSTELLAR_STATUS_LIMIT;
  if ((mask & VSTELLAR_QP_AV) && PeerIp(a.av).unspecified()) return VSTELLAR_STATUS_BAD_FIELD;
  return VSTELLAR_STATUS_OK;
}

// The engine's form of checked wire attributes; `next` is the state asked
// for (or the QP's own), the peer reached on the port every vstellard
// listens on.
vstellar::QpAttr EngineQpAttr(const vstellar_qp_attr& a, uint8_t next, uint16_t peer_port) {
  vstellar::QpAttr qa;
  if (le32toh(a.attr_mask) & VSTELLAR_QP_AV) {
    qa.ah.ip = PeerIp(a.av);
    qa.ah.port = peer_port;
  }
  qa.qp_state = vstellar::QpState(next);
  qa.cur_qp_state = vstellar::QpState(a.cur_qp_state);
  qa.path_mtu = a.path_mtu;
  qa.qp_access_flags = le32toh(a.access_flags);
  qa.pkey_index = le16toh(a.pkey_index);
  qa.port_num = a.port;
  qa.dest_qp_num = le32toh(a.dest_qpn);
  qa.qkey = le32toh(a.qkey);
  qa.rq_psn = le32toh(a.rq_psn);
  qa.sq_psn = le32toh(a.sq_psn);
  qa.max_rd_atomic = a.max_rd_atomic;
  qa.max_dest_rd_atomic = a.max_dest_rd_atomic;
  qa.min_rnr_timer = a.min_rnr_timer;
  qa.timeout = a.timeout;
  qa.retry_cnt = a.retry_cnt;
  qa.rnr_retry = a.rnr_retry;
  return qa;
}

}  // namespace

// The address an RC or UC QP sends from and is reached at: the source GID
// its address vector names if this device holds it and it is of the
// peer's family, else the device's held address of that family. A daemon
// bound to one address sends from it whatever a QP names, so there a QP
// may go without one (its device may not have added its GID yet); a
// daemon serving several devices' addresses needs one, or the QP would
// send as nobody's (BAD_FIELD).
uint16_t Commands::QpSource(const vstellar_av& av, const vstellar::IpAddr& peer, vstellar::IpAddr* out) {
  auto usable = [&](const vstellar::Gid& g) {
    return HoldsGid(*sh_, &obj_, g) && vstellar::IpAddr::from_bytes(g.data()).is_v4() == peer.is_v4();
  };
  auto named = obj_.gids.find(av.sgid_index);
  if (named != obj_.gids.end() && usable(named->second)) {
    *out = vstellar::IpAddr::from_bytes(named->second.data());
    return VSTELLAR_STATUS_OK;
  }
  for (const auto& [index, g] : obj_.gids)
    if (usable(g)) {
      *out = vstellar::IpAddr::from_bytes(g.data());
      return VSTELLAR_STATUS_OK;
    }
  *out = vstellar::IpAddr();
  return sh_->link_serves_many_addresses ? VSTELLAR_STATUS_BAD_FIELD : VSTELLAR_STATUS_OK;
}

// Check the wire attributes, ask the engine's state machine, modify.
template <>
uint16_t Commands::Run<VSTELLAR_CMD_MODIFY_QP>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_modify_qp>(b);
  QpObj* q = obj_.qps.Owned(uctx, le32toh(cmd.qpn));
  if (!q) return VSTELLAR_STATUS_BAD_HANDLE;
  if (uint16_t s = CheckQpAttr(cmd, config())) return s;
  const uint32_t mask = le32toh(cmd.attr.attr_mask);
  vstellar::Qp* qp = q->qp;
  const uint8_t next = (mask & VSTELLAR_QP_STATE) ? cmd.attr.qp_state : uint8_t(qp->state());
  vstellar::QpAttr qa = EngineQpAttr(cmd.attr, next, sh_->peer_port);
  if (mask & VSTELLAR_QP_AV)
    if (uint16_t s = QpSource(cmd.attr.av, qa.ah.ip, &qa.local)) return s;
  // Our attr_mask bits are the IB (and engine) numbering. The engine owns
  // the state machine: a state the QP is not in, or a transition that does
  // not exist, is BAD_STATE; attributes the transition lacks, does not
  // take or cannot hold are BAD_FIELD.
  switch (sh_->engine->check_modify_qp(qp, qa, mask)) {
    case vstellar::ModifyQpCheck::OK: break;
    case vstellar::ModifyQpCheck::WRONG_CUR_STATE:
    case vstellar::ModifyQpCheck::BAD_TRANSITION: return VSTELLAR_STATUS_BAD_STATE;
    default: return VSTELLAR_STATUS_BAD_FIELD;
  }
  if (sh_->engine->modify_qp(qp, qa, mask)) return VSTELLAR_STATUS_BAD_FIELD;
  dp_.OnQpModified(*q, next);
  // A connected QP now has its peer: the worker may move this device to
  // its peers' worker (Worker::Place), after this turn.
  if (next == VSTELLAR_QPS_RTR && (q->type == VSTELLAR_QPT_RC || q->type == VSTELLAR_QPT_UC) && sh_->connected)
    sh_->connected(dp_.device_id());
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_QUERY_QP>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  const auto [q, qpn, status] = ObjectNamedBy(obj_.qps, uctx, b);
  if (!q) return status;
  vstellar::QpAttr qa;
  vstellar::QpInitAttr init;
  if (sh_->engine->query_qp(q->qp, qa, init)) return VSTELLAR_STATUS_INTERNAL;
  vstellar_resp_query_qp r{};
  vstellar_qp_attr& a = r.attr;
  a.attr_mask = htole32(VSTELLAR_QP_ATTR_MASK_VALID);
  a.qp_state = uint8_t(q->qp->state());
  a.cur_qp_state = a.qp_state;
  a.path_mtu = uint8_t(qa.path_mtu);
  a.port = qa.port_num;
  a.rq_psn = htole32(qa.rq_psn);
  a.sq_psn = htole32(qa.sq_psn);
  a.dest_qpn = htole32(qa.dest_qp_num);
  a.qkey = htole32(qa.qkey);
  a.access_flags = htole32(qa.qp_access_flags);
  a.pkey_index = htole16(qa.pkey_index);
  a.max_rd_atomic = qa.max_rd_atomic;
  a.max_dest_rd_atomic = qa.max_dest_rd_atomic;
  a.min_rnr_timer = qa.min_rnr_timer;
  a.timeout = qa.timeout;
  a.retry_cnt = qa.retry_cnt;
  a.rnr_retry = qa.rnr_retry;
  if (!qa.ah.ip.unspecified()) std::memcpy(a.av.dgid, qa.ah.ip.b.data(), 16);
  r.sq_draining = htole32(qa.sq_draining);
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DESTROY_QP>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  const auto [q, qpn, status] = ObjectNamedBy(obj_.qps, uctx, b);
  if (!q) return status;
  ReleaseQp(qpn, *q);
  obj_.qps.erase(qpn);
  return VSTELLAR_STATUS_OK;
}

}  // namespace vstellard
