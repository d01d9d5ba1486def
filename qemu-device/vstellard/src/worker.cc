// One worker's event loop; see include/vstellard/worker.h.
#include "vstellard/worker.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include <vstellar/roce_wire.h>
#include <vstellar/udp_link.h>
#include <vstellar/wire.h>

#include "vstellard/stats_json.h"

namespace vstellard {

namespace {
constexpr uint64_t kTokStop = ~0ull - 1, kTokStats = ~0ull - 2, kTokUdp = ~0ull - 3,
                   kTokInbox = ~0ull - 4, kTokTrace = ~0ull - 5;
// Per connection: token = id << 16 | 0xffff for its socket, id << 16 | q for a kick.
// Listening socket i (the default one, then each --device socket).
constexpr size_t kMaxListeners = DaemonOptions::kMaxDeviceSockets;
constexpr uint64_t ListenTok(size_t i) { return ~0ull - 16 - i; }
// A thread that did not run, or a turn that ran, this long is logged.
constexpr uint64_t kLongStallNs = 100'000'000;
uint64_t SockTok(unsigned id) { return uint64_t(id) << 16 | 0xffff; }
uint64_t KickTok(unsigned id, uint32_t q) { return uint64_t(id) << 16 | q; }

void Log(const char* fmt, auto... args) {
  std::fprintf(stderr, "vstellard: ");
  std::fprintf(stderr, fmt, args...);
  std::fputc('\n', stderr);
}

void WakeEventfd(int fd) {
  uint64_t one = 1;
  (void)!write(fd, &one, sizeof(one));
}

void DrainEventfd(int fd) {
  uint64_t v;
  (void)!read(fd, &v, sizeof(v));
}

// No network: packets are dropped (control-path-only daemons and tests).
class NullLink final : public vstellar::Link {
 public:
  void send(uint16_t, const vstellar::IpAddr&, const vstellar::Endpoint&, const uint8_t*, size_t,
            const vstellar::HostSpan*, size_t) override {}
  void flush() override {}
};
}  // namespace

// Datagrams from the link into the engine. With several workers, a
// datagram for another worker's QP (one that came inside a GSO buffer
// steered by its first datagram, or for QP 1 of a GID another worker's
// device holds) goes to that worker's inbox. Which worker owns it the
// engine reads from the bytes (wire::route_key).
class Worker::DatagramRouter final : public vstellar::RxSink {
 public:
  explicit DatagramRouter(Worker& w)
      : w_(w),
        workers_(*w.env_.workers),
        moved_(w.env_.placement ? w.env_.placement->Snapshot() : nullptr) {}
  void on_datagram(const uint8_t* data, size_t n, const vstellar::Endpoint& from, const vstellar::IpAddr& to,
                   bool ce) override {
    if (workers_.size() > 1) {
      const int owner = Owner(data, n);
      if (owner >= 0 && unsigned(owner) != w_.index()) {
        workers_[size_t(owner)]->Forward(data, n, from, to, ce);
        w_.forwarded.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    w_.engine_->receive(data, n, from, to, ce);
  }

 private:
  // The worker whose engine owns the datagram's destination, or -1 (this
  // one: it has a copy of its own, or the engine drops it).
  int Owner(const uint8_t* data, size_t n) const {
    using Kind = vstellar::wire::RouteKey::Kind;
    const vstellar::wire::RouteKey key = vstellar::wire::route_key(data, n, w_.o_.integrity);
    switch (key.kind) {
      case Kind::kQpn: {
        // A QP of a device that moved to its peers' worker (Placement).
        if (moved_ && !moved_->empty()) {
          auto it = moved_->find(key.dst_qpn);
          if (it != moved_->end()) return int(it->second);
        }
        return int(key.dst_qpn % workers_.size());
      }
      case Kind::kGsi: return w_.env_.gids->WorkerOf(key.dgid);
      case Kind::kMulticast: return -1;  // every worker's multicast socket got its own copy
      case Kind::kAny: return -1;
    }
    return -1;
  }
  Worker& w_;
  const std::vector<std::unique_ptr<Worker>>& workers_;
  std::shared_ptr<const Placement::Moved> moved_;  // as it was when this turn's pass began
};

Worker::Worker(const WorkerEnv& env, unsigned index)
    : env_(env),
      o_(*env.options),
      index_(index),
      stopfd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      inboxfd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

void Worker::TearDown() {
  std::lock_guard<std::mutex> g(mu);
  // Devices still on their way here are taken in, so that they are
  // destroyed like the others, through this engine; from here on no
  // worker sends one (MoveOut looks at torn_down_ under decide_mu, as a
  // worker may still be in its last turn while this one goes).
  std::vector<Arrival> arrivals;
  {
    std::unique_lock<std::mutex> decide;
    if (env_.placement) decide = std::unique_lock<std::mutex>(env_.placement->decide_mu);
    torn_down_ = true;
    std::lock_guard<std::mutex> l(inbox_mu_);
    arrivals.swap(arrivals_);
  }
  if (engine_)
    for (Arrival& a : arrivals) MoveIn(std::move(a), false);
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

Worker::~Worker() {
  TearDown();
  for (const NewConn& c : new_conns_) close(c.sock);
  for (int fd : {epfd_, stopfd_, inboxfd_})
    if (fd >= 0) close(fd);
}

void Worker::Stop() { WakeEventfd(stopfd_); }

bool Worker::Start(std::string* err) {
  if (!StartLink(err) || !StartEngine(err)) return false;
  StartLocator();
  ShareWithDevices();
  return StartEpoll(err);
}

// The UDP link on the engine's ports, or none without --udp-port.
bool Worker::StartLink(std::string* err) {
  if (!o_.udp_port) {
    link_ = std::make_unique<NullLink>();
    return true;
  }
  vstellar::UdpLinkConfig lc;
  // One address: bound to it. Several devices' own: the wildcard, and each
  // QP names its source.
  lc.local = o_.serves_many_addresses() ? vstellar::IpAddr() : o_.ip;
  lc.base_port = o_.udp_port;
  lc.num_paths = o_.paths;
  lc.mode = o_.link_mode;
  lc.zerocopy = o_.zerocopy;
  lc.mcast_port = uint16_t((o_.peer_port ? o_.peer_port : o_.udp_port) + DeviceShared::kMcastPortOffset);
  if (!o_.roce_peers.empty()) lc.roce_port = vstellar::roce::kUdpPort;
  if (o_.threads > 1) {
    lc.shards = uint16_t(o_.threads);
    lc.shard = uint16_t(index_);
    lc.shard_qpn_offset = uint16_t(vstellar::wire::dst_qpn_offset(o_.integrity));
  }
  auto udp = std::make_unique<vstellar::UdpLink>(lc);
  if (!udp->ok()) {
    *err = "udp link: " + udp->error();
    return false;
  }
  udp_ = udp.get();
  link_ = std::move(udp);
  return true;
}

bool Worker::StartEngine(std::string* err) {
  const unsigned n = o_.threads;
  vstellar::EngineConfig ec;
  ec.num_paths = o_.paths;
  ec.path_burst = o_.path_burst;
  ec.lkeys_at_post = true;  // a WQE with a bad lkey fails at once (design.md, data-path rules)
  ec.integrity = o_.integrity;
  ec.integrity_key = o_.integrity_key;
  ec.integrity_alg = o_.integrity_alg;
  ec.qpn_shards = n;  // this worker's QPNs are index_ mod n: the steering key
  ec.qpn_shard = index_;
  ec.roce.peers = o_.roce_peers;
  ec.roce.src_port = vstellar::roce::kUdpPort;  // the link's RoCE socket sends them
  ec.roce.local = o_.serves_many_addresses() ? vstellar::IpAddr() : o_.ip;
  if (!ec.validate()) {
    // The one check a valid command line can fail: GMAC on a CPU without
    // AES-NI or PCLMUL (integrity.h).
    *err = ec.integrity && ec.integrity_alg == vstellar::EngineConfig::MacAlgorithm::AES_GMAC
               ? "--integrity-alg aes-gmac: this CPU lacks AES-NI or PCLMUL"
               : "bad engine configuration";
    return false;
  }
  engine_ = std::make_unique<vstellar::Engine>(ec, *link_, clock_);
  // A message that finds no receive WQE: its device looks at its RQ (or
  // SRQ) doorbell once more before the engine drops it or answers RNR.
  // Only this worker's engine calls it, under mu (PumpEngine).
  if (n > 1 && env_.place_by_peers)
    shared_.connected = [this](unsigned device) { to_place_.push_back({device, false}); };
  engine_->set_recv_refill([this](vstellar::Qp& qp, uint64_t owner) {
    auto it = conns_.find(unsigned(owner));
    if (it != conns_.end()) it->second.dev->RefillRecv(qp.qpn());
  });
  // The ATC's entries are split among the workers (each device is on one).
  atc_ = std::make_unique<Atc>(std::max<size_t>(1, o_.atc_entries / n), o_.atc_miss_ns);
  return true;
}

// What every device of this worker shares (DeviceShared).
void Worker::ShareWithDevices() {
  shared_.engine = engine_.get();
  shared_.atc = atc_.get();
  shared_.worker = index_;
  shared_.pin = o_.pin;
  shared_.translation = o_.translation;
  shared_.odp_fault_timeout_ns = o_.odp_fault_timeout_ms * 1'000'000;
  shared_.poll_ns = o_.poll_us * 1000;
  shared_.recheck_ns = o_.idle_recheck_us * 1000;
  shared_.control_budget = o_.control_budget ? o_.control_budget : 1;
  shared_.wqe_budget_queue = o_.wqe_budget_queue ? o_.wqe_budget_queue : 1;
  shared_.wqe_budget_device = o_.wqe_budget_device ? o_.wqe_budget_device : 1;
  shared_.peer_port = o_.peer_port ? o_.peer_port : (o_.udp_port ? o_.udp_port : 47000);
  shared_.link_serves_many_addresses = o_.udp_port && o_.serves_many_addresses();
  shared_.require_sealed_memory = o_.require_sealed_memory;
  shared_.memory = env_.memory;
  shared_.device_memory_limit = o_.device_memory_limit;
  shared_.mcast_groups_per_device = o_.mcast_groups_per_device;
  shared_.mcast_qps_per_group = o_.mcast_qps_per_group;
  shared_.device_config = env_.device_config;
  shared_.gids = env_.gids;
  SetHooks();
}

bool Worker::StartEpoll(std::string* err) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0 || stopfd_ < 0 || inboxfd_ < 0) {
    *err = std::string("epoll/eventfd: ") + std::strerror(errno);
    return false;
  }
  std::vector<std::pair<int, uint64_t>> fds = {{stopfd_, kTokStop}, {inboxfd_, kTokInbox}};
  if (index_ == 0) {
    fds.emplace_back(env_.stats_fd, kTokStats);
    for (size_t i = 0; i < env_.listen_fds.size(); i++) fds.emplace_back(env_.listen_fds[i], ListenTok(i));
  }
  if (udp_) fds.emplace_back(udp_->event_fd(), kTokUdp);  // a datagram or a send completion
  // A router's answer to a path probe: read at once, so its RTT is the network's.
  if (tracer_ && tracer_->fd() >= 0) fds.emplace_back(tracer_->fd(), kTokTrace);
  for (auto [fd, tok] : fds) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tok;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
  }
  return true;
}

void Worker::SetHooks() {
  shared_.after_copy = env_.after_copy;
  shared_.after_wqe_copy = env_.after_wqe_copy;
}

void Worker::Adopt(unsigned id, int sock, size_t listener) {
  {
    std::lock_guard<std::mutex> g(inbox_mu_);
    new_conns_.push_back(NewConn{id, sock, listener});
  }
  WakeEventfd(inboxfd_);
}

void Worker::Forward(const uint8_t* data, size_t len, const vstellar::Endpoint& from, const vstellar::IpAddr& to,
                     bool ce) {
  bool first;
  {
    std::lock_guard<std::mutex> g(inbox_mu_);
    first = datagrams_.empty();
    datagrams_.push_back(Datagram{std::vector<uint8_t>(data, data + len), from, to, ce});
  }
  if (first) WakeEventfd(inboxfd_);
}

void Worker::Arrive(Arrival&& a) {
  devices.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> g(inbox_mu_);
    arrivals_.push_back(std::move(a));
  }
  WakeEventfd(inboxfd_);
}

void Worker::AskToPlace(uint32_t qpn) {
  {
    std::lock_guard<std::mutex> g(inbox_mu_);
    asked_to_place_.push_back(qpn);
  }
  WakeEventfd(inboxfd_);
}

void Worker::GiveBack(vstellar::ReturnedIds ids) {
  {
    std::lock_guard<std::mutex> g(inbox_mu_);
    given_back_.push_back(std::move(ids));
  }
  WakeEventfd(inboxfd_);
}

// New connections, devices moving here, numbers coming home and passed-on
// datagrams from other threads. Devices first: datagrams for their QPs
// that reached their old worker were passed on after them.
void Worker::TakeInbox() {
  DrainEventfd(inboxfd_);
  std::vector<NewConn> conns;
  std::vector<Datagram> dgrams;
  std::vector<Arrival> arrivals;
  std::vector<vstellar::ReturnedIds> back;
  std::vector<uint32_t> asked;
  {
    std::lock_guard<std::mutex> g(inbox_mu_);
    asked.swap(asked_to_place_);
    conns.swap(new_conns_);
    dgrams.swap(datagrams_);
    arrivals.swap(arrivals_);
    back.swap(given_back_);
  }
  for (const NewConn& c : conns) AddConn(c.id, c.sock, c.listener);
  for (Arrival& a : arrivals) MoveIn(std::move(a), true);
  if (!arrivals.empty()) Steer();
  for (const vstellar::ReturnedIds& ids : back) engine_->ids_returned(ids);
  for (uint32_t qpn : asked)
    for (auto& [id, c] : conns_)
      if (c.dev->OwnsQp(qpn)) to_place_.push_back({id, true});
  for (const Datagram& dg : dgrams) engine_->receive(dg.bytes.data(), dg.bytes.size(), dg.from, dg.to, dg.ce);
}

// ---------------------------------------------------------------- placement
//
// Two devices of one daemon whose QPs are connected to each other belong
// on one worker: across two, every packet and every ACK is handed from
// one thread to the other (a wake-up each), and two threads do less than
// one. So when a device's RC or UC QP gets its peer (RTR), the device
// moves to the worker that serves most of its peers on this daemon, if
// that is not its own. It moves whole (its vhost-user connection, kick
// fds, data path and engine objects: Engine::detach/attach), at the end
// of a loop turn, with its packets in flight: nothing is quiesced, and
// its QPs keep their numbers (Placement tells where they are now; the
// kernel's steering program lists them). Peers on other daemons do not
// vote: their traffic arrives on whichever worker anyway.

bool Worker::LocalPeer(const vstellar::Endpoint& ep) const {
  if (ep.port != (o_.udp_port ? o_.udp_port : shared_.peer_port)) return false;
  if (!o_.serves_many_addresses()) return ep.ip == o_.ip;
  for (const auto& list : env_.listener_addresses)
    if (std::find(list.begin(), list.end(), ep.ip) != list.end()) return true;
  return false;
}

void Worker::Place() {
  if (to_place_.empty()) return;
  std::vector<ToPlace> todo;
  todo.swap(to_place_);
  Placement& pl = *env_.placement;
  const auto& workers = *env_.workers;
  std::lock_guard<std::mutex> decide(pl.decide_mu);
  for (const ToPlace& t : todo) {
    auto it = conns_.find(t.id);
    if (it == conns_.end()) continue;
    Device& dev = *it->second.dev;
    std::vector<unsigned> votes(pl.workers());
    const auto peers = dev.ConnectedPeers();
    for (const auto& [ep, qpn] : peers)
      if (LocalPeer(ep)) votes[pl.WorkerOf(qpn)]++;
    unsigned best = index_;
    for (unsigned k = 0; k < votes.size(); k++)
      if (votes[k] > votes[best]) best = k;
    if (best == index_) continue;
    const std::string why = dev.Unmovable();
    if (!why.empty()) {
      if (unmovable_logged_.insert(t.id).second)
        Log("device %u: stays on worker %u, away from its peers on worker %u: %s", t.id, index_, best, why.c_str());
      continue;
    }
    // Pairs meet on the less busy of their two workers, so that devices
    // placed by peers still spread over the threads: towards a busier
    // worker, the peers there are asked to come here instead (and, asked,
    // they move without asking back).
    if (!t.asked && workers[best]->devices.load(std::memory_order_relaxed) >
                        devices.load(std::memory_order_relaxed)) {
      for (const auto& [ep, qpn] : peers)
        if (LocalPeer(ep) && pl.WorkerOf(qpn) == best) workers[best]->AskToPlace(qpn);
      continue;
    }
    MoveOut(t.id, best);
  }
}

// Under mu and Placement::decide_mu: device `id` leaves for worker `to`.
void Worker::MoveOut(unsigned id, unsigned to) {
  if ((*env_.workers)[to]->torn_down_) return;  // the daemon is going down
  Conn& c = conns_.at(id);
  Arrival a;
  if (int e = engine_->detach(c.dev->EngineObjects(), &a.objs)) {
    Log("device %u: cannot move to worker %u: its engine objects: %s", id, to, std::strerror(e));
    return;
  }
  const std::vector<uint32_t> qpns = c.dev->Qpns();
  UnwatchKicks(c);
  epoll_ctl(epfd_, EPOLL_CTL_DEL, c.sock, nullptr);
  partial_.erase(id);
  auto drop = [id](std::vector<unsigned>& v) { v.erase(std::remove(v.begin(), v.end(), id), v.end()); };
  drop(active_);
  drop(visit_);
  drop(shared_.woken);
  shared_.rechecks.erase(std::remove_if(shared_.rechecks.begin(), shared_.rechecks.end(),
                                        [id](const auto& r) { return r.second == id; }),
                         shared_.rechecks.end());
  env_.gids->MoveHolder(c.dev->GidHolder(), to);
  a.id = id;
  a.conn = std::move(c);
  conns_.erase(id);
  devices.fetch_sub(1, std::memory_order_relaxed);
  // The table first: from here on this worker's router passes the QPs'
  // datagrams to `to`, behind the arrival in its inbox.
  env_.placement->Move(qpns, to);
  env_.placement->moves++;
  (*env_.workers)[to]->Arrive(std::move(a));
  Log("device %u: moved from worker %u to worker %u, where its peers are (%zu QPs)", id, index_, to, qpns.size());
}

// Under mu: device a.id joins this worker. `serving`: the loop runs (not
// the teardown), so the device's fds join this epoll and it is visited.
void Worker::MoveIn(Arrival&& a, bool serving) {
  if (int e = engine_->attach(&a.objs)) {
    // Engines of one daemon have one shape; this is a bug, not a guest's
    // doing. The objects stay with the arrival and die with it.
    Log("device %u: cannot take its engine objects on worker %u (%s): closing it", a.id, index_, std::strerror(e));
    close(a.conn.sock);
    devices.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  const unsigned id = a.id;
  Conn& c = conns_.emplace(id, std::move(a.conn)).first->second;
  c.dev->Rebind(shared_);
  if (!serving) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = SockTok(id);
  epoll_ctl(epfd_, EPOLL_CTL_ADD, c.sock, &ev);
  c.kicks.clear();
  SyncKicks(id);  // an eventfd kicked on the way is readable, and epoll says so
  if (c.reader.partial()) partial_.insert(id);
  Visit(id);
  // Its doorbells are looked at once more: a WQE published while it moved.
  shared_.rechecks.emplace_back(clock_.now_ns(), id);
}

// The kernel's steering program, from the table as it is now. Under
// decide_mu, so that two workers' programs never replace a newer one
// with an older.
void Worker::Steer() {
  if (!udp_ || !env_.placement) return;
  std::lock_guard<std::mutex> decide(env_.placement->decide_mu);
  std::string err;
  if (!udp_->steer(env_.placement->Exceptions(), &err)) Log("steering moved QPs: %s", err.c_str());
}

// QPNs and keys of other workers' shards whose objects died here go home.
void Worker::ReturnIds() {
  vstellar::ReturnedIds ids = engine_->take_returned_ids();
  if (ids.empty()) return;
  if (env_.placement && !ids.qpns.empty()) {
    env_.placement->Forget(ids.qpns);
    Steer();  // the kernel's list too
  }
  const size_t n = env_.workers->size();
  std::vector<vstellar::ReturnedIds> home(n);
  for (uint32_t q : ids.qpns) home[q % n].qpns.push_back(q);
  for (uint32_t k : ids.key_indices) home[k % n].key_indices.push_back(k);
  for (size_t w = 0; w < n; w++)
    if (!home[w].empty()) (*env_.workers)[w]->GiveBack(std::move(home[w]));
}

// Marks a device as worked on in this turn: it gets its budgets anew
// (DeviceShared), and the end of the turn continues its control queue and
// polls its data path.
void Worker::Visit(unsigned id) {
  auto it = conns_.find(id);
  if (it == conns_.end() || it->second.turn == turn_) return;
  it->second.turn = turn_;
  it->second.dev->BeginTurn();
  visit_.push_back(id);
}

// The engine's timers (RTO, delayed ACKs) are the epoll timeout, to the
// nanosecond (epoll_pwait2); datagrams wake the loop through the UDP
// link's eventfd. A device that polls its doorbells (kicked, or work less
// than poll_ns ago), one with control requests left over from the last
// turn's budget, and an engine with work left keep the loop from
// sleeping; an idle device has set need_kick and waits for its kick
// eventfd. Idle, the loop sleeps: no periodic wake-up.
//
// A turn costs what the devices with work cost, not what all devices do,
// so that many idle guests do not slow the busy ones: it visits the
// devices that were polling or had control left (active_), those woken by
// the engine (shared_.woken) and those with an event, and times only
// connections stuck inside a message (partial_).
void Worker::Run() {
  epoll_event evs[64];
  bool engine_more = false;
  for (;;) {
    timespec ts{};
    timespec* timeout = NextTimeout(engine_more, &ts);
    const uint64_t slept = clock_.now_ns();
    const uint64_t until = timeout ? slept + uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec) : 0;
    wakeups.fetch_add(1, std::memory_order_relaxed);
    int n = epoll_pwait2(epfd_, evs, 64, timeout, nullptr);
    if (n < 0 && errno != EINTR) {
      Log("epoll_wait: %s", std::strerror(errno));
      return;
    }
    // A loaded host may not run this thread for a long time; the engine
    // forgives its QPs that time (late_passes), and the log says how long,
    // so that a peer's retry limit reached meanwhile is explained.
    const uint64_t woke = clock_.now_ns();
    if (timeout && woke > until + kLongStallNs)
      Log("woke %llu ms after its deadline (the host did not run this thread)",
          (unsigned long long)((woke - until) / 1'000'000));
    bool stats = false;
    {
      std::lock_guard<std::mutex> g(mu);
      BeginTurn();
      if (!HandleEvents(evs, n, &stats)) return;
      RecheckIdleDevices();
      CloseStalled();
      engine_more = EndTurn();
    }
    if (const uint64_t took = clock_.now_ns() - woke; took > kLongStallNs)
      Log("a turn took %llu ms (%d events)", (unsigned long long)(took / 1'000'000), n);
    // Outside this worker's lock: the stats take every worker's in turn.
    if (stats) env_.write_stats();
  }
}

// How long the next epoll wait may sleep: not at all while there is work,
// else until the first timer (the engine's, an idle device's second look,
// a stalled connection's time), nullptr for until an event.
timespec* Worker::NextTimeout(bool engine_more, timespec* ts) {
  bool polling;
  uint64_t deadline = UINT64_MAX;
  {
    std::lock_guard<std::mutex> g(mu);
    polling = !active_.empty() || !shared_.woken.empty();
    if (udp_) deadline = engine_->next_deadline();
    if (locator_) deadline = std::min(deadline, next_locate_ns_);
    for (const auto& [at, id] : shared_.rechecks) deadline = std::min(deadline, at);
    // A connection stuck mid-message is closed when its time is up.
    for (unsigned id : partial_) deadline = std::min(deadline, conns_.at(id).partial_since_ns + StallLimitNs());
  }
  if (polling || (udp_ && engine_more)) return ts;  // zero: a look, no sleep
  if (deadline == UINT64_MAX) return nullptr;
  const uint64_t now = clock_.now_ns();
  const uint64_t wait = deadline > now ? deadline - now : 0;
  ts->tv_sec = time_t(wait / 1'000'000'000ull);
  ts->tv_nsec = long(wait % 1'000'000'000ull);
  return ts;
}

// Each device gets its budgets anew each turn it is visited, however often
// it is kicked: round robin across devices, one budget each.
void Worker::BeginTurn() {
  turn_++;
  visit_.clear();
  for (unsigned id : active_) Visit(id);
  std::vector<unsigned> woken;
  woken.swap(shared_.woken);
  for (unsigned id : woken) Visit(id);
}

bool Worker::HandleEvents(const epoll_event* evs, int n, bool* stats) {
  for (int i = 0; i < n; i++) {
    const uint64_t tok = evs[i].data.u64;
    if (tok == kTokStop) return false;
    if (tok == kTokStats) {
      DrainEventfd(env_.stats_fd);
      *stats = true;
      continue;
    }
    if (tok >= ListenTok(kMaxListeners - 1) && tok <= ListenTok(0)) {
      env_.accept(size_t(ListenTok(0) - tok));
      continue;
    }
    if (tok == kTokInbox) {
      TakeInbox();
      continue;
    }
    if (tok == kTokUdp) {  // re-arm; PumpEngine takes the datagrams
      DrainEventfd(udp_->event_fd());
      continue;
    }
    if (tok == kTokTrace) {  // PumpEngine reads the answers
      trace_ready_ = true;
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
  return true;
}

// Devices that went idle a moment ago look at their doorbells once more
// (after this turn's kicks, so a kick that came is no miss).
void Worker::RecheckIdleDevices() {
  if (shared_.rechecks.empty()) return;
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

// The visited devices continue their control queues and poll their data
// paths; those still polling or with control left are next turn's active
// ones. Then the engine takes the datagrams and moves.
bool Worker::EndTurn() {
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
  const bool more = udp_ && PumpEngine();
  if (env_.placement) {
    Place();
    ReturnIds();
  }
  return more;
}

bool Worker::PumpEngine() {
  DatagramRouter router(*this);
  udp_->poll(0, router);
  const bool more = engine_->progress();
  if (locator_) Locate();
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

// The path tracer sends from the engine's address; a daemon serving
// several (each device its own) has none to trace from, and its locator
// works at path granularity (docs/fabric.md, "Failure localization").
void Worker::StartLocator() {
  if (!o_.locate_faults || !udp_) return;
  const vstellar::IpAddr local = o_.serves_many_addresses() ? vstellar::IpAddr() : o_.ip;
  tracer_ = std::make_unique<vstellar::telemetry::PathTracer>(local, o_.udp_port, o_.paths);
  if (!tracer_->ok()) Log("fault localization: no routes, faults per peer only: %s", tracer_->error().c_str());
  locator_ = std::make_unique<vstellar::telemetry::FaultLocator>(vstellar::telemetry::LocatorConfig{}, local,
                                                                 *tracer_);
}

void Worker::Locate() {
  const uint64_t now = clock_.now_ns();
  // Only when epoll said an answer waits, or at a tick: not a syscall per turn.
  if (trace_ready_ || now >= next_locate_ns_) {
    trace_ready_ = false;
    tracer_->poll(now, [&](const vstellar::telemetry::HopReply& r) { locator_->on_reply(r); });
  }
  if (now < next_locate_ns_) return;
  next_locate_ns_ = now + vstellar::telemetry::LocatorConfig{}.tick_ns;
  locator_->tick(now, *engine_);
  for (const std::string& line : locator_->take_log()) Log("%s", line.c_str());
}

// Under mu: device `id` on connection `sock` joins this worker.
void Worker::AddConn(unsigned id, int sock, size_t listener) {
  // Devices are created at run time, one per QEMU connection; the log
  // reports how long creating one takes (Stellar's point against SR-IOV).
  const auto t0 = std::chrono::steady_clock::now();
  Conn c;
  c.sock = sock;
  c.dev = std::make_unique<Device>(id, shared_, env_.listener_addresses.at(listener));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = SockTok(id);
  epoll_ctl(epfd_, EPOLL_CTL_ADD, sock, &ev);
  conns_.emplace(id, std::move(c));
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (o_.threads > 1)
    Log("device %u: created in %.1f us on worker %u (pin=%s, translation=%s)", id, us, index_, ToString(o_.pin),
        ToString(o_.translation));
  else
    Log("device %u: created in %.1f us (pin=%s, translation=%s)", id, us, ToString(o_.pin),
        ToString(o_.translation));
}

// Reads what the socket holds without waiting: whole messages are handled
// (at most kMaxPerTurn, the rest next turn), a partial one is kept by the
// connection's MessageReader and timed (CloseStalled).
void Worker::OnSocket(unsigned id) {
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

uint64_t Worker::StallLimitNs() const { return uint64_t(o_.vhost_timeout_ms) * 1'000'000ull; }

void Worker::CloseStalled() {
  const uint64_t now = clock_.now_ns(), limit = StallLimitNs();
  std::vector<unsigned> stalled;
  for (unsigned id : partial_)
    if (now - conns_.at(id).partial_since_ns >= limit) stalled.push_back(id);
  for (unsigned id : stalled) Close(id, "stalled inside a vhost-user message");
}

void Worker::HandleMessage(unsigned id, Message&& m) {
  Conn& c = conns_.at(id);
  std::string err;
  const uint32_t req = m.hdr.request;
  // A message may close kick fds (SET_VRING_KICK replaces one, RESET_OWNER
  // drops them): take them out of epoll while they are still open. After
  // the close, a registration whose eventfd the frontend still holds could
  // not be removed any more and would wake the loop forever.
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

void Worker::UnwatchKicks(Conn& c) {
  for (auto& [fd, q] : c.kicks) epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  c.kicks.clear();
}

void Worker::SyncKicks(unsigned id) {
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

void Worker::Close(unsigned id, const std::string& why) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  for (auto& [fd, q] : it->second.kicks) epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  epoll_ctl(epfd_, EPOLL_CTL_DEL, it->second.sock, nullptr);
  close(it->second.sock);
  const PvdmaStats s = it->second.dev->pvdma().stats();
  Log("device %u: destroyed (%s); %llu blocks pinned, %llu misses", id, why.c_str(),
      (unsigned long long)s.blocks_pinned, (unsigned long long)s.misses);
  partial_.erase(id);
  DeviceStats last = it->second.dev->stats();
  last.closed = true;
  env_.keep_closed(last);
  conns_.erase(it);
  devices.fetch_sub(1, std::memory_order_relaxed);
}

void Worker::CollectStats(std::vector<DeviceStats>* v) {
  for (auto& [id, c] : conns_) v->push_back(c.dev->stats());
}

// Every QP's state, the engine's view and the data path's.
void Worker::DescribeQps(std::vector<std::string>* out) {
  if (engine_)
    for (std::string& l : engine_->describe_qps()) out->push_back("worker=" + std::to_string(index_) + " " + l);
  for (auto& [id, c] : conns_)
    for (std::string& l : c.dev->Describe()) out->push_back(std::move(l));
}

void Worker::AddStats(DaemonStats* s) {
  CollectStats(&s->devices);
  DescribeQps(&s->qps);
  if (atc_) {
    AddAtcStats(&s->atc, atc_->stats());
    s->atc_entries += atc_->capacity();
  }
  if (!o_.udp_port || !engine_) return;
  s->have_engine = true;
  AddEngineStats(&s->engine, engine_->stats());
  if (locator_) {
    const double wall =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    const uint64_t now = clock_.now_ns();
    s->locating = true;
    s->faults.push_back(locator_->faults_json(wall, now, false));
    s->fault_history.push_back(locator_->faults_json(wall, now, true));
    const vstellar::telemetry::TracerStats& t = tracer_->stats();
    s->localization.push_back("\"worker\":" + std::to_string(index_) + "," + locator_->summary_json() +
                              ",\"tracer_ok\":" + (tracer_->ok() ? "true" : "false") +
                              ",\"probe_bytes\":" + std::to_string(t.probe_bytes));
  }
}

}  // namespace vstellard
