// The commands on memory regions: REG_MR, DEREG_MR, ALLOC_MR (a
// fast-registration MR, mapped later by REG_MR work requests),
// INVALIDATE_MR (an exporter took a dmabuf MR's pages back), and the
// on-demand paging pair MAP_MR_PAGES / UNMAP_MR_PAGES (F_ODP).
#include "vstellard/commands.h"

#include <endian.h>

#include <cstring>
#include <memory>

#include "vstellard/translate.h"

#include "commands_common.h"

namespace vstellard {

// A new MR (registered or fast-registration) in the table, and the reply
// that gives the guest its handle and keys; NO_RESOURCES if the engine
// made none.
uint16_t Commands::AddMr(uint32_t uctx, uint32_t pdn, vstellar::Mr* mr, MemoryCharge charge,
                         std::vector<uint8_t>* resp, std::shared_ptr<OdpTranslator> odp) {
  if (!mr) return VSTELLAR_STATUS_NO_RESOURCES;
  const uint32_t h = obj_.NewHandle();
  if (odp) WireOdp(h, uctx, odp);
  obj_.mrs[h] = MrObj{uctx, mr, pdn, std::move(charge), std::move(odp)};
  vstellar_resp_reg_mr r{};
  r.mrn = htole32(h);
  r.lkey = htole32(mr->lkey());
  r.rkey = htole32(mr->rkey());
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

void Commands::WireOdp(uint32_t h, uint32_t uctx, const std::shared_ptr<OdpTranslator>& odp) {
  // Its faults name it by the handle the guest knows it by.
  DataPathEvents* ev = &dp_.events();
  odp->set_fault_handler([ev, h, uctx](uint64_t iova, uint32_t npages, bool write) {
    return ev->PostPageFault(h, uctx, iova, npages, write);
  });
  odp->set_fault_timeout_ns(sh_->odp_fault_timeout_ns);
}

uint64_t Commands::MrBytes(uint64_t table) { return sizeof(MrObj) + sizeof(vstellar::Mr) + table; }

template <>
uint16_t Commands::Run<VSTELLAR_CMD_REG_MR>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_reg_mr>(b);
  const virtio_vstellar_config& c = config();
  const uint32_t n = le32toh(cmd.num_pages), shift = le32toh(cmd.page_shift);
  const uint32_t access = le32toh(cmd.access_flags);
  const uint64_t iova = le64toh(cmd.iova), length = le64toh(cmd.length);
  if (uint64_t(len) != sizeof(cmd) + 8ull * n) return VSTELLAR_STATUS_BAD_LENGTH;
  const uint32_t pdn = le32toh(cmd.pdn);
  PdObj* pd = obj_.pds.Owned(uctx, pdn);
  if (!pd) return VSTELLAR_STATUS_BAD_HANDLE;
  if (access & ~(VSTELLAR_ACCESS_VALID | (WindowsOn() ? VSTELLAR_ACCESS_MW_BIND : 0u) |
                 (OdpOn() ? VSTELLAR_ACCESS_ON_DEMAND : 0u)))
    return VSTELLAR_STATUS_BAD_FIELD;
  if ((access & (VSTELLAR_ACCESS_REMOTE_WRITE | VSTELLAR_ACCESS_REMOTE_ATOMIC)) &&
      !(access & VSTELLAR_ACCESS_LOCAL_WRITE))
    return VSTELLAR_STATUS_BAD_FIELD;
  if (access & VSTELLAR_ACCESS_ON_DEMAND) return RegOdpMr(uctx, cmd, len, pd, resp);
  if (!PageShiftSupported(c, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  if (length == 0 || iova + length < iova) return VSTELLAR_STATUS_BAD_FIELD;
  if (length > le64toh(c.max_mr_size)) return VSTELLAR_STATUS_LIMIT;
  if (n > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  const uint64_t off = iova & ((1ull << shift) - 1);
  if (n != PagesFor(off, length, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  if (obj_.mrs.size() >= cfg32(c.max_mr)) return VSTELLAR_STATUS_LIMIT;
  // Each page's guest address and (eMTT) final host pointer.
  MemoryCharge charge;
  if (uint16_t s = Charge(MrPagesBytes(n), &charge)) return s;
  MrLayout l;
  l.iova = iova;
  l.length = length;
  l.page_shift = shift;
  if (uint16_t s = ReadPages(b + sizeof(cmd), n, shift, &l.pages)) return s;
  uint16_t status = VSTELLAR_STATUS_OK;
  std::shared_ptr<vstellar::MemoryTranslator> t;
  if (sh_->translation == TranslationMode::kEmtt) t = EmttTranslator::Create(pvdma_, std::move(l), &status);
  else t = AtcTranslator::Create(pvdma_, *sh_->atc, std::move(l), &status);
  if (!t) return status ? status : uint16_t(VSTELLAR_STATUS_INTERNAL);
  return AddMr(uctx, pdn, sh_->engine->reg_mr(pd->pd, iova, length, access, std::move(t)), std::move(charge), resp);
}

// REG_MR of an on-demand MR (F_ODP): no pages now; the guest maps them
// when asked (MAP_MR_PAGES). iova 0 with length VSTELLAR_ODP_IMPLICIT_LENGTH
// is an implicit MR, the whole address space of the process. Its table is
// charged for the most it may hold, so mapping never needs a new charge.
uint16_t Commands::RegOdpMr(uint32_t uctx, const vstellar_cmd_reg_mr& cmd, uint32_t len, PdObj* pd,
                            std::vector<uint8_t>* resp) {
  const virtio_vstellar_config& c = config();
  const uint64_t iova = le64toh(cmd.iova), length = le64toh(cmd.length);
  const uint32_t access = le32toh(cmd.access_flags) & ~uint32_t(VSTELLAR_ACCESS_ON_DEMAND);
  if (uctx == 0) return VSTELLAR_STATUS_ACCESS;  // faults are served for user memory only
  if (le32toh(cmd.num_pages) != 0 || len != sizeof(cmd)) return VSTELLAR_STATUS_BAD_FIELD;
  if (le32toh(cmd.page_shift) != 12) return VSTELLAR_STATUS_BAD_FIELD;
  if (access & VSTELLAR_ACCESS_MW_BIND) return VSTELLAR_STATUS_BAD_FIELD;
  const bool implicit = iova == 0 && length == VSTELLAR_ODP_IMPLICIT_LENGTH;
  if (!implicit) {
    if (length == 0 || iova + length < iova) return VSTELLAR_STATUS_BAD_FIELD;
    if (length > le64toh(c.max_mr_size)) return VSTELLAR_STATUS_LIMIT;
  }
  if (obj_.mrs.size() >= cfg32(c.max_mr)) return VSTELLAR_STATUS_LIMIT;
  MemoryCharge charge;
  const uint64_t table = OdpTranslator::MaxChunks(iova, length) * (OdpTranslator::kChunkPages * 8 + 64);
  if (uint16_t s = Charge(MrBytes(sizeof(OdpTranslator) + table), &charge)) return s;
  auto t = std::make_shared<OdpTranslator>(pvdma_, iova, length);
  vstellar::Mr* mr = sh_->engine->reg_mr(pd->pd, iova, length, access, t);
  return AddMr(uctx, le32toh(cmd.pdn), mr, std::move(charge), resp, std::move(t));
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DEREG_MR>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  const auto [m, mrn, status] = ObjectNamedBy(obj_.mrs, uctx, b);
  if (!m) return status;
  if (int e = sh_->engine->dereg_mr(m->mr)) return e == EBUSY ? VSTELLAR_STATUS_BUSY : VSTELLAR_STATUS_INTERNAL;
  obj_.mrs.erase(mrn);
  return VSTELLAR_STATUS_OK;
}

// The guest driver's dma-buf move_notify: the exporter is moving the
// pages, so the MR must reach none of them once this returns. Commands run
// on the worker that runs the engine, so no packet of this device is being
// handled meanwhile; the next one that names the MR finds it INVALID.
template <>
uint16_t Commands::Run<VSTELLAR_CMD_INVALIDATE_MR>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (!state_.HasFeature(VIRTIO_VSTELLAR_F_DMABUF)) return VSTELLAR_STATUS_UNSUPPORTED;
  const auto [m, mrn, status] = ObjectNamedBy(obj_.mrs, uctx, b);
  if (!m) return status;
  if (m->mr->fast_reg()) return VSTELLAR_STATUS_BAD_HANDLE;  // LOCAL_INV is theirs
  return sh_->engine->invalidate_mr(m->mr) ? uint16_t(VSTELLAR_STATUS_INTERNAL) : uint16_t(VSTELLAR_STATUS_OK);
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
  const uint32_t pdn = le32toh(cmd.pdn);
  PdObj* pd = obj_.pds.Owned(uctx, pdn);
  if (!pd) return VSTELLAR_STATUS_BAD_HANDLE;
  const uint32_t n = le32toh(cmd.max_num_pages);
  if (n == 0) return VSTELLAR_STATUS_BAD_FIELD;
  if (n > cfg32(c.max_fast_reg_pages)) return VSTELLAR_STATUS_LIMIT;
  if (obj_.mrs.size() >= cfg32(c.max_mr)) return VSTELLAR_STATUS_LIMIT;
  // Charged for the most it may map: each page's guest address and final
  // host pointer, built at every REG_MR WQE.
  MemoryCharge charge;
  if (uint16_t s = Charge(MrPagesBytes(n), &charge)) return s;
  return AddMr(uctx, pdn, sh_->engine->alloc_mr(pd->pd, n), std::move(charge), resp);
}

// The guest driver's answer to a page fault, or a prefetch (advise_mr):
// pages of an on-demand MR. Work requests waiting for them go on at once.
template <>
uint16_t Commands::Run<VSTELLAR_CMD_MAP_MR_PAGES>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (!OdpOn()) return VSTELLAR_STATUS_UNSUPPORTED;
  const auto cmd = Get<vstellar_cmd_map_mr_pages>(b);
  const uint32_t n = le32toh(cmd.num_pages);
  if (uint64_t(len) != sizeof(cmd) + 8ull * n) return VSTELLAR_STATUS_BAD_LENGTH;
  if (n == 0) return VSTELLAR_STATUS_BAD_FIELD;
  if (n > cfg32(config().max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  MrObj* m = obj_.mrs.Owned(uctx, le32toh(cmd.mrn));
  if (!m || !m->odp) return VSTELLAR_STATUS_BAD_HANDLE;
  std::vector<uint64_t> pages(n);
  for (uint32_t i = 0; i < n; i++) pages[i] = le64toh(Get<uint64_t>(b + sizeof(cmd) + 8ull * i));
  const uint16_t s = m->odp->Map(le64toh(cmd.iova), pages);
  if (s == VSTELLAR_STATUS_OK) sh_->engine->pages_mapped();
  return s;
}

// The guest driver's mmu notifier: the kernel is about to reuse or move
// these pages. Commands run on the engine's worker, so once this returns
// no access of this device reaches them; the next one faults.
template <>
uint16_t Commands::Run<VSTELLAR_CMD_UNMAP_MR_PAGES>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (!OdpOn()) return VSTELLAR_STATUS_UNSUPPORTED;
  const auto cmd = Get<vstellar_cmd_unmap_mr_pages>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  const uint64_t iova = le64toh(cmd.iova), length = le64toh(cmd.length);
  if (iova % OdpTranslator::kPage || length == 0 || length % OdpTranslator::kPage) return VSTELLAR_STATUS_BAD_FIELD;
  MrObj* m = obj_.mrs.Owned(uctx, le32toh(cmd.mrn));
  if (!m || !m->odp) return VSTELLAR_STATUS_BAD_HANDLE;
  m->odp->Unmap(iova, length);
  return VSTELLAR_STATUS_OK;
}

}  // namespace vstellard
