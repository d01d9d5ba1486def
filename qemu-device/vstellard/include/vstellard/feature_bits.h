// Bit n of a 64-bit mask: virtio and vhost-user feature words, the
// device's page_size_cap. Defined once for every layer of vstellard.
#pragma once

#include <cstdint>

namespace vstellard {

constexpr uint64_t Bit(int n) { return uint64_t{1} << n; }

// Whether feature word `features` has bit `n`.
constexpr bool HasBit(uint64_t features, int n) { return (features & Bit(n)) != 0; }

}  // namespace vstellard
