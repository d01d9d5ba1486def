// vstellard's device core end to end, without QEMU: an in-process daemon on
// a unix socket and test frontends that play QEMU and the guest driver.
// Hostile-guest tests check that every bad request fails alone with a
// clear status, and that the daemon keeps serving its other devices.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <chrono>
#include <thread>

#include "vstellard/daemon_test.h"

using namespace vstellard;

namespace {

constexpr uint64_t MiB = 1ull << 20;

class Device : public DaemonTest {
 protected:
  DeviceStats StatsOf(size_t i) {
    auto v = d_->Stats();
    EXPECT_GT(v.size(), i);
    return v.size() > i ? v[i] : DeviceStats{};
  }
};

template <typename T>
T As(const CmdResult& r) {
  T v{};
  EXPECT_EQ(r.body.size(), sizeof(T));
  std::memcpy(&v, r.body.data(), std::min(sizeof(T), r.body.size()));
  return v;
}

// Little helpers acting like the guest driver.
struct Driver {
  Frontend& f;
  uint32_t uctx = 0;
  uint16_t last = 0;
  CmdResult Cmd(uint16_t op, const void* b, size_t n, uint32_t resp) {
    CmdResult r = f.Command(op, uctx, b, n, resp);
    EXPECT_TRUE(r.done);
    last = r.status();
    return r;
  }
  template <typename T>
  CmdResult Cmd(uint16_t op, const T& b, uint32_t resp = 0) { return Cmd(op, &b, sizeof(b), resp); }
  CmdResult Handle(uint16_t op, uint32_t h, uint32_t resp = 0) {
    vstellar_cmd_handle c{h, 0};
    return Cmd(op, c, resp);
  }
  uint32_t AllocUctx() {
    const uint32_t keep = uctx;
    uctx = 0;
    CmdResult r = Cmd(VSTELLAR_CMD_ALLOC_UCONTEXT, nullptr, 0, 8);
    uctx = keep;
    return r.status() ? 0 : As<vstellar_resp_alloc_ucontext>(r).ucontext;
  }
  uint32_t AllocPd() {
    CmdResult r = Cmd(VSTELLAR_CMD_ALLOC_PD, nullptr, 0, 8);
    return r.status() ? 0 : As<vstellar_resp_alloc_pd>(r).pdn;
  }
  uint32_t CreateCq(uint64_t gpa, uint32_t log_cqe = 6) {
    vstellar_cmd_create_cq c{};
    c.log_cqe = log_cqe;
    c.page_shift = 12;
    c.num_pages = 1;
    auto body = WithPages(&c, sizeof(c), {gpa});
    CmdResult r = Cmd(VSTELLAR_CMD_CREATE_CQ, body.data(), body.size(), 8);
    return r.status() ? 0 : As<vstellar_resp_create_cq>(r).cqn;
  }
  uint32_t CreateQp(uint32_t pd, uint32_t cq, uint64_t gpa) {
    auto body = CreateQpBody(RcQpBody(pd, cq), gpa);
    CmdResult r = Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24);
    return r.status() ? 0 : As<vstellar_resp_create_qp>(r).qpn;
  }
  CmdResult RegMr(uint32_t pd, uint64_t iova, uint64_t len, const std::vector<uint64_t>& pages,
                  uint32_t access = VSTELLAR_ACCESS_LOCAL_WRITE | VSTELLAR_ACCESS_REMOTE_WRITE, uint32_t shift = 12) {
    vstellar_cmd_reg_mr c{};
    c.pdn = pd;
    c.access_flags = access;
    c.iova = iova;
    c.length = len;
    c.page_shift = shift;
    c.num_pages = uint32_t(pages.size());
    auto body = WithPages(&c, sizeof(c), pages);
    return Cmd(VSTELLAR_CMD_REG_MR, body.data(), body.size(), 16);
  }
  uint16_t Modify(uint32_t qpn, uint32_t mask, uint8_t state, std::function<void(vstellar_qp_attr&)> fill = {}) {
    vstellar_cmd_modify_qp m{};
    m.qpn = qpn;
    m.attr.attr_mask = mask;
    m.attr.qp_state = state;
    m.attr.port = 1;
    m.attr.path_mtu = 5;
    m.attr.timeout = 14;
    m.attr.retry_cnt = 7;
    m.attr.rnr_retry = 7;
    m.attr.max_rd_atomic = 1;
    m.attr.max_dest_rd_atomic = 1;
    m.attr.av.dgid[10] = m.attr.av.dgid[11] = 0xff;
    m.attr.av.dgid[12] = 127;
    m.attr.av.dgid[15] = 1;
    if (fill) fill(m.attr);
    return Cmd(VSTELLAR_CMD_MODIFY_QP, m).status();
  }
};

constexpr uint32_t kInitMask = VSTELLAR_QP_STATE | VSTELLAR_QP_PKEY_INDEX | VSTELLAR_QP_PORT | VSTELLAR_QP_ACCESS_FLAGS;
constexpr uint32_t kRtrMask = VSTELLAR_QP_STATE | VSTELLAR_QP_AV | VSTELLAR_QP_PATH_MTU | VSTELLAR_QP_DEST_QPN |
                              VSTELLAR_QP_RQ_PSN | VSTELLAR_QP_MAX_DEST_RD_ATOMIC | VSTELLAR_QP_MIN_RNR_TIMER;
constexpr uint32_t kRtsMask = VSTELLAR_QP_STATE | VSTELLAR_QP_TIMEOUT | VSTELLAR_QP_RETRY_CNT |
                              VSTELLAR_QP_RNR_RETRY | VSTELLAR_QP_SQ_PSN | VSTELLAR_QP_MAX_QP_RD_ATOMIC;

TEST_F(Device, AttachPinsNothingAndTheFirstCommandPinsOneBlock) {
  StartDaemon();
  FrontendOptions fo;
  fo.mem_size = 256 * MiB;
  Frontend f(fo);
  std::string err;
  ASSERT_TRUE(f.Connect(sock_, &err)) << err;  // SET_MEM_TABLE acked
  DeviceStats s = StatsOf(0);
  EXPECT_EQ(s.pvdma.guest_bytes, 256 * MiB + 65536);
  EXPECT_EQ(s.pvdma.blocks_pinned, 0u);
  EXPECT_EQ(s.pvdma.bytes_pinned, 0u);
  ASSERT_TRUE(f.StartQueues(&err)) << err;
  CmdResult r = f.Command(VSTELLAR_CMD_QUERY_DEVICE, 0, nullptr, 0, sizeof(vstellar_resp_query_device));
  ASSERT_TRUE(r.done);
  EXPECT_EQ(r.status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(r.hdr.opcode, VSTELLAR_CMD_QUERY_DEVICE);
  EXPECT_EQ(r.used_len, 16 + sizeof(vstellar_resp_query_device));
  EXPECT_EQ(As<vstellar_resp_query_device>(r).vendor_part_id, VSTELLAR_PCI_DEVICE_ID);
  s = StatsOf(0);
  // Rings and command buffers all sit in guest block 0.
  EXPECT_EQ(s.pvdma.blocks_pinned, 1u);
  EXPECT_EQ(s.pvdma.bytes_pinned, 2 * MiB);
  EXPECT_EQ(s.pvdma.misses, 1u);
  EXPECT_GT(s.pvdma.hits, 0u);
}

TEST_F(Device, EagerPinsAllGuestMemoryAtAttach) {
  DaemonOptions o;
  o.pin = PinMode::kEager;
  StartDaemon(o);
  FrontendOptions fo;
  fo.mem_size = 32 * MiB;
  fo.doorbell = false;
  auto f = Connect(fo);
  EXPECT_EQ(f->Command(VSTELLAR_CMD_QUERY_DEVICE, 0, nullptr, 0, 112).status(), VSTELLAR_STATUS_OK);
  DeviceStats s = StatsOf(0);
  EXPECT_EQ(s.pvdma.bytes_pinned, 32 * MiB);
  EXPECT_EQ(s.pvdma.blocks_pinned, 16u);
  EXPECT_EQ(s.pvdma.misses, 0u);
}

TEST_F(Device, VerbsObjectLifecycle) {
  StartDaemon();
  auto f = Connect();
  Driver d{*f};
  d.uctx = d.AllocUctx();
  ASSERT_NE(d.uctx, 0u);
  const uint32_t pd = d.AllocPd();
  ASSERT_NE(pd, 0u);
  const uint32_t cq = d.CreateCq(4 * MiB);
  ASSERT_NE(cq, 0u) << d.last;
  const uint32_t qpn = d.CreateQp(pd, cq, 5 * MiB);
  ASSERT_NE(qpn, 0u) << d.last;
  EXPECT_EQ(d.Modify(qpn, kInitMask, VSTELLAR_QPS_INIT), VSTELLAR_STATUS_OK);
  EXPECT_EQ(d.Modify(qpn, kRtrMask, VSTELLAR_QPS_RTR, [&](auto& a) { a.dest_qpn = qpn; }), VSTELLAR_STATUS_OK);
  EXPECT_EQ(d.Modify(qpn, kRtsMask, VSTELLAR_QPS_RTS), VSTELLAR_STATUS_OK);
  CmdResult q = d.Handle(VSTELLAR_CMD_QUERY_QP, qpn, 80);
  ASSERT_EQ(q.status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(As<vstellar_resp_query_qp>(q).attr.qp_state, VSTELLAR_QPS_RTS);
  EXPECT_EQ(As<vstellar_resp_query_qp>(q).attr.dest_qpn, qpn);
  // eMTT: registration resolves (and pins) the MR's pages.
  const uint64_t before = StatsOf(0).pvdma.blocks_pinned;
  CmdResult mr = d.RegMr(pd, 0x10000, 3 * 4096, {8 * MiB, 12 * MiB, 16 * MiB});
  ASSERT_EQ(mr.status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(StatsOf(0).pvdma.blocks_pinned, before + 3);
  const auto m = As<vstellar_resp_reg_mr>(mr);
  EXPECT_EQ(m.lkey, m.rkey);
  EXPECT_EQ(d.Handle(VSTELLAR_CMD_DEALLOC_PD, pd).status(), VSTELLAR_STATUS_BUSY);
  EXPECT_EQ(d.Handle(VSTELLAR_CMD_DESTROY_CQ, cq).status(), VSTELLAR_STATUS_BUSY);
  EXPECT_EQ(d.Handle(VSTELLAR_CMD_DEREG_MR, m.mrn).status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(d.Handle(VSTELLAR_CMD_DESTROY_QP, qpn).status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(d.Handle(VSTELLAR_CMD_DESTROY_CQ, cq).status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(d.Handle(VSTELLAR_CMD_DEALLOC_PD, pd).status(), VSTELLAR_STATUS_OK);
  // A context's leftovers go with it.
  const uint32_t pd2 = d.AllocPd();
  ASSERT_NE(d.CreateCq(4 * MiB), 0u);
  ASSERT_NE(pd2, 0u);
  const uint32_t u = d.uctx;
  d.uctx = 0;
  EXPECT_EQ(d.Handle(VSTELLAR_CMD_DEALLOC_UCONTEXT, u).status(), VSTELLAR_STATUS_OK);
  DeviceStats s = StatsOf(0);
  EXPECT_EQ(s.pds + s.cqs + s.qps + s.mrs + s.ucontexts, 0u);
}

TEST_F(Device, AtcRegistrationPinsNothing) {
  DaemonOptions o;
  o.translation = TranslationMode::kAtc;
  StartDaemon(o);
  auto f = Connect();
  Driver d{*f};
  const uint32_t pd = d.AllocPd();
  const uint64_t before = StatsOf(0).pvdma.blocks_pinned;
  EXPECT_EQ(d.RegMr(pd, 0, 2 * 4096, {8 * MiB, 12 * MiB}).status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(StatsOf(0).pvdma.blocks_pinned, before);
}

// Every hostile control request, one after the other on one device: each
// must fail with its own status and leave the device serving the next, so
// the cases run in one test on one device rather than one device each.
TEST_F(Device, HostileRequestsFailAloneWithAClearStatus) {
  StartDaemon();
  auto f = Connect();
  Driver d{*f};
  d.uctx = d.AllocUctx();
  const uint32_t pd = d.AllocPd();
  const uint32_t cq = d.CreateCq(4 * MiB);
  ASSERT_TRUE(pd && cq);

  EXPECT_EQ(d.Cmd(0x77, nullptr, 0, 0).status(), VSTELLAR_STATUS_BAD_OPCODE);
  EXPECT_EQ(d.Cmd(0, nullptr, 0, 0).status(), VSTELLAR_STATUS_BAD_OPCODE);
  vstellar_cmd_handle junk{1, 0};
  EXPECT_EQ(d.Cmd(VSTELLAR_CMD_ALLOC_PD, junk, 8).status(), VSTELLAR_STATUS_BAD_LENGTH);  // body on a body-less op
  vstellar_cmd_handle resv{pd, 1};
  EXPECT_EQ(d.Cmd(VSTELLAR_CMD_DEALLOC_PD, resv).status(), VSTELLAR_STATUS_BAD_FIELD);
  // Out-of-range and foreign handles.
  EXPECT_EQ(d.Handle(VSTELLAR_CMD_DEALLOC_PD, 0xffffffff).status(), VSTELLAR_STATUS_BAD_HANDLE);
  EXPECT_EQ(d.Handle(VSTELLAR_CMD_DESTROY_QP, 0x123456).status(), VSTELLAR_STATUS_BAD_HANDLE);
  EXPECT_EQ(d.Handle(VSTELLAR_CMD_DEREG_MR, 0).status(), VSTELLAR_STATUS_BAD_HANDLE);
  {
    Driver other{*f};
    other.uctx = other.AllocUctx();  // another process of the same guest
    EXPECT_EQ(other.Handle(VSTELLAR_CMD_DEALLOC_PD, pd).status(), VSTELLAR_STATUS_BAD_HANDLE);
    Driver kernel{*f};
    EXPECT_EQ(kernel.Handle(VSTELLAR_CMD_DESTROY_CQ, cq).status(), VSTELLAR_STATUS_BAD_HANDLE);
    Driver ghost{*f};
    ghost.uctx = 999;
    EXPECT_EQ(ghost.Cmd(VSTELLAR_CMD_ALLOC_PD, nullptr, 0, 8).status(), VSTELLAR_STATUS_BAD_HANDLE);
  }
  // Page lists outside guest RAM (beyond it, in the doorbell region, wrapping).
  EXPECT_EQ(d.RegMr(pd, 0, 4096, {f->mem_size()}).status(), VSTELLAR_STATUS_BAD_ADDRESS);
  EXPECT_EQ(d.RegMr(pd, 0, 4096, {f->doorbell_gpa()}).status(), VSTELLAR_STATUS_BAD_ADDRESS);
  EXPECT_EQ(d.RegMr(pd, 0, 4096, {~0ull << 12}).status(), VSTELLAR_STATUS_BAD_ADDRESS);
  EXPECT_EQ(d.RegMr(pd, 0, 4096, {4 * MiB + 8}).status(), VSTELLAR_STATUS_BAD_FIELD);  // misaligned
  EXPECT_EQ(d.CreateCq(f->mem_size() + 4096), 0u);
  EXPECT_EQ(d.last, VSTELLAR_STATUS_BAD_ADDRESS);
  // Huge counts.
  {
    vstellar_cmd_reg_mr c{};
    c.pdn = pd;
    c.access_flags = VSTELLAR_ACCESS_LOCAL_WRITE;
    c.length = 1ull << 40;
    c.page_shift = 12;
    c.num_pages = 0xffffffff;  // says 32 GiB of page list, carries none
    EXPECT_EQ(d.Cmd(VSTELLAR_CMD_REG_MR, c, 16).status(), VSTELLAR_STATUS_BAD_LENGTH);
    c.length = 1ull << 50;
    c.num_pages = 0;
    EXPECT_EQ(d.Cmd(VSTELLAR_CMD_REG_MR, c, 16).status(), VSTELLAR_STATUS_LIMIT);
    c.length = ~0ull;
    c.iova = 2;
    EXPECT_EQ(d.Cmd(VSTELLAR_CMD_REG_MR, c, 16).status(), VSTELLAR_STATUS_BAD_FIELD);  // wraps
  }
  EXPECT_EQ(d.CreateCq(4 * MiB, 31), 0u);
  EXPECT_EQ(d.last, VSTELLAR_STATUS_LIMIT);
  EXPECT_EQ(d.CreateCq(4 * MiB, 200), 0u);
  EXPECT_EQ(d.last, VSTELLAR_STATUS_LIMIT);
  {
    auto c = RcQpBody(pd, cq);
    c.sq_log_wqe = 30;
    auto body = WithPages(&c, sizeof(c), {5 * MiB, 5 * MiB + 4096, 5 * MiB + 8192});
    EXPECT_EQ(d.Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24).status(), VSTELLAR_STATUS_LIMIT);
    c = RcQpBody(pd, cq);
    c.max_send_sge = 1000;
    body = WithPages(&c, sizeof(c), {5 * MiB, 5 * MiB + 4096, 5 * MiB + 8192});
    EXPECT_EQ(d.Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24).status(), VSTELLAR_STATUS_LIMIT);
    c = RcQpBody(pd, cq);
    c.sq_pages = 1;  // ring needs 2
    body = WithPages(&c, sizeof(c), {5 * MiB, 5 * MiB + 4096});
    EXPECT_EQ(d.Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24).status(), VSTELLAR_STATUS_BAD_FIELD);
    c = RcQpBody(pd, cq);
    c.qp_type = 99;
    body = WithPages(&c, sizeof(c), {5 * MiB, 5 * MiB + 4096, 5 * MiB + 8192});
    EXPECT_EQ(d.Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24).status(), VSTELLAR_STATUS_BAD_FIELD);
  }
  // QP attribute masks and state transitions.
  const uint32_t qpn = d.CreateQp(pd, cq, 5 * MiB);
  ASSERT_NE(qpn, 0u);
  EXPECT_EQ(d.Modify(qpn, VSTELLAR_QP_STATE, VSTELLAR_QPS_RTS), VSTELLAR_STATUS_BAD_STATE);  // RESET -> RTS
  EXPECT_EQ(d.Modify(qpn, kInitMask | (1u << 14), VSTELLAR_QPS_INIT), VSTELLAR_STATUS_BAD_FIELD);  // ALT_PATH
  EXPECT_EQ(d.Modify(qpn, VSTELLAR_QP_STATE, 9), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(d.Modify(qpn, VSTELLAR_QP_STATE, VSTELLAR_QPS_INIT), VSTELLAR_STATUS_BAD_FIELD);  // required attrs missing
  EXPECT_EQ(d.Modify(qpn, kInitMask, VSTELLAR_QPS_INIT, [](auto& a) { a.access_flags = 0x100; }),
            VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(d.Modify(qpn, kInitMask, VSTELLAR_QPS_INIT, [](auto& a) { a.port = 2; }), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(d.Modify(qpn, kInitMask, VSTELLAR_QPS_INIT), VSTELLAR_STATUS_OK);
  EXPECT_EQ(d.Modify(qpn, kRtrMask, VSTELLAR_QPS_RTR, [](auto& a) { a.dest_qpn = 1u << 24; }),
            VSTELLAR_STATUS_BAD_FIELD);
  // A GID that names no host a peer engine can be at: link-local (fe80::),
  // a group, none.
  EXPECT_EQ(d.Modify(qpn, kRtrMask, VSTELLAR_QPS_RTR, [](auto& a) {
              std::memset(a.av.dgid, 0, 16);
              a.av.dgid[0] = 0xfe;
              a.av.dgid[1] = 0x80;
              a.av.dgid[15] = 1;
            }),
            VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(d.Modify(qpn, kRtrMask, VSTELLAR_QPS_RTR, [](auto& a) { a.av.dgid[12] = 239; }),
            VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(d.Modify(qpn, kRtrMask, VSTELLAR_QPS_RTR, [](auto& a) { std::memset(a.av.dgid, 0, 16); }),
            VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(d.Modify(qpn, kRtrMask | VSTELLAR_QP_CUR_STATE, VSTELLAR_QPS_RTR,
                     [](auto& a) { a.cur_qp_state = VSTELLAR_QPS_RTS; }),
            VSTELLAR_STATUS_BAD_STATE);
  // A response buffer too small for the response: nothing executes.
  {
    const uint32_t pds = StatsOf(0).pds;
    CmdResult r = f->Command(VSTELLAR_CMD_ALLOC_PD, d.uctx, nullptr, 0, 4);
    EXPECT_EQ(r.status(), VSTELLAR_STATUS_BAD_LENGTH);
    EXPECT_EQ(StatsOf(0).pds, pds);
  }
  // A request whose descriptor points outside guest memory.
  {
    f->Post(VSTELLAR_VQ_CONTROL, {{f->mem_size() - 8, 16, false}, {Frontend::kRespGpa, 16, true}});
    uint16_t head;
    uint32_t len;
    ASSERT_TRUE(f->WaitUsed(VSTELLAR_VQ_CONTROL, &head, &len));
    ASSERT_EQ(len, 16u);
    vstellar_resp_hdr h;
    std::memcpy(&h, f->mem() + Frontend::kRespGpa, 16);
    EXPECT_EQ(h.status, VSTELLAR_STATUS_BAD_ADDRESS);
  }
  // Readable after writable: a malformed chain comes back with nothing written.
  {
    f->Post(VSTELLAR_VQ_CONTROL, {{Frontend::kRespGpa, 16, true}, {Frontend::kReqGpa, 16, false}});
    uint16_t head;
    uint32_t len;
    ASSERT_TRUE(f->WaitUsed(VSTELLAR_VQ_CONTROL, &head, &len));
    EXPECT_EQ(len, 0u);
  }
  // And the device still works.
  EXPECT_NE(d.AllocPd(), 0u);
  EXPECT_FALSE(StatsOf(0).fatal);
}

TEST_F(Device, CommandChangedAfterTheKickIsNotReadTwice) {
  StartDaemon();
  // The device copies the request; then this hook rewrites the guest's copy
  // (a hostile vCPU racing the device). The device must act on what it copied.
  Frontend* target = nullptr;
  bool fired = false;
  d_->SetAfterCopyHook([&](unsigned) {
    if (!target) return;
    vstellar_cmd_hdr h;
    std::memcpy(&h, target->mem() + Frontend::kReqGpa, sizeof(h));
    if (h.opcode != VSTELLAR_CMD_REG_MR) return;
    auto* c = reinterpret_cast<vstellar_cmd_reg_mr*>(target->mem() + Frontend::kReqGpa + sizeof(h));
    c->num_pages = 0x10000000;     // a huge count
    c->length = ~0ull;             // and a wrapping length
    uint64_t outside = ~0ull << 12;
    std::memcpy(target->mem() + Frontend::kReqGpa + sizeof(h) + sizeof(*c), &outside, 8);
    fired = true;
  });
  auto f = Connect();
  Driver d{*f};
  const uint32_t pd = d.AllocPd();
  target = f.get();
  CmdResult r = d.RegMr(pd, 0x1000, 4096, {6 * MiB}, VSTELLAR_ACCESS_LOCAL_WRITE);
  target = nullptr;
  EXPECT_TRUE(fired);
  ASSERT_EQ(r.status(), VSTELLAR_STATUS_OK);  // the copy was valid
  EXPECT_EQ(StatsOf(0).mrs, 1u);
}

TEST_F(Device, TwoDevicesAreIsolated) {
  StartDaemon();
  auto a = Connect();
  auto b = Connect();
  Driver da{*a}, db{*b};
  const uint32_t pa = da.AllocPd();
  ASSERT_NE(pa, 0u);
  // A's handles mean nothing on B.
  EXPECT_EQ(db.Handle(VSTELLAR_CMD_DEALLOC_PD, pa).status(), VSTELLAR_STATUS_BAD_HANDLE);
  const uint32_t cqa = da.CreateCq(4 * MiB);
  const uint32_t qpa = da.CreateQp(pa, cqa, 5 * MiB);
  ASSERT_NE(qpa, 0u);
  EXPECT_EQ(db.Handle(VSTELLAR_CMD_QUERY_QP, qpa, 80).status(), VSTELLAR_STATUS_BAD_HANDLE);
  EXPECT_EQ(db.Handle(VSTELLAR_CMD_DESTROY_QP, qpa).status(), VSTELLAR_STATUS_BAD_HANDLE);

  // A corrupts its control ring (an available index 1000 ahead): A goes
  // fatal, with a DEVICE_FATAL event; B is untouched.
  a->SetAvailIdx(VSTELLAR_VQ_CONTROL, 1000);
  a->Kick(VSTELLAR_VQ_CONTROL);
  auto ev = a->Events(2000);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().type, VSTELLAR_EV_DEVICE_FATAL);
  EXPECT_TRUE(StatsOf(0).fatal);
  EXPECT_FALSE(StatsOf(1).fatal);
  EXPECT_NE(db.AllocPd(), 0u);

  // A sends a bad ring size: vstellard ends A's session, B keeps working.
  std::string err;
  VringState bad{VSTELLAR_VQ_EVENT, 3};
  EXPECT_FALSE(a->Send(Request::kSetVringNum, &bad, sizeof(bad), &err, {}, true));
  for (int i = 0; i < 100 && d_->Stats().size() != 1; i++) usleep(10000);
  EXPECT_EQ(d_->Stats().size(), 1u);
  EXPECT_FALSE(a->Alive());
  EXPECT_NE(db.AllocPd(), 0u);
  EXPECT_EQ(db.Cmd(VSTELLAR_CMD_QUERY_DEVICE, nullptr, 0, 112).status(), VSTELLAR_STATUS_OK);
  // A new device can still attach.
  auto c = Connect();
  Driver dc{*c};
  EXPECT_NE(dc.AllocPd(), 0u);
}

TEST_F(Device, EventIdxIsHonoured) {
  StartDaemon();
  FrontendOptions fo;
  fo.event_idx = true;
  auto f = Connect(fo);
  Driver d{*f};
  for (int i = 0; i < 10; i++) EXPECT_NE(d.AllocPd(), 0u);
  // The device publishes where the driver must kick next (avail_event).
  uint16_t avail_event;
  std::memcpy(&avail_event, f->mem() + 0x10000 + 0x2000 + 4 + 8 * 64, 2);
  EXPECT_EQ(avail_event, 10);
}

TEST_F(Device, StatsJson) {
  StartDaemon();
  auto f = Connect();
  Driver d{*f};
  d.AllocPd();
  std::string j = d_->StatsJson();
  EXPECT_NE(j.find("\"blocks_pinned\":1"), std::string::npos) << j;
  EXPECT_NE(j.find("\"pin\":\"lazy\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"closed\":false"), std::string::npos) << j;
  // The frontend goes away: the device's last counters stay in the stats.
  f.reset();
  for (int i = 0; i < 200 && !d_->Stats().empty(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  j = d_->StatsJson();
  EXPECT_NE(j.find("\"closed\":true"), std::string::npos) << j;
  EXPECT_NE(j.find("\"commands\":"), std::string::npos) << j;
}

}  // namespace
