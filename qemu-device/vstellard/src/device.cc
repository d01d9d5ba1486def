// One virtual vStellar device; see include/vstellard/device.h and
// docs/vstellard.md.
#include "vstellard/device.h"

#include <endian.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace vstellard {

namespace {

constexpr uint16_t kDescNext = 1, kDescWrite = 2, kDescIndirect = 4;
constexpr uint16_t kAvailNoInterrupt = 1;
constexpr uint32_t kMaxIndirect = 1024;
constexpr uint64_t Bit(int n) { return uint64_t{1} << n; }

#pragma pack(push, 1)
struct Desc {
  uint64_t addr;
  uint32_t len;
  uint16_t flags;
  uint16_t next;
};
#pragma pack(pop)

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Put(std::vector<uint8_t>* out, const T& v) {
  out->resize(sizeof(T));
  std::memcpy(out->data(), &v, sizeof(T));
}

bool IsZero(const void* p, size_t n) {
  auto* b = static_cast<const uint8_t*>(p);
  return std::all_of(b, b + n, [](uint8_t c) { return c == 0; });
}

// Fixed body size of each opcode (page lists come on top), response size.
struct OpInfo {
  uint32_t body;
  uint32_t resp;
  bool pages;
};
OpInfo Info(uint16_t op) {
  switch (op) {
    case VSTELLAR_CMD_QUERY_DEVICE: return {0, sizeof(vstellar_resp_query_device), false};
    case VSTELLAR_CMD_QUERY_PORT: return {sizeof(vstellar_cmd_query_port), sizeof(vstellar_resp_query_port), false};
    case VSTELLAR_CMD_ALLOC_UCONTEXT: return {0, sizeof(vstellar_resp_alloc_ucontext), false};
    case VSTELLAR_CMD_DEALLOC_UCONTEXT: return {sizeof(vstellar_cmd_handle), 0, false};
    case VSTELLAR_CMD_ALLOC_PD: return {0, sizeof(vstellar_resp_alloc_pd), false};
    case VSTELLAR_CMD_DEALLOC_PD: return {sizeof(vstellar_cmd_handle), 0, false};
    case VSTELLAR_CMD_CREATE_CQ: return {sizeof(vstellar_cmd_create_cq), sizeof(vstellar_resp_create_cq), true};
    case VSTELLAR_CMD_RESIZE_CQ: return {sizeof(vstellar_cmd_resize_cq), 0, true};
    case VSTELLAR_CMD_DESTROY_CQ: return {sizeof(vstellar_cmd_handle), 0, false};
    case VSTELLAR_CMD_REQ_NOTIFY_CQ: return {sizeof(vstellar_cmd_req_notify_cq), 0, false};
    case VSTELLAR_CMD_CREATE_QP: return {sizeof(vstellar_cmd_create_qp), sizeof(vstellar_resp_create_qp), true};
    case VSTELLAR_CMD_MODIFY_QP: return {sizeof(vstellar_cmd_modify_qp), 0, false};
    case VSTELLAR_CMD_QUERY_QP: return {sizeof(vstellar_cmd_handle), sizeof(vstellar_resp_query_qp), false};
    case VSTELLAR_CMD_DESTROY_QP: return {sizeof(vstellar_cmd_handle), 0, false};
    case VSTELLAR_CMD_REG_MR: return {sizeof(vstellar_cmd_reg_mr), sizeof(vstellar_resp_reg_mr), true};
    case VSTELLAR_CMD_DEREG_MR: return {sizeof(vstellar_cmd_handle), 0, false};
    case VSTELLAR_CMD_ADD_GID:
    case VSTELLAR_CMD_DEL_GID: return {sizeof(vstellar_cmd_gid), 0, false};
    case VSTELLAR_CMD_CREATE_AH: return {sizeof(vstellar_cmd_create_ah), sizeof(vstellar_resp_create_ah), false};
    case VSTELLAR_CMD_DESTROY_AH: return {sizeof(vstellar_cmd_handle), 0, false};
    case VSTELLAR_CMD_KERNEL_DB: return {0, sizeof(vstellar_resp_kernel_db), false};
    default: return {0, 0, false};
  }
}

// Pages needed for `bytes` starting `offset` into the first page.
uint64_t PagesFor(uint64_t offset, uint64_t bytes, uint32_t shift) {
  return (offset + bytes + (uint64_t{1} << shift) - 1) >> shift;
}

bool ValidTransition(uint8_t cur, uint8_t next) {
  using S = vstellar_qp_state;
  if (next == VSTELLAR_QPS_RESET || next == VSTELLAR_QPS_ERR) return true;
  switch (S(cur)) {
    case VSTELLAR_QPS_RESET: return next == VSTELLAR_QPS_INIT;
    case VSTELLAR_QPS_INIT: return next == VSTELLAR_QPS_INIT || next == VSTELLAR_QPS_RTR;
    case VSTELLAR_QPS_RTR: return next == VSTELLAR_QPS_RTS;
    case VSTELLAR_QPS_RTS: return next == VSTELLAR_QPS_RTS || next == VSTELLAR_QPS_SQD;
    case VSTELLAR_QPS_SQD: return next == VSTELLAR_QPS_RTS || next == VSTELLAR_QPS_SQD;
    case VSTELLAR_QPS_SQE: return next == VSTELLAR_QPS_RTS;
    default: return false;
  }
}

}  // namespace

Device::Device(unsigned id, DeviceShared& shared)
    : id_(id), sh_(shared), pvdma_(shared.pin), session_(DeviceConfig::Default()), qs_(VSTELLAR_MAX_VQS) {
  // A node GUID of its own: EUI-64 (locally administered) from the host's
  // IPv4 address and the device number, so no two devices of a fabric share
  // one (ibv_devinfo, rdma_cm and the GID table tell devices apart by it).
  const uint32_t ip = shared.host_ip;
  const uint8_t guid[8] = {0x02, uint8_t(ip >> 24), uint8_t(ip >> 16), 0xff, 0xfe,
                           uint8_t(ip >> 8), uint8_t(ip), uint8_t(id)};
  std::memcpy(session_.mutable_device().config.node_guid, guid, sizeof(guid));
}

Device::~Device() {
  ResetState();
  if (sh_.atc) sh_.atc->Invalidate(pvdma_.id());
}

// ------------------------------------------------------------------ vhost-user

Outcome Device::OnMessage(Message&& m) {
  const auto req = static_cast<Request>(m.hdr.request);
  uint32_t index = 0;
  if (m.payload.size() >= 4) std::memcpy(&index, m.payload.data(), 4);
  index &= 0xff;
  Outcome out = session_.Handle(std::move(m));
  if (!out.ok()) return out;
  switch (req) {
    case Request::kSetMemTable: {
      std::string err;
      if (!pvdma_.Attach(session_.regions(), &err)) out.error = err;
      for (auto& [h, u] : uctx_) u.page = nullptr;  // the doorbell region may have moved
      break;
    }
    case Request::kSetVringKick:
      if (index < qs_.size()) qs_[index] = QueueState{};
      break;
    case Request::kGetVringBase:
      if (index < qs_.size()) qs_[index] = QueueState{};
      // The control queue stopping is the device's reset (virtio reset or
      // driver unload): its objects go away with it.
      if (index == VSTELLAR_VQ_CONTROL) ResetState();
      break;
    case Request::kResetOwner:
      ResetState();
      for (auto& q : qs_) q = QueueState{};
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
  if (q == VSTELLAR_VQ_CONTROL) ProcessControl();
  else if (q == VSTELLAR_VQ_EVENT) FlushEvents();
  else if (q >= VSTELLAR_VQ_CQN0) FlushCqNotifies();
  else if (q == VSTELLAR_VQ_KICK) {
    // Doorbell wake-up: poll until idle again (datapath.cc).
    db_kicks_++;
    SetNeedKick(0);
    polling_ = true;
    last_work_ns_ = NowNs();
    PollDataPath();
  }
}

bool Device::RingOf(uint32_t q, Ring* r) {
  const Vring& v = session_.vring(q);
  if (!v.started || !v.addr_set || qs_[q].broken) return false;
  r->num = v.num;
  if (!pvdma_.QemuVaToGpa(v.desc, 16ull * v.num, &r->desc) ||
      !pvdma_.QemuVaToGpa(v.avail, 6 + 2ull * v.num, &r->avail) ||
      !pvdma_.QemuVaToGpa(v.used, 6 + 8ull * v.num, &r->used))
    return false;
  if (!qs_[q].inited) {
    uint16_t u;
    if (!pvdma_.Read(r->used + 2, &u, 2)) return false;
    qs_[q].used_idx = le16toh(u);
    qs_[q].inited = true;
  }
  return true;
}

Device::Pop Device::PopChain(uint32_t q, const Ring& r, Chain* c) {
  Vring& v = session_.mutable_vring(q);
  uint16_t avail_idx;
  if (!pvdma_.Read(r.avail + 2, &avail_idx, 2)) return Pop::kBroken;
  avail_idx = le16toh(avail_idx);
  std::atomic_thread_fence(std::memory_order_acquire);
  const uint16_t pending = uint16_t(avail_idx - v.last_avail);
  if (pending == 0) return Pop::kNone;
  if (pending > r.num) return Pop::kBroken;  // the driver claims more than the ring holds
  uint16_t head;
  if (!pvdma_.Read(r.avail + 4 + 2ull * (v.last_avail % r.num), &head, 2)) return Pop::kBroken;
  head = le16toh(head);
  v.last_avail++;
  *c = Chain{};
  c->head = head;
  if (head >= r.num) return Pop::kBroken;

  uint64_t table = r.desc;
  uint32_t size = r.num, i = head, seen = 0;
  bool indirect = false;
  for (;;) {
    Desc d;
    if (!pvdma_.Read(table + 16ull * i, &d, sizeof(d))) return Pop::kBadChain;
    const uint16_t flags = le16toh(d.flags);
    const uint64_t addr = le64toh(d.addr);
    const uint32_t len = le32toh(d.len);
    if (++seen > size) return Pop::kBadChain;  // a loop
    if (flags & kDescIndirect) {
      if (indirect || (flags & kDescNext) || len == 0 || len % 16 || len / 16 > kMaxIndirect ||
          !pvdma_.Contains(addr, len))
        return Pop::kBadChain;
      if (!(session_.acked_features() & Bit(kFeatureIndirectDesc))) return Pop::kBadChain;
      indirect = true;
      table = addr;
      size = len / 16;
      i = 0;
      seen = 0;
      continue;
    }
    if (flags & kDescWrite) {
      c->wr.push_back({addr, len});
      c->wr_len += len;
    } else {
      if (!c->wr.empty()) return Pop::kBadChain;  // readable after writable
      c->rd.push_back({addr, len});
      c->rd_len += len;
    }
    if (!(flags & kDescNext)) break;
    i = le16toh(d.next);
    if (i >= size) return Pop::kBadChain;
  }
  return Pop::kChain;
}

void Device::PushUsed(uint32_t q, const Ring& r, uint16_t head, uint32_t len) {
  QueueState& s = qs_[q];
  const uint32_t elem[2] = {htole32(head), htole32(len)};
  pvdma_.Write(r.used + 4 + 8ull * (s.used_idx % r.num), elem, sizeof(elem));
  std::atomic_thread_fence(std::memory_order_release);
  s.used_idx++;
  const uint16_t idx = htole16(s.used_idx);
  pvdma_.Write(r.used + 2, &idx, 2);
}

void Device::Notify(uint32_t q, const Ring& r, uint16_t old_used) {
  const Vring& v = session_.vring(q);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  bool need = true;
  const uint16_t new_used = qs_[q].used_idx;
  if (new_used == old_used) return;
  if (session_.acked_features() & Bit(kFeatureEventIdx)) {
    uint16_t ev;
    if (pvdma_.Read(r.avail + 4 + 2ull * r.num, &ev, 2)) {
      ev = le16toh(ev);
      need = uint16_t(new_used - ev - 1) < uint16_t(new_used - old_used);
    }
  } else {
    uint16_t flags;
    if (pvdma_.Read(r.avail, &flags, 2)) need = !(le16toh(flags) & kAvailNoInterrupt);
  }
  if (need && v.call) {
    uint64_t one = 1;
    (void)!write(v.call.get(), &one, sizeof(one));
  }
}

void Device::Fatal(const std::string& why) {
  if (fatal_) return;
  fatal_ = true;
  fatal_why_ = why;
  auto& c = session_.mutable_device().config;
  c.device_status = htole32(le32toh(c.device_status) | VSTELLAR_DEV_S_FATAL);
  PostEvent(VSTELLAR_EV_DEVICE_FATAL, 0, 0, VSTELLAR_STATUS_DEVICE_FATAL);
}

void Device::ProcessControl() {
  const uint32_t q = VSTELLAR_VQ_CONTROL;
  Ring r;
  if (!RingOf(q, &r)) return;
  const uint16_t old_used = qs_[q].used_idx;
  const uint64_t max_req = sizeof(vstellar_cmd_hdr) + sizeof(vstellar_cmd_create_qp) +
                           8ull * cfg32(session_.device().config.max_cmd_pages);
  for (;;) {
    Chain c;
    Pop p = PopChain(q, r, &c);
    if (p == Pop::kNone) {
      if (!(session_.acked_features() & Bit(kFeatureEventIdx))) break;
      // Tell the driver where to kick next, then look once more (race).
      const uint16_t ae = htole16(session_.vring(q).last_avail);
      pvdma_.Write(r.used + 4 + 8ull * r.num, &ae, 2);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      p = PopChain(q, r, &c);
      if (p == Pop::kNone) break;
    }
    if (p == Pop::kBroken) {
      qs_[q].broken = true;
      Fatal("control queue: corrupt available ring");
      break;
    }
    if (p == Pop::kBadChain) {
      commands_++;
      commands_failed_++;
      PushUsed(q, r, c.head, 0);
      continue;
    }
    // Copy the whole request out of guest memory first (no double fetch).
    std::vector<uint8_t> resp;
    uint16_t status = VSTELLAR_STATUS_OK;
    vstellar_cmd_hdr h{};
    std::vector<uint8_t> req;
    if (c.rd_len > max_req || c.rd_len < sizeof(h)) {
      status = VSTELLAR_STATUS_BAD_LENGTH;
      if (c.rd_len >= sizeof(h) && !c.rd.empty())
        pvdma_.Read(c.rd[0].gpa, &h, std::min<uint64_t>(sizeof(h), c.rd[0].len));
    } else {
      req.resize(c.rd_len);
      uint64_t off = 0;
      for (const Seg& s : c.rd) {
        if (!pvdma_.Read(s.gpa, req.data() + off, s.len)) {
          status = VSTELLAR_STATUS_BAD_ADDRESS;
          break;
        }
        off += s.len;
      }
      if (sh_.after_copy) sh_.after_copy(id_);
      std::memcpy(&h, req.data(), std::min(req.size(), sizeof(h)));
    }
    if (status == VSTELLAR_STATUS_OK) {
      // Room for the response must be there before anything executes.
      const OpInfo info = Info(le16toh(h.opcode));
      if (c.wr_len < sizeof(vstellar_resp_hdr) + info.resp) status = VSTELLAR_STATUS_BAD_LENGTH;
      else if (fatal_) status = VSTELLAR_STATUS_DEVICE_FATAL;
      else status = Execute(req, &resp);
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
    if (c.wr_len >= sizeof(rh)) {
      for (const Seg& s : c.wr) {
        if (written == out.size()) break;
        const uint32_t n = std::min<uint32_t>(s.len, uint32_t(out.size() - written));
        if (!pvdma_.Write(s.gpa, out.data() + written, n)) {
          written = 0;  // response buffer outside guest memory
          break;
        }
        written += n;
      }
    }
    PushUsed(q, r, c.head, written);
  }
  Notify(q, r, old_used);
}

bool Device::PushToQueue(uint32_t q, const void* data, uint32_t len) {
  Ring r;
  if (q >= session_.num_vrings() || !RingOf(q, &r)) return false;
  const uint16_t old_used = qs_[q].used_idx;
  for (;;) {
    Chain c;
    Pop p = PopChain(q, r, &c);
    if (p == Pop::kNone) return false;
    if (p == Pop::kBroken) {
      qs_[q].broken = true;
      return false;
    }
    if (p == Pop::kBadChain || !c.rd.empty() || c.wr_len < len) {
      PushUsed(q, r, c.head, 0);  // unusable buffer: give it back empty
      Notify(q, r, old_used);
      continue;
    }
    uint32_t written = 0;
    for (const Seg& s : c.wr) {
      if (written == len) break;
      const uint32_t n = std::min(s.len, len - written);
      if (!pvdma_.Write(s.gpa, static_cast<const uint8_t*>(data) + written, n)) break;
      written += n;
    }
    PushUsed(q, r, c.head, written);
    Notify(q, r, old_used);
    return written == len;
  }
}

void Device::PostEvent(uint16_t type, uint32_t object, uint32_t ucontext, uint32_t info) {
  vstellar_event e{};
  e.type = htole16(type);
  e.object = htole32(object);
  e.ucontext = htole32(ucontext);
  e.info = htole32(info);
  if (events_.size() >= 64) {
    events_dropped_++;
    if (!fatal_) {
      // An event lost is a state the driver cannot trust.
      fatal_ = true;
      auto& cf = session_.mutable_device().config;
      cf.device_status = htole32(le32toh(cf.device_status) | VSTELLAR_DEV_S_FATAL);
    }
    return;
  }
  events_.push_back(e);
  FlushEvents();
}

void Device::FlushEvents() {
  while (!events_.empty()) {
    if (!PushToQueue(VSTELLAR_VQ_EVENT, &events_.front(), sizeof(vstellar_event))) return;
    events_.pop_front();
    events_n_++;
  }
}

void Device::FlushCqNotifies() {
  for (uint32_t i = 0; i < VSTELLAR_MAX_CQ_QUEUES; i++) {
    auto& dq = cq_notifies_[i];
    while (!dq.empty()) {
      if (!PushToQueue(VSTELLAR_VQ_CQN0 + i, &dq.front(), sizeof(vstellar_cq_notify))) break;
      dq.pop_front();
      cq_notify_n_++;
    }
  }
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
  }
  if (e.type == T::CQ_ERR) {
    for (auto& [h, c] : cqs_)
      if (c.cq->cqn() == e.qpn_or_cqn) {
        object = h;
        owner = c.owner;
      }
  } else if (auto it = qps_.find(e.qpn_or_cqn); it != qps_.end()) {
    owner = it->second.owner;
  }
  PostEvent(type, object, owner, 0);
}

bool Device::OwnsEngineCq(const vstellar::Cq* cq) const {
  for (auto& [h, c] : cqs_)
    if (c.cq == cq) return true;
  return false;
}

// ------------------------------------------------------------------ objects

void Device::DestroyQp(uint32_t qpn) {
  auto it = qps_.find(qpn);
  if (it == qps_.end()) return;
  sh_.engine->destroy_qp(it->second.qp);
  FreeSlot(it->second.owner, it->second.slot);
  qps_.erase(it);
}

void Device::DestroyAllOf(uint32_t uctx) {
  std::vector<uint32_t> v;
  for (auto& [n, q] : qps_)
    if (q.owner == uctx) v.push_back(n);
  for (uint32_t n : v) DestroyQp(n);
  for (auto it = mrs_.begin(); it != mrs_.end();) {
    if (it->second.owner == uctx) {
      sh_.engine->dereg_mr(it->second.mr);
      it = mrs_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = cqs_.begin(); it != cqs_.end();) {
    if (it->second.owner == uctx) {
      sh_.engine->destroy_cq(it->second.cq);
      it = cqs_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = pds_.begin(); it != pds_.end();) {
    if (it->second.owner == uctx) {
      if (it->second.dma_mr) sh_.engine->dereg_mr(it->second.dma_mr);
      sh_.engine->dealloc_pd(it->second.pd);
      it = pds_.erase(it);
    } else {
      ++it;
    }
  }
}

void Device::ResetState() {
  if (!sh_.engine) return;
  std::vector<uint32_t> owners;
  for (auto& [h, u] : uctx_) owners.push_back(h);
  for (uint32_t o : owners) DestroyAllOf(o);
  DestroyAllOf(0);
  uctx_.clear();
  db_pages_used_.clear();
  gids_.clear();
  events_.clear();
  for (auto& d : cq_notifies_) d.clear();
  fatal_ = false;
  polling_ = false;
  auto& c = session_.mutable_device().config;
  c.device_status = htole32(le32toh(c.device_status) & ~VSTELLAR_DEV_S_FATAL);
}

uint16_t Device::AllocSlot(uint32_t uctx, uint32_t* slot) {
  *slot = 0;
  // Kernel objects get a slot once the kernel has its page (KERNEL_DB).
  if (uctx == 0 && !uctx_.count(0)) return VSTELLAR_STATUS_OK;
  UContext& u = uctx_.at(uctx);
  for (uint32_t i = VSTELLAR_DB_FIRST_SLOT; i < VSTELLAR_DB_SLOTS_PER_PAGE; i++)
    if (!u.slots[i]) {
      u.slots[i] = true;
      *slot = i;
      return VSTELLAR_STATUS_OK;
    }
  return VSTELLAR_STATUS_LIMIT;
}

void Device::FreeSlot(uint32_t uctx, uint32_t slot) {
  auto it = uctx_.find(uctx);
  if (it != uctx_.end() && slot < it->second.slots.size()) it->second.slots[slot] = false;
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
  s.cq_notifies = cq_notify_n_;
  s.fatal = fatal_;
  s.ucontexts = uint32_t(uctx_.size());
  s.pds = uint32_t(pds_.size());
  s.cqs = uint32_t(cqs_.size());
  s.qps = uint32_t(qps_.size());
  s.mrs = uint32_t(mrs_.size());
  s.wqes = wqes_;
  s.bad_wqes = bad_wqes_;
  s.cqes = cqes_;
  s.cq_overflows = cq_overflows_;
  s.db_kicks = db_kicks_;
  s.idle_entries = idle_entries_;
  s.polling = polling_;
  return s;
}

// ------------------------------------------------------------------ commands

uint16_t Device::CheckUctx(uint32_t uctx) const {
  return (uctx == 0 || uctx_.count(uctx)) ? VSTELLAR_STATUS_OK : VSTELLAR_STATUS_BAD_HANDLE;
}

uint16_t Device::ReadPages(const uint8_t* p, uint32_t n, uint32_t shift, std::vector<uint64_t>* out) const {
  out->resize(n);
  const uint64_t ps = uint64_t{1} << shift;
  for (uint32_t i = 0; i < n; i++) {
    const uint64_t a = le64toh(Get<uint64_t>(p + 8ull * i));
    if (a & (ps - 1)) return VSTELLAR_STATUS_BAD_FIELD;
    if (!pvdma_.Contains(a, ps)) return VSTELLAR_STATUS_BAD_ADDRESS;
    (*out)[i] = a;
  }
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::Execute(const std::vector<uint8_t>& req, std::vector<uint8_t>* resp) {
  vstellar_cmd_hdr h;
  std::memcpy(&h, req.data(), sizeof(h));
  const uint16_t op = le16toh(h.opcode);
  const uint32_t uctx = le32toh(h.ucontext), len = le32toh(h.length);
  if (op == 0 || op > VSTELLAR_CMD_MAX) return VSTELLAR_STATUS_BAD_OPCODE;
  if (h.flags != 0) return VSTELLAR_STATUS_BAD_FIELD;
  if (len > req.size() - sizeof(h)) return VSTELLAR_STATUS_BAD_LENGTH;
  const OpInfo info = Info(op);
  if (info.pages ? len < info.body : len != info.body) return VSTELLAR_STATUS_BAD_LENGTH;
  const uint8_t* b = req.data() + sizeof(h);
  if (op != VSTELLAR_CMD_ALLOC_UCONTEXT && op != VSTELLAR_CMD_DEALLOC_UCONTEXT)
    if (uint16_t s = CheckUctx(uctx)) return s;
  switch (op) {
    case VSTELLAR_CMD_QUERY_DEVICE: return CmdQueryDevice(resp);
    case VSTELLAR_CMD_QUERY_PORT: return CmdQueryPort(b, resp);
    case VSTELLAR_CMD_ALLOC_UCONTEXT: return CmdAllocUctx(uctx, resp);
    case VSTELLAR_CMD_DEALLOC_UCONTEXT: return CmdDeallocUctx(uctx, b);
    case VSTELLAR_CMD_ALLOC_PD: return CmdAllocPd(uctx, resp);
    case VSTELLAR_CMD_DEALLOC_PD: return CmdDeallocPd(uctx, b);
    case VSTELLAR_CMD_CREATE_CQ: return CmdCreateCq(uctx, b, len, resp);
    case VSTELLAR_CMD_DESTROY_CQ: return CmdDestroyCq(uctx, b);
    case VSTELLAR_CMD_REQ_NOTIFY_CQ: return CmdReqNotify(uctx, b);
    case VSTELLAR_CMD_CREATE_QP: return CmdCreateQp(uctx, b, len, resp);
    case VSTELLAR_CMD_MODIFY_QP: return CmdModifyQp(uctx, b);
    case VSTELLAR_CMD_QUERY_QP: return CmdQueryQp(uctx, b, resp);
    case VSTELLAR_CMD_DESTROY_QP: return CmdDestroyQp(uctx, b);
    case VSTELLAR_CMD_REG_MR: return CmdRegMr(uctx, b, len, resp);
    case VSTELLAR_CMD_DEREG_MR: return CmdDeregMr(uctx, b);
    case VSTELLAR_CMD_ADD_GID: return CmdGid(uctx, true, b);
    case VSTELLAR_CMD_DEL_GID: return CmdGid(uctx, false, b);
    case VSTELLAR_CMD_KERNEL_DB: return CmdKernelDb(uctx, resp);
    case VSTELLAR_CMD_RESIZE_CQ:  // not implemented yet (moving outstanding CQEs)
    case VSTELLAR_CMD_CREATE_AH:  // reserved: UD WQEs carry their address vector
    case VSTELLAR_CMD_DESTROY_AH:
      return VSTELLAR_STATUS_UNSUPPORTED;
  }
  return VSTELLAR_STATUS_BAD_OPCODE;
}

uint16_t Device::CmdQueryDevice(std::vector<uint8_t>* resp) {
  const virtio_vstellar_config& c = session_.device().config;
  vstellar_resp_query_device r{};
  r.fw_version = htole64(1);
  std::memcpy(r.sys_image_guid, c.node_guid, 8);
  r.vendor_id = htole32(VSTELLAR_PCI_VENDOR_ID);
  r.vendor_part_id = htole32(VSTELLAR_PCI_DEVICE_ID);
  r.hw_version = htole32(1);
  r.device_cap_flags = htole32(VSTELLAR_DEVCAP_RC_RNR_NAK_GEN | VSTELLAR_DEVCAP_SYS_IMAGE_GUID);
  r.max_qp = c.max_qp;
  r.max_qp_wr = c.max_qp_wr;
  r.max_send_sge = c.max_send_sge;
  r.max_recv_sge = c.max_recv_sge;
  r.max_cq = c.max_cq;
  r.max_cqe = c.max_cqe;
  r.max_mr = c.max_mr;
  r.max_pd = c.max_pd;
  r.max_ah = c.max_ah;
  r.max_qp_rd_atom = c.max_qp_rd_atom;
  r.max_qp_init_rd_atom = c.max_qp_init_rd_atom;
  r.max_inline_data = c.max_inline_data;
  r.max_mr_size = c.max_mr_size;
  r.page_size_cap = c.page_size_cap;
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdQueryPort(const uint8_t* b, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_query_port>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  if (le32toh(cmd.port) != 1) return VSTELLAR_STATUS_BAD_FIELD;
  const virtio_vstellar_config& c = session_.device().config;
  vstellar_resp_query_port r{};
  r.state = 4;       // ACTIVE
  r.phys_state = 5;  // LINK_UP
  r.max_mtu = 5;
  r.active_mtu = 5;
  r.active_speed = 0x40;  // IB_SPEED_HDR (100 Gb/s class)
  r.active_width = 2;     // 4X
  r.gid_table_len = c.gid_table_len;
  r.max_msg_size = c.max_msg_size;
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

// A doorbell page for a user context (key = its handle) or the kernel (key 0).
uint16_t Device::AddDbContext(uint32_t key, uint32_t* page_out) {
  const virtio_vstellar_config& c = session_.device().config;
  uint32_t pages = cfg32(c.max_ucontext);
  // The doorbell region bounds the pages when the frontend gave us one.
  for (const MemRegion& r : session_.regions())
    if (r.doorbell) pages = std::min<uint64_t>(pages, r.size / VSTELLAR_DB_PAGE_SIZE);
  if (uctx_.size() >= cfg32(c.max_ucontext)) return VSTELLAR_STATUS_LIMIT;
  db_pages_used_.resize(pages, false);
  uint32_t page = 0;
  while (page < pages && db_pages_used_[page]) page++;
  if (page >= pages) return VSTELLAR_STATUS_LIMIT;
  db_pages_used_[page] = true;
  UContext u;
  u.db_page = page;
  u.slots.assign(VSTELLAR_DB_SLOTS_PER_PAGE, false);
  uctx_[key] = std::move(u);
  // A fresh page: every slot zero, and need_kick set (the device is idle
  // for this context until its first kick).
  if (uint8_t* p = DbPage(key)) {
    std::memset(p, 0, VSTELLAR_DB_PAGE_SIZE);
    std::atomic_thread_fence(std::memory_order_release);
    __atomic_store_n(reinterpret_cast<uint32_t*>(p), htole32(1u), __ATOMIC_SEQ_CST);
  }
  *page_out = page;
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdAllocUctx(uint32_t uctx, std::vector<uint8_t>* resp) {
  if (uctx != 0) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t handle = next_handle_++;
  uint32_t page = 0;
  if (uint16_t s = AddDbContext(handle, &page)) return s;
  vstellar_resp_alloc_ucontext r{htole32(handle), htole32(page)};
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

bool Device::DatagramsOn() const {
  return session_.acked_features() & Bit(VIRTIO_VSTELLAR_F_UD);
}

uint16_t Device::CmdKernelDb(uint32_t uctx, std::vector<uint8_t>* resp) {
  if (uctx != 0) return VSTELLAR_STATUS_ACCESS;
  if (!DatagramsOn()) return VSTELLAR_STATUS_UNSUPPORTED;
  if (uctx_.count(0)) return VSTELLAR_STATUS_BUSY;
  uint32_t page = 0;
  if (uint16_t s = AddDbContext(0, &page)) return s;
  vstellar_resp_kernel_db r{htole32(page), 0};
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdDeallocUctx(uint32_t uctx, const uint8_t* b) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (uctx != 0 || cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t handle = le32toh(cmd.handle);
  auto it = uctx_.find(handle);
  if (handle == 0 || it == uctx_.end()) return VSTELLAR_STATUS_BAD_HANDLE;  // 0: the kernel's page
  DestroyAllOf(handle);
  if (it->second.db_page < db_pages_used_.size()) db_pages_used_[it->second.db_page] = false;
  uctx_.erase(it);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdAllocPd(uint32_t uctx, std::vector<uint8_t>* resp) {
  if (pds_.size() >= cfg32(session_.device().config.max_pd)) return VSTELLAR_STATUS_LIMIT;
  vstellar::Pd* pd = sh_.engine->alloc_pd();
  if (!pd) return VSTELLAR_STATUS_NO_RESOURCES;
  PdObj o{uctx, pd};
  if (uctx == 0 && DatagramsOn()) {
    // The local DMA lkey's MR: all guest-physical space, local access only.
    o.dma_mr = sh_.engine->reg_mr(pd, 0, uint64_t{1} << 52, vstellar::ACCESS_LOCAL_WRITE,
                                  std::make_shared<GpaTranslator>(pvdma_));
    if (!o.dma_mr) {
      sh_.engine->dealloc_pd(pd);
      return VSTELLAR_STATUS_NO_RESOURCES;
    }
  }
  const uint32_t h = next_handle_++;
  pds_[h] = o;
  vstellar_resp_alloc_pd r{htole32(h), 0};
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdDeallocPd(uint32_t uctx, const uint8_t* b) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = pds_.find(le32toh(cmd.handle));
  if (it == pds_.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (it->second.pd->refs > (it->second.dma_mr ? 1u : 0u)) return VSTELLAR_STATUS_BUSY;
  if (it->second.dma_mr) sh_.engine->dereg_mr(it->second.dma_mr);
  if (sh_.engine->dealloc_pd(it->second.pd)) return VSTELLAR_STATUS_BUSY;
  pds_.erase(it);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdCreateCq(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_create_cq>(b);
  const virtio_vstellar_config& c = session_.device().config;
  const uint32_t log_cqe = le32toh(cmd.log_cqe), cq_queue = le32toh(cmd.cq_queue);
  const uint32_t shift = le32toh(cmd.page_shift), n = le32toh(cmd.num_pages);
  const uint64_t ring_off = le64toh(cmd.ring_offset);
  if (uint64_t(len) != sizeof(cmd) + 8ull * n) return VSTELLAR_STATUS_BAD_LENGTH;
  if (shift >= 64 || !(le64toh(c.page_size_cap) & Bit(int(shift)))) return VSTELLAR_STATUS_BAD_FIELD;
  if (log_cqe >= 32 || (uint64_t{1} << log_cqe) > cfg32(c.max_cqe)) return VSTELLAR_STATUS_LIMIT;
  if (cq_queue >= VSTELLAR_MAX_CQ_QUEUES || session_.vring(VSTELLAR_VQ_CQN0 + cq_queue).num == 0)
    return VSTELLAR_STATUS_BAD_FIELD;
  if (ring_off >= (uint64_t{1} << shift) || ring_off % sizeof(vstellar_cqe)) return VSTELLAR_STATUS_BAD_FIELD;
  if (n > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  if (n != PagesFor(ring_off, uint64_t(sizeof(vstellar_cqe)) << log_cqe, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  if (cqs_.size() >= cfg32(c.max_cq)) return VSTELLAR_STATUS_LIMIT;
  CqObj o{};
  if (uint16_t s = ReadPages(b + sizeof(cmd), n, shift, &o.pages)) return s;
  if (uint16_t s = AllocSlot(uctx, &o.slot)) return s;
  o.cq = sh_.engine->create_cq(1u << log_cqe);
  if (!o.cq) {
    FreeSlot(uctx, o.slot);
    return VSTELLAR_STATUS_NO_RESOURCES;
  }
  o.owner = uctx;
  o.cq_queue = cq_queue;
  o.log_cqe = log_cqe;
  o.page_shift = shift;
  o.ring_offset = ring_off;
  const uint32_t h = next_handle_++;
  // Completions go straight into the guest's CQE ring (datapath.cc), which
  // also raises the CQ notification of an armed CQ.
  o.cq->on_completion = [this, h](vstellar::Cq&) { DrainCq(h); };
  cqs_[h] = std::move(o);
  ResetDbSlot(uctx, cqs_[h].slot);
  vstellar_resp_create_cq r{htole32(h), htole32(cqs_[h].slot)};
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdDestroyCq(uint32_t uctx, const uint8_t* b) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = cqs_.find(le32toh(cmd.handle));
  if (it == cqs_.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (it->second.cq->refs) return VSTELLAR_STATUS_BUSY;
  if (sh_.engine->destroy_cq(it->second.cq)) return VSTELLAR_STATUS_BUSY;
  FreeSlot(uctx, it->second.slot);
  cqs_.erase(it);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdReqNotify(uint32_t uctx, const uint8_t* b) {
  auto cmd = Get<vstellar_cmd_req_notify_cq>(b);
  const uint32_t f = le32toh(cmd.flags);
  auto it = cqs_.find(le32toh(cmd.cqn));
  if (it == cqs_.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (f != VSTELLAR_NOTIFY_NEXT_COMP && f != VSTELLAR_NOTIFY_SOLICITED) return VSTELLAR_STATUS_BAD_FIELD;
  it->second.armed = true;
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdCreateQp(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_create_qp>(b);
  const virtio_vstellar_config& c = session_.device().config;
  const uint32_t sqp = le32toh(cmd.sq_pages), rqp = le32toh(cmd.rq_pages);
  if (uint64_t(len) != sizeof(cmd) + 8ull * (uint64_t(sqp) + rqp)) return VSTELLAR_STATUS_BAD_LENGTH;
  if (cmd.reserved0) return VSTELLAR_STATUS_BAD_FIELD;
  auto pd = pds_.find(le32toh(cmd.pdn));
  auto scq = cqs_.find(le32toh(cmd.send_cqn));
  auto rcq = cqs_.find(le32toh(cmd.recv_cqn));
  if (pd == pds_.end() || pd->second.owner != uctx || scq == cqs_.end() || scq->second.owner != uctx ||
      rcq == cqs_.end() || rcq->second.owner != uctx)
    return VSTELLAR_STATUS_BAD_HANDLE;
  const uint8_t type = cmd.qp_type;
  if (type == VSTELLAR_QPT_UD || type == VSTELLAR_QPT_GSI) {
    if (!DatagramsOn()) return VSTELLAR_STATUS_UNSUPPORTED;
    if (type == VSTELLAR_QPT_GSI) {
      if (uctx != 0) return VSTELLAR_STATUS_UNSUPPORTED;  // QP 1 is the kernel's MAD layer's
      for (auto& [n, q] : qps_)
        if (q.type == VSTELLAR_QPT_GSI) return VSTELLAR_STATUS_LIMIT;  // one QP 1 per device
    }
  } else if (type != VSTELLAR_QPT_RC) {
    return VSTELLAR_STATUS_BAD_FIELD;
  }
  if (cmd.sq_sig_all > 1) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t shift = cmd.page_shift;
  if (shift >= 64 || !(le64toh(c.page_size_cap) & Bit(int(shift)))) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t ssge = le32toh(cmd.max_send_sge), rsge = le32toh(cmd.max_recv_sge);
  const uint32_t inl = le32toh(cmd.max_inline_data);
  if (cmd.sq_log_wqe >= 32 || cmd.rq_log_wqe >= 32 || (1ull << cmd.sq_log_wqe) > cfg32(c.max_qp_wr) ||
      (1ull << cmd.rq_log_wqe) > cfg32(c.max_qp_wr) || ssge > cfg32(c.max_send_sge) ||
      rsge > cfg32(c.max_recv_sge) || inl > cfg32(c.max_inline_data))
    return VSTELLAR_STATUS_LIMIT;
  if (cmd.sq_log_stride < 6 || cmd.sq_log_stride > 12 || cmd.rq_log_stride < 4 || cmd.rq_log_stride > 12)
    return VSTELLAR_STATUS_BAD_FIELD;
  // A WQE with its SGEs (or inline data) must fit one slot.
  const uint64_t sstride = 1ull << cmd.sq_log_stride, rstride = 1ull << cmd.rq_log_stride;
  if (sizeof(vstellar_send_wqe) + 16ull * ssge > sstride || sizeof(vstellar_send_wqe) + inl > sstride ||
      sizeof(vstellar_recv_wqe) + 16ull * rsge > rstride)
    return VSTELLAR_STATUS_BAD_FIELD;
  const uint64_t ps = 1ull << shift, soff = le64toh(cmd.sq_offset), roff = le64toh(cmd.rq_offset);
  if (soff >= ps || roff >= ps || soff % 64 || roff % 16) return VSTELLAR_STATUS_BAD_FIELD;
  if (uint64_t(sqp) + rqp > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  if (sqp != PagesFor(soff, sstride << cmd.sq_log_wqe, shift) || rqp != PagesFor(roff, rstride << cmd.rq_log_wqe, shift))
    return VSTELLAR_STATUS_BAD_FIELD;
  if (qps_.size() >= cfg32(c.max_qp)) return VSTELLAR_STATUS_LIMIT;
  QpObj o{};
  const uint8_t* pages = b + sizeof(cmd);
  if (uint16_t s = ReadPages(pages, sqp, shift, &o.sq_pages)) return s;
  if (uint16_t s = ReadPages(pages + 8ull * sqp, rqp, shift, &o.rq_pages)) return s;
  vstellar::QpInitAttr init;
  init.send_cq = scq->second.cq;
  init.recv_cq = rcq->second.cq;
  init.cap.max_send_wr = 1u << cmd.sq_log_wqe;
  init.cap.max_recv_wr = 1u << cmd.rq_log_wqe;
  init.cap.max_send_sge = ssge;
  init.cap.max_recv_sge = rsge;
  init.cap.max_inline_data = inl;
  init.sq_sig_all = cmd.sq_sig_all;
  init.qp_type = vstellar::QpType(type);
  if (uint16_t s = AllocSlot(uctx, &o.slot)) return s;
  o.qp = sh_.engine->create_qp(pd->second.pd, init);
  if (!o.qp) {
    FreeSlot(uctx, o.slot);
    return VSTELLAR_STATUS_NO_RESOURCES;
  }
  o.owner = uctx;
  o.type = type;
  o.pdn = pd->first;
  o.send_cqn = scq->first;
  o.recv_cqn = rcq->first;
  o.sq.pages = o.sq_pages;
  o.sq.shift = o.rq.shift = shift;
  o.sq.offset = soff;
  o.sq.log_n = cmd.sq_log_wqe;
  o.sq.log_stride = cmd.sq_log_stride;
  o.rq.pages = o.rq_pages;
  o.rq.offset = roff;
  o.rq.log_n = cmd.rq_log_wqe;
  o.rq.log_stride = cmd.rq_log_stride;
  o.sq_wrid.assign(size_t{1} << cmd.sq_log_wqe, 0);
  o.sq_op.assign(size_t{1} << cmd.sq_log_wqe, 0);
  o.rq_wrid.assign(size_t{1} << cmd.rq_log_wqe, 0);
  o.max_send_sge = ssge;
  o.max_recv_sge = rsge;
  o.max_inline = inl;
  ResetDbSlot(uctx, o.slot);
  const uint32_t qpn = o.qp->qpn();
  vstellar_resp_create_qp r{};
  r.qpn = htole32(qpn);
  r.db_slot = htole32(o.slot);
  r.max_send_sge = htole32(ssge);
  r.max_recv_sge = htole32(rsge);
  r.max_inline_data = htole32(inl);
  qps_[qpn] = std::move(o);
  if (type == VSTELLAR_QPT_GSI) SyncGsiGids();
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdModifyQp(uint32_t uctx, const uint8_t* b) {
  auto cmd = Get<vstellar_cmd_modify_qp>(b);
  const vstellar_qp_attr& a = cmd.attr;
  auto it = qps_.find(le32toh(cmd.qpn));
  if (it == qps_.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (cmd.reserved || a.reserved || !IsZero(a.av.reserved, sizeof(a.av.reserved))) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t mask = le32toh(a.attr_mask);
  if (mask & ~VSTELLAR_QP_ATTR_MASK_VALID) return VSTELLAR_STATUS_BAD_FIELD;
  vstellar::QpAttr qa;
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
  const virtio_vstellar_config& c = session_.device().config;
  if (((mask & VSTELLAR_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > cfg32(c.max_qp_init_rd_atom)) ||
      ((mask & VSTELLAR_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > cfg32(c.max_qp_rd_atom)))
    return VSTELLAR_STATUS_LIMIT;
  if (mask & VSTELLAR_QP_AV) {
    // RoCEv2-style: the GID is an IPv4-mapped IPv6 address of the peer host.
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(a.av.dgid, v4mapped, 12) != 0) return VSTELLAR_STATUS_BAD_FIELD;
    uint32_t ip;
    std::memcpy(&ip, a.av.dgid + 12, 4);
    qa.ah.ip = be32toh(ip);
    qa.ah.port = sh_.peer_port;
    if (qa.ah.ip == 0) return VSTELLAR_STATUS_BAD_FIELD;
  }
  vstellar::Qp* qp = it->second.qp;
  const uint8_t cur = uint8_t(qp->state());
  if ((mask & VSTELLAR_QP_CUR_STATE) && a.cur_qp_state != cur) return VSTELLAR_STATUS_BAD_STATE;
  const uint8_t next = (mask & VSTELLAR_QP_STATE) ? a.qp_state : cur;
  if (!ValidTransition(cur, next)) return VSTELLAR_STATUS_BAD_STATE;
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
  // Our attr_mask bits are the IB (and engine) numbering. The engine checks
  // which attributes each transition requires and allows.
  if (sh_.engine->modify_qp(qp, qa, mask)) return VSTELLAR_STATUS_BAD_FIELD;
  OnQpModified(it->second, next);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdQueryQp(uint32_t uctx, const uint8_t* b, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = qps_.find(le32toh(cmd.handle));
  if (it == qps_.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  vstellar::QpAttr qa;
  vstellar::QpInitAttr init;
  if (sh_.engine->query_qp(it->second.qp, qa, init)) return VSTELLAR_STATUS_INTERNAL;
  vstellar_resp_query_qp r{};
  vstellar_qp_attr& a = r.attr;
  a.attr_mask = htole32(VSTELLAR_QP_ATTR_MASK_VALID);
  a.qp_state = uint8_t(it->second.qp->state());
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
  if (qa.ah.ip) {
    a.av.dgid[10] = a.av.dgid[11] = 0xff;
    const uint32_t ip = htobe32(qa.ah.ip);
    std::memcpy(a.av.dgid + 12, &ip, 4);
  }
  r.sq_draining = htole32(qa.sq_draining);
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdDestroyQp(uint32_t uctx, const uint8_t* b) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = qps_.find(le32toh(cmd.handle));
  if (it == qps_.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  DestroyQp(it->first);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdRegMr(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_reg_mr>(b);
  const virtio_vstellar_config& c = session_.device().config;
  const uint32_t n = le32toh(cmd.num_pages), shift = le32toh(cmd.page_shift);
  const uint32_t access = le32toh(cmd.access_flags);
  const uint64_t iova = le64toh(cmd.iova), length = le64toh(cmd.length);
  if (uint64_t(len) != sizeof(cmd) + 8ull * n) return VSTELLAR_STATUS_BAD_LENGTH;
  auto pd = pds_.find(le32toh(cmd.pdn));
  if (pd == pds_.end() || pd->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (access & ~VSTELLAR_ACCESS_VALID) return VSTELLAR_STATUS_BAD_FIELD;
  if ((access & (VSTELLAR_ACCESS_REMOTE_WRITE | VSTELLAR_ACCESS_REMOTE_ATOMIC)) &&
      !(access & VSTELLAR_ACCESS_LOCAL_WRITE))
    return VSTELLAR_STATUS_BAD_FIELD;
  if (shift >= 64 || !(le64toh(c.page_size_cap) & Bit(int(shift)))) return VSTELLAR_STATUS_BAD_FIELD;
  if (length == 0 || iova + length < iova) return VSTELLAR_STATUS_BAD_FIELD;
  if (length > le64toh(c.max_mr_size)) return VSTELLAR_STATUS_LIMIT;
  if (n > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  const uint64_t off = iova & ((1ull << shift) - 1);
  if (n != PagesFor(off, length, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  if (mrs_.size() >= cfg32(c.max_mr)) return VSTELLAR_STATUS_LIMIT;
  MrLayout l;
  l.iova = iova;
  l.length = length;
  l.page_shift = shift;
  if (uint16_t s = ReadPages(b + sizeof(cmd), n, shift, &l.pages)) return s;
  uint16_t status = VSTELLAR_STATUS_OK;
  std::shared_ptr<vstellar::MemoryTranslator> t;
  if (sh_.translation == TranslationMode::kEmtt) t = EmttTranslator::Create(pvdma_, std::move(l), &status);
  else t = AtcTranslator::Create(pvdma_, *sh_.atc, std::move(l), &status);
  if (!t) return status ? status : uint16_t(VSTELLAR_STATUS_INTERNAL);
  vstellar::Mr* mr = sh_.engine->reg_mr(pd->second.pd, iova, length, access, std::move(t));
  if (!mr) return VSTELLAR_STATUS_NO_RESOURCES;
  const uint32_t h = next_handle_++;
  mrs_[h] = MrObj{uctx, mr, pd->first};
  vstellar_resp_reg_mr r{};
  r.mrn = htole32(h);
  r.lkey = htole32(mr->lkey());
  r.rkey = htole32(mr->rkey());
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdDeregMr(uint32_t uctx, const uint8_t* b) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = mrs_.find(le32toh(cmd.handle));
  if (it == mrs_.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (sh_.engine->dereg_mr(it->second.mr)) return VSTELLAR_STATUS_INTERNAL;
  mrs_.erase(it);
  return VSTELLAR_STATUS_OK;
}

uint16_t Device::CmdGid(uint32_t uctx, bool add, const uint8_t* b) {
  auto cmd = Get<vstellar_cmd_gid>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  if (uctx != 0) return VSTELLAR_STATUS_ACCESS;  // the kernel's GID cache only
  if (le32toh(cmd.port) != 1) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t index = le32toh(cmd.index);
  if (index >= cfg32(session_.device().config.gid_table_len)) return VSTELLAR_STATUS_BAD_FIELD;
  if (!add) {
    if (!gids_.erase(index)) return VSTELLAR_STATUS_BAD_HANDLE;
    SyncGsiGids();
    return VSTELLAR_STATUS_OK;
  }
  if (le32toh(cmd.gid_type) != VSTELLAR_GID_TYPE_ROCE_V2) return VSTELLAR_STATUS_BAD_FIELD;
  std::array<uint8_t, 16> g;
  std::memcpy(g.data(), cmd.gid, 16);
  gids_[index] = g;
  SyncGsiGids();
  return VSTELLAR_STATUS_OK;
}

// The GSI QP answers to QP 1 for exactly the device's GIDs.
void Device::SyncGsiGids() {
  for (auto& [n, q] : qps_) {
    if (q.type != VSTELLAR_QPT_GSI) continue;
    std::vector<vstellar::Gid> gids;
    for (auto& [i, g] : gids_) gids.push_back(g);
    sh_.engine->set_gsi_gids(q.qp, gids);
  }
}

}  // namespace vstellard
