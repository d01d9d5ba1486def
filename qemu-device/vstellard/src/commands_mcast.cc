// The commands on multicast groups: ATTACH_MCAST, DETACH_MCAST.
#include "vstellard/commands.h"

#include <endian.h>

#include <cerrno>
#include <cstring>

#include "commands_common.h"

namespace vstellard {

uint16_t Commands::McastCommand(uint32_t uctx, const uint8_t* b, bool attach) {
  if (!state_.HasFeature(VIRTIO_VSTELLAR_F_MCAST)) return VSTELLAR_STATUS_UNSUPPORTED;
  auto cmd = Get<vstellar_cmd_mcast>(b);
  if (cmd.reserved) return VSTELLAR_STATUS_BAD_FIELD;
  const uint32_t qpn = le32toh(cmd.qpn);
  QpObj* q = obj_.qps.Owned(uctx, qpn);
  if (!q) return VSTELLAR_STATUS_BAD_HANDLE;
  if (q->type != VSTELLAR_QPT_UD) return VSTELLAR_STATUS_BAD_FIELD;
  vstellar::Gid mgid;
  std::memcpy(mgid.data(), cmd.mgid, sizeof(cmd.mgid));
  auto mine = obj_.mcast.find(mgid);
  if (attach && !(mine != obj_.mcast.end() && mine->second.count(qpn))) {
    if (mine == obj_.mcast.end() ? obj_.mcast.size() >= sh_->mcast_groups_per_device
                                 : mine->second.size() >= sh_->mcast_qps_per_group)
      return VSTELLAR_STATUS_LIMIT;
  }
  vstellar::Engine& e = *sh_->engine;
  switch (attach ? e.attach_mcast(q->qp, mgid) : e.detach_mcast(q->qp, mgid)) {
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

}  // namespace vstellard
