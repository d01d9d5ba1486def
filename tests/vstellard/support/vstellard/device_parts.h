// One device's parts without a Device or a vhost-user connection: guest RAM
// (memfd), PVDMA over it, an engine on a simulated network, the object
// tables, a DataPath with a recording event sink, and Commands. Tests that
// drive commands or the data path alone derive their fixture from it
// (commands_test.cc, security_control_test.cc).
#pragma once

#include <endian.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <vstellar/engine.h>
#include <vstellar/sim_net.h>

#include "vstellard/commands.h"
#include "vstellard/datapath.h"
#include "vstellard/guest_ram.h"

namespace vstellard {

// What the data path reported: event types, CQ notifications.
struct RecordedEvents : DataPathEvents {
  void PostEvent(uint16_t type, uint32_t object, uint32_t ucontext, uint32_t info) override {
    events.push_back(type);
  }
  bool PostPageFault(uint32_t mrn, uint32_t ucontext, uint64_t iova, uint32_t npages, bool write) override {
    events.push_back(VSTELLAR_EV_PAGE_FAULT);
    faults.push_back({mrn, iova, npages, write});
    return true;
  }
  void NotifyCq(uint32_t cq_queue, const vstellar_cq_notify& n) override { notifies++; }
  bool DeviceFatal() const override { return fatal; }
  struct Fault {
    uint32_t mrn;
    uint64_t iova;
    uint32_t npages;
    bool write;
  };
  std::vector<uint16_t> events;
  std::vector<Fault> faults;
  int notifies = 0;
  bool fatal = false;
};

class PartsHarness {
 protected:
  // Attaches the RAM and the engine; false (and *err) if the RAM is unusable.
  bool Start(std::string* err) {
    if (!ram_.ok()) {
      *err = "guest RAM: memfd failed";
      return false;
    }
    if (!pvdma_.Attach(ram_.Table(), err)) return false;
    net_.attach(1, &engine_);
    shared_.engine = &engine_;
    return true;
  }

  // Runs one command; returns its status, *resp its response body.
  uint16_t Command(uint16_t op, uint32_t uctx, const void* body, size_t len, std::vector<uint8_t>* resp = nullptr) {
    vstellar_cmd_hdr h{};
    h.opcode = htole16(op);
    h.ucontext = htole32(uctx);
    h.length = htole32(uint32_t(len));
    std::vector<uint8_t> req(sizeof(h) + len);
    std::memcpy(req.data(), &h, sizeof(h));
    if (len) std::memcpy(req.data() + sizeof(h), body, len);
    std::vector<uint8_t> scratch;
    return cmds_.Execute(req, resp ? resp : &scratch);
  }

  // ALLOC_PD for context `uctx` (0: the kernel); its PDN.
  uint32_t AllocPd(uint32_t uctx = 0) {
    std::vector<uint8_t> resp;
    EXPECT_EQ(Command(VSTELLAR_CMD_ALLOC_PD, uctx, nullptr, 0, &resp), VSTELLAR_STATUS_OK);
    vstellar_resp_alloc_pd r{};
    std::memcpy(&r, resp.data(), std::min(resp.size(), sizeof(r)));
    return le32toh(r.pdn);
  }

  GuestRam ram_{4ull << 20};
  Pvdma pvdma_;
  vstellar::SimNet net_;
  vstellar::Engine engine_{vstellar::EngineConfig{}, net_.add_node(1), net_};
  DeviceShared shared_;
  DeviceState state_{DeviceConfig::Default()};
  Session session_{state_};
  ObjectTables objects_;
  RecordedEvents events_;
  DataPath dp_{0, shared_, state_, session_, pvdma_, objects_, events_};
  Commands cmds_{shared_, state_, session_, pvdma_, objects_, dp_};
};

}  // namespace vstellard
