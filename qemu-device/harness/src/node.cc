#include <algorithm>
#include <chrono>
#include <cstdio>

#include "vstellar/harness/harness.h"

namespace vstellar::harness {

uint32_t link_of(uint16_t path, uint32_t links) {
  // A multiplicative hash, like a switch's ECMP hash of the source port.
  return uint32_t((uint64_t(path) * 2654435761u) >> 7) % (links ? links : 1);
}

UdpLinkConfig Node::link_config(const Options& o, uint16_t base_port) {
  UdpLinkConfig c;
  c.local = o.local_ip;
  c.base_port = base_port;
  c.num_paths = o.eng.num_paths;
  c.max_datagram = o.eng.mtu + 256;
  c.mode = o.link_mode;
  c.zerocopy = o.zerocopy;
  return c;
}

Node::Node(const Options& o, uint16_t base_port, uint16_t peer_port)
    : o_(o),
      peer_port_(peer_port),
      lossy_link_(o.loss_link >= 0 ? o.loss_link : int(link_of(0, o.loss_links))),
      link_(link_config(o, base_port)),
      eng_(o.eng, link_, clock_) {
  if (o.locate_faults) {
    tracer_ = std::make_unique<telemetry::PathTracer>(o.local_ip, base_port, o.eng.num_paths);
    if (!tracer_->ok())
      fprintf(stderr, "vstellar-harness: no routes, faults at path granularity only: %s\n",
              tracer_->error().c_str());
    locator_ = std::make_unique<telemetry::FaultLocator>(telemetry::LocatorConfig{}, o.local_ip, *tracer_);
  }
}

namespace {
double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

void Node::locate(uint64_t now) {
  // The answers carry the kernel's arrival time: read them every few
  // milliseconds, not every loop turn (a syscall each).
  if (now >= next_poll_ns_) {
    next_poll_ns_ = now + 5'000'000;
    tracer_->poll(now, [&](const telemetry::HopReply& r) { locator_->on_reply(r); });
  }
  if (now < next_tick_ns_) return;
  next_tick_ns_ = now + telemetry::LocatorConfig{}.tick_ns;
  locator_->tick(now, eng_);
  for (const std::string& line : locator_->take_log())
    fprintf(stderr, "vstellar-harness: [%.3f] %s\n", wall_now(), line.c_str());
}

std::string Node::telemetry_json() {
  if (!locator_) return "null";
  const telemetry::TracerStats& t = tracer_->stats();
  std::string j = locator_->json(wall_now(), clock_.now_ns());
  char b[256];
  snprintf(b, sizeof(b), ",\"tracer\":{\"ok\":%s,\"probes_sent\":%lu,\"probe_bytes\":%lu,\"replies\":%lu}}",
           tracer_->ok() ? "true" : "false", t.probes_sent, t.probe_bytes, t.replies);
  j.pop_back();
  return j + b;
}

void Node::run_once(uint64_t max_wait_ns) {
  // Take in what arrived first: after this process was descheduled for a
  // while, the ACKs waiting in the ring must be seen before the timers run,
  // or every packet in flight would look lost.
  link_.poll(0, *this);
  bool more = eng_.progress();
  if (locator_) locate(clock_.now_ns());
  uint64_t wait = 0;
  if (!more) {
    uint64_t now = clock_.now_ns(), dl = eng_.next_deadline();
    wait = dl == UINT64_MAX ? max_wait_ns : dl > now ? std::min(dl - now, max_wait_ns) : 0;
  }
  link_.poll(wait, *this);
}

void Node::on_datagram(const uint8_t* data, size_t len, const Endpoint& from, const IpAddr& to,
                       bool ce) {
  if (o_.loss_rate > 0) {
    uint16_t path = uint16_t(from.port - peer_port_);  // the source port is the path
    if (path < 256 && int(link_of(path, o_.loss_links)) == lossy_link_ &&
        std::uniform_real_distribution<double>(0, 1)(rng_) < o_.loss_rate) {
      emu_dropped++;
      return;
    }
  }
  eng_.receive(data, len, from, to, ce);
}

std::string stats_json(const EngineStats& s, bool path_detail) {
  char b[2048];
  snprintf(b, sizeof(b),
           "{\"tx_pkts\":%lu,\"rx_pkts\":%lu,\"tx_bytes\":%lu,\"rx_bytes\":%lu,"
           "\"data_pkts_sent\":%lu,\"retx_pkts\":%lu,\"timeouts\":%lu,\"acks_sent\":%lu,"
           "\"acks_rcvd\":%lu,\"naks_sent\":%lu,\"naks_rcvd\":%lu,\"rnr_naks_sent\":%lu,"
           "\"dup_pkts\":%lu,\"out_of_window\":%lu,\"bad_parse\":%lu,\"bad_qpn\":%lu,"
           "\"bad_peer\":%lu,\"bad_state\":%lu,\"bad_ack\":%lu,\"ce_marks\":%lu,"
           "\"early_errors\":%lu,\"bad_reread\":%lu,\"bad_mac\":%lu,\"wrong_mac_alg\":%lu,\"replayed\":%lu,\"paths_set_aside\":%lu,"
           "\"path_probes\":%lu,\"spurious_timeouts\":%lu,\"read_gap_losses\":%lu,\"path_gap_losses\":%lu,\"quiet_losses\":%lu,\"quiet_probes\":%lu,\"overdue_losses\":%lu,\"overdue_wrong\":%lu,\"held_notices_sent\":%lu,\"held_resends\":%lu,\"early_reads\":%lu,\"stalled_qps\":%lu",
           s.tx_pkts, s.rx_pkts, s.tx_bytes, s.rx_bytes, s.data_pkts_sent, s.retx_pkts,
           s.timeouts, s.acks_sent, s.acks_rcvd, s.naks_sent, s.naks_rcvd, s.rnr_naks_sent,
           s.dup_pkts, s.out_of_window, s.bad_parse, s.bad_qpn, s.bad_peer, s.bad_state,
           s.bad_ack, s.ce_marks, s.early_errors, s.bad_reread, s.bad_mac, s.wrong_mac_alg, s.replayed, s.paths_set_aside,
           s.path_probes, s.spurious_timeouts, s.read_gap_losses, s.path_gap_losses, s.quiet_losses, s.quiet_probes, s.overdue_losses, s.overdue_wrong, s.held_notices_sent, s.held_resends, s.early_reads, s.stalled_qps);
  std::string out = b;
  if (path_detail) {
    out += ",\"paths\":[";
    for (size_t i = 0; i < s.paths.size(); i++) {
      const PathCounters& p = s.paths[i];
      snprintf(b, sizeof(b), "%s[%lu,%lu,%lu,%lu,%lu]", i ? "," : "", p.tx_pkts, p.tx_bytes,
               p.retx_pkts, p.timeouts, p.rx_pkts);
      out += b;
    }
    out += "]";
  }
  return out + "}";
}

}  // namespace vstellar::harness
