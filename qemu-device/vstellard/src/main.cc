// vstellard: the host daemon behind vhost-user-vstellar-pci. One process
// is one emulated Stellar RNIC; every QEMU connection on its socket is one
// virtual device, created when the connection is accepted and destroyed
// when it closes. See docs/vstellard.md.
#include <getopt.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <arpa/inet.h>

#include <algorithm>

#include <vstellar/integrity_key.h>
#include <vstellar/ip_text.h>

#include "vstellard/daemon.h"

namespace {

vstellard::Daemon* g_daemon = nullptr;
// --require-integrity: checked once every option is in, wherever the key
// comes from (command line or --config).
bool g_require_integrity = false;

void OnSignal(int sig) {
  if (!g_daemon) return;
  if (sig == SIGUSR1) g_daemon->RequestStats();
  else g_daemon->Stop();
}

int Usage(const char* argv0, int rc) {
  std::fprintf(rc ? stderr : stdout,
               "usage: %s --socket PATH [options]\n"
               "       %s --device PATH,ip=ADDR[,ip=ADDR...] [--device ...] [options]\n"
               "  --socket PATH          vhost-user socket to listen on; its devices may hold\n"
               "                         the --ip address as their GID\n"
               "  --device PATH,ip=ADDR[,ip=ADDR...]\n"
               "                         one more vhost-user socket (repeatable): a device that\n"
               "                         attaches through it may hold exactly these IPv4 or IPv6\n"
               "                         addresses as GIDs, and its QPs send from them. With any\n"
               "                         --device the engine receives on every address of the\n"
               "                         host (one daemon serving many guests, each with its\n"
               "                         own addresses); see docs/vstellard.md\n"
               "  --config FILE          options from FILE, one `option = value` a line\n"
               "                         (options after it on the command line win)\n"
               "  --pin=lazy|eager       PVDMA: pin 2 MiB blocks on first access (default) or\n"
               "                         all guest memory at attach (VFIO-like baseline)\n"
               "  --translation=emtt|atc MR translation: final translations in the MR (default)\n"
               "                         or a bounded translation cache (baseline)\n"
               "  --atc-entries N        ATC size in 4 KiB entries (default 16384 = 64 MiB)\n"
               "  --atc-miss-ns N        emulated round trip of an ATC miss (default 0)\n"
               "  --odp-fault-timeout MS how long an access to an on-demand MR waits for the\n"
               "                         guest to map a missing page before it fails (5000)\n"
               "  --ip ADDR              the address (IPv4 or IPv6) of the --socket devices and,\n"
               "                         without --device, the one the engine is bound to\n"
               "                         (default 127.0.0.1)\n"
               "  --port N               engine UDP base port (default 0: no network)\n"
               "  --peer-port N          peers' UDP base port (default: --port)\n"
               "  --paths N              UDP paths per connection, 1..256 (default 128)\n"
               "  --link=gso|plain       UDP link: segmentation and receive offloads\n"
               "                         (UDP_SEGMENT, UDP_GRO; default) or one sendmsg and\n"
               "                         one receive per datagram; the two interoperate\n"
               "  --path-burst N         packets a path carries before the next pick, so the\n"
               "                         link can send runs as one (1..64, default 16)\n"
               "  --zerocopy             gso link: zero-copy sends (SENDMSG_ZC) of 32 KiB and more\n"
               "  --roce-peers CIDR[,CIDR...]\n"
               "                         peers in these subnets speak plain RoCE v2 (rxe, a\n"
               "                         RoCE NIC): RC QPs and datagrams (UD, rdma_cm's QP 1)\n"
               "                         to one use standard IBTA packets on UDP port 4791,\n"
               "                         one path, go-back-N, from the first packet\n"
               "                         (repeatable; not with --threads > 1 or\n"
               "                         integrity mode; docs/wire-format.md, \"RoCE v2 mode\")\n"
               "  --locate-faults        learn each path's route with TTL-limited probes (raw\n"
               "                         sockets: CAP_NET_RAW; IPv4) and name the fabric link\n"
               "                         that breaks; logged, and in the stats' \"faults\"\n"
               "                         (docs/fabric.md, \"Failure localization\")\n"
               "  --threads N            worker threads, each with its own engine, io_uring and\n"
               "                         devices (default 1; 1..64); see docs/vstellard.md\n"
               "  --placement MODE       with --threads > 1: peers (default) moves a device to\n"
               "                         the worker of the devices of this daemon its QPs are\n"
               "                         connected to; fixed keeps it where it was accepted\n"
               "  --poll-us N            data path: poll doorbells this long after the last\n"
               "                         work, then set need_kick and sleep (default 50)\n"
               "  --nice N               run at this scheduling priority, -20..19 (default -10:\n"
               "                         the engine answers its peers' packets; behind busy\n"
               "                         guest vCPUs at 0 it waited up to 0.65 s for a core,\n"
               "                         longer than a QP's retry limit); needs CAP_SYS_NICE\n"
               "  --idle-recheck-us N    look at the doorbells once more this long after the\n"
               "                         data path went idle, for a producer index published\n"
               "                         without its kick (counted: missed_kicks) (default 1000)\n"
               "  --control-budget N     control commands per device per loop turn (default 64)\n"
               "  --wqe-budget N         WQEs per SQ, RQ or SRQ per loop turn (default 64)\n"
               "  --wqe-budget-device N  WQEs per device per loop turn (default 1024)\n"
               "  --vhost-timeout-ms N   close a frontend that stalls mid-message this long\n"
               "                         (default 5000)\n"
               "  --integrity-key FILE   integrity mode: a keyed MAC on every packet, with the\n"
               "                         key in FILE (64 hex digits); every peer needs it\n"
               "  --integrity-alg A      its MAC: chacha20-poly1305 (default) or aes-gmac (only\n"
               "                         with AES-NI and PCLMUL); every peer needs the same\n"
               "  --require-integrity    refuse to start without --integrity-key, so that no\n"
               "                         unsealed packet is ever sent or taken\n"
               "  --allow-unsealed-memory  accept guest memory that cannot be sealed against\n"
               "                         shrinking (memory-backend-file); its owner could\n"
               "                         then crash the daemon by truncating the file\n"
               "  --memory-limit SIZE    host memory all guests' QPs, CQs, SRQs and MRs may\n"
               "                         hold in the daemon (default 4G; K, M, G suffixes)\n"
               "  --device-memory-limit SIZE  the same for each device (default 1G); over\n"
               "                         either, creating an object fails with ENOMEM\n"
               "  --guest-memory-limit SIZE  guest memory one device's memory table may\n"
               "                         declare (default 1024G); a larger one is refused\n"
               "  --mcast-groups N       multicast groups one device may join (default 16,\n"
               "                         at most 256); over it ATTACH_MCAST fails with LIMIT\n"
               "  --mcast-qps N          QPs of one device in one group (default 8, at most 64)\n"
               "  --device-max K=N[,K=N...]  objects one device may hold, K one of ucontext,\n"
               "                         pd, qp, cq, mr (defaults 64, 1024, 1024, 1024, 4096;\n"
               "                         only lower); over it a create fails with LIMIT\n"
               "  --stats-json FILE      write counters here on SIGUSR1 and at exit\n"
               "                         (default: SIGUSR1 prints them to stderr)\n",
               argv0, argv0);
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


enum { kSocket = 's', kHelp = 'h', kPin = 256, kTrans, kAtcEntries, kAtcMiss, kOdpTimeout, kIp, kPort, kPeerPort,
       kPaths, kStats, kPollUs, kIdleRecheckUs, kControlBudget, kWqeBudget, kWqeBudgetDevice, kVhostTimeout,
       kMemLimit, kDevMemLimit, kGuestMemLimit, kAllowUnsealed, kIntegrityKey, kRequireIntegrity, kConfig, kLink, kPathBurst, kZerocopy, kDeviceMax, kThreads, kPlacement,
       kMcastGroups, kMcastQps, kDevice, kIntegrityAlg, kLocateFaults, kRocePeers, kNice };
const option kOptions[] = {{"socket", required_argument, nullptr, kSocket},
                           {"config", required_argument, nullptr, kConfig},
                           {"pin", required_argument, nullptr, kPin},
                           {"translation", required_argument, nullptr, kTrans},
                           {"atc-entries", required_argument, nullptr, kAtcEntries},
                           {"atc-miss-ns", required_argument, nullptr, kAtcMiss},
                           {"odp-fault-timeout", required_argument, nullptr, kOdpTimeout},
                           {"ip", required_argument, nullptr, kIp},
                           {"port", required_argument, nullptr, kPort},
                           {"peer-port", required_argument, nullptr, kPeerPort},
                           {"paths", required_argument, nullptr, kPaths},
                           {"link", required_argument, nullptr, kLink},
                           {"path-burst", required_argument, nullptr, kPathBurst},
                           {"zerocopy", no_argument, nullptr, kZerocopy},
                           {"locate-faults", no_argument, nullptr, kLocateFaults},
                           {"roce-peers", required_argument, nullptr, kRocePeers},
                           {"device-max", required_argument, nullptr, kDeviceMax},
                           {"threads", required_argument, nullptr, kThreads},
                           {"placement", required_argument, nullptr, kPlacement},
                           {"stats-json", required_argument, nullptr, kStats},
                           {"poll-us", required_argument, nullptr, kPollUs},
                           {"nice", required_argument, nullptr, kNice},
                           {"idle-recheck-us", required_argument, nullptr, kIdleRecheckUs},
                           {"control-budget", required_argument, nullptr, kControlBudget},
                           {"wqe-budget", required_argument, nullptr, kWqeBudget},
                           {"wqe-budget-device", required_argument, nullptr, kWqeBudgetDevice},
                           {"vhost-timeout-ms", required_argument, nullptr, kVhostTimeout},
                           {"memory-limit", required_argument, nullptr, kMemLimit},
                           {"allow-unsealed-memory", no_argument, nullptr, kAllowUnsealed},
                           {"integrity-key", required_argument, nullptr, kIntegrityKey},
                           {"require-integrity", no_argument, nullptr, kRequireIntegrity},
                           {"integrity-alg", required_argument, nullptr, kIntegrityAlg},
                           {"device-memory-limit", required_argument, nullptr, kDevMemLimit},
                           {"guest-memory-limit", required_argument, nullptr, kGuestMemLimit},
                           {"mcast-groups", required_argument, nullptr, kMcastGroups},
                           {"mcast-qps", required_argument, nullptr, kMcastQps},
                           {"device", required_argument, nullptr, kDevice},
                           {"help", no_argument, nullptr, kHelp},
                           {nullptr, 0, nullptr, 0}};

const char* ArgName(int code) {
  for (const option* opt = kOptions; opt->name; opt++)
    if (opt->val == code) return opt->name;
  return "?";
}

// "qp=64,cq=128": per-device object limits.
bool DeviceMax(const char* s, vstellard::DaemonOptions::DeviceMax* m) {
  std::string all(s);
  for (size_t at = 0; at <= all.size();) {
    size_t end = all.find(',', at);
    if (end == std::string::npos) end = all.size();
    const std::string kv = all.substr(at, end - at);
    const size_t eq = kv.find('=');
    unsigned long long v;
    if (eq == std::string::npos || !Num(kv.c_str() + eq + 1, 0xffffffffull, &v) || v == 0) return false;
    const std::string k = kv.substr(0, eq);
    if (k == "ucontext") m->ucontext = uint32_t(v);
    else if (k == "pd") m->pd = uint32_t(v);
    else if (k == "qp") m->qp = uint32_t(v);
    else if (k == "cq") m->cq = uint32_t(v);
    else if (k == "mr") m->mr = uint32_t(v);
    else return false;
    at = end + 1;
  }
  return true;
}

// An address a device may hold: a host's own, so not unspecified, not a
// group, and not link-local (which names no host beyond one link).
bool DeviceAddress(const std::string& s, vstellar::IpAddr* a, std::string* why) {
  if (!vstellar::parse_ip(s, a)) return *why = "not an IPv4 or IPv6 address", false;
  if (a->unspecified() || a->is_multicast() || a->is_link_local())
    return *why = "not a unicast address a peer can reach", false;
  return true;
}

// "PATH,ip=A[,ip=B...]": a device socket and the addresses its devices may
// hold. An address belongs to one socket only.
bool DeviceSocket(const vstellard::DaemonOptions& o, const char* s, vstellard::DaemonOptions::DeviceSocket* d,
                  std::string* why) {
  std::string all(s);
  size_t comma = all.find(',');
  d->path = all.substr(0, comma);
  if (d->path.empty() || comma == std::string::npos) return *why = "expected PATH,ip=ADDR[,ip=ADDR...]", false;
  for (size_t at = comma + 1; at <= all.size();) {
    size_t end = all.find(',', at);
    if (end == std::string::npos) end = all.size();
    const std::string kv = all.substr(at, end - at);
    if (kv.rfind("ip=", 0) != 0) return *why = "'" + kv + "' is not ip=ADDR", false;
    vstellar::IpAddr a;
    if (!DeviceAddress(kv.substr(3), &a, why)) return *why = kv.substr(3) + ": " + *why, false;
    for (const auto& other : o.device_sockets)
      if (std::find(other.addresses.begin(), other.addresses.end(), a) != other.addresses.end())
        return *why = kv.substr(3) + " is already the address of " + other.path, false;
    if (std::find(d->addresses.begin(), d->addresses.end(), a) == d->addresses.end()) d->addresses.push_back(a);
    at = end + 1;
  }
  return true;
}

// Sets the option `code` from `arg` (the same for the command line and the
// config file); on a bad value says why in *why.
bool Apply(vstellard::DaemonOptions& o, int code, const char* arg, std::string* why) {
  unsigned long long v;
  auto num = [&](unsigned long long min, unsigned long long max) {
    if (Num(arg, max, &v) && v >= min) return true;
    *why = "not a number in " + std::to_string(min) + ".." + std::to_string(max);
    return false;
  };
  auto size = [&]() {
    if (Size(arg, &v)) return true;
    *why = "not a size (a positive number with an optional K, M or G)";
    return false;
  };
  switch (code) {
    case kSocket: o.socket = arg; return true;
    case kDevice: {
      vstellard::DaemonOptions::DeviceSocket d;
      if (!DeviceSocket(o, arg, &d, why)) return false;
      o.device_sockets.push_back(std::move(d));
      return true;
    }
    case kPin:
      if (!std::strcmp(arg, "lazy")) o.pin = vstellard::PinMode::kLazy;
      else if (!std::strcmp(arg, "eager")) o.pin = vstellard::PinMode::kEager;
      else return *why = "not lazy or eager", false;
      return true;
    case kTrans:
      if (!std::strcmp(arg, "emtt")) o.translation = vstellard::TranslationMode::kEmtt;
      else if (!std::strcmp(arg, "atc")) o.translation = vstellard::TranslationMode::kAtc;
      else return *why = "not emtt or atc", false;
      return true;
    case kAtcEntries: if (!num(1, 1ull << 26)) return false; o.atc_entries = v; return true;
    case kAtcMiss: if (!num(0, 1000000)) return false; o.atc_miss_ns = v; return true;
    case kOdpTimeout: if (!num(1, 600000)) return false; o.odp_fault_timeout_ms = v; return true;
    case kIp: return DeviceAddress(arg, &o.ip, why);
    case kPort: if (!num(0, 65535)) return false; o.udp_port = uint16_t(v); return true;
    case kPeerPort: if (!num(0, 65535)) return false; o.peer_port = uint16_t(v); return true;
    case kPaths: if (!num(1, 256)) return false; o.paths = uint16_t(v); return true;
    case kLink:
      if (!vstellar::parse_link_mode(arg, o.link_mode)) return *why = "not gso or plain", false;
      return true;
    case kPathBurst: if (!num(1, 64)) return false; o.path_burst = uint16_t(v); return true;
    case kZerocopy: o.zerocopy = true; return true;
    case kLocateFaults: o.locate_faults = true; return true;
    case kRocePeers: {
      std::string list = arg;
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        vstellar::IpPrefix p;
        if (!vstellar::parse_prefix(list.substr(at, comma - at), &p))
          return *why = "not a subnet (ADDR/LEN, IPv4 or IPv6)", false;
        o.roce_peers.push_back(p);
        at = comma + 1;
      }
      return true;
    }
    case kDeviceMax:
      if (!DeviceMax(arg, &o.device_max)) return *why = "not K=N[,K=N...] with K ucontext, pd, qp, cq or mr", false;
      return true;
    case kThreads:
      if (!num(1, vstellard::DaemonOptions::kMaxThreads)) return false;
      o.threads = unsigned(v);
      return true;
    case kPlacement:
      if (std::string(arg) == "peers") o.place_by_peers = true;
      else if (std::string(arg) == "fixed") o.place_by_peers = false;
      else return *why = "not peers or fixed", false;
      return true;
    case kStats: o.stats_json = arg; return true;
    case kPollUs: if (!num(0, 1000000)) return false; o.poll_us = v; return true;
    case kNice: {
      char* end = nullptr;
      errno = 0;
      const long n = std::strtol(arg, &end, 10);
      if (errno || end == arg || *end || n < -20 || n > 19) return *why = "not a number in -20..19", false;
      o.nice = int(n);
      return true;
    }
    case kIdleRecheckUs: if (!num(1, 10000000)) return false; o.idle_recheck_us = v; return true;
    case kControlBudget:
      if (!num(1, 1u << 20)) return false;
      o.control_budget = uint32_t(v);
      return true;
    case kWqeBudget: if (!num(1, 1u << 20)) return false; o.wqe_budget_queue = uint32_t(v); return true;
    case kWqeBudgetDevice:
      if (!num(1, 1u << 24)) return false;
      o.wqe_budget_device = uint32_t(v);
      return true;
    case kVhostTimeout:
      if (!num(1, 3'600'000)) return false;
      o.vhost_timeout_ms = uint32_t(v);
      return true;
    case kAllowUnsealed: o.require_sealed_memory = false; return true;
    case kIntegrityKey:
      if (!vstellar::ReadIntegrityKey(arg, &o.integrity_key, why)) return false;
      o.integrity = true;
      return true;
    case kRequireIntegrity: g_require_integrity = true; return true;
    case kIntegrityAlg: {
      using Alg = vstellar::EngineConfig::MacAlgorithm;
      const std::string name = arg;
      if (name != "chacha20-poly1305" && name != "aes-gmac") return *why = "not chacha20-poly1305 or aes-gmac", false;
      o.integrity_alg = name == "aes-gmac" ? Alg::AES_GMAC : Alg::CHACHA20_POLY1305;
      return true;
    }
    case kMemLimit: if (!size()) return false; o.memory_limit = v; return true;
    case kDevMemLimit: if (!size()) return false; o.device_memory_limit = v; return true;
    case kGuestMemLimit: if (!size()) return false; o.guest_memory_limit = v; return true;
    // At most what the engine itself keeps (DeviceLimits): a device reports
    // these in its config space, so they must be true.
    case kMcastGroups:
      if (!num(1, vstellar::DeviceLimits::kMaxMcastGroups)) return false;
      o.mcast_groups_per_device = uint32_t(v);
      return true;
    case kMcastQps:
      if (!num(1, vstellar::DeviceLimits::kMaxMcastQpAttach)) return false;
      o.mcast_qps_per_group = uint32_t(v);
      return true;
  }
  *why = "not an option";
  return false;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// A config file: one `option = value` per line, the long options without
// their dashes (`allow-unsealed-memory = yes` for the one flag), `#` starts
// a comment. On an error *why is "FILE:LINE: what is wrong".
bool ApplyConfig(vstellard::DaemonOptions& o, const char* path, std::string* why) {
  FILE* f = std::fopen(path, "re");
  if (!f) return *why = std::string(path) + ": " + std::strerror(errno), false;
  char* buf = nullptr;
  size_t cap = 0;
  bool ok = true;
  for (unsigned line = 1; ok && getline(&buf, &cap, f) > 0; line++) {
    std::string text(buf);
    text = Trim(text.substr(0, text.find('#')));
    if (text.empty()) continue;
    std::string where = std::string(path) + ":" + std::to_string(line) + ": ";
    size_t eq = text.find('=');
    std::string key = Trim(text.substr(0, eq)), value = eq == std::string::npos ? "" : Trim(text.substr(eq + 1));
    const option* opt = kOptions;
    while (opt->name && key != opt->name) opt++;
    std::string err;
    if (eq == std::string::npos) {
      *why = where + "expected `option = value`";
      ok = false;
    } else if (!opt->name || opt->val == kConfig || opt->val == kHelp) {
      *why = where + "unknown option '" + key + "'";
      ok = false;
    } else if (opt->has_arg == no_argument && value != "yes" && value != "no") {
      *why = where + key + " = " + value + ": not yes or no";
      ok = false;
    } else if (opt->has_arg == no_argument && value == "no") {
      continue;
    } else if (value.empty() && opt->has_arg != no_argument) {
      *why = where + key + ": no value";
      ok = false;
    } else if (!Apply(o, opt->val, value.c_str(), &err)) {
      *why = where + key + " = " + value + ": " + err;
      ok = false;
    }
  }
  std::free(buf);
  std::fclose(f);
  return ok;
}

// The engine is this host's NIC: its peers' retry clocks run while it
// waits for a core. At the priority of the guests' vCPUs, on a host whose
// cores they keep busy, it waited up to 0.65 s (two TCG guests and a
// migration on 2 cores), longer than perftest's QPs wait for an ACK
// (8 x 67 ms), and they failed. So it asks for a larger share: for its
// threads (set before any starts; they inherit it) and for its autogroup,
// the unit the kernel shares CPU between when processes run in sessions
// of their own. It polls only --poll-us after work, so the share is used
// only when there is work. Without CAP_SYS_NICE it runs at 0, and says so.
void SetNice(int nice) {
  if (nice == 0) return;
  if (setpriority(PRIO_PROCESS, 0, nice) != 0) {
    std::fprintf(stderr,
                 "vstellard: --nice %d: %s; running at the normal priority (on a loaded host its peers' QPs "
                 "may time out waiting for it)\n",
                 nice, std::strerror(errno));
    return;
  }
  // Its autogroup only when it leads its session (a daemon started on its
  // own), not a shell's that started it. (No autogroup file without
  // CONFIG_SCHED_AUTOGROUP; under systemd the unit's CPUWeight= does this.)
  if (getsid(0) != getpid()) return;
  if (FILE* f = std::fopen("/proc/self/autogroup", "w")) {
    std::fprintf(f, "%d", nice);
    std::fclose(f);
  }
}

}  // namespace

int main(int argc, char** argv) {
  vstellard::DaemonOptions o;
  std::string why;
  for (int c; (c = getopt_long(argc, argv, "s:h", kOptions, nullptr)) != -1;) {
    if (c == kHelp) return Usage(argv[0], 0);
    if (c == '?') return Usage(argv[0], 2);
    // Options apply in order: those after --config override the file's.
    if (c == kConfig ? !ApplyConfig(o, optarg, &why) : !Apply(o, c, optarg, &why)) {
      if (c == kConfig) std::fprintf(stderr, "vstellard: %s\n", why.c_str());
      else std::fprintf(stderr, "vstellard: --%s %s: %s\n", ArgName(c), optarg, why.c_str());
      return 2;
    }
  }
  if ((o.socket.empty() && o.device_sockets.empty()) || optind != argc) return Usage(argv[0], 2);
  if (!o.roce_peers.empty() && (o.threads > 1 || o.integrity)) {
    std::fprintf(stderr, "vstellard: --roce-peers: %s\n",
                 o.integrity ? "a RoCE v2 peer cannot seal its packets (integrity mode)"
                             : "needs --threads 1 (datagrams on port 4791 are not steered to workers)");
    return 2;
  }
  if (g_require_integrity && !o.integrity) {
    std::fprintf(stderr, "vstellard: --require-integrity: no --integrity-key configured\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  // A device holds about a dozen descriptors (its socket, two memfds, a
  // kick and a call eventfd per queue): take all the hard limit allows.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }

  SetNice(o.nice);

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
  std::string threads = o.threads > 1 ? ", threads=" + std::to_string(o.threads) : "";
  std::string sockets = o.socket;
  for (const auto& dev : o.device_sockets) sockets += (sockets.empty() ? "" : ", ") + dev.path;
  std::fprintf(stderr, "vstellard: listening on %s (pin=%s, translation=%s%s)\n", sockets.c_str(),
               vstellard::ToString(o.pin), vstellard::ToString(o.translation), threads.c_str());
  d.Run();
  g_daemon = nullptr;
  return 0;
}
