// One virtual vStellar device: the coordinator of its parts; see
// include/vstellard/device.h and docs/vstellard.md.
#include "vstellard/device.h"

#include <endian.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

namespace vstellard {

Device::Device(unsigned id, DeviceShared& shared, const std::vector<vstellar::IpAddr>& addresses)
    : id_(id),
      sh_(&shared),
      pvdma_(shared.pin),
      state_(shared.device_config, addresses),
      session_(state_, pvdma_.dirty_log()),
      qs_(VSTELLAR_MAX_VQS, Virtqueue(pvdma_)),
      dp_(id, shared, state_, session_, pvdma_, obj_, *this),
      cmds_(shared, state_, session_, pvdma_, obj_, dp_),
      control_left_(shared.control_budget) {
  session_.set_state_transfer(this);
  pvdma_.set_require_sealed(shared.require_sealed_memory);
  pvdma_.set_budgets(obj_.budget, shared.memory);
  // A node GUID of its own: EUI-64 (locally administered) from the last
  // four bytes of the device's first address (an IPv4 address whole) and
  // the device number, so no two devices of a fabric share one (ibv_devinfo,
  // rdma_cm and the GID table tell devices apart by it).
  const vstellar::IpAddr first = addresses.empty() ? vstellar::IpAddr() : addresses.front();
  const uint8_t* ip = first.b.data() + 12;
  const uint8_t guid[8] = {0x02, ip[0], ip[1], 0xff, 0xfe, ip[2], ip[3], uint8_t(id)};
  std::memcpy(state_.mutable_device().config.node_guid, guid, sizeof(guid));
}

Device::~Device() {
  ResetState();
  if (sh_->atc) sh_->atc->Invalidate(pvdma_.id());
}

// ------------------------------------------------------------------ vhost-user

// The boundary of vhost-user requests: an allocation that fails while one
// is handled ends that connection (the daemon logs why), never the daemon.
Outcome Device::OnMessage(Message&& m) {
  const uint32_t request = m.hdr.request;
  try {
    return HandleMessage(std::move(m));
  } catch (const std::bad_alloc&) {
    Outcome out;
    out.error = "out of memory while handling request " + std::to_string(request);
    return out;
  }
}

void Device::CallAfterStop(uint32_t index) {
  if (index >= call_after_stop_.size() || !call_after_stop_[index]) return;
  const Vring& v = session_.vring(index);
  if (!v.started || !v.call) return;
  call_after_stop_[index] = false;
  const uint64_t one = 1;
  (void)!write(v.call.get(), &one, sizeof(one));
  // And served as if kicked: a kick that came while stopped was dropped
  // (OnKick), and the driver does not kick again for buffers it has
  // already made available (requests, event and notification buffers).
  if (frozen_) return;
  if (index == VSTELLAR_VQ_CONTROL)
    control_pending_ = true;  // the next turn takes the requests
  else if (index == VSTELLAR_VQ_EVENT)
    FlushEvents();
  else if (index >= VSTELLAR_VQ_CQN0)
    FlushCqNotifies();
}

Outcome Device::HandleMessage(Message&& m) {
  const auto req = static_cast<Request>(m.hdr.request);
  uint32_t index = 0;
  if (m.payload.size() >= 4) std::memcpy(&index, m.payload.data(), 4);
  index &= 0xff;
  // The ring base goes out with GET_VRING_BASE: the Virtqueue's index.
  if (req == Request::kGetVringBase && index < qs_.size())
    session_.mutable_vring(index).base = qs_[index].last_avail();
  Outcome out = session_.Handle(std::move(m));
  if (!out.ok()) return out;
  switch (req) {
    case Request::kSetMemTable: {
      std::string err;
      if (!pvdma_.Attach(session_.regions(), &err)) {
        out.error = err;
        // The session acked the table already; the frontend must hear
        // that it was refused after all.
        if (out.reply && out.reply->size() == sizeof(Header) + sizeof(uint64_t)) {
          const uint64_t refused = 1;
          std::memcpy(out.reply->data() + sizeof(Header), &refused, sizeof(refused));
        }
      }
      dp_.ForgetDbPages();  // the doorbell region may have moved
      break;
    }
    case Request::kSetConfig:
      dp_.ForgetDbPages();  // db_region_id names another region now
      break;
    case Request::kSetVringBase:
      if (index < qs_.size()) qs_[index].set_last_avail(session_.vring(index).base);
      break;
    case Request::kSetVringKick:
      if (index < qs_.size()) qs_[index].Restart();
      if (index == VSTELLAR_VQ_CONTROL) Thaw();
      CallAfterStop(index);
      break;
    case Request::kSetVringCall:
      CallAfterStop(index);  // (QEMU may set the call fd before or after the kick)
      break;
    case Request::kGetVringBase:
      if (index < qs_.size()) qs_[index].Restart();
      // The control queue stopping: a frontend that resets the device with
      // RESET_DEVICE stops it here (a VM paused or migrating keeps its
      // objects); for one that does not, this is the device's reset (virtio
      // reset or driver unload) and its objects go away with it.
      if (index == VSTELLAR_VQ_CONTROL) {
        if (session_.stop_is_not_reset()) Freeze();
        else ResetState();
      }
      break;
    case Request::kResetDevice:
      ResetState();
      break;
    case Request::kResetOwner:
      ResetState();
      for (auto& q : qs_) q.Reset();
      break;
    default:
      break;
  }
  return out;
}

std::vector<std::pair<int, uint32_t>> Device::KickFds() const {
  std::vector<std::pair<int, uint32_t>> v;
  for (uint32_t i = 0; i < session_.num_vrings(); i++) {
    const Vring& r = session_.vring(i);
    if (r.started && r.kick) v.emplace_back(r.kick.get(), i);
  }
  return v;
}


void Device::OnKick(uint32_t q) {
  if (q >= session_.num_vrings()) return;
  const Vring& v = session_.vring(q);
  if (v.kick) {
    uint64_t n;
    while (read(v.kick.get(), &n, sizeof(n)) == sizeof(n)) {
    }
  }
  // A stopped device serves nothing (a kick may have been on its way).
  if (frozen_) return;
  if (q == VSTELLAR_VQ_CONTROL) {
    control_pending_ = true;
    ProcessControl();
  }
  else if (q == VSTELLAR_VQ_EVENT) FlushEvents();
  else if (q >= VSTELLAR_VQ_CQN0) FlushCqNotifies();
  else if (q == VSTELLAR_VQ_KICK) dp_.OnKick();  // doorbell wake-up: poll until idle again
}

void Device::Fatal(const std::string& why) {
  if (fatal_) return;
  fatal_ = true;
  fatal_why_ = why;
  auto& c = state_.mutable_device().config;
  c.device_status = htole32(le32toh(c.device_status) | VSTELLAR_DEV_S_FATAL);
  PostEvent(VSTELLAR_EV_DEVICE_FATAL, 0, 0, VSTELLAR_STATUS_DEVICE_FATAL);
}


// The control queue: each chain is one request (readable part) and room for
// its response (writable part). The request is copied out whole before
// anything in it is looked at (no double fetch); Commands executes it.
// At most control_left_ requests per turn: the rest stays in the ring,
// control_pending_ set, for the next turn (no kick is needed for it).
void Device::ProcessControl() {
  if (frozen_) return;  // stopped: what is pending waits for the rings to start
  Virtqueue& vq = qs_[VSTELLAR_VQ_CONTROL];
  if (control_left_ == 0) return;  // pending: the next turn continues
  control_pending_ = false;
  if (!vq.Begin(session_.vring(VSTELLAR_VQ_CONTROL), state_.acked_features())) return;
  const uint64_t max_req = sizeof(vstellar_cmd_hdr) + sizeof(vstellar_cmd_create_qp) +
                           8ull * le32toh(state_.config().max_cmd_pages);
  for (;;) {
    if (control_left_ == 0) {
      control_pending_ = true;
      break;
    }
    Virtqueue::Chain c;
    Virtqueue::PopResult p = vq.Pop(&c);
    if (p == Virtqueue::PopResult::kEmpty) {
      // Tell the driver where to kick next, then look once more (race).
      if (!vq.ArmKick()) break;
      p = vq.Pop(&c);
      if (p == Virtqueue::PopResult::kEmpty) break;
    }
    if (p == Virtqueue::PopResult::kBroken) {
      vq.MarkBroken();
      Fatal("control queue: corrupt available ring");
      break;
    }
    control_left_--;
    if (p == Virtqueue::PopResult::kBadChain) {
      commands_++;
      commands_failed_++;
      vq.Push(c.head, 0);
      continue;
    }
    std::vector<uint8_t> resp;
    uint16_t status = VSTELLAR_STATUS_OK;
    vstellar_cmd_hdr h{};
    std::vector<uint8_t> req;
    if (c.readable_len > max_req || c.readable_len < sizeof(h)) {
      status = VSTELLAR_STATUS_BAD_LENGTH;
      if (c.readable_len >= sizeof(h) && !c.readable.empty())
        pvdma_.Read(c.readable[0].gpa, &h, std::min<uint64_t>(sizeof(h), c.readable[0].len));
    } else {
      req.resize(c.readable_len);
      if (!vq.ReadAll(c, req.data())) status = VSTELLAR_STATUS_BAD_ADDRESS;
      if (sh_->after_copy) sh_->after_copy(id_);
      std::memcpy(&h, req.data(), std::min(req.size(), sizeof(h)));
    }
    if (status == VSTELLAR_STATUS_OK) {
      // Room for the response must be there before anything executes.
      const auto* info = vstellar_cmd_info(le16toh(h.opcode));
      const uint32_t resp_len = info ? info->resp_len : 0;
      if (c.writable_len < sizeof(vstellar_resp_hdr) + resp_len) status = VSTELLAR_STATUS_BAD_LENGTH;
      else if (fatal_) status = VSTELLAR_STATUS_DEVICE_FATAL;
      else status = ExecuteCommand(req, &resp);
    }
    if (status != VSTELLAR_STATUS_OK) resp.clear();
    commands_++;
    if (status) commands_failed_++;
    last_status_ = status;
    vstellar_resp_hdr rh{};
    rh.opcode = h.opcode;
    rh.status = htole16(status);
    rh.cmd_id = h.cmd_id;
    rh.length = htole32(uint32_t(resp.size()));
    std::vector<uint8_t> out(sizeof(rh) + resp.size());
    std::memcpy(out.data(), &rh, sizeof(rh));
    if (!resp.empty()) std::memcpy(out.data() + sizeof(rh), resp.data(), resp.size());
    uint32_t written = 0;
    if (c.writable_len >= sizeof(rh)) {
      bool ok;
      written = vq.WriteAll(c, out.data(), uint32_t(out.size()), &ok);
      if (!ok) written = 0;  // response buffer outside guest memory
    }
    vq.Push(c.head, written);
  }
  vq.Notify();
}

// The boundary of control commands: an allocation that fails inside one
// fails that command (NO_RESOURCES) and is logged; the daemon goes on.
uint16_t Device::ExecuteCommand(const std::vector<uint8_t>& req, std::vector<uint8_t>* resp) {
  try {
    return cmds_.Execute(req, resp);
  } catch (const std::bad_alloc&) {
    vstellar_cmd_hdr h{};
    std::memcpy(&h, req.data(), std::min(req.size(), sizeof(h)));
    std::fprintf(stderr, "vstellard: device %u: out of memory in control command %u; it fails with NO_RESOURCES\n",
                 id_, unsigned(le16toh(h.opcode)));
    resp->clear();
    return VSTELLAR_STATUS_NO_RESOURCES;
  }
}

// The event and CQ notification queues: the driver posts writable buffers,
// the device fills one per message.
bool Device::PushToQueue(uint32_t q, const void* data, uint32_t len) {
  if (q >= session_.num_vrings()) return false;
  Virtqueue& vq = qs_[q];
  if (!vq.Begin(session_.vring(q), state_.acked_features())) return false;
  for (;;) {
    Virtqueue::Chain c;
    Virtqueue::PopResult p = vq.Pop(&c);
    if (p == Virtqueue::PopResult::kEmpty) {
      // Out of buffers: what waits goes out when the driver adds some, and
      // with EVENT_IDX the driver kicks for them only if asked to. Ask,
      // then look once more (it may have added one meanwhile).
      if (!vq.ArmKick()) return false;
      p = vq.Pop(&c);
      if (p == Virtqueue::PopResult::kEmpty) return false;
    }
    if (p == Virtqueue::PopResult::kBroken) {
      vq.MarkBroken();
      return false;
    }
    if (p == Virtqueue::PopResult::kBadChain || !c.readable.empty() || c.writable_len < len) {
      vq.Push(c.head, 0);  // unusable buffer: give it back empty
      vq.Notify();
      continue;
    }
    bool ok;
    const uint32_t written = vq.WriteAll(c, data, len, &ok);
    vq.Push(c.head, written);
    vq.Notify();
    return written == len;
  }
}

void Device::PostEvent(uint16_t type, uint32_t object, uint32_t ucontext, uint32_t info) {
  vstellar_event_page_fault e{};
  e.type = htole16(type);
  e.object = htole32(object);
  e.ucontext = htole32(ucontext);
  e.num_pages = htole32(info);  // vstellar_event::info
  QueueEvent(e, sizeof(vstellar_event));
}

// Faults of the same pages waiting in the queue are merged; the
// translator asks for pages once per kAskAgainNs, so there are few.
bool Device::PostPageFault(uint32_t mrn, uint32_t ucontext, uint64_t iova, uint32_t npages, bool write) {
  vstellar_event_page_fault e{};
  e.type = htole16(VSTELLAR_EV_PAGE_FAULT);
  e.flags = htole16(write ? VSTELLAR_FAULT_WRITE : 0);
  e.object = htole32(mrn);
  e.ucontext = htole32(ucontext);
  e.num_pages = htole32(npages);
  e.iova = htole64(iova);
  return QueueEvent(e, sizeof(e));
}

bool Device::QueueEvent(const vstellar_event_page_fault& e, uint32_t len) {
  const uint16_t type = le16toh(e.type);
  const uint32_t object = le32toh(e.object), ucontext = le32toh(e.ucontext);
  const uint64_t iova = type == VSTELLAR_EV_PAGE_FAULT ? le64toh(e.iova) : 0;
  if (!events_waiting_.emplace(type, object, ucontext, iova).second) {
    events_merged_++;
    return true;
  }
  // Six kinds of event can name a QP; the slack covers objects just destroyed.
  const size_t backlog = 64 + 8 * (obj_.qps.size() + obj_.cqs.size() + obj_.srqs.size());
  if (events_.size() >= backlog && type != VSTELLAR_EV_DEVICE_FATAL) {
    events_waiting_.erase({type, object, ucontext, iova});
    events_dropped_++;
    return false;
  }
  events_.push_back({e, len});
  FlushEvents();
  return true;
}

void Device::FlushEvents() {
  while (!events_.empty()) {
    const vstellar_event_page_fault& e = events_.front().e;
    if (!PushToQueue(VSTELLAR_VQ_EVENT, &e, events_.front().len)) return;
    events_waiting_.erase({le16toh(e.type), le32toh(e.object), le32toh(e.ucontext),
                           le16toh(e.type) == VSTELLAR_EV_PAGE_FAULT ? le64toh(e.iova) : 0});
    events_.pop_front();
    events_n_++;
  }
}

void Device::FlushCqNotifies() {
  for (uint32_t i = 0; i < VSTELLAR_MAX_CQ_QUEUES; i++) {
    auto& dq = cq_notifies_[i];
    while (!dq.empty()) {
      if (!PushToQueue(VSTELLAR_VQ_CQN0 + i, &dq.front(), sizeof(vstellar_cq_notify))) break;
      cq_notify_waiting_.erase(le32toh(dq.front().cqn));
      dq.pop_front();
      cq_notify_n_++;
    }
  }
}


void Device::NotifyCq(uint32_t cq_queue, const vstellar_cq_notify& n) {
  if (cq_notify_waiting_.insert(le32toh(n.cqn)).second) cq_notifies_[cq_queue].push_back(n);
  FlushCqNotifies();
}

void Device::OnEngineEvent(const vstellar::AsyncEvent& e) {
  using T = vstellar::AsyncEventType;
  uint16_t type = VSTELLAR_EV_QP_FATAL;
  uint32_t owner = 0, object = e.qpn_or_cqn;
  switch (e.type) {
    case T::QP_FATAL: type = VSTELLAR_EV_QP_FATAL; break;
    case T::QP_REQ_ERR: type = VSTELLAR_EV_QP_REQ_ERR; break;
    case T::QP_ACCESS_ERR: type = VSTELLAR_EV_QP_ACCESS_ERR; break;
    case T::SQ_DRAINED: type = VSTELLAR_EV_SQ_DRAINED; break;
    case T::COMM_EST: type = VSTELLAR_EV_COMM_EST; break;
    case T::CQ_ERR: type = VSTELLAR_EV_CQ_ERR; break;
    case T::SRQ_LIMIT_REACHED: type = VSTELLAR_EV_SRQ_LIMIT_REACHED; break;
    case T::QP_LAST_WQE_REACHED: type = VSTELLAR_EV_QP_LAST_WQE_REACHED; break;
  }
  if (e.type == T::SRQ_LIMIT_REACHED) {
    for (auto& [h, s] : obj_.srqs)
      if (s.srq->srqn() == e.qpn_or_cqn) {
        object = h;  // the guest's SRQN
        owner = s.owner;
      }
  } else if (e.type == T::CQ_ERR) {
    for (auto& [h, c] : obj_.cqs)
      if (c.cq->cqn() == e.qpn_or_cqn) {
        object = h;
        owner = c.owner;
      }
  } else if (auto it = obj_.qps.find(e.qpn_or_cqn); it != obj_.qps.end()) {
    owner = it->second.owner;
  }
  PostEvent(type, object, owner, 0);
}

bool Device::OwnsEvent(const vstellar::AsyncEvent& e) const {
  using T = vstellar::AsyncEventType;
  if (e.type == T::CQ_ERR) return false;  // the data path reports CQ errors itself
  if (e.type == T::SRQ_LIMIT_REACHED) {
    for (auto& [h, s] : obj_.srqs)
      if (s.srq->srqn() == e.qpn_or_cqn) return true;
    return false;
  }
  return OwnsQp(e.qpn_or_cqn);
}


// ------------------------------------------------------------------ reset, stats

void Device::ResetState() {
  // Objects held out of the engine (a stopped device) go back in to be
  // destroyed there. Their numbers stay reserved while they are out, so
  // this cannot fail; were it to, they must outlive the pointers the
  // tables hold: kept (leaked), never freed under them.
  if (frozen_objs_ && sh_->engine && sh_->engine->attach(&frozen_objs_) != 0) (void)frozen_objs_.release();
  frozen_ = false;
  freeze_error_.clear();
  transfer_.Cancel();
  cmds_.DestroyAll();
  if (!sh_->engine) return;
  events_.clear();
  events_waiting_.clear();
  for (auto& d : cq_notifies_) d.clear();
  cq_notify_waiting_.clear();
  fatal_ = false;
  dp_.Stop();
  auto& c = state_.mutable_device().config;
  c.device_status = htole32(le32toh(c.device_status) & ~VSTELLAR_DEV_S_FATAL);
}

vstellar::EngineObjects Device::EngineObjects() const {
  vstellar::EngineObjects o;
  for (const auto& [h, pd] : obj_.pds) {
    o.pds.push_back(pd.pd);
    if (pd.dma_mr) o.mrs.push_back(pd.dma_mr);
  }
  for (const auto& [h, m] : obj_.mrs) o.mrs.push_back(m.mr);
  for (const auto& [h, w] : obj_.mws) o.mws.push_back(w.mw);
  for (const auto& [h, c] : obj_.cqs) o.cqs.push_back(c.cq);
  for (const auto& [h, s] : obj_.srqs) o.srqs.push_back(s.srq);
  for (const auto& [qpn, q] : obj_.qps) o.qps.push_back(q.qp);
  return o;
}

std::vector<std::pair<vstellar::Endpoint, uint32_t>> Device::ConnectedPeers() const {
  std::vector<std::pair<vstellar::Endpoint, uint32_t>> out;
  for (const auto& [qpn, q] : obj_.qps) {
    if (q.type != VSTELLAR_QPT_RC && q.type != VSTELLAR_QPT_UC) continue;
    const vstellar::QpState st = q.qp->state();
    if (st != vstellar::QpState::RTR && st != vstellar::QpState::RTS && st != vstellar::QpState::SQD) continue;
    vstellar::QpAttr a;
    vstellar::QpInitAttr init;
    if (sh_->engine->query_qp(q.qp, a, init) == 0) out.emplace_back(a.ah, a.dest_qp_num);
  }
  return out;
}

std::vector<uint32_t> Device::Qpns() const {
  std::vector<uint32_t> out;
  for (const auto& [qpn, q] : obj_.qps) out.push_back(qpn);
  return out;
}

std::string Device::Unmovable() const {
  if (fatal_) return "fatal";
  if (frozen_) return "stopped (its VM is paused or migrating)";
  if (sh_->translation == TranslationMode::kAtc) return "its MRs translate through its worker's ATC";
  if (!obj_.mcast.empty()) return "its QPs are in multicast groups";
  return {};
}

DeviceStats Device::stats() const {
  DeviceStats s;
  s.id = id_;
  s.pvdma = pvdma_.stats();
  s.commands = commands_;
  s.commands_failed = commands_failed_;
  s.last_status = last_status_;
  s.events = events_n_;
  s.events_dropped = events_dropped_;
  s.events_merged = events_merged_;
  s.cq_notifies = cq_notify_n_;
  s.fatal = fatal_;
  s.ucontexts = uint32_t(obj_.uctx.size());
  s.pds = uint32_t(obj_.pds.size());
  s.cqs = uint32_t(obj_.cqs.size());
  s.qps = uint32_t(obj_.qps.size());
  s.mrs = uint32_t(obj_.mrs.size());
  s.memory = obj_.memory.used();
  s.cq_notify_backlog = uint32_t(cq_notify_waiting_.size());
  s.memory_peak = obj_.memory.peak();
  s.memory_refused = obj_.memory.refused();
  const DataPathCounters& n = dp_.counters();
  s.wqes = n.wqes;
  s.bad_wqes = n.bad_wqes;
  s.cqes = n.cqes;
  s.cq_overflows = n.cq_overflows;
  s.db_kicks = n.db_kicks;
  s.idle_entries = n.idle_entries;
  s.missed_kicks = n.missed_kicks;
  s.polling = dp_.polling();
  return s;
}

}  // namespace vstellard
