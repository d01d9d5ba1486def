#include "vstellar/udp_link.h"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace vstellar {
namespace {

// The sender of a received datagram, from the socket address the kernel
// wrote (IPv4 on an IPv6 socket arrives mapped); false if it is neither.
bool sender_of(const void* name, uint32_t namelen, Endpoint* out) {
  sockaddr_in6 s6;
  if (namelen >= sizeof(sockaddr_in6)) {
    std::memcpy(&s6, name, sizeof(s6));
    if (s6.sin6_family != AF_INET6) return false;
    *out = Endpoint{IpAddr::from_bytes(s6.sin6_addr.s6_addr), ntohs(s6.sin6_port)};
    return true;
  }
  sockaddr_in s4;
  if (namelen < sizeof(sockaddr_in)) return false;
  std::memcpy(&s4, name, sizeof(s4));
  if (s4.sin_family != AF_INET) return false;
  *out = Endpoint{IpAddr(ntohl(s4.sin_addr.s_addr)), ntohs(s4.sin_port)};
  return true;
}

constexpr uint64_t kTxTag = 1ull << 32;
constexpr uint64_t kRxTag = 2ull << 32;
constexpr uint64_t kMcRxTag = 4ull << 32;
constexpr uint64_t kRoceRxTag = 8ull << 32;
constexpr uint16_t kBufGroup = 0;
constexpr uint32_t kGroBufBytes = 65536;  // a GRO receive holds up to 64 KiB

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef IORING_SEND_ZC_REPORT_USAGE
#define IORING_SEND_ZC_REPORT_USAGE (1U << 3)
#endif
#ifndef IORING_NOTIF_USAGE_ZC_COPIED
#define IORING_NOTIF_USAGE_ZC_COPIED (1U << 31)
#endif

void set_buf(int fd, int force_opt, int opt, int bytes) {
  if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof(bytes)) != 0)
    setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof(bytes));
}

}  // namespace

const char* to_string(LinkMode m) { return m == LinkMode::GSO ? "gso" : "plain"; }

bool parse_link_mode(const std::string& s, LinkMode& out) {
  for (LinkMode m : {LinkMode::PLAIN, LinkMode::GSO})
    if (s == to_string(m)) { out = m; return true; }
  return false;
}

// Each step sets error_ and returns false on failure; the link is then
// unusable (error() says why) and the destructor frees what was made.
UdpLink::UdpLink(const UdpLinkConfig& cfg) : cfg_(cfg) {
  if (cfg_.rx_buffers == 0) cfg_.rx_buffers = gso_mode() ? 256 : 1024;
  if (!gso_mode()) cfg_.zerocopy = false;
  if (cfg_.num_paths < 1 || cfg_.num_paths > 256) {
    error_ = "num_paths must be 1..256";
    return;
  }
  if (cfg_.rx_buffers & (cfg_.rx_buffers - 1)) {
    error_ = "rx_buffers must be a power of two";
    return;
  }
  if (!init_ring() || !open_path_sockets() || !steer_shards() || !set_receive_options()) return;

  tx_.resize(cfg_.tx_slots);
  for (uint32_t i = 0; i < cfg_.tx_slots; i++) tx_free_.push_back(cfg_.tx_slots - 1 - i);

  if (!init_receive_buffers()) return;
  rx_msg_.msg_namelen = sizeof(sockaddr_in6);
  arm_recv();
  if (cfg_.roce_port && !open_roce_socket()) return;
  io_uring_submit(&ring_);
}

static int udp_socket(int family);

bool UdpLink::open_roce_socket() {
  if (cfg_.shards > 1) {
    error_ = "a RoCE v2 port with several shards: the steering program cannot read BTH";
    return false;
  }
  roce_fd_ = udp_socket(family_);
  sockaddr_in6 a;
  const socklen_t alen = sockaddr_of(cfg_.local, cfg_.roce_port, &a);
  int on = 1;
  const bool v6 = family_ == AF_INET6;
  if (roce_fd_ < 0 || bind(roce_fd_, reinterpret_cast<sockaddr*>(&a), alen) != 0 ||
      (v6 && (setsockopt(roce_fd_, IPPROTO_IPV6, IPV6_RECVTCLASS, &on, sizeof(on)) != 0 ||
              setsockopt(roce_fd_, IPPROTO_IPV6, IPV6_RECVPKTINFO, &on, sizeof(on)) != 0)) ||
      (!v6 && setsockopt(roce_fd_, IPPROTO_IP, IP_PKTINFO, &on, sizeof(on)) != 0)) {
    error_ = "RoCE v2 port " + std::to_string(cfg_.roce_port) + ": " + strerror(errno);
    return false;
  }
  setsockopt(roce_fd_, IPPROTO_IP, IP_RECVTOS, &on, sizeof(on));
  // DF without path MTU discovery's local fragmentation: Linux then gives
  // the datagrams of an unconnected socket the IPv4 identification 0 (it
  // numbers them otherwise, even with DF set), and a RoCE v2 ICRC covers
  // the identification, so the engine can compute it.
  const int probe = IP_PMTUDISC_PROBE;
  if (setsockopt(roce_fd_, IPPROTO_IP, IP_MTU_DISCOVER, &probe, sizeof(probe)) != 0 ||
      (v6 && setsockopt(roce_fd_, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &probe, sizeof(probe)) != 0)) {
    error_ = std::string("RoCE v2 port: IP_MTU_DISCOVER: ") + strerror(errno);
    return false;
  }
  set_buf(roce_fd_, SO_RCVBUFFORCE, SO_RCVBUF, cfg_.sock_buf);
  arm_roce_recv();
  return true;
}

void UdpLink::arm_roce_recv() {
  io_uring_sqe* s = sqe();
  io_uring_prep_recvmsg_multishot(s, roce_fd_, &rx_msg_, 0);
  s->flags |= IOSQE_BUFFER_SELECT;
  s->buf_group = kBufGroup;
  io_uring_sqe_set_data64(s, kRoceRxTag);
  roce_armed_ = true;
}

// The io_uring, with the flags of newer kernels where they exist, and the
// eventfd the owner's epoll waits on.
bool UdpLink::init_ring() {
  io_uring_params p{};
  p.flags = IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN |
            IORING_SETUP_SINGLE_ISSUER;
  p.cq_entries = 16384;
  int r = io_uring_queue_init_params(4096, &ring_, &p);
  if (r < 0) {  // older kernel: plain ring
    p = io_uring_params{};
    p.flags = IORING_SETUP_CQSIZE;
    p.cq_entries = 16384;
    r = io_uring_queue_init_params(4096, &ring_, &p);
  }
  if (r < 0) {
    error_ = std::string("io_uring_queue_init: ") + strerror(-r);
    return false;
  }
  ring_ok_ = true;
  event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_fd_ < 0 || io_uring_register_eventfd(&ring_, event_fd_) < 0) {
    error_ = std::string("io_uring eventfd: ") + strerror(errno);
    return false;
  }
  return true;
}

socklen_t UdpLink::sockaddr_of(const IpAddr& a, uint16_t port, sockaddr_in6* out) const {
  *out = sockaddr_in6{};
  if (family_ == AF_INET6) {
    out->sin6_family = AF_INET6;
    out->sin6_port = htons(port);
    std::memcpy(&out->sin6_addr, a.b.data(), 16);  // IpAddr() is ::, the wildcard
    return sizeof(sockaddr_in6);
  }
  if (!a.is_v4() && !a.unspecified()) return 0;
  auto* in = reinterpret_cast<sockaddr_in*>(out);
  in->sin_family = AF_INET;
  in->sin_port = htons(port);
  in->sin_addr.s_addr = htonl(a.unspecified() ? INADDR_ANY : a.v4());
  return sizeof(sockaddr_in);
}

// A UDP socket of the link's family; an IPv6 one also carries IPv4.
static int udp_socket(int family) {
  const int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int off = 0;
  if (fd >= 0 && family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
  return fd;
}

// One socket per path: path i sends from source port base_port + i. With
// shards, every link of the group binds the same ports (SO_REUSEPORT).
bool UdpLink::open_path_sockets() {
  for (uint16_t i = 0; i < cfg_.num_paths; i++) {
    int fd = udp_socket(family_);
    if (fd < 0 && i == 0 && errno == EAFNOSUPPORT && (cfg_.local.is_v4() || cfg_.local.unspecified())) {
      family_ = AF_INET;  // no IPv6 on this host: IPv4 sockets serve IPv4 alone
      fd = udp_socket(family_);
    }
    if (fd < 0) {
      error_ = std::string("socket: ") + strerror(errno);
      return false;
    }
    fds_.push_back(fd);
    sockaddr_in6 a;
    const socklen_t alen = sockaddr_of(cfg_.local, uint16_t(cfg_.base_port + i), &a);
    if (alen == 0) {
      error_ = "an IPv6 address on a host without IPv6";
      return false;
    }
    if (cfg_.shards > 1) {
      if (cfg_.shard == 0) {  // the port is free: bound alone, it would be
        const int probe = udp_socket(family_);
        const bool free = probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&a), alen) == 0;
        const int e = errno;
        if (probe >= 0) close(probe);
        if (!free) {
          error_ = "bind port " + std::to_string(cfg_.base_port + i) + ": " + strerror(e);
          return false;
        }
      }
      int one = 1;
      if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) {
        error_ = std::string("SO_REUSEPORT: ") + strerror(errno);
        return false;
      }
    }
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), alen) != 0) {
      error_ = "bind port " + std::to_string(cfg_.base_port + i) + ": " + strerror(errno);
      return false;
    }
    set_buf(fd, SO_SNDBUFFORCE, SO_SNDBUF, cfg_.sock_buf);
    if (cfg_.mcast_port && cfg_.local.is_v4()) {  // datagrams to a group leave from our own address
      in_addr ifa{htonl(cfg_.local.v4())};
      setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &ifa, sizeof(ifa));
    }
    if (cfg_.ecn) {
      int tos = 0x02;  // ECT(0): a fabric may mark CE instead of dropping
      setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof(tos));  // IPv4, on either family
      if (family_ == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &tos, sizeof(tos));
    }
  }
  set_buf(fds_[0], SO_RCVBUFFORCE, SO_RCVBUF, cfg_.sock_buf);
  return true;
}

// With shards, a classic BPF program on the base port's group gives each
// datagram to socket dst_qpn % shards (UdpLinkConfig::shards).
bool UdpLink::steer_shards() {
  if (cfg_.shards <= 1) return true;
  return steer({}, &error_);
}

// The program: load dst_qpn; for each exception, if it is that QPN return
// its socket; else return dst_qpn % shards. The group's socket index is
// the order of binding: link k is socket k. A datagram too short for the
// load ends the program with 0 (socket 0 then drops or passes it on).
// Classic BPF, not eBPF with a map: nothing to build or load beyond one
// setsockopt, and a linear list is cheap for the few QPs that move.
bool UdpLink::steer(const std::vector<std::pair<uint32_t, uint16_t>>& exceptions, std::string* err) {
  if (cfg_.shards <= 1) return true;
  std::vector<sock_filter> prog;
  prog.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, cfg_.shard_qpn_offset));
  for (size_t i = 0; i < exceptions.size() && i < kMaxSteeringExceptions; i++) {
    prog.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, exceptions[i].first, 0, 1));
    prog.push_back(BPF_STMT(BPF_RET | BPF_K, exceptions[i].second));
  }
  prog.push_back(BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, cfg_.shards));
  prog.push_back(BPF_STMT(BPF_RET | BPF_A, 0));
  sock_fprog fprog{uint16_t(prog.size()), prog.data()};
  if (setsockopt(fds_[0], SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &fprog, sizeof(fprog)) != 0) {
    *err = std::string("SO_ATTACH_REUSEPORT_CBPF: ") + strerror(errno);
    return false;
  }
  return true;
}

// The receiving socket (the base port) reports the TOS byte or traffic
// class (ECN) and the address each datagram was sent to, and, in GSO mode,
// coalesces with UDP_GRO. An IPv6 socket's IPV6_PKTINFO also names the
// IPv4 destination of an IPv4 datagram (mapped).
bool UdpLink::set_receive_options() {
  int on = 1;
  setsockopt(fds_[0], IPPROTO_IP, IP_RECVTOS, &on, sizeof(on));
  const bool v6 = family_ == AF_INET6;
  if ((v6 && (setsockopt(fds_[0], IPPROTO_IPV6, IPV6_RECVTCLASS, &on, sizeof(on)) != 0 ||
              setsockopt(fds_[0], IPPROTO_IPV6, IPV6_RECVPKTINFO, &on, sizeof(on)) != 0)) ||
      (!v6 && setsockopt(fds_[0], IPPROTO_IP, IP_PKTINFO, &on, sizeof(on)) != 0)) {
    error_ = std::string("receive options: ") + strerror(errno);
    return false;
  }
  if (gso_mode() && setsockopt(fds_[0], IPPROTO_UDP, UDP_GRO, &on, sizeof(on)) != 0) {
    error_ = std::string("UDP_GRO: ") + strerror(errno);
    return false;
  }
  return true;
}

// Provided-buffer ring: the kernel picks a buffer per datagram. Room for
// the sender's address, the TOS byte or traffic class, the destination
// address and, in GSO mode, the UDP_GRO segment size.
bool UdpLink::init_receive_buffers() {
  rx_msg_.msg_controllen = 3 * CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(in6_pktinfo));
  const size_t payload = gso_mode() ? std::max<size_t>(cfg_.max_datagram, kGroBufBytes) : cfg_.max_datagram;
  rx_buf_len_ = (payload + sizeof(io_uring_recvmsg_out) + sizeof(sockaddr_in6) +
                 rx_msg_.msg_controllen + 63) & ~size_t(63);
  br_bytes_ = cfg_.rx_buffers * sizeof(io_uring_buf);
  void* m = mmap(nullptr, br_bytes_, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  if (m == MAP_FAILED) {
    error_ = "mmap buffer ring";
    return false;
  }
  br_ = static_cast<io_uring_buf_ring*>(m);
  io_uring_buf_ring_init(br_);
  io_uring_buf_reg reg{};
  reg.ring_addr = uint64_t(uintptr_t(br_));
  reg.ring_entries = cfg_.rx_buffers;
  reg.bgid = kBufGroup;
  const int r = io_uring_register_buf_ring(&ring_, &reg, 0);
  if (r < 0) {
    error_ = std::string("io_uring_register_buf_ring: ") + strerror(-r);
    return false;
  }
  rx_mem_ = static_cast<uint8_t*>(aligned_alloc(4096, ((rx_buf_len_ * cfg_.rx_buffers) + 4095) & ~size_t(4095)));
  int mask = io_uring_buf_ring_mask(cfg_.rx_buffers);
  for (uint32_t i = 0; i < cfg_.rx_buffers; i++)
    io_uring_buf_ring_add(br_, rx_mem_ + i * rx_buf_len_, unsigned(rx_buf_len_), uint16_t(i), mask, int(i));
  io_uring_buf_ring_advance(br_, int(cfg_.rx_buffers));
  return true;
}

UdpLink::~UdpLink() {
  if (ring_ok_) {
    // Cancel the multishot receive and wait for it to end: a request still in
    // flight holds its socket, and the ring's teardown is asynchronous, so
    // without this the ports would stay bound for a moment after we exit.
    auto mc_armed = [&] {
      return std::any_of(mc_.begin(), mc_.end(), [](const McSocket& m) { return m.armed; });
    };
    if (rx_armed_ || roce_armed_ || mc_armed()) {
      std::vector<uint64_t> tags = {kRxTag};
      if (roce_armed_) tags.push_back(kRoceRxTag);
      for (size_t i = 0; i < mc_.size(); i++) tags.push_back(kMcRxTag | i);
      for (uint64_t tag : tags) {
        io_uring_sqe* s = sqe();
        io_uring_prep_cancel64(s, tag, 0);
        io_uring_sqe_set_data64(s, 3ull << 32);
      }
      // The ring is single-issuer: only its own thread may submit, and a
      // receive left armed would write into the buffers freed below.
      if (io_uring_submit(&ring_) == -EEXIST)
        std::fprintf(stderr, "vstellar: UdpLink destroyed off its ring's thread: its receive stays armed\n");
      uint64_t deadline_loops = 100;
      while ((rx_armed_ || roce_armed_ || mc_armed()) && deadline_loops--) {
        __kernel_timespec ts{0, 1'000'000};
        io_uring_cqe* c;
        if (io_uring_wait_cqe_timeout(&ring_, &c, &ts) != 0) continue;
        uint64_t d = io_uring_cqe_get_data64(c);
        if (d == kRxTag && !(c->flags & IORING_CQE_F_MORE)) rx_armed_ = false;
        if (d == kRoceRxTag && !(c->flags & IORING_CQE_F_MORE)) roce_armed_ = false;
        if ((d >> 32) == (kMcRxTag >> 32) && uint32_t(d) < mc_.size() && !(c->flags & IORING_CQE_F_MORE))
          mc_[uint32_t(d)].armed = false;
        if ((d >> 32) == 1) {
          tx_inflight_--;
        }
        io_uring_cqe_seen(&ring_, c);
      }
    }
    io_uring_queue_exit(&ring_);
  }
  for (int fd : fds_) close(fd);
  for (const McSocket& m : mc_) close(m.fd);
  if (roce_fd_ >= 0) close(roce_fd_);
  if (event_fd_ >= 0) close(event_fd_);
  if (br_) munmap(br_, br_bytes_);
  free(rx_mem_);
}

io_uring_sqe* UdpLink::sqe() {
  io_uring_sqe* s = io_uring_get_sqe(&ring_);
  if (!s) {
    io_uring_submit(&ring_);
    stats_.submits++;
    s = io_uring_get_sqe(&ring_);
  }
  return s;
}

void UdpLink::arm_recv() {
  io_uring_sqe* s = sqe();
  io_uring_prep_recvmsg_multishot(s, fds_[0], &rx_msg_, 0);
  s->flags |= IOSQE_BUFFER_SELECT;
  s->buf_group = kBufGroup;
  io_uring_sqe_set_data64(s, kRxTag);
  rx_armed_ = true;
}

void UdpLink::arm_mc_recv(size_t i) {
  io_uring_sqe* s = sqe();
  io_uring_prep_recvmsg_multishot(s, mc_[i].fd, &rx_msg_, 0);
  s->flags |= IOSQE_BUFFER_SELECT;
  s->buf_group = kBufGroup;
  io_uring_sqe_set_data64(s, kMcRxTag | i);
  mc_[i].armed = true;
}

bool UdpLink::mc_arm_missing() {
  bool any = false;
  for (size_t i = 0; i < mc_.size(); i++)
    if (!mc_[i].armed) {
      arm_mc_recv(i);
      any = true;
    }
  return any;
}

// One more wildcard socket on mcast_port that group datagrams (IPv4 and,
// on an IPv6 socket, IPv6 ones) arrive on. A socket bound to our unicast
// address (the base port's) never sees them.
bool UdpLink::open_mc() {
  if (mc_.size() >= kMaxMcSockets) return false;
  int fd = udp_socket(family_);
  if (fd < 0) return false;
  int on = 1, off = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  // Only the groups joined on this socket: by default a socket bound to the
  // port gets every group any socket of the host joined, so with several
  // of ours each datagram would arrive once per socket.
  if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &off, sizeof(off)) != 0 ||
      (family_ == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_ALL, &off, sizeof(off)) != 0)) {
    close(fd);
    return false;
  }
  sockaddr_in6 a;
  const socklen_t alen = sockaddr_of(IpAddr(), cfg_.mcast_port, &a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), alen) != 0) {
    close(fd);
    return false;
  }
  setsockopt(fd, IPPROTO_IP, IP_RECVTOS, &on, sizeof(on));
  if (family_ == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, &on, sizeof(on));
  set_buf(fd, SO_RCVBUFFORCE, SO_RCVBUF, cfg_.sock_buf);
  mc_.push_back(McSocket{fd, false, false});
  arm_mc_recv(mc_.size() - 1);
  io_uring_submit(&ring_);
  return true;
}

// An IPv4 group is joined on the link's address (a link bound to the
// wildcard lets the route pick the interface), an IPv6 one on the
// interface the route to the group picks.
bool UdpLink::membership(int fd, const IpAddr& group, bool join) {
  if (group.is_v4()) {
    ip_mreq m{};
    m.imr_multiaddr.s_addr = htonl(group.v4());
    m.imr_interface.s_addr = htonl(cfg_.local.is_v4() ? cfg_.local.v4() : INADDR_ANY);
    return setsockopt(fd, IPPROTO_IP, join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &m, sizeof(m)) == 0;
  }
  if (family_ != AF_INET6) {
    errno = EAFNOSUPPORT;
    return false;
  }
  ipv6_mreq m{};
  std::memcpy(&m.ipv6mr_multiaddr, group.b.data(), 16);
  return setsockopt(fd, IPPROTO_IPV6, join ? IPV6_JOIN_GROUP : IPV6_LEAVE_GROUP, &m, sizeof(m)) == 0;
}

bool UdpLink::join_group(const IpAddr& group, bool join) {
  if (!ok() || !cfg_.mcast_port || !group.is_multicast()) return false;
  auto at = mc_group_.find(group);
  if (!join) {
    if (at == mc_group_.end()) return false;
    McSocket& s = mc_[at->second];
    const bool ok = membership(s.fd, group, false);
    s.full = false;
    mc_group_.erase(at);
    return ok;
  }
  if (at != mc_group_.end()) return true;
  // The first socket that takes one more membership; ENOBUFS is its
  // per-socket limit, so the next one (or a new one) is tried.
  for (size_t i = 0;; i++) {
    if (i == mc_.size() && !open_mc()) return false;
    McSocket& s = mc_[i];
    if (s.full) continue;
    if (membership(s.fd, group, true)) {
      mc_group_[group] = i;
      return true;
    }
    if (errno != ENOBUFS) return false;
    s.full = true;
  }
}

void UdpLink::send(uint16_t path, const IpAddr& src, const Endpoint& dst, const uint8_t* hdr,
                   size_t hdr_len, const HostSpan* payload, size_t nspans) {
  send_trailed(path, src, dst, hdr, hdr_len, payload, nspans, nullptr, 0);
}

void UdpLink::send_trailed(uint16_t path, const IpAddr& src, const Endpoint& dst, const uint8_t* hdr,
                           size_t hdr_len, const HostSpan* payload, size_t nspans, const uint8_t* trailer,
                           size_t trailer_len) {
  if (!ok()) return;
  sockaddr_in6 to;
  const socklen_t tolen = sockaddr_of(dst.ip, dst.port, &to);
  const size_t ntail = trailer_len ? 1 : 0;
  if (nspans + 1 + ntail > size_t(kMaxIov) || hdr_len > sizeof(TxSlot::hdr[0]) ||
      trailer_len > sizeof(TxSlot::tail[0]) || tolen == 0) {
    stats_.tx_err++;
    return;
  }
  // A link bound to one address sends from it, whatever src says.
  const IpAddr from = cfg_.local.unspecified() ? src : IpAddr();
  path = uint16_t(path % fds_.size());
  size_t len = hdr_len + trailer_len;
  for (size_t i = 0; i < nspans; i++) len += payload[i].len;
  if (open_ >= 0) {
    // GSO: the datagram joins the open send if the kernel can cut it out of
    // the same buffer (same socket, same source and destination, not longer
    // than the segment size, which only the last may undercut).
    TxSlot& t = tx_[size_t(open_)];
    if (!ntail && t.path == path && t.src == from && t.msg.msg_namelen == tolen &&
        std::memcmp(&t.dst, &to, tolen) == 0 && !t.closed &&
        len <= t.seg_len && t.segs < kMaxGsoSegs && t.bytes + len <= kGsoMaxBytes &&
        t.msg.msg_iovlen + 1 + nspans + ntail <= size_t(cfg_.zerocopy ? kZcMaxIov : kSlotIov)) {
      std::memcpy(t.hdr[t.segs], hdr, hdr_len);
      iovec* v = t.iov + t.msg.msg_iovlen;
      v[0] = {t.hdr[t.segs], hdr_len};
      for (size_t i = 0; i < nspans; i++) v[1 + i] = {payload[i].ptr, payload[i].len};
      if (ntail) {
        std::memcpy(t.tail[t.segs], trailer, trailer_len);
        v[1 + nspans] = {t.tail[t.segs], trailer_len};
      }
      t.msg.msg_iovlen += 1 + nspans + ntail;
      t.segs++;
      t.bytes += uint32_t(len);
      t.closed = len < t.seg_len;
      if (t.closed || t.segs == kMaxGsoSegs) {
        submit_slot(uint32_t(open_));
        open_ = -1;
      }
      return;
    }
    submit_slot(uint32_t(open_));
    open_ = -1;
  }
  if (tx_free_.empty()) flush();
  uint32_t idx = tx_free_.back();
  tx_free_.pop_back();
  TxSlot& t = tx_[idx];
  std::memcpy(t.hdr[0], hdr, hdr_len);
  t.iov[0] = {t.hdr[0], hdr_len};
  for (size_t i = 0; i < nspans; i++) t.iov[1 + i] = {payload[i].ptr, payload[i].len};
  if (ntail) {
    std::memcpy(t.tail[0], trailer, trailer_len);
    t.iov[1 + nspans] = {t.tail[0], trailer_len};
  }
  t.dst = to;
  t.src = from;
  t.msg = msghdr{};
  // Unconnected: the destination travels with each send, the source port
  // is the path's socket.
  t.msg.msg_name = &t.dst;
  t.msg.msg_namelen = tolen;
  t.msg.msg_iov = t.iov;
  t.msg.msg_iovlen = 1 + nspans + ntail;
  t.path = path;
  // A RoCE v2 datagram leaves from the RoCE socket (open_roce_socket: its
  // IPv4 identification is 0, which the ICRC covers).
  t.fd = ntail && roce_fd_ >= 0 ? roce_fd_ : fds_[path];
  t.segs = 1;
  t.seg_len = uint32_t(len);
  t.bytes = uint32_t(len);
  t.closed = false;
  // A datagram with a trailer (RoCE v2) goes alone: the kernel numbers the
  // IPv4 identification of GSO segments one by one, and a RoCE v2 ICRC
  // covers it; alone, on an unconnected socket with DF, it is 0.
  if (gso_mode() && gso_ok_ && !ntail) open_ = idx;
  else submit_slot(idx);
}

// A slot's control messages: with more than one datagram in it, the
// segment size (UDP_SEGMENT); with a source named, the source address
// (IPV6_PKTINFO, which an IPv6 socket also takes for IPv4 as ::ffff:a.b.c.d;
// IP_PKTINFO on IPv4 sockets).
void UdpLink::fill_control(TxSlot& t) {
  const bool v6 = family_ == AF_INET6;
  const bool src = !t.src.unspecified();
  const size_t len = (t.segs > 1 ? CMSG_SPACE(sizeof(uint16_t)) : 0) +
                     (src ? (v6 ? CMSG_SPACE(sizeof(in6_pktinfo)) : CMSG_SPACE(sizeof(in_pktinfo))) : 0);
  t.msg.msg_control = len ? t.cmsg : nullptr;
  t.msg.msg_controllen = len;
  if (!len) return;
  std::memset(t.cmsg, 0, len);
  cmsghdr* c = CMSG_FIRSTHDR(&t.msg);
  if (t.segs > 1) {
    c->cmsg_level = SOL_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    const uint16_t seg = uint16_t(t.seg_len);
    std::memcpy(CMSG_DATA(c), &seg, sizeof(seg));
    c = CMSG_NXTHDR(&t.msg, c);
  }
  if (!src) return;
  if (v6) {
    in6_pktinfo pi{};
    std::memcpy(&pi.ipi6_addr, t.src.b.data(), 16);
    c->cmsg_level = IPPROTO_IPV6;
    c->cmsg_type = IPV6_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(pi));
    std::memcpy(CMSG_DATA(c), &pi, sizeof(pi));
  } else {
    in_pktinfo pi{};
    pi.ipi_spec_dst.s_addr = htonl(t.src.v4());
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_PKTINFO;
    c->cmsg_len = CMSG_LEN(sizeof(pi));
    std::memcpy(CMSG_DATA(c), &pi, sizeof(pi));
  }
}

// Queue one slot's sendmsg, with its control messages (fill_control).
void UdpLink::submit_slot(uint32_t idx) {
  TxSlot& t = tx_[idx];
  fill_control(t);
  io_uring_sqe* s = sqe();
  // A zero-copy send's buffer becomes the skb's page fragments (at most
  // MAX_SKB_FRAGS, 17; more is EMSGSIZE), an iovec one or two of them.
  if (cfg_.zerocopy && t.bytes >= cfg_.zc_min_bytes && t.msg.msg_iovlen <= kZcMaxIov) {
    io_uring_prep_sendmsg_zc(s, t.fd, &t.msg, 0);
    s->ioprio |= IORING_SEND_ZC_REPORT_USAGE;
    stats_.tx_zc++;
  } else {
    io_uring_prep_sendmsg(s, t.fd, &t.msg, 0);
  }
  io_uring_sqe_set_data64(s, kTxTag | idx);
  stats_.tx_sends++;
  tx_inflight_++;
  tx_unsubmitted_ = true;
}

// A segmented send the route cannot take (a device without checksum
// offload, a route MTU below the segment size: EIO or EINVAL) is sent again
// one datagram per sendmsg, and the link stops segmenting. Called while the
// payload is still valid (before flush() returns).
void UdpLink::resend_unsegmented(const TxSlot& t) {
  gso_ok_ = false;
  stats_.tx_gso_fallbacks++;
  size_t v = 0;
  for (uint16_t k = 0; k < t.segs; k++) {
    if (tx_free_.empty()) {  // every slot busy: the rest are lost (the transport resends)
      stats_.tx_err += t.segs - k;
      return;
    }
    const uint32_t idx = tx_free_.back();
    tx_free_.pop_back();
    TxSlot& n = tx_[idx];
    // The datagram's iovecs: its header, then payload up to seg_len bytes.
    size_t want = k + 1 < t.segs ? t.seg_len : t.bytes - size_t(k) * t.seg_len;
    std::memcpy(n.hdr[0], t.iov[v].iov_base, t.iov[v].iov_len);
    n.iov[0] = {n.hdr[0], t.iov[v].iov_len};
    want -= t.iov[v].iov_len;
    size_t ni = 1;
    for (v++; want > 0 && v < t.msg.msg_iovlen; v++) {
      n.iov[ni++] = t.iov[v];
      want -= t.iov[v].iov_len;
      // A trailer lives in t, which is free for reuse once this returns:
      // copied, as the header is.
      const auto* b = static_cast<const uint8_t*>(t.iov[v].iov_base);
      if (b >= &t.tail[0][0] && b < &t.tail[0][0] + sizeof(t.tail)) {
        std::memcpy(n.tail[0], b, t.iov[v].iov_len);
        n.iov[ni - 1].iov_base = n.tail[0];
      }
    }
    n.dst = t.dst;
    n.src = t.src;
    n.msg = msghdr{};
    n.msg.msg_name = &n.dst;
    n.msg.msg_namelen = t.msg.msg_namelen;
    n.msg.msg_iov = n.iov;
    n.msg.msg_iovlen = ni;
    n.path = t.path;
    n.fd = t.fd;
    n.segs = 1;
    n.seg_len = n.bytes = uint32_t(k + 1 < t.segs ? t.seg_len : t.bytes - size_t(k) * t.seg_len);
    n.closed = true;
    submit_slot(idx);
  }
}

// Submit the batch and wait until the kernel has taken every datagram (and,
// for zero-copy sends, given the pages back), so the payload spans (pointing
// into MR memory) may change afterwards.
void UdpLink::flush() {
  if (!ok()) return;
  if (open_ >= 0) {
    submit_slot(uint32_t(open_));
    open_ = -1;
  }
  if (tx_inflight_ == 0) return;
  size_t none = 0;
  while (tx_inflight_ > 0) {
    if (tx_unsubmitted_) {
      io_uring_submit(&ring_);
      stats_.submits++;
      tx_unsubmitted_ = false;
    }
    reap(nullptr, none);
    if (tx_inflight_ == 0 || tx_unsubmitted_) continue;
    io_uring_cqe* c;
    io_uring_wait_cqe(&ring_, &c);
  }
}

void UdpLink::tx_complete(uint32_t idx, int32_t res, uint32_t flags) {
  TxSlot& t = tx_[idx];
  if (flags & IORING_CQE_F_NOTIF) {  // zero-copy: the kernel let go of the pages
    if (uint32_t(res) & IORING_NOTIF_USAGE_ZC_COPIED) stats_.tx_zc_copied++;
  } else {
    if (res >= 0) {
      stats_.tx += t.segs;
    } else if (t.segs > 1 && (res == -EIO || res == -EINVAL)) {
      resend_unsegmented(t);
    } else {
      stats_.tx_err += t.segs;
    }
    if (flags & IORING_CQE_F_MORE) return;  // a notification follows
  }
  tx_free_.push_back(idx);
  tx_inflight_--;
}

void UdpLink::reap(RxSink* sink, size_t& delivered) {
  // Copy the CQEs out and release the ring entries before handling any: a
  // handler may send, and send may flush, which reaps again.
  struct C { uint64_t data; int32_t res; uint32_t flags; };
  C local[256];
  for (;;) {
    io_uring_cqe* cqes[256];
    unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, 256);
    if (n == 0) return;
    for (unsigned i = 0; i < n; i++) local[i] = {io_uring_cqe_get_data64(cqes[i]), cqes[i]->res, cqes[i]->flags};
    io_uring_cq_advance(&ring_, n);
    for (unsigned i = 0; i < n; i++) {
      if (local[i].data & kTxTag) {
        tx_complete(uint32_t(local[i].data), local[i].res, local[i].flags);
        continue;
      }
      if (!(local[i].flags & IORING_CQE_F_MORE)) {
        const uint64_t d = local[i].data;
        if ((d >> 32) == (kMcRxTag >> 32)) {
          if (uint32_t(d) < mc_.size()) mc_[uint32_t(d)].armed = false;
        } else if (d == kRoceRxTag) {
          roce_armed_ = false;
        } else {
          rx_armed_ = false;
        }
      }
      if (local[i].res < 0) {
        if (local[i].res == -ENOBUFS) stats_.rx_nobufs++;
        continue;
      }
      if (!(local[i].flags & IORING_CQE_F_BUFFER)) continue;
      if (!sink) {
        stash_.push_back({local[i].res, local[i].flags});
        continue;
      }
      handle_cqe(local[i].res, local[i].flags, sink, delivered);
    }
  }
}

void UdpLink::handle_cqe(int32_t res, uint32_t flags, RxSink* sink, size_t& delivered) {
  uint16_t bid = uint16_t(flags >> IORING_CQE_BUFFER_SHIFT);
  if (bid >= cfg_.rx_buffers) return;
  uint8_t* buf = rx_mem_ + size_t(bid) * rx_buf_len_;
  io_uring_recvmsg_out* o = io_uring_recvmsg_validate(buf, res, &rx_msg_);
  if (o && (o->flags & MSG_TRUNC)) {
    stats_.rx_trunc++;
  } else if (Endpoint from; o && sender_of(io_uring_recvmsg_name(o), o->namelen, &from)) {
    bool ce = false;
    IpAddr to;         // the address it was sent to (unspecified: not said)
    uint32_t seg = 0;  // UDP_GRO: the datagrams' size (the last may be shorter)
    for (cmsghdr* c = io_uring_recvmsg_cmsg_firsthdr(o, &rx_msg_); c;
         c = io_uring_recvmsg_cmsg_nexthdr(o, &rx_msg_, c)) {
      if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS)
        ce = (*reinterpret_cast<uint8_t*>(CMSG_DATA(c)) & 3) == 3;
      if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
        int v;
        std::memcpy(&v, CMSG_DATA(c), sizeof(v));
        ce = (v & 3) == 3;
      }
      if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO &&
          c->cmsg_len >= CMSG_LEN(sizeof(in6_pktinfo))) {
        in6_pktinfo pi;
        std::memcpy(&pi, CMSG_DATA(c), sizeof(pi));
        to = IpAddr::from_bytes(pi.ipi6_addr.s6_addr);
      }
      if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO && c->cmsg_len >= CMSG_LEN(sizeof(in_pktinfo))) {
        in_pktinfo pi;
        std::memcpy(&pi, CMSG_DATA(c), sizeof(pi));
        to = IpAddr(ntohl(pi.ipi_addr.s_addr));
      }
      if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
        int v;
        std::memcpy(&v, CMSG_DATA(c), sizeof(v));
        seg = v > 0 ? uint32_t(v) : 0;
      }
    }
    const uint8_t* payload = static_cast<const uint8_t*>(io_uring_recvmsg_payload(o, &rx_msg_));
    uint32_t plen = io_uring_recvmsg_payload_length(o, res, &rx_msg_);
    if (seg == 0 || seg > plen) seg = plen;
    stats_.rx_bufs++;
    // The datagrams are handed over where they lie: no copy of our own.
    uint32_t off = 0;
    do {
      const uint32_t n = std::min(seg, plen - off);
      stats_.rx++;
      delivered++;
      sink->on_datagram(payload + off, n, from, to, ce);
      off += n;
    } while (off < plen);
  }
  io_uring_buf_ring_add(br_, buf, unsigned(rx_buf_len_), bid, io_uring_buf_ring_mask(cfg_.rx_buffers), 0);
  io_uring_buf_ring_advance(br_, 1);
}

size_t UdpLink::poll(uint64_t timeout_ns, RxSink& sink) {
  size_t delivered = 0;
  if (!ok()) return 0;
  while (!stash_.empty()) {
    std::vector<Stashed> s;
    s.swap(stash_);
    for (auto& x : s) handle_cqe(x.res, x.flags, &sink, delivered);
  }
  reap(&sink, delivered);
  if (!rx_armed_) arm_recv();
  if (roce_fd_ >= 0 && !roce_armed_) arm_roce_recv();
  mc_arm_missing();
  if (delivered == 0 && timeout_ns > 0) {
    __kernel_timespec ts;
    ts.tv_sec = int64_t(timeout_ns / 1'000'000'000ull);
    ts.tv_nsec = int64_t(timeout_ns % 1'000'000'000ull);
    io_uring_cqe* c;
    io_uring_submit_and_wait_timeout(&ring_, &c, 1, &ts, nullptr);
    stats_.waits++;
    reap(&sink, delivered);
  } else if (io_uring_sq_ready(&ring_)) {
    io_uring_submit(&ring_);
  }
  bool rearm_rx = !rx_armed_;
  if (rearm_rx) arm_recv();
  if (roce_fd_ >= 0 && !roce_armed_) {
    arm_roce_recv();
    rearm_rx = true;
  }
  if (mc_arm_missing() || rearm_rx) io_uring_submit(&ring_);
  return delivered;
}

}  // namespace vstellar
