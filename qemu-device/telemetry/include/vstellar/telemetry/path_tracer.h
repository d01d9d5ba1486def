// Where each path goes: TTL-limited probes on a path's own 5-tuple, as
// traceroute sends them, and the routers' ICMP time-exceeded answers.
//
// A path is a UDP source port (base_port + path), and the fabric's ECMP
// hashes the 5-tuple, so a probe must carry exactly the data packets'
// addresses and ports to follow their route. The engine's path sockets
// cannot send it: an ICMP error for an unconnected UDP socket with
// IP_RECVERR also sets the socket's pending error, which the next data
// send or receive on it would return. So the tracer writes whole IPv4
// datagrams on an IPPROTO_RAW socket (which never receives) and reads the
// answers on a raw ICMP socket filtered to time-exceeded and unreachable.
// Both need CAP_NET_RAW; without it the tracer says so (ok() false) and
// the locator works at path granularity. IPv4 only: an IPv6 peer is not
// traced (send_probe returns false).
//
// A probe that outlives its TTL is answered by the router it died at; one
// that does not reaches the peer's engine port, where the engine drops it
// as a trace probe (kTraceMagic, EngineStats::trace_probes).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "vstellar/telemetry/fault_locator.h"

namespace vstellar::telemetry {

struct TracerStats {
  uint64_t probes_sent = 0, probe_bytes = 0, send_errors = 0;
  uint64_t replies = 0;       // answers to our probes
  uint64_t icmp_ignored = 0;  // ICMP that answered somebody else
};

class PathTracer final : public ProbeSender {
 public:
  // `local`: the IPv4 address the engine sends from; `base_port`,
  // `num_paths`: its path ports.
  PathTracer(const IpAddr& local, uint16_t base_port, uint16_t num_paths);
  ~PathTracer() override;
  PathTracer(const PathTracer&) = delete;
  PathTracer& operator=(const PathTracer&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

  bool send_probe(const Endpoint& peer, uint16_t path, uint8_t ttl, uint32_t id) override;
  // Hand every answer to one of our probes that has arrived to `f`
  // (never blocks), each with its arrival time on the clock whose time is
  // now_ns (the kernel stamps it: answers may be read in batches).
  // Returns how many.
  size_t poll(uint64_t now_ns, const std::function<void(const HopReply&)>& f);
  // Readable when an ICMP message is waiting (for an owner's epoll).
  int fd() const { return icmp_fd_; }
  const TracerStats& stats() const { return stats_; }

 private:
  IpAddr local_;
  uint16_t base_port_, num_paths_;
  uint32_t nonce_;  // tells our probes from another tracer's on the host
  int raw_fd_ = -1, icmp_fd_ = -1;
  std::string error_;
  TracerStats stats_;
};

}  // namespace vstellar::telemetry
