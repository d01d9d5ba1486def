// vstellard's event loop; see include/vstellard/daemon.h.
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
#include <tuple>

#include <vstellar/udp_link.h>

namespace vstellard {

namespace {
constexpr uint64_t kTokListen = ~0ull, kTokStop = ~0ull - 1, kTokStats = ~0ull - 2, kTokUdp = ~0ull - 3;
// Per connection: token = id << 16 | 0xffff for its socket, id << 16 | q for a kick.
uint64_t SockTok(unsigned id) { return uint64_t(id) << 16 | 0xffff; }
uint64_t KickTok(unsigned id, uint32_t q) { return uint64_t(id) << 16 | q; }

void Log(const char* fmt, auto... args) {
  std::fprintf(stderr, "vstellard: ");
  std::fprintf(stderr, fmt, args...);
  std::fputc('\n', stderr);
}
}  // namespace

const char* ToString(PinMode m) { return m == PinMode::kEager ? "eager" : "lazy"; }
const char* ToString(TranslationMode m) { return m == TranslationMode::kAtc ? "atc" : "emtt"; }

// No network: packets are dropped (control-path-only daemons and tests).
class Daemon::NullLink final : public vstellar::Link {
 public:
  void send(uint16_t, const vstellar::Endpoint&, const uint8_t*, size_t, const vstellar::HostSpan*, size_t) override {}
  void flush() override {}
};

class Daemon::Sink final : public vstellar::RxSink {
 public:
  explicit Sink(vstellar::Engine& e) : e_(e) {}
  void on_datagram(const uint8_t* d, size_t n, const vstellar::Endpoint& from, uint16_t, bool ce) override {
    e_.receive(d, n, from, ce);
  }

 private:
  vstellar::Engine& e_;
};

Daemon::Daemon(DaemonOptions o) : o_(std::move(o)) {}

Daemon::~Daemon() {
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& [id, c] : conns_) {
      c.dev.reset();
      if (c.sock >= 0) close(c.sock);
    }
    conns_.clear();
  }
  for (int fd : {epfd_, lsock_, stopfd_, statsfd_})
    if (fd >= 0) close(fd);
}

bool Daemon::Start(std::string* err) {
  if (o_.udp_port) {
    vstellar::UdpLinkConfig lc;
    lc.local_ip = o_.ip;
    lc.base_port = o_.udp_port;
    lc.num_paths = o_.paths;
    lc.mode = o_.link_mode;
    lc.zerocopy = o_.zerocopy;
    lc.mcast_port = uint16_t((o_.peer_port ? o_.peer_port : o_.udp_port) + DeviceShared::kMcastPortOffset);
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
  ec.num_paths = o_.paths;
  ec.path_burst = o_.path_burst;
  ec.lkeys_at_post = true;  // a WQE with a bad lkey fails at once (design.md, data-path rules)
  ec.integrity = o_.integrity;
  ec.integrity_key = o_.integrity_key;
  if (!ec.validate()) {
    *err = "bad engine configuration";
    return false;
  }
  engine_ = std::make_unique<vstellar::Engine>(ec, *link_, clock_);
  atc_ = std::make_unique<Atc>(o_.atc_entries, o_.atc_miss_ns);
  shared_.engine = engine_.get();
  shared_.atc = atc_.get();
  shared_.pin = o_.pin;
  shared_.translation = o_.translation;
  shared_.poll_ns = o_.poll_us * 1000;
  shared_.control_budget = o_.control_budget ? o_.control_budget : 1;
  shared_.wqe_budget_queue = o_.wqe_budget_queue ? o_.wqe_budget_queue : 1;
  shared_.wqe_budget_device = o_.wqe_budget_device ? o_.wqe_budget_device : 1;
  shared_.peer_port = o_.peer_port ? o_.peer_port : (o_.udp_port ? o_.udp_port : 47000);
  shared_.host_ip = o_.ip;
  shared_.require_sealed_memory = o_.require_sealed_memory;
  shared_.memory.set_limit(o_.memory_limit);
  shared_.device_memory_limit = o_.device_memory_limit;
  virtio_vstellar_config& dc = shared_.device_config.config;
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
  // The engine's sockets are bound to this one address, so it is the one
  // GID any device here can send from and be reached at.
  vstellar::Gid own{};
  own[10] = own[11] = 0xff;
  for (int i = 0; i < 4; i++) own[12 + i] = uint8_t(o_.ip >> (24 - 8 * i));
  shared_.served_gids.insert(own);

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
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  stopfd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  statsfd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epfd_ < 0 || stopfd_ < 0 || statsfd_ < 0) {
    *err = std::string("epoll/eventfd: ") + std::strerror(errno);
    return false;
  }
  std::vector<std::pair<int, uint64_t>> fds = {{lsock_, kTokListen}, {stopfd_, kTokStop}, {statsfd_, kTokStats}};
  if (udp_) fds.emplace_back(udp_->event_fd(), kTokUdp);  // a datagram or a send completion
  for (auto [fd, tok] : fds) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tok;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
  }
  return true;
}

void Daemon::Stop() {
  uint64_t one = 1;
  (void)!write(stopfd_, &one, sizeof(one));
}

void Daemon::RequestStats() {
  uint64_t one = 1;
  (void)!write(statsfd_, &one, sizeof(one));
}

// Marks a device as worked on in this turn: it gets its budgets anew
// (DeviceShared), and the end of the turn continues its control queue and
// polls its data path.
void Daemon::Visit(unsigned id) {
  auto it = conns_.find(id);
  if (it == conns_.end() || it->second.turn == turn_) return;
  it->second.turn = turn_;
  it->second.dev->BeginTurn();
  visit_.push_back(id);
}

void Daemon::Run() {
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
      for (unsigned id : partial_)
        deadline = std::min<uint64_t>(
            deadline, conns_.at(id).partial_since_ns + uint64_t(o_.vhost_timeout_ms) * 1'000'000ull);
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
    wakeups_.fetch_add(1, std::memory_order_relaxed);
    int n = epoll_pwait2(epfd_, evs, 64, timeout, nullptr);
    if (n < 0 && errno != EINTR) {
      Log("epoll_wait: %s", std::strerror(errno));
      return;
    }
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
      if (tok == kTokStop) {
        if (!o_.stats_json.empty()) WriteStats();
        return;
      }
      if (tok == kTokStats) {
        uint64_t v;
        (void)!read(statsfd_, &v, sizeof(v));
        WriteStats();
        continue;
      }
      if (tok == kTokListen) {
        Accept();
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
      if (it != conns_.end() && (it->second.dev->Polling() || it->second.dev->ControlPending())) active_.push_back(id);
    }
    engine_more = udp_ && PumpEngine();
  }
}

bool Daemon::PumpEngine() {
  Sink sink(*engine_);
  udp_->poll(0, sink);
  const bool more = engine_->progress();
  for (const vstellar::AsyncEvent& e : engine_->take_async_events()) {
    for (auto& [id, c] : conns_) {
      if (c.dev->OwnsEvent(e)) c.dev->OnEngineEvent(e);
    }
  }
  return more;
}

void Daemon::Accept() {
  for (;;) {
    // Non-blocking: no frontend can make the loop wait for its bytes.
    int s = accept4(lsock_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (s < 0) return;
    // Devices are created at run time, one per QEMU connection; the log
    // reports how long creating one takes (Stellar's point against SR-IOV).
    const auto t0 = std::chrono::steady_clock::now();
    const unsigned id = next_id_++;
    Conn c;
    c.sock = s;
    c.dev = std::make_unique<Device>(id, shared_);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = SockTok(id);
    epoll_ctl(epfd_, EPOLL_CTL_ADD, s, &ev);
    conns_.emplace(id, std::move(c));
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    Log("device %u: created in %.1f us (pin=%s, translation=%s)", id, us, ToString(o_.pin),
        ToString(o_.translation));
  }
}

// Reads what the socket holds without waiting: whole messages are handled
// (at most kMaxPerTurn, the rest next turn), a partial one is kept by the
// connection's MessageReader and timed (CloseStalled).
void Daemon::OnSocket(unsigned id) {
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

void Daemon::CloseStalled() {
  const uint64_t now = clock_.now_ns(), limit = uint64_t(o_.vhost_timeout_ms) * 1'000'000ull;
  std::vector<unsigned> stalled;
  for (unsigned id : partial_)
    if (now - conns_.at(id).partial_since_ns >= limit) stalled.push_back(id);
  for (unsigned id : stalled) Close(id, "stalled inside a vhost-user message");
}

void Daemon::HandleMessage(unsigned id, Message&& m) {
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

void Daemon::UnwatchKicks(Conn& c) {
  for (auto& [fd, q] : c.kicks) epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  c.kicks.clear();
}

void Daemon::SyncKicks(unsigned id) {
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

void Daemon::Close(unsigned id, const std::string& why) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  for (auto& [fd, q] : it->second.kicks) epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  epoll_ctl(epfd_, EPOLL_CTL_DEL, it->second.sock, nullptr);
  close(it->second.sock);
  const PvdmaStats s = it->second.dev->pvdma().stats();
  Log("device %u: destroyed (%s); %llu blocks pinned, %llu misses", id, why.c_str(),
      (unsigned long long)s.blocks_pinned, (unsigned long long)s.misses);
  partial_.erase(id);
  closed_.push_back(it->second.dev->stats());
  closed_.back().closed = true;
  if (closed_.size() > kMaxClosed) closed_.erase(closed_.begin());
  conns_.erase(it);
}

std::vector<DeviceStats> Daemon::Stats() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<DeviceStats> v;
  for (auto& [id, c] : conns_) v.push_back(c.dev->stats());
  return v;
}

AtcStats Daemon::atc_stats() {
  std::lock_guard<std::mutex> g(mu_);
  return atc_ ? atc_->stats() : AtcStats{};
}

std::string Daemon::StatsJson() {
  std::lock_guard<std::mutex> g(mu_);
  return StatsJsonLocked();
}

std::string Daemon::StatsJsonLocked() {
  std::vector<DeviceStats> v = closed_;
  AtcStats a;
  for (auto& [id, c] : conns_) v.push_back(c.dev->stats());
  if (atc_) a = atc_->stats();
  std::string out = "{\"pin\":\"";
  out += ToString(o_.pin);
  out += "\",\"translation\":\"";
  out += ToString(o_.translation);
  char b[512];
  std::snprintf(b, sizeof(b),
                "\",\"atc\":{\"entries\":%zu,\"lookups\":%llu,\"hits\":%llu,\"misses\":%llu,\"evictions\":%llu},"
                "\"devices\":[",
                atc_ ? atc_->capacity() : size_t(0), (unsigned long long)a.lookups, (unsigned long long)a.hits,
                (unsigned long long)a.misses, (unsigned long long)a.evictions);
  out += b;
  for (size_t i = 0; i < v.size(); i++) {
    const DeviceStats& d = v[i];
    const PvdmaStats& p = d.pvdma;
    std::snprintf(b, sizeof(b),
                  "%s{\"id\":%u,\"guest_bytes\":%llu,\"blocks_pinned\":%llu,\"bytes_pinned\":%llu,"
                  "\"misses\":%llu,\"hits\":%llu,\"faults\":%llu,\"lock_errors\":%llu,\"attach_ns\":%llu,"
                  "\"commands\":%llu,\"commands_failed\":%llu,\"fatal\":%s,\"qps\":%u,\"mrs\":%u,"
                  "\"wqes\":%llu,\"bad_wqes\":%llu,\"cqes\":%llu,\"memory\":%llu,\"memory_peak\":%llu,"
                  "\"memory_refused\":%llu,\"cq_notify_backlog\":%u,\"closed\":%s}",
                  i ? "," : "", d.id, (unsigned long long)p.guest_bytes, (unsigned long long)p.blocks_pinned,
                  (unsigned long long)p.bytes_pinned, (unsigned long long)p.misses, (unsigned long long)p.hits,
                  (unsigned long long)p.faults, (unsigned long long)p.lock_errors,
                  (unsigned long long)p.attach_ns, (unsigned long long)d.commands,
                  (unsigned long long)d.commands_failed, d.fatal ? "true" : "false", d.qps, d.mrs,
                  (unsigned long long)d.wqes, (unsigned long long)d.bad_wqes, (unsigned long long)d.cqes,
                  (unsigned long long)d.memory, (unsigned long long)d.memory_peak,
                  (unsigned long long)d.memory_refused, d.cq_notify_backlog, d.closed ? "true" : "false");
    out += b;
  }
  std::snprintf(b, sizeof(b), "],\"memory\":{\"limit\":%llu,\"device_limit\":%llu,\"used\":%llu,\"peak\":%llu,\"refused\":%llu}",
                (unsigned long long)shared_.memory.limit(), (unsigned long long)shared_.device_memory_limit,
                (unsigned long long)shared_.memory.used(), (unsigned long long)shared_.memory.peak(),
                (unsigned long long)shared_.memory.refused());
  out += b;
  // The engine (shared by all devices): transport counters and, per path,
  // the packets sent, so a run shows how its traffic spread.
  if (engine_) {
    const vstellar::EngineStats& e = engine_->stats();
    std::snprintf(b, sizeof(b),
                  ",\"engine\":{\"tx_pkts\":%llu,\"rx_pkts\":%llu,\"tx_bytes\":%llu,\"rx_bytes\":%llu,"
                  "\"retx_pkts\":%llu,\"timeouts\":%llu,\"acks_sent\":%llu,\"ce_marks\":%llu,"
                  "\"ud_sent\":%llu,\"ud_rcvd\":%llu,\"ud_drops\":%llu,\"path_tx_pkts\":[",
                  (unsigned long long)e.tx_pkts, (unsigned long long)e.rx_pkts, (unsigned long long)e.tx_bytes,
                  (unsigned long long)e.rx_bytes, (unsigned long long)e.retx_pkts, (unsigned long long)e.timeouts,
                  (unsigned long long)e.acks_sent, (unsigned long long)e.ce_marks, (unsigned long long)e.ud_sent,
                  (unsigned long long)e.ud_rcvd, (unsigned long long)e.ud_drops);
    out += b;
    for (size_t i = 0; i < e.paths.size(); i++) {
      out += i ? "," : "";
      out += std::to_string(e.paths[i].tx_pkts);
    }
    out += "]}";
  }
  return out + "}\n";
}

void Daemon::WriteStats() {
  const std::string j = StatsJsonLocked();
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
