#include "vstellar/memory.h"

#include <atomic>
#include <cstring>

namespace vstellar {

TranslateResult HostMemory::translate(uint64_t iova, uint64_t len, bool, HostSpan* out,
                                      size_t max_out) {
  TranslateResult r;
  r.ok = true;
  if (len == 0 || max_out == 0) return r;
  if (block_ == 0) {
    out[0] = {reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(iova)), static_cast<size_t>(len)};
    r.count = 1;
    r.covered = len;
    return r;
  }
  uint64_t a = iova, left = len;
  while (left > 0 && r.count < max_out) {
    uint64_t in_block = block_ - (a % block_);
    uint64_t n = in_block < left ? in_block : left;
    out[r.count++] = {reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(a)), static_cast<size_t>(n)};
    a += n;
    left -= n;
    r.covered += n;
  }
  return r;
}

namespace {
template <typename F>
bool for_spans(MemoryTranslator& t, uint64_t iova, uint64_t len, bool wr, bool* fault, F&& f) {
  HostSpan spans[16];
  uint64_t done = 0;
  if (fault) *fault = false;
  while (done < len) {
    TranslateResult r = t.translate(iova + done, len - done, wr, spans, 16);
    if (!r.ok || r.covered == 0) {
      if (fault) *fault = r.fault;
      return false;
    }
    for (size_t i = 0; i < r.count; i++) {
      f(spans[i], done);
      done += spans[i].len;
    }
  }
  return true;
}
}  // namespace

// The last 8 bytes are stored last. Programs poll the end of a buffer a
// peer writes to learn that the rest has landed (NCCL's clear-to-send
// FIFO, UCX's and MPI's eager flags); memcpy gives no order among its
// stores, so without this a poller could see the flag before the data of
// the same packet. (Across packets nothing is promised: a sprayed WRITE's
// packets land in any order, and so IB promises nothing either.)
bool mem_write(MemoryTranslator& t, uint64_t iova, const void* src, uint64_t len, bool* fault) {
  auto* s = static_cast<const uint8_t*>(src);
  auto copy = [&](uint64_t from, uint64_t n) {
    return for_spans(t, iova + from, n, true, fault,
                     [&](HostSpan sp, uint64_t off) { std::memcpy(sp.ptr, s + from + off, sp.len); });
  };
  if (len <= 8) return copy(0, len);
  if (!copy(0, len - 8)) return false;
  std::atomic_thread_fence(std::memory_order_release);
  return copy(len - 8, 8);
}

bool mem_read(MemoryTranslator& t, uint64_t iova, void* dst, uint64_t len, bool* fault) {
  auto* d = static_cast<uint8_t*>(dst);
  return for_spans(t, iova, len, false, fault,
                   [&](HostSpan sp, uint64_t off) { std::memcpy(d + off, sp.ptr, sp.len); });
}

MemCheck mem_probe(MemoryTranslator& t, uint64_t iova, uint64_t len, bool for_write) {
  bool fault = false;
  if (for_spans(t, iova, len, for_write, &fault, [](HostSpan, uint64_t) {})) return MemCheck::kOk;
  return fault ? MemCheck::kFault : MemCheck::kError;
}

}  // namespace vstellar
