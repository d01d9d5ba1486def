// PVDMA (lazy 2 MiB pinning, map cache, eager baseline) and the MR
// translators (eMTT, ATC), including WRITEs through the engine.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include <vstellar/engine.h>
#include <vstellar/sim_net.h>

#include "vstellard/pvdma.h"
#include "vstellard/translate.h"

using namespace vstellard;

namespace {

constexpr uint64_t MiB = 1ull << 20;

// A memfd "guest RAM" the test can also write through its own mapping.
struct Guest {
  int fd = -1;
  uint64_t size;
  uint8_t* mem = nullptr;
  explicit Guest(uint64_t sz) : size(sz) {
    fd = memfd_create("guest-ram", MFD_CLOEXEC);
    EXPECT_EQ(ftruncate(fd, off_t(sz)), 0);
    mem = static_cast<uint8_t*>(mmap(nullptr, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  }
  ~Guest() {
    munmap(mem, size);
    close(fd);
  }
  std::vector<MemRegion> Table(uint64_t gpa = 0, uint64_t offset = 0, uint64_t len = 0) const {
    std::vector<MemRegion> t(1);
    t[0].gpa = gpa;
    t[0].size = len ? len : size - offset;
    t[0].qemu_va = 0x7f0000000000ull + gpa;
    t[0].offset = offset;
    t[0].fd = Fd(dup(fd));
    return t;
  }
};

TEST(Pvdma, NothingPinnedAtAttach) {
  Guest g(64 * MiB);
  Pvdma pv(PinMode::kLazy);
  std::string err;
  ASSERT_TRUE(pv.Attach(g.Table(), &err)) << err;
  PvdmaStats s = pv.stats();
  EXPECT_EQ(s.blocks_pinned, 0u);
  EXPECT_EQ(s.bytes_pinned, 0u);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_EQ(s.guest_bytes, 64 * MiB);
}

TEST(Pvdma, FirstAccessPinsExactlyOneBlock) {
  Guest g(64 * MiB);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(g.Table(), &err));
  std::memcpy(g.mem + 5 * MiB + 123, "hello", 5);
  uint64_t contig;
  uint8_t* p = pv.Map(5 * MiB + 123, &contig);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(std::memcmp(p, "hello", 5), 0);
  EXPECT_EQ(contig, 6 * MiB - (5 * MiB + 123));  // to the end of the 2 MiB block [4, 6) MiB
  PvdmaStats s = pv.stats();
  EXPECT_EQ(s.blocks_pinned, 1u);
  EXPECT_EQ(s.bytes_pinned, 2 * MiB);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits, 0u);
  // Same block again: a map-cache hit, nothing new pinned.
  ASSERT_NE(pv.Map(4 * MiB, &contig), nullptr);
  s = pv.stats();
  EXPECT_EQ(s.blocks_pinned, 1u);
  EXPECT_EQ(s.hits, 1u);
  // A write through the device lands in guest memory.
  ASSERT_TRUE(pv.Write(6 * MiB - 2, "abcd", 4));  // spans two blocks
  EXPECT_EQ(std::memcmp(g.mem + 6 * MiB - 2, "abcd", 4), 0);
  EXPECT_EQ(pv.stats().blocks_pinned, 2u);
}

TEST(Pvdma, OutsideGuestMemoryIsRefused) {
  Guest g(8 * MiB);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(g.Table(), &err));
  uint64_t c;
  EXPECT_EQ(pv.Map(8 * MiB, &c), nullptr);
  EXPECT_EQ(pv.Map(~0ull, &c), nullptr);
  char buf[16];
  EXPECT_FALSE(pv.Read(8 * MiB - 8, buf, 16));  // runs off the end
  EXPECT_FALSE(pv.Contains(8 * MiB - 4096, 8192));
  EXPECT_TRUE(pv.Contains(8 * MiB - 4096, 4096));
  EXPECT_GE(pv.stats().faults, 2u);
}

TEST(Pvdma, BlocksAreClampedToUnalignedRegions) {
  // A region at gpa 1 MiB + 64 KiB, from offset 256 KiB of its file: its
  // first block is [1 MiB + 64 KiB, 2 MiB).
  Guest g(16 * MiB);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(g.Table(MiB + 64 * 1024, 256 * 1024, 8 * MiB), &err));
  g.mem[256 * 1024 + 10] = 0x5a;
  uint64_t c;
  uint8_t* p = pv.Map(MiB + 64 * 1024 + 10, &c);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 0x5a);
  EXPECT_EQ(c, 2 * MiB - (MiB + 64 * 1024 + 10));
  EXPECT_EQ(pv.stats().bytes_pinned, MiB - 64 * 1024);
  EXPECT_EQ(pv.Map(MiB, &c), nullptr);  // below the region
}

TEST(Pvdma, EagerPinsEverythingAtAttach) {
  Guest g(16 * MiB);
  Pvdma pv(PinMode::kEager);
  std::string err;
  ASSERT_TRUE(pv.Attach(g.Table(), &err)) << err;
  PvdmaStats s = pv.stats();
  EXPECT_EQ(s.blocks_pinned, 8u);
  EXPECT_EQ(s.bytes_pinned, 16 * MiB);
  uint64_t c;
  ASSERT_NE(pv.Map(15 * MiB, &c), nullptr);
  EXPECT_EQ(pv.stats().misses, 0u);
  EXPECT_EQ(pv.stats().blocks_pinned, 8u);
}

TEST(Pvdma, NewTableKeepsIdenticalRegionsAndReleasesOthers) {
  Guest g(8 * MiB);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(g.Table(), &err));
  uint64_t c;
  uint8_t* p = pv.Map(0, &c);
  ASSERT_NE(p, nullptr);
  const uint64_t gen = pv.generation();
  ASSERT_TRUE(pv.Attach(g.Table(), &err));  // same region again
  EXPECT_EQ(pv.Map(0, &c), p);              // same mapping, no new pin
  EXPECT_EQ(pv.stats().blocks_pinned, 1u);
  EXPECT_EQ(pv.generation(), gen);  // nothing left the table
  EXPECT_EQ(pv.stats().regions_released, 0u);
  // Shrunk: the old region leaves the table; a hold keeps it mapped.
  std::shared_ptr<const void> hold = pv.Hold(0);
  ASSERT_TRUE(hold);
  ASSERT_TRUE(pv.Attach(g.Table(0, 0, 4 * MiB), &err));
  EXPECT_NE(pv.generation(), gen);
  p[0] = 1;  // still mapped: held
  EXPECT_EQ(g.mem[0], 1);
  EXPECT_EQ(pv.Map(5 * MiB, &c), nullptr);
  EXPECT_EQ(pv.stats().blocks_pinned, 1u);
  hold.reset();  // now it goes, with its pinned block
  EXPECT_EQ(pv.stats().regions_released, 1u);
  EXPECT_EQ(pv.stats().blocks_pinned, 0u);
  EXPECT_EQ(pv.Hold(5 * MiB), nullptr);
}

TEST(Pvdma, SealingIsCountedPerRegion) {
  // The test's memfd cannot be sealed (no MFD_ALLOW_SEALING); one that
  // allows sealing is sealed at attach, as QEMU's seal=on RAM already is.
  Guest g(4 * MiB);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(g.Table(), &err));
  EXPECT_EQ(pv.stats().unsealed_regions, 1u);
  int fd = memfd_create("sealable", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(fd, off_t(4 * MiB)), 0);
  std::vector<MemRegion> t(1);
  t[0].size = 4 * MiB;
  t[0].qemu_va = 0x7f0000000000ull;
  t[0].fd = Fd(fd);
  ASSERT_TRUE(pv.Attach(t, &err)) << err;
  EXPECT_EQ(pv.stats().unsealed_regions, 0u);
  EXPECT_NE(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK, 0);
}

MrLayout Layout(uint64_t iova, uint64_t len, uint32_t shift, const std::vector<uint64_t>& pages) {
  MrLayout l;
  l.iova = iova;
  l.length = len;
  l.page_shift = shift;
  l.pages = pages;
  return l;
}

// Guest pages in a scrambled order, as a guest's page allocator hands them out.
std::vector<uint64_t> ScrambledPages(uint64_t first, size_t n, uint64_t ps) {
  std::vector<uint64_t> v(n);
  for (size_t i = 0; i < n; i++) v[i] = first + i * ps;
  std::shuffle(v.begin(), v.end(), std::mt19937_64(7));
  return v;
}

void CheckTranslator(vstellar::MemoryTranslator& t, Guest& g, uint64_t iova, const std::vector<uint64_t>& pages,
                     uint32_t shift) {
  const uint64_t ps = 1ull << shift, base = iova & ~(ps - 1);
  std::vector<uint8_t> src(3 * ps + 100);
  for (size_t i = 0; i < src.size(); i++) src[i] = uint8_t(i * 7 + 1);
  const uint64_t at = iova + ps / 2;
  ASSERT_TRUE(vstellar::mem_write(t, at, src.data(), src.size()));
  for (size_t i = 0; i < src.size(); i++) {
    const uint64_t off = at + i - base;
    ASSERT_EQ(g.mem[pages[off >> shift] + (off & (ps - 1))], src[i]) << i;
  }
  std::vector<uint8_t> back(src.size());
  ASSERT_TRUE(vstellar::mem_read(t, at, back.data(), back.size()));
  EXPECT_EQ(back, src);
}

TEST(Translate, EmttResolvesAndPinsAtRegistration) {
  Guest g(64 * MiB);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(g.Table(), &err));
  auto pages = ScrambledPages(8 * MiB, 16, 4096);
  uint16_t st = 0;
  auto t = EmttTranslator::Create(pv, Layout(0x10000123, 16 * 4096 - 0x123, 12, pages), &st);
  ASSERT_TRUE(t) << st;
  const uint64_t pinned = pv.stats().blocks_pinned, misses = pv.stats().misses;
  EXPECT_GE(pinned, 1u);
  CheckTranslator(*t, g, 0x10000123, pages, 12);
  EXPECT_EQ(pv.stats().misses, misses);  // no lookups after registration
  vstellar::HostSpan sp[4];
  EXPECT_FALSE(t->translate(0x10000000, 16, false, sp, 4).ok);  // before the MR
  EXPECT_FALSE(t->translate(0x10000123 + 16 * 4096, 1, false, sp, 4).ok);  // past the end
}

TEST(Translate, BadPagesAreRefused) {
  Guest g(16 * MiB);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(g.Table(), &err));
  Atc atc(64);
  uint16_t st = 0;
  EXPECT_FALSE(EmttTranslator::Create(pv, Layout(0, 8192, 12, {0, 16 * MiB}), &st));
  EXPECT_EQ(st, VSTELLAR_STATUS_BAD_ADDRESS);
  EXPECT_FALSE(AtcTranslator::Create(pv, atc, Layout(0, 8192, 12, {0, 0x1001}), &st));
  EXPECT_EQ(st, VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_FALSE(AtcTranslator::Create(pv, atc, Layout(0, 4096, 12, {~0ull & ~4095ull}), &st));
  EXPECT_EQ(st, VSTELLAR_STATUS_BAD_ADDRESS);
  EXPECT_EQ(pv.stats().blocks_pinned, 0u);  // nothing pinned for refused MRs
}

TEST(Translate, AtcCachesEvictsAndTakesTheSlowPathOnMiss) {
  Guest g(64 * MiB);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(g.Table(), &err));
  Atc atc(8);  // 8 frames
  auto pages = ScrambledPages(2 * MiB, 32, 4096);
  uint16_t st = 0;
  auto t = AtcTranslator::Create(pv, atc, Layout(0x4000, 32 * 4096, 12, pages), &st);
  ASSERT_TRUE(t);
  EXPECT_EQ(pv.stats().blocks_pinned, 0u);  // ATC registration maps nothing
  CheckTranslator(*t, g, 0x4000, pages, 12);
  EXPECT_GT(atc.stats().misses, 0u);
  vstellar::HostSpan sp[64];
  atc.Invalidate(pv.id());
  atc.ResetStats();
  ASSERT_TRUE(t->translate(0x4000, 4096, false, sp, 64).ok);
  ASSERT_TRUE(t->translate(0x4000, 4096, false, sp, 64).ok);
  EXPECT_EQ(atc.stats().hits, 1u);
  // 32 frames through an 8-entry cache: evictions.
  ASSERT_TRUE(t->translate(0x4000, 32 * 4096, false, sp, 64).ok);
  EXPECT_GT(atc.stats().evictions, 0u);
  atc.Invalidate(pv.id());
  atc.ResetStats();
  ASSERT_TRUE(t->translate(0x4000, 4096, false, sp, 64).ok);
  EXPECT_EQ(atc.stats().misses, 1u);
}

TEST(Translate, TwoMegabytePages) {
  Guest g(64 * MiB);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(g.Table(), &err));
  std::vector<uint64_t> pages = {40 * MiB, 10 * MiB, 2 * MiB, 60 * MiB};
  uint16_t st;
  auto e = EmttTranslator::Create(pv, Layout(0x7f0000200000ull, 8 * MiB, 21, pages), &st);
  ASSERT_TRUE(e);
  CheckTranslator(*e, g, 0x7f0000200000ull, pages, 21);
}

// RDMA WRITE through the engine, between two PDs of one engine over a
// simulated network, with guest MRs translated by eMTT or ATC.
void EngineWrite(TranslationMode mode) {
  Guest g(64 * MiB);
  Pvdma pv;
  std::string err;
  ASSERT_TRUE(pv.Attach(g.Table(), &err));
  Atc atc(256);
  vstellar::SimNet net;
  vstellar::EngineConfig cfg;
  cfg.num_paths = 8;
  ASSERT_TRUE(cfg.validate());
  vstellar::Engine a(cfg, net.add_node(1), net), b(cfg, net.add_node(2), net);
  net.attach(1, &a);
  net.attach(2, &b);
  const uint64_t len = 3 * MiB + 4096 * 3 + 17;
  const size_t np = (len + 4095) / 4096 + 1;
  auto src_pages = ScrambledPages(4 * MiB, np, 4096);
  auto dst_pages = ScrambledPages(24 * MiB, np, 4096);
  auto make = [&](const std::vector<uint64_t>& pages, uint64_t iova) -> std::shared_ptr<vstellar::MemoryTranslator> {
    uint16_t st;
    if (mode == TranslationMode::kEmtt) return EmttTranslator::Create(pv, Layout(iova, len, 12, pages), &st);
    return AtcTranslator::Create(pv, atc, Layout(iova, len, 12, pages), &st);
  };
  for (size_t i = 0; i < np; i++)
    for (int k = 0; k < 4096; k += 512) g.mem[src_pages[i] + k] = uint8_t(i * 13 + k);
  vstellar::Pd* pa = a.alloc_pd();
  vstellar::Pd* pb = b.alloc_pd();
  vstellar::Mr* ma = a.reg_mr(pa, 0x1000, len, vstellar::ACCESS_LOCAL_WRITE, make(src_pages, 0x1000));
  vstellar::Mr* mb = b.reg_mr(pb, 0x2000, len, vstellar::ACCESS_LOCAL_WRITE | vstellar::ACCESS_REMOTE_WRITE,
                              make(dst_pages, 0x2000));
  ASSERT_TRUE(ma && mb);
  vstellar::Cq* ca = a.create_cq(64);
  vstellar::Cq* cb = b.create_cq(64);
  vstellar::QpInitAttr ia;
  ia.send_cq = ia.recv_cq = ca;
  vstellar::QpInitAttr ib = ia;
  ib.send_cq = ib.recv_cq = cb;
  vstellar::Qp* qa = a.create_qp(pa, ia);
  vstellar::Qp* qb = b.create_qp(pb, ib);
  auto connect = [](vstellar::Engine& e, vstellar::Qp* q, uint32_t peer_ip, uint32_t peer_qpn) {
    vstellar::QpAttr at;
    at.qp_state = vstellar::QpState::INIT;
    at.qp_access_flags = vstellar::ACCESS_REMOTE_WRITE;
    ASSERT_EQ(e.modify_qp(q, at, vstellar::QP_STATE | vstellar::QP_ACCESS_FLAGS | vstellar::QP_PKEY_INDEX |
                                     vstellar::QP_PORT), 0);
    at.qp_state = vstellar::QpState::RTR;
    at.ah = {peer_ip, 1};
    at.dest_qp_num = peer_qpn;
    ASSERT_EQ(e.modify_qp(q, at, vstellar::QP_STATE | vstellar::QP_AV | vstellar::QP_PATH_MTU |
                                     vstellar::QP_DEST_QPN | vstellar::QP_RQ_PSN | vstellar::QP_MAX_DEST_RD_ATOMIC |
                                     vstellar::QP_MIN_RNR_TIMER), 0);
    at.qp_state = vstellar::QpState::RTS;
    ASSERT_EQ(e.modify_qp(q, at, vstellar::QP_STATE | vstellar::QP_TIMEOUT | vstellar::QP_RETRY_CNT |
                                     vstellar::QP_RNR_RETRY | vstellar::QP_SQ_PSN | vstellar::QP_MAX_QP_RD_ATOMIC), 0);
  };
  connect(a, qa, 2, qb->qpn());
  connect(b, qb, 1, qa->qpn());
  vstellar::Sge sge{0x1000, uint32_t(len), ma->lkey()};
  vstellar::SendWr wr;
  wr.wr_id = 9;
  wr.opcode = vstellar::WrOpcode::RDMA_WRITE;
  wr.send_flags = vstellar::SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.remote_addr = 0x2000;
  wr.rkey = mb->rkey();
  ASSERT_EQ(a.post_send(qa, wr), 0);
  vstellar::Wc wc;
  ASSERT_TRUE(net.run_until([&] { return a.poll_cq(ca, &wc, 1) == 1; }));
  EXPECT_EQ(wc.status, vstellar::WcStatus::SUCCESS);
  std::vector<uint8_t> x(len), y(len);
  ASSERT_TRUE(vstellar::mem_read(ma->mem(), 0x1000, x.data(), len));
  ASSERT_TRUE(vstellar::mem_read(mb->mem(), 0x2000, y.data(), len));
  EXPECT_TRUE(x == y);
  if (mode == TranslationMode::kAtc) {
    EXPECT_GT(atc.stats().evictions, 0u);
  }
}

TEST(Translate, EngineWriteThroughEmtt) { EngineWrite(TranslationMode::kEmtt); }
TEST(Translate, EngineWriteThroughAtc) { EngineWrite(TranslationMode::kAtc); }

}  // namespace
