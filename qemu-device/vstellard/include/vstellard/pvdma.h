// PVDMA: lazy mapping and pinning of guest memory, 2 MiB at a time.
//
// Stellar pins guest memory on the device's first DMA to it, in 2 MiB
// blocks, and keeps a map cache, instead of pinning all of it before the VM
// starts as VFIO does. Here "the device" is vstellard: at attach
// (vhost-user SET_MEM_TABLE) nothing is mapped. The first access to a 2 MiB
// guest-physical block maps that block from the region's fd (mmap at the
// right offset) and mlocks it; later accesses hit the block table (the map
// cache: one pointer per block, indexed directly). PinMode::kEager is the
// VFIO-like baseline: every region is mapped and mlocked at attach.
//
// Blocks are 2 MiB-aligned in guest-physical space and clamped to their
// region, so a block never spans two regions and every host pointer is
// contiguous up to the end of its block.
//
// Lifetime of mappings: a region is shared between the current table and
// whoever holds host pointers into it for longer than one lookup (an eMTT
// MR takes a Hold at registration). A SET_MEM_TABLE that drops or moves a
// region lets go of the table's reference: the region is unmapped and its
// fd closed at once if nobody else holds it, else when the last holder
// goes. So churning the memory table costs nothing that lasts, and a
// translation an MR holds never dangles. Caches keyed on guest addresses
// (the ATC) must include generation() in their key: it changes whenever a
// region leaves the table, so an entry for a dropped region is never hit.
//
// SIGBUS safety: a mapping of a file that is later shrunk faults (SIGBUS)
// on access beyond the new end, which would kill the daemon and every
// device in it. QEMU's memory-backend-memfd seals guest RAM against
// shrinking by default (seal=on: F_SEAL_GROW | F_SEAL_SHRINK |
// F_SEAL_SEAL). Attach accepts a region whose file
//   - already has F_SEAL_SHRINK, or
//   - allows sealing: Attach adds F_SEAL_SHRINK itself (growing stays
//     allowed; only shrinking can fault), or
//   - cannot be sealed (a memfd made without MFD_ALLOW_SEALING, such as
//     QEMU's doorbell memfd, or a tmpfs/hugetlbfs file): accepted, counted
//     in stats().unsealed_regions, with the file size checked at Attach and
//     again before each block is mapped, so a file already shrunk is
//     refused instead of faulting. Shrinking such a file after its block
//     was mapped can still fault: see docs/threat-model.md.
// In every case the file must cover [offset, offset + size) at Attach.
//
// Single-threaded (the daemon's event loop); counters are atomics so other
// threads (tests, a stats dump) can read them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vstellard/dirty_log.h"
#include "vstellard/memory_budget.h"
#include "vstellard/memory_region.h"

namespace vstellard {

enum class PinMode { kLazy, kEager };

constexpr uint64_t kBlockShift = 21;
constexpr uint64_t kBlockSize = uint64_t{1} << kBlockShift;  // 2 MiB

struct PvdmaStats {
  uint64_t regions = 0;         // regions in the current table
  uint64_t guest_bytes = 0;     // bytes of guest memory in the current table
  uint64_t blocks_pinned = 0;   // blocks mapped and locked now (current table and held regions)
  uint64_t bytes_pinned = 0;    // bytes of them
  uint64_t regions_released = 0;  // regions unmapped and closed after leaving the table
  uint64_t unsealed_regions = 0;  // regions of the current table whose file could not be sealed
  uint64_t misses = 0;          // lookups that had to map a block
  uint64_t hits = 0;            // lookups served by the map cache
  uint64_t faults = 0;          // lookups outside guest memory (refused)
  uint64_t map_errors = 0;      // mmap failures
  uint64_t lock_errors = 0;     // mlock failures (mapped, but not pinned)
  uint64_t attach_ns = 0;       // time the last Attach took
};

class Pvdma {
 public:
  explicit Pvdma(PinMode mode = PinMode::kLazy);
  ~Pvdma();
  Pvdma(const Pvdma&) = delete;
  Pvdma& operator=(const Pvdma&) = delete;

  PinMode mode() const { return mode_; }
  // Refuse a memory table with a region whose file cannot be sealed
  // against shrinking (vstellard's default; see docs/threat-model.md #9):
  // such a file, shrunk by its owner after a block was mapped, would make
  // an access fault (SIGBUS) in the daemon.
  void set_require_sealed(bool on) { require_sealed_ = on; }
  // Where each region's block table is charged (memory_budget.h): the
  // device's budget and the daemon's. Without them nothing is charged.
  // Shared, since a region held by an MR may outlive the device's tables.
  void set_budgets(std::shared_ptr<MemoryBudget> device, std::shared_ptr<MemoryBudget> daemon) {
    device_budget_ = std::move(device);
    daemon_budget_ = std::move(daemon);
  }
  // Host memory the daemon keeps for a region of `size` bytes at `gpa`.
  static uint64_t RegionFootprint(uint64_t gpa, uint64_t size);
  // A process-unique id (never reused): translation caches key on it.
  uint64_t id() const { return id_; }

  // Takes the memory table (the fds are duplicated). Lazy: records it.
  // Eager: maps and locks every region now. A region identical to one of
  // the previous table (same file, offset, guest range) keeps its blocks;
  // the others of the previous table are released (see above). Refuses a
  // table with a region its file does not cover, or whose block table
  // cannot be charged or allocated (the table is unchanged).
  bool Attach(const std::vector<MemRegion>& regions, std::string* err);

  // Keeps the region holding gpa mapped (and its fd open) while the handle
  // lives, even after a new table drops it. nullptr if gpa is not guest
  // memory. For host pointers kept beyond the next Attach (eMTT).
  std::shared_ptr<const void> Hold(uint64_t gpa) const;

  // Changes whenever a region leaves the table (host pointers into it may
  // be gone): translation caches key on (id(), generation(), frame).
  uint64_t generation() const { return generation_; }

  // Host pointer for guest-physical address gpa, mapping and pinning its
  // block on first use. *contig receives the bytes contiguous from there to
  // the end of the block. nullptr if gpa is not guest memory (or the map
  // failed).
  uint8_t* Map(uint64_t gpa, uint64_t* contig);

  // Whether [gpa, gpa+len) lies inside one region (no mapping, no pinning).
  // `ram_only` excludes the doorbell region.
  bool Contains(uint64_t gpa, uint64_t len, bool ram_only = true) const;

  // Copies across blocks. False if any byte is outside guest memory.
  // Write marks what it wrote in the dirty log.
  bool Read(uint64_t gpa, void* dst, uint64_t len);
  bool Write(uint64_t gpa, const void* src, uint64_t len);

  // The device's dirty log (live migration): Write marks it; whoever writes
  // through a pointer from Map() (translators, the doorbell page) marks it
  // themselves, translators holding it beyond this Pvdma.
  const std::shared_ptr<DirtyLog>& dirty_log() const { return log_; }

  // QEMU virtual address (what vring addresses are) to guest-physical.
  bool QemuVaToGpa(uint64_t va, uint64_t len, uint64_t* gpa) const;

  PvdmaStats stats() const;

 private:
  // Pinned-memory counters shared with the regions, which may outlive the
  // Pvdma (held by an MR) and give back their blocks when they go.
  struct PinCounters {
    std::atomic<uint64_t> blocks{0}, bytes{0}, released{0};
  };
  struct Region {
    uint64_t gpa = 0, size = 0, qemu_va = 0, offset = 0;
    dev_t dev = 0;
    ino_t ino = 0;
    bool doorbell = false;
    bool sealed = false;                  // F_SEAL_SHRINK: the file cannot shrink
    Fd fd;
    uint64_t first_block = 0;             // gpa >> 21 of its first block
    std::vector<uint8_t*> blocks;         // host pointer of each block's first byte
    std::vector<std::pair<void*, size_t>> maps;  // what to munmap when released
    uint64_t blocks_mapped = 0, bytes_mapped = 0;
    std::shared_ptr<PinCounters> counters;
    // Its block table's charge; the budgets live as long as the charge.
    std::shared_ptr<MemoryBudget> device_budget, daemon_budget;
    MemoryCharge charge;
    Region() = default;
    Region(const Region&) = delete;
    Region& operator=(const Region&) = delete;
    ~Region();  // unmaps, gives back its counts; fd closes
  };
  Region* Find(uint64_t gpa);
  const Region* Find(uint64_t gpa) const;
  uint8_t* MapBlock(Region& r, uint64_t bi);
  bool MapAll(Region& r, std::string* err);
  bool FileCovers(const Region& r) const;

  PinMode mode_;
  bool require_sealed_ = false;
  uint64_t id_;
  uint64_t generation_ = 0;
  std::shared_ptr<PinCounters> pins_ = std::make_shared<PinCounters>();
  std::shared_ptr<DirtyLog> log_ = std::make_shared<DirtyLog>();
  std::shared_ptr<MemoryBudget> device_budget_, daemon_budget_;
  std::vector<std::shared_ptr<Region>> regions_;
  Region* last_ = nullptr;  // one-entry lookup cache
  std::atomic<uint64_t> regions_n_{0}, guest_bytes_{0}, misses_{0}, hits_{0}, faults_{0}, map_errors_{0},
      lock_errors_{0}, attach_ns_{0}, unsealed_{0};
};

}  // namespace vstellard
