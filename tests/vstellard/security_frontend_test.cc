// Regression tests for problems where the frontend (QEMU, or
// whatever connects to the socket) or a guest sizes what the daemon keeps:
//   - a memory-table region on a huge sparse memfd made PVDMA's block
//      table throw std::bad_alloc, which nothing caught (SIGABRT);
//   - RESIZE_SRQ grew the engine's ring uncharged;
//   - SET_VRING_ADDR moved a running ring;
// Session and Pvdma alone, as the daemon calls them, and an in-process
// daemon with test frontends (daemon_test.h).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "vstellard/daemon_test.h"
#include "vstellard/pvdma.h"
#include "vstellard/vhost_user.h"

namespace vstellard {
namespace {

constexpr uint64_t kHuge = uint64_t{1} << 60;

// A sparse memfd of `size` bytes: it costs nothing, however large.
int SparseMemfd(uint64_t size) {
  const int fd = memfd_create("memory-backend-memfd", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, off_t(size)), 0) << std::strerror(errno);
  return fd;
}

Message MemTable(const std::vector<MemRegionDesc>& d, const std::vector<int>& fds) {
  Message m;
  const uint32_t n = uint32_t(d.size());
  m.payload.resize(8 + n * sizeof(MemRegionDesc));
  std::memcpy(m.payload.data(), &n, 4);
  for (uint32_t i = 0; i < n; i++) std::memcpy(m.payload.data() + 8 + i * 32, &d[i], 32);
  m.hdr = Header{uint32_t(Request::kSetMemTable), kFlagVersion, uint32_t(m.payload.size())};
  for (int fd : fds) m.fds.emplace_back(dup(fd));
  return m;
}

// The payload of SET_MEM_TABLE as a frontend sends it.
std::vector<uint8_t> MemTablePayload(const std::vector<MemRegionDesc>& d) {
  const uint32_t n = uint32_t(d.size());
  std::vector<uint8_t> p(8 + n * sizeof(MemRegionDesc));
  std::memcpy(p.data(), &n, 4);
  for (uint32_t i = 0; i < n; i++) std::memcpy(p.data() + 8 + i * 32, &d[i], 32);
  return p;
}

template <typename T>
Message MsgOf(Request r, const T& v, std::vector<int> fds = {}) {
  Message m;
  m.hdr = Header{uint32_t(r), kFlagVersion, uint32_t(sizeof(v))};
  m.payload.resize(sizeof(v));
  std::memcpy(m.payload.data(), &v, sizeof(v));
  for (int fd : fds) m.fds.emplace_back(dup(fd));
  return m;
}

class FrontendSecurity : public DaemonTest {};

// A guest's commands against a daemon, for what its objects are charged.
class GuestQuotas : public DaemonTest {
 protected:
  uint64_t Memory() {
    const std::vector<DeviceStats> st = d_->Stats();
    EXPECT_EQ(st.size(), 1u);
    return st.empty() ? 0 : st[0].memory;
  }
  template <typename R>
  static R As(const CmdResult& r) {
    R v{};
    std::memcpy(&v, r.body.data(), std::min(r.body.size(), sizeof(v)));
    return v;
  }
  // A body followed by its page list.
  static std::vector<uint8_t> WithPages(const void* body, size_t n, uint64_t gpa, uint32_t pages) {
    std::vector<uint8_t> b(static_cast<const uint8_t*>(body), static_cast<const uint8_t*>(body) + n);
    for (uint32_t i = 0; i < pages; i++) {
      const uint64_t p = htole64(gpa + 4096ull * i);
      b.insert(b.end(), reinterpret_cast<const uint8_t*>(&p), reinterpret_cast<const uint8_t*>(&p) + 8);
    }
    return b;
  }
};

// "Within its file" holds for any size on a sparse file, so
// the size a frontend declares must be bounded by itself.
TEST_F(FrontendSecurity, SessionRefusesMoreGuestMemoryThanTheLimit) {
  DeviceState state{DeviceConfig::Default()};
  Session s{state};
  ASSERT_TRUE(s.Handle(Message{Header{uint32_t(Request::kSetOwner), kFlagVersion, 0}, {}, {}}).ok());
  const int fd = SparseMemfd(kHuge);
  Outcome o = s.Handle(MemTable({{0, kHuge, 0x7f0000000000, 0}}, {fd}));
  EXPECT_FALSE(o.ok());
  EXPECT_NE(o.error.find("guest-memory-limit"), std::string::npos) << o.error;
  EXPECT_TRUE(s.regions().empty());
  // Six regions within the limit each, over it together.
  std::vector<MemRegionDesc> six;
  for (uint64_t i = 0; i < 6; i++) six.push_back({i << 38, uint64_t{1} << 38, (i + 1) << 40, 0});
  EXPECT_FALSE(s.Handle(MemTable(six, std::vector<int>(6, fd))).ok());
  // Up to the limit is fine.
  const uint64_t limit = DeviceConfig::Default().max_guest_memory;
  EXPECT_TRUE(s.Handle(MemTable({{0, limit, 0x7f0000000000, 0}}, {fd})).ok());
  close(fd);
}

// The block table (8 bytes per 2 MiB) of a region is charged
// to the device before it is allocated; one that does not fit refuses the
// table and throws nothing.
TEST_F(FrontendSecurity, PvdmaChargesTheBlockTableBeforeAllocatingIt) {
  auto device = std::make_shared<MemoryBudget>(uint64_t{1} << 30);
  auto daemon = std::make_shared<MemoryBudget>(uint64_t{4} << 30);
  const int fd = SparseMemfd(kHuge);
  {
    Pvdma pv;
    pv.set_budgets(device, daemon);
    std::vector<MemRegion> t(1);
    t[0].size = kHuge;
    t[0].qemu_va = 0x7f0000000000;
    t[0].fd = Fd(dup(fd));
    std::string err;
    bool ok = true;
    EXPECT_NO_THROW(ok = pv.Attach(t, &err));
    EXPECT_FALSE(ok);
    EXPECT_NE(err.find("block table"), std::string::npos) << err;
    EXPECT_EQ(device->used(), 0u);
    EXPECT_EQ(daemon->used(), 0u);
    // 1 GiB: a table of 512 blocks, charged while the region lives.
    t[0].size = uint64_t{1} << 30;
    ASSERT_TRUE(pv.Attach(t, &err)) << err;
    EXPECT_EQ(device->used(), Pvdma::RegionFootprint(0, t[0].size));
    EXPECT_GE(device->used(), 512 * sizeof(void*));
    EXPECT_EQ(daemon->used(), device->used());
  }
  EXPECT_EQ(device->used(), 0u) << "the region's charge outlived it";
  EXPECT_EQ(daemon->used(), 0u);
  close(fd);
}

// The same against the daemon: before, the first table below made
// vstellard die with SIGABRT. Now it is refused, that connection closes,
// and the daemon serves the next one.
TEST_F(FrontendSecurity, HugeSparseRegionIsRefusedAndTheDaemonServesOn) {
  StartDaemon();
  const int fd = SparseMemfd(kHuge);
  Frontend bad;
  std::string err;
  ASSERT_TRUE(bad.Connect(sock_, &err, false)) << err;
  const std::vector<uint8_t> p = MemTablePayload({{0, kHuge, 0x7f0000000000, 0}});
  EXPECT_FALSE(bad.Send(Request::kSetMemTable, p.data(), p.size(), &err, {fd}, true));
  // Six regions of 32 TiB, with a limit high enough to let them by: their
  // block tables (768 MiB) are over the device's memory limit.
  TearDown();
  DaemonOptions o;
  o.guest_memory_limit = uint64_t{1} << 50;
  o.device_memory_limit = 256ull << 20;
  StartDaemon(o);
  Frontend bad6;
  ASSERT_TRUE(bad6.Connect(sock_, &err, false)) << err;
  std::vector<MemRegionDesc> six;
  for (uint64_t i = 0; i < 6; i++) six.push_back({i << 45, uint64_t{1} << 45, (i + 1) << 46, 0});
  const std::vector<uint8_t> p6 = MemTablePayload(six);
  EXPECT_FALSE(bad6.Send(Request::kSetMemTable, p6.data(), p6.size(), &err, std::vector<int>(6, fd), true));
  close(fd);
  auto good = Connect();
  EXPECT_EQ(good->Command(VSTELLAR_CMD_ALLOC_PD, 0, nullptr, 0, 8).status(), VSTELLAR_STATUS_OK);
  // What a good table costs is charged to its device.
  const std::vector<DeviceStats> st = d_->Stats();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_GE(st[0].memory, Pvdma::RegionFootprint(0, good->mem_size()));
}

// The size, base and address of a ring are the frontend's to
// change only while the ring is stopped; SET_VRING_ADDR was taken on a
// running one, so the device went on with a ring moved under it.
TEST_F(FrontendSecurity, RunningRingCannotBeReconfigured) {
  DeviceState state{DeviceConfig::Default()};
  Session s{state};
  ASSERT_TRUE(s.Handle(MsgOf(Request::kSetFeatures, s.offered_features())).ok());
  ASSERT_TRUE(s.Handle(Message{Header{uint32_t(Request::kSetOwner), kFlagVersion, 0}, {}, {}}).ok());
  const int ram = SparseMemfd(1 << 20);
  ASSERT_TRUE(s.Handle(MemTable({{0, 1 << 20, 0x7f0000000000, 0}}, {ram})).ok());
  const uint64_t base = 0x7f0000010000;
  const VringAddr addr{0, 0, base, base + 0x8000, base + 0x4000, 0};
  VringAddr moved = addr;
  moved.desc_user_addr += 0x20000;
  moved.used_user_addr += 0x20000;
  moved.avail_user_addr += 0x20000;
  auto layout_refused = [&](const char* when) {
    EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringAddr, moved)).ok()) << "SET_VRING_ADDR " << when;
    EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringNum, VringState{0, 128})).ok()) << "SET_VRING_NUM " << when;
    EXPECT_FALSE(s.Handle(MsgOf(Request::kSetVringBase, VringState{0, 9})).ok()) << "SET_VRING_BASE " << when;
    EXPECT_EQ(s.vring(0).desc, addr.desc_user_addr);
    EXPECT_EQ(s.vring(0).num, 256u);
  };
  ASSERT_TRUE(s.Handle(MsgOf(Request::kSetVringNum, VringState{0, 256})).ok());
  ASSERT_TRUE(s.Handle(MsgOf(Request::kSetVringAddr, addr)).ok());
  const int kick = SparseMemfd(8);  // any fd does for the session
  ASSERT_TRUE(s.Handle(MsgOf(Request::kSetVringKick, uint64_t{0}, {kick})).ok());
  layout_refused("after its kick");
  // Stopped: the layout may change again; enabled, it may not.
  ASSERT_TRUE(s.Handle(MsgOf(Request::kGetVringBase, VringState{0, 0})).ok());
  EXPECT_TRUE(s.Handle(MsgOf(Request::kSetVringAddr, addr)).ok());
  ASSERT_TRUE(s.Handle(MsgOf(Request::kSetVringEnable, VringState{0, 1})).ok());
  layout_refused("while enabled");
  ASSERT_TRUE(s.Handle(MsgOf(Request::kGetVringBase, VringState{0, 0})).ok());
  EXPECT_TRUE(s.Handle(MsgOf(Request::kSetVringNum, VringState{0, 128})).ok());
  EXPECT_TRUE(s.Handle(MsgOf(Request::kSetVringBase, VringState{0, 9})).ok());
  EXPECT_TRUE(s.Handle(MsgOf(Request::kSetVringAddr, moved)).ok());
  close(kick);
  close(ram);
}

// CREATE_SRQ of one WQE was charged about 1 KiB, and
// RESIZE_SRQ to 4,096 WQEs then added some 1.4 MiB (the engine's ring and
// the wr_id map) that nothing charged. Now the difference is charged before
// the ring grows, a resize over the device's limit fails with NO_RESOURCES
// (as every create over it does) and leaves the SRQ as it was, and DESTROY
// gives back what the SRQ holds after its resizes.
TEST_F(GuestQuotas, ResizeSrqIsChargedBeforeTheRingGrows) {
  DaemonOptions o;
  o.device_memory_limit = 1ull << 20;
  StartDaemon(o);
  auto f = Connect();
  CmdResult r = f->Command(VSTELLAR_CMD_ALLOC_UCONTEXT, 0, nullptr, 0, sizeof(vstellar_resp_alloc_ucontext));
  ASSERT_EQ(r.status(), VSTELLAR_STATUS_OK);
  const uint32_t uctx = le32toh(As<vstellar_resp_alloc_ucontext>(r).ucontext);
  r = f->Command(VSTELLAR_CMD_ALLOC_PD, uctx, nullptr, 0, sizeof(vstellar_resp_alloc_pd));
  ASSERT_EQ(r.status(), VSTELLAR_STATUS_OK);
  const uint32_t pdn = As<vstellar_resp_alloc_pd>(r).pdn;
  const uint64_t none = Memory();

  vstellar_cmd_create_srq c{};
  c.pdn = pdn;
  c.log_wqe = 0;
  c.log_stride = 6;
  c.page_shift = 12;
  c.max_sge = htole32(1);
  c.num_pages = htole32(1);
  std::vector<uint8_t> body = WithPages(&c, sizeof(c), Frontend::kFreeGpa, 1);
  r = f->Command(VSTELLAR_CMD_CREATE_SRQ, uctx, body.data(), body.size(), sizeof(vstellar_resp_create_srq));
  ASSERT_EQ(r.status(), VSTELLAR_STATUS_OK);
  const uint32_t srqn = As<vstellar_resp_create_srq>(r).srqn;
  const uint64_t one = Memory();
  EXPECT_GT(one, none);

  auto resize = [&](uint8_t log) {
    const uint32_t pages = std::max(1u, (64u << log) / 4096u);
    vstellar_cmd_resize_srq z{};
    z.srqn = srqn;
    z.log_wqe = log;
    z.page_shift = 12;
    z.num_pages = htole32(pages);
    std::vector<uint8_t> b = WithPages(&z, sizeof(z), Frontend::kFreeGpa + 0x100000, pages);
    return f->Command(VSTELLAR_CMD_RESIZE_SRQ, uctx, b.data(), b.size(), 0).status();
  };
  EXPECT_EQ(resize(12), VSTELLAR_STATUS_NO_RESOURCES) << "4,096 WQEs are over the device's 1 MiB";
  EXPECT_EQ(Memory(), one);
  vstellar_cmd_handle q{};
  q.handle = srqn;
  r = f->Command(VSTELLAR_CMD_QUERY_SRQ, uctx, &q, sizeof(q), sizeof(vstellar_resp_query_srq));
  ASSERT_EQ(r.status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(le32toh(As<vstellar_resp_query_srq>(r).max_wr), 1u) << "a refused resize changed the SRQ";

  ASSERT_EQ(resize(8), VSTELLAR_STATUS_OK);
  const uint64_t grown = Memory();
  EXPECT_GE(grown - one, 255u * (32 + sizeof(vstellar::Sge))) << "256 WQEs charged as one";
  ASSERT_EQ(resize(2), VSTELLAR_STATUS_OK);
  EXPECT_LT(Memory(), grown) << "a smaller SRQ still holds the larger charge";
  EXPECT_GT(Memory(), none);

  EXPECT_EQ(f->Command(VSTELLAR_CMD_DESTROY_SRQ, uctx, &q, sizeof(q), 0).status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(Memory(), none);
}

}  // namespace
}  // namespace vstellard
