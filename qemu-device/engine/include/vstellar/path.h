// Path selection for one connection. A path is a UDP source port; the fabric's
// ECMP hash maps it onto a route. OBS (oblivious spraying: a pseudo-random path
// per packet, no per-path state) is Stellar's choice; the others are baselines.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace vstellar {

enum class PathAlgo : uint8_t { OBS, RR, DWRR, BEST_RTT, SINGLE };
const char* to_string(PathAlgo a);
bool parse_path_algo(const std::string& s, PathAlgo& out);

class PathSelector {
 public:
  // burst: OBS and RR keep each path they pick for this many first
  // transmissions (1: a new path per packet).
  PathSelector(PathAlgo algo, uint16_t num_paths, uint64_t seed, uint16_t single_path = 0,
               uint16_t burst = 1);
  // Path for a first transmission of `bytes` payload bytes.
  uint16_t pick(uint32_t bytes);
  // Path for a retransmission: never `avoid` when another path exists, so a
  // resend does not go back into the hole that lost the original.
  uint16_t pick_retx(uint16_t avoid, uint32_t bytes);
  // Feedback: a packet sent on `path` was acknowledged with this RTT sample.
  void on_ack(uint16_t path, uint64_t rtt_ns);
  // A packet sent on `path` timed out.
  void on_timeout(uint16_t path);

  uint16_t num_paths() const { return n_; }
  PathAlgo algo() const { return algo_; }

 private:
  uint64_t rand();
  uint16_t pick_one(uint32_t bytes);
  uint16_t pick_dwrr(uint32_t bytes);
  uint16_t pick_best_rtt();

  PathAlgo algo_;
  uint16_t n_;
  uint16_t single_;
  uint16_t burst_;
  uint16_t burst_left_ = 0;
  uint16_t burst_path_ = 0;
  uint64_t rng_;
  uint32_t rr_ = 0;
  uint64_t picks_ = 0;
  // DWRR and BestRTT state (empty for OBS/RR/SINGLE: OBS keeps none).
  std::vector<double> weight_;   // DWRR: 1 = healthy, halved per timeout
  std::vector<double> deficit_;  // DWRR: byte credit
  std::vector<uint64_t> srtt_;   // BestRTT: smoothed RTT per path, ns (0 = unknown)
};

}  // namespace vstellar
