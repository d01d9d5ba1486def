// Per-flow ECMP for the ns-3 fabric: a switch sends every packet of one
// UDP 5-tuple over the same one of its equal-cost ports, chosen by a
// seeded hash, as a data-centre switch does.
//
// Why not ns-3's own routing: Ipv4GlobalRouting (3.37) offers only
// RandomEcmpRouting, a random port per *packet*. That would spray even a
// single-path connection and reorder it, and would make the engine's path
// choice meaningless (a path is a source port precisely because the
// fabric's hash pins it to one route). Its lookup is private, so a
// subclass cannot change the choice; hence this small routing protocol,
// filled by the topology builder, which knows the equal-cost ports of every
// switch for every destination.
#pragma once
#include <ns3/ipv4-route.h>
#include <ns3/ipv4-routing-helper.h>
#include <ns3/ipv4-routing-protocol.h>
#include <ns3/ipv4.h>

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace vstellar::ns3sim {

class FlowEcmpRouting : public ns3::Ipv4RoutingProtocol {
 public:
  static ns3::TypeId GetTypeId();

  void set_hash_seed(uint64_t seed) { seed_ = seed; }
  // Packets to host `dst` (its /32) leave through one of `ifaces` (this
  // node's ns-3 interface indices; peers: the address at the other end).
  void add_route(ns3::Ipv4Address dst, const std::vector<uint32_t>& ifaces);
  // Anything without a route of its own leaves through these (a host's NIC).
  void set_default(const std::vector<uint32_t>& ifaces);
  // The address at the far end of interface `iface` (the next hop).
  void set_peer(uint32_t iface, ns3::Ipv4Address peer);

  // Which of n equal-cost ports a 5-tuple takes on this switch.
  uint32_t pick(uint32_t src, uint32_t dst, uint8_t proto, uint16_t sport, uint16_t dport,
                uint32_t n) const;

  // ns3::Ipv4RoutingProtocol
  ns3::Ptr<ns3::Ipv4Route> RouteOutput(ns3::Ptr<ns3::Packet> p, const ns3::Ipv4Header& header,
                                       ns3::Ptr<ns3::NetDevice> oif,
                                       ns3::Socket::SocketErrno& sockerr) override;
  bool RouteInput(ns3::Ptr<const ns3::Packet> p, const ns3::Ipv4Header& header,
                  ns3::Ptr<const ns3::NetDevice> idev, UnicastForwardCallback ucb,
                  MulticastForwardCallback mcb, LocalDeliverCallback lcb,
                  ErrorCallback ecb) override;
  void NotifyInterfaceUp(uint32_t) override { forget_addresses(); }
  void NotifyInterfaceDown(uint32_t) override { forget_addresses(); }
  void NotifyAddAddress(uint32_t, ns3::Ipv4InterfaceAddress) override { forget_addresses(); }
  void NotifyRemoveAddress(uint32_t, ns3::Ipv4InterfaceAddress) override { forget_addresses(); }
  void SetIpv4(ns3::Ptr<ns3::Ipv4> ipv4) override {
    ipv4_ = ipv4;
    forget_addresses();
  }
  void PrintRoutingTable(ns3::Ptr<ns3::OutputStreamWrapper> stream,
                         ns3::Time::Unit unit) const override;

 protected:
  void DoDispose() override;

 private:
  // The route for a packet to dst whose transport header starts `l4`
  // (nullptr: no ports known, hash the addresses only).
  ns3::Ptr<ns3::Ipv4Route> lookup(const ns3::Ipv4Header& h, const uint8_t* l4);
  // RouteInput's two questions, answered from a cache. ns-3 answers both by
  // walking every interface (and copying each address) per packet: on a
  // switch of 64 ports that was a tenth of a 1,024-host run's time.
  uint32_t interface_of(const ns3::Ptr<const ns3::NetDevice>& dev);
  bool is_local(ns3::Ipv4Address dst, uint32_t iif);
  void forget_addresses() {
    addresses_known_ = false;
    dev_iface_.clear();
  }

  ns3::Ptr<ns3::Ipv4> ipv4_;
  uint64_t seed_ = 0;
  // Equal-cost groups, shared by every destination behind the same ports
  // (a spine has one group per ToR, not one per host).
  std::vector<std::vector<uint32_t>> groups_;
  std::unordered_map<uint32_t, uint32_t> dst_group_;  // dst address -> group
  int default_group_ = -1;
  std::vector<ns3::Ptr<ns3::Ipv4Route>> port_route_;  // per interface: its next hop
  std::vector<ns3::Ipv4Address> peer_;
  // The cache: per device (NetDevice::GetIfIndex) its interface + 1 (0:
  // not looked up yet); and every address a packet may be delivered here
  // for, this node's own and its interfaces' broadcasts.
  std::vector<uint32_t> dev_iface_;
  std::unordered_set<uint32_t> addresses_;
  bool addresses_known_ = false;
};

// For InternetStackHelper::SetRoutingHelper: every node gets an empty
// FlowEcmpRouting, which the topology builder then fills.
class FlowEcmpHelper : public ns3::Ipv4RoutingHelper {
 public:
  FlowEcmpHelper* Copy() const override { return new FlowEcmpHelper(*this); }
  ns3::Ptr<ns3::Ipv4RoutingProtocol> Create(ns3::Ptr<ns3::Node> node) const override;
};

}  // namespace vstellar::ns3sim
