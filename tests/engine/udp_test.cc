// The engine over real UDP sockets on loopback (io_uring link), two engines
// in one process driven alternately: byte-exact transfers, spraying over
// source ports, and recovery from emulated loss on one link.
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "sim_pair.h"
#include "vstellar/harness/harness.h"

namespace vstellar::test {
namespace {

struct UdpSide {
  std::unique_ptr<harness::Node> node;
  std::vector<uint8_t> buf;
  Pd* pd;
  Mr* mr;
  Cq* cq;
  Qp* qp;
  uint64_t addr(size_t off = 0) { return uint64_t(uintptr_t(buf.data() + off)); }
};

// Ports: 20000 + (a pid-derived offset) mod 25000, so that tests of two
// processes seldom meet, and never 46000 and up, where the guest tests'
// daemons listen (47000, tools/python/vstellar/guest.py): make test runs
// ctest in parallel, a guest test beside these.
class UdpPair {
 public:
  explicit UdpPair(harness::Options o) : UdpPair(o, o) {}
  // Side b may run another link mode than side a.
  UdpPair(harness::Options o, harness::Options ob) : opt(o), opt_b(ob) {
    uint16_t base = uint16_t(20000 + (getpid() * 7919u) % 25000);
    a.node = std::make_unique<harness::Node>(opt, base, uint16_t(base + 300));
    b.node = std::make_unique<harness::Node>(opt_b, uint16_t(base + 300), base);
    if (!a.node->ok() || !b.node->ok()) return;
    for (UdpSide* s : {&a, &b}) {
      Engine& e = s->node->eng();
      s->buf.assign(4 << 20, 0);
      s->pd = e.alloc_pd();
      s->mr = e.reg_mr(s->pd, s->addr(), s->buf.size(),
                       ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ,
                       std::make_shared<HostMemory>(4096));
      s->cq = e.create_cq(1024);
      QpInitAttr ia;
      ia.send_cq = ia.recv_cq = s->cq;
      s->qp = e.create_qp(s->pd, ia);
    }
    connect(a, b, uint16_t(base + 300));
    connect(b, a, base);
    ok = true;
  }
  void connect(UdpSide& s, UdpSide& p, uint16_t peer_port) {
    Engine& e = s.node->eng();
    QpAttr at;
    at.qp_state = QpState::INIT;
    at.qp_access_flags = ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
    ASSERT_EQ(e.modify_qp(s.qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS), 0);
    at.qp_state = QpState::RTR;
    at.dest_qp_num = p.qp->qpn();
    at.ah = {0x7f000001, peer_port};
    at.rq_psn = 77;
    ASSERT_EQ(e.modify_qp(s.qp, at, QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN |
                                        QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER),
              0);
    at.qp_state = QpState::RTS;
    at.sq_psn = 77;
    ASSERT_EQ(e.modify_qp(s.qp, at, QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT |
                                        QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC),
              0);
  }
  std::vector<Wc> wait(UdpSide& s, size_t n, double secs = 20) {
    std::vector<Wc> out;
    uint64_t end = SteadyClock().now_ns() + uint64_t(secs * 1e9);
    while (out.size() < n && SteadyClock().now_ns() < end) {
      a.node->run_once(100'000);
      b.node->run_once(100'000);
      Wc wc[16];
      int k = s.node->eng().poll_cq(s.cq, wc, 16);
      out.insert(out.end(), wc, wc + k);
    }
    return out;
  }
  harness::Options opt, opt_b;
  UdpSide a, b;
  bool ok = false;
};

harness::Options base_options() {
  harness::Options o;
  o.eng.num_paths = 128;
  o.eng.path_burst = 1;  // a new path per packet
  return o;
}

// WRITE 2 MiB, SEND 100000 bytes and READ 1 MiB from a to b, and check
// every completion and every byte.
void write_send_read(UdpPair& t) {
  fill_random(t.a.buf.data(), 2 << 20, 1);
  fill_random(t.b.buf.data() + (3 << 20), 1 << 20, 2);
  Engine& ea = t.a.node->eng();
  Sge sg{t.a.addr(), 2 << 20, t.a.mr->lkey()};
  SendWr w;
  w.wr_id = 1;
  w.opcode = WrOpcode::RDMA_WRITE;
  w.send_flags = SEND_SIGNALED;
  w.sg_list = &sg;
  w.num_sge = 1;
  w.remote_addr = t.b.addr();
  w.rkey = t.b.mr->rkey();
  ASSERT_EQ(ea.post_send(t.a.qp, w), 0);
  Sge rsg{t.b.addr(2 << 20), 100000, t.b.mr->lkey()};
  RecvWr r;
  r.wr_id = 9;
  r.sg_list = &rsg;
  r.num_sge = 1;
  ASSERT_EQ(t.b.node->eng().post_recv(t.b.qp, r), 0);
  Sge ssg{t.a.addr(12345), 100000, t.a.mr->lkey()};
  w.wr_id = 2;
  w.opcode = WrOpcode::SEND;
  w.sg_list = &ssg;
  ASSERT_EQ(ea.post_send(t.a.qp, w), 0);
  Sge rd{t.a.addr(3 << 20), 1 << 20, t.a.mr->lkey()};
  w.wr_id = 3;
  w.opcode = WrOpcode::RDMA_READ;
  w.sg_list = &rd;
  w.remote_addr = t.b.addr(3 << 20);
  ASSERT_EQ(ea.post_send(t.a.qp, w), 0);
  auto wc = t.wait(t.a, 3);
  ASSERT_EQ(wc.size(), 3u);
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(wc[i].wr_id, uint64_t(i + 1));
    EXPECT_EQ(wc[i].status, WcStatus::SUCCESS);
  }
  auto rc = t.wait(t.b, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].byte_len, 100000u);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 2 << 20), 0);
  EXPECT_EQ(std::memcmp(t.a.buf.data() + 12345, t.b.buf.data() + (2 << 20), 100000), 0);
  EXPECT_EQ(std::memcmp(t.a.buf.data() + (3 << 20), t.b.buf.data() + (3 << 20), 1 << 20), 0);
}

TEST(Udp, WriteSendReadByteExactAndSprayed) {
  UdpPair t(base_options());
  ASSERT_TRUE(t.ok);
  write_send_read(t);
  // The packets really left from many source ports (one socket per path).
  int used = 0;
  for (auto& p : t.b.node->eng().stats().paths) used += p.rx_pkts > 0;
  EXPECT_GE(used, 100);
  EXPECT_EQ(t.b.node->link().stats().rx, t.b.node->eng().stats().rx_pkts);
}

// The GSO link (UDP_SEGMENT sends, UDP_GRO receives) and the plain one
// put the same datagrams on the wire: each pairing moves every byte. A GSO
// sender sends runs of one path as one sendmsg; a GSO receiver gets a GSO
// sender's runs as one buffer (loopback keeps them whole) and cuts them up.
TEST(Udp, GsoAndPlainLinksInteroperate) {
  for (auto [ma, mb] : {std::pair{LinkMode::GSO, LinkMode::PLAIN}, std::pair{LinkMode::PLAIN, LinkMode::GSO},
                        std::pair{LinkMode::GSO, LinkMode::GSO}}) {
    SCOPED_TRACE(std::string(to_string(ma)) + " -> " + to_string(mb));
    harness::Options oa = base_options(), ob = base_options();
    oa.link_mode = ma;
    ob.link_mode = mb;
    oa.eng.path_burst = ob.eng.path_burst = 16;
    UdpPair t(oa, ob);
    ASSERT_TRUE(t.ok);
    write_send_read(t);
    for (UdpSide* s : {&t.a, &t.b}) {
      const UdpLinkStats& l = s->node->link().stats();
      EXPECT_EQ(l.tx, s->node->eng().stats().tx_pkts);
      EXPECT_EQ(l.rx, s->node->eng().stats().rx_pkts);
      EXPECT_EQ(l.tx_err, 0u);
      EXPECT_EQ(l.rx_trunc, 0u);
      if (s->node->link().config().mode == LinkMode::PLAIN) {
        EXPECT_EQ(l.tx_sends, l.tx);
      }
    }
    // a sends the WRITE and SEND data: runs of up to 16 datagrams per send.
    const UdpLinkStats& ta = t.a.node->link().stats();
    if (ma == LinkMode::GSO) {
      EXPECT_LT(ta.tx_sends * 2, ta.tx);
    }
    const UdpLinkStats& rb = t.b.node->link().stats();
    if (ma == LinkMode::GSO && mb == LinkMode::GSO) {
      EXPECT_LT(rb.rx_bufs * 2, rb.rx);
    }
    if (mb == LinkMode::PLAIN) {
      EXPECT_EQ(rb.rx_bufs, rb.rx);
    }
  }
}

TEST(Udp, RecoversFromLossOnOneLink) {
  harness::Options o = base_options();
  o.loss_rate = 0.3;
  o.loss_links = 8;  // about 16 of 128 paths cross the lossy link
  UdpPair t(o);
  ASSERT_TRUE(t.ok);
  fill_random(t.a.buf.data(), 4 << 20, 3);
  Sge sg{t.a.addr(), 4 << 20, t.a.mr->lkey()};
  SendWr w;
  w.opcode = WrOpcode::RDMA_WRITE;
  w.send_flags = SEND_SIGNALED;
  w.sg_list = &sg;
  w.num_sge = 1;
  w.remote_addr = t.b.addr();
  w.rkey = t.b.mr->rkey();
  ASSERT_EQ(t.a.node->eng().post_send(t.a.qp, w), 0);
  auto wc = t.wait(t.a, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 4 << 20), 0);
  EXPECT_GT(t.a.node->emu_dropped + t.b.node->emu_dropped, 0u);
  EXPECT_GT(t.a.node->eng().stats().retx_pkts, 0u);
}

// RoCE v2 over IPv6 has IPv6 groups too (ff00::/8): the link joins them on
// its IPv6 group socket, and a datagram sent to one arrives once. IPv6
// multicast needs an interface that carries it (the route to ff00::/8;
// the loopback device has none), so the test needs one on this host.
TEST(Udp, Ipv6GroupsAreJoinedAndLeft) {
  struct Count final : RxSink {
    size_t n = 0;
    void on_datagram(const uint8_t*, size_t, const Endpoint&, const IpAddr&, bool) override { n++; }
  };
  const uint16_t base = uint16_t(20000 + (getpid() * 7919u + 4211) % 25000);
  UdpLinkConfig c;
  c.local = IpAddr();  // the wildcard: sends name no source, the route picks it
  c.base_port = base;
  c.num_paths = 1;
  c.mcast_port = uint16_t(base + 200);
  UdpLink rx(c);
  ASSERT_TRUE(rx.ok()) << rx.error();
  auto group = [](uint8_t last) {
    IpAddr g;
    g.b[0] = 0xff;
    g.b[1] = 0x15;  // transient, site scope
    g.b[15] = last;
    return g;
  };
  if (!rx.join_group(group(1), true)) GTEST_SKIP() << "no interface carries IPv6 multicast here: " << strerror(errno);
  ASSERT_TRUE(rx.join_group(group(2), true));
  ASSERT_TRUE(rx.join_group(group(2), false));
  UdpLinkConfig sc = c;
  sc.base_port = uint16_t(base + 100);
  UdpLink tx(sc);
  ASSERT_TRUE(tx.ok()) << tx.error();
  Count got;
  const uint8_t hdr[24] = {1, 3};
  tx.send(0, IpAddr(), Endpoint{group(1), c.mcast_port}, hdr, sizeof(hdr), nullptr, 0);
  tx.send(0, IpAddr(), Endpoint{group(2), c.mcast_port}, hdr, sizeof(hdr), nullptr, 0);  // left: not ours
  tx.flush();
  for (int round = 0; round < 100 && got.n < 1; round++) rx.poll(1'000'000, got);
  for (int round = 0; round < 20; round++) rx.poll(1'000'000, got);  // a stray one would come now
  EXPECT_EQ(got.n, 1u);
  EXPECT_EQ(tx.stats().tx_err, 0u);
}

}  // namespace
}  // namespace vstellar::test

namespace vstellar::test {
namespace {

// vstellard --threads: links bound to the same ports as one
// SO_REUSEPORT group; a datagram reaches link dst_qpn % shards, whatever
// source port it comes from.
TEST(Udp, ShardedLinksGetTheirQpnsDatagrams) {
  struct Count final : RxSink {
    std::vector<uint32_t> qpns;
    void on_datagram(const uint8_t* d, size_t n, const Endpoint&, const IpAddr&, bool) override {
      if (n >= 8) qpns.push_back(uint32_t(d[4]) << 24 | uint32_t(d[5]) << 16 | uint32_t(d[6]) << 8 | d[7]);
    }
  };
  const uint16_t base = uint16_t(20000 + (getpid() * 7919u + 611) % 25000);
  std::vector<std::unique_ptr<UdpLink>> shards;
  for (uint16_t k = 0; k < 3; k++) {  // one after the other: link k is socket k
    UdpLinkConfig c;
    c.base_port = base;
    c.num_paths = 2;
    c.shards = 3;
    c.shard = k;
    shards.push_back(std::make_unique<UdpLink>(c));
    ASSERT_TRUE(shards.back()->ok()) << shards.back()->error();
  }
  UdpLinkConfig sc;
  sc.base_port = uint16_t(base + 100);
  sc.num_paths = 4;
  UdpLink sender(sc);
  ASSERT_TRUE(sender.ok()) << sender.error();
  std::vector<uint32_t> sent;
  for (uint32_t i = 0; i < 60; i++) {
    const uint32_t qpn = 0x11 + i * 7;
    uint8_t hdr[24] = {1, 3};
    hdr[4] = uint8_t(qpn >> 24);
    hdr[5] = uint8_t(qpn >> 16);
    hdr[6] = uint8_t(qpn >> 8);
    hdr[7] = uint8_t(qpn);
    sender.send(uint16_t(i % 4), IpAddr(), Endpoint{0x7f000001, base}, hdr, sizeof(hdr), nullptr, 0);
    sender.flush();
    sent.push_back(qpn);
  }
  Count got[3];
  size_t total = 0;
  for (int round = 0; round < 200 && total < sent.size(); round++) {
    total = 0;
    for (int k = 0; k < 3; k++) {
      shards[size_t(k)]->poll(1'000'000, got[k]);
      total += got[k].qpns.size();
    }
  }
  ASSERT_EQ(total, sent.size());
  for (uint32_t k = 0; k < 3; k++) {
    EXPECT_FALSE(got[k].qpns.empty()) << k;
    for (uint32_t q : got[k].qpns) EXPECT_EQ(q % 3, k) << q;
  }
}

// The kernel takes at most net.ipv4.igmp_max_memberships (20)
// groups on one socket, and the link had one: after 20 joins of all its
// devices together every ATTACH_MCAST failed. The link opens another
// socket when the open ones are full, and a datagram to any group arrives
// once, however many sockets there are.
TEST(Udp, GroupsSpreadOverSocketsBeyondTheKernelsPerSocketLimit) {
  struct Count final : RxSink {
    size_t n = 0;
    void on_datagram(const uint8_t*, size_t, const Endpoint&, const IpAddr&, bool) override { n++; }
  };
  unsigned per_socket = 20;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/igmp_max_memberships", "r")) {
    if (std::fscanf(f, "%u", &per_socket) != 1) per_socket = 20;
    std::fclose(f);
  }
  const unsigned groups = std::min(2 * per_socket + 10, 200u);
  const uint16_t base = uint16_t(20000 + (getpid() * 7919u + 1223) % 25000);
  UdpLinkConfig c;
  c.base_port = base;
  c.num_paths = 1;
  c.mcast_port = uint16_t(base + 200);
  UdpLink rx(c);
  ASSERT_TRUE(rx.ok()) << rx.error();
  auto group = [](unsigned i) { return 0xe6180000u | i; };  // 230.24.0.0/16
  for (unsigned i = 0; i < groups; i++) ASSERT_TRUE(rx.join_group(group(i), true)) << "join " << i;
  // A group left frees its socket's membership for the next.
  ASSERT_TRUE(rx.join_group(group(0), false));
  ASSERT_TRUE(rx.join_group(group(groups), true));
  UdpLinkConfig sc;
  sc.base_port = uint16_t(base + 100);
  sc.num_paths = 1;
  sc.mcast_port = c.mcast_port;  // sends to groups leave from 127.0.0.1
  UdpLink tx(sc);
  ASSERT_TRUE(tx.ok()) << tx.error();
  Count got;
  const uint8_t hdr[24] = {1, 3};
  for (unsigned i : {1u, groups - 1, groups}) {
    tx.send(0, IpAddr(), Endpoint{group(i), c.mcast_port}, hdr, sizeof(hdr), nullptr, 0);
    tx.flush();
  }
  tx.send(0, IpAddr(), Endpoint{group(0), c.mcast_port}, hdr, sizeof(hdr), nullptr, 0);  // left: not ours
  tx.flush();
  for (int round = 0; round < 100 && got.n < 3; round++) rx.poll(1'000'000, got);
  for (int round = 0; round < 20; round++) rx.poll(1'000'000, got);  // duplicates would come now
  EXPECT_EQ(got.n, 3u) << "one datagram to each of 3 joined groups";
}

}  // namespace
}  // namespace vstellar::test

namespace vstellar::test {
namespace {

// Plain RoCE v2 (UdpLinkConfig::roce_port): what a peer sends to the RoCE
// port reaches the sink, and a datagram sent with a trailer leaves from
// that port whole: header, payload spans and trailer, in that order.
TEST(Udp, RocePortReceivesAndSendsTrailedDatagrams) {
  struct Keep final : RxSink {
    std::vector<std::vector<uint8_t>> got;
    std::vector<uint16_t> from_ports;
    void on_datagram(const uint8_t* d, size_t n, const Endpoint& from, const IpAddr&, bool) override {
      got.emplace_back(d, d + n);
      from_ports.push_back(from.port);
    }
  };
  const uint16_t base = uint16_t(20000 + (getpid() * 7919u + 1223) % 25000);
  UdpLinkConfig rc;
  rc.base_port = base;
  rc.num_paths = 2;
  rc.roce_port = uint16_t(base + 50);
  UdpLink roce(rc);
  ASSERT_TRUE(roce.ok()) << roce.error();
  UdpLinkConfig pc;
  pc.base_port = uint16_t(base + 100);
  pc.num_paths = 1;
  UdpLink peer(pc);
  ASSERT_TRUE(peer.ok()) << peer.error();

  const uint8_t hello[16] = {0x04, 0, 0xff, 0xff};
  peer.send(0, IpAddr(), Endpoint{0x7f000001, rc.roce_port}, hello, sizeof(hello), nullptr, 0);
  peer.flush();
  Keep at_roce;
  for (int i = 0; i < 100 && at_roce.got.empty(); i++) roce.poll(10'000'000, at_roce);
  ASSERT_EQ(at_roce.got.size(), 1u);
  EXPECT_EQ(at_roce.got[0], std::vector<uint8_t>(hello, hello + sizeof(hello)));
  EXPECT_EQ(at_roce.from_ports[0], pc.base_port);

  const uint8_t hdr[12] = {0x0a, 1, 2, 3};
  uint8_t payload[1024];
  for (size_t i = 0; i < sizeof(payload); i++) payload[i] = uint8_t(i * 7);
  const HostSpan spans[2] = {{payload, 1000}, {payload + 1000, 24}};
  const uint8_t trailer[4] = {0xde, 0xad, 0xbe, 0xef};
  roce.send_trailed(1, IpAddr(), Endpoint{0x7f000001, pc.base_port}, hdr, sizeof(hdr), spans, 2, trailer,
                    sizeof(trailer));
  roce.flush();
  Keep at_peer;
  for (int i = 0; i < 100 && at_peer.got.empty(); i++) peer.poll(10'000'000, at_peer);
  ASSERT_EQ(at_peer.got.size(), 1u);
  std::vector<uint8_t> want(hdr, hdr + sizeof(hdr));
  want.insert(want.end(), payload, payload + sizeof(payload));
  want.insert(want.end(), trailer, trailer + sizeof(trailer));
  EXPECT_EQ(at_peer.got[0], want);
  EXPECT_EQ(at_peer.from_ports[0], rc.roce_port) << "a trailed datagram leaves from the RoCE port";
}

}  // namespace
}  // namespace vstellar::test
