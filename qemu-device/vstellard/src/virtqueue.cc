// One split virtqueue, device side; see include/vstellard/virtqueue.h.
#include "vstellard/virtqueue.h"

#include <endian.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "vstellard/feature_bits.h"

namespace vstellard {

namespace {

// Split-ring layout (virtio 1.x): descriptor flags, avail flags, limits.
constexpr uint16_t kDescNext = 1, kDescWrite = 2, kDescIndirect = 4;
constexpr uint16_t kAvailNoInterrupt = 1;
constexpr uint32_t kMaxIndirect = 1024;
constexpr uint64_t kDescSize = 16;

#pragma pack(push, 1)
struct Desc {
  uint64_t addr;
  uint32_t len;
  uint16_t flags;
  uint16_t next;
};
#pragma pack(pop)
static_assert(sizeof(Desc) == kDescSize);

// Offsets into the available ring (flags, idx, ring[num], used_event) and
// the used ring (flags, idx, ring[num] of {id, len}, avail_event).
uint64_t AvailEntry(uint32_t i) { return 4 + 2ull * i; }
uint64_t UsedEntry(uint32_t i) { return 4 + 8ull * i; }

}  // namespace

void Virtqueue::Restart() {
  used_idx_ = 0;
  used_read_ = false;
  broken_ = false;
}

void Virtqueue::Reset() {
  Restart();
  last_avail_ = 0;
}

bool Virtqueue::Begin(const Vring& v, uint64_t acked_features) {
  if (!v.started || !v.addr_set || broken_) return false;
  num_ = v.num;
  if (!mem_->QemuVaToGpa(v.desc, kDescSize * v.num, &desc_) ||
      !mem_->QemuVaToGpa(v.avail, AvailEntry(v.num) + 2, &avail_) ||
      !mem_->QemuVaToGpa(v.used, UsedEntry(v.num) + 2, &used_))
    return false;
  if (!used_read_) {
    uint16_t u;
    if (!mem_->Read(used_ + 2, &u, 2)) return false;
    used_idx_ = le16toh(u);
    used_read_ = true;
  }
  features_ = acked_features;
  call_fd_ = v.call ? v.call.get() : -1;
  batch_used_ = used_idx_;
  return true;
}

Virtqueue::PopResult Virtqueue::Pop(Chain* c) {
  uint16_t avail_idx;
  if (!mem_->Read(avail_ + 2, &avail_idx, 2)) return PopResult::kBroken;
  avail_idx = le16toh(avail_idx);
  // The ring entries are read after the index that announced them.
  std::atomic_thread_fence(std::memory_order_acquire);
  const uint16_t pending = uint16_t(avail_idx - last_avail_);
  if (pending == 0) return PopResult::kEmpty;
  if (pending > num_) return PopResult::kBroken;  // the driver claims more than the ring holds
  uint16_t head;
  if (!mem_->Read(avail_ + AvailEntry(last_avail_ % num_), &head, 2)) return PopResult::kBroken;
  head = le16toh(head);
  last_avail_++;
  *c = Chain{};
  c->head = head;
  if (head >= num_) return PopResult::kBroken;

  uint64_t table = desc_;
  uint32_t size = num_, i = head, seen = 0;
  bool indirect = false;
  for (;;) {
    Desc d;
    if (!mem_->Read(table + kDescSize * i, &d, sizeof(d))) return PopResult::kBadChain;
    const uint16_t flags = le16toh(d.flags);
    const uint64_t addr = le64toh(d.addr);
    const uint32_t len = le32toh(d.len);
    if (++seen > size) return PopResult::kBadChain;  // a loop
    if (flags & kDescIndirect) {
      // One level only, a whole table of descriptors inside guest memory.
      if (indirect || (flags & kDescNext) || len == 0 || len % kDescSize || len / kDescSize > kMaxIndirect ||
          !mem_->Contains(addr, len))
        return PopResult::kBadChain;
      if (!(features_ & Bit(kFeatureIndirectDesc))) return PopResult::kBadChain;
      indirect = true;
      table = addr;
      size = uint32_t(len / kDescSize);
      i = 0;
      seen = 0;
      continue;
    }
    if (flags & kDescWrite) {
      c->writable.push_back({addr, len});
      c->writable_len += len;
    } else {
      if (!c->writable.empty()) return PopResult::kBadChain;  // readable after writable
      c->readable.push_back({addr, len});
      c->readable_len += len;
    }
    if (!(flags & kDescNext)) break;
    i = le16toh(d.next);
    if (i >= size) return PopResult::kBadChain;
  }
  return PopResult::kChain;
}

bool Virtqueue::ArmKick() {
  if (!(features_ & Bit(kFeatureEventIdx))) return false;
  const uint16_t ae = htole16(last_avail_);
  mem_->Write(used_ + UsedEntry(num_), &ae, 2);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return true;
}

void Virtqueue::Push(uint16_t head, uint32_t len) {
  const uint32_t elem[2] = {htole32(head), htole32(len)};
  mem_->Write(used_ + UsedEntry(used_idx_ % num_), elem, sizeof(elem));
  // The element is visible before the index that publishes it.
  std::atomic_thread_fence(std::memory_order_release);
  used_idx_++;
  const uint16_t idx = htole16(used_idx_);
  mem_->Write(used_ + 2, &idx, 2);
}

void Virtqueue::Notify() {
  // The used index store is ordered before reading the driver's wishes.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint16_t old_used = batch_used_, new_used = used_idx_;
  if (new_used == old_used) return;
  bool need = true;
  if (features_ & Bit(kFeatureEventIdx)) {
    uint16_t ev;
    if (mem_->Read(avail_ + AvailEntry(num_), &ev, 2)) {
      ev = le16toh(ev);
      // vring_need_event(): did used_idx step over used_event?
      need = uint16_t(new_used - ev - 1) < uint16_t(new_used - old_used);
    }
  } else {
    uint16_t flags;
    if (mem_->Read(avail_, &flags, 2)) need = !(le16toh(flags) & kAvailNoInterrupt);
  }
  if (need && call_fd_ >= 0) {
    uint64_t one = 1;
    (void)!write(call_fd_, &one, sizeof(one));
  }
}

bool Virtqueue::ReadAll(const Chain& c, uint8_t* dst) const {
  uint64_t off = 0;
  for (const Segment& s : c.readable) {
    if (!mem_->Read(s.gpa, dst + off, s.len)) return false;
    off += s.len;
  }
  return true;
}

uint32_t Virtqueue::WriteAll(const Chain& c, const void* data, uint32_t len, bool* ok) const {
  uint32_t written = 0;
  *ok = true;
  for (const Segment& s : c.writable) {
    if (written == len) break;
    const uint32_t n = std::min(s.len, len - written);
    if (!mem_->Write(s.gpa, static_cast<const uint8_t*>(data) + written, n)) {
      *ok = false;
      break;
    }
    written += n;
  }
  return written;
}

}  // namespace vstellard
