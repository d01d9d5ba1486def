// Integrity mode: a keyed MAC on every packet, so a host on the
// fabric that does not hold the daemons' shared key can neither forge nor
// alter a packet (an ACK that completes a WRITE never delivered, a NAK that
// kills a connection, a request into a guest's memory). Off by default;
// EngineConfig::integrity turns it on for the whole engine, and every peer
// must use the same key (docs/wire-format.md, "Integrity prefix").
//
// Built on libsodium and OpenSSL, not by hand. Each connection direction
// has its own key, derived from the shared key and the two QPNs with keyed
// BLAKE2b (datagrams share one key). Each packet gets a fresh one-time
// Poly1305 key from ChaCha20 under that key and a 96-bit nonce (the sending
// engine's random 32-bit salt and a 64-bit counter), which is how
// ChaCha20-Poly1305 authenticates its associated data; the packet is not
// encrypted. The
// 28-byte prefix (nonce, tag) goes in front of the header, so the payload
// is MACed where it lies, with no copy.
//
// EngineConfig::integrity_alg can choose GMAC instead (AES-256-GCM with the
// whole packet as associated data and nothing encrypted: the tag is
// GHASH's, under a hash key and mask from AES), offered only where the CPU
// has AES-NI and PCLMUL. OpenSSL's GCM and AES compute it (about twice as
// fast per packet as libsodium's AES-256-GCM, and they take the header and
// the payload in pieces, so neither is copied); each thread keeps the
// contexts of the keys it used last, keyed once. The nonce's first byte names the
// algorithm, so a receiver that uses the other one drops the packet and
// says why (EngineStats::wrong_mac_alg) instead of counting a bad MAC; the
// salt is the random other 24 bits.
//
// Replay: a MAC alone lets anyone who captured a packet send
// it again, a READ request or a datagram included. So the counter belongs
// to the key it is used with (one per connection direction, one per
// engine for datagrams) and only grows, and the receiver keeps the
// counters it saw in a sliding window (ReplayWindow, the scheme of IPsec's
// anti-replay, RFC 4303 3.4.3): a counter seen before, or older than the
// window, is dropped. Counters start at the wall clock's nanoseconds, so
// a QP or engine made later, even with a key an earlier one used (the same
// QPN pair), neither repeats a nonce nor looks older to its peer's window.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <unordered_map>

#include "vstellar/engine.h"
#include "vstellar/memory.h"
#include "vstellar/wire.h"

namespace vstellar {

using MacKey = std::array<uint8_t, 32>;
using MacAlgorithm = EngineConfig::MacAlgorithm;

// The sending side of one key: the key and the counter its next packet
// gets. The counter is never reset, also when the QP is reset and
// connected again.
struct MacSender {
  MacKey key{};
  uint64_t next = 0;
};

class PacketMac {
 public:
  static constexpr size_t kNonceLen = 12;
  static constexpr size_t kTagLen = 16;
  static constexpr size_t kPrefixLen = kNonceLen + kTagLen;
  static_assert(kPrefixLen == wire::kIntegrityPrefixLen);

  // False if libsodium cannot start (no usable random source).
  static bool Init();
  // Whether this CPU (and libsodium) can run `alg`; calls Init.
  static bool Usable(MacAlgorithm alg);
  static uint32_t RandomSalt();
  // Where a new key's counter starts: nanoseconds of the wall clock (one
  // engine sends far fewer than one packet per nanosecond).
  static uint64_t FirstCounter();
  // The key of packets from QP `from_qpn` to QP `to_qpn` (RC), or of
  // datagrams (UD, GSI).
  static MacKey ConnectionKey(const MacKey& shared, uint32_t from_qpn, uint32_t to_qpn);
  static MacKey DatagramKey(const MacKey& shared);

  // Signs with `alg`; the salt's low 24 bits are used.
  PacketMac(MacAlgorithm alg, uint32_t salt) : alg_(alg), salt_(uint32_t(alg) << 24 | (salt & 0xffffff)) {}
  // Writes the prefix for header + payload into out[0, kPrefixLen), with
  // the sender's next counter (which it advances).
  void Sign(MacSender& tx, const uint8_t* hdr, size_t hdr_len, const HostSpan* payload, size_t nspans,
            uint8_t* out) const;
  // Whether the prefix (at the front of pkt) authenticates pkt[kPrefixLen, len).
  // False too if the prefix names another algorithm than `alg`.
  static bool Verify(MacAlgorithm alg, const MacKey& key, const uint8_t* pkt, size_t len);
  // The nonce's parts, from a prefix: the algorithm (its first byte), the
  // salt (its first 4 bytes, algorithm included) and the counter.
  static MacAlgorithm AlgorithmOf(const uint8_t* prefix) { return MacAlgorithm(prefix[0]); }
  static uint32_t Salt(const uint8_t* prefix);
  static uint64_t Counter(const uint8_t* prefix);

 private:
  MacAlgorithm alg_;
  uint32_t salt_;
};

// The counters of one sender seen so far: the highest, and which of the
// kBits below it. Fed only packets whose MAC verified, so a forger cannot
// move it.
class ReplayWindow {
 public:
  friend class EngineCore;  // save and restore (save_restore.cc)
  static constexpr uint64_t kBits = 1024;
  // Whether counter `c` is new, and if so, it is seen from now on.
  bool Admit(uint64_t c);

 private:
  bool bit(uint64_t c) const { return (bits_[(c % kBits) / 64] >> (c % 64)) & 1; }
  void set(uint64_t c, bool v) {
    uint64_t& w = bits_[(c % kBits) / 64];
    if (v) w |= 1ull << (c % 64);
    else w &= ~(1ull << (c % 64));
  }
  bool any_ = false;
  uint64_t top_ = 0;
  uint64_t bits_[kBits / 64] = {};
};

// One window per datagram sender: its address, QPN and the salt of its
// engine (several engines of one daemon send from the same address, and
// QP 1 is every daemon's). A bounded table; the sender heard from least
// recently leaves first.
class DatagramReplay {
 public:
  static constexpr size_t kMaxSources = 1024;
  bool Admit(const IpAddr& ip, uint32_t qpn, uint32_t salt, uint64_t counter);
  size_t sources() const { return lru_.size(); }

 private:
  struct Key {
    IpAddr ip;
    uint32_t qpn, salt;
    bool operator==(const Key& o) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      uint64_t lo, hi;
      std::memcpy(&hi, k.ip.b.data(), 8);
      std::memcpy(&lo, k.ip.b.data() + 8, 8);
      return std::hash<uint64_t>()((lo ^ hi * 0xff51afd7ed558ccdull) ^ uint64_t(k.qpn) << 32 ^
                                   uint64_t(k.salt) * 0x9e3779b97f4a7c15ull);
    }
  };
  struct Source {
    Key key;
    ReplayWindow seen;
  };
  std::list<Source> lru_;  // most recently heard first
  std::unordered_map<Key, std::list<Source>::iterator, KeyHash> by_key_;
};

}  // namespace vstellar
