// Fuzz target: WQEs and doorbells.
//
// One device's Commands and DataPath, as in fuzz_commands.cc, but with a
// Session that holds a real memory table: 4 MiB of RAM at GPA 0 and a
// 64 KiB doorbell region at kDbGpa, so that contexts get doorbell pages.
// Commands build PDs, CQs, QPs, SRQs and MRs whose rings live in that RAM;
// the input then writes WQEs into the rings and producer indices into the
// doorbell slots and kicks, and the data path fetches, checks and hands
// the WQEs to the engine (which runs on a SimNet with no peer).
//
// Input: records of  type(1) len(2, little-endian) bytes(len).  type % 4:
//   0  a control request (vstellar_cmd_hdr, then body)
//   1  RAM write: gpa(4, LE, modulo the RAM size), then the bytes
//   2  doorbell write: offset(4, LE, modulo the region size), then the bytes
//   3  kick: the data path polls its doorbells, then 1 ms of engine time
//
// What counts as a bug: a sanitizer report or a crash. FUZZ_TRACE=1 in the
// environment prints each command's status (for writing seeds).
#include <endian.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <vstellar/engine.h>
#include <vstellar/sim_net.h>

#include "vstellard/commands.h"
#include "vstellard/datapath.h"
#include "vstellard/vhost_user.h"

#include "fuzz_device.h"

namespace {

using namespace vstellard;

constexpr uint64_t kRamSize = 4ull << 20;
constexpr uint64_t kDbGpa = 0xfe000000, kDbSize = 64 << 10;
constexpr uint64_t kRamVa = 0x7f0000000000ull, kDbVa = 0x7f1000000000ull;

// A memfd the fuzzer writes through its own mapping.
struct Memfd {
  Memfd(const char* name, uint64_t size) : size(size) {
    fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, off_t(size)) != 0) abort();
    mem = static_cast<uint8_t*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    if (mem == MAP_FAILED) abort();
  }
  ~Memfd() {
    munmap(mem, size);
    close(fd);
  }
  void Store(const uint8_t* p, size_t len) {
    if (len < 4) return;
    uint32_t at;
    std::memcpy(&at, p, 4);
    uint64_t off = le32toh(at) % size;
    std::memcpy(mem + off, p + 4, std::min<uint64_t>(len - 4, size - off));
  }
  uint64_t size;
  int fd;
  uint8_t* mem;
};

template <typename T>
Message MsgOf(Request r, const T& v) {
  Message m;
  m.hdr = Header{uint32_t(r), kFlagVersion, uint32_t(sizeof(v))};
  m.payload.assign(reinterpret_cast<const uint8_t*>(&v), reinterpret_cast<const uint8_t*>(&v) + sizeof(v));
  return m;
}

struct Device {
  Device() {
    // What QEMU tells the daemon before the guest driver starts.
    if (!session.Handle(MsgOf(Request::kSetFeatures, session.offered_features())).ok() ||
        !session.Handle(MsgOf(Request::kSetProtocolFeatures, session.offered_protocol_features())).ok())
      abort();
    Message owner;
    owner.hdr = Header{uint32_t(Request::kSetOwner), kFlagVersion, 0};
    if (!session.Handle(std::move(owner)).ok()) abort();
    struct {
      uint32_t n, pad;
      MemRegionDesc d[2];
    } table{2, 0, {{0, kRamSize, kRamVa, 0}, {kDbGpa, kDbSize, kDbVa, 0}}};
    Message mt = MsgOf(Request::kSetMemTable, table);
    mt.fds.emplace_back(dup(ram.fd));
    mt.fds.emplace_back(dup(db.fd));
    std::string err;
    if (!session.Handle(std::move(mt)).ok() || !pvdma.Attach(session.regions(), &err)) abort();
    net.attach(1, &engine);
    shared.engine = &engine;
    shared.poll_ns = 0;  // a kick polls until idle, then sleeps
    // CQ notification queue 0 is set up (CREATE_CQ asks for a live one).
    session.mutable_vring(VSTELLAR_VQ_CQN0).num = 64;
  }
  ~Device() { cmds.DestroyAll(); }

  Memfd ram{"memory-backend-memfd", kRamSize};
  Memfd db{"vstellar-doorbell", kDbSize};
  DeviceState state{DeviceConfig::Default()};
  Session session{state};
  Pvdma pvdma;
  vstellar::SimNet net;
  vstellar::Engine engine{FuzzEngineConfig(), net.add_node(1), net};
  DeviceShared shared;
  ObjectTables objects;
  NoEvents events;
  DataPath dp{0, shared, state, session, pvdma, objects, events};
  Commands cmds{shared, state, session, pvdma, objects, dp};
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool trace = getenv("FUZZ_TRACE") != nullptr;
  Device dev;
  size_t pos = 0;
  while (pos + 3 <= size) {
    uint8_t type = data[pos] % 4;
    size_t len = size_t(data[pos + 1]) | size_t(data[pos + 2]) << 8;
    pos += 3;
    len = std::min(len, size - pos);
    const uint8_t* p = data + pos;
    pos += len;
    switch (type) {
      case 0: {
        if (len < sizeof(vstellar_cmd_hdr)) break;  // Device answers these itself
        std::vector<uint8_t> req(p, p + len), resp;
        uint16_t status = dev.cmds.Execute(req, &resp);
        if (trace) {  // for writing seeds: which command failed
          vstellar_cmd_hdr h;
          std::memcpy(&h, req.data(), sizeof(h));
          fprintf(stderr, "cmd %s -> status %u, resp", vstellar_cmd_name(le16toh(h.opcode)), status);
          for (uint8_t b : resp) fprintf(stderr, " %02x", b);
          fprintf(stderr, "\n");
        }
        break;
      }
      case 1: dev.ram.Store(p, len); break;
      case 2: dev.db.Store(p, len); break;
      case 3:
        dev.dp.OnKick();
        dev.net.run_for(1'000'000);
        break;
    }
  }
  if (trace) {
    const DataPathCounters& n = dev.dp.counters();
    fprintf(stderr, "kicks %llu wqes %llu bad_wqes %llu cqes %llu\n", (unsigned long long)n.db_kicks,
            (unsigned long long)n.wqes, (unsigned long long)n.bad_wqes, (unsigned long long)n.cqes);
  }
  return 0;
}
