// Live migration of one device (docs/virtio-vstellar.md, "Live
// migration"): what happens to it when QEMU stops and starts its rings, and
// its whole state out of this daemon and into another.
//
// Stop and start. With RESET_DEVICE and DEVICE_STATE negotiated
// (Session::stop_is_not_reset), the frontend resets the device with
// RESET_DEVICE, so GET_VRING_BASE of the control queue is only a stop (a VM paused, or at the stop-and-copy point of a migration): the
// device freezes. Its engine objects leave the engine (Engine::detach) and
// wait in frozen_: no packet is sent, none is taken (the engine drops
// packets for QPNs it does not have, unanswered, so the peer resends them
// later, to wherever the QP then is), no timer fires, and nothing more is
// written to guest memory, whose last copy QEMU takes after the stop. The
// next SET_VRING_KICK of the control queue thaws it where it stopped.
//
// The state. SET_DEVICE_STATE_FD(SAVE) on a frozen device serialises its
// tables and its engine objects (Engine::save) and sends them through the
// frontend's pipe; the device stays frozen, and goes away with the
// connection once QEMU is done (or thaws, if the migration failed and the
// guest runs on here). SET_DEVICE_STATE_FD(LOAD) on a device that has no
// objects yet reads the state, and CHECK_DEVICE_STATE takes it: every
// field is checked first (it comes from another host), then the engine
// objects are restored (Engine::restore, same QPNs and keys), and the
// device is frozen until the guest's rings start here. MRs come back
// without their translation: each builds it on first use (PVDMA pins
// lazily here too, eMTT entries are rebuilt from the migrated page lists);
// on-demand MRs come back with nothing mapped (the guest's driver maps
// pages again when they fault). UD QPs in multicast groups leave them at
// the stop (the membership is the engine's link's, on this host) and join
// them again where the device starts: the destination joins them once
// already as it loads the state, and refuses it if it cannot.
#include <endian.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include <vstellar/ip_text.h>

#include "vstellard/device.h"
#include <vstellar/state_stream.h>
#include "vstellard/translate.h"

namespace vstellard {

using vstellar::StateReader;
using vstellar::StateWriter;

namespace {

constexpr uint64_t kMagic = 0x3154534c54535456ull;  // "VSTSLTS1", little-endian
constexpr uint32_t kVersion = 2;  // 2: multicast memberships (after the QPs)
// What a load takes at most: far above any device (the engine's part is a
// few KiB per QP), far below what would hurt the daemon.
constexpr size_t kMaxState = size_t{256} << 20;
constexpr uint32_t kNone = UINT32_MAX;
// Bounds of the counts in the state, whatever the config says.
constexpr uint32_t kMaxObjects = 1u << 20;
constexpr uint32_t kMaxPages = 1u << 24;

// How an engine MR translates, so the destination can build its
// translator again.
enum MemKind : uint8_t {
  kMemNone = 0,    // none now (a FREE or INVALID MR)
  kMemLayout = 1,  // eMTT or ATC over a page list
  kMemOdp = 2,     // on demand: the guest maps its pages
  kMemGpa = 3,     // the kernel's local DMA lkey: guest-physical as is
};

void LogMigration(unsigned id, const std::string& what) {
  std::fprintf(stderr, "vstellard: device %u: migration: %s\n", id, what.c_str());
}

// Microseconds since t, as text.
std::string MicrosecondsSince(std::chrono::steady_clock::time_point t) {
  using namespace std::chrono;
  return std::to_string(duration_cast<microseconds>(steady_clock::now() - t).count());
}

void PutGeom(StateWriter& w, const RingGeom& g) {
  w.U64s(g.pages);
  w.U32(g.shift);
  w.U64(g.offset);
  w.U32(g.log_n);
  w.U32(g.log_stride);
}

bool GetGeom(StateReader& r, RingGeom* g) {
  r.U64s(&g->pages, kMaxPages);
  r.U32(&g->shift);
  r.U64(&g->offset);
  r.U32(&g->log_n);
  r.U32(&g->log_stride);
  return r.ok() && g->shift >= 12 && g->shift < 64 && g->log_n < 32 && g->log_stride < 16;
}

// The config fields the frontend owns or that name this host (status,
// epoch, queues and doorbells, the node GUID, which the device takes from
// the state) may differ; every other must be the same on both sides, or
// the guest's driver would run against limits it never read.
bool SameDevice(virtio_vstellar_config a, virtio_vstellar_config b, std::string* why) {
  for (auto* c : {&a, &b}) {
    c->device_status = c->epoch = c->num_cq_queues = 0;
    std::memset(c->node_guid, 0, sizeof(c->node_guid));
    c->db_page_count = c->db_page_size = c->db_region_id = 0;
  }
  const auto* pa = reinterpret_cast<const uint8_t*>(&a);
  const auto* pb = reinterpret_cast<const uint8_t*>(&b);
  for (size_t i = 0; i < sizeof(a); i++) {
    if (pa[i] != pb[i]) {
      *why = "the device here differs from the source's in its config space at byte " + std::to_string(i) +
             " (start both daemons with the same device options)";
      return false;
    }
  }
  return true;
}

// What a translator is, so the destination can build it again (the
// engine's save_mem / restore_mem): its kind, and for eMTT and ATC its
// layout in guest memory.
bool SaveTranslator(vstellar::MemoryTranslator& t, std::vector<uint8_t>* out) {
  StateWriter w;
  const MrLayout* l = nullptr;
  MrLayout atc_layout;
  if (auto* e = dynamic_cast<EmttTranslator*>(&t)) l = &e->layout();
  else if (auto* r = dynamic_cast<RestoredTranslator*>(&t)) l = &r->layout();
  else if (auto* a = dynamic_cast<AtcTranslator*>(&t)) l = &(atc_layout = a->layout());
  if (l) {
    w.U8(kMemLayout);
    w.U64(l->iova);
    w.U64(l->length);
    w.U32(l->page_shift);
    w.U64s(l->pages);
  } else if (auto* o = dynamic_cast<OdpTranslator*>(&t)) {
    w.U8(kMemOdp);
    w.U64(o->iova());
    w.U64(o->length());
  } else if (dynamic_cast<GpaTranslator*>(&t)) {
    w.U8(kMemGpa);
  } else {
    return false;
  }
  *out = std::move(w.bytes());
  return true;
}

}  // namespace

// ------------------------------------------------------------ stop and start

void Device::Freeze(bool tell_peers) {
  if (frozen_) return;
  stopped_at_ = std::chrono::steady_clock::now();
  pvdma_.dirty_log()->Flush();  // every write so far is done: QEMU takes the log next
  frozen_ = true;
  call_after_stop_.assign(qs_.size(), true);
  freeze_error_.clear();
  dp_.Stop();
  dp_.CheckCqRings("at the stop");
  if (!sh_->engine) return;
  vstellar::EngineObjects objs = EngineObjects();
  if (objs.pds.empty() && objs.cqs.empty()) return;
  // Its peers hold their retry clocks until it runs again (here or at a
  // migration's destination).
  if (tell_peers) sh_->engine->notify_peers(objs, /*resumed=*/false);
  LeaveGroups();
  if (int e = sh_->engine->detach(objs, &frozen_objs_)) {
    // It runs on while the VM is stopped (and cannot migrate).
    freeze_error_ = std::string("detach: ") + std::strerror(e);
    LogMigration(id_, "cannot stop the device's objects: " + freeze_error_);
    std::string err;
    if (!JoinGroups(&err)) LogMigration(id_, err);
  }
}

void Device::LeaveGroups() {
  for (const auto& [mgid, qpns] : obj_.mcast)
    for (uint32_t qpn : qpns)
      if (auto q = obj_.qps.find(qpn); q != obj_.qps.end()) sh_->engine->detach_mcast(q->second.qp, mgid);
}

// Joins each QP of `groups` (found by qp_of: null if there is no such QP)
// to its groups in the engine, listing in *joined what it joined. 0, or
// the first error with why: EINVAL (no such UD QP, not a group), ENOSPC
// (the engine's groups or a group's slots are full here: shared by every
// device of the worker), EIO (the link could not join the IP group).
int Device::JoinGroups(const McastGroups& groups, const std::function<vstellar::Qp*(uint32_t)>& qp_of,
                       std::vector<std::pair<vstellar::Qp*, vstellar::Gid>>* joined, std::string* err) {
  for (const auto& [mgid, qpns] : groups) {
    for (uint32_t qpn : qpns) {
      vstellar::Qp* qp = qp_of(qpn);
      if (const int e = qp ? sh_->engine->attach_mcast(qp, mgid) : EINVAL) {
        *err = "QP " + std::to_string(qpn) + " cannot join multicast group " +
               vstellar::to_string(vstellar::IpAddr::from_bytes(mgid.data())) + ": " + std::strerror(e);
        return e;
      }
      if (joined) joined->emplace_back(qp, mgid);
    }
  }
  return 0;
}

// The device's own memberships, joined again where it starts; false (with
// why) if one could not be (those joined stay).
bool Device::JoinGroups(std::string* err) {
  auto qp_of = [this](uint32_t qpn) -> vstellar::Qp* {
    auto q = obj_.qps.find(qpn);
    return q != obj_.qps.end() ? q->second.qp : nullptr;
  };
  return JoinGroups(obj_.mcast, qp_of, nullptr, err) == 0;
}

void Device::Thaw() {
  if (!frozen_) return;
  frozen_ = false;
  if (frozen_objs_) {
    if (int e = sh_->engine->attach(&frozen_objs_)) {
      Fatal(std::string("cannot start the device's objects again: ") + std::strerror(e));
      return;
    }
    frozen_objs_.reset();
    std::string err;
    if (!JoinGroups(&err)) LogMigration(id_, err + " (its QP gets no more datagrams to that group)");
    dp_.CheckCqRings("at the start");
    // Its peers resend what they have outstanding, to wherever it is now.
    sh_->engine->notify_peers(EngineObjects(), /*resumed=*/true);
    // Completions staged in the engine's CQs (a guest ring that was full,
    // or a state loaded here) go to the guest now, not at the next one.
    for (auto& [h, c] : obj_.cqs) dp_.DrainCq(h);
  }
  dp_.OnKick();  // doorbells rung while stopped
}

// --------------------------------------------------------------------- save

bool Device::SaveState(std::vector<uint8_t>* out, std::string* err) {
  if (!frozen_) {
    *err = "the device is running (its rings were not stopped)";
    return false;
  }
  if (!freeze_error_.empty()) {
    *err = "the device could not be stopped: " + freeze_error_;
    return false;
  }
  // The engine saves attached objects: take them back for the moment (no
  // packet or timer runs between these calls, on this one thread).
  if (frozen_objs_ && sh_->engine->attach(&frozen_objs_)) {
    *err = "cannot take the device's objects back";
    return false;
  }
  frozen_objs_.reset();
  const vstellar::EngineObjects objs = EngineObjects();
  std::vector<uint8_t> engine_bytes;
  const int saved =
      objs.pds.empty() && objs.cqs.empty() ? 0 : sh_->engine->save(objs, SaveTranslator, &engine_bytes);
  if (!objs.pds.empty() || !objs.cqs.empty()) {
    if (sh_->engine->detach(objs, &frozen_objs_)) {
      Fatal("cannot stop the device's objects again after saving them");
      *err = "cannot stop the device's objects again";
      return false;
    }
  }
  if (saved) {
    *err = std::string("the engine could not save the device's objects: ") + std::strerror(saved);
    return false;
  }
  std::map<const void*, uint32_t> index;  // engine object -> its index in its list
  auto number = [&](const auto& list) {
    for (uint32_t i = 0; i < list.size(); i++) index[list[i]] = i;
  };
  number(objs.pds);
  number(objs.mrs);
  number(objs.mws);
  number(objs.cqs);
  number(objs.srqs);
  number(objs.qps);
  auto at = [&](const void* p) { return p ? index.at(p) : kNone; };

  StateWriter w;
  w.U64(kMagic);
  w.U32(kVersion);
  w.Bytes(&state_.config(), sizeof(virtio_vstellar_config));
  w.U64(state_.acked_features());
  w.U8(fatal_);
  w.Str(fatal_why_);
  w.U32(obj_.next_handle);
  w.U32(uint32_t(obj_.uctx.size()));
  for (const auto& [h, u] : obj_.uctx) {
    w.U32(h);
    w.U32(u.db_page);
    w.U32(uint32_t(u.slots.size()));
    for (bool s : u.slots) w.U8(s);
  }
  w.U32(uint32_t(obj_.db_pages_used.size()));
  for (bool b : obj_.db_pages_used) w.U8(b);
  w.U32(uint32_t(obj_.gids.size()));
  for (const auto& [i, g] : obj_.gids) {
    w.U32(i);
    w.Bytes(g.data(), 16);
  }
  w.U32(uint32_t(obj_.pds.size()));
  for (const auto& [h, p] : obj_.pds) {
    w.U32(h);
    w.U32(p.owner);
    w.U32(at(p.pd));
    w.U32(at(p.dma_mr));
  }
  w.U32(uint32_t(obj_.mrs.size()));
  for (const auto& [h, m] : obj_.mrs) {
    w.U32(h);
    w.U32(m.owner);
    w.U32(at(m.mr));
    w.U32(m.pdn);
    w.U64(m.charge.bytes());
  }
  w.U32(uint32_t(obj_.mws.size()));
  for (const auto& [h, m] : obj_.mws) {
    w.U32(h);
    w.U32(m.owner);
    w.U32(at(m.mw));
    w.U32(m.pdn);
    w.U64(m.charge.bytes());
  }
  w.U32(uint32_t(obj_.cqs.size()));
  for (const auto& [h, c] : obj_.cqs) {
    w.U32(h);
    w.U32(c.owner);
    w.U32(at(c.cq));
    w.U32(c.cq_queue);
    w.U32(c.slot);
    w.U32(c.log_cqe);
    w.U32(c.page_shift);
    w.U64(c.ring_offset);
    w.U64s(c.pages);
    w.U8(c.armed);
    w.U32(c.pi);
    w.U32(c.last_arm);
    w.U8(c.overflow);
    w.U64(c.charge.bytes());
  }
  w.U32(uint32_t(obj_.srqs.size()));
  for (const auto& [h, s] : obj_.srqs) {
    w.U32(h);
    w.U32(s.owner);
    w.U32(at(s.srq));
    w.U32(s.pdn);
    w.U32(s.slot);
    w.U64(s.charge.bytes());
    PutGeom(w, s.ring);
    w.U32(s.ci);
    w.U32(uint32_t(s.wrid.size()));
    for (const auto& [i, id] : s.wrid) {
      w.U32(i);
      w.U64(id);
    }
    w.U32(s.max_sge);
    w.U8(s.broken);
    w.U8(s.blocked);
  }
  w.U32(uint32_t(obj_.qps.size()));
  for (const auto& [qpn, q] : obj_.qps) {
    w.U32(qpn);
    w.U32(q.owner);
    w.U32(at(q.qp));
    w.U8(q.type);
    w.U32(q.pdn);
    w.U32(q.send_cqn);
    w.U32(q.recv_cqn);
    w.U32(q.slot);
    w.U32(q.srqh);
    PutGeom(w, q.sq);
    PutGeom(w, q.rq);
    w.U32(q.sq_ci);
    w.U32(q.rq_ci);
    w.U64s(q.sq_wrid);
    w.U64s(q.rq_wrid);
    w.U32(uint32_t(q.sq_op.size()));
    w.Bytes(q.sq_op.data(), q.sq_op.size());
    w.U32(q.max_send_sge);
    w.U32(q.max_recv_sge);
    w.U32(q.max_inline);
    w.U64(q.charge.bytes());
    w.U8(q.broken);
    w.U8(q.blocked);
    w.U8(q.error_logged);
  }
  w.U32(uint32_t(events_.size()));
  for (const QueuedEvent& e : events_) {
    w.U32(e.len);
    w.Bytes(&e.e, sizeof(e.e));
  }
  for (const auto& d : cq_notifies_) {
    w.U32(uint32_t(d.size()));
    for (const vstellar_cq_notify& n : d) w.Bytes(&n, sizeof(n));
  }
  w.U32(uint32_t(obj_.mcast.size()));
  for (const auto& [mgid, qpns] : obj_.mcast) {
    w.Bytes(mgid.data(), 16);
    w.U32(uint32_t(qpns.size()));
    for (uint32_t qpn : qpns) w.U32(qpn);
  }
  w.Blob(engine_bytes);
  *out = std::move(w.bytes());
  return true;
}

// --------------------------------------------------------------------- load

namespace {

// The device's records as read from the state, before anything is made.
struct Loaded {
  virtio_vstellar_config config{};
  uint64_t acked = 0;
  bool fatal = false;
  std::string fatal_why;
  uint32_t next_handle = 1;
  std::map<uint32_t, UContext> uctx;
  std::vector<bool> db_pages_used;
  std::map<uint32_t, vstellar::Gid> gids;
  // `charge`: what the source charged. Read and not used: the charges here
  // are counted from the objects made (version 1 carries the field).
  struct Pd { uint32_t h, owner, pd, dma_mr; };
  struct Mr { uint32_t h, owner, mr, pdn; uint64_t charge; };
  struct Mw { uint32_t h, owner, mw, pdn; uint64_t charge; };
  struct Cq { uint32_t h, engine; uint64_t charge; CqObj o; };
  struct Srq { uint32_t h, engine; uint64_t charge; SrqObj o; };
  struct Qp { uint32_t qpn, engine; uint64_t charge; QpObj o; };
  std::vector<Pd> pds;
  std::vector<Mr> mrs;
  std::vector<Mw> mws;
  std::vector<Cq> cqs;
  std::vector<Srq> srqs;
  std::vector<Qp> qps;
  std::vector<std::pair<uint32_t, vstellar_event_page_fault>> events;
  std::vector<vstellar_cq_notify> notifies[VSTELLAR_MAX_CQ_QUEUES];
  std::map<vstellar::Gid, std::set<uint32_t>> mcast;
  const uint8_t* engine = nullptr;
  size_t engine_len = 0;
};

bool Parse(const std::vector<uint8_t>& bytes, Loaded* L, std::string* err) {
  StateReader r(bytes.data(), bytes.size());
  auto bad = [&](const char* what) {
    *err = std::string("malformed device state (") + what + ")";
    return false;
  };
  uint64_t magic = 0;
  uint32_t version = 0, n = 0;
  if (!r.U64(&magic) || magic != kMagic) return bad("not a vStellar device state");
  if (!r.U32(&version) || version != kVersion) {
    *err = "device state version " + std::to_string(version) + "; this daemon takes version " +
           std::to_string(kVersion);
    return false;
  }
  r.Bytes(&L->config, sizeof(L->config));
  r.U64(&L->acked);
  r.Bool(&L->fatal);
  r.Str(&L->fatal_why, 4096);
  r.U32(&L->next_handle);
  if (!r.Count(&n, kMaxObjects)) return bad("header");
  for (uint32_t i = 0; i < n; i++) {
    uint32_t h = 0, slots = 0;
    UContext u;
    r.U32(&h);
    r.U32(&u.db_page);
    if (!r.Count(&slots, VSTELLAR_DB_SLOTS_PER_PAGE)) return bad("context");
    u.slots.resize(slots);
    for (uint32_t s = 0; s < slots; s++) {
      bool b = false;
      r.Bool(&b);
      u.slots[s] = b;
    }
    if (!r.ok() || !L->uctx.emplace(h, std::move(u)).second) return bad("context");
  }
  if (!r.Count(&n, 1u << 16)) return bad("doorbell pages");
  L->db_pages_used.resize(n);
  for (uint32_t i = 0; i < n; i++) {
    bool b = false;
    r.Bool(&b);
    L->db_pages_used[i] = b;
  }
  if (!r.Count(&n, 1u << 16)) return bad("GIDs");
  for (uint32_t i = 0; i < n; i++) {
    uint32_t index = 0;
    vstellar::Gid g;
    r.U32(&index);
    r.Bytes(g.data(), 16);
    if (!r.ok() || !L->gids.emplace(index, g).second) return bad("GIDs");
  }
  if (!r.Count(&n, kMaxObjects)) return bad("PDs");
  L->pds.resize(n);
  for (auto& p : L->pds) r.U32(&p.h), r.U32(&p.owner), r.U32(&p.pd), r.U32(&p.dma_mr);
  if (!r.Count(&n, kMaxObjects)) return bad("MRs");
  L->mrs.resize(n);
  for (auto& m : L->mrs) r.U32(&m.h), r.U32(&m.owner), r.U32(&m.mr), r.U32(&m.pdn), r.U64(&m.charge);
  if (!r.Count(&n, kMaxObjects)) return bad("MWs");
  L->mws.resize(n);
  for (auto& m : L->mws) r.U32(&m.h), r.U32(&m.owner), r.U32(&m.mw), r.U32(&m.pdn), r.U64(&m.charge);
  if (!r.Count(&n, kMaxObjects)) return bad("CQs");
  L->cqs.resize(n);
  for (auto& c : L->cqs) {
    r.U32(&c.h), r.U32(&c.o.owner), r.U32(&c.engine), r.U32(&c.o.cq_queue), r.U32(&c.o.slot);
    r.U32(&c.o.log_cqe), r.U32(&c.o.page_shift), r.U64(&c.o.ring_offset);
    r.U64s(&c.o.pages, kMaxPages);
    r.Bool(&c.o.armed), r.U32(&c.o.pi), r.U32(&c.o.last_arm), r.Bool(&c.o.overflow), r.U64(&c.charge);
    if (!r.ok() || c.o.page_shift < 12 || c.o.page_shift >= 64 || c.o.log_cqe >= 32 ||
        c.o.cq_queue >= VSTELLAR_MAX_CQ_QUEUES)
      return bad("CQ");
  }
  if (!r.Count(&n, kMaxObjects)) return bad("SRQs");
  L->srqs.resize(n);
  for (auto& s : L->srqs) {
    uint32_t nw = 0;
    r.U32(&s.h), r.U32(&s.o.owner), r.U32(&s.engine), r.U32(&s.o.pdn), r.U32(&s.o.slot), r.U64(&s.charge);
    if (!GetGeom(r, &s.o.ring)) return bad("SRQ ring");
    r.U32(&s.o.ci);
    if (!r.Count(&nw, 1u << 20)) return bad("SRQ");
    for (uint32_t i = 0; i < nw; i++) {
      uint32_t k = 0;
      uint64_t id = 0;
      r.U32(&k), r.U64(&id);
      s.o.wrid[k] = id;
    }
    r.U32(&s.o.max_sge), r.Bool(&s.o.broken), r.Bool(&s.o.blocked);
    if (!r.ok()) return bad("SRQ");
  }
  if (!r.Count(&n, kMaxObjects)) return bad("QPs");
  L->qps.resize(n);
  for (auto& q : L->qps) {
    uint32_t nop = 0;
    r.U32(&q.qpn), r.U32(&q.o.owner), r.U32(&q.engine), r.U8(&q.o.type), r.U32(&q.o.pdn);
    r.U32(&q.o.send_cqn), r.U32(&q.o.recv_cqn), r.U32(&q.o.slot), r.U32(&q.o.srqh);
    if (!GetGeom(r, &q.o.sq) || !GetGeom(r, &q.o.rq)) return bad("QP rings");
    r.U32(&q.o.sq_ci), r.U32(&q.o.rq_ci);
    r.U64s(&q.o.sq_wrid, 1u << 20), r.U64s(&q.o.rq_wrid, 1u << 20);
    if (!r.Count(&nop, 1u << 20)) return bad("QP");
    q.o.sq_op.resize(nop);
    r.Bytes(q.o.sq_op.data(), nop);
    r.U32(&q.o.max_send_sge), r.U32(&q.o.max_recv_sge), r.U32(&q.o.max_inline), r.U64(&q.charge);
    r.Bool(&q.o.broken), r.Bool(&q.o.blocked), r.Bool(&q.o.error_logged);
    if (!r.ok()) return bad("QP");
  }
  if (!r.Count(&n, kMaxObjects)) return bad("events");
  L->events.resize(n);
  for (auto& [len, e] : L->events) {
    r.U32(&len), r.Bytes(&e, sizeof(e));
    if (!r.ok() || (len != sizeof(vstellar_event) && len != sizeof(vstellar_event_page_fault))) return bad("event");
  }
  for (auto& d : L->notifies) {
    if (!r.Count(&n, kMaxObjects)) return bad("CQ notifications");
    d.resize(n);
    for (auto& x : d) r.Bytes(&x, sizeof(x));
  }
  if (!r.Count(&n, 1u << 16)) return bad("multicast groups");
  for (uint32_t i = 0; i < n; i++) {
    vstellar::Gid mgid;
    uint32_t k = 0;
    r.Bytes(mgid.data(), 16);
    if (!r.Count(&k, 1u << 16) || L->mcast.count(mgid)) return bad("multicast group");
    std::set<uint32_t>& qpns = L->mcast[mgid];
    for (uint32_t j = 0; j < k; j++) {
      uint32_t qpn = 0;
      if (!r.U32(&qpn) || !qpns.insert(qpn).second) return bad("multicast group's QPs");
    }
    if (qpns.empty()) return bad("multicast group without QPs");
  }
  if (!r.Blob(&L->engine, &L->engine_len) || !r.done()) return bad("trailer");
  return true;
}

}  // namespace

bool Device::LoadState(const std::vector<uint8_t>& bytes, std::string* err) {
  if (frozen_objs_ || !obj_.uctx.empty() || !obj_.pds.empty() || !obj_.cqs.empty() || !obj_.gids.empty()) {
    *err = "the device here is in use already";
    return false;
  }
  if (!sh_->engine) {
    *err = "no engine";
    return false;
  }
  Loaded L;
  if (!Parse(bytes, &L, err)) return false;
  if (!SameDevice(L.config, state_.config(), err)) return false;
  if (L.acked & ~session_.offered_features()) {
    *err = "the guest's driver took features this device does not offer";
    return false;
  }
  const virtio_vstellar_config& c = state_.config();
  // Every reference inside the state must name something in it: a handle
  // of the right kind, owned by the same context, slots and pages within
  // the device's bounds. A context is 0 (the kernel) or a context's handle.
  auto ctx_ok = [&](uint32_t o) { return o == 0 || L.uctx.count(o); };
  // Contexts have a doorbell page each (the kernel's, handle 0, once it
  // asked for one), at most max_ucontext of them.
  const uint32_t db_pages = le32toh(c.max_ucontext);
  for (auto& [h, u] : L.uctx)
    if (u.db_page >= db_pages || u.db_page >= L.db_pages_used.size() || !L.db_pages_used[u.db_page] ||
        u.slots.size() != VSTELLAR_DB_SLOTS_PER_PAGE) {
      *err = "malformed device state (context " + std::to_string(h) + ")";
      return false;
    }
  if (L.db_pages_used.size() > db_pages || L.gids.size() > le32toh(c.gid_table_len)) {
    *err = "malformed device state (doorbell pages or GIDs)";
    return false;
  }
  std::map<uint32_t, uint32_t> pd_owner, cq_owner, srq_owner;
  // A doorbell slot the owner's page has taken, or none (0: kernel
  // objects made before the kernel had its page).
  auto slot_ok = [&](uint32_t owner, uint32_t slot) {
    if (slot == 0) return owner == 0;
    auto it = L.uctx.find(owner);
    return it != L.uctx.end() && slot >= VSTELLAR_DB_FIRST_SLOT && slot < VSTELLAR_DB_SLOTS_PER_PAGE &&
           it->second.slots[slot];
  };
  for (auto& p : L.pds)
    if (!p.h || !ctx_ok(p.owner) || !pd_owner.emplace(p.h, p.owner).second) {
      *err = "malformed device state (PD)";
      return false;
    }
  auto pd_of = [&](uint32_t pdn, uint32_t owner) {
    auto it = pd_owner.find(pdn);
    return it != pd_owner.end() && it->second == owner;
  };
  for (auto& m : L.mrs)
    if (!m.h || !pd_of(m.pdn, m.owner)) {
      *err = "malformed device state (MR)";
      return false;
    }
  for (auto& m : L.mws)
    if (!m.h || !pd_of(m.pdn, m.owner)) {
      *err = "malformed device state (MW)";
      return false;
    }
  for (auto& q : L.cqs) {
    if (!q.h || !ctx_ok(q.o.owner) || !slot_ok(q.o.owner, q.o.slot) || !cq_owner.emplace(q.h, q.o.owner).second ||
        q.o.pages.empty() || (q.o.ring_offset >> q.o.page_shift) >= q.o.pages.size()) {
      *err = "malformed device state (CQ)";
      return false;
    }
  }
  for (auto& s : L.srqs)
    if (!s.h || !pd_of(s.o.pdn, s.o.owner) || !slot_ok(s.o.owner, s.o.slot) ||
        !srq_owner.emplace(s.h, s.o.owner).second) {
      *err = "malformed device state (SRQ)";
      return false;
    }
  for (auto& q : L.qps) {
    auto owned = [&](const std::map<uint32_t, uint32_t>& m, uint32_t h) {
      auto it = m.find(h);
      return it != m.end() && it->second == q.o.owner;
    };
    const size_t sq_n = size_t{1} << q.o.sq.log_n, rq_n = size_t{1} << q.o.rq.log_n;
    if (!pd_of(q.o.pdn, q.o.owner) || !owned(cq_owner, q.o.send_cqn) || !owned(cq_owner, q.o.recv_cqn) ||
        (q.o.srqh && !owned(srq_owner, q.o.srqh)) || !slot_ok(q.o.owner, q.o.slot) ||
        (q.o.sq_wrid.size() && q.o.sq_wrid.size() != sq_n) || (q.o.rq_wrid.size() && q.o.rq_wrid.size() != rq_n) ||
        q.o.sq_op.size() != q.o.sq_wrid.size()) {
      *err = "malformed device state (QP " + std::to_string(q.qpn) + ")";
      return false;
    }
  }
  // The addresses: the source's GIDs must be ones this device may hold
  // here, and free (the fabric moves the guest's address with it).
  std::vector<vstellar::Gid> taken;
  auto give_back = [&] {
    for (const auto& g : taken) sh_->gids->Release(g, &obj_);
  };
  for (auto& [i, g] : L.gids) {
    const vstellar::IpAddr a = vstellar::IpAddr::from_bytes(g.data());
    if (a.is_link_local()) continue;
    if (!state_.MayHold(a)) {
      give_back();
      *err = "the guest's address " + vstellar::to_string(a) + " is not one this device may hold here (vstellard --device PATH,ip=...)";
      return false;
    }
    if (!sh_->gids->Take(g, &obj_, sh_->worker)) {
      give_back();
      *err = "the guest's address " + vstellar::to_string(a) + " is held by another device here";
      return false;
    }
    taken.push_back(g);
  }
  // No more objects than the device's limits (the guest's driver read
  // them; it could not have made more).
  // (CREATE_SRQ counts SRQs against max_qp, and ALLOC_MW windows against max_mr.)
  const uint32_t max_qp = le32toh(c.max_qp), max_mr = le32toh(c.max_mr);
  if (L.qps.size() > max_qp || L.srqs.size() > max_qp || L.cqs.size() > le32toh(c.max_cq) ||
      L.mrs.size() > max_mr || L.mws.size() > max_mr || L.pds.size() > le32toh(c.max_pd)) {
    give_back();
    *err = "malformed device state (more objects than the device's limits)";
    return false;
  }
  // The memory the objects hold here is charged as the commands that make
  // them charge it, from what they are (never from what the source says):
  // the engine counts its part as it makes them, within what is left of
  // the budgets, and the rest is charged below once they are made.
  const uint64_t left = std::min(obj_.memory.limit() - std::min(obj_.memory.limit(), obj_.memory.used()),
                                 sh_->memory->limit() - std::min(sh_->memory->limit(), sh_->memory->used()));
  std::map<const vstellar::MemoryTranslator*, uint64_t> translator_bytes;

  // The engine's objects, with their numbers; their translators from what
  // the source said of each (built on first use). On-demand ones are kept
  // to give their MRs (MAP_ and UNMAP_MR_PAGES reach them).
  std::vector<std::shared_ptr<OdpTranslator>> odp;
  auto mem = [&](const uint8_t* p, size_t len) -> std::shared_ptr<vstellar::MemoryTranslator> {
    StateReader m(p, len);
    uint8_t kind = kMemNone;
    MrLayout l;
    if (!m.U8(&kind)) return nullptr;
    switch (kind) {
      case kMemLayout:
        m.U64(&l.iova), m.U64(&l.length), m.U32(&l.page_shift), m.U64s(&l.pages, kMaxPages);
        if (!m.done() || l.page_shift < 12 || l.page_shift >= 64) return nullptr;
      {
        const uint64_t bytes = 16ull * l.pages.size();
        auto t = std::make_shared<RestoredTranslator>(pvdma_, sh_->atc, sh_->translation, std::move(l));
        translator_bytes[t.get()] = bytes;
        return t;
      }
      case kMemOdp:
        m.U64(&l.iova), m.U64(&l.length);
        if (!m.done() || (l.length != VSTELLAR_ODP_IMPLICIT_LENGTH && l.iova + l.length < l.iova)) return nullptr;
        odp.push_back(std::make_shared<OdpTranslator>(pvdma_, l.iova, l.length));
        translator_bytes[odp.back().get()] = sizeof(OdpTranslator) + OdpTranslator::MaxChunks(l.iova, l.length) *
                                                                          (OdpTranslator::kChunkPages * 8 + 64);
        return odp.back();
      case kMemGpa:
        return m.done() ? std::make_shared<GpaTranslator>(pvdma_) : nullptr;
      default:
        return nullptr;
    }
  };
  vstellar::EngineObjects eo;
  if (int e = sh_->engine->restore(L.engine, L.engine_len, mem, id_, &eo, err, left)) {
    give_back();
    *err = "the engine refused the device's objects (" + std::string(std::strerror(e)) + "): " + *err;
    return false;
  }
  auto odp_of = [&](vstellar::Mr* mr) -> std::shared_ptr<OdpTranslator> {
    if (mr->state() != vstellar::MrState::VALID) return nullptr;
    for (auto& t : odp)
      if (t.get() == &mr->mem()) return t;
    return nullptr;
  };
  // Indices into the restored lists, checked now that their sizes are known.
  auto in = [](uint32_t i, const auto& v) { return i < v.size(); };
  bool fits = true;
  for (auto& p : L.pds) fits = fits && in(p.pd, eo.pds) && (p.dma_mr == kNone || in(p.dma_mr, eo.mrs));
  for (auto& m : L.mrs) fits = fits && in(m.mr, eo.mrs);
  for (auto& m : L.mws) fits = fits && in(m.mw, eo.mws);
  for (auto& q : L.cqs) fits = fits && in(q.engine, eo.cqs);
  for (auto& s : L.srqs) fits = fits && in(s.engine, eo.srqs);
  for (auto& q : L.qps) fits = fits && in(q.engine, eo.qps) && eo.qps[q.engine]->qpn() == q.qpn;
  // ... and each engine object is the device's once: one nobody names
  // would stay in the engine for ever, one named twice be freed twice.
  if (fits) {
    auto once = [&](const auto& v, auto&& each) {
      std::vector<uint32_t> seen(v.size());
      each([&](uint32_t i) { seen[i]++; });
      return std::all_of(seen.begin(), seen.end(), [](uint32_t k) { return k == 1; });
    };
    fits = once(eo.pds, [&](auto use) { for (auto& p : L.pds) use(p.pd); }) &&
           once(eo.mrs, [&](auto use) {
             for (auto& m : L.mrs) use(m.mr);
             for (auto& p : L.pds)
               if (p.dma_mr != kNone) use(p.dma_mr);
           }) &&
           once(eo.mws, [&](auto use) { for (auto& m : L.mws) use(m.mw); }) &&
           once(eo.cqs, [&](auto use) { for (auto& q : L.cqs) use(q.engine); }) &&
           once(eo.srqs, [&](auto use) { for (auto& s : L.srqs) use(s.engine); }) &&
           once(eo.qps, [&](auto use) { for (auto& q : L.qps) use(q.engine); });
  }
  auto drop = [&](const std::string& why) {
    vstellar::Detached gone;
    sh_->engine->detach(eo, &gone);  // and dropped
    give_back();
    *err = why;
    return false;
  };
  if (!fits) return drop("malformed device state (engine object indices)");
  // The charges, as CREATE_* and REG_MR make them.
  const vstellar::Engine& engine = *sh_->engine;
  std::vector<MemoryCharge> charges;
  auto charge = [&](uint64_t bytes, MemoryCharge* out) { return out->Take(obj_.memory, *sh_->memory, bytes); };
  bool charged = true;
  for (auto& m : L.mrs) {
    const vstellar::Mr* mr = eo.mrs[m.mr];
    uint64_t table = 16ull * mr->max_pages();  // a fast-registration MR's page list (MrPagesBytes)
    if (mr->state() == vstellar::MrState::VALID) {
      auto t = translator_bytes.find(&mr->mem());
      if (t != translator_bytes.end()) table = std::max(table, t->second);
    }
    charged = charged && charge(Commands::MrBytes(table), &charges.emplace_back());
  }
  for (size_t i = 0; i < L.mws.size(); i++)
    charged = charged && charge(Commands::MwBytes(), &charges.emplace_back());
  for (auto& q : L.cqs)
    charged = charged && charge(Commands::CqBytes(q.o.pages.size(), engine.footprint(eo.cqs[q.engine])), &q.o.charge);
  for (auto& s : L.srqs) {
    const vstellar::Srq* srq = eo.srqs[s.engine];
    charged = charged && charge(cmds_.SrqBytes(uint32_t(s.o.ring.pages.size()), {srq->max_wr(), srq->max_sge(), 0}),
                                &s.o.charge);
  }
  for (auto& q : L.qps)
    charged = charged && charge(Commands::QpBytes(q.o.sq.pages.size() + q.o.rq.pages.size(), q.o.sq.log_n,
                                                  q.o.rq.log_n, engine.footprint(eo.qps[q.engine])),
                                &q.o.charge);
  if (!charged) return drop("the device's objects do not fit this daemon's memory budget");
  // Multicast memberships: UD QPs of the state, within the device's
  // quotas, and groups this host's engine can join now (joined here and
  // left again as the device stops below: a destination that cannot join
  // them refuses the state, and the guest runs on at the source).
  if (L.mcast.size() > sh_->mcast_groups_per_device) return drop("malformed device state (multicast groups)");
  for (const auto& [mgid, qpns] : L.mcast)
    if (qpns.size() > sh_->mcast_qps_per_group) return drop("malformed device state (multicast group's QPs)");
  std::map<uint32_t, vstellar::Qp*> ud_qps;
  for (auto& q : L.qps)
    if (q.o.type == VSTELLAR_QPT_UD) ud_qps[q.qpn] = eo.qps[q.engine];
  auto ud_qp = [&](uint32_t qpn) -> vstellar::Qp* {
    auto q = ud_qps.find(qpn);
    return q != ud_qps.end() ? q->second : nullptr;
  };
  std::vector<std::pair<vstellar::Qp*, vstellar::Gid>> joined;
  std::string why;
  if (const int e = JoinGroups(L.mcast, ud_qp, &joined, &why)) {
    for (auto& [qp, mgid] : joined) sh_->engine->detach_mcast(qp, mgid);
    return drop(e == EINVAL ? "malformed device state (multicast group)" : why);
  }

  // Nothing fails from here on.
  std::memcpy(state_.mutable_device().config.node_guid, L.config.node_guid, sizeof(L.config.node_guid));
  obj_.next_handle = L.next_handle;
  obj_.uctx = std::move(L.uctx);
  obj_.db_pages_used = std::move(L.db_pages_used);
  for (auto& [i, g] : L.gids) obj_.gids[i] = g;
  for (auto& p : L.pds)
    obj_.pds[p.h] = PdObj{p.owner, eo.pds[p.pd], p.dma_mr == kNone ? nullptr : eo.mrs[p.dma_mr]};
  size_t ci = 0;
  for (auto& m : L.mrs) {
    std::shared_ptr<OdpTranslator> o = odp_of(eo.mrs[m.mr]);
    if (o) cmds_.WireOdp(m.h, m.owner, o);
    obj_.mrs[m.h] = MrObj{m.owner, eo.mrs[m.mr], m.pdn, std::move(charges[ci++]), std::move(o)};
  }
  for (auto& m : L.mws) obj_.mws[m.h] = MwObj{m.owner, eo.mws[m.mw], m.pdn, std::move(charges[ci++])};
  for (auto& q : L.cqs) {
    q.o.cq = eo.cqs[q.engine];
    const uint32_t h = q.h;
    q.o.cq->on_completion = [this, h](vstellar::Cq&) { dp_.DrainCq(h); };
    obj_.cqs[h] = std::move(q.o);
  }
  for (auto& s : L.srqs) {
    s.o.srq = eo.srqs[s.engine];
    obj_.srqs[s.h] = std::move(s.o);
  }
  for (auto& q : L.qps) {
    q.o.qp = eo.qps[q.engine];
    obj_.qps[q.qpn] = std::move(q.o);
  }
  obj_.mcast = std::move(L.mcast);
  cmds_.SyncGsiGids();
  fatal_ = L.fatal;
  fatal_why_ = L.fatal_why;
  if (fatal_) {
    auto& cfg = state_.mutable_device().config;
    cfg.device_status = htole32(le32toh(cfg.device_status) | VSTELLAR_DEV_S_FATAL);
  }
  for (auto& [len, e] : L.events) QueueEvent(e, len);
  for (uint32_t q = 0; q < VSTELLAR_MAX_CQ_QUEUES; q++)
    for (const vstellar_cq_notify& n : L.notifies[q])
      if (cq_notify_waiting_.insert(le32toh(n.cqn)).second) cq_notifies_[q].push_back(n);
  // Stopped until the guest's rings start here (its peers heard PAUSED
  // from the source already; this host may not have its address yet).
  frozen_ = false;
  Freeze(/*tell_peers=*/false);
  LogMigration(id_, "took the state of " + std::to_string(obj_.qps.size()) + " QPs, " +
                        std::to_string(obj_.mrs.size()) + " MRs, " + std::to_string(obj_.cqs.size()) + " CQs");
  return true;
}

// ---------------------------------------------- SET_DEVICE_STATE_FD / CHECK

bool Device::BeginStateTransfer(bool save, Fd fd) {
  transfer_.Cancel();
  transfer_save_ = save;
  transfer_ok_ = false;
  std::string err;
  if (save) {
    std::vector<uint8_t> bytes;
    const auto began = std::chrono::steady_clock::now();
    if (!SaveState(&bytes, &err)) {
      LogMigration(id_, "cannot save the device: " + err);
      return false;
    }
    LogMigration(id_, "saving " + std::to_string(bytes.size()) + " bytes of state (" +
                          std::to_string(obj_.qps.size()) + " QPs), made in " + MicrosecondsSince(began) +
                          " us, " + MicrosecondsSince(stopped_at_) + " us after the device stopped");
    transfer_.StartSave(std::move(fd), std::move(bytes));
  } else {
    load_began_at_ = std::chrono::steady_clock::now();
    transfer_.StartLoad(std::move(fd), kMaxState);
  }
  transfer_ok_ = true;
  return true;
}

bool Device::CheckStateTransfer() {
  if (!transfer_ok_) return false;
  transfer_ok_ = false;
  std::vector<uint8_t> bytes;
  std::string err;
  // The frontend checks after it read the state to its end (save) or
  // closed its end (load): the thread is done or about to be.
  if (!transfer_.Finish(std::chrono::seconds(1), transfer_save_ ? nullptr : &bytes, &err)) {
    LogMigration(id_, "state transfer failed: " + err);
    return false;
  }
  if (transfer_save_) {
    LogMigration(id_, "state sent, " + MicrosecondsSince(stopped_at_) + " us after the device stopped");
    return true;
  }
  const auto began = std::chrono::steady_clock::now();
  if (!LoadState(bytes, &err)) {
    LogMigration(id_, "refused the state: " + err);
    return false;
  }
  LogMigration(id_, "state loaded in " + MicrosecondsSince(began) + " us, " + MicrosecondsSince(load_began_at_) +
                        " us after it began to arrive");
  return true;
}

}  // namespace vstellard
