// Which worker thread serves each QP of a daemon with several
// (vstellard --threads). A QP starts on the worker whose engine made it,
// the one its number names (qpn % workers: the kernel steers its
// datagrams there by that alone). When a device moves to its peers'
// worker (Worker::Place), its QPs keep their numbers, and this table
// records where they went: the workers' routers pass a datagram on to
// that worker, and the kernel's steering program lists them
// (UdpLink::steer). One table for the daemon; every call takes its lock.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace vstellard {

class Placement {
 public:
  using Moved = std::unordered_map<uint32_t, unsigned>;  // QPN -> worker, where not qpn % workers

  explicit Placement(unsigned workers) : workers_(workers ? workers : 1) {}
  unsigned workers() const { return workers_; }

  // The worker whose engine has QP `qpn` (or will, once a move under way
  // arrives: the table changes when a move is decided).
  unsigned WorkerOf(uint32_t qpn) const {
    std::lock_guard<std::mutex> l(mu_);
    auto it = moved_->find(qpn);
    return it != moved_->end() ? it->second : qpn % workers_;
  }
  // The QPs now live on `worker`.
  void Move(const std::vector<uint32_t>& qpns, unsigned worker) {
    std::lock_guard<std::mutex> l(mu_);
    auto next = std::make_shared<Moved>(*moved_);
    for (uint32_t q : qpns) {
      if (q % workers_ == worker) next->erase(q);
      else (*next)[q] = worker;
    }
    moved_ = std::move(next);
  }
  // The QPs died (their numbers went home, Engine::take_returned_ids).
  void Forget(const std::vector<uint32_t>& qpns) {
    std::lock_guard<std::mutex> l(mu_);
    auto next = std::make_shared<Moved>(*moved_);
    for (uint32_t q : qpns) next->erase(q);
    moved_ = std::move(next);
  }
  // The table as it is now, for a router's pass over the datagrams of one
  // loop turn (no lock per datagram), and for the steering program.
  std::shared_ptr<const Moved> Snapshot() const {
    std::lock_guard<std::mutex> l(mu_);
    return moved_;
  }
  std::vector<std::pair<uint32_t, uint16_t>> Exceptions() const {
    auto m = Snapshot();
    std::vector<std::pair<uint32_t, uint16_t>> v;
    for (auto& [q, w] : *m) v.emplace_back(q, uint16_t(w));
    return v;
  }

  // Decisions to move devices are taken one at a time across the workers
  // (Worker::Place): two devices connected to each other, on two workers,
  // must not each move to the other's.
  std::mutex decide_mu;
  // Devices moved so far (vstellar-stat, tests).
  uint64_t moves = 0;

 private:
  const unsigned workers_;
  mutable std::mutex mu_;
  std::shared_ptr<const Moved> moved_ = std::make_shared<Moved>();
};

}  // namespace vstellard
