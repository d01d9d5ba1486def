// One region of a guest's memory table, as the frontend described it
// (vhost-user SET_MEM_TABLE fills them; PVDMA maps from them), and the
// owned file descriptor it keeps.
#pragma once

#include <cstdint>

namespace vstellard {

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// A guest memory region as QEMU described it. Not mapped: PVDMA maps
// ranges of it on first use.
struct MemRegion {
  uint64_t gpa = 0;
  uint64_t size = 0;
  uint64_t qemu_va = 0;  // QEMU's address, what vring addresses refer to
  uint64_t offset = 0;   // of the region in fd
  Fd fd;
  // A doorbell memfd of the frontend (by its name): VSTELLAR_DB_MEMFD_NAME,
  // or that and "-<doorbell_id>". Every vStellar device of the guest has
  // one in the table; DoorbellRegion() says which one is this device's.
  bool doorbell = false;
  uint32_t doorbell_id = 0;
};

}  // namespace vstellard
