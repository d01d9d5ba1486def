// Integrity mode: see integrity.h.
#include "integrity.h"

#include <openssl/evp.h>
#include <openssl/modes.h>
#include <sodium.h>

#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "vstellar/integrity_key.h"

namespace vstellar {
namespace {

MacKey Derive(const MacKey& shared, const uint8_t* label, size_t n) {
  MacKey k;
  crypto_generichash(k.data(), k.size(), label, n, shared.data(), shared.size());
  return k;
}

void PutBe32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = uint8_t(v >> (24 - 8 * i));
}

// The tag of nonce || data (|| more spans) under the one-time key that
// ChaCha20 gives for this nonce.
class Tagger {
 public:
  Tagger(const MacKey& key, const uint8_t* nonce) {
    uint8_t otk[crypto_onetimeauth_poly1305_KEYBYTES];
    crypto_stream_chacha20_ietf(otk, sizeof(otk), nonce, key.data());
    crypto_onetimeauth_poly1305_init(&st_, otk);
    sodium_memzero(otk, sizeof(otk));
    Update(nonce, PacketMac::kNonceLen);
  }
  void Update(const uint8_t* p, size_t n) { crypto_onetimeauth_poly1305_update(&st_, p, n); }
  void Final(uint8_t* tag) { crypto_onetimeauth_poly1305_final(&st_, tag); }

 private:
  crypto_onetimeauth_poly1305_state st_;
};

// GMAC: AES-256-GCM's tag over the associated data, nothing encrypted; the
// tag covers the nonce too, as GCM's IV. The same tag whichever library
// computes it (the test checks it against libsodium's, which it was until
// OpenSSL's was measured faster: docs/threat-model.md). OpenSSL's GCM
// (CRYPTO_gcm128: GHASH with PCLMUL) over its AES-256 (an ECB context:
// AES-NI), both keyed once per key, so a packet costs one AES block for the
// IV and GHASH over its bytes; EVP's AES-256-GCM computes the same tag with
// about 120 ns more per packet (BM_MacLib/4 against /8). It takes the data
// in pieces: header and payload are hashed where they lie, not gathered
// first.
class Gmac {
 public:
  // The context keyed with `key`, from a small cache per thread (two ways
  // of 64 sets, the older way replaced): a packet of a key used a moment
  // ago (a QP's sending or receiving key) skips the key schedule. Null if
  // OpenSSL cannot give one.
  static Gmac* For(const MacKey& key);
  static bool Available() { return Cipher() != nullptr; }

  void Start(const uint8_t* nonce) { CRYPTO_gcm128_setiv(gcm_, nonce, PacketMac::kNonceLen); }
  bool Update(const uint8_t* p, size_t n) { return CRYPTO_gcm128_aad(gcm_, p, n) == 0; }
  void Final(uint8_t* tag) { CRYPTO_gcm128_tag(gcm_, tag, PacketMac::kTagLen); }

 private:
  friend struct GmacCache;
  static EVP_CIPHER* Cipher() {
    static EVP_CIPHER* const aes = EVP_CIPHER_fetch(nullptr, "AES-256-ECB", nullptr);
    return aes;
  }
  // GCM's block cipher: one block of AES-256 under the context's key.
  static void Block(const unsigned char in[16], unsigned char out[16], const void* aes) {
    int outl = 0;
    EVP_EncryptUpdate(static_cast<EVP_CIPHER_CTX*>(const_cast<void*>(aes)), out, &outl, in, 16);
  }
  bool Key(const MacKey& key) {
    if (!aes_) aes_ = EVP_CIPHER_CTX_new();
    EVP_CIPHER* cipher = Cipher();
    keyed_ = aes_ && cipher && EVP_EncryptInit_ex2(aes_, cipher, key.data(), nullptr, nullptr) == 1 &&
             EVP_CIPHER_CTX_set_padding(aes_, 0) == 1;
    if (keyed_ && gcm_) CRYPTO_gcm128_init(gcm_, aes_, Block);  // the new hash key
    else if (keyed_) gcm_ = CRYPTO_gcm128_new(aes_, Block);
    keyed_ = keyed_ && gcm_;
    key_ = key;
    return keyed_;
  }
  EVP_CIPHER_CTX* aes_ = nullptr;
  GCM128_CONTEXT* gcm_ = nullptr;
  bool keyed_ = false;
  uint64_t used_ = 0;
  MacKey key_{};
};

constexpr size_t kGmacSets = 64;
struct GmacCache {
  Gmac slot[kGmacSets][2];
  uint64_t clock = 0;
  ~GmacCache() {
    for (auto& set : slot)
      for (Gmac& g : set) {
        CRYPTO_gcm128_release(g.gcm_);  // both clear their keys
        EVP_CIPHER_CTX_free(g.aes_);
        sodium_memzero(g.key_.data(), g.key_.size());
      }
  }
};

Gmac* Gmac::For(const MacKey& key) {
  thread_local GmacCache cache;
  Gmac* set = cache.slot[key[0] % kGmacSets];  // keys are BLAKE2b outputs: a byte is a fair hash
  for (int w = 0; w < 2; w++)
    if (set[w].keyed_ && set[w].key_ == key) {
      set[w].used_ = ++cache.clock;
      return &set[w];
    }
  Gmac& g = set[set[0].used_ <= set[1].used_ ? 0 : 1];
  if (!g.Key(key)) return nullptr;
  g.used_ = ++cache.clock;
  return &g;
}

// The GMAC tag of the pieces, or false (and no tag) if OpenSSL failed.
bool GmacTag(const MacKey& key, const uint8_t* nonce, const uint8_t* hdr, size_t hdr_len, const HostSpan* payload,
             size_t nspans, uint8_t* tag) {
  Gmac* g = Gmac::For(key);
  if (!g) return false;
  g->Start(nonce);
  if (!g->Update(hdr, hdr_len)) return false;
  for (size_t i = 0; i < nspans; i++)
    if (!g->Update(payload[i].ptr, payload[i].len)) return false;
  g->Final(tag);
  return true;
}

}  // namespace

static_assert(PacketMac::kNonceLen == crypto_stream_chacha20_ietf_NONCEBYTES);
static_assert(PacketMac::kTagLen == crypto_onetimeauth_poly1305_BYTES);

bool PacketMac::Init() { return sodium_init() >= 0; }

bool PacketMac::Usable(MacAlgorithm alg) {
  if (!Init()) return false;
  switch (alg) {
    case MacAlgorithm::CHACHA20_POLY1305: return true;
    // Only with AES-NI and PCLMUL (as libsodium detects them): without,
    // AES and GHASH in software are slower than ChaCha20-Poly1305.
    case MacAlgorithm::AES_GMAC: return crypto_aead_aes256gcm_is_available() != 0 && Gmac::Available();
  }
  return false;
}

uint32_t PacketMac::RandomSalt() { return randombytes_random(); }

uint64_t PacketMac::FirstCounter() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

MacKey PacketMac::ConnectionKey(const MacKey& shared, uint32_t from_qpn, uint32_t to_qpn) {
  uint8_t label[28] = "vstellar-mac-rc-v1";  // 19 bytes with its NUL, then the QPNs
  PutBe32(label + 20, from_qpn);
  PutBe32(label + 24, to_qpn);
  return Derive(shared, label, sizeof(label));
}

MacKey PacketMac::DatagramKey(const MacKey& shared) {
  static const uint8_t label[] = "vstellar-mac-ud-v1";
  return Derive(shared, label, sizeof(label) - 1);
}

void PacketMac::Sign(MacSender& tx, const uint8_t* hdr, size_t hdr_len, const HostSpan* payload,
                     size_t nspans, uint8_t* out) const {
  PutBe32(out, salt_);
  const uint64_t c = tx.next++;
  for (int i = 0; i < 8; i++) out[4 + i] = uint8_t(c >> (56 - 8 * i));
  if (alg_ == MacAlgorithm::AES_GMAC) {
    // Should OpenSSL fail (it does not once Usable said yes), the tag is
    // zeros, which does not verify, not whatever the buffer held.
    if (!GmacTag(tx.key, out, hdr, hdr_len, payload, nspans, out + kNonceLen)) std::memset(out + kNonceLen, 0, kTagLen);
    return;
  }
  Tagger t(tx.key, out);
  t.Update(hdr, hdr_len);
  for (size_t i = 0; i < nspans; i++) t.Update(payload[i].ptr, payload[i].len);
  t.Final(out + kNonceLen);
}

uint32_t PacketMac::Salt(const uint8_t* prefix) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v = v << 8 | prefix[i];
  return v;
}

uint64_t PacketMac::Counter(const uint8_t* prefix) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | prefix[4 + i];
  return v;
}

bool PacketMac::Verify(MacAlgorithm alg, const MacKey& key, const uint8_t* pkt, size_t len) {
  if (len < kPrefixLen || AlgorithmOf(pkt) != alg) return false;
  if (alg == MacAlgorithm::AES_GMAC) {
    uint8_t tag[kTagLen];
    return GmacTag(key, pkt, pkt + kPrefixLen, len - kPrefixLen, nullptr, 0, tag) &&
           crypto_verify_16(tag, pkt + kNonceLen) == 0;
  }
  Tagger t(key, pkt);
  t.Update(pkt + kPrefixLen, len - kPrefixLen);
  uint8_t tag[kTagLen];
  t.Final(tag);
  return crypto_verify_16(tag, pkt + kNonceLen) == 0;
}

bool ReplayWindow::Admit(uint64_t c) {
  if (!any_ || c > top_) {
    // Slots the window slides over belong to counters not seen yet.
    const uint64_t from = any_ ? top_ + 1 : c;
    if (!any_ || c - from >= kBits) {
      std::memset(bits_, 0, sizeof(bits_));
    } else {
      for (uint64_t x = from; x < c; x++) set(x, false);
    }
    any_ = true;
    top_ = c;
    set(c, true);
    return true;
  }
  if (top_ - c >= kBits || bit(c)) return false;
  set(c, true);
  return true;
}

bool DatagramReplay::Admit(const IpAddr& ip, uint32_t qpn, uint32_t salt, uint64_t counter) {
  const Key k{ip, qpn, salt};
  auto it = by_key_.find(k);
  if (it == by_key_.end()) {
    if (lru_.size() >= kMaxSources) {
      by_key_.erase(lru_.back().key);
      lru_.pop_back();
    }
    lru_.push_front(Source{k, {}});
    it = by_key_.emplace(k, lru_.begin()).first;
  } else if (it->second != lru_.begin()) {
    lru_.splice(lru_.begin(), lru_, it->second);
  }
  return it->second->seen.Admit(counter);
}

bool ReadIntegrityKey(const std::string& path, std::array<uint8_t, 32>* key, std::string* err) {
  FILE* f = std::fopen(path.c_str(), "re");
  if (!f) {
    *err = path + ": " + std::strerror(errno);
    return false;
  }
  char text[80];
  const size_t n = std::fread(text, 1, sizeof(text), f);
  std::fclose(f);
  size_t len = n;
  while (len && (text[len - 1] == '\n' || text[len - 1] == '\r')) len--;
  size_t got = 0;
  if (len != 2 * key->size() ||
      sodium_hex2bin(key->data(), key->size(), text, len, nullptr, &got, nullptr) != 0 || got != key->size()) {
    *err = path + ": not a key of 64 hexadecimal digits";
    return false;
  }
  sodium_memzero(text, sizeof(text));
  return true;
}

}  // namespace vstellar
