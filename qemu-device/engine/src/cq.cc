#include "vstellar/cq.h"

namespace vstellar {

bool Cq::push(const Wc& wc) {
  if (tail_ - head_ >= ring_.size()) {
    overflow_ = true;
    return false;
  }
  ring_[tail_++ % ring_.size()] = wc;
  return true;
}

int Cq::poll(Wc* out, int n) {
  int k = 0;
  while (k < n && head_ < tail_) out[k++] = ring_[head_++ % ring_.size()];
  return k;
}

}  // namespace vstellar
