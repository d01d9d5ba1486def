// Regression tests for control-path problems of issue 13:
//   #10 the 32-bit handle counter could wrap onto live objects.
// Commands alone (no vhost-user connection), as in test_commands.cc.
#include <endian.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <vstellar/engine.h>
#include <vstellar/sim_net.h>

#include "vstellard/commands.h"
#include "vstellard/datapath.h"
#include "vstellard/guest_ram.h"

namespace vstellard {
namespace {

struct NoEvents : DataPathEvents {
  void PostEvent(uint16_t, uint32_t, uint32_t, uint32_t) override {}
  void NotifyCq(uint32_t, const vstellar_cq_notify&) override {}
  bool DeviceFatal() const override { return false; }
};

class ControlSecurity : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ram_.ok());
    std::string err;
    ASSERT_TRUE(pvdma_.Attach(ram_.Table(), &err)) << err;
    net_.attach(1, &engine_);
    shared_.engine = &engine_;
  }
  void TearDown() override { cmds_.DestroyAll(); }

  uint16_t Run(uint16_t op, uint32_t uctx, const void* body, size_t len, std::vector<uint8_t>* resp) {
    vstellar_cmd_hdr h{};
    h.opcode = htole16(op);
    h.ucontext = htole32(uctx);
    h.length = htole32(uint32_t(len));
    std::vector<uint8_t> req(sizeof(h) + len);
    std::memcpy(req.data(), &h, sizeof(h));
    if (len) std::memcpy(req.data() + sizeof(h), body, len);
    return cmds_.Execute(req, resp);
  }
  uint32_t AllocPd() {
    std::vector<uint8_t> resp;
    EXPECT_EQ(Run(VSTELLAR_CMD_ALLOC_PD, 0, nullptr, 0, &resp), VSTELLAR_STATUS_OK);
    vstellar_resp_alloc_pd r{};
    std::memcpy(&r, resp.data(), std::min(resp.size(), sizeof(r)));
    return le32toh(r.pdn);
  }

  GuestRam ram_{4ull << 20};
  Pvdma pvdma_;
  vstellar::SimNet net_;
  vstellar::Engine engine_{vstellar::EngineConfig{}, net_.add_node(1), net_};
  DeviceShared shared_;
  Session session_{DeviceConfig::Default()};
  ObjectTables objects_;
  NoEvents events_;
  DataPath dp_{0, shared_, session_, pvdma_, objects_, events_};
  Commands cmds_{shared_, session_, pvdma_, objects_, dp_};
};

// Issue 13 #10: after 2^32 allocations the handle counter wraps. A handle
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
