#include "vstellar/ns3/flow_ecmp.h"

#include <ns3/ipv4-l3-protocol.h>
#include <ns3/node.h>
#include <ns3/output-stream-wrapper.h>
#include <ns3/packet.h>

#include <algorithm>

namespace vstellar::ns3sim {

using namespace ns3;

namespace {
// splitmix64's finalizer: every input bit moves every output bit, so
// source ports that differ in their low bits land on unrelated ports.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}
}  // namespace

TypeId FlowEcmpRouting::GetTypeId() {
  static TypeId tid = TypeId("vstellar::FlowEcmpRouting")
                          .SetParent<Ipv4RoutingProtocol>()
                          .SetGroupName("Internet")
                          .AddConstructor<FlowEcmpRouting>();
  return tid;
}

void FlowEcmpRouting::DoDispose() {
  ipv4_ = nullptr;
  port_route_.clear();
  Ipv4RoutingProtocol::DoDispose();
}

void FlowEcmpRouting::add_route(Ipv4Address dst, const std::vector<uint32_t>& ifaces) {
  auto it = std::find(groups_.begin(), groups_.end(), ifaces);
  uint32_t g = uint32_t(it - groups_.begin());
  if (it == groups_.end()) groups_.push_back(ifaces);
  dst_group_[dst.Get()] = g;
}

void FlowEcmpRouting::set_default(const std::vector<uint32_t>& ifaces) {
  auto it = std::find(groups_.begin(), groups_.end(), ifaces);
  default_group_ = int(it - groups_.begin());
  if (it == groups_.end()) groups_.push_back(ifaces);
}

void FlowEcmpRouting::set_peer(uint32_t iface, Ipv4Address peer) {
  if (peer_.size() <= iface) peer_.resize(iface + 1);
  peer_[iface] = peer;
}

uint32_t FlowEcmpRouting::pick(uint32_t src, uint32_t dst, uint8_t proto, uint16_t sport,
                               uint16_t dport, uint32_t n) const {
  if (n <= 1) return 0;
  uint64_t h = mix(seed_ ^ (uint64_t(src) << 32 | dst));
  h = mix(h ^ (uint64_t(proto) << 32 | uint64_t(sport) << 16 | dport));
  return uint32_t(h % n);
}

Ptr<Ipv4Route> FlowEcmpRouting::lookup(const Ipv4Header& h, const uint8_t* l4) {
  auto it = dst_group_.find(h.GetDestination().Get());
  int g = it != dst_group_.end() ? int(it->second) : default_group_;
  if (g < 0) return nullptr;
  const std::vector<uint32_t>& ports = groups_[g];
  uint16_t sport = 0, dport = 0;
  if (l4) {
    sport = uint16_t(l4[0] << 8 | l4[1]);
    dport = uint16_t(l4[2] << 8 | l4[3]);
  }
  uint32_t iface = ports[pick(h.GetSource().Get(), h.GetDestination().Get(), h.GetProtocol(), sport,
                              dport, uint32_t(ports.size()))];
  if (port_route_.size() <= iface) port_route_.resize(iface + 1);
  Ptr<Ipv4Route>& r = port_route_[iface];
  if (!r) {
    // One route object per port, reused: forwarding reads only its
    // output device and gateway.
    r = Create<Ipv4Route>();
    r->SetOutputDevice(ipv4_->GetNetDevice(iface));
    r->SetGateway(iface < peer_.size() ? peer_[iface] : Ipv4Address::GetZero());
    r->SetSource(ipv4_->GetAddress(iface, 0).GetLocal());
  }
  return r;
}

Ptr<Ipv4Route> FlowEcmpRouting::RouteOutput(Ptr<Packet> p, const Ipv4Header& header,
                                            Ptr<NetDevice> oif, Socket::SocketErrno& sockerr) {
  (void)oif;
  // The packet here starts with the UDP header (UdpL4Protocol added it).
  uint8_t l4[4];
  bool ports = p && header.GetProtocol() == 17 && p->GetSize() >= 4;
  if (ports) p->CopyData(l4, 4);
  Ptr<Ipv4Route> r = lookup(header, ports ? l4 : nullptr);
  sockerr = r ? Socket::ERROR_NOTERROR : Socket::ERROR_NOROUTETOHOST;
  return r;
}

bool FlowEcmpRouting::RouteInput(Ptr<const Packet> p, const Ipv4Header& header,
                                 Ptr<const NetDevice> idev, UnicastForwardCallback ucb,
                                 MulticastForwardCallback mcb, LocalDeliverCallback lcb,
                                 ErrorCallback ecb) {
  (void)mcb;
  const uint32_t iif = interface_of(idev);
  // Installed alone (no Ipv4ListRouting in front), so local delivery is ours.
  if (is_local(header.GetDestination(), iif)) {
    lcb(p, header, iif);
    return true;
  }
  // The IP header is already removed: the UDP ports come first.
  uint8_t l4[4];
  bool ports = header.GetProtocol() == 17 && p->GetSize() >= 4 && header.GetFragmentOffset() == 0;
  if (ports) p->CopyData(l4, 4);
  Ptr<Ipv4Route> r = lookup(header, ports ? l4 : nullptr);
  if (!r) {
    ecb(p, header, Socket::ERROR_NOROUTETOHOST);
    return true;
  }
  ucb(r, p, header);
  return true;
}

uint32_t FlowEcmpRouting::interface_of(const Ptr<const NetDevice>& dev) {
  const uint32_t d = dev->GetIfIndex();
  if (dev_iface_.size() <= d) dev_iface_.resize(d + 1, 0);
  if (!dev_iface_[d]) dev_iface_[d] = uint32_t(ipv4_->GetInterfaceForDevice(dev)) + 1;
  return dev_iface_[d] - 1;
}

// The cache only says which destinations cannot be local (the switches'
// forwarding, nearly every packet); for the others ns-3's own test decides.
bool FlowEcmpRouting::is_local(Ipv4Address dst, uint32_t iif) {
  if (!addresses_known_) {
    addresses_.clear();
    for (uint32_t i = 0; i < ipv4_->GetNInterfaces(); i++)
      for (uint32_t k = 0; k < ipv4_->GetNAddresses(i); k++) {
        const Ipv4InterfaceAddress a = ipv4_->GetAddress(i, k);
        addresses_.insert(a.GetLocal().Get());
        addresses_.insert(a.GetBroadcast().Get());
      }
    addresses_known_ = true;
  }
  if (!dst.IsBroadcast() && !dst.IsMulticast() && !addresses_.count(dst.Get())) return false;
  return ipv4_->IsDestinationAddress(dst, iif);
}

void FlowEcmpRouting::PrintRoutingTable(Ptr<OutputStreamWrapper> stream, Time::Unit unit) const {
  (void)unit;
  std::ostream& os = *stream->GetStream();
  os << "FlowEcmpRouting seed " << seed_ << ", " << dst_group_.size() << " destinations, "
     << groups_.size() << " groups\n";
  for (size_t g = 0; g < groups_.size(); g++) {
    os << "  group " << g << ":";
    for (uint32_t i : groups_[g]) os << " " << i;
    os << "\n";
  }
}

Ptr<Ipv4RoutingProtocol> FlowEcmpHelper::Create(Ptr<Node> node) const {
  (void)node;
  return CreateObject<FlowEcmpRouting>();
}

}  // namespace vstellar::ns3sim
