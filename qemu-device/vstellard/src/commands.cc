// The control commands of one device; see include/vstellard/commands.h and
// docs/vstellard.md ("Commands").
#include "vstellard/commands.h"

#include <endian.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <memory>

#include "vstellard/translate.h"

namespace vstellard {

namespace {

// Completions the engine holds for a CQ before DrainCq moves them (one at
// a time, in practice).
constexpr uint32_t kEngineCqStaging = 256;

constexpr uint64_t Bit(int n) { return uint64_t{1} << n; }
uint32_t cfg32(const __le32& v) { return le32toh(v); }

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

Commands::Commands(DeviceShared& shared, Session& session, Pvdma& pvdma, ObjectTables& objects, DataPath& datapath)
    : sh_(shared), session_(session), pvdma_(pvdma), obj_(objects), dp_(datapath) {
  obj_.memory.set_limit(sh_.device_memory_limit);
}

// An SRQ's host memory: the engine's ring, our page list and wr_id map (an
// entry per WQE held).
uint64_t Commands::SrqBytes(uint32_t pages, const vstellar::SrqInitAttr& init) const {
  return sizeof(SrqObj) + 8ull * pages + 32ull * init.max_wr + sh_.engine->srq_footprint(init);
}

// Charges an object's host memory to this device and to the daemon before
// anything is allocated for it (memory_budget.h).
uint16_t Commands::Charge(uint64_t bytes, MemoryCharge* charge) {
  return charge->Take(obj_.memory, *sh_.memory, bytes) ? VSTELLAR_STATUS_OK : VSTELLAR_STATUS_NO_RESOURCES;
}

// Every request passes the checks its VSTELLAR_CMD_LIST entry implies (a
// known opcode, a body of the listed size, or at least that with a page
// list), then the owning context's, then goes to its command's handler.
uint16_t Commands::Execute(const std::vector<uint8_t>& req, std::vector<uint8_t>* resp) {
  vstellar_cmd_hdr h;
  if (req.size() < sizeof(h)) return VSTELLAR_STATUS_BAD_LENGTH;  // the caller checks too
  std::memcpy(&h, req.data(), sizeof(h));
  const uint16_t op = le16toh(h.opcode);
  const uint32_t uctx = le32toh(h.ucontext), len = le32toh(h.length);
  const auto* info = vstellar_cmd_info(op);
  if (!info) return VSTELLAR_STATUS_BAD_OPCODE;
  if (h.flags != 0) return VSTELLAR_STATUS_BAD_FIELD;
  if (len > req.size() - sizeof(h)) return VSTELLAR_STATUS_BAD_LENGTH;
  if ((info->flags & VSTELLAR_CMDF_PAGES) ? len < info->req_len : len != info->req_len)
    return VSTELLAR_STATUS_BAD_LENGTH;
  if (op != VSTELLAR_CMD_ALLOC_UCONTEXT && op != VSTELLAR_CMD_DEALLOC_UCONTEXT)
    if (uint16_t s = CheckUctx(uctx)) return s;
  return Dispatch(op, uctx, req.data() + sizeof(h), len, resp);
}

void Commands::DestroyAll() {
  // The device's addresses go back to the daemon first, so another device
  // can take them (there are none without an engine's GSI QPs to matter,
  // but a holder must never outlive its tables).
  std::vector<vstellar::Gid> held;
  for (auto& [i, g] : obj_.gids) held.push_back(g);
  obj_.gids.clear();
  for (const auto& g : held) ReleaseGid(g);
  if (!sh_.engine) return;
  std::vector<uint32_t> owners;
  for (auto& [h, u] : obj_.uctx) owners.push_back(h);
  for (uint32_t o : owners) DestroyAllOf(o);
  DestroyAllOf(0);
  obj_.uctx.clear();
  obj_.db_pages_used.clear();
}

// ------------------------------------------------------------------ objects

void Commands::DestroyQp(uint32_t qpn) {
  auto it = obj_.qps.find(qpn);
  if (it == obj_.qps.end()) return;
  sh_.engine->destroy_qp(it->second.qp);  // leaves its groups
  for (auto g = obj_.mcast.begin(); g != obj_.mcast.end();) {
    g->second.erase(qpn);
    g = g->second.empty() ? obj_.mcast.erase(g) : std::next(g);
  }
  FreeSlot(it->second.owner, it->second.slot);
  obj_.qps.erase(it);
}

void Commands::DestroyAllOf(uint32_t uctx) {
  std::vector<uint32_t> v;
  for (auto& [n, q] : obj_.qps)
    if (q.owner == uctx) v.push_back(n);
  for (uint32_t n : v) DestroyQp(n);
  for (auto it = obj_.srqs.begin(); it != obj_.srqs.end();) {
    if (it->second.owner == uctx) {
      sh_.engine->destroy_srq(it->second.srq);
      FreeSlot(uctx, it->second.slot);
      it = obj_.srqs.erase(it);
    } else {
      ++it;
    }
  }
  // Windows first: an MR with bound windows cannot be deregistered.
  for (auto it = obj_.mws.begin(); it != obj_.mws.end();) {
    if (it->second.owner == uctx) {
      sh_.engine->dealloc_mw(it->second.mw);
      it = obj_.mws.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = obj_.mrs.begin(); it != obj_.mrs.end();) {
    if (it->second.owner == uctx) {
      sh_.engine->dereg_mr(it->second.mr);
      it = obj_.mrs.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = obj_.cqs.begin(); it != obj_.cqs.end();) {
    if (it->second.owner == uctx) {
      sh_.engine->destroy_cq(it->second.cq);
      it = obj_.cqs.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = obj_.pds.begin(); it != obj_.pds.end();) {
    if (it->second.owner == uctx) {
      if (it->second.dma_mr) sh_.engine->dereg_mr(it->second.dma_mr);
      sh_.engine->dealloc_pd(it->second.pd);
      it = obj_.pds.erase(it);
    } else {
      ++it;
    }
  }
}


uint16_t Commands::AllocSlot(uint32_t uctx, uint32_t* slot) {
  *slot = 0;
  // Kernel objects get a slot once the kernel has its page (KERNEL_DB).
  if (uctx == 0 && !obj_.uctx.count(0)) return VSTELLAR_STATUS_OK;
  UContext& u = obj_.uctx.at(uctx);
  for (uint32_t i = VSTELLAR_DB_FIRST_SLOT; i < VSTELLAR_DB_SLOTS_PER_PAGE; i++)
    if (!u.slots[i]) {
      u.slots[i] = true;
      *slot = i;
      return VSTELLAR_STATUS_OK;
    }
  return VSTELLAR_STATUS_LIMIT;
}

void Commands::FreeSlot(uint32_t uctx, uint32_t slot) {
  auto it = obj_.uctx.find(uctx);
  if (it != obj_.uctx.end() && slot < it->second.slots.size()) it->second.slots[slot] = false;
}


// ------------------------------------------------------------------ commands

uint16_t Commands::CheckUctx(uint32_t uctx) const {
  return (uctx == 0 || obj_.uctx.count(uctx)) ? VSTELLAR_STATUS_OK : VSTELLAR_STATUS_BAD_HANDLE;
}

uint16_t Commands::ReadPages(const uint8_t* p, uint32_t n, uint32_t shift, std::vector<uint64_t>* out) const {
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

template <>
uint16_t Commands::Run<VSTELLAR_CMD_QUERY_DEVICE>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  const virtio_vstellar_config& c = config();
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
  if (SrqsOn()) {
    r.max_srq = c.max_qp;  // at most one SRQ per QP is ever useful
    r.max_srq_wr = c.max_qp_wr;
    r.max_srq_sge = c.max_recv_sge;
  }
  if (WindowsOn()) r.max_mw = c.max_mr;
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_QUERY_PORT>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_query_port>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  if (le32toh(cmd.port) != 1) return VSTELLAR_STATUS_BAD_FIELD;
  const virtio_vstellar_config& c = config();
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
uint16_t Commands::AddDbContext(uint32_t key, uint32_t* page_out) {
  const virtio_vstellar_config& c = config();
  uint32_t pages = cfg32(c.max_ucontext);
  // The doorbell region bounds the pages when the frontend gave us one.
  if (const MemRegion* r = session_.DoorbellRegion())
    pages = std::min<uint64_t>(pages, r->size / VSTELLAR_DB_PAGE_SIZE);
  if (obj_.uctx.size() >= cfg32(c.max_ucontext)) return VSTELLAR_STATUS_LIMIT;
  obj_.db_pages_used.resize(pages, false);
  uint32_t page = 0;
  while (page < pages && obj_.db_pages_used[page]) page++;
  if (page >= pages) return VSTELLAR_STATUS_LIMIT;
  obj_.db_pages_used[page] = true;
  UContext u;
  u.db_page = page;
  u.slots.assign(VSTELLAR_DB_SLOTS_PER_PAGE, false);
  obj_.uctx[key] = std::move(u);
  // A fresh page: every slot zero, need_kick set (the device is idle for
  // this context until its first kick) and alive set (the provider tells a
  // removed device by this word reading 0).
  if (uint8_t* p = dp_.DbPage(key)) {
    std::memset(p, 0, VSTELLAR_DB_PAGE_SIZE);
    std::atomic_thread_fence(std::memory_order_release);
    __atomic_store_n(reinterpret_cast<uint32_t*>(p + offsetof(vstellar_db_page_hdr, alive)),
                     htole32(VSTELLAR_DB_ALIVE), __ATOMIC_RELAXED);
    __atomic_store_n(reinterpret_cast<uint32_t*>(p), htole32(1u), __ATOMIC_SEQ_CST);
  }
  *page_out = page;
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_ALLOC_UCONTEXT>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (uctx != 0) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t handle = obj_.NewHandle();
  uint32_t page = 0;
  if (uint16_t s = AddDbContext(handle, &page)) return s;
  vstellar_resp_alloc_ucontext r{htole32(handle), htole32(page)};
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

bool Commands::DatagramsOn() const {
  return session_.acked_features() & Bit(VIRTIO_VSTELLAR_F_UD);
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_KERNEL_DB>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (uctx != 0) return VSTELLAR_STATUS_ACCESS;
  if (!DatagramsOn()) return VSTELLAR_STATUS_UNSUPPORTED;
  if (obj_.uctx.count(0)) return VSTELLAR_STATUS_BUSY;
  uint32_t page = 0;
  if (uint16_t s = AddDbContext(0, &page)) return s;
  vstellar_resp_kernel_db r{htole32(page), 0};
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DEALLOC_UCONTEXT>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (uctx != 0 || cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t handle = le32toh(cmd.handle);
  auto it = obj_.uctx.find(handle);
  if (handle == 0 || it == obj_.uctx.end()) return VSTELLAR_STATUS_BAD_HANDLE;  // 0: the kernel's page
  DestroyAllOf(handle);
  if (it->second.db_page < obj_.db_pages_used.size()) obj_.db_pages_used[it->second.db_page] = false;
  obj_.uctx.erase(it);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_ALLOC_PD>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (obj_.pds.size() >= cfg32(session_.device().config.max_pd)) return VSTELLAR_STATUS_LIMIT;
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
  const uint32_t h = obj_.NewHandle();
  obj_.pds[h] = o;
  vstellar_resp_alloc_pd r{htole32(h), 0};
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DEALLOC_PD>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = obj_.pds.find(le32toh(cmd.handle));
  if (it == obj_.pds.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (it->second.pd->refs > (it->second.dma_mr ? 1u : 0u)) return VSTELLAR_STATUS_BUSY;
  if (it->second.dma_mr) sh_.engine->dereg_mr(it->second.dma_mr);
  if (sh_.engine->dealloc_pd(it->second.pd)) return VSTELLAR_STATUS_BUSY;
  obj_.pds.erase(it);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_CREATE_CQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_create_cq>(b);
  const virtio_vstellar_config& c = config();
  const uint32_t log_cqe = le32toh(cmd.log_cqe), cq_queue = le32toh(cmd.cq_queue);
  const uint32_t shift = le32toh(cmd.page_shift), n = le32toh(cmd.num_pages);
  const uint64_t ring_off = le64toh(cmd.ring_offset);
  if (uint64_t(len) != sizeof(cmd) + 8ull * n) return VSTELLAR_STATUS_BAD_LENGTH;
  if (shift >= 64 || !(le64toh(c.page_size_cap) & Bit(int(shift)))) return VSTELLAR_STATUS_BAD_FIELD;
  if (log_cqe > VSTELLAR_MAX_LOG_CQE || (uint64_t{1} << log_cqe) > cfg32(c.max_cqe)) return VSTELLAR_STATUS_LIMIT;
  if (cq_queue >= VSTELLAR_MAX_CQ_QUEUES || session_.vring(VSTELLAR_VQ_CQN0 + cq_queue).num == 0)
    return VSTELLAR_STATUS_BAD_FIELD;
  if (ring_off >= (uint64_t{1} << shift) || ring_off % sizeof(vstellar_cqe)) return VSTELLAR_STATUS_BAD_FIELD;
  if (n > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  if (n != PagesFor(ring_off, uint64_t(sizeof(vstellar_cqe)) << log_cqe, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  if (obj_.cqs.size() >= cfg32(c.max_cq)) return VSTELLAR_STATUS_LIMIT;
  CqObj o{};
  const uint32_t staging = std::min(1u << log_cqe, kEngineCqStaging);
  if (uint16_t s = Charge(sizeof(CqObj) + 8ull * n + sh_.engine->cq_footprint(staging), &o.charge)) return s;
  if (uint16_t s = ReadPages(b + sizeof(cmd), n, shift, &o.pages)) return s;
  if (uint16_t s = AllocSlot(uctx, &o.slot)) return s;
  // The guest's ring is the CQ. The engine's CQ only stages completions:
  // every one is drained into the ring as it is made (DrainCq, from
  // on_completion), so a small one serves any guest CQ size, and daemon
  // memory does not grow with what the guest asks for.
  o.cq = sh_.engine->create_cq(staging);
  if (!o.cq) {
    FreeSlot(uctx, o.slot);
    return VSTELLAR_STATUS_NO_RESOURCES;
  }
  o.owner = uctx;
  o.cq_queue = cq_queue;
  o.log_cqe = log_cqe;
  o.page_shift = shift;
  o.ring_offset = ring_off;
  const uint32_t h = obj_.NewHandle();
  // Completions go straight into the guest's CQE ring (datapath.cc), which
  // also raises the CQ notification of an armed CQ.
  o.cq->on_completion = [this, h](vstellar::Cq&) { dp_.DrainCq(h); };
  obj_.cqs[h] = std::move(o);
  dp_.ResetDbSlot(uctx, obj_.cqs[h].slot);
  vstellar_resp_create_cq r{htole32(h), htole32(obj_.cqs[h].slot)};
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_RESIZE_CQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (!(session_.acked_features() & Bit(VIRTIO_VSTELLAR_F_RESIZE_CQ))) return VSTELLAR_STATUS_UNSUPPORTED;
  auto cmd = Get<vstellar_cmd_resize_cq>(b);
  const virtio_vstellar_config& c = config();
  const uint32_t log_cqe = le32toh(cmd.log_cqe);
  const uint32_t shift = le32toh(cmd.page_shift), n = le32toh(cmd.num_pages);
  const uint64_t ring_off = le64toh(cmd.ring_offset);
  if (uint64_t(len) != sizeof(cmd) + 8ull * n) return VSTELLAR_STATUS_BAD_LENGTH;
  auto it = obj_.cqs.find(le32toh(cmd.cqn));
  if (it == obj_.cqs.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (shift >= 64 || !(le64toh(c.page_size_cap) & Bit(int(shift)))) return VSTELLAR_STATUS_BAD_FIELD;
  if (log_cqe > VSTELLAR_MAX_LOG_CQE || (uint64_t{1} << log_cqe) > cfg32(c.max_cqe)) return VSTELLAR_STATUS_LIMIT;
  if (ring_off >= (uint64_t{1} << shift) || ring_off % sizeof(vstellar_cqe)) return VSTELLAR_STATUS_BAD_FIELD;
  if (n > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  if (n != PagesFor(ring_off, uint64_t(sizeof(vstellar_cqe)) << log_cqe, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  CqObj geom{};
  if (uint16_t s = ReadPages(b + sizeof(cmd), n, shift, &geom.pages)) return s;
  geom.page_shift = shift;
  geom.ring_offset = ring_off;
  geom.log_cqe = log_cqe;
  uint32_t moved = 0;
  if (uint16_t s = dp_.ResizeCq(it->first, geom, &moved)) return s;
  vstellar_resp_resize_cq r{htole32(moved), 0};
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DESTROY_CQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = obj_.cqs.find(le32toh(cmd.handle));
  if (it == obj_.cqs.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (it->second.cq->refs) return VSTELLAR_STATUS_BUSY;
  if (sh_.engine->destroy_cq(it->second.cq)) return VSTELLAR_STATUS_BUSY;
  FreeSlot(uctx, it->second.slot);
  obj_.cqs.erase(it);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_REQ_NOTIFY_CQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_req_notify_cq>(b);
  const uint32_t f = le32toh(cmd.flags);
  auto it = obj_.cqs.find(le32toh(cmd.cqn));
  if (it == obj_.cqs.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (f != VSTELLAR_NOTIFY_NEXT_COMP && f != VSTELLAR_NOTIFY_SOLICITED) return VSTELLAR_STATUS_BAD_FIELD;
  it->second.armed = true;
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_CREATE_QP>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_create_qp>(b);
  const virtio_vstellar_config& c = config();
  const uint32_t sqp = le32toh(cmd.sq_pages), rqp = le32toh(cmd.rq_pages);
  if (uint64_t(len) != sizeof(cmd) + 8ull * (uint64_t(sqp) + rqp)) return VSTELLAR_STATUS_BAD_LENGTH;
  if (cmd.create_flags & ~VSTELLAR_QP_CREATE_VALID) return VSTELLAR_STATUS_BAD_FIELD;
  // On an SRQ (RC or UD) the QP has no RQ: no ring, no receive SGEs.
  SrqObj* srq = nullptr;
  uint32_t srqh = 0;
  if (cmd.create_flags & VSTELLAR_QP_CREATE_USE_SRQ) {
    if (!SrqsOn()) return VSTELLAR_STATUS_UNSUPPORTED;
    srqh = le32toh(cmd.srq.srqn);
    auto s = obj_.srqs.find(srqh);
    if (s == obj_.srqs.end() || s->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
    if (cmd.srq.reserved || rqp || cmd.rq_log_wqe || cmd.rq_log_stride || le32toh(cmd.max_recv_sge) ||
        cmd.qp_type == VSTELLAR_QPT_GSI || s->second.pdn != le32toh(cmd.pdn))
      return VSTELLAR_STATUS_BAD_FIELD;
    srq = &s->second;
  }
  auto pd = obj_.pds.find(le32toh(cmd.pdn));
  auto scq = obj_.cqs.find(le32toh(cmd.send_cqn));
  auto rcq = obj_.cqs.find(le32toh(cmd.recv_cqn));
  if (pd == obj_.pds.end() || pd->second.owner != uctx || scq == obj_.cqs.end() || scq->second.owner != uctx ||
      rcq == obj_.cqs.end() || rcq->second.owner != uctx)
    return VSTELLAR_STATUS_BAD_HANDLE;
  const uint8_t type = cmd.qp_type;
  if (type == VSTELLAR_QPT_UD || type == VSTELLAR_QPT_GSI) {
    if (!DatagramsOn()) return VSTELLAR_STATUS_UNSUPPORTED;
    if (type == VSTELLAR_QPT_GSI) {
      if (uctx != 0) return VSTELLAR_STATUS_UNSUPPORTED;  // QP 1 is the kernel's MAD layer's
      for (auto& [n, q] : obj_.qps)
        if (q.type == VSTELLAR_QPT_GSI) return VSTELLAR_STATUS_LIMIT;  // one QP 1 per device
    }
  } else if (type == VSTELLAR_QPT_UC) {
    if (!(session_.acked_features() & Bit(VIRTIO_VSTELLAR_F_UC))) return VSTELLAR_STATUS_UNSUPPORTED;
  } else if (type != VSTELLAR_QPT_RC) {
    return VSTELLAR_STATUS_BAD_FIELD;
  }
  if (cmd.sq_sig_all > 1) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t shift = cmd.page_shift;
  if (shift >= 64 || !(le64toh(c.page_size_cap) & Bit(int(shift)))) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t ssge = le32toh(cmd.max_send_sge), rsge = le32toh(cmd.max_recv_sge);
  const uint32_t inl = le32toh(cmd.max_inline_data);
  if (cmd.sq_log_wqe > VSTELLAR_MAX_LOG_WQE || cmd.rq_log_wqe > VSTELLAR_MAX_LOG_WQE ||
      (1ull << cmd.sq_log_wqe) > cfg32(c.max_qp_wr) || (1ull << cmd.rq_log_wqe) > cfg32(c.max_qp_wr) ||
      ssge > cfg32(c.max_send_sge) || rsge > cfg32(c.max_recv_sge) || inl > cfg32(c.max_inline_data))
    return VSTELLAR_STATUS_LIMIT;
  if (cmd.sq_log_stride < VSTELLAR_MIN_SQ_LOG_STRIDE || cmd.sq_log_stride > VSTELLAR_MAX_LOG_STRIDE ||
      (!srq && (cmd.rq_log_stride < VSTELLAR_MIN_RQ_LOG_STRIDE || cmd.rq_log_stride > VSTELLAR_MAX_LOG_STRIDE)))
    return VSTELLAR_STATUS_BAD_FIELD;
  // A WQE with its SGEs (or inline data) must fit one slot.
  const uint64_t sstride = 1ull << cmd.sq_log_stride, rstride = 1ull << cmd.rq_log_stride;
  if (sizeof(vstellar_send_wqe) + 16ull * ssge > sstride || sizeof(vstellar_send_wqe) + inl > sstride ||
      (!srq && sizeof(vstellar_recv_wqe) + 16ull * rsge > rstride))
    return VSTELLAR_STATUS_BAD_FIELD;
  const uint64_t ps = 1ull << shift, soff = le64toh(cmd.sq_offset);
  const uint64_t roff = srq ? 0 : le64toh(cmd.rq_offset);
  if (soff >= ps || roff >= ps || soff % 64 || roff % 16) return VSTELLAR_STATUS_BAD_FIELD;
  if (uint64_t(sqp) + rqp > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  if (sqp != PagesFor(soff, sstride << cmd.sq_log_wqe, shift) ||
      (!srq && rqp != PagesFor(roff, rstride << cmd.rq_log_wqe, shift)))
    return VSTELLAR_STATUS_BAD_FIELD;
  if (obj_.qps.size() >= cfg32(c.max_qp)) return VSTELLAR_STATUS_LIMIT;
  QpObj o{};
  const uint8_t* pages = b + sizeof(cmd);
  if (uint16_t s = ReadPages(pages, sqp, shift, &o.sq.pages)) return s;
  if (uint16_t s = ReadPages(pages + 8ull * sqp, rqp, shift, &o.rq.pages)) return s;
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
  init.srq = srq ? srq->srq : nullptr;
  // The engine's rings and window, and our wr_id and opcode arrays.
  const uint64_t wrs = (1ull << cmd.sq_log_wqe) * 9 + (1ull << cmd.rq_log_wqe) * 8;
  if (uint16_t s = Charge(sizeof(QpObj) + wrs + 8ull * (sqp + rqp) + sh_.engine->qp_footprint(init), &o.charge))
    return s;
  if (uint16_t s = AllocSlot(uctx, &o.slot)) return s;
  o.qp = sh_.engine->create_qp(pd->second.pd, init);
  if (!o.qp) {
    FreeSlot(uctx, o.slot);
    return VSTELLAR_STATUS_NO_RESOURCES;
  }
  o.owner = uctx;
  o.type = type;
  o.srqh = srqh;
  o.pdn = pd->first;
  o.send_cqn = scq->first;
  o.recv_cqn = rcq->first;
  o.sq.shift = o.rq.shift = shift;
  o.sq.offset = soff;
  o.sq.log_n = cmd.sq_log_wqe;
  o.sq.log_stride = cmd.sq_log_stride;
  o.rq.offset = roff;
  o.rq.log_n = cmd.rq_log_wqe;
  o.rq.log_stride = cmd.rq_log_stride;
  o.sq_wrid.assign(size_t{1} << cmd.sq_log_wqe, 0);
  o.sq_op.assign(size_t{1} << cmd.sq_log_wqe, 0);
  o.rq_wrid.assign(size_t{1} << cmd.rq_log_wqe, 0);
  o.max_send_sge = ssge;
  o.max_recv_sge = rsge;
  o.max_inline = inl;
  dp_.ResetDbSlot(uctx, o.slot);
  const uint32_t qpn = o.qp->qpn();
  vstellar_resp_create_qp r{};
  r.qpn = htole32(qpn);
  r.db_slot = htole32(o.slot);
  r.max_send_sge = htole32(ssge);
  r.max_recv_sge = htole32(rsge);
  r.max_inline_data = htole32(inl);
  obj_.qps[qpn] = std::move(o);
  if (type == VSTELLAR_QPT_GSI) SyncGsiGids();
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_MODIFY_QP>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_modify_qp>(b);
  const vstellar_qp_attr& a = cmd.attr;
  auto it = obj_.qps.find(le32toh(cmd.qpn));
  if (it == obj_.qps.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
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
  const virtio_vstellar_config& c = config();
  if (((mask & VSTELLAR_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > cfg32(c.max_qp_init_rd_atom)) ||
      ((mask & VSTELLAR_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > cfg32(c.max_qp_rd_atom)))
    return VSTELLAR_STATUS_LIMIT;
  if (mask & VSTELLAR_QP_AV) {
    // RoCEv2-style: the GID is an IPv4-mapped IPv6 address of the peer host.
    if (!IsV4Mapped(a.av.dgid)) return VSTELLAR_STATUS_BAD_FIELD;
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
  dp_.OnQpModified(it->second, next);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_QUERY_QP>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = obj_.qps.find(le32toh(cmd.handle));
  if (it == obj_.qps.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
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

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DESTROY_QP>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = obj_.qps.find(le32toh(cmd.handle));
  if (it == obj_.qps.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  DestroyQp(it->first);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_REG_MR>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_reg_mr>(b);
  const virtio_vstellar_config& c = config();
  const uint32_t n = le32toh(cmd.num_pages), shift = le32toh(cmd.page_shift);
  const uint32_t access = le32toh(cmd.access_flags);
  const uint64_t iova = le64toh(cmd.iova), length = le64toh(cmd.length);
  if (uint64_t(len) != sizeof(cmd) + 8ull * n) return VSTELLAR_STATUS_BAD_LENGTH;
  auto pd = obj_.pds.find(le32toh(cmd.pdn));
  if (pd == obj_.pds.end() || pd->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (access & ~(VSTELLAR_ACCESS_VALID | (WindowsOn() ? VSTELLAR_ACCESS_MW_BIND : 0u))) return VSTELLAR_STATUS_BAD_FIELD;
  if ((access & (VSTELLAR_ACCESS_REMOTE_WRITE | VSTELLAR_ACCESS_REMOTE_ATOMIC)) &&
      !(access & VSTELLAR_ACCESS_LOCAL_WRITE))
    return VSTELLAR_STATUS_BAD_FIELD;
  if (shift >= 64 || !(le64toh(c.page_size_cap) & Bit(int(shift)))) return VSTELLAR_STATUS_BAD_FIELD;
  if (length == 0 || iova + length < iova) return VSTELLAR_STATUS_BAD_FIELD;
  if (length > le64toh(c.max_mr_size)) return VSTELLAR_STATUS_LIMIT;
  if (n > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  const uint64_t off = iova & ((1ull << shift) - 1);
  if (n != PagesFor(off, length, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  if (obj_.mrs.size() >= cfg32(c.max_mr)) return VSTELLAR_STATUS_LIMIT;
  // Each page's guest address and (eMTT) final host pointer.
  MemoryCharge charge;
  if (uint16_t s = Charge(sizeof(MrObj) + sizeof(vstellar::Mr) + 16ull * n, &charge)) return s;
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
  const uint32_t h = obj_.NewHandle();
  obj_.mrs[h] = MrObj{uctx, mr, pd->first, std::move(charge)};
  vstellar_resp_reg_mr r{};
  r.mrn = htole32(h);
  r.lkey = htole32(mr->lkey());
  r.rkey = htole32(mr->rkey());
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DEREG_MR>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = obj_.mrs.find(le32toh(cmd.handle));
  if (it == obj_.mrs.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (int e = sh_.engine->dereg_mr(it->second.mr)) return e == EBUSY ? VSTELLAR_STATUS_BUSY : VSTELLAR_STATUS_INTERNAL;
  obj_.mrs.erase(it);
  return VSTELLAR_STATUS_OK;
}

uint16_t Commands::GidCommand(uint32_t uctx, const uint8_t* b, bool add) {
  auto cmd = Get<vstellar_cmd_gid>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  if (uctx != 0) return VSTELLAR_STATUS_ACCESS;  // the kernel's GID cache only
  if (le32toh(cmd.port) != 1) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t index = le32toh(cmd.index);
  if (index >= cfg32(session_.device().config.gid_table_len)) return VSTELLAR_STATUS_BAD_FIELD;
  if (!add) {
    auto it = obj_.gids.find(index);
    if (it == obj_.gids.end()) return VSTELLAR_STATUS_BAD_HANDLE;
    const vstellar::Gid g = it->second;
    obj_.gids.erase(it);
    ReleaseGid(g);
    SyncGsiGids();
    return VSTELLAR_STATUS_OK;
  }
  if (le32toh(cmd.gid_type) != VSTELLAR_GID_TYPE_ROCE_V2) return VSTELLAR_STATUS_BAD_FIELD;
  vstellar::Gid g;
  std::memcpy(g.data(), cmd.gid, 16);
  // An IPv4 address (RoCEv2 over IPv4, the only one the engine speaks):
  // only one this daemon serves, and only while no other device holds it,
  // so a guest cannot take another guest's QP 1 traffic or send as its
  // address by writing that address into its own GID table. Any other
  // address (the netdev's IPv6 link-local one, say) is listed, so the
  // guest's GID table matches its netdev as the kernel expects, but never
  // held: nothing is sent from it and QP 1 does not answer for it.
  const bool ipv4 = IsV4Mapped(g.data());
  if (ipv4 && !sh_.gids->Serves(g)) return VSTELLAR_STATUS_ACCESS;
  if (ipv4 && !sh_.gids->Take(g, &obj_, sh_.worker)) return VSTELLAR_STATUS_BUSY;
  auto old = obj_.gids.find(index);
  if (old != obj_.gids.end()) {
    const vstellar::Gid prev = old->second;
    obj_.gids.erase(old);
    if (prev != g) ReleaseGid(prev);
  }
  obj_.gids[index] = g;
  SyncGsiGids();
  return VSTELLAR_STATUS_OK;
}

// Gives a GID back once no index of this device's table holds it any more.
void Commands::ReleaseGid(const vstellar::Gid& g) {
  for (auto& [i, other] : obj_.gids)
    if (other == g) return;
  sh_.gids->Release(g, &obj_);
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_ADD_GID>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  return GidCommand(uctx, b, /*add=*/true);
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DEL_GID>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  return GidCommand(uctx, b, /*add=*/false);
}

// The GSI QP answers to QP 1 for exactly the device's GIDs.
void Commands::SyncGsiGids() {
  for (auto& [n, q] : obj_.qps) {
    if (q.type != VSTELLAR_QPT_GSI) continue;
    std::vector<vstellar::Gid> gids;
    for (auto& [i, g] : obj_.gids)
      if (HoldsGid(sh_, &obj_, g)) gids.push_back(g);
    sh_.engine->set_gsi_gids(q.qp, gids);
  }
}

// ------------------------------------------------------------------ SRQs

bool Commands::SrqsOn() const {
  return session_.acked_features() & Bit(VIRTIO_VSTELLAR_F_SRQ);
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_CREATE_SRQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (!SrqsOn()) return VSTELLAR_STATUS_UNSUPPORTED;
  auto cmd = Get<vstellar_cmd_create_srq>(b);
  const virtio_vstellar_config& c = config();
  const uint32_t n = le32toh(cmd.num_pages), shift = cmd.page_shift;
  const uint32_t max_sge = le32toh(cmd.max_sge), limit = le32toh(cmd.srq_limit);
  const uint64_t off = le64toh(cmd.ring_offset);
  if (uint64_t(len) != sizeof(cmd) + 8ull * n) return VSTELLAR_STATUS_BAD_LENGTH;
  if (cmd.reserved0 || cmd.reserved1) return VSTELLAR_STATUS_BAD_FIELD;
  auto pd = obj_.pds.find(le32toh(cmd.pdn));
  if (pd == obj_.pds.end() || pd->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (shift >= 64 || !(le64toh(c.page_size_cap) & Bit(int(shift)))) return VSTELLAR_STATUS_BAD_FIELD;
  if (cmd.log_wqe > VSTELLAR_MAX_LOG_WQE || (1ull << cmd.log_wqe) > cfg32(c.max_qp_wr) ||
      max_sge > cfg32(c.max_recv_sge))
    return VSTELLAR_STATUS_LIMIT;
  if (cmd.log_stride < VSTELLAR_MIN_RQ_LOG_STRIDE || cmd.log_stride > VSTELLAR_MAX_LOG_STRIDE ||
      sizeof(vstellar_recv_wqe) + 16ull * max_sge > (1ull << cmd.log_stride) ||
      limit >= (1u << cmd.log_wqe))
    return VSTELLAR_STATUS_BAD_FIELD;
  if (off >= (1ull << shift) || off % 16) return VSTELLAR_STATUS_BAD_FIELD;
  if (n > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  if (n != PagesFor(off, uint64_t(1) << (cmd.log_wqe + cmd.log_stride), shift)) return VSTELLAR_STATUS_BAD_FIELD;
  if (obj_.srqs.size() >= cfg32(c.max_qp)) return VSTELLAR_STATUS_LIMIT;
  SrqObj o{};
  vstellar::SrqInitAttr init;
  init.max_wr = 1u << cmd.log_wqe;
  init.max_sge = max_sge;
  init.limit = limit;
  if (uint16_t s = Charge(SrqBytes(n, init), &o.charge)) return s;
  if (uint16_t s = ReadPages(b + sizeof(cmd), n, shift, &o.ring.pages)) return s;
  if (uint16_t s = AllocSlot(uctx, &o.slot)) return s;
  o.srq = sh_.engine->create_srq(pd->second.pd, init);
  if (!o.srq) {
    FreeSlot(uctx, o.slot);
    return VSTELLAR_STATUS_NO_RESOURCES;
  }
  o.owner = uctx;
  o.pdn = pd->first;
  o.ring.shift = shift;
  o.ring.offset = off;
  o.ring.log_n = cmd.log_wqe;
  o.ring.log_stride = cmd.log_stride;
  o.max_sge = max_sge;
  const uint32_t h = obj_.NewHandle();
  const uint32_t slot = o.slot;
  obj_.srqs[h] = std::move(o);
  dp_.ResetDbSlot(uctx, slot);
  vstellar_resp_create_srq r{};
  r.srqn = htole32(h);
  r.db_slot = htole32(slot);
  r.max_sge = htole32(max_sge);
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_MODIFY_SRQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_modify_srq>(b);
  auto it = obj_.srqs.find(le32toh(cmd.srqn));
  if (it == obj_.srqs.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  const uint32_t mask = le32toh(cmd.attr_mask);
  if (cmd.reserved || (mask & ~(VSTELLAR_SRQ_MAX_WR | VSTELLAR_SRQ_LIMIT))) return VSTELLAR_STATUS_BAD_FIELD;
  if (mask & VSTELLAR_SRQ_MAX_WR) return VSTELLAR_STATUS_UNSUPPORTED;  // no resizing
  if ((mask & VSTELLAR_SRQ_LIMIT) && sh_.engine->modify_srq(it->second.srq, le32toh(cmd.srq_limit)))
    return VSTELLAR_STATUS_BAD_FIELD;
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_RESIZE_SRQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (!(session_.acked_features() & Bit(VIRTIO_VSTELLAR_F_RESIZE_SRQ))) return VSTELLAR_STATUS_UNSUPPORTED;
  auto cmd = Get<vstellar_cmd_resize_srq>(b);
  const virtio_vstellar_config& c = config();
  const uint32_t n = le32toh(cmd.num_pages), shift = cmd.page_shift;
  const uint64_t off = le64toh(cmd.ring_offset);
  if (uint64_t(len) != sizeof(cmd) + 8ull * n) return VSTELLAR_STATUS_BAD_LENGTH;
  if (cmd.reserved0 || cmd.reserved1) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = obj_.srqs.find(le32toh(cmd.srqn));
  if (it == obj_.srqs.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (shift >= 64 || !(le64toh(c.page_size_cap) & Bit(int(shift)))) return VSTELLAR_STATUS_BAD_FIELD;
  if (cmd.log_wqe > VSTELLAR_MAX_LOG_WQE || (1ull << cmd.log_wqe) > cfg32(c.max_qp_wr)) return VSTELLAR_STATUS_LIMIT;
  const uint32_t log_stride = it->second.ring.log_stride;
  if (off >= (1ull << shift) || off % 16) return VSTELLAR_STATUS_BAD_FIELD;
  if (n > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  if (n != PagesFor(off, uint64_t(1) << (cmd.log_wqe + log_stride), shift)) return VSTELLAR_STATUS_BAD_FIELD;
  RingGeom ring;
  if (uint16_t s = ReadPages(b + sizeof(cmd), n, shift, &ring.pages)) return s;
  ring.shift = shift;
  ring.offset = off;
  ring.log_n = cmd.log_wqe;
  ring.log_stride = log_stride;
  // The new size is charged before the engine grows its ring; what it
  // shrinks is given back only once it has.
  vstellar::SrqInitAttr init;
  init.max_wr = 1u << cmd.log_wqe;
  init.max_sge = it->second.max_sge;
  init.limit = it->second.srq->limit();
  MemoryCharge& charge = it->second.charge;
  const uint64_t before = charge.bytes(), after = SrqBytes(n, init);
  if (after > before && !charge.Resize(obj_.memory, *sh_.memory, after)) return VSTELLAR_STATUS_NO_RESOURCES;
  const uint16_t s = dp_.ResizeSrq(it->first, ring);
  charge.Resize(obj_.memory, *sh_.memory, s == VSTELLAR_STATUS_OK ? after : before);  // never grows here
  return s;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_QUERY_SRQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = obj_.srqs.find(le32toh(cmd.handle));
  if (it == obj_.srqs.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  vstellar_resp_query_srq r{};
  r.max_wr = htole32(it->second.srq->max_wr());
  r.max_sge = htole32(it->second.max_sge);
  r.srq_limit = htole32(it->second.srq->limit());
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DESTROY_SRQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = obj_.srqs.find(le32toh(cmd.handle));
  if (it == obj_.srqs.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (sh_.engine->destroy_srq(it->second.srq)) return VSTELLAR_STATUS_BUSY;  // QPs use it
  FreeSlot(uctx, it->second.slot);
  obj_.srqs.erase(it);
  return VSTELLAR_STATUS_OK;
}

// ------------------------------------------------------------------ keys

bool Commands::MemMgtOn() const {
  return session_.acked_features() & Bit(VIRTIO_VSTELLAR_F_MEM_MGT);
}

bool Commands::WindowsOn() const {
  return session_.acked_features() & Bit(VIRTIO_VSTELLAR_F_MW);
}

// A fast-registration MR: kernel only (REG_MR WQEs carry guest-physical
// page lists, which only kernel QPs may post). It counts against max_mr.
template <>
uint16_t Commands::Run<VSTELLAR_CMD_ALLOC_MR>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (!MemMgtOn()) return VSTELLAR_STATUS_UNSUPPORTED;
  auto cmd = Get<vstellar_cmd_alloc_mr>(b);
  const virtio_vstellar_config& c = config();
  if (uctx != 0) return VSTELLAR_STATUS_ACCESS;
  if (!IsZero(cmd.reserved, sizeof(cmd.reserved))) return VSTELLAR_STATUS_BAD_FIELD;
  auto pd = obj_.pds.find(le32toh(cmd.pdn));
  if (pd == obj_.pds.end() || pd->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  const uint32_t n = le32toh(cmd.max_num_pages);
  if (n == 0) return VSTELLAR_STATUS_BAD_FIELD;
  if (n > cfg32(c.max_fast_reg_pages)) return VSTELLAR_STATUS_LIMIT;
  if (obj_.mrs.size() >= cfg32(c.max_mr)) return VSTELLAR_STATUS_LIMIT;
  // Charged for the most it may map: each page's guest address and final
  // host pointer, built at every REG_MR WQE.
  MemoryCharge charge;
  if (uint16_t s = Charge(sizeof(MrObj) + sizeof(vstellar::Mr) + 16ull * n, &charge)) return s;
  vstellar::Mr* mr = sh_.engine->alloc_mr(pd->second.pd, n);
  if (!mr) return VSTELLAR_STATUS_NO_RESOURCES;
  const uint32_t h = obj_.NewHandle();
  obj_.mrs[h] = MrObj{uctx, mr, pd->first, std::move(charge)};
  vstellar_resp_reg_mr r{};
  r.mrn = htole32(h);
  r.lkey = htole32(mr->lkey());
  r.rkey = htole32(mr->rkey());
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_ALLOC_MW>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (!WindowsOn()) return VSTELLAR_STATUS_UNSUPPORTED;
  auto cmd = Get<vstellar_cmd_alloc_mw>(b);
  const uint32_t type = le32toh(cmd.type);
  auto pd = obj_.pds.find(le32toh(cmd.pdn));
  if (pd == obj_.pds.end() || pd->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (type != VSTELLAR_MW_TYPE_1 && type != VSTELLAR_MW_TYPE_2) return VSTELLAR_STATUS_BAD_FIELD;
  if (obj_.mws.size() >= cfg32(config().max_mr)) return VSTELLAR_STATUS_LIMIT;
  MemoryCharge charge;
  if (uint16_t s = Charge(sizeof(MwObj) + sizeof(vstellar::Mw), &charge)) return s;
  vstellar::Mw* mw = sh_.engine->alloc_mw(pd->second.pd, uint8_t(type));
  if (!mw) return VSTELLAR_STATUS_NO_RESOURCES;
  const uint32_t h = obj_.NewHandle();
  obj_.mws[h] = MwObj{uctx, mw, pd->first, std::move(charge)};
  vstellar_resp_alloc_mw r{};
  r.mwn = htole32(h);
  r.rkey = htole32(mw->rkey());
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DEALLOC_MW>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (!WindowsOn()) return VSTELLAR_STATUS_UNSUPPORTED;
  auto cmd = Get<vstellar_cmd_handle>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = obj_.mws.find(le32toh(cmd.handle));
  if (it == obj_.mws.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (sh_.engine->dealloc_mw(it->second.mw)) return VSTELLAR_STATUS_INTERNAL;
  obj_.mws.erase(it);
  return VSTELLAR_STATUS_OK;
}

// ------------------------------------------------------------------ multicast

uint16_t Commands::McastCommand(uint32_t uctx, const uint8_t* b, bool attach) {
  if (!(session_.acked_features() & Bit(VIRTIO_VSTELLAR_F_MCAST))) return VSTELLAR_STATUS_UNSUPPORTED;
  auto cmd = Get<vstellar_cmd_mcast>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  auto it = obj_.qps.find(le32toh(cmd.qpn));
  if (it == obj_.qps.end() || it->second.owner != uctx) return VSTELLAR_STATUS_BAD_HANDLE;
  if (it->second.type != VSTELLAR_QPT_UD) return VSTELLAR_STATUS_BAD_FIELD;
  vstellar::Gid mgid;
  std::memcpy(mgid.data(), cmd.mgid, sizeof(cmd.mgid));
  const uint32_t qpn = it->first;
  auto mine = obj_.mcast.find(mgid);
  if (attach && !(mine != obj_.mcast.end() && mine->second.count(qpn))) {
    if (mine == obj_.mcast.end() ? obj_.mcast.size() >= sh_.mcast_groups_per_device
                                 : mine->second.size() >= sh_.mcast_qps_per_group)
      return VSTELLAR_STATUS_LIMIT;
  }
  vstellar::Engine& e = *sh_.engine;
  switch (attach ? e.attach_mcast(it->second.qp, mgid) : e.detach_mcast(it->second.qp, mgid)) {
    case 0:
      if (attach) {
        obj_.mcast[mgid].insert(qpn);
      } else if (mine != obj_.mcast.end()) {
        mine->second.erase(qpn);
        if (mine->second.empty()) obj_.mcast.erase(mine);
      }
      return VSTELLAR_STATUS_OK;
    case ENOSPC: return VSTELLAR_STATUS_LIMIT;
    case EIO: return VSTELLAR_STATUS_NO_RESOURCES;  // the link could not join the group
    default: return VSTELLAR_STATUS_BAD_FIELD;  // not a group, or (detach) not attached
  }
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_ATTACH_MCAST>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  return McastCommand(uctx, b, true);
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DETACH_MCAST>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  return McastCommand(uctx, b, false);
}

// ------------------------------------------------------------------ dispatch

// One case per entry of VSTELLAR_CMD_LIST: a reserved opcode answers
// UNSUPPORTED (its flag says so), every other calls its handler above (a
// command without one fails to link).
uint16_t Commands::Dispatch(uint16_t op, uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  switch (op) {
#define VSTELLARD_DISPATCH_(name, opcode, req_len, resp_len, flags)          \
  case VSTELLAR_CMD_##name:                                                   \
    if constexpr (((flags) & VSTELLAR_CMDF_RESERVED) != 0)                    \
      return VSTELLAR_STATUS_UNSUPPORTED;                                     \
    else                                                                      \
      return Run<VSTELLAR_CMD_##name>(uctx, b, len, resp);
    VSTELLAR_CMD_LIST(VSTELLARD_DISPATCH_)
#undef VSTELLARD_DISPATCH_
  }
  return VSTELLAR_STATUS_BAD_OPCODE;
}

}  // namespace vstellard
