// A queue pair as the engine's users see it: its number, state, PD and
// type, and how many more work requests each queue takes. Everything else
// (the send and receive queues, the transport state of the connection) is
// the engine's own (engine/src/engine_internal.h); a QP changes only through
// the Engine's verbs.
#pragma once
#include <cstdint>

#include "vstellar/pd.h"
#include "vstellar/types.h"

namespace vstellar {

class Qp {
 public:
  uint32_t qpn() const { return qpn_; }
  QpState state() const { return state_; }
  Pd* pd() const { return pd_; }
  QpType type() const { return type_; }
  bool is_ud() const { return type_ == QpType::UD || type_ == QpType::GSI; }  // datagrams
  bool is_uc() const { return type_ == QpType::UC; }
  bool is_gsi() const { return type_ == QpType::GSI; }
  // Free slots: how many more WRs post_send / post_recv take before they
  // return ENOMEM. Completions (polled or not) free slots.
  uint32_t sq_room() const;
  uint32_t rq_room() const;

  Qp(const Qp&) = delete;
  Qp& operator=(const Qp&) = delete;

 protected:
  Qp() = default;
  ~Qp() = default;  // only the engine creates and destroys QPs

  uint32_t qpn_ = 0;
  QpState state_ = QpState::RESET;
  Pd* pd_ = nullptr;
  QpType type_ = QpType::RC;
};

}  // namespace vstellar
