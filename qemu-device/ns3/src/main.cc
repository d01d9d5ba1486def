// vstellar-ns3: run the vstellar engine as the transport of ns-3 hosts on a
// fat-tree read from a topology file, and print what happened as JSON.
#include <ns3/simulator.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "vstellar/ns3/topology.h"
#include "vstellar/ns3/workload.h"

using namespace vstellar;
using namespace vstellar::ns3sim;

namespace {

const char* kUsage = R"(usage: vstellar-ns3 --topology FILE [options]

Each host of the fabric runs a vstellar Engine; connections are RC QP pairs
moving RDMA WRITEs. Prints one JSON object (or writes it to --out).

  --topology FILE       topology config (qemu-device/ns3/topologies/*.conf)
  --set KEY=VALUE       override one of its keys (e.g. --set ecn=off); repeatable
  --pattern P           permutation (default): every host sends to one host
                        under another ToR; pairs:S-D,S-D,...: those host pairs;
                        incast:N: hosts 1..N send to host 0; all-to-all: every
                        host to every other (n(n-1) connections); ring: a ring
                        collective over every host with random rank placement,
                        step k of a rank waiting for step k-1 of the rank before
                        it (--messages steps of --msg bytes: a ring allreduce of
                        S bytes is 2(n-1) steps of S/n; use --depth 1)
  --paths N             paths per connection (1..256, default 128)
  --path-algo A         obs (default), rr, dwrr, bestrtt, single, reps
  --path-burst N        OBS, RR: packets a path gets in a row before the next
                        pick (1..64, default 1: every packet sprayed)
  --msg SIZE            bytes per WRITE (default 64KiB)
  --depth N             WRITEs outstanding per connection (default 8)
  --window N            PSN window per QP (a power of two, 64..65536; default
                        4096): smaller for patterns with many QPs per host
                        (all-to-all), whose windows are memory
  --messages N          WRITEs per connection (default 64; 0: until --stop)
  --stop TIME           give up at this simulated time (default 2s)
  --goodput-bin TIME    also write "goodput_series": bytes of WRITEs completed
                        in each interval of TIME, every connection together
  --seed N              seed of the engines and the pattern (default 1)
  --cc-target-delay TIME
                        a connection's window shrinks when its round trips
                        exceed this (default 1ms, vstellard's, made for a
                        software host's round trips; a 100 Gb/s fabric's
                        are a few us)
  --black-hole PORT     make the link of switch port PORT (e.g. tor0.up1) a
                        black hole both ways; a switch name (spine0): all its links
  --black-hole-at TIME  a black hole from TIME on (default 0)
  --loss PORT:RATE      the link of PORT (or every link of a switch) loses
                        packets with probability RATE both ways, from the start
  --ports all|used      ports in the JSON (default used: those that sent)
  --out FILE            write the JSON there
)";

bool parse_pairs(const std::string& s, std::vector<std::pair<uint32_t, uint32_t>>& out) {
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    unsigned a, b;
    if (std::sscanf(item.c_str(), "%u-%u", &a, &b) != 2) return false;
    out.emplace_back(a, b);
  }
  return !out.empty();
}

void port_json(std::ostream& o, const Fabric::Port& p) {
  PortStats s = p.stats();
  o << "{\"name\":\"" << p.name << "\",\"uplink\":" << (p.uplink ? "true" : "false")
    << ",\"pkts\":" << s.pkts << ",\"bytes\":" << s.bytes << ",\"drops\":" << s.drops
    << ",\"marks\":" << s.marks << ",\"backlog_mean\":" << s.mean_backlog
    << ",\"backlog_p99\":" << s.p99_backlog << ",\"backlog_max\":" << s.max_backlog << "}";
}

}  // namespace

int main(int argc, char** argv) {
  std::string loss_port;
  double loss_rate = 0;
  std::string topo_path, overrides, pattern = "permutation", out_path, bh_port, ports_mode = "used";
  uint64_t bh_at = 0;
  WorkloadOptions opt;
  opt.engine.num_paths = 128;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    auto bad = [&](const std::string& v) {
      std::cerr << "bad value for " << a << ": " << v << "\n";
      std::exit(2);
    };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--topology") topo_path = val();
    else if (a == "--set") overrides += val() + "\n";
    else if (a == "--pattern") pattern = val();
    else if (a == "--paths") {
      std::string v = val();
      int n = std::atoi(v.c_str());
      if (n < 1 || n > 256) bad(v);
      opt.engine.num_paths = uint16_t(n);
    } else if (a == "--path-burst") {
      std::string v = val();
      int n = std::atoi(v.c_str());
      if (n < 1 || n > 64) bad(v);
      opt.engine.path_burst = uint16_t(n);
    } else if (a == "--path-algo") {
      std::string v = val();
      if (!parse_path_algo(v, opt.engine.path_algo)) bad(v);
    } else if (a == "--msg") {
      std::string v = val();
      uint64_t b;
      if (!parse_bytes(v, b) || b == 0 || b > (1u << 30)) bad(v);
      opt.msg_bytes = uint32_t(b);
    } else if (a == "--depth") opt.depth = uint32_t(std::max(1, std::atoi(val().c_str())));
    else if (a == "--window") opt.engine.window_pkts = uint32_t(std::max(0, std::atoi(val().c_str())));
    else if (a == "--messages") opt.messages = std::strtoull(val().c_str(), nullptr, 10);
    else if (a == "--stop") {
      std::string v = val();
      if (!parse_time_ns(v, opt.stop_ns)) bad(v);
    } else if (a == "--goodput-bin") {
      std::string v = val();
      if (!parse_time_ns(v, opt.series_bin_ns) || opt.series_bin_ns == 0) bad(v);
    } else if (a == "--cc-target-delay") {
      std::string v = val();
      if (!parse_time_ns(v, opt.engine.cc.target_delay_ns) || opt.engine.cc.target_delay_ns == 0) bad(v);
    } else if (a == "--seed") opt.seed = std::strtoull(val().c_str(), nullptr, 10);
    else if (a == "--black-hole") bh_port = val();
    else if (a == "--black-hole-at") {
      std::string v = val();
      if (!parse_time_ns(v, bh_at)) bad(v);
    } else if (a == "--loss") {
      std::string v = val();
      size_t colon = v.rfind(':');
      if (colon == std::string::npos) bad(v);
      loss_port = v.substr(0, colon);
      loss_rate = std::atof(v.c_str() + colon + 1);
      if (loss_rate < 0 || loss_rate > 1) bad(v);
    } else if (a == "--ports") ports_mode = val();
    else if (a == "--out") out_path = val();
    else {
      std::cerr << "unknown option " << a << "\n" << kUsage;
      return 2;
    }
  }
  if (topo_path.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  TopologyConfig tc;
  std::string err;
  if (!load_topology(topo_path, tc, err) || !parse_topology(overrides, tc, err)) {
    std::cerr << err << "\n";
    return 2;
  }
  if (!opt.engine.validate()) {
    std::cerr << "bad engine configuration\n";
    return 2;
  }

  auto wall0 = std::chrono::steady_clock::now();
  std::ostringstream o;
  bool ok;
  {
    Fabric fab(tc);
    std::vector<std::pair<uint32_t, uint32_t>> conns;
    if (pattern == "permutation") {
      conns = permutation(fab.hosts(), tc.hosts_per_tor, opt.seed);
    } else if (pattern.rfind("pairs:", 0) == 0) {
      if (!parse_pairs(pattern.substr(6), conns)) {
        std::cerr << "bad --pattern " << pattern << "\n";
        return 2;
      }
    } else if (pattern == "ring") {
      conns = ring(fab.hosts(), opt.seed);
    } else if (pattern == "all-to-all") {
      for (uint32_t s = 0; s < fab.hosts(); s++)
        for (uint32_t d = 0; d < fab.hosts(); d++)
          if (s != d) conns.emplace_back(s, d);
    } else if (pattern.rfind("incast:", 0) == 0) {
      uint32_t n = uint32_t(std::atoi(pattern.c_str() + 7));
      if (n < 1 || n >= fab.hosts()) {
        std::cerr << "incast:N needs 1 <= N < hosts\n";
        return 2;
      }
      for (uint32_t h = 1; h <= n; h++) conns.emplace_back(h, 0);
    } else {
      std::cerr << "unknown --pattern " << pattern << "\n";
      return 2;
    }
    for (auto [s, d] : conns)
      if (s >= fab.hosts() || d >= fab.hosts() || s == d) {
        std::cerr << "bad connection " << s << "-" << d << "\n";
        return 2;
      }
    if (!loss_port.empty()) fab.lossy(loss_port, loss_rate);
    if (!bh_port.empty())
      ns3::Simulator::Schedule(ns3::NanoSeconds(int64_t(bh_at)), [&fab, bh_port] { fab.black_hole(bh_port); });

    Workload w(fab, opt, conns);
    if (pattern == "ring") w.chain(ring_after(fab.hosts()));
    w.run();
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();

    uint64_t completed = 0, failed = 0, verified = 0, bytes = 0, last = 0;
    for (const ConnectionResult& r : w.results()) {
      completed += r.completed;
      failed += r.failed;
      verified += r.verified;
      bytes += r.bytes;
      last = std::max(last, r.finish_ns);
    }
    ok = w.all_done() && failed == 0 && verified == w.results().size();
    EngineStats es = w.engine_totals();
    o << "{\"topology\":{\"name\":\"" << tc.name << "\",\"hosts\":" << tc.hosts()
      << ",\"tiers\":" << tc.tiers << ",\"tors\":" << tc.tors << ",\"spines\":" << tc.spine_count()
      << ",\"pods\":" << (tc.tiers == 3 ? tc.pods : 1) << ",\"aggs_per_pod\":" << (tc.tiers == 3 ? tc.agg_count() : 0)
      << ",\"host_rate_bps\":" << tc.host_rate_bps << ",\"fabric_rate_bps\":" << tc.fabric_rate_bps
      << ",\"buffer\":" << tc.buffer_bytes << ",\"ecn\":\""
      << (tc.ecn == EcnMode::OFF ? "off" : tc.ecn == EcnMode::RED ? "red" : "threshold") << "\"}";
    o << ",\"workload\":{\"pattern\":\"" << pattern << "\",\"connections\":" << conns.size()
      << ",\"paths\":" << opt.engine.num_paths << ",\"window\":" << opt.engine.window_pkts
      << ",\"cc_target_delay_ns\":" << opt.engine.cc.target_delay_ns << ",\"path_algo\":\"" << to_string(opt.engine.path_algo)
      << "\",\"msg_bytes\":" << opt.msg_bytes << ",\"depth\":" << opt.depth
      << ",\"messages\":" << opt.messages << ",\"seed\":" << opt.seed << ",\"black_hole\":\"" << bh_port
      << "\",\"loss\":\"" << loss_port << "\",\"loss_rate\":" << loss_rate << "}";
    o << ",\"ok\":" << (ok ? "true" : "false") << ",\"completed\":" << completed << ",\"failed\":" << failed
      << ",\"verified\":" << verified << ",\"sim_ns\":" << w.sim_ns() << ",\"last_completion_ns\":" << last
      << ",\"goodput_gbps\":" << (last ? double(bytes) * 8 / double(last) : 0.0)
      << ",\"wall_s\":" << wall;
    o << ",\"engine\":{\"data_pkts\":" << es.data_pkts_sent << ",\"retx_pkts\":" << es.retx_pkts
      << ",\"timeouts\":" << es.timeouts << ",\"spurious_timeouts\":" << es.spurious_timeouts
      << ",\"path_gap_losses\":" << es.path_gap_losses << ",\"quiet_losses\":" << es.quiet_losses
      << ",\"quiet_probes\":" << es.quiet_probes << ",\"overdue_losses\":" << es.overdue_losses << ",\"overdue_wrong\":" << es.overdue_wrong
      << ",\"paths_set_aside\":" << es.paths_set_aside << ",\"path_probes\":" << es.path_probes
      << ",\"ce_marks\":" << es.ce_marks << ",\"dup_pkts\":" << es.dup_pkts << "}";
    if (opt.series_bin_ns) {
      o << ",\"goodput_series\":{\"bin_ns\":" << opt.series_bin_ns << ",\"bytes\":[";
      for (size_t i = 0; i < w.goodput_series().size(); i++) o << (i ? "," : "") << w.goodput_series()[i];
      o << "]}";
    }
    o << ",\"connections\":[";
    for (size_t i = 0; i < w.results().size(); i++) {
      const ConnectionResult& r = w.results()[i];
      o << (i ? "," : "") << "{\"src\":" << r.src << ",\"dst\":" << r.dst << ",\"completed\":" << r.completed
        << ",\"failed\":" << r.failed << ",\"verified\":" << (r.verified ? "true" : "false")
        << ",\"finish_ns\":" << r.finish_ns << "}";
    }
    o << "],\"ports\":[";
    bool first = true;
    for (const Fabric::Port& p : fab.ports()) {
      if (ports_mode == "used" && p.stats().pkts == 0 && p.stats().drops == 0) continue;
      o << (first ? "" : ",");
      first = false;
      port_json(o, p);
    }
    o << "]}\n";
  }
  ns3::Simulator::Destroy();
  if (out_path.empty()) {
    std::cout << o.str();
  } else {
    std::ofstream f(out_path);
    f << o.str();
  }
  return ok ? 0 : 1;
}
