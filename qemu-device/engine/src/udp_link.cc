#include "vstellar/udp_link.h"

#include <arpa/inet.h>
#include <netinet/ip.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace vstellar {
namespace {

constexpr uint64_t kTxTag = 1ull << 32;
constexpr uint64_t kRxTag = 2ull << 32;
constexpr uint64_t kMcRxTag = 4ull << 32;
constexpr uint16_t kBufGroup = 0;

void set_buf(int fd, int force_opt, int opt, int bytes) {
  if (setsockopt(fd, SOL_SOCKET, force_opt, &bytes, sizeof(bytes)) != 0)
    setsockopt(fd, SOL_SOCKET, opt, &bytes, sizeof(bytes));
}

}  // namespace

UdpLink::UdpLink(const UdpLinkConfig& cfg) : cfg_(cfg) {
  if (cfg_.num_paths < 1 || cfg_.num_paths > 256) {
    error_ = "num_paths must be 1..256";
    return;
  }
  if (cfg_.rx_buffers & (cfg_.rx_buffers - 1)) {
    error_ = "rx_buffers must be a power of two";
    return;
  }
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
    return;
  }
  ring_ok_ = true;
  event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_fd_ < 0 || io_uring_register_eventfd(&ring_, event_fd_) < 0) {
    error_ = std::string("io_uring eventfd: ") + strerror(errno);
    return;
  }

  for (uint16_t i = 0; i < cfg_.num_paths; i++) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error_ = std::string("socket: ") + strerror(errno);
      return;
    }
    fds_.push_back(fd);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(cfg_.local_ip);
    a.sin_port = htons(uint16_t(cfg_.base_port + i));
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      error_ = "bind port " + std::to_string(cfg_.base_port + i) + ": " + strerror(errno);
      return;
    }
    set_buf(fd, SO_SNDBUFFORCE, SO_SNDBUF, cfg_.sock_buf);
    if (cfg_.mcast_port) {  // datagrams to a group leave from our own address
      in_addr ifa{htonl(cfg_.local_ip)};
      setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &ifa, sizeof(ifa));
    }
    if (cfg_.ecn) {
      int tos = 0x02;  // ECT(0): a fabric may mark CE instead of dropping
      setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof(tos));
    }
  }
  set_buf(fds_[0], SO_RCVBUFFORCE, SO_RCVBUF, cfg_.sock_buf);
  int on = 1;
  setsockopt(fds_[0], IPPROTO_IP, IP_RECVTOS, &on, sizeof(on));

  tx_.resize(cfg_.tx_slots);
  for (uint32_t i = 0; i < cfg_.tx_slots; i++) tx_free_.push_back(cfg_.tx_slots - 1 - i);

  // Provided-buffer ring: the kernel picks a buffer per datagram.
  rx_buf_len_ = (cfg_.max_datagram + sizeof(io_uring_recvmsg_out) + sizeof(sockaddr_in) +
                 CMSG_SPACE(sizeof(int)) + 63) & ~size_t(63);
  br_bytes_ = cfg_.rx_buffers * sizeof(io_uring_buf);
  void* m = mmap(nullptr, br_bytes_, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
  if (m == MAP_FAILED) {
    error_ = "mmap buffer ring";
    return;
  }
  br_ = static_cast<io_uring_buf_ring*>(m);
  io_uring_buf_ring_init(br_);
  io_uring_buf_reg reg{};
  reg.ring_addr = uint64_t(uintptr_t(br_));
  reg.ring_entries = cfg_.rx_buffers;
  reg.bgid = kBufGroup;
  r = io_uring_register_buf_ring(&ring_, &reg, 0);
  if (r < 0) {
    error_ = std::string("io_uring_register_buf_ring: ") + strerror(-r);
    return;
  }
  rx_mem_ = static_cast<uint8_t*>(aligned_alloc(4096, ((rx_buf_len_ * cfg_.rx_buffers) + 4095) & ~size_t(4095)));
  int mask = io_uring_buf_ring_mask(cfg_.rx_buffers);
  for (uint32_t i = 0; i < cfg_.rx_buffers; i++)
    io_uring_buf_ring_add(br_, rx_mem_ + i * rx_buf_len_, unsigned(rx_buf_len_), uint16_t(i), mask, int(i));
  io_uring_buf_ring_advance(br_, int(cfg_.rx_buffers));
  rx_msg_.msg_namelen = sizeof(sockaddr_in);
  rx_msg_.msg_controllen = CMSG_SPACE(sizeof(int));
  arm_recv();
  io_uring_submit(&ring_);
}

UdpLink::~UdpLink() {
  if (ring_ok_) {
    // Cancel the multishot receive and wait for it to end: a request still in
    // flight holds its socket, and the ring's teardown is asynchronous, so
    // without this the ports would stay bound for a moment after we exit.
    if (rx_armed_ || mc_armed_) {
      for (uint64_t tag : {kRxTag, kMcRxTag}) {
        io_uring_sqe* s = sqe();
        io_uring_prep_cancel64(s, tag, 0);
        io_uring_sqe_set_data64(s, 3ull << 32);
      }
      io_uring_submit(&ring_);
      uint64_t deadline_loops = 100;
      while ((rx_armed_ || mc_armed_) && deadline_loops--) {
        __kernel_timespec ts{0, 1'000'000};
        io_uring_cqe* c;
        if (io_uring_wait_cqe_timeout(&ring_, &c, &ts) != 0) continue;
        uint64_t d = io_uring_cqe_get_data64(c);
        if (d == kRxTag && !(c->flags & IORING_CQE_F_MORE)) rx_armed_ = false;
        if (d == kMcRxTag && !(c->flags & IORING_CQE_F_MORE)) mc_armed_ = false;
        if ((d >> 32) == 1) {
          tx_inflight_--;
        }
        io_uring_cqe_seen(&ring_, c);
      }
    }
    io_uring_queue_exit(&ring_);
  }
  for (int fd : fds_) close(fd);
  if (mc_fd_ >= 0) close(mc_fd_);
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

void UdpLink::arm_mc_recv() {
  io_uring_sqe* s = sqe();
  io_uring_prep_recvmsg_multishot(s, mc_fd_, &rx_msg_, 0);
  s->flags |= IOSQE_BUFFER_SELECT;
  s->buf_group = kBufGroup;
  io_uring_sqe_set_data64(s, kMcRxTag);
  mc_armed_ = true;
}

// The wildcard socket on mcast_port that group datagrams arrive on. A
// socket bound to our unicast address (the base port's) never sees them.
bool UdpLink::open_mc() {
  if (mc_fd_ >= 0) return true;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(cfg_.mcast_port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return false;
  }
  setsockopt(fd, IPPROTO_IP, IP_RECVTOS, &on, sizeof(on));
  set_buf(fd, SO_RCVBUFFORCE, SO_RCVBUF, cfg_.sock_buf);
  mc_fd_ = fd;
  arm_mc_recv();
  io_uring_submit(&ring_);
  return true;
}

bool UdpLink::join_group(uint32_t group, bool join) {
  if (!ok() || !cfg_.mcast_port || (join && !open_mc()) || mc_fd_ < 0) return false;
  ip_mreq m{};
  m.imr_multiaddr.s_addr = htonl(group);
  m.imr_interface.s_addr = htonl(cfg_.local_ip);
  return setsockopt(mc_fd_, IPPROTO_IP, join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &m, sizeof(m)) == 0;
}

void UdpLink::send(uint16_t path, const Endpoint& dst, const uint8_t* hdr, size_t hdr_len,
                   const HostSpan* payload, size_t nspans) {
  if (!ok()) return;
  if (tx_free_.empty()) flush();
  if (nspans + 1 > size_t(kMaxIov) || hdr_len > sizeof(TxSlot::hdr)) {
    stats_.tx_err++;
    return;
  }
  uint32_t idx = tx_free_.back();
  tx_free_.pop_back();
  TxSlot& t = tx_[idx];
  std::memcpy(t.hdr, hdr, hdr_len);
  t.iov[0] = {t.hdr, hdr_len};
  for (size_t i = 0; i < nspans; i++) t.iov[1 + i] = {payload[i].ptr, payload[i].len};
  t.dst = sockaddr_in{};
  t.dst.sin_family = AF_INET;
  t.dst.sin_port = htons(dst.port);
  t.dst.sin_addr.s_addr = htonl(dst.ip);
  t.msg = msghdr{};
  t.msg.msg_name = &t.dst;
  t.msg.msg_namelen = sizeof(t.dst);
  t.msg.msg_iov = t.iov;
  t.msg.msg_iovlen = 1 + nspans;
  io_uring_sqe* s = sqe();
  // Unconnected: the destination travels with each datagram, the source
  // port is the path's socket.
  io_uring_prep_sendmsg(s, fds_[path % fds_.size()], &t.msg, 0);
  io_uring_sqe_set_data64(s, kTxTag | idx);
  tx_inflight_++;
  tx_unsubmitted_ = true;
}

// Submit the batch and wait until the kernel has taken every datagram, so
// the payload spans (pointing into MR memory) may change afterwards.
void UdpLink::flush() {
  if (!ok() || tx_inflight_ == 0) return;
  io_uring_submit(&ring_);
  stats_.submits++;
  tx_unsubmitted_ = false;
  size_t none = 0;
  while (tx_inflight_ > 0) {
    reap(nullptr, none);
    if (tx_inflight_ == 0) break;
    io_uring_cqe* c;
    io_uring_wait_cqe(&ring_, &c);
  }
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
        tx_free_.push_back(uint32_t(local[i].data));
        tx_inflight_--;
        if (local[i].res < 0) stats_.tx_err++;
        else stats_.tx++;
        continue;
      }
      if (!(local[i].flags & IORING_CQE_F_MORE)) {
        if (local[i].data == kMcRxTag) mc_armed_ = false;
        else rx_armed_ = false;
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
      io_uring_cqe fake{};
      fake.res = local[i].res;
      fake.flags = local[i].flags;
      handle_cqe(&fake, sink, delivered);
    }
  }
}

void UdpLink::handle_cqe(io_uring_cqe* cqe, RxSink* sink, size_t& delivered) {
  uint16_t bid = uint16_t(cqe->flags >> IORING_CQE_BUFFER_SHIFT);
  if (bid >= cfg_.rx_buffers) return;
  uint8_t* buf = rx_mem_ + size_t(bid) * rx_buf_len_;
  io_uring_recvmsg_out* o = io_uring_recvmsg_validate(buf, cqe->res, &rx_msg_);
  if (o && (o->flags & MSG_TRUNC)) {
    stats_.rx_trunc++;
  } else if (o && o->namelen >= sizeof(sockaddr_in)) {
    sockaddr_in sa;
    std::memcpy(&sa, io_uring_recvmsg_name(o), sizeof(sa));
    bool ce = false;
    for (cmsghdr* c = io_uring_recvmsg_cmsg_firsthdr(o, &rx_msg_); c;
         c = io_uring_recvmsg_cmsg_nexthdr(o, &rx_msg_, c)) {
      if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS)
        ce = (*reinterpret_cast<uint8_t*>(CMSG_DATA(c)) & 3) == 3;
    }
    const uint8_t* payload = static_cast<const uint8_t*>(io_uring_recvmsg_payload(o, &rx_msg_));
    uint32_t plen = io_uring_recvmsg_payload_length(o, cqe->res, &rx_msg_);
    stats_.rx++;
    delivered++;
    sink->on_datagram(payload, plen, Endpoint{ntohl(sa.sin_addr.s_addr), ntohs(sa.sin_port)},
                      ntohs(sa.sin_port), ce);
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
    for (auto& x : s) {
      io_uring_cqe fake{};
      fake.res = x.res;
      fake.flags = x.flags;
      handle_cqe(&fake, &sink, delivered);
    }
  }
  reap(&sink, delivered);
  if (!rx_armed_) arm_recv();
  if (mc_fd_ >= 0 && !mc_armed_) arm_mc_recv();
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
  if (!rx_armed_ || (mc_fd_ >= 0 && !mc_armed_)) {
    if (!rx_armed_) arm_recv();
    if (mc_fd_ >= 0 && !mc_armed_) arm_mc_recv();
    io_uring_submit(&ring_);
  }
  return delivered;
}

}  // namespace vstellar
