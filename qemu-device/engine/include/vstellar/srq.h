// A shared receive queue as the engine's users see it. RC and UD QPs
// created with QpInitAttr::srq take their receive WQEs from it, in the
// order they were posted, when a message needs one; the QP then holds the
// WQE until it completes, so completions stay in message order per QP
// while the SRQ's WQEs complete out of posting order. The queue itself is
// the engine's own (engine/src/engine_internal.h).
#pragma once
#include <cstdint>

#include "vstellar/pd.h"

namespace vstellar {

struct SrqInitAttr {
  uint32_t max_wr = 128;
  uint32_t max_sge = 4;
  // IB's SRQ limit: when nonzero and fewer WQEs than this are left after
  // a QP took one, the engine raises SRQ_LIMIT_REACHED once and sets the
  // limit to 0 (disarmed) until modify_srq arms it again.
  uint32_t limit = 0;
};

class Srq {
 public:
  uint32_t srqn() const { return srqn_; }
  Pd* pd() const { return pd_; }
  uint32_t max_wr() const { return max_wr_; }
  uint32_t max_sge() const { return max_sge_; }
  uint32_t limit() const { return limit_; }
  // Free slots: how many more WRs post_srq_recv takes before ENOMEM. A
  // slot frees when a QP takes its WQE (not when it completes): the QP
  // keeps its own copy.
  uint32_t room() const;

  Srq(const Srq&) = delete;
  Srq& operator=(const Srq&) = delete;

 protected:
  Srq() = default;
  ~Srq() = default;

  uint32_t srqn_ = 0;
  Pd* pd_ = nullptr;
  uint32_t max_wr_ = 0;
  uint32_t max_sge_ = 0;
  uint32_t limit_ = 0;
};

}  // namespace vstellar
