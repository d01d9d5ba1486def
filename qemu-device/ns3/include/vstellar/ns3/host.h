// One ns-3 host whose transport is a real vstellar Engine: this class is
// the engine's Link (datagrams go out through the node's ns-3 UDP layer,
// so the switches see a real IPv4/UDP 5-tuple whose source port is the
// path) and its Clock (ns-3 simulated time). The engine is driven as its
// owner thread drives it on a real host: receive() per datagram, then
// progress(), then sleep until next_deadline() — here "sleep" is an ns-3
// event scheduled at that deadline.
#pragma once
#include <ns3/ipv4-address.h>
#include <ns3/ipv4-end-point.h>
#include <ns3/ipv4-header.h>
#include <ns3/node.h>
#include <ns3/nstime.h>
#include <ns3/packet.h>
#include <ns3/ptr.h>
#include <ns3/simulator.h>
#include <ns3/udp-l4-protocol.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "vstellar/engine.h"

namespace vstellar::ns3sim {

// Where engines receive (the RoCEv2 port number, as the fabric tests use)
// and the first source port: path p leaves from kPathPortBase + p, so the
// switches' 5-tuple hash sees one flow per path.
constexpr uint16_t kEnginePort = 4791;
constexpr uint16_t kPathPortBase = 49152;

struct HostCounters {
  uint64_t tx_datagrams = 0, rx_datagrams = 0, rx_ce = 0;
};

class Ns3Host final : public Link, public Clock {
 public:
  // `addr` is the node's address on its NIC (the engine's IP). The node
  // must already have the ns-3 internet stack and that address.
  Ns3Host(ns3::Ptr<ns3::Node> node, ns3::Ipv4Address addr, const EngineConfig& cfg);
  ~Ns3Host() override;

  // Clock: ns-3 time, shifted by 1 ms as SimNet's clock is, so that no
  // engine timestamp is 0 (the engine reads 0 as "never").
  uint64_t now_ns() override { return uint64_t(ns3::Simulator::Now().GetNanoSeconds()) + kEpochNs; }

  // Link: one datagram per send, handed to ns-3's UDP layer at once (the
  // header and payload are copied into the ns-3 packet, so nothing needs
  // to live until flush()).
  void send(uint16_t path, const IpAddr& src, const Endpoint& dst, const uint8_t* hdr,
            size_t hdr_len, const HostSpan* payload, size_t nspans) override;
  void flush() override {}

  Engine& engine() { return *engine_; }
  uint32_t ip() const { return addr_.Get(); }
  ns3::Ptr<ns3::Node> node() const { return node_; }
  const HostCounters& counters() const { return counters_; }

  // Run the engine soon (in this simulated instant, after the current
  // event): after posting work, or when datagrams arrived.
  void kick();
  // Called after every engine pass (the workload polls its CQs here).
  std::function<void()> after_pass;

 private:
  static constexpr uint64_t kEpochNs = 1'000'000;
  void on_datagram(ns3::Ptr<ns3::Packet> p, ns3::Ipv4Header hdr, uint16_t sport,
                   ns3::Ptr<ns3::Ipv4Interface> iface);
  void pass();

  ns3::Ptr<ns3::Node> node_;
  ns3::Ipv4Address addr_;
  ns3::Ptr<ns3::UdpL4Protocol> udp_;
  ns3::Ipv4EndPoint* endpoint_ = nullptr;
  std::unique_ptr<Engine> engine_;
  bool pass_pending_ = false;
  ns3::EventId timer_;
  uint64_t timer_at_ = UINT64_MAX;  // engine clock time timer_ fires at
  HostCounters counters_;
  std::vector<uint8_t> scratch_;  // one datagram being sent or received
};

}  // namespace vstellar::ns3sim
