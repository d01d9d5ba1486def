// vstellard's daemon: the listening socket, the workers (worker.cc) and
// what is read across them; see include/vstellard/daemon.h.
#include "vstellard/daemon.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <endian.h>

#include <cstring>
#include <future>
#include <tuple>

#include "vstellard/stats_json.h"

namespace vstellard {

const char* ToString(PinMode m) { return m == PinMode::kEager ? "eager" : "lazy"; }
const char* ToString(TranslationMode m) { return m == TranslationMode::kAtc ? "atc" : "emtt"; }

Daemon::Daemon(DaemonOptions o) : o_(std::move(o)) {
  env_.options = &o_;
  env_.workers = &workers_;
  if (o_.threads > 1) env_.placement = std::make_shared<Placement>(o_.threads);
  env_.place_by_peers = o_.place_by_peers;
  env_.accept = [this](size_t listener) { Accept(listener); };
  env_.write_stats = [this] { WriteStats(); };
  env_.keep_closed = [this](const DeviceStats& last) { KeepClosed(last); };
}

Daemon::~Daemon() {
  StopWorkers();
  workers_.clear();
  for (int fd : listen_fds_) close(fd);
  if (statsfd_ >= 0) close(statsfd_);
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

void Daemon::SetAfterCopyHook(std::function<void(unsigned)> f) {
  env_.after_copy = std::move(f);
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> g(w->mu);
    w->SetHooks();
  }
}

void Daemon::SetAfterWqeCopyHook(std::function<void(unsigned, uint32_t, bool, uint32_t)> f) {
  env_.after_wqe_copy = std::move(f);
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> g(w->mu);
    w->SetHooks();
  }
}

bool Daemon::Start(std::string* err) {
  if (o_.threads < 1 || o_.threads > DaemonOptions::kMaxThreads) {
    *err = "--threads must be 1.." + std::to_string(DaemonOptions::kMaxThreads);
    return false;
  }
  env_.memory = std::make_shared<MemoryBudget>(o_.memory_limit);
  if (!ApplyDeviceMax(err)) return false;
  return Listen(err) && StartWorkers(err);
}

// The device's limits as the options lower them (--device-max, the
// multicast quotas, the guest memory a table may declare).
bool Daemon::ApplyDeviceMax(std::string* err) {
  env_.device_config.max_guest_memory = o_.guest_memory_limit;
  virtio_vstellar_config& dc = env_.device_config.config;
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
  return true;
}

// The vhost-user sockets and the stats eventfd, which worker 0 watches:
// the default socket, whose devices may hold --ip, then each --device
// socket with its own addresses.
bool Daemon::Listen(std::string* err) {
  if (o_.socket.empty() && o_.device_sockets.empty()) {
    *err = "no vhost-user socket: give --socket or --device";
    return false;
  }
  if (o_.device_sockets.size() + 1 > DaemonOptions::kMaxDeviceSockets) {
    *err = "at most " + std::to_string(DaemonOptions::kMaxDeviceSockets - 1) + " --device sockets";
    return false;
  }
  if (!o_.socket.empty() && !ListenOn(o_.socket, {o_.ip}, err)) return false;
  for (const DaemonOptions::DeviceSocket& d : o_.device_sockets)
    if (!ListenOn(d.path, d.addresses, err)) return false;
  statsfd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (statsfd_ < 0) {
    *err = std::string("eventfd: ") + std::strerror(errno);
    return false;
  }
  env_.listen_fds = listen_fds_;
  env_.stats_fd = statsfd_;
  return true;
}

bool Daemon::ListenOn(const std::string& path, const std::vector<vstellar::IpAddr>& addresses, std::string* err) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    *err = "socket path too long: " + path;
    return false;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s >= 0) listen_fds_.push_back(s);
  unlink(path.c_str());
  if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0 || listen(s, 64) < 0) {
    *err = "cannot listen on " + path + ": " + std::strerror(errno);
    return false;
  }
  env_.listener_addresses.push_back(addresses);
  return true;
}

// Worker 0 on this thread; the others each on its own, one after the
// other (the k-th link to bind is socket k of the ports' group), each
// serving as soon as it is set up. All workers exist before any runs: a
// running one may hand a datagram to any other.
bool Daemon::StartWorkers(std::string* err) {
  for (unsigned k = 0; k < o_.threads; k++) workers_.push_back(std::make_unique<Worker>(env_, k));
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

// Worker 0, under its lock: each new connection goes to the worker with
// the fewest devices (the lowest index of those), so devices, and with
// them their QPs, spread over the workers as they come and go.
void Daemon::Accept(size_t listener) {
  for (;;) {
    // Non-blocking: no frontend can make the loop wait for its bytes.
    int s = accept4(listen_fds_.at(listener), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (s < 0) return;
    const unsigned id = next_id_++;
    Worker* pick = workers_[0].get();
    for (auto& w : workers_)
      if (w->devices.load(std::memory_order_relaxed) < pick->devices.load(std::memory_order_relaxed))
        pick = w.get();
    pick->devices.fetch_add(1, std::memory_order_relaxed);
    if (pick == workers_[0].get()) pick->AddConn(id, s, listener);
    else pick->Adopt(id, s, listener);
  }
}

void Daemon::KeepClosed(const DeviceStats& last) {
  std::lock_guard<std::mutex> g(closed_mu_);
  closed_.push_back(last);
  if (closed_.size() > kMaxClosed) closed_.erase(closed_.begin());
}

std::vector<DeviceStats> Daemon::Stats() {
  std::vector<DeviceStats> v;
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> g(w->mu);
    w->CollectStats(&v);
  }
  return v;
}

int Daemon::WorkerOf(unsigned id) {
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> g(w->mu);
    if (w->HasDevice(id)) return int(w->index());
  }
  return -1;
}

uint64_t Daemon::wakeups() const {
  uint64_t n = 0;
  for (auto& w : workers_) n += w->wakeups.load(std::memory_order_relaxed);
  return n;
}

uint64_t Daemon::device_moves() const {
  if (!env_.placement) return 0;
  std::lock_guard<std::mutex> l(env_.placement->decide_mu);
  return env_.placement->moves;
}

uint64_t Daemon::forwarded() const {
  uint64_t n = 0;
  for (auto& w : workers_) n += w->forwarded.load(std::memory_order_relaxed);
  return n;
}

// Each worker's lock in turn (never two at once): the devices, and the
// engines' counters summed.
std::string Daemon::StatsJson() {
  DaemonStats s;
  {
    std::lock_guard<std::mutex> g(closed_mu_);
    s.devices = closed_;
  }
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> g(w->mu);
    w->AddStats(&s);
  }
  s.pin = o_.pin;
  s.translation = o_.translation;
  s.threads = workers_.size();
  s.forwarded = forwarded();
  s.device_moves = device_moves();
  s.memory = {env_.memory->limit(), o_.device_memory_limit, env_.memory->used(), env_.memory->peak(),
              env_.memory->refused()};
  return vstellard::StatsJson(s);
}

void Daemon::WriteStats() { WriteStatsFile(o_.stats_json, StatsJson()); }

}  // namespace vstellard
