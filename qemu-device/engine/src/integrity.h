// Integrity mode (issue 13): a keyed MAC on every packet, so a host on the
// fabric that does not hold the daemons' shared key can neither forge nor
// alter a packet (an ACK that completes a WRITE never delivered, a NAK that
// kills a connection, a request into a guest's memory). Off by default;
// EngineConfig::integrity turns it on for the whole engine, and every peer
// must use the same key (docs/wire-format.md, "Integrity trailer").
//
// Built on libsodium, not by hand. Each connection direction has its own
// key, derived from the shared key and the two QPNs with keyed BLAKE2b
// (datagrams share one key). Each packet gets a fresh one-time Poly1305 key
// from ChaCha20 under that key and a 96-bit nonce (the sender's random
// 32-bit salt and 64-bit packet counter, never repeated), which is how
// ChaCha20-Poly1305 authenticates its associated data; the packet is not
// encrypted. The 28-byte trailer (nonce, tag) goes in front of the
// header, so the payload is MACed where it lies, with no copy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "vstellar/memory.h"

namespace vstellar {

using MacKey = std::array<uint8_t, 32>;

class PacketMac {
 public:
  static constexpr size_t kNonceLen = 12;
  static constexpr size_t kTagLen = 16;
  static constexpr size_t kTrailerLen = kNonceLen + kTagLen;

  // False if libsodium cannot start (no usable random source).
  static bool Init();
  static uint32_t RandomSalt();
  // The key of packets from QP `from_qpn` to QP `to_qpn` (RC), or of
  // datagrams (UD, GSI).
  static MacKey ConnectionKey(const MacKey& shared, uint32_t from_qpn, uint32_t to_qpn);
  static MacKey DatagramKey(const MacKey& shared);

  explicit PacketMac(uint32_t salt) : salt_(salt) {}
  // Writes the trailer for header + payload into out[0, kTrailerLen).
  void Sign(const MacKey& key, const uint8_t* hdr, size_t hdr_len, const HostSpan* payload, size_t nspans,
            uint8_t* out);
  // Whether trailer (at the front of pkt) authenticates pkt[kTrailerLen, len).
  static bool Verify(const MacKey& key, const uint8_t* pkt, size_t len);

 private:
  uint32_t salt_;
  uint64_t counter_ = 0;
};

}  // namespace vstellar
