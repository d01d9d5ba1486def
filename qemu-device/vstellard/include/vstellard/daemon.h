// The vstellard daemon: one process = one emulated physical Stellar RNIC.
// One epoll loop per worker thread (--threads, 1 by default) serves the
// QEMU connections (one virtual device each) given to that worker, every
// started queue's kick eventfd, and drives the worker's own engine (one
// UDP link with its io_uring, one ATC) for its devices; worker 0 also
// accepts connections and hands each to the worker with the fewest.
// One worker is worker.h; the stats file the daemon writes, stats_json.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "vstellard/daemon_options.h"
#include "vstellard/device.h"
#include "vstellard/worker.h"

namespace vstellard {

class Daemon {
 public:
  explicit Daemon(DaemonOptions o);
  ~Daemon();
  // Binds the socket and sets up the engines (worker 0's on this thread,
  // the others' on their own threads, which start serving at once). False
  // with *err on failure.
  bool Start(std::string* err);
  // Serves until Stop(), as worker 0; then stops the other workers.
  void Run();
  // Thread-safe and async-signal-safe.
  void Stop();
  void RequestStats();

  // Thread-safe snapshot of every live device.
  std::vector<DeviceStats> Stats();
  std::string StatsJson();
  // Test hooks (see DeviceShared::after_copy, after_wqe_copy); set before
  // clients connect.
  void SetAfterCopyHook(std::function<void(unsigned)> f);
  void SetAfterWqeCopyHook(std::function<void(unsigned, uint32_t, bool, uint32_t)> f);
  const DaemonOptions& options() const { return o_; }
  // Turns of the event loops so far (each one a return from epoll).
  uint64_t wakeups() const;
  // The worker thread serving device `id` (-1: no such live device).
  int WorkerOf(unsigned id);
  // Devices moved to their peers' worker so far (Worker::Place).
  uint64_t device_moves() const;
  // Datagrams a worker received for another worker's QP and passed on.
  uint64_t forwarded() const;

 private:
  bool ApplyDeviceMax(std::string* err);
  bool Listen(std::string* err);
  bool ListenOn(const std::string& path, const std::vector<vstellar::IpAddr>& addresses, std::string* err);
  bool StartWorkers(std::string* err);
  void Accept(size_t listener);  // on worker 0's thread
  void KeepClosed(const DeviceStats& last);
  void WriteStats();
  void StopWorkers();

  DaemonOptions o_;
  std::vector<int> listen_fds_;  // the default socket (if any), then each --device socket
  int statsfd_ = -1;
  WorkerEnv env_;  // what every worker shares
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<unsigned> next_id_{0};
  // Last counters of devices whose frontend went away (newest kMaxClosed),
  // so the stats written at exit still tell what each device did.
  static constexpr size_t kMaxClosed = 64;
  std::mutex closed_mu_;
  std::vector<DeviceStats> closed_;
};

}  // namespace vstellard
