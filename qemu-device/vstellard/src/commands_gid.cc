// The commands on the GID table: ADD_GID, DEL_GID, and what QP 1 answers for.
#include "vstellard/commands.h"

#include <endian.h>

#include <cstring>

#include "commands_common.h"

namespace vstellard {

uint16_t Commands::GidCommand(uint32_t uctx, const uint8_t* b, bool add) {
  auto cmd = Get<vstellar_cmd_gid>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  if (uctx != 0) return VSTELLAR_STATUS_ACCESS;  // the kernel's GID cache only
  if (le32toh(cmd.port) != 1) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t index = le32toh(cmd.index);
  if (index >= cfg32(config().gid_table_len)) return VSTELLAR_STATUS_BAD_FIELD;
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
  // An address (RoCE v2 over IPv4 or IPv6): only one configured for this
  // device, and only while no other device holds it, so a guest cannot
  // take another guest's QP 1 traffic or send as its address by writing
  // that address into its own GID table. A link-local IPv6 address (the
  // netdev's fe80::, which the kernel always adds) is listed, so the
  // guest's GID table matches its netdev as the kernel expects, but never
  // held: it names no host beyond the guest's own link, so nothing is sent
  // from it and QP 1 does not answer for it.
  const vstellar::IpAddr a = vstellar::IpAddr::from_bytes(g.data());
  const bool held = !a.is_link_local();
  if (held && !state_.MayHold(a)) return VSTELLAR_STATUS_ACCESS;
  if (held && !sh_->gids->Take(g, &obj_, sh_->worker)) return VSTELLAR_STATUS_BUSY;
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
  sh_->gids->Release(g, &obj_);
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
      if (HoldsGid(*sh_, &obj_, g)) gids.push_back(g);
    sh_->engine->set_gsi_gids(q.qp, gids);
  }
}

}  // namespace vstellard
