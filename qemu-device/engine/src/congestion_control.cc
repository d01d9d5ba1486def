#include "vstellar/congestion_control.h"

#include <algorithm>

#include "vstellar/types.h"

namespace vstellar {

void CongestionControl::reset(const CcConfig& c, uint32_t mtu) {
  cfg_ = c;
  mtu_ = mtu;
  cwnd_ = std::clamp(c.init_cwnd, c.min_cwnd, c.max_cwnd);
  alpha_ = 0;
  srtt_ = 0;
  epoch_open_ = false;
  epoch_pkts_ = epoch_ce_ = 0;
  epoch_acked_ = 0;
  epoch_downs_ = 0;
  epoch_max_rtt_ = prev_max_rtt_ = 0;
  epoch_late_ = false;
  epoch_rtts_.clear();
  epoch_rtts_.reserve(kMaxSamples);
  epoch_nrtt_ = 0;
}

void CongestionControl::on_ack(uint64_t acked_bytes, uint32_t pkts, uint32_t ce, uint64_t rtt_ns,
                               uint32_t cum, uint32_t snd_nxt) {
  if (rtt_ns) {
    srtt_ = srtt_ ? (7 * srtt_ + rtt_ns) / 8 : rtt_ns;
    // Keep every sample of a short epoch; of a long one, a sample spread
    // over it (each new one replaces a slot in turn).
    if (epoch_rtts_.size() < kMaxSamples) epoch_rtts_.push_back(rtt_ns);
    else epoch_rtts_[epoch_nrtt_ % kMaxSamples] = rtt_ns;
    epoch_nrtt_++;
    if (rtt_ns > cfg_.target_delay_ns) epoch_late_ = true;
    epoch_max_rtt_ = std::max(epoch_max_rtt_, rtt_ns);
  }
  epoch_pkts_ += pkts;
  epoch_ce_ += std::min(ce, pkts);
  if (!epoch_open_) {
    epoch_open_ = true;
    epoch_end_ = snd_nxt;
  }
  // Additive increase on every ACK: ai_mtus MTUs per window's worth of ACKs,
  // as long as this epoch has seen no congestion signal yet.
  if (epoch_ce_ == 0 && !epoch_late_ && epoch_downs_ < 2 && acked_bytes && cwnd_ > 0) {
    uint64_t inc = std::max<uint64_t>(1, uint64_t(cfg_.ai_mtus) * mtu_ * acked_bytes / cwnd_);
    cwnd_ = std::min(cwnd_ + inc, cfg_.max_cwnd);
  }
  epoch_acked_ += acked_bytes;
  // An epoch is about one RTT: it ends when the cumulative ACK passes the
  // snd_nxt at its start, or when a window's worth of bytes has been
  // acknowledged (with spraying the cumulative ACK waits for the slowest
  // path, and a queue there grows for that long unchecked).
  if (seq_lt(cum, epoch_end_) && epoch_acked_ < cwnd_) return;
  // Epoch over (about one RTT): decide once per epoch, so one burst of marks
  // does not cut the window many times.
  double f = epoch_pkts_ ? double(epoch_ce_) / epoch_pkts_ : 0.0;
  alpha_ = (1 - cfg_.ecn_gain) * alpha_ + cfg_.ecn_gain * f;
  double factor = 1.0;
  if (epoch_ce_ > 0) factor = 1.0 - alpha_ / 2;
  if (!epoch_rtts_.empty()) {
    auto at = epoch_rtts_.begin() + ptrdiff_t(cfg_.delay_percentile * double(epoch_rtts_.size() - 1));
    std::nth_element(epoch_rtts_.begin(), at, epoch_rtts_.end());
    const uint64_t rtt = *at;
    if (rtt > cfg_.target_delay_ns) {
      double over = double(rtt - cfg_.target_delay_ns) / double(rtt);
      factor = std::min(factor, 1.0 - cfg_.rtt_beta * over);
    }
  }
  if (epoch_downs_ >= 2) factor = 0;  // losses on several paths: the largest cut
  factor = std::max(factor, 1.0 - cfg_.max_decrease);
  if (factor < 1.0) cwnd_ = std::max<uint64_t>(cfg_.min_cwnd, uint64_t(double(cwnd_) * factor));
  epoch_open_ = true;
  epoch_end_ = snd_nxt;
  epoch_pkts_ = epoch_ce_ = 0;
  epoch_acked_ = 0;
  epoch_downs_ = 0;
  epoch_late_ = false;
  epoch_rtts_.clear();
  epoch_nrtt_ = 0;
  prev_max_rtt_ = epoch_max_rtt_;
  epoch_max_rtt_ = 0;
}

}  // namespace vstellar
