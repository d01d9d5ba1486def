// vstellard's counters as one JSON object (the file --stats-json names,
// written on SIGUSR1 and at exit; tools/vstellar-stat reads it). The daemon
// gathers a DaemonStats from its workers, one lock at a time; this file
// only formats it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <vstellar/engine.h>

#include "vstellard/device.h"
#include "vstellard/pvdma.h"
#include "vstellard/translate.h"

namespace vstellard {

struct DaemonStats {
  PinMode pin = PinMode::kLazy;
  TranslationMode translation = TranslationMode::kEmtt;
  size_t threads = 0;
  uint64_t forwarded = 0;  // datagrams passed on to another worker
  uint64_t device_moves = 0;  // devices moved to their peers' worker (Worker::Place)
  AtcStats atc;            // summed over the workers
  size_t atc_entries = 0;
  std::vector<DeviceStats> devices;  // the live ones and the last closed
  struct Memory {
    uint64_t limit = 0, device_limit = 0, used = 0, peak = 0, refused = 0;
  } memory;
  bool have_engine = false;   // a network: the engine counters mean something
  vstellar::EngineStats engine;  // summed over the workers
  std::vector<std::string> qps;  // one line of key=value per QP (vstellar-stat --qps)
  // --locate-faults, from every worker: faults active and every fault seen
  // (JSON objects), and each worker's counters ("key":value pairs).
  bool locating = false;
  std::vector<std::string> faults, fault_history, localization;
};

void AddAtcStats(AtcStats* sum, const AtcStats& s);
// The counters the stats file reports, and the packets sent per path.
void AddEngineStats(vstellar::EngineStats* sum, const vstellar::EngineStats& s);

std::string StatsJson(const DaemonStats& s);
// Writes `json` to `path` whole (a temporary file renamed over it), or to
// stderr if path is empty.
void WriteStatsFile(const std::string& path, const std::string& json);

}  // namespace vstellard
