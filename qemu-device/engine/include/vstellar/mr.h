// Memory region: [iova, iova+length) of its owner's address space, keys,
// access flags, and the translator that turns its addresses into host memory.
#pragma once
#include <cstdint>
#include <memory>

#include "vstellar/memory.h"
#include "vstellar/pd.h"

namespace vstellar {

class Mr {
 public:
  Mr(Pd* pd, uint64_t iova, uint64_t length, uint32_t access, uint32_t key,
     std::shared_ptr<MemoryTranslator> mem)
      : pd_(pd), iova_(iova), length_(length), access_(access), key_(key), mem_(std::move(mem)) {}

  Pd* pd() const { return pd_; }
  uint64_t iova() const { return iova_; }
  uint64_t length() const { return length_; }
  uint32_t access() const { return access_; }
  uint32_t lkey() const { return key_; }
  uint32_t rkey() const { return key_; }
  MemoryTranslator& mem() const { return *mem_; }

  // [addr, addr+len) lies inside the region (overflow-safe) and the region
  // grants every bit of `need`.
  bool allows(uint64_t addr, uint64_t len, uint32_t need) const {
    if ((access_ & need) != need) return false;
    if (addr < iova_) return false;
    uint64_t off = addr - iova_;
    return off <= length_ && len <= length_ - off;
  }

 private:
  Pd* pd_;
  uint64_t iova_;
  uint64_t length_;
  uint32_t access_;
  uint32_t key_;
  std::shared_ptr<MemoryTranslator> mem_;
};

}  // namespace vstellar
