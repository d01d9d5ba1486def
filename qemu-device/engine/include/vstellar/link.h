// What the engine needs from the outside world: a clock and a datagram link.
// The engine itself never blocks and never does I/O; UdpLink (io_uring) and
// SimNet (virtual time, for tests) implement these.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "vstellar/memory.h"
#include "vstellar/types.h"

namespace vstellar {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint64_t now_ns() = 0;
};

class SteadyClock final : public Clock {
 public:
  uint64_t now_ns() override {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
  }
};

class Link {
 public:
  virtual ~Link() = default;
  // Queue one datagram from path `path` (source port base+path) and address
  // `src` to `dst`. An unspecified src is the link's own address (a link
  // serving several addresses then lets the route choose). The header bytes
  // are copied now; the payload spans must stay valid until the next
  // flush() returns (they point into MR memory: no copy on send).
  virtual void send(uint16_t path, const IpAddr& src, const Endpoint& dst, const uint8_t* hdr,
                    size_t hdr_len, const HostSpan* payload, size_t nspans) = 0;
  // The same with `trailer` after the payload (the pad and ICRC of a RoCE
  // v2 packet), copied now as the header is. The default hands the
  // trailer on as one more payload span, which is right for a link that
  // copies the datagram within send(); a link that keeps the spans until
  // flush() must override it.
  virtual void send_trailed(uint16_t path, const IpAddr& src, const Endpoint& dst, const uint8_t* hdr,
                            size_t hdr_len, const HostSpan* payload, size_t nspans, const uint8_t* trailer,
                            size_t trailer_len);
  // Hand everything queued to the network.
  virtual void flush() = 0;
  // Receive (join) or stop receiving (leave) datagrams sent to multicast
  // group `group` (IPv4 or IPv6). The engine joins a group once,
  // when its first QP attaches, and leaves it with the last. False if the
  // link cannot (then attaching fails).
  virtual bool join_group(const IpAddr& group, bool join) {
    (void)group;
    (void)join;
    return false;
  }
};

}  // namespace vstellar
