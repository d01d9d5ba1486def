// The device state's way in and out of the daemon for live migration:
// vhost-user SET_DEVICE_STATE_FD hands over one end of a pipe, the
// frontend reads (save) or writes (load) the other end, and
// CHECK_DEVICE_STATE asks how it went. The pipe holds 64 KiB and the
// frontend reads or writes only after SET_DEVICE_STATE_FD is answered, so
// the bytes move on a thread of their own while the daemon's loop goes on.
// A frontend that never reads or never closes its end costs that thread
// (bounded by kTimeout), never the loop or another device.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "vstellard/memory_region.h"

namespace vstellard {

class StateTransfer {
 public:
  // A transfer that has not finished within this fails.
  static constexpr std::chrono::seconds kTimeout{30};

  StateTransfer() = default;
  ~StateTransfer() { Cancel(); }
  StateTransfer(const StateTransfer&) = delete;
  StateTransfer& operator=(const StateTransfer&) = delete;

  // Writes `bytes` into fd, then closes it (the frontend's EOF).
  void StartSave(Fd fd, std::vector<uint8_t> bytes);
  // Reads fd up to EOF, at most `max` bytes.
  void StartLoad(Fd fd, size_t max);
  bool running() const { return thread_.joinable(); }
  // Waits for the transfer to end (at most `wait`): true if it moved every
  // byte; a load's bytes go to *out. Otherwise *err says why (and a
  // transfer still running is cancelled).
  bool Finish(std::chrono::milliseconds wait, std::vector<uint8_t>* out, std::string* err);
  // Stops a running transfer (within 100 ms) and forgets it.
  void Cancel();

 private:
  void Run(Fd fd, bool save);

  std::thread thread_;
  std::atomic<bool> cancel_{false}, done_{false};
  std::vector<uint8_t> bytes_;
  size_t max_ = 0;
  std::string error_;  // set by the thread before done_
};

}  // namespace vstellard
