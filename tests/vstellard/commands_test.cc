// Commands and DataPath alone: no vhost-user connection and no queues, a
// request buffer in, a status and a response body out; the data path with
// a recording event sink.
#include <endian.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "vstellard/device_parts.h"

namespace vstellard {
namespace {

// One device's parts without the Device: the session only for its config.
class DeviceParts : public ::testing::Test, protected PartsHarness {
 protected:
  void SetUp() override {
    std::string err;
    ASSERT_TRUE(Start(&err)) << err;
  }
  void TearDown() override { cmds_.DestroyAll(); }
};

TEST_F(DeviceParts, EveryOpcodeIsCheckedAgainstTheCommandList) {
  EXPECT_EQ(Command(0, 0, nullptr, 0), VSTELLAR_STATUS_BAD_OPCODE);
  EXPECT_EQ(Command(VSTELLAR_CMD_MAX + 1, 0, nullptr, 0), VSTELLAR_STATUS_BAD_OPCODE);
  for (uint16_t op = 1; op <= VSTELLAR_CMD_MAX; op++) {
    const auto* info = vstellar_cmd_info(op);
    ASSERT_NE(info, nullptr);
    // One byte too many: refused before anything runs (a page list
    // makes the length a minimum, so too few bytes is the test there).
    std::vector<uint8_t> body(info->req_len + 1, 0);
    const size_t len = (info->flags & VSTELLAR_CMDF_PAGES) ? 0 : body.size();
    EXPECT_EQ(Command(op, 0, body.data(), len), VSTELLAR_STATUS_BAD_LENGTH) << info->name;
  }
}

TEST_F(DeviceParts, ReservedOpcodesAnswerUnsupported) {
  for (uint16_t op = 1; op <= VSTELLAR_CMD_MAX; op++) {
    const auto* info = vstellar_cmd_info(op);
    if (!(info->flags & VSTELLAR_CMDF_RESERVED)) continue;
    std::vector<uint8_t> body(info->req_len, 0);
    EXPECT_EQ(Command(op, 0, body.data(), body.size()), VSTELLAR_STATUS_UNSUPPORTED) << info->name;
  }
}

TEST_F(DeviceParts, QueryDeviceAnswersTheConfig) {
  std::vector<uint8_t> resp;
  ASSERT_EQ(Command(VSTELLAR_CMD_QUERY_DEVICE, 0, nullptr, 0, &resp), VSTELLAR_STATUS_OK);
  ASSERT_EQ(resp.size(), sizeof(vstellar_resp_query_device));
  vstellar_resp_query_device r;
  std::memcpy(&r, resp.data(), sizeof(r));
  EXPECT_EQ(r.max_qp_wr, state_.config().max_qp_wr);
  EXPECT_LE(le32toh(r.max_qp_wr), 1u << VSTELLAR_MAX_LOG_WQE);
  EXPECT_LE(le32toh(r.max_cqe), 1u << VSTELLAR_MAX_LOG_CQE);
}

TEST_F(DeviceParts, ObjectsBelongToTheirContext) {
  std::vector<uint8_t> resp;
  ASSERT_EQ(Command(VSTELLAR_CMD_ALLOC_UCONTEXT, 0, nullptr, 0, &resp), VSTELLAR_STATUS_OK);
  vstellar_resp_alloc_ucontext u;
  std::memcpy(&u, resp.data(), sizeof(u));
  const uint32_t uctx = le32toh(u.ucontext);
  const uint32_t pdn = AllocPd(uctx);
  EXPECT_EQ(objects_.pds.size(), 1u);
  vstellar_cmd_handle h{htole32(pdn), 0};
  EXPECT_EQ(Command(VSTELLAR_CMD_DEALLOC_PD, 0, &h, sizeof(h)), VSTELLAR_STATUS_BAD_HANDLE);  // not the kernel's
  EXPECT_EQ(Command(VSTELLAR_CMD_DEALLOC_PD, uctx + 1, &h, sizeof(h)), VSTELLAR_STATUS_BAD_HANDLE);
  EXPECT_EQ(Command(VSTELLAR_CMD_DEALLOC_PD, uctx, &h, sizeof(h)), VSTELLAR_STATUS_OK);
  EXPECT_TRUE(objects_.pds.empty());
}

TEST_F(DeviceParts, CreateQpTakesRingLimitsFromTheInterfaceHeader) {
  session_.mutable_vring(VSTELLAR_VQ_CQN0).num = 64;  // CQ notification queue 0 exists
  const uint32_t pdn = AllocPd(0);
  struct {
    vstellar_cmd_create_cq cmd;
    uint64_t page;
  } cq{};
  cq.cmd.log_cqe = htole32(4);
  cq.cmd.page_shift = htole32(12);
  cq.cmd.num_pages = htole32(1);
  cq.page = htole64(0x10000);
  std::vector<uint8_t> resp;
  ASSERT_EQ(Command(VSTELLAR_CMD_CREATE_CQ, 0, &cq, sizeof(cq), &resp), VSTELLAR_STATUS_OK);
  vstellar_resp_create_cq r;
  std::memcpy(&r, resp.data(), sizeof(r));

  vstellar_cmd_create_qp c{};
  c.pdn = htole32(pdn);
  c.send_cqn = c.recv_cqn = r.cqn;
  c.qp_type = VSTELLAR_QPT_RC;
  c.page_shift = 12;
  c.sq_log_wqe = VSTELLAR_MAX_LOG_WQE + 1;
  c.rq_log_wqe = 4;
  c.sq_log_stride = VSTELLAR_MIN_SQ_LOG_STRIDE;
  c.rq_log_stride = VSTELLAR_MIN_RQ_LOG_STRIDE;
  EXPECT_EQ(Command(VSTELLAR_CMD_CREATE_QP, 0, &c, sizeof(c)), VSTELLAR_STATUS_LIMIT);
  c.sq_log_wqe = 4;
  c.sq_log_stride = VSTELLAR_MIN_SQ_LOG_STRIDE - 1;
  EXPECT_EQ(Command(VSTELLAR_CMD_CREATE_QP, 0, &c, sizeof(c)), VSTELLAR_STATUS_BAD_FIELD);
  c.sq_log_stride = VSTELLAR_MAX_LOG_STRIDE + 1;
  EXPECT_EQ(Command(VSTELLAR_CMD_CREATE_QP, 0, &c, sizeof(c)), VSTELLAR_STATUS_BAD_FIELD);
  c.sq_log_stride = VSTELLAR_MIN_SQ_LOG_STRIDE;
  c.rq_log_stride = VSTELLAR_MIN_RQ_LOG_STRIDE - 1;
  EXPECT_EQ(Command(VSTELLAR_CMD_CREATE_QP, 0, &c, sizeof(c)), VSTELLAR_STATUS_BAD_FIELD);
  EXPECT_TRUE(objects_.qps.empty());
}

TEST_F(DeviceParts, DataPathGoesIdleWhenThereIsNoWork) {
  shared_.poll_ns = 0;
  EXPECT_FALSE(dp_.polling());
  dp_.OnKick();  // kicked: polls, finds nothing, and with poll_ns 0 sleeps at once
  EXPECT_FALSE(dp_.polling());
  EXPECT_EQ(dp_.counters().db_kicks, 1u);
  EXPECT_EQ(dp_.counters().idle_entries, 1u);
  EXPECT_TRUE(events_.events.empty());
}

}  // namespace
}  // namespace vstellard
