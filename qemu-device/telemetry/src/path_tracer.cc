// Raw-socket probes and their ICMP answers (path_tracer.h says why raw).
#include "vstellar/telemetry/path_tracer.h"

#include <arpa/inet.h>
#include <linux/icmp.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "vstellar/wire.h"

namespace vstellar::telemetry {

namespace {

// The probe's UDP payload: the engine's trace magic, then who sent it.
struct ProbePayload {
  uint8_t magic[4];
  uint32_t nonce;  // network order
  uint32_t id;     // network order
  uint8_t ttl;
  uint8_t pad[3];
};
static_assert(sizeof(ProbePayload) == wire::kTraceProbeLen);

uint16_t csum_fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return uint16_t(~sum);
}

uint32_t csum_add(uint32_t sum, const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i + 1 < len; i += 2) sum += uint32_t(p[i]) << 8 | p[i + 1];
  if (len & 1) sum += uint32_t(p[len - 1]) << 8;
  return sum;
}

}  // namespace

PathTracer::PathTracer(const IpAddr& local, uint16_t base_port, uint16_t num_paths)
    : local_(local), base_port_(base_port), num_paths_(num_paths) {
  if (getrandom(&nonce_, sizeof(nonce_), 0) != sizeof(nonce_)) nonce_ = uint32_t(getpid()) * 2654435761u;
  if (!local.is_v4() || local.unspecified()) {
    error_ = "path tracing needs the engine's IPv4 address (IPv6 and wildcard links are not traced)";
    return;
  }
  raw_fd_ = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
  if (raw_fd_ < 0) {
    error_ = std::string("raw socket for path probes: ") + strerror(errno) +
             (errno == EPERM ? " (needs CAP_NET_RAW)" : "");
    return;
  }
  icmp_fd_ = socket(AF_INET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_ICMP);
  if (icmp_fd_ < 0) {
    error_ = std::string("raw ICMP socket for probe answers: ") + strerror(errno) +
             (errno == EPERM ? " (needs CAP_NET_RAW)" : "");
    return;
  }
  // Only the two types an expired or refused probe brings (ICMP_FILTER
  // passes the types whose bit is clear).
  icmp_filter f{};
  f.data = ~((1u << ICMP_TIME_EXCEEDED) | (1u << ICMP_DEST_UNREACH));
  setsockopt(icmp_fd_, SOL_RAW, ICMP_FILTER, &f, sizeof(f));
  // The kernel's arrival time of each answer, so that an owner may read
  // them in batches (a syscall per engine loop turn would cost more than
  // the rest of the locator) and still get the hop's RTT.
  const int on = 1;
  setsockopt(icmp_fd_, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof(on));
}

PathTracer::~PathTracer() {
  if (raw_fd_ >= 0) close(raw_fd_);
  if (icmp_fd_ >= 0) close(icmp_fd_);
}

bool PathTracer::send_probe(const Endpoint& peer, uint16_t path, uint8_t ttl, uint32_t id) {
  if (!ok() || !peer.ip.is_v4() || path >= num_paths_) return false;
  struct {
    iphdr ip;
    udphdr udp;
    ProbePayload pl;
  } __attribute__((packed)) pkt{};
  pkt.ip.version = 4;
  pkt.ip.ihl = 5;
  pkt.ip.tot_len = htons(sizeof(pkt));
  pkt.ip.frag_off = htons(IP_DF);
  pkt.ip.ttl = ttl;
  pkt.ip.protocol = IPPROTO_UDP;
  pkt.ip.saddr = htonl(local_.v4());
  pkt.ip.daddr = htonl(peer.ip.v4());
  // The kernel fills in the IP checksum and, being 0, the identification.
  pkt.udp.source = htons(uint16_t(base_port_ + path));
  pkt.udp.dest = htons(peer.port);
  pkt.udp.len = htons(sizeof(pkt.udp) + sizeof(pkt.pl));
  std::memcpy(pkt.pl.magic, wire::kTraceMagic, sizeof(pkt.pl.magic));
  pkt.pl.nonce = htonl(nonce_);
  pkt.pl.id = htonl(id);
  pkt.pl.ttl = ttl;
  // UDP checksum over the pseudo-header, as any host's stack would send.
  uint32_t sum = 0;
  sum = csum_add(sum, &pkt.ip.saddr, 8);
  sum += IPPROTO_UDP + sizeof(pkt.udp) + sizeof(pkt.pl);
  sum = csum_add(sum, &pkt.udp, sizeof(pkt.udp) + sizeof(pkt.pl));
  pkt.udp.check = htons(csum_fold(sum));
  if (pkt.udp.check == 0) pkt.udp.check = 0xffff;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = pkt.ip.daddr;
  if (sendto(raw_fd_, &pkt, sizeof(pkt), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&to), sizeof(to)) < 0) {
    stats_.send_errors++;
    return false;
  }
  stats_.probes_sent++;
  stats_.probe_bytes += sizeof(pkt);
  return true;
}

size_t PathTracer::poll(uint64_t now_ns, const std::function<void(const HopReply&)>& f) {
  if (icmp_fd_ < 0) return 0;
  size_t n = 0;
  uint8_t buf[1500];
  alignas(cmsghdr) uint8_t control[CMSG_SPACE(sizeof(timespec))];
  timespec real_now{};
  clock_gettime(CLOCK_REALTIME, &real_now);
  const int64_t real_now_ns = int64_t(real_now.tv_sec) * 1'000'000'000 + real_now.tv_nsec;
  for (;;) {
    iovec iov{buf, sizeof(buf)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t len = recvmsg(icmp_fd_, &msg, 0);
    if (len < 0) break;  // EAGAIN: nothing more
    // Arrival on the caller's clock: now, less how long ago the kernel
    // took it in (SO_TIMESTAMPNS is CLOCK_REALTIME).
    uint64_t at = now_ns;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
        timespec ts;
        std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
        const int64_t ago = real_now_ns - (int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec);
        if (ago > 0 && uint64_t(ago) < now_ns) at = now_ns - uint64_t(ago);
      }
    // outer IP | ICMP (8) | the probe's IP header | UDP | our payload
    if (size_t(len) < sizeof(iphdr)) continue;
    const auto* outer = reinterpret_cast<const iphdr*>(buf);
    const size_t ohl = size_t(outer->ihl) * 4;
    const size_t need = ohl + 8 + sizeof(iphdr) + sizeof(udphdr) + sizeof(ProbePayload);
    if (ohl < sizeof(iphdr) || size_t(len) < need) {
      stats_.icmp_ignored++;
      continue;
    }
    const uint8_t* icmp = buf + ohl;
    const auto* inner = reinterpret_cast<const iphdr*>(icmp + 8);
    const size_t ihl = size_t(inner->ihl) * 4;
    if (ihl < sizeof(iphdr) || size_t(len) < ohl + 8 + ihl + sizeof(udphdr) + sizeof(ProbePayload) ||
        inner->protocol != IPPROTO_UDP || ntohl(inner->saddr) != local_.v4()) {
      stats_.icmp_ignored++;
      continue;
    }
    const auto* udp = reinterpret_cast<const udphdr*>(icmp + 8 + ihl);
    ProbePayload pl;
    std::memcpy(&pl, reinterpret_cast<const uint8_t*>(udp) + sizeof(udphdr), sizeof(pl));
    const uint16_t sport = ntohs(udp->source);
    if (std::memcmp(pl.magic, wire::kTraceMagic, sizeof(pl.magic)) != 0 || ntohl(pl.nonce) != nonce_ ||
        sport < base_port_ || sport >= base_port_ + num_paths_) {
      stats_.icmp_ignored++;
      continue;
    }
    // The peer itself refusing it (port unreachable) is not a hop.
    if (outer->saddr == inner->daddr) {
      stats_.icmp_ignored++;
      continue;
    }
    HopReply r;
    r.id = ntohl(pl.id);
    r.hop = IpAddr(ntohl(outer->saddr));
    r.at_ns = at;
    stats_.replies++;
    n++;
    f(r);
  }
  return n;
}

}  // namespace vstellar::telemetry
