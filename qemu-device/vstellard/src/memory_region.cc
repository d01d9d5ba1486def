// See include/vstellard/memory_region.h.
#include "vstellard/memory_region.h"

#include <unistd.h>

namespace vstellard {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace vstellard
