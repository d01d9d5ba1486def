// vstellard's event loops; see include/vstellard/daemon.h.
#include "vstellard/daemon.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <endian.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <tuple>

#include <vstellar/udp_link.h>
#include <vstellar/wire.h>

namespace vstellard {

namespace {
constexpr uint64_t kTokListen = ~0ull, kTokStop = ~0ull - 1, kTokStats = ~0ull - 2, kTokUdp = ~0ull - 3,
                   kTokInbox = ~0ull - 4;
// Per connection: token = id << 16 | 0xffff for its socket, id << 16 | q for a kick.
uint64_t SockTok(unsigned id) { return uint64_t(id) << 16 | 0xffff; }
uint64_t KickTok(unsigned id, uint32_t q) { return uint64_t(id) << 16 | q; }

void Log(const char* fmt, auto... args) {
  std::fprintf(stderr, "vstellard: ");
  std::fprintf(stderr, fmt, args...);
  std::fputc('\n', stderr);
}

void AddAtcStats(AtcStats* sum, const AtcStats& s) {
  sum->lookups += s.lookups;
  sum->hits += s.hits;
  sum->misses += s.misses;
  sum->evictions += s.evictions;
}

// Integrity mode puts its trailer in front of the wire header.
constexpr size_t kIntegrityTrailer = 28;
}  // namespace

const char* ToString(PinMode m) { return m == PinMode::kEager ? "eager" : "lazy"; }
const char* ToString(TranslationMode m) { return m == TranslationMode::kAtc ? "atc" : "emtt"; }

// No network: packets are dropped (control-path-only daemons and tests).
class Daemon::NullLink final : public vstellar::Link {
 public:
  void send(uint16_t, const vstellar::Endpoint&, const uint8_t*, size_t, const vstellar::HostSpan*, size_t) override {}
  void flush() override {}
};

// One worker thread: an epoll loop over its devices (their sockets and kick
// eventfds), its own engine, UDP link (io_uring) and ATC. Everything of a
// device (vhost-user messages, control queue, data path, engine objects)
// runs on its worker's thread, so no lock is held across the data path;
// other threads reach a worker only through its inbox (new connections,
// datagrams for its QPs that arrived elsewhere) and its eventfd.
class Daemon::Worker {
 public:
  // The eventfds exist from the start, so a connection or datagram handed
  // over before the worker runs waits in them.
  Worker(Daemon& d, unsigned index)
      : d_(d),
        index_(index),
        stopfd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        inboxfd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  ~Worker();
  // Link, engine, epoll. On the thread that runs Run() (the link's
  // io_uring is single-issuer).
  bool Start(std::string* err);
  void Run();
  void Stop() {  // async-signal-safe
    uint64_t one = 1;
    (void)!write(stopfd_, &one, sizeof(one));
  }
  // Thread-safe: a new connection for this worker.
  void Adopt(unsigned id, int sock);
  // Thread-safe: a datagram for one of this worker's QPs.
  void Forward(const uint8_t* data, size_t len, const vstellar::Endpoint& from, bool ce);
  // Devices given to this worker and not yet closed (PickWorker).
  std::atomic<unsigned> devices{0};
  std::atomic<uint64_t> wakeups{0}, forwarded{0};
  std::mutex mu_;  // held while the loop works; Stats() takes it
  // Workers 1..N-1: their thread, which after Run() waits for `release`
  // and then takes down the devices, engine and link itself (the link's
  // io_uring takes requests from its own thread only, and cancels its
  // receive so the ports are free when the daemon exits).
  std::thread thread;
  std::promise<void> release;
  void TearDown();

  // Under mu_:
  void CollectStats(std::vector<DeviceStats>* v);
  void DescribeQps(std::vector<std::string>* out);
  bool HasDevice(unsigned id) const { return conns_.count(id) != 0; }
  const vstellar::Engine* engine() const { return engine_.get(); }
  const Atc* atc() const { return atc_.get(); }
  void SetHooks();
  void AddConn(unsigned id, int sock);
  vstellar::Engine& engine_ref() { return *engine_; }
  unsigned index() const { return index_; }

 private:
  void OnSocket(unsigned id);
  void HandleMessage(unsigned id, Message&& m);
  void CloseStalled();  // connections stuck mid-message for vhost_timeout_ms
  void SyncKicks(unsigned id);
  struct Conn;
  void UnwatchKicks(Conn& c);
  void Close(unsigned id, const std::string& why);
  bool PumpEngine();  // true: the engine has work left
  void TakeInbox();
  void Visit(unsigned id);

  struct Conn {
    int sock = -1;  // non-blocking
    MessageReader reader;
    uint64_t partial_since_ns = 0;  // a message began arriving then (0: none)
    std::unique_ptr<Device> dev;
    std::vector<std::pair<int, uint32_t>> kicks;  // registered in epoll
    uint64_t turn = 0;  // the loop turn that last visited it
  };
  struct Datagram {
    std::vector<uint8_t> bytes;
    vstellar::Endpoint from;
    bool ce;
  };

  Daemon& d_;
  const unsigned index_;
  int epfd_ = -1, stopfd_ = -1, inboxfd_ = -1;
  std::unique_ptr<vstellar::Link> link_;
  vstellar::UdpLink* udp_ = nullptr;
  vstellar::SteadyClock clock_;
  std::unique_ptr<vstellar::Engine> engine_;
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
  std::vector<std::pair<unsigned, int>> new_conns_;
  std::vector<Datagram> datagrams_;
};

// Datagrams from the link into the engine. With several workers, a
// datagram for another worker's QP (one that came inside a GSO buffer
// steered by its first datagram, or for QP 1 of a GID another worker's
// device holds) goes to that worker's inbox.
class Daemon::Sink final : public vstellar::RxSink {
 public:
  Sink(Daemon& d, Worker& w) : d_(d), w_(w) {}
  void on_datagram(const uint8_t* data, size_t n, const vstellar::Endpoint& from, uint16_t, bool ce) override {
    const size_t nw = d_.workers_.size();
    if (nw > 1) {
      const int owner = Owner(data, n, nw);
      if (owner >= 0 && unsigned(owner) != w_.index()) {
        d_.workers_[size_t(owner)]->Forward(data, n, from, ce);
        w_.forwarded.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    w_.engine_ref().receive(data, n, from, ce);
  }

 private:
  // The worker whose engine owns the datagram's destination, or -1 (this
  // one: it has a copy of its own, or the engine drops it).
  int Owner(const uint8_t* data, size_t n, size_t nw) const {
    const size_t off = d_.o_.integrity ? kIntegrityTrailer : 0;
    if (n < off + vstellar::wire::kBaseLen) return -1;
    const uint8_t* h = data + off;
    const uint32_t qpn = uint32_t(h[4]) << 24 | uint32_t(h[5]) << 16 | uint32_t(h[6]) << 8 | h[7];
    const auto op = vstellar::wire::Op(h[1]);
    if (vstellar::wire::is_ud(op)) {
      constexpr size_t kDgid = vstellar::wire::kBaseLen + 32;  // in the UD extension
      if (n < off + kDgid + 16) return -1;
      vstellar::Gid dgid;
      std::memcpy(dgid.data(), h + kDgid, 16);
      // Every worker's multicast socket gets its own copy.
      if (IsV4Mapped(dgid.data()) && (dgid[12] & 0xf0) == 0xe0) return -1;
      if (qpn == 1) return d_.gids_->WorkerOf(dgid);
    }
    return int(qpn % nw);
  }
  Daemon& d_;
  Worker& w_;
};

Daemon::Daemon(DaemonOptions o) : o_(std::move(o)) {}

Daemon::~Daemon() {
  StopWorkers();
  workers_.clear();
  for (int fd : {lsock_, statsfd_})
    if (fd >= 0) close(fd);
}

// Every worker but 0 (which runs in Run()'s thread) is stopped, then
// released to take itself down, and joined.
void Daemon::StopWorkers() {
  for (auto& w : workers_)
    if (w->thread.joinable()) w->Stop();
  for (auto& w : workers_) {
    if (!w->thread.joinable()) continue;
    w->release.set_value();
    w->thread.join();
  }
}

void Daemon::Worker::TearDown() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [id, c] : conns_) {
    c.dev.reset();
    if (c.sock >= 0) close(c.sock);
  }
  conns_.clear();
  // The engine's objects go before the link they send on.
  engine_.reset();
  link_.reset();
  udp_ = nullptr;
}

Daemon::Worker::~Worker() {
  TearDown();
  for (auto& [id, s] : new_conns_) close(s);
  for (int fd : {epfd_, stopfd_, inboxfd_})
    if (fd >= 0) close(fd);
}

bool Daemon::Worker::Start(std::string* err) {
  const DaemonOptions& o = d_.o_;
  const unsigned n = o.threads;
  if (o.udp_port) {
    vstellar::UdpLinkConfig lc;
    lc.local_ip = o.ip;
    lc.base_port = o.udp_port;
    lc.num_paths = o.paths;
    lc.mode = o.link_mode;
    lc.zerocopy = o.zerocopy;
    lc.mcast_port = uint16_t((o.peer_port ? o.peer_port : o.udp_port) + DeviceShared::kMcastPortOffset);
    if (n > 1) {
      lc.shards = uint16_t(n);
      lc.shard = uint16_t(index_);
      lc.shard_qpn_offset = uint16_t(4 + (o.integrity ? kIntegrityTrailer : 0));
    }
    auto udp = std::make_unique<vstellar::UdpLink>(lc);
    if (!udp->ok()) {
      *err = "udp link: " + udp->error();
      return false;
    }
    udp_ = udp.get();
    link_ = std::move(udp);
  } else {
    link_ = std::make_unique<NullLink>();
  }
  vstellar::EngineConfig ec;
  ec.num_paths = o.paths;
  ec.path_burst = o.path_burst;
  ec.lkeys_at_post = true;  // a WQE with a bad lkey fails at once (design.md, data-path rules)
  ec.integrity = o.integrity;
  ec.integrity_key = o.integrity_key;
  ec.qpn_shards = n;  // this worker's QPNs are index_ mod n: the steering key
  ec.qpn_shard = index_;
  if (!ec.validate()) {
    *err = "bad engine configuration";
    return false;
  }
  engine_ = std::make_unique<vstellar::Engine>(ec, *link_, clock_);
  // The ATC's entries are split among the workers (each device is on one).
  atc_ = std::make_unique<Atc>(std::max<size_t>(1, o.atc_entries / n), o.atc_miss_ns);
  shared_.engine = engine_.get();
  shared_.atc = atc_.get();
  shared_.worker = index_;
  shared_.pin = o.pin;
  shared_.translation = o.translation;
  shared_.poll_ns = o.poll_us * 1000;
  shared_.recheck_ns = o.idle_recheck_us * 1000;
  shared_.control_budget = o.control_budget ? o.control_budget : 1;
  shared_.wqe_budget_queue = o.wqe_budget_queue ? o.wqe_budget_queue : 1;
  shared_.wqe_budget_device = o.wqe_budget_device ? o.wqe_budget_device : 1;
  shared_.peer_port = o.peer_port ? o.peer_port : (o.udp_port ? o.udp_port : 47000);
  shared_.host_ip = o.ip;
  shared_.require_sealed_memory = o.require_sealed_memory;
  shared_.memory = d_.memory_;
  shared_.device_memory_limit = o.device_memory_limit;
  shared_.mcast_groups_per_device = o.mcast_groups_per_device;
  shared_.mcast_qps_per_group = o.mcast_qps_per_group;
  shared_.device_config = d_.device_config_;
  shared_.gids = d_.gids_;
  SetHooks();

  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0 || stopfd_ < 0 || inboxfd_ < 0) {
    *err = std::string("epoll/eventfd: ") + std::strerror(errno);
    return false;
  }
  std::vector<std::pair<int, uint64_t>> fds = {{stopfd_, kTokStop}, {inboxfd_, kTokInbox}};
  if (index_ == 0) fds.insert(fds.end(), {{d_.lsock_, kTokListen}, {d_.statsfd_, kTokStats}});
  if (udp_) fds.emplace_back(udp_->event_fd(), kTokUdp);  // a datagram or a send completion
  for (auto [fd, tok] : fds) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tok;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
  }
  return true;
}

void Daemon::Worker::SetHooks() {
  shared_.after_copy = d_.after_copy_;
  shared_.after_wqe_copy = d_.after_wqe_copy_;
}

void Daemon::SetAfterCopyHook(std::function<void(unsigned)> f) {
  after_copy_ = std::move(f);
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> g(w->mu_);
    w->SetHooks();
  }
}

void Daemon::SetAfterWqeCopyHook(std::function<void(unsigned, uint32_t, bool, uint32_t)> f) {
  after_wqe_copy_ = std::move(f);
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> g(w->mu_);
    w->SetHooks();
  }
}

bool Daemon::Start(std::string* err) {
  if (o_.threads < 1 || o_.threads > DaemonOptions::kMaxThreads) {
    *err = "--threads must be 1.." + std::to_string(DaemonOptions::kMaxThreads);
    return false;
  }
  memory_ = std::make_shared<MemoryBudget>(o_.memory_limit);
  device_config_.max_guest_memory = o_.guest_memory_limit;
  virtio_vstellar_config& dc = device_config_.config;
  for (auto [want, field, name] : {std::tuple{o_.device_max.ucontext, &dc.max_ucontext, "ucontext"},
                                   std::tuple{o_.device_max.pd, &dc.max_pd, "pd"},
                                   std::tuple{o_.device_max.qp, &dc.max_qp, "qp"},
                                   std::tuple{o_.device_max.cq, &dc.max_cq, "cq"},
                                   std::tuple{o_.device_max.mr, &dc.max_mr, "mr"}}) {
    if (!want) continue;
    if (want > le32toh(*field)) {
      *err = std::string("--device-max ") + name + "=" + std::to_string(want) + " is above the device's " +
             std::to_string(le32toh(*field));
      return false;
    }
    *field = htole32(want);
  }
  // What ATTACH_MCAST allows (commands.cc), so that ibv_devinfo says so.
  dc.max_mcast_grp = htole16(uint16_t(o_.mcast_groups_per_device));
  dc.max_mcast_qp_attach = htole16(uint16_t(o_.mcast_qps_per_group));
  // The engine's sockets are bound to this one address, so it is the one
  // GID any device here can send from and be reached at.
  vstellar::Gid own{};
  own[10] = own[11] = 0xff;
  for (int i = 0; i < 4; i++) own[12 + i] = uint8_t(o_.ip >> (24 - 8 * i));
  gids_->Serve(own);

  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (o_.socket.size() >= sizeof(addr.sun_path)) {
    *err = "socket path too long: " + o_.socket;
    return false;
  }
  std::memcpy(addr.sun_path, o_.socket.c_str(), o_.socket.size());
  lsock_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  unlink(o_.socket.c_str());
  if (lsock_ < 0 || bind(lsock_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0 || listen(lsock_, 64) < 0) {
    *err = "cannot listen on " + o_.socket + ": " + std::strerror(errno);
    return false;
  }
  statsfd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (statsfd_ < 0) {
    *err = std::string("eventfd: ") + std::strerror(errno);
    return false;
  }
  // Worker 0 on this thread; the others each on its own, one after the
  // other (the k-th link to bind is socket k of the ports' group), each
  // serving as soon as it is set up.
  // All workers exist before any runs: a running one may hand a datagram
  // to any other.
  for (unsigned k = 0; k < o_.threads; k++) workers_.push_back(std::make_unique<Worker>(*this, k));
  if (!workers_[0]->Start(err)) return false;
  for (unsigned k = 1; k < o_.threads; k++) {
    Worker& w = *workers_[k];
    std::promise<std::string> started;
    std::future<std::string> result = started.get_future();
    w.thread = std::thread([&w, &started, released = w.release.get_future()] {
      std::string e;
      const bool ok = w.Start(&e);
      started.set_value(ok ? std::string() : (e.empty() ? "worker failed" : e));
      if (ok) w.Run();
      released.wait();
      w.TearDown();
    });
    std::string e = result.get();
    if (!e.empty()) {
      w.release.set_value();
      w.thread.join();
      *err = "worker " + std::to_string(k) + ": " + e;
      return false;
    }
  }
  return true;
}

void Daemon::Stop() {
  for (auto& w : workers_) w->Stop();
}

void Daemon::RequestStats() {
  uint64_t one = 1;
  (void)!write(statsfd_, &one, sizeof(one));
}

void Daemon::Run() {
  workers_[0]->Run();
  // The others stop too; their devices are still there for the stats.
  for (auto& w : workers_) w->Stop();
  if (!o_.stats_json.empty()) WriteStats();
  StopWorkers();
}

void Daemon::Worker::Adopt(unsigned id, int sock) {
  {
    std::lock_guard<std::mutex> g(inbox_mu_);
    new_conns_.emplace_back(id, sock);
  }
  uint64_t one = 1;
  (void)!write(inboxfd_, &one, sizeof(one));
}

void Daemon::Worker::Forward(const uint8_t* data, size_t len, const vstellar::Endpoint& from, bool ce) {
  bool first;
  {
    std::lock_guard<std::mutex> g(inbox_mu_);
    first = datagrams_.empty();
    datagrams_.push_back(Datagram{std::vector<uint8_t>(data, data + len), from, ce});
  }
  if (first) {
    uint64_t one = 1;
    (void)!write(inboxfd_, &one, sizeof(one));
  }
}

// New connections and passed-on datagrams from other threads.
void Daemon::Worker::TakeInbox() {
  uint64_t v;
  (void)!read(inboxfd_, &v, sizeof(v));
  std::vector<std::pair<unsigned, int>> conns;
  std::vector<Datagram> dgrams;
  {
    std::lock_guard<std::mutex> g(inbox_mu_);
    conns.swap(new_conns_);
    dgrams.swap(datagrams_);
  }
  for (auto& [id, s] : conns) AddConn(id, s);
  for (const Datagram& dg : dgrams) engine_->receive(dg.bytes.data(), dg.bytes.size(), dg.from, dg.ce);
}

// Marks a device as worked on in this turn: it gets its budgets anew
// (DeviceShared), and the end of the turn continues its control queue and
// polls its data path.
void Daemon::Worker::Visit(unsigned id) {
  auto it = conns_.find(id);
  if (it == conns_.end() || it->second.turn == turn_) return;
  it->second.turn = turn_;
  it->second.dev->BeginTurn();
  visit_.push_back(id);
}

void Daemon::Worker::Run() {
  epoll_event evs[64];
  bool engine_more = false;
  for (;;) {
    // The engine's timers (RTO, delayed ACKs) are the epoll timeout, to the
    // nanosecond (epoll_pwait2); datagrams wake the loop through the UDP
    // link's eventfd. A device that polls its doorbells (kicked, or work
    // less than poll_ns ago), one with control requests left over from the
    // last turn's budget, and an engine with work left keep the loop from
    // sleeping; an idle device has set need_kick and waits for its kick
    // eventfd. Idle, the loop sleeps: no periodic wake-up.
    //
    // A turn costs what the devices with work cost, not what all devices
    // do (issue 16): it visits the devices that were polling or had
    // control left (active_), those woken by the engine (shared_.woken)
    // and those with an event, and times only connections stuck inside a
    // message (partial_).
    bool polling;
    uint64_t deadline = UINT64_MAX;
    {
      std::lock_guard<std::mutex> g(mu_);
      polling = !active_.empty() || !shared_.woken.empty();
      if (udp_) deadline = engine_->next_deadline();
      // A connection stuck mid-message is closed when its time is up.
      for (const auto& [at, id] : shared_.rechecks) deadline = std::min(deadline, at);
      for (unsigned id : partial_)
        deadline = std::min<uint64_t>(
            deadline, conns_.at(id).partial_since_ns + uint64_t(d_.o_.vhost_timeout_ms) * 1'000'000ull);
    }
    timespec ts{}, *timeout = nullptr;  // nullptr: until an event
    if (polling || (udp_ && engine_more)) {
      timeout = &ts;
    } else if (deadline != UINT64_MAX) {
      const uint64_t now = clock_.now_ns();
      const uint64_t wait = deadline > now ? deadline - now : 0;
      ts.tv_sec = time_t(wait / 1'000'000'000ull);
      ts.tv_nsec = long(wait % 1'000'000'000ull);
      timeout = &ts;
    }
    wakeups.fetch_add(1, std::memory_order_relaxed);
    int n = epoll_pwait2(epfd_, evs, 64, timeout, nullptr);
    if (n < 0 && errno != EINTR) {
      Log("epoll_wait: %s", std::strerror(errno));
      return;
    }
    bool stats = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      // Each device gets its budgets anew each turn it is visited, however
      // often it is kicked: round robin across devices, one budget each.
      turn_++;
      visit_.clear();
      for (unsigned id : active_) Visit(id);
      std::vector<unsigned> woken;
      woken.swap(shared_.woken);
      for (unsigned id : woken) Visit(id);
      for (int i = 0; i < n; i++) {
        const uint64_t tok = evs[i].data.u64;
        if (tok == kTokStop) return;
        if (tok == kTokStats) {
          uint64_t v;
          (void)!read(d_.statsfd_, &v, sizeof(v));
          stats = true;
          continue;
        }
        if (tok == kTokListen) {
          d_.Accept();
          continue;
        }
        if (tok == kTokInbox) {
          TakeInbox();
          continue;
        }
        if (tok == kTokUdp) {  // re-arm; PumpEngine below takes the datagrams
          uint64_t v;
          (void)!read(udp_->event_fd(), &v, sizeof(v));
          continue;
        }
        const unsigned id = unsigned(tok >> 16);
        const uint32_t q = uint32_t(tok & 0xffff);
        auto it = conns_.find(id);
        if (it == conns_.end()) continue;
        Visit(id);
        if (q == 0xffff) OnSocket(id);
        else it->second.dev->OnKick(q);
      }
      // Devices that went idle a moment ago look at their doorbells once
      // more (after this turn's kicks, so a kick that came is no miss).
      if (!shared_.rechecks.empty()) {
        const uint64_t now = clock_.now_ns();
        std::vector<std::pair<uint64_t, unsigned>> due;
        due.swap(shared_.rechecks);  // a recheck adds none: those not due go back
        for (const auto& r : due) {
          auto it = conns_.find(r.second);
          if (it == conns_.end()) continue;
          if (r.first > now) {
            shared_.rechecks.push_back(r);
            continue;
          }
          Visit(r.second);
          const uint64_t missed = it->second.dev->RecheckDataPath();
          if (missed && (missed & (missed - 1)) == 0)  // 1, 2, 4, ...: not a flood
            Log("device %u: %llu WQEs found by the look after going idle before a kick came for them "
                "(kicks late on a loaded host, or lost: a TCG guest needs -smp N,maxcpus>=2)",
                r.second, (unsigned long long)missed);
        }
      }
      CloseStalled();
      for (unsigned id : visit_) {
        auto it = conns_.find(id);
        if (it == conns_.end()) continue;
        it->second.dev->ContinueControl();
        it->second.dev->PollDataPath();
      }
      active_.clear();
      for (unsigned id : visit_) {
        auto it = conns_.find(id);
        if (it != conns_.end() && (it->second.dev->Polling() || it->second.dev->ControlPending()))
          active_.push_back(id);
      }
      engine_more = udp_ && PumpEngine();
    }
    // Outside this worker's lock: the stats take every worker's in turn.
    if (stats) d_.WriteStats();
  }
}

bool Daemon::Worker::PumpEngine() {
  Sink sink(d_, *this);
  udp_->poll(0, sink);
  const bool more = engine_->progress();
  // The engine's watchdog (EngineStats::stalled_qps): a QP owing work
  // that nothing will move. Said once per episode, with its state.
  for (uint32_t qpn : engine_->take_stalled())
    Log("qp %u stalled: owes work, no progress for 10 RTOs, nothing armed: %s", qpn,
        engine_->describe_qp(qpn).c_str());
  for (const vstellar::AsyncEvent& e : engine_->take_async_events()) {
    for (auto& [id, c] : conns_) {
      if (c.dev->OwnsEvent(e)) c.dev->OnEngineEvent(e);
    }
  }
  return more;
}

// Worker 0, under its lock: each new connection goes to the worker with
// the fewest devices (the lowest index of those), so devices, and with
// them their QPs, spread over the workers as they come and go.
void Daemon::Accept() {
  for (;;) {
    // Non-blocking: no frontend can make the loop wait for its bytes.
    int s = accept4(lsock_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (s < 0) return;
    const unsigned id = next_id_++;
    Worker* pick = workers_[0].get();
    for (auto& w : workers_)
      if (w->devices.load(std::memory_order_relaxed) < pick->devices.load(std::memory_order_relaxed))
        pick = w.get();
    pick->devices.fetch_add(1, std::memory_order_relaxed);
    if (pick == workers_[0].get()) pick->AddConn(id, s);
    else pick->Adopt(id, s);
  }
}

// Under mu_: device `id` on connection `sock` joins this worker.
void Daemon::Worker::AddConn(unsigned id, int sock) {
  // Devices are created at run time, one per QEMU connection; the log
  // reports how long creating one takes (Stellar's point against SR-IOV).
  const auto t0 = std::chrono::steady_clock::now();
  Conn c;
  c.sock = sock;
  c.dev = std::make_unique<Device>(id, shared_);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = SockTok(id);
  epoll_ctl(epfd_, EPOLL_CTL_ADD, sock, &ev);
  conns_.emplace(id, std::move(c));
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  const DaemonOptions& o = d_.o_;
  if (o.threads > 1)
    Log("device %u: created in %.1f us on worker %u (pin=%s, translation=%s)", id, us, index_, ToString(o.pin),
        ToString(o.translation));
  else
    Log("device %u: created in %.1f us (pin=%s, translation=%s)", id, us, ToString(o.pin), ToString(o.translation));
}

// Reads what the socket holds without waiting: whole messages are handled
// (at most kMaxPerTurn, the rest next turn), a partial one is kept by the
// connection's MessageReader and timed (CloseStalled).
void Daemon::Worker::OnSocket(unsigned id) {
  constexpr int kMaxPerTurn = 16;
  for (int i = 0; i < kMaxPerTurn; i++) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;  // closed while handling a message
    Conn& c = it->second;
    Message m;
    std::string err;
    const MessageReader::Result r = c.reader.Read(c.sock, &m, &err);
    if (r == MessageReader::Result::kAgain) break;
    if (r != MessageReader::Result::kMessage) {
      Close(id, err.empty() ? "frontend closed" : err);
      return;
    }
    HandleMessage(id, std::move(m));
  }
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  if (!c.reader.partial()) {
    c.partial_since_ns = 0;
    partial_.erase(id);
  } else if (!c.partial_since_ns) {
    c.partial_since_ns = clock_.now_ns();
    partial_.insert(id);
  }
}

void Daemon::Worker::CloseStalled() {
  const uint64_t now = clock_.now_ns(), limit = uint64_t(d_.o_.vhost_timeout_ms) * 1'000'000ull;
  std::vector<unsigned> stalled;
  for (unsigned id : partial_)
    if (now - conns_.at(id).partial_since_ns >= limit) stalled.push_back(id);
  for (unsigned id : stalled) Close(id, "stalled inside a vhost-user message");
}

void Daemon::Worker::HandleMessage(unsigned id, Message&& m) {
  Conn& c = conns_.at(id);
  std::string err;
  const uint32_t req = m.hdr.request;
  // A message may close kick fds (SET_VRING_KICK replaces one, RESET_OWNER
  // drops them): take them out of epoll while they are still open. After
  // the close, a registration whose eventfd the frontend still holds could
  // not be removed any more and would wake the loop forever (issue 13).
  UnwatchKicks(c);
  Outcome out = c.dev->OnMessage(std::move(m));
  // A reply that does not fit the socket buffer (a frontend that does not
  // read its replies) fails with EAGAIN and closes the connection.
  if (out.reply && !WriteAll(c.sock, *out.reply, &err)) {
    Close(id, err);
    return;
  }
  if (!out.ok()) {
    Close(id, "request " + std::to_string(req) + " refused: " + out.error);
    return;
  }
  SyncKicks(id);
  // A queue that was started may already hold work.
  if (req == uint32_t(Request::kSetVringKick) || req == uint32_t(Request::kSetVringEnable))
    for (auto& [fd, q] : c.kicks) c.dev->OnKick(q);
}

void Daemon::Worker::UnwatchKicks(Conn& c) {
  for (auto& [fd, q] : c.kicks) epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  c.kicks.clear();
}

void Daemon::Worker::SyncKicks(unsigned id) {
  Conn& c = conns_.at(id);
  auto want = c.dev->KickFds();
  if (want == c.kicks) return;
  UnwatchKicks(c);
  for (auto& [fd, q] : want) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = KickTok(id, q);
    epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
  }
  c.kicks = std::move(want);
}

void Daemon::Worker::Close(unsigned id, const std::string& why) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  for (auto& [fd, q] : it->second.kicks) epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  epoll_ctl(epfd_, EPOLL_CTL_DEL, it->second.sock, nullptr);
  close(it->second.sock);
  const PvdmaStats s = it->second.dev->pvdma().stats();
  Log("device %u: destroyed (%s); %llu blocks pinned, %llu misses", id, why.c_str(),
      (unsigned long long)s.blocks_pinned, (unsigned long long)s.misses);
  partial_.erase(id);
  {
    std::lock_guard<std::mutex> g(d_.closed_mu_);
    d_.closed_.push_back(it->second.dev->stats());
    d_.closed_.back().closed = true;
    if (d_.closed_.size() > kMaxClosed) d_.closed_.erase(d_.closed_.begin());
  }
  conns_.erase(it);
  devices.fetch_sub(1, std::memory_order_relaxed);
}

void Daemon::Worker::CollectStats(std::vector<DeviceStats>* v) {
  for (auto& [id, c] : conns_) v->push_back(c.dev->stats());
}

// Under mu_: every QP's state, the engine's view and the data path's.
void Daemon::Worker::DescribeQps(std::vector<std::string>* out) {
  if (engine_)
    for (std::string& l : engine_->describe_qps()) out->push_back("worker=" + std::to_string(index_) + " " + l);
  for (auto& [id, c] : conns_)
    for (std::string& l : c.dev->Describe()) out->push_back(std::move(l));
}

std::vector<DeviceStats> Daemon::Stats() {
  std::vector<DeviceStats> v;
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> g(w->mu_);
    w->CollectStats(&v);
  }
  return v;
}

int Daemon::WorkerOf(unsigned id) {
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> g(w->mu_);
    if (w->HasDevice(id)) return int(w->index());
  }
  return -1;
}

uint64_t Daemon::wakeups() const {
  uint64_t n = 0;
  for (auto& w : workers_) n += w->wakeups.load(std::memory_order_relaxed);
  return n;
}

uint64_t Daemon::forwarded() const {
  uint64_t n = 0;
  for (auto& w : workers_) n += w->forwarded.load(std::memory_order_relaxed);
  return n;
}

// Each worker's lock in turn (never two at once): the devices, and the
// engines' counters summed.
std::string Daemon::StatsJson() {
  std::vector<DeviceStats> v;
  {
    std::lock_guard<std::mutex> g(closed_mu_);
    v = closed_;
  }
  AtcStats a;
  std::vector<std::string> qps;
  size_t atc_entries = 0;
  vstellar::EngineStats e;
  bool have_engine = false;
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> g(w->mu_);
    w->CollectStats(&v);
    w->DescribeQps(&qps);
    if (const Atc* atc = w->atc()) {
      AddAtcStats(&a, atc->stats());
      atc_entries += atc->capacity();
    }
    if (!o_.udp_port || !w->engine()) continue;
    const vstellar::EngineStats& s = w->engine()->stats();
    have_engine = true;
    e.tx_pkts += s.tx_pkts;
    e.rx_pkts += s.rx_pkts;
    e.tx_bytes += s.tx_bytes;
    e.rx_bytes += s.rx_bytes;
    e.retx_pkts += s.retx_pkts;
    e.timeouts += s.timeouts;
    e.acks_sent += s.acks_sent;
    e.ce_marks += s.ce_marks;
    e.ud_sent += s.ud_sent;
    e.ud_rcvd += s.ud_rcvd;
    e.ud_drops += s.ud_drops;
    e.stalled_qps += s.stalled_qps;
    e.spurious_timeouts += s.spurious_timeouts;
    e.read_gap_losses += s.read_gap_losses;
    e.paths_set_aside += s.paths_set_aside;
    e.held_notices_sent += s.held_notices_sent;
    e.held_resends += s.held_resends;
    e.early_reads += s.early_reads;
    e.paths.resize(std::max(e.paths.size(), s.paths.size()));
    for (size_t i = 0; i < s.paths.size(); i++) e.paths[i].tx_pkts += s.paths[i].tx_pkts;
  }
  std::string out = "{\"pin\":\"";
  out += ToString(o_.pin);
  out += "\",\"translation\":\"";
  out += ToString(o_.translation);
  char b[1024];
  std::snprintf(b, sizeof(b),
                "\",\"threads\":%zu,\"forwarded\":%llu,"
                "\"atc\":{\"entries\":%zu,\"lookups\":%llu,\"hits\":%llu,\"misses\":%llu,\"evictions\":%llu},"
                "\"devices\":[",
                workers_.size(), (unsigned long long)forwarded(), atc_entries, (unsigned long long)a.lookups,
                (unsigned long long)a.hits, (unsigned long long)a.misses, (unsigned long long)a.evictions);
  out += b;
  for (size_t i = 0; i < v.size(); i++) {
    const DeviceStats& d = v[i];
    const PvdmaStats& p = d.pvdma;
    std::snprintf(b, sizeof(b),
                  "%s{\"id\":%u,\"guest_bytes\":%llu,\"blocks_pinned\":%llu,\"bytes_pinned\":%llu,"
                  "\"misses\":%llu,\"hits\":%llu,\"faults\":%llu,\"lock_errors\":%llu,\"attach_ns\":%llu,"
                  "\"commands\":%llu,\"commands_failed\":%llu,\"fatal\":%s,\"qps\":%u,\"mrs\":%u,"
                  "\"wqes\":%llu,\"bad_wqes\":%llu,\"cqes\":%llu,\"memory\":%llu,\"memory_peak\":%llu,"
                  "\"memory_refused\":%llu,\"cq_notify_backlog\":%u,\"missed_kicks\":%llu,\"events\":%llu,"
                  "\"events_dropped\":%llu,\"events_merged\":%llu,\"closed\":%s}",
                  i ? "," : "", d.id, (unsigned long long)p.guest_bytes, (unsigned long long)p.blocks_pinned,
                  (unsigned long long)p.bytes_pinned, (unsigned long long)p.misses, (unsigned long long)p.hits,
                  (unsigned long long)p.faults, (unsigned long long)p.lock_errors,
                  (unsigned long long)p.attach_ns, (unsigned long long)d.commands,
                  (unsigned long long)d.commands_failed, d.fatal ? "true" : "false", d.qps, d.mrs,
                  (unsigned long long)d.wqes, (unsigned long long)d.bad_wqes, (unsigned long long)d.cqes,
                  (unsigned long long)d.memory, (unsigned long long)d.memory_peak,
                  (unsigned long long)d.memory_refused, d.cq_notify_backlog, (unsigned long long)d.missed_kicks,
                  (unsigned long long)d.events, (unsigned long long)d.events_dropped,
                  (unsigned long long)d.events_merged,
                  d.closed ? "true" : "false");
    out += b;
  }
  std::snprintf(b, sizeof(b), "],\"memory\":{\"limit\":%llu,\"device_limit\":%llu,\"used\":%llu,\"peak\":%llu,\"refused\":%llu}",
                (unsigned long long)memory_->limit(), (unsigned long long)o_.device_memory_limit,
                (unsigned long long)memory_->used(), (unsigned long long)memory_->peak(),
                (unsigned long long)memory_->refused());
  out += b;
  // The engines (summed over the workers): transport counters and, per
  // path, the packets sent, so a run shows how its traffic spread.
  if (have_engine) {
    std::snprintf(b, sizeof(b),
                  ",\"engine\":{\"tx_pkts\":%llu,\"rx_pkts\":%llu,\"tx_bytes\":%llu,\"rx_bytes\":%llu,"
                  "\"retx_pkts\":%llu,\"timeouts\":%llu,\"acks_sent\":%llu,\"ce_marks\":%llu,"
                  "\"ud_sent\":%llu,\"ud_rcvd\":%llu,\"ud_drops\":%llu,\"stalled_qps\":%llu,\"spurious_timeouts\":%llu,"
                  "\"paths_set_aside\":%llu,\"read_gap_losses\":%llu,\"held_notices_sent\":%llu,\"held_resends\":%llu,\"early_reads\":%llu,"
                  "\"path_tx_pkts\":[",
                  (unsigned long long)e.tx_pkts, (unsigned long long)e.rx_pkts, (unsigned long long)e.tx_bytes,
                  (unsigned long long)e.rx_bytes, (unsigned long long)e.retx_pkts, (unsigned long long)e.timeouts,
                  (unsigned long long)e.acks_sent, (unsigned long long)e.ce_marks, (unsigned long long)e.ud_sent,
                  (unsigned long long)e.ud_rcvd, (unsigned long long)e.ud_drops,
                  (unsigned long long)e.stalled_qps, (unsigned long long)e.spurious_timeouts,
                  (unsigned long long)e.paths_set_aside, (unsigned long long)e.read_gap_losses,
                  (unsigned long long)e.held_notices_sent,
                  (unsigned long long)e.held_resends, (unsigned long long)e.early_reads);
    out += b;
    for (size_t i = 0; i < e.paths.size(); i++) {
      out += i ? "," : "";
      out += std::to_string(e.paths[i].tx_pkts);
    }
    out += "]}";
  }
  // The per-QP state dump (vstellar-stat --qps): lines of key=value.
  out += ",\"qps\":[";
  for (size_t i = 0; i < qps.size(); i++) out += (i ? ",\"" : "\"") + qps[i] + "\"";
  out += "]";
  return out + "}\n";
}

void Daemon::WriteStats() {
  const std::string j = StatsJson();
  if (o_.stats_json.empty()) {
    std::fputs(j.c_str(), stderr);
    return;
  }
  const std::string tmp = o_.stats_json + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return;
  std::fputs(j.c_str(), f);
  std::fclose(f);
  std::rename(tmp.c_str(), o_.stats_json.c_str());
}

}  // namespace vstellard
