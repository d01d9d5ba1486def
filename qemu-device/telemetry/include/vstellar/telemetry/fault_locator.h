// Failure localization from the endpoints: which link of the fabric is
// broken, named from what one engine sees of its own paths.
//
// Inputs: the engine's path health per peer (PathHealth: requests sent,
// timeouts, answers and their RTTs, per path), sampled every tick, and the
// route of every path, learnt with TTL-limited probes (ProbeSender; the
// routers' answers come back through on_reply). Method (docs/fabric.md,
// "Failure localization"):
//   1. Each path is classed over the last ticks: dead (it lost what it
//      sent and nothing came back), lossy, slow (RTT), or good.
//   2. Tomography: a link is suspect of a kind when the paths crossing it
//      are bad of that kind and the paths that do not cross it are not
//      (loss, RTT: compared with the peer's other paths at the same time,
//      so that a loaded host does not look like a slow link).
//   3. Links crossed by exactly the same paths cannot be told apart from
//      the endpoints (with two ToRs, a ToR's uplink to an aggregation
//      switch and that switch's downlink to the other ToR); probes to each
//      hop along the suspect paths (as mtr does) find the first hop that
//      stops answering, loses, or answers late, compared with the same hop
//      over good paths.
//   4. A suspicion confirmed over several ticks is a fault (logged); it
//      clears when the evidence has been gone for a while.
// A link is named by the addresses of its two ends as the routers answer
// (a router should answer from the interface the probe came in on: Linux
// with net.ipv4.icmp_errors_use_inbound_ifaddr=1); the first link starts
// at our own address, the last ends at the peer's. Without routes (no
// ICMP, no CAP_NET_RAW, an IPv6 peer), faults are reported per peer, at
// path granularity.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "vstellar/engine.h"
#include "vstellar/types.h"

namespace vstellar::telemetry {

class ProbeSender {
 public:
  virtual ~ProbeSender() = default;
  // One probe from path `path` towards `peer`, dying after `ttl` hops;
  // its answer carries `id`. False if it cannot be sent.
  virtual bool send_probe(const Endpoint& peer, uint16_t path, uint8_t ttl, uint32_t id) = 0;
};

// A router's answer to probe `id`: it died at `hop`.
struct HopReply {
  uint32_t id = 0;
  IpAddr hop;
  uint64_t at_ns = 0;
};

enum class FaultKind : uint8_t { BLACK_HOLE, LOSSY, SLOW };
const char* to_string(FaultKind k);

struct LinkId {
  IpAddr from, to;
  auto operator<=>(const LinkId&) const = default;
};

struct Fault {
  bool link_known = true;  // false: path granularity (peer and paths only)
  LinkId link;
  Endpoint peer;           // the peer whose paths showed it (one of them)
  FaultKind kind = FaultKind::BLACK_HOLE;
  uint64_t since_ns = 0;   // first seen (locator clock)
  uint64_t found_ns = 0;   // confirmed
  uint64_t cleared_ns = 0; // 0 while active
  uint32_t paths_affected = 0;
  double confidence = 0;   // 1 / links it could not be told from, times the share of paths that show it
  std::string evidence;
};

struct LocatorConfig {
  uint64_t tick_ns = 100'000'000;
  unsigned horizon_ticks = 10;  // RTT and activity are judged over this many ticks
  // Loss over this many: a loaded host loses a few percent of packets on
  // every path (socket buffers, descheduling), and a lossy link's extra
  // 1-2% on a quarter of the paths takes seconds to stand out of that.
  unsigned loss_ticks = 30;
  unsigned dead_ticks = 3;      // dead: nothing answered and losses over this many
  unsigned confirm_ticks = 3;   // suspect this long before it is reported
  unsigned clear_ticks = 10;    // gone this long before it is cleared
  uint8_t max_ttl = 8;
  uint32_t probe_budget = 192;  // probes per tick, all purposes
  unsigned hop_window_ticks = 30;  // hop probes are judged over this many ticks
  // Links the hop probes have not told apart after this long are named
  // together, each with its share of the confidence.
  unsigned tell_apart_ticks = 50;
  uint64_t probe_timeout_ns = 300'000'000;
  uint64_t route_refresh_ns = 30'000'000'000ull;
  // Thresholds (per link, against the peer's other paths).
  double dead_fraction = 0.8;   // of the active paths crossing a link
  double loss_min = 0.002;      // loss ratio of a lossy link's paths
  double loss_excess = 0.004;   // ... and that much above the other paths'
  // Hop probes: the natural log of how many times likelier the losses are
  // to start at the chosen link than anywhere else along the same paths
  // (or nowhere), before a link is named lossy from them (ln 1000).
  double hop_loss_evidence = 6.9;
  uint32_t loss_min_events = 5;
  double slow_factor = 3;       // median RTT of its paths over the others'
  uint64_t slow_min_ns = 1'000'000;
};

struct LocatorStats {
  uint64_t probes_sent = 0, probe_send_failures = 0, replies = 0, late_replies = 0;
  uint64_t routes_known = 0, traces = 0;
  uint64_t faults_found = 0, faults_cleared = 0;
};

class FaultLocator {
 public:
  FaultLocator(const LocatorConfig& cfg, const IpAddr& self, ProbeSender& probes);

  // A router's answer (from the tracer).
  void on_reply(const HopReply& r);
  // Every cfg.tick_ns: the engine's path health now, cumulative.
  void tick(uint64_t now_ns, const Engine& engine);
  void tick(uint64_t now_ns, const std::map<Endpoint, std::vector<PathHealth>>& health);

  // Faults active now, and every fault seen (cleared ones too, oldest first).
  std::vector<Fault> active() const;
  const std::vector<Fault>& history() const { return history_; }
  // "fault found: ..." / "fault cleared: ..." lines since the last call.
  std::vector<std::string> take_log();
  // The route of `path` towards `peer` (hop addresses, TTL 1 first); empty if unknown.
  std::vector<IpAddr> route(const Endpoint& peer, uint16_t path) const;
  const LocatorStats& stats() const { return stats_; }
  // {"faults":[...],"history":[...],"routes_known":N,...}; times as Unix
  // seconds, given the wall clock and the locator clock now.
  std::string json(double wall_now_s, uint64_t now_ns) const;
  // Its parts: the faults (active, or every one seen) as JSON objects
  // joined by commas, and the counters as "key":value pairs.
  std::string faults_json(double wall_now_s, uint64_t now_ns, bool history) const;
  std::string summary_json() const;
  static std::string describe(const Fault& f);

 private:
  struct Slot {  // one tick of one path, or a sum of ticks
    uint64_t sent = 0, lost = 0, not_lost = 0, delivered = 0, answered = 0, rtt_sum_ns = 0;
    Slot& operator+=(const Slot& o) {
      sent += o.sent, lost += o.lost, not_lost += o.not_lost, delivered += o.delivered, answered += o.answered;
      rtt_sum_ns += o.rtt_sum_ns;
      return *this;
    }
    Slot& operator-=(const Slot& o) {
      sent -= o.sent, lost -= o.lost, not_lost -= o.not_lost, delivered -= o.delivered, answered -= o.answered;
      rtt_sum_ns -= o.rtt_sum_ns;
      return *this;
    }
  };
  struct PathState {
    std::vector<IpAddr> route;  // last complete trace: a hop per TTL
    std::vector<LinkId> links;  // its links (evaluate: empty until derived)
    std::vector<IpAddr> trace;  // the trace in progress
    uint64_t trace_started = 0;
    bool tracing = false;
    bool active = false;  // sent something within the horizon
    uint64_t next_trace_ns = 0;
    PathHealth last;
    std::deque<Slot> slots;  // newest last, at most max(horizon_ticks, loss_ticks)
    Slot loss_sum, horizon_sum, dead_sum;  // over the last loss_ticks, horizon_ticks, dead_ticks
  };
  struct HopSample {  // one hop probe's outcome
    uint16_t path;
    uint8_t ttl;
    bool answered;
    uint64_t rtt_ns;
    uint64_t sent_ns;
    uint64_t at_ns;  // answered, or given up
  };
  struct ProbeTarget {  // a group of suspect links: its paths, and the TTLs of its hops
    std::vector<uint16_t> paths;
    std::vector<uint8_t> ttls;
    bool resolved = false;  // its link was picked this tick
  };
  struct GroupTime {
    uint64_t since, last;
    // The member the hop probes picked last. Links crossed by the same
    // paths show the same end-to-end losses, and the verdicts between
    // neighbours would flicker over the many ticks a fault lasts: a
    // black hole or slow pick stays until its own hop measures clean; a
    // lossy pick stays while it is still the likeliest place for the
    // loss to start (evaluate()).
    bool decided = false;
    LinkId picked{};
  };
  struct PeerState {
    std::vector<PathState> paths;
    uint16_t refresh_cursor = 0;
    uint64_t next_refresh_ns = 0;
    size_t route_len = 0;  // hops of most complete traces (the peer is one more)
    std::deque<HopSample> hops;
    std::vector<ProbeTarget> targets;  // what to probe hop by hop this tick
    uint16_t suspect_cursor = 0;
    // Groups of suspect links (keyed by their first link): since when
    // they are suspect, and when they last were.
    std::map<LinkId, GroupTime> groups;
  };
  struct Outstanding {
    uint32_t id;
    Endpoint peer;
    uint16_t path;
    uint8_t ttl;
    bool trace;  // a route trace (else a hop probe)
    uint64_t sent_ns;
  };
  struct Candidate {
    LinkId link;
    FaultKind kind;
    Endpoint peer;
    uint32_t paths;
    double confidence;
    std::string evidence;
    bool link_known = true;
  };
  struct Tracking {  // a suspected (link, kind) over ticks
    Candidate c;
    uint64_t since_ns = 0;
    unsigned seen = 0, missed = 0;
    bool reported = false;
    size_t history_index = 0;
  };

  void update_health(const Endpoint& peer, const std::vector<PathHealth>& h);
  void expire_probes(uint64_t now);
  void finish_trace(uint64_t now, PeerState& ps, uint16_t path);
  void send_probes(uint64_t now);
  bool probe(uint64_t now, const Endpoint& peer, uint16_t path, uint8_t ttl, bool trace);
  void evaluate(uint64_t now, const Endpoint& peer, PeerState& ps, std::vector<Candidate>& out);
  void forget_groups(uint64_t now, PeerState& ps);
  void track(uint64_t now, const std::vector<Candidate>& found, const std::set<Endpoint>& active_peers);
  std::vector<LinkId> links_of(const PeerState& ps, uint16_t path) const;

  LocatorConfig cfg_;
  IpAddr self_;
  ProbeSender& probes_;
  std::map<Endpoint, PeerState> peers_;
  std::map<uint32_t, Outstanding> outstanding_;  // by id: in send order
  uint32_t next_id_ = 1;
  std::map<std::pair<LinkId, FaultKind>, Tracking> tracking_;
  std::vector<Fault> history_;
  std::vector<std::string> log_;
  LocatorStats stats_;
  uint64_t rng_ = 0x9e3779b97f4a7c15ull;
};

}  // namespace vstellar::telemetry
