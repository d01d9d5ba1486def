// The commands on completion queues: CREATE_CQ, RESIZE_CQ, DESTROY_CQ,
// REQ_NOTIFY_CQ.
#include "vstellard/commands.h"

#include <endian.h>

#include <algorithm>
#include <cstring>

#include "commands_common.h"

namespace vstellard {

namespace {

// Completions the engine holds for a CQ before DrainCq moves them (one at
// a time, in practice).
constexpr uint32_t kEngineCqStaging = 256;

// A CQE ring's page size and entries, within the device's limits (CREATE_CQ
// and RESIZE_CQ).
uint16_t CheckCqSize(const virtio_vstellar_config& c, uint32_t shift, uint32_t log_cqe) {
  if (!PageShiftSupported(c, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  if (log_cqe > VSTELLAR_MAX_LOG_CQE || (uint64_t{1} << log_cqe) > cfg32(c.max_cqe)) return VSTELLAR_STATUS_LIMIT;
  return VSTELLAR_STATUS_OK;
}

// Where a CQE ring starts in its first page, and a page list that holds it
// exactly.
uint16_t CheckCqPages(const virtio_vstellar_config& c, uint32_t shift, uint32_t log_cqe, uint64_t ring_off,
                      uint32_t n) {
  if (ring_off >= (uint64_t{1} << shift) || ring_off % sizeof(vstellar_cqe)) return VSTELLAR_STATUS_BAD_FIELD;
  if (n > cfg32(c.max_cmd_pages)) return VSTELLAR_STATUS_LIMIT;
  if (n != PagesFor(ring_off, uint64_t(sizeof(vstellar_cqe)) << log_cqe, shift)) return VSTELLAR_STATUS_BAD_FIELD;
  return VSTELLAR_STATUS_OK;
}

}  // namespace

uint64_t Commands::CqBytes(uint64_t pages, uint64_t engine_bytes) { return sizeof(CqObj) + 8 * pages + engine_bytes; }

template <>
uint16_t Commands::Run<VSTELLAR_CMD_CREATE_CQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_create_cq>(b);
  const virtio_vstellar_config& c = config();
  const uint32_t log_cqe = le32toh(cmd.log_cqe), cq_queue = le32toh(cmd.cq_queue);
  const uint32_t shift = le32toh(cmd.page_shift), n = le32toh(cmd.num_pages);
  const uint64_t ring_off = le64toh(cmd.ring_offset);
  if (uint64_t(len) != sizeof(cmd) + 8ull * n) return VSTELLAR_STATUS_BAD_LENGTH;
  if (uint16_t s = CheckCqSize(c, shift, log_cqe)) return s;
  if (cq_queue >= VSTELLAR_MAX_CQ_QUEUES || transport_.QueueSize(VSTELLAR_VQ_CQN0 + cq_queue) == 0)
    return VSTELLAR_STATUS_BAD_FIELD;
  if (uint16_t s = CheckCqPages(c, shift, log_cqe, ring_off, n)) return s;
  if (obj_.cqs.size() >= cfg32(c.max_cq)) return VSTELLAR_STATUS_LIMIT;
  CqObj o{};
  const uint32_t staging = std::min(1u << log_cqe, kEngineCqStaging);
  if (uint16_t s = Charge(CqBytes(n, sh_->engine->cq_footprint(staging)), &o.charge)) return s;
  if (uint16_t s = ReadPages(b + sizeof(cmd), n, shift, &o.pages)) return s;
  if (uint16_t s = AllocSlot(uctx, &o.slot)) return s;
  // The guest's ring is the CQ. The engine's CQ only stages completions:
  // every one is drained into the ring as it is made (DrainCq, from
  // on_completion), so a small one serves any guest CQ size, and daemon
  // memory does not grow with what the guest asks for.
  o.cq = sh_->engine->create_cq(staging);
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
  if (!state_.HasFeature(VIRTIO_VSTELLAR_F_RESIZE_CQ)) return VSTELLAR_STATUS_UNSUPPORTED;
  auto cmd = Get<vstellar_cmd_resize_cq>(b);
  const virtio_vstellar_config& c = config();
  const uint32_t log_cqe = le32toh(cmd.log_cqe);
  const uint32_t shift = le32toh(cmd.page_shift), n = le32toh(cmd.num_pages);
  const uint64_t ring_off = le64toh(cmd.ring_offset);
  if (uint64_t(len) != sizeof(cmd) + 8ull * n) return VSTELLAR_STATUS_BAD_LENGTH;
  const uint32_t cqn = le32toh(cmd.cqn);
  CqObj* cq = obj_.cqs.Owned(uctx, cqn);
  if (!cq) return VSTELLAR_STATUS_BAD_HANDLE;
  if (uint16_t s = CheckCqSize(c, shift, log_cqe)) return s;
  if (uint16_t s = CheckCqPages(c, shift, log_cqe, ring_off, n)) return s;
  CqObj geom{};
  if (uint16_t s = ReadPages(b + sizeof(cmd), n, shift, &geom.pages)) return s;
  geom.page_shift = shift;
  geom.ring_offset = ring_off;
  geom.log_cqe = log_cqe;
  uint32_t moved = 0;
  if (uint16_t s = dp_.ResizeCq(cqn, geom, &moved)) return s;
  vstellar_resp_resize_cq r{htole32(moved), 0};
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DESTROY_CQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  const auto [cq, cqn, status] = ObjectNamedBy(obj_.cqs, uctx, b);
  if (!cq) return status;
  if (cq->cq->refs) return VSTELLAR_STATUS_BUSY;
  if (sh_->engine->destroy_cq(cq->cq)) return VSTELLAR_STATUS_BUSY;
  FreeSlot(uctx, cq->slot);
  obj_.cqs.erase(cqn);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_REQ_NOTIFY_CQ>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  auto cmd = Get<vstellar_cmd_req_notify_cq>(b);
  const uint32_t f = le32toh(cmd.flags);
  const uint32_t cqn = le32toh(cmd.cqn);
  CqObj* cq = obj_.cqs.Owned(uctx, cqn);
  if (!cq) return VSTELLAR_STATUS_BAD_HANDLE;
  if (f != VSTELLAR_NOTIFY_NEXT_COMP && f != VSTELLAR_NOTIFY_SOLICITED) return VSTELLAR_STATUS_BAD_FIELD;
  cq->armed = true;
  return VSTELLAR_STATUS_OK;
}

}  // namespace vstellard
