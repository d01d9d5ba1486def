// The vstellard daemon: one process = one emulated physical Stellar RNIC.
// One epoll loop serves the listening socket, every QEMU connection (one
// virtual device each), every started queue's kick eventfd, and drives the
// shared engine (one UDP link, one ATC) for all devices.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
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
  // Objects one device may hold (0: the default, DeviceConfig::Default());
  // a limit above the default is refused by Start(). Over it, creating one
  // more fails with VSTELLAR_STATUS_LIMIT.
  struct DeviceMax {
    uint32_t ucontext = 0, pd = 0, qp = 0, cq = 0, mr = 0;
  } device_max;
  std::string stats_json;      // file written on SIGUSR1 (RequestStats) and at exit
};

class Daemon {
 public:
  explicit Daemon(DaemonOptions o);
  ~Daemon();
  // Binds the socket and sets up the engine. False with *err on failure.
  bool Start(std::string* err);
  // Serves until Stop().
  void Run();
  // Thread-safe and async-signal-safe.
  void Stop();
  void RequestStats();

  // Thread-safe snapshot of every live device.
  std::vector<DeviceStats> Stats();
  std::string StatsJson();
  AtcStats atc_stats();
  // Test hook (see DeviceShared::after_copy); set before clients connect.
  void SetAfterCopyHook(std::function<void(unsigned)> f) { shared_.after_copy = std::move(f); }
  // Test hook (see DeviceShared::after_wqe_copy); set before clients connect.
  void SetAfterWqeCopyHook(std::function<void(unsigned, uint32_t, bool, uint32_t)> f) {
    shared_.after_wqe_copy = std::move(f);
  }
  const DaemonOptions& options() const { return o_; }
  // Turns of the event loop so far (each one a return from epoll).
  uint64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }

 private:
  class NullLink;
  class Sink;
  void Accept();
  void OnSocket(unsigned id);
  void HandleMessage(unsigned id, Message&& m);
  void CloseStalled();  // connections stuck mid-message for vhost_timeout_ms
  void SyncKicks(unsigned id);
  struct Conn;
  void UnwatchKicks(Conn& c);
  void Close(unsigned id, const std::string& why);
  bool PumpEngine();  // true: the engine has work left
  void Visit(unsigned id);
  void WriteStats();
  std::string StatsJsonLocked();

  struct Conn {
    int sock = -1;  // non-blocking
    MessageReader reader;
    uint64_t partial_since_ns = 0;  // a message began arriving then (0: none)
    std::unique_ptr<Device> dev;
    std::vector<std::pair<int, uint32_t>> kicks;  // registered in epoll
    uint64_t turn = 0;  // the loop turn that last visited it
  };

  DaemonOptions o_;
  int epfd_ = -1, lsock_ = -1, stopfd_ = -1, statsfd_ = -1;
  std::unique_ptr<vstellar::Link> link_;
  vstellar::UdpLink* udp_ = nullptr;
  vstellar::SteadyClock clock_;
  std::unique_ptr<vstellar::Engine> engine_;
  std::unique_ptr<Atc> atc_;
  DeviceShared shared_;
  std::mutex mu_;  // held while the loop works; Stats() takes it
  std::map<unsigned, Conn> conns_;
  // Last counters of devices whose frontend went away (newest kMaxClosed),
  // so the stats written at exit still tell what each device did.
  static constexpr size_t kMaxClosed = 64;
  std::vector<DeviceStats> closed_;
  unsigned next_id_ = 0;
  // The loop's bookkeeping (Run): devices polling or with control left
  // after the last turn, those visited in this turn, connections stuck
  // inside a message.
  uint64_t turn_ = 0;
  std::vector<unsigned> active_, visit_;
  std::set<unsigned> partial_;
  std::atomic<uint64_t> wakeups_{0};
};

const char* ToString(PinMode m);
const char* ToString(TranslationMode m);

}  // namespace vstellard
