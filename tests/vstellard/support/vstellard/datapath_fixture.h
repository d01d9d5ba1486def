// The data path end to end, without QEMU: an in-process daemon with a
// loopback UDP engine, test frontends (devices) playing QEMU, the guest
// driver and the guest's provider library: WQEs written into SQ/RQ rings
// in "guest memory", producer indices stored in the doorbell page, kicks
// through the kick queue when need_kick says so, CQEs polled by their
// owner bit. The fixture (DataPath, and DataPathOnTwoThreads for a daemon
// with two workers) and the guest it drives (Guest) are shared by the
// datapath_*_test.cc files, one per object.
#pragma once

#include <endian.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "vstellard/daemon.h"
#include "vstellard/frontend.h"

// Its own namespace: the fixture is named DataPath, as the tests' names
// (DataPath.*) are, beside vstellard::DataPath, the class under test.
namespace vstellard::datapath_test {

constexpr uint32_t kInitMask = kRcInitMask, kRtrMask = kRcRtrMask, kRtsMask = kRcRtsMask;

constexpr uint64_t kCqGpa = 0x200000;     // CQ ring: 64 CQEs, one page
constexpr uint64_t kRingGpa = 0x210000;   // QP k: SQ 2 pages + RQ 1 page at +0x4000 * k
constexpr uint64_t kMrGpa = 0x400000;     // MR: iova == gpa, 128 KiB
constexpr uint64_t kMrLen = 0x20000;
constexpr uint32_t kLogCqe = 6, kSqLog = 6, kSqStride = 128, kRqLog = 6, kRqStride = 64;
constexpr uint64_t kSrqGpa = 0x3f0000;    // SRQ ring: 16 slots of 64 bytes, one page
constexpr uint32_t kSrqLog = 4;

template <typename T>
T As(const CmdResult& r) {
  T v{};
  EXPECT_EQ(r.body.size(), sizeof(T));
  std::memcpy(&v, r.body.data(), std::min(sizeof(T), r.body.size()));
  return v;
}

struct GQp {
  uint32_t qpn = 0, slot = 0;
  uint64_t ring = 0;
  uint32_t sq_pi = 0, rq_pi = 0;
};

struct GSrq {
  uint32_t srqn = 0, slot = 0;
  uint32_t pi = 0;
  uint64_t gpa = kSrqGpa;  // the ring (RESIZE_SRQ moves it)
  uint32_t log = kSrqLog;
};

// One guest: a user context with a PD, a CQ, an MR and QPs, driven like the
// kernel driver (control commands) and the provider (rings, doorbells).
struct Guest {
  Frontend& f;
  uint32_t uctx = 0, page = 0, pd = 0, cq = 0, cq_slot = 0, cq_ci = 0, lkey = 0, rkey = 0;
  uint32_t nqp = 0;
  uint64_t cq_gpa = kCqGpa;  // where the CQ's ring is (RESIZE_CQ moves it)
  uint32_t cq_log = kLogCqe;

  CmdResult Cmd(uint16_t op, const void* b, size_t n, uint32_t resp) {
    CmdResult r = f.Command(op, uctx, b, n, resp);
    EXPECT_TRUE(r.done);
    return r;
  }
  // One CQ of 64 CQEs at kCqGpa.
  void CreateCq() {
    std::memset(f.mem() + kCqGpa, 0, 4096);
    auto body = CreateCqBody(kLogCqe, kCqGpa);
    CmdResult r = Cmd(VSTELLAR_CMD_CREATE_CQ, body.data(), body.size(), 8);
    ASSERT_EQ(r.status(), 0);
    cq = As<vstellar_resp_create_cq>(r).cqn;
    cq_slot = As<vstellar_resp_create_cq>(r).db_slot;
  }
  void Setup() {
    CmdResult r = f.Command(VSTELLAR_CMD_ALLOC_UCONTEXT, 0, nullptr, 0, 8);
    ASSERT_EQ(r.status(), 0);
    auto u = As<vstellar_resp_alloc_ucontext>(r);
    uctx = u.ucontext;
    page = u.db_page;
    r = Cmd(VSTELLAR_CMD_ALLOC_PD, nullptr, 0, 8);
    ASSERT_EQ(r.status(), 0);
    pd = As<vstellar_resp_alloc_pd>(r).pdn;
    CreateCq();
    auto body = RegMrBody(pd, kMrGpa, kMrLen, VSTELLAR_ACCESS_VALID);
    r = Cmd(VSTELLAR_CMD_REG_MR, body.data(), body.size(), 16);
    ASSERT_EQ(r.status(), 0);
    lkey = As<vstellar_resp_reg_mr>(r).lkey;
    rkey = As<vstellar_resp_reg_mr>(r).rkey;
  }
  // The kernel's side instead: its doorbell page (KERNEL_DB), a kernel PD
  // and CQ, no MR (kernel SGEs use the local DMA lkey and guest-physical
  // addresses), and the GID the kernel's GID cache would add (none for
  // ip_last 0).
  void SetupKernel(uint8_t ip_last) {
    CmdResult r = f.Command(VSTELLAR_CMD_KERNEL_DB, 0, nullptr, 0, 8);
    ASSERT_EQ(r.status(), 0);
    page = As<vstellar_resp_kernel_db>(r).db_page;
    uctx = 0;
    r = Cmd(VSTELLAR_CMD_ALLOC_PD, nullptr, 0, 8);
    ASSERT_EQ(r.status(), 0);
    pd = As<vstellar_resp_alloc_pd>(r).pdn;
    CreateCq();
    ASSERT_GE(cq_slot, VSTELLAR_DB_FIRST_SLOT);
    lkey = VSTELLAR_LOCAL_DMA_LKEY;
    if (ip_last) {
      const vstellar_cmd_gid g = LoopbackGid(ip_last);
      ASSERT_EQ(Cmd(VSTELLAR_CMD_ADD_GID, &g, sizeof(g), 0).status(), 0);
    }
  }
  // The RoCE v2 GID of 127.0.0.ip_last at `index` (ADD_GID).
  static vstellar_cmd_gid LoopbackGid(uint8_t ip_last, uint32_t index = 0) {
    vstellar_cmd_gid g{};
    g.port = 1;
    g.index = index;
    g.gid[10] = g.gid[11] = 0xff;
    g.gid[12] = 127;
    g.gid[15] = ip_last;
    g.gid_type = VSTELLAR_GID_TYPE_ROCE_V2;
    return g;
  }
  // Adds it as the kernel does (its GID cache), whatever context this guest has.
  void AddLoopbackGid(uint8_t ip_last) {
    const vstellar_cmd_gid g = LoopbackGid(ip_last);
    ASSERT_EQ(f.Command(VSTELLAR_CMD_ADD_GID, 0, &g, sizeof(g), 0).status(), 0);
  }
  // UD/GSI: RESET -> INIT (Q_Key) -> RTR -> RTS.
  uint16_t ToRtsUd(uint32_t qpn, bool gsi, uint32_t qkey) {
    vstellar_cmd_modify_qp m{};
    m.qpn = qpn;
    m.attr.qp_state = VSTELLAR_QPS_INIT;
    m.attr.port = 1;
    m.attr.qkey = qkey;
    m.attr.attr_mask = VSTELLAR_QP_STATE | VSTELLAR_QP_PKEY_INDEX | VSTELLAR_QP_QKEY | (gsi ? 0 : VSTELLAR_QP_PORT);
    if (uint16_t st = Cmd(VSTELLAR_CMD_MODIFY_QP, &m, sizeof(m), 0).status()) return st;
    m.attr.qp_state = VSTELLAR_QPS_RTR;
    m.attr.attr_mask = VSTELLAR_QP_STATE;
    if (uint16_t st = Cmd(VSTELLAR_CMD_MODIFY_QP, &m, sizeof(m), 0).status()) return st;
    m.attr.qp_state = VSTELLAR_QPS_RTS;
    m.attr.attr_mask = VSTELLAR_QP_STATE | VSTELLAR_QP_SQ_PSN;
    return Cmd(VSTELLAR_CMD_MODIFY_QP, &m, sizeof(m), 0).status();
  }
  // A UD QP (2 send SGEs) taken to RTS with `qkey`, into *out. Fatal on
  // failure: call it under ASSERT_NO_FATAL_FAILURE.
  void CreateUdQp(uint32_t qkey, GQp* out) {
    uint16_t st = 0;
    *out = CreateQp(2, VSTELLAR_QPT_UD, &st);
    ASSERT_EQ(st, 0);
    ASSERT_EQ(ToRtsUd(out->qpn, false, qkey), 0);
  }
  GQp CreateQp(uint32_t max_send_sge = 4, uint8_t type = VSTELLAR_QPT_RC, uint16_t* status = nullptr) {
    GQp q;
    q.ring = kRingGpa + 0x4000ull * nqp++;
    std::memset(f.mem() + q.ring, 0, 3 * 4096);
    vstellar_cmd_create_qp c = RcQpBody(pd, cq);  // kSqLog x kSqStride, kRqLog x kRqStride
    c.qp_type = type;
    c.max_send_sge = max_send_sge;
    auto body = CreateQpBody(c, q.ring);
    CmdResult r = Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24);
    if (status) {
      *status = r.status();
      if (r.status()) return q;
    }
    EXPECT_EQ(r.status(), 0);
    q.qpn = As<vstellar_resp_create_qp>(r).qpn;
    q.slot = As<vstellar_resp_create_qp>(r).db_slot;
    return q;
  }
  // An SRQ of 16 slots (2 SGEs each) at kSrqGpa; `srq_limit` arms its limit.
  GSrq CreateSrq(uint32_t srq_limit = 0, uint16_t* status = nullptr) {
    GSrq q;
    std::memset(f.mem() + kSrqGpa, 0, 4096);
    vstellar_cmd_create_srq c{};
    c.pdn = pd;
    c.log_wqe = kSrqLog;
    c.log_stride = 6;
    c.page_shift = 12;
    c.max_sge = 2;
    c.srq_limit = srq_limit;
    c.num_pages = 1;
    auto body = WithPages(&c, sizeof(c), {kSrqGpa});
    CmdResult r = Cmd(VSTELLAR_CMD_CREATE_SRQ, body.data(), body.size(), sizeof(vstellar_resp_create_srq));
    if (status) *status = r.status();
    if (r.status()) return q;
    q.srqn = As<vstellar_resp_create_srq>(r).srqn;
    q.slot = As<vstellar_resp_create_srq>(r).db_slot;
    EXPECT_EQ(As<vstellar_resp_create_srq>(r).max_sge, 2u);
    return q;
  }
  // An RC or UD QP whose receives come from SRQ `srqn`: an SQ, no RQ.
  GQp CreateQpOnSrq(uint32_t srqn, uint16_t* status = nullptr, uint8_t type = VSTELLAR_QPT_RC) {
    GQp q;
    q.ring = kRingGpa + 0x4000ull * nqp++;
    std::memset(f.mem() + q.ring, 0, 2 * 4096);
    vstellar_cmd_create_qp c = RcQpBody(pd, cq);
    c.qp_type = type;
    c.create_flags = VSTELLAR_QP_CREATE_USE_SRQ;
    c.srq.srqn = srqn;
    c.rq_log_wqe = c.rq_log_stride = c.max_recv_sge = c.rq_pages = 0;
    auto body = CreateQpBody(c, q.ring);
    CmdResult r = Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24);
    if (status) *status = r.status();
    if (r.status()) return q;
    q.qpn = As<vstellar_resp_create_qp>(r).qpn;
    q.slot = As<vstellar_resp_create_qp>(r).db_slot;
    return q;
  }
  void PostSrqRecv(GSrq& q, uint64_t wr_id, const std::vector<vstellar_sge>& sges) {
    uint8_t* s = f.mem() + q.gpa + (q.pi & ((1u << q.log) - 1)) * 64;
    vstellar_recv_wqe w{};
    w.wr_id = wr_id;
    w.num_sge = uint32_t(sges.size());
    std::memcpy(s + sizeof(w), sges.data(), 16 * std::min<size_t>(sges.size(), 2));
    std::memcpy(s, &w, sizeof(w));
    q.pi++;
    Ring(VSTELLAR_DB_SLOT_SIZE * q.slot + offsetof(vstellar_db_srq, pi), q.pi);
  }
  uint16_t Modify(uint32_t qpn, uint32_t mask, uint8_t state, uint32_t dest = 0) {
    vstellar_cmd_modify_qp m = RcModifyBody(qpn, dest, 3);  // 1024: several packets per message
    m.attr.attr_mask = mask;
    m.attr.qp_state = state;
    return Cmd(VSTELLAR_CMD_MODIFY_QP, &m, sizeof(m), 0).status();
  }
  void Connect(const GQp& q, uint32_t dest) {
    ASSERT_EQ(Modify(q.qpn, kInitMask, VSTELLAR_QPS_INIT), 0);
    ASSERT_EQ(Modify(q.qpn, kRtrMask, VSTELLAR_QPS_RTR, dest), 0);
    ASSERT_EQ(Modify(q.qpn, kRtsMask, VSTELLAR_QPS_RTS), 0);
  }
  uint8_t QpState(uint32_t qpn) {
    vstellar_cmd_handle h{qpn, 0};
    CmdResult r = Cmd(VSTELLAR_CMD_QUERY_QP, &h, sizeof(h), sizeof(vstellar_resp_query_qp));
    return r.status() ? 0xff : As<vstellar_resp_query_qp>(r).attr.qp_state;
  }

  std::atomic_ref<uint32_t> DbWord(uint32_t off) { return f.DoorbellWord(page, off); }
  uint32_t NeedKick() { return DbWord(0).load(); }
  // The provider's doorbell: index store, store-load fence, kick if asked.
  void Ring(uint32_t off, uint32_t value, bool kick = true) { f.RingDoorbell(page, off, value, kick); }
  uint8_t* SqSlot(const GQp& q, uint32_t idx) { return f.mem() + q.ring + (idx & ((1u << kSqLog) - 1)) * kSqStride; }
  uint8_t* RqSlot(const GQp& q, uint32_t idx) { return f.mem() + q.ring + 8192 + (idx & ((1u << kRqLog) - 1)) * kRqStride; }

  // Writes a send WQE (header + SGEs or inline bytes) at the next SQ slot.
  void WriteSend(GQp& q, vstellar_send_wqe w, const std::vector<vstellar_sge>& sges, const std::vector<uint8_t>& inl = {}) {
    uint8_t* s = SqSlot(q, q.sq_pi);
    std::memset(s, 0, kSqStride);
    if (!inl.empty()) {
      w.flags |= VSTELLAR_WQE_INLINE;
      w.inline_len = uint32_t(inl.size());
      std::memcpy(s + sizeof(w), inl.data(), inl.size());
    } else {
      if (!w.num_sge) w.num_sge = uint8_t(sges.size());
      std::memcpy(s + sizeof(w), sges.data(), 16 * std::min<size_t>(sges.size(), 4));
    }
    std::memcpy(s, &w, sizeof(w));
    q.sq_pi++;
  }
  void PostSend(GQp& q, vstellar_send_wqe w, const std::vector<vstellar_sge>& sges, const std::vector<uint8_t>& inl = {},
                bool kick = true) {
    WriteSend(q, w, sges, inl);
    Ring(VSTELLAR_DB_SLOT_SIZE * q.slot + offsetof(vstellar_db_qp, sq_pi), q.sq_pi, kick);
  }
  void PostRecv(GQp& q, uint64_t wr_id, const std::vector<vstellar_sge>& sges, uint32_t num_sge = ~0u,
                bool kick = true) {
    uint8_t* s = RqSlot(q, q.rq_pi);
    vstellar_recv_wqe w{};
    w.wr_id = wr_id;
    w.num_sge = num_sge == ~0u ? uint32_t(sges.size()) : num_sge;
    std::memcpy(s + sizeof(w), sges.data(), 16 * std::min<size_t>(sges.size(), 2));
    std::memcpy(s, &w, sizeof(w));
    q.rq_pi++;
    Ring(VSTELLAR_DB_SLOT_SIZE * q.slot + offsetof(vstellar_db_qp, rq_pi), q.rq_pi, kick);
  }
  vstellar_sge Sge(uint64_t off, uint32_t len) { return vstellar_sge{kMrGpa + off, len, lkey}; }
  uint8_t* Buf(uint64_t off) { return f.mem() + kMrGpa + off; }

  // RESIZE_CQ to a ring of 1 << log CQEs at gpa (contiguous pages), as the
  // provider does it: a zeroed ring, then poll it from index 0. Only what
  // lies in guest memory is zeroed: a ring the device must refuse (log 21:
  // 64 MiB) may not fit, and past the end of the frontend's mapping is
  // whatever the process has there (the heap).
  CmdResult ResizeCq(uint64_t gpa, uint32_t log, uint32_t cqn = 0) {
    const uint32_t pages = uint32_t(std::max<uint64_t>(1, (32ull << log) / 4096));
    if (gpa < f.mem_size()) std::memset(f.mem() + gpa, 0, std::min<uint64_t>(4096ull * pages, f.mem_size() - gpa));
    vstellar_cmd_resize_cq c{};
    c.cqn = cqn ? cqn : cq;
    c.log_cqe = log;
    c.page_shift = 12;
    c.num_pages = pages;
    auto body = WithPages(c, PagesFrom(gpa, pages));
    CmdResult r = Cmd(VSTELLAR_CMD_RESIZE_CQ, body.data(), body.size(), sizeof(vstellar_resp_resize_cq));
    if (r.status() == 0 && !cqn) {
      cq_gpa = gpa;
      cq_log = log;
      cq_ci = 0;
    }
    return r;
  }

  // Polls the next CQE by its owner bit; stores the consumer index.
  std::optional<vstellar_cqe> Poll(int timeout_ms = 5000) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      vstellar_cqe c;
      if (f.TakeCqe(cq_gpa, cq_log, cq_ci, &c)) {
        cq_ci++;
        DbWord(VSTELLAR_DB_SLOT_SIZE * cq_slot + offsetof(vstellar_db_cq, ci)).store(htole32(cq_ci));
        return c;
      }
      if (std::chrono::steady_clock::now() > end) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
};

inline vstellar_send_wqe Wqe(uint8_t op, uint64_t wr_id, uint8_t flags = VSTELLAR_WQE_SIGNALED) {
  vstellar_send_wqe w{};
  w.wr_id = wr_id;
  w.opcode = op;
  w.flags = flags;
  return w;
}

// A UD send to 127.0.0.<ip_last>, QP qpn, from GID index sgid_index.
inline vstellar_send_wqe UdWqe(uint64_t wr_id, uint8_t ip_last, uint32_t qpn, uint32_t qkey, uint8_t sgid_index = 0) {
  vstellar_send_wqe w = Wqe(VSTELLAR_WR_SEND, wr_id);
  w.u.ud.av.dgid[10] = w.u.ud.av.dgid[11] = 0xff;
  w.u.ud.av.dgid[12] = 127;
  w.u.ud.av.dgid[15] = ip_last;
  w.u.ud.av.sgid_index = sgid_index;
  w.u.ud.av.hop_limit = 64;
  w.u.ud.remote_qpn = qpn;
  w.u.ud.remote_qkey = qkey;
  return w;
}

class DataPath : public ::testing::Test {
 protected:
  std::string dir_, sock_;
  std::unique_ptr<Daemon> d_;
  std::thread t_;
  std::promise<void> release_;  // TearDown lets the daemon's thread destroy it
  std::unique_ptr<Frontend> fa_, fb_;
  std::unique_ptr<Guest> a_, b_;
  unsigned threads_ = 1;  // DaemonOptions::threads

  void StartDaemon(uint64_t poll_us = 50, std::function<void(Daemon&)> before = {},
                   std::function<void(DaemonOptions&)> tune = {}) {
    char tmpl[] = "/tmp/vstellard-dp-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    sock_ = dir_ + "/s";
    // The UDP link's io_uring is single-issuer: Start(), Run() and the
    // destructor (which cancels the ring's receive) on the daemon's own
    // thread.
    std::promise<std::string> started;
    auto fut = started.get_future();
    release_ = std::promise<void>();
    t_ = std::thread([&, poll_us, before, tune, released = release_.get_future()] {
      std::string err;
      for (int attempt = 0; attempt < 20; attempt++) {
        DaemonOptions o;
        o.socket = sock_;
        // Below 45000: the guest tests' daemons, which may run beside
        // (make test's parallel ctest), listen from 47000.
        o.udp_port = uint16_t(20000 + (getpid() * 37 + attempt * 1009) % 25000);
        o.paths = 4;
        o.poll_us = poll_us;
        o.threads = threads_;
        if (tune) tune(o);
        auto d = std::make_unique<Daemon>(o);
        if (d->Start(&err)) {
          if (before) before(*d);
          d_ = std::move(d);
          break;
        }
      }
      Daemon* d = d_.get();
      started.set_value(d ? "" : err);
      if (!d) return;
      d->Run();
      released.wait();
      d_.reset();
    });
    const std::string err = fut.get();
    if (!d_) t_.join();
    ASSERT_TRUE(d_) << err;
  }
  // Two devices (frontends) and their guests, nothing set up yet.
  void TwoDevices() {
    for (auto* f : {&fa_, &fb_}) {
      *f = std::make_unique<Frontend>();
      std::string err;
      ASSERT_TRUE((*f)->Connect(sock_, &err)) << err;
      ASSERT_TRUE((*f)->StartQueues(&err)) << err;
    }
    a_ = std::make_unique<Guest>(Guest{*fa_});
    b_ = std::make_unique<Guest>(Guest{*fb_});
  }
  // ... each with a user context, PD, CQ and MR.
  void TwoGuests() {
    TwoDevices();
    a_->Setup();
    b_->Setup();
  }
  void TearDown() override {
    if (d_) {
      d_->Stop();
      release_.set_value();
      t_.join();
    }
    a_.reset();
    b_.reset();
    fa_.reset();
    fb_.reset();
    if (!sock_.empty()) unlink(sock_.c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  // Tests that run on one worker thread and again on two (threads on and
  // off give the same results; with two, the devices alternate between
  // the workers, so every pair talks across threads).
  void SendRecvWriteReadAtomicsBetweenTwoDevices();
  void ManyDevicesAttachMoveDataAndDetachLeavingNothing();
  std::vector<uint64_t> TwoQpPairsRun();
  // n guests attached through the daemon's socket, each set up (Guest::
  // Setup); returns the lowest id among the daemon's devices (the first
  // of them, when they are the daemon's only ones).
  unsigned AttachGuests(int n, std::vector<std::unique_ptr<Frontend>>* fs, std::vector<std::unique_ptr<Guest>>* gs) {
    for (int i = 0; i < n; i++) {
      fs->push_back(std::make_unique<Frontend>());
      std::string err;
      EXPECT_TRUE(fs->back()->Connect(sock_, &err)) << err;
      EXPECT_TRUE(fs->back()->StartQueues(&err)) << err;
      gs->push_back(std::make_unique<Guest>(Guest{*fs->back()}));
      gs->back()->Setup();
    }
    unsigned first = ~0u;
    for (const DeviceStats& st : d_->Stats()) first = std::min(first, st.id);
    return first;
  }
  // The worker serving device `id`; a device moving between two is in
  // neither for a moment (Worker::MoveOut), so wait for it to arrive.
  int WaitForWorker(unsigned id) {
    for (int i = 0; i < 5000; i++) {
      const int w = d_->WorkerOf(id);
      if (w >= 0) return w;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return -1;
  }
  void IdleDaemonWithQpsSleeps();
  void AReceivePublishedBeforeTheMessageTakesIt();
  void KernelGsiAndUdQpsExchangeDatagrams();
  void OnlyOneDeviceHoldsAnAddressAndItsQp1();
  void MulticastGroupsThroughTheDaemon();
  void UcQpsSendWriteAndDropBadMessagesAlone();
  // Posts with `post` and waits until device `id` has fetched one WQE
  // more from its rings. A datagram that arrives before its receive WQE
  // was fetched is dropped (UD), and with two worker threads the sender's
  // worker does not wait for the receiver's.
  template <typename F>
  void Fetched(unsigned id, F post) {
    auto wqes = [&] {
      for (const DeviceStats& st : d_->Stats())
        if (st.id == id) return st.wqes;
      return uint64_t{0};
    };
    const uint64_t before = wqes();
    post();
    for (int i = 0; i < 2000 && wqes() == before; i++) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_GT(wqes(), before) << "device " << id;
  }
  DeviceStats StatsOf(size_t i) {
    auto v = d_->Stats();
    return v.size() > i ? v[i] : DeviceStats{};
  }
  static bool Has(const std::vector<vstellar_event>& v, uint16_t type, uint32_t object) {
    for (auto& e : v)
      if (le16toh(e.type) == type && le32toh(e.object) == object) return true;
    return false;
  }
};

// The same tests on a daemon with two worker threads.
class DataPathOnTwoThreads : public DataPath {
 protected:
  DataPathOnTwoThreads() { threads_ = 2; }
};

inline void Fill(uint8_t* p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; i++) p[i] = uint8_t(seed + i * 7);
}

}  // namespace vstellard::datapath_test
