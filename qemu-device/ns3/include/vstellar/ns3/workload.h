// RC WRITE workloads between the engines of an ns-3 fabric: each host runs
// one vstellar Engine (Ns3Host); a connection is an RC QP pair set up as
// the verbs state machine wants it (RESET -> INIT -> RTR -> RTS, QPNs and
// PSNs exchanged in-process, as the harness's control channel does over
// TCP), which then moves `messages` WRITEs of `msg_bytes` at `depth`
// outstanding. At the end every connection's target region is compared
// with the source bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vstellar/engine.h"
#include "vstellar/ns3/host.h"
#include "vstellar/ns3/topology.h"

namespace vstellar::ns3sim {

struct WorkloadOptions {
  EngineConfig engine;          // num_paths, path_algo, ... (seeds are set per host)
  uint32_t msg_bytes = 64 * 1024;
  uint32_t depth = 8;           // WRITEs outstanding per connection
  uint64_t messages = 64;       // per connection (0: until stop_ns)
  uint64_t start_ns = 0;        // the connections start at this simulated time
  uint64_t stop_ns = 2'000'000'000;  // give up at this simulated time
  uint64_t seed = 1;
  // Bytes of WRITEs completed per interval of this many simulated ns, over
  // every connection (Workload::goodput_series); 0: not kept.
  uint64_t series_bin_ns = 0;
};

struct ConnectionResult {
  uint32_t src = 0, dst = 0;  // host numbers
  uint64_t completed = 0, failed = 0, bytes = 0;
  uint64_t first_error = 0;   // WcStatus of the first failed completion (0: none)
  uint64_t finish_ns = 0;     // simulated time of the last completion
  bool verified = false;      // the target region holds the source bytes
};

class Workload {
 public:
  // Engines on every host of the fabric; connections (src, dst) by host
  // number. A host may be in many connections, both ways.
  Workload(Fabric& fabric, const WorkloadOptions& opt,
           const std::vector<std::pair<uint32_t, uint32_t>>& conns);
  ~Workload();

  // Steps of a collective: connection i may post its k-th WRITE only
  // once connection after[i] has completed k of its own (its k-th step's
  // data has arrived where connection i starts: an RC WRITE completes when
  // the peer acknowledged it). -1: no such dependence. Call before run().
  void chain(const std::vector<int32_t>& after);
  // Run the simulation until every connection is done or stop_ns.
  void run();
  bool all_done() const { return done_ == conns_.size(); }
  const std::vector<ConnectionResult>& results() const { return results_; }
  Ns3Host& host(uint32_t h) { return *hosts_[h]; }
  EngineStats engine_totals() const;  // summed over hosts (paths left empty)
  uint64_t sim_ns() const { return end_ns_; }
  // WorkloadOptions::series_bin_ns: bytes completed in each interval from 0.
  const std::vector<uint64_t>& goodput_series() const { return series_; }

 private:
  struct HostState;
  struct Conn;
  void start(Conn& c);
  void post(Conn& c);
  void poll(uint32_t h);
  void finish(Conn& c);

  Fabric& fab_;
  WorkloadOptions opt_;
  std::vector<std::unique_ptr<Ns3Host>> hosts_;
  std::vector<std::unique_ptr<HostState>> hs_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::vector<ConnectionResult> results_;
  size_t done_ = 0;
  uint64_t end_ns_ = 0;
  std::vector<uint64_t> series_;
};

// Traffic patterns over n hosts (host numbers; a ToR's hosts are consecutive).
// permutation: every host sends to one other host, a random derangement
// whose pairs cross ToRs where possible.
std::vector<std::pair<uint32_t, uint32_t>> permutation(uint32_t hosts, uint32_t hosts_per_tor,
                                                       uint64_t seed);
// A ring collective's traffic with ranks placed on hosts at random (the
// job scheduler's placement): rank r on host place[r] sends to rank r+1.
// Connection r is rank r's; with Workload::chain(ring_after(n)) step k of
// rank r waits for step k-1 of rank r-1, as a ring allreduce's
// reduce-scatter and all-gather steps do (2(n-1) steps of S/n bytes).
std::vector<std::pair<uint32_t, uint32_t>> ring(uint32_t hosts, uint64_t seed);
std::vector<int32_t> ring_after(uint32_t hosts);

}  // namespace vstellar::ns3sim
