// One owner's objects out of this engine as bytes, and into another
// engine, in another process on another host (Engine::save and
// Engine::restore): the engine's part of a live migration
// (docs/virtio-vstellar.md, "Live migration").
//
// The format: a header (magic, version, the engine shape the state is
// sized by), then PDs, CQs, SRQs, MRs, windows, QPs and async events, each
// list prefixed by its count, every field little-endian and fixed-width
// (vstellar/state_stream.h). Objects name each other by their index in
// these lists, never by number. Translators are the owner's: the state
// carries what the owner's save_mem wrote for each, and restore_mem
// builds it again. In order:
//   header   u64 magic "ENGNLST1", u32 version 1, u32 window_pkts,
//            u32 num_paths, u32 mtu, u8 integrity
//   PDs      u32 count (nothing else: their numbers are the new engine's)
//   CQs      capacity, the completions not yet polled, the overflow flag
//   SRQs     PD index, max_wr, max_sge, limit, the WQEs posted
//   MRs      PD index, range, access, key, state, fast-registration pages,
//            windows bound, translator (u8 present, u64 length, bytes)
//   windows  PD index, type, rkey, state, MR index (~0: unbound), range,
//            access, the QPN of a type 2 binding
//   QPs      QPN, state, type, PD/CQ/SRQ indices, capabilities, attributes,
//            segment size; the send queue (positions, WQEs with their
//            inline bytes and REG_MR translators); READs and atomics
//            outstanding; PSNs, bytes in flight, RTT; one record per PSN
//            in flight; the resend queue; READ re-requests; the receive
//            queue; the expected PSN and arrival bitmap; the held READ and
//            atomic requests (as wire headers); the atomic replay cache;
//            the READs done; ACK, UC, datagram and RoCE v2 state; the
//            integrity keys, counter and replay window
//   events   type, and the object: a CQ's or SRQ's index, or a QPN
// Times travel as ages (how long ago) and waits (how long from now).
//
// restore() trusts nothing: the bytes reach the destination through
// QEMU's migration stream. Every count is bounded by the engine's limits,
// every enum and bool checked, every index must name an object of the
// state, and every invariant the engine relies on holds (queue positions
// within their rings, a WQE's packets numbered as req_start numbers them,
// each packet record the one its WQE made, the answers a WQE counts what
// its records say, an MR's bound windows those bound to it), before
// anything is made here.
//
// What does not move: the path choice and the congestion window, which
// belong to the paths of the old host, start afresh as at RTR; the retry
// clock and RTO backoff start now (the outage was the migration, not the
// peer); the timers of the packets in flight are due at once (each then
// waits for its RTO from when it was sent), so what went to the old host's
// network goes out again from here, as after any outage; packets found
// lost wait in the resend queue, and the bytes in flight are counted
// again from the records. A QP that does not send (ERR) keeps nothing of
// its packets: it leaves ERR only through RESET.
#include <algorithm>
#include <cerrno>
#include <map>
#include <type_traits>

#include "engine_internal.h"
#include "vstellar/state_stream.h"

namespace vstellar {

namespace {

constexpr uint64_t kMagic = 0x3154534c4e474e45ull;  // "ENGNLST1"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kNone = UINT32_MAX;
constexpr uint32_t kMaxObjects = 1u << 20;
constexpr uint32_t kMaxMemBytes = 1u << 30;  // one translator's description (a page list)

bool valid_wr(uint8_t v) { return v <= uint8_t(WrOpcode::SEND_WITH_INV) || v == uint8_t(WrOpcode::REG_MR); }
bool valid_wc_status(uint8_t v) { return v <= uint8_t(WcStatus::GENERAL_ERR); }
bool valid_wc_opcode(uint8_t v) {
  return v <= uint8_t(WcOpcode::LOCAL_INV) || v == uint8_t(WcOpcode::REG_MR) || v == uint8_t(WcOpcode::RECV) ||
         v == uint8_t(WcOpcode::RECV_RDMA_WITH_IMM);
}
bool valid_qp_state(uint8_t v) { return v <= uint8_t(QpState::ERR); }
bool valid_qp_type(uint8_t v) { return v >= uint8_t(QpType::GSI) && v <= uint8_t(QpType::UD); }
bool valid_mr_state(uint8_t v) { return v <= uint8_t(MrState::INVALID); }
bool valid_event(uint8_t v) { return v <= uint8_t(AsyncEventType::QP_LAST_WQE_REACHED); }
bool valid_op(uint8_t v) { return v >= uint8_t(wire::Op::SEND) && v <= uint8_t(wire::Op::SEND_INV); }

// The kind of the packets a WQE of this opcode sends (req_progress).
PktKind kind_of(WrOpcode op) {
  return op == WrOpcode::RDMA_READ ? PktKind::READ : is_rd_atomic(op) ? PktKind::ATOMIC : PktKind::DATA;
}

// Times move as ages (how long ago) or waits (how long from now), never as
// clock values: the destination's clock is another.
uint64_t age(uint64_t now, uint64_t t) { return t && t <= now ? now - t : 0; }
uint64_t wait_for(uint64_t now, uint64_t t) { return t > now ? t - now : 0; }
uint64_t from_age(uint64_t now, uint64_t a) { return a && a <= now ? now - a : (a ? 1 : 0); }

void put_ip(StateWriter& w, const IpAddr& a) { w.Bytes(a.b.data(), 16); }
void put_ep(StateWriter& w, const Endpoint& e) {
  put_ip(w, e.ip);
  w.U16(e.port);
}
bool get_ip(StateReader& r, IpAddr* a) { return r.Bytes(a->b.data(), 16); }
bool get_ep(StateReader& r, Endpoint* e) { return get_ip(r, &e->ip) && r.U16(&e->port); }

template <typename E>
bool get_enum(StateReader& r, E* out, bool (*valid)(uint8_t)) {
  uint8_t v = 0;
  if (!r.U8(&v) || !valid(v)) return r.Fail();
  *out = E(v);
  return true;
}

void put_sge(StateWriter& w, const Sge& s) {
  w.U64(s.addr);
  w.U32(s.length);
  w.U32(s.lkey);
}
bool get_sge(StateReader& r, Sge* s) { return r.U64(&s->addr) && r.U32(&s->length) && r.U32(&s->lkey); }

void put_ud(StateWriter& w, const UdDest& u) {
  put_ep(w, u.peer);
  w.U32(u.remote_qpn);
  w.U32(u.remote_qkey);
  w.Bytes(u.sgid.data(), 16);
  w.Bytes(u.dgid.data(), 16);
  w.U32(u.flow_label);
  w.U8(u.traffic_class);
  w.U8(u.hop_limit);
}
bool get_ud(StateReader& r, UdDest* u) {
  return get_ep(r, &u->peer) && r.U32(&u->remote_qpn) && r.U32(&u->remote_qkey) && r.Bytes(u->sgid.data(), 16) &&
         r.Bytes(u->dgid.data(), 16) && r.U32(&u->flow_label) && r.U8(&u->traffic_class) && r.U8(&u->hop_limit);
}

void put_wc(StateWriter& w, const Wc& c) {
  w.U64(c.wr_id);
  w.U8(uint8_t(c.status));
  w.U8(uint8_t(c.opcode));
  w.U32(c.vendor_err);
  w.U32(c.byte_len);
  w.U32(c.imm_data);
  w.U32(c.qp_num);
  w.U32(c.src_qp);
  w.U32(c.wc_flags);
}
bool get_wc(StateReader& r, Wc* c) {
  return r.U64(&c->wr_id) && get_enum(r, &c->status, valid_wc_status) && get_enum(r, &c->opcode, valid_wc_opcode) &&
         r.U32(&c->vendor_err) && r.U32(&c->byte_len) && r.U32(&c->imm_data) && r.U32(&c->qp_num) &&
         r.U32(&c->src_qp) && r.U32(&c->wc_flags);
}

void put_recv(StateWriter& w, const RecvWqe& q) {
  w.U64(q.wr_id);
  w.U32(q.nsge);
  for (const Sge& s : q.sge) put_sge(w, s);
  w.U64(q.cap);
  w.U8(q.have_last);
  w.U32(q.last_psn);
  w.U32(q.byte_len);
  w.U32(q.imm);
  w.U8(q.with_imm);
  w.U8(q.write_imm);
  w.U8(q.from_srq);
  w.U8(q.with_inv);
  w.U8(uint8_t(q.status));
}
bool get_recv(StateReader& r, RecvWqe* q) {
  r.U64(&q->wr_id);
  r.U32(&q->nsge);
  for (Sge& s : q->sge) get_sge(r, &s);
  r.U64(&q->cap);
  r.Bool(&q->have_last);
  r.U32(&q->last_psn);
  r.U32(&q->byte_len);
  r.U32(&q->imm);
  r.Bool(&q->with_imm);
  r.Bool(&q->write_imm);
  r.Bool(&q->from_srq);
  r.Bool(&q->with_inv);
  get_enum(r, &q->status, valid_wc_status);
  return r.ok() && (q->nsge <= DeviceLimits::kMaxSge || r.Fail());
}

// A translator as its owner describes it: a flag, then its bytes.
bool put_mem(StateWriter& w, const std::shared_ptr<MemoryTranslator>& mem, const Engine::SaveMem& save_mem) {
  if (!mem) {
    w.U8(0);
    return true;
  }
  std::vector<uint8_t> b;
  if (!save_mem || !save_mem(*mem, &b)) return false;
  w.U8(1);
  w.Blob(b);
  return true;
}
bool get_mem(StateReader& r, std::shared_ptr<MemoryTranslator>* mem, const Engine::RestoreMem& restore_mem) {
  bool has = false;
  if (!r.Bool(&has)) return false;
  if (!has) return true;
  const uint8_t* p = nullptr;
  size_t n = 0;
  if (!r.Blob(&p, &n) || n > kMaxMemBytes || !restore_mem) return r.Fail();
  *mem = restore_mem(p, n);
  return *mem ? true : r.Fail();
}

}  // namespace

// ---------------------------------------------------------------------- save

int EngineCore::save(const EngineObjects& o, const Engine::SaveMem& save_mem, std::vector<uint8_t>* out) {
  if (int e = closed_set(o)) return e;
  const uint64_t now = clock_.now_ns();
  std::map<const void*, uint32_t> index;
  auto number = [&](const auto& list) {
    for (uint32_t i = 0; i < list.size(); i++) index[list[i]] = i;
  };
  number(o.pds);
  number(o.cqs);
  number(o.srqs);
  number(o.mrs);
  auto at = [&](const void* p) { return p ? index.at(p) : kNone; };

  StateWriter w;
  w.U64(kMagic);
  w.U32(kVersion);
  w.U32(cfg_.window_pkts);
  w.U32(cfg_.num_paths);
  w.U32(cfg_.mtu);
  w.U8(cfg_.integrity);

  w.U32(uint32_t(o.pds.size()));
  w.U32(uint32_t(o.cqs.size()));
  for (Cq* c : o.cqs) {
    w.U32(c->capacity());
    w.U32(c->count());
    for (uint64_t i = c->head_; i < c->tail_; i++) put_wc(w, c->ring_[i % c->ring_.size()]);
    w.U8(c->overflow_);
  }
  w.U32(uint32_t(o.srqs.size()));
  for (Srq* s0 : o.srqs) {
    SrqImpl* s = impl(s0);
    w.U32(at(s->pd()));
    w.U32(s->max_wr_);
    w.U32(s->max_sge_);
    w.U32(s->limit_);
    w.U32(uint32_t(s->posted()));
    for (uint64_t i = s->head; i < s->tail; i++) put_recv(w, s->at(i));
  }
  w.U32(uint32_t(o.mrs.size()));
  for (Mr* m : o.mrs) {
    w.U32(at(m->pd_));
    w.U64(m->iova_);
    w.U64(m->length_);
    w.U32(m->access_);
    w.U32(m->key_);
    w.U8(uint8_t(m->state_));
    w.U8(m->fast_reg_);
    w.U32(m->max_pages_);
    w.U32(m->bound_windows_);
    if (!put_mem(w, m->mem_, save_mem)) return ENOTSUP;
  }
  w.U32(uint32_t(o.mws.size()));
  for (Mw* m : o.mws) {
    w.U32(at(m->pd_));
    w.U8(m->type_);
    w.U32(m->rkey_);
    w.U8(uint8_t(m->state_));
    w.U32(at(m->mr_));
    w.U64(m->addr_);
    w.U64(m->length_);
    w.U32(m->access_);
    w.U32(m->qpn_);
  }
  w.U32(uint32_t(o.qps.size()));
  for (Qp* q0 : o.qps) {
    QpImpl& q = impl(*q0);
    w.U32(q.qpn_);
    w.U8(uint8_t(q.state_));
    w.U8(uint8_t(q.type_));
    w.U32(at(q.pd_));
    w.U32(at(q.send_cq));
    w.U32(at(q.recv_cq));
    w.U32(at(q.srq));
    const QpCap& c = q.init.cap;
    w.U32(c.max_send_wr);
    w.U32(c.max_recv_wr);
    w.U32(c.max_send_sge);
    w.U32(c.max_recv_sge);
    w.U32(c.max_inline_data);
    w.U8(q.init.sq_sig_all);
    const QpAttr& a = q.attr;
    w.U8(uint8_t(a.qp_state));
    w.U8(uint8_t(a.cur_qp_state));
    w.U32(a.path_mtu);
    w.U32(a.qp_access_flags);
    w.U16(a.pkey_index);
    w.U8(a.port_num);
    put_ep(w, a.ah);
    put_ip(w, a.local);
    w.U32(a.dest_qp_num);
    w.U32(a.qkey);
    w.U32(a.rq_psn);
    w.U32(a.sq_psn);
    for (uint8_t v : {a.max_rd_atomic, a.max_dest_rd_atomic, a.min_rnr_timer, a.timeout, a.retry_cnt, a.rnr_retry,
                      a.sq_draining, a.en_sqd_async_notify})
      w.U8(v);
    w.U32(q.seg);
    // Send queue: every slot (WQEs keep their slot), and the inline bytes.
    w.U64(q.sq_head);
    w.U64(q.sq_next);
    w.U64(q.sq_tail);
    for (uint64_t i = q.sq_head; i < q.sq_tail; i++) {
      const SendWqe& s = q.sq_at(i);
      w.U64(s.wr_id);
      w.U8(uint8_t(s.op));
      w.U32(s.flags);
      w.U32(s.imm);
      w.U64(s.raddr);
      w.U32(s.rkey);
      w.U64(s.cmp_add);
      w.U64(s.swap);
      w.U32(s.nsge);
      for (const Sge& g : s.sge) put_sge(w, g);
      w.U8(s.is_inline);
      w.U64(s.len);
      w.U8(s.signaled);
      w.U8(s.started);
      w.U8(s.done);
      w.U8(uint8_t(s.status));
      w.U32(s.first_psn);
      w.U32(s.read_fence);
      w.U32(s.npkts);
      w.U32(s.pkts_sent);
      w.U32(s.pkts_done);
      w.U32(s.seg);
      w.U32(s.rsn);
      w.U8(s.rnr_left);
      w.U64(wait_for(now, s.rnr_hold_until));
      w.U8(s.rd_counted);
      put_ud(w, s.ud);
      w.U32(s.reg.key);
      w.U64(s.reg.iova);
      w.U64(s.reg.length);
      w.U32(s.reg.access);
      if (!put_mem(w, s.reg.mem, save_mem)) return ENOTSUP;
      w.U32(s.bind.mw_rkey);
      w.U32(s.bind.new_rkey);
      w.U32(s.bind.mr_lkey);
      w.U64(s.bind.addr);
      w.U64(s.bind.length);
      w.U32(s.bind.access);
      w.U8(s.bind.mw_type);
      w.U32(s.vendor_err);
      w.U16(s.path);
      const size_t slot = size_t(i % q.sq.size()) * c.max_inline_data;
      w.Bytes(q.inline_buf.data() + slot, s.is_inline ? c.max_inline_data : 0);
    }
    w.U32(q.rd_atomic_outstanding);
    w.U32(q.next_rsn);
    // The connection's PSNs and what is in flight.
    w.U32(q.snd_una);
    w.U32(q.snd_nxt);
    w.U32(q.read_fence);
    w.U32(q.cum_seen);
    w.U64(q.inflight);
    w.U64(q.srtt);
    w.U64(q.rttvar);
    w.U64(wait_for(now, q.fault_retry_ns));
    w.U64(age(now, q.fault_since_ns));
    w.U8(q.drained_reported);
    put_ep(w, q.health_peer);
    const uint32_t live = q.recs.empty() ? 0 : q.snd_nxt - q.snd_una;
    w.U32(live);
    for (uint32_t k = 0; k < live; k++) {
      const PktRec& r = q.rec(q.snd_una + k);
      w.U64(r.wqe);
      w.U32(r.off);
      w.U32(r.len);
      w.U32(r.tx_seq);
      w.U16(r.path);
      w.U8(r.retries);
      w.U8(uint8_t(r.kind));
      w.U8(r.acked);
      w.U8(r.lost);
      w.U16(r.run);
      w.U16(r.prev_path);
      w.U64(age(now, r.sent_ns));
      w.U64(age(now, r.held_ns));
    }
    w.U32(uint32_t(q.resend.size()));
    for (uint32_t psn : q.resend) w.U32(psn);
    w.U32(uint32_t(q.read_reruns.size()));
    for (const auto& rr : q.read_reruns) {
      w.U32(rr.psn);
      w.U32(rr.n);
      w.U16(rr.path);
      w.U64(age(now, rr.sent_ns));
    }
    // Receive side.
    w.U64(q.rq_head);
    w.U64(q.rq_tail);
    for (uint64_t i = q.rq_head; i < q.rq_tail; i++) put_recv(w, q.rq_at(i));
    w.U32(q.epsn);
    w.U32(uint32_t(q.rbits.size()));
    for (uint64_t b : q.rbits) w.U64(b);
    w.U32(uint32_t(q.pending_rd.size()));
    for (const wire::Packet& p : q.pending_rd) {
      // A held READ or atomic request: its header, as a parser would
      // give it again (encode / parse_header round trip).
      uint8_t hdr[wire::kMaxHeaderLen];
      const size_t n = p.base.op == wire::Op::READ_REQ ? wire::encode(p.base, p.rreq, hdr)
                                                       : wire::encode(p.base, p.atomic, hdr);
      w.U32(uint32_t(n));
      w.Bytes(hdr, n);
      w.U32(p.held_since_us);
    }
    for (const auto& ar : q.atomic_replay) {
      w.U32(ar.psn);
      w.U64(ar.orig);
      w.U8(ar.valid);
    }
    w.U32(q.atomic_replay_next);
    w.U32(uint32_t(q.reads_done.size()));
    for (const auto& d : q.reads_done) {
      w.U32(d.psn);
      w.U32(d.npsn);
      w.U64(d.va);
      w.U32(d.rkey);
      w.U32(d.len);
      w.U32(d.msg_off);
      w.U16(d.seg);
    }
    w.U8(q.ack_pending);
    w.U64(age(now, q.last_ack_ns));
    w.U32(q.ack_lo);
    w.U32(q.ack_hi);
    w.U32(q.rx_since_ack);
    w.U32(q.ce_since_ack);
    w.U32(q.last_ts);
    w.U16(q.last_path);
    w.U8(q.uc_in_msg);
    w.U8(uint8_t(q.uc_op));
    w.U32(q.uc_len);
    w.U64(q.uc_va);
    w.U32(q.uc_rkey);
    w.U32(uint32_t(q.local_gids.size()));
    for (const Gid& g : q.local_gids) w.Bytes(g.data(), 16);
    w.U32(q.ud_next_path);
    w.U8(q.roce);
    w.U8(q.roce_nak_sent);
    w.U8(q.roce_in_msg);
    w.U8(uint8_t(q.roce_op));
    w.U64(q.roce_va);
    w.U32(q.roce_rkey);
    w.U32(q.roce_len);
    w.U32(q.roce_off);
    w.U32(q.roce_msn);
    w.U16(q.roce_sport_path);
    w.Bytes(q.mac_tx.key.data(), q.mac_tx.key.size());
    w.U64(q.mac_tx.next);
    w.Bytes(q.mac_rx.data(), q.mac_rx.size());
    w.U8(q.mac_rx_seen.any_);
    w.U64(q.mac_rx_seen.top_);
    for (uint64_t b : q.mac_rx_seen.bits_) w.U64(b);
  }
  // The async events not yet taken that name these objects.
  std::vector<std::pair<AsyncEvent, uint32_t>> events;  // the event, its object's index
  for (const AsyncEvent& e : events_) {
    const void* obj = nullptr;
    if (e.type == AsyncEventType::CQ_ERR) {
      for (Cq* c : o.cqs)
        if (c->cqn() == e.qpn_or_cqn) obj = c;
    } else if (e.type == AsyncEventType::SRQ_LIMIT_REACHED) {
      for (Srq* s : o.srqs)
        if (s->srqn() == e.qpn_or_cqn) obj = s;
    } else {
      for (Qp* q : o.qps)
        if (q->qpn() == e.qpn_or_cqn) obj = q;
    }
    if (obj) events.push_back({e, e.type == AsyncEventType::CQ_ERR || e.type == AsyncEventType::SRQ_LIMIT_REACHED
                                       ? at(obj)
                                       : e.qpn_or_cqn});
  }
  w.U32(uint32_t(events.size()));
  for (auto& [e, obj] : events) {
    w.U8(uint8_t(e.type));
    w.U32(obj);
  }
  *out = std::move(w.bytes());
  return 0;
}

// ------------------------------------------------------------------- restore

int EngineCore::restore(const uint8_t* data, size_t len, const Engine::RestoreMem& restore_mem, uint64_t qp_owner,
                        EngineObjects* out, std::string* err, size_t max_bytes) {
  StateReader r(data, len);
  const uint64_t now = clock_.now_ns();
  auto bad = [&](const std::string& what) {
    *err = "engine state: " + what + " (at byte " + std::to_string(r.offset()) + " of " + std::to_string(len) + ")";
    return EPROTO;
  };
  // The memory the objects will hold, counted before each is made: a few
  // bytes of state can ask for a CQ or a QP of the largest size.
  size_t used = 0;
  auto fits = [&](size_t bytes) {
    if (bytes > max_bytes - used) return false;
    used += bytes;
    return true;
  };
  auto too_big = [&] {
    *err = "the objects would hold more than the " + std::to_string(max_bytes) + " bytes of memory left here";
    return ENOMEM;
  };
  uint64_t magic = 0;
  uint32_t version = 0, window = 0, paths = 0, mtu = 0, n = 0;
  bool integrity = false;
  if (!r.U64(&magic) || magic != kMagic) return bad("not an engine state");
  if (!r.U32(&version) || version != kVersion) return bad("version " + std::to_string(version));
  r.U32(&window), r.U32(&paths), r.U32(&mtu), r.Bool(&integrity);
  if (!r.ok()) return bad("header");
  if (window != cfg_.window_pkts || paths != cfg_.num_paths || mtu != cfg_.mtu || integrity != cfg_.integrity) {
    *err = "the engine here has another shape (window " + std::to_string(cfg_.window_pkts) + " against " +
           std::to_string(window) + ", paths " + std::to_string(cfg_.num_paths) + " against " +
           std::to_string(paths) + ", MTU, integrity)";
    return EINVAL;
  }

  // Everything is made aside first and moved in only once all of it checks.
  std::vector<std::unique_ptr<Pd>> pds;
  std::vector<std::unique_ptr<Cq>> cqs;
  std::vector<std::unique_ptr<SrqImpl>> srqs;
  std::vector<std::unique_ptr<Mr>> mrs;
  std::vector<std::unique_ptr<Mw>> mws;
  std::vector<std::unique_ptr<QpImpl>> qps;
  uint32_t handle = next_handle_, srqn = next_srqn_;
  auto next = [&](uint32_t& counter) {
    const uint32_t v = counter;
    counter += cfg_.qpn_shards;
    return v;
  };

  if (!r.Count(&n, kMaxObjects)) return bad("PDs");
  for (uint32_t i = 0; i < n; i++) pds.push_back(std::make_unique<Pd>(next(handle)));
  auto pd_at = [&](uint32_t i) -> Pd* { return i < pds.size() ? pds[i].get() : nullptr; };

  if (!r.Count(&n, kMaxObjects)) return bad("CQs");
  for (uint32_t i = 0; i < n; i++) {
    uint32_t cap = 0, count = 0;
    if (!r.U32(&cap) || cap < 1 || cap > DeviceLimits::kMaxCqe || !r.Count(&count, cap)) return bad("CQ");
    if (!fits(sizeof(Cq) + size_t(cap) * sizeof(Wc))) return too_big();
    auto c = std::make_unique<Cq>(next(handle), cap);
    for (uint32_t k = 0; k < count; k++)
      if (!get_wc(r, &c->ring_[k])) return bad("CQ completion");
    c->tail_ = count;
    if (!r.Bool(&c->overflow_)) return bad("CQ");
    cqs.push_back(std::move(c));
  }
  auto cq_at = [&](uint32_t i) -> Cq* { return i < cqs.size() ? cqs[i].get() : nullptr; };

  if (!r.Count(&n, kMaxObjects)) return bad("SRQs");
  for (uint32_t i = 0; i < n; i++) {
    auto s = std::make_unique<SrqImpl>();
    uint32_t pd = 0, posted = 0;
    r.U32(&pd), r.U32(&s->max_wr_), r.U32(&s->max_sge_), r.U32(&s->limit_);
    s->pd_ = pd_at(pd);
    if (!r.ok() || !s->pd_ || s->max_wr_ < 1 || s->max_wr_ > DeviceLimits::kMaxQpWr ||
        s->max_sge_ > DeviceLimits::kMaxSge || s->limit_ >= s->max_wr_ || !r.Count(&posted, s->max_wr_))
      return bad("SRQ");
    if (!fits(sizeof(SrqImpl) + size_t(s->max_wr_) * sizeof(RecvWqe))) return too_big();
    s->srqn_ = next(srqn);
    s->ring.resize(s->max_wr_);
    for (uint32_t k = 0; k < posted; k++)
      if (!get_recv(r, &s->ring[k])) return bad("SRQ WQE");
    s->tail = posted;
    srqs.push_back(std::move(s));
  }
  auto srq_at = [&](uint32_t i) -> SrqImpl* { return i < srqs.size() ? srqs[i].get() : nullptr; };

  if (!r.Count(&n, kMaxObjects)) return bad("MRs");
  for (uint32_t i = 0; i < n; i++) {
    uint32_t pd = 0, key = 0;
    r.U32(&pd);
    Pd* p = pd_at(pd);
    if (!p) return bad("MR's PD");
    if (!fits(sizeof(Mr))) return too_big();  // (its translator is the owner's to count)
    auto m = std::make_unique<Mr>(p, 0, 0);
    r.U64(&m->iova_), r.U64(&m->length_), r.U32(&m->access_), r.U32(&key);
    m->key_ = key;
    get_enum(r, &m->state_, valid_mr_state);
    r.Bool(&m->fast_reg_);
    r.U32(&m->max_pages_);
    r.U32(&m->bound_windows_);
    if (!r.ok() || (m->access_ & ~uint32_t(ACCESS_MR_SUPPORTED)) || !get_mem(r, &m->mem_, restore_mem))
      return bad("MR");
    if (m->state_ == MrState::VALID && !m->mem_) return bad("a valid MR without a translation");
    const uint32_t index = key >> 8;
    if (mrs_.count(index) || mws_.count(index) || lent_keys_.count(index)) {
      *err = "key " + std::to_string(key) + " is in use here";
      return EEXIST;
    }
    if (!own_shard(index)) return bad("a key of another worker's shard (a destination with --threads > 1)");
    mrs.push_back(std::move(m));
  }
  auto mr_at = [&](uint32_t i) -> Mr* { return i < mrs.size() ? mrs[i].get() : nullptr; };

  if (!r.Count(&n, kMaxObjects)) return bad("windows");
  for (uint32_t i = 0; i < n; i++) {
    uint32_t pd = 0, rkey = 0, mr = 0;
    uint8_t type = 0;
    r.U32(&pd), r.U8(&type), r.U32(&rkey);
    Pd* p = pd_at(pd);
    if (!r.ok() || !p || (type != 1 && type != 2)) return bad("window");
    if (!fits(sizeof(Mw))) return too_big();
    auto m = std::make_unique<Mw>(p, type, rkey);
    get_enum(r, &m->state_, valid_mr_state);
    r.U32(&mr);
    m->mr_ = mr == kNone ? nullptr : mr_at(mr);
    r.U64(&m->addr_), r.U64(&m->length_), r.U32(&m->access_), r.U32(&m->qpn_);
    if (!r.ok() || (mr != kNone && !m->mr_)) return bad("window");
    const uint32_t index = rkey >> 8;
    if (mrs_.count(index) || mws_.count(index) || lent_keys_.count(index)) {
      *err = "key " + std::to_string(rkey) + " is in use here";
      return EEXIST;
    }
    if (!own_shard(index)) return bad("a key of another worker's shard (a destination with --threads > 1)");
    mws.push_back(std::move(m));
  }
  // Keys are unique within the state too.
  {
    std::vector<uint32_t> idx;
    for (auto& m : mrs) idx.push_back(m->key_ >> 8);
    for (auto& m : mws) idx.push_back(m->rkey_ >> 8);
    std::sort(idx.begin(), idx.end());
    if (std::adjacent_find(idx.begin(), idx.end()) != idx.end()) return bad("a key twice");
  }
  // An MR counts the windows bound to it (it cannot go while they are).
  {
    std::map<const Mr*, uint32_t> bound;
    for (auto& w : mws)
      if (w->mr_) bound[w->mr_]++;
    for (auto& m : mrs)
      if (m->bound_windows_ != (bound.count(m.get()) ? bound[m.get()] : 0)) return bad("MR's windows");
  }

  if (!r.Count(&n, kMaxObjects)) return bad("QPs");
  const uint32_t nqps = n;  // n counts the lists inside each QP below
  // A QP's segment size is the engine's MTU, a path MTU of at most 4096
  // (RoCE v2 peers), or 4096 before RTR; a WQE's and a packet's follow it.
  const uint32_t max_seg = std::max<uint32_t>(cfg_.mtu, 4096);
  for (uint32_t i = 0; i < nqps; i++) {
    auto qp = std::make_unique<QpImpl>();
    QpImpl& q = *qp;
    uint32_t pd = 0, scq = 0, rcq = 0, srq = 0;
    r.U32(&q.qpn_);
    get_enum(r, &q.state_, valid_qp_state);
    get_enum(r, &q.type_, valid_qp_type);
    r.U32(&pd), r.U32(&scq), r.U32(&rcq), r.U32(&srq);
    q.pd_ = pd_at(pd);
    q.send_cq = cq_at(scq);
    q.recv_cq = cq_at(rcq);
    q.srq = srq == kNone ? nullptr : srq_at(srq);
    if (!r.ok() || !q.pd_ || !q.send_cq || !q.recv_cq || (srq != kNone && !q.srq)) return bad("QP's objects");
    if (q.srq && (q.srq->pd() != q.pd_ || q.type_ == QpType::GSI)) return bad("QP's SRQ");
    if (q.qpn_ < DeviceLimits::kFirstQpn || q.qpn_ > cfg_.max_qpn) return bad("QPN");
    // A QPN in quarantine here (a QP that lived here and left, by
    // migration) may come back: it is the same QP, with the same peer.
    if (qps_.count(q.qpn_) || lent_qpns_.count(q.qpn_)) {
      *err = "QPN " + std::to_string(q.qpn_) + " is in use here";
      return EEXIST;
    }
    if (!own_shard(q.qpn_)) return bad("a QPN of another worker's shard (a destination with --threads > 1)");
    QpCap& c = q.init.cap;
    r.U32(&c.max_send_wr), r.U32(&c.max_recv_wr), r.U32(&c.max_send_sge), r.U32(&c.max_recv_sge);
    r.U32(&c.max_inline_data);
    r.Bool(&q.init.sq_sig_all);
    if (!r.ok() || c.max_send_wr < 1 || c.max_send_wr > DeviceLimits::kMaxQpWr ||
        (!q.srq && (c.max_recv_wr < 1 || c.max_recv_wr > DeviceLimits::kMaxQpWr)) ||
        c.max_send_sge > DeviceLimits::kMaxSge || (!q.srq && c.max_recv_sge > DeviceLimits::kMaxSge) ||
        c.max_inline_data > DeviceLimits::kMaxInline)
      return bad("QP capabilities");
    q.init.qp_type = q.type_;
    q.init.send_cq = q.send_cq;
    q.init.recv_cq = q.recv_cq;
    q.init.srq = q.srq;
    q.init.owner = qp_owner;
    QpAttr& a = q.attr;
    get_enum(r, &a.qp_state, valid_qp_state);
    get_enum(r, &a.cur_qp_state, valid_qp_state);
    r.U32(&a.path_mtu), r.U32(&a.qp_access_flags), r.U16(&a.pkey_index), r.U8(&a.port_num);
    get_ep(r, &a.ah), get_ip(r, &a.local);
    r.U32(&a.dest_qp_num), r.U32(&a.qkey), r.U32(&a.rq_psn), r.U32(&a.sq_psn);
    for (uint8_t* v : {&a.max_rd_atomic, &a.max_dest_rd_atomic, &a.min_rnr_timer, &a.timeout, &a.retry_cnt,
                       &a.rnr_retry, &a.sq_draining, &a.en_sqd_async_notify})
      r.U8(v);
    r.U32(&q.seg);
    if (!r.ok() || a.path_mtu < MTU_256 || a.path_mtu > MTU_4096 || a.max_rd_atomic > DeviceLimits::kMaxRdAtomic ||
        a.max_dest_rd_atomic > DeviceLimits::kMaxRdAtomic || a.min_rnr_timer > 31 || a.timeout > 31 ||
        a.retry_cnt > 7 || a.rnr_retry > 7 || q.seg < 256 || q.seg > max_seg)
      return bad("QP attributes");
    const bool rc = q.type_ == QpType::RC;
    if (!fits(qp_footprint(q.init))) return too_big();
    q.sq.resize(c.max_send_wr);
    q.inline_buf.resize(size_t(c.max_send_wr) * c.max_inline_data);
    if (rc) {
      q.recs.resize(cfg_.window_pkts);
      q.rbits.assign(cfg_.window_pkts / 64, 0);
    }
    r.U64(&q.sq_head), r.U64(&q.sq_next), r.U64(&q.sq_tail);
    if (!r.ok() || q.sq_head > q.sq_next || q.sq_next > q.sq_tail || q.sq_tail - q.sq_head > q.sq.size())
      return bad("send queue positions");
    for (uint64_t k = q.sq_head; k < q.sq_tail; k++) {
      SendWqe& s = q.sq_at(k);
      uint64_t hold = 0;
      r.U64(&s.wr_id);
      get_enum(r, &s.op, valid_wr);
      r.U32(&s.flags), r.U32(&s.imm), r.U64(&s.raddr), r.U32(&s.rkey), r.U64(&s.cmp_add), r.U64(&s.swap);
      r.U32(&s.nsge);
      for (Sge& g : s.sge) get_sge(r, &g);
      r.Bool(&s.is_inline), r.U64(&s.len), r.Bool(&s.signaled), r.Bool(&s.started), r.Bool(&s.done);
      get_enum(r, &s.status, valid_wc_status);
      r.U32(&s.first_psn), r.U32(&s.read_fence), r.U32(&s.npkts), r.U32(&s.pkts_sent), r.U32(&s.pkts_done);
      r.U32(&s.seg), r.U32(&s.rsn), r.U8(&s.rnr_left), r.U64(&hold), r.Bool(&s.rd_counted);
      s.rnr_hold_until = hold ? now + std::min<uint64_t>(hold, 1'000'000'000) : 0;
      get_ud(r, &s.ud);
      r.U32(&s.reg.key), r.U64(&s.reg.iova), r.U64(&s.reg.length), r.U32(&s.reg.access);
      if (!r.ok() || !get_mem(r, &s.reg.mem, restore_mem)) return bad("send WQE");
      r.U32(&s.bind.mw_rkey), r.U32(&s.bind.new_rkey), r.U32(&s.bind.mr_lkey), r.U64(&s.bind.addr);
      r.U64(&s.bind.length), r.U32(&s.bind.access), r.U8(&s.bind.mw_type), r.U32(&s.vendor_err), r.U16(&s.path);
      if (!r.ok() || s.nsge > c.max_send_sge || s.pkts_done > s.pkts_sent || s.pkts_sent > s.npkts ||
          (s.is_inline && s.len > c.max_inline_data) || s.path >= cfg_.num_paths || s.len > DeviceLimits::kMaxMsgSize)
        return bad("send WQE");
      // Packets numbered (req_start): the requester sends packet k of the
      // message from offset k * seg, which must lie within it.
      if (s.npkts && (s.seg < 256 || s.seg > max_seg ||
                      s.npkts != (is_atomic(s.op) ? 1 : std::max<uint64_t>(1, (s.len + s.seg - 1) / s.seg))))
        return bad("send WQE's packets");
      // (A QP without inline data has no buffer at all: nothing to read.)
      const size_t slot = size_t(k % q.sq.size()) * c.max_inline_data;
      if (s.is_inline && c.max_inline_data && !r.Bytes(q.inline_buf.data() + slot, c.max_inline_data))
        return bad("inline data");
    }
    r.U32(&q.rd_atomic_outstanding), r.U32(&q.next_rsn);
    {
      // The READs and atomics outstanding are the WQEs that count (they
      // hold back the next ones at max_rd_atomic until they retire).
      uint32_t counted = 0;
      for (uint64_t k = q.sq_head; k < q.sq_tail; k++) counted += q.sq_at(k).rd_counted;
      if (q.rd_atomic_outstanding != counted) return bad("READs and atomics outstanding");
    }
    r.U32(&q.snd_una), r.U32(&q.snd_nxt), r.U32(&q.read_fence), r.U32(&q.cum_seen);
    uint64_t retry = 0, since = 0;
    r.U64(&q.inflight), r.U64(&q.srtt), r.U64(&q.rttvar), r.U64(&retry), r.U64(&since);
    r.Bool(&q.drained_reported);
    get_ep(r, &q.health_peer);
    // A WQE waiting for on-demand pages looks again now; only one that has
    // not started waits (a poll time without it would be due for ever).
    q.fault_retry_ns = retry && q.sq_next != q.sq_tail && !q.sq_at(q.sq_next).started ? now : 0;
    q.fault_since_ns = from_age(now, since);
    uint32_t live = 0;
    if (!r.ok() || q.rd_atomic_outstanding > DeviceLimits::kMaxRdAtomic ||
        !r.Count(&live, rc ? cfg_.window_pkts : 0) || (rc && live != q.snd_nxt - q.snd_una))
      return bad("PSN state");
    // A QP that does not send (ERR) never looks at its packets again (it
    // leaves ERR only through RESET, which forgets them), and the WQEs
    // they name may have been flushed: they are read and dropped.
    const bool sending = sends(q.state_);
    for (uint32_t k = 0; k < live; k++) {
      PktRec& p = q.rec(q.snd_una + k);
      uint64_t sent = 0, held = 0;
      r.U64(&p.wqe), r.U32(&p.off), r.U32(&p.len), r.U32(&p.tx_seq), r.U16(&p.path), r.U8(&p.retries);
      uint8_t kind = 0;
      r.U8(&kind);
      p.kind = PktKind(kind);
      r.Bool(&p.acked), r.Bool(&p.lost), r.U16(&p.run), r.U16(&p.prev_path), r.U64(&sent), r.U64(&held);
      p.sent_ns = from_age(now, sent);
      p.held_ns = from_age(now, held);
      // In no path's list (QpImpl::path_order): the state does not keep the
      // order in which they left, so their losses are left to the timer.
      p.on_path = false;
      if (!r.ok() || kind > uint8_t(PktKind::ATOMIC) || p.path >= cfg_.num_paths || p.prev_path >= cfg_.num_paths)
        return bad("packet record");
      if (!sending) continue;
      // The packet is the one req_progress made for its WQE: a resend
      // rebuilds it from the WQE at this offset.
      if (p.wqe < q.sq_head || p.wqe >= q.sq_tail) return bad("packet record's WQE");
      const SendWqe& w = q.sq_at(p.wqe);
      const uint32_t d = q.snd_una + k - w.first_psn;
      const uint64_t off = uint64_t(d) * w.seg;
      if (d >= w.pkts_sent || p.kind != kind_of(w.op) || is_local_op(w.op) || p.off != off ||
          p.len != (p.kind == PktKind::ATOMIC ? 8 : std::min<uint64_t>(w.seg, w.len - off)))
        return bad("packet record");
    }
    if (rc && !sending) q.snd_una = q.snd_nxt;
    // Each WQE counts the answers its packets got (those before snd_una,
    // and the records answered), and is done exactly when all are in:
    // otherwise it would complete without an answer, or wait for ever for
    // one already given.
    if (sending && rc) {
      std::vector<uint32_t> answered(q.sq_tail - q.sq_head);
      for (uint32_t psn = q.snd_una; psn != q.snd_nxt; psn++)
        if (q.rec(psn).acked) answered[q.rec(psn).wqe - q.sq_head]++;
      for (uint64_t k = q.sq_head; k < q.sq_tail; k++) {
        const SendWqe& w = q.sq_at(k);
        if (!w.npkts) continue;
        if (q.snd_nxt - w.first_psn < w.pkts_sent) return bad("send WQE's PSNs");
        const uint32_t before = q.snd_una - w.first_psn <= q.snd_nxt - w.first_psn
                                    ? std::min(w.pkts_sent, q.snd_una - w.first_psn)
                                    : 0;
        const uint32_t got = before + answered[k - q.sq_head];
        if (w.pkts_done != got || w.done != (got == w.npkts)) return bad("send WQE's answers");
      }
    }
    if (!r.Count(&n, rc ? cfg_.window_pkts : 0)) return bad("resend queue");
    // The PSNs in flight (an RC QP that sends; at most window_pkts, as
    // `live` was); UC counts PSNs without a window.
    const uint32_t flying = rc ? q.snd_nxt - q.snd_una : 0;
    std::vector<bool> queued(flying);
    for (uint32_t k = 0; k < n; k++) {
      uint32_t psn = 0;
      if (!r.U32(&psn)) return bad("resend queue");
      // Entries behind the window are stale (answered before their resend
      // went; req_resend skips them): they stay behind.
      if (psn - q.snd_una < flying) {
        q.resend.push_back(psn);
        queued[psn - q.snd_una] = true;
      }
    }
    // In flight: what the records say (not the count saved). A lost
    // packet waits in the resend queue, without a timer (its resend arms
    // one); the others' timers are due now: they went to the old host's
    // network, and their answers, if any, to the old host.
    q.inflight = 0;
    for (uint32_t k = 0; k < flying; k++) {
      const uint32_t psn = q.snd_una + k;
      const PktRec& p = q.rec(psn);
      if (p.acked) continue;
      if (!p.lost) {
        q.inflight += p.len;
        q.timers.push(RetxTimer{now, psn, p.tx_seq, false});
      } else if (!queued[k]) {
        q.resend.push_back(psn);
      }
    }
    if (!r.Count(&n, QpImpl::kMaxReadReruns)) return bad("READ reruns");
    for (uint32_t k = 0; k < n; k++) {
      QpImpl::ReadRerun rr{};
      uint64_t sent = 0;
      r.U32(&rr.psn), r.U32(&rr.n), r.U16(&rr.path), r.U64(&sent);
      rr.sent_ns = from_age(now, sent);
      if (!r.ok() || rr.path >= cfg_.num_paths || rr.n > cfg_.window_pkts) return bad("READ rerun");
      q.read_reruns.push_back(rr);
    }
    r.U64(&q.rq_head), r.U64(&q.rq_tail);
    if (!r.ok() || q.rq_head > q.rq_tail || q.rq_tail - q.rq_head > DeviceLimits::kMaxQpWr) return bad("receive queue");
    // On an SRQ, the QP holds what it took, and the SRQ may have been made
    // smaller since (resize_srq).
    if (q.srq && q.rq_tail - q.rq_head > q.srq->max_wr() &&
        !fits((q.rq_tail - q.rq_head - q.srq->max_wr()) * sizeof(RecvWqe)))
      return too_big();
    q.rq.resize(q.srq ? std::max<uint64_t>(q.srq->max_wr(), q.rq_tail - q.rq_head) : c.max_recv_wr);
    if (q.rq_tail - q.rq_head > q.rq.size()) return bad("receive queue");
    for (uint64_t k = q.rq_head; k < q.rq_tail; k++)
      if (!get_recv(r, &q.rq_at(k))) return bad("receive WQE");
    r.U32(&q.epsn);
    if (!r.Count(&n, uint32_t(q.rbits.size())) || n != q.rbits.size()) return bad("arrival bitmap");
    for (uint64_t& b : q.rbits) r.U64(&b);
    if (!r.Count(&n, uint32_t(kMaxPendingReads))) return bad("held requests");
    for (uint32_t k = 0; k < n; k++) {
      uint32_t hl = 0, held = 0;
      uint8_t hdr[wire::kMaxHeaderLen];
      wire::Packet p;
      if (!r.Count(&hl, wire::kMaxHeaderLen) || !r.Bytes(hdr, hl) || !r.U32(&held) ||
          wire::parse_header(hdr, hl, p) != wire::ParseError::OK ||
          (p.base.op != wire::Op::READ_REQ && p.base.op != wire::Op::CMP_SWAP && p.base.op != wire::Op::FETCH_ADD))
        return bad("held request");
      p.held_since_us = held;
      q.pending_rd.push_back(p);
    }
    for (auto& ar : q.atomic_replay) r.U32(&ar.psn), r.U64(&ar.orig), r.Bool(&ar.valid);
    r.U32(&n);
    q.atomic_replay_next = n % 32;
    if (!r.Count(&n, cfg_.window_pkts)) return bad("READs done");
    for (uint32_t k = 0; k < n; k++) {
      QpImpl::ReadDone d{};
      r.U32(&d.psn), r.U32(&d.npsn), r.U64(&d.va), r.U32(&d.rkey), r.U32(&d.len), r.U32(&d.msg_off), r.U16(&d.seg);
      if (!r.ok() || d.seg == 0) return bad("READ done");  // the peer's segment size: any but 0 (resp_read)
      q.reads_done.push_back(d);
    }
    uint64_t ack_age = 0;
    r.Bool(&q.ack_pending), r.U64(&ack_age), r.U32(&q.ack_lo), r.U32(&q.ack_hi), r.U32(&q.rx_since_ack);
    r.U32(&q.ce_since_ack), r.U32(&q.last_ts), r.U16(&q.last_path);
    q.last_ack_ns = from_age(now, ack_age);
    r.Bool(&q.uc_in_msg);
    get_enum(r, &q.uc_op, valid_op);
    r.U32(&q.uc_len), r.U64(&q.uc_va), r.U32(&q.uc_rkey);
    if (!r.Count(&n, 256)) return bad("GSI GIDs");
    q.local_gids.resize(n);
    for (Gid& g : q.local_gids) r.Bytes(g.data(), 16);
    r.U32(&q.ud_next_path);
    r.Bool(&q.roce), r.Bool(&q.roce_nak_sent), r.Bool(&q.roce_in_msg);
    get_enum(r, &q.roce_op, valid_op);
    r.U64(&q.roce_va), r.U32(&q.roce_rkey), r.U32(&q.roce_len), r.U32(&q.roce_off), r.U32(&q.roce_msn);
    r.U16(&q.roce_sport_path);
    r.Bytes(q.mac_tx.key.data(), q.mac_tx.key.size());
    r.U64(&q.mac_tx.next);
    r.Bytes(q.mac_rx.data(), q.mac_rx.size());
    r.Bool(&q.mac_rx_seen.any_);
    r.U64(&q.mac_rx_seen.top_);
    for (uint64_t& b : q.mac_rx_seen.bits_) r.U64(&b);
    if (!r.ok() || q.last_path >= cfg_.num_paths || q.roce_sport_path >= cfg_.num_paths ||
        (!rc && (q.roce || !q.pending_rd.empty())))
      return bad("QP " + std::to_string(q.qpn_));
    // Afresh: the paths and the window of the old host, and the clocks.
    const bool connected = q.state_ == QpState::RTR || q.state_ == QpState::RTS || q.state_ == QpState::SQD ||
                           (q.state_ == QpState::ERR && a.dest_qp_num);
    if (connected && q.roce) {
      q.paths = PathSelector(PathAlgo::SINGLE, 1, 0, 0, 1);
    } else if (connected) {
      q.paths = PathSelector(cfg_.path_algo, cfg_.num_paths,
                             cfg_.seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(q.qpn_) << 17), cfg_.single_path,
                             cfg_.path_burst);
      q.paths.set_probe_hold(4 * cfg_.rto_ns);
    }
    if (q.state_ == QpState::RTS || q.state_ == QpState::SQD) q.cc.reset(cfg_.cc, q.seg);
    q.backoff = 0;
    q.last_progress_ns = q.last_post_ns = now;
    qps.push_back(std::move(qp));
  }
  std::vector<uint32_t> qpns;  // sorted: events name QPs by number
  for (auto& q : qps) qpns.push_back(q->qpn_);
  std::sort(qpns.begin(), qpns.end());
  if (std::adjacent_find(qpns.begin(), qpns.end()) != qpns.end()) return bad("a QPN twice");

  std::vector<AsyncEvent> events;
  if (!r.Count(&n, kMaxObjects)) return bad("events");
  for (uint32_t i = 0; i < n; i++) {
    AsyncEvent e{};
    uint32_t obj = 0;
    if (!get_enum(r, &e.type, valid_event) || !r.U32(&obj)) return bad("event");
    if (e.type == AsyncEventType::CQ_ERR) {
      if (!cq_at(obj)) return bad("event");
      e.qpn_or_cqn = cq_at(obj)->cqn();
    } else if (e.type == AsyncEventType::SRQ_LIMIT_REACHED) {
      if (!srq_at(obj)) return bad("event");
      e.qpn_or_cqn = srq_at(obj)->srqn();
    } else {
      if (!std::binary_search(qpns.begin(), qpns.end(), obj)) return bad("event");
      e.qpn_or_cqn = obj;
    }
    events.push_back(e);
  }
  if (!r.done()) return bad("trailing bytes");

  // It all checks: references counted, then in.
  for (auto& m : mrs) m->pd_->refs++;
  for (auto& m : mws) m->pd_->refs++;
  for (auto& s : srqs) s->pd_->refs++;
  for (auto& q : qps) {
    q->pd_->refs++;
    q->send_cq->refs++;
    q->recv_cq->refs++;
    if (q->srq) q->srq->refs++;
  }
  next_handle_ = handle;
  next_srqn_ = srqn;
  *out = EngineObjects{};
  for (auto& p : pds) {
    out->pds.push_back(p.get());
    pds_.push_back(std::move(p));
  }
  for (auto& c : cqs) {
    out->cqs.push_back(c.get());
    cqs_.push_back(std::move(c));
  }
  for (auto& s : srqs) {
    out->srqs.push_back(s.get());
    srqs_.push_back(std::move(s));
  }
  for (auto& m : mrs) {
    out->mrs.push_back(m.get());
    const uint32_t index = m->key_ >> 8;
    mrs_[index] = std::move(m);
  }
  for (auto& m : mws) {
    out->mws.push_back(m.get());
    const uint32_t index = m->rkey_ >> 8;
    mws_[index] = std::move(m);
  }
  for (auto& q : qps) {
    QpImpl* qp = q.get();
    quarantined_qpns_.erase(qp->qpn_);
    out->qps.push_back(qp);
    qps_[qp->qpn_] = std::move(q);
    qp_list_.push_back(qp);
    activate(*qp);
    if (qp->ack_pending) ack_list_.push_back(qp);
  }
  events_.insert(events_.end(), events.begin(), events.end());
  return 0;
}

// ------------------------------------------------------------ peer notices

void EngineCore::notify_peer(QpImpl& qp, wire::Syndrome what) {
  wire::AckExt a;
  a.cum_psn = qp.epsn;
  a.syndrome = what;
  wire::Base b;
  b.op = wire::Op::ACK;
  b.dst_qpn = qp.attr.dest_qp_num;
  b.src_qpn = qp.qpn_;
  b.psn = qp.epsn;
  b.ts = now_us();
  uint8_t hdr[wire::kMaxHeaderLen];
  (what == wire::Syndrome::PAUSED ? stats_.paused_sent : stats_.resumed_sent)++;
  // A datagram may be lost: three, over different paths.
  for (uint16_t k = 0; k < 3; k++) {
    b.path = uint16_t((qp.last_path + k * (cfg_.num_paths / 3 + 1)) % cfg_.num_paths);
    const size_t hl = wire::encode(b, a, hdr);
    xmit(qp, b.path, hdr, hl, nullptr, 0, 0, false);
  }
}

void Engine::notify_peers(const EngineObjects& objs, bool resumed) {
  for (Qp* q0 : objs.qps) {
    QpImpl& q = impl(*q0);
    const bool connected = q.state_ == QpState::RTR || q.state_ == QpState::RTS || q.state_ == QpState::SQD;
    if (q.type_ == QpType::RC && connected && !q.roce)
      core_->notify_peer(q, resumed ? wire::Syndrome::RESUMED : wire::Syndrome::PAUSED);
  }
}

// A notice from the peer about itself. PAUSED holds the retry clock (see
// retry_exceeded). RESUMED: the peer runs again, perhaps on another host,
// and has not seen what was sent during the pause: everything outstanding
// is due now, from a fresh start of the backoff, the retry clock and the
// path choice (the paths to a new host are others).
void EngineCore::comp_peer_notice(QpImpl& qp, wire::Syndrome what, uint64_t now) {
  if (qp.state_ == QpState::RESET || qp.state_ == QpState::INIT) {
    stats_.bad_state++;
    return;
  }
  stats_.peer_notices_rcvd++;
  if (what == wire::Syndrome::PAUSED) {
    if (!qp.peer_paused_ns) qp.peer_paused_ns = now;
    return;
  }
  qp.peer_paused_ns = 0;
  qp.last_progress_ns = now;
  qp.backoff = 0;
  if (qp.type_ == QpType::RC && !qp.roce) {
    qp.paths = PathSelector(cfg_.path_algo, cfg_.num_paths,
                            cfg_.seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(qp.qpn_) << 17), cfg_.single_path,
                            cfg_.path_burst);
    qp.paths.set_probe_hold(4 * cfg_.rto_ns);
  }
  if (!qp.recs.empty() && sends(qp.state_))
    for (uint32_t psn = qp.snd_una; seq_lt(psn, qp.snd_nxt); psn++) {
      const PktRec& r = qp.rec(psn);
      if (!r.acked && !r.lost) qp.timers.push(RetxTimer{now, psn, r.tx_seq, false});
    }
  activate(qp);
}

int Engine::save(const EngineObjects& objs, const SaveMem& save_mem, std::vector<uint8_t>* out) {
  return core_->save(objs, save_mem, out);
}

int Engine::restore(const uint8_t* data, size_t len, const RestoreMem& restore_mem, uint64_t qp_owner,
                    EngineObjects* out, std::string* err, size_t max_bytes) {
  return core_->restore(data, len, restore_mem, qp_owner, out, err, max_bytes);
}

}  // namespace vstellar
