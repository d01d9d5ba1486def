// Regression tests for problems of issue 24, where the frontend (QEMU, or
// whatever connects to the socket) or a guest sizes what the daemon keeps:
//   #1 a memory-table region on a huge sparse memfd made PVDMA's block
//      table throw std::bad_alloc, which nothing caught (SIGABRT);
// Session and Pvdma alone, as the daemon calls them, and an in-process
// daemon with test frontends (daemon_test.h).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

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

class FrontendSecurity : public DaemonTest {};

// Issue 24 #1: "within its file" holds for any size on a sparse file, so
// the size a frontend declares must be bounded by itself.
TEST_F(FrontendSecurity, SessionRefusesMoreGuestMemoryThanTheLimit) {
  Session s{DeviceConfig::Default()};
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

// Issue 24 #1: the block table (8 bytes per 2 MiB) of a region is charged
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

// Issue 24 #1 against the daemon: before, the first table below made
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

}  // namespace
}  // namespace vstellard
