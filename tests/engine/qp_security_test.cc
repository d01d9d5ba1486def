// Security regressions of the engine's QPs (issue 13).
#include <gtest/gtest.h>

#include "engine_internal.h"
#include "sim_pair.h"

namespace vstellar::test {
namespace {

void ToReset(Side& s) {
  QpAttr at;
  at.qp_state = QpState::RESET;
  ASSERT_EQ(s.eng->modify_qp(s.qp, at, QP_STATE), 0);
}

// Issue 13 #10: a QP taken to RESET and connected again with the same PSNs
// must not keep the cumulative-ACK state of its first connection; with it,
// the new connection's first ACKs completed nothing and its WQEs never
// finished.
TEST(QpSecurity, ResetForgetsTheOldConnectionsTransportState) {
  PairOptions o;
  o.retry_cnt = 2;
  Pair t(o);
  constexpr int kWrites = 40;
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < kWrites; i++)
      ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, i, 0, 4096, 0), 0) << "round " << round;
    auto wc = t.wait(t.a, t.a.scq, kWrites, 2'000'000'000ull);
    ASSERT_EQ(wc.size(), size_t(kWrites)) << "round " << round;
    for (const Wc& w : wc) EXPECT_EQ(w.status, WcStatus::SUCCESS) << "round " << round;
    ToReset(t.a);
    ToReset(t.b);
    const QpImpl& qa = impl(*t.a.qp);
    EXPECT_EQ(qa.cum_seen, 0u);
    EXPECT_EQ(qa.snd_una, 0u);
    EXPECT_EQ(qa.ack_lo, 0u);
    EXPECT_EQ(qa.ack_hi, 0u);
    EXPECT_EQ(qa.last_progress_ns, 0u);
    t.connect();
  }
}

}  // namespace
}  // namespace vstellar::test
