// Protection domain: MRs and QPs of one PD only work with each other.
#pragma once
#include <cstdint>

namespace vstellar {

class Pd {
 public:
  explicit Pd(uint32_t handle) : handle_(handle) {}
  uint32_t handle() const { return handle_; }
  uint32_t refs = 0;  // MRs and QPs using it; dealloc fails while non-zero

 private:
  uint32_t handle_;
};

}  // namespace vstellar
