// A memfd "guest RAM" for tests of one part of vstellard alone: the test
// reads and writes it through its own mapping, the part under test through
// a Pvdma attached to Table().
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "vstellard/vhost_user.h"

namespace vstellard {

class GuestRam {
 public:
  static constexpr uint64_t kVaBase = 0x7f0000000000ull;  // "QEMU's" address of gpa 0

  explicit GuestRam(uint64_t size) : size_(size) {
    fd_ = memfd_create("guest-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd_ >= 0 && ftruncate(fd_, off_t(size)) == 0)
      mem_ = static_cast<uint8_t*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    if (mem_ == MAP_FAILED) mem_ = nullptr;
  }
  ~GuestRam() {
    if (mem_) munmap(mem_, size_);
    if (fd_ >= 0) close(fd_);
  }
  GuestRam(const GuestRam&) = delete;
  GuestRam& operator=(const GuestRam&) = delete;

  bool ok() const { return mem_ != nullptr; }
  uint8_t* at(uint64_t gpa) { return mem_ + gpa; }
  static uint64_t Va(uint64_t gpa) { return kVaBase + gpa; }

  // The memory table QEMU would send: one region, gpa 0 .. size.
  std::vector<MemRegion> Table() const {
    std::vector<MemRegion> t(1);
    t[0].gpa = 0;
    t[0].size = size_;
    t[0].qemu_va = kVaBase;
    t[0].fd = Fd(dup(fd_));
    return t;
  }

 private:
  uint64_t size_;
  int fd_ = -1;
  uint8_t* mem_ = nullptr;
};

}  // namespace vstellard
