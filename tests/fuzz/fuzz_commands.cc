// Fuzz target: control commands.
//
// One device's Commands and DataPath without a vhost-user connection, as in
// tests/vstellard/commands_test.cc, over 4 MiB of guest RAM. The input is a
// list of records; each either runs one control request (header and body,
// exactly the bytes the guest driver would put in the control queue, so the
// header's length may lie) or writes bytes into guest RAM first (page
// lists, rings and MR contents that commands refer to).
//
// Input: records of  type(1) len(2, little-endian) bytes(len).
//   type even  a request: vstellar_cmd_hdr, then body
//   type odd   guest RAM: gpa(4, little-endian, taken modulo the RAM size),
//              then the bytes to store there (clipped at the end of RAM)
//
// What counts as a bug: a sanitizer report or a crash, a response body
// longer than the command list allows, or a status outside the list.
#include <endian.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <vstellar/engine.h>
#include <vstellar/sim_net.h>

#include "vstellard/commands.h"
#include "vstellard/datapath.h"
#include "vstellard/vhost_user.h"
#include "vstellard/guest_ram.h"

#include "fuzz_device.h"

namespace {

using namespace vstellard;

constexpr uint64_t kRamSize = 4ull << 20;

// The parts of one device, built as commands_test.cc builds them.
struct DeviceParts {
  DeviceParts() {
    std::string err;
    if (!ram.ok() || !pvdma.Attach(ram.Table(), &err)) abort();
    net.attach(1, &engine);
    shared.engine = &engine;
    // CQ notification queue 0 is set up (CREATE_CQ asks for a live one).
    session.mutable_vring(VSTELLAR_VQ_CQN0).num = 64;
  }
  ~DeviceParts() { cmds.DestroyAll(); }

  GuestRam ram{kRamSize};
  Pvdma pvdma;
  vstellar::SimNet net;
  vstellar::Engine engine{FuzzEngineConfig(), net.add_node(1), net};
  DeviceShared shared;
  DeviceState state{DeviceConfig::Default()};
  Session session{state};
  ObjectTables objects;
  NoEvents events;
  DataPath dp{0, shared, state, session, pvdma, objects, events};
  Commands cmds{shared, state, session, pvdma, objects, dp};
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  DeviceParts dev;
  size_t pos = 0;
  while (pos + 3 <= size) {
    uint8_t type = data[pos];
    size_t len = size_t(data[pos + 1]) | size_t(data[pos + 2]) << 8;
    pos += 3;
    len = std::min(len, size - pos);
    const uint8_t* p = data + pos;
    pos += len;

    if (type & 1) {
      if (len < 4) continue;
      uint32_t gpa;
      std::memcpy(&gpa, p, 4);
      uint64_t at = le32toh(gpa) % kRamSize;
      size_t n = std::min<uint64_t>(len - 4, kRamSize - at);
      std::memcpy(dev.ram.at(at), p + 4, n);
      continue;
    }
    // Device::ProcessControl answers a request shorter than the header
    // itself; Execute may assume a whole header.
    if (len < sizeof(vstellar_cmd_hdr)) continue;
    std::vector<uint8_t> req(p, p + len);
    std::vector<uint8_t> resp;
    uint16_t status = dev.cmds.Execute(req, &resp);
    if (status == VSTELLAR_STATUS_OK) {
      vstellar_cmd_hdr h;
      std::memcpy(&h, req.data(), sizeof(h));
      const auto* info = vstellar_cmd_info(le16toh(h.opcode));
      if (!info) abort();                       // an unknown opcode succeeded
      if (resp.size() > info->resp_len) abort();  // more than the driver's buffer holds
    }
  }
  return 0;
}
