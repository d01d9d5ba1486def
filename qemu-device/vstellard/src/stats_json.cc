// The stats file's JSON; see include/vstellard/stats_json.h. One function
// per section, in the order the file has them.
#include "vstellard/stats_json.h"

#include <algorithm>
#include <cstdio>

#include "vstellard/daemon_options.h"

namespace vstellard {

namespace {

using ull = unsigned long long;

template <typename... A>
void Appendf(std::string* out, const char* fmt, A... args) {
  char b[1024];
  std::snprintf(b, sizeof(b), fmt, args...);
  *out += b;
}

// "pin", "translation", "threads", "forwarded" and the ATC.
void AppendDaemon(const DaemonStats& s, std::string* out) {
  *out += "\"pin\":\"";
  *out += ToString(s.pin);
  *out += "\",\"translation\":\"";
  *out += ToString(s.translation);
  Appendf(out,
          "\",\"threads\":%zu,\"forwarded\":%llu,\"device_moves\":%llu,"
          "\"atc\":{\"entries\":%zu,\"lookups\":%llu,\"hits\":%llu,\"misses\":%llu,\"evictions\":%llu}",
          s.threads, ull(s.forwarded), ull(s.device_moves), s.atc_entries, ull(s.atc.lookups), ull(s.atc.hits), ull(s.atc.misses),
          ull(s.atc.evictions));
}

void AppendDevice(const DeviceStats& d, std::string* out) {
  const PvdmaStats& p = d.pvdma;
  Appendf(out,
          "{\"id\":%u,\"guest_bytes\":%llu,\"blocks_pinned\":%llu,\"bytes_pinned\":%llu,"
          "\"misses\":%llu,\"hits\":%llu,\"faults\":%llu,\"lock_errors\":%llu,\"attach_ns\":%llu,"
          "\"commands\":%llu,\"commands_failed\":%llu,\"fatal\":%s,\"qps\":%u,\"mrs\":%u,"
          "\"wqes\":%llu,\"bad_wqes\":%llu,\"cqes\":%llu,\"memory\":%llu,\"memory_peak\":%llu,"
          "\"memory_refused\":%llu,\"cq_notify_backlog\":%u,\"missed_kicks\":%llu,\"events\":%llu,"
          "\"events_dropped\":%llu,\"events_merged\":%llu,\"closed\":%s}",
          d.id, ull(p.guest_bytes), ull(p.blocks_pinned), ull(p.bytes_pinned), ull(p.misses), ull(p.hits),
          ull(p.faults), ull(p.lock_errors), ull(p.attach_ns), ull(d.commands), ull(d.commands_failed),
          d.fatal ? "true" : "false", d.qps, d.mrs, ull(d.wqes), ull(d.bad_wqes), ull(d.cqes), ull(d.memory),
          ull(d.memory_peak), ull(d.memory_refused), d.cq_notify_backlog, ull(d.missed_kicks), ull(d.events),
          ull(d.events_dropped), ull(d.events_merged), d.closed ? "true" : "false");
}

void AppendDevices(const DaemonStats& s, std::string* out) {
  *out += ",\"devices\":[";
  for (size_t i = 0; i < s.devices.size(); i++) {
    if (i) *out += ",";
    AppendDevice(s.devices[i], out);
  }
  *out += "]";
}

void AppendMemory(const DaemonStats& s, std::string* out) {
  const DaemonStats::Memory& m = s.memory;
  Appendf(out, ",\"memory\":{\"limit\":%llu,\"device_limit\":%llu,\"used\":%llu,\"peak\":%llu,\"refused\":%llu}",
          ull(m.limit), ull(m.device_limit), ull(m.used), ull(m.peak), ull(m.refused));
}

// The engines (summed over the workers): transport counters and, per path,
// the packets sent, so a run shows how its traffic spread.
void AppendEngine(const DaemonStats& s, std::string* out) {
  if (!s.have_engine) return;
  const vstellar::EngineStats& e = s.engine;
  Appendf(out,
          ",\"engine\":{\"tx_pkts\":%llu,\"rx_pkts\":%llu,\"tx_bytes\":%llu,\"rx_bytes\":%llu,"
          "\"retx_pkts\":%llu,\"timeouts\":%llu,\"acks_sent\":%llu,\"ce_marks\":%llu,"
          "\"ud_sent\":%llu,\"ud_rcvd\":%llu,\"ud_drops\":%llu,\"stalled_qps\":%llu,\"spurious_timeouts\":%llu,"
          "\"paths_set_aside\":%llu,\"read_gap_losses\":%llu,\"path_gap_losses\":%llu,\"quiet_losses\":%llu,\"quiet_probes\":%llu,\"overdue_losses\":%llu,\"overdue_wrong\":%llu,\"held_notices_sent\":%llu,\"held_resends\":%llu,"
          "\"early_reads\":%llu,\"trace_probes\":%llu,\"roce_tx\":%llu,\"roce_rx\":%llu,\"roce_bad\":%llu,"
          "\"roce_seq_naks_sent\":%llu,\"roce_seq_naks_rcvd\":%llu,\"roce_goback_pkts\":%llu,"
          "\"bad_parse\":%llu,\"bad_qpn\":%llu,\"bad_peer\":%llu,\"bad_state\":%llu,\"bad_ack\":%llu,"
          "\"dup_pkts\":%llu,\"naks_sent\":%llu,\"naks_rcvd\":%llu,\"rnr_naks_sent\":%llu,"
          "\"page_fault_naks\":%llu,\"page_fault_waits\":%llu,\"page_fault_drops\":%llu,"
          "\"paused_sent\":%llu,\"resumed_sent\":%llu,\"peer_notices_rcvd\":%llu,\"late_passes\":%llu,"
          "\"late_max_us\":%llu,\"path_tx_pkts\":[",
          ull(e.tx_pkts), ull(e.rx_pkts), ull(e.tx_bytes), ull(e.rx_bytes), ull(e.retx_pkts), ull(e.timeouts),
          ull(e.acks_sent), ull(e.ce_marks), ull(e.ud_sent), ull(e.ud_rcvd), ull(e.ud_drops), ull(e.stalled_qps),
          ull(e.spurious_timeouts), ull(e.paths_set_aside), ull(e.read_gap_losses), ull(e.path_gap_losses), ull(e.quiet_losses), ull(e.quiet_probes),
          ull(e.overdue_losses), ull(e.overdue_wrong),
          ull(e.held_notices_sent),
          ull(e.held_resends), ull(e.early_reads), ull(e.trace_probes), ull(e.roce_tx), ull(e.roce_rx),
          ull(e.roce_bad), ull(e.roce_seq_naks_sent), ull(e.roce_seq_naks_rcvd), ull(e.roce_goback_pkts),
          ull(e.bad_parse), ull(e.bad_qpn), ull(e.bad_peer), ull(e.bad_state), ull(e.bad_ack), ull(e.dup_pkts),
          ull(e.naks_sent), ull(e.naks_rcvd), ull(e.rnr_naks_sent), ull(e.page_fault_naks),
          ull(e.page_fault_waits), ull(e.page_fault_drops), ull(e.paused_sent), ull(e.resumed_sent),
          ull(e.peer_notices_rcvd), ull(e.late_passes), ull(e.late_max_us));
  for (size_t i = 0; i < e.paths.size(); i++) {
    *out += i ? "," : "";
    *out += std::to_string(e.paths[i].tx_pkts);
  }
  *out += "]}";
}

// The per-QP state dump (vstellar-stat --qps): lines of key=value.
void AppendQps(const DaemonStats& s, std::string* out) {
  *out += ",\"qps\":[";
  for (size_t i = 0; i < s.qps.size(); i++) *out += (i ? ",\"" : "\"") + s.qps[i] + "\"";
  *out += "]";
}

}  // namespace

void AddAtcStats(AtcStats* sum, const AtcStats& s) {
  sum->lookups += s.lookups;
  sum->hits += s.hits;
  sum->misses += s.misses;
  sum->evictions += s.evictions;
}

void AddEngineStats(vstellar::EngineStats* sum, const vstellar::EngineStats& s) {
  sum->tx_pkts += s.tx_pkts;
  sum->rx_pkts += s.rx_pkts;
  sum->tx_bytes += s.tx_bytes;
  sum->rx_bytes += s.rx_bytes;
  sum->retx_pkts += s.retx_pkts;
  sum->timeouts += s.timeouts;
  sum->acks_sent += s.acks_sent;
  sum->ce_marks += s.ce_marks;
  sum->ud_sent += s.ud_sent;
  sum->ud_rcvd += s.ud_rcvd;
  sum->ud_drops += s.ud_drops;
  sum->stalled_qps += s.stalled_qps;
  sum->spurious_timeouts += s.spurious_timeouts;
  sum->read_gap_losses += s.read_gap_losses;
  sum->path_gap_losses += s.path_gap_losses;
  sum->quiet_losses += s.quiet_losses;
  sum->quiet_probes += s.quiet_probes;
  sum->overdue_losses += s.overdue_losses;
  sum->overdue_wrong += s.overdue_wrong;
  sum->paths_set_aside += s.paths_set_aside;
  sum->held_notices_sent += s.held_notices_sent;
  sum->held_resends += s.held_resends;
  sum->paused_sent += s.paused_sent;
  sum->resumed_sent += s.resumed_sent;
  sum->peer_notices_rcvd += s.peer_notices_rcvd;
  sum->late_passes += s.late_passes;
  sum->late_max_us = std::max(sum->late_max_us, s.late_max_us);
  sum->early_reads += s.early_reads;
  sum->trace_probes += s.trace_probes;
  sum->roce_tx += s.roce_tx;
  sum->roce_rx += s.roce_rx;
  sum->roce_bad += s.roce_bad;
  sum->roce_seq_naks_sent += s.roce_seq_naks_sent;
  sum->roce_seq_naks_rcvd += s.roce_seq_naks_rcvd;
  sum->roce_goback_pkts += s.roce_goback_pkts;
  sum->bad_parse += s.bad_parse;
  sum->bad_qpn += s.bad_qpn;
  sum->bad_peer += s.bad_peer;
  sum->bad_state += s.bad_state;
  sum->bad_ack += s.bad_ack;
  sum->dup_pkts += s.dup_pkts;
  sum->naks_sent += s.naks_sent;
  sum->naks_rcvd += s.naks_rcvd;
  sum->rnr_naks_sent += s.rnr_naks_sent;
  sum->page_fault_naks += s.page_fault_naks;
  sum->page_fault_waits += s.page_fault_waits;
  sum->page_fault_drops += s.page_fault_drops;
  sum->paths.resize(std::max(sum->paths.size(), s.paths.size()));
  for (size_t i = 0; i < s.paths.size(); i++) sum->paths[i].tx_pkts += s.paths[i].tx_pkts;
}

// Failure localization (--locate-faults): each worker names what its own
// paths show, so one link may be named by several.
void AppendFaults(const DaemonStats& s, std::string* out) {
  if (!s.locating) return;
  auto list = [&](const char* key, const std::vector<std::string>& items) {
    *out += std::string(",\"") + key + "\":[";
    bool first = true;
    for (const std::string& i : items) {
      if (i.empty()) continue;
      *out += (first ? "" : ",") + i;
      first = false;
    }
    *out += "]";
  };
  list("faults", s.faults);
  list("fault_history", s.fault_history);
  *out += ",\"localization\":[";
  for (size_t i = 0; i < s.localization.size(); i++) *out += (i ? ",{" : "{") + s.localization[i] + "}";
  *out += "]";
}

std::string StatsJson(const DaemonStats& s) {
  std::string out = "{";
  AppendDaemon(s, &out);
  AppendDevices(s, &out);
  AppendMemory(s, &out);
  AppendEngine(s, &out);
  AppendFaults(s, &out);
  AppendQps(s, &out);
  return out + "}\n";
}

void WriteStatsFile(const std::string& path, const std::string& json) {
  if (path.empty()) {
    std::fputs(json.c_str(), stderr);
    return;
  }
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return;
  std::fputs(json.c_str(), f);
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace vstellard
