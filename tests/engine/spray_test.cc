// Spraying under congestion and failure (issue 14): the simulator's shaped,
// bounded queues (tail drop, token-bucket bursts, an ECMP stage with a
// black-hole uplink).
#include <map>

#include "sim_pair.h"

namespace vstellar::test {
namespace {

constexpr uint64_t kMbit = 1'000'000;

// Raw datagrams of `len` bytes from a to b on `path`, all at the current time.
void blast(SimNet& net, Link& l, uint32_t to, uint16_t path, int n, size_t len) {
  std::vector<uint8_t> junk(len, 0xee);
  for (int i = 0; i < n; i++) {
    HostSpan sp{junk.data(), junk.size()};
    l.send(path, Endpoint{to, 4791}, nullptr, 0, &sp, 1);
  }
  (void)net;
}

// A receiving engine only counts what arrives (the junk fails to parse).
struct Sink {
  explicit Sink(SimNet& net, uint32_t ip) : link(net.add_node(ip)), eng(EngineConfig{}, link, net) {
    net.attach(ip, &eng);
  }
  uint64_t got() const { return eng.stats().bad_parse; }
  Link& link;
  Engine eng;
};

TEST(SimQueue, TailDropsWhatDoesNotFit) {
  SimNet net;
  Link& a = net.add_node(kIpA);
  Sink b(net, kIpB);
  net.impairment.downlink = {100 * kMbit, 64 * 1024, 0, 0};
  blast(net, a, kIpB, 0, 100, 4096 - 42);  // 4096 bytes on the wire each
  EXPECT_EQ(net.stats.queue_drops, 100u - 16u);  // 64 KiB hold 16 of them
  net.run_for(100'000'000);
  EXPECT_EQ(b.got(), 16u);
  SimQueueStats s = net.downlink_stats(kIpB);
  EXPECT_EQ(s.drops, 84u);
  EXPECT_LE(s.max_backlog, 64u * 1024);
  EXPECT_EQ(s.p99_backlog, 64u * 1024);  // most found it full
}

TEST(SimQueue, TokenBucketLetsABurstThroughThenTheRate) {
  // tbf rate 100 Mbit/s burst 32 KiB: after an idle time 8 packets of 4 KiB
  // leave at once, the rest one per 328 us.
  SimNet net;
  Link& a = net.add_node(kIpA);
  Sink b(net, kIpB);
  net.impairment.delay_ns = 1000;
  net.impairment.downlink = {100 * kMbit, 1 << 20, 32 * 1024, 0};
  net.run_for(10'000'000);  // a full bucket
  blast(net, a, kIpB, 0, 20, 4096 - 42);
  net.run_for(2'000);
  EXPECT_EQ(b.got(), 8u);
  net.run_for(328'000);
  EXPECT_EQ(b.got(), 9u);
  net.run_for(11 * 328'000);
  EXPECT_EQ(b.got(), 20u);
  // Without a bucket every packet waits for the one before it.
  SimNet net2;
  Link& a2 = net2.add_node(kIpA);
  Sink b2(net2, kIpB);
  net2.impairment.delay_ns = 1000;
  net2.impairment.downlink = {100 * kMbit, 1 << 20, 0, 0};
  net2.run_for(10'000'000);
  blast(net2, a2, kIpB, 0, 20, 4096 - 42);
  net2.run_for(330'000);
  EXPECT_EQ(b2.got(), 1u);
}

TEST(SimQueue, EcmpStageHashesPathsOntoSharedUplinks) {
  SimNet net;
  Link& a = net.add_node(kIpA);
  Sink b(net, kIpB);
  net.impairment.uplinks = 4;
  net.impairment.uplink = {100 * kMbit, 1 << 20, 0, 0};
  std::vector<int> per(4);
  for (uint16_t p = 0; p < 128; p++) per[net.uplink_of(kIpA, p)]++;
  for (int n : per) EXPECT_GT(n, 16);  // every uplink gets some of 128 paths
  EXPECT_EQ(net.uplink_of(kIpA, 7), net.uplink_of(kIpA, 7));
  // One path: one uplink's queue; a black hole there eats it all.
  const uint16_t u = net.uplink_of(kIpA, 3);
  blast(net, a, kIpB, 3, 10, 1000);
  EXPECT_EQ(net.uplink_stats(kIpA, u).pkts, 10u);
  EXPECT_EQ(net.uplink_stats(kIpA, uint16_t((u + 1) % 4)).pkts, 0u);
  net.impairment.dead_uplink = u;
  blast(net, a, kIpB, 3, 10, 1000);
  net.run_for(10'000'000);
  EXPECT_EQ(b.got(), 10u);
  EXPECT_EQ(net.stats.dropped, 10u);
}

}  // namespace
}  // namespace vstellar::test
