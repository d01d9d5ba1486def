// Regression tests for guest-memory problems:
//   - memory-table churn leaked fds and mappings;
//   - ATC entries of two devices could alias (12-bit owner in the key);
//   - a guest-RAM file shrunk after attach killed the daemon (SIGBUS).
// They use only the Pvdma/translator API, as the daemon does on
// SET_MEM_TABLE, MR registration and data-path accesses.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "vstellard/pvdma.h"
#include "vstellard/translate.h"

using namespace vstellard;

namespace {

constexpr uint64_t MiB = 1ull << 20;

// A memfd as QEMU would hand it over; the test keeps its own mapping to
// see what the daemon wrote. `sealable`: created with MFD_ALLOW_SEALING but
// no seals yet (QEMU's seal=off), else unsealable (QEMU's doorbell memfd).
struct File {
  int fd = -1;
  uint64_t size;
  uint8_t* mem = nullptr;
  File(uint64_t sz, bool sealable, uint8_t fill = 0) : size(sz) {
    fd = memfd_create("guest-ram", MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0u));
    EXPECT_EQ(ftruncate(fd, off_t(sz)), 0);
    mem = static_cast<uint8_t*>(mmap(nullptr, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    std::memset(mem, fill, sz);
  }
  ~File() {
    munmap(mem, size);
    close(fd);
  }
  MemRegion Region(uint64_t gpa, uint64_t len = 0, bool doorbell = false) const {
    MemRegion r;
    r.gpa = gpa;
    r.size = len ? len : size;
    r.qemu_va = 0x7f0000000000ull + gpa;
    r.fd = Fd(dup(fd));
    r.doorbell = doorbell;
    return r;
  }
};

std::vector<MemRegion> Table(MemRegion a) {
  std::vector<MemRegion> t;
  t.push_back(std::move(a));
  return t;
}
std::vector<MemRegion> Table(MemRegion a, MemRegion b) {
  std::vector<MemRegion> t;
  t.push_back(std::move(a));
  t.push_back(std::move(b));
  return t;
}

size_t OpenFds() {
  size_t n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

size_t Mappings() {
  std::ifstream f("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(f, line);) n++;
  return n;
}

// A guest that keeps moving its doorbell BAR makes QEMU send a new
// memory table each time: RAM unchanged, the doorbell region elsewhere.
TEST(SecurityPvdma, MemTableChurnKeepsFdsAndMappingsFlat) {
  File ram(8 * MiB, true), db(64 * 1024, false);
  Pvdma pv;
  std::string err;
  uint64_t c;
  auto cycle = [&](int i) {
    const uint64_t db_gpa = 0x100000000ull + uint64_t(i % 2) * 0x10000000ull;  // moves back and forth
    ASSERT_TRUE(pv.Attach(Table(ram.Region(0), db.Region(db_gpa, 0, true)), &err)) << err;
    ASSERT_NE(pv.Map(4096, &c), nullptr);
    uint8_t* bell = pv.Map(db_gpa, &c);
    ASSERT_NE(bell, nullptr);
    bell[0] = uint8_t(i);
  };
  cycle(0);
  const size_t fds = OpenFds(), maps = Mappings();
  for (int i = 1; i <= 500; i++) {
    cycle(i);
    if (HasFatalFailure()) return;
  }
  EXPECT_LE(OpenFds(), fds + 1) << "fds leak on SET_MEM_TABLE churn";
  EXPECT_LE(Mappings(), maps + 2) << "mappings leak on SET_MEM_TABLE churn";
  EXPECT_EQ(db.mem[0], uint8_t(500));
}

// A region that left the table is unmapped, but an eMTT MR registered
// on it keeps it mapped (its host pointers stay valid) until the MR goes.
TEST(SecurityPvdma, EmttMrKeepsItsRegionUntilItIsGone) {
  File a(4 * MiB, true, 0xaa), b(4 * MiB, true, 0xbb);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(Table(a.Region(0)), &err)) << err;
  MrLayout l;
  l.iova = 0x10000;
  l.length = 8192;
  l.pages = {0, 4096};
  uint16_t st = 0;
  auto mr = EmttTranslator::Create(pv, l, &st);
  ASSERT_TRUE(mr);
  const size_t maps_with_a = Mappings();
  ASSERT_TRUE(pv.Attach(Table(b.Region(0)), &err)) << err;  // a leaves the table
  // The MR still reads and writes a's memory through its pinned pointers.
  vstellar::HostSpan sp[4];
  auto r = mr->translate(0x10000, 8192, true, sp, 4);
  ASSERT_TRUE(r.ok);
  EXPECT_EQ(sp[0].ptr[0], 0xaa);
  sp[0].ptr[1] = 0x11;
  EXPECT_EQ(a.mem[1], 0x11);
  // And new accesses see the new table.
  uint8_t x = 0;
  ASSERT_TRUE(pv.Read(0, &x, 1));
  EXPECT_EQ(x, 0xbb);
  // When the MR goes, a's mapping goes.
  const size_t maps_held = Mappings();
  mr.reset();
  EXPECT_LT(Mappings(), maps_held);
  EXPECT_LE(Mappings(), maps_with_a);
}

// ATC entries made for a region that left the table are never used
// again (the region is unmapped: a hit would be a dangling pointer).
TEST(SecurityPvdma, AtcDoesNotServeADroppedRegion) {
  File a(4 * MiB, true, 0xaa), b(4 * MiB, true, 0xbb);
  Pvdma pv;
  Atc atc(64);
  std::string err;
  ASSERT_TRUE(pv.Attach(Table(a.Region(0)), &err)) << err;
  uint8_t* p = atc.Lookup(pv, 8192);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 0xaa);
  ASSERT_TRUE(pv.Attach(Table(b.Region(0)), &err)) << err;  // same gpa, other file
  p = atc.Lookup(pv, 8192);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 0xbb);
}

// Two devices whose Pvdma ids differ only above bit 12 (the 4,096th
// connection after a live one) must never see each other's translations.
TEST(SecurityPvdma, AtcOwnersDifferingAboveBit12DoNotAlias) {
  File a(4 * MiB, true, 0xaa), b(4 * MiB, true, 0xbb);
  Atc atc(64);
  std::string err;
  Pvdma victim;
  ASSERT_TRUE(victim.Attach(Table(a.Region(0)), &err)) << err;
  uint8_t* pa = atc.Lookup(victim, 4096);
  ASSERT_NE(pa, nullptr);
  // Connections come and go until one gets an id 4,096 above the victim's.
  std::unique_ptr<Pvdma> other;
  while (!other || other->id() < victim.id() + 4096) other = std::make_unique<Pvdma>();
  ASSERT_EQ(other->id(), victim.id() + 4096);
  ASSERT_TRUE(other->Attach(Table(b.Region(0)), &err)) << err;
  uint8_t* pb = atc.Lookup(*other, 4096);
  ASSERT_NE(pb, nullptr);
  EXPECT_NE(pb, pa);
  EXPECT_EQ(*pb, 0xbb) << "the new connection reads the victim's memory";
  // Dropping the other's entries (its device goes) keeps the victim's.
  atc.ResetStats();
  atc.Invalidate(other->id());
  EXPECT_EQ(atc.Lookup(victim, 4096), pa);
  EXPECT_EQ(atc.stats().hits, 1u);
}

// A memfd that allows sealing is sealed against shrinking at attach,
// so the frontend can no longer shrink it under the daemon's mappings.
TEST(SecurityPvdma, SealableMemfdIsSealedAgainstShrinking) {
  File ram(8 * MiB, true, 0x5a);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(Table(ram.Region(0)), &err)) << err;
  uint8_t x = 0;
  ASSERT_TRUE(pv.Read(6 * MiB, &x, 1));
  const int rc = ftruncate(ram.fd, 0);
  ASSERT_NE(rc, 0) << "shrink allowed: the next access would be a SIGBUS";
  EXPECT_EQ(errno, EPERM);
  ASSERT_TRUE(pv.Read(6 * MiB, &x, 1));
  EXPECT_EQ(x, 0x5a);
}

// A file that cannot be sealed and was shrunk is refused when a block
// is mapped (no SIGBUS on the access that follows).
TEST(SecurityPvdma, ShrunkUnsealableFileIsRefusedAtMapTime) {
  File ram(8 * MiB, false);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(Table(ram.Region(0)), &err)) << err;
  ASSERT_EQ(ftruncate(ram.fd, off_t(2 * MiB)), 0);  // not sealable: allowed
  uint64_t c;
  ASSERT_EQ(pv.Map(6 * MiB, &c), nullptr) << "mapped past the end of the file";
  uint8_t x;
  EXPECT_FALSE(pv.Read(6 * MiB, &x, 1));
}

// A region its file does not cover is refused at attach.
TEST(SecurityPvdma, RegionLargerThanItsFileIsRefusedAtAttach) {
  File ram(2 * MiB, false);
  Pvdma pv;
  std::string err;
  EXPECT_FALSE(pv.Attach(Table(ram.Region(0, 8 * MiB)), &err));
  uint64_t c;
  EXPECT_EQ(pv.Map(6 * MiB, &c), nullptr);
}

}  // namespace
