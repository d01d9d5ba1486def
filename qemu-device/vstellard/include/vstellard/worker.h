// One worker thread of vstellard (daemon.h runs 1..--threads of them): an
// epoll loop over its devices (their sockets and kick eventfds), its own
// engine, UDP link (io_uring) and ATC. Everything of a device (vhost-user
// messages, control queue, data path, engine objects) runs on its worker's
// thread, so no lock is held across the data path; other threads reach a
// worker only through its inbox (new connections, datagrams for its QPs
// that arrived elsewhere) and its eventfd.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <cstdint>
#include <ctime>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <vstellar/engine.h>
#include <vstellar/telemetry/fault_locator.h>
#include <vstellar/telemetry/path_tracer.h>
#include <vstellar/udp_link.h>

#include "vstellard/daemon_options.h"
#include "vstellard/device.h"
#include "vstellard/placement.h"
#include "vstellard/translate.h"
#include "vstellard/vhost_user.h"

namespace vstellard {

struct DaemonStats;
class Worker;

// What the daemon gives its workers: the same for all of them, set up
// before any runs and outliving them.
struct WorkerEnv {
  const DaemonOptions* options = nullptr;
  std::shared_ptr<MemoryBudget> memory;
  DeviceConfig device_config = DeviceConfig::Default();
  std::shared_ptr<GidTable> gids = std::make_shared<GidTable>();
  // Every worker, by index: where a datagram for another worker's QP goes.
  const std::vector<std::unique_ptr<Worker>>* workers = nullptr;
  // With several workers: where each QP lives (placement.h); with
  // place_by_peers, a device moves to the worker of the devices of this
  // daemon its QPs are connected to (Worker::Place).
  std::shared_ptr<Placement> placement;
  bool place_by_peers = false;
  // Worker 0 only: the listening sockets and the stats eventfd, and what it
  // does when they are readable (on its thread, under its lock for
  // accept; outside it for write_stats, which takes every worker's).
  std::vector<int> listen_fds;
  int stats_fd = -1;
  std::function<void(size_t listener)> accept;
  std::function<void()> write_stats;
  // Per listening socket: the addresses its devices may hold.
  std::vector<std::vector<vstellar::IpAddr>> listener_addresses;
  // A device's last counters, when its frontend went away.
  std::function<void(const DeviceStats&)> keep_closed;
  // Test hooks (DeviceShared::after_copy, after_wqe_copy).
  std::function<void(unsigned)> after_copy;
  std::function<void(unsigned, uint32_t, bool, uint32_t)> after_wqe_copy;
};

class Worker {
 public:
  // The eventfds exist from the start, so a connection or datagram handed
  // over before the worker runs waits in them.
  Worker(const WorkerEnv& env, unsigned index);
  ~Worker();
  // Link, engine, epoll. On the thread that runs Run() (the link's
  // io_uring is single-issuer).
  bool Start(std::string* err);
  // Serves until Stop().
  void Run();
  void Stop();  // async-signal-safe
  // Thread-safe: a new connection for this worker, accepted on listening
  // socket `listener` (WorkerEnv::listener_addresses).
  void Adopt(unsigned id, int sock, size_t listener);
  // Thread-safe: numbers of this worker's shard whose objects died on
  // another worker (Engine::ids_returned).
  void GiveBack(vstellar::ReturnedIds ids);
  // Thread-safe: the device owning QP `qpn` is asked to look whether it
  // belongs on its peers' worker (Worker::Place: a peer on a busier
  // worker asks instead of moving there).
  void AskToPlace(uint32_t qpn);
  // Thread-safe: a datagram for one of this worker's QPs.
  void Forward(const uint8_t* data, size_t len, const vstellar::Endpoint& from, const vstellar::IpAddr& to,
               bool ce);
  // Devices given to this worker and not yet closed (Daemon::Accept).
  std::atomic<unsigned> devices{0};
  std::atomic<uint64_t> wakeups{0}, forwarded{0};
  std::mutex mu;  // held while the loop works; the daemon's readers take it
  // Workers 1..N-1: their thread, which after Run() waits for `release`
  // and then takes down the devices, engine and link itself (the link's
  // io_uring takes requests from its own thread only, and cancels its
  // receive so the ports are free when the daemon exits).
  std::thread thread;
  std::promise<void> release;
  void TearDown();

  // Under mu:
  void CollectStats(std::vector<DeviceStats>* v);
  // Adds this worker's devices, QP states, ATC and engine counters.
  void AddStats(DaemonStats* s);
  bool HasDevice(unsigned id) const { return conns_.count(id) != 0; }
  void SetHooks();  // takes the env's test hooks anew
  void AddConn(unsigned id, int sock, size_t listener);
  unsigned index() const { return index_; }

 private:
  class DatagramRouter;
  struct Conn {
    int sock = -1;  // non-blocking
    MessageReader reader;
    uint64_t partial_since_ns = 0;  // a message began arriving then (0: none)
    std::unique_ptr<Device> dev;
    std::vector<std::pair<int, uint32_t>> kicks;  // registered in epoll
    uint64_t turn = 0;  // the loop turn that last visited it
  };
  // A device on its way from another worker (MoveOut): its connection and
  // its engine objects. The objects are declared first so that they
  // outlive the device, whose destructor may still name them.
  struct Arrival {
    vstellar::Detached objs;
    unsigned id = 0;
    Conn conn;
  };
  void Arrive(Arrival&& a);  // thread-safe
  // Placement (Worker::Place): devices whose QPs got a peer this turn are
  // looked at after it; one may move to the worker serving its peers.
  void Place();
  bool LocalPeer(const vstellar::Endpoint& ep) const;
  void MoveOut(unsigned id, unsigned to);
  void MoveIn(Arrival&& a, bool serving);
  void Steer();
  void ReturnIds();
  struct ToPlace {
    unsigned id;
    bool asked;  // by a peer's worker (AskToPlace): moves, never asks back
  };
  std::vector<ToPlace> to_place_;
  bool torn_down_ = false;  // under Placement::decide_mu (TearDown, MoveOut)
  std::set<unsigned> unmovable_logged_;
  struct Datagram {
    std::vector<uint8_t> bytes;
    vstellar::Endpoint from;
    vstellar::IpAddr to;
    bool ce;
  };

  bool StartLink(std::string* err);
  bool StartEngine(std::string* err);
  void ShareWithDevices();
  bool StartEpoll(std::string* err);
  // One turn of Run's loop, in order: how long epoll may sleep; the turn's
  // bookkeeping; the events; the idle devices' second look; the end of the
  // turn (control queues, data paths, the engine).
  timespec* NextTimeout(bool engine_more, timespec* ts);
  void BeginTurn();
  bool HandleEvents(const epoll_event* evs, int n, bool* stats);  // false: stop
  void RecheckIdleDevices();
  bool EndTurn();  // true: the engine has work left

  void OnSocket(unsigned id);
  void HandleMessage(unsigned id, Message&& m);
  void CloseStalled();  // connections stuck mid-message for vhost_timeout_ms
  uint64_t StallLimitNs() const;  // --vhost-timeout
  void SyncKicks(unsigned id);
  void UnwatchKicks(Conn& c);
  void Close(unsigned id, const std::string& why);
  bool PumpEngine();  // true: the engine has work left
  void TakeInbox();
  void Visit(unsigned id);
  void DescribeQps(std::vector<std::string>* out);

  const WorkerEnv& env_;
  const DaemonOptions& o_;
  const unsigned index_;
  int epfd_ = -1, stopfd_ = -1, inboxfd_ = -1;
  std::unique_ptr<vstellar::Link> link_;
  vstellar::UdpLink* udp_ = nullptr;
  vstellar::SteadyClock clock_;
  std::unique_ptr<vstellar::Engine> engine_;
  // --locate-faults: routes of the engine's paths and the faults they show.
  void StartLocator();
  void Locate();
  std::unique_ptr<vstellar::telemetry::PathTracer> tracer_;
  std::unique_ptr<vstellar::telemetry::FaultLocator> locator_;
  uint64_t next_locate_ns_ = 0;
  bool trace_ready_ = false;  // epoll: the tracer's ICMP socket is readable
  std::unique_ptr<Atc> atc_;
  DeviceShared shared_;
  std::map<unsigned, Conn> conns_;
  // The loop's bookkeeping (Run): devices polling or with control left
  // after the last turn, those visited in this turn, connections stuck
  // inside a message.
  uint64_t turn_ = 0;
  std::vector<unsigned> active_, visit_;
  std::set<unsigned> partial_;
  // The inbox: filled by other threads, taken by this one.
  std::mutex inbox_mu_;
  struct NewConn {
    unsigned id;
    int sock;
    size_t listener;
  };
  std::vector<NewConn> new_conns_;
  std::vector<Datagram> datagrams_;
  std::vector<Arrival> arrivals_;
  std::vector<vstellar::ReturnedIds> given_back_;
  std::vector<uint32_t> asked_to_place_;  // QPNs
};

}  // namespace vstellard
