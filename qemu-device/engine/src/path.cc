#include "vstellar/path.h"

#include <algorithm>

namespace vstellar {

const char* to_string(PathAlgo a) {
  switch (a) {
    case PathAlgo::OBS: return "obs";
    case PathAlgo::RR: return "rr";
    case PathAlgo::DWRR: return "dwrr";
    case PathAlgo::BEST_RTT: return "bestrtt";
    case PathAlgo::SINGLE: return "single";
    case PathAlgo::REPS: return "reps";
  }
  return "?";
}

bool parse_path_algo(const std::string& s, PathAlgo& out) {
  for (PathAlgo a : {PathAlgo::OBS, PathAlgo::RR, PathAlgo::DWRR, PathAlgo::BEST_RTT, PathAlgo::SINGLE, PathAlgo::REPS})
    if (s == to_string(a)) { out = a; return true; }
  return false;
}

PathSelector::PathSelector(PathAlgo algo, uint16_t num_paths, uint64_t seed, uint16_t single_path,
                           uint16_t burst)
    : algo_(algo), n_(num_paths ? num_paths : 1), single_(single_path), burst_(burst ? burst : 1),
      rng_(seed | 1) {
  if (single_ >= n_) single_ = 0;
  if (algo_ == PathAlgo::DWRR) {
    weight_.assign(n_, 1.0);
    deficit_.assign(n_, 0.0);
  }
  if (algo_ == PathAlgo::BEST_RTT) {
    srtt_.assign(n_, 0);
    sampled_after_.assign(n_, 0);
  }
  if (algo_ == PathAlgo::REPS) recycle_.assign(n_, 0);
  rr_ = uint32_t(rand() % n_);
}

uint64_t PathSelector::rand() {  // xorshift64*: cheap, stateless per path
  rng_ ^= rng_ >> 12;
  rng_ ^= rng_ << 25;
  rng_ ^= rng_ >> 27;
  return rng_ * 2685821657736338717ull;
}

uint16_t PathSelector::pick(uint32_t bytes) {
  if (since_probe_ < probe_gap_) since_probe_++;
  // OBS and RR keep a path for burst_ packets: the UDP link sends
  // a run of one path as one segmented send (UDP_SEGMENT).
  if (algo_ != PathAlgo::OBS && algo_ != PathAlgo::RR) return choose(bytes);
  // Runs are a saving of the software link (one send per run), and while
  // paths fail they cost twice: a dead path eats a whole run at once, and
  // each path is picked burst_ times less often, so the rest of a black hole's
  // paths are found that much later (on the namespace fabric, 16-packet
  // runs at 200 Mbit/s visited each of 128 paths about 3 times a second,
  // and OBS took a median 41 ms, up to 114, to get its goodput back; with
  // this rule 5 ms, as without a failure). So after a path is set aside, the
  // next 4 x n_ picks are a packet each: enough for each path to be
  // picked about 4 times (a path missed by all: e^-4, 2%).
  if (per_packet_left_ > 0) {
    per_packet_left_--;
    burst_left_ = 0;
    return choose(bytes);
  }
  if (burst_left_ > 0 && !is_down(burst_path_)) {
    burst_left_--;
    return burst_path_;
  }
  burst_path_ = choose(bytes);
  burst_left_ = uint16_t(burst_ - 1);
  return burst_path_;
}

// The algorithm's pick, moved off a path that is set aside.
uint16_t PathSelector::choose(uint32_t bytes) {
  picks_++;
  uint16_t p = 0;
  switch (algo_) {
    case PathAlgo::OBS: p = uint16_t(rand() % n_); break;
    case PathAlgo::RR: p = uint16_t(rr_++ % n_); break;
    case PathAlgo::DWRR: p = pick_dwrr(bytes); break;
    case PathAlgo::BEST_RTT: p = pick_best_rtt(); break;
    case PathAlgo::SINGLE: return single_;
    case PathAlgo::REPS:
      // Every 8th pick explores even when paths wait for reuse: with few
      // packets in flight the ring would otherwise shrink to the handful
      // of paths they took, and a path that cleared up would never return.
      if (recycle_len_ && picks_ % 8 != 0) {
        p = recycle_[recycle_head_];
        recycle_head_ = uint16_t((recycle_head_ + 1) % n_);
        recycle_len_--;
      } else {
        p = uint16_t(rand() % n_);  // nothing to reuse: explore
      }
      break;
  }
  if (n_down_ && down_[p].until) p = pick_healthy(-1);
  return p;
}

uint16_t PathSelector::pick_retx(uint16_t avoid, uint32_t bytes) {
  if (n_ == 1) return 0;
  if (algo_ == PathAlgo::SINGLE) return single_;  // the baseline has one path only
  uint16_t p = choose(bytes);
  if (p == avoid) p = pick_healthy(avoid);
  return p;
}

uint16_t PathSelector::pick_healthy(int avoid) {
  auto ok = [&](uint16_t p) { return int(p) != avoid && (down_.empty() || !down_[p].until); };
  for (int i = 0; i < 4; i++) {  // cheap while most paths are healthy
    uint16_t p = uint16_t(rand() % n_);
    if (ok(p)) return p;
  }
  uint16_t start = uint16_t(rand() % n_);
  for (uint16_t i = 0; i < n_; i++) {
    uint16_t p = uint16_t((start + i) % n_);
    if (ok(p)) return p;
  }
  // No healthy path left. That is a dead peer, or stale evidence: on a
  // busy host a descheduled engine times out path after path although
  // they deliver, and with nothing sent no probe brings one back. So try
  // any other path at random. (Always taking the down path whose probe
  // was nearest sent a stalled connection's resends back and forth
  // between two paths of a black hole until its retry deadline passed,
  // while most of its 128 paths would have delivered.)
  if (n_ == 1) return 0;
  if (avoid < 0 || avoid >= int(n_)) return uint16_t(rand() % n_);
  uint16_t p = uint16_t(rand() % (n_ - 1));
  return p >= avoid ? uint16_t(p + 1) : p;
}

uint16_t PathSelector::probe(uint64_t now) {
  if (!n_down_ || now < next_probe_ || (probe_gap_ > 1 && since_probe_ < probe_gap_)) return n_;
  uint16_t due = n_;
  uint64_t next = UINT64_MAX;
  for (uint16_t p = 0; p < n_; p++) {
    const Down& d = down_[p];
    if (!d.until) continue;
    if (d.until <= now && (due == n_ || d.until < down_[due].until)) due = p;
  }
  if (due < n_) {  // re-armed with a doubled hold: an ACK for it ends that
    since_probe_ = 0;
    Down& d = down_[due];
    if (d.fails < 6) d.fails++;
    d.until = now + (hold_ns_ << d.fails);
  }
  for (uint16_t p = 0; p < n_; p++)
    if (down_[p].until) next = std::min(next, down_[p].until);
  next_probe_ = next;
  return due;
}

// Deficit weighted round robin: each visit gives a path quantum = weight*MTU
// bytes of credit; it sends while it has credit. A path that lost packets has a
// lower weight, so it carries proportionally less.
uint16_t PathSelector::pick_dwrr(uint32_t bytes) {
  const double quantum = 4096.0;
  double need = bytes ? double(bytes) : 1.0;
  for (int guard = 0; guard < 4 * n_ + 64; guard++) {
    uint16_t p = uint16_t(rr_ % n_);
    if (n_down_ && down_[p].until) {  // set aside: earns no credit
      rr_++;
      continue;
    }
    if (deficit_[p] >= need) {
      deficit_[p] -= need;
      return p;
    }
    deficit_[p] += quantum * weight_[p];
    rr_++;
  }
  return uint16_t(rr_++ % n_);
}

// Lowest smoothed RTT wins; every 16th packet explores a random path so the
// estimates of the others stay fresh, and unknown paths count as best.
//
// After a path is set aside, two rules keep BestRTT from walking a black
// hole one path at a time (on ns-3, a hole in one spine kept it below 90%
// of its goodput for good in 7 of 10 runs; both rules: back in about 1 ms,
// as OBS, docs/experiments.md):
// - Only paths with an RTT sample since the latest set-aside compete. The
//   paths that died with it get no samples, and their estimates, frozen
//   from before the failure, look better than those of the live paths the
//   herded load now queues on, so they would be tried next, each one
//   costing a window and a loss detection.
// - The next 4 x n_ picks are at random: the window is spread over every
//   path, the other dead ones are found in parallel while data still flows
//   past them (a loss is found when a later packet arrives, and herded
//   onto one path there is none), and the live ones get fresh samples. A
//   path missed by all 4 x n_ picks: e^-4, 2%.
uint16_t PathSelector::pick_best_rtt() {
  if (explore_left_ > 0) {
    explore_left_--;
    return uint16_t(rand() % n_);
  }
  if (picks_ % 16 == 0) return uint16_t(rand() % n_);
  uint16_t best = n_;
  uint64_t best_rtt = UINT64_MAX;
  uint16_t start = uint16_t(rand() % n_);  // break ties randomly
  for (uint16_t i = 0; i < n_; i++) {
    uint16_t p = uint16_t((start + i) % n_);
    if (n_down_ && down_[p].until) continue;
    if (sampled_after_[p] != downs_) continue;  // evidence from before the latest failure
    if (srtt_[p] < best_rtt) {
      best_rtt = srtt_[p];
      best = p;
    }
  }
  return best < n_ ? best : uint16_t(rand() % n_);  // none answered since: explore
}

void PathSelector::on_ack(uint16_t path, uint64_t rtt_ns, bool ce) {
  if (path >= n_) return;
  if (n_down_ && down_[path].until) {  // it delivers again
    down_[path] = Down{};
    n_down_--;
  }
  if (algo_ == PathAlgo::REPS && rtt_ns) {
    // Near the base RTT: within half of it, and at least 2 us (a few
    // packets' serialisation at 100 Gb/s), so that an uncongested path's
    // jitter does not disqualify it.
    min_rtt_ = std::min(min_rtt_, rtt_ns);
    if (!ce && rtt_ns <= min_rtt_ + std::max<uint64_t>(min_rtt_ / 2, 2'000)) {
      // Once per ACK, however many packets it covered: queueing the path
      // once per packet sent runs of packets after each other onto it
      // (measured on ns-3: a third more uplink queue than OBS).
      if (recycle_len_ < n_) {
        recycle_[(recycle_head_ + recycle_len_) % n_] = path;
        recycle_len_++;
      }
    }
  }
  if (algo_ == PathAlgo::DWRR) weight_[path] += (1.0 - weight_[path]) / 16.0;
  if (algo_ == PathAlgo::BEST_RTT && rtt_ns) {
    uint64_t& s = srtt_[path];
    s = s ? (7 * s + rtt_ns) / 8 : rtt_ns;
    sampled_after_[path] = downs_;
  }
}

void PathSelector::on_timeout(uint16_t path, uint64_t now) {
  if (path >= n_) return;
  if (path == burst_path_) burst_left_ = 0;  // no more of the burst into a hole
  if (algo_ == PathAlgo::DWRR) weight_[path] = std::max(weight_[path] / 2, 1.0 / 64);
  if (algo_ == PathAlgo::BEST_RTT) srtt_[path] = std::max<uint64_t>(srtt_[path] * 4, 1'000'000);
  if (algo_ == PathAlgo::SINGLE || n_ == 1) return;  // nothing to move to
  if (down_.empty()) down_.resize(n_);
  Down& d = down_[path];
  if (d.until) return;  // down already: its probes set the hold
  n_down_++;
  downs_++;
  if (burst_ > 1) per_packet_left_ = 4u * n_;
  if (algo_ == PathAlgo::BEST_RTT) explore_left_ = 4u * n_;
  d.fails = 0;
  d.until = now + hold_ns_;
  next_probe_ = std::min(next_probe_, d.until);
}

}  // namespace vstellar
