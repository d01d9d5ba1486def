// vstellard's data path end to end, without QEMU: an in-process daemon with
// a loopback UDP engine, two test frontends (two devices) playing QEMU, the
// guest driver and the guest's provider library: WQEs written into SQ/RQ
// rings in "guest memory", producer indices stored in the doorbell page,
// kicks through the kick queue when need_kick says so, CQEs polled by their
// owner bit. Hostile cases: bad opcode, SGE count, lkey, MR bounds, inline
// size, a producer index beyond the ring, a WQE rewritten after the doorbell.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "vstellard/daemon.h"
#include "vstellard/frontend.h"

using namespace vstellard;

namespace {

constexpr uint32_t kInitMask = kRcInitMask, kRtrMask = kRcRtrMask, kRtsMask = kRcRtsMask;

constexpr uint64_t kCqGpa = 0x200000;     // CQ ring: 64 CQEs, one page
constexpr uint64_t kRingGpa = 0x210000;   // QP k: SQ 2 pages + RQ 1 page at +0x4000 * k
constexpr uint64_t kMrGpa = 0x400000;     // MR: iova == gpa, 128 KiB
constexpr uint64_t kMrLen = 0x20000;
constexpr uint32_t kLogCqe = 6, kSqLog = 6, kSqStride = 128, kRqLog = 6, kRqStride = 64;
constexpr uint64_t kSrqGpa = 0x3f0000;    // SRQ ring: 16 slots of 64 bytes, one page
constexpr uint32_t kSrqLog = 4;

std::vector<uint8_t> WithPages(const void* body, size_t n, const std::vector<uint64_t>& pages) {
  std::vector<uint8_t> v(n + 8 * pages.size());
  std::memcpy(v.data(), body, n);
  std::memcpy(v.data() + n, pages.data(), 8 * pages.size());
  return v;
}

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
    vstellar_cmd_create_cq c{};
    c.log_cqe = kLogCqe;
    c.page_shift = 12;
    c.num_pages = 1;
    std::memset(f.mem() + kCqGpa, 0, 4096);
    auto body = WithPages(&c, sizeof(c), {kCqGpa});
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
    vstellar_cmd_reg_mr m{};
    std::vector<uint8_t> body;
    m.pdn = pd;
    m.access_flags = VSTELLAR_ACCESS_VALID;
    m.iova = kMrGpa;
    m.length = kMrLen;
    m.page_shift = 12;
    std::vector<uint64_t> pages;
    for (uint64_t a = kMrGpa; a < kMrGpa + kMrLen; a += 4096) pages.push_back(a);
    m.num_pages = uint32_t(pages.size());
    body = WithPages(&m, sizeof(m), pages);
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
    vstellar_cmd_gid g{};
    g.port = 1;
    g.index = 0;
    g.gid[10] = g.gid[11] = 0xff;
    g.gid[12] = 127;
    g.gid[15] = ip_last;
    g.gid_type = VSTELLAR_GID_TYPE_ROCE_V2;
    if (ip_last) {
      ASSERT_EQ(Cmd(VSTELLAR_CMD_ADD_GID, &g, sizeof(g), 0).status(), 0);
    }
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
  GQp CreateQp(uint32_t max_send_sge = 4, uint8_t type = VSTELLAR_QPT_RC, uint16_t* status = nullptr) {
    GQp q;
    q.ring = kRingGpa + 0x4000ull * nqp++;
    std::memset(f.mem() + q.ring, 0, 3 * 4096);
    vstellar_cmd_create_qp c{};
    c.pdn = pd;
    c.send_cqn = c.recv_cqn = cq;
    c.qp_type = type;
    c.sq_log_wqe = kSqLog;
    c.sq_log_stride = 7;
    c.rq_log_wqe = kRqLog;
    c.rq_log_stride = 6;
    c.page_shift = 12;
    c.max_send_sge = max_send_sge;
    c.max_recv_sge = 2;
    c.max_inline_data = 64;
    c.sq_pages = 2;
    c.rq_pages = 1;
    auto body = WithPages(&c, sizeof(c), {q.ring, q.ring + 4096, q.ring + 8192});
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
    vstellar_cmd_create_qp c{};
    c.pdn = pd;
    c.send_cqn = c.recv_cqn = cq;
    c.qp_type = type;
    c.create_flags = VSTELLAR_QP_CREATE_USE_SRQ;
    c.srq.srqn = srqn;
    c.sq_log_wqe = kSqLog;
    c.sq_log_stride = 7;
    c.page_shift = 12;
    c.max_send_sge = 4;
    c.max_inline_data = 64;
    c.sq_pages = 2;
    auto body = WithPages(&c, sizeof(c), {q.ring, q.ring + 4096});
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

  uint8_t* db() { return f.doorbell_page(page); }
  std::atomic_ref<uint32_t> DbWord(uint32_t off) { return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(db() + off)); }
  uint32_t NeedKick() { return DbWord(0).load(); }
  // The provider's doorbell: index store, store-load fence, kick if asked.
  void Ring(uint32_t off, uint32_t value, bool kick = true) {
    std::atomic_thread_fence(std::memory_order_release);
    DbWord(off).store(htole32(value), std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (kick && NeedKick()) f.Kick(VSTELLAR_VQ_KICK);
  }
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
  void PostRecv(GQp& q, uint64_t wr_id, const std::vector<vstellar_sge>& sges, uint32_t num_sge = ~0u) {
    uint8_t* s = RqSlot(q, q.rq_pi);
    vstellar_recv_wqe w{};
    w.wr_id = wr_id;
    w.num_sge = num_sge == ~0u ? uint32_t(sges.size()) : num_sge;
    std::memcpy(s + sizeof(w), sges.data(), 16 * std::min<size_t>(sges.size(), 2));
    std::memcpy(s, &w, sizeof(w));
    q.rq_pi++;
    Ring(VSTELLAR_DB_SLOT_SIZE * q.slot + offsetof(vstellar_db_qp, rq_pi), q.rq_pi);
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
    std::vector<uint64_t> pl;
    for (uint32_t i = 0; i < pages; i++) pl.push_back(gpa + 4096ull * i);
    auto body = WithPages(&c, sizeof(c), pl);
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
    const uint32_t n = 1u << cq_log;
    uint8_t* e = f.mem() + cq_gpa + 32ull * (cq_ci & (n - 1));
    const uint8_t want = ((cq_ci >> cq_log) & 1) ? 0 : 1;
    for (;;) {
      const uint8_t owner = std::atomic_ref<uint8_t>(e[31]).load(std::memory_order_acquire);
      if ((owner & VSTELLAR_CQE_OWNER) == want) {
        vstellar_cqe c;
        std::memcpy(&c, e, sizeof(c));
        cq_ci++;
        DbWord(VSTELLAR_DB_SLOT_SIZE * cq_slot + offsetof(vstellar_db_cq, ci)).store(htole32(cq_ci));
        return c;
      }
      if (std::chrono::steady_clock::now() > end) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
};

vstellar_send_wqe Wqe(uint8_t op, uint64_t wr_id, uint8_t flags = VSTELLAR_WQE_SIGNALED) {
  vstellar_send_wqe w{};
  w.wr_id = wr_id;
  w.opcode = op;
  w.flags = flags;
  return w;
}

// A UD send to 127.0.0.<ip_last>, QP qpn, from GID index sgid_index.
vstellar_send_wqe UdWqe(uint64_t wr_id, uint8_t ip_last, uint32_t qpn, uint32_t qkey, uint8_t sgid_index = 0) {
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
        o.udp_port = uint16_t(20000 + (getpid() * 37 + attempt * 1009) % 30000);
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
  void IdleDaemonWithQpsSleeps();
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

void Fill(uint8_t* p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; i++) p[i] = uint8_t(seed + i * 7);
}

void DataPath::SendRecvWriteReadAtomicsBetweenTwoDevices() {
  StartDaemon();
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  Guest& A = *a_;
  Guest& B = *b_;

  // SEND -> RECV, 3000 bytes in two SGEs, three packets at MTU 1024.
  Fill(A.Buf(0), 3000, 1);
  std::memset(B.Buf(0), 0, 8192);
  B.PostRecv(qb, 0xb0, {B.Sge(0, 1000), B.Sge(1000, 4000)});
  A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0xa0), {A.Sge(0, 1200), A.Sge(1200, 1800)});
  auto ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 0xa0u);
  EXPECT_EQ(ca->status, 0);
  EXPECT_EQ(ca->opcode, VSTELLAR_WC_SEND);
  EXPECT_EQ(ca->qpn, qa.qpn);
  EXPECT_EQ(ca->wqe_idx, 0);
  auto cb = B.Poll();
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->wr_id, 0xb0u);
  EXPECT_EQ(cb->status, 0);
  EXPECT_EQ(cb->opcode, VSTELLAR_WC_RECV);
  EXPECT_EQ(cb->byte_len, 3000u);
  EXPECT_EQ(cb->wqe_idx, 0);
  EXPECT_EQ(std::memcmp(A.Buf(0), B.Buf(0), 3000), 0);

  // Inline SEND with immediate; B's CQ is armed: one CQ notification.
  B.DbWord(VSTELLAR_DB_SLOT_SIZE * B.cq_slot + offsetof(vstellar_db_cq, arm)).store(htole32(1));
  B.PostRecv(qb, 0xb1, {B.Sge(8192, 256)});
  std::vector<uint8_t> inl(40);
  Fill(inl.data(), inl.size(), 9);
  auto w = Wqe(VSTELLAR_WR_SEND_IMM, 0xa1, VSTELLAR_WQE_SIGNALED | VSTELLAR_WQE_SOLICITED);
  w.imm_data = htobe32(0x12345678);
  A.PostSend(qa, w, {}, inl);
  ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 0xa1u);
  EXPECT_EQ(ca->status, 0);
  cb = B.Poll();
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->wr_id, 0xb1u);
  EXPECT_EQ(cb->byte_len, 40u);
  EXPECT_EQ(cb->wc_flags & VSTELLAR_CQE_WITH_IMM, VSTELLAR_CQE_WITH_IMM);
  EXPECT_EQ(be32toh(cb->imm_data), 0x12345678u);
  EXPECT_EQ(std::memcmp(B.Buf(8192), inl.data(), 40), 0);
  uint16_t head;
  uint32_t len;
  ASSERT_TRUE(fb_->WaitUsed(VSTELLAR_VQ_CQN0, &head, &len));
  EXPECT_EQ(len, 8u);
  vstellar_cq_notify nt;
  std::memcpy(&nt, fb_->mem() + Frontend::kCqnGpa + 8 * (head / 4), 8);
  EXPECT_EQ(le32toh(nt.cqn), B.cq);
  EXPECT_EQ(le32toh(nt.ucontext), B.uctx);

  // Unsignaled WRITE then signaled WRITE_IMM: one send CQE naming WQE 3.
  Fill(A.Buf(16384), 5000, 3);
  std::memset(B.Buf(32768), 0, 8192);
  w = Wqe(VSTELLAR_WR_RDMA_WRITE, 0xa2, 0);
  w.u.rdma.remote_addr = kMrGpa + 32768;
  w.u.rdma.rkey = B.rkey;
  A.WriteSend(qa, w, {A.Sge(16384, 4000)});
  B.PostRecv(qb, 0xb2, {});
  w = Wqe(VSTELLAR_WR_RDMA_WRITE_IMM, 0xa3);
  w.u.rdma.remote_addr = kMrGpa + 32768 + 4000;
  w.u.rdma.rkey = B.rkey;
  w.imm_data = htobe32(77);
  A.PostSend(qa, w, {A.Sge(20384, 1000)});
  ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 0xa3u);
  EXPECT_EQ(ca->wqe_idx, 3);
  EXPECT_EQ(ca->opcode, VSTELLAR_WC_RDMA_WRITE);
  cb = B.Poll();
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->wr_id, 0xb2u);
  EXPECT_EQ(cb->opcode, VSTELLAR_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(be32toh(cb->imm_data), 77u);
  EXPECT_EQ(std::memcmp(A.Buf(16384), B.Buf(32768), 5000), 0);

  // READ 6000 bytes of B into A.
  Fill(B.Buf(49152), 6000, 5);
  std::memset(A.Buf(65536), 0, 8192);
  w = Wqe(VSTELLAR_WR_RDMA_READ, 0xa4);
  w.u.rdma.remote_addr = kMrGpa + 49152;
  w.u.rdma.rkey = B.rkey;
  A.PostSend(qa, w, {A.Sge(65536, 6000)});
  ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->status, 0);
  EXPECT_EQ(ca->opcode, VSTELLAR_WC_RDMA_READ);
  EXPECT_EQ(ca->byte_len, 6000u);
  EXPECT_EQ(std::memcmp(A.Buf(65536), B.Buf(49152), 6000), 0);

  // Fetch-and-add, then compare-and-swap.
  uint64_t v = htole64(5);
  std::memcpy(B.Buf(90112), &v, 8);
  w = Wqe(VSTELLAR_WR_ATOMIC_FETCH_ADD, 0xa5);
  w.u.atomic.remote_addr = kMrGpa + 90112;
  w.u.atomic.rkey = B.rkey;
  w.u.atomic.compare_add = 7;
  A.PostSend(qa, w, {A.Sge(81920, 8)});
  ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->status, 0);
  EXPECT_EQ(ca->opcode, VSTELLAR_WC_FETCH_ADD);
  std::memcpy(&v, A.Buf(81920), 8);
  EXPECT_EQ(le64toh(v), 5u);
  std::memcpy(&v, B.Buf(90112), 8);
  EXPECT_EQ(le64toh(v), 12u);
  w = Wqe(VSTELLAR_WR_ATOMIC_CMP_SWP, 0xa6);
  w.u.atomic.remote_addr = kMrGpa + 90112;
  w.u.atomic.rkey = B.rkey;
  w.u.atomic.compare_add = 12;
  w.u.atomic.swap = 99;
  A.PostSend(qa, w, {A.Sge(81928, 8)});
  ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->status, 0);
  EXPECT_EQ(ca->opcode, VSTELLAR_WC_COMP_SWAP);
  std::memcpy(&v, A.Buf(81928), 8);
  EXPECT_EQ(le64toh(v), 12u);
  std::memcpy(&v, B.Buf(90112), 8);
  EXPECT_EQ(le64toh(v), 99u);

  // A bad rkey is the responder's verdict: remote access error, QP in ERR.
  w = Wqe(VSTELLAR_WR_RDMA_WRITE, 0xa7);
  w.u.rdma.remote_addr = kMrGpa;
  w.u.rdma.rkey = B.rkey ^ 0x100;
  A.PostSend(qa, w, {A.Sge(0, 64)});
  ca = A.Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 0xa7u);
  EXPECT_EQ(ca->status, uint8_t(vstellar::WcStatus::REM_ACCESS_ERR));

  // More than a ring's worth of CQEs went by with the phase bit flipping.
  auto s = StatsOf(0);
  EXPECT_GE(s.wqes, 8u);
  EXPECT_EQ(s.bad_wqes, 0u);
}

TEST_F(DataPath, SendRecvWriteReadAtomicsBetweenTwoDevices) { SendRecvWriteReadAtomicsBetweenTwoDevices(); }
TEST_F(DataPathOnTwoThreads, SendRecvWriteReadAtomicsBetweenTwoDevices) { SendRecvWriteReadAtomicsBetweenTwoDevices(); }

TEST_F(DataPath, RingWrapsAndPhaseBitFlips) {
  StartDaemon();
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  // 150 SEND/RECV pairs: more than two passes over the 64-entry rings.
  for (uint32_t i = 0; i < 150; i++) {
    *b_->Buf(0) = 0;
    *a_->Buf(4096) = uint8_t(i + 1);
    b_->PostRecv(qb, 1000 + i, {b_->Sge(0, 64)});
    a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, i), {a_->Sge(4096, 16)});
    auto ca = a_->Poll();
    ASSERT_TRUE(ca) << i;
    EXPECT_EQ(ca->wr_id, i);
    EXPECT_EQ(ca->wqe_idx, uint16_t(i));
    auto cb = b_->Poll();
    ASSERT_TRUE(cb) << i;
    EXPECT_EQ(cb->wr_id, 1000 + i);
    EXPECT_EQ(*b_->Buf(0), uint8_t(i + 1));
  }
}

// Two devices of one guest: QEMU puts both doorbell regions into each
// device's memory table, the other's first. Each device must read and
// write only its own (it used to take the first: contexts of one device
// cleared the other's doorbell pages, and its QPs read the other's).
TEST_F(DataPath, DevicesOfOneGuestEachUseTheirOwnDoorbells) {
  StartDaemon();
  FrontendOptions oa, ob;
  oa.db_region_id = 1;
  oa.doorbell_gpa = 0xfe000000;
  ob.db_region_id = 2;
  ob.doorbell_gpa = 0xfd000000;
  fa_ = std::make_unique<Frontend>(oa);
  fb_ = std::make_unique<Frontend>(ob);
  std::string err;
  ASSERT_TRUE(fa_->Connect(sock_, &err, /*mem_table=*/false)) << err;
  ASSERT_TRUE(fb_->Connect(sock_, &err, /*mem_table=*/false)) << err;
  fa_->AddDoorbellOf(*fb_);
  fb_->AddDoorbellOf(*fa_);
  for (Frontend* f : {fa_.get(), fb_.get()}) {
    ASSERT_TRUE(f->SendMemTable(&err)) << err;
    ASSERT_TRUE(f->StartQueues(&err)) << err;
  }
  a_ = std::make_unique<Guest>(Guest{*fa_});
  b_ = std::make_unique<Guest>(Guest{*fb_});
  a_->Setup();
  b_->Setup();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  for (uint32_t i = 0; i < 20; i++) {
    *b_->Buf(0) = 0;
    *a_->Buf(4096) = uint8_t(i + 1);
    b_->PostRecv(qb, 1000 + i, {b_->Sge(0, 64)});
    a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, i), {a_->Sge(4096, 16)});
    auto ca = a_->Poll();
    ASSERT_TRUE(ca) << i;
    EXPECT_EQ(ca->status, 0u) << i;
    auto cb = b_->Poll();
    ASSERT_TRUE(cb) << i;
    EXPECT_EQ(*b_->Buf(0), uint8_t(i + 1));
  }
  EXPECT_EQ(StatsOf(0).bad_wqes + StatsOf(1).bad_wqes, 0u);
}

TEST_F(DataPath, BadWqesMoveTheQpToErrWithAnErrorCqe) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  struct Case {
    const char* name;
    std::function<void(GQp&)> post;
    uint8_t status;
    uint16_t event;
  };
  const uint32_t other_lkey = b_->lkey;
  std::vector<Case> cases = {
      {"bad opcode", [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_BIND_MW + 1, 0xe0), {A.Sge(0, 8)}); },
       uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR), VSTELLAR_EV_QP_FATAL},
      {"unknown flag", [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xe0, 0x81), {A.Sge(0, 8)}); },
       uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR), VSTELLAR_EV_QP_FATAL},
      {"SGE count above the QP's",
       [&](GQp& q) {
         auto w = Wqe(VSTELLAR_WR_SEND, 0xe0);
         w.num_sge = 5;
         A.PostSend(q, w, {A.Sge(0, 8)});
       },
       uint8_t(vstellar::WcStatus::LOC_LEN_ERR), VSTELLAR_EV_QP_FATAL},
      {"SGE count beyond the slot",
       [&](GQp& q) {
         auto w = Wqe(VSTELLAR_WR_SEND, 0xe0);
         w.num_sge = 255;
         A.PostSend(q, w, {A.Sge(0, 8)});
       },
       uint8_t(vstellar::WcStatus::LOC_LEN_ERR), VSTELLAR_EV_QP_FATAL},
      {"unknown lkey", [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xe0), {{kMrGpa, 8, 0xdead00}}); },
       uint8_t(vstellar::WcStatus::LOC_PROT_ERR), VSTELLAR_EV_QP_ACCESS_ERR},
      {"another device's lkey", [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xe0), {{kMrGpa, 8, other_lkey}}); },
       uint8_t(vstellar::WcStatus::LOC_PROT_ERR), VSTELLAR_EV_QP_ACCESS_ERR},
      {"SGE past the MR's end", [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xe0), {A.Sge(kMrLen - 4, 64)}); },
       uint8_t(vstellar::WcStatus::LOC_PROT_ERR), VSTELLAR_EV_QP_ACCESS_ERR},
      {"SGE wrapping the address space",
       [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xe0), {{~0ull - 4, 64, A.lkey}}); },
       uint8_t(vstellar::WcStatus::LOC_PROT_ERR), VSTELLAR_EV_QP_ACCESS_ERR},
      {"inline above max_inline_data",
       [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xe0), {}, std::vector<uint8_t>(65, 1)); },
       uint8_t(vstellar::WcStatus::LOC_LEN_ERR), VSTELLAR_EV_QP_FATAL},
      {"inline READ",
       [&](GQp& q) { A.PostSend(q, Wqe(VSTELLAR_WR_RDMA_READ, 0xe0), {}, std::vector<uint8_t>(8, 1)); },
       uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR), VSTELLAR_EV_QP_FATAL},
      {"atomic of 16 bytes",
       [&](GQp& q) {
         auto w = Wqe(VSTELLAR_WR_ATOMIC_FETCH_ADD, 0xe0);
         w.u.atomic.remote_addr = 0x1000;
         A.PostSend(q, w, {A.Sge(0, 16)});
       },
       uint8_t(vstellar::WcStatus::LOC_LEN_ERR), VSTELLAR_EV_QP_FATAL},
      {"unaligned atomic",
       [&](GQp& q) {
         auto w = Wqe(VSTELLAR_WR_ATOMIC_CMP_SWP, 0xe0);
         w.u.atomic.remote_addr = 0x1004;
         A.PostSend(q, w, {A.Sge(0, 8)});
       },
       uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR), VSTELLAR_EV_QP_FATAL},
      {"recv with a bad lkey", [&](GQp& q) { A.PostRecv(q, 0xe0, {{kMrGpa, 8, 0xbad}}); },
       uint8_t(vstellar::WcStatus::LOC_PROT_ERR), VSTELLAR_EV_QP_ACCESS_ERR},
      {"recv with too many SGEs", [&](GQp& q) { A.PostRecv(q, 0xe0, {A.Sge(0, 8)}, 3); },
       uint8_t(vstellar::WcStatus::LOC_LEN_ERR), VSTELLAR_EV_QP_FATAL},
  };
  const uint8_t before[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    GQp q = A.CreateQp();
    A.Connect(q, 0x77);  // nobody: nothing is ever sent
    std::memcpy(A.Buf(0), before, 8);
    c.post(q);
    auto e = A.Poll();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->wr_id, 0xe0u);
    EXPECT_EQ(e->status, c.status);
    EXPECT_EQ(e->qpn, q.qpn);
    EXPECT_EQ(A.QpState(q.qpn), VSTELLAR_QPS_ERR);
    EXPECT_TRUE(Has(fa_->Events(1000), c.event, q.qpn));
    // Later WQEs of the QP are flushed, in order.
    A.PostRecv(q, 0xf1, {A.Sge(0, 8)});
    A.PostSend(q, Wqe(VSTELLAR_WR_SEND, 0xf2), {A.Sge(0, 8)});
    auto f1 = A.Poll(), f2 = A.Poll();
    ASSERT_TRUE(f1 && f2);
    EXPECT_EQ(f1->wr_id, 0xf1u);
    EXPECT_EQ(f1->status, uint8_t(vstellar::WcStatus::WR_FLUSH_ERR));
    EXPECT_EQ(f1->opcode, VSTELLAR_WC_RECV);
    EXPECT_EQ(f2->wr_id, 0xf2u);
    EXPECT_EQ(f2->status, uint8_t(vstellar::WcStatus::WR_FLUSH_ERR));
    EXPECT_EQ(std::memcmp(A.Buf(0), before, 8), 0);
    // The QP comes back through RESET; indices restart at 0.
    ASSERT_EQ(A.Modify(q.qpn, VSTELLAR_QP_STATE, VSTELLAR_QPS_RESET), 0);
    q.sq_pi = q.rq_pi = 0;
    A.Connect(q, 0x77);
    A.PostRecv(q, 0xf3, {A.Sge(0, 8)});
    EXPECT_FALSE(A.Poll(50));  // accepted, waiting for a message
    ASSERT_EQ(A.Modify(q.qpn, VSTELLAR_QP_STATE, VSTELLAR_QPS_ERR), 0);
    auto f3 = A.Poll();
    ASSERT_TRUE(f3);
    EXPECT_EQ(f3->wr_id, 0xf3u);
    EXPECT_EQ(f3->status, uint8_t(vstellar::WcStatus::WR_FLUSH_ERR));
    vstellar_cmd_handle h{q.qpn, 0};
    ASSERT_EQ(A.Cmd(VSTELLAR_CMD_DESTROY_QP, &h, sizeof(h), 0).status(), 0);
    A.nqp--;
  }
  EXPECT_EQ(StatsOf(0).bad_wqes, cases.size());
  EXPECT_FALSE(StatsOf(0).fatal);
}

TEST_F(DataPath, ProducerIndexBeyondTheRingStopsOnlyThatQp) {
  StartDaemon();
  TwoGuests();
  GQp bad = a_->CreateQp(), qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(bad, 0x77);
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  bad.sq_pi = 1000;  // the ring has 64 slots
  a_->Ring(VSTELLAR_DB_SLOT_SIZE * bad.slot + offsetof(vstellar_db_qp, sq_pi), bad.sq_pi);
  EXPECT_TRUE(Has(fa_->Events(2000), VSTELLAR_EV_QP_FATAL, bad.qpn));
  EXPECT_EQ(a_->QpState(bad.qpn), VSTELLAR_QPS_ERR);
  EXPECT_FALSE(a_->Poll(20));  // nothing was fetched, nothing completes
  // Same for the RQ, on the healthy device B's side of things, with a
  // wrapped-around index.
  GQp bad_b = b_->CreateQp();
  b_->Connect(bad_b, 0x77);
  b_->Ring(VSTELLAR_DB_SLOT_SIZE * bad_b.slot + offsetof(vstellar_db_qp, rq_pi), 0xffffffffu);
  EXPECT_TRUE(Has(fb_->Events(2000), VSTELLAR_EV_QP_FATAL, bad_b.qpn));
  // The other QPs work.
  b_->PostRecv(qb, 1, {b_->Sge(0, 64)});
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 2), {a_->Sge(0, 64)});
  auto ca = a_->Poll(), cb = b_->Poll();
  ASSERT_TRUE(ca && cb);
  EXPECT_EQ(ca->status, 0);
  EXPECT_EQ(cb->status, 0);
  EXPECT_FALSE(StatsOf(0).fatal);
}

// Issue 24 #1: a peer that fails many of a guest's connections at once
// (one bad-rkey WRITE each) raised more QP errors than the driver had event
// buffers and the device queue had room for, and the next one made the
// whole device FATAL, so the guest's connection to a third guest died too.
// Each QP's event now waits its turn; the device and its other QPs go on.
TEST_F(DataPath, PeerFailingManyQpsAtOnceDoesNotMakeTheDeviceFatal) {
  StartDaemon();
  TwoGuests();  // a_ attacks b_
  Guest& A = *a_;
  Guest& B = *b_;
  auto fc = std::make_unique<Frontend>();
  std::string err;
  ASSERT_TRUE(fc->Connect(sock_, &err)) << err;
  ASSERT_TRUE(fc->StartQueues(&err)) << err;
  Guest C{*fc};
  C.Setup();
  GQp bc = B.CreateQp(), cb = C.CreateQp();
  B.Connect(bc, cb.qpn);
  C.Connect(cb, bc.qpn);
  // The test driver has 8 event buffers; the device used to hold 64 more.
  constexpr int kQps = 100;
  ASSERT_EQ(A.ResizeCq(0x3c0000, 8).status(), 0);  // room for every error CQE
  std::vector<GQp> qa, qb;
  for (int i = 0; i < kQps; i++) {
    qa.push_back(A.CreateQp());
    qb.push_back(B.CreateQp());
  }
  for (int i = 0; i < kQps; i++) {
    A.Connect(qa[i], qb[i].qpn);
    B.Connect(qb[i], qa[i].qpn);
  }
  for (int i = 0; i < kQps; i++) {
    auto w = Wqe(VSTELLAR_WR_RDMA_WRITE, i);
    w.u.rdma.remote_addr = kMrGpa;
    w.u.rdma.rkey = B.rkey ^ 0x100;
    A.PostSend(qa[i], w, {A.Sge(0, 64)});
  }
  for (int i = 0; i < kQps; i++) {
    auto e = A.Poll();
    ASSERT_TRUE(e) << i;
    EXPECT_EQ(e->status, uint8_t(vstellar::WcStatus::REM_ACCESS_ERR));
  }
  for (int i = 0; i < kQps; i++) EXPECT_EQ(B.QpState(qb[i].qpn), VSTELLAR_QPS_ERR);
  EXPECT_FALSE(StatsOf(1).fatal);
  EXPECT_FALSE(StatsOf(0).fatal);
  EXPECT_EQ(StatsOf(1).events_dropped, 0u);
  // The victim's other connection works.
  EXPECT_EQ(B.QpState(bc.qpn), VSTELLAR_QPS_RTS);
  C.PostRecv(cb, 1, {C.Sge(0, 64)});
  B.PostSend(bc, Wqe(VSTELLAR_WR_SEND, 2), {B.Sge(0, 64)});
  auto sb = B.Poll(), rc = C.Poll();
  ASSERT_TRUE(sb && rc);
  EXPECT_EQ(sb->status, 0);
  EXPECT_EQ(rc->status, 0);
  // Every failed QP's event reaches the driver once buffers come back.
  // The driver has 8 buffers, and each call takes what is there now (often
  // one event): the wait is bounded by time, not by calls.
  std::set<uint32_t> told;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (told.size() < size_t(kQps) && std::chrono::steady_clock::now() < until)
    for (const vstellar_event& e : fb_->Events(100))
      if (le16toh(e.type) == VSTELLAR_EV_QP_ACCESS_ERR) told.insert(le32toh(e.object));
  for (int i = 0; i < kQps; i++) EXPECT_TRUE(told.count(qb[i].qpn)) << i;
  EXPECT_NE(d_->StatsJson().find("\"events_dropped\":0"), std::string::npos);
}

// Issue 13 #1: the doorbell scan took every WQE a QP announced before it
// looked at the next QP (up to 1,024 QPs x 4,096 WQEs in one loop turn).
// Now each queue gives at most --wqe-budget WQEs per turn and the scan
// goes round robin: a QP with one WQE is served after at most one budget's
// worth of a full QP's, and the full QP's rest follows in later turns.
TEST_F(DataPath, FullQueueGetsOnlyItsBudgetPerTurn) {
  constexpr uint32_t kBudget = 4;
  std::mutex mu;
  std::vector<uint32_t> order;  // QPN of each receive WQE fetched
  StartDaemon(
      50,
      [&](Daemon& d) {
        d.SetAfterWqeCopyHook([&](unsigned, uint32_t qpn, bool send, uint32_t) {
          std::lock_guard<std::mutex> g(mu);
          if (!send) order.push_back(qpn);
        });
      },
      [&](DaemonOptions& o) { o.wqe_budget_queue = kBudget; });
  TwoGuests();
  GQp x = a_->CreateQp(), y = a_->CreateQp();
  GQp& full = x.qpn < y.qpn ? x : y;  // scanned first
  GQp& one = x.qpn < y.qpn ? y : x;
  ASSERT_EQ(a_->Modify(full.qpn, kInitMask, VSTELLAR_QPS_INIT), 0);
  ASSERT_EQ(a_->Modify(one.qpn, kInitMask, VSTELLAR_QPS_INIT), 0);
  // Let the data path go idle, so it sees both doorbells in one scan.
  for (int i = 0; i < 5000 && !a_->NeedKick(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(a_->NeedKick());
  auto write_recv = [&](GQp& q) {
    vstellar_recv_wqe w{};
    w.wr_id = q.rq_pi;
    w.num_sge = 1;
    const vstellar_sge s = a_->Sge(0, 64);
    std::memcpy(a_->RqSlot(q, q.rq_pi), &w, sizeof(w));
    std::memcpy(a_->RqSlot(q, q.rq_pi) + sizeof(w), &s, sizeof(s));
    q.rq_pi++;
  };
  for (uint32_t i = 0; i < (1u << kRqLog); i++) write_recv(full);
  write_recv(one);
  a_->Ring(VSTELLAR_DB_SLOT_SIZE * full.slot + offsetof(vstellar_db_qp, rq_pi), full.rq_pi, false);
  a_->Ring(VSTELLAR_DB_SLOT_SIZE * one.slot + offsetof(vstellar_db_qp, rq_pi), one.rq_pi, false);
  fa_->Kick(VSTELLAR_VQ_KICK);
  for (int i = 0; i < 5000; i++) {
    {
      std::lock_guard<std::mutex> g(mu);
      if (order.size() == (1u << kRqLog) + 1) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::lock_guard<std::mutex> g(mu);
  ASSERT_EQ(order.size(), (1u << kRqLog) + 1);  // nothing is lost: the rest came in later turns
  const size_t before_one = size_t(std::find(order.begin(), order.end(), one.qpn) - order.begin());
  EXPECT_LE(before_one, kBudget) << "the full QP gave " << before_one << " WQEs before the other QP got a turn";
}

TEST_F(DataPath, WqeRewrittenAfterTheDoorbellIsNotReadTwice) {
  std::atomic<uint8_t*> slot{nullptr};
  StartDaemon(50, [&](Daemon& d) {
    d.SetAfterWqeCopyHook([&](unsigned, uint32_t, bool send, uint32_t) {
      uint8_t* p = slot.load();
      if (!send || !p) return;
      // The guest rewrites the WQE it already rang for: opcode, SGE count,
      // lkey, length, address all turn hostile.
      vstellar_send_wqe w{};
      w.wr_id = 0xbad;
      w.opcode = 0xee;
      w.num_sge = 200;
      std::memcpy(p, &w, sizeof(w));
      vstellar_sge s{~0ull - 100, 1u << 30, 0xdead};
      std::memcpy(p + 64, &s, sizeof(s));
    });
  });
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  Fill(a_->Buf(0), 64, 42);
  std::memset(b_->Buf(0), 0, 256);
  b_->PostRecv(qb, 7, {b_->Sge(0, 256)});
  slot = a_->SqSlot(qa, qa.sq_pi);
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0x600d), {a_->Sge(0, 64)});
  auto ca = a_->Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 0x600du);
  EXPECT_EQ(ca->status, 0);
  auto cb = b_->Poll();
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->byte_len, 64u);
  EXPECT_EQ(std::memcmp(a_->Buf(0), b_->Buf(0), 64), 0);
  EXPECT_EQ(StatsOf(0).bad_wqes, 0u);
}

TEST_F(DataPath, NeedKickIsSetWhenIdleAndClearedWhilePolling) {
  StartDaemon(300'000);  // poll 300 ms after the last work
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  // A fresh context starts with need_kick set; after the modify commands
  // the device polls, then goes idle again and sets it.
  auto wait_kick = [&](Guest& g, uint32_t want) {
    for (int i = 0; i < 200 && g.NeedKick() != want; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return g.NeedKick() == want;
  };
  ASSERT_TRUE(wait_kick(*a_, 1));
  ASSERT_TRUE(wait_kick(*b_, 1));
  // ... and alive set, the word a provider reads as 0 once the device is gone
  EXPECT_EQ(le32toh(a_->DbWord(offsetof(vstellar_db_page_hdr, alive)).load()), VSTELLAR_DB_ALIVE);
  EXPECT_FALSE(StatsOf(0).polling);
  const uint64_t idle0 = StatsOf(0).idle_entries;
  EXPECT_GE(idle0, 1u);

  // Idle, once the look after going idle is over (DataPath::Recheck): a
  // doorbell without a kick is not seen (nobody polls).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  b_->PostRecv(qb, 1, {b_->Sge(0, 64)});
  const uint64_t wqes = StatsOf(0).wqes;
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 2), {a_->Sge(0, 64)}, {}, /*kick=*/false);
  EXPECT_FALSE(a_->Poll(100));
  EXPECT_EQ(StatsOf(0).wqes, wqes);
  EXPECT_EQ(a_->NeedKick(), 1u);
  // The kick wakes it: the WQE runs, need_kick is cleared while it polls.
  fa_->Kick(VSTELLAR_VQ_KICK);
  auto ca = a_->Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 2u);
  EXPECT_EQ(a_->NeedKick(), 0u);
  EXPECT_TRUE(StatsOf(0).polling);
  EXPECT_GE(StatsOf(0).db_kicks, 1u);
  // While it polls, the provider sees need_kick == 0 and does not kick.
  b_->PostRecv(qb, 3, {b_->Sge(0, 64)});
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 4), {a_->Sge(0, 64)});
  ca = a_->Poll();
  ASSERT_TRUE(ca);
  EXPECT_EQ(ca->wr_id, 4u);
  // Then it goes idle again.
  ASSERT_TRUE(wait_kick(*a_, 1));
  EXPECT_GT(StatsOf(0).idle_entries, idle0);
  EXPECT_FALSE(StatsOf(0).polling);
}

// A provider whose memory barrier did not hold (a TCG guest with one vCPU
// drops mfence) can publish a producer index and read need_kick as 0 just
// as the device goes idle: both miss each other, and the WQE would wait
// for ever. The one look after going idle finds it, counts it and polls.
TEST_F(DataPath, AWqeWithoutItsKickAtTheIdleMomentIsFoundByTheRecheck) {
  StartDaemon(50, {}, [](DaemonOptions& o) { o.idle_recheck_us = 200'000; });
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  auto idle = [&](Guest& g) {
    for (int i = 0; i < 200 && (g.NeedKick() != 1 || StatsOf(&g == a_.get() ? 0 : 1).polling); i++)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return g.NeedKick() == 1;
  };
  ASSERT_TRUE(idle(*b_));
  b_->PostRecv(qb, 1, {b_->Sge(0, 64)});  // kicked
  ASSERT_TRUE(idle(*a_));
  EXPECT_EQ(StatsOf(0).missed_kicks, 0u);
  // Just gone idle: a WQE whose kick is missing.
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 2), {a_->Sge(0, 64)}, {}, /*kick=*/false);
  auto ca = a_->Poll(2000);
  ASSERT_TRUE(ca) << "the WQE published without its kick was never fetched";
  EXPECT_EQ(ca->wr_id, 2u);
  EXPECT_EQ(StatsOf(0).missed_kicks, 1u);
}

// With connected QPs and nothing to do, the daemon sleeps: datagrams wake
// it through the UDP link's eventfd and timers through the epoll timeout,
// so there is no periodic tick (it used to wake every millisecond).
size_t OpenFds() {
  size_t n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += !e.path().empty();
  return n;
}

uint64_t MemoryUsed(Daemon& d) {  // "memory":{"limit":..,"device_limit":..,"used":N
  const std::string j = d.StatsJson();
  const size_t at = j.find("\"used\":", j.find("\"memory\":{\"limit\""));
  return at == std::string::npos ? ~0ull : std::stoull(j.substr(at + 7));
}

// Device scale (issue 16): 64 devices on one daemon, each with a context,
// PD, CQ, MR and an RC QP connected to its neighbour's; every pair moves a
// SEND and a WRITE; then the frontends go away. Twice: after each round the
// daemon holds no device, no accounted memory, and the process no more
// file descriptors than before the round (kick/call eventfds, memfds,
// sockets and the mappings behind them are all released).
void DataPath::ManyDevicesAttachMoveDataAndDetachLeavingNothing() {
  StartDaemon();
  constexpr int kDevices = 64;
  for (int round = 0; round < 2; round++) {
    SCOPED_TRACE(round);
    const size_t fds_before = OpenFds();
    std::vector<std::unique_ptr<Frontend>> fs;
    std::vector<std::unique_ptr<Guest>> gs;
    std::vector<GQp> qs;
    for (int i = 0; i < kDevices; i++) {
      FrontendOptions fo;
      fo.mem_size = 8ull << 20;
      fs.push_back(std::make_unique<Frontend>(fo));
      std::string err;
      ASSERT_TRUE(fs.back()->Connect(sock_, &err)) << i << ": " << err;
      ASSERT_TRUE(fs.back()->StartQueues(&err)) << i << ": " << err;
      gs.push_back(std::make_unique<Guest>(Guest{*fs.back()}));
      gs.back()->Setup();
      qs.push_back(gs.back()->CreateQp());
    }
    ASSERT_EQ(d_->Stats().size(), size_t(kDevices));
    EXPECT_GT(MemoryUsed(*d_), 0u);
    // Spread evenly over the workers, each QP on its device's worker.
    unsigned first = ~0u;
    for (const DeviceStats& st : d_->Stats()) first = std::min(first, st.id);
    for (int i = 0; i < kDevices; i++) {
      EXPECT_EQ(d_->WorkerOf(first + unsigned(i)), int(unsigned(i) % threads_)) << i;
      EXPECT_EQ(qs[i].qpn % threads_, unsigned(i) % threads_) << i;
    }
    for (int i = 0; i < kDevices; i += 2) {
      gs[i]->Connect(qs[i], qs[i + 1].qpn);
      gs[i + 1]->Connect(qs[i + 1], qs[i].qpn);
    }
    // Every even device SENDs 3000 bytes to its odd neighbour and WRITEs
    // 5000 bytes into it; all pairs at once.
    for (int i = 0; i < kDevices; i += 2) {
      Fill(gs[i]->Buf(0), 8192, uint8_t(i));
      std::memset(gs[i + 1]->Buf(0), 0, 16384);
      gs[i + 1]->PostRecv(qs[i + 1], 7, {gs[i + 1]->Sge(0, 4096)});
      gs[i]->PostSend(qs[i], Wqe(VSTELLAR_WR_SEND, 1), {gs[i]->Sge(0, 3000)});
      vstellar_send_wqe w = Wqe(VSTELLAR_WR_RDMA_WRITE, 2);
      w.u.rdma.remote_addr = kMrGpa + 8192;
      w.u.rdma.rkey = gs[i + 1]->rkey;
      gs[i]->PostSend(qs[i], w, {gs[i]->Sge(0, 5000)});
    }
    for (int i = 0; i < kDevices; i += 2) {
      for (uint64_t id : {1, 2}) {
        auto c = gs[i]->Poll();
        ASSERT_TRUE(c) << i;
        EXPECT_EQ(c->wr_id, id);
        EXPECT_EQ(c->status, 0);
      }
      auto r = gs[i + 1]->Poll();
      ASSERT_TRUE(r) << i + 1;
      EXPECT_EQ(r->wr_id, 7u);
      EXPECT_EQ(r->byte_len, 3000u);
      EXPECT_EQ(std::memcmp(gs[i + 1]->Buf(0), gs[i]->Buf(0), 3000), 0) << i;
      EXPECT_EQ(std::memcmp(gs[i + 1]->Buf(8192), gs[i]->Buf(0), 5000), 0) << i;
    }
    gs.clear();
    fs.clear();  // the connections close: the daemon destroys the devices
    for (int i = 0; i < 500 && !d_->Stats().empty(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(d_->Stats().empty());
    EXPECT_EQ(MemoryUsed(*d_), 0u);
    EXPECT_EQ(OpenFds(), fds_before);
  }
}

TEST_F(DataPath, ManyDevicesAttachMoveDataAndDetachLeavingNothing) { ManyDevicesAttachMoveDataAndDetachLeavingNothing(); }
TEST_F(DataPathOnTwoThreads, ManyDevicesAttachMoveDataAndDetachLeavingNothing) { ManyDevicesAttachMoveDataAndDetachLeavingNothing(); }

// Two QP pairs (four devices) moving data at once: WRITE, SEND and READ of
// several packets each. One worker thread and two (where each pair talks
// across the threads and every QPN names its worker) give the same
// completions and the same bytes.
std::vector<uint64_t> DataPath::TwoQpPairsRun() {
  std::vector<uint64_t> out;
  std::vector<std::unique_ptr<Frontend>> fs;
  std::vector<std::unique_ptr<Guest>> gs;
  std::vector<GQp> qs;
  for (int i = 0; i < 4; i++) {
    fs.push_back(std::make_unique<Frontend>());
    std::string err;
    EXPECT_TRUE(fs.back()->Connect(sock_, &err)) << err;
    EXPECT_TRUE(fs.back()->StartQueues(&err)) << err;
    gs.push_back(std::make_unique<Guest>(Guest{*fs.back()}));
    gs.back()->Setup();
    qs.push_back(gs.back()->CreateQp());
  }
  unsigned first = ~0u;
  for (const DeviceStats& st : d_->Stats()) first = std::min(first, st.id);
  for (int i = 0; i < 4; i++) {
    // Devices alternate between the workers; a QP's number names its own.
    EXPECT_EQ(d_->WorkerOf(first + unsigned(i)), int(unsigned(i) % threads_)) << i;
    EXPECT_EQ(qs[i].qpn % threads_, unsigned(i) % threads_) << i;
  }
  for (int i = 0; i < 4; i += 2) {
    gs[i]->Connect(qs[i], qs[i + 1].qpn);
    gs[i + 1]->Connect(qs[i + 1], qs[i].qpn);
  }
  for (int i = 0; i < 4; i += 2) {
    Guest& a = *gs[i];
    Guest& b = *gs[i + 1];
    Fill(a.Buf(0), 65536, uint8_t(i + 1));
    std::memset(b.Buf(0), 0, kMrLen);
    b.PostRecv(qs[i + 1], 7, {b.Sge(65536, 16384)});
    vstellar_send_wqe w = Wqe(VSTELLAR_WR_RDMA_WRITE, 1);
    w.u.rdma.remote_addr = kMrGpa;
    w.u.rdma.rkey = b.rkey;
    a.PostSend(qs[i], w, {a.Sge(0, 49152)});
    a.PostSend(qs[i], Wqe(VSTELLAR_WR_SEND, 2), {a.Sge(4096, 12000)});
    w = Wqe(VSTELLAR_WR_RDMA_READ, 3);
    w.u.rdma.remote_addr = kMrGpa + 1000;
    w.u.rdma.rkey = a.rkey;
    b.PostSend(qs[i + 1], w, {b.Sge(98304, 30000)});
  }
  for (int i = 0; i < 4; i++) {
    // Even: WRITE, SEND (in order); odd: RECV and READ, in either order
    // (two queues).
    std::vector<std::array<uint64_t, 4>> cs;
    for (int k = 0; k < 2; k++) {
      auto c = gs[i]->Poll();
      EXPECT_TRUE(c) << i;
      if (!c) return out;
      cs.push_back({uint64_t(c->wr_id), uint64_t(c->status), uint64_t(c->opcode), uint64_t(c->byte_len)});
    }
    std::sort(cs.begin(), cs.end());
    for (auto& c : cs) out.insert(out.end(), c.begin(), c.end());
  }
  for (int i = 0; i < 4; i++) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the whole MR
    for (uint64_t k = 0; k < kMrLen; k++) h = (h ^ gs[i]->Buf(0)[k]) * 1099511628211ull;
    out.push_back(h);
  }
  for (int i = 0; i < 4; i += 2) {
    EXPECT_EQ(std::memcmp(gs[i + 1]->Buf(0), gs[i]->Buf(0), 49152), 0) << i;
    EXPECT_EQ(std::memcmp(gs[i + 1]->Buf(65536), gs[i]->Buf(4096), 12000), 0) << i;
    EXPECT_EQ(std::memcmp(gs[i + 1]->Buf(98304), gs[i]->Buf(1000), 30000), 0) << i;
  }
  return out;
}

TEST_F(DataPath, TwoQpPairsGiveTheSameResultsOnOneAndTwoThreads) {
  std::vector<uint64_t> results[2];
  for (unsigned t : {1u, 2u}) {
    SCOPED_TRACE(t);
    threads_ = t;
    StartDaemon();
    results[t - 1] = TwoQpPairsRun();
    TearDown();
    d_.reset();
    sock_.clear();
    dir_.clear();
  }
  EXPECT_EQ(results[0].size(), 4u * 2 * 4 + 4);
  EXPECT_EQ(results[0], results[1]);
}

// A daemon with two workers and one with one, on two ports of one host:
// each sends to the other's one base port (--peer-port) as always, and the
// two-worker daemon's kernel steering finds the QP's worker. Pairs: device
// k of one with device k of the other (k = 0, 1: both workers).
TEST_F(DataPath, DaemonsWithOneAndTwoThreadsInteroperate) {
  const uint16_t pa = uint16_t(20000 + (getpid() * 37 + 17) % 29000), pb = uint16_t(pa + 600);
  threads_ = 2;
  StartDaemon(50, {}, [&](DaemonOptions& o) {
    o.udp_port = pa;
    o.peer_port = pb;
  });
  DaemonOptions ob;
  ob.socket = dir_ + "/b";
  ob.udp_port = pb;
  ob.peer_port = pa;
  ob.paths = 4;
  auto bp = std::make_unique<Daemon>(ob);
  Daemon& b = *bp;
  std::promise<std::string> started;
  auto fut = started.get_future();
  std::promise<void> release;
  std::thread tb([&, released = release.get_future()] {
    // Start(), Run() and the destructor on the daemon's own thread (its
    // io_uring is single-issuer).
    std::string err;
    const bool ok = b.Start(&err);
    started.set_value(ok ? "" : err);
    if (ok) {
      b.Run();
      released.wait();
    }
    bp.reset();
  });
  const std::string err = fut.get();
  if (!err.empty()) {
    tb.join();
    FAIL() << err;
  }
  std::vector<std::unique_ptr<Frontend>> fs;
  std::vector<std::unique_ptr<Guest>> gs;
  std::vector<GQp> qs;
  for (const std::string& sock : {sock_, sock_, ob.socket, ob.socket}) {  // A0, A1, B0, B1
    fs.push_back(std::make_unique<Frontend>());
    std::string e;
    ASSERT_TRUE(fs.back()->Connect(sock, &e)) << e;
    ASSERT_TRUE(fs.back()->StartQueues(&e)) << e;
    gs.push_back(std::make_unique<Guest>(Guest{*fs.back()}));
    gs.back()->Setup();
    qs.push_back(gs.back()->CreateQp());
  }
  EXPECT_NE(qs[0].qpn % 2, qs[1].qpn % 2);  // one QP on each worker of A
  for (int k = 0; k < 2; k++) {
    gs[k]->Connect(qs[k], qs[k + 2].qpn);
    gs[k + 2]->Connect(qs[k + 2], qs[k].qpn);
  }
  for (int k = 0; k < 2; k++) {
    Guest& a = *gs[k];
    Guest& bg = *gs[k + 2];
    Fill(a.Buf(0), 40000, uint8_t(3 + k));
    Fill(bg.Buf(65536), 30000, uint8_t(9 + k));
    vstellar_send_wqe w = Wqe(VSTELLAR_WR_RDMA_WRITE, 1);
    w.u.rdma.remote_addr = kMrGpa;
    w.u.rdma.rkey = bg.rkey;
    a.PostSend(qs[k], w, {a.Sge(0, 40000)});  // A -> B
    w = Wqe(VSTELLAR_WR_RDMA_WRITE, 2);
    w.u.rdma.remote_addr = kMrGpa + 65536;
    w.u.rdma.rkey = a.rkey;
    bg.PostSend(qs[k + 2], w, {bg.Sge(65536, 30000)});  // B -> A
  }
  for (int k = 0; k < 4; k++) {
    auto c = gs[k]->Poll();
    ASSERT_TRUE(c) << k;
    EXPECT_EQ(c->status, 0) << k;
  }
  for (int k = 0; k < 2; k++) {
    EXPECT_EQ(std::memcmp(gs[k + 2]->Buf(0), gs[k]->Buf(0), 40000), 0) << k;
    EXPECT_EQ(std::memcmp(gs[k]->Buf(65536), gs[k + 2]->Buf(65536), 30000), 0) << k;
  }
  gs.clear();
  fs.clear();
  b.Stop();
  release.set_value();
  tb.join();
  unlink(ob.socket.c_str());
}

// Per-device object limits (--device-max): the device reports them and
// enforces them with LIMIT; the next device has its own; a limit above the
// device's own maximum is refused at start.
TEST_F(DataPath, DeviceMaxLimitsObjectsPerDevice) {
  StartDaemon(50, {}, [](DaemonOptions& o) {
    o.device_max.qp = 2;
    o.device_max.cq = 1;
  });
  TwoGuests();  // one CQ each
  CmdResult r = fa_->Command(VSTELLAR_CMD_QUERY_DEVICE, 0, nullptr, 0, sizeof(vstellar_resp_query_device));
  ASSERT_EQ(r.status(), 0);
  EXPECT_EQ(As<vstellar_resp_query_device>(r).max_qp, 2u);
  EXPECT_EQ(As<vstellar_resp_query_device>(r).max_cq, 1u);
  for (Guest* g : {a_.get(), b_.get()}) {
    g->CreateQp();
    g->CreateQp();
    uint16_t st = 0;
    g->CreateQp(4, VSTELLAR_QPT_RC, &st);
    EXPECT_EQ(st, VSTELLAR_STATUS_LIMIT);
    vstellar_cmd_create_cq c{};
    c.log_cqe = kLogCqe;
    c.page_shift = 12;
    c.num_pages = 1;
    auto body = WithPages(&c, sizeof(c), {kCqGpa + 0x1000});
    EXPECT_EQ(g->Cmd(VSTELLAR_CMD_CREATE_CQ, body.data(), body.size(), 8).status(), VSTELLAR_STATUS_LIMIT);
  }
  DaemonOptions o;
  o.socket = dir_ + "/t";
  o.device_max.qp = 1025;
  Daemon d(o);
  std::string err;
  EXPECT_FALSE(d.Start(&err));
  EXPECT_NE(err.find("qp=1025"), std::string::npos) << err;
}

void DataPath::IdleDaemonWithQpsSleeps() {
  StartDaemon();
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  b_->PostRecv(qb, 1, {b_->Sge(0, 64)});
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 2), {a_->Sge(0, 64)});
  ASSERT_TRUE(a_->Poll());
  ASSERT_TRUE(b_->Poll());
  // Let the delayed ACKs and the doorbell polling run out.
  for (int i = 0; i < 100 && (StatsOf(0).polling || StatsOf(1).polling); i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const uint64_t w0 = d_->wakeups();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(d_->wakeups() - w0, 10u);
  // And it still answers at once when work comes.
  b_->PostRecv(qb, 3, {b_->Sge(0, 64)});
  a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, 4), {a_->Sge(0, 64)});
  auto c = a_->Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
}

TEST_F(DataPath, IdleDaemonWithQpsSleeps) { IdleDaemonWithQpsSleeps(); }
TEST_F(DataPathOnTwoThreads, IdleDaemonWithQpsSleeps) { IdleDaemonWithQpsSleeps(); }

TEST_F(DataPath, FullCqRaisesCqErr) {
  StartDaemon();
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  // 64 receives fill B's 64-entry CQ if B never polls; the 65th is lost
  // and the CQ is in error.
  for (uint32_t round = 0; round < 65; round++) {
    b_->PostRecv(qb, round, {b_->Sge(0, 64)});
    a_->PostSend(qa, Wqe(VSTELLAR_WR_SEND, round), {a_->Sge(0, 8)});
    ASSERT_TRUE(a_->Poll()) << round;
  }
  std::vector<vstellar_event> ev;
  for (int i = 0; i < 20 && !Has(ev, VSTELLAR_EV_CQ_ERR, b_->cq); i++) {
    auto more = fb_->Events(100);
    ev.insert(ev.end(), more.begin(), more.end());
  }
  EXPECT_TRUE(Has(ev, VSTELLAR_EV_CQ_ERR, b_->cq));
  EXPECT_EQ(StatsOf(1).cq_overflows, 1u);
  EXPECT_EQ(StatsOf(1).cqes, 64u);
}


// rdma_cm's path: the kernel's GSI QP (QP 1) and kernel UD QPs, on the
// device that holds the daemon's address and on one that holds none, with
// kernel doorbell pages and SGEs with the local DMA lkey. QP 1 is found by
// destination GID; receives start with the GRH area.
void DataPath::KernelGsiAndUdQpsExchangeDatagrams() {
  StartDaemon();
  TwoDevices();
  Guest& A = *a_;
  Guest& B = *b_;
  A.SetupKernel(1);
  // B's kernel has no address: the daemon's one (127.0.0.1) is A's.
  B.SetupKernel(0);
  // The kernel page is given once; user contexts cannot ask for it.
  EXPECT_EQ(A.f.Command(VSTELLAR_CMD_KERNEL_DB, 0, nullptr, 0, 8).status(), VSTELLAR_STATUS_BUSY);

  uint16_t st = 0;
  GQp gsi = A.CreateQp(2, VSTELLAR_QPT_GSI, &st);
  ASSERT_EQ(st, 0);
  A.CreateQp(2, VSTELLAR_QPT_GSI, &st);
  EXPECT_EQ(st, VSTELLAR_STATUS_LIMIT);  // one QP 1 per device
  GQp ud = A.CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  GQp udb = B.CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  ASSERT_EQ(A.ToRtsUd(gsi.qpn, true, VSTELLAR_GSI_QKEY), 0);
  // A kernel QP may hold a controlled Q_Key (high bit set), as QP 1 does.
  ASSERT_EQ(A.ToRtsUd(ud.qpn, false, VSTELLAR_GSI_QKEY), 0);
  ASSERT_EQ(B.ToRtsUd(udb.qpn, false, VSTELLAR_GSI_QKEY), 0);

  // UD QP -> QP 1 of 127.0.0.1: a 256-byte "MAD" from guest-physical memory.
  constexpr uint64_t kMad = 0x8000;  // offset of the sent MAD in the MR
  Fill(A.Buf(kMad), 256, 3);
  std::memset(A.Buf(0), 0, 1024);
  A.PostRecv(gsi, 0x61, {vstellar_sge{kMrGpa, 512, VSTELLAR_LOCAL_DMA_LKEY}});
  A.PostSend(ud, UdWqe(0x51, 1, VSTELLAR_GSI_QPN, 0x1234), {vstellar_sge{kMrGpa + kMad, 256, VSTELLAR_LOCAL_DMA_LKEY}});
  auto sc = A.Poll();
  ASSERT_TRUE(sc);
  EXPECT_EQ(sc->status, 0);
  EXPECT_EQ(le64toh(sc->wr_id), 0x51u);
  // QP 1 wants Q_Key 0x80010000, so nothing arrives. Then with "the QP's
  // own Q_Key" (high bit set in the WQE), which is that one.
  EXPECT_FALSE(A.Poll(300));
  A.PostSend(ud, UdWqe(0x52, 1, VSTELLAR_GSI_QPN, 0x80000000u), {vstellar_sge{kMrGpa + kMad, 256, VSTELLAR_LOCAL_DMA_LKEY}});
  std::optional<vstellar_cqe> rc;
  for (int i = 0; i < 2; i++) {  // the send's and the receive's, in either order
    auto c = A.Poll();
    ASSERT_TRUE(c);
    if (c->opcode == VSTELLAR_WC_RECV) rc = c;
  }
  ASSERT_TRUE(rc);
  // Two workers: the MAD for QP 1 was steered to worker 1 (1 % 2) and
  // passed on to worker 0, whose device A holds the address.
  if (threads_ > 1) {
    EXPECT_GT(d_->forwarded(), 0u);
  }
  EXPECT_EQ(rc->status, 0);
  EXPECT_EQ(le64toh(rc->wr_id), 0x61u);
  EXPECT_EQ(le32toh(rc->qpn), gsi.qpn);
  EXPECT_EQ(le32toh(rc->src_qp), ud.qpn);
  EXPECT_EQ(le32toh(rc->byte_len), uint32_t(VSTELLAR_GRH_BYTES + 256));
  EXPECT_TRUE(rc->wc_flags & VSTELLAR_CQE_GRH);
  EXPECT_TRUE(rc->wc_flags & VSTELLAR_CQE_GRH_IPV4) << "IPv4 GIDs: the GRH area holds an IPv4 header";
  EXPECT_EQ(A.Buf(0)[20], 0x45);  // the IPv4 header of a RoCEv2 receive
  EXPECT_EQ(std::memcmp(A.Buf(VSTELLAR_GRH_BYTES), A.Buf(kMad), 256), 0);

  // QP 1 answers from QP 1, to another device's UD QP (receiving takes no
  // address).
  Fill(A.Buf(2048), 100, 9);
  Fetched(1, [&] { B.PostRecv(udb, 0x62, {vstellar_sge{kMrGpa + 4096, 512, VSTELLAR_LOCAL_DMA_LKEY}}); });
  A.PostSend(gsi, UdWqe(0x71, 1, udb.qpn, VSTELLAR_GSI_QKEY), {vstellar_sge{kMrGpa + 2048, 100, VSTELLAR_LOCAL_DMA_LKEY}});
  ASSERT_TRUE(A.Poll());
  rc = B.Poll();
  ASSERT_TRUE(rc);
  EXPECT_EQ(rc->status, 0);
  EXPECT_EQ(le32toh(rc->src_qp), uint32_t(VSTELLAR_GSI_QPN));
  EXPECT_EQ(std::memcmp(B.Buf(4096 + VSTELLAR_GRH_BYTES), A.Buf(2048), 100), 0);

  // Hostile WQEs fail their QP only: a source GID the device does not
  // have (B has none; A none at index 7), then (on a fresh QP) a datagram
  // larger than one packet.
  B.PostSend(udb, UdWqe(0x73, 1, VSTELLAR_GSI_QPN, VSTELLAR_GSI_QKEY), {vstellar_sge{kMrGpa, 16, VSTELLAR_LOCAL_DMA_LKEY}});
  auto bad = B.Poll();
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR));
  A.PostSend(gsi, UdWqe(0x72, 1, ud.qpn, VSTELLAR_GSI_QKEY, 7), {vstellar_sge{kMrGpa, 16, VSTELLAR_LOCAL_DMA_LKEY}});
  bad = A.Poll();
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR));
  EXPECT_EQ(A.QpState(ud.qpn), VSTELLAR_QPS_RTS);
  GQp ud2 = A.CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  ASSERT_EQ(A.ToRtsUd(ud2.qpn, false, 0x1234), 0);
  A.PostSend(ud2, UdWqe(0x53, 1, VSTELLAR_GSI_QPN, VSTELLAR_GSI_QKEY), {vstellar_sge{kMrGpa, 8192, VSTELLAR_LOCAL_DMA_LKEY}});
  bad = A.Poll();
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, uint8_t(vstellar::WcStatus::LOC_LEN_ERR));
}

TEST_F(DataPath, KernelGsiAndUdQpsExchangeDatagrams) { KernelGsiAndUdQpsExchangeDatagrams(); }
TEST_F(DataPathOnTwoThreads, KernelGsiAndUdQpsExchangeDatagrams) { KernelGsiAndUdQpsExchangeDatagrams(); }

// QP 1's traffic goes to the device that holds the address, never to
// another (issue 13 #2): the daemon serves only its own address, and one
// device at a time holds it. Writing it into a second device's GID table
// fails; once the holder lets go, the other device may take it.
void DataPath::OnlyOneDeviceHoldsAnAddressAndItsQp1() {
  StartDaemon();
  TwoDevices();
  Guest& A = *a_;
  Guest& B = *b_;
  A.SetupKernel(1);
  B.SetupKernel(0);
  auto gid = [](uint8_t last, uint32_t index) {
    vstellar_cmd_gid g{};
    g.port = 1;
    g.index = index;
    g.gid[10] = g.gid[11] = 0xff;
    g.gid[12] = 127;
    g.gid[15] = last;
    g.gid_type = VSTELLAR_GID_TYPE_ROCE_V2;
    return g;
  };
  auto add = [&](Guest& x, uint8_t last, uint32_t index) {
    auto g = gid(last, index);
    return x.Cmd(VSTELLAR_CMD_ADD_GID, &g, sizeof(g), 0).status();
  };
  auto del = [&](Guest& x, uint32_t index) {
    auto g = gid(0, index);
    return x.Cmd(VSTELLAR_CMD_DEL_GID, &g, sizeof(g), 0).status();
  };
  EXPECT_EQ(add(B, 1, 0), VSTELLAR_STATUS_BUSY) << "A holds 127.0.0.1";
  EXPECT_EQ(add(B, 9, 0), VSTELLAR_STATUS_ACCESS) << "the daemon does not serve 127.0.0.9";
  EXPECT_EQ(add(A, 9, 1), VSTELLAR_STATUS_ACCESS);
  EXPECT_EQ(add(A, 1, 1), VSTELLAR_STATUS_OK) << "the holder may list its address twice";
  // An IPv6 address (the netdev's link-local one) is listed, by any device,
  // so the guest's table matches its netdev; but nobody holds it: no
  // datagram leaves with it as its source.
  vstellar_cmd_gid v6{};
  v6.port = 1;
  v6.index = 2;
  v6.gid[0] = 0xfe;
  v6.gid[1] = 0x80;
  v6.gid[15] = 0x42;
  v6.gid_type = VSTELLAR_GID_TYPE_ROCE_V2;
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_ADD_GID, &v6, sizeof(v6), 0).status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_ADD_GID, &v6, sizeof(v6), 0).status(), VSTELLAR_STATUS_OK);

  // B's QP 1 hears nothing sent to 127.0.0.1's QP 1; A's does.
  uint16_t st = 0;
  GQp gsia = A.CreateQp(2, VSTELLAR_QPT_GSI, &st);
  ASSERT_EQ(st, 0);
  GQp gsib = B.CreateQp(2, VSTELLAR_QPT_GSI, &st);
  ASSERT_EQ(st, 0);
  GQp ud = A.CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  ASSERT_EQ(A.ToRtsUd(gsia.qpn, true, VSTELLAR_GSI_QKEY), 0);
  ASSERT_EQ(B.ToRtsUd(gsib.qpn, true, VSTELLAR_GSI_QKEY), 0);
  ASSERT_EQ(A.ToRtsUd(ud.qpn, false, VSTELLAR_GSI_QKEY), 0);
  Fetched(1, [&] { B.PostRecv(gsib, 0x91, {vstellar_sge{kMrGpa, 512, VSTELLAR_LOCAL_DMA_LKEY}}); });
  A.PostRecv(gsia, 0x92, {vstellar_sge{kMrGpa, 512, VSTELLAR_LOCAL_DMA_LKEY}});
  A.PostSend(ud, UdWqe(0x93, 1, VSTELLAR_GSI_QPN, 0x80000000u), {vstellar_sge{kMrGpa + 4096, 64, VSTELLAR_LOCAL_DMA_LKEY}});
  bool got = false;
  for (int i = 0; i < 2; i++) {
    auto c = A.Poll();
    ASSERT_TRUE(c);
    got |= le64toh(c->wr_id) == 0x92u && c->status == 0;
  }
  EXPECT_TRUE(got);
  EXPECT_FALSE(B.Poll(300));
  A.PostSend(ud, UdWqe(0x94, 1, VSTELLAR_GSI_QPN, 0x80000000u, 2), {vstellar_sge{kMrGpa + 4096, 64, VSTELLAR_LOCAL_DMA_LKEY}});
  auto v6send = A.Poll();
  ASSERT_TRUE(v6send);
  EXPECT_EQ(v6send->status, uint8_t(vstellar::WcStatus::LOC_QP_OP_ERR)) << "sent from a GID it does not hold";

  // Released (both indexes), the address is B's to take, and then A's
  // second add fails.
  EXPECT_EQ(del(A, 0), VSTELLAR_STATUS_OK);
  EXPECT_EQ(add(B, 1, 0), VSTELLAR_STATUS_BUSY) << "A still lists it at index 1";
  EXPECT_EQ(del(A, 1), VSTELLAR_STATUS_OK);
  EXPECT_EQ(add(B, 1, 0), VSTELLAR_STATUS_OK);
  EXPECT_EQ(add(A, 1, 0), VSTELLAR_STATUS_BUSY);
  // A device that goes away gives its address back.
  b_.reset();
  fb_.reset();
  for (int i = 0; i < 100 && add(A, 1, 0) != VSTELLAR_STATUS_OK; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(add(A, 1, 0), VSTELLAR_STATUS_OK);
}

TEST_F(DataPath, OnlyOneDeviceHoldsAnAddressAndItsQp1) { OnlyOneDeviceHoldsAnAddressAndItsQp1(); }
TEST_F(DataPathOnTwoThreads, OnlyOneDeviceHoldsAnAddressAndItsQp1) { OnlyOneDeviceHoldsAnAddressAndItsQp1(); }

// Issue 13 #5: what a guest makes the daemon allocate (here the engine's
// window and rings of each RC QP) is charged to its device and to the
// daemon. Over either limit, creating fails with NO_RESOURCES and nothing
// is allocated; destroying gives the memory back, to any device; the
// daemon's total never passes its limit.
TEST_F(DataPath, HostMemoryIsChargedToTheDeviceThatAsks) {
  StartDaemon(50, {}, [](DaemonOptions& o) {
    o.device_memory_limit = 3ull << 20;
    o.memory_limit = 5ull << 20;
  });
  TwoGuests();
  auto used = [&](const std::string& key) {
    const std::string js = d_->StatsJson();
    const std::string pat = "\"memory\":{\"limit\":";
    size_t at = js.find(pat);
    EXPECT_NE(at, std::string::npos) << js;
    at = js.find("\"" + key + "\":", at);
    return std::stoull(js.substr(at + key.size() + 3));
  };
  auto fill = [&](Guest& g, std::vector<GQp>* made) {
    for (int i = 0; i < 24; i++) {
      uint16_t st = 0;
      GQp q = g.CreateQp(4, VSTELLAR_QPT_RC, &st);
      if (st) return st;
      made->push_back(q);
    }
    return uint16_t(0);
  };
  std::vector<GQp> qa, qb;
  EXPECT_EQ(fill(*a_, &qa), VSTELLAR_STATUS_NO_RESOURCES) << "A's device limit";
  ASSERT_GE(qa.size(), 1u);
  EXPECT_LE(used("used"), 5ull << 20);
  EXPECT_EQ(fill(*b_, &qb), VSTELLAR_STATUS_NO_RESOURCES) << "the daemon's limit";
  ASSERT_GE(qb.size(), 1u);
  EXPECT_LT(qb.size(), qa.size()) << "B got only what A left of the daemon's 5 MiB";
  EXPECT_LE(used("used"), 5ull << 20);
  EXPECT_GE(used("refused"), 1u);
  // A QP of A goes: B may create one more; everything goes: nothing is held.
  vstellar_cmd_handle h{};
  h.handle = qa.back().qpn;
  ASSERT_EQ(a_->Cmd(VSTELLAR_CMD_DESTROY_QP, &h, sizeof(h), 0).status(), 0);
  uint16_t st = 0;
  b_->CreateQp(4, VSTELLAR_QPT_RC, &st);
  EXPECT_EQ(st, 0);
  a_.reset();
  b_.reset();
  fa_.reset();
  fb_.reset();
  for (int i = 0; i < 100 && used("used") != 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(used("used"), 0u);
}

// Issue 13 #5: a guest that never takes its CQ notifications cannot grow
// the daemon's backlog of them: a CQ already waiting is not queued again.
TEST_F(DataPath, CqNotificationBacklogIsOnePerCq) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  // More armed completions than the notification queue has buffers
  // (FrontendOptions::ring_num), none of them taken.
  for (uint32_t i = 1; i <= 150; i++) {
    B.DbWord(VSTELLAR_DB_SLOT_SIZE * B.cq_slot + offsetof(vstellar_db_cq, arm)).store(htole32(i));
    B.PostRecv(qb, i, {B.Sge(0, 64)});
    A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, i), {A.Sge(0, 64)});
    ASSERT_TRUE(A.Poll());
    ASSERT_TRUE(B.Poll());
  }
  const std::string js = d_->StatsJson();
  size_t at = js.find("\"cq_notify_backlog\":");
  ASSERT_NE(at, std::string::npos);
  uint32_t most = 0;
  for (; at != std::string::npos; at = js.find("\"cq_notify_backlog\":", at + 1))
    most = std::max<uint32_t>(most, uint32_t(std::stoul(js.substr(at + 20))));
  EXPECT_LE(most, 1u) << js;
}

// User space gets UD QPs, but neither QP 1 nor the local DMA lkey.
TEST_F(DataPath, UserContextsGetUdButNotQp1NorTheDmaLkey) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  uint16_t st = 0;
  GQp ud = A.CreateQp(2, VSTELLAR_QPT_UD, &st);
  EXPECT_EQ(st, 0);
  // A UD QP of one process talks to another device's UD QP.
  GQp udb = b_->CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  ASSERT_EQ(A.ToRtsUd(ud.qpn, false, 0x4242), 0);
  ASSERT_EQ(b_->ToRtsUd(udb.qpn, false, 0x4242), 0);
  vstellar_cmd_gid g{};
  g.port = 1;
  g.gid[10] = g.gid[11] = 0xff;
  g.gid[12] = 127;
  g.gid[15] = 1;
  g.gid_type = VSTELLAR_GID_TYPE_ROCE_V2;
  ASSERT_EQ(A.f.Command(VSTELLAR_CMD_ADD_GID, 0, &g, sizeof(g), 0).status(), 0);  // the kernel's GID cache
  b_->PostRecv(udb, 0x21, {b_->Sge(0, 512)});
  Fill(A.Buf(0), 100, 5);
  A.PostSend(ud, UdWqe(0x11, 1, udb.qpn, 0x4242), {A.Sge(0, 100)});
  ASSERT_TRUE(A.Poll());
  auto rc = b_->Poll();
  ASSERT_TRUE(rc);
  EXPECT_EQ(rc->status, 0);
  EXPECT_EQ(le32toh(rc->src_qp), ud.qpn);
  EXPECT_EQ(std::memcmp(b_->Buf(VSTELLAR_GRH_BYTES), A.Buf(0), 100), 0);
  A.CreateQp(2, VSTELLAR_QPT_GSI, &st);
  EXPECT_EQ(st, VSTELLAR_STATUS_UNSUPPORTED);
  EXPECT_EQ(A.f.Command(VSTELLAR_CMD_KERNEL_DB, A.uctx, nullptr, 0, 8).status(), VSTELLAR_STATUS_ACCESS);
  GQp qa = A.CreateQp(), qb = b_->CreateQp();
  A.Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  // An SGE naming the local DMA lkey with a guest-physical address.
  A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0x1), {vstellar_sge{kCqGpa, 64, VSTELLAR_LOCAL_DMA_LKEY}});
  auto c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, uint8_t(vstellar::WcStatus::LOC_PROT_ERR));
}

// Node GUIDs: EUI-64 from the daemon's address and the device number, so two
// guests' devices never look like one (ibv_devinfo, rdma_cm).
TEST_F(DataPath, EachDeviceHasItsOwnNodeGuid) {
  StartDaemon();
  TwoGuests();
  std::array<uint8_t, 8> g[2];
  int i = 0;
  for (Guest* x : {a_.get(), b_.get()}) {
    CmdResult r = x->Cmd(VSTELLAR_CMD_QUERY_DEVICE, nullptr, 0, sizeof(vstellar_resp_query_device));
    ASSERT_EQ(r.status(), 0);
    std::memcpy(g[i].data(), As<vstellar_resp_query_device>(r).sys_image_guid, 8);
    EXPECT_EQ(g[i][0], 0x02);  // locally administered
    EXPECT_EQ(g[i][3], 0xff);
    EXPECT_EQ(g[i][4], 0xfe);
    EXPECT_EQ(g[i][1], 127);   // the daemon's 127.0.0.1
    i++;
  }
  EXPECT_NE(g[0], g[1]);
}

}  // namespace

namespace {

// Shared receive queues: two QPs of device B take their receives from one
// SRQ; the CQEs name the SRQ's slots and carry its wr_ids; the limit event
// reaches the guest's event queue; the verbs rules of the commands.
TEST_F(DataPath, SrqFeedsTwoQpsAndCqesNameItsSlots) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GSrq srq = B.CreateSrq(/*srq_limit=*/3);
  ASSERT_NE(srq.srqn, 0u);
  GQp qa0 = A.CreateQp(), qa1 = A.CreateQp();
  GQp qb0 = B.CreateQpOnSrq(srq.srqn), qb1 = B.CreateQpOnSrq(srq.srqn);
  A.Connect(qa0, qb0.qpn);
  B.Connect(qb0, qa0.qpn);
  A.Connect(qa1, qb1.qpn);
  B.Connect(qb1, qa1.qpn);

  // Five receives of 1 KiB each, wr_ids 0x50..0x54.
  for (uint32_t i = 0; i < 5; i++) B.PostSrqRecv(srq, 0x50 + i, {B.Sge(1024 * i, 1024)});
  // QP0 sends tags 1 and 2, QP1 tag 3: 600 bytes each, all bytes = tag.
  auto send = [&](GQp& q, uint8_t tag) {
    std::memset(A.Buf(4096 * tag), tag, 600);
    A.PostSend(q, Wqe(VSTELLAR_WR_SEND, tag), {A.Sge(4096 * tag, 600)});
    auto c = A.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->status, 0);
  };
  send(qa0, 1);
  send(qa1, 3);
  send(qa0, 2);
  std::map<uint32_t, std::vector<uint8_t>> by_qp;
  std::set<uint64_t> wr_ids;
  for (int i = 0; i < 3; i++) {
    auto c = B.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->status, 0);
    EXPECT_EQ(c->opcode, VSTELLAR_WC_RECV);
    EXPECT_TRUE(c->wc_flags & VSTELLAR_CQE_SRQ);
    EXPECT_EQ(c->byte_len, 600u);
    ASSERT_GE(c->wr_id, 0x50u);
    ASSERT_LE(c->wr_id, 0x54u);
    EXPECT_EQ(c->wqe_idx, c->wr_id - 0x50) << "wqe_idx names the SRQ slot";
    EXPECT_TRUE(wr_ids.insert(c->wr_id).second);
    by_qp[c->qpn].push_back(B.Buf(1024 * (c->wr_id - 0x50))[599]);
  }
  EXPECT_EQ(by_qp[qb0.qpn], (std::vector<uint8_t>{1, 2}));
  EXPECT_EQ(by_qp[qb1.qpn], (std::vector<uint8_t>{3}));
  EXPECT_EQ(wr_ids, (std::set<uint64_t>{0x50, 0x51, 0x52})) << "taken in posting order";
  // 2 left, below the limit of 3: one event for the guest's SRQN.
  EXPECT_TRUE(Has(fb_->Events(2000), VSTELLAR_EV_SRQ_LIMIT_REACHED, srq.srqn));
  vstellar_cmd_handle h{srq.srqn, 0};
  CmdResult r = B.Cmd(VSTELLAR_CMD_QUERY_SRQ, &h, sizeof(h), sizeof(vstellar_resp_query_srq));
  ASSERT_EQ(r.status(), 0);
  EXPECT_EQ(As<vstellar_resp_query_srq>(r).max_wr, 16u);
  EXPECT_EQ(As<vstellar_resp_query_srq>(r).max_sge, 2u);
  EXPECT_EQ(As<vstellar_resp_query_srq>(r).srq_limit, 0u) << "disarmed once it fired";
  // In use by QPs: BUSY; another context's device cannot name it.
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_DESTROY_SRQ, &h, sizeof(h), 0).status(), VSTELLAR_STATUS_BUSY);
  EXPECT_EQ(A.Cmd(VSTELLAR_CMD_DESTROY_SRQ, &h, sizeof(h), 0).status(), VSTELLAR_STATUS_BAD_HANDLE);
}

TEST_F(DataPath, SrqCommandsCheckEveryField) {
  StartDaemon();
  TwoGuests();
  Guest& B = *b_;
  auto create = [&](auto change) {
    vstellar_cmd_create_srq c{};
    c.pdn = B.pd;
    c.log_wqe = kSrqLog;
    c.log_stride = 6;
    c.page_shift = 12;
    c.max_sge = 2;
    c.num_pages = 1;
    change(c);
    auto body = WithPages(&c, sizeof(c), {kSrqGpa});
    return B.Cmd(VSTELLAR_CMD_CREATE_SRQ, body.data(), body.size(), sizeof(vstellar_resp_create_srq)).status();
  };
  EXPECT_EQ(create([](auto& c) { c.pdn = 999; }), VSTELLAR_STATUS_BAD_HANDLE);
  EXPECT_EQ(create([](auto& c) { c.log_wqe = 17; }), VSTELLAR_STATUS_LIMIT);
  EXPECT_EQ(create([](auto& c) { c.max_sge = 1000; }), VSTELLAR_STATUS_LIMIT);
  EXPECT_EQ(create([](auto& c) { c.log_stride = 3; }), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(create([](auto& c) { c.max_sge = 4; }), VSTELLAR_STATUS_BAD_FIELD) << "4 SGEs do not fit 64 bytes";
  EXPECT_EQ(create([](auto& c) { c.srq_limit = 16; }), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(create([](auto& c) { c.reserved1 = 1; }), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(create([](auto& c) { c.num_pages = 2; }), VSTELLAR_STATUS_BAD_LENGTH);
  EXPECT_EQ(create([](auto& c) { c.ring_offset = 8; }), VSTELLAR_STATUS_BAD_FIELD);
  GSrq srq = B.CreateSrq();
  ASSERT_NE(srq.srqn, 0u);
  // A QP on it may not also bring an RQ, and must be of the SRQ's PD.
  vstellar_cmd_create_qp c{};
  c.pdn = B.pd;
  c.send_cqn = c.recv_cqn = B.cq;
  c.qp_type = VSTELLAR_QPT_RC;
  c.create_flags = VSTELLAR_QP_CREATE_USE_SRQ;
  c.srq.srqn = srq.srqn;
  c.sq_log_wqe = kSqLog;
  c.sq_log_stride = 7;
  c.rq_log_wqe = 2;
  c.page_shift = 12;
  c.sq_pages = 2;
  auto body = WithPages(&c, sizeof(c), {kRingGpa, kRingGpa + 4096});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24).status(), VSTELLAR_STATUS_BAD_FIELD);
  c.rq_log_wqe = 0;
  c.srq.srqn = 12345;
  body = WithPages(&c, sizeof(c), {kRingGpa, kRingGpa + 4096});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24).status(), VSTELLAR_STATUS_BAD_HANDLE);
  c.create_flags = 0x80;
  body = WithPages(&c, sizeof(c), {kRingGpa, kRingGpa + 4096});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_CREATE_QP, body.data(), body.size(), 24).status(), VSTELLAR_STATUS_BAD_FIELD);
  // MODIFY_SRQ: the limit only; no resizing.
  vstellar_cmd_modify_srq m{};
  m.srqn = srq.srqn;
  m.attr_mask = VSTELLAR_SRQ_MAX_WR;
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_MODIFY_SRQ, &m, sizeof(m), 0).status(), VSTELLAR_STATUS_UNSUPPORTED);
  m.attr_mask = VSTELLAR_SRQ_LIMIT;
  m.srq_limit = 16;
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_MODIFY_SRQ, &m, sizeof(m), 0).status(), VSTELLAR_STATUS_BAD_FIELD);
  m.srq_limit = 4;
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_MODIFY_SRQ, &m, sizeof(m), 0).status(), 0);
  vstellar_cmd_handle h{srq.srqn, 0};
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_DESTROY_SRQ, &h, sizeof(h), 0).status(), 0);
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_DESTROY_SRQ, &h, sizeof(h), 0).status(), VSTELLAR_STATUS_BAD_HANDLE);
}

TEST_F(DataPath, ABadSrqWqeFailsTheSrqAloneAndTheDaemonServesOthers) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GSrq srq = B.CreateSrq();
  // An SGE count beyond the slot, then a producer index beyond the ring.
  vstellar_recv_wqe w{};
  w.wr_id = 0x60;
  w.num_sge = htole32(200);
  std::memcpy(B.f.mem() + kSrqGpa, &w, sizeof(w));
  B.Ring(VSTELLAR_DB_SLOT_SIZE * srq.slot + offsetof(vstellar_db_srq, pi), ++srq.pi);
  EXPECT_TRUE(Has(fb_->Events(2000), VSTELLAR_EV_SRQ_ERR, srq.srqn));
  GSrq srq2 = B.CreateSrq();
  B.Ring(VSTELLAR_DB_SLOT_SIZE * srq2.slot + offsetof(vstellar_db_srq, pi), 1000);
  EXPECT_TRUE(Has(fb_->Events(2000), VSTELLAR_EV_SRQ_ERR, srq2.srqn));
  // Device A's ordinary traffic is untouched.
  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  B.PostRecv(qb, 0x70, {B.Sge(0, 64)});
  A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0x71), {A.Sge(0, 64)});
  auto c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0x70u);
  EXPECT_EQ(c->status, 0);
}

// RESIZE_CQ: the CQEs not yet polled move to the start of the new ring, in
// order, none lost and none twice; the slot's ci is reset; new CQEs follow,
// also across the new ring's wrap.
TEST_F(DataPath, ResizeCqMovesTheUnpolledCqes) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  for (uint64_t i = 0; i < 5; i++) B.PostRecv(qb, 0x100 + i, {B.Sge(64 * i, 64)});
  for (uint64_t i = 0; i < 5; i++) A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0x200 + i), {A.Sge(0, 16)});
  for (uint64_t i = 0; i < 2; i++) {
    auto c = B.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->wr_id, 0x100 + i);
  }
  // Wait until all five are in B's ring (the sender's completions say the
  // receiver has them), then move the three unpolled ones to a bigger ring.
  for (int i = 0; i < 5; i++) ASSERT_TRUE(A.Poll());
  uint8_t* old = B.f.mem() + kCqGpa;
  CmdResult r = B.ResizeCq(0x201000, 7);
  ASSERT_EQ(r.status(), 0);
  EXPECT_EQ(As<vstellar_resp_resize_cq>(r).cqe_moved, 3u);
  EXPECT_EQ(B.DbWord(VSTELLAR_DB_SLOT_SIZE * B.cq_slot + offsetof(vstellar_db_cq, ci)).load(), 0u);
  std::vector<uint8_t> before(old, old + 4096);
  for (uint64_t i = 2; i < 5; i++) {
    auto c = B.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->wr_id, 0x100 + i);
    EXPECT_EQ(c->status, 0);
    EXPECT_EQ(c->byte_len, 16u);
  }
  EXPECT_FALSE(B.Poll(50));
  // New completions go to the new ring; shrink it to 4 CQEs and wrap it.
  r = B.ResizeCq(0x203000, 2);
  ASSERT_EQ(r.status(), 0);
  EXPECT_EQ(As<vstellar_resp_resize_cq>(r).cqe_moved, 0u);
  for (uint64_t i = 0; i < 10; i++) {
    B.PostRecv(qb, 0x300 + i, {B.Sge(0, 64)});
    A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0x400 + i), {A.Sge(0, 8)});
    auto c = B.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->wr_id, 0x300 + i);
    ASSERT_TRUE(A.Poll());
  }
  // The old ring was not written after the resize.
  EXPECT_EQ(std::memcmp(before.data(), old, 4096), 0);
}

// Hostile RESIZE_CQ requests each fail alone with a clear status and leave
// the CQ as it was; the other device keeps being served.
TEST_F(DataPath, BadResizeCqFailsAloneAndTheCqKeepsWorking) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GQp qa = A.CreateQp(), qb = B.CreateQp();
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  for (uint64_t i = 0; i < 6; i++) B.PostRecv(qb, 0x10 + i, {B.Sge(0, 64)});
  for (uint64_t i = 0; i < 6; i++) A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0x20 + i), {A.Sge(0, 8)});
  for (int i = 0; i < 6; i++) ASSERT_TRUE(A.Poll());
  // Six CQEs outstanding: a ring of four cannot take them (IB: EINVAL).
  EXPECT_EQ(B.ResizeCq(0x201000, 2).status(), VSTELLAR_STATUS_LIMIT);
  // Larger than max_cqe, a log beyond the ABI.
  EXPECT_EQ(B.ResizeCq(0x201000, 21).status(), VSTELLAR_STATUS_LIMIT);
  // No such CQ; B's CQ named by another context (the kernel's) of B.
  EXPECT_EQ(B.ResizeCq(0x201000, 7, 0xdead).status(), VSTELLAR_STATUS_BAD_HANDLE);
  {
    vstellar_cmd_resize_cq k{};
    k.cqn = B.cq;
    k.log_cqe = 7;
    k.page_shift = 12;
    k.num_pages = 1;
    auto kb = WithPages(&k, sizeof(k), {0x201000});
    CmdResult r = B.f.Command(VSTELLAR_CMD_RESIZE_CQ, 0, kb.data(), kb.size(), 8);
    ASSERT_TRUE(r.done);
    EXPECT_EQ(r.status(), VSTELLAR_STATUS_BAD_HANDLE);
  }
  // Page list: too short, an address outside guest RAM, a bad offset.
  vstellar_cmd_resize_cq c{};
  c.cqn = B.cq;
  c.log_cqe = 8;  // 8 KiB: two pages
  c.page_shift = 12;
  c.num_pages = 1;
  auto body = WithPages(&c, sizeof(c), {0x201000});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_RESIZE_CQ, body.data(), body.size(), 8).status(), VSTELLAR_STATUS_BAD_FIELD);
  c.num_pages = 2;
  body = WithPages(&c, sizeof(c), {0x201000});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_RESIZE_CQ, body.data(), body.size(), 8).status(), VSTELLAR_STATUS_BAD_LENGTH);
  body = WithPages(&c, sizeof(c), {0x201000, 1ull << 40});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_RESIZE_CQ, body.data(), body.size(), 8).status(), VSTELLAR_STATUS_BAD_ADDRESS);
  c.ring_offset = 16;
  body = WithPages(&c, sizeof(c), {0x201000, 0x202000});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_RESIZE_CQ, body.data(), body.size(), 8).status(), VSTELLAR_STATUS_BAD_FIELD);
  c.ring_offset = 0;
  c.page_shift = 13;  // not in page_size_cap
  c.num_pages = 1;
  body = WithPages(&c, sizeof(c), {0x201000});
  EXPECT_EQ(B.Cmd(VSTELLAR_CMD_RESIZE_CQ, body.data(), body.size(), 8).status(), VSTELLAR_STATUS_BAD_FIELD);
  // A consumer index ahead of the producer: the driver is broken.
  auto ci = B.DbWord(VSTELLAR_DB_SLOT_SIZE * B.cq_slot + offsetof(vstellar_db_cq, ci));
  ci.store(htole32(100));
  EXPECT_EQ(B.ResizeCq(0x201000, 7).status(), VSTELLAR_STATUS_BAD_STATE);
  ci.store(htole32(B.cq_ci));
  // The CQ is as it was: the six CQEs are in the old ring, in order.
  for (uint64_t i = 0; i < 6; i++) {
    auto e = B.Poll();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->wr_id, 0x10 + i);
  }
  // Device A was served throughout, and B's CQ still takes completions.
  A.PostRecv(qa, 0x30, {A.Sge(0, 64)});
  B.PostSend(qb, Wqe(VSTELLAR_WR_SEND, 0x31), {B.Sge(0, 8)});
  auto e = A.Poll();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->wr_id, 0x30u);
  e = B.Poll();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->wr_id, 0x31u);
}

// UC QPs between two devices: SEND and WRITE_IMM land; a send longer than
// its receive WQE is dropped at the responder and the QP stays in RTS; an
// RDMA READ on UC fails that WQE; the other QPs keep working.
void DataPath::UcQpsSendWriteAndDropBadMessagesAlone() {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GQp qa = A.CreateQp(4, VSTELLAR_QPT_UC), qb = B.CreateQp(4, VSTELLAR_QPT_UC);
  constexpr uint32_t kUcRtr =
      VSTELLAR_QP_STATE | VSTELLAR_QP_AV | VSTELLAR_QP_PATH_MTU | VSTELLAR_QP_DEST_QPN | VSTELLAR_QP_RQ_PSN;
  for (auto [g, q, peer] : {std::tuple{&A, &qa, qb.qpn}, std::tuple{&B, &qb, qa.qpn}}) {
    ASSERT_EQ(g->Modify(q->qpn, kInitMask, VSTELLAR_QPS_INIT), 0);
    // RC's RTR attributes are refused on UC (no RNR timer, no rd_atomic).
    EXPECT_EQ(g->Modify(q->qpn, kRtrMask, VSTELLAR_QPS_RTR, peer), VSTELLAR_STATUS_BAD_FIELD);
    ASSERT_EQ(g->Modify(q->qpn, kUcRtr, VSTELLAR_QPS_RTR, peer), 0);
    ASSERT_EQ(g->Modify(q->qpn, VSTELLAR_QP_STATE | VSTELLAR_QP_SQ_PSN, VSTELLAR_QPS_RTS), 0);
  }
  Fill(A.Buf(0), 5000, 4);
  std::memset(B.Buf(0), 0, 16384);
  B.PostRecv(qb, 0xb0, {B.Sge(0, 100)});
  // Too long for 0xb0: dropped; 0xb0 takes the next message.
  A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0xa0), {A.Sge(0, 3000)});
  A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, 0xa1), {A.Sge(100, 60)});
  auto w = Wqe(VSTELLAR_WR_RDMA_WRITE_IMM, 0xa2);
  w.u.rdma.remote_addr = kMrGpa + 4096;
  w.u.rdma.rkey = B.rkey;
  w.imm_data = htobe32(5);
  A.PostSend(qa, w, {A.Sge(0, 5000)});
  for (uint64_t id = 0xa0; id <= 0xa2; id++) {
    auto c = A.Poll();
    ASSERT_TRUE(c);
    EXPECT_EQ(c->wr_id, id);
    EXPECT_EQ(c->status, 0);  // UC: the sender cannot know what the responder did
  }
  auto c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0xb0u);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(c->byte_len, 60u);
  EXPECT_EQ(std::memcmp(B.Buf(0), A.Buf(100), 60), 0);
  B.PostRecv(qb, 0xb1, {});
  // The WRITE_IMM found no receive WQE when it arrived: dropped (no RNR on
  // UC); its bytes were placed. Once a WQE is posted, the next one lands.
  A.PostSend(qa, w, {A.Sge(0, 5000)});
  ASSERT_TRUE(A.Poll());
  c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0xb1u);
  EXPECT_EQ(c->opcode, VSTELLAR_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(c->byte_len, 5000u);
  EXPECT_EQ(be32toh(c->imm_data), 5u);
  EXPECT_EQ(std::memcmp(B.Buf(4096), A.Buf(0), 5000), 0);
  EXPECT_EQ(B.QpState(qb.qpn), VSTELLAR_QPS_RTS);
  // READ is not a UC operation: that WQE fails (and the QP with it).
  w = Wqe(VSTELLAR_WR_RDMA_READ, 0xa3);
  w.u.rdma.remote_addr = kMrGpa;
  w.u.rdma.rkey = B.rkey;
  A.PostSend(qa, w, {A.Sge(0, 64)});
  c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0xa3u);
  EXPECT_EQ(c->status, 2);  // IBV_WC_LOC_QP_OP_ERR
  // B's UC QP, and an RC pair next to them, still work.
  GQp ra = A.CreateQp(), rb = B.CreateQp();
  A.Connect(ra, rb.qpn);
  B.Connect(rb, ra.qpn);
  B.PostRecv(rb, 0xc0, {B.Sge(0, 64)});
  A.PostSend(ra, Wqe(VSTELLAR_WR_SEND, 0xc1), {A.Sge(0, 64)});
  c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0xc0u);
  EXPECT_EQ(B.QpState(qb.qpn), VSTELLAR_QPS_RTS);
}

TEST_F(DataPath, UcQpsSendWriteAndDropBadMessagesAlone) { UcQpsSendWriteAndDropBadMessagesAlone(); }
TEST_F(DataPathOnTwoThreads, UcQpsSendWriteAndDropBadMessagesAlone) { UcQpsSendWriteAndDropBadMessagesAlone(); }

// UD multicast through the daemon: ATTACH_MCAST, a UD send to the group's
// GID over real UDP (IP multicast on the loopback), DETACH_MCAST; hostile
// requests (bogus groups, RC QPs, another context's QP, reserved bits,
// detaching what is not attached) each fail alone with their status.
void DataPath::MulticastGroupsThroughTheDaemon() {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  uint16_t st = 0;
  GQp ua = A.CreateQp(2, VSTELLAR_QPT_UD, &st), ub = B.CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  ASSERT_EQ(A.ToRtsUd(ua.qpn, false, 0x4242), 0);
  ASSERT_EQ(B.ToRtsUd(ub.qpn, false, 0x4242), 0);
  vstellar_cmd_gid g{};
  g.port = 1;
  g.gid[10] = g.gid[11] = 0xff;
  g.gid[12] = 127;
  g.gid[15] = 1;
  g.gid_type = VSTELLAR_GID_TYPE_ROCE_V2;
  ASSERT_EQ(A.f.Command(VSTELLAR_CMD_ADD_GID, 0, &g, sizeof(g), 0).status(), 0);
  auto mc = [](uint32_t qpn, std::array<uint8_t, 4> ip) {
    vstellar_cmd_mcast m{};
    m.qpn = qpn;
    m.mgid[10] = m.mgid[11] = 0xff;
    std::memcpy(m.mgid + 12, ip.data(), 4);
    return m;
  };
  auto cmd = [](Guest& G, uint16_t op, const vstellar_cmd_mcast& m) { return G.Cmd(op, &m, sizeof(m), 0).status(); };
  vstellar_cmd_mcast m = mc(ub.qpn, {230, 9, 8, 7});
  ASSERT_EQ(cmd(B, VSTELLAR_CMD_ATTACH_MCAST, m), 0);
  // Hostile: a unicast GID, an IPv6 GID, an RC QP, A naming B's QP, reserved bits.
  EXPECT_EQ(cmd(B, VSTELLAR_CMD_ATTACH_MCAST, mc(ub.qpn, {10, 0, 0, 1})), VSTELLAR_STATUS_BAD_FIELD);
  vstellar_cmd_mcast v6 = m;
  v6.mgid[0] = 0xff;
  EXPECT_EQ(cmd(B, VSTELLAR_CMD_ATTACH_MCAST, v6), VSTELLAR_STATUS_BAD_FIELD);
  GQp rc = B.CreateQp();
  EXPECT_EQ(cmd(B, VSTELLAR_CMD_ATTACH_MCAST, mc(rc.qpn, {230, 9, 8, 7})), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(cmd(A, VSTELLAR_CMD_ATTACH_MCAST, m), VSTELLAR_STATUS_BAD_HANDLE);
  vstellar_cmd_mcast rsv = m;
  rsv.reserved = 1;
  EXPECT_EQ(cmd(B, VSTELLAR_CMD_ATTACH_MCAST, rsv), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(cmd(A, VSTELLAR_CMD_DETACH_MCAST, mc(ua.qpn, {230, 9, 8, 7})), VSTELLAR_STATUS_BAD_FIELD);
  // A sends to the group (not attached itself): B's QP gets it.
  Fetched(1, [&] { B.PostRecv(ub, 0x21, {B.Sge(0, 512)}); });
  Fill(A.Buf(0), 100, 6);
  vstellar_send_wqe w = UdWqe(0x11, 1, 0xffffff, 0x4242);
  w.u.ud.av.dgid[12] = 230;
  w.u.ud.av.dgid[13] = 9;
  w.u.ud.av.dgid[14] = 8;
  w.u.ud.av.dgid[15] = 7;
  A.PostSend(ua, w, {A.Sge(0, 100)});
  auto c = A.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, 0);
  c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0x21u);
  EXPECT_EQ(c->status, 0);
  EXPECT_EQ(le32toh(c->src_qp), ua.qpn);
  EXPECT_EQ(c->byte_len, VSTELLAR_GRH_BYTES + 100);
  EXPECT_EQ(std::memcmp(B.Buf(VSTELLAR_GRH_BYTES), A.Buf(0), 100), 0);
  // Detached: the next datagram to the group reaches no one.
  ASSERT_EQ(cmd(B, VSTELLAR_CMD_DETACH_MCAST, m), 0);
  EXPECT_EQ(cmd(B, VSTELLAR_CMD_DETACH_MCAST, m), VSTELLAR_STATUS_BAD_FIELD);
  Fetched(1, [&] { B.PostRecv(ub, 0x22, {B.Sge(0, 512)}); });
  A.PostSend(ua, w, {A.Sge(0, 100)});
  ASSERT_TRUE(A.Poll());
  EXPECT_FALSE(B.Poll(300));
  // The daemon serves both devices as before.
  GQp ra = A.CreateQp();
  A.Connect(ra, rc.qpn);
  B.Connect(rc, ra.qpn);
  B.PostRecv(rc, 0x30, {B.Sge(0, 64)});
  A.PostSend(ra, Wqe(VSTELLAR_WR_SEND, 0x31), {A.Sge(0, 64)});
  c = B.Poll();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->wr_id, 0x30u);
}

TEST_F(DataPath, MulticastGroupsThroughTheDaemon) { MulticastGroupsThroughTheDaemon(); }

// Issue 24 #4: groups and a group's QP slots are the engine's, shared by
// every device; one guest could take them all (the kernel's 20 memberships
// of the group socket, the engine's 64 QPs of a group), and then every
// other guest's ATTACH_MCAST failed. Each device now has a quota of groups
// and of its QPs in one group; over it, LIMIT, and the others attach as
// before. Detaching and destroying give the quota back.
TEST_F(DataPath, MulticastIsQuotedPerDevice) {
  StartDaemon(50, {}, [](DaemonOptions& o) {
    o.mcast_groups_per_device = 4;
    o.mcast_qps_per_group = 3;
  });
  TwoGuests();
  // The device says so in its config space (what ibv_devinfo reports).
  std::vector<uint8_t> p(sizeof(ConfigHeader) + sizeof(virtio_vstellar_config), 0);
  const ConfigHeader ch{0, sizeof(virtio_vstellar_config), 0};
  std::memcpy(p.data(), &ch, sizeof(ch));
  std::vector<uint8_t> reply;
  std::string err;
  ASSERT_TRUE(fa_->Get(Request::kGetConfig, p.data(), p.size(), &reply, &err)) << err;
  ASSERT_GE(reply.size(), sizeof(virtio_vstellar_config));
  virtio_vstellar_config got;
  std::memcpy(&got, reply.data() + reply.size() - sizeof(got), sizeof(got));
  EXPECT_EQ(le16toh(got.max_mcast_grp), 4u);
  EXPECT_EQ(le16toh(got.max_mcast_qp_attach), 3u);
  Guest& A = *a_;
  Guest& B = *b_;
  uint16_t st = 0;
  std::vector<GQp> qa;
  for (int i = 0; i < 4; i++) qa.push_back(A.CreateQp(2, VSTELLAR_QPT_UD, &st));
  GQp qb = B.CreateQp(2, VSTELLAR_QPT_UD, &st);
  ASSERT_EQ(st, 0);
  auto mcast = [](Guest& G, uint16_t op, uint32_t qpn, uint8_t group) {
    vstellar_cmd_mcast m{};
    m.qpn = qpn;
    m.mgid[10] = m.mgid[11] = 0xff;
    m.mgid[12] = 230;
    m.mgid[13] = 24;
    m.mgid[15] = group;
    return G.Cmd(op, &m, sizeof(m), 0).status();
  };
  auto attach = [&](Guest& G, uint32_t qpn, uint8_t group) { return mcast(G, VSTELLAR_CMD_ATTACH_MCAST, qpn, group); };
  // Groups: A's fifth is refused, B still joins it; attaching again is no new join.
  for (uint8_t g = 0; g < 4; g++) EXPECT_EQ(attach(A, qa[0].qpn, g), VSTELLAR_STATUS_OK) << "group " << int(g);
  EXPECT_EQ(attach(A, qa[0].qpn, 3), VSTELLAR_STATUS_OK);
  EXPECT_EQ(attach(A, qa[1].qpn, 4), VSTELLAR_STATUS_LIMIT);
  EXPECT_EQ(attach(B, qb.qpn, 4), VSTELLAR_STATUS_OK);
  // Slots of one group: A's fourth QP in group 0 is refused, B's is taken.
  EXPECT_EQ(attach(A, qa[1].qpn, 0), VSTELLAR_STATUS_OK);
  EXPECT_EQ(attach(A, qa[2].qpn, 0), VSTELLAR_STATUS_OK);
  EXPECT_EQ(attach(A, qa[3].qpn, 0), VSTELLAR_STATUS_LIMIT);
  EXPECT_EQ(attach(B, qb.qpn, 0), VSTELLAR_STATUS_OK);
  // What a detach or a destroyed QP frees is A's again.
  EXPECT_EQ(mcast(A, VSTELLAR_CMD_DETACH_MCAST, qa[0].qpn, 3), VSTELLAR_STATUS_OK);
  EXPECT_EQ(attach(A, qa[1].qpn, 4), VSTELLAR_STATUS_OK);
  vstellar_cmd_handle h{};
  h.handle = qa[2].qpn;
  ASSERT_EQ(A.Cmd(VSTELLAR_CMD_DESTROY_QP, &h, sizeof(h), 0).status(), VSTELLAR_STATUS_OK);
  EXPECT_EQ(attach(A, qa[3].qpn, 0), VSTELLAR_STATUS_OK);
}
TEST_F(DataPathOnTwoThreads, MulticastGroupsThroughTheDaemon) { MulticastGroupsThroughTheDaemon(); }

// RESIZE_SRQ: the WQEs posted in the old ring are taken first, later ones
// come from the new ring at the same free-running indices; every receive
// completes once, in posting order. Hostile requests fail alone.
TEST_F(DataPath, ResizeSrqKeepsEveryPostedWqe) {
  StartDaemon();
  TwoGuests();
  Guest& A = *a_;
  Guest& B = *b_;
  GSrq srq = B.CreateSrq();
  ASSERT_NE(srq.srqn, 0u);
  GQp qa = A.CreateQp(), qb = B.CreateQpOnSrq(srq.srqn);
  A.Connect(qa, qb.qpn);
  B.Connect(qb, qa.qpn);
  for (uint32_t i = 0; i < 14; i++) B.PostSrqRecv(srq, 0x60 + i, {B.Sge(256 * i, 256)});
  auto resize = [&](uint32_t srqn, uint8_t log, uint64_t gpa, uint32_t pages, uint8_t shift = 12) {
    std::memset(B.f.mem() + gpa, 0, 4096ull * pages);
    vstellar_cmd_resize_srq c{};
    c.srqn = srqn;
    c.log_wqe = log;
    c.page_shift = shift;
    c.num_pages = pages;
    std::vector<uint64_t> pl;
    for (uint32_t i = 0; i < pages; i++) pl.push_back(gpa + 4096ull * i);
    auto body = WithPages(&c, sizeof(c), pl);
    return B.Cmd(VSTELLAR_CMD_RESIZE_SRQ, body.data(), body.size(), 0).status();
  };
  // Hostile: smaller than the 14 WQEs posted, beyond max_srq_wr, a page
  // list of the wrong size, another context's SRQ, reserved bits.
  EXPECT_EQ(resize(srq.srqn, 3, 0x3f1000, 1), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_EQ(resize(srq.srqn, 17, 0x3f1000, 1), VSTELLAR_STATUS_LIMIT);
  EXPECT_EQ(resize(srq.srqn, 7, 0x3f1000, 1), VSTELLAR_STATUS_BAD_FIELD);  // 8 KiB: two pages
  EXPECT_EQ(resize(0xbad, 6, 0x3f1000, 1), VSTELLAR_STATUS_BAD_HANDLE);
  {
    vstellar_cmd_resize_srq c{};
    c.srqn = srq.srqn;
    c.log_wqe = 6;
    c.page_shift = 12;
    c.num_pages = 1;
    c.reserved1 = 1;
    auto body = WithPages(&c, sizeof(c), {0x3f1000});
    EXPECT_EQ(B.Cmd(VSTELLAR_CMD_RESIZE_SRQ, body.data(), body.size(), 0).status(), VSTELLAR_STATUS_BAD_FIELD);
    c.reserved1 = 0;
    body = WithPages(&c, sizeof(c), {0x3f1000});
    EXPECT_EQ(A.Cmd(VSTELLAR_CMD_RESIZE_SRQ, body.data(), body.size(), 0).status(), VSTELLAR_STATUS_BAD_HANDLE);
  }
  // 64 slots: WQEs 14..19 go into the new ring, slots 14..19 of it.
  ASSERT_EQ(resize(srq.srqn, 6, 0x3f1000, 1), 0);
  srq.gpa = 0x3f1000;
  srq.log = 6;
  for (uint32_t i = 14; i < 20; i++) B.PostSrqRecv(srq, 0x60 + i, {B.Sge(256 * i, 256)});
  vstellar_cmd_handle h{srq.srqn, 0};
  CmdResult r = B.Cmd(VSTELLAR_CMD_QUERY_SRQ, &h, sizeof(h), sizeof(vstellar_resp_query_srq));
  ASSERT_EQ(r.status(), 0);
  EXPECT_EQ(As<vstellar_resp_query_srq>(r).max_wr, 64u);
  for (uint32_t i = 0; i < 20; i++) {
    A.PostSend(qa, Wqe(VSTELLAR_WR_SEND, i), {A.Sge(0, 100)});
    auto c = B.Poll();
    ASSERT_TRUE(c) << i;
    EXPECT_EQ(c->status, 0);
    EXPECT_EQ(c->wr_id, 0x60u + i);
    EXPECT_TRUE(c->wc_flags & VSTELLAR_CQE_SRQ);
    ASSERT_TRUE(A.Poll());
  }
}

}  // namespace

// ------------------------------------------------------------ memory keys

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

// The kernel (device A) registers pages of its memory under a
// fast-registration key, a user QP of device B writes through it, the
// kernel invalidates it and B's next write gets a remote access error.
// Then every kind of bad REG_MR fails alone, on its own QP, with a status
// that says why, and the daemon keeps serving both devices.
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
// bound window cannot be deregistered.
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

}  // namespace
