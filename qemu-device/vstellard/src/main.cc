// vstellard: the host daemon behind vhost-user-vstellar-pci. One process
// is one emulated Stellar RNIC; every QEMU connection on its socket is one
// virtual device, created when the connection is accepted and destroyed
// when it closes. See docs/vstellard.md.
#include <getopt.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <arpa/inet.h>

#include <vstellar/integrity_key.h>

#include "vstellard/daemon.h"

namespace {

vstellard::Daemon* g_daemon = nullptr;

void OnSignal(int sig) {
  if (!g_daemon) return;
  if (sig == SIGUSR1) g_daemon->RequestStats();
  else g_daemon->Stop();
}

int Usage(const char* argv0, int rc) {
  std::fprintf(rc ? stderr : stdout,
               "usage: %s --socket PATH [options]\n"
               "  --socket PATH          vhost-user socket to listen on (required)\n"
               "  --pin=lazy|eager       PVDMA: pin 2 MiB blocks on first access (default) or\n"
               "                         all guest memory at attach (VFIO-like baseline)\n"
               "  --translation=emtt|atc MR translation: final translations in the MR (default)\n"
               "                         or a bounded translation cache (baseline)\n"
               "  --atc-entries N        ATC size in 4 KiB entries (default 16384 = 64 MiB)\n"
               "  --atc-miss-ns N        emulated round trip of an ATC miss (default 0)\n"
               "  --ip A.B.C.D           local IPv4 address of the engine (default 127.0.0.1)\n"
               "  --port N               engine UDP base port (default 0: no network)\n"
               "  --peer-port N          peers' UDP base port (default: --port)\n"
               "  --paths N              UDP paths per connection, 1..256 (default 128)\n"
               "  --link=gso|plain       UDP link: segmentation and receive offloads\n"
               "                         (UDP_SEGMENT, UDP_GRO; default) or one sendmsg and\n"
               "                         one receive per datagram; the two interoperate\n"
               "  --path-burst N         packets a path carries before the next pick, so the\n"
               "                         link can send runs as one (1..64, default 16)\n"
               "  --zerocopy             gso link: zero-copy sends (SENDMSG_ZC) of 32 KiB and more\n"
               "  --poll-us N            data path: poll doorbells this long after the last\n"
               "                         work, then set need_kick and sleep (default 50)\n"
               "  --control-budget N     control commands per device per loop turn (default 64)\n"
               "  --wqe-budget N         WQEs per SQ, RQ or SRQ per loop turn (default 64)\n"
               "  --wqe-budget-device N  WQEs per device per loop turn (default 1024)\n"
               "  --vhost-timeout-ms N   close a frontend that stalls mid-message this long\n"
               "                         (default 5000)\n"
               "  --integrity-key FILE   integrity mode: a keyed MAC on every packet, with the\n"
               "                         key in FILE (64 hex digits); every peer needs it\n"
               "  --allow-unsealed-memory  accept guest memory that cannot be sealed against\n"
               "                         shrinking (memory-backend-file); its owner could\n"
               "                         then crash the daemon by truncating the file\n"
               "  --memory-limit SIZE    host memory all guests' QPs, CQs, SRQs and MRs may\n"
               "                         hold in the daemon (default 4G; K, M, G suffixes)\n"
               "  --device-memory-limit SIZE  the same for each device (default 1G); over\n"
               "                         either, creating an object fails with ENOMEM\n"
               "  --stats-json FILE      write counters here on SIGUSR1 and at exit\n"
               "                         (default: SIGUSR1 prints them to stderr)\n",
               argv0);
  return rc;
}

bool Num(const char* s, unsigned long long max, unsigned long long* out) {
  char* end;
  errno = 0;
  *out = std::strtoull(s, &end, 0);
  return errno == 0 && *end == 0 && *out <= max;
}

// A byte count with an optional K, M or G (binary) suffix.
bool Size(const char* s, unsigned long long* out) {
  char* end;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  unsigned shift = 0;
  switch (*end) {
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
  }
  if (errno || end == s || *end || v == 0 || v > (~0ull >> shift)) return false;
  *out = v << shift;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  vstellard::DaemonOptions o;
  enum { kPin = 256, kTrans, kAtcEntries, kAtcMiss, kIp, kPort, kPeerPort, kPaths, kStats, kPollUs,
         kControlBudget, kWqeBudget, kWqeBudgetDevice, kVhostTimeout, kMemLimit, kDevMemLimit, kAllowUnsealed, kIntegrityKey, kLink, kPathBurst, kZerocopy };
  static const option opts[] = {{"socket", required_argument, nullptr, 's'},
                                {"pin", required_argument, nullptr, kPin},
                                {"translation", required_argument, nullptr, kTrans},
                                {"atc-entries", required_argument, nullptr, kAtcEntries},
                                {"atc-miss-ns", required_argument, nullptr, kAtcMiss},
                                {"ip", required_argument, nullptr, kIp},
                                {"port", required_argument, nullptr, kPort},
                                {"peer-port", required_argument, nullptr, kPeerPort},
                                {"paths", required_argument, nullptr, kPaths},
                                {"link", required_argument, nullptr, kLink},
                                {"path-burst", required_argument, nullptr, kPathBurst},
                                {"zerocopy", no_argument, nullptr, kZerocopy},
                                {"stats-json", required_argument, nullptr, kStats},
                                {"poll-us", required_argument, nullptr, kPollUs},
                                {"control-budget", required_argument, nullptr, kControlBudget},
                                {"wqe-budget", required_argument, nullptr, kWqeBudget},
                                {"wqe-budget-device", required_argument, nullptr, kWqeBudgetDevice},
                                {"vhost-timeout-ms", required_argument, nullptr, kVhostTimeout},
                                {"memory-limit", required_argument, nullptr, kMemLimit},
                                {"allow-unsealed-memory", no_argument, nullptr, kAllowUnsealed},
                                {"integrity-key", required_argument, nullptr, kIntegrityKey},
                                {"device-memory-limit", required_argument, nullptr, kDevMemLimit},
                                {"help", no_argument, nullptr, 'h'},
                                {nullptr, 0, nullptr, 0}};
  unsigned long long v;
  for (int c; (c = getopt_long(argc, argv, "s:h", opts, nullptr)) != -1;) {
    switch (c) {
      case 's': o.socket = optarg; break;
      case kPin:
        if (!std::strcmp(optarg, "lazy")) o.pin = vstellard::PinMode::kLazy;
        else if (!std::strcmp(optarg, "eager")) o.pin = vstellard::PinMode::kEager;
        else return Usage(argv[0], 2);
        break;
      case kTrans:
        if (!std::strcmp(optarg, "emtt")) o.translation = vstellard::TranslationMode::kEmtt;
        else if (!std::strcmp(optarg, "atc")) o.translation = vstellard::TranslationMode::kAtc;
        else return Usage(argv[0], 2);
        break;
      case kAtcEntries:
        if (!Num(optarg, 1ull << 26, &v) || v == 0) return Usage(argv[0], 2);
        o.atc_entries = v;
        break;
      case kAtcMiss:
        if (!Num(optarg, 1000000, &v)) return Usage(argv[0], 2);
        o.atc_miss_ns = v;
        break;
      case kIp: {
        in_addr a;
        if (inet_pton(AF_INET, optarg, &a) != 1) return Usage(argv[0], 2);
        o.ip = ntohl(a.s_addr);
        break;
      }
      case kPort:
        if (!Num(optarg, 65535, &v)) return Usage(argv[0], 2);
        o.udp_port = uint16_t(v);
        break;
      case kPeerPort:
        if (!Num(optarg, 65535, &v)) return Usage(argv[0], 2);
        o.peer_port = uint16_t(v);
        break;
      case kPaths:
        if (!Num(optarg, 256, &v) || v == 0) return Usage(argv[0], 2);
        o.paths = uint16_t(v);
        break;
      case kLink:
        if (!vstellar::parse_link_mode(optarg, o.link_mode)) return Usage(argv[0], 2);
        break;
      case kPathBurst:
        if (!Num(optarg, 64, &v) || v == 0) return Usage(argv[0], 2);
        o.path_burst = uint16_t(v);
        break;
      case kZerocopy: o.zerocopy = true; break;
      case kStats: o.stats_json = optarg; break;
      case kPollUs:
        if (!Num(optarg, 1000000, &v)) return Usage(argv[0], 2);
        o.poll_us = v;
        break;
      case kControlBudget:
        if (!Num(optarg, 1u << 20, &v) || v == 0) return Usage(argv[0], 2);
        o.control_budget = uint32_t(v);
        break;
      case kWqeBudget:
        if (!Num(optarg, 1u << 20, &v) || v == 0) return Usage(argv[0], 2);
        o.wqe_budget_queue = uint32_t(v);
        break;
      case kWqeBudgetDevice:
        if (!Num(optarg, 1u << 24, &v) || v == 0) return Usage(argv[0], 2);
        o.wqe_budget_device = uint32_t(v);
        break;
      case kVhostTimeout:
        if (!Num(optarg, 3'600'000, &v) || v == 0) return Usage(argv[0], 2);
        o.vhost_timeout_ms = uint32_t(v);
        break;
      case kAllowUnsealed: o.require_sealed_memory = false; break;
      case kIntegrityKey: {
        std::string err;
        if (!vstellar::ReadIntegrityKey(optarg, &o.integrity_key, &err)) {
          std::fprintf(stderr, "%s: --integrity-key %s\n", argv[0], err.c_str());
          return 2;
        }
        o.integrity = true;
        break;
      }
      case kMemLimit:
        if (!Size(optarg, &v)) return Usage(argv[0], 2);
        o.memory_limit = v;
        break;
      case kDevMemLimit:
        if (!Size(optarg, &v)) return Usage(argv[0], 2);
        o.device_memory_limit = v;
        break;
      case 'h': return Usage(argv[0], 0);
      default: return Usage(argv[0], 2);
    }
  }
  if (o.socket.empty() || optind != argc) return Usage(argv[0], 2);
  signal(SIGPIPE, SIG_IGN);
  // A device holds about a dozen descriptors (its socket, two memfds, a
  // kick and a call eventfd per queue): take all the hard limit allows.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }

  vstellard::Daemon d(o);
  std::string err;
  if (!d.Start(&err)) {
    std::fprintf(stderr, "vstellard: %s\n", err.c_str());
    return 1;
  }
  g_daemon = &d;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::fprintf(stderr, "vstellard: listening on %s (pin=%s, translation=%s)\n", o.socket.c_str(),
               vstellard::ToString(o.pin), vstellard::ToString(o.translation));
  d.Run();
  g_daemon = nullptr;
  return 0;
}
