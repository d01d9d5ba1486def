// One virtual vStellar device as its guest sees it, apart from the
// transport that carries it: what the device is and offers (DeviceConfig)
// and what the driver took of it (DeviceState). The Device owns its
// DeviceState; the vhost-user Session answers GET_FEATURES and GET_CONFIG
// from it and records SET_FEATURES and SET_CONFIG in it; the commands and
// the data path read it, and reach the transport only through the narrow
// DeviceTransport below.
#pragma once

#include <endian.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <vstellar/types.h>

#include <vstellar/virtio_vstellar.h>

#include "vstellard/feature_bits.h"
#include "vstellard/memory_region.h"

namespace vstellard {

// What the device reports and enforces: its config space (object counts,
// queue sizes, page sizes, the GUID), the device features it offers, its
// queues, the guest memory one memory table may declare. Default() is the
// whole device; the daemon's options lower it (--device-max and others).
struct DeviceConfig {
  virtio_vstellar_config config{};
  uint64_t device_features = 0;  // bits 0..23
  uint32_t max_queues = VSTELLAR_MAX_VQS;
  // Guest memory one memory table may declare, all regions together
  // (vstellard --guest-memory-limit). What the daemon keeps per region
  // grows with its size (PVDMA's block table), and a frontend can declare
  // any size on a sparse file, so it must be bounded before any of it is
  // allocated. The default is max_mr_size: no MR could be larger.
  uint64_t max_guest_memory = uint64_t{1} << 40;
  static DeviceConfig Default();
};

// Whether the device offers pages of 2^shift bytes (its page_size_cap)
// for rings, MRs and fast registration.
inline bool PageShiftSupported(const virtio_vstellar_config& c, uint32_t shift) {
  return shift < 64 && (le64toh(c.page_size_cap) >> shift & 1);
}

class DeviceState {
 public:
  explicit DeviceState(const DeviceConfig& offered, std::vector<vstellar::IpAddr> addresses = {})
      : device_(offered), addresses_(std::move(addresses)) {}
  const DeviceConfig& device() const { return device_; }
  DeviceConfig& mutable_device() { return device_; }
  const virtio_vstellar_config& config() const { return device_.config; }
  // The features the driver acked (SET_FEATURES; 0 again after a reset).
  uint64_t acked_features() const { return acked_features_; }
  void set_acked_features(uint64_t f) { acked_features_ = f; }
  // Whether the driver took feature VIRTIO_VSTELLAR_F_x.
  bool HasFeature(int bit) const { return HasBit(acked_features_, bit); }
  // The addresses the device may hold as GIDs: those of the vhost-user
  // socket it attached through (vstellard --ip for the default socket,
  // --device PATH,ip=... for the others), set by the host's administrator
  // and never by anything the guest or its QEMU sends.
  const std::vector<vstellar::IpAddr>& addresses() const { return addresses_; }
  bool MayHold(const vstellar::IpAddr& a) const {
    return std::find(addresses_.begin(), addresses_.end(), a) != addresses_.end();
  }

 private:
  DeviceConfig device_;
  std::vector<vstellar::IpAddr> addresses_;
  uint64_t acked_features_ = 0;
};

// What the commands and the data path need of the transport (the
// vhost-user Session implements it): this device's doorbell region in
// the guest's memory table, and the size of each queue the frontend set
// up (0: not set up).
class DeviceTransport {
 public:
  virtual ~DeviceTransport() = default;
  virtual const MemRegion* DoorbellRegion() const = 0;
  virtual uint32_t QueueSize(uint32_t queue) const = 0;
};

}  // namespace vstellard
