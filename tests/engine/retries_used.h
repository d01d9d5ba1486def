// A requester one timer away from RETRY_EXC: the starting point of the tests
// that a stop (a migration, a descheduled engine) is not counted against a
// QP's peer as its silence.
#pragma once

#include <gtest/gtest.h>

#include "engine_internal.h"  // white box: the oldest packet's retry count
#include "sim_pair.h"

namespace vstellar::test {

// Posts a signaled 64 KiB RDMA WRITE from p.a (data filled from seed) while
// the network drops every packet for 200 ms, until the oldest packet has
// used all of its retries. Packets pass again once the caller sets *drop
// to false.
inline ::testing::AssertionResult write_until_retries_used(Pair& p, uint32_t seed, bool* drop) {
  fill_random(p.a.buf.data(), 65536, seed);
  *drop = true;
  p.net.tap = [drop](uint32_t, uint32_t, uint16_t, std::vector<uint8_t>&) { return !*drop; };
  if (p.post_send(p.a, WrOpcode::RDMA_WRITE, 1, 0, 65536, 0) != 0)
    return ::testing::AssertionFailure() << "post_send failed";
  p.net.run_for(200'000'000);
  QpImpl& q = impl(*p.a.qp);
  if (q.snd_una == q.snd_nxt) return ::testing::AssertionFailure() << "nothing in flight";
  if (q.rec(q.snd_una).retries < q.attr.retry_cnt)
    return ::testing::AssertionFailure() << "oldest packet used " << q.rec(q.snd_una).retries
                                         << " of " << int(q.attr.retry_cnt) << " retries";
  return ::testing::AssertionSuccess();
}

}  // namespace vstellar::test
