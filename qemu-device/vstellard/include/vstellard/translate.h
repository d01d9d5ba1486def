// Memory translation for MRs: eMTT and the ATC baseline, plugged into the
// engine through vstellar::MemoryTranslator.
//
// An MR registered by a guest covers [iova, iova+length) of the guest
// process and comes with a page list of guest-physical addresses (pages of
// 1 << page_shift bytes; iova's offset inside a page is the offset of the
// first byte in the first page).
//
// eMTT (Stellar's extended MTT): at registration every page is resolved
// through PVDMA to its final host pointer (which maps and pins its 2 MiB
// block on first use) and the MR stores those pointers with their owner,
// and holds the regions they point into (Pvdma::Hold) so the pointers stay
// valid whatever memory table comes next. An access is an array index: no
// cache, no miss.
//
// ATC (baseline, how an IOMMU-translated RNIC works): the MR keeps only the
// guest-physical pages. Every access consults a bounded translation cache
// of 4 KiB guest frames (CLOCK replacement), shared by every MR of the
// daemon as a NIC's ATC is; a miss takes the slow path (the PVDMA lookup,
// plus an optional emulated round-trip delay) and inserts the entry.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <vstellar/memory.h>
#include <vstellar/virtio_vstellar.h>  // the VSTELLAR_STATUS_* Create returns

#include "vstellard/pvdma.h"

namespace vstellard {

enum class TranslationMode { kEmtt, kAtc };

struct AtcStats {
  uint64_t lookups = 0, hits = 0, misses = 0, evictions = 0, slow_path_faults = 0;
};

// The translation cache: (owner, guest frame) -> host pointer of the frame.
// The owner is the whole identity of the memory the frame belongs to: the
// Pvdma's process-unique id (one per device connection) and its table
// generation, each kept in full, so no two devices (and no two memory
// tables of one device) can ever share an entry.
struct AtcKey {
  uint64_t owner = 0;       // Pvdma::id()
  uint64_t generation = 0;  // Pvdma::generation() when the entry was made
  uint64_t frame = 0;       // guest-physical address >> 12
  bool operator==(const AtcKey&) const = default;
};
struct AtcKeyHash {
  size_t operator()(const AtcKey& k) const;
};

class Atc {
 public:
  explicit Atc(size_t entries = 16384, uint64_t miss_ns = 0);
  size_t capacity() const { return slots_.size(); }
  uint64_t miss_ns() const { return miss_ns_; }
  // Host pointer for the 4 KiB frame holding gpa (of the memory `pv`), or
  // nullptr if it is not guest memory.
  uint8_t* Lookup(Pvdma& pv, uint64_t gpa);
  // Drop every entry of one owner (its memory is going away).
  void Invalidate(uint64_t owner);
  const AtcStats& stats() const { return stats_; }
  void ResetStats() { stats_ = {}; }

 private:
  struct Slot {
    AtcKey key;
    uint8_t* host = nullptr;
    bool used = false;
    bool ref = false;
  };
  std::vector<Slot> slots_;
  std::unordered_map<AtcKey, uint32_t, AtcKeyHash> index_;
  size_t hand_ = 0;
  uint64_t miss_ns_;
  AtcStats stats_;
};

// Validated MR geometry shared by both translators.
struct MrLayout {
  uint64_t iova = 0, length = 0;
  uint32_t page_shift = 12;
  std::vector<uint64_t> pages;  // guest-physical
  // Page index and offset for an iova inside the MR.
  uint64_t base() const { return iova & ~((uint64_t{1} << page_shift) - 1); }
};

class EmttTranslator final : public vstellar::MemoryTranslator {
 public:
  // Resolves (and so pins) every page. Returns nullptr with *status set to
  // a VSTELLAR_STATUS_* when a page is not guest RAM or not host-contiguous.
  static std::shared_ptr<EmttTranslator> Create(Pvdma& pv, MrLayout layout, uint16_t* status);
  vstellar::TranslateResult translate(uint64_t iova, uint64_t len, bool for_write,
                                      vstellar::HostSpan* out, size_t max_out) override;
  uint64_t owner() const { return owner_; }
  // Where the MR is in guest memory (what a migrating device saves).
  const MrLayout& layout() const { return layout_; }

 private:
  MrLayout layout_;
  uint64_t base_ = 0, start_ = 0, end_ = 0;
  uint32_t shift_ = 12;
  uint64_t owner_ = 0;
  std::shared_ptr<DirtyLog> log_;
  std::vector<uint8_t*> host_;  // final translation of each page
  // The regions host_ points into: kept mapped while this MR lives, even
  // if a new memory table drops them.
  std::vector<std::shared_ptr<const void>> holds_;
};

class AtcTranslator final : public vstellar::MemoryTranslator {
 public:
  // Checks the pages lie in guest RAM; maps nothing.
  static std::shared_ptr<AtcTranslator> Create(Pvdma& pv, Atc& atc, MrLayout layout, uint16_t* status);
  vstellar::TranslateResult translate(uint64_t iova, uint64_t len, bool for_write,
                                      vstellar::HostSpan* out, size_t max_out) override;
  MrLayout layout() const { return MrLayout{start_, end_ - start_, shift_, pages_}; }

 private:
  Pvdma* pv_ = nullptr;
  Atc* atc_ = nullptr;
  std::shared_ptr<DirtyLog> log_;
  uint64_t base_ = 0, start_ = 0, end_ = 0;
  uint32_t shift_ = 12;
  std::vector<uint64_t> pages_;
};

// On-demand paging (interface minor 7, F_ODP; docs/virtio-vstellar.md):
// an MR registered with no pages, whose pages the guest driver maps when
// the device asks (MAP_MR_PAGES after a VSTELLAR_EV_PAGE_FAULT) and takes
// back before the guest kernel reuses them (UNMAP_MR_PAGES, from its mmu
// notifier). What is mapped is held as eMTT holds it: final host pointers
// of 4 KiB pages, resolved through PVDMA (so their blocks are pinned on
// first use), whatever the translation mode. An access to a page that is
// missing (or read-only, for a write) reports a fault and answers
// fault == true, so the engine waits and retries; a page that stays
// missing for longer than the fault timeout makes the access fail.
//
// The table is sparse, in 2 MiB chunks of 512 entries, because an
// implicit MR spans the whole address space of the process.
class OdpTranslator final : public vstellar::MemoryTranslator {
 public:
  // The device's way to tell the guest: first missing page (aligned),
  // pages the access needs from there, whether it writes. False if the
  // event could not be queued.
  using FaultFn = std::function<bool(uint64_t iova, uint32_t npages, bool write)>;
  static constexpr uint64_t kPage = 4096;
  static constexpr uint64_t kChunkPages = 512;
  // Chunks an implicit MR may have mapped at once (4 GiB of address
  // space; the table is charged for them at registration).
  static constexpr uint64_t kMaxImplicitChunks = 2048;
  static constexpr uint64_t kDefaultFaultTimeoutNs = 5'000'000'000;
  // A page the guest was asked for is not asked for again before this:
  // every packet of a message that waits for it meets it, and one event
  // per packet would bury the guest in duplicates (an emulated guest takes
  // tens of milliseconds per fault). Asking again covers a driver that
  // mapped only part of what it was asked for.
  static constexpr uint64_t kAskAgainNs = 250'000'000;

  OdpTranslator(Pvdma& pv, uint64_t iova, uint64_t length);
  // Table chunks this MR may ever need (what registration charges).
  static uint64_t MaxChunks(uint64_t iova, uint64_t length);
  void set_fault_handler(FaultFn fn) { on_fault_ = std::move(fn); }
  void set_fault_timeout_ns(uint64_t ns) { timeout_ns_ = ns; }

  bool on_demand() const override { return true; }
  vstellar::TranslateResult translate(uint64_t iova, uint64_t len, bool for_write,
                                      vstellar::HostSpan* out, size_t max_out) override;

  // MAP_MR_PAGES: pages from iova (aligned) on, each a guest-physical
  // address | VSTELLAR_ODP_PAGE_WRITABLE. All or nothing: a VSTELLAR_STATUS_*.
  uint16_t Map(uint64_t iova, const std::vector<uint64_t>& pages);
  // UNMAP_MR_PAGES: [iova, iova+length), clipped to the MR.
  void Unmap(uint64_t iova, uint64_t length);
  uint64_t mapped_pages() const { return mapped_; }
  uint64_t fault_timeouts() const { return timeouts_; }
  // The range registered (length VSTELLAR_ODP_IMPLICIT_LENGTH: implicit).
  uint64_t iova() const { return start_; }
  uint64_t length() const { return length_; }

 private:
  struct Chunk {
    uintptr_t page[kChunkPages] = {};  // host pointer | 1 if writable; 0: missing
    uint64_t gpa[kChunkPages] = {};    // its guest-physical address (dirty log, migration)
    uint32_t used = 0;
  };
  uintptr_t Entry(uint64_t page) const;
  bool Fault(uint64_t iova, uint64_t end, bool write);

  Pvdma& pv_;
  std::shared_ptr<DirtyLog> log_;
  uint64_t start_, end_;  // [start_, end_) of the MR; end_ saturates for implicit MRs
  uint64_t length_;       // as registered
  uint64_t max_chunks_;
  std::unordered_map<uint64_t, std::unique_ptr<Chunk>> chunks_;  // by iova / 2 MiB
  std::vector<std::shared_ptr<const void>> holds_;  // regions mapped pages point into
  // Missing pages the guest was asked for: since when, and when last.
  // A page that waited past the timeout fails every access for one more
  // timeout (so that each packet of a message fails alike, not only the
  // few that happen to look at the right moment), then may be asked for
  // afresh.
  struct Waiting {
    uint64_t since_ns, asked_ns;
    bool failed = false;
  };
  std::unordered_map<uint64_t, Waiting> waiting_;
  FaultFn on_fault_;
  uint64_t timeout_ns_ = kDefaultFaultTimeoutNs;
  uint64_t mapped_ = 0, timeouts_ = 0;
};

// An MR that arrived with a migrated device (device_migration.cc): its
// layout came in the state, and its translation (eMTT's final host
// pointers, or the ATC's checks) is built on its first access, when the
// destination has the guest's memory table, so the destination pins
// lazily again instead of pinning every MR before the guest resumes. If
// the layout no longer fits guest memory, every access fails (a
// protection error for that MR's users, nothing else).
class RestoredTranslator final : public vstellar::MemoryTranslator {
 public:
  RestoredTranslator(Pvdma& pv, Atc* atc, TranslationMode mode, MrLayout layout)
      : pv_(pv), atc_(atc), mode_(mode), layout_(std::move(layout)) {}
  vstellar::TranslateResult translate(uint64_t iova, uint64_t len, bool for_write, vstellar::HostSpan* out,
                                      size_t max_out) override;
  const MrLayout& layout() const { return layout_; }
  bool built() const { return real_ != nullptr; }

 private:
  Pvdma& pv_;
  Atc* atc_;
  TranslationMode mode_;
  MrLayout layout_;
  std::shared_ptr<vstellar::MemoryTranslator> real_;
  bool failed_ = false;
};

// Guest-physical addresses as they are, for the kernel's local DMA lkey
// (VSTELLAR_LOCAL_DMA_LKEY): a kernel PD gets one MR over the whole
// guest-physical space with this translator and local access only. Every
// access checks that the range is guest RAM (not the doorbell region) and
// maps it through PVDMA, so lazy pinning holds for kernel buffers too.
class GpaTranslator final : public vstellar::MemoryTranslator {
 public:
  explicit GpaTranslator(Pvdma& pv) : pv_(pv) {}
  vstellar::TranslateResult translate(uint64_t iova, uint64_t len, bool for_write,
                                      vstellar::HostSpan* out, size_t max_out) override;

 private:
  Pvdma& pv_;
};

}  // namespace vstellard
