// Host harness: runs a vStellar engine over real UDP (io_uring) with ordinary
// process memory standing in for guest memory, connects RC QPs to a peer
// harness process over a small TCP control channel, and drives verbs traffic
// (bandwidth, latency, raw-UDP ceiling). Results are JSON on stdout.
// See `vstellar-harness --help` and docs/engine.md.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "vstellar/engine.h"
#include "vstellar/telemetry/fault_locator.h"
#include "vstellar/telemetry/path_tracer.h"
#include "vstellar/udp_link.h"

namespace vstellar::harness {

struct Options {
  std::string role = "pair";  // server | client | pair
  std::string mode = "bw";    // bw | lat | raw
  std::string op = "write";   // write | send | read
  IpAddr local_ip = IpAddr(0x7f000001);  // IPv4 or IPv6
  IpAddr peer_ip = IpAddr(0x7f000001);
  uint16_t base_port = 0;  // 0: 47000 for the server, 47300 for the client
  uint16_t peer_port = 0;  // 0: the other role's default
  uint16_t ctrl_port = 46999;
  // Runs of 16 packets per path, for the GSO link.
  EngineConfig eng = [] {
    EngineConfig c;
    c.path_burst = 16;
    return c;
  }();
  LinkMode link_mode = LinkMode::GSO;
  bool zerocopy = false;
  uint64_t size = 65536;
  uint32_t qps = 1;
  uint32_t depth = 16;
  double duration = 2.0;
  uint32_t interval_ms = 100;
  uint32_t stall_ms = 1000;  // no completion this long with WRs outstanding: a stall (exit 4)
  double warmup = 0.2;  // seconds excluded from the totals
  double loss_rate = 0;
  uint32_t loss_links = 60;
  int loss_link = -1;  // -1: the link path 0 hashes to
  bool path_detail = true;
  bool locate_faults = false;
  double connect_timeout = 10.0;
};

// Parse argv; on error or --help prints to stderr/stdout and returns false
// with exit_code set.
bool parse_args(int argc, char** argv, Options& o, int& exit_code);
const char* usage();

// The fabric-like mapping of a path (source port offset) onto one of `links`
// uplinks, used by the loss emulation.
uint32_t link_of(uint16_t path, uint32_t links);

// One engine on a UDP link, with optional loss emulation on receive.
class Node final : public RxSink {
 public:
  Node(const Options& o, uint16_t base_port, uint16_t peer_port);
  bool ok() const { return link_.ok(); }
  const std::string& error() const { return link_.error(); }
  Engine& eng() { return eng_; }
  UdpLink& link() { return link_; }
  SteadyClock& clock() { return clock_; }
  // Progress the engine, then wait for packets until the next timer (at most
  // max_wait_ns), never spinning when there is nothing to do.
  void run_once(uint64_t max_wait_ns);
  void on_datagram(const uint8_t* data, size_t len, const Endpoint& from, const IpAddr& to,
                   bool ce) override;
  uint64_t emu_dropped = 0;
  // With --locate-faults: the fault locator's JSON; "null" without.
  std::string telemetry_json();

 private:
  static UdpLinkConfig link_config(const Options& o, uint16_t base_port);
  const Options& o_;
  uint16_t peer_port_;
  int lossy_link_;
  std::mt19937_64 rng_{12345};
  SteadyClock clock_;
  UdpLink link_;
  Engine eng_;
  // --locate-faults
  void locate(uint64_t now);
  std::unique_ptr<telemetry::PathTracer> tracer_;
  std::unique_ptr<telemetry::FaultLocator> locator_;
  uint64_t next_tick_ns_ = 0, next_poll_ns_ = 0;
};

// Run one role; returns the process exit code, prints JSON to stdout.
int run_server(const Options& o);
int run_client(const Options& o);
int run_pair(const Options& o);

std::string stats_json(const EngineStats& s, bool path_detail);

}  // namespace vstellar::harness
