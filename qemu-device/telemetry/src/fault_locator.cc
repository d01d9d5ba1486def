// Failure localization (fault_locator.h has the method; docs/fabric.md
// the limits). Everything here is arithmetic over counters and probe
// answers: no I/O, no clock of its own, so tests drive it with a model
// fabric in virtual time.
#include "vstellar/telemetry/fault_locator.h"

#include <algorithm>
#include <cmath>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <set>

#include "vstellar/ip_text.h"

namespace vstellar::telemetry {

const char* to_string(FaultKind k) {
  switch (k) {
    case FaultKind::BLACK_HOLE: return "black_hole";
    case FaultKind::LOSSY: return "lossy";
    case FaultKind::SLOW: return "slow";
  }
  return "?";
}

namespace {

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char b[512];
  va_list ap;
  va_start(ap, f);
  vsnprintf(b, sizeof(b), f, ap);
  va_end(ap);
  return b;
}

uint64_t median(std::vector<uint64_t> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

std::string link_text(const LinkId& l) { return to_string(l.from) + " -> " + to_string(l.to); }

// Log-likelihood of `lost` of `n` probes lost at ratio r (binomial, without
// the constant the hypotheses share).
double loss_ll(double lost, double n, double r) {
  r = std::clamp(r, 1e-9, 1 - 1e-9);
  return lost * std::log(r) + (n - lost) * std::log(1 - r);
}

// Probes at hops whose answers are lost at ratio base[i] anyway (the
// baseline: a router's or this host's ICMP losses) and that all cross one
// link losing p more: the p that makes lost[i] of n[i] most likely, and
// that likelihood. With q = 1 - p the log-likelihood is concave in q, so
// its derivative is found by bisection.
std::pair<double, double> fit_link_loss(const std::vector<double>& lost, const std::vector<double>& n,
                                        const std::vector<double>& base) {
  double answered = 0;
  for (size_t i = 0; i < n.size(); i++) answered += n[i] - lost[i];
  auto slope = [&](double q) {
    double d = answered / q;
    for (size_t i = 0; i < n.size(); i++)
      if (lost[i] > 0) d -= lost[i] * (1 - base[i]) / (1 - q * (1 - base[i]));
    return d;
  };
  double q = 1;
  if (slope(1) < 0) {
    double lo = 1e-9, hi = 1;
    for (int k = 0; k < 60; k++) (slope((lo + hi) / 2) > 0 ? lo : hi) = (lo + hi) / 2;
    q = (lo + hi) / 2;
  }
  double ll = 0;
  for (size_t i = 0; i < n.size(); i++) ll += loss_ll(lost[i], n[i], 1 - q * (1 - base[i]));
  return {1 - q, ll};
}

// What hop probes at one TTL say, over a set of paths.
struct HopView {
  uint32_t n = 0, answered = 0;
  std::vector<uint64_t> rtts;
  double loss() const { return n ? double(n - answered) / n : 0; }
};

}  // namespace

FaultLocator::FaultLocator(const LocatorConfig& cfg, const IpAddr& self, ProbeSender& probes)
    : cfg_(cfg), self_(self), probes_(probes) {
  if (cfg_.horizon_ticks < cfg_.dead_ticks) cfg_.horizon_ticks = cfg_.dead_ticks;
  if (cfg_.max_ttl == 0) cfg_.max_ttl = 1;
}

// ---- probes ----

bool FaultLocator::probe(uint64_t now, const Endpoint& peer, uint16_t path, uint8_t ttl, bool trace) {
  const uint32_t id = next_id_++;
  if (!probes_.send_probe(peer, path, ttl, id)) {
    stats_.probe_send_failures++;
    return false;
  }
  stats_.probes_sent++;
  outstanding_.emplace(id, Outstanding{id, peer, path, ttl, trace, now});
  return true;
}

void FaultLocator::on_reply(const HopReply& r) {
  auto it = outstanding_.find(r.id);
  if (it == outstanding_.end()) {
    stats_.late_replies++;
    return;
  }
  const Outstanding o = it->second;
  outstanding_.erase(it);
  stats_.replies++;
  auto pit = peers_.find(o.peer);
  if (pit == peers_.end() || o.path >= pit->second.paths.size()) return;
  PeerState& ps = pit->second;
  PathState& p = ps.paths[o.path];
  if (o.trace && p.tracing && o.ttl <= p.trace.size()) p.trace[o.ttl - 1] = r.hop;
  // A hop answering from another address than the route says: the route
  // moved (a routing change); trace it again soon.
  if (!o.trace && o.ttl <= p.route.size() && p.route[o.ttl - 1] != r.hop) p.next_trace_ns = 0;
  ps.hops.push_back({o.path, o.ttl, true, r.at_ns > o.sent_ns ? r.at_ns - o.sent_ns : 1, o.sent_ns, r.at_ns});
}

void FaultLocator::expire_probes(uint64_t now) {
  while (!outstanding_.empty()) {
    const Outstanding& o = outstanding_.begin()->second;  // lowest id: the oldest
    if (o.sent_ns + cfg_.probe_timeout_ns > now) break;
    auto pit = peers_.find(o.peer);
    if (pit != peers_.end()) pit->second.hops.push_back({o.path, o.ttl, false, 0, o.sent_ns, now});
    outstanding_.erase(outstanding_.begin());
  }
  const uint64_t keep = uint64_t(cfg_.hop_window_ticks + 10) * cfg_.tick_ns;
  for (auto& [peer, ps] : peers_) {
    while (!ps.hops.empty() && ps.hops.front().at_ns + keep < now) ps.hops.pop_front();
    for (uint16_t i = 0; i < ps.paths.size(); i++)
      if (ps.paths[i].tracing && ps.paths[i].trace_started + cfg_.probe_timeout_ns <= now)
        finish_trace(now, ps, i);
  }
}

void FaultLocator::finish_trace(uint64_t now, PeerState& ps, uint16_t path) {
  PathState& p = ps.paths[path];
  p.tracing = false;
  stats_.traces++;
  // The hops that answered, from the first on. Past the last router the
  // probe reaches the peer, which does not answer; a trace shorter than
  // the others of this peer lost a probe (or met a fault) and is not a
  // route.
  size_t k = 0;
  while (k < p.trace.size() && !p.trace[k].unspecified()) k++;
  if (k > 0 && k >= ps.route_len) {
    if (k > ps.route_len) {  // the shorter routes were not whole: their links go
      ps.route_len = k;
      for (PathState& q : ps.paths) q.links.clear();
    }
    if (p.route.empty()) stats_.routes_known++;
    p.route.assign(p.trace.begin(), p.trace.begin() + long(k));
    p.links.clear();  // evaluate() derives them again
    // Refresh slowly, spread over the refresh period so that the peer's
    // paths do not all trace in the same tick.
    rng_ = rng_ * 6364136223846793005ull + 1442695040888963407ull;
    p.next_trace_ns = now + cfg_.route_refresh_ns / 2 + (rng_ >> 11) % (cfg_.route_refresh_ns / 2 + 1);
  } else {
    p.next_trace_ns = now + 10 * cfg_.tick_ns;  // try again soon
  }
}

void FaultLocator::send_probes(uint64_t now) {
  uint32_t budget = cfg_.probe_budget;
  // Hop probes first: they settle a fault that is being located: most
  // over the suspect paths, some over other paths of the same peer (the
  // baseline each hop is compared with).
  for (auto& [peer, ps] : peers_) {
    if (ps.targets.empty() || ps.route_len == 0) continue;
    std::vector<uint16_t> others;
    std::set<uint16_t> sus;
    for (const ProbeTarget& t : ps.targets) sus.insert(t.paths.begin(), t.paths.end());
    for (uint16_t i = 0; i < ps.paths.size(); i++)
      if (!sus.count(i) && ps.paths[i].route.size() == ps.route_len && ps.paths[i].active) others.push_back(i);
    const uint32_t share = std::max<uint32_t>(2, cfg_.probe_budget * 7 / 8 / uint32_t(peers_.size()));
    // The groups in turn, each over its own paths at its own TTLs; one
    // probe in four over a path outside every group, at the same TTL: the
    // baseline.
    // A group already told apart needs a few probes to stay so; one not
    // yet, four times as many.
    std::vector<size_t> turns;
    for (size_t i = 0; i < ps.targets.size(); i++)
      for (int w = ps.targets[i].resolved ? 1 : 4; w > 0; w--) turns.push_back(i);
    for (uint32_t k = 0; k < share && budget; k++) {
      const ProbeTarget& t = ps.targets[turns[k % turns.size()]];
      const uint32_t c = ps.suspect_cursor + k / uint32_t(turns.size());
      const bool baseline = k % 4 == 3 && !others.empty();
      const uint16_t path = baseline ? others[c % others.size()] : t.paths[c % t.paths.size()];
      const uint8_t ttl = t.ttls[(c / t.paths.size() + c) % t.ttls.size()];
      if (probe(now, peer, path, ttl, false)) budget--;
    }
    ps.suspect_cursor = uint16_t(ps.suspect_cursor + share / turns.size() + 1);
  }
  // Then route traces: paths that carry traffic and have no route, or
  // whose refresh is due. A trace sends a probe per TTL at once.
  for (auto& [peer, ps] : peers_) {
    const uint8_t ttls = uint8_t(ps.route_len ? std::min<size_t>(ps.route_len + 1, cfg_.max_ttl) : cfg_.max_ttl);
    for (size_t n = 0; n < ps.paths.size() && budget >= ttls; n++) {
      const uint16_t i = uint16_t((ps.refresh_cursor + n) % ps.paths.size());
      PathState& p = ps.paths[i];
      if (p.tracing || !p.active || p.next_trace_ns > now) continue;
      p.tracing = true;
      p.trace_started = now;
      p.trace.assign(ttls, IpAddr());
      for (uint8_t t = 1; t <= ttls; t++)
        if (probe(now, peer, i, t, true)) budget--;
      ps.refresh_cursor = uint16_t((i + 1) % ps.paths.size());
    }
  }
}

// ---- evidence ----

void FaultLocator::update_health(const Endpoint& peer, const std::vector<PathHealth>& h) {
  PeerState& ps = peers_[peer];
  if (ps.paths.size() != h.size()) ps.paths.assign(h.size(), PathState{});
  for (size_t i = 0; i < h.size(); i++) {
    PathState& p = ps.paths[i];
    Slot s;
    s.sent = h[i].sent - p.last.sent;
    s.lost = h[i].lost - p.last.lost;
    s.not_lost = h[i].not_lost - p.last.not_lost;
    s.delivered = h[i].delivered - p.last.delivered;
    s.answered = h[i].answered - p.last.answered;
    s.rtt_sum_ns = h[i].rtt_sum_ns - p.last.rtt_sum_ns;
    p.last = h[i];
    p.slots.push_back(s);
    // Running sums over the last `w` slots: add the new one, take out the
    // one that just left the window.
    auto roll = [&](Slot& sum, size_t w) {
      sum += s;
      if (p.slots.size() > w) sum -= p.slots[p.slots.size() - 1 - w];
    };
    roll(p.loss_sum, cfg_.loss_ticks);
    roll(p.horizon_sum, cfg_.horizon_ticks);
    roll(p.dead_sum, cfg_.dead_ticks);
    if (p.slots.size() > std::max(cfg_.horizon_ticks, cfg_.loss_ticks)) p.slots.pop_front();
    p.active = p.horizon_sum.sent > 0;
  }
}

std::vector<LinkId> FaultLocator::links_of(const PeerState& ps, uint16_t path) const {
  const PathState& p = ps.paths[path];
  std::vector<LinkId> out;
  if (ps.route_len == 0 || p.route.size() != ps.route_len) return out;
  IpAddr prev = self_;
  for (const IpAddr& hop : p.route) {
    out.push_back({prev, hop});
    prev = hop;
  }
  // The last link, into the peer, is not listed: every path to the peer
  // crosses it, so this peer's paths cannot tell it from the peer itself.
  return out;
}

void FaultLocator::evaluate(uint64_t now, const Endpoint& peer, PeerState& ps, std::vector<Candidate>& out) {
  ps.targets.clear();
  const size_t n = ps.paths.size();
  // 1. Each path over the horizon (loss, RTT) and over the last dead_ticks.
  struct PathView {
    bool active = false, dead = false;
    bool lost_all = false;  // dead by its own counts, not only by the engine's verdict
    uint64_t sent = 0, lost = 0, rtt = 0;
  };
  std::vector<PathView> pv(n);
  for (size_t i = 0; i < n; i++) {
    const PathState& p = ps.paths[i];
    const Slot& H = p.horizon_sum;
    const Slot& L = p.loss_sum;
    const uint64_t sent = H.sent, ans = H.answered, got = H.delivered + H.answered, rtt = H.rtt_sum_ns;
    const uint64_t lsent = L.sent, lost = L.lost, not_lost = L.not_lost;
    const uint64_t dsent = p.dead_sum.sent, dgot = p.dead_sum.delivered + p.dead_sum.answered;
    PathView& v = pv[i];
    v.active = sent >= 3;
    // Dead: nothing sent on it came back, and it went on sending (data,
    // or the probe copies of a path set aside) or the engine holds it set
    // aside now (PathHealth::down: a timer found a packet on it lost and
    // no probe copy has been answered since). With a path picked per
    // packet, a dead path loses one packet before it is set aside and
    // then carries a probe copy now and then: waiting for 3 packets sent
    // within dead_ticks took 1.6-3 s to name a black hole on a loaded
    // host, or never did.
    v.lost_all = dgot == 0 && dsent > 0 && (dsent >= 3 || (got == 0 && sent >= 3));
    v.dead = v.lost_all || (dgot == 0 && p.last.down > 0);
    // Losses: timeouts, less those answered after all (a descheduled
    // engine at either end times out packets the fabric delivered).
    v.sent = lsent, v.lost = lost > not_lost ? lost - not_lost : 0, v.rtt = ans ? rtt / ans : 0;
  }
  auto good = [&](size_t i) { return pv[i].active && !pv[i].dead; };
  // Whose losses and RTTs are compared: every active path but those that
  // lost all they sent (a path dead by the engine's verdict alone counts).
  auto measured = [&](size_t i) { return pv[i].active && !pv[i].lost_all; };
  size_t n_good = 0, n_dead = 0;
  for (size_t i = 0; i < n; i++) n_good += good(i), n_dead += pv[i].active && pv[i].dead;
  // Every active path dead: the peer is gone or a link every path crosses
  // broke; nothing to compare with, nothing to say.
  if (n_good == 0) return;

  // Without routes: path granularity.
  if (ps.route_len == 0) {
    if (n_dead >= 2) {
      Candidate c{{self_, peer.ip}, FaultKind::BLACK_HOLE, peer, uint32_t(n_dead), 0, "", false};
      c.confidence = double(n_dead) / double(n_dead + n_good);
      c.evidence = fmt("%zu of %zu active paths to the peer lost all they sent; no routes known (no ICMP "
                       "answers), so no link can be named",
                       n_dead, n_dead + n_good);
      out.push_back(c);
    }
    return;
  }

  // Nothing any link could be suspect of: no dead paths, too few losses
  // for a lossy link, RTTs too close for a slow one. The common case,
  // and the cheap one.
  {
    uint64_t lost_total = 0, rtt_min = UINT64_MAX, rtt_max = 0;
    for (size_t i = 0; i < n; i++) {
      if (!measured(i)) continue;
      lost_total += pv[i].lost;
      if (pv[i].rtt) rtt_min = std::min(rtt_min, pv[i].rtt), rtt_max = std::max(rtt_max, pv[i].rtt);
    }
    const bool rtt_spread = rtt_max && double(rtt_max) >= cfg_.slow_factor * double(rtt_min) &&
                            rtt_max >= rtt_min + cfg_.slow_min_ns;
    if (n_dead < 2 && lost_total < cfg_.loss_min_events && !rtt_spread) {
      forget_groups(now, ps);
      return;
    }
  }

  // 2. Tomography over the links of the known routes.
  struct LinkAgg {
    std::vector<uint16_t> paths;  // active paths crossing it
    size_t position = 0;          // 1: our own first link (the one into the peer is not listed)
    uint64_t dead = 0, sent = 0, lost = 0;
    std::vector<uint64_t> rtts;
  };
  std::map<LinkId, LinkAgg> links;
  uint64_t all_sent = 0, all_lost = 0;
  size_t all_active = 0, all_dead = 0;
  for (uint16_t i = 0; i < n; i++) {
    if (!pv[i].active) continue;
    PathState& path = ps.paths[i];
    if (path.links.empty()) path.links = links_of(ps, i);
    const std::vector<LinkId>& ls = path.links;
    if (ls.empty()) continue;
    all_active++;
    if (pv[i].dead) all_dead++;
    // A path set aside after a loss or two, on a lossy link, is dead only
    // by the engine's verdict: its losses count towards loss, or a lossy
    // link whose paths the engine holds aside would hide its loss.
    if (measured(i)) {
      all_sent += pv[i].sent, all_lost += pv[i].lost;
    }
    for (size_t k = 0; k < ls.size(); k++) {
      LinkAgg& a = links[ls[k]];
      a.paths.push_back(i);
      a.position = k + 1;
      if (pv[i].dead) a.dead++;
      if (measured(i)) {
        a.sent += pv[i].sent, a.lost += pv[i].lost;
        if (pv[i].rtt) a.rtts.push_back(pv[i].rtt);
      }
    }
  }
  struct Suspect {
    LinkId link;
    FaultKind kind;
    const LinkAgg* agg;
    std::string why;
  };
  std::vector<Suspect> suspects;
  for (const auto& [id, a] : links) {
    const size_t crossing = a.paths.size();
    if (crossing == 0 || crossing == all_active) continue;  // nothing to compare with
    const size_t other_active = all_active - crossing;
    const size_t other_dead = all_dead - a.dead;
    if (a.dead >= 2 && double(a.dead) >= cfg_.dead_fraction * double(crossing) && other_dead < other_active) {
      suspects.push_back({id, FaultKind::BLACK_HOLE, &a,
                          fmt("%" PRIu64 " of %zu paths crossing it had nothing back (lost all they sent, or held aside by the engine), %zu of %zu other paths",
                              a.dead, crossing, other_dead, other_active)});
      continue;
    }
    // The RTTs of the live paths that do not cross it.
    std::vector<bool> crosses(n);
    for (uint16_t p : a.paths) crosses[p] = true;
    std::vector<uint64_t> other_rtts;
    for (size_t i = 0; i < n; i++)
      if (!crosses[i] && measured(i) && pv[i].rtt && !ps.paths[i].links.empty()) other_rtts.push_back(pv[i].rtt);
    const uint64_t rtt_mine = median(a.rtts), rtt_other = median(other_rtts);
    if (a.rtts.size() >= 2 && other_rtts.size() >= 2 && double(rtt_mine) >= cfg_.slow_factor * double(rtt_other) &&
        rtt_mine >= rtt_other + cfg_.slow_min_ns) {
      suspects.push_back({id, FaultKind::SLOW, &a,
                          fmt("median RTT %.2f ms on the %zu paths crossing it, %.2f ms on the others",
                              double(rtt_mine) / 1e6, a.rtts.size(), double(rtt_other) / 1e6)});
      continue;
    }
    const uint64_t o_sent = all_sent - a.sent, o_lost = all_lost - a.lost;
    const double loss_mine = a.sent ? double(a.lost) / double(a.sent) : 0;
    const double loss_other = o_sent ? double(o_lost) / double(o_sent) : 0;
    // More losses than chance puts on these paths: the expected count
    // at the peer's overall ratio, plus four standard deviations (Poisson).
    const double expect = double(a.sent) * double(all_lost) / double(all_sent ? all_sent : 1);
    const bool beyond_chance = double(a.lost) >= expect + 4 * std::sqrt(expect) + 3;
    if (a.lost >= cfg_.loss_min_events && loss_mine >= cfg_.loss_min && loss_mine >= loss_other + cfg_.loss_excess &&
        beyond_chance)
      suspects.push_back({id, FaultKind::LOSSY, &a,
                          fmt("%.2f%% of %" PRIu64 " packets lost on the paths crossing it, %.2f%% on the others",
                              100 * loss_mine, a.sent, 100 * loss_other)});
  }
  if (suspects.empty()) {
    forget_groups(now, ps);
    return;
  }

  // 3. Links crossed by the same paths are one group; hop probes tell
  // which of them it is (and what kind: a hop that answers late is a slow
  // link even where the end-to-end view saw mostly losses).
  std::map<std::vector<uint16_t>, std::vector<const Suspect*>> groups;
  for (const Suspect& s : suspects) groups[s.agg->paths].push_back(&s);
  const uint64_t window = cfg_.hop_window_ticks * cfg_.tick_ns;
  // The baseline of a hop is the paths outside every suspect group (a
  // second fault's paths would make any hop look good).
  std::set<uint16_t> any_suspect;
  for (const auto& [paths, members] : groups) any_suspect.insert(paths.begin(), paths.end());
  for (auto& [paths, members] : groups) {
    std::sort(members.begin(), members.end(),
              [](const Suspect* x, const Suspect* y) { return x->agg->position < y->agg->position; });
    std::set<uint16_t> in(paths.begin(), paths.end());
    // Hop probes over its paths at the far end of each member; for a slow
    // suspect, at the near end of the first too (the reference for what
    // each link adds to the RTT; a trace's answers serve otherwise).
    ProbeTarget target{paths, {}};
    for (const Suspect* s : members) {
      if (s == members.front() && s->kind == FaultKind::SLOW && s->agg->position > 1)
        target.ttls.push_back(uint8_t(s->agg->position - 1));
      target.ttls.push_back(uint8_t(s->agg->position));
    }
    ps.targets.push_back(std::move(target));
    // Hop probes count from when the group became suspect: older answers
    // describe the fabric before the fault.
    const LinkId key = members.front()->link;
    GroupTime& gt = ps.groups.emplace(key, GroupTime{now, now}).first->second;
    gt.last = now;
    const uint64_t since = gt.since;
    const Suspect* pick = nullptr;
    FaultKind kind = members.front()->kind;
    double certainty = 1;  // what the hop probes add: 1 - answered share for a dead hop
    std::string hop_why;
    bool undecided = false;
    // The hop probes at one TTL since the group became suspect: over its
    // paths, and over the paths outside every group.
    auto view = [&](size_t at_ttl, HopView& mine_v, HopView& other_v) {
      for (const HopSample& h : ps.hops) {
        if (h.ttl != at_ttl || h.at_ns + window < now || h.sent_ns < since) continue;
        if (!in.count(h.path) && any_suspect.count(h.path)) continue;
        HopView& v = in.count(h.path) ? mine_v : other_v;
        v.n++;
        if (h.answered) v.answered++, v.rtts.push_back(h.rtt_ns);
      }
    };
    // Each member's far-end hop, and its near end (the hop before).
    std::vector<HopView> mine(members.size()), other(members.size()), mine_before(members.size()),
        other_before(members.size());
    for (size_t m = 0; m < members.size(); m++) {
      view(members[m]->agg->position, mine[m], other[m]);
      view(members[m]->agg->position - 1, mine_before[m], other_before[m]);
    }
    // Loss along the group's paths. A lossy link's loss shows at its far
    // end and at every later hop, so the question is where it starts: for
    // each member k, the likelihood of all the group's hop probes if k's
    // link loses some p (fitted) on top of the baseline from k's hop on,
    // against the same for the other members and for no lossy link at
    // all. Judging each hop alone against a threshold, tick after tick,
    // came out wrong by chance now and then over the many ticks a fault
    // lasts (a lossy uplink's hop once passed as clean, and the spine link
    // after it was named).
    // The baseline is what probes lose without a faulty link: answers the
    // loaded host (or a router) missed. It is one ratio for every hop (the
    // hops of other paths are other routers anyway), measured by the
    // probes over other paths and the group's own probes before the lossy
    // link; comparing each hop with its own few baseline probes (one in
    // four goes over other paths) left too little evidence.
    std::vector<double> lost_n(members.size()), sent_n(members.size());
    double other_lost = 0, other_sent = 0;
    for (size_t m = 0; m < members.size(); m++) {
      lost_n[m] = double(mine[m].n - mine[m].answered), sent_n[m] = double(mine[m].n);
      other_lost += double(other[m].n - other[m].answered), other_sent += double(other[m].n);
    }
    std::vector<double> ll(members.size() + 1);  // ll[k]: loss from member k on; ll[members.size()]: none
    std::vector<double> fitted(members.size());
    for (size_t k = 0; k <= members.size(); k++) {
      double clean_lost = other_lost, clean_sent = other_sent;
      for (size_t j = 0; j < k && j < members.size(); j++) clean_lost += lost_n[j], clean_sent += sent_n[j];
      const double b = clean_sent ? clean_lost / clean_sent : 0;
      ll[k] = loss_ll(clean_lost, clean_sent, b);
      if (k == members.size()) continue;
      const std::vector<double> lost_after(lost_n.begin() + long(k), lost_n.end()),
          sent_after(sent_n.begin() + long(k), sent_n.end());
      auto [p, after] = fit_link_loss(lost_after, sent_after, std::vector<double>(lost_after.size(), b));
      fitted[k] = p, ll[k] += after;
    }
    const size_t none = members.size();
    size_t best = 0;
    for (size_t k = 1; k < members.size(); k++)
      if (ll[k] > ll[best]) best = k;
    double lost_from_best = 0;
    for (size_t j = best; j < members.size(); j++) lost_from_best += lost_n[j];
    // Loss on these paths at all: far likelier than none, and enough of it.
    const bool lossy_hops = ll[best] - ll[none] >= cfg_.hop_loss_evidence && fitted[best] >= cfg_.loss_min &&
                            lost_from_best >= 3;
    double runner_up = -INFINITY;
    for (size_t k = 0; k < members.size(); k++)
      if (k != best) runner_up = std::max(runner_up, ll[k]);
    // Where it starts: that member, once the others are far less likely;
    // until then a member picked before stays while it is the likeliest
    // (its evidence may hover at the threshold), and otherwise the group
    // waits.
    size_t lossy_at = none;
    const bool kept = gt.decided && gt.picked == members[best]->link;
    if (lossy_hops && (ll[best] - runner_up >= cfg_.hop_loss_evidence || kept)) lossy_at = best;
    // The loss the group's paths see end to end (they are the same paths
    // for every member). A hop that answers late is a slow link only once
    // the hops after it are shown not to lose that much: a connection's
    // queue sits on the uplink that got the most of its paths, and that
    // uplink's far end answered 1.77 ms against 0.85 ms before a 2% lossy
    // spine link, which was the fault.
    const LinkAgg& e2e = *members.front()->agg;
    const double e2e_loss = e2e.sent ? double(e2e.lost) / double(e2e.sent) : 0;
    const double other_base = (other_lost + 0.5) / (other_sent + 1);
    auto no_loss_after = [&](size_t m) {
      if (e2e_loss < cfg_.loss_min) return true;
      double odds = 0;
      for (size_t j = m + 1; j < lost_n.size(); j++)
        odds += loss_ll(lost_n[j], sent_n[j], other_base) -
                loss_ll(lost_n[j], sent_n[j], 1 - (1 - e2e_loss) * (1 - other_base));
      return m + 1 == lost_n.size() || odds >= cfg_.hop_loss_evidence;
    };
    for (size_t m = 0; m < members.size(); m++) {
      const Suspect* s = members[m];
      const size_t ttl = s->agg->position;  // the hop at the link's far end
      const HopView& mi = mine[m];
      const HopView& ot = other[m];
      const uint64_t rm = median(mi.rtts), ro = median(ot.rtts);
      // Slow: what this link adds (the RTT to its far end less the RTT to
      // its near end) against what it adds over other paths; a queue
      // before it delays every later hop too, and must not be blamed on
      // them. Without samples of the near end, the whole RTT.
      const bool have_before = mine_before[m].rtts.size() >= 3 && other_before[m].rtts.size() >= 3;
      const double add_mine = double(rm) - (have_before ? double(median(mine_before[m].rtts)) : 0);
      const double add_other = std::max(double(ro) - (have_before ? double(median(other_before[m].rtts)) : 0),
                                        double(cfg_.slow_min_ns) / 10);
      // And the far end itself must answer later over its paths than over
      // the others: on a loaded host the near-end and far-end medians are
      // mostly scheduling noise, and their difference alone once named a
      // hop slow whose far end answered 1.23 ms against 1.16 ms.
      const bool late = mi.rtts.size() >= 3 && ot.rtts.size() >= 3 && add_mine >= 2 * add_other &&
                        add_mine >= add_other + double(cfg_.slow_min_ns) / 2 &&
                        double(rm) >= double(ro) + double(cfg_.slow_min_ns) / 2;
      enum { ANOM, CLEAN, UNKNOWN } st = UNKNOWN;
      if (mi.n >= 3 && mi.answered * 5 <= mi.n) {
        st = ANOM, kind = FaultKind::BLACK_HOLE;
        certainty = 1 - double(mi.answered) / double(mi.n);
      } else if (late && no_loss_after(m)) {
        st = ANOM, kind = FaultKind::SLOW;
      } else if (late) {
        // A queue before a lossy link, or a slow link: the hops after it
        // tell, once the loss is placed.
        st = lossy_at != none && lossy_at > m ? CLEAN : UNKNOWN;
      } else if (mi.loss() >= 0.5) {
        // Most probes lost but not yet nearly all: a black hole forming,
        // or too few probes to say. Wait.
        st = UNKNOWN;
      } else if (lossy_hops) {
        st = lossy_at == m ? ANOM : lossy_at == none ? UNKNOWN : CLEAN;
        if (st == ANOM) kind = FaultKind::LOSSY;
      } else if (mi.n >= 3 && mi.answered * 10 >= mi.n * 7) {
        // Answering. Clean for a black hole at once; for loss or delay
        // only with enough probes.
        const bool enough = s->kind == FaultKind::BLACK_HOLE ||
                            (s->kind == FaultKind::SLOW ? mi.rtts.size() >= 5 : mi.n >= 3 / cfg_.loss_min);
        st = enough ? CLEAN : UNKNOWN;
      }
      if (st == ANOM) {
        pick = s;
        hop_why = fmt("hop %zu (%s) over its paths: %u of %u probes answered, median %.2f ms; over other paths: "
                      "%u of %u, median %.2f ms",
                      ttl, to_string(s->link.to).c_str(), mi.answered, mi.n, double(rm) / 1e6, ot.answered, ot.n,
                      double(ro) / 1e6);
        if (kind == FaultKind::LOSSY && members.size() > 1)
          hop_why += fmt("; loss starts here, %.1f%% (log-likelihood %.1f above the next likeliest hop)",
                         100 * fitted[m], ll[m] - runner_up);
        break;
      }
      if (st == UNKNOWN) {
        undecided = true;
        break;
      }
    }
    // The first pick stays against flicker (a later hop that crosses the
    // threshold now and then), unless its own hop has since been measured
    // clean: the members are judged in path order and the first anomalous
    // one is picked, so an earlier pick before this one passed as CLEAN
    // in this round, with enough probes. (A lossy pick keeps or gives way
    // by the likelihoods above.)
    if (pick && gt.decided && pick->link != gt.picked && kind != FaultKind::LOSSY) {
      bool earlier_clean = false;
      for (const Suspect* s : members) {
        if (s == pick) break;
        earlier_clean |= s->link == gt.picked;
      }
      if (earlier_clean) {
        hop_why = "named after the link picked first was measured clean; " + hop_why;
      } else {
        for (const Suspect* s : members)
          if (s->link == gt.picked) {  // the earlier pick, while it is still a member
            pick = s;
            hop_why = "picked first among the links crossed by the same paths; now " + hop_why;
          }
      }
    }
    if (pick) {
      gt.decided = true;
      gt.picked = pick->link;
    }
    ps.targets.back().resolved = pick != nullptr;
    if (!pick && !undecided) {
      // Every hop along these paths answers as the others do: whatever
      // the end-to-end counters saw (a burst of losses while this host was
      // descheduled, say), no link of the group shows it.
      continue;
    }
    if (pick) {
      // The share of its paths that show it end to end (a black hole seen
      // as a black hole from both ends and hops), times the hops' word.
      const double share = kind == FaultKind::BLACK_HOLE && pick->kind == FaultKind::BLACK_HOLE
                               ? double(pick->agg->dead) / double(paths.size())
                               : 1.0;
      Candidate c{pick->link, kind, peer, uint32_t(paths.size()), share * certainty, pick->why + "; " + hop_why};
      out.push_back(c);
      continue;
    }
    // Not told apart yet. After a while, if the hops could not be
    // measured (few answers: a fabric that polices ICMP hard), name them
    // all, each with its share of the confidence; with plenty of answers
    // and no hop standing out, the end-to-end view alone is not enough to
    // name any (a loaded host's losses look like a link's).
    size_t hop_samples = 0;
    for (const HopSample& h : ps.hops)
      if (h.sent_ns >= since && h.answered && in.count(h.path)) hop_samples++;
    if (hop_samples < 200 && now - since >= uint64_t(cfg_.tell_apart_ticks) * cfg_.tick_ns) {
      for (const Suspect* s : members)
        out.push_back({s->link, s->kind, peer, uint32_t(paths.size()), 1.0 / double(members.size()),
                       s->why + fmt("; not told apart from %zu other link(s) crossed by the same paths",
                                    members.size() - 1)});
    }
  }
  forget_groups(now, ps);
}

// A group's suspicion may flicker while its evidence is near the
// thresholds (a lossy link on a loaded host); its hop probes keep counting
// until it has been gone for a while.
void FaultLocator::forget_groups(uint64_t now, PeerState& ps) {
  const uint64_t grace = uint64_t(cfg_.clear_ticks) * 2 * cfg_.tick_ns;
  for (auto it = ps.groups.begin(); it != ps.groups.end();)
    it = now - it->second.last > grace ? ps.groups.erase(it) : std::next(it);
}

// ---- faults over time ----

void FaultLocator::track(uint64_t now, const std::vector<Candidate>& found, const std::set<Endpoint>& active_peers) {
  std::map<std::pair<LinkId, FaultKind>, Candidate> merged;
  for (const Candidate& c : found) {
    auto [it, fresh] = merged.emplace(std::make_pair(c.link, c.kind), c);
    if (!fresh) {
      it->second.paths += c.paths;
      it->second.confidence = std::max(it->second.confidence, c.confidence);
    }
  }
  for (auto& [key, c] : merged) {
    auto [it, fresh] = tracking_.emplace(key, Tracking{});
    Tracking& t = it->second;
    if (fresh) t.since_ns = now;
    t.c = c;
    t.seen++;
    t.missed = 0;
    if (!t.reported && t.seen >= cfg_.confirm_ticks) {
      t.reported = true;
      t.history_index = history_.size();
      Fault f;
      f.link_known = c.link_known;
      f.link = c.link;
      f.peer = c.peer;
      f.kind = c.kind;
      f.since_ns = t.since_ns;
      f.found_ns = now;
      history_.push_back(f);
      stats_.faults_found++;
    }
    if (t.reported) {
      Fault& f = history_[t.history_index];
      f.paths_affected = c.paths;
      f.confidence = c.confidence;
      f.evidence = c.evidence;
      if (t.seen == cfg_.confirm_ticks) log_.push_back("fault found: " + describe(f));
    }
  }
  for (auto it = tracking_.begin(); it != tracking_.end();) {
    Tracking& t = it->second;
    if (merged.count(it->first)) {
      ++it;
      continue;
    }
    // No verdict while the peer sends nothing: no news is not good news.
    if (!active_peers.count(t.c.peer)) {
      ++it;
      continue;
    }
    t.missed++;
    if (!t.reported) {
      it = t.missed >= 2 ? tracking_.erase(it) : std::next(it);
      if (t.missed < 2) t.seen = 0;
      continue;
    }
    if (t.missed >= cfg_.clear_ticks) {
      Fault& f = history_[t.history_index];
      f.cleared_ns = now;
      stats_.faults_cleared++;
      log_.push_back("fault cleared: " + describe(f));
      it = tracking_.erase(it);
      continue;
    }
    ++it;
  }
}

void FaultLocator::tick(uint64_t now_ns, const Engine& engine) {
  std::map<Endpoint, std::vector<PathHealth>> h;
  engine.for_each_peer_health([&](const Endpoint& peer, const std::vector<PathHealth>& paths) { h[peer] = paths; });
  tick(now_ns, h);
}

void FaultLocator::tick(uint64_t now, const std::map<Endpoint, std::vector<PathHealth>>& health) {
  for (const auto& [peer, h] : health) update_health(peer, h);
  expire_probes(now);
  std::vector<Candidate> found;
  std::set<Endpoint> active_peers;
  for (auto& [peer, ps] : peers_) {
    for (const PathState& p : ps.paths)
      if (p.active) {
        active_peers.insert(peer);
        break;
      }
    evaluate(now, peer, ps, found);
  }
  track(now, found, active_peers);
  send_probes(now);
}

// ---- reports ----

std::vector<Fault> FaultLocator::active() const {
  std::vector<Fault> out;
  for (const auto& [key, t] : tracking_)
    if (t.reported) out.push_back(history_[t.history_index]);
  return out;
}

std::vector<std::string> FaultLocator::take_log() {
  std::vector<std::string> out;
  out.swap(log_);
  return out;
}

std::vector<IpAddr> FaultLocator::route(const Endpoint& peer, uint16_t path) const {
  auto it = peers_.find(peer);
  if (it == peers_.end() || path >= it->second.paths.size()) return {};
  return it->second.paths[path].route;
}

std::string FaultLocator::describe(const Fault& f) {
  std::string where = f.link_known ? "link " + link_text(f.link)
                                   : "a path towards " + to_string(f.peer.ip) + " (no route known)";
  return fmt("%s, %s, %u paths affected, confidence %.2f (%s)", where.c_str(), to_string(f.kind), f.paths_affected,
             f.confidence, f.evidence.c_str());
}

namespace {
std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o += c;
  }
  return o;
}
}  // namespace

std::string FaultLocator::faults_json(double wall_now_s, uint64_t now_ns, bool history) const {
  auto wall = [&](uint64_t t) { return wall_now_s - (double(now_ns) - double(t)) / 1e9; };
  auto one = [&](const Fault& f) {
    std::string s = "{";
    if (f.link_known)
      s += "\"link\":{\"from\":\"" + to_string(f.link.from) + "\",\"to\":\"" + to_string(f.link.to) + "\"}";
    else
      s += "\"link\":null";
    s += fmt(",\"peer\":\"%s\",\"kind\":\"%s\",\"since\":%.3f,\"found\":%.3f", to_string(f.peer.ip).c_str(),
             to_string(f.kind), wall(f.since_ns), wall(f.found_ns));
    if (f.cleared_ns) s += fmt(",\"cleared\":%.3f", wall(f.cleared_ns));
    s += fmt(",\"paths_affected\":%u,\"confidence\":%.3f,\"evidence\":\"%s\"}", f.paths_affected, f.confidence,
             json_escape(f.evidence).c_str());
    return s;
  };
  std::string out;
  for (const Fault& f : history ? history_ : active()) out += (out.empty() ? "" : ",") + one(f);
  return out;
}

std::string FaultLocator::summary_json() const {
  size_t routes = 0, paths = 0;
  for (const auto& [peer, ps] : peers_)
    for (const PathState& p : ps.paths) paths += p.active, routes += !p.route.empty() && p.active;
  return fmt("\"active_paths\":%zu,\"routes_known\":%zu,\"traces\":%" PRIu64 ",\"probes_sent\":%" PRIu64
             ",\"probe_replies\":%" PRIu64 ",\"late_replies\":%" PRIu64 ",\"probe_send_failures\":%" PRIu64,
             paths, routes, stats_.traces, stats_.probes_sent, stats_.replies, stats_.late_replies,
             stats_.probe_send_failures);
}

std::string FaultLocator::json(double wall_now_s, uint64_t now_ns) const {
  return "{\"faults\":[" + faults_json(wall_now_s, now_ns, false) + "],\"history\":[" +
         faults_json(wall_now_s, now_ns, true) + "]," + summary_json() + "}";
}

}  // namespace vstellar::telemetry
