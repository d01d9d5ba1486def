// What every command handler (commands*.cc) uses to read its request body
// and write its response: the bodies are little-endian wire structs that
// may sit at any alignment in the copied-out request.
#pragma once

#include <endian.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <vstellar/virtio_vstellar.h>

#include "vstellard/feature_bits.h"
#include "vstellard/objects.h"

namespace vstellard {

inline uint32_t cfg32(const __le32& v) { return le32toh(v); }

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Put(std::vector<uint8_t>* out, const T& v) {
  out->resize(sizeof(T));
  std::memcpy(out->data(), &v, sizeof(T));
}

inline bool IsZero(const void* p, size_t n) {
  auto* b = static_cast<const uint8_t*>(p);
  return std::all_of(b, b + n, [](uint8_t c) { return c == 0; });
}

// Pages needed for `bytes` starting `offset` into the first page.
inline uint64_t PagesFor(uint64_t offset, uint64_t bytes, uint32_t shift) {
  return (offset + bytes + (uint64_t{1} << shift) - 1) >> shift;
}

// The object a command whose body is only a handle (vstellar_cmd_handle)
// names, if context `uctx` owns it. `status` is BAD_FIELD for reserved
// bits, BAD_HANDLE for a handle unknown or another context's, else OK.
template <typename T>
struct NamedObject {
  T* obj;
  uint32_t handle;
  uint16_t status;
};

template <typename T>
NamedObject<T> ObjectNamedBy(ObjectTable<T>& table, uint32_t uctx, const uint8_t* body) {
  const auto cmd = Get<vstellar_cmd_handle>(body);
  if (cmd.reserved) return {nullptr, 0, VSTELLAR_STATUS_BAD_FIELD};
  const uint32_t handle = le32toh(cmd.handle);
  T* obj = table.Owned(uctx, handle);
  return {obj, handle, uint16_t(obj ? VSTELLAR_STATUS_OK : VSTELLAR_STATUS_BAD_HANDLE)};
}

}  // namespace vstellard
