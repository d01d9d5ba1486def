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
  t->log_ = pv.dirty_log();
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
  t->layout_ = std::move(l);
  return t;
}

vstellar::TranslateResult EmttTranslator::translate(uint64_t iova, uint64_t len, bool for_write,
                                                    vstellar::HostSpan* out, size_t max_out) {
  vstellar::TranslateResult r;
  if (iova < start_ || iova > end_ || len > end_ - iova) return r;  // ok = false
  r.ok = true;
  const uint64_t ps = uint64_t{1} << shift_;
  uint64_t a = iova, left = len;
  while (left) {
    const uint64_t idx = (a - base_) >> shift_, off = (a - base_) & (ps - 1);
    const uint64_t n = std::min(left, ps - off);
    if (!Emit(r, out, max_out, host_[idx] + off, n)) break;
    if (for_write) log_->MarkBefore(layout_.pages[idx] + off, n);
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
  t->log_ = pv.dirty_log();
  t->base_ = l.base();
  t->start_ = l.iova;
  t->end_ = l.iova + l.length;
  t->shift_ = l.page_shift;
  t->pages_ = std::move(l.pages);
  return t;
}

vstellar::TranslateResult AtcTranslator::translate(uint64_t iova, uint64_t len, bool for_write,
                                                   vstellar::HostSpan* out, size_t max_out) {
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
    if (for_write) log_->MarkBefore(gpa, n);
    a += n;
    left -= n;
  }
  r.ok = true;
  return r;
}

OdpTranslator::OdpTranslator(Pvdma& pv, uint64_t iova, uint64_t length)
    : pv_(pv), log_(pv.dirty_log()), start_(iova), end_(iova + length < iova ? UINT64_MAX : iova + length),
      length_(length),
      max_chunks_(MaxChunks(iova, length)) {}

uint64_t OdpTranslator::MaxChunks(uint64_t iova, uint64_t length) {
  const uint64_t span = kChunkPages * kPage;
  if (length == VSTELLAR_ODP_IMPLICIT_LENGTH || iova + length < iova) return kMaxImplicitChunks;
  return (iova + length - 1) / span - iova / span + 1;
}

uintptr_t OdpTranslator::Entry(uint64_t page) const {
  auto it = chunks_.find(page / kChunkPages);
  return it == chunks_.end() ? 0 : it->second->page[page % kChunkPages];
}

// Reports pages [iova's page, end) missing: asks the guest for them (up to
// 1 MiB), unless it was asked for the first of them within kAskAgainNs.
// False once that page has waited longer than the timeout: the access
// fails (Waiting::failed), until the page is mapped or one more timeout
// has passed.
bool OdpTranslator::Fault(uint64_t iova, uint64_t end, bool write) {
  const uint64_t page = iova / kPage;
  const uint64_t now = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::steady_clock::now().time_since_epoch())
                                    .count());
  auto it = waiting_.find(page);
  if (it != waiting_.end() && it->second.failed) {
    if (now - it->second.since_ns <= 2 * timeout_ns_) return false;
    waiting_.erase(it);  // a new wait
  } else if (it != waiting_.end() && now - it->second.since_ns > timeout_ns_) {
    it->second.failed = true;
    timeouts_++;
    return false;
  }
  // Faults nobody answered and nobody met again: forgotten in bulk rather
  // than kept forever.
  if (waiting_.size() > 8192) waiting_.clear();
  // At most 1 MiB per fault: the driver maps in steps, and each mapping
  // wakes the waiters, whose next look asks for the rest.
  const uint64_t last = page + std::clamp<uint64_t>((end - page * kPage + kPage - 1) / kPage, 1, 256);
  auto asked = [&](uint64_t p) {
    auto w = waiting_.find(p);
    return w != waiting_.end() && now - w->second.asked_ns < kAskAgainNs;
  };
  // Asked for already (one packet of a message asks for its page, the
  // next for the rest of the message): from the first page not asked.
  if (asked(page) && asked(last - 1)) return true;
  uint64_t first = page;
  while (first < last && asked(first)) first++;
  // Not marked asked when the event could not be queued: the next look
  // asks again.
  if (on_fault_ && !on_fault_(first * kPage, uint32_t(last - first), write)) return true;
  for (uint64_t p = first; p < last; p++) {
    auto [w, fresh] = waiting_.try_emplace(p, Waiting{now, now, false});
    if (!fresh) w->second.asked_ns = now;
  }
  return true;
}

vstellar::TranslateResult OdpTranslator::translate(uint64_t iova, uint64_t len, bool for_write,
                                                   vstellar::HostSpan* out, size_t max_out) {
  vstellar::TranslateResult r;
  if (iova < start_ || iova > end_ || len > end_ - iova) return r;  // ok = false
  uint64_t a = iova, left = len;
  while (left) {
    const uintptr_t e = Entry(a / kPage);
    if (!e || (for_write && !(e & 1))) {
      if (r.covered) break;  // what is there first; the caller asks again for the rest
      r.fault = Fault(a, iova + len, for_write);
      return r;
    }
    const uint64_t off = a % kPage, n = std::min(left, kPage - off);
    if (!Emit(r, out, max_out, reinterpret_cast<uint8_t*>(e & ~uintptr_t(1)) + off, n)) break;
    if (for_write && log_->active())
      log_->MarkBefore(chunks_.at(a / kPage / kChunkPages)->gpa[a / kPage % kChunkPages] + off, n);
    a += n;
    left -= n;
  }
  r.ok = true;
  return r;
}

uint16_t OdpTranslator::Map(uint64_t iova, const std::vector<uint64_t>& pages) {
  if (iova % kPage || pages.empty()) return VSTELLAR_STATUS_BAD_FIELD;
  // Inside the MR: from its first page to its last.
  const uint64_t first = start_ / kPage, last = (end_ - 1) / kPage;
  const uint64_t p0 = iova / kPage;
  if (p0 < first || p0 > last || pages.size() - 1 > last - p0) return VSTELLAR_STATUS_BAD_FIELD;
  // Resolve every page before changing anything.
  std::vector<uintptr_t> host(pages.size());
  for (size_t i = 0; i < pages.size(); i++) {
    const uint64_t gpa = pages[i] & ~uint64_t(VSTELLAR_ODP_PAGE_WRITABLE);
    if (gpa % kPage) return VSTELLAR_STATUS_BAD_FIELD;
    if (!pv_.Contains(gpa, kPage)) return VSTELLAR_STATUS_BAD_ADDRESS;
    uint64_t contig = 0;
    uint8_t* h = pv_.Map(gpa, &contig);
    if (!h) return VSTELLAR_STATUS_NO_RESOURCES;
    if (contig < kPage) return VSTELLAR_STATUS_BAD_ADDRESS;
    host[i] = reinterpret_cast<uintptr_t>(h) | ((pages[i] & VSTELLAR_ODP_PAGE_WRITABLE) ? 1 : 0);
  }
  uint64_t new_chunks = 0;
  for (uint64_t c = p0 / kChunkPages; c <= (p0 + pages.size() - 1) / kChunkPages; c++)
    if (!chunks_.count(c)) new_chunks++;
  if (chunks_.size() + new_chunks > max_chunks_) return VSTELLAR_STATUS_LIMIT;
  for (size_t i = 0; i < pages.size(); i++) {
    std::shared_ptr<const void> hold = pv_.Hold(pages[i] & ~uint64_t(kPage - 1));
    if (std::find(holds_.begin(), holds_.end(), hold) == holds_.end()) holds_.push_back(std::move(hold));
    const uint64_t p = p0 + i;
    std::unique_ptr<Chunk>& c = chunks_[p / kChunkPages];
    if (!c) c = std::make_unique<Chunk>();
    uintptr_t& slot = c->page[p % kChunkPages];
    if (!slot) {
      c->used++;
      mapped_++;
    }
    slot = host[i];
    c->gpa[p % kChunkPages] = pages[i] & ~uint64_t(kPage - 1);
    waiting_.erase(p);
  }
  return VSTELLAR_STATUS_OK;
}

void OdpTranslator::Unmap(uint64_t iova, uint64_t length) {
  if (length == 0) return;
  const uint64_t lo = std::max(iova, start_), hi = iova + length < iova ? end_ : std::min(iova + length, end_);
  if (lo >= hi) return;
  const uint64_t p_lo = lo / kPage, p_hi = (hi - 1) / kPage;  // pages [p_lo, p_hi]
  auto clear = [&](uint64_t ci, Chunk& c) {
    const uint64_t base = ci * kChunkPages;
    const uint64_t a = std::max(p_lo, base), b = std::min(p_hi, base + kChunkPages - 1);
    for (uint64_t p = a; p <= b; p++) {
      uintptr_t& slot = c.page[p - base];
      if (!slot) continue;
      slot = 0;
      c.used--;
      mapped_--;
    }
  };
  // A whole-address-space unmap walks the chunks there are, not the range.
  if (p_hi / kChunkPages - p_lo / kChunkPages >= chunks_.size()) {
    for (auto it = chunks_.begin(); it != chunks_.end();) {
      const uint64_t ci = it->first;
      if (ci >= p_lo / kChunkPages && ci <= p_hi / kChunkPages) clear(ci, *it->second);
      it = it->second->used ? std::next(it) : chunks_.erase(it);
    }
    return;
  }
  for (uint64_t ci = p_lo / kChunkPages; ci <= p_hi / kChunkPages; ci++) {
    auto it = chunks_.find(ci);
    if (it == chunks_.end()) continue;
    clear(ci, *it->second);
    if (!it->second->used) chunks_.erase(it);
  }
}

vstellar::TranslateResult RestoredTranslator::translate(uint64_t iova, uint64_t len, bool for_write,
                                                        vstellar::HostSpan* out, size_t max_out) {
  if (!real_ && !failed_) {
    uint16_t status = VSTELLAR_STATUS_OK;
    if (mode_ == TranslationMode::kEmtt || !atc_) real_ = EmttTranslator::Create(pv_, layout_, &status);
    else real_ = AtcTranslator::Create(pv_, *atc_, layout_, &status);
    failed_ = !real_;
  }
  if (!real_) return vstellar::TranslateResult{};
  return real_->translate(iova, len, for_write, out, max_out);
}

vstellar::TranslateResult GpaTranslator::translate(uint64_t iova, uint64_t len, bool for_write,
                                                   vstellar::HostSpan* out, size_t max_out) {
  vstellar::TranslateResult r;
  if (!pv_.Contains(iova, len)) return r;
  while (r.covered < len && r.count < max_out) {
    uint64_t contig = 0;
    uint8_t* p = pv_.Map(iova + r.covered, &contig);
    if (!p || contig == 0) return r;
    const uint64_t n = std::min(contig, len - r.covered);
    out[r.count++] = {p, size_t(n)};
    if (for_write) pv_.dirty_log()->MarkBefore(iova + r.covered, n);
    r.covered += n;
  }
  r.ok = true;
  return r;
}

}  // namespace vstellard
