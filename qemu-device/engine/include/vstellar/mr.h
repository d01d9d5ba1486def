// Memory region: [iova, iova+length) of its owner's address space, keys,
// access flags, and the translator that turns its addresses into host memory.
//
// Keys are index << 8 | key byte: the engine draws the index at random when
// it creates the MR and keeps it for the MR's life, so a key names its MR;
// the byte changes with each fast registration, so an old key stops
// matching. A fast-registration MR (Engine::alloc_mr) starts FREE, without
// a translation; a REG_MR work request makes it VALID, LOCAL_INV or a remote
// SEND_WITH_INV makes it INVALID and drops the translation. An MR from
// Engine::reg_mr is VALID for its whole life.
#pragma once
#include <cstdint>
#include <memory>

#include "vstellar/memory.h"
#include "vstellar/pd.h"

namespace vstellar {

enum class MrState : uint8_t { FREE, VALID, INVALID };

class Mr {
 public:
  Mr(Pd* pd, uint64_t iova, uint64_t length, uint32_t access, uint32_t key,
     std::shared_ptr<MemoryTranslator> mem)
      : pd_(pd), iova_(iova), length_(length), access_(access), key_(key), mem_(std::move(mem)),
        state_(MrState::VALID) {}
  // A fast-registration MR of at most max_pages pages, FREE.
  Mr(Pd* pd, uint32_t key, uint32_t max_pages)
      : pd_(pd), key_(key), state_(MrState::FREE), fast_reg_(true), max_pages_(max_pages) {}

  Pd* pd() const { return pd_; }
  uint64_t iova() const { return iova_; }
  uint64_t length() const { return length_; }
  uint32_t access() const { return access_; }
  uint32_t lkey() const { return key_; }
  uint32_t rkey() const { return key_; }
  MrState state() const { return state_; }
  bool fast_reg() const { return fast_reg_; }
  uint32_t max_pages() const { return max_pages_; }
  uint32_t bound_windows() const { return bound_windows_; }
  MemoryTranslator& mem() const { return *mem_; }

  // The region is VALID, [addr, addr+len) lies inside it (overflow-safe)
  // and it grants every bit of `need`.
  bool allows(uint64_t addr, uint64_t len, uint32_t need) const {
    if (state_ != MrState::VALID || !mem_) return false;
    if ((access_ & need) != need) return false;
    if (addr < iova_) return false;
    uint64_t off = addr - iova_;
    return off <= length_ && len <= length_ - off;
  }

 private:
  friend class EngineCore;
  Pd* pd_;
  uint64_t iova_ = 0;
  uint64_t length_ = 0;
  uint32_t access_ = 0;
  uint32_t key_;
  std::shared_ptr<MemoryTranslator> mem_;
  MrState state_;
  bool fast_reg_ = false;
  uint32_t max_pages_ = 0;
  uint32_t bound_windows_ = 0;  // windows bound to it; it cannot be deregistered or invalidated meanwhile
};

// Memory window (IB type 1, or type 2B): remote access to a part of an MR,
// granted by binding. Its rkey is index << 8 | key byte, like an MR's.
// Type 1 is VALID from allocation and rebinds freely (length 0 unbinds);
// type 2 starts FREE, a bind makes it VALID for the one QP it was bound
// through, and LOCAL_INV or SEND_WITH_INV makes it INVALID.
class Mw {
 public:
  Mw(Pd* pd, uint8_t type, uint32_t rkey)
      : pd_(pd), type_(type), rkey_(rkey), state_(type == 1 ? MrState::VALID : MrState::FREE) {}

  Pd* pd() const { return pd_; }
  uint8_t type() const { return type_; }
  uint32_t rkey() const { return rkey_; }
  MrState state() const { return state_; }
  Mr* mr() const { return mr_; }
  uint64_t addr() const { return addr_; }
  uint64_t length() const { return length_; }
  uint32_t access() const { return access_; }
  uint32_t qpn() const { return qpn_; }  // type 2: the QP it was bound through

 private:
  friend class EngineCore;
  Pd* pd_;
  uint8_t type_;
  uint32_t rkey_;
  MrState state_;
  Mr* mr_ = nullptr;  // bound to; nullptr when unbound
  uint64_t addr_ = 0;
  uint64_t length_ = 0;
  uint32_t access_ = 0;
  uint32_t qpn_ = 0;
};

}  // namespace vstellar
