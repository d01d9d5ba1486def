#include "vstellar/ns3/topology.h"

#include <ns3/boolean.h>
#include <ns3/double.h>
#include <ns3/error-model.h>
#include <ns3/internet-stack-helper.h>
#include <ns3/ipv4.h>
#include <ns3/point-to-point-helper.h>
#include <ns3/point-to-point-net-device.h>
#include <ns3/queue-size.h>
#include <ns3/simulator.h>
#include <ns3/string.h>
#include <ns3/traffic-control-helper.h>
#include <ns3/uinteger.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

namespace vstellar::ns3sim {

using namespace ns3;

// ---------------------------------------------------------------- parsing

namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r");
  size_t b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// A number followed by a unit from `units` (case-insensitive); "" is the
// unit of a bare number.
bool parse_scaled(const std::string& s, const std::map<std::string, double>& units, uint64_t& out) {
  std::string t = trim(s);
  size_t i = 0;
  while (i < t.size() && (isdigit(uint8_t(t[i])) || t[i] == '.')) i++;
  if (i == 0) return false;
  double v;
  try {
    v = std::stod(t.substr(0, i));
  } catch (...) {
    return false;
  }
  std::string u = trim(t.substr(i));
  std::transform(u.begin(), u.end(), u.begin(), [](char c) { return char(tolower(c)); });
  auto it = units.find(u);
  if (it == units.end()) return false;
  out = uint64_t(std::llround(v * it->second));
  return true;
}

bool parse_uint(const std::string& s, uint32_t& out) {
  uint64_t v;
  if (!parse_scaled(s, {{"", 1}}, v) || v > UINT32_MAX) return false;
  out = uint32_t(v);
  return true;
}

// A positive real number, all of the text.
bool parse_positive(const std::string& s, double& out) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size() || !(v > 0)) return false;
    out = v;
    return true;
  } catch (...) {
    return false;
  }
}

bool parse_bool(const std::string& s, bool& out) {
  if (s == "yes" || s == "true" || s == "1" || s == "on") return out = true, true;
  if (s == "no" || s == "false" || s == "0" || s == "off") return out = false, true;
  return false;
}

}  // namespace

bool parse_rate(const std::string& s, uint64_t& bps) {
  return parse_scaled(s, {{"", 1}, {"bps", 1}, {"k", 1e3}, {"kbps", 1e3}, {"m", 1e6}, {"mbps", 1e6},
                          {"g", 1e9}, {"gbps", 1e9}},
                      bps);
}

bool parse_bytes(const std::string& s, uint64_t& bytes) {
  return parse_scaled(s, {{"", 1}, {"b", 1}, {"kb", 1e3}, {"kib", 1024}, {"mb", 1e6},
                          {"mib", 1 << 20}, {"gb", 1e9}, {"gib", double(1 << 30)}},
                      bytes);
}

bool parse_time_ns(const std::string& s, uint64_t& ns) {
  return parse_scaled(s, {{"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}}, ns);
}

uint32_t TopologyConfig::tor_uplinks() const {
  double up = double(hosts_per_tor) * double(host_rate_bps) / (oversubscription * double(fabric_rate_bps));
  return std::max<uint32_t>(1, uint32_t(std::llround(up)));
}

uint32_t TopologyConfig::agg_count() const { return aggs_per_pod ? aggs_per_pod : tor_uplinks(); }

uint32_t TopologyConfig::spine_count() const {
  if (spines) return spines;
  return tiers == 3 ? agg_count() * tors_per_pod() : tor_uplinks();
}

bool parse_topology(const std::string& text, TopologyConfig& c, std::string& err) {
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    n++;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    line = trim(line);
    if (line.empty()) continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) {
      err = "line " + std::to_string(n) + ": expected key = value";
      return false;
    }
    std::string k = trim(line.substr(0, eq)), v = trim(line.substr(eq + 1));
    bool ok = true;
    uint32_t u = 0;
    if (k == "name") c.name = v;
    else if (k == "tiers") ok = parse_uint(v, u) && (c.tiers = int(u), true);
    else if (k == "tors") ok = parse_uint(v, c.tors);
    else if (k == "hosts_per_tor") ok = parse_uint(v, c.hosts_per_tor);
    else if (k == "spines") ok = parse_uint(v, c.spines);
    else if (k == "pods") ok = parse_uint(v, c.pods) && c.pods > 0;
    else if (k == "aggs_per_pod") ok = parse_uint(v, c.aggs_per_pod);
    else if (k == "oversubscription") ok = parse_positive(v, c.oversubscription);
    else if (k == "host_rate") ok = parse_rate(v, c.host_rate_bps);
    else if (k == "fabric_rate") ok = parse_rate(v, c.fabric_rate_bps);
    else if (k == "link_delay") ok = parse_time_ns(v, c.link_delay_ns);
    else if (k == "buffer") ok = parse_bytes(v, c.buffer_bytes);
    else if (k == "shared_buffer") ok = parse_bytes(v, c.shared_buffer_bytes);
    else if (k == "dt_alpha") ok = parse_positive(v, c.dt_alpha);
    else if (k == "ecn") {
      if (v == "off") c.ecn = EcnMode::OFF;
      else if (v == "threshold") c.ecn = EcnMode::THRESHOLD;
      else if (v == "red") c.ecn = EcnMode::RED;
      else ok = false;
    } else if (k == "ecn_threshold") ok = parse_bytes(v, c.ecn_threshold_bytes);
    else if (k == "red_min") ok = parse_bytes(v, c.red_min_bytes);
    else if (k == "red_max") ok = parse_bytes(v, c.red_max_bytes);
    else if (k == "red_max_p") ok = parse_positive(v, c.red_max_p) && c.red_max_p <= 1;
    else if (k == "hash_seed") {
      uint64_t s;
      ok = parse_scaled(v, {{"", 1}}, s) && (c.hash_seed = s, true);
    } else if (k == "hash_seed_per_switch") ok = parse_bool(v, c.hash_seed_per_switch);
    else if (k == "host_queue") ok = parse_bytes(v, c.host_queue_bytes);
    else {
      err = "line " + std::to_string(n) + ": unknown key '" + k + "'";
      return false;
    }
    if (!ok) {
      err = "line " + std::to_string(n) + ": bad value for " + k + ": '" + v + "'";
      return false;
    }
  }
  if (c.tiers != 2 && c.tiers != 3) {
    err = "tiers = " + std::to_string(c.tiers) + ": 2 (ToRs, spines) or 3 (ToRs, aggregation, spines)";
    return false;
  }
  if (c.tiers == 3 && (c.tors % c.pods != 0 || c.spine_count() % c.agg_count() != 0)) {
    err = "three tiers: tors must be a multiple of pods, and spines of aggs_per_pod";
    return false;
  }
  if (c.tors < 1 || c.hosts_per_tor < 1 || c.hosts_per_tor > 250 || c.tors > 65000) {
    err = "tors must be 1..65000 and hosts_per_tor 1..250";
    return false;
  }
  if (c.buffer_bytes < 10'000) {
    err = "buffer must hold at least two jumbo packets (10 kB)";
    return false;
  }
  if (c.shared_buffer_bytes && c.shared_buffer_bytes < 10'000) {
    err = "shared_buffer must hold at least two jumbo packets (10 kB), or be 0 (none)";
    return false;
  }
  return true;
}

bool load_topology(const std::string& path, TopologyConfig& out, std::string& err) {
  std::ifstream f(path);
  if (!f) {
    err = "cannot read " + path;
    return false;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  if (!parse_topology(ss.str(), out, err)) {
    err = path + ": " + err;
    return false;
  }
  return true;
}

// ---------------------------------------------------------------- port monitor

// Follows one queue disc's traces: packets and bytes sent, drops, marks,
// and the backlog over time (its time-weighted mean, maximum and the
// backlog each arriving packet found, for the 99th percentile), as
// SimNet's queues report theirs.
struct Fabric::Port::Monitor {
  Ptr<QueueDisc> q;
  PortStats st;
  uint64_t backlog = 0, last_t = 0, start_t = 0;
  double area = 0;
  std::vector<uint64_t> seen;  // arrivals by backlog found, 1 KiB bins

  void advance() {
    uint64_t now = uint64_t(Simulator::Now().GetNanoSeconds());
    area += double(backlog) * double(now - last_t);
    last_t = now;
  }
  void on_enqueue(Ptr<const QueueDiscItem> item) {
    advance();
    // What the packet found: the backlog before it.
    uint64_t found = q->GetNBytes() - item->GetSize();
    size_t bin = found / 1024;
    if (seen.size() <= bin) seen.resize(bin + 1);
    seen[bin]++;
    backlog = q->GetNBytes();
    st.max_backlog = std::max(st.max_backlog, backlog);
  }
  void on_dequeue(Ptr<const QueueDiscItem> item) {
    advance();
    st.pkts++;
    st.bytes += item->GetSize();
    backlog = q->GetNBytes();
  }
  void on_drop(Ptr<const QueueDiscItem>) { st.drops++; }
  void on_mark(Ptr<const QueueDiscItem>, const char*) { st.marks++; }
  void reset() {
    advance();
    st = PortStats{};
    st.max_backlog = backlog;
    seen.clear();
    area = 0;
    start_t = last_t;
  }
  PortStats stats() {
    advance();
    PortStats s = st;
    uint64_t span = last_t - start_t;
    s.mean_backlog = span ? area / double(span) : 0;
    uint64_t total = 0;
    for (uint64_t c : seen) total += c;
    uint64_t acc = 0;
    for (size_t b = 0; b < seen.size(); b++) {
      acc += seen[b];
      if (total && acc * 100 >= total * 99) {
        s.p99_backlog = uint64_t(b + 1) * 1024;
        break;
      }
    }
    return s;
  }
};

PortStats Fabric::Port::stats() const { return mon->stats(); }

// ---------------------------------------------------------------- building

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint32_t Fabric::host_ip(uint32_t h) const {
  // 10.<ToR high>.<ToR low>.<host in ToR + 1>
  uint32_t t = tor_of(h), i = h % cfg_.hosts_per_tor;
  return 0x0a000000u | (t << 8) | (i + 1);
}

Fabric::Fabric(const TopologyConfig& cfg) : cfg_(cfg) {
  const uint32_t nspines = cfg_.spine_count();
  const bool three = cfg_.tiers == 3;
  const uint32_t naggs = three ? cfg_.pods * cfg_.agg_count() : 0;
  hosts_.Create(cfg_.hosts());
  tors_.Create(cfg_.tors);
  spines_.Create(nspines);
  if (naggs) aggs_.Create(naggs);

  InternetStackHelper stack;
  stack.SetIpv6StackInstall(false);
  FlowEcmpHelper ecmp;
  stack.SetRoutingHelper(ecmp);
  stack.Install(hosts_);
  stack.Install(tors_);
  stack.Install(spines_);
  if (naggs) stack.Install(aggs_);

  // Jumbo frames: the engine's 4 KiB packets plus headers must not be
  // fragmented (a fragment carries no ports, so ECMP would hash them all alike).
  PointToPointHelper hostlink;
  hostlink.SetDeviceAttribute("DataRate", DataRateValue(DataRate(cfg_.host_rate_bps)));
  hostlink.SetDeviceAttribute("Mtu", UintegerValue(9000));
  hostlink.SetChannelAttribute("Delay", TimeValue(NanoSeconds(int64_t(cfg_.link_delay_ns))));
  hostlink.SetQueue("ns3::DropTailQueue<Packet>", "MaxSize",
                    QueueSizeValue(QueueSize(QueueSizeUnit::BYTES, uint32_t(cfg_.host_queue_bytes))));
  PointToPointHelper fabriclink = hostlink;
  fabriclink.SetDeviceAttribute("DataRate", DataRateValue(DataRate(cfg_.fabric_rate_bps)));

  // A switch port's queue is its queue disc; the device queue under it
  // holds one packet (the one being serialised), so the backlog, drops and
  // marks are all the queue disc's.
  // With a shared buffer, that queue disc is the child of the port's
  // SharedBufferQueueDisc, which admits by the switch's free space.
  TrafficControlHelper tc;
  uint32_t buf = uint32_t(cfg_.buffer_bytes);
  const bool shared = cfg_.shared_buffer_bytes > 0;
  uint16_t parent = 0, cls = 0;
  if (shared) {
    parent = tc.SetRootQueueDisc("vstellar::ns3sim::SharedBufferQueueDisc");
    cls = tc.AddQueueDiscClasses(parent, 1, "ns3::QueueDiscClass")[0];
  }
  // The port's own queue: the root, or the shared buffer's child.
  auto port_queue = [&](const std::string& type, auto&&... args) {
    if (shared) tc.AddChildQueueDisc(parent, cls, type, args...);
    else tc.SetRootQueueDisc(type, args...);
  };
  if (cfg_.ecn == EcnMode::OFF) {
    port_queue("ns3::FifoQueueDisc", "MaxSize", QueueSizeValue(QueueSize(QueueSizeUnit::BYTES, buf)));
  } else {
    // RED in byte mode. The threshold marker is RED with both thresholds
    // at K, the instantaneous queue (QW 1) and no gentle region: every
    // packet that finds more than K queued is marked (DCTCP's switch
    // setting), ECT packets only; what finds the buffer full is dropped.
    bool thr = cfg_.ecn == EcnMode::THRESHOLD;
    double lo = double(thr ? cfg_.ecn_threshold_bytes : cfg_.red_min_bytes);
    double hi = double(thr ? cfg_.ecn_threshold_bytes : cfg_.red_max_bytes);
    port_queue("ns3::RedQueueDisc", "MaxSize",
                        QueueSizeValue(QueueSize(QueueSizeUnit::BYTES, buf)), "MinTh", DoubleValue(lo),
                        "MaxTh", DoubleValue(hi), "UseEcn", BooleanValue(true), "UseHardDrop",
                        BooleanValue(false), "QW", DoubleValue(thr ? 1.0 : 0.002), "Gentle",
                        BooleanValue(!thr), "LInterm", DoubleValue(thr ? 1.0 : 1.0 / cfg_.red_max_p),
                        "MeanPktSize", UintegerValue(4200));
  }

  // Switch ports' interface addresses: 172.16.0.0/12, one per interface.
  // Only next hops; no packet is ever addressed to a switch.
  uint32_t g_switch_addr = 0xac100001;
  auto iface = [](Ptr<Node> n, Ptr<NetDevice> d, uint32_t addr) {
    Ptr<Ipv4> ip = n->GetObject<Ipv4>();
    uint32_t i = uint32_t(ip->AddInterface(d));
    ip->AddAddress(i, Ipv4InterfaceAddress(Ipv4Address(addr), Ipv4Mask("255.255.255.255")));
    ip->SetUp(i);
    return i;
  };
  auto routing = [](Ptr<Node> n) {
    return DynamicCast<FlowEcmpRouting>(n->GetObject<Ipv4>()->GetRoutingProtocol());
  };
  auto add_port = [&](const std::string& name, uint32_t sw, bool up, Ptr<NetDevice> dev,
                      Ptr<NetDevice> peer) {
    DynamicCast<PointToPointNetDevice>(dev)->GetQueue()->SetMaxSize(QueueSize("1p"));
    Port p;
    p.name = name;
    p.sw = sw;
    p.uplink = up;
    p.dev = dev;
    p.qdisc = tc.Install(dev).Get(0);
    if (shared) {
      if (pools_.size() <= sw) pools_.resize(sw + 1);
      if (!pools_[sw]) {
        pools_[sw] = Create<SharedBufferPool>();
        pools_[sw]->capacity = cfg_.shared_buffer_bytes;
        pools_[sw]->alpha = cfg_.dt_alpha;
      }
      DynamicCast<SharedBufferQueueDisc>(p.qdisc)->SetPool(pools_[sw]);
    }
    p.mon = std::make_unique<Port::Monitor>();
    Port::Monitor* m = p.mon.get();
    m->q = p.qdisc;
    p.qdisc->TraceConnectWithoutContext("Enqueue", MakeCallback(&Port::Monitor::on_enqueue, m));
    p.qdisc->TraceConnectWithoutContext("Dequeue", MakeCallback(&Port::Monitor::on_dequeue, m));
    p.qdisc->TraceConnectWithoutContext("Drop", MakeCallback(&Port::Monitor::on_drop, m));
    p.qdisc->TraceConnectWithoutContext("Mark", MakeCallback(&Port::Monitor::on_mark, m));
    ports_.push_back(std::move(p));
    peer_of_port_.push_back(peer);
  };

  // Hosts to ToRs.
  std::vector<std::vector<uint32_t>> tor_up(cfg_.tors);
  for (uint32_t h = 0; h < cfg_.hosts(); h++) {
    uint32_t t = tor_of(h);
    NetDeviceContainer d = hostlink.Install(hosts_.Get(h), tors_.Get(t));
    uint32_t hi = iface(hosts_.Get(h), d.Get(0), host_ip(h));
    uint32_t tor_addr = g_switch_addr++;
    uint32_t ti = iface(tors_.Get(t), d.Get(1), tor_addr);
    routing(hosts_.Get(h))->set_default({hi});
    routing(hosts_.Get(h))->set_peer(hi, Ipv4Address(tor_addr));
    routing(tors_.Get(t))->add_route(Ipv4Address(host_ip(h)), {ti});
    routing(tors_.Get(t))->set_peer(ti, Ipv4Address(host_ip(h)));
    add_port("tor" + std::to_string(t) + ".down" + std::to_string(h % cfg_.hosts_per_tor), t, false,
             d.Get(1), d.Get(0));
  }
  // A fabric link between two switches: the lower one's uplink port and
  // the upper one's downlink port, and each end's next hop.
  auto switch_link = [&](Ptr<Node> lo, uint32_t lo_sw, const std::string& lo_name, Ptr<Node> hi, uint32_t hi_sw,
                         const std::string& hi_name, uint32_t* lo_if, uint32_t* hi_if) {
    NetDeviceContainer d = fabriclink.Install(lo, hi);
    uint32_t la = g_switch_addr++, ha = g_switch_addr++;
    *lo_if = iface(lo, d.Get(0), la);
    *hi_if = iface(hi, d.Get(1), ha);
    routing(lo)->set_peer(*lo_if, Ipv4Address(ha));
    routing(hi)->set_peer(*hi_if, Ipv4Address(la));
    add_port(lo_name, lo_sw, true, d.Get(0), d.Get(1));
    add_port(hi_name, hi_sw, false, d.Get(1), d.Get(0));
  };
  const std::string kTor = "tor", kSpine = "spine", kAgg = "agg";
  auto nm = [](const std::string& sw, uint32_t n, const char* dir, uint32_t k) {
    return sw + std::to_string(n) + dir + std::to_string(k);
  };
  if (!three) {
    // ToRs to spines: one link from every ToR to every spine. A ToR sends
    // what is not its own hosts' up, over every uplink (ECMP); a spine
    // sends to the destination's ToR.
    std::vector<std::vector<uint32_t>> spine_down(nspines, std::vector<uint32_t>(cfg_.tors));
    for (uint32_t t = 0; t < cfg_.tors; t++) {
      for (uint32_t s = 0; s < nspines; s++) {
        uint32_t ti, si;
        switch_link(tors_.Get(t), t, nm(kTor, t, ".up", s), spines_.Get(s), cfg_.tors + s, nm(kSpine, s, ".down", t),
                    &ti, &si);
        tor_up[t].push_back(ti);
        spine_down[s][t] = si;
      }
    }
    for (uint32_t s = 0; s < nspines; s++)
      for (uint32_t h = 0; h < cfg_.hosts(); h++)
        routing(spines_.Get(s))->add_route(Ipv4Address(host_ip(h)), {spine_down[s][tor_of(h)]});
  } else {
    // Pods: ToR t of pod p has an uplink to each of the pod's aggregation
    // switches; aggregation switch j of every pod has one to each spine
    // of group j. Up: ECMP over every uplink (ToR, aggregation switch);
    // down: the one port towards the destination's pod (spine) or ToR
    // (aggregation switch).
    const uint32_t tpp = cfg_.tors_per_pod(), apod = cfg_.agg_count(), group = nspines / apod;
    std::vector<std::vector<uint32_t>> agg_up(naggs), agg_down(naggs, std::vector<uint32_t>(tpp));
    std::vector<std::vector<uint32_t>> spine_down(nspines, std::vector<uint32_t>(cfg_.pods));
    const uint32_t agg_sw0 = cfg_.tors + nspines;
    for (uint32_t t = 0; t < cfg_.tors; t++) {
      const uint32_t pod = t / tpp;
      for (uint32_t j = 0; j < apod; j++) {
        const uint32_t a = pod * apod + j;
        uint32_t ti, ai;
        switch_link(tors_.Get(t), t, nm(kTor, t, ".up", j), aggs_.Get(a), agg_sw0 + a, nm(kAgg, a, ".down", t % tpp),
                    &ti, &ai);
        tor_up[t].push_back(ti);
        agg_down[a][t % tpp] = ai;
      }
    }
    for (uint32_t a = 0; a < naggs; a++) {
      const uint32_t pod = a / apod, j = a % apod;
      for (uint32_t m = 0; m < group; m++) {
        const uint32_t s = j * group + m;
        uint32_t ai, si;
        switch_link(aggs_.Get(a), agg_sw0 + a, nm(kAgg, a, ".up", m), spines_.Get(s), cfg_.tors + s,
                    nm(kSpine, s, ".down", pod), &ai, &si);
        agg_up[a].push_back(ai);
        spine_down[s][pod] = si;
      }
    }
    for (uint32_t a = 0; a < naggs; a++) {
      const uint32_t pod = a / apod;
      routing(aggs_.Get(a))->set_default(agg_up[a]);
      for (uint32_t t = pod * tpp; t < (pod + 1) * tpp; t++)
        for (uint32_t i = 0; i < cfg_.hosts_per_tor; i++)
          routing(aggs_.Get(a))->add_route(Ipv4Address(host_ip(t * cfg_.hosts_per_tor + i)), {agg_down[a][t % tpp]});
    }
    for (uint32_t s = 0; s < nspines; s++)
      for (uint32_t h = 0; h < cfg_.hosts(); h++)
        routing(spines_.Get(s))->add_route(Ipv4Address(host_ip(h)), {spine_down[s][tor_of(h) / tpp]});
  }
  for (uint32_t t = 0; t < cfg_.tors; t++) routing(tors_.Get(t))->set_default(tor_up[t]);
  for (uint32_t sw = 0; sw < cfg_.tors + nspines + naggs; sw++) {
    Ptr<Node> n = sw < cfg_.tors ? tors_.Get(sw)
                  : sw < cfg_.tors + nspines ? spines_.Get(sw - cfg_.tors)
                                             : aggs_.Get(sw - cfg_.tors - nspines);
    routing(n)->set_hash_seed(cfg_.hash_seed_per_switch ? mix(cfg_.hash_seed * 1000003 + sw) : cfg_.hash_seed);
  }
}

Fabric::~Fabric() = default;

std::vector<const Fabric::Port*> Fabric::uplinks(uint32_t tor) const {
  std::vector<const Port*> out;
  for (const Port& p : ports_)
    if (p.uplink && p.sw == tor) out.push_back(&p);
  return out;
}

void Fabric::reset_stats() {
  for (Port& p : ports_) p.mon->reset();
}

void Fabric::black_hole(const std::string& name) { lossy(name, 1.0); }

void Fabric::lossy(const std::string& name, double rate) {
  // A port name is one link; a switch name ("spine0", "tor3") is every
  // link of that switch (all its ports, whose peers are the other ends).
  // Each end's device drops what it receives with this probability, so
  // the link loses packets both ways.
  bool any = false;
  for (size_t i = 0; i < ports_.size(); i++) {
    if (ports_[i].name != name && ports_[i].name.rfind(name + ".", 0) != 0) continue;
    any = true;
    for (Ptr<NetDevice> d : {ports_[i].dev, peer_of_port_[i]}) {
      Ptr<RateErrorModel> em = CreateObject<RateErrorModel>();
      em->SetUnit(RateErrorModel::ERROR_UNIT_PACKET);
      em->SetRate(rate);
      DynamicCast<PointToPointNetDevice>(d)->SetReceiveErrorModel(em);
    }
  }
  NS_ABORT_MSG_IF(!any, "no port or switch named " << name);
}

}  // namespace vstellar::ns3sim
