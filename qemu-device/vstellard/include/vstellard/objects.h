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
};

// A memory window (minor 3, F_MW).
struct MwObj {
  uint32_t owner;
  vstellar::Mw* mw;
  uint32_t pdn;
  MemoryCharge charge;
};

struct ObjectTables {
  // What this device's objects hold of host memory (first, so that it
  // outlives every object's MemoryCharge). Shared: guest memory regions
  // charge their PVDMA block tables to it, and an MR may keep a region
  // (with its charge) beyond the device's tables.
  std::shared_ptr<MemoryBudget> budget = std::make_shared<MemoryBudget>();
  MemoryBudget& memory = *budget;
  // A fresh handle for a user context, PD, CQ, MR or SRQ: never 0 and
  // never one in use, also after the 32-bit counter wrapped (issue 13:
  // a wrapped counter overwrote a live object's entry).
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
  std::map<uint32_t, PdObj> pds;
  std::map<uint32_t, CqObj> cqs;
  std::map<uint32_t, QpObj> qps;  // by QPN
  std::map<uint32_t, MrObj> mrs;
  std::map<uint32_t, SrqObj> srqs;  // by handle (the guest's SRQN)
  std::map<uint32_t, MwObj> mws;
  std::map<uint32_t, std::array<uint8_t, 16>> gids;  // by GID index
  // Multicast groups this device's QPs are attached to, and which QPs: the
  // engine's groups and slots are shared by every device of its worker,
  // so each device gets a quota of them (DeviceShared::mcast_*).
  std::map<vstellar::Gid, std::set<uint32_t>> mcast;
};

}  // namespace vstellard
