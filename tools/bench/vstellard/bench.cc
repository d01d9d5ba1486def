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
//   vstellard_bench dma ...same options...
//     The translation cost alone: copy MR to MR through the translators
//     (what the engine does per packet), no network.
// Each prints one JSON object.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
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

// Guest RAM holding two MRs of `size` bytes in scrambled 4 KiB pages.
struct GuestMrs {
  int fd = -1;
  uint64_t bytes = 0;
  Pvdma pv{PinMode::kLazy};
  std::vector<uint64_t> src, dst;
  explicit GuestMrs(uint64_t size) {
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
    std::string err;
    if (!pv.Attach(t, &err)) std::abort();
  }
  ~GuestMrs() { close(fd); }
  std::shared_ptr<vstellar::MemoryTranslator> Make(TranslationMode m, Atc& atc, const std::vector<uint64_t>& pages,
                                                   uint64_t iova, uint64_t len) {
    MrLayout l;
    l.iova = iova;
    l.length = len;
    l.page_shift = 12;
    l.pages = pages;
    uint16_t st;
    if (m == TranslationMode::kEmtt) return EmttTranslator::Create(pv, l, &st);
    return AtcTranslator::Create(pv, atc, l, &st);
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
  void on_datagram(const uint8_t* d, size_t n, const vstellar::Endpoint& f, uint16_t, bool ce) override {
    e_.receive(d, n, f, ce);
  }
  vstellar::Engine& e_;
};

int Write(const Args& a) {
  GuestMrs g(a.size);
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
  vstellar::Mr* mb = e.reg_mr(pb, 0x90000000, a.size, vstellar::ACCESS_LOCAL_WRITE | vstellar::ACCESS_REMOTE_WRITE,
                              g.Make(a.tr, atc, g.dst, 0x90000000, a.size));
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
  if (e.post_send(qa, wr) == 0) outstanding++;
  while (outstanding) pump();
  atc.ResetStats();
  done = 0;
  const auto t0 = Clock::now();
  double secs = 0;
  for (;;) {
    secs = Since(t0);
    const bool more_time = secs < a.seconds;
    while (more_time && outstanding < depth && e.post_send(qa, wr) == 0) outstanding++;
    if (!more_time && outstanding == 0) break;
    if (errors || secs > a.seconds * 20 + 30) break;
    pump();
  }
  secs = Since(t0);
  const auto& st = e.stats();
  char extra[160];
  std::snprintf(extra, sizeof(extra), ",\"errors\":%llu,\"retx_pkts\":%llu,\"depth\":%u",
                (unsigned long long)errors, (unsigned long long)st.retx_pkts, depth);
  Report(a, "write", done * a.size, done, secs, atc, g.pv.stats(), extra);
  return errors ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s attach|write|dma [options]\n", argv[0]);
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
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (a.mode == "attach") return Attach(a);
  if (a.mode == "write") return Write(a);
  if (a.mode == "dma") return Dma(a);
  std::fprintf(stderr, "unknown mode %s\n", a.mode.c_str());
  return 2;
}
