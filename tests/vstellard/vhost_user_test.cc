// vstellard's vhost-user message handling: every field of every message
// is checked; these tests feed it good and bad messages.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "vstellard/vhost_user.h"

using namespace vstellard;

namespace {

Message Msg(Request r, const void* p = nullptr, size_t n = 0, uint32_t flags = kFlagVersion) {
  Message m;
  m.hdr = Header{static_cast<uint32_t>(r), flags, static_cast<uint32_t>(n)};
  m.payload.assign(static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  return m;
}

template <typename T>
Message MsgOf(Request r, const T& v, uint32_t flags = kFlagVersion) {
  return Msg(r, &v, sizeof(v), flags);
}

uint64_t ReplyU64(const Outcome& o) {
  EXPECT_TRUE(o.reply.has_value());
  EXPECT_EQ(o.reply->size(), sizeof(Header) + 8);
  uint64_t v;
  std::memcpy(&v, o.reply->data() + sizeof(Header), 8);
  return v;
}

Fd Memfd(const char* name, size_t size) {
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  return Fd(fd);
}

struct Region {
  MemRegionDesc d;
  Fd fd;
};

Message MemTable(std::vector<Region>& regions) {
  std::vector<uint8_t> p(8 + regions.size() * sizeof(MemRegionDesc), 0);
  uint32_t n = static_cast<uint32_t>(regions.size());
  std::memcpy(p.data(), &n, 4);
  for (size_t i = 0; i < regions.size(); i++) std::memcpy(p.data() + 8 + i * 32, &regions[i].d, 32);
  Message m = Msg(Request::kSetMemTable, p.data(), p.size());
  for (auto& r : regions) m.fds.push_back(std::move(r.fd));
  return m;
}

class VhostUser : public ::testing::Test {
 protected:
  DeviceState state{DeviceConfig::Default()};
  Session s{state};

  void Handshake() {
    ASSERT_TRUE(s.Handle(MsgOf(Request::kSetFeatures, s.offered_features())).ok());
    ASSERT_TRUE(s.Handle(MsgOf(Request::kSetProtocolFeatures, s.offered_protocol_features())).ok());
    ASSERT_TRUE(s.Handle(Msg(Request::kSetOwner)).ok());
  }
  // 1 MiB of "RAM" at GPA 0, QEMU VA 0x7f0000000000, and 64 KiB of doorbells.
  void Memory() {
    std::vector<Region> r;
    r.push_back({{0, 1 << 20, 0x7f0000000000, 0}, Memfd("memory-backend-memfd", 1 << 20)});
    r.push_back({{0xfe000000, 1 << 16, 0x7f1000000000, 0}, Memfd("vstellar-doorbell", 1 << 16)});
    ASSERT_TRUE(s.Handle(MemTable(r)).ok());
  }
  void Ring(uint32_t q, uint32_t num = 256) {
    ASSERT_TRUE(s.Handle(MsgOf(Request::kSetVringNum, VringState{q, num})).ok());
    const uint64_t base = 0x7f0000000000ull + 0x10000ull * (q + 1);
    VringAddr a{q, 0, base, base + 0x8000, base + 0x4000, 0};
    ASSERT_TRUE(s.Handle(MsgOf(Request::kSetVringAddr, a)).ok()) << s.Handle(MsgOf(Request::kSetVringAddr, a)).error;
  }
};

TEST_F(VhostUser, GetFeaturesOffersVersion1ProtocolFeaturesAndDeviceBits) {
  Outcome o = s.Handle(Msg(Request::kGetFeatures));
  ASSERT_TRUE(o.ok());
  Header h;
  std::memcpy(&h, o.reply->data(), sizeof(h));
  EXPECT_EQ(h.request, static_cast<uint32_t>(Request::kGetFeatures));
  EXPECT_EQ(h.flags, kFlagVersion | kFlagReply);
  EXPECT_EQ(h.size, 8u);
  uint64_t f = ReplyU64(o);
  EXPECT_TRUE(f & Bit(kFeatureVersion1));
  EXPECT_TRUE(f & Bit(kFeatureProtocolFeatures));
  EXPECT_TRUE(f & Bit(VIRTIO_VSTELLAR_F_RC));
  EXPECT_TRUE(f & Bit(VIRTIO_VSTELLAR_F_DB_SUPPRESS));
  EXPECT_TRUE(f & Bit(VIRTIO_VSTELLAR_F_UD));
  EXPECT_FALSE(f & Bit(VIRTIO_VSTELLAR_F_MULTI_CQNQ));
}

TEST_F(VhostUser, HeaderChecks) {
  EXPECT_FALSE(s.Handle(Msg(Request::kGetFeatures, nullptr, 0, 0)).ok());                       // version 0
  EXPECT_FALSE(s.Handle(Msg(Request::kGetFeatures, nullptr, 0, 2)).ok());                       // version 2
  EXPECT_FALSE(s.Handle(Msg(Request::kGetFeatures, nullptr, 0, kFlagVersion | kFlagReply)).ok());  // a reply
  EXPECT_FALSE(s.Handle(Msg(Request::kGetFeatures, nullptr, 0, kFlagVersion | 0x100)).ok());    // reserved
  Message m = Msg(Request::kGetFeatures);
  m.hdr.size = 8;  // says 8, carries 0
  EXPECT_FALSE(s.Handle(std::move(m)).ok());
  uint64_t junk = 0;
  EXPECT_FALSE(s.Handle(MsgOf(Request::kGetFeatures, junk)).ok());  // GET with payload
  EXPECT_FALSE(s.Handle(Msg(static_cast<Request>(999))).ok());
  EXPECT_FALSE(s.Handle(Msg(Request::kSetLogBase)).ok());
}

TEST_F(VhostUser, FeaturesMustBeOffered) {
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetFeatures, s.offered_features() | Bit(VIRTIO_VSTELLAR_F_MULTI_CQNQ))).ok());
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetProtocolFeatures, Bit(2))).ok());  // RARP: never offered
  uint32_t short_payload = 0;
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetFeatures, short_payload)).ok());
  EXPECT_TRUE(s.Handle(MsgOf(Request::kSetFeatures, Bit(kFeatureVersion1))).ok());
  EXPECT_EQ(s.acked_features(), Bit(kFeatureVersion1));
}

TEST_F(VhostUser, OwnerOnceAndBeforeRingMessages) {
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringNum, VringState{0, 256})).ok());
  EXPECT_TRUE(s.Handle(Msg(Request::kSetOwner)).ok());
  EXPECT_FALSE(s.Handle(Msg(Request::kSetOwner)).ok());
}

TEST_F(VhostUser, MemTableRecordsRegionsAndFindsDoorbells) {
  Handshake();
  Memory();
  ASSERT_EQ(s.regions().size(), 2u);
  EXPECT_FALSE(s.regions()[0].doorbell);
  EXPECT_TRUE(s.regions()[1].doorbell);
  EXPECT_EQ(s.regions()[1].gpa, 0xfe000000u);
  EXPECT_GE(s.regions()[1].fd.get(), 0);
  EXPECT_NE(s.FindByQemuVa(0x7f0000000000 + 4096, 4096), nullptr);
  EXPECT_EQ(s.FindByQemuVa(0x7f0000000000 + (1 << 20) - 8, 16), nullptr);  // runs off the end
}

TEST_F(VhostUser, MemTableRejectsBadRegions) {
  Handshake();
  auto one = [&](MemRegionDesc d, size_t file = 1 << 20) {
    std::vector<Region> r;
    r.push_back({d, Memfd("m", file)});
    return s.Handle(MemTable(r));
  };
  EXPECT_FALSE(one({0, 0, 0x1000, 0}).ok());                       // empty
  EXPECT_FALSE(one({0x800, 0x1000, 0x1000, 0}).ok());              // unaligned GPA
  EXPECT_FALSE(one({0, 0x1000, 0x1000, 0x800}).ok());              // unaligned offset
  EXPECT_FALSE(one({~0ull & ~0xfffull, 0x2000, 0x1000, 0}).ok());  // GPA wraps
  EXPECT_FALSE(one({0, 2 << 20, 0x1000, 0}).ok());                 // past end of file
  EXPECT_FALSE(one({0, 0x1000, 0x1000, 1 << 20}).ok());            // offset past end
  // Overlapping guest-physical ranges.
  std::vector<Region> r;
  r.push_back({{0, 0x2000, 0x10000, 0}, Memfd("a", 0x2000)});
  r.push_back({{0x1000, 0x2000, 0x20000, 0}, Memfd("b", 0x2000)});
  EXPECT_FALSE(s.Handle(MemTable(r)).ok());
  // fd count must match the region count.
  std::vector<Region> r2;
  r2.push_back({{0, 0x1000, 0x10000, 0}, Memfd("a", 0x1000)});
  Message m = MemTable(r2);
  m.fds.clear();
  EXPECT_FALSE(s.Handle(std::move(m)).ok());
  // Not a memory file.
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  close(p[1]);
  std::vector<Region> r3;
  r3.push_back({{0, 0x1000, 0x10000, 0}, Fd(p[0])});
  EXPECT_FALSE(s.Handle(MemTable(r3)).ok());
  // Nine regions is one too many; non-zero padding.
  std::vector<uint8_t> nine(8 + 9 * 32, 0);
  nine[0] = 9;
  EXPECT_FALSE(s.Handle(Msg(Request::kSetMemTable, nine.data(), nine.size())).ok());
  std::vector<uint8_t> pad(8 + 32, 0);
  pad[0] = 1;
  pad[4] = 1;
  EXPECT_FALSE(s.Handle(Msg(Request::kSetMemTable, pad.data(), pad.size())).ok());
  EXPECT_TRUE(s.regions().empty());
}

TEST_F(VhostUser, VringSetupChecks) {
  Handshake();
  Memory();
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringNum, VringState{0, 100})).ok());    // not pow2
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringNum, VringState{0, 65536})).ok());  // too big
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringNum, VringState{VSTELLAR_MAX_VQS, 256})).ok());
  // Address before size.
  VringAddr a{1, 0, 0x7f0000010000, 0x7f0000018000, 0x7f0000014000, 0};
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringAddr, a)).ok());
  Ring(0);
  VringAddr bad = a;
  bad.index = 0;
  bad.desc_user_addr = 0x7f2000000000;  // not guest memory
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringAddr, bad)).ok());
  bad = a;
  bad.index = 0;
  bad.desc_user_addr += 8;  // misaligned
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringAddr, bad)).ok());
  bad = a;
  bad.index = 0;
  bad.flags = 2;  // only VHOST_VRING_F_LOG (1) exists
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringAddr, bad)).ok());
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringBase, VringState{0, 0x10000})).ok());
  EXPECT_TRUE(s.Handle(MsgOf(Request::kSetVringBase, VringState{0, 77})).ok());
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringEnable, VringState{0, 2})).ok());
  EXPECT_TRUE(s.Handle(MsgOf(Request::kSetVringEnable, VringState{0, 1})).ok());
  EXPECT_TRUE(s.vring(0).enabled);
}

TEST_F(VhostUser, VringFdsAndBase) {
  Handshake();
  Memory();
  Ring(2);
  auto fdmsg = [](Request r, uint64_t u, bool with_fd) {
    Message m = MsgOf(r, u);
    if (with_fd) m.fds.emplace_back(dup(0) >= 0 ? memfd_create("e", MFD_CLOEXEC | MFD_ALLOW_SEALING) : -1);
    return m;
  };
  EXPECT_FALSE(s.Handle(fdmsg(Request::kSetVringKick, 2 | (1u << 9), true)).ok());  // reserved bit
  EXPECT_FALSE(s.Handle(fdmsg(Request::kSetVringKick, 2 | kVringNoFd, true)).ok());  // NOFD with fd
  EXPECT_FALSE(s.Handle(fdmsg(Request::kSetVringKick, 2, false)).ok());              // fd missing
  EXPECT_FALSE(s.Handle(fdmsg(Request::kSetVringKick, 3, true)).ok());               // ring 3 has no address
  EXPECT_TRUE(s.Handle(fdmsg(Request::kSetVringCall, 3, true)).ok());                // call: any time
  EXPECT_TRUE(s.Handle(MsgOf(Request::kSetVringBase, VringState{2, 5})).ok());
  EXPECT_TRUE(s.Handle(fdmsg(Request::kSetVringKick, 2, true)).ok());
  EXPECT_TRUE(s.vring(2).started);
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringNum, VringState{2, 128})).ok());  // running
  Outcome o = s.Handle(MsgOf(Request::kGetVringBase, VringState{2, 0}));
  ASSERT_TRUE(o.ok());
  VringState st;
  std::memcpy(&st, o.reply->data() + sizeof(Header), sizeof(st));
  EXPECT_EQ(st.index, 2u);
  EXPECT_EQ(st.num, 5u);
  EXPECT_FALSE(s.vring(2).started);
  // A message that carries an fd it should not.
  Message extra = MsgOf(Request::kSetVringNum, VringState{2, 128});
  extra.fds.emplace_back(memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_FALSE(s.Handle(std::move(extra)).ok());
}

TEST_F(VhostUser, GetConfigReturnsTheConfigSpace) {
  std::vector<uint8_t> p(sizeof(ConfigHeader) + sizeof(virtio_vstellar_config), 0);
  ConfigHeader c{0, sizeof(virtio_vstellar_config), 0};
  std::memcpy(p.data(), &c, sizeof(c));
  Outcome o = s.Handle(Msg(Request::kGetConfig, p.data(), p.size()));
  ASSERT_TRUE(o.ok()) << o.error;
  ASSERT_EQ(o.reply->size(), sizeof(Header) + p.size());
  virtio_vstellar_config got;
  std::memcpy(&got, o.reply->data() + sizeof(Header) + sizeof(ConfigHeader), sizeof(got));
  EXPECT_EQ(le32toh(got.abi_version), static_cast<uint32_t>(VSTELLAR_ABI_VERSION));
  EXPECT_EQ(le32toh(got.db_slots), 512u);
  // Out of range, size mismatch, flags.
  c = ConfigHeader{64, 128, 0};
  std::vector<uint8_t> q(sizeof(c) + 128, 0);
  std::memcpy(q.data(), &c, sizeof(c));
  EXPECT_FALSE(s.Handle(Msg(Request::kGetConfig, q.data(), q.size())).ok());
  c = ConfigHeader{0, 64, 0};
  std::memcpy(q.data(), &c, sizeof(c));
  EXPECT_FALSE(s.Handle(Msg(Request::kGetConfig, q.data(), q.size())).ok());
  c = ConfigHeader{0, 128, 1};
  std::memcpy(q.data(), &c, sizeof(c));
  EXPECT_FALSE(s.Handle(Msg(Request::kGetConfig, q.data(), q.size())).ok());
  EXPECT_FALSE(s.Handle(Msg(Request::kSetConfig, q.data(), q.size())).ok());  // all 128 bytes
}

// Every vhost-user device of a guest gets the doorbell regions of all its
// vStellar devices in its memory table; the frontend names its own with
// SET_CONFIG of db_region_id (interface 1.4), and that is the only config
// field it may write.
TEST_F(VhostUser, DoorbellRegionIsTheOneTheFrontendNames) {
  Handshake();
  auto set_id = [&](uint32_t id) {
    std::vector<uint8_t> p(sizeof(ConfigHeader) + 4);
    ConfigHeader c{uint32_t(offsetof(virtio_vstellar_config, db_region_id)), 4, 0};
    std::memcpy(p.data(), &c, sizeof(c));
    std::memcpy(p.data() + sizeof(c), &id, 4);
    return s.Handle(Msg(Request::kSetConfig, p.data(), p.size()));
  };
  std::vector<Region> r;
  r.push_back({{0, 1 << 20, 0x7f0000000000, 0}, Memfd("memory-backend-memfd", 1 << 20)});
  // another device's doorbells first, at the lower address
  r.push_back({{0xfd000000, 1 << 16, 0x7f1000000000, 0}, Memfd("vstellar-doorbell-7", 1 << 16)});
  r.push_back({{0xfe000000, 1 << 16, 0x7f2000000000, 0}, Memfd("vstellar-doorbell-8", 1 << 16)});
  r.push_back({{0xff000000, 1 << 16, 0x7f3000000000, 0}, Memfd("vstellar-doorbell-x", 1 << 16)});
  ASSERT_TRUE(s.Handle(MemTable(r)).ok());
  EXPECT_TRUE(s.regions()[1].doorbell);
  EXPECT_FALSE(s.regions()[3].doorbell);  // not a doorbell name: plain memory
  EXPECT_EQ(s.DoorbellRegion(), nullptr) << "unnamed, two doorbell regions: neither may be taken";
  ASSERT_TRUE(set_id(8).ok());
  ASSERT_NE(s.DoorbellRegion(), nullptr);
  EXPECT_EQ(s.DoorbellRegion()->gpa, 0xfe000000u);
  ASSERT_TRUE(set_id(9).ok());
  EXPECT_EQ(s.DoorbellRegion(), nullptr);  // named, not in the table
  // Nothing else in the config space is writable, and no migration writes.
  std::vector<uint8_t> p(sizeof(ConfigHeader) + 4, 0);
  ConfigHeader c{uint32_t(offsetof(virtio_vstellar_config, max_qp)), 4, 0};
  std::memcpy(p.data(), &c, sizeof(c));
  EXPECT_FALSE(s.Handle(Msg(Request::kSetConfig, p.data(), p.size())).ok());
  c = ConfigHeader{uint32_t(offsetof(virtio_vstellar_config, db_region_id)), 4, 1};
  std::memcpy(p.data(), &c, sizeof(c));
  EXPECT_FALSE(s.Handle(Msg(Request::kSetConfig, p.data(), p.size())).ok());
}

TEST(VhostUserNames, DoorbellMemfdNames) {
  uint32_t id = 99;
  EXPECT_TRUE(ParseDoorbellName("vstellar-doorbell", &id));
  EXPECT_EQ(id, 0u);
  EXPECT_TRUE(ParseDoorbellName("vstellar-doorbell-4294967295", &id));
  EXPECT_EQ(id, 4294967295u);
  for (const char* bad : {"vstellar-doorbell-", "vstellar-doorbell-0", "vstellar-doorbell-4294967296",
                          "vstellar-doorbell-1x", "vstellar-doorbell-+1", "vstellar-doorbells", "guest-ram", ""})
    EXPECT_FALSE(ParseDoorbellName(bad, &id)) << bad;
}

TEST_F(VhostUser, ReplyAckAndQueueNum) {
  EXPECT_FALSE(s.Handle(Msg(Request::kGetQueueNum)).ok());  // MQ not acked yet
  Handshake();
  EXPECT_EQ(ReplyU64(s.Handle(Msg(Request::kGetQueueNum))), static_cast<uint64_t>(VSTELLAR_MAX_VQS));
  Outcome ok = s.Handle(MsgOf(Request::kSetVringEnable, VringState{0, 0}, kFlagVersion | kFlagNeedReply));
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ReplyU64(ok), 0u);
  Outcome bad = s.Handle(MsgOf(Request::kSetVringEnable, VringState{0, 5}, kFlagVersion | kFlagNeedReply));
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(ReplyU64(bad), 0u);
}

TEST(VhostUserTransport, ReadsHeaderPayloadAndFds) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Header h{static_cast<uint32_t>(Request::kSetVringCall), kFlagVersion, 8};
  uint64_t u = 1;
  char buf[20];
  std::memcpy(buf, &h, 12);
  std::memcpy(buf + 12, &u, 8);
  int efd = memfd_create("vstellar-doorbell", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &efd, sizeof(int));
  ASSERT_EQ(sendmsg(sv[0], &msg, 0), 20);
  close(efd);
  Message m;
  std::string err;
  ASSERT_TRUE(ReadMessage(sv[1], &m, &err)) << err;
  EXPECT_EQ(m.hdr.request, h.request);
  ASSERT_EQ(m.payload.size(), 8u);
  ASSERT_EQ(m.fds.size(), 1u);
  EXPECT_EQ(MemfdName(m.fds[0].get()), "vstellar-doorbell");
  // An oversized payload is refused before it is read.
  Header big{1, kFlagVersion, 1 << 20};
  ASSERT_EQ(write(sv[0], &big, sizeof(big)), 12);
  EXPECT_FALSE(ReadMessage(sv[1], &m, &err));
  EXPECT_FALSE(err.empty());
  close(sv[0]);
  EXPECT_FALSE(ReadMessage(sv[1], &m, &err));  // EOF
  close(sv[1]);
}

}  // namespace

// Live migration's requests (docs/virtio-vstellar.md, "Live migration"):
// the dirty log's base is answered (QEMU waits for it with LOG_SHMFD), a
// running ring takes its own addresses again with the log flag but cannot
// move, RESET_DEVICE and the state requests need their protocol features.
TEST_F(VhostUser, MigrationRequests) {
  Handshake();
  Memory();
  Ring(0);
  ASSERT_TRUE(s.Handle(MsgOf(Request::kSetVringEnable, VringState{0, 1})).ok());
  Message lb = MsgOf(Request::kSetLogBase, LogBase{4096, 0});
  lb.fds.push_back(Memfd("vhost-log", 4096));
  Outcome o = s.Handle(std::move(lb));
  ASSERT_TRUE(o.ok()) << o.error;
  ASSERT_TRUE(o.reply);
  EXPECT_EQ(ReplyU64(o), 0u);
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetLogBase, LogBase{4096, 0})).ok()) << "no fd";
  Message huge = MsgOf(Request::kSetLogBase, LogBase{uint64_t{1} << 40, 0});
  huge.fds.push_back(Memfd("vhost-log", 4096));
  EXPECT_FALSE(s.Handle(std::move(huge)).ok());
  const uint64_t base = 0x7f0000000000ull + 0x10000ull;
  EXPECT_TRUE(s.Handle(MsgOf(Request::kSetVringAddr, VringAddr{0, kVringFlagLog, base, base + 0x8000, base + 0x4000,
                                                                0x18000}))
                  .ok());
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringAddr, VringAddr{0, kVringFlagLog, base + 0x1000, base + 0x8000,
                                                                 base + 0x4000, 0x18000}))
                   .ok())
      << "a running ring moved";
  EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringAddr, VringAddr{0, 2, base, base + 0x8000, base + 0x4000, 0})).ok());
  EXPECT_FALSE(s.Handle(Msg(Request::kSetLogFd)).ok());
  // No device lends the state transfer here: DEVICE_STATE is not offered.
  EXPECT_FALSE(s.offered_protocol_features() & Bit(kProtocolDeviceState));
  EXPECT_FALSE(s.Handle(MsgOf(Request::kCheckDeviceState, uint64_t{0})).ok());
  EXPECT_TRUE(s.Handle(Msg(Request::kResetDevice)).ok());
}

TEST_F(VhostUser, ResetDeviceNeedsItsProtocolFeature) {
  ASSERT_TRUE(s.Handle(MsgOf(Request::kSetFeatures, s.offered_features())).ok());
  ASSERT_TRUE(s.Handle(MsgOf(Request::kSetProtocolFeatures, Bit(kProtocolReplyAck))).ok());
  ASSERT_TRUE(s.Handle(Msg(Request::kSetOwner)).ok());
  EXPECT_FALSE(s.Handle(Msg(Request::kResetDevice)).ok());
  EXPECT_FALSE(s.stop_is_not_reset());
}
