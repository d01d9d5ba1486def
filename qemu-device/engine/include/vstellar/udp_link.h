// UDP tunnels through io_uring. One socket per path, bound to base_port+path,
// sends unconnected (sendmsg with a destination): Linux ECMP hashes a
// connected socket with a per-socket random hash, so the path would not follow
// the source port. Receives go to the base port's socket through one
// multishot recvmsg with a provided-buffer ring, so a packet costs no syscall
// of its own; sends are batched and submitted once per flush().
//
// IP ECN: sockets send ECT(0) so a fabric can mark; the receive side reads the
// TOS byte (IP_RECVTOS) and reports CE to the engine.
//
// Addresses: the sockets are IPv6 ones that also carry IPv4 (IPV6_V6ONLY
// off, IPv4 peers as ::ffff:a.b.c.d), so one link speaks RoCE v2 over both;
// a host without IPv6 gets IPv4 sockets instead. A link bound to one
// address (UdpLinkConfig::local) sends from it. A link with no local
// address is bound to the wildcard and serves every address of the host
// (a daemon whose devices each have their own): each send names its source
// (IPV6_PKTINFO), and each receive says the address it arrived at, so the
// engine can tell which device's address a datagram was sent to.
//
// Two modes (UdpLinkConfig::mode). PLAIN: one sendmsg and one
// receive per datagram. GSO (the default): consecutive datagrams of one
// flush that leave from the same path (source port) for the same
// destination with the same size go to the kernel as one sendmsg with
// UDP_SEGMENT (at most kMaxGsoSegs datagrams and 64 KiB), which the stack
// carries as one buffer and cuts into datagrams at the device (or not at
// all on loopback); the receive socket sets UDP_GRO, so a burst of one
// source port may arrive as one buffer, which poll() cuts back into
// datagrams at the size the kernel reports. Every datagram on the wire is
// the same in both modes, so the two interoperate. With zerocopy, a GSO
// send of at least zc_min_bytes uses IORING_OP_SENDMSG_ZC (the payload is
// not copied; flush() then also waits for the kernel's release).
//
// Waking an owner: event_fd() is an eventfd registered with the ring, which
// the kernel signals whenever it posts a completion (a datagram arrived, a
// send finished), so an owner can sleep in epoll and poll(0) when it fires
// instead of waking on a timer to look.
#pragma once
#include <liburing.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "vstellar/link.h"

namespace vstellar {

enum class LinkMode : uint8_t { PLAIN, GSO };
const char* to_string(LinkMode m);
bool parse_link_mode(const std::string& s, LinkMode& out);

struct UdpLinkConfig {
  LinkMode mode = LinkMode::GSO;
  bool zerocopy = false;           // GSO mode: SENDMSG_ZC for sends of zc_min_bytes and more
  uint32_t zc_min_bytes = 32768;
  IpAddr local = IpAddr(0x7f000001);  // unspecified: the wildcard (see above)
  uint16_t base_port = 47000;
  uint16_t num_paths = 128;        // sockets on base_port .. base_port+num_paths-1
  uint32_t max_datagram = 4096 + 256;
  uint32_t rx_buffers = 0;         // provided buffers (power of two); 0: 1024 (PLAIN), 256 (GSO, 64 KiB each)
  uint32_t tx_slots = 512;         // sends in flight per flush
  int sock_buf = 16 << 20;         // SO_RCVBUF/SO_SNDBUF (forced when root)
  bool ecn = true;
  // UD multicast: a datagram to group G (IPv4 or IPv6) goes to G:mcast_port, where a
  // socket bound to the wildcard address (SO_REUSEADDR, so every engine of
  // the host has one) receives what the groups joined bring. 0: none.
  uint16_t mcast_port = 0;
  // Several links on the same ports, one per engine of a multi-threaded
  // daemon (vstellard --threads). With shards > 1 every socket is
  // bound with SO_REUSEPORT, and a classic BPF program on the base port's
  // group hands each arriving datagram to socket dst_qpn % shards of the
  // group, reading the big-endian dst_qpn at shard_qpn_offset of the UDP
  // payload (4, or 4 + the integrity prefix). Link k of the group must be
  // the k-th to bind (construct them one after the other); its engine
  // hands out only QPNs with qpn % shards == k (EngineConfig::qpn_shards).
  // A GSO buffer goes whole to the socket its first datagram picks, so the
  // owner of a link must pass on datagrams that belong to another.
  // Link 0 first makes sure no one else holds the ports (a socket of
  // another group, even one being closed, would shift the indices).
  uint16_t shards = 0;
  uint16_t shard = 0;  // this link's index in the group
  uint16_t shard_qpn_offset = 4;
  // Plain RoCE v2 peers (EngineConfig::roce) send to this port (IANA's
  // 4791): a socket bound to it on the link's address hands what arrives
  // to the same sink, and every datagram sent with a trailer
  // (send_trailed: RoCE v2) leaves from it, so from this port. 0: none.
  // Not with shards > 1 (the steering program reads our format's dst_qpn).
  uint16_t roce_port = 0;
};

class RxSink {
 public:
  virtual ~RxSink() = default;
  // `from`: the sender's address and source port (its path); `to`: the
  // address the datagram was sent to.
  virtual void on_datagram(const uint8_t* data, size_t len, const Endpoint& from, const IpAddr& to,
                           bool ce) = 0;
};

struct UdpLinkStats {
  uint64_t tx = 0, tx_err = 0, rx = 0, rx_trunc = 0, rx_nobufs = 0, submits = 0, waits = 0;
  // tx_sends: sendmsg requests (tx / tx_sends = datagrams per send);
  // tx_zc: of them zero-copy, tx_zc_copied: ones the kernel copied anyway;
  // rx_bufs: receive completions (rx / rx_bufs = datagrams per receive).
  // tx_gso_fallbacks: segmented sends the route refused (then the link
  // sends one datagram per sendmsg).
  uint64_t tx_sends = 0, tx_zc = 0, tx_zc_copied = 0, rx_bufs = 0, tx_gso_fallbacks = 0;
};

class UdpLink final : public Link {
 public:
  explicit UdpLink(const UdpLinkConfig& cfg);
  ~UdpLink() override;
  UdpLink(const UdpLink&) = delete;
  UdpLink& operator=(const UdpLink&) = delete;

  bool ok() const { return error_.empty(); }
  // With shards: datagrams for these QPNs go to socket `shard` of the
  // group instead of qpn % shards (QPs moved to another engine of the
  // process, Engine::detach). The group's steering program is replaced
  // whole; at most kMaxSteeringExceptions are in it, the others still
  // reach qpn % shards (whose owner passes them on). May be called from
  // any thread; false with errno's text in *err if the kernel refused.
  static constexpr size_t kMaxSteeringExceptions = 1000;
  bool steer(const std::vector<std::pair<uint32_t, uint16_t>>& exceptions, std::string* err);
  const std::string& error() const { return error_; }

  void send(uint16_t path, const IpAddr& src, const Endpoint& dst, const uint8_t* hdr, size_t hdr_len,
            const HostSpan* payload, size_t nspans) override;
  void send_trailed(uint16_t path, const IpAddr& src, const Endpoint& dst, const uint8_t* hdr, size_t hdr_len,
                    const HostSpan* payload, size_t nspans, const uint8_t* trailer, size_t trailer_len) override;
  void flush() override;
  bool join_group(const IpAddr& group, bool join) override;

  // Hand every datagram that has arrived to `sink`; if none has, block up to
  // timeout_ns first (0 = do not block). Returns how many were delivered.
  size_t poll(uint64_t timeout_ns, RxSink& sink);

  const UdpLinkStats& stats() const { return stats_; }
  const UdpLinkConfig& config() const { return cfg_; }
  // Readable once a completion was posted; read it (8 bytes) to re-arm.
  int event_fd() const { return event_fd_; }

 private:
  // One sendmsg: a datagram, or in GSO mode up to kMaxGsoSegs datagrams of
  // seg_len bytes (the last may be shorter) from one path to one destination.
  static constexpr int kMaxIov = 66;      // iovecs of one datagram
  static constexpr int kMaxGsoSegs = 16;  // 16 x (4 KiB + header) stays under 64 KiB
  static constexpr int kSlotIov = 256;
  static constexpr size_t kGsoMaxBytes = 65000;  // UDP payload of one GSO send
  static constexpr size_t kZcMaxIov = 16;
  struct TxSlot {
    msghdr msg;
    iovec iov[kSlotIov];
    sockaddr_in6 dst;  // or a sockaddr_in, on a link of IPv4 sockets
    IpAddr src;         // unspecified: the socket's own
    alignas(cmsghdr) uint8_t cmsg[CMSG_SPACE(sizeof(uint16_t)) + CMSG_SPACE(sizeof(in6_pktinfo))];
    uint8_t hdr[kMaxGsoSegs][256];
    uint8_t tail[kMaxGsoSegs][8];  // send_trailed(): each datagram's trailer
    uint16_t path;
    int fd;              // the socket it leaves from: the path's, or the RoCE one
    uint16_t segs;       // datagrams in it
    uint32_t seg_len;    // bytes of each but the last
    uint32_t bytes;
    bool closed;         // its last datagram was shorter: nothing may follow
  };
  io_uring_sqe* sqe();
  void submit_slot(uint32_t idx);
  void resend_unsegmented(const TxSlot& t);
  void tx_complete(uint32_t idx, int32_t res, uint32_t flags);
  bool gso_mode() const { return cfg_.mode == LinkMode::GSO; }
  // The socket address of `a`:`port` for this link's sockets (family_);
  // 0 if they cannot reach it (an IPv6 address on a link of IPv4 sockets).
  socklen_t sockaddr_of(const IpAddr& a, uint16_t port, sockaddr_in6* out) const;
  void fill_control(TxSlot& t);
  // Construction steps (udp_link.cc); each sets error_ on failure.
  bool init_ring();
  bool open_path_sockets();
  bool steer_shards();
  bool set_receive_options();
  bool init_receive_buffers();
  void arm_recv();
  void arm_mc_recv(size_t i);
  bool open_mc();
  bool membership(int fd, const IpAddr& group, bool join);
  void handle_cqe(int32_t res, uint32_t flags, RxSink* sink, size_t& delivered);
  void reap(RxSink* sink, size_t& delivered);

  UdpLinkConfig cfg_;
  std::string error_;
  io_uring ring_{};
  bool ring_ok_ = false;
  std::vector<int> fds_;
  int family_ = AF_INET6;  // AF_INET where the host has no IPv6
  int event_fd_ = -1;
  std::vector<TxSlot> tx_;
  std::vector<uint32_t> tx_free_;
  uint32_t tx_inflight_ = 0;  // requests (and zero-copy notifications) not yet complete
  bool tx_unsubmitted_ = false;
  int64_t open_ = -1;          // GSO: the slot later datagrams may join
  bool gso_ok_ = true;         // false once the route refused a segmented send
  // provided buffer ring for multishot receive
  io_uring_buf_ring* br_ = nullptr;
  size_t br_bytes_ = 0;
  uint8_t* rx_mem_ = nullptr;
  size_t rx_buf_len_ = 0;
  msghdr rx_msg_{};
  bool rx_armed_ = false;
  // Multicast sockets, each with its multishot receive: the first opened
  // at the first join, another whenever the kernel refuses one more
  // membership on every open one (net.ipv4.igmp_max_memberships, 20 by
  // default, is per socket). Each group is joined on one of them.
  struct McSocket {
    int fd = -1;
    bool armed = false;
    bool full = false;  // the kernel refused it one more group
  };
  std::vector<McSocket> mc_;
  std::map<IpAddr, size_t> mc_group_;  // group -> index in mc_
  static constexpr size_t kMaxMcSockets = 64;
  bool mc_arm_missing();  // arms each socket whose receive ended; true if any
  // The RoCE v2 socket (UdpLinkConfig::roce_port), with its multishot receive.
  int roce_fd_ = -1;
  bool roce_armed_ = false;
  bool open_roce_socket();
  void arm_roce_recv();
  // stashed receive completions seen while flush() waited for sends
  struct Stashed { int32_t res; uint32_t flags; };
  std::vector<Stashed> stash_;
  UdpLinkStats stats_;
};

}  // namespace vstellar
