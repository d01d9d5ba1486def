// The harness command line: what the fabric experiment relies on.
#include <gtest/gtest.h>

#include "vstellar/harness/harness.h"

namespace vstellar::harness {
namespace {

bool parse(std::vector<const char*> args, Options& o, int& code) {
  args.insert(args.begin(), "vstellar-harness");
  return parse_args(int(args.size()), const_cast<char**>(args.data()), o, code);
}

TEST(HarnessCli, ParsesFabricOptions) {
  Options o;
  int code = -1;
  ASSERT_TRUE(parse({"--role", "client", "--local-ip", "10.0.2.1", "--peer-ip", "10.0.1.1",
                     "--base-port", "40000", "--paths", "64", "--path-algo", "dwrr", "--qps", "16",
                     "--duration", "30", "--interval-ms", "50", "--size", "64K", "--rto-us", "500",
                     "--loss-rate", "0.01", "--loss-links", "60"},
                    o, code));
  EXPECT_EQ(o.role, "client");
  EXPECT_EQ(o.local_ip, 0x0a000201u);
  EXPECT_EQ(o.peer_ip, 0x0a000101u);
  EXPECT_EQ(o.base_port, 40000);
  EXPECT_EQ(o.eng.num_paths, 64);
  EXPECT_EQ(o.eng.path_algo, PathAlgo::DWRR);
  EXPECT_EQ(o.qps, 16u);
  EXPECT_EQ(o.size, 65536u);
  EXPECT_EQ(o.eng.rto_ns, 500'000u);
  EXPECT_DOUBLE_EQ(o.loss_rate, 0.01);
}

TEST(HarnessCli, RejectsBadValues) {
  int code = 0;
  for (auto bad : std::vector<std::vector<const char*>>{{"--paths", "0"},
                                                        {"--paths", "257"},
                                                        {"--path-algo", "ecmp"},
                                                        {"--local-ip", "10.0.0"},
                                                        {"--mode", "fast"},
                                                        {"--frobnicate", "1"},
                                                        {"--size"},
                                                        {"--loss-rate", "2"}}) {
    Options o;
    EXPECT_FALSE(parse(bad, o, code)) << bad[0];
    EXPECT_EQ(code, 2);
  }
}

TEST(HarnessCli, LinkHashPutsPathZeroOnTheDefaultLossyLink) {
  EXPECT_EQ(link_of(0, 60), 0u);
  std::vector<int> per(60);
  for (uint16_t p = 0; p < 128; p++) per[link_of(p, 60)]++;
  int used = 0;
  for (int n : per) used += n > 0;
  EXPECT_GT(used, 40);  // 128 paths spread over most of the 60 links
}

}  // namespace
}  // namespace vstellar::harness
