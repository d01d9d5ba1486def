// On-demand translators (MemoryTranslator::on_demand, what vstellard's ODP
// MRs plug in): a responder refuses with RNR until the pages are there, a
// requester waits before its first packet, and pages taken away in the
// middle of a message cost resends, never a failed work request.
#include <random>
#include <set>

#include "sim_pair.h"

namespace vstellar::test {
namespace {

constexpr uint64_t kPage = 4096;

// Host memory that answers only for the pages in `present`, and reports
// the others as faults (as vstellard's OdpTranslator asks its guest).
class OnDemandMemory final : public MemoryTranslator {
 public:
  std::set<uint64_t> present;  // page numbers (address / 4096)
  std::set<uint64_t> faults;
  int calls = 0;
  std::function<void(OnDemandMemory&)> hook;  // after each call

  bool on_demand() const override { return true; }
  TranslateResult translate(uint64_t iova, uint64_t len, bool, HostSpan* out, size_t max_out) override {
    calls++;
    TranslateResult r = lookup(iova, len, out, max_out);
    if (hook) hook(*this);
    return r;
  }
  void add(uint64_t addr, uint64_t len) {
    for (uint64_t p = addr / kPage; p <= (addr + len - 1) / kPage; p++) present.insert(p);
  }
  void remove(uint64_t addr, uint64_t len) {
    for (uint64_t p = addr / kPage; p <= (addr + len - 1) / kPage; p++) present.erase(p);
  }

 private:
  TranslateResult lookup(uint64_t iova, uint64_t len, HostSpan* out, size_t max_out) {
    TranslateResult r;
    uint64_t a = iova, left = len;
    while (left && r.count < max_out) {
      if (!present.count(a / kPage)) {
        if (r.covered) break;
        faults.insert(a / kPage);
        r.fault = true;
        return r;
      }
      const uint64_t n = std::min(left, kPage - a % kPage);
      out[r.count++] = {reinterpret_cast<uint8_t*>(uintptr_t(a)), size_t(n)};
      r.covered += n;
      a += n;
      left -= n;
    }
    r.ok = true;
    return r;
  }
};

// Side s's buffer registered again, on demand.
Mr* OnDemandMr(Side& s, std::shared_ptr<OnDemandMemory> m) {
  return s.eng->reg_mr(s.pd, s.addr(0), s.buf.size(),
                       ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC, m);
}

void Fill(Side& s, uint64_t off, uint64_t len, uint8_t seed) {
  for (uint64_t i = 0; i < len; i++) s.buf[off + i] = uint8_t(seed + i * 13);
}

}  // namespace

TEST(OnDemand, ResponderRefusesWithRnrUntilThePagesAreMapped) {
  Pair t;
  auto mem = std::make_shared<OnDemandMemory>();
  Mr* odp = OnDemandMr(t.b, mem);
  ASSERT_NE(odp, nullptr);
  t.b.mr = odp;
  Fill(t.a, 0, 65536, 5);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 65536, 0x10000), 0);
  t.net.run_for(5'000'000);
  Wc wc[4];
  EXPECT_EQ(t.a.eng->poll_cq(t.a.scq, wc, 4), 0);  // still waiting, not failed
  EXPECT_GT(t.b.eng->stats().page_fault_naks, 0u);
  EXPECT_TRUE(mem->faults.count(t.b.addr(0x10000) / kPage));
  mem->add(t.b.addr(0x10000), 65536);
  auto done = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.b.buf.data() + 0x10000, t.a.buf.data(), 65536), 0);

  // A READ and an atomic of pages not mapped wait the same way.
  mem->present.clear();
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 2, 0x40000, 65536, 0x10000), 0);
  ASSERT_EQ(t.post_fetch_add(t.a, 3, 0x60000, 0x20000, 7), 0);
  t.net.run_for(5'000'000);
  EXPECT_EQ(t.a.eng->poll_cq(t.a.scq, wc, 4), 0);
  mem->add(t.b.addr(0), t.b.buf.size());
  done = t.wait(t.a, t.a.scq, 2);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(done[1].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data() + 0x40000, t.a.buf.data(), 65536), 0);
}

TEST(OnDemand, RequesterWaitsForItsPagesBeforeTheFirstPacket) {
  Pair t;
  auto mem = std::make_shared<OnDemandMemory>();
  Mr* odp = OnDemandMr(t.a, mem);
  ASSERT_NE(odp, nullptr);
  Mr* plain = t.a.mr;
  t.a.mr = odp;
  Fill(t.a, 0, 65536, 9);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 65536, 0), 0);
  t.net.run_for(20'000'000);  // 20 ms: twenty poll periods
  Wc wc[4];
  EXPECT_EQ(t.a.eng->poll_cq(t.a.scq, wc, 4), 0);
  EXPECT_EQ(t.a.eng->stats().data_pkts_sent, 0u);
  EXPECT_EQ(t.a.eng->stats().page_fault_waits, 1u);
  EXPECT_TRUE(t.a.eng->take_stalled().empty());
  EXPECT_EQ(t.a.eng->audit(false), "");
  mem->add(t.a.addr(0), 65536);
  t.a.eng->pages_mapped();
  auto done = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.b.buf.data(), t.a.buf.data(), 65536), 0);
  t.a.mr = plain;
}

TEST(OnDemand, PagesTakenAwayMidMessageAreResentNotFailed) {
  PairOptions o;
  o.path_mtu = MTU_1024;
  Pair t(o);
  auto mem = std::make_shared<OnDemandMemory>();
  Mr* odp = OnDemandMr(t.a, mem);
  ASSERT_NE(odp, nullptr);
  t.a.mr = odp;
  constexpr uint64_t kLen = 256 * 1024;
  mem->add(t.a.addr(0), kLen);
  Fill(t.a, 0, kLen, 3);
  // Once the WQE has started and some packets left, the owner takes pages
  // 40-59 back; after a few faults on them it maps them again.
  int faults_seen = 0;
  mem->hook = [&, taken = false](OnDemandMemory& m) mutable {
    if (!taken && m.calls == 20) {
      m.remove(t.a.addr(40 * kPage), 20 * kPage);
      taken = true;
    } else if (taken && m.faults.size() > 0 && ++faults_seen == 40) {
      m.add(t.a.addr(0), kLen);
    }
  };
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, kLen, 0), 0);
  auto done = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::SUCCESS);
  EXPECT_GT(t.a.eng->stats().page_fault_drops, 0u);
  EXPECT_EQ(std::memcmp(t.b.buf.data(), t.a.buf.data(), kLen), 0);
}

// The owner of a responder's on-demand pages takes 2 MiB of them away in
// the middle of each message pair (as the guest kernel does: reclaim, THP
// collapse, migration; between two passes of the engine, as vstellard's
// one thread per device serves the driver's invalidations between them)
// while WRITEs and READs of 1 MiB run over a network that loses 1% of the
// packets, and maps faulted pages again 300 us after it is asked. Every
// work request completes, successfully, with the right bytes. This found
// a READ on RNR hold that nothing woke once its last packets were
// answered (EngineCore::rnr_wake_ns), re-requests of faulted pages left
// unanswered until the retry limit failed the QP, and lost packets an RNR
// NAK re-armed being lost twice (inflight off by a packet).
TEST(OnDemand, ReadsAndWritesCompleteWhilePagesComeAndGo) {
  uint64_t fault_naks = 0;
  for (uint64_t seed = 1; seed <= 16; seed++) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    PairOptions o;
    o.path_mtu = MTU_1024;
    o.seed = seed;
    o.buf_size = 4 << 20;
    Pair t(o);
    t.net.impairment.loss = seed % 4 ? 0.01 : 0;
    t.net.impairment.jitter_ns = 20'000;
    auto mem = std::make_shared<OnDemandMemory>();
    Mr* odp = OnDemandMr(t.b, mem);
    ASSERT_NE(odp, nullptr);
    t.b.mr = odp;
    constexpr uint64_t kMsg = 1 << 20;
    mem->add(t.b.addr(0), t.b.buf.size());
    std::mt19937_64 rng(seed);
    uint64_t asked_ns = 0, steps = 0, take_at = 0;
    // One step: 100 us of the network, then the owner's turn.
    auto step = [&] {
      t.net.run_for(100'000);
      const uint64_t now = t.net.now_ns();
      if (!mem->faults.empty() && !asked_ns) asked_ns = now;
      if (asked_ns && now - asked_ns >= 300'000) {  // the driver served the fault
        for (uint64_t p : mem->faults) mem->present.insert(p);
        mem->faults.clear();
        asked_ns = 0;
      }
      if (++steps == take_at) mem->remove(t.b.addr((rng() % 2) * (2 << 20)), 2 << 20);
    };
    Fill(t.a, 0, kMsg, uint8_t(seed));
    for (int k = 0; k < 8; k++) {
      const uint64_t roff = (k % 4) * kMsg, into = kMsg + (k % 2) * kMsg;
      steps = 0;
      take_at = 1 + rng() % 8;
      ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, kMsg, roff), 0);
      ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 2, into, kMsg, roff), 0);
      std::vector<Wc> done;
      for (uint64_t end = t.net.now_ns() + 60'000'000'000ull; done.size() < 2 && t.net.now_ns() < end;) {
        step();
        Wc wc[4];
        for (int n; (n = t.a.eng->poll_cq(t.a.scq, wc, 4)) > 0;) done.insert(done.end(), wc, wc + n);
      }
      ASSERT_EQ(done.size(), 2u) << "message " << k << " never completed";
      ASSERT_EQ(done[0].status, WcStatus::SUCCESS) << "WRITE " << k;
      ASSERT_EQ(done[1].status, WcStatus::SUCCESS) << "READ " << k;
      ASSERT_EQ(std::memcmp(t.a.buf.data() + into, t.a.buf.data(), kMsg), 0) << "message " << k;
    }
    fault_naks += t.b.eng->stats().page_fault_naks;
  }
  EXPECT_GT(fault_naks, 100u);  // the pages did go away under the traffic
}

}  // namespace vstellar::test
