// One congestion window per connection, shared by all its paths (Stellar).
// Signals: ECN CE marks (DCTCP-style fraction estimate) and RTT above a target
// delay (Swift-style). The delay signal is a high percentile of the epoch's
// RTT samples, not their minimum: the samples come from all the paths the
// connection sprays over, and the minimum is the least loaded path's, blind
// to the queue the one window builds on the most loaded path. Loss is deliberately NOT a congestion signal: with
// spraying, a loss usually means one bad path, which the RTO resend on another
// path repairs; shrinking the window for it would slow the whole connection.
// See docs/transport.md for the algorithm.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace vstellar {

struct CcConfig {
  bool enabled = true;
  uint64_t init_cwnd = 256 << 10;     // bytes (a burst of it must drain well within one RTO)
  uint64_t min_cwnd = 4096;           // bytes
  uint64_t max_cwnd = 4 << 20;        // bytes
  uint64_t target_delay_ns = 1'000'000;
  double ecn_gain = 1.0 / 16;         // DCTCP g
  double rtt_beta = 0.5;              // decrease factor scale on delay
  double max_decrease = 0.5;          // never cut by more than this per epoch
  uint32_t ai_mtus = 4;               // additive increase per RTT, in MTUs
  double delay_percentile = 0.9;      // of the epoch's RTT samples, compared with the target
};

class CongestionControl {
 public:
  CongestionControl() = default;
  CongestionControl(const CcConfig& c, uint32_t mtu) { reset(c, mtu); }
  void reset(const CcConfig& c, uint32_t mtu);

  uint64_t cwnd() const { return cfg_.enabled ? cwnd_ : UINT64_MAX; }
  uint64_t srtt_ns() const { return srtt_; }

  double alpha() const { return alpha_; }
  // The largest RTT sample of this epoch and the one before: the round
  // trip of the slowest path in use, which a retransmission timeout must
  // exceed (srtt is mostly the fast paths' when one path queues).
  uint64_t max_rtt_ns() const { return std::max(prev_max_rtt_, epoch_max_rtt_); }

  // An ACK acknowledged `acked_bytes` new bytes; it reports `pkts` data
  // packets of which `ce` were CE-marked; `rtt_ns` is 0 when there is no
  // sample. `cum` is the new cumulative PSN, `snd_nxt` the next PSN to send:
  // an epoch (about one RTT) ends when cum passes the snd_nxt at its start.
  void on_ack(uint64_t acked_bytes, uint32_t pkts, uint32_t ce, uint64_t rtt_ns, uint32_t cum,
              uint32_t snd_nxt);
  // A timeout set a healthy path aside (path.h). One such path is a bad
  // path, not congestion; two or more in one epoch are losses on several
  // paths at once, a queue overflowing (incast), and the epoch ends with
  // the largest decrease.
  void on_path_down() { epoch_downs_++; }
  // Nothing was acknowledged for a whole RTO: the window goes to its floor
  // (TCP's loss window).
  void on_stall() { cwnd_ = cfg_.min_cwnd; }

 private:
  CcConfig cfg_;
  uint32_t mtu_ = 4096;
  uint64_t cwnd_ = 0;
  double alpha_ = 0;
  uint64_t srtt_ = 0;
  bool epoch_open_ = false;
  uint32_t epoch_end_ = 0;
  uint32_t epoch_pkts_ = 0;
  uint32_t epoch_ce_ = 0;
  uint64_t epoch_acked_ = 0;  // bytes acknowledged this epoch
  uint32_t epoch_downs_ = 0;  // healthy paths set aside this epoch
  uint64_t epoch_max_rtt_ = 0, prev_max_rtt_ = 0;
  bool epoch_late_ = false;  // an RTT sample of this epoch was above target
  std::vector<uint64_t> epoch_rtts_;  // this epoch's samples (at most kMaxSamples)
  uint32_t epoch_nrtt_ = 0;           // samples seen this epoch
  static constexpr size_t kMaxSamples = 256;
};

}  // namespace vstellar
