// The commands on shared receive queues: CREATE_SRQ, MODIFY_SRQ,
// RESIZE_SRQ, QUERY_SRQ, DESTROY_SRQ.
#include "vstellard/commands.h"

#include <endian.h>

#include <cstring>

#include "commands_common.h"

namespace vstellard {

namespace {

// Where an SRQ's ring of 2^log_bytes bytes starts in its first page, and a
// page list that holds it exactly (CREATE_SRQ and RESIZE_SRQ).
uint16_t CheckSrqPages(const virtio_vstellar_config& c, uint32_t shift, uint32_t log_bytes, uint64_t off, uint32_t n) {
  if (off >= (1ull << shift) || off % 16) return VSTELLAR_STATUS_BAD_FIELD;
  if (n > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  if (n != PagesFor(off, uint64_t(1) << log_bytes, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  return VSTELLAR_STATUS_OK;
}

}  // namespace

// An SRQ's host memory: the engine's ring, our page list and wr_id map (an
// entry per WQE held).
uint64_t Commands::SrqBytes(uint32_t pages, const vstellar::SrqInitAttr& init) const {
  return sizeof(SrqObj) + 8ull * pages + 32ull * init.max_wr + sh_->engine->srq_footprint(init);
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
  const uint32_t pdn = le32toh(cmd.pdn);
  PdObj* pd = obj_.pds.Owned(uctx, pdn);
  if (!pd) return VSTELLAR_STATUS_BAD_HANDLE;
  if (!PageShiftSupported(c, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  if (cmd.log_wqe > VSTELLAR_MAX_LOG_WQE || (1ull << cmd.log_wqe) > cfg32(c.max_qp_wr) ||
      max_sge > cfg32(c.max_recv_sge))
    return VSTELLAR_STATUS_LIMIT;
  if (cmd.log_stride < VSTELLAR_MIN_RQ_LOG_STRIDE || cmd.log_stride > VSTELLAR_MAX_LOG_STRIDE ||
      sizeof(vstellar_recv_wqe) + 16ull * max_sge > (1ull << cmd.log_stride) ||
      limit >= (1u << cmd.log_wqe))
    return VSTELLAR_STATUS_BAD_FIELD;
  if (uint16_t s = CheckSrqPages(c, shift, cmd.log_wqe + cmd.log_stride, off, n)) return s;
  if (obj_.srqs.size() >= cfg32(c.max_qp)) return VSTELLAR_STATUS_LIMIT;
  SrqObj o{};
  vstellar::SrqInitAttr init;
  init.max_wr = 1u << cmd.log_wqe;
  init.max_sge = max_sge;
  init.limit = limit;
  if (uint16_t s = Charge(SrqBytes(n, init), &o.charge)) return s;
  if (uint16_t s = ReadPages(b + sizeof(cmd), n, shift, &o.ring.pages)) return s;
  if (uint16_t s = AllocSlot(uctx, &o.slot)) return s;
  o.srq = sh_->engine->create_srq(pd->pd, init);
  if (!o.srq) {
    FreeSlot(uctx, o.slot);
    return VSTELLAR_STATUS_NO_RESOURCES;
  }
  o.owner = uctx;
  o.pdn = pdn;
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
  const uint32_t srqn = le32toh(cmd.srqn);
  SrqObj* srq = obj_.srqs.Owned(uctx, srqn);
  if (!srq) return VSTELLAR_STATUS_BAD_HANDLE;
  const uint32_t mask = le32toh(cmd.attr_mask);
  if (cmd.reserved || (mask & ~(VSTELLAR_SRQ_MAX_WR | VSTELLAR_SRQ_LIMIT))) return VSTELLAR_STATUS_BAD_FIELD;
  if (mask & VSTELLAR_SRQ_MAX_WR) return VSTELLAR_STATUS_UNSUPPORTED;  // no resizing
  if ((mask & VSTELLAR_SRQ_LIMIT) && sh_->engine->modify_srq(srq->srq, le32toh(cmd.srq_limit)))
    return VSTELLAR_STATUS_BAD_FIELD;
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_RESIZE_SRQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (!state_.HasFeature(VIRTIO_VSTELLAR_F_RESIZE_SRQ)) return VSTELLAR_STATUS_UNSUPPORTED;
  auto cmd = Get<vstellar_cmd_resize_srq>(b);
  const virtio_vstellar_config& c = config();
  const uint32_t n = le32toh(cmd.num_pages), shift = cmd.page_shift;
  const uint64_t off = le64toh(cmd.ring_offset);
  if (uint64_t(len) != sizeof(cmd) + 8ull * n) return VSTELLAR_STATUS_BAD_LENGTH;
  if (cmd.reserved0 || cmd.reserved1) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t srqn = le32toh(cmd.srqn);
  SrqObj* srq = obj_.srqs.Owned(uctx, srqn);
  if (!srq) return VSTELLAR_STATUS_BAD_HANDLE;
  if (!PageShiftSupported(c, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  if (cmd.log_wqe > VSTELLAR_MAX_LOG_WQE || (1ull << cmd.log_wqe) > cfg32(c.max_qp_wr)) return VSTELLAR_STATUS_LIMIT;
  const uint32_t log_stride = srq->ring.log_stride;
  if (uint16_t s = CheckSrqPages(c, shift, cmd.log_wqe + log_stride, off, n)) return s;
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
  init.max_sge = srq->max_sge;
  init.limit = srq->srq->limit();
  MemoryCharge& charge = srq->charge;
  const uint64_t before = charge.bytes(), after = SrqBytes(n, init);
  if (after > before && !charge.Resize(obj_.memory, *sh_->memory, after)) return VSTELLAR_STATUS_NO_RESOURCES;
  const uint16_t s = dp_.ResizeSrq(srqn, ring);
  charge.Resize(obj_.memory, *sh_->memory, s == VSTELLAR_STATUS_OK ? after : before);  // never grows here
  return s;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_QUERY_SRQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  const auto [srq, srqn, status] = ObjectNamedBy(obj_.srqs, uctx, b);
  if (!srq) return status;
  vstellar_resp_query_srq r{};
  r.max_wr = htole32(srq->srq->max_wr());
  r.max_sge = htole32(srq->max_sge);
  r.srq_limit = htole32(srq->srq->limit());
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DESTROY_SRQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  const auto [srq, srqn, status] = ObjectNamedBy(obj_.srqs, uctx, b);
  if (!srq) return status;
  if (sh_->engine->destroy_srq(srq->srq)) return VSTELLAR_STATUS_BUSY;  // QPs use it
  FreeSlot(uctx, srq->slot);
  obj_.srqs.erase(srqn);
  return VSTELLAR_STATUS_OK;
}

}  // namespace vstellard
