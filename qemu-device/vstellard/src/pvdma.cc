// PVDMA: see include/vstellard/pvdma.h.
#include "vstellard/pvdma.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

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

// Dropping the table releases every region nobody else holds.
Pvdma::~Pvdma() = default;

Pvdma::Region::~Region() {
  for (auto& [p, n] : maps) munmap(p, n);
  if (counters) {
    counters->blocks -= blocks_mapped;
    counters->bytes -= bytes_mapped;
    counters->released++;
  }
}

namespace {
// Makes the file of fd unable to shrink, if it is not already: true if it
// is sealed against shrinking when this returns. Files that cannot carry
// seals (not a memfd, or a memfd made without MFD_ALLOW_SEALING, which
// has F_SEAL_SEAL from birth) stay as they are.
bool SealAgainstShrink(int fd) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) return false;  // EINVAL: this file type has no seals
  if (seals & F_SEAL_SHRINK) return true;
  if (seals & F_SEAL_SEAL) return false;
  return fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0;
}

// Whether the file of fd holds [offset, offset + size).
bool Covers(int fd, uint64_t offset, uint64_t size, std::string* why) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    if (why) *why = std::string("fstat: ") + std::strerror(errno);
    return false;
  }
  const uint64_t file = st.st_size > 0 ? uint64_t(st.st_size) : 0;
  if (offset > file || size > file - offset) {
    if (why)
      *why = "file of " + std::to_string(file) + " bytes does not hold [" + std::to_string(offset) + ", +" +
             std::to_string(size) + ")";
    return false;
  }
  return true;
}
}  // namespace

uint64_t Pvdma::RegionFootprint(uint64_t gpa, uint64_t size) {
  const uint64_t blocks = size ? ((gpa + size - 1) >> kBlockShift) - (gpa >> kBlockShift) + 1 : 0;
  return sizeof(Region) + blocks * sizeof(uint8_t*);
}

bool Pvdma::FileCovers(const Region& r) const { return r.sealed || Covers(r.fd.get(), r.offset, r.size, nullptr); }

bool Pvdma::Attach(const std::vector<MemRegion>& table, std::string* err) {
  const uint64_t t0 = NowNs();
  std::vector<std::shared_ptr<Region>> next;
  uint64_t total = 0, unsealed = 0;
  for (const MemRegion& m : table) {
    struct stat st;
    if (fstat(m.fd.get(), &st) != 0) {
      *err = std::string("pvdma: fstat: ") + std::strerror(errno);
      return false;
    }
    // Same file, offset and ranges as a region we already have: keep it.
    auto same = std::find_if(regions_.begin(), regions_.end(), [&](const std::shared_ptr<Region>& o) {
      return o->gpa == m.gpa && o->size == m.size && o->qemu_va == m.qemu_va && o->offset == m.offset &&
             o->dev == st.st_dev && o->ino == st.st_ino;
    });
    if (same != regions_.end()) {
      if (!(*same)->sealed) unsealed++;
      next.push_back(*same);
      total += m.size;
      continue;
    }
    int fd = dup(m.fd.get());
    if (fd < 0) {
      *err = std::string("pvdma: dup: ") + std::strerror(errno);
      return false;
    }
    auto r = std::make_shared<Region>();
    r->fd = Fd(fd);
    // Seal first, then check the size: a shrink between the two cannot
    // slip through.
    r->sealed = SealAgainstShrink(fd);
    std::string why;
    if (!Covers(fd, m.offset, m.size, &why)) {
      *err = "pvdma: region at gpa " + std::to_string(m.gpa) + " refused: " + why;
      return false;
    }
    if (!r->sealed && require_sealed_) {
      *err = "pvdma: region at gpa " + std::to_string(m.gpa) +
             " refused: its file cannot be sealed against shrinking (use memory-backend-memfd with seal=on, "
             "QEMU's default, or run vstellard with --allow-unsealed-memory)";
      return false;
    }
    if (!r->sealed) unsealed++;
    r->gpa = m.gpa;
    r->size = m.size;
    r->qemu_va = m.qemu_va;
    r->offset = m.offset;
    r->dev = st.st_dev;
    r->ino = st.st_ino;
    r->doorbell = m.doorbell;
    r->counters = pins_;
    r->first_block = m.gpa >> kBlockShift;
    const uint64_t last_block = (m.gpa + m.size - 1) >> kBlockShift;
    // The table grows with the size the frontend declared: charged first,
    // and an allocation that fails refuses this table, not the daemon.
    const uint64_t footprint = RegionFootprint(m.gpa, m.size);
    if (device_budget_ && daemon_budget_) {
      r->device_budget = device_budget_;
      r->daemon_budget = daemon_budget_;
      if (!r->charge.Take(*r->device_budget, *r->daemon_budget, footprint)) {
        *err = "pvdma: region at gpa " + std::to_string(m.gpa) + " refused: its block table (" +
               std::to_string(footprint) + " bytes) is over the device's or the daemon's memory limit";
        return false;
      }
    }
    try {
      r->blocks.assign(last_block - r->first_block + 1, nullptr);
    } catch (const std::bad_alloc&) {
      *err = "pvdma: region at gpa " + std::to_string(m.gpa) + " refused: no memory for its block table (" +
             std::to_string(footprint) + " bytes)";
      return false;
    }
    next.push_back(std::move(r));
    total += m.size;
  }
  // A region of the old table that is not in the new one goes now (unless
  // an MR holds it); host pointers into it that caches kept are stale.
  for (auto& r : regions_)
    if (std::find(next.begin(), next.end(), r) == next.end()) {
      generation_++;
      break;
    }
  regions_ = std::move(next);
  last_ = nullptr;
  regions_n_ = regions_.size();
  guest_bytes_ = total;
  unsealed_ = unsealed;
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

std::shared_ptr<const void> Pvdma::Hold(uint64_t gpa) const {
  for (const auto& r : regions_)
    if (gpa - r->gpa < r->size) return r;
  return nullptr;
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
      r.blocks_mapped++;
      pins_->blocks++;
    }
  }
  r.bytes_mapped += r.size;
  pins_->bytes += r.size;
  return true;
}

uint8_t* Pvdma::MapBlock(Region& r, uint64_t bi) {
  const uint64_t bstart = std::max(r.gpa, (r.first_block + bi) << kBlockShift);
  const uint64_t bend = std::min(r.gpa + r.size, (r.first_block + bi + 1) << kBlockShift);
  const size_t len = size_t(bend - bstart);
  // A file that can shrink is checked before each block is mapped: mapping
  // past its end would fault (SIGBUS) on the first access.
  if (!FileCovers(r)) {
    map_errors_++;
    return nullptr;
  }
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd.get(),
                 off_t(r.offset + (bstart - r.gpa)));
  if (p == MAP_FAILED) {
    map_errors_++;
    return nullptr;
  }
  if (mlock(p, len) != 0) lock_errors_++;
  r.maps.emplace_back(p, len);
  r.blocks[bi] = static_cast<uint8_t*>(p);
  r.blocks_mapped++;
  r.bytes_mapped += len;
  pins_->blocks++;
  pins_->bytes += len;
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
    log_->Mark(gpa, n);
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
  s.blocks_pinned = pins_->blocks.load();
  s.bytes_pinned = pins_->bytes.load();
  s.regions_released = pins_->released.load();
  s.unsealed_regions = unsealed_.load();
  s.misses = misses_.load();
  s.hits = hits_.load();
  s.faults = faults_.load();
  s.map_errors = map_errors_.load();
  s.lock_errors = lock_errors_.load();
  s.attach_ns = attach_ns_.load();
  return s;
}

}  // namespace vstellard
