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

 private:
  uint64_t base_ = 0, start_ = 0, end_ = 0;
  uint32_t shift_ = 12;
  uint64_t owner_ = 0;
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

 private:
  Pvdma* pv_ = nullptr;
  Atc* atc_ = nullptr;
  uint64_t base_ = 0, start_ = 0, end_ = 0;
  uint32_t shift_ = 12;
  std::vector<uint64_t> pages_;
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
