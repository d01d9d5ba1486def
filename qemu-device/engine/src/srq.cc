// Shared receive queues: the verbs (create, modify, destroy, post) and how a
// QP takes WQEs from its SRQ.
#include <algorithm>

#include "engine_internal.h"

namespace vstellar {

SrqImpl* EngineCore::create_srq(Pd* pd, const SrqInitAttr& init) {
  if (!pd || init.max_wr < 1 || init.max_wr > DeviceLimits::kMaxQpWr ||
      init.max_sge > DeviceLimits::kMaxSge || init.limit >= init.max_wr)
    return nullptr;
  auto srq = std::make_unique<SrqImpl>();
  srq->srqn_ = next_srqn_;
  next_srqn_ += cfg_.qpn_shards;
  srq->pd_ = pd;
  srq->max_wr_ = init.max_wr;
  srq->max_sge_ = init.max_sge;
  srq->limit_ = init.limit;
  srq->ring.resize(init.max_wr);
  pd->refs++;
  srqs_.push_back(std::move(srq));
  return srqs_.back().get();
}

bool EngineCore::owns_srq(const SrqImpl* srq) const {
  return srq && std::any_of(srqs_.begin(), srqs_.end(), [&](const auto& s) { return s.get() == srq; });
}

int EngineCore::modify_srq(SrqImpl* srq, uint32_t limit) {
  if (!owns_srq(srq) || limit >= srq->max_wr()) return EINVAL;
  srq->limit_ = limit;
  return 0;
}

int EngineCore::resize_srq(SrqImpl* srq, uint32_t max_wr) {
  if (!owns_srq(srq) || max_wr < 1 || max_wr > DeviceLimits::kMaxQpWr || max_wr < srq->posted() ||
      srq->limit_ >= max_wr)
    return EINVAL;
  std::vector<RecvWqe> ring(max_wr);
  for (uint64_t i = srq->head; i < srq->tail; i++) ring[i % max_wr] = srq->at(i);
  srq->ring = std::move(ring);
  srq->max_wr_ = max_wr;
  return 0;
}

int EngineCore::destroy_srq(SrqImpl* srq) {
  if (!owns_srq(srq)) return EINVAL;
  if (srq->refs) return EBUSY;
  srq->pd_->refs--;
  srqs_.erase(std::find_if(srqs_.begin(), srqs_.end(), [&](const auto& s) { return s.get() == srq; }));
  return 0;
}

int EngineCore::post_srq_recv(SrqImpl* srq, const RecvWr& wr, WcStatus* why) {
  if (!owns_srq(srq)) return EINVAL;
  if (srq->room() == 0) return ENOMEM;
  if (WcStatus bad = check_recv(srq->pd(), srq->max_sge(), wr); bad != WcStatus::SUCCESS) {
    if (why) *why = bad;
    return EINVAL;
  }
  RecvWqe& r = srq->at(srq->tail);
  r = RecvWqe{};
  r.wr_id = wr.wr_id;
  r.nsge = wr.num_sge;
  r.from_srq = true;
  for (uint32_t i = 0; i < wr.num_sge; i++) {
    r.sge[i] = wr.sg_list[i];
    r.cap += wr.sg_list[i].length;
  }
  srq->tail++;
  return 0;
}

// Take SRQ WQEs in posting order into the QP's own queue, so that the
// QP's messages keep their order (the rsn of an RC SEND names the QP's
// k-th receive). Raises SRQ_LIMIT_REACHED once when the SRQ falls below
// its armed limit.
uint64_t EngineCore::take_srq_wqes(QpImpl& qp, uint64_t want) {
  SrqImpl& srq = *qp.srq;
  bool took = false;
  while (qp.rq_tail - qp.rq_head < want && qp.rq_tail - qp.rq_head < qp.rq.size() &&
         srq.posted() > 0) {
    qp.rq_at(qp.rq_tail++) = srq.at(srq.head++);
    took = true;
  }
  if (took && srq.limit_ && srq.posted() < srq.limit_) {
    srq.limit_ = 0;
    events_.push_back({AsyncEventType::SRQ_LIMIT_REACHED, srq.srqn_});
  }
  return qp.rq_tail - qp.rq_head;
}

uint64_t EngineCore::recv_held(QpImpl& qp, uint64_t want) {
  uint64_t held = qp.srq ? take_srq_wqes(qp, want) : qp.rq_tail - qp.rq_head;
  if (held < want && recv_refill_) {
    recv_refill_(qp, qp.init.owner);
    held = qp.srq ? take_srq_wqes(qp, want) : qp.rq_tail - qp.rq_head;
  }
  return held;
}

uint32_t Srq::room() const {
  const SrqImpl& s = impl(*this);
  return uint32_t(s.ring.size() - s.posted());
}

}  // namespace vstellar
