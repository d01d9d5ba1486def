// Host memory charged to the guests that asked for it.
//
// Guest RAM is the guest's own; what a guest makes vstellard allocate on
// top of it (the engine's rings and windows for its QPs, CQs and SRQs, the
// page lists and final translations of its MRs) is charged when the object
// is created and given back when it is destroyed, against two limits: one
// per device (--device-memory-limit) and one for the daemon
// (--memory-limit). A request over either fails with NO_RESOURCES and
// allocates nothing, so no guest can grow the daemon without bound or take
// memory another guest needs.
#pragma once

#include <atomic>
#include <cstdint>

namespace vstellard {

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit = 0) : limit_(limit) {}
  void set_limit(uint64_t limit) { limit_ = limit; }  // before anyone charges
  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

  // Thread-safe: the daemon's budget is charged by every worker thread
  // (vstellard --threads).
  bool TryCharge(uint64_t n) {
    uint64_t u = used_.load(std::memory_order_relaxed);
    do {
      if (n > limit_ - u || u > limit_) {
        refused_.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
    } while (!used_.compare_exchange_weak(u, u + n, std::memory_order_relaxed));
    uint64_t p = peak_.load(std::memory_order_relaxed);
    while (u + n > p && !peak_.compare_exchange_weak(p, u + n, std::memory_order_relaxed)) {
    }
    return true;
  }
  void Refund(uint64_t n) {
    uint64_t u = used_.load(std::memory_order_relaxed);
    while (!used_.compare_exchange_weak(u, n <= u ? u - n : 0, std::memory_order_relaxed)) {
    }
  }

 private:
  uint64_t limit_;
  std::atomic<uint64_t> used_{0}, peak_{0}, refused_{0};
};

// One object's charge, held by the object (QpObj, CqObj, ...): moved with
// it, given back once when it is destroyed, whichever path destroys it.
class MemoryCharge {
 public:
  MemoryCharge() = default;
  MemoryCharge(const MemoryCharge&) = delete;
  MemoryCharge& operator=(const MemoryCharge&) = delete;
  MemoryCharge(MemoryCharge&& o) noexcept : device_(o.device_), daemon_(o.daemon_), bytes_(o.bytes_) {
    o.bytes_ = 0;
  }
  MemoryCharge& operator=(MemoryCharge&& o) noexcept {
    if (this != &o) {
      Release();
      device_ = o.device_;
      daemon_ = o.daemon_;
      bytes_ = o.bytes_;
      o.bytes_ = 0;
    }
    return *this;
  }
  ~MemoryCharge() { Release(); }

  // Charges `bytes` to both budgets, or to neither (false).
  bool Take(MemoryBudget& device, MemoryBudget& daemon, uint64_t bytes) {
    Release();
    if (!device.TryCharge(bytes)) return false;
    if (!daemon.TryCharge(bytes)) {
      device.Refund(bytes);
      return false;
    }
    device_ = &device;
    daemon_ = &daemon;
    bytes_ = bytes;
    return true;
  }
  // Makes the charge `bytes` (an object that grows or shrinks): only the
  // difference is charged or given back. Growing may fail (false, the
  // charge unchanged); shrinking never does.
  bool Resize(MemoryBudget& device, MemoryBudget& daemon, uint64_t bytes) {
    if (!bytes_) return Take(device, daemon, bytes);
    if (bytes <= bytes_) {
      device_->Refund(bytes_ - bytes);
      daemon_->Refund(bytes_ - bytes);
      bytes_ = bytes;
      return true;
    }
    const uint64_t more = bytes - bytes_;
    if (!device_->TryCharge(more)) return false;
    if (!daemon_->TryCharge(more)) {
      device_->Refund(more);
      return false;
    }
    bytes_ = bytes;
    return true;
  }
  uint64_t bytes() const { return bytes_; }

 private:
  void Release() {
    if (!bytes_) return;
    device_->Refund(bytes_);
    daemon_->Refund(bytes_);
    bytes_ = 0;
  }
  MemoryBudget* device_ = nullptr;
  MemoryBudget* daemon_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace vstellard
