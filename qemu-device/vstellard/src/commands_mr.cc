// The commands on memory regions: REG_MR, DEREG_MR, ALLOC_MR (a
// fast-registration MR, mapped later by REG_MR work requests), and
// INVALIDATE_MR (an exporter took a dmabuf MR's pages back).
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
                         std::vector<uint8_t>* resp) {
  if (!mr) return VSTELLAR_STATUS_NO_RESOURCES;
  const uint32_t h = obj_.NewHandle();
  obj_.mrs[h] = MrObj{uctx, mr, pdn, std::move(charge)};
  vstellar_resp_reg_mr r{};
  r.mrn = htole32(h);
  r.lkey = htole32(mr->lkey());
  r.rkey = htole32(mr->rkey());
  Put(resp, r);
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
  const uint32_t pdn = le32toh(cmd.pdn);
  PdObj* pd = obj_.pds.Owned(uctx, pdn);
  if (!pd) return VSTELLAR_STATUS_BAD_HANDLE;
  if (access & ~(VSTELLAR_ACCESS_VALID | (WindowsOn() ? VSTELLAR_ACCESS_MW_BIND : 0u))) return VSTELLAR_STATUS_BAD_FIELD;
  if ((access & (VSTELLAR_ACCESS_REMOTE_WRITE | VSTELLAR_ACCESS_REMOTE_ATOMIC)) &&
      !(access & VSTELLAR_ACCESS_LOCAL_WRITE))
    return VSTELLAR_STATUS_BAD_FIELD;
  if (!PageShiftSupported(c, shift)) return VSTELLAR_STATUS_BAD_FIELD;
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
  if (sh_->translation == TranslationMode::kEmtt) t = EmttTranslator::Create(pvdma_, std::move(l), &status);
  else t = AtcTranslator::Create(pvdma_, *sh_->atc, std::move(l), &status);
  if (!t) return status ? status : uint16_t(VSTELLAR_STATUS_INTERNAL);
  return AddMr(uctx, pdn, sh_->engine->reg_mr(pd->pd, iova, length, access, std::move(t)), std::move(charge), resp);
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
  if (uint16_t s = Charge(sizeof(MrObj) + sizeof(vstellar::Mr) + 16ull * n, &charge)) return s;
  return AddMr(uctx, pdn, sh_->engine->alloc_mr(pd->pd, n), std::move(charge), resp);
}

}  // namespace vstellard
