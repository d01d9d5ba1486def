// Little-endian fixed-width fields in and out of a byte vector: the format
// of a migrating device's state (the engine's objects, save_restore.cc;
// vstellard's tables, device_migration.cc). Written by hand
// because the format must stay the same across builds and versions and
// every field read must be checked: the bytes come from another host
// through QEMU's migration stream, and a reader that trusts a count or a
// length could be made to allocate without bound or read past the end.
// Every Get returns false once anything failed (short input, a count over
// its bound) and keeps returning false, so a parser checks once at the end
// of each record.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace vstellar {

class StateWriter {
 public:
  void U8(uint8_t v) { out_.push_back(v); }
  void U16(uint16_t v) { Le(v, 2); }
  void U32(uint32_t v) { Le(v, 4); }
  void U64(uint64_t v) { Le(v, 8); }
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  // A length-prefixed vector of u64 (page lists, wr_ids).
  void U64s(const std::vector<uint64_t>& v) {
    U32(uint32_t(v.size()));
    for (uint64_t x : v) U64(x);
  }
  void Blob(const std::vector<uint8_t>& v) {
    U64(v.size());
    Bytes(v.data(), v.size());
  }
  void Str(const std::string& s) {
    U32(uint32_t(s.size()));
    Bytes(s.data(), s.size());
  }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  void Le(uint64_t v, int n) {
    for (int i = 0; i < n; i++) out_.push_back(uint8_t(v >> (8 * i)));
  }
  std::vector<uint8_t> out_;
};

class StateReader {
 public:
  StateReader(const uint8_t* p, size_t n) : start_(p), p_(p), end_(p + n) {}
  // Bytes read so far (where a parse failed, for its error message).
  size_t offset() const { return size_t(p_ - start_); }
  bool ok() const { return ok_; }
  bool done() const { return ok_ && p_ == end_; }
  size_t left() const { return size_t(end_ - p_); }
  bool U8(uint8_t* v) { return Le(v, 1); }
  bool U16(uint16_t* v) { return Le(v, 2); }
  bool U32(uint32_t* v) { return Le(v, 4); }
  bool U64(uint64_t* v) { return Le(v, 8); }
  bool Bool(bool* v) {
    uint8_t b = 0;
    if (!U8(&b) || b > 1) return Fail();
    *v = b;
    return true;
  }
  bool Bytes(void* dst, size_t n) {
    if (!ok_ || left() < n) return Fail();
    if (n) std::memcpy(dst, p_, n);  // (dst may be null then: an empty vector's data())
    p_ += n;
    return true;
  }
  // A count, refused over `max`.
  bool Count(uint32_t* n, uint32_t max) { return U32(n) && (*n <= max || Fail()); }
  bool U64s(std::vector<uint64_t>* v, uint32_t max) {
    uint32_t n = 0;
    // Each element takes 8 bytes: a count beyond what is left is a lie.
    if (!Count(&n, max) || uint64_t(n) * 8 > left()) return Fail();
    v->resize(n);
    for (auto& x : *v) U64(&x);
    return ok_;
  }
  // A length-prefixed byte range, returned in place (no copy).
  bool Blob(const uint8_t** p, size_t* n) {
    uint64_t len = 0;
    if (!U64(&len) || len > left()) return Fail();
    *p = p_;
    *n = size_t(len);
    p_ += len;
    return true;
  }
  bool Str(std::string* s, uint32_t max) {
    uint32_t n = 0;
    if (!Count(&n, max) || n > left()) return Fail();
    s->assign(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return true;
  }
  bool Fail() {
    ok_ = false;
    return false;
  }

 private:
  template <typename T>
  bool Le(T* v, int n) {
    if (!ok_ || left() < size_t(n)) return Fail();
    uint64_t x = 0;
    for (int i = 0; i < n; i++) x |= uint64_t(p_[i]) << (8 * i);
    p_ += n;
    *v = T(x);
    return true;
  }
  const uint8_t* start_;
  const uint8_t* p_;
  const uint8_t* end_;
  bool ok_ = true;
};

}  // namespace vstellar
