// The commands on memory windows: ALLOC_MW, DEALLOC_MW (binding is a
// work request, in the data path).
#include "vstellard/commands.h"

#include <endian.h>

#include <cstring>

#include "commands_common.h"

namespace vstellard {

uint64_t Commands::MwBytes() { return sizeof(MwObj) + sizeof(vstellar::Mw); }

template <>
uint16_t Commands::Run<VSTELLAR_CMD_ALLOC_MW>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (!WindowsOn()) return VSTELLAR_STATUS_UNSUPPORTED;
  auto cmd = Get<vstellar_cmd_alloc_mw>(b);
  const uint32_t type = le32toh(cmd.type);
  const uint32_t pdn = le32toh(cmd.pdn);
  PdObj* pd = obj_.pds.Owned(uctx, pdn);
  if (!pd) return VSTELLAR_STATUS_BAD_HANDLE;
  if (type != VSTELLAR_MW_TYPE_1 && type != VSTELLAR_MW_TYPE_2) return VSTELLAR_STATUS_BAD_FIELD;
  if (obj_.mws.size() >= cfg32(config().max_mr)) return VSTELLAR_STATUS_LIMIT;
  MemoryCharge charge;
  if (uint16_t s = Charge(MwBytes(), &charge)) return s;
  vstellar::Mw* mw = sh_->engine->alloc_mw(pd->pd, uint8_t(type));
  if (!mw) return VSTELLAR_STATUS_NO_RESOURCES;
  const uint32_t h = obj_.NewHandle();
  obj_.mws[h] = MwObj{uctx, mw, pdn, std::move(charge)};
  vstellar_resp_alloc_mw r{};
  r.mwn = htole32(h);
  r.rkey = htole32(mw->rkey());
  Put(resp, r);
  return VSTELLAR_STATUS_OK;
}

template <>
uint16_t Commands::Run<VSTELLAR_CMD_DEALLOC_MW>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp) {
  if (!WindowsOn()) return VSTELLAR_STATUS_UNSUPPORTED;
  const auto [w, mwn, status] = ObjectNamedBy(obj_.mws, uctx, b);
  if (!w) return status;
  if (sh_->engine->dealloc_mw(w->mw)) return VSTELLAR_STATUS_INTERNAL;
  obj_.mws.erase(mwn);
  return VSTELLAR_STATUS_OK;
}

}  // namespace vstellard
