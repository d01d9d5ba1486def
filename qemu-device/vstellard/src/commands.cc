// The control commands of one device: the checks every request passes,
// the dispatch to its handler, and the commands on the device, user
// contexts and PDs. The other objects' commands are in commands_<object>.cc
// (cq, qp, srq, mr, mw, gid, mcast); see include/vstellard/commands.h and
// docs/vstellard.md ("Commands").
#include "vstellard/commands.h"

#include <endian.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "vstellard/translate.h"

#include "commands_common.h"

namespace vstellard {

Commands::Commands(DeviceShared& shared, const DeviceState& state, const DeviceTransport& transport, Pvdma& pvdma,
                   ObjectTables& objects, DataPath& datapath)
    : sh_(&shared), state_(state), transport_(transport), pvdma_(pvdma), obj_(objects), dp_(datapath) {
  obj_.memory.set_limit(sh_->device_memory_limit);
}

// Charges an object's host memory to this device and to the daemon before
// anything is allocated for it (memory_budget.h).
uint16_t Commands::Charge(uint64_t bytes, MemoryCharge* charge) {
  return charge->Take(obj_.memory, *sh_->memory, bytes) ? VSTELLAR_STATUS_OK : VSTELLAR_STATUS_NO_RESOURCES;
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
  if (!sh_->engine) return;
  std::vector<uint32_t> owners;
  for (auto& [h, u] : obj_.uctx) owners.push_back(h);
  for (uint32_t o : owners) DestroyAllOf(o);
  DestroyAllOf(0);
  obj_.uctx.clear();
  obj_.db_pages_used.clear();
}

// ------------------------------------------------- a context's objects, doorbell slots

// Every object of one context (0: the kernel's), in the order the engine
// lets them go: QPs before the SRQs, CQs and PDs they use, windows before
// the MRs they are bound to.
void Commands::DestroyAllOf(uint32_t uctx) {
  vstellar::Engine& e = *sh_->engine;
  obj_.qps.EraseOwnedBy(uctx, [&](uint32_t qpn, QpObj& q) { ReleaseQp(qpn, q); });
  obj_.srqs.EraseOwnedBy(uctx, [&](uint32_t, SrqObj& s) {
    e.destroy_srq(s.srq);
    FreeSlot(uctx, s.slot);
  });
  obj_.mws.EraseOwnedBy(uctx, [&](uint32_t, MwObj& w) { e.dealloc_mw(w.mw); });
  obj_.mrs.EraseOwnedBy(uctx, [&](uint32_t, MrObj& m) { e.dereg_mr(m.mr); });
  obj_.cqs.EraseOwnedBy(uctx, [&](uint32_t, CqObj& c) { e.destroy_cq(c.cq); });
  obj_.pds.EraseOwnedBy(uctx, [&](uint32_t, PdObj& p) {
    if (p.dma_mr) e.dereg_mr(p.dma_mr);
    e.dealloc_pd(p.pd);
  });
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

// ------------------------------------------------- checks and features

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

bool Commands::DatagramsOn() const {
  return state_.HasFeature(VIRTIO_VSTELLAR_F_UD);
}

bool Commands::SrqsOn() const {
  return state_.HasFeature(VIRTIO_VSTELLAR_F_SRQ);
}

bool Commands::MemMgtOn() const {
  return state_.HasFeature(VIRTIO_VSTELLAR_F_MEM_MGT);
}

bool Commands::OdpOn() const {
  return state_.HasFeature(VIRTIO_VSTELLAR_F_ODP);
}

bool Commands::WindowsOn() const {
  return state_.HasFeature(VIRTIO_VSTELLAR_F_MW);
}

// ------------------------------------------------- device, contexts, PDs

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
  if (const MemRegion* r = transport_.DoorbellRegion())
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
  if (obj_.pds.size() >= cfg32(config().max_pd)) return VSTELLAR_STATUS_LIMIT;
  vstellar::Pd* pd = sh_->engine->alloc_pd();
  if (!pd) return VSTELLAR_STATUS_NO_RESOURCES;
  PdObj o{uctx, pd};
  if (uctx == 0 && DatagramsOn()) {
    // The local DMA lkey's MR: all guest-physical space, local access only.
    o.dma_mr = sh_->engine->reg_mr(pd, 0, uint64_t{1} << 52, vstellar::ACCESS_LOCAL_WRITE,
                                  std::make_shared<GpaTranslator>(pvdma_));
    if (!o.dma_mr) {
      sh_->engine->dealloc_pd(pd);
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
  const auto [pd, pdn, status] = ObjectNamedBy(obj_.pds, uctx, b);
  if (!pd) return status;
  if (pd->pd->refs > (pd->dma_mr ? 1u : 0u)) return VSTELLAR_STATUS_BUSY;
  if (pd->dma_mr) sh_->engine->dereg_mr(pd->dma_mr);
  if (sh_->engine->dealloc_pd(pd->pd)) return VSTELLAR_STATUS_BUSY;
  obj_.pds.erase(pdn);
  return VSTELLAR_STATUS_OK;
}

// ------------------------------------------------- dispatch

// One case per entry of VSTELLAR_CMD_LIST: a reserved opcode answers
// UNSUPPORTED (its flag says so), every other calls its handler in its
// object's commands_*.cc (a command without one fails to link).
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
