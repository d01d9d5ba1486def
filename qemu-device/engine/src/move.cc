// Objects moving between two engines of one process (Engine::detach and
// Engine::attach): vstellard moves a device to the worker thread of its
// peers. The objects move by pointer, so everything that points at them
// (the device's tables, a QP's PD and CQs, a window's MR, the CQs'
// completion hooks) stays valid; what moves by hand is what the engine
// itself keeps about them: its tables, the lists of QPs with work, the
// async events not yet taken, and which numbers are lent out.
#include <algorithm>
#include <cerrno>
#include <unordered_set>
#include <utility>

#include "engine_internal.h"

namespace vstellar {

struct DetachedObjects {
  std::vector<std::unique_ptr<Pd>> pds;
  std::vector<std::unique_ptr<Mr>> mrs;
  std::vector<std::unique_ptr<Mw>> mws;
  std::vector<std::unique_ptr<Cq>> cqs;
  std::vector<std::unique_ptr<SrqImpl>> srqs;
  std::vector<std::unique_ptr<QpImpl>> qps;
  std::vector<AsyncEvent> events;
  // The shape of the engine they come from: attach() takes them only into
  // one of the same (a QP's window ring and path tables are sized by it).
  uint32_t window_pkts = 0, num_paths = 0, shards = 0;
  bool integrity = false;
};

void DetachedObjectsDeleter::operator()(DetachedObjects* d) const { delete d; }

namespace {

template <typename T>
bool has(const std::unordered_set<const void*>& set, const T* p) {
  return set.count(static_cast<const void*>(p)) != 0;
}

bool names_qp(AsyncEventType t) {
  return t != AsyncEventType::CQ_ERR && t != AsyncEventType::SRQ_LIMIT_REACHED;
}

}  // namespace

// Every object must be this engine's, and the set closed under "uses":
// moving a QP without its CQ (or leaving an MR behind whose PD moves)
// would leave one engine with a pointer into the other. EINVAL if not,
// EBUSY if a QP is in a multicast group (its membership is this engine's
// link's). detach() and save() take only such sets.
int EngineCore::closed_set(const EngineObjects& o) {
  std::unordered_set<const void*> in;
  for (Pd* p : o.pds) {
    if (std::none_of(pds_.begin(), pds_.end(), [&](auto& x) { return x.get() == p; })) return EINVAL;
    in.insert(p);
  }
  for (Cq* c : o.cqs) {
    if (std::none_of(cqs_.begin(), cqs_.end(), [&](auto& x) { return x.get() == c; })) return EINVAL;
    in.insert(c);
  }
  for (Srq* s : o.srqs) {
    if (!owns_srq(impl(s))) return EINVAL;
    in.insert(s);
  }
  for (Mr* m : o.mrs) {
    if (!m || mr_by_index(m->lkey()) != m) return EINVAL;
    in.insert(m);
  }
  for (Mw* w : o.mws) {
    auto it = w ? mws_.find(w->rkey() >> 8) : mws_.end();
    if (it == mws_.end() || it->second.get() != w) return EINVAL;
    in.insert(w);
  }
  for (Qp* q : o.qps) {
    if (!q || find_qp(q->qpn()) != q) return EINVAL;
    in.insert(q);
  }
  // Closure: an object is in the set exactly when what it uses is.
  auto closed = [&](const void* obj, std::initializer_list<const void*> uses) {
    const bool here = in.count(obj) != 0;
    for (const void* u : uses)
      if (u && (in.count(u) != 0) != here) return false;
    return true;
  };
  for (auto& [n, m] : mrs_)
    if (!closed(m.get(), {m->pd_})) return EINVAL;
  for (auto& [n, w] : mws_)
    if (!closed(w.get(), {w->pd_, w->mr_})) return EINVAL;
  for (auto& s : srqs_)
    if (!closed(s.get(), {s->pd()})) return EINVAL;
  for (QpImpl* q : qp_list_)
    if (!closed(q, {q->pd_, q->send_cq, q->recv_cq, q->srq})) return EINVAL;
  for (auto& [g, members] : mcast_)
    for (QpImpl* q : members)
      if (has(in, q)) return EBUSY;

  return 0;
}

int EngineCore::detach(const EngineObjects& o, Detached* out) {
  if (int e = closed_set(o)) return e;
  auto d = Detached(new DetachedObjects);
  d->window_pkts = cfg_.window_pkts;
  d->num_paths = cfg_.num_paths;
  d->shards = cfg_.qpn_shards;
  d->integrity = cfg_.integrity;
  auto take = [](auto& vec, const void* p, auto& dst) {
    auto it = std::find_if(vec.begin(), vec.end(), [&](auto& x) { return x.get() == p; });
    dst.push_back(std::move(*it));
    vec.erase(it);
  };
  for (Pd* p : o.pds) take(pds_, p, d->pds);
  for (Cq* c : o.cqs) take(cqs_, c, d->cqs);
  for (Srq* s : o.srqs) take(srqs_, s, d->srqs);
  for (Mr* m : o.mrs) {
    const uint32_t index = m->lkey() >> 8;
    if (own_shard(index)) lent_keys_.insert(index);
    d->mrs.push_back(std::move(mrs_[index]));
    mrs_.erase(index);
  }
  for (Mw* w : o.mws) {
    const uint32_t index = w->rkey() >> 8;
    if (own_shard(index)) lent_keys_.insert(index);
    d->mws.push_back(std::move(mws_[index]));
    mws_.erase(index);
  }
  for (Qp* q : o.qps) {
    QpImpl* qp = impl(q);
    const uint32_t qpn = qp->qpn();
    if (own_shard(qpn)) lent_qpns_.insert(qpn);
    qp_list_.erase(std::find(qp_list_.begin(), qp_list_.end(), qp));
    if (qp->active) *std::find(active_qps_.begin(), active_qps_.end(), qp) = nullptr;
    qp->active = false;
    ack_list_.erase(std::remove(ack_list_.begin(), ack_list_.end(), qp), ack_list_.end());
    ack_later_.erase(std::remove(ack_later_.begin(), ack_later_.end(), qp), ack_later_.end());
    qp->health = nullptr;  // pointed into this engine's peer_health_
    d->qps.push_back(std::move(qps_[qpn]));
    qps_.erase(qpn);
  }
  // Async events of the moving objects go with them.
  std::unordered_set<uint32_t> qpns, cqns, srqns;
  for (auto& q : d->qps) qpns.insert(q->qpn());
  for (auto& c : d->cqs) cqns.insert(c->cqn());
  for (auto& s : d->srqs) srqns.insert(s->srqn());
  auto moves = [&](const AsyncEvent& e) {
    if (e.type == AsyncEventType::CQ_ERR) return cqns.count(e.qpn_or_cqn) != 0;
    if (e.type == AsyncEventType::SRQ_LIMIT_REACHED) return srqns.count(e.qpn_or_cqn) != 0;
    return names_qp(e.type) && qpns.count(e.qpn_or_cqn) != 0;
  };
  for (const AsyncEvent& e : events_)
    if (moves(e)) d->events.push_back(e);
  events_.erase(std::remove_if(events_.begin(), events_.end(), moves), events_.end());
  *out = std::move(d);
  return 0;
}

int EngineCore::attach(Detached* objs) {
  DetachedObjects* d = objs->get();
  if (!d || d->window_pkts != cfg_.window_pkts || d->num_paths != cfg_.num_paths || d->shards != cfg_.qpn_shards ||
      d->integrity != cfg_.integrity)
    return EINVAL;
  for (auto& q : d->qps)
    if (qps_.count(q->qpn())) return EINVAL;
  for (auto& m : d->mrs)
    if (mrs_.count(m->lkey() >> 8) || mws_.count(m->lkey() >> 8)) return EINVAL;
  for (auto& w : d->mws)
    if (mrs_.count(w->rkey() >> 8) || mws_.count(w->rkey() >> 8)) return EINVAL;

  for (auto& p : d->pds) pds_.push_back(std::move(p));
  for (auto& c : d->cqs) cqs_.push_back(std::move(c));
  for (auto& s : d->srqs) srqs_.push_back(std::move(s));
  for (auto& m : d->mrs) {
    const uint32_t index = m->lkey() >> 8;
    lent_keys_.erase(index);  // home again
    mrs_[index] = std::move(m);
  }
  for (auto& w : d->mws) {
    const uint32_t index = w->rkey() >> 8;
    lent_keys_.erase(index);
    mws_[index] = std::move(w);
  }
  for (auto& q : d->qps) {
    QpImpl* qp = q.get();
    lent_qpns_.erase(qp->qpn());
    qps_[qp->qpn()] = std::move(q);
    qp_list_.push_back(qp);
    // The time it spent detached (a device stopped: a paused VM, a
    // migration's stop and copy, a loaded state waiting for its VM to
    // start) is no silence of its peer: its retry clock starts again now,
    // or a stop longer than the retry limit would fail it at its first
    // timer.
    qp->last_progress_ns = qp->last_post_ns = clock_.now_ns();
    qp->backoff = 0;
    // Its timers and anything it owes are looked at in the next pass.
    activate(*qp);
    if (qp->ack_pending) ack_list_.push_back(qp);
  }
  events_.insert(events_.end(), d->events.begin(), d->events.end());
  objs->reset();
  return 0;
}

int Engine::detach(const EngineObjects& objs, Detached* out) { return core_->detach(objs, out); }
int Engine::attach(Detached* objs) { return core_->attach(objs); }

ReturnedIds Engine::take_returned_ids() { return std::exchange(core_->returned_, {}); }

void Engine::ids_returned(const ReturnedIds& ids) {
  for (uint32_t q : ids.qpns)
    if (core_->lent_qpns_.erase(q)) core_->free_qpn(q);  // quarantined as if it died here
  for (uint32_t k : ids.key_indices) core_->lent_keys_.erase(k);
}

}  // namespace vstellar
