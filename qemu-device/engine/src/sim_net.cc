#include "vstellar/sim_net.h"

#include <algorithm>
#include <cstring>

#include "vstellar/engine.h"

namespace vstellar {
namespace {

class SimLink final : public Link {
 public:
  SimLink(SimNet& net, uint32_t ip) : net_(net), ip_(ip) {}
  void send(uint16_t path, const Endpoint& dst, const uint8_t* hdr, size_t hlen,
            const HostSpan* payload, size_t nspans) override {
    std::vector<uint8_t> b(hdr, hdr + hlen);
    for (size_t i = 0; i < nspans; i++) b.insert(b.end(), payload[i].ptr, payload[i].ptr + payload[i].len);
    net_.enqueue(ip_, dst.ip, path, std::move(b));
  }
  void flush() override {}
  bool join_group(uint32_t group, bool join) override {
    net_.join_group(ip_, group, join);
    return true;
  }

 private:
  SimNet& net_;
  uint32_t ip_;
};

}  // namespace

Link& SimNet::add_node(uint32_t ip) {
  auto& l = links_[ip];
  l = std::make_unique<SimLink>(*this, ip);
  return *l;
}

void SimNet::attach(uint32_t ip, Engine* e) { engines_[ip] = e; }

void SimNet::join_group(uint32_t node, uint32_t group, bool join) {
  std::vector<uint32_t>& m = groups_[group];
  auto it = std::find(m.begin(), m.end(), node);
  if (join && it == m.end()) m.push_back(node);
  if (!join && it != m.end()) m.erase(it);
}

void SimNet::enqueue(uint32_t from, uint32_t to, uint16_t path, std::vector<uint8_t> bytes) {
  if ((to & 0xf0000000u) == 0xe0000000u) {  // a group: a copy per member
    const std::vector<uint32_t> members = groups_[to];
    for (uint32_t m : members) enqueue(from, m, path, bytes);
    return;
  }
  stats.sent++;
  if (tap && !tap(from, to, path, bytes)) {
    stats.dropped++;
    return;
  }
  const SimImpairment& im = impairment;
  if (im.burst_enter > 0) burst_bad_ = burst_bad_ ? uni() >= im.burst_exit : uni() < im.burst_enter;
  bool drop = (im.loss > 0 && uni() < im.loss) || (burst_bad_ && uni() < im.burst_loss) ||
              (int(path) == im.dead_path) ||
              (int(path) == im.lossy_path && uni() < im.lossy_path_rate);
  if (drop) {
    stats.dropped++;
    return;
  }
  uint64_t t = now_ + im.delay_ns;
  if (im.jitter_ns) t += std::uniform_int_distribution<uint64_t>(0, im.jitter_ns - 1)(rng_);
  bool ce = im.ce_rate > 0 && uni() < im.ce_rate;
  if (im.bandwidth_bps) {
    uint64_t& free_at = link_free_[to];
    uint64_t start = std::max(free_at, now_);
    if (im.ecn_threshold_ns && start - now_ > im.ecn_threshold_ns) ce = true;
    free_at = start + (bytes.size() + 42) * 8'000'000'000ull / im.bandwidth_bps;
    t += free_at - now_;
  }
  if (im.reorder > 0 && uni() < im.reorder) {
    t += im.reorder_delay_ns;
    stats.reordered++;
  }
  if (ce) stats.ce++;
  if (im.dup > 0 && uni() < im.dup) {
    stats.duplicated++;
    events_.push({t + im.delay_ns / 2 + 1, seq_++, from, to, ce, bytes});
  }
  events_.push({t, seq_++, from, to, ce, std::move(bytes)});
}

void SimNet::inject(uint32_t from, uint32_t to, std::vector<uint8_t> bytes, bool ce) {
  events_.push({now_, seq_++, from, to, ce, std::move(bytes)});
}

bool SimNet::step(uint64_t limit) {
  bool busy = false;
  for (auto& [ip, e] : engines_)
    if (e->progress()) busy = true;
  while (!events_.empty() && events_.top().t <= now_) {
    Event ev = events_.top();
    events_.pop();
    auto it = engines_.find(ev.to);
    if (it == engines_.end()) continue;
    stats.delivered++;
    it->second->receive(ev.bytes.data(), ev.bytes.size(), Endpoint{ev.from, 0}, ev.ce);
    busy = true;
  }
  if (busy) return true;
  uint64_t next = events_.empty() ? UINT64_MAX : events_.top().t;
  for (auto& [ip, e] : engines_) next = std::min(next, e->next_deadline());
  if (next == UINT64_MAX || next > limit) return false;
  now_ = std::max(now_, next);
  return true;
}

bool SimNet::run_until(const std::function<bool()>& pred, uint64_t max_ns) {
  uint64_t limit = now_ + max_ns;
  while (!pred()) {
    if (!step(limit)) return pred();
  }
  return true;
}

void SimNet::run_for(uint64_t ns) {
  uint64_t limit = now_ + ns;
  while (step(limit)) {
  }
  now_ = std::max(now_, limit);
}

}  // namespace vstellar
