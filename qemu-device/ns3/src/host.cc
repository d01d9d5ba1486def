#include "vstellar/ns3/host.h"

#include <ns3/ipv4-interface.h>
#include <ns3/socket.h>

#include <algorithm>
#include <cstring>

namespace vstellar::ns3sim {

using namespace ns3;

Ns3Host::Ns3Host(Ptr<Node> node, Ipv4Address addr, const EngineConfig& cfg)
    : node_(node), addr_(addr) {
  // The UDP layer itself, not a socket per path: the engine's UdpLink has
  // a socket per source port (up to 256 per host), which at 1,024 hosts
  // would be a quarter of a million ns-3 socket objects. UdpL4Protocol::Send
  // takes the source port per datagram and builds the same UDP header, and
  // an endpoint on the engine port hands us the IP header with its ECN bits
  // (a socket would need IP_RECVTOS and a tag for that).
  udp_ = node->GetObject<UdpL4Protocol>();
  NS_ABORT_MSG_IF(!udp_, "vstellar host needs the ns-3 internet stack on its node");
  endpoint_ = udp_->Allocate(nullptr, addr_, kEnginePort);
  NS_ABORT_MSG_IF(!endpoint_, "engine port already taken on " << addr_);
  endpoint_->SetRxCallback(MakeCallback(&Ns3Host::on_datagram, this));
  engine_ = std::make_unique<Engine>(cfg, *this, *this);
}

Ns3Host::~Ns3Host() {
  // Hosts go before Simulator::Destroy, which frees the UDP layer's endpoints.
  timer_.Cancel();
  if (endpoint_) udp_->DeAllocate(endpoint_);
}

void Ns3Host::send(uint16_t path, const IpAddr& src, const Endpoint& dst, const uint8_t* hdr,
                   size_t hdr_len, const HostSpan* payload, size_t nspans) {
  // One copy into the ns-3 packet: the bytes must be real, since the
  // receiving engine parses and places them (the test checks the data).
  size_t len = hdr_len;
  for (size_t i = 0; i < nspans; i++) len += payload[i].len;
  scratch_.resize(len);
  uint8_t* w = scratch_.data();
  if (hdr_len) std::memcpy(w, hdr, hdr_len);
  w += hdr_len;
  for (size_t i = 0; i < nspans; i++) {
    std::memcpy(w, payload[i].ptr, payload[i].len);
    w += payload[i].len;
  }
  Ptr<Packet> p = Create<Packet>(scratch_.data(), uint32_t(len));
  // ECT(0), as UdpLink sets IP_TOS: the switches' queue discs may then mark
  // CE instead of dropping (Ipv4QueueDiscItem::Mark needs an ECT packet).
  SocketIpTosTag tos;
  tos.SetTos(0x02);
  p->AddPacketTag(tos);
  Ipv4Address from = src.unspecified() ? addr_ : Ipv4Address(src.v4());
  udp_->Send(p, from, Ipv4Address(dst.ip.v4()), uint16_t(kPathPortBase + path), dst.port);
  counters_.tx_datagrams++;
}

void Ns3Host::on_datagram(Ptr<Packet> p, Ipv4Header hdr, uint16_t sport, Ptr<Ipv4Interface> iface) {
  (void)sport;
  (void)iface;
  scratch_.resize(p->GetSize());
  p->CopyData(scratch_.data(), uint32_t(scratch_.size()));
  bool ce = hdr.GetEcn() == Ipv4Header::ECN_CE;
  counters_.rx_datagrams++;
  counters_.rx_ce += ce;
  engine_->receive(scratch_.data(), scratch_.size(), Endpoint{hdr.GetSource().Get(), sport},
                   IpAddr(hdr.GetDestination().Get()), ce);
  // Datagrams arriving in the same instant are taken in one pass, as the
  // UdpLink's receive batch is.
  kick();
}

void Ns3Host::kick() {
  if (pass_pending_) return;
  pass_pending_ = true;
  Simulator::ScheduleNow(&Ns3Host::pass, this);
}

void Ns3Host::pass() {
  pass_pending_ = false;
  bool more = engine_->progress();
  if (after_pass) after_pass();
  if (more) {
    // Work left that needs no input (a QP's tx_budget ran out): go on in
    // this instant, after whatever else is due now. The engine takes no
    // simulated time; its sends queue at the host's NIC.
    kick();
    return;
  }
  uint64_t d = engine_->next_deadline();
  if (d == UINT64_MAX || d == timer_at_) return;
  timer_.Cancel();
  timer_at_ = d;
  uint64_t now = now_ns();
  timer_ = Simulator::Schedule(NanoSeconds(int64_t(d > now ? d - now : 0)), [this] {
    timer_at_ = UINT64_MAX;
    pass();
  });
}

}  // namespace vstellar::ns3sim
