// Memory keys: fast registration by the kernel with bad page lists, and
// memory windows with foreign binds.
#include <gtest/gtest.h>

#include "vstellard/datapath_fixture.h"

namespace vstellard::datapath_test {
namespace {

// A fast-registration WQE of `n` pages listed at guest-physical `list`.
vstellar_send_wqe RegMrWqe(uint64_t wr_id, uint32_t key, uint64_t iova, uint64_t length, uint64_t list, uint32_t n,
                           uint8_t shift = 12, uint32_t access = VSTELLAR_ACCESS_VALID) {
  vstellar_send_wqe w = Wqe(VSTELLAR_WR_REG_MR, wr_id);
  w.u.reg_mr.iova = iova;
  w.u.reg_mr.length = length;
  w.u.reg_mr.page_list = list;
  w.u.reg_mr.npages = n;
  w.u.reg_mr.key = key;
  w.u.reg_mr.access = access;
  w.u.reg_mr.page_shift = shift;
  return w;
}

uint32_t NextKey(uint32_t k) { return (k & ~0xffu) | ((k + 1) & 0xff); }

}  // namespace

// The kernel (device A) registers pages of its memory under a
// fast-registration key, a user QP of device B writes through it, the
// kernel invalidates it and B's next write gets a remote access error.
// Then every kind of bad REG_MR fails alone, on its own QP, with a status
// that says why, and the daemon keeps serving both devices. One piece: the
// bad requests run against the registration the good path left behind.
TEST_F(DataPath, KernelFastRegistrationAndBadPageLists) {
  StartDaemon();
  TwoDevices();
  Guest& A = *a_;
  Guest& B = *b_;
  A.SetupKernel(1);
  B.Setup();

  vstellar_cmd_alloc_mr am{};
  am.pdn = A.pd;
  am.max_num_pages = 4;
  CmdResult r = A.Cmd(VSTELLAR_CMD_ALLOC_MR, &am, sizeof(am), 16);
  ASSERT_EQ(r.status(), 0);
  const uint32_t key0 = As<vstellar_resp_reg_mr>(r).lkey;
  EXPECT_EQ(As<vstellar_resp_reg_mr>(r).rkey, key0);
  EXPECT_NE(key0, uint32_t(VSTELLAR_LOCAL_DMA_LKEY));
  // Fast-registration MRs are the kernel's.
  am.pdn = B.pd;
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_ALLOC_MR, &am, sizeof(am), 16).status(), VSTELLAR_STATUS_ACCESS);
  am.pdn = A.pd;
  am.max_num_pages = 0;
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_ALLOC_MR, &am, sizeof(am), 16).status(), VSTELLAR_STATUS_BAD_FIELD);
  am.max_num_pages = 513;
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_ALLOC_MR, &am, sizeof(am), 16).status(), VSTELLAR_STATUS_LIMIT);

  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);

  // Two non-contiguous pages of A's memory, listed at kList.
  constexpr uint64_t kList = kMrGpa + 0x1f000, kP0 = kMrGpa + 0x6000, kP1 = kMrGpa + 0x3000;
  const uint64_t pages[2] = {htole64(kP0), htole64(kP1)};
  std::memcpy(A.f.mem() + kList, pages, sizeof(pages));
  std::memset(A.f.mem() + kP0, 0, 4096);
  std::memset(A.f.mem() + kP1, 0, 4096);
  const uint32_t k1 = NextKey(key0);
  constexpr uint64_t kIova = 0x7f0000000800;  // offset 0x800 in the first page
  A.PostSend(qa, RegMrWqe(0x71, k1, kIova, 6000, kList, 2), {});
  auto c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(c->opcode, VSTELLAR_WC_REG_MR);
  EXPECT_EQ(le64toh(c->wr_id), 0x71u);

  // B writes 3000 bytes across the page boundary of A's registration.
  Fill(B.Buf(0), 3000, 9);
  auto wr = Wqe(VSTELLAR_WR_RDMA_WRITE, 0x81);
  wr.u.rdma.remote_addr = kIova + 1000;
  wr.u.rdma.rkey = k1;
  B.PostSend(qb, wr, {B.Sge(0, 3000)});
  c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(std::memcmp(A.f.mem() + kP0 + 0x800 + 1000, B.Buf(0), 4096 - 0x800 - 1000), 0);
  EXPECT_EQ(std::memcmp(A.f.mem() + kP1, B.Buf(4096 - 0x800 - 1000), 3000 - (4096 - 0x800 - 1000)), 0);

  // A user QP may not invalidate the kernel's key.
  {
    GQp qx = B.CreateQp();
    B.Connect(qx, qa.qpn);
    auto inv = Wqe(VSTELLAR_WR_LOCAL_INV, 0x91);
    inv.invalidate_rkey = k1;
    B.PostSend(qx, inv, {});
    c = B.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->status, uint8_t(vstellar::WcStatus::LOC_PROT_ERR));
    EXPECT_EQ(c->opcode, VSTELLAR_WC_LOCAL_INV);
    EXPECT_EQ(c->vendor_err, VSTELLAR_STATUS_BAD_HANDLE);
    // ... nor post a REG_MR at all (its page list is guest-physical).
    GQp qy = B.CreateQp();
    B.Connect(qy, qa.qpn);
    B.PostSend(qy, RegMrWqe(0x92, k1, kIova, 4096, kList, 1), {});
    c = B.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->status, uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR));
    EXPECT_EQ(c->vendor_err, VSTELLAR_STATUS_ACCESS);
  }

  // The kernel invalidates; B's write with the old key is refused and
  // touches nothing.
  auto inv = Wqe(VSTELLAR_WR_LOCAL_INV, 0x72);
  inv.invalidate_rkey = k1;
  A.PostSend(qa, inv, {});
  c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(c->opcode, VSTELLAR_WC_LOCAL_INV);
  std::vector<uint8_t> before(A.f.mem() + kP0, A.f.mem() + kP0 + 4096);
  Fill(B.Buf(0), 64, 1);
  wr.u.rdma.remote_addr = kIova;
  B.PostSend(qb, wr, {B.Sge(0, 64)});
  c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, uint8_t(vstellar::WcStatus::REM_ACCESS_ERR));
  EXPECT_EQ(std::memcmp(before.data(), A.f.mem() + kP0, 4096), 0);

  // Bad REG_MRs, each on a fresh kernel QP.
  vstellar_cmd_handle other_mr{};
  {
    // An MR of user context B (same engine, another PD).
    vstellar_cmd_reg_mr m{};
    m.pdn = B.pd;
    m.access_flags = VSTELLAR_ACCESS_LOCAL_WRITE;
    m.iova = kMrGpa;
    m.length = 4096;
    m.page_shift = 12;
    m.num_pages = 1;
    auto body = WithPages(&m, sizeof(m), {kMrGpa});
    r = B.Cmd(VSTELLAR_CMD_REG_MR, body.data(), body.size(), 16);
    ASSERT_EQ(r.status(), 0);
    other_mr.handle = As<vstellar_resp_reg_mr>(r).mrn;
    other_mr.reserved = As<vstellar_resp_reg_mr>(r).lkey;
  }
  const uint64_t page_outside = uint64_t{1} << 40;
  std::memcpy(A.f.mem() + kList + 64, &page_outside, 8);
  const uint64_t unaligned = kP0 + 8;
  std::memcpy(A.f.mem() + kList + 128, &unaligned, 8);
  const uint32_t k = NextKey(k1);
  struct Case {
    const char* what;
    vstellar_send_wqe w;
    vstellar::WcStatus status;
    uint8_t vendor;
  };
  const Case cases[] = {
      {"no pages", RegMrWqe(1, k, kIova, 2048, kList, 0), vstellar::WcStatus::LOC_QP_OP_ERR, VSTELLAR_STATUS_BAD_FIELD},
      {"more pages than allocated", RegMrWqe(1, k, kIova, 2048, kList, 5), vstellar::WcStatus::LOC_QP_OP_ERR,
       VSTELLAR_STATUS_BAD_FIELD},
      {"page size not offered", RegMrWqe(1, k, kIova, 2048, kList, 1, 13), vstellar::WcStatus::LOC_QP_OP_ERR,
       VSTELLAR_STATUS_BAD_FIELD},
      {"page shift 64", RegMrWqe(1, k, kIova, 2048, kList, 1, 64), vstellar::WcStatus::LOC_QP_OP_ERR,
       VSTELLAR_STATUS_BAD_FIELD},
      {"length beyond the pages", RegMrWqe(1, k, kIova, 2 * 4096, kList, 2), vstellar::WcStatus::LOC_QP_OP_ERR,
       VSTELLAR_STATUS_BAD_FIELD},
      {"zero length", RegMrWqe(1, k, kIova, 0, kList, 1), vstellar::WcStatus::LOC_QP_OP_ERR, VSTELLAR_STATUS_BAD_FIELD},
      {"unknown access bit", RegMrWqe(1, k, kIova, 2048, kList, 1, 12, 0x100), vstellar::WcStatus::LOC_QP_OP_ERR,
       VSTELLAR_STATUS_BAD_FIELD},
      {"page list outside guest RAM", RegMrWqe(1, k, kIova, 2048, page_outside, 1), vstellar::WcStatus::LOC_PROT_ERR,
       VSTELLAR_STATUS_BAD_ADDRESS},
      {"page list unaligned", RegMrWqe(1, k, kIova, 2048, kList + 4, 1), vstellar::WcStatus::LOC_PROT_ERR,
       VSTELLAR_STATUS_BAD_ADDRESS},
      {"a page outside guest RAM", RegMrWqe(1, k, kIova, 2048, kList + 64, 1), vstellar::WcStatus::LOC_PROT_ERR,
       VSTELLAR_STATUS_BAD_ADDRESS},
      {"a page not aligned", RegMrWqe(1, k, kIova, 2048, kList + 128, 1), vstellar::WcStatus::LOC_QP_OP_ERR,
       VSTELLAR_STATUS_BAD_FIELD},
      {"another context's MR", RegMrWqe(1, other_mr.reserved, kIova, 2048, kList, 1), vstellar::WcStatus::LOC_PROT_ERR,
       VSTELLAR_STATUS_BAD_HANDLE},
      {"a key naming nothing", RegMrWqe(1, k ^ 0x5a5a00, kIova, 2048, kList, 1), vstellar::WcStatus::LOC_PROT_ERR,
       VSTELLAR_STATUS_BAD_HANDLE},
  };
  for (const Case& cs : cases) {
    GQp q = A.CreateQp();
    A.Connect(q, qb.qpn);
    A.PostSend(q, cs.w, {});
    c = A.Poll();
    ASSERT_TRUE(c) << cs.what;
    EXPECT_EQ(c->status, uint8_t(cs.status)) << cs.what;
    EXPECT_EQ(c->vendor_err, cs.vendor) << cs.what;
    EXPECT_EQ(c->opcode, VSTELLAR_WC_REG_MR) << cs.what;
    EXPECT_EQ(A.QpState(q.qpn), VSTELLAR_QPS_ERR) << cs.what;
  }
  // None of them registered anything; a good one still does.
  GQp qg = A.CreateQp();
  A.Connect(qg, qb.qpn);
  A.PostSend(qg, RegMrWqe(0x73, k, kIova, 2048, kList, 1), {});
  c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  // And both devices still answer commands.
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_ALLOC_PD, nullptr, 0, 8).status(), 0);
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_ALLOC_PD, nullptr, 0, 8).status(), 0);
}

// Memory windows between two user contexts: a type 2 window bound through
// B's QP serves A's READ; binds to another context's MR, to an MR without
// MW_BIND, and deallocating someone else's window fail alone; an MR with a
// bound window cannot be deregistered. One piece: the foreign binds are
// tried against the window and MRs the first part set up.
TEST_F(DataPath, MemoryWindowsAndForeignBinds) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  vstellar_cmd_reg_mr m{};
  m.pdn = B.pd;
  m.access_flags = VSTELLAR_ACCESS_VALID | VSTELLAR_ACCESS_MW_BIND;
  m.iova = kMrGpa;
  m.length = 0x10000;
  m.page_shift = 12;
  std::vector<uint64_t> pages;
  for (uint64_t a = kMrGpa; a < kMrGpa + 0x10000; a += 4096) pages.push_back(a);
  m.num_pages = uint32_t(pages.size());
  auto body = WithPages(&m, sizeof(m), pages);
  CmdResult r = B.Cmd(VSTELLAR_CMD_REG_MR, body.data(), body.size(), 16);
  ASSERT_EQ(r.status(), 0);
  const uint32_t mrh = As<vstellar_resp_reg_mr>(r).mrn, bind_lkey = As<vstellar_resp_reg_mr>(r).lkey;

  vstellar_cmd_alloc_mw amw{};
  amw.pdn = B.pd;
  amw.type = 3;
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_ALLOC_MW, &amw, sizeof(amw), 8).status(), VSTELLAR_STATUS_BAD_FIELD);
  amw.type = VSTELLAR_MW_TYPE_2;
  amw.pdn = B.pd + 1000;  // no PD of B's
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_ALLOC_MW, &amw, sizeof(amw), 8).status(), VSTELLAR_STATUS_BAD_HANDLE);
  amw.pdn = B.pd;
  r = B.Cmd(VSTELLAR_CMD_ALLOC_MW, &amw, sizeof(amw), 8);
  ASSERT_EQ(r.status(), 0);
  const uint32_t mwh = As<vstellar_resp_alloc_mw>(r).mwn, rkey0 = As<vstellar_resp_alloc_mw>(r).rkey;

  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  auto bind = Wqe(VSTELLAR_WR_BIND_MW, 0x41);
  bind.u.bind_mw.mw_rkey = rkey0;
  bind.u.bind_mw.new_rkey = NextKey(rkey0);
  bind.u.bind_mw.mr_lkey = bind_lkey;
  bind.u.bind_mw.addr = kMrGpa + 0x1000;
  bind.u.bind_mw.length = 0x2000;
  bind.u.bind_mw.access = VSTELLAR_ACCESS_REMOTE_READ;
  bind.u.bind_mw.mw_type = VSTELLAR_MW_TYPE_2;
  B.PostSend(qb, bind, {});
  auto c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(c->opcode, VSTELLAR_WC_BIND_MW);

  Fill(B.Buf(0x1800), 512, 4);
  auto rd = Wqe(VSTELLAR_WR_RDMA_READ, 0x42);
  rd.u.rdma.remote_addr = kMrGpa + 0x1800;
  rd.u.rdma.rkey = NextKey(rkey0);
  A.PostSend(qa, rd, {A.Sge(0x100, 512)});
  c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(std::memcmp(A.Buf(0x100), B.Buf(0x1800), 512), 0);

  vstellar_cmd_handle h{mrh, 0};
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_DEREG_MR, &h, sizeof(h), 0).status(), VSTELLAR_STATUS_BUSY);
  vstellar_cmd_handle hw{mwh, 0};
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_DEALLOC_MW, &hw, sizeof(hw), 0).status(), VSTELLAR_STATUS_BAD_HANDLE);

  // Binds that must fail, each on its own QP: another context's MR (A's),
  // an MR without MW_BIND (B's first one), a type mismatch.
  r = B.Cmd(VSTELLAR_CMD_ALLOC_MW, &amw, sizeof(amw), 8);
  ASSERT_EQ(r.status(), 0);
  const uint32_t rkey1 = As<vstellar_resp_alloc_mw>(r).rkey;
  struct Case {
    const char* what;
    uint32_t mr_lkey;
    uint8_t type;
    uint8_t vendor;
  };
  const Case cases[] = {{"another context's MR", A.lkey, VSTELLAR_MW_TYPE_2, VSTELLAR_STATUS_BAD_HANDLE},
                        {"MR without MW_BIND", B.lkey, VSTELLAR_MW_TYPE_2, VSTELLAR_STATUS_ACCESS},
                        {"type 1 bind of a type 2 window", bind_lkey, VSTELLAR_MW_TYPE_1, VSTELLAR_STATUS_BAD_FIELD}};
  for (const Case& cs : cases) {
    GQp q = B.CreateQp();
    B.Connect(q, qa.qpn);
    auto w = bind;
    w.u.bind_mw.mw_rkey = rkey1;
    w.u.bind_mw.new_rkey = NextKey(rkey1);
    w.u.bind_mw.mr_lkey = cs.mr_lkey;
    w.u.bind_mw.addr = kMrGpa;
    w.u.bind_mw.mw_type = cs.type;
    B.PostSend(q, w, {});
    c = B.Poll();
    ASSERT_TRUE(c) << cs.what;
    EXPECT_EQ(c->status, uint8_t(vstellar::WcStatus::MW_BIND_ERR)) << cs.what;
    EXPECT_EQ(c->vendor_err, cs.vendor) << cs.what;
  }
  // A's QP still reads through the window bound on B's first QP.
  A.PostSend(qa, rd, {A.Sge(0x400, 512)});
  c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  // Deallocating the bound window unbinds it: the MR can go, the rkey is dead.
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_DEALLOC_MW, &hw, sizeof(hw), 0).status(), 0);
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_DEREG_MR, &h, sizeof(h), 0).status(), 0);
  A.PostSend(qa, rd, {A.Sge(0x400, 512)});
  c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, uint8_t(vstellar::WcStatus::REM_ACCESS_ERR));
}

}  // namespace vstellard::datapath_test

namespace vstellard::datapath_test {

namespace {

constexpr uint64_t kAccelGpa = 0x100000000ull;  // above RAM, as a 64-bit BAR may be

// An MR over device memory (F_DMABUF): `mem_len` bytes of an accelerator's
// memory, its own sealable memfd in guest g's memory table at kAccelGpa as
// QEMU hands vstellard a vstellar-accel BAR, and a REG_MR of [off, off +
// len) of it at `iova`, as vstellar.ko registers a dmabuf.
struct DeviceMemoryMr {
  uint8_t* mem = nullptr;  // the memory, as the accelerator (and the test) sees it
  uint32_t mrn = 0, key = 0;
};
DeviceMemoryMr RegDeviceMemoryMr(Frontend& f, Guest& g, uint64_t mem_len, uint64_t off, uint64_t len,
                                 uint64_t iova) {
  DeviceMemoryMr d;
  std::string err;
  uint8_t* mem = f.AddDeviceMemory(kAccelGpa, mem_len, &err);
  if (!mem || !f.SendMemTable(&err)) {
    ADD_FAILURE() << err;
    return d;
  }
  auto body = RegMrBody(g.pd, kAccelGpa + off, len, VSTELLAR_ACCESS_VALID);
  vstellar_cmd_reg_mr m;
  std::memcpy(&m, body.data(), sizeof(m));
  m.iova = iova;
  std::memcpy(body.data(), &m, sizeof(m));
  CmdResult r = g.Cmd(VSTELLAR_CMD_REG_MR, body.data(), body.size(), 16);
  if (r.status() != 0) {
    ADD_FAILURE() << "REG_MR of device memory: status " << r.status();
    return d;
  }
  d.mem = mem;
  d.mrn = As<vstellar_resp_reg_mr>(r).mrn;
  d.key = As<vstellar_resp_reg_mr>(r).rkey;
  return d;
}

}  // namespace

// A dmabuf MR (F_DMABUF): device B registers pages of an accelerator's
// memory (its own memfd in the memory table, above RAM, as QEMU hands
// vstellard a vstellar-accel BAR) at iova 0; A writes into it and reads it
// back by RDMA. Then the exporter moves the buffer: INVALIDATE_MR, after
// which a WRITE or READ through the rkey gets a remote access error and
// leaves the memory alone, and B's own use of the lkey a local protection
// error. Invalidation is B's alone to ask for, only of MRs from REG_MR.
TEST_F(DataPath, DmabufMrOverDeviceMemoryIsInvalidatedWhenItsExporterMovesIt) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  constexpr uint64_t kBufOff = 0x40000, kBufLen = 0x10000;
  // iova 0: ibv_reg_dmabuf_mr's iova is the offset in the dmabuf, say.
  const DeviceMemoryMr d = RegDeviceMemoryMr(*fb_, B, 1 << 20, kBufOff, kBufLen, 0);
  ASSERT_NE(d.mem, nullptr);
  uint8_t* accel = d.mem;
  const uint32_t mrn = d.mrn, key = d.key;

  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  Fill(A.Buf(0), 8192, 7);
  auto wr = Wqe(VSTELLAR_WR_RDMA_WRITE, 1);
  wr.u.rdma.remote_addr = 0x1000;
  wr.u.rdma.rkey = key;
  A.PostSend(qa, wr, {A.Sge(0, 8192)});
  auto c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(std::memcmp(accel + kBufOff + 0x1000, A.Buf(0), 8192), 0);
  auto rd = Wqe(VSTELLAR_WR_RDMA_READ, 2);
  rd.u.rdma.remote_addr = 0x1000;
  rd.u.rdma.rkey = key;
  A.PostSend(qa, rd, {A.Sge(0x4000, 8192)});
  c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(std::memcmp(A.Buf(0x4000), A.Buf(0), 8192), 0);

  // Only B's context names the MR; a fast-registration MR is LOCAL_INV's.
  vstellar_cmd_handle h{mrn, 0};
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_INVALIDATE_MR, &h, sizeof(h), 0).status(), VSTELLAR_STATUS_BAD_HANDLE);
  vstellar_cmd_handle bad{mrn, 1};
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_INVALIDATE_MR, &bad, sizeof(bad), 0).status(), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_INVALIDATE_MR, &h, sizeof(h), 0).status(), 0);
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_INVALIDATE_MR, &h, sizeof(h), 0).status(), 0);  // twice: still invalid

  // The exporter may hand the old range to someone else now: nothing
  // reaches it through the MR.
  std::memset(accel + kBufOff, 0x5a, kBufLen);
  for (uint8_t op : {uint8_t(VSTELLAR_WR_RDMA_WRITE), uint8_t(VSTELLAR_WR_RDMA_READ)}) {
    GQp a2 = A.CreateQp(), b2 = B.CreateQp();
    A.Connect(a2, b2.qpn);
    B.Connect(b2, a2.qpn);
    auto w = op == VSTELLAR_WR_RDMA_WRITE ? wr : rd;
    A.PostSend(a2, w, {A.Sge(0x8000, 4096)});
    c = A.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->status, uint8_t(vstellar::WcStatus::REM_ACCESS_ERR)) << int(op);
  }
  EXPECT_TRUE(std::all_of(accel + kBufOff, accel + kBufOff + kBufLen, [](uint8_t x) { return x == 0x5a; }));
  GQp b3 = B.CreateQp(), a3 = A.CreateQp();
  B.Connect(b3, a3.qpn);
  A.Connect(a3, b3.qpn);
  auto local = Wqe(VSTELLAR_WR_RDMA_WRITE, 3);
  local.u.rdma.remote_addr = kMrGpa;
  local.u.rdma.rkey = A.rkey;
  B.PostSend(b3, local, {vstellar_sge{0, 4096, key}});
  c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, uint8_t(vstellar::WcStatus::LOC_PROT_ERR));

  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_DEREG_MR, &h, sizeof(h), 0).status(), 0);
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_INVALIDATE_MR, &h, sizeof(h), 0).status(), VSTELLAR_STATUS_BAD_HANDLE);
}

// INVALIDATE_MR names MRs from REG_MR only: a kernel fast-registration
// MR is invalidated by its LOCAL_INV WQE.
TEST_F(DataPath, InvalidateMrRefusesFastRegistrationMrs) {
  StartDaemon();
  TwoDevices();
  Guest& A = *a_;
  A.SetupKernel(1);
  vstellar_cmd_alloc_mr am{};
  am.pdn = A.pd;
  am.max_num_pages = 4;
  CmdResult r = A.Cmd(VSTELLAR_CMD_ALLOC_MR, &am, sizeof(am), 16);
  ASSERT_EQ(r.status(), 0);
  vstellar_cmd_handle h{As<vstellar_resp_reg_mr>(r).mrn, 0};
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_INVALIDATE_MR, &h, sizeof(h), 0).status(), VSTELLAR_STATUS_BAD_HANDLE);
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_DEREG_MR, &h, sizeof(h), 0).status(), 0);
}

// INVALIDATE_MR racing incoming WRITEs: A posts 48 WRITEs of 4 KiB into
// B's dmabuf MR at once, and B invalidates the MR once the first has
// completed, while the others arrive. Once the command has answered,
// nothing may change the old pages; every WRITE
// that completed successfully left its bytes there; the first that did not
// failed with a remote access error and the rest were flushed. Where the
// invalidation falls is up to the scheduler; the invariants hold wherever.
TEST_F(DataPath, DmabufInvalidationRacingIncomingWritesLeavesNoStaleWrite) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  constexpr uint64_t kLen = 1 << 20;
  constexpr uint32_t kWrites = 48, kChunk = 4096;
  const DeviceMemoryMr d = RegDeviceMemoryMr(*fb_, B, kLen, 0, kLen, kAccelGpa);
  ASSERT_NE(d.mem, nullptr);
  uint8_t* accel = d.mem;
  const uint32_t mrn = d.mrn, key = d.key;

  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  for (uint32_t i = 0; i < 32; i++) Fill(A.Buf(i * kChunk), kChunk, uint8_t(i + 1));
  for (uint32_t i = 0; i < kWrites; i++) {
    auto w = Wqe(VSTELLAR_WR_RDMA_WRITE, i);
    w.u.rdma.remote_addr = kAccelGpa + uint64_t(i) * kChunk;
    w.u.rdma.rkey = key;
    A.WriteSend(qa, w, {A.Sge((i % 32) * kChunk, kChunk)});
  }
  A.Ring(VSTELLAR_DB_SLOT_SIZE * qa.slot + offsetof(vstellar_db_qp, sq_pi), qa.sq_pi, true);
  // The first WRITE's completion says the stream is flowing; the rest are
  // posted, on the wire or arriving when B invalidates.
  auto first = A.Poll();
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 0);
  EXPECT_EQ(std::memcmp(accel, A.Buf(0), kChunk), 0);
  vstellar_cmd_handle h{mrn, 0};
  ASSERT_EQ(B.Cmd(VSTELLAR_CMD_INVALIDATE_MR, &h, sizeof(h), 0).status(), 0);
  const std::vector<uint8_t> at_invalidation(accel, accel + kLen);

  uint32_t ok = 1, rem_access = 0, flushed = 0;
  for (uint32_t n = 1; n < kWrites; n++) {
    auto c = A.Poll();
    ASSERT_TRUE(c) << "completion " << n;
    EXPECT_EQ(c->wr_id, n);
    if (c->status == 0) {
      EXPECT_EQ(rem_access + flushed, 0u) << "a WRITE succeeded after one failed";
      EXPECT_EQ(std::memcmp(accel + uint64_t(n) * kChunk, A.Buf((n % 32) * kChunk), kChunk), 0) << n;
      ok++;
    } else if (c->status == uint8_t(vstellar::WcStatus::REM_ACCESS_ERR)) {
      EXPECT_EQ(rem_access + flushed, 0u);
      rem_access++;
    } else {
      EXPECT_EQ(c->status, uint8_t(vstellar::WcStatus::WR_FLUSH_ERR));
      flushed++;
    }
  }
  EXPECT_EQ(ok + rem_access + flushed, kWrites);
  EXPECT_EQ(rem_access, ok < kWrites ? 1u : 0u);
  EXPECT_EQ(std::memcmp(accel, at_invalidation.data(), kLen), 0) << "the old pages changed after INVALIDATE_MR";
  std::printf("%u WRITEs completed before the invalidation, %u failed, %u flushed\n", ok, rem_access, flushed);
}

}  // namespace vstellard::datapath_test
