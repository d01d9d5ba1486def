// How one vstellard runs: the command line (main.cc) and the tests fill
// it in, the daemon (daemon.h) and its workers (worker.h) read it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <vstellar/engine.h>
#include <vstellar/udp_link.h>

#include "vstellard/pvdma.h"
#include "vstellard/translate.h"

namespace vstellard {

struct DaemonOptions {
  // The default vhost-user socket; devices that attach through it may hold
  // `ip` as their GID. Empty: only device_sockets.
  std::string socket;
  PinMode pin = PinMode::kLazy;
  TranslationMode translation = TranslationMode::kEmtt;
  size_t atc_entries = 16384;  // 4 KiB frames: 64 MiB of reach
  uint64_t atc_miss_ns = 0;    // emulated ATS round trip on a miss
  // How long an access waits for the guest to map an on-demand page.
  uint64_t odp_fault_timeout_ms = 5000;
  vstellar::IpAddr ip = vstellar::IpAddr(0x7f000001);
  // More vhost-user sockets (vstellard --device PATH,ip=A[,ip=B...]), each
  // with the addresses (IPv4, IPv6) a device attached through it may hold,
  // so that one daemon serves many guests each with its own addresses.
  // With any, the engine's sockets are bound to the wildcard, and each QP
  // sends from its device's address (UdpLinkConfig::local).
  struct DeviceSocket {
    std::string path;
    std::vector<vstellar::IpAddr> addresses;
  };
  std::vector<DeviceSocket> device_sockets;
  static constexpr size_t kMaxDeviceSockets = 4096;  // with the default one
  bool serves_many_addresses() const { return !device_sockets.empty(); }
  uint16_t udp_port = 0;       // engine base port; 0 = no network
  uint16_t peer_port = 0;      // peers' base port; 0 = same as udp_port
  uint16_t paths = 128;
  vstellar::LinkMode link_mode = vstellar::LinkMode::GSO;  // UdpLinkConfig::mode
  uint16_t path_burst = 16;    // EngineConfig::path_burst
  bool zerocopy = false;       // UdpLinkConfig::zerocopy
  bool locate_faults = false;  // path tracing and fault localization (qemu-device/telemetry)
  // Peers that speak plain RoCE v2 (EngineConfig::roce): --roce-peers.
  std::vector<vstellar::IpPrefix> roce_peers;
  uint64_t poll_us = 50;       // data path: keep polling doorbells this long after the last work
  int nice = -10;              // scheduling priority asked for at start (main.cc, SetNice)
  uint64_t idle_recheck_us = 1000;  // data path: one more look this long after going idle (missed kicks)
  // Work per device per loop turn (DeviceShared): what is left waits a turn.
  uint32_t control_budget = 64;       // control commands
  uint32_t wqe_budget_queue = 64;     // WQEs of one SQ, RQ or SRQ
  uint32_t wqe_budget_device = 1024;  // WQEs of all the device's queues
  // A frontend that sends part of a vhost-user message and then nothing
  // for this long is closed (that device only).
  uint32_t vhost_timeout_ms = 5000;
  // Guest memory must be sealed against shrinking (memfd seal=on).
  bool require_sealed_memory = true;
  // Integrity mode (docs/wire-format.md): a MAC on every packet.
  bool integrity = false;
  std::array<uint8_t, 32> integrity_key{};
  // Its MAC (--integrity-alg); every peer needs the same.
  vstellar::EngineConfig::MacAlgorithm integrity_alg = vstellar::EngineConfig::MacAlgorithm::CHACHA20_POLY1305;
  // Host memory the guests' objects may hold (memory_budget.h): all
  // devices together, and each device.
  uint64_t memory_limit = uint64_t{4} << 30;
  uint64_t device_memory_limit = uint64_t{1} << 30;
  // Guest memory one device's memory table may declare
  // (DeviceConfig::max_guest_memory); a larger table is refused.
  uint64_t guest_memory_limit = uint64_t{1} << 40;
  // Multicast quotas of each device (DeviceShared::mcast_*).
  uint32_t mcast_groups_per_device = 16;
  uint32_t mcast_qps_per_group = 8;
  // Objects one device may hold (0: the default, DeviceConfig::Default());
  // a limit above the default is refused by Start(). Over it, creating one
  // more fails with VSTELLAR_STATUS_LIMIT.
  struct DeviceMax {
    uint32_t ucontext = 0, pd = 0, qp = 0, cq = 0, mr = 0;
  } device_max;
  std::string stats_json;      // file written on SIGUSR1 (RequestStats) and at exit
  // Worker threads (1..kMaxThreads): each has its own engine, io_uring and
  // sockets (on the same ports, SO_REUSEPORT; arriving datagrams are
  // steered by destination QPN) and serves the devices it was given.
  unsigned threads = 1;
  // With several: a device whose QPs connect to devices of this daemon on
  // another worker moves to that worker (--placement peers), or stays
  // where it was accepted (--placement fixed). docs/vstellard.md.
  bool place_by_peers = true;
  static constexpr unsigned kMaxThreads = 64;
};

const char* ToString(PinMode m);
const char* ToString(TranslationMode m);

}  // namespace vstellard
