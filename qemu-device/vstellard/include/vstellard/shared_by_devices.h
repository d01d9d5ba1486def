// What all devices of one daemon share (one emulated physical RNIC): the
// engine, the ATC, the pinning and translation modes, test hooks.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include <vstellar/engine.h>

#include "vstellard/device_state.h"
#include "vstellard/memory_budget.h"
#include "vstellard/pvdma.h"
#include "vstellard/translate.h"

namespace vstellard {

// Who holds each GID (address) of this daemon's devices. A device may
// hold only the addresses configured for it (DeviceState::addresses), and
// each address belongs to at most one device at a time: QP 1 datagrams
// for a GID go to its holder's GSI QP and nowhere else, and only the
// holder sends from it (no guest can take another's QP 1 traffic or send
// as it). A holder is named by its device's object tables. The table is
// shared by the worker threads of the daemon, so every call takes the
// table's lock.
class GidTable {
 public:
  // Takes g for `holder` (on worker thread `worker`); false if another
  // holder has it.
  bool Take(const vstellar::Gid& g, const void* holder, unsigned worker) {
    std::lock_guard<std::mutex> l(mu_);
    auto [it, fresh] = holders_.try_emplace(g, holder, worker);
    return fresh || it->second.first == holder;
  }
  void Release(const vstellar::Gid& g, const void* holder) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = holders_.find(g);
    if (it != holders_.end() && it->second.first == holder) holders_.erase(it);
  }
  bool Holds(const vstellar::Gid& g, const void* holder) const {
    std::lock_guard<std::mutex> l(mu_);
    auto it = holders_.find(g);
    return it != holders_.end() && it->second.first == holder;
  }
  // The holder's device moved to worker thread `worker` (Worker::MoveOut).
  void MoveHolder(const void* holder, unsigned worker) {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [g, h] : holders_)
      if (h.first == holder) h.second = worker;
  }
  // The worker thread of g's holder, or -1.
  int WorkerOf(const vstellar::Gid& g) const {
    std::lock_guard<std::mutex> l(mu_);
    auto it = holders_.find(g);
    return it == holders_.end() ? -1 : int(it->second.second);
  }

 private:
  mutable std::mutex mu_;
  std::map<vstellar::Gid, std::pair<const void*, unsigned>> holders_;
};

struct DeviceShared {
  vstellar::Engine* engine = nullptr;
  Atc* atc = nullptr;
  PinMode pin = PinMode::kLazy;
  bool require_sealed_memory = true;  // Pvdma::set_require_sealed
  TranslationMode translation = TranslationMode::kEmtt;
  // How long an access waits for a guest to map an on-demand page before
  // it fails (OdpTranslator; vstellard --odp-fault-timeout).
  uint64_t odp_fault_timeout_ns = OdpTranslator::kDefaultFaultTimeoutNs;
  uint16_t peer_port = 47000;  // UDP base port of peer vstellards
  // The engine's link is bound to the wildcard and serves several devices'
  // addresses (vstellard --device): every QP must name its source.
  bool link_serves_many_addresses = false;
  // UD multicast: datagrams to IPv4 group G go to G:mcast_port, which every
  // vstellard listens on (kMcastPortOffset above the peers' base port).
  static constexpr uint16_t kMcastPortOffset = 256;
  uint16_t mcast_port() const { return uint16_t(peer_port + kMcastPortOffset); }
  // The addresses this daemon serves and who holds each (GidTable), one
  // table for all worker threads.
  std::shared_ptr<GidTable> gids = std::make_shared<GidTable>();
  // The worker thread (vstellard --threads) whose engine serves these
  // devices: GidTable::WorkerOf tells where QP 1 datagrams for a GID go.
  unsigned worker = 0;
  // Called when one of a device's RC or UC QPs reaches RTR (it has its
  // peer): the worker looks, after its turn, whether the device belongs
  // on its peers' worker (Worker::Place). Unset with one worker.
  std::function<void(unsigned device)> connected;
  // Test hook: called after a command was copied out of guest memory and
  // before it is validated (tests change guest memory here: double fetch).
  std::function<void(unsigned device)> after_copy;
  // Test hook: called after a WQE was copied out of a guest SQ/RQ ring and
  // before it is validated (tests rewrite the WQE here: double fetch).
  std::function<void(unsigned device, uint32_t qpn, bool send, uint32_t index)> after_wqe_copy;
  // Data path: how long a device keeps polling its doorbells after the last
  // work before it sets need_kick and sleeps.
  uint64_t poll_ns = 50'000;
  // Work one device may do in one turn of the daemon's loop, so a guest
  // that keeps its queues full cannot starve the other devices and the
  // engine. What is left waits for the next turn; the loop does
  // not sleep while a device has work left.
  uint32_t control_budget = 64;       // control commands per device
  uint32_t wqe_budget_queue = 64;     // WQEs per SQ, RQ or SRQ
  uint32_t wqe_budget_device = 1024;  // WQEs per device (all its queues)
  // Host memory the guests' objects hold: all devices together (of every
  // worker thread), and the limit each device's own budget
  // (ObjectTables::memory) gets.
  std::shared_ptr<MemoryBudget> memory = std::make_shared<MemoryBudget>(uint64_t{4} << 30);
  // Multicast a device may use of its engine's (DeviceLimits::kMaxMcast*:
  // 256 groups, 64 QPs in each): groups it has QPs in, and its QPs in one
  // group. Over either, ATTACH_MCAST fails with LIMIT, so no guest can
  // take every group or every slot of a group from the others.
  uint32_t mcast_groups_per_device = 16;
  uint32_t mcast_qps_per_group = 8;
  uint64_t device_memory_limit = uint64_t{1} << 30;
  // What every new device reports and enforces (its config space: object
  // counts, queue sizes); the daemon's --device-max lowers the counts.
  DeviceConfig device_config = DeviceConfig::Default();
  // Devices whose data path started polling outside their own turn (an
  // engine completion freed room for waiting WQEs): the daemon's loop
  // visits only devices that are polling or have work, and takes these in.
  std::vector<unsigned> woken;
  // Devices whose data path went idle, with when to look at their
  // doorbells once more (DataPath::Recheck): a guest whose memory barrier
  // did not hold (a TCG guest with one vCPU, say) may have published a
  // producer index without the kick it owed.
  std::vector<std::pair<uint64_t, unsigned>> rechecks;
  uint64_t recheck_ns = 1'000'000;
};

// Whether the device whose object tables are `tables` holds address g
// (GidTable::Holds): may send from it, and gets QP 1 for it.
inline bool HoldsGid(const DeviceShared& sh, const void* tables, const vstellar::Gid& g) {
  return sh.gids->Holds(g, tables);
}

}  // namespace vstellard
