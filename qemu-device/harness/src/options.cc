#include <arpa/inet.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <vstellar/integrity_key.h>
#include <vstellar/ip_text.h>

#include "vstellar/harness/harness.h"

namespace vstellar::harness {

const char* usage() {
  return R"(NAME
    vstellar-harness - drive the vStellar RNIC engine between two processes

SYNOPSIS
    vstellar-harness [--role pair|server|client] [OPTIONS]

DESCRIPTION
    Runs one vStellar engine over UDP tunnels (io_uring, one socket per path)
    with ordinary process memory as "guest memory". A server and a client
    exchange QP numbers, PSNs, buffer addresses and rkeys over a TCP control
    connection, move their RC QPs to RTS and run a workload. Each process
    prints one JSON object on stdout. With --role pair (the default) the
    program forks a server child and runs the client itself, both on the
    local addresses, and prints {"client": {...}, "server": {...}}.

    The engine never busy-polls: when idle it blocks in io_uring until a
    datagram arrives or the next retransmission deadline.

ROLES
    --role server     listen on --local-ip:--ctrl-port, accept one client
    --role client     connect to --peer-ip:--ctrl-port
    --role pair       fork a server, run the client (loopback by default)

NETWORK
    --local-ip A      local IPv4 or IPv6 address for UDP and control (127.0.0.1)
    --peer-ip B       the peer's IPv4 or IPv6 address (127.0.0.1)
    --base-port P     first local UDP port; path i is source port P+i; the
                      engine receives on P (server 47000, client 47300)
    --peer-port Q     the peer's base port (default: the other role's)
                      With --role pair, --base-port is the server's base port
                      and the client uses base port + 300.
    --ctrl-port C     TCP control port on the server (46999)

TRANSPORT
    --link M          UDP link mode: gso (segmentation and receive
                      offloads, UDP_SEGMENT/UDP_GRO; default) or plain (one
                      sendmsg and one receive per datagram); they interoperate
    --zerocopy        gso mode: zero-copy sends (io_uring SENDMSG_ZC) of
                      32 KiB and more
    --paths N         paths per connection, 1..256 (128)
    --path-burst N    obs/rr: packets a path carries before the next pick,
                      so the link can segment runs (1..64; 16)
    --path-algo A     obs (oblivious random spraying, default), rr, dwrr,
                      bestrtt, single, reps (reuse paths that delivered
                      without congestion)
    --single-path K   path used by --path-algo single (0)
    --mtu B           payload bytes per packet, 256..16384 (4096)
    --rto-us U        minimum retransmission timeout in us (250)
    --window N        PSN window per QP, a power of two (4096)
    --cwnd-init B, --cwnd-max B
                      congestion window start and cap in bytes (256 KiB, 4 MiB)
    --target-delay-us U
                      RTT above which the window shrinks (1000)
    --no-cc           disable congestion control (window only)
    --integrity-key F integrity mode: a MAC on every packet, key in file F
                      (64 hex digits; both sides need the same)
    --integrity-alg A chacha20-poly1305 (default) or aes-gmac (AES-NI and
                      PCLMUL); both sides need the same

WORKLOAD (client side; the server follows the client's choice)
    --mode M          bw: keep --depth WRs outstanding per QP for --duration
                      seconds and report goodput and message rate per
                      interval; lat: SEND ping-pong, report one-way latency
                      (RTT/2) median, p99; raw: raw UDP datagrams with the
                      same sockets and io_uring batching, no engine (the
                      throughput ceiling; the server reports what arrived)
    --op O            write, send or read (write)
    --size BYTES      message size, suffixes K, M allowed (64K)
    --qps N           connections (RC QP pairs) (1)
    --depth D         outstanding WRs per QP (16)
    --duration S      seconds to run (2)
    --warmup S        seconds at the start left out of the totals (0.2)
    --interval-ms M   goodput reporting interval (100)
    --stall-ms M      a gap this long without a completion while WRs are
                      outstanding, after warm-up, is a stall: exit status 4
                      (1000)

IMPAIRMENT (emulated on receive, before the engine)
    --loss-rate R     drop probability on the lossy link (0)
    --loss-links L    number of emulated uplinks paths hash onto (60)
    --loss-link K     the lossy link (default: the link path 0 maps to, so a
                      single-path connection crosses it)

FAULT LOCALIZATION (docs/fabric.md, "Failure localization")
    --locate-faults   learn each path's route with TTL-limited probes on the
                      path's own ports (raw sockets: needs CAP_NET_RAW; IPv4)
                      and name the fabric link that breaks, from the
                      engine's per-path losses and RTTs. Each fault found
                      and cleared is a line on stderr ("fault found: link
                      A -> B, black_hole, ..."); the JSON gains telemetry
                      {faults, history, routes_known, probes_sent, ...}.

OUTPUT
    --no-path-detail  leave per-path counters out of the JSON
    -h, --help        this text

JSON
    goodput_gbps, msg_rate_mps, bytes, messages, intervals[{t_ms, gbps}],
    posted and completed (WRs; equal when nothing was left behind),
    latency {median_us, p99_us, avg_us, samples} (lat mode),
    engine {tx_pkts, rx_pkts, retx_pkts, timeouts, acks_sent, naks_sent, ...,
    paths [[tx_pkts, tx_bytes, retx_pkts, timeouts, rx_pkts], ...]},
    link {tx, rx, tx_err, rx_nobufs, submits, waits, tx_sends, rx_bufs,
    tx_zc, tx_zc_copied, gso_fallbacks}, emu_dropped,
    cpu_s and wall_s (CPU seconds the process used over the run: the engine
    is one thread, so cpu_s/wall_s is its share of one core).

EXIT STATUS
    0 success; 1 setup failure (ports, control connection, handshake);
    2 bad command line; 3 some work request completed with an error;
    4 the engine stalled: after warm-up, --stall-ms passed with WRs
    outstanding and none completed, or posted != completed at the end
    (JSON: stalls, longest_gap_ms).

EXAMPLES
    vstellar-harness --op write --size 64K --duration 2
    vstellar-harness --mode lat --size 64
    vstellar-harness --loss-rate 0.01 --paths 128 --op write --size 1M
    ip netns exec h1 vstellar-harness --role server --local-ip 10.0.1.1 \
        --peer-ip 10.0.2.1 &
    ip netns exec h2 vstellar-harness --role client --local-ip 10.0.2.1 \
        --peer-ip 10.0.1.1 --qps 16 --duration 30 --interval-ms 50
)";
}

namespace {


bool parse_size(const char* s, uint64_t& out) {
  char* end;
  double v = strtod(s, &end);
  if (end == s || v < 0) return false;
  if (*end == 'K' || *end == 'k') v *= 1024, end++;
  else if (*end == 'M' || *end == 'm') v *= 1024 * 1024, end++;
  else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024, end++;
  if (*end == 'i' || *end == 'B') end++;
  if (*end == 'B') end++;
  if (*end) return false;
  out = uint64_t(v);
  return true;
}

}  // namespace

bool parse_args(int argc, char** argv, Options& o, int& code) {
  code = 2;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      fputs(usage(), stdout);
      code = 0;
      return false;
    }
    if (a == "--no-cc") { o.eng.cc.enabled = false; continue; }
    if (a == "--no-path-detail") { o.path_detail = false; continue; }
    if (a == "--zerocopy") { o.zerocopy = true; continue; }
    if (a == "--locate-faults") { o.locate_faults = true; continue; }
    if (i + 1 >= argc) {
      fprintf(stderr, "vstellar-harness: %s needs a value (see --help)\n", a.c_str());
      return false;
    }
    const char* v = argv[++i];
    uint64_t n = 0;
    bool ok = true;
    auto num = [&](uint64_t lo, uint64_t hi) {
      ok = parse_size(v, n) && n >= lo && n <= hi;
      return n;
    };
    if (a == "--role") { o.role = v; ok = o.role == "server" || o.role == "client" || o.role == "pair"; }
    else if (a == "--mode") { o.mode = v; ok = o.mode == "bw" || o.mode == "lat" || o.mode == "raw"; }
    else if (a == "--op") { o.op = v; ok = o.op == "write" || o.op == "send" || o.op == "read"; }
    else if (a == "--local-ip") ok = vstellar::parse_ip(v, &o.local_ip);
    else if (a == "--integrity-key") {
      std::string err;
      ok = vstellar::ReadIntegrityKey(v, &o.eng.integrity_key, &err);
      if (!ok) fprintf(stderr, "vstellar-harness: --integrity-key %s\n", err.c_str());
      o.eng.integrity = ok;
    }
    else if (a == "--integrity-alg") {
      using Alg = vstellar::EngineConfig::MacAlgorithm;
      const std::string name = v;
      ok = name == "chacha20-poly1305" || name == "aes-gmac";
      o.eng.integrity_alg = name == "aes-gmac" ? Alg::AES_GMAC : Alg::CHACHA20_POLY1305;
    }
    else if (a == "--peer-ip") ok = vstellar::parse_ip(v, &o.peer_ip);
    else if (a == "--base-port") o.base_port = uint16_t(num(1, 65535 - 600));
    else if (a == "--peer-port") o.peer_port = uint16_t(num(1, 65535));
    else if (a == "--ctrl-port") o.ctrl_port = uint16_t(num(1, 65535));
    else if (a == "--paths") o.eng.num_paths = uint16_t(num(1, 256));
    else if (a == "--path-burst") o.eng.path_burst = uint16_t(num(1, 64));
    else if (a == "--link") ok = parse_link_mode(v, o.link_mode);
    else if (a == "--path-algo") ok = parse_path_algo(v, o.eng.path_algo);
    else if (a == "--single-path") o.eng.single_path = uint16_t(num(0, 255));
    else if (a == "--mtu") o.eng.mtu = uint32_t(num(256, 16384));
    else if (a == "--rto-us") o.eng.rto_ns = num(1, 10'000'000) * 1000;
    else if (a == "--window") o.eng.window_pkts = uint32_t(num(64, 1 << 20));
    else if (a == "--cwnd-init") o.eng.cc.init_cwnd = num(1024, 1ull << 32);
    else if (a == "--cwnd-max") o.eng.cc.max_cwnd = num(1024, 1ull << 32);
    else if (a == "--target-delay-us") o.eng.cc.target_delay_ns = num(1, 100'000'000) * 1000;
    else if (a == "--size") o.size = num(0, 1ull << 31);
    else if (a == "--qps") o.qps = uint32_t(num(1, 4096));
    else if (a == "--depth") o.depth = uint32_t(num(1, 4096));
    else if (a == "--duration") { o.duration = atof(v); ok = o.duration > 0; }
    else if (a == "--warmup") { o.warmup = atof(v); ok = o.warmup >= 0; }
    else if (a == "--interval-ms") o.interval_ms = uint32_t(num(1, 100000));
    else if (a == "--stall-ms") o.stall_ms = uint32_t(num(1, 3600000));
    else if (a == "--loss-rate") { o.loss_rate = atof(v); ok = o.loss_rate >= 0 && o.loss_rate <= 1; }
    else if (a == "--loss-links") o.loss_links = uint32_t(num(1, 65536));
    else if (a == "--loss-link") o.loss_link = int(num(0, 65535));
    else {
      fprintf(stderr, "vstellar-harness: unknown option %s (see --help)\n", a.c_str());
      return false;
    }
    if (!ok) {
      fprintf(stderr, "vstellar-harness: bad value '%s' for %s\n", v, a.c_str());
      return false;
    }
  }
  if (o.eng.single_path >= o.eng.num_paths) o.eng.single_path = 0;
  if (!o.eng.validate()) {
    fprintf(stderr, "vstellar-harness: inconsistent transport options\n");
    return false;
  }
  if (o.mode == "lat" && o.op == "read") o.op = "send";
  code = 0;
  return true;
}

}  // namespace vstellar::harness
