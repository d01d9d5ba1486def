// One split virtqueue (virtio 1.x, "Split Virtqueues") seen from the device
// side: the available index the device has consumed up to (last_avail) and
// the used index it has produced up to (used_idx) live here together, with
// the three operations a device does on a ring: pop a descriptor chain the
// driver made available, push a used element back, notify the driver.
// Modelled on the split of libvhost-user's vu_queue_pop/vu_queue_push: the
// ring knows nothing of what the buffers mean; Device (control, event and CQ
// notification queues) decides that.
//
// Guest memory is reached only through Pvdma, by guest-physical address;
// every index and descriptor read from the ring is checked before use. A
// corrupt available ring (an index beyond the ring) breaks the queue; a
// corrupt chain (loop, bad length, indirect misuse) fails that chain only.
//
// Ring base: vhost-user's SET_VRING_BASE and GET_VRING_BASE carry
// last_avail. Session keeps the value of those messages (Vring::base), and
// Device hands it to and from the Virtqueue around them; while the ring
// runs, the Virtqueue's last_avail is the one that counts.
#pragma once

#include <cstdint>
#include <vector>

#include "vstellard/pvdma.h"
#include "vstellard/vhost_user.h"

namespace vstellard {

class Virtqueue {
 public:
  // A part of a chain's buffer: guest-physical address and length.
  struct Segment {
    uint64_t gpa;
    uint32_t len;
  };
  // A descriptor chain copied out of the ring: its head (what push names)
  // and its device-readable, then device-writable segments.
  struct Chain {
    uint16_t head = 0;
    std::vector<Segment> readable, writable;
    uint64_t readable_len = 0, writable_len = 0;
  };
  enum class PopResult {
    kEmpty,     // nothing available
    kChain,     // *chain is valid
    kBadChain,  // the chain is malformed: push it back with length 0
    kBroken,    // the available ring itself is corrupt: stop using the queue
  };

  explicit Virtqueue(Pvdma& mem) : mem_(&mem) {}

  // The next available entry the device will consume (the ring base).
  uint16_t last_avail() const { return last_avail_; }
  void set_last_avail(uint16_t v) { last_avail_ = v; }
  // The used index the device has published.
  uint16_t used_idx() const { return used_idx_; }
  bool broken() const { return broken_; }
  void MarkBroken() { broken_ = true; }

  // The frontend (re)started or stopped the ring: the used index is read
  // again from guest memory on next use and a broken ring gets a new
  // chance. The ring base stays.
  void Restart();
  // Back to the state of a new ring (RESET_OWNER): ring base 0 as well.
  void Reset();

  // Starts a batch of work on the ring `v` describes: finds its three parts
  // in guest-physical memory and, on first use after a (re)start, reads the
  // used index the driver last saw. False if the ring is not running, is
  // broken or lies outside guest memory. Notify() covers what was pushed
  // since Begin().
  bool Begin(const Vring& v, uint64_t acked_features);

  // Takes the next available chain (copying and checking every descriptor).
  PopResult Pop(Chain* chain);
  // With VIRTIO_RING_F_EVENT_IDX: asks the driver to kick at the next
  // buffer it makes available (avail_event = last_avail) and orders that
  // store before the caller looks at the ring once more. False, doing
  // nothing, without the feature.
  bool ArmKick();
  // Returns chain `head` to the driver with `len` bytes written.
  void Push(uint16_t head, uint32_t len);
  // Signals the call eventfd for the elements pushed since Begin(), unless
  // the driver suppressed it (VRING_AVAIL_F_NO_INTERRUPT or used_event).
  void Notify();

  // Copies the readable part of `chain` to dst (readable_len bytes). False
  // if a segment is not guest memory.
  bool ReadAll(const Chain& chain, uint8_t* dst) const;
  // Copies up to len bytes of data into the writable part of `chain`.
  // Returns the bytes written; *ok is false if a segment was not guest
  // memory (the bytes before it are written).
  uint32_t WriteAll(const Chain& chain, const void* data, uint32_t len, bool* ok) const;

 private:
  Pvdma* mem_;
  uint16_t last_avail_ = 0;
  uint16_t used_idx_ = 0;
  bool used_read_ = false;  // used_idx_ holds the ring's value since the (re)start
  bool broken_ = false;
  // Set by Begin(): where the ring is and what was negotiated.
  uint32_t num_ = 0;
  uint64_t desc_ = 0, avail_ = 0, used_ = 0;  // guest-physical
  uint64_t features_ = 0;
  int call_fd_ = -1;
  uint16_t batch_used_ = 0;  // used_idx_ at Begin()
};

}  // namespace vstellard
