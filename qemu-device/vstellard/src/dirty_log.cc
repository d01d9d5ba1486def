// Dirty logging for live migration; see include/vstellard/dirty_log.h.
#include "vstellard/dirty_log.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace vstellard {

DirtyLog::~DirtyLog() { Unmap(); }

void DirtyLog::Unmap() {
  if (map_) munmap(map_, map_len_);
  map_ = nullptr;
  map_len_ = 0;
  bits_ = nullptr;
  bytes_ = 0;
}

bool DirtyLog::Map(Fd fd, uint64_t size, uint64_t offset, std::string* err) {
  // A log for 2^52 bytes of guest memory is 128 GiB of bits: far beyond
  // any memory table this daemon accepts (--guest-memory-limit).
  constexpr uint64_t kMaxBytes = uint64_t{1} << 32;
  if (!fd) {
    *err = "SET_LOG_BASE without a file descriptor";
    return false;
  }
  if (size == 0 || size > kMaxBytes || offset > kMaxBytes) {
    *err = "SET_LOG_BASE: log of " + std::to_string(size) + " bytes at offset " + std::to_string(offset) +
           " (at most 4 GiB)";
    return false;
  }
  // mmap wants a page-aligned offset; map from the page below it.
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  const uint64_t lead = offset % page;
  const size_t len = size_t(size + lead);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), off_t(offset - lead));
  if (p == MAP_FAILED) {
    *err = std::string("SET_LOG_BASE: mmap of the log failed: ") + strerror(errno);
    return false;
  }
  Flush();  // into the old bitmap: QEMU syncs it before it lets go
  Unmap();
  map_ = p;
  map_len_ = len;
  bits_ = static_cast<uint8_t*>(p) + lead;
  bytes_ = size;
  return true;  // the fd closes here; the mapping stays
}

void DirtyLog::SetBits(uint64_t first, uint64_t last) {
  for (uint64_t pg = first; pg <= last; pg++) {
    if (pg / 8 >= bytes_) {
      beyond_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    // QEMU takes the bits with an atomic exchange while we set them.
    __atomic_fetch_or(&bits_[pg / 8], uint8_t(1u << (pg % 8)), __ATOMIC_RELAXED);
  }
  marked_.fetch_add(last - first + 1, std::memory_order_relaxed);
}

void DirtyLog::Flush() {
  if (active())
    for (auto [first, last] : again_) SetBits(first, last);
  again_.clear();
}

}  // namespace vstellard
