// vstellard benchmarks (driven by tools/bench/vstellard/run):
//
//   vstellard_bench attach --mem-mib N --pin lazy|eager
//     An in-process vstellard and a test frontend with N MiB of sparse memfd
//     guest RAM: time from connect to SET_MEM_TABLE acked (attach) and to the
//     first control command answered (ready), and the bytes pinned then.
//   vstellard_bench write --translation emtt|atc --size BYTES [--seconds S]
//       [--atc-entries N] [--atc-miss-ns NS] [--port P]
//     RDMA WRITE bandwidth through the engine: a loopback RC QP pair on one
//     engine over UDP (io_uring, 127.0.0.1), both MRs guest memory (4 KiB
//     guest pages, scrambled) translated by eMTT or through the ATC.
//       [--memory ram|accel] [--mrs N]
//     --memory accel: the target MRs are device memory instead (an
//     accelerator's BAR, its own memfd region above RAM: GPU Direct RDMA
//     through a dmabuf MR), contiguous in 2 MiB pages where the size allows,
//     as the guest driver registers a dmabuf. --mrs N: N target MRs of
//     --size bytes each, the WRITEs going to them in turn (Stellar's
//     figure of translation against the number of MRs).
//   vstellard_bench dma ...same options...
//     The translation cost alone: copy MR to MR through the translators
//     (what the engine does per packet), no network.
//   vstellard_bench scale --devices N [--seconds S] [--size BYTES]
//       [--link gso|plain] [--port P] [--vstellard PATH] [--hostile 1]
//     N devices (test frontends, 8 MiB guests) on one vstellard process:
//     attach time, the daemon's memory and idle CPU, bare and with a
//     context, PD, CQ, MR and connected RC QP each; with S > 0 every device
//     WRITEs to its neighbour for S seconds (Jain's index of the messages
//     each completed); destroy time. --hostile 1: one more device creates
//     QPs (connected), CQs and MRs until refused, and stays idle.
// Each prints one JSON object.
#include <endian.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>

#include <vstellar/engine.h>
#include <vstellar/udp_link.h>

#include "vstellard/daemon.h"
#include "vstellard/frontend.h"
#include "vstellard/pvdma.h"
#include "vstellard/translate.h"

using namespace vstellard;
using Clock = std::chrono::steady_clock;

namespace {

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Args {
  std::string mode;
  uint64_t mem_mib = 1024;
  PinMode pin = PinMode::kLazy;
  TranslationMode tr = TranslationMode::kEmtt;
  uint64_t size = 1 << 20;
  double seconds = 1.0;
  size_t atc_entries = 16384;
  uint64_t atc_miss_ns = 0;
  uint16_t port = 53000;
  uint64_t devices = 64;
  std::string vstellard;  // scale: the daemon binary (default: the build tree's)
  bool hostile = false;   // scale: one more device takes all it can
  vstellar::LinkMode link = vstellar::LinkMode::GSO;
  unsigned threads = 1;   // scale: vstellard --threads
  // scale: device i's QP is connected to device i ^ pair's (a power of
  // two). Devices go to the workers in turn, so with --threads 2 pair 1
  // connects each device to one on the other worker, pair 2 to one on its
  // own.
  uint32_t pair = 1;
  // scale, host: vstellard --placement (peers: a device of a pair split
  // over two workers moves to the other's; fixed: it stays).
  std::string placement = "peers";
  unsigned daemons = 1;  // host: 1 = one daemon for every device, else one each
  bool accel = false;    // write: target MRs in device memory (--memory accel)
  uint32_t mrs = 1;      // write: target MRs, written in turn
};

int Attach(const Args& a) {
  char tmpl[] = "/tmp/vstellard-bench-XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  DaemonOptions o;
  o.socket = std::string(tmpl) + "/s";
  o.pin = a.pin;
  Daemon d(o);
  std::string err;
  if (!d.Start(&err)) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return 1;
  }
  std::thread t([&] { d.Run(); });
  FrontendOptions fo;
  fo.mem_size = a.mem_mib << 20;
  fo.doorbell = true;
  int rc = 0;
  {
    Frontend f(fo);
    const auto t0 = Clock::now();
    bool ok = f.Connect(o.socket, &err, false);
    const auto t1 = Clock::now();
    ok = ok && f.SendMemTable(&err);
    const double attach = Since(t1);
    ok = ok && f.StartQueues(&err);
    CmdResult r;
    if (ok) r = f.Command(VSTELLAR_CMD_QUERY_DEVICE, 0, nullptr, 0, sizeof(vstellar_resp_query_device), 600000);
    const double ready = Since(t0);
    if (!ok || !r.done || r.status() != 0) {
      std::fprintf(stderr, "attach failed: %s\n", err.c_str());
      rc = 1;
    } else {
      auto s = d.Stats();
      const PvdmaStats& p = s.at(0).pvdma;
      std::printf(
          "{\"mode\":\"attach\",\"pin\":\"%s\",\"mem_bytes\":%llu,\"attach_s\":%.6f,\"ready_s\":%.6f,"
          "\"daemon_attach_s\":%.6f,\"bytes_pinned\":%llu,\"blocks_pinned\":%llu,\"lock_errors\":%llu}\n",
          ToString(a.pin), (unsigned long long)fo.mem_size, attach, ready, p.attach_ns / 1e9,
          (unsigned long long)p.bytes_pinned, (unsigned long long)p.blocks_pinned, (unsigned long long)p.lock_errors);
    }
  }
  d.Stop();
  t.join();
  unlink(o.socket.c_str());
  rmdir(tmpl);
  return rc;
}

// Guest RAM holding two MRs of `size` bytes in scrambled 4 KiB pages, and
// with `accel_mrs` > 0, device memory above RAM (an accelerator's BAR: a
// memfd of its own, in the memory table as QEMU hands it) holding that many
// target MRs of `size` bytes, each contiguous, as a dmabuf's pages are.
struct GuestMrs {
  static constexpr uint64_t kAccelGpa = 1ull << 32;
  int fd = -1, accel_fd = -1;
  uint64_t bytes = 0, accel_bytes = 0, accel_stride = 0;
  Pvdma pv{PinMode::kLazy};
  std::vector<uint64_t> src, dst;
  explicit GuestMrs(uint64_t size, uint32_t accel_mrs = 0) {
    const uint64_t np = (size + 4095) / 4096;
    bytes = (2 * np * 4096 + (4ull << 20)) & ~((2ull << 20) - 1);
    fd = memfd_create("guest-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (ftruncate(fd, off_t(bytes)) != 0) std::abort();
    std::vector<uint64_t> all(2 * np);
    for (uint64_t i = 0; i < all.size(); i++) all[i] = (2ull << 20) + i * 4096;
    std::shuffle(all.begin(), all.end(), std::mt19937_64(1));
    src.assign(all.begin(), all.begin() + long(np));
    dst.assign(all.begin() + long(np), all.end());
    std::vector<MemRegion> t(1);
    t[0].gpa = 0;
    t[0].size = bytes;
    t[0].qemu_va = 0x7f0000000000ull;
    t[0].fd = Fd(dup(fd));
    if (accel_mrs) {
      // A buffer of 2 MiB or more starts on a 2 MiB boundary, as the
      // accelerator's allocator would place a large one; smaller ones pack.
      const uint64_t align = size >= (2ull << 20) ? (2ull << 20) : 4096;
      accel_stride = (size + align - 1) & ~(align - 1);
      accel_bytes = accel_stride * accel_mrs;
      accel_fd = memfd_create("accel-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (ftruncate(accel_fd, off_t(accel_bytes)) != 0) std::abort();
      t.resize(2);
      t[1].gpa = kAccelGpa;
      t[1].size = accel_bytes;
      t[1].qemu_va = 0x7f0000000000ull + kAccelGpa;
      t[1].fd = Fd(dup(accel_fd));
    }
    std::string err;
    if (!pv.Attach(t, &err)) std::abort();
  }
  ~GuestMrs() {
    close(fd);
    if (accel_fd >= 0) close(accel_fd);
  }
  std::shared_ptr<vstellar::MemoryTranslator> Make(TranslationMode m, Atc& atc, const std::vector<uint64_t>& pages,
                                                   uint64_t iova, uint64_t len, uint32_t page_shift = 12) {
    MrLayout l;
    l.iova = iova;
    l.length = len;
    l.page_shift = page_shift;
    l.pages = pages;
    uint16_t st;
    if (m == TranslationMode::kEmtt) return EmttTranslator::Create(pv, l, &st);
    return AtcTranslator::Create(pv, atc, l, &st);
  }
  // Target MR i in device memory at iova: the largest page the guest
  // driver's ib_umem_find_best_pgsz would choose for it (2 MiB when the
  // MR is at least that large, 4 KiB otherwise).
  std::shared_ptr<vstellar::MemoryTranslator> MakeAccel(TranslationMode m, Atc& atc, uint32_t i, uint64_t iova,
                                                        uint64_t len) {
    const uint32_t shift = len >= (2ull << 20) ? 21 : 12;
    std::vector<uint64_t> pages;
    for (uint64_t off = 0; off < len; off += 1ull << shift) pages.push_back(kAccelGpa + i * accel_stride + off);
    return Make(m, atc, pages, iova, len, shift);
  }
};

void Report(const Args& a, const char* mode, uint64_t bytes, uint64_t msgs, double secs, const Atc& atc,
            const PvdmaStats& p, const std::string& extra = "") {
  const AtcStats& s = atc.stats();
  std::printf(
      "{\"mode\":\"%s\",\"translation\":\"%s\",\"size\":%llu,\"messages\":%llu,\"seconds\":%.4f,\"gbps\":%.4f,"
      "\"atc_entries\":%zu,\"atc_miss_ns\":%llu,\"atc_lookups\":%llu,\"atc_misses\":%llu,\"atc_evictions\":%llu,"
      "\"bytes_pinned\":%llu%s}\n",
      mode, a.tr == TranslationMode::kAtc ? "atc" : "emtt", (unsigned long long)a.size, (unsigned long long)msgs,
      secs, bytes * 8 / secs / 1e9, atc.capacity(), (unsigned long long)a.atc_miss_ns,
      (unsigned long long)s.lookups, (unsigned long long)s.misses, (unsigned long long)s.evictions,
      (unsigned long long)p.bytes_pinned, extra.c_str());
}

int Dma(const Args& a) {
  GuestMrs g(a.size);
  Atc atc(a.atc_entries, a.atc_miss_ns);
  auto s = g.Make(a.tr, atc, g.src, 0x10000000, a.size);
  auto d = g.Make(a.tr, atc, g.dst, 0x90000000, a.size);
  vstellar::HostSpan in[64], out[64];
  auto copy = [&] {
    // Packet by packet (4 KiB), as the requester gathers and the responder places.
    for (uint64_t off = 0; off < a.size; off += 4096) {
      const uint64_t n = std::min<uint64_t>(4096, a.size - off);
      auto r1 = s->translate(0x10000000 + off, n, false, in, 64);
      auto r2 = d->translate(0x90000000 + off, n, true, out, 64);
      if (!r1.ok || !r2.ok) std::abort();
      std::memcpy(out[0].ptr, in[0].ptr, std::min(in[0].len, out[0].len));
    }
  };
  copy();  // warm: first touch pins
  atc.ResetStats();
  uint64_t msgs = 0;
  const auto t0 = Clock::now();
  do {
    copy();
    msgs++;
  } while (Since(t0) < a.seconds);
  Report(a, "dma", msgs * a.size, msgs, Since(t0), atc, g.pv.stats());
  return 0;
}

class Sink final : public vstellar::RxSink {
 public:
  explicit Sink(vstellar::Engine& e) : e_(e) {}
  void on_datagram(const uint8_t* d, size_t n, const vstellar::Endpoint& f, const vstellar::IpAddr& to, bool ce) override {
    e_.receive(d, n, f, to, ce);
  }
  vstellar::Engine& e_;
};

int Write(const Args& a) {
  if (a.mrs > 1 && !a.accel) {
    std::fprintf(stderr, "--mrs N needs --memory accel\n");
    return 2;
  }
  GuestMrs g(a.size, a.accel ? a.mrs : 0);
  Atc atc(a.atc_entries, a.atc_miss_ns);
  vstellar::UdpLinkConfig lc;
  lc.base_port = a.port;
  lc.num_paths = 16;
  vstellar::UdpLink link(lc);
  if (!link.ok()) {
    std::fprintf(stderr, "udp: %s\n", link.error().c_str());
    return 1;
  }
  vstellar::SteadyClock clk;
  vstellar::EngineConfig ec;
  ec.num_paths = 16;
  ec.validate();
  vstellar::Engine e(ec, link, clk);
  Sink sink(e);
  vstellar::Pd* pa = e.alloc_pd();
  vstellar::Pd* pb = e.alloc_pd();
  vstellar::Mr* ma = e.reg_mr(pa, 0x10000000, a.size, vstellar::ACCESS_LOCAL_WRITE,
                              g.Make(a.tr, atc, g.src, 0x10000000, a.size));
  // The targets: MR i at iova 0x90000000 + i * stride.
  const uint64_t stride = (a.size + 4095) & ~4095ull;
  std::vector<vstellar::Mr*> mbs;
  for (uint32_t i = 0; i < a.mrs; i++) {
    const uint64_t iova = 0x90000000 + i * stride;
    mbs.push_back(e.reg_mr(pb, iova, a.size, vstellar::ACCESS_LOCAL_WRITE | vstellar::ACCESS_REMOTE_WRITE,
                           a.accel ? g.MakeAccel(a.tr, atc, i, iova, a.size)
                           : i == 0 ? g.Make(a.tr, atc, g.dst, iova, a.size)
                                    : nullptr));
    if (!mbs.back()) return 1;
  }
  vstellar::Mr* mb = mbs[0];
  vstellar::Cq* ca = e.create_cq(1024);
  vstellar::Cq* cb = e.create_cq(1024);
  vstellar::QpInitAttr ia;
  ia.send_cq = ia.recv_cq = ca;
  ia.cap.max_send_wr = 256;
  vstellar::QpInitAttr ib = ia;
  ib.send_cq = ib.recv_cq = cb;
  vstellar::Qp* qa = e.create_qp(pa, ia);
  vstellar::Qp* qb = e.create_qp(pb, ib);
  if (!ma || !mb || !qa || !qb) return 1;
  auto connect = [&](vstellar::Qp* q, uint32_t peer) {
    vstellar::QpAttr at;
    at.qp_state = vstellar::QpState::INIT;
    at.qp_access_flags = vstellar::ACCESS_REMOTE_WRITE;
    int r = e.modify_qp(q, at, vstellar::QP_STATE | vstellar::QP_ACCESS_FLAGS | vstellar::QP_PKEY_INDEX | vstellar::QP_PORT);
    at.qp_state = vstellar::QpState::RTR;
    at.ah = {0x7f000001, a.port};
    at.dest_qp_num = peer;
    r |= e.modify_qp(q, at, vstellar::QP_STATE | vstellar::QP_AV | vstellar::QP_PATH_MTU | vstellar::QP_DEST_QPN |
                                vstellar::QP_RQ_PSN | vstellar::QP_MAX_DEST_RD_ATOMIC | vstellar::QP_MIN_RNR_TIMER);
    at.qp_state = vstellar::QpState::RTS;
    r |= e.modify_qp(q, at, vstellar::QP_STATE | vstellar::QP_TIMEOUT | vstellar::QP_RETRY_CNT | vstellar::QP_RNR_RETRY |
                                vstellar::QP_SQ_PSN | vstellar::QP_MAX_QP_RD_ATOMIC);
    return r == 0;
  };
  if (!connect(qa, qb->qpn()) || !connect(qb, qa->qpn())) return 1;
  const uint32_t depth = uint32_t(std::clamp<uint64_t>((16ull << 20) / a.size, 1, 64));
  vstellar::Sge sge{0x10000000, uint32_t(a.size), ma->lkey()};
  vstellar::SendWr wr;
  wr.opcode = vstellar::WrOpcode::RDMA_WRITE;
  wr.send_flags = vstellar::SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.remote_addr = 0x90000000;
  wr.rkey = mb->rkey();
  uint32_t outstanding = 0;
  uint64_t done = 0, errors = 0;
  uint32_t next_mr = 0;
  auto post = [&] {
    wr.remote_addr = 0x90000000 + next_mr * stride;
    wr.rkey = mbs[next_mr]->rkey();
    if (e.post_send(qa, wr) != 0) return false;
    next_mr = (next_mr + 1) % a.mrs;
    return true;
  };
  auto pump = [&] {
    bool more = e.progress();
    link.poll(more ? 0 : 200'000, sink);
    vstellar::Wc wc[32];
    int n;
    while ((n = e.poll_cq(ca, wc, 32)) > 0)
      for (int i = 0; i < n; i++) {
        outstanding--;
        if (wc[i].status == vstellar::WcStatus::SUCCESS) done++;
        else errors++;
      }
  };
  // Warm-up: one message (first touches pin the blocks in both modes).
  for (uint32_t i = 0; i < a.mrs; i++) {
    if (post()) outstanding++;
    while (outstanding) pump();
  }
  atc.ResetStats();
  done = 0;
  const auto t0 = Clock::now();
  double secs = 0;
  for (;;) {
    secs = Since(t0);
    const bool more_time = secs < a.seconds;
    while (more_time && outstanding < depth && post()) outstanding++;
    if (!more_time && outstanding == 0) break;
    if (errors || secs > a.seconds * 20 + 30) break;
    pump();
  }
  secs = Since(t0);
  const auto& st = e.stats();
  char extra[224];
  std::snprintf(extra, sizeof(extra), ",\"errors\":%llu,\"retx_pkts\":%llu,\"depth\":%u,\"memory\":\"%s\",\"mrs\":%u",
                (unsigned long long)errors, (unsigned long long)st.retx_pkts, depth, a.accel ? "accel" : "ram", a.mrs);
  Report(a, "write", done * a.size, done, secs, atc, g.pv.stats(), extra);
  return errors ? 1 : 0;
}

// ---- scale: many devices on one daemon ----

// One device as a guest's driver and provider drive it, reduced to what
// the scale run needs: a user context, PD, CQ (256 CQEs), MR (256 KiB) and
// one RC QP (64 SQ slots of 128 bytes), RDMA WRITEs posted through the
// doorbell page and completions polled by their owner bit. The command
// bodies, the doorbell and the CQE test are the test frontend's
// (tests/vstellard/support); Guest in support/vstellard/datapath_fixture.h
// is the full version, under gtest.
struct ScaleDev {
  static constexpr uint64_t kCq = 0x200000, kSq = 0x210000, kMr = 0x400000, kMrLen = 256 << 10;
  static constexpr uint32_t kLogCqe = 8, kSqLog = 6, kSqStride = 128;
  std::unique_ptr<Frontend> f;
  uint32_t uctx = 0, page = 0, pd = 0, cq = 0, cq_slot = 0, lkey = 0, rkey = 0, qpn = 0, qp_slot = 0;
  uint32_t sq_pi = 0, cq_ci = 0, outstanding = 0;
  uint64_t done = 0, errors = 0;

  // A command's status (0xffff: no answer); the response body into `out`.
  uint16_t Cmd(uint16_t op, uint32_t ctx, const void* b, size_t n, uint32_t resp, void* out = nullptr) {
    CmdResult r = f->Command(op, ctx, b, n, resp, 30000);
    if (!r.done) return 0xffff;
    if (out && r.status() == 0) std::memcpy(out, r.body.data(), std::min<size_t>(resp, r.body.size()));
    return r.status();
  }
  // A CQ of 256 CQEs whose ring is the two pages at `gpa`.
  uint16_t CreateCq(uint64_t gpa, vstellar_resp_create_cq* rc) {
    std::memset(f->mem() + gpa, 0, 8192);
    auto body = CreateCqBody(kLogCqe, gpa);
    return Cmd(VSTELLAR_CMD_CREATE_CQ, uctx, body.data(), body.size(), sizeof(*rc), rc);
  }
  uint16_t RegMr(vstellar_resp_reg_mr* rm) {
    auto body = RegMrBody(pd, kMr, kMrLen, VSTELLAR_ACCESS_VALID);
    return Cmd(VSTELLAR_CMD_REG_MR, uctx, body.data(), body.size(), sizeof(*rm), rm);
  }
  // An RC QP on the device's CQ whose SQ (2 pages) and RQ (1 page) are at `gpa`.
  uint16_t CreateQp(uint64_t gpa, vstellar_resp_create_qp* rq) {
    std::memset(f->mem() + gpa, 0, 3 * 4096);
    vstellar_cmd_create_qp q = RcQpBody(pd, cq);  // kSqLog slots of kSqStride bytes
    q.max_inline_data = 0;  // the WRITEs gather from the MR
    auto body = CreateQpBody(q, gpa);
    return Cmd(VSTELLAR_CMD_CREATE_QP, uctx, body.data(), body.size(), sizeof(*rq), rq);
  }
  bool Setup() {
    vstellar_resp_alloc_ucontext u{};
    if (Cmd(VSTELLAR_CMD_ALLOC_UCONTEXT, 0, nullptr, 0, sizeof(u), &u)) return false;
    uctx = u.ucontext;
    page = u.db_page;
    vstellar_resp_alloc_pd p{};
    if (Cmd(VSTELLAR_CMD_ALLOC_PD, uctx, nullptr, 0, sizeof(p), &p)) return false;
    pd = p.pdn;
    vstellar_resp_create_cq rc{};
    if (CreateCq(kCq, &rc)) return false;
    cq = rc.cqn;
    cq_slot = rc.db_slot;
    vstellar_resp_reg_mr rm{};
    if (RegMr(&rm)) return false;
    lkey = rm.lkey;
    rkey = rm.rkey;
    vstellar_resp_create_qp rq{};
    if (CreateQp(kSq, &rq)) return false;
    qpn = rq.qpn;
    qp_slot = rq.db_slot;
    return true;
  }
  bool Connect(uint32_t dest) { return ConnectQp(qpn, dest); }
  bool ConnectQp(uint32_t qp, uint32_t dest) {
    vstellar_cmd_modify_qp m = RcModifyBody(qp, dest, 5);  // 4096
    const std::pair<uint8_t, uint32_t> steps[] = {
        {VSTELLAR_QPS_INIT, kRcInitMask}, {VSTELLAR_QPS_RTR, kRcRtrMask}, {VSTELLAR_QPS_RTS, kRcRtsMask}};
    for (auto [state, mask] : steps) {
      m.attr.qp_state = state;
      m.attr.attr_mask = mask;
      if (Cmd(VSTELLAR_CMD_MODIFY_QP, uctx, &m, sizeof(m), 0)) return false;
    }
    return true;
  }
  // Keeps `depth` WRITEs of `size` bytes into the peer's MR outstanding.
  void Post(uint32_t depth, uint32_t size, uint32_t peer_rkey) {
    bool posted = false;
    while (outstanding < depth) {
      uint8_t* s = f->mem() + kSq + (sq_pi & ((1u << kSqLog) - 1)) * kSqStride;
      vstellar_send_wqe w{};
      w.wr_id = sq_pi;
      w.opcode = VSTELLAR_WR_RDMA_WRITE;
      w.flags = VSTELLAR_WQE_SIGNALED;
      w.num_sge = 1;
      w.u.rdma.remote_addr = kMr;
      w.u.rdma.rkey = peer_rkey;
      const vstellar_sge sge{kMr, size, lkey};
      std::memcpy(s + sizeof(w), &sge, sizeof(sge));
      std::memcpy(s, &w, sizeof(w));
      sq_pi++;
      outstanding++;
      posted = true;
    }
    if (posted) f->RingDoorbell(page, VSTELLAR_DB_SLOT_SIZE * qp_slot + offsetof(vstellar_db_qp, sq_pi), sq_pi);
  }
  void Reap() {
    for (vstellar_cqe c; f->TakeCqe(kCq, kLogCqe, cq_ci, &c);) {
      cq_ci++;
      f->DoorbellWord(page, VSTELLAR_DB_SLOT_SIZE * cq_slot + offsetof(vstellar_db_cq, ci)).store(htole32(cq_ci));
      outstanding--;
      if (c.status == 0) done++;
      else errors++;
    }
  }
};

// The daemon under test, as its own process (its memory, CPU time and file
// descriptors are then its own): vstellard with --stats-json, which it
// rewrites on SIGUSR1.
class DaemonProcess {
 public:
  // `listen`: how it takes devices (default: --socket DIR/s); socket() is
  // the first path named there.
  DaemonProcess(const std::string& exe, const std::string& dir, const Args& a,
                std::vector<std::string> listen = {}, unsigned threads = 0)
      : dir_(dir) {
    sock_ = dir + "/s";
    stats_ = dir + "/stats.json";
    if (listen.empty()) listen = {"--socket", sock_};
    else sock_ = listen[1].substr(0, listen[1].find(','));
    const std::string port = std::to_string(a.port), link = vstellar::to_string(a.link),
                      burst = a.link == vstellar::LinkMode::GSO ? "16" : "1";
    std::vector<std::string> args = {exe,      "--port",       port,   "--paths",   "16",
                                     "--link", link,           "--path-burst", burst,
                                     "--stats-json", stats_,   "--threads",  std::to_string(threads ? threads : a.threads),
                                     "--placement", a.placement};
    args.insert(args.begin() + 1, listen.begin(), listen.end());
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, (dir + "/log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (posix_spawn(&pid_, exe.c_str(), &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~DaemonProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    for (const char* f : {"/s", "/stats.json", "/stats.json.tmp", "/log"}) unlink((dir_ + f).c_str());
    unlink(sock_.c_str());
  }
  const std::string& socket() const { return sock_; }
  bool WaitListening(double secs) {
    const auto t0 = Clock::now();
    while (Since(t0) < secs) {
      if (pid_ < 0 || waitpid(pid_, nullptr, WNOHANG) != 0) return false;
      int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un sa{};
      sa.sun_family = AF_UNIX;
      std::snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_.c_str());
      const bool up = connect(s, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
      close(s);
      if (up) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  // Its counters, freshly written (SIGUSR1, then wait for the new file).
  std::string Stats() {
    unlink(stats_.c_str());
    kill(pid_, SIGUSR1);
    for (int i = 0; i < 10000; i++) {
      FILE* f = std::fopen(stats_.c_str(), "r");
      if (f) {
        std::string s;
        char b[65536];
        for (size_t n; (n = std::fread(b, 1, sizeof(b), f)) > 0;) s.append(b, n);
        std::fclose(f);
        return s;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return "";
  }
  uint64_t Status(const char* key) {  // a /proc/PID/status field, kB fields in bytes
    FILE* f = std::fopen(("/proc/" + std::to_string(pid_) + "/status").c_str(), "r");
    if (!f) return 0;
    char line[256];
    uint64_t v = 0;
    const size_t kl = std::strlen(key);
    while (std::fgets(line, sizeof(line), f))
      if (!std::strncmp(line, key, kl) && line[kl] == ':') {
        v = std::strtoull(line + kl + 1, nullptr, 10);
        if (std::strstr(line, "kB")) v <<= 10;
      }
    std::fclose(f);
    return v;
  }
  double CpuSeconds() {  // utime + stime from /proc/PID/stat
    FILE* f = std::fopen(("/proc/" + std::to_string(pid_) + "/stat").c_str(), "r");
    if (!f) return 0;
    char b[1024];
    const size_t n = std::fread(b, 1, sizeof(b) - 1, f);
    std::fclose(f);
    b[n] = 0;
    const char* p = std::strrchr(b, ')');
    unsigned long long ut = 0, st = 0;
    if (p) std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st);
    return double(ut + st) / double(sysconf(_SC_CLK_TCK));
  }

 private:
  std::string dir_, sock_, stats_;
  pid_t pid_ = -1;
};

uint64_t JsonNumber(const std::string& j, const std::string& key, size_t from = 0) {
  const size_t at = j.find("\"" + key + "\":", from);
  return at == std::string::npos ? 0 : std::strtoull(j.c_str() + at + key.size() + 3, nullptr, 10);
}

size_t LiveDevices(const std::string& j) {
  size_t n = 0;
  for (size_t at = 0; (at = j.find("\"closed\":false", at)) != std::string::npos; at++) n++;
  return n;
}

// The daemon binary: --vstellard, or the build tree's
// (build/tools/bench/vstellard/ -> build/qemu-device/vstellard/vstellard).
std::string DaemonExe(const Args& a) {
  if (!a.vstellard.empty()) return a.vstellard;
  char self[4096];
  const ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string exe(self, k > 0 ? size_t(k) : 0);
  return exe.substr(0, exe.rfind('/')) + "/../../../qemu-device/vstellard/vstellard";
}

// Connects devs[i] (8 MiB guests) one after the other, each until its first
// control command is answered; each device's time into *attach_s.
bool AttachDevices(DaemonProcess& d, std::vector<ScaleDev>& devs, std::vector<double>* attach_s, std::string* err) {
  for (ScaleDev& dev : devs) {
    FrontendOptions fo;
    fo.mem_size = 8ull << 20;
    dev.f = std::make_unique<Frontend>(fo);
    const auto t0 = Clock::now();
    bool ok = dev.f->Connect(d.socket(), err) && dev.f->StartQueues(err);
    CmdResult r;
    if (ok) r = dev.f->Command(VSTELLAR_CMD_QUERY_DEVICE, 0, nullptr, 0, sizeof(vstellar_resp_query_device), 30000);
    ok = ok && r.done && r.status() == 0;
    attach_s->push_back(Since(t0));
    if (!ok) return false;
  }
  return true;
}

// The daemon's CPU time and sleeps (voluntary context switches) per second
// over two idle seconds.
void IdleCost(DaemonProcess& d, double* cpu, uint64_t* sleeps) {
  const double c0 = d.CpuSeconds();
  const uint64_t s0 = d.Status("voluntary_ctxt_switches");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  *cpu = (d.CpuSeconds() - c0) / 2;
  *sleeps = (d.Status("voluntary_ctxt_switches") - s0) / 2;
}

// What the hostile device got before it was refused, and the statuses
// that refused it.
struct HostileTake {
  uint32_t qps = 0, cqs = 0, mrs = 0;
  uint16_t qp_status = 0, cq_status = 0, mr_status = 0;
};

// One more device (64 MiB guest) takes all it can: QPs, all connected and
// so in the engine's RTS list, then CQs, then MRs, until the device's
// limits or its memory budget refuse.
bool TakeAllItCan(DaemonProcess& d, ScaleDev& h, HostileTake* got, std::string* err) {
  FrontendOptions fo;
  fo.mem_size = 64ull << 20;
  h.f = std::make_unique<Frontend>(fo);
  if (!h.f->Connect(d.socket(), err) || !h.f->StartQueues(err) || !h.Setup()) return false;
  std::vector<uint32_t> qpns{h.qpn};
  for (vstellar_resp_create_qp rq{}; (got->qp_status = h.CreateQp(0x1000000 + 0x4000ull * qpns.size(), &rq)) == 0;)
    qpns.push_back(rq.qpn);
  for (size_t i = 0; i + 1 < qpns.size(); i += 2)
    if (!h.ConnectQp(qpns[i], qpns[i + 1]) || !h.ConnectQp(qpns[i + 1], qpns[i])) return false;
  got->qps = uint32_t(qpns.size());
  got->cqs = 1;
  for (vstellar_resp_create_cq rc{}; (got->cq_status = h.CreateCq(0x2000000 + 0x2000ull * got->cqs, &rc)) == 0;)
    got->cqs++;
  got->mrs = 1;
  for (vstellar_resp_reg_mr rm{}; (got->mr_status = h.RegMr(&rm)) == 0;) got->mrs++;
  return true;
}

// What the busy run measured.
struct BusyRun {
  double jain = 0, gbps = 0, daemon_cpu = 0;
  uint64_t min_done = 0, max_done = 0, errors = 0;
};

// Every device keeps `depth` WRITEs of `size` bytes to its partner
// (device i ^ a.pair) in flight for a.seconds after 200 ms of warm-up;
// then what is in flight finishes (at most 10 s).
BusyRun WriteToPartners(const std::function<double()>& cpu_seconds, std::vector<ScaleDev>& devs, const Args& a,
                        uint32_t size, uint32_t depth) {
  BusyRun b;
  const uint32_t n = uint32_t(devs.size());
  const auto tb = Clock::now();
  const auto warm_end = tb + std::chrono::milliseconds(200);
  bool counting = false;
  double c0 = 0;
  while (Since(tb) < a.seconds + 0.2) {
    if (!counting && Clock::now() >= warm_end) {
      for (auto& v : devs) v.done = 0;
      counting = true;
      c0 = cpu_seconds();
    }
    uint64_t before = 0, after = 0;
    for (uint32_t i = 0; i < n; i++) {
      ScaleDev& v = devs[i];
      before += v.done + v.errors;
      v.Reap();
      after += v.done + v.errors;
      if ((i ^ a.pair) < n) v.Post(depth, size, devs[i ^ a.pair].rkey);
    }
    // Nothing completed: leave the cores to the daemon for a moment
    // (guests' vCPUs would not spin on 64 CQs either).
    if (after == before) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  b.daemon_cpu = (cpu_seconds() - c0) / a.seconds;
  double sum = 0, sq = 0;
  b.min_done = ~0ull;
  for (auto& v : devs) {
    sum += double(v.done);
    sq += double(v.done) * double(v.done);
    b.min_done = std::min(b.min_done, v.done);
    b.max_done = std::max(b.max_done, v.done);
    b.errors += v.errors;
  }
  b.jain = sq > 0 ? sum * sum / (double(n) * sq) : 0;
  b.gbps = sum * size * 8 / a.seconds / 1e9;
  const auto td = Clock::now();
  for (bool left = true; left && Since(td) < 10;) {
    left = false;
    for (auto& v : devs) {
      v.Reap();
      left |= v.outstanding > 0;
    }
  }
  return b;
}

// Until the daemon has destroyed every device (at most 60 s).
void WaitAllDestroyed(DaemonProcess& d) {
  for (const auto t0 = Clock::now(); LiveDevices(d.Stats()) > 0 && Since(t0) < 60;)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// n devices again, set up, paired (0-1, 2-3, ...) and connected, then gone.
bool SecondRound(DaemonProcess& d, uint32_t n, std::string* err) {
  std::vector<ScaleDev> devs(n);
  bool ok = true;
  for (uint32_t i = 0; i < n && ok; i++) {
    FrontendOptions fo;
    fo.mem_size = 8ull << 20;
    devs[i].f = std::make_unique<Frontend>(fo);
    ok = devs[i].f->Connect(d.socket(), err) && devs[i].f->StartQueues(err) && devs[i].Setup();
  }
  for (uint32_t i = 0; i + 1 < n && ok; i += 2) ok = devs[i].Connect(devs[i + 1].qpn) && devs[i + 1].Connect(devs[i].qpn);
  devs.clear();
  WaitAllDestroyed(d);
  return ok;
}

// N devices on one vstellard process (with the UDP engine): each gets a
// context, PD, CQ, MR and an RC QP connected to its neighbour's. Measured
// on the daemon's process: attach time, memory (private and shared, bare
// and with the objects; the accounted budget), idle CPU time and sleeps
// (voluntary context switches) bare and with connected QPs; with
// --seconds > 0, every device WRITEs to its neighbour for that long and
// Jain's index of the messages each completed is reported; then all
// frontends close and the time until the daemon has destroyed every device.
int Scale(const Args& a) {
  // About a dozen descriptors per device on the frontends' side.
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  const std::string exe = DaemonExe(a);
  char tmpl[] = "/tmp/vstellard-bench-XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  int rc = 0;
  {
    DaemonProcess d(exe, tmpl, a);
    if (!d.WaitListening(10)) {
      std::fprintf(stderr, "scale: %s did not start (see its log)\n", exe.c_str());
      rmdir(tmpl);
      return 1;
    }
    const uint32_t n = uint32_t(a.devices);
    std::vector<ScaleDev> devs(n);
    std::vector<double> attach_s;
    auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); };  // > poll_us
    settle();
    const uint64_t anon0 = d.Status("RssAnon"), shm0 = d.Status("RssShmem");
    std::string err;
    const auto ta = Clock::now();
    bool ok = AttachDevices(d, devs, &attach_s, &err);
    const double attach_total = Since(ta);
    settle();
    const uint64_t anon1 = d.Status("RssAnon"), shm1 = d.Status("RssShmem");
    double idle_bare = 0, idle_qps = 0;
    uint64_t sleeps_bare = 0, sleeps_qps = 0;
    if (ok) IdleCost(d, &idle_bare, &sleeps_bare);
    const auto tsu = Clock::now();
    for (uint32_t i = 0; i < n && ok; i++) ok = devs[i].Setup();
    for (uint32_t i = 0; i < n && ok; i++)
      if ((i ^ a.pair) < n) ok = devs[i].Connect(devs[i ^ a.pair].qpn);
    const double setup_total = Since(tsu);
    // Hostile: one more device takes all it can, then stays idle while the
    // others work.
    ScaleDev h;
    HostileTake took;
    if (ok && a.hostile) ok = TakeAllItCan(d, h, &took, &err);
    settle();
    const uint64_t anon2 = d.Status("RssAnon"), shm2 = d.Status("RssShmem");
    std::string j = d.Stats();
    const uint64_t accounted = JsonNumber(j, "used", j.find("\"memory\":{\"limit\""));
    const size_t live = LiveDevices(j);
    if (ok) IdleCost(d, &idle_qps, &sleeps_qps);
    // Busy: every device keeps `depth` WRITEs to its neighbour in flight.
    const uint32_t size = uint32_t(std::min<uint64_t>(a.size, ScaleDev::kMrLen)), depth = 8;
    BusyRun busy;
    if (ok && a.seconds > 0 && n >= 2) busy = WriteToPartners([&] { return d.CpuSeconds(); }, devs, a, size, depth);
    j = d.Stats();
    const size_t eng = j.find("\"engine\":");
    const uint64_t retx = JsonNumber(j, "retx_pkts", eng), timeouts = JsonNumber(j, "timeouts", eng);
    const uint64_t forwarded = JsonNumber(j, "forwarded");  // between worker threads
    const uint64_t moves = JsonNumber(j, "device_moves");   // to their peers' worker
    const auto tdown = Clock::now();
    devs.clear();
    h.f.reset();
    WaitAllDestroyed(d);
    const double destroy_total = Since(tdown);
    settle();
    const uint64_t anon3 = d.Status("RssAnon");
    // A second round of the same devices: a daemon that leaked would grow
    // again; one whose allocator kept the freed memory reuses it.
    if (ok) ok = SecondRound(d, n, &err);
    settle();
    const uint64_t anon4 = d.Status("RssAnon");
    if (!ok) {
      std::fprintf(stderr, "scale: a device failed to attach or set up: %s\n", err.c_str());
      rc = 1;
    } else {
      std::sort(attach_s.begin(), attach_s.end());
      auto pct = [&](double p) { return attach_s[std::min(attach_s.size() - 1, size_t(p * double(attach_s.size())))]; };
      auto per = [&](uint64_t hi, uint64_t lo) { return (double(hi) - double(lo)) / n; };
      std::printf(
          "{\"mode\":\"scale\",\"threads\":%u,\"pair\":%u,\"devices\":%u,\"live\":%zu,\"link\":\"%s\",\"attach_s_per_device\":%.6f,"
          "\"attach_p50_s\":%.6f,\"attach_p99_s\":%.6f,\"setup_s_per_device\":%.6f,\"destroy_s_per_device\":%.6f,"
          "\"rss_anon_per_device\":%.0f,\"rss_shmem_per_device\":%.0f,\"rss_anon_per_device_with_objects\":%.0f,"
          "\"rss_shmem_per_device_with_objects\":%.0f,\"accounted_per_device\":%.0f,\"rss_anon_base\":%llu,"
          "\"rss_anon_after_destroy\":%llu,\"rss_anon_after_second_round\":%llu,\"idle_cpu_bare\":%.5f,\"idle_sleeps_bare\":%llu,\"idle_cpu_qps\":%.5f,"
          "\"idle_sleeps_qps\":%llu,\"busy_seconds\":%.2f,\"busy_size\":%u,\"busy_gbps\":%.3f,\"busy_daemon_cpu\":%.3f,"
          "\"jain\":%.4f,\"min_msgs\":%llu,\"max_msgs\":%llu,\"errors\":%llu,\"retx_pkts\":%llu,\"timeouts\":%llu,"
          "\"forwarded\":%llu,\"device_moves\":%llu,\"placement\":\"%s\","
          "\"hostile\":%s,\"hostile_qps\":%u,\"hostile_cqs\":%u,\"hostile_mrs\":%u,\"hostile_qp_status\":%u,"
          "\"hostile_cq_status\":%u,\"hostile_mr_status\":%u,\"daemon_rss_anon_peak\":%llu}\n",
          a.threads, a.pair, n, live, vstellar::to_string(a.link), attach_total / n, pct(0.5), pct(0.99), setup_total / n,
          destroy_total / n, per(anon1, anon0), per(shm1, shm0), per(anon2, anon0), per(shm2, shm0),
          double(accounted) / n, (unsigned long long)anon0, (unsigned long long)anon3, (unsigned long long)anon4, idle_bare,
          (unsigned long long)sleeps_bare, idle_qps, (unsigned long long)sleeps_qps, a.seconds, size, busy.gbps,
          busy.daemon_cpu, busy.jain, (unsigned long long)busy.min_done, (unsigned long long)busy.max_done,
          (unsigned long long)busy.errors,
          (unsigned long long)retx, (unsigned long long)timeouts, (unsigned long long)forwarded, (unsigned long long)moves, a.placement.c_str(), a.hostile ? "true" : "false", took.qps, took.cqs, took.mrs,
          took.qp_status, took.cq_status, took.mr_status, (unsigned long long)anon2);
      rc = busy.errors ? 1 : 0;
    }
  }
  rmdir(tmpl);
  return rc;
}

// ---- host: one daemon for a host's guests, or one daemon each ----

// N devices in pairs (0-1, 2-3, ...) WRITE to each other for a.seconds:
// either all on one vstellard (--daemons 1, with a.threads workers), each
// attached through its own --device socket with its own address
// 127.0.0.<i+1>, or each on a vstellard of its own (one thread, bound to
// 127.0.0.<i+1>), as a host gave every guest its own daemon before
// addresses per device. Reports goodput and the daemons' CPU time, so
// goodput per CPU-second compares the two shapes.
int Host(const Args& a) {
  const std::string exe = DaemonExe(a);
  char tmpl[] = "/tmp/vstellard-host-XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  const std::string dir = tmpl;
  const uint32_t n = uint32_t(a.devices & ~uint64_t{1});
  auto ip = [](uint32_t i) { return "127.0.0." + std::to_string(i + 1); };
  std::vector<std::unique_ptr<DaemonProcess>> daemons;
  std::vector<std::string> sockets;
  if (a.daemons == 1) {
    std::vector<std::string> listen;
    for (uint32_t i = 0; i < n; i++) {
      sockets.push_back(dir + "/d" + std::to_string(i));
      listen.insert(listen.end(), {"--device", sockets.back() + ",ip=" + ip(i)});
    }
    daemons.push_back(std::make_unique<DaemonProcess>(exe, dir, a, listen));
  } else {
    for (uint32_t i = 0; i < n; i++) {
      const std::string sub = dir + "/" + std::to_string(i);
      mkdir(sub.c_str(), 0700);
      sockets.push_back(sub + "/s");
      daemons.push_back(std::make_unique<DaemonProcess>(
          exe, sub, a, std::vector<std::string>{"--socket", sockets.back(), "--ip", ip(i)}, 1));
    }
  }
  int rc = 1;
  std::string err;
  bool ok = true;
  for (auto& d : daemons) ok = ok && d->WaitListening(10);
  std::vector<ScaleDev> devs(n);
  for (uint32_t i = 0; i < n && ok; i++) {
    FrontendOptions fo;
    fo.mem_size = 8ull << 20;
    devs[i].f = std::make_unique<Frontend>(fo);
    ok = devs[i].f->Connect(sockets[i], &err) && devs[i].f->StartQueues(&err) && devs[i].Setup();
    vstellar_cmd_gid g{};  // the device's address, as the guest's GID cache adds it
    g.port = 1;
    g.gid[10] = g.gid[11] = 0xff;
    g.gid[12] = 127;
    g.gid[15] = uint8_t(i + 1);
    g.gid_type = VSTELLAR_GID_TYPE_ROCE_V2;
    ok = ok && devs[i].Cmd(VSTELLAR_CMD_ADD_GID, 0, &g, sizeof(g), 0) == 0;
  }
  for (uint32_t i = 0; i < n && ok; i++) {
    vstellar_cmd_modify_qp m = RcModifyBody(devs[i].qpn, devs[i ^ 1].qpn, 5);
    m.attr.av.dgid[15] = uint8_t((i ^ 1) + 1);
    for (auto [state, mask] : {std::pair{VSTELLAR_QPS_INIT, kRcInitMask}, std::pair{VSTELLAR_QPS_RTR, kRcRtrMask},
                               std::pair{VSTELLAR_QPS_RTS, kRcRtsMask}}) {
      m.attr.qp_state = uint8_t(state);
      m.attr.attr_mask = mask;
      ok = ok && devs[i].Cmd(VSTELLAR_CMD_MODIFY_QP, devs[i].uctx, &m, sizeof(m), 0) == 0;
    }
  }
  if (ok) {
    Args w = a;
    w.pair = 1;
    const uint32_t size = uint32_t(std::min<uint64_t>(a.size, ScaleDev::kMrLen));
    auto cpu = [&] {
      double s = 0;
      for (auto& d : daemons) s += d->CpuSeconds();
      return s;
    };
    const BusyRun b = WriteToPartners(cpu, devs, w, size, 8);
    std::printf("{\"mode\":\"host\",\"devices\":%u,\"daemons\":%zu,\"threads\":%u,\"size\":%u,\"seconds\":%.2f,"
                "\"gbps\":%.3f,\"daemon_cpu\":%.3f,\"gb_per_cpu_s\":%.4f,\"jain\":%.4f,\"errors\":%llu}\n",
                n, daemons.size(), a.daemons == 1 ? a.threads : 1u, size, a.seconds, b.gbps, b.daemon_cpu,
                b.daemon_cpu > 0 ? b.gbps / 8 / b.daemon_cpu : 0.0, b.jain, (unsigned long long)b.errors);
    rc = b.errors ? 1 : 0;
  } else {
    std::fprintf(stderr, "host: a device failed to attach or connect: %s\n", err.c_str());
  }
  devs.clear();
  daemons.clear();
  for (const std::string& s : sockets) unlink(s.c_str());
  if (a.daemons != 1)
    for (uint32_t i = 0; i < n; i++) rmdir((dir + "/" + std::to_string(i)).c_str());
  rmdir(tmpl);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s attach|write|dma|scale|host [options]\n", argv[0]);
    return 2;
  }
  Args a;
  a.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mem-mib") a.mem_mib = std::stoull(v);
    else if (k == "--pin") a.pin = v == "eager" ? PinMode::kEager : PinMode::kLazy;
    else if (k == "--translation") a.tr = v == "atc" ? TranslationMode::kAtc : TranslationMode::kEmtt;
    else if (k == "--size") a.size = std::stoull(v);
    else if (k == "--seconds") a.seconds = std::stod(v);
    else if (k == "--atc-entries") a.atc_entries = std::stoull(v);
    else if (k == "--atc-miss-ns") a.atc_miss_ns = std::stoull(v);
    else if (k == "--port") a.port = uint16_t(std::stoul(v));
    else if (k == "--devices") a.devices = std::stoull(v);
    else if (k == "--vstellard") a.vstellard = v;
    else if (k == "--hostile") a.hostile = v == "1";
    else if (k == "--threads") a.threads = unsigned(std::stoul(v));
    else if (k == "--pair") a.pair = uint32_t(std::stoul(v));
    else if (k == "--placement") a.placement = v;
    else if (k == "--daemons") a.daemons = unsigned(std::stoul(v));
    else if (k == "--memory") a.accel = v == "accel";
    else if (k == "--mrs") a.mrs = std::max(1u, unsigned(std::stoul(v)));
    else if (k == "--link") {
      if (!vstellar::parse_link_mode(v, a.link)) return 2;
    }
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (a.mode == "attach") return Attach(a);
  if (a.mode == "write") return Write(a);
  if (a.mode == "dma") return Dma(a);
  if (a.mode == "scale") return Scale(a);
  if (a.mode == "host") return Host(a);
  std::fprintf(stderr, "unknown mode %s\n", a.mode.c_str());
  return 2;
}
