// What the fuzz targets that build a device's parts (fuzz_commands,
// fuzz_datapath) share: an engine configuration that replays, and a sink
// for the device's events.
#pragma once

#include <cstdint>

#include <vstellar/engine.h>

#include "vstellard/datapath.h"

namespace vstellard {

// QPNs and memory keys from fixed sequences, not getrandom: an input must
// replay.
inline vstellar::EngineConfig FuzzEngineConfig() {
  vstellar::EngineConfig c;
  c.qpn_seed = 1;
  c.key_seed = 1;
  return c;
}

struct NoEvents : DataPathEvents {
  void PostEvent(uint16_t, uint32_t, uint32_t, uint32_t) override {}
  bool PostPageFault(uint32_t, uint32_t, uint64_t, uint32_t, bool) override { return true; }
  void NotifyCq(uint32_t, const vstellar_cq_notify&) override {}
  bool DeviceFatal() const override { return false; }
};

}  // namespace vstellard
