// Dirty logging for live migration (vhost-user VHOST_F_LOG_ALL).
//
// While QEMU migrates a guest it copies guest RAM in passes and copies
// again what changed since; it sees the guest's own stores, but not
// vstellard's: received RDMA data, CQEs, used-ring entries, doorbell
// records. The vhost-user log is how a backend tells it: a bitmap in
// memory shared with QEMU (SET_LOG_BASE), one bit per 4 KiB page of
// guest-physical address space, which the backend sets for every page it
// writes while the frontend has acked VHOST_F_LOG_ALL. QEMU takes the bits
// (atomic exchange of 64-bit chunks) at every pass and once more after the
// device stopped, so a write made before the stop is never lost and none
// may be made after it.
//
// Every write of vstellard's into guest memory goes through Pvdma::Write or
// a translator asked for_write; both mark here. Marking is one branch when
// logging is off.
//
// One per device, shared (shared_ptr) with the translators of its MRs,
// which may outlive the device's memory table. Used on the device's worker
// thread only; the bits themselves are shared with QEMU and set atomically.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "vstellard/memory_region.h"

namespace vstellard {

class DirtyLog {
 public:
  static constexpr uint64_t kPageShift = 12;  // VHOST_LOG_PAGE

  DirtyLog() = default;
  ~DirtyLog();
  DirtyLog(const DirtyLog&) = delete;
  DirtyLog& operator=(const DirtyLog&) = delete;

  // SET_LOG_BASE: the bitmap is [offset, offset + size) of fd. Replaces
  // the previous one (QEMU resizes the log by sending a new one). False
  // with *err if it cannot be mapped; the previous bitmap is kept then.
  bool Map(Fd fd, uint64_t size, uint64_t offset, std::string* err);
  // VHOST_F_LOG_ALL acked (SET_FEATURES): log from now on, or no more.
  void SetLogging(bool on) { logging_ = on; }
  bool logging() const { return logging_; }
  bool active() const { return logging_ && bits_ != nullptr; }

  // The pages of [gpa, gpa + len) were just written.
  void Mark(uint64_t gpa, uint64_t len) {
    if (active() && len) SetBits(gpa >> kPageShift, (gpa + len - 1) >> kPageShift);
  }
  // The pages of [gpa, gpa + len) are about to be written (a translator
  // handing out host pointers: the engine writes after it returns). Set
  // now, and again at the next Flush(): QEMU may take the bits between
  // this and the write, and the write must not go unseen.
  void MarkBefore(uint64_t gpa, uint64_t len) {
    if (!active() || !len) return;
    const uint64_t first = gpa >> kPageShift, last = (gpa + len - 1) >> kPageShift;
    SetBits(first, last);
    if (!again_.empty() && again_.back().second + 1 >= first && again_.back().first <= first)
      again_.back().second = std::max(again_.back().second, last);
    else
      again_.emplace_back(first, last);
  }
  // Every write marked with MarkBefore() is done (the daemon calls this at
  // each turn of its loop and when the device stops): set their bits again.
  // What a turn writes is bounded by its budgets, so again_ is too.
  void Flush();

  // Pages marked so far, and writes beyond the bitmap (QEMU sizes it to
  // the memory table; one past it is a daemon bug or a stale table).
  uint64_t pages_marked() const { return marked_.load(std::memory_order_relaxed); }
  uint64_t beyond() const { return beyond_.load(std::memory_order_relaxed); }

 private:
  void SetBits(uint64_t first, uint64_t last);
  void Unmap();

  bool logging_ = false;
  uint8_t* bits_ = nullptr;  // the bitmap (past the mapping's page offset)
  uint64_t bytes_ = 0;       // its size
  void* map_ = nullptr;      // what to munmap
  size_t map_len_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> again_;  // page ranges for Flush()
  std::atomic<uint64_t> marked_{0}, beyond_{0};
};

}  // namespace vstellard
