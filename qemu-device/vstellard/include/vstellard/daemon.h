// The vstellard daemon: one process = one emulated physical Stellar RNIC.
// One epoll loop per worker thread (--threads, 1 by default) serves the
// QEMU connections (one virtual device each) given to that worker, every
// started queue's kick eventfd, and drives the worker's own engine (one
// UDP link with its io_uring, one ATC) for its devices; worker 0 also
// accepts connections and hands each to the worker with the fewest.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <string>
#include <vector>

#include <vstellar/engine.h>
#include <vstellar/udp_link.h>

#include "vstellard/device.h"
#include "vstellard/pvdma.h"
#include "vstellard/translate.h"

namespace vstellard {

struct DaemonOptions {
  std::string socket;
  PinMode pin = PinMode::kLazy;
  TranslationMode translation = TranslationMode::kEmtt;
  size_t atc_entries = 16384;  // 4 KiB frames: 64 MiB of reach
  uint64_t atc_miss_ns = 0;    // emulated ATS round trip on a miss
  uint32_t ip = 0x7f000001;    // host order
  uint16_t udp_port = 0;       // engine base port; 0 = no network
  uint16_t peer_port = 0;      // peers' base port; 0 = same as udp_port
  uint16_t paths = 128;
  vstellar::LinkMode link_mode = vstellar::LinkMode::GSO;  // UdpLinkConfig::mode
  uint16_t path_burst = 16;    // EngineConfig::path_burst
  bool zerocopy = false;       // UdpLinkConfig::zerocopy
  uint64_t poll_us = 50;       // data path: keep polling doorbells this long after the last work
  uint64_t idle_recheck_us = 1000;  // data path: one more look this long after going idle (missed kicks)
  // Work per device per loop turn (DeviceShared): what is left waits a turn.
  uint32_t control_budget = 64;       // control commands
  uint32_t wqe_budget_queue = 64;     // WQEs of one SQ, RQ or SRQ
  uint32_t wqe_budget_device = 1024;  // WQEs of all the device's queues
  // A frontend that sends part of a vhost-user message and then nothing
  // for this long is closed (that device only).
  uint32_t vhost_timeout_ms = 5000;
  // Guest memory must be sealed against shrinking (memfd seal=on).
  bool require_sealed_memory = true;
  // Integrity mode (docs/wire-format.md): a MAC on every packet.
  bool integrity = false;
  std::array<uint8_t, 32> integrity_key{};
  // Host memory the guests' objects may hold (memory_budget.h): all
  // devices together, and each device.
  uint64_t memory_limit = uint64_t{4} << 30;
  uint64_t device_memory_limit = uint64_t{1} << 30;
  // Guest memory one device's memory table may declare
  // (DeviceConfig::max_guest_memory); a larger table is refused.
  uint64_t guest_memory_limit = uint64_t{1} << 40;
  // Multicast quotas of each device (DeviceShared::mcast_*).
  uint32_t mcast_groups_per_device = 16;
  uint32_t mcast_qps_per_group = 8;
  // Objects one device may hold (0: the default, DeviceConfig::Default());
  // a limit above the default is refused by Start(). Over it, creating one
  // more fails with VSTELLAR_STATUS_LIMIT.
  struct DeviceMax {
    uint32_t ucontext = 0, pd = 0, qp = 0, cq = 0, mr = 0;
  } device_max;
  std::string stats_json;      // file written on SIGUSR1 (RequestStats) and at exit
  // Worker threads (1..kMaxThreads): each has its own engine, io_uring and
  // sockets (on the same ports, SO_REUSEPORT; arriving datagrams are
  // steered by destination QPN) and serves the devices it was given.
  unsigned threads = 1;
  static constexpr unsigned kMaxThreads = 64;
};

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
  // Datagrams a worker received for another worker's QP and passed on.
  uint64_t forwarded() const;

 private:
  class NullLink;
  class Sink;
  class Worker;
  void Accept();  // on worker 0's thread
  void WriteStats();
  void StopWorkers();

  DaemonOptions o_;
  int lsock_ = -1, statsfd_ = -1;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::shared_ptr<GidTable> gids_ = std::make_shared<GidTable>();
  std::shared_ptr<MemoryBudget> memory_;
  DeviceConfig device_config_ = DeviceConfig::Default();
  std::function<void(unsigned)> after_copy_;
  std::function<void(unsigned, uint32_t, bool, uint32_t)> after_wqe_copy_;
  std::atomic<unsigned> next_id_{0};
  // Last counters of devices whose frontend went away (newest kMaxClosed),
  // so the stats written at exit still tell what each device did.
  static constexpr size_t kMaxClosed = 64;
  std::mutex closed_mu_;
  std::vector<DeviceStats> closed_;
};

const char* ToString(PinMode m);
const char* ToString(TranslationMode m);

}  // namespace vstellard
