// The verbs objects of one device (user contexts, PDs, CQs, QPs, MRs, the
// GID table), by the handles its guest names them with. Commands
// (commands.cc) create and destroy them; the data path (datapath.cc) reads
// their rings. Device owns the tables; nothing outside one device sees them.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include <vstellar/engine.h>
#include <vstellar/virtio_vstellar.h>

#include "vstellard/memory_budget.h"
#include "vstellard/translate.h"

namespace vstellard {

// Where a guest ring (SQ or RQ) is: its pages (guest-physical), the page
// size, the offset of entry 0 in the first page, entries and entry size.
struct RingGeom {
  std::vector<uint64_t> pages;
  uint32_t shift = 12;
  uint64_t offset = 0;
  uint32_t log_n = 0, log_stride = 0;
};

struct UContext {
  uint32_t db_page = 0;
  uint8_t* page = nullptr;  // host pointer to its doorbell page (cached)
  uint64_t page_gpa = 0;    // and its guest-physical address (dirty log)
  std::vector<bool> slots;  // VSTELLAR_DB_SLOTS_PER_PAGE
};

struct PdObj {
  uint32_t owner;
  vstellar::Pd* pd;
  // Kernel PDs: the MR behind VSTELLAR_LOCAL_DMA_LKEY (guest-physical,
  // local access only). Not in mrs: no guest can deregister it.
  vstellar::Mr* dma_mr = nullptr;
};

struct CqObj {
  uint32_t owner;
  vstellar::Cq* cq;
  uint32_t cq_queue, slot, log_cqe;
  uint32_t page_shift;
  uint64_t ring_offset;
  std::vector<uint64_t> pages;
  MemoryCharge charge;
  bool armed = false;
  // Data path: CQEs written (free-running), arm value last consumed,
  // overflow latched (CQ_ERR sent, no more CQEs).
  uint32_t pi = 0, last_arm = 0;
  bool overflow = false;
};

// A shared receive queue: its ring in guest memory, served like an RQ
// from its own doorbell slot (struct vstellar_db_srq).
struct SrqObj {
  uint32_t owner;
  vstellar::Srq* srq;
  uint32_t pdn, slot;
  MemoryCharge charge;
  RingGeom ring;
  uint32_t ci = 0;  // WQEs fetched (free-running)
  // The guest wr_id of each fetched WQE not yet completed, by its
  // free-running index (the engine's wr_id). Not by slot: SRQ WQEs complete
  // out of order, so the driver may refill a slot while the WQE fetched
  // from it earlier is still held by a QP.
  std::unordered_map<uint32_t, uint64_t> wrid;
  uint32_t max_sge = 0;
  bool broken = false;   // doorbell record or ring corrupt: SRQ_ERR sent, not read again
  bool blocked = false;  // the engine's SRQ was full: rescan after a completion
};

struct QpObj {
  uint32_t owner;
  vstellar::Qp* qp;
  uint8_t type = VSTELLAR_QPT_RC;  // VSTELLAR_QPT_*
  uint32_t pdn, send_cqn, recv_cqn, slot;
  uint32_t srqh = 0;  // receives come from this SRQ (0: the QP's own RQ)
  // Data path: ring geometry, WQEs fetched (free-running), the guest
  // wr_id of each slot (the engine's wr_id is the WQE index), the send
  // opcode of each SQ slot, limits granted at create.
  RingGeom sq, rq;
  uint32_t sq_ci = 0, rq_ci = 0;
  std::vector<uint64_t> sq_wrid, rq_wrid;
  std::vector<uint8_t> sq_op;
  uint32_t max_send_sge = 0, max_recv_sge = 0, max_inline = 0;
  MemoryCharge charge;
  bool broken = false;   // doorbell record corrupt: not read until RESET
  bool blocked = false;  // the engine's queue was full: rescan after a completion
  bool error_logged = false;  // its first error completion is in the log
};

struct MrObj {
  uint32_t owner;
  vstellar::Mr* mr;
  uint32_t pdn;
  MemoryCharge charge;
  std::shared_ptr<OdpTranslator> odp;  // on-demand MRs (F_ODP): MAP_ and UNMAP_MR_PAGES reach it
};

// A memory window (minor 3, F_MW).
struct MwObj {
  uint32_t owner;
  vstellar::Mw* mw;
  uint32_t pdn;
  MemoryCharge charge;
};

// The objects of one kind, by the handle the guest names them with (T has
// an `owner`: the user context that made it, 0 for the kernel). Requests
// reach an object only through Owned, so a handle of another context reads
// as unknown.
template <typename T>
class ObjectTable {
 public:
  using Map = std::map<uint32_t, T>;

  // The object `handle` names if context `uctx` owns it; null when the
  // handle is unknown or belongs to another context.
  T* Owned(uint32_t uctx, uint32_t handle) {
    auto it = map_.find(handle);
    return it != map_.end() && it->second.owner == uctx ? &it->second : nullptr;
  }

  // Erases every object context `uctx` owns, handing each to
  // release(handle, object) first to free what the engine holds for it.
  template <typename Release>
  void EraseOwnedBy(uint32_t uctx, Release release) {
    for (auto it = map_.begin(); it != map_.end();) {
      if (it->second.owner == uctx) {
        release(it->first, it->second);
        it = map_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // The map's own lookups, for the data path (which finds objects by the
  // handles it stored itself) and for walks over every object.
  typename Map::iterator begin() { return map_.begin(); }
  typename Map::iterator end() { return map_.end(); }
  typename Map::const_iterator begin() const { return map_.begin(); }
  typename Map::const_iterator end() const { return map_.end(); }
  typename Map::iterator find(uint32_t h) { return map_.find(h); }
  typename Map::const_iterator find(uint32_t h) const { return map_.find(h); }
  typename Map::iterator lower_bound(uint32_t h) { return map_.lower_bound(h); }
  size_t count(uint32_t h) const { return map_.count(h); }
  size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }
  T& at(uint32_t h) { return map_.at(h); }
  const T& at(uint32_t h) const { return map_.at(h); }
  T& operator[](uint32_t h) { return map_[h]; }
  void erase(uint32_t h) { map_.erase(h); }
  typename Map::iterator erase(typename Map::iterator it) { return map_.erase(it); }

 private:
  Map map_;
};

struct ObjectTables {
  // What this device's objects hold of host memory (first, so that it
  // outlives every object's MemoryCharge). Shared: guest memory regions
  // charge their PVDMA block tables to it, and an MR may keep a region
  // (with its charge) beyond the device's tables.
  std::shared_ptr<MemoryBudget> budget = std::make_shared<MemoryBudget>();
  MemoryBudget& memory = *budget;
  // A fresh handle for a user context, PD, CQ, MR, MW or SRQ: never 0 and
  // never one in use, also after the 32-bit counter wrapped (a wrapped
  // counter must not overwrite a live object's entry).
  uint32_t NewHandle() {
    for (;;) {
      const uint32_t h = next_handle++;
      if (h != 0 && !uctx.count(h) && !pds.count(h) && !cqs.count(h) && !mrs.count(h) && !srqs.count(h) &&
          !mws.count(h))
        return h;
    }
  }
  uint32_t next_handle = 1;
  std::map<uint32_t, UContext> uctx;  // by handle; 0 = the kernel's doorbell page
  std::vector<bool> db_pages_used;
  ObjectTable<PdObj> pds;
  ObjectTable<CqObj> cqs;
  ObjectTable<QpObj> qps;  // by QPN
  ObjectTable<MrObj> mrs;
  ObjectTable<SrqObj> srqs;  // by handle (the guest's SRQN)
  ObjectTable<MwObj> mws;
  std::map<uint32_t, std::array<uint8_t, 16>> gids;  // by GID index
  // Multicast groups this device's QPs are attached to, and which QPs: the
  // engine's groups and slots are shared by every device of its worker,
  // so each device gets a quota of them (DeviceShared::mcast_*).
  std::map<vstellar::Gid, std::set<uint32_t>> mcast;
};

}  // namespace vstellard
