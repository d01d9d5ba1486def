// The MAC libraries integrity mode could use, per byte, on one packet of
// 1 KiB or 4 KiB (64 KiB: the rate without the per-packet cost) that is only
// authenticated (associated data, nothing encrypted), one fresh nonce per
// packet: which one is behind PacketMac is chosen from these numbers
// (docs/threat-model.md, "Integrity's cost").
//
// BM_MacLib/<impl>/<bytes>, impl:
//   0 libsodium ChaCha20-Poly1305 (IETF AEAD, AD only)
//   1 libsodium ChaCha20 + Poly1305 as integrity mode's ChaCha construction
//     (one-time key from ChaCha20, Poly1305 over nonce || packet)
//   2 libsodium AES-256-GCM, AD only, key expanded per packet (as before)
//   3 libsodium AES-256-GCM, AD only, key expanded once (beforenm)
//   4 OpenSSL EVP AES-256-GCM, AAD only, context keyed once, IV per packet
//   5 OpenSSL EVP AES-256-GCM, AAD only, key set per packet
//   6 OpenSSL EVP ChaCha20-Poly1305, AAD only, context keyed once
//   7 OpenSSL Poly1305 (EVP_MAC) in integrity mode's ChaCha construction,
//     the one-time key from libsodium's ChaCha20
//   8 OpenSSL CRYPTO_gcm128 (GHASH) over an EVP AES-256-ECB context, both
//     keyed once (integrity mode's GMAC since it left libsodium)
#include <benchmark/benchmark.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/modes.h>
#include <sodium.h>

#include <cstdint>
#include <vector>

namespace {

struct Ctx {
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  ~Ctx() { EVP_CIPHER_CTX_free(c); }
};

// The tag of `ad` under a context already keyed with a 12-byte-IV AEAD.
void EvpTag(EVP_CIPHER_CTX* c, const uint8_t* key, const uint8_t* iv, const uint8_t* ad, size_t n,
            uint8_t* tag) {
  int outl = 0;
  EVP_EncryptInit_ex(c, nullptr, nullptr, key, iv);
  EVP_EncryptUpdate(c, nullptr, &outl, ad, int(n));
  uint8_t none[16];
  EVP_EncryptFinal_ex(c, none, &outl);
  EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, tag);
}

void AesBlock(const unsigned char in[16], unsigned char out[16], const void* aes) {
  int outl = 0;
  EVP_EncryptUpdate(static_cast<EVP_CIPHER_CTX*>(const_cast<void*>(aes)), out, &outl, in, 16);
}

void BM_MacLib(benchmark::State& st) {
  if (sodium_init() < 0) st.SkipWithError("libsodium");
  const int impl = int(st.range(0));
  const size_t n = size_t(st.range(1));
  if ((impl == 2 || impl == 3 || impl == 8) && !crypto_aead_aes256gcm_is_available())
    st.SkipWithError("no AES-NI/PCLMUL");
  std::vector<uint8_t> ad(n, 0x5a);
  uint8_t key[32], nonce[12] = {}, tag[16], empty[1] = {0};
  randombytes_buf(key, sizeof(key));
  uint64_t counter = 0;
  auto next_nonce = [&] {
    counter++;
    for (int i = 0; i < 8; i++) nonce[4 + i] = uint8_t(counter >> (8 * i));
  };
  unsigned long long tl = 0;
  Ctx ctx;
  crypto_aead_aes256gcm_state gcm;
  EVP_MAC* mac = nullptr;
  EVP_MAC_CTX* mctx = nullptr;
  GCM128_CONTEXT* gcm128 = nullptr;
  switch (impl) {
    case 3: crypto_aead_aes256gcm_beforenm(&gcm, key); break;
    case 4: EVP_EncryptInit_ex(ctx.c, EVP_aes_256_gcm(), nullptr, key, nullptr); break;
    case 5: EVP_EncryptInit_ex(ctx.c, EVP_aes_256_gcm(), nullptr, nullptr, nullptr); break;
    case 6: EVP_EncryptInit_ex(ctx.c, EVP_chacha20_poly1305(), nullptr, key, nullptr); break;
    case 7:
      mac = EVP_MAC_fetch(nullptr, "POLY1305", nullptr);
      mctx = EVP_MAC_CTX_new(mac);
      break;
    case 8:
      EVP_EncryptInit_ex2(ctx.c, EVP_aes_256_ecb(), key, nullptr, nullptr);
      gcm128 = CRYPTO_gcm128_new(ctx.c, AesBlock);
      break;
  }
  for (auto _ : st) {
    next_nonce();
    switch (impl) {
      case 0:
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(empty, tag, &tl, empty, 0, ad.data(), n, nullptr,
                                                           nonce, key);
        break;
      case 1:
      case 7: {
        uint8_t otk[32];
        crypto_stream_chacha20_ietf(otk, sizeof(otk), nonce, key);
        if (impl == 1) {
          crypto_onetimeauth_poly1305_state p;
          crypto_onetimeauth_poly1305_init(&p, otk);
          crypto_onetimeauth_poly1305_update(&p, nonce, sizeof(nonce));
          crypto_onetimeauth_poly1305_update(&p, ad.data(), n);
          crypto_onetimeauth_poly1305_final(&p, tag);
        } else {
          size_t outl = 0;
          EVP_MAC_init(mctx, otk, sizeof(otk), nullptr);
          EVP_MAC_update(mctx, nonce, sizeof(nonce));
          EVP_MAC_update(mctx, ad.data(), n);
          EVP_MAC_final(mctx, tag, &outl, sizeof(tag));
        }
        break;
      }
      case 2:
        crypto_aead_aes256gcm_encrypt_detached(empty, tag, &tl, empty, 0, ad.data(), n, nullptr, nonce, key);
        break;
      case 3:
        crypto_aead_aes256gcm_encrypt_detached_afternm(empty, tag, &tl, empty, 0, ad.data(), n, nullptr, nonce,
                                                       &gcm);
        break;
      case 4:
      case 6: EvpTag(ctx.c, nullptr, nonce, ad.data(), n, tag); break;
      case 5: EvpTag(ctx.c, key, nonce, ad.data(), n, tag); break;
      case 8:
        CRYPTO_gcm128_setiv(gcm128, nonce, sizeof(nonce));
        CRYPTO_gcm128_aad(gcm128, ad.data(), n);
        CRYPTO_gcm128_tag(gcm128, tag, sizeof(tag));
        break;
    }
    benchmark::DoNotOptimize(tag);
  }
  CRYPTO_gcm128_release(gcm128);
  EVP_MAC_CTX_free(mctx);
  EVP_MAC_free(mac);
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(n));
}

}  // namespace

BENCHMARK(BM_MacLib)->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7, 8}, {1024, 4096, 65536}});
