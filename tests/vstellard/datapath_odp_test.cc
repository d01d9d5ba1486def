// On-demand paging (F_ODP): MRs registered without pages, page faults the
// guest driver answers with MAP_MR_PAGES, invalidations by UNMAP_MR_PAGES,
// and what happens when a guest never answers or answers with nonsense.
// The test plays the guest driver: it reads the fault events and maps
// pages of its own choosing, as vstellar.ko does from the process's page
// tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "vstellard/datapath_fixture.h"

namespace vstellard::datapath_test {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kOdpIova = 0x7f0000000000;  // a user address, as a process has it
constexpr uint64_t kOdpLen = 0x10000;           // 16 pages
constexpr uint64_t kBacking = 0x1000000;        // guest-physical pages the "kernel" gives it
constexpr uint64_t kMoved = 0x1800000;          // ... and after it moved them

struct OdpMr {
  uint32_t mrn = 0, key = 0;
};

vstellar_cmd_reg_mr OdpRegBody(const Guest& g, uint64_t iova, uint64_t len, uint32_t access) {
  vstellar_cmd_reg_mr c{};
  c.pdn = g.pd;
  c.access_flags = access | VSTELLAR_ACCESS_ON_DEMAND;
  c.iova = iova;
  c.length = len;
  c.page_shift = 12;
  return c;
}

OdpMr RegOdp(Guest& g, uint64_t iova, uint64_t len, uint32_t access = VSTELLAR_ACCESS_VALID,
             uint16_t* status = nullptr) {
  const vstellar_cmd_reg_mr c = OdpRegBody(g, iova, len, access);
  CmdResult r = g.Cmd(VSTELLAR_CMD_REG_MR, &c, sizeof(c), sizeof(vstellar_resp_reg_mr));
  if (status) *status = r.status();
  OdpMr m;
  if (r.status()) return m;
  m.mrn = As<vstellar_resp_reg_mr>(r).mrn;
  m.key = As<vstellar_resp_reg_mr>(r).lkey;
  return m;
}

uint16_t MapPages(Guest& g, uint32_t mrn, uint64_t iova, const std::vector<uint64_t>& pages) {
  vstellar_cmd_map_mr_pages c{};
  c.mrn = mrn;
  c.num_pages = uint32_t(pages.size());
  c.iova = iova;
  auto body = WithPages(&c, sizeof(c), pages);
  return g.Cmd(VSTELLAR_CMD_MAP_MR_PAGES, body.data(), body.size(), 0).status();
}

uint16_t UnmapPages(Guest& g, uint32_t mrn, uint64_t iova, uint64_t len) {
  vstellar_cmd_unmap_mr_pages c{};
  c.mrn = mrn;
  c.iova = iova;
  c.length = len;
  return g.Cmd(VSTELLAR_CMD_UNMAP_MR_PAGES, &c, sizeof(c), 0).status();
}

// The guest driver's half: every fault of MR `mrn` is answered with the
// pages its address has in `where` (iova -> gpa), writable.
struct FaultServer {
  Guest& g;
  uint32_t mrn;
  uint64_t iova0, gpa0;
  int served = 0, writes = 0;
  bool answer = true;

  void Serve(int timeout_ms) {
    std::vector<vstellar_event_page_fault> faults;
    g.f.Events(timeout_ms, &faults);
    for (const auto& pf : faults) {
      ASSERT_EQ(pf.object, mrn);
      ASSERT_EQ(pf.ucontext, g.uctx);
      ASSERT_EQ(pf.iova % kPage, 0u);
      ASSERT_GE(pf.num_pages, 1u);
      if (pf.flags & VSTELLAR_FAULT_WRITE) writes++;
      if (!answer) continue;
      std::vector<uint64_t> pages;
      for (uint32_t i = 0; i < pf.num_pages; i++)
        pages.push_back((gpa0 + pf.iova - iova0 + i * kPage) | VSTELLAR_ODP_PAGE_WRITABLE);
      ASSERT_EQ(MapPages(g, mrn, pf.iova, pages), 0);
      served++;
    }
  }
};

// An RC QP on each guest, connected to each other.
std::pair<GQp, GQp> ConnectedQps(Guest& A, Guest& B) {
  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  return {qa, qb};
}

// Polls `poller`'s CQ while serving faults.
std::optional<vstellar_cqe> PollServing(Guest& poller, std::vector<FaultServer*> servers, int timeout_ms = 10000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    for (FaultServer* s : servers) s->Serve(1);
    if (auto c = poller.Poll(1)) return c;
  }
  return std::nullopt;
}

}  // namespace

// A WRITE into an MR none of whose pages are mapped: the device asks the
// guest for them, the requester waits out RNRs, and the bytes land where
// the guest mapped them. A READ then finds them there. After UNMAP (the
// kernel moved the pages), the next WRITE faults again and lands at the
// new place; the old pages are not touched.
TEST_F(DataPath, OdpMrFaultsInPagesOnFirstTouchAndAgainAfterUnmap) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  const OdpMr m = RegOdp(B, kOdpIova, kOdpLen);
  ASSERT_NE(m.key, 0u);
  FaultServer srv{B, m.mrn, kOdpIova, kBacking};
  auto [qa, qb] = ConnectedQps(A, B);

  Fill(A.Buf(0), 3 * kPage, 11);
  auto wr = Wqe(VSTELLAR_WR_RDMA_WRITE, 1);
  wr.u.rdma.remote_addr = kOdpIova + 0x1800;  // across four pages
  wr.u.rdma.rkey = m.key;
  A.PostSend(qa, wr, {A.Sge(0, 3 * kPage)});
  auto c = PollServing(A, {&srv});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_GE(srv.served, 1);
  EXPECT_GE(srv.writes, 1);
  EXPECT_EQ(std::memcmp(B.f.mem() + kBacking + 0x1800, A.Buf(0), 3 * kPage), 0);

  auto rd = Wqe(VSTELLAR_WR_RDMA_READ, 2);
  rd.u.rdma.remote_addr = kOdpIova + 0x1800;
  rd.u.rdma.rkey = m.key;
  A.PostSend(qa, rd, {A.Sge(0x8000, 3 * kPage)});
  c = PollServing(A, {&srv});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(std::memcmp(A.Buf(0x8000), A.Buf(0), 3 * kPage), 0);

  // The kernel takes the pages back (and, say, migrates them): from now on
  // they are somewhere else.
  ASSERT_EQ(UnmapPages(B, m.mrn, kOdpIova, kOdpLen), 0);
  std::memset(B.f.mem() + kBacking, 0x5a, kOdpLen);
  srv.gpa0 = kMoved;
  const int before = srv.served;
  Fill(A.Buf(0), 3 * kPage, 29);
  wr.wr_id = 3;
  A.PostSend(qa, wr, {A.Sge(0, 3 * kPage)});
  c = PollServing(A, {&srv});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_GT(srv.served, before);
  EXPECT_EQ(std::memcmp(B.f.mem() + kMoved + 0x1800, A.Buf(0), 3 * kPage), 0);
  EXPECT_TRUE(std::all_of(B.f.mem() + kBacking, B.f.mem() + kBacking + kOdpLen, [](uint8_t x) { return x == 0x5a; }));

  // An atomic faults the same way.
  ASSERT_EQ(UnmapPages(B, m.mrn, kOdpIova, kPage), 0);
  auto fa = Wqe(VSTELLAR_WR_ATOMIC_FETCH_ADD, 4);
  fa.u.atomic.remote_addr = kOdpIova + 8;
  fa.u.atomic.rkey = m.key;
  fa.u.atomic.compare_add = 5;
  uint64_t old = 0;
  std::memcpy(&old, B.f.mem() + kMoved + 8, 8);
  A.PostSend(qa, fa, {A.Sge(0x10000, 8)});
  c = PollServing(A, {&srv});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  uint64_t now = 0, got = 0;
  std::memcpy(&now, B.f.mem() + kMoved + 8, 8);
  std::memcpy(&got, A.Buf(0x10000), 8);
  EXPECT_EQ(now, old + 5);
  EXPECT_EQ(got, old);
}

// SEND into receive buffers of an on-demand MR (the responder's scatter
// faults: RNR until mapped), and a requester whose own buffers are on
// demand: it waits before sending (local READ targets must be writable
// pages, so those faults say "write").
TEST_F(DataPath, OdpReceiveBuffersAndLocalBuffersWaitForTheirPages) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  const OdpMr mb = RegOdp(B, kOdpIova, kOdpLen);
  const OdpMr ma = RegOdp(A, kOdpIova, kOdpLen);
  FaultServer sb{B, mb.mrn, kOdpIova, kBacking};
  FaultServer sa{A, ma.mrn, kOdpIova, kBacking};
  auto [qa, qb] = ConnectedQps(A, B);

  // A sends from its on-demand buffer into B's on-demand receive buffer.
  // A's pages hold whatever "the process" wrote there before it was mapped.
  Fill(A.f.mem() + kBacking, 2 * kPage, 41);
  B.PostRecv(qb, 7, {vstellar_sge{kOdpIova + 0x4000, uint32_t(2 * kPage), mb.key}});
  auto s = Wqe(VSTELLAR_WR_SEND, 8);
  A.PostSend(qa, s, {vstellar_sge{kOdpIova, uint32_t(2 * kPage), ma.key}});
  auto c = PollServing(A, {&sa, &sb});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  c = PollServing(B, {&sa, &sb});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(c->byte_len, 2 * kPage);
  EXPECT_EQ(std::memcmp(B.f.mem() + kBacking + 0x4000, A.f.mem() + kBacking, 2 * kPage), 0);
  EXPECT_GE(sa.served, 1);
  EXPECT_GE(sb.served, 1);

  // A READs into its on-demand pages 8 and 9, never touched: write faults.
  Fill(B.Buf(0), 2 * kPage, 53);
  const int writes = sa.writes;
  auto rd = Wqe(VSTELLAR_WR_RDMA_READ, 9);
  rd.u.rdma.remote_addr = kMrGpa;
  rd.u.rdma.rkey = B.rkey;
  A.PostSend(qa, rd, {vstellar_sge{kOdpIova + 8 * kPage, uint32_t(2 * kPage), ma.key}});
  c = PollServing(A, {&sa, &sb});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_GT(sa.writes, writes);
  EXPECT_EQ(std::memcmp(A.f.mem() + kBacking + 8 * kPage, B.Buf(0), 2 * kPage), 0);
}

// A page mapped for reading only (the zero page after a read fault) is
// never written: a write to it faults again, asking for a writable page.
TEST_F(DataPath, OdpReadOnlyPageIsNeverWrittenAndFaultsForWriting) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  const OdpMr m = RegOdp(B, kOdpIova, kOdpLen);
  std::vector<uint64_t> ro;
  for (uint64_t i = 0; i < 16; i++) ro.push_back(kMoved);  // every page: one shared read-only page
  std::memset(B.f.mem() + kMoved, 0, kPage);
  ASSERT_EQ(MapPages(B, m.mrn, kOdpIova, ro), 0);
  auto [qa, qb] = ConnectedQps(A, B);
  // Reading needs no fault.
  auto rd = Wqe(VSTELLAR_WR_RDMA_READ, 1);
  rd.u.rdma.remote_addr = kOdpIova + 5 * kPage;
  rd.u.rdma.rkey = m.key;
  Fill(A.Buf(0), kPage, 3);
  A.PostSend(qa, rd, {A.Sge(0, kPage)});
  auto c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_TRUE(std::all_of(A.Buf(0), A.Buf(kPage), [](uint8_t x) { return x == 0; }));
  EXPECT_TRUE(B.f.Events(0).empty());
  // Writing faults for a writable page, and lands there only.
  FaultServer srv{B, m.mrn, kOdpIova, kBacking};
  Fill(A.Buf(0), kPage, 9);
  auto wr = Wqe(VSTELLAR_WR_RDMA_WRITE, 2);
  wr.u.rdma.remote_addr = kOdpIova + 5 * kPage;
  wr.u.rdma.rkey = m.key;
  A.PostSend(qa, wr, {A.Sge(0, kPage)});
  c = PollServing(A, {&srv});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_GE(srv.writes, 1);
  EXPECT_EQ(std::memcmp(B.f.mem() + kBacking + 5 * kPage, A.Buf(0), kPage), 0);
  EXPECT_TRUE(std::all_of(B.f.mem() + kMoved, B.f.mem() + kMoved + kPage, [](uint8_t x) { return x == 0; }));
}

// An implicit MR (the whole address space) faults in whatever address a
// peer names.
TEST_F(DataPath, OdpImplicitMrCoversTheWholeAddressSpace) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  const OdpMr m = RegOdp(B, 0, VSTELLAR_ODP_IMPLICIT_LENGTH);
  ASSERT_NE(m.key, 0u);
  const uint64_t where = 0x7ffe12340000;
  FaultServer srv{B, m.mrn, where, kBacking};
  auto [qa, qb] = ConnectedQps(A, B);
  Fill(A.Buf(0), 2 * kPage, 77);
  auto wr = Wqe(VSTELLAR_WR_RDMA_WRITE, 1);
  wr.u.rdma.remote_addr = where + 0x100;
  wr.u.rdma.rkey = m.key;
  A.PostSend(qa, wr, {A.Sge(0, 2 * kPage)});
  auto c = PollServing(A, {&srv});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(std::memcmp(B.f.mem() + kBacking + 0x100, A.Buf(0), 2 * kPage), 0);
  // Unmapping the whole space is one command.
  EXPECT_EQ(UnmapPages(B, m.mrn, 0, ~uint64_t(kPage - 1)), 0);
}

// A guest that never answers: the access fails after the fault timeout
// with a clear status, on that QP only, and the daemon goes on serving.
TEST_F(DataPath, OdpFaultNobodyAnswersFailsThatRequestAfterTheTimeout) {
  StartDaemon(50, {}, [](DaemonOptions& o) { o.odp_fault_timeout_ms = 200; });
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  const OdpMr mb = RegOdp(B, kOdpIova, kOdpLen);
  const OdpMr ma = RegOdp(A, kOdpIova, kOdpLen);
  FaultServer sb{B, mb.mrn, kOdpIova, kBacking};
  sb.answer = false;
  auto [qa, qb] = ConnectedQps(A, B);
  auto wr = Wqe(VSTELLAR_WR_RDMA_WRITE, 1);
  wr.u.rdma.remote_addr = kOdpIova;
  wr.u.rdma.rkey = mb.key;
  A.PostSend(qa, wr, {A.Sge(0, kPage)});
  auto c = PollServing(A, {&sb});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, uint8_t(vstellar::WcStatus::REM_OP_ERR));
  EXPECT_GE(sb.writes, 1);

  // Its own buffer, never mapped: a local protection error.
  auto [qa2, qb2] = ConnectedQps(A, B);
  auto w2 = Wqe(VSTELLAR_WR_RDMA_WRITE, 2);
  w2.u.rdma.remote_addr = kMrGpa;
  w2.u.rdma.rkey = B.rkey;
  A.PostSend(qa2, w2, {vstellar_sge{kOdpIova, uint32_t(kPage), ma.key}});
  c = A.Poll(10000);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, uint8_t(vstellar::WcStatus::LOC_PROT_ERR));

  // Others are served.
  auto [qa3, qb3] = ConnectedQps(A, B);
  Fill(A.Buf(0), kPage, 5);
  auto w3 = Wqe(VSTELLAR_WR_RDMA_WRITE, 3);
  w3.u.rdma.remote_addr = kMrGpa + 0x1000;
  w3.u.rdma.rkey = B.rkey;
  A.PostSend(qa3, w3, {A.Sge(0, kPage)});
  // Flushes of the failed QPs come first.
  for (int i = 0; i < 4; i++) {
    c = A.Poll();
    ASSERT_TRUE(c);
    if (c->wr_id == 3) break;
  }
  EXPECT_EQ(c->wr_id, 3u);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(std::memcmp(B.Buf(0x1000), A.Buf(0), kPage), 0);
}

// UNMAP_MR_PAGES racing a stream of incoming WRITEs (the kernel takes the
// pages back while a peer writes): once it is answered no byte of the old
// pages changes, and the WRITEs still arriving fault and land in the
// pages mapped next; none fails.
TEST_F(DataPath, OdpUnmapRacingIncomingWritesLeavesNoStaleWrite) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  constexpr uint64_t kLen = 1 << 20;
  constexpr uint32_t kWrites = 48, kChunk = 4096, kPkt = 1024;  // MTU 1024: 4 packets each
  const OdpMr m = RegOdp(B, kOdpIova, kLen);
  std::vector<uint64_t> all;
  for (uint64_t i = 0; i < kLen / kPage; i++) all.push_back((kBacking + i * kPage) | VSTELLAR_ODP_PAGE_WRITABLE);
  ASSERT_EQ(MapPages(B, m.mrn, kOdpIova, all), 0);
  std::memset(B.f.mem() + kBacking, 0, kLen);
  std::memset(B.f.mem() + kMoved, 0, kLen);
  FaultServer srv{B, m.mrn, kOdpIova, kMoved};
  auto [qa, qb] = ConnectedQps(A, B);
  for (uint32_t i = 0; i < 32; i++) Fill(A.Buf(i * kChunk), kChunk, uint8_t(i + 1));
  for (uint32_t i = 0; i < kWrites; i++) {
    auto w = Wqe(VSTELLAR_WR_RDMA_WRITE, i);
    w.u.rdma.remote_addr = kOdpIova + uint64_t(i) * kChunk;
    w.u.rdma.rkey = m.key;
    A.WriteSend(qa, w, {A.Sge((i % 32) * kChunk, kChunk)});
  }
  A.Ring(VSTELLAR_DB_SLOT_SIZE * qa.slot + offsetof(vstellar_db_qp, sq_pi), qa.sq_pi, true);
  auto first = A.Poll();
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 0);
  ASSERT_EQ(UnmapPages(B, m.mrn, kOdpIova, kLen), 0);
  const std::vector<uint8_t> old(B.f.mem() + kBacking, B.f.mem() + kBacking + kLen);

  for (uint32_t n = 1; n < kWrites; n++) {
    auto c = PollServing(A, {&srv});
    ASSERT_TRUE(c) << "completion " << n;
    EXPECT_EQ(c->wr_id, n);
    EXPECT_EQ(c->status, 0) << n;
  }
  EXPECT_EQ(std::memcmp(B.f.mem() + kBacking, old.data(), kLen), 0) << "the old pages changed after UNMAP_MR_PAGES";
  // Each packet's bytes are where the pages were when it landed.
  uint32_t moved = 0;
  for (uint32_t n = 0; n < kWrites; n++) {
    for (uint32_t k = 0; k < kChunk / kPkt; k++) {
      const uint64_t off = uint64_t(n) * kChunk + k * kPkt;
      const uint8_t* want = A.Buf((n % 32) * kChunk + k * kPkt);
      const bool in_old = std::memcmp(old.data() + off, want, kPkt) == 0;
      const bool in_new = std::memcmp(B.f.mem() + kMoved + off, want, kPkt) == 0;
      EXPECT_TRUE(in_old || in_new) << "WRITE " << n << " packet " << k << " landed nowhere";
      moved += in_new && !in_old;
    }
  }
  std::printf("%u of %u packets landed in the pages mapped after the UNMAP\n", moved, kWrites * kChunk / kPkt);
}

// Every value of the new commands is checked; a bad one fails alone.
TEST_F(DataPath, OdpCommandsRefuseBadInput) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  const OdpMr m = RegOdp(B, kOdpIova, kOdpLen);
  auto ok = [&](uint64_t i) { return (kBacking + i * kPage) | VSTELLAR_ODP_PAGE_WRITABLE; };
  // Outside the MR, before and after; past its last page.
  EXPECT_EQ(MapPages(B, m.mrn, kOdpIova - kPage, {ok(0)}), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(MapPages(B, m.mrn, kOdpIova + kOdpLen, {ok(0)}), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(MapPages(B, m.mrn, kOdpIova + kOdpLen - kPage, {ok(0), ok(1)}), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(MapPages(B, m.mrn, kOdpIova + 1, {ok(0)}), VSTELLAR_STATUS_BAD_FIELD);
  // Pages that are not aligned, not guest RAM, or the doorbell region.
  EXPECT_EQ(MapPages(B, m.mrn, kOdpIova, {kBacking + 8}), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(MapPages(B, m.mrn, kOdpIova, {ok(0), B.f.mem_size() + kPage}), VSTELLAR_STATUS_BAD_ADDRESS);
  EXPECT_EQ(MapPages(B, m.mrn, kOdpIova, {B.f.doorbell_gpa()}), VSTELLAR_STATUS_BAD_ADDRESS);
  // All or nothing: the good first page of a refused list is not mapped.
  std::vector<uint64_t> none;
  EXPECT_EQ(MapPages(B, m.mrn, kOdpIova, none), VSTELLAR_STATUS_BAD_FIELD);
  // Another context's MR, and an MR that is not on demand.
  EXPECT_EQ(MapPages(A, m.mrn, kOdpIova, {ok(0)}), VSTELLAR_STATUS_BAD_HANDLE);
  vstellar_cmd_handle h{0, 0};
  (void)h;
  uint16_t st = 0;
  RegOdp(B, kOdpIova, kOdpLen, VSTELLAR_ACCESS_VALID | VSTELLAR_ACCESS_MW_BIND, &st);
  EXPECT_EQ(st, VSTELLAR_STATUS_BAD_FIELD);
  RegOdp(B, kOdpIova, 0, VSTELLAR_ACCESS_VALID, &st);
  EXPECT_EQ(st, VSTELLAR_STATUS_BAD_FIELD);
  RegOdp(B, ~uint64_t(0) - kPage, 2 * kPage, VSTELLAR_ACCESS_VALID, &st);
  EXPECT_EQ(st, VSTELLAR_STATUS_BAD_FIELD);
  // With pages: not an on-demand registration.
  {
    vstellar_cmd_reg_mr c = OdpRegBody(B, kOdpIova, kPage, VSTELLAR_ACCESS_VALID);
    c.num_pages = 1;
    auto body = WithPages(&c, sizeof(c), {kBacking});
    EXPECT_EQ(B.Cmd(VSTELLAR_CMD_REG_MR, body.data(), body.size(), 16).status(), VSTELLAR_STATUS_BAD_FIELD);
  }
  // A plain MR takes no pages this way.
  {
    auto body = RegMrBody(B.pd, kMrGpa, kPage, VSTELLAR_ACCESS_VALID);
    CmdResult r = B.Cmd(VSTELLAR_CMD_REG_MR, body.data(), body.size(), 16);
    ASSERT_EQ(r.status(), 0);
    const uint32_t plain = As<vstellar_resp_reg_mr>(r).mrn;
    EXPECT_EQ(MapPages(B, plain, kMrGpa, {ok(0)}), VSTELLAR_STATUS_BAD_HANDLE);
    EXPECT_EQ(UnmapPages(B, plain, kMrGpa, kPage), VSTELLAR_STATUS_BAD_HANDLE);
  }
  // UNMAP: aligned, not empty, reserved zero.
  EXPECT_EQ(UnmapPages(B, m.mrn, kOdpIova + 1, kPage), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(UnmapPages(B, m.mrn, kOdpIova, 100), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(UnmapPages(B, m.mrn, kOdpIova, 0), VSTELLAR_STATUS_BAD_FIELD);
  vstellar_cmd_unmap_mr_pages u{m.mrn, 1, kOdpIova, kPage};
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_UNMAP_MR_PAGES, &u, sizeof(u), 0).status(), VSTELLAR_STATUS_BAD_FIELD);
  // Outside the MR: clipped, nothing to do.
  EXPECT_EQ(UnmapPages(B, m.mrn, 0, kPage), 0);
  // A good map still works after all that, and the MR deregisters.
  EXPECT_EQ(MapPages(B, m.mrn, kOdpIova, {ok(0), ok(1)}), 0);
  EXPECT_EQ(UnmapPages(B, m.mrn, kOdpIova, kOdpLen), 0);
  vstellar_cmd_handle d{m.mrn, 0};
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_DEREG_MR, &d, sizeof(d), 0).status(), 0);
  EXPECT_EQ(MapPages(B, m.mrn, kOdpIova, {ok(0)}), VSTELLAR_STATUS_BAD_HANDLE);
}

}  // namespace vstellard::datapath_test
