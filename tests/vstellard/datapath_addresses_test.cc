// One daemon, many devices, each with its own addresses (vstellard
// --device PATH,ip=...): a device holds only its own addresses as GIDs,
// its QPs send from them and are reached at them, over IPv4 and IPv6.
#include <arpa/inet.h>

#include "vstellard/datapath_fixture.h"

namespace vstellard::datapath_test {
namespace {

vstellar::IpAddr V4(const char* s) {
  in_addr a;
  inet_pton(AF_INET, s, &a);
  return vstellar::IpAddr(ntohl(a.s_addr));
}

vstellar::IpAddr V6(const char* s) {
  in6_addr a;
  inet_pton(AF_INET6, s, &a);
  return vstellar::IpAddr::from_bytes(a.s6_addr);
}

// A RESET -> INIT -> RTR -> RTS walk to `dest` at `peer`, from GID index
// `sgid_index`; the status of the first step that fails.
uint16_t ConnectTo(Guest& g, const GQp& q, uint32_t dest, const vstellar::IpAddr& peer, uint8_t sgid_index) {
  auto step = [&](uint32_t mask, uint8_t state) {
    vstellar_cmd_modify_qp m = RcModifyBody(q.qpn, dest, 3);
    std::memcpy(m.attr.av.dgid, peer.b.data(), 16);
    m.attr.av.sgid_index = sgid_index;
    m.attr.attr_mask = mask;
    m.attr.qp_state = state;
    return g.Cmd(VSTELLAR_CMD_MODIFY_QP, &m, sizeof(m), 0).status();
  };
  if (uint16_t s = step(kInitMask, VSTELLAR_QPS_INIT)) return s;
  if (uint16_t s = step(kRtrMask, VSTELLAR_QPS_RTR)) return s;
  return step(kRtsMask, VSTELLAR_QPS_RTS);
}

// SEND 3000 bytes from a to b (which may be the same guest, with one CQ);
// both complete and the bytes arrive whole.
void ExpectSendArrives(Guest& a, GQp& qa, Guest& b, GQp& qb, uint64_t tag) {
  for (uint32_t i = 0; i < 3000; i++) *a.Buf(i) = uint8_t(i * 7 + tag);
  std::memset(b.Buf(16384), 0, 3000);
  b.PostRecv(qb, tag | 0x100, {b.Sge(16384, 4096)});
  a.PostSend(qa, Wqe(VSTELLAR_WR_SEND, tag), {a.Sge(0, 3000)});
  std::vector<vstellar_cqe> got;
  for (Guest* g : {&a, &b}) {
    auto c = g->Poll();
    ASSERT_TRUE(c);
    got.push_back(*c);
  }
  for (const vstellar_cqe& c : got) {
    EXPECT_EQ(c.status, 0);
    if (c.opcode == VSTELLAR_WC_RECV) {
      EXPECT_EQ(c.wr_id, tag | 0x100);
      EXPECT_EQ(c.byte_len, 3000u);
    } else {
      EXPECT_EQ(c.wr_id, tag);
    }
  }
  EXPECT_NE(got[0].opcode, got[1].opcode);
  EXPECT_EQ(std::memcmp(a.Buf(0), b.Buf(16384), 3000), 0);
}

}  // namespace

class DeviceAddresses : public DataPath {
 protected:
  // Device A (socket a) may hold 127.0.0.1 and ::1, device B (socket b)
  // 127.0.0.2; no default socket.
  void StartWithTwoDeviceSockets() {
    StartDaemon(50, {}, [this](DaemonOptions& o) {
      o.socket.clear();
      o.device_sockets = {{dir_ + "/a", {V4("127.0.0.1"), V6("::1")}}, {dir_ + "/b", {V4("127.0.0.2")}}};
    });
    for (auto [f, name] : {std::pair{&fa_, "/a"}, std::pair{&fb_, "/b"}}) {
      *f = std::make_unique<Frontend>();
      std::string err;
      ASSERT_TRUE((*f)->Connect(dir_ + name, &err)) << err;
      ASSERT_TRUE((*f)->StartQueues(&err)) << err;
    }
    a_ = std::make_unique<Guest>(Guest{*fa_});
    b_ = std::make_unique<Guest>(Guest{*fb_});
    a_->Setup();
    b_->Setup();
  }
  // ADD_GID as the guest kernel's GID cache does it (no user context).
  static uint16_t AddGid(Guest& g, uint32_t index, const vstellar::IpAddr& a) {
    vstellar_cmd_gid c{};
    c.port = 1;
    c.index = index;
    std::memcpy(c.gid, a.b.data(), 16);
    c.gid_type = VSTELLAR_GID_TYPE_ROCE_V2;
    return g.f.Command(VSTELLAR_CMD_ADD_GID, 0, &c, sizeof(c), 0).status();
  }
  void TearDown() override {
    DataPath::TearDown();
    for (const char* name : {"/a", "/b"}) unlink((dir_ + name).c_str());
  }
};

// Each device takes its own addresses and is refused the other's, IPv4
// and IPv6 alike; a link-local address is listed by anyone and held by
// no one.
TEST_F(DeviceAddresses, EachDeviceHoldsOnlyItsOwnAddresses) {
  StartWithTwoDeviceSockets();
  Guest& A = *a_;
  Guest& B = *b_;
  EXPECT_EQ(AddGid(A, 0, V6("fe80::1")), VSTELLAR_STATUS_OK);
  EXPECT_EQ(AddGid(A, 1, V4("127.0.0.1")), VSTELLAR_STATUS_OK);
  EXPECT_EQ(AddGid(A, 2, V6("::1")), VSTELLAR_STATUS_OK);
  EXPECT_EQ(AddGid(A, 3, V4("127.0.0.2")), VSTELLAR_STATUS_ACCESS) << "B's address";
  EXPECT_EQ(AddGid(B, 0, V6("fe80::2")), VSTELLAR_STATUS_OK);
  EXPECT_EQ(AddGid(B, 1, V4("127.0.0.2")), VSTELLAR_STATUS_OK);
  EXPECT_EQ(AddGid(B, 2, V4("127.0.0.1")), VSTELLAR_STATUS_ACCESS) << "A's address";
  EXPECT_EQ(AddGid(B, 2, V6("::1")), VSTELLAR_STATUS_ACCESS) << "A's address";
  EXPECT_EQ(AddGid(B, 2, V4("127.0.0.9")), VSTELLAR_STATUS_ACCESS) << "nobody's";
}

// A QP of a daemon that serves several devices' addresses needs one of its
// own device's to send from: before its device holds an address of the
// peer's family, RTR is refused.
TEST_F(DeviceAddresses, AQpWithoutAnAddressOfItsDeviceIsRefused) {
  StartWithTwoDeviceSockets();
  GQp qb = b_->CreateQp();
  EXPECT_EQ(ConnectTo(*b_, qb, 0x20, V4("127.0.0.1"), 0), VSTELLAR_STATUS_BAD_FIELD) << "B holds no address yet";
  ASSERT_EQ(AddGid(*b_, 0, V4("127.0.0.2")), VSTELLAR_STATUS_OK);
  EXPECT_EQ(ConnectTo(*b_, qb, 0x20, V6("::1"), 0), VSTELLAR_STATUS_BAD_FIELD) << "B has no IPv6 address";
  EXPECT_EQ(ConnectTo(*b_, qb, 0x20, V4("127.0.0.1"), 0), VSTELLAR_STATUS_OK);
}

// Two devices of one daemon talk RC over their own IPv4 addresses; each
// QP's packets leave from its device's address (the peer's QP takes
// packets only from the address it connected to), and a QP named by the
// wrong source GID index still sends from an address its device holds.
TEST_F(DeviceAddresses, RcBetweenDevicesOfOneDaemonOverTheirOwnAddresses) {
  StartWithTwoDeviceSockets();
  Guest& A = *a_;
  Guest& B = *b_;
  ASSERT_EQ(AddGid(A, 0, V6("fe80::1")), VSTELLAR_STATUS_OK);
  ASSERT_EQ(AddGid(A, 1, V4("127.0.0.1")), VSTELLAR_STATUS_OK);
  ASSERT_EQ(AddGid(B, 1, V4("127.0.0.2")), VSTELLAR_STATUS_OK);
  GQp qa = A.CreateQp(), qb = B.CreateQp();
  // A names index 0 (link-local, never held): it sends from 127.0.0.1.
  ASSERT_EQ(ConnectTo(A, qa, qb.qpn, V4("127.0.0.2"), 0), 0);
  ASSERT_EQ(ConnectTo(B, qb, qa.qpn, V4("127.0.0.1"), 1), 0);
  ExpectSendArrives(A, qa, B, qb, 0x31);
  ExpectSendArrives(B, qb, A, qa, 0x32);
}

// The same on two worker threads: the devices are accepted on different
// workers, and the first to connect moves to the other's (its peer is
// one of the daemon's own addresses, so it votes), from where both send
// from their own addresses as before, over IPv4 and IPv6.
class DeviceAddressesOnTwoThreads : public DeviceAddresses {
 protected:
  DeviceAddressesOnTwoThreads() { threads_ = 2; }
};

TEST_F(DeviceAddressesOnTwoThreads, DevicesWithTheirOwnAddressesMeetOnOneWorker) {
  StartWithTwoDeviceSockets();
  Guest& A = *a_;
  Guest& B = *b_;
  ASSERT_EQ(AddGid(A, 1, V4("127.0.0.1")), VSTELLAR_STATUS_OK);
  ASSERT_EQ(AddGid(B, 1, V4("127.0.0.2")), VSTELLAR_STATUS_OK);
  unsigned first = ~0u;
  for (const DeviceStats& st : d_->Stats()) first = std::min(first, st.id);
  ASSERT_NE(WaitForWorker(first), WaitForWorker(first + 1));
  GQp qa = A.CreateQp(), qb = B.CreateQp();
  ASSERT_EQ(ConnectTo(A, qa, qb.qpn, V4("127.0.0.2"), 1), 0);
  ASSERT_EQ(ConnectTo(B, qb, qa.qpn, V4("127.0.0.1"), 1), 0);
  ExpectSendArrives(A, qa, B, qb, 0x41);
  ExpectSendArrives(B, qb, A, qa, 0x42);
  EXPECT_EQ(d_->device_moves(), 1u);
  EXPECT_EQ(WaitForWorker(first), WaitForWorker(first + 1));
}

// RoCE v2 over IPv6: two QPs of one device connected over ::1.
TEST_F(DeviceAddresses, RcOverIpv6) {
  StartWithTwoDeviceSockets();
  Guest& A = *a_;
  ASSERT_EQ(AddGid(A, 0, V4("127.0.0.1")), VSTELLAR_STATUS_OK);
  ASSERT_EQ(AddGid(A, 1, V6("::1")), VSTELLAR_STATUS_OK);
  GQp q1 = A.CreateQp(), q2 = A.CreateQp();
  ASSERT_EQ(ConnectTo(A, q1, q2.qpn, V6("::1"), 1), 0);
  ASSERT_EQ(ConnectTo(A, q2, q1.qpn, V6("::1"), 1), 0);
  ExpectSendArrives(A, q1, A, q2, 0x61);
}

// Mixed versions: a daemon that serves its devices' own addresses (bound
// to the wildcard) talks to one bound to its one address (--socket, --ip),
// as a daemon before per-device addresses was. The wire is the same; only
// the addresses packets leave from and arrive at differ.
TEST_F(DeviceAddresses, TalksToADaemonWithOneAddress) {
  constexpr uint16_t kOtherPortOffset = 1000;
  uint16_t port = 0;
  StartDaemon(50, {}, [&](DaemonOptions& o) {
    o.socket.clear();
    o.device_sockets = {{dir_ + "/a", {V4("127.0.0.1")}}};
    o.peer_port = uint16_t(o.udp_port + kOtherPortOffset);
    port = o.udp_port;
  });
  // The other daemon, on its own thread (its link's io_uring is
  // single-issuer), bound to 127.0.0.2 and reaching this one's port.
  DaemonOptions other;
  other.socket = dir_ + "/b";
  other.ip = V4("127.0.0.2");
  other.udp_port = uint16_t(port + kOtherPortOffset);
  other.peer_port = port;
  other.paths = 4;
  std::promise<std::string> started;
  std::promise<void> release;
  std::unique_ptr<Daemon> y;
  std::thread ty([&, released = release.get_future()] {
    std::string err;
    auto d = std::make_unique<Daemon>(other);
    const bool ok = d->Start(&err);
    if (ok) y = std::move(d);
    started.set_value(ok ? "" : err);
    if (!ok) return;
    y->Run();
    released.wait();
    y.reset();
  });
  const std::string err = started.get_future().get();
  if (!err.empty()) {
    ty.join();
    FAIL() << err;
  }
  {
    Frontend fa, fb;
    std::string e;
    ASSERT_TRUE(fa.Connect(dir_ + "/a", &e) && fa.StartQueues(&e)) << e;
    ASSERT_TRUE(fb.Connect(dir_ + "/b", &e) && fb.StartQueues(&e)) << e;
    Guest A{fa}, B{fb};
    A.Setup();
    B.Setup();
    ASSERT_EQ(AddGid(A, 0, V4("127.0.0.1")), VSTELLAR_STATUS_OK);
    ASSERT_EQ(AddGid(B, 0, V4("127.0.0.2")), VSTELLAR_STATUS_OK);
    EXPECT_EQ(AddGid(B, 1, V4("127.0.0.1")), VSTELLAR_STATUS_ACCESS) << "not the other daemon's --ip";
    GQp qa = A.CreateQp(), qb = B.CreateQp();
    ASSERT_EQ(ConnectTo(A, qa, qb.qpn, V4("127.0.0.2"), 0), 0);
    ASSERT_EQ(ConnectTo(B, qb, qa.qpn, V4("127.0.0.1"), 0), 0);
    ExpectSendArrives(A, qa, B, qb, 0x71);
    ExpectSendArrives(B, qb, A, qa, 0x72);
  }
  y->Stop();
  release.set_value();
  ty.join();
}

}  // namespace vstellard::datapath_test
