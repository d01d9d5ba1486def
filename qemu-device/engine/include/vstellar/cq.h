// Completion queue: a bounded ring of work completions.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "vstellar/types.h"

namespace vstellar {

class Cq {
 public:
  Cq(uint32_t cqn, uint32_t capacity) : cqn_(cqn), ring_(capacity) {}
  uint32_t cqn() const { return cqn_; }
  uint32_t capacity() const { return uint32_t(ring_.size()); }
  uint32_t count() const { return uint32_t(tail_ - head_); }
  bool overflowed() const { return overflow_; }

  // Returns false (and latches the overflow error) when full, like a CQ
  // overrun on hardware: the completion is lost and the CQ is in error.
  bool push(const Wc& wc);
  int poll(Wc* out, int n);

  // Called after completions were added (the virtio backend raises an
  // interrupt from here; the harness leaves it empty).
  std::function<void(Cq&)> on_completion;
  uint32_t refs = 0;  // QPs using it

 private:
  friend class EngineCore;  // save and restore (save_restore.cc)
  uint32_t cqn_;
  std::vector<Wc> ring_;
  uint64_t head_ = 0, tail_ = 0;
  bool overflow_ = false;
};

}  // namespace vstellar
