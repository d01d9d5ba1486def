// Fabrics for the ns-3 runs: a topology is a small config file (key =
// value lines, docs/experiments.md "The engine on ns-3"), and Fabric builds
// it: hosts, switches, point-to-point links, per-port queue discs (tail
// drop, optionally ECN marking at a threshold or RED) and the per-flow
// ECMP routes (flow_ecmp.h).
#pragma once
#include <ns3/net-device.h>
#include <ns3/node-container.h>
#include <ns3/queue-disc.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vstellar/ns3/flow_ecmp.h"

#include "vstellar/ns3/shared_buffer.h"

namespace vstellar::ns3sim {

enum class EcnMode { OFF, THRESHOLD, RED };

struct TopologyConfig {
  std::string name;
  // 2: ToRs and spines (a leaf-spine fat-tree). 3: ToRs, aggregation
  // switches and spines (core switches), in pods: every ToR has one
  // uplink to every aggregation switch of its pod, and aggregation switch
  // j of every pod one to each spine of group j (spines / aggs_per_pod of
  // them), as in a k-ary fat-tree.
  int tiers = 2;
  uint32_t tors = 4;  // all of them (tors / pods per pod)
  uint32_t hosts_per_tor = 4;
  uint32_t pods = 1;          // three tiers only
  uint32_t aggs_per_pod = 0;  // three tiers; 0: as many as a ToR's uplinks (below)
  // Two tiers: every ToR has one uplink to every spine. 0: derived from
  // oversubscription = hosts_per_tor * host_rate / (uplinks * fabric_rate),
  // the ToR's uplinks (spines, or a pod's aggregation switches). Three
  // tiers, 0: aggs_per_pod * (tors / pods), no oversubscription above the
  // ToRs.
  uint32_t spines = 0;
  double oversubscription = 1.0;
  uint64_t host_rate_bps = 100'000'000'000ull;
  uint64_t fabric_rate_bps = 100'000'000'000ull;
  uint64_t link_delay_ns = 1'000;
  // Per switch port (each direction of a link has its own queue).
  uint64_t buffer_bytes = 1'000'000;
  // A buffer per switch shared by its ports (0: none, each port has its
  // own `buffer`). A port then holds at most dt_alpha times the shared
  // buffer's free space (Dynamic Threshold), and never more than `buffer`.
  uint64_t shared_buffer_bytes = 0;
  double dt_alpha = 1.0;
  EcnMode ecn = EcnMode::OFF;
  uint64_t ecn_threshold_bytes = 100'000;    // threshold: mark what finds more queued
  uint64_t red_min_bytes = 50'000, red_max_bytes = 200'000;  // RED: average-queue thresholds
  double red_max_p = 0.1;
  // Each switch hashes with mix(hash_seed, switch number); with
  // hash_seed_per_switch = no every switch uses hash_seed itself (the same
  // hash at every tier: polarisation).
  uint64_t hash_seed = 1;
  bool hash_seed_per_switch = true;
  // A host's NIC queue. The engine has no back pressure from its link
  // (a real host's socket buffer and NIC ring), so this is large: what the
  // congestion window releases waits here, not on the fabric.
  uint64_t host_queue_bytes = 64'000'000;

  uint32_t hosts() const { return tors * hosts_per_tor; }
  uint32_t tors_per_pod() const { return tors / (tiers == 3 ? pods : 1); }
  uint32_t tor_uplinks() const;  // from the oversubscription
  uint32_t agg_count() const;    // per pod (three tiers)
  uint32_t spine_count() const;
};

// Parse a topology file's text. Unknown keys and bad values are errors.
bool parse_topology(const std::string& text, TopologyConfig& out, std::string& err);
bool load_topology(const std::string& path, TopologyConfig& out, std::string& err);

// Values like "100Gbps", "1MB", "64KiB", "2us" (used by the program's options too).
bool parse_rate(const std::string& s, uint64_t& bps);
bool parse_bytes(const std::string& s, uint64_t& bytes);
bool parse_time_ns(const std::string& s, uint64_t& ns);

// What one switch port's queue saw (its queue disc's traces).
struct PortStats {
  uint64_t pkts = 0, bytes = 0, drops = 0, marks = 0;
  uint64_t max_backlog = 0;   // bytes
  double mean_backlog = 0;    // bytes, time-weighted since the last reset
  uint64_t p99_backlog = 0;   // bytes found queued by arriving packets, 1 KiB bins
};

class Fabric {
 public:
  explicit Fabric(const TopologyConfig& cfg);
  ~Fabric();

  struct Port {
    std::string name;        // "tor0.up2", "spine1.down3", "tor2.down0"
    uint32_t sw = 0;         // switch number (ToRs first, then spines, then aggregation switches)
    bool uplink = false;     // towards the spines (ToR up, aggregation switch up)
    ns3::Ptr<ns3::NetDevice> dev;
    ns3::Ptr<ns3::QueueDisc> qdisc;
    struct Monitor;
    std::unique_ptr<Monitor> mon;
    PortStats stats() const;
  };

  const TopologyConfig& config() const { return cfg_; }
  uint32_t hosts() const { return cfg_.hosts(); }
  ns3::Ptr<ns3::Node> host_node(uint32_t h) const { return hosts_.Get(h); }
  uint32_t host_ip(uint32_t h) const;  // host order
  uint32_t tor_of(uint32_t h) const { return h / cfg_.hosts_per_tor; }
  std::vector<Port>& ports() { return ports_; }
  // Switch sw's shared buffer (shared_buffer > 0), else nullptr.
  const SharedBufferPool* pool(uint32_t sw) const { return sw < pools_.size() ? ns3::PeekPointer(pools_[sw]) : nullptr; }
  // The uplink ports of ToR t, in spine order.
  std::vector<const Port*> uplinks(uint32_t tor) const;
  // Start every port's statistics afresh (after a warm-up).
  void reset_stats();
  // Make a link a black hole both ways from now on: a port's packets and
  // its peer's vanish (both devices drop whatever arrives). A switch's
  // name ("spine0") makes every link of that switch one.
  void black_hole(const std::string& name);
  // The same link or links lose each packet with probability `rate`.
  void lossy(const std::string& name, double rate);

 private:
  TopologyConfig cfg_;
  ns3::NodeContainer hosts_, tors_, spines_, aggs_;
  std::vector<Port> ports_;
  std::vector<ns3::Ptr<ns3::NetDevice>> peer_of_port_;  // the device at the other end
  std::vector<ns3::Ptr<SharedBufferPool>> pools_;        // by switch number, with shared buffers
};

}  // namespace vstellar::ns3sim
