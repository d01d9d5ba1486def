// eMTT and ATC translators; see include/vstellard/translate.h.
#include "vstellard/translate.h"

#include <algorithm>
#include <chrono>

#include <vstellar/virtio_vstellar.h>

namespace vstellard {

namespace {
constexpr uint64_t kFrame = 4096;

void Delay(uint64_t ns) {
  if (!ns) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  while (std::chrono::steady_clock::now() < until) {
  }
}

// Appends a span, merging it with the previous one when contiguous.
bool Emit(vstellar::TranslateResult& r, vstellar::HostSpan* out, size_t max_out, uint8_t* p, uint64_t n) {
  if (r.count && out[r.count - 1].ptr + out[r.count - 1].len == p) {
    out[r.count - 1].len += n;
  } else {
    if (r.count == max_out) return false;
    out[r.count++] = {p, size_t(n)};
  }
  r.covered += n;
  return true;
}
}  // namespace

size_t AtcKeyHash::operator()(const AtcKey& k) const {
  // Mixes all 192 bits (splitmix64 finaliser on a combination); equality
  // compares every field, so a hash collision costs a probe, never an alias.
  auto mix = [](uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  return size_t(mix(k.frame ^ mix(k.owner ^ mix(k.generation))));
}

Atc::Atc(size_t entries, uint64_t miss_ns) : slots_(entries ? entries : 1), miss_ns_(miss_ns) {
  index_.reserve(slots_.size() * 2);
}

uint8_t* Atc::Lookup(Pvdma& pv, uint64_t gpa) {
  stats_.lookups++;
  const uint64_t frame = gpa & ~(kFrame - 1);
  const AtcKey key{pv.id(), pv.generation(), frame >> 12};
  auto it = index_.find(key);
  if (it != index_.end()) {
    Slot& s = slots_[it->second];
    s.ref = true;
    stats_.hits++;
    return s.host + (gpa - frame);
  }
  // Slow path: the PVDMA lookup (maps and pins on first touch).
  stats_.misses++;
  Delay(miss_ns_);
  uint64_t contig;
  uint8_t* host = pv.Map(frame, &contig);
  if (!host || contig < kFrame) {
    stats_.slow_path_faults++;
    return nullptr;
  }
  // CLOCK: skip referenced slots (clearing their bit), take the first other.
  for (;;) {
    Slot& s = slots_[hand_];
    if (!s.used || !s.ref) break;
    s.ref = false;
    hand_ = (hand_ + 1) % slots_.size();
  }
  Slot& s = slots_[hand_];
  if (s.used) {
    index_.erase(s.key);
    stats_.evictions++;
  }
  s = Slot{key, host, true, true};
  index_[key] = uint32_t(hand_);
  hand_ = (hand_ + 1) % slots_.size();
  return host + (gpa - frame);
}

void Atc::Invalidate(uint64_t owner) {
  for (size_t i = 0; i < slots_.size(); i++) {
    Slot& s = slots_[i];
    if (s.used && s.key.owner == owner) {
      index_.erase(s.key);
      s = Slot{};
    }
  }
}

namespace {
// Geometry checks common to both translators.
bool CheckLayout(const Pvdma& pv, const MrLayout& l, uint16_t* status) {
  const uint64_t ps = uint64_t{1} << l.page_shift;
  for (uint64_t p : l.pages) {
    if (p & (ps - 1)) {
      *status = VSTELLAR_STATUS_BAD_FIELD;
      return false;
    }
    if (!pv.Contains(p, ps)) {
      *status = VSTELLAR_STATUS_BAD_ADDRESS;
      return false;
    }
  }
  return true;
}
}  // namespace

std::shared_ptr<EmttTranslator> EmttTranslator::Create(Pvdma& pv, MrLayout l, uint16_t* status) {
  if (!CheckLayout(pv, l, status)) return nullptr;
  auto t = std::make_shared<EmttTranslator>();
  t->base_ = l.base();
  t->start_ = l.iova;
  t->end_ = l.iova + l.length;
  t->shift_ = l.page_shift;
  t->owner_ = pv.id();
  t->host_.reserve(l.pages.size());
  const uint64_t ps = uint64_t{1} << l.page_shift;
  for (uint64_t p : l.pages) {
    uint64_t contig;
    uint8_t* h = pv.Map(p, &contig);
    if (!h) {
      *status = VSTELLAR_STATUS_NO_RESOURCES;
      return nullptr;
    }
    if (contig < ps) {  // a page across two blocks of different regions
      *status = VSTELLAR_STATUS_BAD_ADDRESS;
      return nullptr;
    }
    t->host_.push_back(h);
    // One hold per region the MR touches (a table has a handful).
    std::shared_ptr<const void> hold = pv.Hold(p);
    if (std::find(t->holds_.begin(), t->holds_.end(), hold) == t->holds_.end())
      t->holds_.push_back(std::move(hold));
  }
  return t;
}

vstellar::TranslateResult EmttTranslator::translate(uint64_t iova, uint64_t len, bool, vstellar::HostSpan* out,
                                                    size_t max_out) {
  vstellar::TranslateResult r;
  if (iova < start_ || iova > end_ || len > end_ - iova) return r;  // ok = false
  r.ok = true;
  const uint64_t ps = uint64_t{1} << shift_;
  uint64_t a = iova, left = len;
  while (left) {
    const uint64_t idx = (a - base_) >> shift_, off = (a - base_) & (ps - 1);
    const uint64_t n = std::min(left, ps - off);
    if (!Emit(r, out, max_out, host_[idx] + off, n)) break;
    a += n;
    left -= n;
  }
  return r;
}

std::shared_ptr<AtcTranslator> AtcTranslator::Create(Pvdma& pv, Atc& atc, MrLayout l, uint16_t* status) {
  if (!CheckLayout(pv, l, status)) return nullptr;
  auto t = std::make_shared<AtcTranslator>();
  t->pv_ = &pv;
  t->atc_ = &atc;
  t->base_ = l.base();
  t->start_ = l.iova;
  t->end_ = l.iova + l.length;
  t->shift_ = l.page_shift;
  t->pages_ = std::move(l.pages);
  return t;
}

vstellar::TranslateResult AtcTranslator::translate(uint64_t iova, uint64_t len, bool, vstellar::HostSpan* out,
                                                   size_t max_out) {
  vstellar::TranslateResult r;
  if (iova < start_ || iova > end_ || len > end_ - iova) return r;
  const uint64_t ps = uint64_t{1} << shift_;
  uint64_t a = iova, left = len;
  while (left) {
    const uint64_t idx = (a - base_) >> shift_, off = (a - base_) & (ps - 1);
    const uint64_t gpa = pages_[idx] + off;
    const uint64_t n = std::min(left, kFrame - (gpa & (kFrame - 1)));
    uint8_t* h = atc_->Lookup(*pv_, gpa);
    if (!h) {
      r.ok = false;
      return r;
    }
    if (!Emit(r, out, max_out, h, n)) break;
    a += n;
    left -= n;
  }
  r.ok = true;
  return r;
}

vstellar::TranslateResult GpaTranslator::translate(uint64_t iova, uint64_t len, bool, vstellar::HostSpan* out,
                                                   size_t max_out) {
  vstellar::TranslateResult r;
  if (!pv_.Contains(iova, len)) return r;
  while (r.covered < len && r.count < max_out) {
    uint64_t contig = 0;
    uint8_t* p = pv_.Map(iova + r.covered, &contig);
    if (!p || contig == 0) return r;
    const uint64_t n = std::min(contig, len - r.covered);
    out[r.count++] = {p, size_t(n)};
    r.covered += n;
  }
  r.ok = true;
  return r;
}

}  // namespace vstellard
