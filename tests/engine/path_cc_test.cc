// Path selection and congestion control.
#include <set>

#include "engine_internal.h"  // white box: the QP's congestion state
#include "sim_pair.h"

namespace vstellar::test {
namespace {

TEST(Paths, ObsSpreadsEvenly) {
  PathSelector s(PathAlgo::OBS, 128, 42);
  std::vector<int> n(128);
  for (int i = 0; i < 128 * 1000; i++) n[s.pick(4096)]++;
  for (int c : n) {
    EXPECT_GT(c, 800);
    EXPECT_LT(c, 1200);
  }
}

TEST(Paths, RoundRobinAndSingle) {
  PathSelector rr(PathAlgo::RR, 8, 1);
  uint16_t first = rr.pick(1);
  for (int i = 1; i < 20; i++) EXPECT_EQ(rr.pick(1), (first + i) % 8);
  PathSelector one(PathAlgo::SINGLE, 8, 1, 5);
  for (int i = 0; i < 20; i++) EXPECT_EQ(one.pick(1), 5);
}

// REPS: paths come back for reuse when their ACKs are clean (no CE, an
// RTT near the connection's smallest). With the paths behind one of four
// "uplinks" (path % 4 == 0) congested, REPS moves its load off that
// uplink; OBS keeps a quarter there. With every ACK congested, REPS
// explores like OBS.
TEST(Paths, RepsReusesPathsThatDeliverWithoutCongestion) {
  auto share_on_congested = [](PathAlgo algo, bool all_congested) {
    PathSelector s(algo, 128, 7);
    int on_bad = 0;
    std::set<uint16_t> used;
    for (int i = 0; i < 40000; i++) {
      const uint16_t p = s.pick(4096);
      used.insert(p);
      const bool bad = all_congested || p % 4 == 0;
      on_bad += p % 4 == 0;
      s.on_ack(p, bad ? 30'000 : 10'000, bad);
    }
    return std::make_pair(on_bad / 40000.0, used.size());
  };
  const auto [obs, obs_used] = share_on_congested(PathAlgo::OBS, false);
  const auto [reps, reps_used] = share_on_congested(PathAlgo::REPS, false);
  EXPECT_GT(obs, 0.2);
  EXPECT_LT(reps, 0.05) << "REPS kept sending into the congested uplink";
  EXPECT_GT(reps_used, 64u) << "REPS should still use many clean paths";
  const auto [explore, explore_used] = share_on_congested(PathAlgo::REPS, true);
  EXPECT_GT(explore, 0.2);
  EXPECT_EQ(explore_used, 128u);
  PathAlgo parsed;
  ASSERT_TRUE(parse_path_algo("reps", parsed));
  EXPECT_EQ(parsed, PathAlgo::REPS);
}

// Bursts: OBS and RR keep a path for `burst` first
// transmissions; a retransmission neither uses nor ends the run, a timeout
// on the run's path ends it.
TEST(Paths, BurstKeepsAPathForRuns) {
  PathSelector rr(PathAlgo::RR, 8, 1, 0, 4);
  const uint16_t first = rr.pick(1);
  for (int run = 0; run < 5; run++)
    for (int i = run ? 0 : 1; i < 4; i++) {
      EXPECT_EQ(rr.pick(1), (first + run) % 8) << run << " " << i;
    }
  PathSelector obs(PathAlgo::OBS, 128, 42, 0, 16);
  std::set<uint16_t> runs;
  for (int run = 0; run < 64; run++) {
    const uint16_t p = obs.pick(4096);
    runs.insert(p);
    for (int i = 1; i < 16; i++) {
      if (i == 5) {
        EXPECT_NE(obs.pick_retx(p, 4096), p);
      }
      ASSERT_EQ(obs.pick(4096), p);
    }
  }
  EXPECT_GT(runs.size(), 30u);  // the runs themselves are sprayed
  const uint16_t p = obs.pick(4096);
  obs.on_timeout(p, 1000);
  // The run ended: the next pick draws again (it may draw p by chance, but
  // not sixteen times in a row).
  int same = 0;
  for (int i = 0; i < 15; i++) same += obs.pick(4096) == p;
  EXPECT_LT(same, 15);
  PathSelector one(PathAlgo::SINGLE, 8, 1, 5, 16);
  for (int i = 0; i < 40; i++) EXPECT_EQ(one.pick(1), 5);
}

// While paths fail, runs would hide them: after a path is set aside, OBS
// and RR pick a path per packet for 4 x num_paths picks, so every path
// gets tried within them; then runs resume. A timeout on a path already
// set aside (its probe) does not start this again.
TEST(Paths, APathSetAsideMakesRunsSinglePacketsForAWhile) {
  for (PathAlgo a : {PathAlgo::OBS, PathAlgo::RR}) {
    PathSelector s(a, 128, 42, 0, 16);
    const uint16_t dead = s.pick(4096);
    s.on_timeout(dead, 1000);
    std::set<uint16_t> seen;
    int repeats = 0;
    uint16_t prev = s.pick(4096);
    for (int i = 1; i < 4 * 128; i++) {
      const uint16_t p = s.pick(4096);
      EXPECT_NE(p, dead) << to_string(a);
      seen.insert(p);
      repeats += p == prev;
      prev = p;
    }
    EXPECT_LT(repeats, 16) << to_string(a);             // no runs: a repeat is chance (1/127)
    EXPECT_GT(seen.size(), 120u) << to_string(a);       // every healthy path tried
    // Then runs of 16 again.
    const uint16_t run = s.pick(4096);
    for (int i = 1; i < 16; i++) EXPECT_EQ(s.pick(4096), run) << to_string(a) << " " << i;
    s.on_timeout(dead, 2000);  // down already: no new failure
    const uint16_t next = s.pick(4096);
    for (int i = 1; i < 16; i++) EXPECT_EQ(s.pick(4096), next) << to_string(a) << " " << i;
  }
}

TEST(Paths, RetransmissionAvoidsThePathThatLost) {
  for (PathAlgo a : {PathAlgo::OBS, PathAlgo::RR, PathAlgo::DWRR, PathAlgo::BEST_RTT}) {
    PathSelector s(a, 4, 3);
    for (int i = 0; i < 1000; i++) EXPECT_NE(s.pick_retx(uint16_t(i % 4), 4096), i % 4);
  }
}

TEST(Paths, DwrrShiftsLoadAwayFromTimeouts) {
  PathSelector s(PathAlgo::DWRR, 4, 3);
  for (int i = 0; i < 6; i++) s.on_timeout(2, 1000 * i);
  s.on_ack(2, 0);  // back in after a probe, with its weight still low
  std::vector<int> n(4);
  for (int i = 0; i < 40000; i++) n[s.pick(4096)]++;
  EXPECT_LT(n[2] * 10, n[0]);
  EXPECT_GT(n[2], 0);
}

TEST(Paths, BestRttPrefersTheFastPath) {
  PathSelector s(PathAlgo::BEST_RTT, 8, 3);
  for (int p = 0; p < 8; p++) s.on_ack(uint16_t(p), p == 6 ? 10'000 : 50'000);
  std::vector<int> n(8);
  for (int i = 0; i < 1600; i++) n[s.pick(4096)]++;
  EXPECT_GT(n[6], 1300);
}

// A black hole silences its paths, and their RTT estimates stay as they
// were before it: better than those of the live paths the load moves to.
// After a set-aside, BestRTT first spreads its picks to find the other dead
// paths at once, then trusts only paths heard from since.
TEST(Paths, BestRttAfterASetAsideExploresThenTrustsOnlyFreshSamples) {
  PathSelector s(PathAlgo::BEST_RTT, 8, 0x9E3779B97F4A7C15ull);  // mixed, as QPs' seeds are
  for (int p = 0; p < 8; p++) s.on_ack(uint16_t(p), p == 2 ? 5'000 : p == 5 ? 7'000 : 50'000);
  s.on_timeout(2, 1000);  // the best path died
  std::set<uint16_t> seen;
  for (int i = 0; i < 4 * 8; i++) {
    const uint16_t p = s.pick(4096);
    EXPECT_NE(p, 2);
    seen.insert(p);
  }
  EXPECT_GE(seen.size(), 6u);  // spread over the 7 live paths, not herded on 5
  s.on_ack(6, 30'000);  // the one path heard from since the failure
  std::vector<int> n(8);
  for (int i = 0; i < 1600; i++) n[s.pick(4096)]++;
  EXPECT_GT(n[6], 1300);
  EXPECT_LT(n[5], 50);  // 7 us, but from before the failure: only explored
  EXPECT_EQ(n[2], 0);
}

TEST(Paths, EngineSpraysOverAllPaths) {
  PairOptions o;
  o.buf_size = 4 << 20;
  Pair t(o);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 4 << 20, 0), 0);
  ASSERT_EQ(t.wait(t.a, t.a.scq, 1).size(), 1u);
  int used = 0;
  for (auto& p : t.a.eng->stats().paths) used += p.tx_pkts > 0;
  EXPECT_GE(used, 120);  // 1024 packets over 128 paths
}

TEST(Cc, EcnAndDelayShrinkTheWindowLossDoesNot) {
  CcConfig c;
  c.init_cwnd = 1 << 20;
  c.max_cwnd = 4 << 20;
  c.target_delay_ns = 100'000;
  CongestionControl cc(c, 4096);
  uint32_t psn = 0;
  // No signal: grows.
  for (int i = 0; i < 1000; i++, psn += 8) cc.on_ack(8 * 4096, 8, 0, 20'000, psn, psn + 256);
  uint64_t grown = cc.cwnd();
  EXPECT_GT(grown, uint64_t(1) << 20);
  // All packets CE-marked: shrinks.
  for (int i = 0; i < 1000; i++, psn += 8) cc.on_ack(8 * 4096, 8, 8, 20'000, psn, psn + 64);
  uint64_t marked = cc.cwnd();
  EXPECT_LT(marked, grown / 4);
  EXPECT_GT(cc.alpha(), 0.5);
  // Delay above target: shrinks too.
  CongestionControl d(c, 4096);
  psn = 0;
  for (int i = 0; i < 200; i++, psn += 8) d.on_ack(8 * 4096, 8, 0, 400'000, psn, psn + 64);
  EXPECT_LT(d.cwnd(), uint64_t(1) << 19);
  EXPECT_GE(d.cwnd(), c.min_cwnd);
}

TEST(Cc, BottleneckWithEcnStillDeliversAndMarksShrinkWindow) {
  PairOptions o;
  o.buf_size = 8 << 20;
  o.cfg.cc.init_cwnd = 4 << 20;
  Pair t(o);
  t.net.impairment.downlink.rate_bps = 10'000'000'000ull;  // 10 Gb/s
  t.net.impairment.downlink.ecn_bytes = 25'000;  // 20 us of it
  fill_random(t.a.buf.data(), 8 << 20, 1);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 8 << 20, 0), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 8 << 20), 0);
  EXPECT_GT(t.net.stats.ce, 0u);
  EXPECT_LT(impl(t.a.qp)->cc.cwnd(), uint64_t(4) << 20);
}

TEST(Cc, CeMarkedReadResponsesShrinkTheRequestersWindow) {
  // READ data flows responder -> requester; the marks it carries are the
  // requester's congestion signal (there is no ACK to echo them).
  PairOptions o;
  o.buf_size = 8 << 20;
  o.cfg.cc.init_cwnd = 4 << 20;
  Pair t(o);
  t.net.impairment.ce_rate = 0.5;
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 1, 0, 8 << 20, 0), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_GT(impl(t.a.qp)->cc.alpha(), 0.05);
  EXPECT_LT(impl(t.a.qp)->cc.cwnd(), uint64_t(4) << 20);
}

TEST(Cc, QueueAtABottleneckCausesNoSpuriousResends) {
  // The window builds a queue of a few hundred microseconds at a 25 Gb/s
  // bottleneck; the RTO must track it instead of firing on packets that are
  // only queued.
  PairOptions o;
  o.buf_size = 4 << 20;
  Pair t(o);
  t.net.impairment.downlink.rate_bps = 25'000'000'000ull;
  t.net.impairment.jitter_ns = 2'000;
  for (int i = 0; i < 16; i++) ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, i, 0, 4 << 20, 0), 0);
  auto wc = t.wait(t.a, t.a.scq, 16);
  ASSERT_EQ(wc.size(), 16u);
  EXPECT_EQ(t.a.eng->stats().timeouts, 0u);
  EXPECT_EQ(t.a.eng->stats().retx_pkts, 0u);
  EXPECT_EQ(t.b.eng->stats().dup_pkts, 0u);
  EXPECT_GT(impl(t.a.qp)->srtt, 100'000u);  // a real queue did build up
}

TEST(Engine, IdleEngineHasNoDeadline) {
  PairOptions o;
  o.cfg.rto_ns = 300'000;
  Pair t(o);
  EXPECT_EQ(t.a.eng->next_deadline(), UINT64_MAX);
  t.net.impairment.loss = 1.0;
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 64, 0), 0);
  uint64_t now = t.net.now_ns();
  t.a.eng->progress();
  EXPECT_EQ(t.a.eng->next_deadline(), now + 300'000);
  t.net.impairment.loss = 0;
  ASSERT_EQ(t.wait(t.a, t.a.scq, 1).size(), 1u);
  t.net.run_for(1'000'000);
  EXPECT_EQ(t.a.eng->next_deadline(), UINT64_MAX);
}

}  // namespace
}  // namespace vstellar::test

namespace vstellar::test {
namespace {

TEST(Paths, AcksAreSprayedToo) {
  // ACKs take the connection's path choice like data (OBS: a random path
  // each), so the reverse direction's uplinks share them; also from a
  // responder that stays in RTR, as perftest's servers do.
  PairOptions o;
  o.cfg.num_paths = 8;
  o.buf_size = 4 << 20;
  o.connect = false;
  Pair t(o);
  ASSERT_EQ(Pair::to_init(t.a, o.access), 0);
  ASSERT_EQ(Pair::to_init(t.b, o.access), 0);
  ASSERT_EQ(t.to_rtr(t.a, t.b), 0);
  ASSERT_EQ(t.to_rtr(t.b, t.a), 0);
  ASSERT_EQ(t.to_rts(t.a), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 4 << 20, 0), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  const EngineStats& s = t.b.eng->stats();
  int used = 0;
  for (const PathCounters& p : s.paths) used += p.tx_pkts > 0;
  EXPECT_GT(s.acks_sent, 16u);
  EXPECT_EQ(used, 8) << "ACKs sent: " << s.acks_sent;
}

}  // namespace
}  // namespace vstellar::test
