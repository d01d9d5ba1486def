// A simulated network with a virtual clock, for deterministic transport
// tests: engines attached to it exchange datagrams through impairments
// (random and bursty loss, duplication, reordering, delay and jitter, one
// lossy path, one dead path, ECN marking, a bandwidth bottleneck). Time only
// advances when every engine is idle, so a test of a 250 us RTO runs in
// microseconds of real time.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <vector>

#include "vstellar/link.h"

namespace vstellar {

class Engine;

struct SimImpairment {
  double loss = 0;                  // random loss per packet
  double dup = 0;                   // duplication per packet
  double reorder = 0;               // probability a packet is held back by reorder_delay_ns
  uint64_t delay_ns = 5'000;        // one-way base delay
  uint64_t jitter_ns = 0;           // uniform extra delay [0, jitter)
  uint64_t reorder_delay_ns = 40'000;
  double burst_enter = 0;           // Gilbert-Elliott: P(good -> bad) per packet
  double burst_exit = 0.25;         // P(bad -> good)
  double burst_loss = 1.0;          // loss probability in the bad state
  int lossy_path = -1;              // path id with extra loss
  double lossy_path_rate = 0;
  int dead_path = -1;               // path id whose packets all vanish
  double ce_rate = 0;               // random CE marks
  uint64_t bandwidth_bps = 0;       // per-destination bottleneck (0 = none)
  uint64_t ecn_threshold_ns = 0;    // CE-mark when the bottleneck queue exceeds this
};

struct SimStats {
  uint64_t sent = 0, delivered = 0, dropped = 0, duplicated = 0, reordered = 0, ce = 0;
};

class SimNet : public Clock {
 public:
  explicit SimNet(uint64_t seed = 1) : rng_(seed) {}
  uint64_t now_ns() override { return now_; }

  // A node: its link (give it to the Engine) and, once built, the engine.
  Link& add_node(uint32_t ip);
  void attach(uint32_t ip, Engine* e);

  SimImpairment impairment;
  SimStats stats;
  // Called for every packet handed to the network; return false to drop it.
  // Tests use it to count, inspect or tamper with traffic.
  std::function<bool(uint32_t from, uint32_t to, uint16_t path, std::vector<uint8_t>& bytes)> tap;

  // Deliver a raw datagram to `to` as if it came from `from` (bad-packet tests).
  void inject(uint32_t from, uint32_t to, std::vector<uint8_t> bytes, bool ce = false);

  // Run until pred() holds, nothing can happen any more, or virtual time
  // passes now+max_ns. Returns pred().
  bool run_until(const std::function<bool()>& pred, uint64_t max_ns = 10'000'000'000ull);
  // Run for a span of virtual time.
  void run_for(uint64_t ns);

  void enqueue(uint32_t from, uint32_t to, uint16_t path, std::vector<uint8_t> bytes);
  // IPv4 multicast: a datagram to a group (224.0.0.0/4) goes to every node
  // that joined it (the sender too, as IP_MULTICAST_LOOP does).
  void join_group(uint32_t node, uint32_t group, bool join);

 private:
  struct Event {
    uint64_t t;
    uint64_t seq;
    uint32_t from, to;
    bool ce;
    std::vector<uint8_t> bytes;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.t != b.t ? a.t > b.t : a.seq > b.seq;
    }
  };
  bool step(uint64_t limit);
  double uni() { return std::uniform_real_distribution<double>(0, 1)(rng_); }

  uint64_t now_ = 1'000'000;
  uint64_t seq_ = 0;
  std::mt19937_64 rng_;
  bool burst_bad_ = false;
  std::map<uint32_t, std::unique_ptr<Link>> links_;
  std::map<uint32_t, Engine*> engines_;
  std::map<uint32_t, uint64_t> link_free_;
  std::map<uint32_t, std::vector<uint32_t>> groups_;  // group -> member nodes  // bottleneck: when each destination is free
  std::priority_queue<Event, std::vector<Event>, Later> events_;
};

}  // namespace vstellar
