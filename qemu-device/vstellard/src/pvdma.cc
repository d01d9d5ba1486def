// PVDMA: see include/vstellard/pvdma.h.
#include "vstellard/pvdma.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace vstellard {

namespace {
std::atomic<uint64_t> next_id{1};
uint64_t NowNs() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}
}  // namespace

Pvdma::Pvdma(PinMode mode) : mode_(mode), id_(next_id++) {}

Pvdma::~Pvdma() {
  for (auto& r : regions_) Release(*r);
  for (auto& r : retired_) Release(*r);
}

void Pvdma::Release(Region& r) {
  for (auto& [p, n] : r.maps) munmap(p, n);
  r.maps.clear();
  std::fill(r.blocks.begin(), r.blocks.end(), nullptr);
}

bool Pvdma::Attach(const std::vector<MemRegion>& table, std::string* err) {
  const uint64_t t0 = NowNs();
  std::vector<std::unique_ptr<Region>> next;
  uint64_t total = 0;
  for (const MemRegion& m : table) {
    struct stat st;
    if (fstat(m.fd.get(), &st) != 0) {
      *err = std::string("pvdma: fstat: ") + std::strerror(errno);
      return false;
    }
    // Same file, offset and ranges as a region we already have: keep it.
    auto same = std::find_if(regions_.begin(), regions_.end(), [&](const std::unique_ptr<Region>& o) {
      return o && o->gpa == m.gpa && o->size == m.size && o->qemu_va == m.qemu_va && o->offset == m.offset &&
             o->dev == st.st_dev && o->ino == st.st_ino;
    });
    if (same != regions_.end()) {
      next.push_back(std::move(*same));
      total += m.size;
      continue;
    }
    int fd = dup(m.fd.get());
    if (fd < 0) {
      *err = std::string("pvdma: dup: ") + std::strerror(errno);
      return false;
    }
    auto r = std::make_unique<Region>();
    r->gpa = m.gpa;
    r->size = m.size;
    r->qemu_va = m.qemu_va;
    r->offset = m.offset;
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    r->doorbell = m.doorbell;
    r->fd = Fd(fd);
    r->first_block = m.gpa >> kBlockShift;
    const uint64_t last_block = (m.gpa + m.size - 1) >> kBlockShift;
    r->blocks.assign(last_block - r->first_block + 1, nullptr);
    next.push_back(std::move(r));
    total += m.size;
  }
  // Whatever was not carried over is retired (kept mapped, never used).
  for (auto& r : regions_)
    if (r) retired_.push_back(std::move(r));
  regions_ = std::move(next);
  last_ = nullptr;
  regions_n_ = regions_.size();
  guest_bytes_ = total;
  if (mode_ == PinMode::kEager) {
    for (auto& r : regions_)
      if (!MapAll(*r, err)) {
        attach_ns_ = NowNs() - t0;
        return false;
      }
  }
  attach_ns_ = NowNs() - t0;
  return true;
}

bool Pvdma::MapAll(Region& r, std::string* err) {
  if (!r.maps.empty() && std::all_of(r.blocks.begin(), r.blocks.end(), [](uint8_t* p) { return p; }))
    return true;
  void* p = mmap(nullptr, r.size, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd.get(), off_t(r.offset));
  if (p == MAP_FAILED) {
    map_errors_++;
    *err = std::string("pvdma: mmap of ") + std::to_string(r.size) + " bytes: " + std::strerror(errno);
    return false;
  }
  if (mlock(p, r.size) != 0) lock_errors_++;
  r.maps.emplace_back(p, r.size);
  auto* base = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < r.blocks.size(); i++) {
    const uint64_t bstart = std::max(r.gpa, (r.first_block + i) << kBlockShift);
    if (!r.blocks[i]) {
      r.blocks[i] = base + (bstart - r.gpa);
      blocks_++;
    }
  }
  bytes_ += r.size;
  return true;
}

uint8_t* Pvdma::MapBlock(Region& r, uint64_t bi) {
  const uint64_t bstart = std::max(r.gpa, (r.first_block + bi) << kBlockShift);
  const uint64_t bend = std::min(r.gpa + r.size, (r.first_block + bi + 1) << kBlockShift);
  const size_t len = size_t(bend - bstart);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd.get(),
                 off_t(r.offset + (bstart - r.gpa)));
  if (p == MAP_FAILED) {
    map_errors_++;
    return nullptr;
  }
  if (mlock(p, len) != 0) lock_errors_++;
  r.maps.emplace_back(p, len);
  r.blocks[bi] = static_cast<uint8_t*>(p);
  blocks_++;
  bytes_ += len;
  return r.blocks[bi];
}

Pvdma::Region* Pvdma::Find(uint64_t gpa) {
  if (last_ && gpa - last_->gpa < last_->size) return last_;
  for (auto& r : regions_)
    if (gpa - r->gpa < r->size) return last_ = r.get();
  return nullptr;
}

const Pvdma::Region* Pvdma::Find(uint64_t gpa) const {
  for (auto& r : regions_)
    if (gpa - r->gpa < r->size) return r.get();
  return nullptr;
}

uint8_t* Pvdma::Map(uint64_t gpa, uint64_t* contig) {
  Region* r = Find(gpa);
  if (!r) {
    faults_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  const uint64_t bi = (gpa >> kBlockShift) - r->first_block;
  uint8_t* base = r->blocks[bi];
  if (base) {
    hits_.fetch_add(1, std::memory_order_relaxed);
  } else {
    misses_.fetch_add(1, std::memory_order_relaxed);
    base = MapBlock(*r, bi);
    if (!base) return nullptr;
  }
  const uint64_t bstart = std::max(r->gpa, gpa & ~(kBlockSize - 1));
  const uint64_t bend = std::min(r->gpa + r->size, (gpa | (kBlockSize - 1)) + 1);
  *contig = bend - gpa;
  return base + (gpa - bstart);
}

bool Pvdma::Contains(uint64_t gpa, uint64_t len, bool ram_only) const {
  const Region* r = Find(gpa);
  if (!r || (ram_only && r->doorbell)) return false;
  const uint64_t off = gpa - r->gpa;
  return len <= r->size - off;
}

bool Pvdma::IsDoorbell(uint64_t gpa) const {
  const Region* r = Find(gpa);
  return r && r->doorbell;
}

bool Pvdma::Read(uint64_t gpa, void* dst, uint64_t len) {
  auto* d = static_cast<uint8_t*>(dst);
  while (len) {
    uint64_t c;
    uint8_t* p = Map(gpa, &c);
    if (!p) return false;
    const uint64_t n = std::min(c, len);
    std::memcpy(d, p, n);
    d += n;
    gpa += n;
    len -= n;
  }
  return true;
}

bool Pvdma::Write(uint64_t gpa, const void* src, uint64_t len) {
  auto* s = static_cast<const uint8_t*>(src);
  while (len) {
    uint64_t c;
    uint8_t* p = Map(gpa, &c);
    if (!p) return false;
    const uint64_t n = std::min(c, len);
    std::memcpy(p, s, n);
    s += n;
    gpa += n;
    len -= n;
  }
  return true;
}

bool Pvdma::QemuVaToGpa(uint64_t va, uint64_t len, uint64_t* gpa) const {
  for (auto& r : regions_) {
    if (va - r->qemu_va < r->size && len <= r->size - (va - r->qemu_va)) {
      *gpa = r->gpa + (va - r->qemu_va);
      return true;
    }
  }
  return false;
}

PvdmaStats Pvdma::stats() const {
  PvdmaStats s;
  s.regions = regions_n_.load();
  s.guest_bytes = guest_bytes_.load();
  s.blocks_pinned = blocks_.load();
  s.bytes_pinned = bytes_.load();
  s.misses = misses_.load();
  s.hits = hits_.load();
  s.faults = faults_.load();
  s.map_errors = map_errors_.load();
  s.lock_errors = lock_errors_.load();
  s.attach_ns = attach_ns_.load();
  return s;
}

}  // namespace vstellard
