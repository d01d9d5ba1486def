// A simulated network with a virtual clock, for deterministic transport
// tests: engines attached to it exchange datagrams through impairments
// (random and bursty loss, duplication, reordering, delay and jitter, one
// lossy path, one dead path, ECN marking) and up to two stages of shaped,
// bounded queues: an ECMP stage (a ToR's uplinks: each source node's path is
// hashed onto one of several shared queues, one of which may be a black
// hole) and a per-destination stage (the receiver's port, where incast
// meets). Queues are token buckets in front of a tail-drop FIFO, as Linux
// tbf is on the namespace fabric. Time only advances when every engine is
// idle, so a test of a 250 us RTO runs in microseconds of real time.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <tuple>
#include <vector>

#include "vstellar/link.h"

namespace vstellar {

class Engine;

// One shaped queue, like `tbf rate R burst B limit L`: packets leave at
// rate_bps, except that up to burst_bytes of tokens saved while the link
// was idle let a burst leave at once (burst_bytes 0: no burst, each packet
// is serialised at the rate); a packet that finds limit_bytes queued
// (0: no limit) is dropped at the tail; one that finds more than ecn_bytes
// queued (0: never) is CE-marked. rate_bps 0: no queue at this stage.
struct SimQueueConfig {
  uint64_t rate_bps = 0;
  uint64_t limit_bytes = 0;
  uint64_t burst_bytes = 0;
  uint64_t ecn_bytes = 0;
};

struct SimQueueStats {
  uint64_t pkts = 0, drops = 0, marks = 0;
  uint64_t max_backlog = 0;       // bytes
  double mean_backlog = 0;        // bytes, averaged over time since the first packet
  uint64_t p99_backlog = 0;       // bytes found queued by arriving packets, 99th percentile (1 KiB bins)
};

struct SimImpairment {
  double loss = 0;                  // random loss per packet
  double dup = 0;                   // duplication per packet
  double reorder = 0;               // probability a packet is held back by reorder_delay_ns
  uint64_t delay_ns = 5'000;        // one-way base delay
  uint64_t jitter_ns = 0;           // uniform extra delay [0, jitter), keeping each path's order
  uint64_t reorder_delay_ns = 40'000;
  double burst_enter = 0;           // Gilbert-Elliott: P(good -> bad) per packet
  double burst_exit = 0.25;         // P(bad -> good)
  double burst_loss = 1.0;          // loss probability in the bad state
  int lossy_path = -1;              // path id with extra loss
  double lossy_path_rate = 0;
  int dead_path = -1;               // path id whose packets all vanish
  double ce_rate = 0;               // random CE marks
  // The sender's link refuses sends (a full io_uring, ENOBUFS): with this
  // probability a send starts a run of at most refuse_run sends from that
  // node that never leave it, within refuse_ns (a full ring is a moment,
  // not a number of sends: an idle sender's next send gets through).
  double refuse = 0;
  uint32_t refuse_run = 16;
  uint64_t refuse_ns = 50'000;
  // ECMP stage: packets from node N on path p go through N's uplink
  // hash(N, p, ecmp_seed) % uplinks, each shaped by `uplink` and shared by
  // every connection from N (0 uplinks: no such stage); as on a switch,
  // each direction has its own queue. dead_uplink's packets vanish (every
  // node's uplink of that number: a link broken both ways).
  uint16_t uplinks = 0;
  SimQueueConfig uplink;
  std::vector<SimQueueConfig> uplink_each;  // if set: uplink u is shaped by uplink_each[u]
  uint64_t ecmp_seed = 0;
  int dead_uplink = -1;
  // Per-destination stage: one queue per receiving node.
  SimQueueConfig downlink;
};

struct SimStats {
  uint64_t sent = 0, delivered = 0, dropped = 0, duplicated = 0, reordered = 0, ce = 0;
  uint64_t queue_drops = 0;  // tail drops of the queue stages (also counted in dropped)
  uint64_t refused = 0;      // sends the sender's link refused (also counted in dropped)
};

class SimNet : public Clock {
 public:
  explicit SimNet(uint64_t seed = 1) : rng_(seed) {}
  uint64_t now_ns() override { return now_; }

  // A node: its link (give it to the Engine) and, once built, the engine.
  Link& add_node(uint32_t ip);
  void attach(uint32_t ip, Engine* e);
  // The link of a node already added (a second engine behind its address).
  Link& link_of(uint32_t ip) { return *links_.at(ip); }

  SimImpairment impairment;
  SimStats stats;
  // Called for every packet handed to the network; return false to drop it.
  // Tests use it to count, inspect or tamper with traffic.
  std::function<bool(uint32_t from, uint32_t to, uint16_t path, std::vector<uint8_t>& bytes)> tap;

  // Deliver a raw datagram to `to` as if it came from `from` (bad-packet tests).
  void inject(uint32_t from, uint32_t to, std::vector<uint8_t> bytes, bool ce = false);

  // Deschedule a node's engine until `until` (virtual time), as a loaded
  // host does to its engine thread: it neither runs its progress loop nor
  // receives (datagrams wait for it, in order), and its timers fire late.
  void freeze(uint32_t node, uint64_t until);

  // Run until pred() holds, nothing can happen any more, or virtual time
  // passes now+max_ns. Returns pred().
  bool run_until(const std::function<bool()>& pred, uint64_t max_ns = 10'000'000'000ull);
  // Nothing in the network (nor held for a descheduled node) and no node
  // descheduled: only the engines' own timers can make anything happen.
  bool quiet() const {
    if (!events_.empty()) return false;
    for (auto& [node, until] : frozen_until_)
      if (until > now_) return false;
    return true;
  }
  // Run for a span of virtual time.
  void run_for(uint64_t ns);

  void enqueue(uint32_t from, uint32_t to, uint16_t path, std::vector<uint8_t> bytes);
  // Which uplink the ECMP stage sends (from, path) over.
  uint16_t uplink_of(uint32_t from, uint16_t path) const;
  SimQueueStats uplink_stats(uint32_t node, uint16_t u) const;
  SimQueueStats downlink_stats(uint32_t node) const;
  // Start the queues' statistics afresh (after a warm-up); what they hold stays.
  void reset_queue_stats();
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
    bool hop = false;  // reaches the destination's queue at t (not yet delivered)
    // The source port it arrives from: the sender's path (a node's base
    // port is 0), which a RoCE v2 ICRC covers.
    uint16_t sport = 0;
  };
  struct Queue {
    std::deque<std::pair<uint64_t, uint32_t>> inq;  // (departure time, bytes), FIFO
    uint64_t backlog = 0, last_dep = 0, first_t = 0, area_t = 0;
    double tokens = 0, area = 0;  // area: backlog integrated over time (byte*ns)
    uint64_t tok_t = 0;
    SimQueueStats st;
    std::vector<uint64_t> seen;  // arrivals by backlog found, 1 KiB bins
    void drain(uint64_t now);
    // Departure time of a packet of len bytes arriving at now, or
    // UINT64_MAX if the tail drops it; ce is set if it is marked.
    uint64_t admit(const SimQueueConfig& c, uint64_t now, uint32_t len, bool& ce);
    SimQueueStats stats() const;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.t != b.t ? a.t > b.t : a.seq > b.seq;
    }
  };
  bool step(uint64_t limit);
  // The last leg of a packet: the destination's queue at time t, then the
  // link delay, jitter, reordering and duplication.
  void deliver_at(uint64_t t, uint32_t from, uint32_t to, bool ce, std::vector<uint8_t> bytes, uint16_t sport);
  double uni() { return std::uniform_real_distribution<double>(0, 1)(rng_); }

  uint64_t now_ = 1'000'000;
  uint64_t seq_ = 0;
  std::mt19937_64 rng_;
  bool burst_bad_ = false;
  std::map<uint32_t, std::unique_ptr<Link>> links_;
  std::map<uint32_t, Engine*> engines_;
  std::map<std::pair<uint32_t, uint16_t>, Queue> up_;  // the ECMP stage: (node, uplink)
  std::map<uint32_t, Queue> down_;        // per destination
  // (from, to, path) -> the latest arrival jitter gave a packet on it
  std::map<std::tuple<uint32_t, uint32_t, uint16_t>, uint64_t> path_last_;
  std::map<uint32_t, std::vector<uint32_t>> groups_;  // group -> member nodes
  std::map<uint32_t, uint64_t> frozen_until_;          // node -> end of its descheduling
  struct Refusing {
    uint32_t left = 0;   // sends its link still refuses
    uint64_t until = 0;  // and not after this time
  };
  std::map<uint32_t, Refusing> refusing_;
  bool frozen(uint32_t node) const {
    auto it = frozen_until_.find(node);
    return it != frozen_until_.end() && it->second > now_;
  }
  std::priority_queue<Event, std::vector<Event>, Later> events_;
};

}  // namespace vstellar
