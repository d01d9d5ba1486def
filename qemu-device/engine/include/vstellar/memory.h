// Memory access behind a memory region.
//
// An MR covers [iova, iova+length) in the address space of its owner (a guest
// process, or the harness). The engine never dereferences an iova itself: it
// asks the MR's MemoryTranslator for host byte spans. The harness uses
// HostMemory (iova == host virtual address). The virtio backend plugs in its
// own translator: eMTT (final guest-to-host translations held by the MR) or an
// ATC baseline (a bounded cache consulted on every access), on top of PVDMA's
// lazily pinned 2 MiB blocks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace vstellar {

struct HostSpan {
  uint8_t* ptr;
  size_t len;
};

// Result of one translate() call: `count` spans written to the output array,
// together covering the first `covered` bytes of the request. The caller asks
// again for the rest when the array was too small. ok == false means some byte
// of the range has no host backing (the engine turns that into a protection or
// access error; it never touches the memory). fault == true (with ok ==
// false) means the range is not backed *yet*: an on-demand translator has
// asked its owner for the pages, and the access is to be retried later (a
// responder answers RNR, a requester waits) instead of failing.
struct TranslateResult {
  size_t count = 0;
  uint64_t covered = 0;
  bool ok = false;
  bool fault = false;
};

class MemoryTranslator {
 public:
  virtual ~MemoryTranslator() = default;
  // Map [iova, iova+len) to host spans, in address order, at most max_out of
  // them. The engine calls this only with ranges already checked against the
  // MR's bounds and access flags. `for_write` tells a lazy pinner whether the
  // pages will be written (so it can fault them in writable).
  virtual TranslateResult translate(uint64_t iova, uint64_t len, bool for_write, HostSpan* out,
                                    size_t max_out) = 0;
  // Pages may be missing until their owner maps them (on-demand paging):
  // the engine checks a requester's whole buffer before it starts a work
  // request (mem_probe), so a message never stops half sent on a fault.
  virtual bool on_demand() const { return false; }
};

// Ordinary process memory: iova is the host virtual address. With block_size
// set, spans are split at block boundaries, which exercises the same code
// paths a page-granular guest translator does (tests use that).
class HostMemory final : public MemoryTranslator {
 public:
  explicit HostMemory(uint64_t block_size = 0) : block_(block_size) {}
  TranslateResult translate(uint64_t iova, uint64_t len, bool for_write, HostSpan* out,
                            size_t max_out) override;

 private:
  uint64_t block_;
};

// Copy helpers over a translator. Return false if translation failed;
// *fault (when given) then says whether it failed on pages not mapped yet.
bool mem_write(MemoryTranslator& t, uint64_t iova, const void* src, uint64_t len, bool* fault = nullptr);
bool mem_read(MemoryTranslator& t, uint64_t iova, void* dst, uint64_t len, bool* fault = nullptr);

// Whether every byte of [iova, iova+len) is backed now (for writing when
// for_write): kOk, kFault (pages not mapped yet; their owner was asked) or
// kError. Touches no memory.
enum class MemCheck { kOk, kFault, kError };
MemCheck mem_probe(MemoryTranslator& t, uint64_t iova, uint64_t len, bool for_write);

}  // namespace vstellar
