// Micro-benchmarks of the engine's per-packet costs, without real I/O.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "integrity.h"  // engine/src: the packet MAC and the replay window
#include "vstellar/engine.h"
#include "vstellar/harness/harness.h"
#include "vstellar/sim_net.h"
#include "vstellar/telemetry/fault_locator.h"
#include "vstellar/wire.h"

using namespace vstellar;

static void BM_WireParseData(benchmark::State& st) {
  wire::Base b;
  b.op = wire::Op::WRITE;
  b.payload_len = 4096;
  wire::DataExt e;
  std::vector<uint8_t> v(wire::kMaxHeaderLen + 4096);
  size_t hl = wire::encode(b, e, v.data());
  v.resize(hl + 4096);
  wire::Packet p;
  for (auto _ : st) benchmark::DoNotOptimize(wire::parse(v.data(), v.size(), p));
}
BENCHMARK(BM_WireParseData);

static void BM_WireEncodeAck(benchmark::State& st) {
  wire::Base b;
  b.op = wire::Op::ACK;
  wire::AckExt a;
  a.sack_words = 16;
  uint8_t buf[wire::kMaxHeaderLen + 128];
  for (auto _ : st) benchmark::DoNotOptimize(wire::encode(b, a, buf));
}
BENCHMARK(BM_WireEncodeAck);

static void BM_PathPick(benchmark::State& st) {
  PathSelector s(PathAlgo(st.range(0)), 128, 1);
  for (auto _ : st) benchmark::DoNotOptimize(s.pick(4096));
}
BENCHMARK(BM_PathPick)->Arg(int(PathAlgo::OBS))->Arg(int(PathAlgo::RR))->Arg(int(PathAlgo::DWRR))->Arg(int(PathAlgo::BEST_RTT));

// RESET -> RTS for an RC QP whose peer engine is at `ip` (both benchmarks).
static void connect_rc(Engine& e, Qp* qp, Qp* peer, uint32_t ip) {
  QpAttr at;
  at.qp_state = QpState::INIT;
  at.qp_access_flags = ACCESS_REMOTE_WRITE;
  e.modify_qp(qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS);
  at.qp_state = QpState::RTR;
  at.dest_qp_num = peer->qpn();
  at.ah = {ip, 1};
  e.modify_qp(qp, at, QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN |
                          QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER);
  at.qp_state = QpState::RTS;
  e.modify_qp(qp, at, QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY |
                          QP_MAX_QP_RD_ATOMIC);
}

// A signaled RDMA WRITE of `sg` to the start of `to`, which `to_mr`
// registers (both benchmarks post it).
static SendWr write_wr(Sge* sg, std::vector<uint8_t>& to, Mr* to_mr) {
  SendWr wr;
  wr.opcode = WrOpcode::RDMA_WRITE;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = sg;
  wr.num_sge = 1;
  wr.remote_addr = uint64_t(uintptr_t(to.data()));
  wr.rkey = to_mr->rkey();
  return wr;
}

// Two engines on the simulated network, nodes 1 (a) and 2 (b), each with a
// PD, a CQ, a 1 MiB buffer registered for local and remote writes, and an RC
// QP connected to the other's: what both benchmarks WRITE across, a to b.
struct SimPair {
  Engine a, b;
  std::vector<uint8_t> ba = std::vector<uint8_t>(1 << 20, 1);
  std::vector<uint8_t> bb = std::vector<uint8_t>(1 << 20, 0);
  Cq *ca, *cb;
  Mr *ma, *mb;
  Qp *qa, *qb;

  SimPair(SimNet& net, const EngineConfig& cfg)
      : a(cfg, net.add_node(1), net), b(cfg, net.add_node(2), net) {
    net.attach(1, &a);
    net.attach(2, &b);
    open(a, ba, ca, ma, qa);
    open(b, bb, cb, mb, qb);
    connect_rc(a, qa, qb, 2);
    connect_rc(b, qb, qa, 1);
  }

  static void open(Engine& e, std::vector<uint8_t>& buf, Cq*& cq, Mr*& mr, Qp*& qp) {
    Pd* pd = e.alloc_pd();
    cq = e.create_cq(1024);
    mr = e.reg_mr(pd, uint64_t(uintptr_t(buf.data())), buf.size(),
                  ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE, std::make_shared<HostMemory>());
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = cq;
    qp = e.create_qp(pd, ia);
  }
};

// Two engines over the simulated network (no loss): engine CPU per byte for
// a 1 MiB WRITE, both sides, including the simulator's copies.
static void BM_SimWrite1M(benchmark::State& st) {
  SimNet net;
  SimPair p(net, EngineConfig{});
  Sge sg{uint64_t(uintptr_t(p.ba.data())), 1 << 20, p.ma->lkey()};
  SendWr wr = write_wr(&sg, p.bb, p.mb);
  for (auto _ : st) {
    p.a.post_send(p.qa, wr);
    Wc wc;
    net.run_until([&] { return p.a.poll_cq(p.ca, &wc, 1) == 1; });
  }
  st.SetBytesProcessed(int64_t(st.iterations()) << 20);
}
BENCHMARK(BM_SimWrite1M)->Unit(benchmark::kMicrosecond);

// Goodput under loss without host noise: two engines on the simulated
// network (25 Gb/s bottleneck per receiver, 5 us delay, 2 us jitter), 1% loss
// on one of 60 emulated uplinks (the harness's link hash; path 0's link, so
// one path crosses it), 64 MiB of 1 MiB WRITEs, 16 outstanding. Goodput is
// in virtual time, so it measures the transport, not the machine.
static void BM_SimLossGoodput(benchmark::State& st) {
  const uint16_t paths = uint16_t(st.range(0));
  const double loss = double(st.range(1)) / 1000.0;
  double gbps = 0, retx = 0, dropped = 0;
  for (auto _ : st) {
    SimNet net(7);
    net.impairment.downlink.rate_bps = 25'000'000'000ull;
    net.impairment.delay_ns = 5'000;
    net.impairment.jitter_ns = 2'000;
    uint32_t lossy = harness::link_of(0, 60);
    std::mt19937_64 rng(11);
    uint64_t drops = 0;
    net.tap = [&](uint32_t, uint32_t, uint16_t path, std::vector<uint8_t>&) {
      if (harness::link_of(path, 60) == lossy && std::uniform_real_distribution<double>(0, 1)(rng) < loss) {
        drops++;
        return false;
      }
      return true;
    };
    EngineConfig cfg;
    cfg.num_paths = paths;
    SimPair p(net, cfg);
    Engine& a = p.a;
    Sge sg{uint64_t(uintptr_t(p.ba.data())), 1 << 20, p.ma->lkey()};
    SendWr wr = write_wr(&sg, p.bb, p.mb);
    const int total = 64;
    int posted = 0, done = 0;
    for (; posted < 16; posted++) a.post_send(p.qa, wr);
    uint64_t t0 = net.now_ns();
    net.run_until([&] {
      Wc wc[16];
      int n = a.poll_cq(p.ca, wc, 16);
      for (int i = 0; i < n; i++) {
        done++;
        if (posted < total) {
          a.post_send(p.qa, wr);
          posted++;
        }
      }
      return done >= total;
    }, 60'000'000'000ull);
    gbps = double(total) * (1 << 20) * 8 / double(net.now_ns() - t0);
    retx = double(a.stats().retx_pkts);
    dropped = double(drops);
  }
  st.counters["goodput_gbps"] = gbps;
  st.counters["retx_pkts"] = retx;
  st.counters["dropped"] = dropped;
}
BENCHMARK(BM_SimLossGoodput)->Args({128, 0})->Args({128, 10})->Args({1, 0})->Args({1, 10})
    ->Iterations(1)->Unit(benchmark::kMillisecond);

// Integrity mode, one 4 KiB WRITE packet: seal it, then verify it as the
// receiver does, with the replay window (first arg 1) or without (0), so the
// ratio of the two is what refusing replays costs per packet; second arg:
// the MAC (1 ChaCha20-Poly1305, 2 AES-GMAC).
static void BM_SealVerify4K(benchmark::State& st) {
  if (!PacketMac::Init()) st.SkipWithError("libsodium");
  const bool window = st.range(0) != 0;
  const auto alg = MacAlgorithm(st.range(1));
  if (!PacketMac::Usable(alg)) st.SkipWithError("this CPU cannot run the algorithm");
  MacKey shared;
  shared.fill(7);
  MacSender tx{PacketMac::ConnectionKey(shared, 0x123, 0x456), PacketMac::FirstCounter()};
  const MacKey rx = tx.key;
  PacketMac mac(alg, PacketMac::RandomSalt());
  ReplayWindow seen;
  std::vector<uint8_t> payload(4096, 0x5a);
  uint8_t hdr[56] = {0x10, 3};
  std::vector<uint8_t> pkt(PacketMac::kPrefixLen + sizeof(hdr) + payload.size());
  std::memcpy(pkt.data() + PacketMac::kPrefixLen, hdr, sizeof(hdr));
  std::memcpy(pkt.data() + PacketMac::kPrefixLen + sizeof(hdr), payload.data(), payload.size());
  const HostSpan span{payload.data(), payload.size()};
  for (auto _ : st) {
    mac.Sign(tx, hdr, sizeof(hdr), &span, 1, pkt.data());
    bool ok = PacketMac::Verify(alg, rx, pkt.data(), pkt.size());
    if (window) ok = ok && seen.Admit(PacketMac::Counter(pkt.data()));
    benchmark::DoNotOptimize(ok);
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(payload.size()));
}
BENCHMARK(BM_SealVerify4K)->Args({0, 1})->Args({1, 1})->Args({0, 2})->Args({1, 2});

BENCHMARK_MAIN();

// The fault locator's steady cost (issue 31's "less than 1% of a core at
// 128 paths per connection and 64 connections"): one tick (every 100 ms)
// over 64 peers of 128 paths each, routes known (3 hops through one of 4
// aggregation switches), every path carrying traffic, nothing broken.
// CPU share of one core = time per tick / 100 ms.
namespace {
// Answers as a two-tier Clos would: TTL 1 the ToR, 2 the path's
// aggregation switch (path % 4), 3 the far ToR; TTL 4 reaches the peer.
class ClosProbes : public vstellar::telemetry::ProbeSender {
 public:
  bool send_probe(const Endpoint&, uint16_t path, uint8_t ttl, uint32_t id) override {
    if (ttl <= 3) {
      vstellar::telemetry::HopReply r;
      r.id = id;
      r.hop = IpAddr(0x0a090000 + ttl * 16 + (ttl == 1 ? 0 : path % 4));
      pending.push_back(r);
    }
    return true;
  }
  std::vector<vstellar::telemetry::HopReply> pending;
};
}  // namespace

static void BM_LocatorTick64Peers(benchmark::State& st) {
  using vstellar::telemetry::FaultLocator;
  ClosProbes probes;
  vstellar::telemetry::LocatorConfig cfg;
  FaultLocator loc(cfg, IpAddr(0x0a000001), probes);
  std::map<Endpoint, std::vector<PathHealth>> health;
  for (uint32_t p = 0; p < 64; p++) health[Endpoint{IpAddr(0x0b000000 + p), 4791}].resize(128);
  uint64_t now = 1'000'000'000;
  auto advance = [&] {
    for (auto& [peer, paths] : health)
      for (PathHealth& h : paths) {
        h.sent += 20;
        h.delivered += 19;
        h.answered += 1;
        h.rtt_sum_ns += 50'000;
      }
    now += cfg.tick_ns;
  };
  // Learn the routes.
  for (int t = 0; t < 400; t++) {
    advance();
    loc.tick(now, health);
    for (vstellar::telemetry::HopReply& r : probes.pending) {
      r.at_ns = now + 100'000;
      loc.on_reply(r);
    }
    probes.pending.clear();
  }
  double spent_ns = 0;
  for (auto _ : st) {
    advance();
    const auto t0 = std::chrono::steady_clock::now();
    loc.tick(now, health);
    spent_ns += double(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  }
  // Percent of one core: the time of a tick over the tick's period.
  st.counters["core_pct"] = 100 * spent_ns / double(st.iterations()) / double(cfg.tick_ns);
  st.counters["routes_known"] = double(loc.stats().routes_known);
}
BENCHMARK(BM_LocatorTick64Peers)->Unit(benchmark::kMicrosecond);
