// Path selection for one connection. A path is a UDP source port; the fabric's
// ECMP hash maps it onto a route. OBS (oblivious spraying: a pseudo-random path
// per packet, no per-path load state) is Stellar's choice; REPS recycles
// paths that just delivered without congestion (below); the others are
// baselines. Under every algorithm a path whose packet timed out is set
// aside (down) and probed back in: after a hold time the engine sends a
// probe on it (probe()); an ACK for a packet sent on it brings it back, and
// each probe without one doubles the hold (up to 64 x). The algorithm's
// choice skips down paths while a healthy one is left.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace vstellar {

// REPS (recycled entropy packet spraying, after UET's REPS): a path whose
// ACK came back without a CE mark and with an RTT near the connection's
// smallest is queued for reuse (once per ACK); a new packet takes the
// oldest such path, or a random one (OBS) when none is queued and at every
// 8th pick (exploration keeps the set of paths wide). Load so follows the
// paths, and through the ECMP hash the uplinks, that are not queueing;
// OBS spreads it evenly over paths, which the hash spreads unevenly over
// uplinks.
enum class PathAlgo : uint8_t { OBS, RR, DWRR, BEST_RTT, SINGLE, REPS };
const char* to_string(PathAlgo a);
bool parse_path_algo(const std::string& s, PathAlgo& out);

class PathSelector {
 public:
  // burst: OBS and RR keep each path they pick for this many first
  // transmissions (1: a new path per packet). Not while a failure is being
  // found: once a healthy path is set aside, the next 4 x num_paths picks
  // are one packet each (see pick()).
  PathSelector(PathAlgo algo, uint16_t num_paths, uint64_t seed, uint16_t single_path = 0,
               uint16_t burst = 1);
  // Path for a first transmission of `bytes` payload bytes.
  uint16_t pick(uint32_t bytes);
  // A down path whose hold is over at `now`, to be probed (its hold is
  // re-armed, doubled, until an ACK for it arrives); num_paths() if none,
  // or if fewer than probe_gap first transmissions went out since the
  // last probe: a probe is a copy of a data packet, and while a black hole
  // lasts, a copy per due path (some 25 paths of 128 at a 64 ms hold) took
  // a tenth of the sender's bandwidth.
  uint16_t probe(uint64_t now);
  // Path for a retransmission: never `avoid` when another path exists, so a
  // resend does not go back into the hole that lost the original, and a
  // healthy one while there is one.
  uint16_t pick_retx(uint16_t avoid, uint32_t bytes);
  // Feedback: a packet sent on `path` was acknowledged with this RTT sample
  // (0: none), in an ACK that carried a CE mark or not.
  void on_ack(uint16_t path, uint64_t rtt_ns, bool ce = false);
  // A packet sent on `path` timed out at `now`: a healthy path is set aside
  // (one already down stays as it is: its probes set the hold).
  void on_timeout(uint16_t path, uint64_t now);
  // The hold before the first probe of a path that went down (doubles
  // per failed probe, up to 64 times this).
  void set_probe_hold(uint64_t ns) { hold_ns_ = ns; }
  // At most one probe per this many first transmissions (1: no limit).
  void set_probe_gap(uint32_t pkts) { probe_gap_ = pkts ? pkts : 1; }

  uint16_t num_paths() const { return n_; }
  PathAlgo algo() const { return algo_; }
  bool is_down(uint16_t path) const { return path < n_ && !down_.empty() && down_[path].until; }
  uint16_t down_count() const { return n_down_; }
  uint64_t downs() const { return downs_; }  // times a healthy path was set aside

 private:
  uint64_t rand();
  uint16_t pick_dwrr(uint32_t bytes);
  uint16_t pick_best_rtt();
  uint16_t choose(uint32_t bytes);  // the algorithm's pick, moved off a down path
  // A healthy path other than `avoid` (random start, then a scan), or any
  // other path at random if none is healthy.
  uint16_t pick_healthy(int avoid);

  PathAlgo algo_;
  uint16_t n_;
  uint16_t single_;
  uint16_t burst_;
  uint16_t burst_left_ = 0;
  uint16_t burst_path_ = 0;
  uint32_t per_packet_left_ = 0;  // picks still made one packet each after a path went down
  uint64_t rng_;
  uint32_t rr_ = 0;
  uint64_t picks_ = 0;
  // DWRR and BestRTT state (empty for OBS/RR/SINGLE: OBS keeps none).
  std::vector<double> weight_;   // DWRR: 1 = healthy, halved per timeout
  std::vector<double> deficit_;  // DWRR: byte credit
  std::vector<uint64_t> srtt_;   // BestRTT: smoothed RTT per path, ns (0 = unknown)
  // BestRTT: how many set-asides (downs_) there had been when each path's
  // latest sample came (only samples since the latest one count), and the
  // picks still made at random after a set-aside (pick_best_rtt).
  std::vector<uint64_t> sampled_after_;
  uint32_t explore_left_ = 0;
  // REPS: paths to reuse, oldest first (a ring of n_ entries), and the
  // smallest RTT seen, the base the "near" test compares with.
  std::vector<uint16_t> recycle_;
  uint16_t recycle_head_ = 0, recycle_len_ = 0;
  uint64_t min_rtt_ = UINT64_MAX;
  // Health, for every algorithm: allocated at the first timeout.
  struct Down {
    uint64_t until = 0;  // 0: healthy; else the time its next probe is due
    uint8_t fails = 0;   // timeouts since it was last healthy (hold doubling)
  };
  std::vector<Down> down_;
  uint16_t n_down_ = 0;
  uint64_t next_probe_ = UINT64_MAX;  // earliest `until` of a down path
  uint64_t hold_ns_ = 1'000'000;
  uint32_t probe_gap_ = 32;
  uint32_t since_probe_ = 0;  // first transmissions since the last probe
  uint64_t downs_ = 0;
};

}  // namespace vstellar
