// Workloads of the harness: control channel, QP setup, bandwidth, latency
// and the raw-UDP ceiling.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "vstellar/harness/harness.h"

namespace vstellar::harness {
namespace {

constexpr uint16_t kServerPort = 47000, kClientPort = 47300;
constexpr size_t kRawHdr = 56;  // the size of a WRITE header, so raw datagrams match

uint64_t now_ns() { return SteadyClock().now_ns(); }

// ---- control channel: newline-terminated text over TCP ----
class Ctrl {
 public:
  explicit Ctrl(int fd = -1) : fd_(fd) {}
  ~Ctrl() { if (fd_ >= 0) close(fd_); }
  bool ok() const { return fd_ >= 0; }
  bool send_line(const std::string& s) {
    std::string l = s + "\n";
    size_t off = 0;
    while (off < l.size()) {
      ssize_t n = ::send(fd_, l.data() + off, l.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += size_t(n);
    }
    return true;
  }
  // timeout_ms < 0: block; 0: only what is there.
  bool recv_line(std::string& out, int timeout_ms) {
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        out = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return true;
      }
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return false;
      char b[4096];
      ssize_t n = ::recv(fd_, b, sizeof(b), 0);
      if (n <= 0) {
        closed_ = true;
        return false;
      }
      buf_.append(b, size_t(n));
    }
  }
  bool closed() const { return closed_; }

 private:
  int fd_;
  std::string buf_;
  bool closed_ = false;
};

// Control connections are IPv6 sockets, which reach IPv4 addresses as
// ::ffff:a.b.c.d.
sockaddr_in6 control_addr(const IpAddr& ip, uint16_t port) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  std::memcpy(&a.sin6_addr, ip.b.data(), 16);
  a.sin6_port = htons(port);
  return a;
}

int tcp_listen(const IpAddr& ip, uint16_t port) {
  int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int on = 1, off = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
  const sockaddr_in6 a = control_addr(ip, port);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 1) != 0) {
    perror("vstellar-harness: control listen");
    close(fd);
    return -1;
  }
  return fd;
}

int tcp_connect(const IpAddr& ip, uint16_t port, double timeout_s) {
  uint64_t end = now_ns() + uint64_t(timeout_s * 1e9);
  while (now_ns() < end) {
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const sockaddr_in6 a = control_addr(ip, port);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) == 0) {
      int on = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
      return fd;
    }
    close(fd);
    usleep(20000);
  }
  return -1;
}

struct Buffer {
  uint8_t* p = nullptr;
  size_t n = 0;
  explicit Buffer(size_t len) : n(std::max<size_t>(len, 4096)) {
    p = static_cast<uint8_t*>(aligned_alloc(4096, (n + 4095) & ~size_t(4095)));
    for (size_t i = 0; i < n; i++) p[i] = uint8_t(i * 7 + 1);  // touch every page now
  }
  ~Buffer() { free(p); }
  uint64_t addr() const { return uint64_t(uintptr_t(p)); }
};

struct Peer {
  uint32_t qpn, psn;
};

struct Setup {
  std::unique_ptr<Node> node;
  std::unique_ptr<Buffer> buf;
  Pd* pd = nullptr;
  Mr* mr = nullptr;
  Cq* scq = nullptr;
  Cq* rcq = nullptr;
  std::vector<Qp*> qps;
  uint64_t peer_addr = 0;
  uint32_t peer_rkey = 0;
};

bool make_objects(Setup& s, const Options& o) {
  Engine& e = s.node->eng();
  s.buf = std::make_unique<Buffer>(o.size);
  s.pd = e.alloc_pd();
  s.mr = e.reg_mr(s.pd, s.buf->addr(), s.buf->n,
                  ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC,
                  std::make_shared<HostMemory>());
  uint32_t cqe = std::min<uint32_t>(DeviceLimits::kMaxCqe, o.qps * (o.depth * 4 + 64));
  s.scq = e.create_cq(cqe);
  s.rcq = e.create_cq(cqe);
  for (uint32_t i = 0; i < o.qps; i++) {
    QpInitAttr ia;
    ia.send_cq = s.scq;
    ia.recv_cq = s.rcq;
    ia.cap.max_send_wr = o.depth + 8;
    ia.cap.max_recv_wr = o.depth * 2 + 8;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ia.cap.max_inline_data = 256;
    Qp* qp = e.create_qp(s.pd, ia);
    if (!qp) return false;
    s.qps.push_back(qp);
  }
  return s.mr && s.scq && s.rcq;
}

bool connect_qp(Engine& e, Qp* qp, uint32_t my_psn, const Peer& p, const Endpoint& peer) {
  QpAttr a;
  a.qp_state = QpState::INIT;
  a.qp_access_flags = ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;
  if (e.modify_qp(qp, a, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS)) return false;
  a.qp_state = QpState::RTR;
  a.path_mtu = MTU_4096;
  a.dest_qp_num = p.qpn;
  a.rq_psn = p.psn;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = 1;
  a.ah = peer;
  if (e.modify_qp(qp, a, QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN |
                             QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER))
    return false;
  a.qp_state = QpState::RTS;
  a.sq_psn = my_psn;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 16;
  return e.modify_qp(qp, a, QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY |
                                QP_MAX_QP_RD_ATOMIC) == 0;
}

uint32_t psn_for(uint32_t qpn) { return (qpn * 2654435761u) & 0xFFFFFF; }

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char b[2048];
  va_list ap;
  va_start(ap, f);
  vsnprintf(b, sizeof(b), f, ap);
  va_end(ap);
  return b;
}

std::string common_json(const Options& o, const char* role) {
  return fmt("\"role\":\"%s\",\"mode\":\"%s\",\"op\":\"%s\",\"size\":%lu,\"qps\":%u,\"depth\":%u,"
             "\"paths\":%u,\"path_algo\":\"%s\",\"mtu\":%u,\"rto_us\":%lu,\"loss_rate\":%g,"
             "\"loss_links\":%u,\"link_mode\":\"%s\",\"zerocopy\":%s,\"path_burst\":%u",
             role, o.mode.c_str(), o.op.c_str(), o.size, o.qps, o.depth, o.eng.num_paths,
             to_string(o.eng.path_algo), o.eng.mtu, o.eng.rto_ns / 1000, o.loss_rate, o.loss_links,
             to_string(o.link_mode), o.zerocopy ? "true" : "false", o.eng.path_burst);
}

// CPU seconds this process used (user + system): the engine is one thread,
// so cpu_s / wall_s is the share of one core it needed.
double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

std::string link_json(const UdpLinkStats& s) {
  return fmt("{\"tx\":%lu,\"rx\":%lu,\"tx_err\":%lu,\"rx_trunc\":%lu,\"rx_nobufs\":%lu,"
             "\"submits\":%lu,\"waits\":%lu,\"tx_sends\":%lu,\"rx_bufs\":%lu,\"tx_zc\":%lu,"
             "\"tx_zc_copied\":%lu,\"gso_fallbacks\":%lu}",
             s.tx, s.rx, s.tx_err, s.rx_trunc, s.rx_nobufs, s.submits, s.waits, s.tx_sends,
             s.rx_bufs, s.tx_zc, s.tx_zc_copied, s.tx_gso_fallbacks);
}

// Interval goodput series.
struct Series {
  uint64_t t0, every, next;
  uint64_t bytes = 0;
  std::string json;
  // A client's intervals also say what its engine did in them (resends,
  // timer expiries, paths set aside), so a dip in goodput can be read
  // against its cause (the fabric's black-hole experiment). `last` holds
  // those counters at the previous interval's end (not the whole
  // EngineStats: its per-path vector would be copied every interval).
  const Engine* eng = nullptr;
  static constexpr const char* kNames[] = {"retx", "timeouts", "quiet_losses", "path_gap_losses",
                                           "set_aside", "probes"};
  uint64_t last[std::size(kNames)] = {};
  Series(uint64_t start, uint32_t ms) : t0(start), every(uint64_t(ms) * 1'000'000), next(start + every) {}
  void add(uint64_t b) { bytes += b; }
  void tick(uint64_t now) {
    while (now >= next) {
      double gbps = double(bytes) * 8 / double(every);
      json += fmt("%s{\"t_ms\":%.0f,\"gbps\":%.3f", json.empty() ? "" : ",", double(next - t0) / 1e6, gbps);
      if (eng) {
        const EngineStats& st = eng->stats();
        const uint64_t now_counts[std::size(kNames)] = {st.retx_pkts,       st.timeouts,
                                                        st.quiet_losses,    st.path_gap_losses,
                                                        st.paths_set_aside, st.path_probes};
        for (size_t k = 0; k < std::size(kNames); k++) {
          json += fmt(",\"%s\":%lu", kNames[k], now_counts[k] - last[k]);
          last[k] = now_counts[k];
        }
      }
      json += "}";
      bytes = 0;
      next += every;
    }
  }
};

class RawSink : public RxSink {
 public:
  uint64_t first = 0, last = 0, pkts = 0, bytes = 0, counted_bytes = 0, counted_pkts = 0;
  uint64_t count_from = 0;
  Series* series = nullptr;
  void on_datagram(const uint8_t*, size_t len, const Endpoint&, const IpAddr&, bool) override {
    uint64_t t = now_ns();
    if (!first) first = t;
    last = t;
    pkts++;
    size_t pl = len > kRawHdr ? len - kRawHdr : 0;
    bytes += pl;
    if (count_from && t >= count_from) {
      counted_bytes += pl;
      counted_pkts++;
    }
    if (series) series->add(pl);
  }
};

int server_impl(const Options& o, std::string& json) {
  uint16_t base = o.base_port ? o.base_port : kServerPort;
  uint16_t peer_port = o.peer_port ? o.peer_port : kClientPort;
  int lfd = tcp_listen(o.local_ip, o.ctrl_port);
  if (lfd < 0) return 1;
  Setup s;
  s.node = std::make_unique<Node>(o, base, peer_port);
  if (!s.node->ok()) {
    fprintf(stderr, "vstellar-harness: %s\n", s.node->error().c_str());
    return 1;
  }
  pollfd pf{lfd, POLLIN, 0};
  if (::poll(&pf, 1, int(o.connect_timeout * 1000) + 5000) <= 0) {
    fprintf(stderr, "vstellar-harness: no client connected\n");
    close(lfd);
    return 1;
  }
  Ctrl ctrl(accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC));
  close(lfd);
  // The client's parameters decide the workload.
  Options w = o;
  std::string line;
  std::vector<Peer> peers;
  uint64_t peer_addr = 0;
  uint32_t peer_rkey = 0;
  while (ctrl.recv_line(line, 10000) && line != "END") {
    std::istringstream in(line);
    std::string k;
    in >> k;
    if (k == "HELLO") in >> w.mode >> w.op >> w.size >> w.qps >> w.depth;
    if (k == "QP") { Peer p{}; in >> p.qpn >> p.psn; peers.push_back(p); }
    if (k == "MR") in >> peer_addr >> peer_rkey;
  }
  if (line != "END" || w.qps < 1 || w.qps > 4096 || w.depth < 1 || w.depth > 4096 ||
      w.size > (1ull << 31)) {
    fprintf(stderr, "vstellar-harness: bad handshake\n");
    return 1;
  }
  bool raw = w.mode == "raw";
  if (!raw) {
    if (peers.size() != w.qps || !make_objects(s, w)) return 1;
    Engine& e = s.node->eng();
    for (size_t i = 0; i < peers.size(); i++) {
      if (!connect_qp(e, s.qps[i], psn_for(s.qps[i]->qpn()), peers[i], Endpoint{o.peer_ip, peer_port}))
        return 1;
      ctrl.send_line(fmt("QP %u %u", s.qps[i]->qpn(), psn_for(s.qps[i]->qpn())));
    }
    ctrl.send_line(fmt("MR %lu %u", s.buf->addr(), s.mr->rkey()));
    // Receives for SEND workloads and the latency ping-pong.
    if (w.op == "send" || w.mode == "lat")
      for (Qp* qp : s.qps)
        for (uint32_t k = 0; k < w.depth * 2; k++) {
          Sge sg{s.buf->addr(), uint32_t(std::max<uint64_t>(w.size, 1)), s.mr->lkey()};
          RecvWr r;
          r.wr_id = qp->qpn();
          r.sg_list = &sg;
          r.num_sge = 1;
          e.post_recv(qp, r);
        }
  }
  ctrl.send_line("END");

  Engine& e = s.node->eng();
  const double cpu0 = cpu_seconds();
  const uint64_t wall0 = now_ns();
  RawSink sink;
  Series series(now_ns(), w.interval_ms);
  if (raw) sink.series = &series;
  uint64_t last_check = 0, recvs = 0, errors = 0;
  Wc wc[64];
  for (;;) {
    uint64_t now = now_ns();
    if (raw) {
      s.node->link().poll(1'000'000, sink);
      if (sink.first && !sink.count_from) sink.count_from = sink.first + uint64_t(w.warmup * 1e9);
      if (sink.first) series.tick(now);
    } else {
      s.node->run_once(2'000'000);
      int n = e.poll_cq(s.rcq, wc, 64);
      for (int i = 0; i < n; i++) {
        if (wc[i].status != WcStatus::SUCCESS) { errors++; continue; }
        recvs++;
        Qp* qp = e.find_qp(wc[i].qp_num);
        Sge sg{s.buf->addr(), uint32_t(std::max<uint64_t>(w.size, 1)), s.mr->lkey()};
        RecvWr r;
        r.wr_id = wc[i].qp_num;
        r.sg_list = &sg;
        r.num_sge = 1;
        e.post_recv(qp, r);
        if (w.mode == "lat") {  // pong
          SendWr sw;
          sw.opcode = WrOpcode::SEND;
          sw.send_flags = SEND_SIGNALED | (w.size <= 256 ? uint32_t(SEND_INLINE) : 0u);
          sw.sg_list = &sg;
          sw.num_sge = 1;
          e.post_send(qp, sw);
        }
      }
      n = e.poll_cq(s.scq, wc, 64);
      for (int i = 0; i < n; i++)
        if (wc[i].status != WcStatus::SUCCESS) errors++;
    }
    if (now - last_check > 5'000'000) {
      last_check = now;
      std::string l;
      if (ctrl.recv_line(l, 0) && l == "DONE") break;
      if (ctrl.closed()) break;
    }
  }
  json = "{" + common_json(w, "server");
  if (raw) {
    uint64_t span = sink.last > sink.count_from ? sink.last - sink.count_from : 0;
    double gbps = span ? double(sink.counted_bytes) * 8 / double(span) : 0;
    json += fmt(",\"rx_pkts\":%lu,\"rx_bytes\":%lu,\"rx_gbps\":%.3f,\"rx_pps\":%.0f",
                sink.pkts, sink.bytes, gbps, span ? double(sink.counted_pkts) * 1e9 / double(span) : 0);
    json += ",\"intervals\":[" + series.json + "]";
  }
  json += fmt(",\"recv_completions\":%lu,\"errors\":%lu,\"emu_dropped\":%lu,\"cpu_s\":%.3f,"
              "\"wall_s\":%.3f",
              recvs, errors, s.node->emu_dropped, cpu_seconds() - cpu0,
              double(now_ns() - wall0) / 1e9);
  json += ",\"engine\":" + stats_json(e.stats(), o.path_detail);
  json += ",\"telemetry\":" + s.node->telemetry_json();
  json += ",\"link\":" + link_json(s.node->link().stats()) + "}";
  return 0;
}

int client_impl(const Options& o, std::string& json) {
  uint16_t base = o.base_port ? o.base_port : kClientPort;
  uint16_t peer_port = o.peer_port ? o.peer_port : kServerPort;
  Setup s;
  s.node = std::make_unique<Node>(o, base, peer_port);
  if (!s.node->ok()) {
    fprintf(stderr, "vstellar-harness: %s\n", s.node->error().c_str());
    return 1;
  }
  Ctrl ctrl(tcp_connect(o.peer_ip, o.ctrl_port, o.connect_timeout));
  if (!ctrl.ok()) {
    fprintf(stderr, "vstellar-harness: cannot reach the server's control port\n");
    return 1;
  }
  bool raw = o.mode == "raw";
  Engine& e = s.node->eng();
  ctrl.send_line(fmt("HELLO %s %s %lu %u %u", o.mode.c_str(), o.op.c_str(), o.size, o.qps, o.depth));
  if (!raw) {
    if (!make_objects(s, o)) return 1;
    for (Qp* qp : s.qps) ctrl.send_line(fmt("QP %u %u", qp->qpn(), psn_for(qp->qpn())));
    ctrl.send_line(fmt("MR %lu %u", s.buf->addr(), s.mr->rkey()));
  }
  ctrl.send_line("END");
  std::vector<Peer> peers;
  std::string line;
  while (ctrl.recv_line(line, 10000) && line != "END") {
    std::istringstream in(line);
    std::string k;
    in >> k;
    if (k == "QP") { Peer p{}; in >> p.qpn >> p.psn; peers.push_back(p); }
    if (k == "MR") in >> s.peer_addr >> s.peer_rkey;
  }
  if (line != "END" || (!raw && peers.size() != s.qps.size())) {
    fprintf(stderr, "vstellar-harness: bad handshake from server\n");
    return 1;
  }
  for (size_t i = 0; i < s.qps.size(); i++)
    if (!connect_qp(e, s.qps[i], psn_for(s.qps[i]->qpn()), peers[i], Endpoint{o.peer_ip, peer_port}))
      return 1;

  const double cpu0 = cpu_seconds();
  const uint64_t t0 = now_ns();
  const uint64_t end = t0 + uint64_t(o.duration * 1e9);
  const uint64_t warm = t0 + uint64_t(std::min(o.warmup, o.duration / 2) * 1e9);
  Series series(t0, o.interval_ms);
  series.eng = &e;
  uint64_t bytes = 0, msgs = 0, errors = 0, posted = 0, done = 0;
  uint64_t stalls = 0, longest_gap = 0;
  std::string first_error;
  std::vector<uint64_t> lat;
  uint32_t seg = o.eng.mtu;

  if (raw) {
    // The ceiling: the same sockets, the same io_uring batching, no engine.
    UdpLink& l = s.node->link();
    PathSelector ps(o.eng.path_algo, o.eng.num_paths, 7, o.eng.single_path, o.eng.path_burst);
    Buffer pay(std::max<uint64_t>(o.size, seg));
    uint8_t hdr[kRawHdr] = {};
    uint64_t per_msg = std::max<uint64_t>(1, (o.size + seg - 1) / seg);
    uint64_t dgrams = 0;
    RawSink none;
    while (now_ns() < end) {
      for (int k = 0; k < 64; k++) {
        uint64_t off = (dgrams % per_msg) * seg;
        uint32_t len = uint32_t(std::min<uint64_t>(seg, o.size - std::min(o.size, off)));
        HostSpan sp{pay.p + off, len};
        l.send(ps.pick(len), IpAddr(), Endpoint{o.peer_ip, peer_port}, hdr, kRawHdr, &sp, len ? 1 : 0);
        dgrams++;
      }
      l.flush();
      l.poll(0, none);
    }
    msgs = dgrams / per_msg;
    double secs = double(now_ns() - t0) / 1e9;
    ctrl.send_line("DONE");
    json = "{" + common_json(o, "client");
    json += fmt(",\"cpu_s\":%.3f,\"wall_s\":%.3f", cpu_seconds() - cpu0, secs);
    json += fmt(",\"tx_datagrams\":%lu,\"tx_gbps\":%.3f,\"messages\":%lu", dgrams,
                double(dgrams) * double(std::min<uint64_t>(o.size, seg)) * 8 / secs / 1e9, msgs);
    json += ",\"link\":" + link_json(l.stats()) + "}";
    return 0;
  }

  auto post = [&](Qp* qp) {
    SendWr w;
    Sge sg{s.buf->addr(), uint32_t(o.size), s.mr->lkey()};
    w.wr_id = now_ns();
    w.sg_list = &sg;
    w.num_sge = 1;
    w.send_flags = SEND_SIGNALED;
    w.remote_addr = s.peer_addr;
    w.rkey = s.peer_rkey;
    if (o.mode == "lat") {
      w.opcode = WrOpcode::SEND;
      if (o.size <= 256) w.send_flags |= SEND_INLINE;
    } else {
      w.opcode = o.op == "send" ? WrOpcode::SEND : o.op == "read" ? WrOpcode::RDMA_READ : WrOpcode::RDMA_WRITE;
    }
    if (e.post_send(qp, w) == 0) posted++;
  };

  Wc wc[64];
  if (o.mode == "lat") {
    Qp* qp = s.qps[0];
    for (uint32_t k = 0; k < 4; k++) {
      Sge sg{s.buf->addr(), uint32_t(std::max<uint64_t>(o.size, 1)), s.mr->lkey()};
      RecvWr r;
      r.sg_list = &sg;
      r.num_sge = 1;
      e.post_recv(qp, r);
    }
    while (now_ns() < end && errors == 0) {
      uint64_t t = now_ns();
      post(qp);
      bool got = false;
      while (!got && now_ns() < end + 1'000'000'000ull) {
        s.node->run_once(1'000'000);
        int n = e.poll_cq(s.rcq, wc, 64);
        for (int i = 0; i < n; i++) {
          if (wc[i].status != WcStatus::SUCCESS) { errors++; continue; }
          got = true;
          Sge sg{s.buf->addr(), uint32_t(std::max<uint64_t>(o.size, 1)), s.mr->lkey()};
          RecvWr r;
          r.sg_list = &sg;
          r.num_sge = 1;
          e.post_recv(qp, r);
        }
        n = e.poll_cq(s.scq, wc, 64);
        for (int i = 0; i < n; i++) {
          done++;
          if (wc[i].status != WcStatus::SUCCESS) errors++;
        }
      }
      if (!got) break;
      uint64_t rtt = now_ns() - t;
      if (t >= warm) lat.push_back(rtt);
      msgs++;
    }
    // The last SENDs' own completions follow their (coalesced) ACKs.
    uint64_t drain = now_ns() + 1'000'000'000ull;
    while (done < posted && now_ns() < drain) {
      s.node->run_once(1'000'000);
      int n = e.poll_cq(s.scq, wc, 64);
      for (int i = 0; i < n; i++) {
        done++;
        if (wc[i].status != WcStatus::SUCCESS) errors++;
      }
    }
  } else {
    for (Qp* qp : s.qps)
      for (uint32_t k = 0; k < o.depth; k++) post(qp);
    bool stopping = false;
    uint64_t drain_end = end + 3'000'000'000ull;
    uint64_t last_done = now_ns();
    bool in_gap = false;
    while (posted > done) {
      uint64_t now = now_ns();
      // A stall: after warm-up, no completion for stall_ms while WRs
      // are outstanding (counted once per gap).
      const uint64_t gap = now - last_done;
      if (now >= warm) longest_gap = std::max(longest_gap, gap);
      if (now >= warm && gap >= uint64_t(o.stall_ms) * 1'000'000ull && !in_gap) {
        in_gap = true;
        stalls++;
      }
      if (!stopping && now >= end) stopping = true;
      if (now > drain_end) break;
      s.node->run_once(1'000'000);
      int n = e.poll_cq(s.scq, wc, 64);
      now = now_ns();
      if (n > 0) {
        last_done = now;
        in_gap = false;
      }
      for (int i = 0; i < n; i++) {
        done++;
        if (wc[i].status != WcStatus::SUCCESS) {
          if (!errors) first_error = fmt("%s on qp %u", to_string(wc[i].status), wc[i].qp_num);
          errors++;
          continue;
        }
        if (now >= warm && now < end) {
          bytes += o.size;
          msgs++;
        }
        if (now < end) series.add(o.size);
        if (!stopping) post(e.find_qp(wc[i].qp_num));
      }
      series.tick(std::min(now, end));
    }
  }
  double secs = double(end - warm) / 1e9;
  ctrl.send_line("DONE");
  json = "{" + common_json(o, "client");
  json += fmt(",\"duration_s\":%.3f,\"messages\":%lu,\"bytes\":%lu,\"goodput_gbps\":%.3f,"
              "\"msg_rate_mps\":%.4f,\"errors\":%lu,\"first_error\":\"%s\",\"emu_dropped\":%lu",
              secs, msgs, bytes, double(bytes) * 8 / secs / 1e9, double(msgs) / secs / 1e6, errors,
              first_error.c_str(), s.node->emu_dropped);
  json += fmt(",\"cpu_s\":%.3f,\"wall_s\":%.3f", cpu_seconds() - cpu0, double(now_ns() - t0) / 1e9);
  // Every posted WR completed (successfully or not) before the drain deadline?
  json += fmt(",\"posted\":%lu,\"completed\":%lu,\"stalls\":%lu,\"longest_gap_ms\":%.1f", posted, done,
              stalls, double(longest_gap) / 1e6);
  if (o.mode == "lat") {
    std::sort(lat.begin(), lat.end());
    auto pct = [&](double q) { return lat.empty() ? 0.0 : double(lat[size_t(q * double(lat.size() - 1))]) / 2e3; };
    double avg = 0;
    for (uint64_t v : lat) avg += double(v);
    avg = lat.empty() ? 0 : avg / double(lat.size()) / 2e3;
    json += fmt(",\"latency\":{\"median_us\":%.2f,\"p99_us\":%.2f,\"avg_us\":%.2f,\"min_us\":%.2f,"
                "\"samples\":%zu,\"note\":\"one-way = RTT/2\"}",
                pct(0.5), pct(0.99), avg, pct(0), lat.size());
  } else {
    json += ",\"intervals\":[" + series.json + "]";
  }
  json += ",\"engine\":" + stats_json(e.stats(), o.path_detail);
  json += ",\"telemetry\":" + s.node->telemetry_json();
  json += ",\"link\":" + link_json(s.node->link().stats()) + "}";
  if (errors) return 3;
  return stalls || posted != done ? 4 : 0;
}

}  // namespace

int run_server(const Options& o) {
  std::string j;
  int rc = server_impl(o, j);
  if (!j.empty()) printf("%s\n", j.c_str());
  return rc;
}

int run_client(const Options& o) {
  std::string j;
  int rc = client_impl(o, j);
  if (!j.empty()) printf("%s\n", j.c_str());
  return rc;
}

int run_pair(const Options& o) {
  int fds[2];
  if (pipe(fds) != 0) return 1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    Options s = o;
    s.role = "server";
    s.base_port = o.base_port ? o.base_port : kServerPort;
    s.peer_port = uint16_t(s.base_port + 300);
    std::string j;
    int rc = server_impl(s, j);
    if (write(fds[1], j.data(), j.size()) < 0) rc = 1;
    _exit(rc);
  }
  close(fds[1]);
  Options c = o;
  c.role = "client";
  c.peer_port = o.base_port ? o.base_port : kServerPort;
  c.base_port = uint16_t(c.peer_port + 300);
  std::string cj;
  int rc = client_impl(c, cj);
  std::string sj;
  char b[65536];
  ssize_t n;
  while ((n = read(fds[0], b, sizeof(b))) > 0) sj.append(b, size_t(n));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  printf("{\"client\":%s,\"server\":%s}\n", cj.empty() ? "null" : cj.c_str(), sj.empty() ? "null" : sj.c_str());
  if (rc == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) rc = 1;
  return rc;
}

}  // namespace vstellar::harness
