// The vstellar engine as the transport of ns-3 hosts on a 16-host
// leaf-spine fabric (qemu-device/ns3/topologies/leaf-spine-16.conf: 4 ToRs
// of 4 hosts, 4 spines). Behaviour only, no timing thresholds: data arrives
// intact, nothing fails, and the fabric's per-flow ECMP spreads a sprayed
// connection over every uplink while a single-path one stays on one.
#include <gtest/gtest.h>
#include <ns3/simulator.h>

#include "vstellar/ns3/topology.h"
#include "vstellar/ns3/workload.h"

namespace vstellar::ns3sim {
namespace {

TopologyConfig load(const std::string& file) {
  TopologyConfig c;
  std::string err;
  EXPECT_TRUE(load_topology(std::string(VSTELLAR_TOPOLOGIES) + "/" + file, c, err)) << err;
  return c;
}

WorkloadOptions options(PathAlgo algo, uint16_t paths) {
  WorkloadOptions o;
  o.engine.path_algo = algo;
  o.engine.num_paths = paths;
  o.engine.audit = true;  // every engine pass checks the liveness rules
  o.msg_bytes = 64 * 1024;
  o.depth = 4;
  o.messages = 16;
  return o;
}

// Each test builds its own fabric; ns-3's simulator is process-wide, so
// it is destroyed after each (hosts and fabric first).
class Ns3 : public ::testing::Test {
 protected:
  void TearDown() override { ns3::Simulator::Destroy(); }
};

void expect_all_delivered(Workload& w, const std::string& what) {
  EXPECT_TRUE(w.all_done()) << what;
  for (const ConnectionResult& r : w.results()) {
    EXPECT_EQ(r.failed, 0u) << what << ": " << r.src << "->" << r.dst << " first error "
                            << r.first_error;
    EXPECT_EQ(r.completed, 16u) << what << ": " << r.src << "->" << r.dst;
    EXPECT_TRUE(r.verified) << what << ": " << r.src << "->" << r.dst << " data differs";
  }
  for (uint32_t h = 0; h < 16; h++)
    EXPECT_EQ(w.host(h).engine().audit_log(), "") << what << ": host " << h;
}

std::vector<uint64_t> uplink_pkts(Fabric& f, uint32_t tor) {
  std::vector<uint64_t> v;
  for (const Fabric::Port* p : f.uplinks(tor)) v.push_back(p->stats().pkts);
  return v;
}

TEST_F(Ns3, TopologyFileParses) {
  TopologyConfig c = load("leaf-spine-16.conf");
  EXPECT_EQ(c.hosts(), 16u);
  EXPECT_EQ(c.spine_count(), 4u);
  TopologyConfig o = load("leaf-spine-128-2to1.conf");
  EXPECT_EQ(o.hosts(), 128u);
  EXPECT_EQ(o.spine_count(), 2u);  // 16 x 100 Gb/s down, 2:1, 400 Gb/s up
  std::string err;
  TopologyConfig bad;
  EXPECT_FALSE(parse_topology("tors = 4\nwidth = 3\n", bad, err));
  EXPECT_NE(err.find("unknown key"), std::string::npos) << err;
  EXPECT_FALSE(parse_topology("buffer = lots\n", bad, err));
  EXPECT_FALSE(parse_topology("tiers = 4\n", bad, err));
  EXPECT_FALSE(parse_topology("tiers = 3\npods = 3\ntors = 4\n", bad, err));  // pods do not divide ToRs
  EXPECT_NE(err.find("multiple"), std::string::npos) << err;
  TopologyConfig t3 = load("fat-tree-16.conf");
  EXPECT_EQ(t3.tiers, 3);
  EXPECT_EQ(t3.tors_per_pod(), 2u);
  EXPECT_EQ(t3.agg_count(), 2u);
  EXPECT_EQ(t3.spine_count(), 4u);
  TopologyConfig big = load("fat-tree-1024.conf");
  EXPECT_EQ(big.hosts(), 1024u);
}

// Three tiers: a permutation across pods arrives intact; a sprayed
// connection between pods uses all of its ToR's uplinks and every spine
// of the fabric (4 ECMP choices on the way), single path one of each;
// a spine that drops everything is routed around.
TEST_F(Ns3, ThreeTierFatTreeSpraysOverEverySpine) {
  {
    Fabric f(load("fat-tree-16.conf"));
    Workload w(f, options(PathAlgo::OBS, 128), permutation(16, 4, 1));
    w.run();
    expect_all_delivered(w, "three tiers, permutation");
  }
  ns3::Simulator::Destroy();
  auto spine_pkts = [](Fabric& f) {
    std::vector<uint64_t> v(4);
    for (const Fabric::Port& p : f.ports())
      if (p.name.rfind("spine", 0) == 0) v[std::stoul(p.name.substr(5))] += p.stats().pkts;
    return v;
  };
  for (PathAlgo algo : {PathAlgo::SINGLE, PathAlgo::OBS}) {
    std::string what = to_string(algo);
    {
      // Host 0 (pod 0) to host 8 (pod 1): the data crosses a spine.
      Fabric f(load("fat-tree-16.conf"));
      Workload w(f, options(algo, algo == PathAlgo::SINGLE ? 1 : 128), {{0, 8}});
      w.run();
      expect_all_delivered(w, what);
      size_t up = 0, spines = 0;
      for (uint64_t n : uplink_pkts(f, 0)) up += n > 0;
      for (uint64_t n : spine_pkts(f)) spines += n > 0;
      if (algo == PathAlgo::SINGLE) {
        EXPECT_EQ(up, 1u) << what;
        EXPECT_LE(spines, 2u) << what;  // the data's spine, and the ACKs'
      } else {
        EXPECT_EQ(up, 2u) << what;
        EXPECT_EQ(spines, 4u) << what;
      }
    }
    ns3::Simulator::Destroy();
  }
  Fabric f(load("fat-tree-16.conf"));
  f.black_hole("spine2");
  Workload w(f, options(PathAlgo::OBS, 128), {{0, 8}, {5, 13}});
  w.run();
  expect_all_delivered(w, "three tiers, black-hole spine");
  EXPECT_GT(w.host(0).engine().stats().paths_set_aside, 0u);
}

// A ring collective (the proxy for a ring allreduce): 16 ranks placed at
// random, 30 steps each, step k of a rank waiting for step k-1 of the
// rank before it. Everything arrives, single path and sprayed; the steps
// really wait (in simulated time the chained ring ends later than the
// same WRITEs without the waits), and no rank runs ahead of its
// predecessor's data.
TEST_F(Ns3, RingCollectiveStepsWaitForTheirPredecessor) {
  std::vector<uint64_t> end;
  for (bool chained : {false, true}) {
    for (PathAlgo algo : {PathAlgo::SINGLE, PathAlgo::OBS}) {
      std::string what = std::string(chained ? "chained " : "free ") + to_string(algo);
      {
        Fabric f(load("fat-tree-16.conf"));
        WorkloadOptions o = options(algo, algo == PathAlgo::SINGLE ? 1 : 128);
        o.msg_bytes = 16 * 1024;
        o.depth = 1;
        o.messages = 30;
        auto conns = ring(16, 3);
        ASSERT_EQ(conns.size(), 16u);
        for (uint32_t r = 0; r < 16; r++) EXPECT_EQ(conns[r].second, conns[(r + 1) % 16].first);
        Workload w(f, o, conns);
        if (chained) w.chain(ring_after(16));
        w.run();
        EXPECT_TRUE(w.all_done()) << what;
        for (const ConnectionResult& r : w.results()) {
          EXPECT_EQ(r.completed, 30u) << what;
          EXPECT_TRUE(r.verified) << what;
        }
        uint64_t last = 0;
        for (const ConnectionResult& r : w.results()) last = std::max(last, r.finish_ns);
        end.push_back(last);
      }
      ns3::Simulator::Destroy();
    }
  }
  EXPECT_GT(end[2], end[0]) << "single path: the chained ring waited";
  EXPECT_GT(end[3], end[1]) << "sprayed: the chained ring waited";
}

TEST_F(Ns3, PermutationOfWritesArrivesIntact) {
  Fabric f(load("leaf-spine-16.conf"));
  WorkloadOptions o = options(PathAlgo::OBS, 128);
  o.series_bin_ns = 10'000;
  Workload w(f, o, permutation(16, 4, 1));
  ASSERT_EQ(w.results().size(), 16u);
  w.run();
  expect_all_delivered(w, "obs 128 paths");
  // Every ToR sent over all four of its uplinks.
  for (uint32_t t = 0; t < 4; t++)
    for (uint64_t n : uplink_pkts(f, t)) EXPECT_GT(n, 0u) << "tor " << t;
  // The goodput series (exp_recovery) counts every completed byte once, in
  // the interval of its completion.
  uint64_t sum = 0, last = 0;
  for (uint64_t b : w.goodput_series()) sum += b;
  for (const ConnectionResult& r : w.results()) last = std::max(last, r.finish_ns);
  EXPECT_EQ(sum, 16u * 16u * 64u * 1024u);
  EXPECT_EQ(w.goodput_series().size(), last / 10'000 + 1);
  EXPECT_GT(w.goodput_series().back(), 0u);
}

TEST_F(Ns3, SinglePathStaysOnOneUplinkSprayingUsesAll) {
  // One connection, host 0 (ToR 0) to host 4 (ToR 1): single path puts
  // every data packet on one of ToR 0's uplinks (its ACKs on one of ToR
  // 1's); 128 sprayed paths reach all four.
  for (PathAlgo algo : {PathAlgo::SINGLE, PathAlgo::OBS}) {
    std::string what = to_string(algo);
    {
      Fabric f(load("leaf-spine-16.conf"));
      Workload w(f, options(algo, algo == PathAlgo::SINGLE ? 1 : 128), {{0, 4}});
      w.run();
      expect_all_delivered(w, what);
      for (uint32_t t : {0u, 1u}) {
        std::vector<uint64_t> up = uplink_pkts(f, t);
        size_t used = 0;
        for (uint64_t n : up) used += n > 0;
        if (algo == PathAlgo::SINGLE)
          EXPECT_EQ(used, 1u) << what << " tor " << t;
        else
          EXPECT_EQ(used, 4u) << what << " tor " << t;
      }
      // Nothing crossed ToRs 2 and 3.
      for (uint32_t t : {2u, 3u})
        for (uint64_t n : uplink_pkts(f, t)) EXPECT_EQ(n, 0u) << what;
    }
    ns3::Simulator::Destroy();
  }
}

TEST_F(Ns3, SprayingRoutesAroundABlackHoleUplink) {
  // ToR 0's first uplink drops everything both ways from the start: the
  // sprayed connection sets aside the paths that hash onto it and still
  // delivers every WRITE.
  Fabric f(load("leaf-spine-16.conf"));
  f.black_hole("tor0.up0");
  Workload w(f, options(PathAlgo::OBS, 128), {{0, 4}, {1, 5}});
  w.run();
  expect_all_delivered(w, "black hole");
  uint64_t set_aside = 0;
  for (uint32_t h : {0u, 1u}) set_aside += w.host(h).engine().stats().paths_set_aside;
  EXPECT_GT(set_aside, 0u);
}

TEST_F(Ns3, SprayingRoutesAroundABlackHoleSpine) {
  // Every link of spine 1 drops everything: a quarter of each sprayed
  // connection's paths, in both directions.
  Fabric f(load("leaf-spine-16.conf"));
  f.black_hole("spine1");
  Workload w(f, options(PathAlgo::OBS, 128), {{0, 4}, {9, 13}});
  w.run();
  expect_all_delivered(w, "black-hole spine");
  for (uint32_t t = 0; t < 4; t++) EXPECT_EQ(f.uplinks(t)[1]->stats().drops, 0u);  // lost on the wire, not queued
  EXPECT_GT(w.host(0).engine().stats().paths_set_aside, 0u);
  EXPECT_GT(w.host(9).engine().stats().paths_set_aside, 0u);
}

TEST_F(Ns3, IncastIsMarkedAndDelivered) {
  // 8 senders under ToRs 1 and 2 into host 0: its ToR port queues, the
  // threshold marker marks CE, and the engines see the marks (the first
  // windows, 8 x 256 KiB, overflow the 1 MB buffer: the drops are resent).
  Fabric f(load("leaf-spine-16-ecn.conf"));
  std::vector<std::pair<uint32_t, uint32_t>> conns;
  for (uint32_t h = 4; h < 12; h++) conns.emplace_back(h, 0);
  Workload w(f, options(PathAlgo::OBS, 128), conns);
  w.run();
  expect_all_delivered(w, "incast");
  uint64_t marks = 0;
  for (const Fabric::Port& p : f.ports()) marks += p.stats().marks;
  EXPECT_GT(marks, 0u);
  EXPECT_GT(w.host(0).counters().rx_ce, 0u);
  EXPECT_GT(w.engine_totals().ce_marks, 0u);
}

}  // namespace
}  // namespace vstellar::ns3sim

namespace vstellar::ns3sim {
namespace {

// A shared buffer (Dynamic Threshold): an 8-to-1 incast into host 0 while
// host 15 sends to host 3 through the same ToR. The incast port may take
// more than an even split of its switch's buffer would give it, never more
// than alpha / (1 + alpha) of it while it is the one congested port (plus
// the packet in flight), so host 3's port still finds room; the ToR's
// buffer is never overrun and every message arrives intact.
TEST_F(Ns3, SharedSwitchBufferLetsABusyPortGrowAndLeavesRoomForOthers) {
  TopologyConfig c = load("leaf-spine-16.conf");
  std::string err;  // parse_topology starts from c: these keys override the file's
  ASSERT_TRUE(parse_topology("shared_buffer = 1MB\ndt_alpha = 1\nbuffer = 16MB\n", c, err)) << err;
  const uint64_t shared = 1'000'000;
  Fabric f(c);
  std::vector<std::pair<uint32_t, uint32_t>> conns;
  for (uint32_t h = 4; h < 12; h++) conns.emplace_back(h, 0);
  conns.emplace_back(15, 3);
  Workload w(f, options(PathAlgo::OBS, 128), conns);
  w.run();
  expect_all_delivered(w, "incast with a shared buffer");
  ASSERT_NE(f.pool(0), nullptr);
  EXPECT_LE(f.pool(0)->peak, shared);
  const Fabric::Port* busy = nullptr;
  for (const Fabric::Port& p : f.ports())
    if (p.name == "tor0.down0") busy = &p;
  ASSERT_NE(busy, nullptr);
  const uint64_t most = busy->stats().max_backlog;
  EXPECT_GT(most, shared / 8) << "no more than an even split of the ToR's 8 ports";
  EXPECT_LE(most, shared / 2 + 9000) << "over the dynamic threshold alpha / (1 + alpha)";
  std::printf("incast port: most %llu bytes queued, %llu drops; ToR buffer peak %llu of %llu\n",
              (unsigned long long)most, (unsigned long long)busy->stats().drops,
              (unsigned long long)f.pool(0)->peak, (unsigned long long)shared);
}

}  // namespace
}  // namespace vstellar::ns3sim
