// Regression tests for control-path problems:
//   - the 32-bit handle counter could wrap onto live objects.
// Commands alone (no vhost-user connection), as in commands_test.cc.
#include <endian.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "vstellard/device_parts.h"

namespace vstellard {
namespace {

class ControlSecurity : public ::testing::Test, protected PartsHarness {
 protected:
  void SetUp() override {
    std::string err;
    ASSERT_TRUE(Start(&err)) << err;
  }
  void TearDown() override { cmds_.DestroyAll(); }
};

// After 2^32 allocations the handle counter wraps. A handle
// must never be 0 and never one that is still in use: before the fix the
// wrapped counter handed out 0 and then overwrote a live PD's entry.
TEST_F(ControlSecurity, WrappedHandleCounterSkipsZeroAndLiveHandles) {
  const uint32_t first = AllocPd();  // 1: stays alive across the wrap
  objects_.next_handle = 0xfffffffe;
  std::set<uint32_t> seen = {first};
  for (int i = 0; i < 4; i++) {
    const uint32_t h = AllocPd();
    EXPECT_NE(h, 0u);
    EXPECT_TRUE(seen.insert(h).second) << "handle " << h << " handed out twice";
  }
  EXPECT_EQ(objects_.pds.size(), 5u);  // no entry was overwritten
  EXPECT_EQ(seen.count(1), 1u);
  EXPECT_EQ(seen.count(2), 1u);  // after 0xfffffffe, 0xffffffff: 0 and 1 skipped
}

}  // namespace
}  // namespace vstellard
