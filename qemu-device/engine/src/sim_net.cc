#include "vstellar/sim_net.h"

#include <algorithm>
#include <cstring>

#include "vstellar/engine.h"

namespace vstellar {
namespace {

// Bytes a datagram takes on the wire besides its UDP payload (IPv4, UDP,
// Ethernet header and FCS), as a shaper counts them.
constexpr size_t kWireOverhead = 42;

class SimLink final : public Link {
 public:
  SimLink(SimNet& net, uint32_t ip) : net_(net), ip_(ip) {}
  // A node has one IPv4 address: the source is always it, and an IPv6
  // destination is nobody.
  void send(uint16_t path, const IpAddr&, const Endpoint& dst, const uint8_t* hdr, size_t hlen,
            const HostSpan* payload, size_t nspans) override {
    if (!dst.ip.is_v4()) return;
    std::vector<uint8_t> b(hdr, hdr + hlen);
    for (size_t i = 0; i < nspans; i++) b.insert(b.end(), payload[i].ptr, payload[i].ptr + payload[i].len);
    net_.enqueue(ip_, dst.ip.v4(), path, std::move(b));
  }
  void flush() override {}
  bool join_group(const IpAddr& group, bool join) override {
    if (!group.is_v4()) return false;  // IPv4 nodes
    net_.join_group(ip_, group.v4(), join);
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
  if (impairment.refuse > 0) {
    Refusing& r = refusing_[from];
    if (now_ >= r.until) r.left = 0;
    if (r.left == 0 && uni() < impairment.refuse) {
      r.left = std::max<uint32_t>(1, impairment.refuse_run);
      r.until = now_ + impairment.refuse_ns;
    }
    if (r.left > 0) {
      r.left--;
      stats.refused++;
      stats.dropped++;
      return;
    }
  }
  if (tap && !tap(from, to, path, bytes)) {
    stats.dropped++;
    return;
  }
  const SimImpairment& im = impairment;
  if (im.burst_enter > 0) burst_bad_ = burst_bad_ ? uni() >= im.burst_exit : uni() < im.burst_enter;
  bool drop = (im.loss > 0 && uni() < im.loss) || (burst_bad_ && uni() < im.burst_loss) ||
              (int(path) == im.dead_path) ||
              (int(path) == im.lossy_path && uni() < im.lossy_path_rate);
  bool ce = im.ce_rate > 0 && uni() < im.ce_rate;
  uint64_t t = now_;
  if (!drop && im.uplinks > 0) {
    const uint16_t u = uplink_of(from, path);
    if (int(u) == im.dead_uplink) {
      drop = true;
    } else if (const SimQueueConfig& c = u < im.uplink_each.size() ? im.uplink_each[u] : im.uplink;
               c.rate_bps) {
      t = up_[{from, u}].admit(c, now_, uint32_t(bytes.size() + kWireOverhead), ce);
      if (t == UINT64_MAX) {
        stats.queue_drops++;
        drop = true;
      }
    }
  }
  if (drop) {
    stats.dropped++;
    return;
  }
  if (t > now_) {  // still in flight to the destination's queue
    events_.push({t, seq_++, from, to, ce, std::move(bytes), true, path});
    return;
  }
  deliver_at(t, from, to, ce, std::move(bytes), path);
}

void SimNet::deliver_at(uint64_t t, uint32_t from, uint32_t to, bool ce, std::vector<uint8_t> bytes,
                        uint16_t sport) {
  const SimImpairment& im = impairment;
  if (im.downlink.rate_bps) {
    t = down_[to].admit(im.downlink, t, uint32_t(bytes.size() + kWireOverhead), ce);
    if (t == UINT64_MAX) {
      stats.queue_drops++;
      stats.dropped++;
      return;
    }
  }
  t += im.delay_ns;
  if (im.jitter_ns) {
    // Jitter is the varying wait in FIFO queues along the path: a packet
    // does not overtake the one before it on the same 5-tuple (the engine's
    // path-gap rule relies on that, as on a real fabric). `reorder` below
    // is the impairment that does reorder within a path.
    t += std::uniform_int_distribution<uint64_t>(0, im.jitter_ns - 1)(rng_);
    uint64_t& last = path_last_[{from, to, sport}];
    t = std::max(t, last);
    last = t;
  }
  if (im.reorder > 0 && uni() < im.reorder) {
    t += im.reorder_delay_ns;
    stats.reordered++;
  }
  if (ce) stats.ce++;
  if (im.dup > 0 && uni() < im.dup) {
    stats.duplicated++;
    events_.push({t + im.delay_ns / 2 + 1, seq_++, from, to, ce, bytes, false, sport});
  }
  events_.push({t, seq_++, from, to, ce, std::move(bytes), false, sport});
}

uint16_t SimNet::uplink_of(uint32_t from, uint16_t path) const {
  if (impairment.uplinks == 0) return 0;
  uint64_t x = (uint64_t(from) << 16 | path) ^ (impairment.ecmp_seed * 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64's finaliser
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return uint16_t(x % impairment.uplinks);
}

void SimNet::Queue::drain(uint64_t now) {
  if (area_t == 0) area_t = first_t = now;
  while (!inq.empty() && inq.front().first <= now) {
    const uint64_t d = std::max(inq.front().first, area_t);
    area += double(backlog) * double(d - area_t);
    area_t = d;
    backlog -= inq.front().second;
    inq.pop_front();
  }
  if (now > area_t) {
    area += double(backlog) * double(now - area_t);
    area_t = now;
  }
}

uint64_t SimNet::Queue::admit(const SimQueueConfig& c, uint64_t now, uint32_t len, bool& ce) {
  drain(now);
  st.pkts++;
  const size_t bin = size_t(backlog / 1024);
  if (seen.size() <= bin) seen.resize(bin + 1);
  seen[bin]++;
  if (c.limit_bytes && backlog + len > c.limit_bytes) {
    st.drops++;
    return UINT64_MAX;
  }
  if (c.ecn_bytes && backlog > c.ecn_bytes) {
    ce = true;
    st.marks++;
  }
  const double ns_per_byte = 8e9 / double(c.rate_bps);
  const uint64_t start = std::max(now, last_dep);
  uint64_t dep;
  if (c.burst_bytes == 0) {
    dep = start + uint64_t(len * ns_per_byte);  // serialised at the rate
  } else {
    // Token bucket: tokens refill at the rate up to burst_bytes; a packet
    // leaves (at once, the line is much faster) when it finds enough.
    tokens = std::min(double(c.burst_bytes), tokens + double(start - tok_t) / ns_per_byte);
    tok_t = start;
    if (tokens >= len) {
      dep = start;
      tokens -= len;
    } else {
      dep = start + uint64_t((len - tokens) * ns_per_byte);
      tokens = 0;
      tok_t = dep;
    }
  }
  last_dep = dep;
  inq.emplace_back(dep, len);
  backlog += len;
  st.max_backlog = std::max(st.max_backlog, backlog);
  return dep;
}

SimQueueStats SimNet::Queue::stats() const {
  SimQueueStats s = st;
  s.mean_backlog = area_t > first_t ? area / double(area_t - first_t) : 0;
  uint64_t n = 0, want = (st.pkts * 99 + 99) / 100;
  for (size_t i = 0; i < seen.size(); i++) {
    n += seen[i];
    if (n >= want) {
      s.p99_backlog = i * 1024;
      break;
    }
  }
  return s;
}

void SimNet::reset_queue_stats() {
  auto reset = [&](Queue& q) {
    q.drain(now_);
    q.st = SimQueueStats{};
    q.seen.clear();
    q.area = 0;
    q.first_t = q.area_t = now_;
  };
  for (auto& [k, q] : up_) reset(q);
  for (auto& [ip, q] : down_) reset(q);
}

SimQueueStats SimNet::uplink_stats(uint32_t node, uint16_t u) const {
  auto it = up_.find({node, u});
  return it == up_.end() ? SimQueueStats{} : it->second.stats();
}

SimQueueStats SimNet::downlink_stats(uint32_t node) const {
  auto it = down_.find(node);
  return it == down_.end() ? SimQueueStats{} : it->second.stats();
}

void SimNet::inject(uint32_t from, uint32_t to, std::vector<uint8_t> bytes, bool ce) {
  events_.push({now_, seq_++, from, to, ce, std::move(bytes)});
}

void SimNet::freeze(uint32_t node, uint64_t until) {
  uint64_t& u = frozen_until_[node];
  u = std::max(u, until);
}

bool SimNet::step(uint64_t limit) {
  bool busy = false;
  for (auto& [ip, e] : engines_)
    if (!frozen(ip) && e->progress()) busy = true;
  std::vector<Event> held;  // for frozen nodes: delivered when they run again
  while (!events_.empty() && events_.top().t <= now_) {
    Event ev = events_.top();
    events_.pop();
    if (ev.hop) {
      deliver_at(ev.t, ev.from, ev.to, ev.ce, std::move(ev.bytes), ev.sport);
      continue;
    }
    auto it = engines_.find(ev.to);
    if (it == engines_.end()) continue;
    if (frozen(ev.to)) {
      held.push_back(std::move(ev));
      continue;
    }
    stats.delivered++;
    it->second->receive(ev.bytes.data(), ev.bytes.size(), Endpoint{ev.from, ev.sport}, IpAddr(ev.to), ev.ce);
    busy = true;
  }
  for (Event& ev : held) {  // same order, at the end of the descheduling
    ev.t = frozen_until_[ev.to];
    events_.push(std::move(ev));
  }
  if (busy) return true;
  uint64_t next = events_.empty() ? UINT64_MAX : events_.top().t;
  for (auto& [ip, e] : engines_) {
    const uint64_t d = e->next_deadline();
    if (d == UINT64_MAX) continue;
    next = std::min(next, frozen(ip) ? std::max(d, frozen_until_[ip]) : d);
  }
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
