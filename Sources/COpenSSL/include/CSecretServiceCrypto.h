/*
 * CSecretServiceCrypto (in the COpenSSL target): the thin C wall between CofferSecretServiceCrypto
 * and OpenSSL 3 libcrypto for the Secret Service's transport encryption,
 * `dh-ietf1024-sha256-aes128-cbc-pkcs7`: Diffie-Hellman
 * over RFC 2409's Second Oakley Group (1024-bit MODP, generator 2), HKDF-SHA256 and AES-128-CBC with
 * PKCS#7 padding. Plain C, byte buffers in and out; no D-Bus, no session state. Only
 * CofferSecretServiceCrypto calls it (COpenSSL.h has the wall's rule).
 *
 * Numbers are big-endian and unsigned. Private values and shared secrets are written only into
 * caller-provided buffers (the Swift module passes secure memory); every OpenSSL object holding
 * them is freed with the clearing functions before a call returns, and OpenSSL's error queue is
 * emptied on every failure.
 */
#ifndef CSECRETSERVICECRYPTO_H
#define CSECRETSERVICECRYPTO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Results. */
#define CSS_OK 0
/** A caller error: a buffer of the wrong size, a NULL pointer. */
#define CSS_ERR_ARGUMENT 1
/** The peer's public value is not one of the group: empty, longer than the prime, ≤ 1, ≥ p − 1, or outside the order-q subgroup. */
#define CSS_ERR_BAD_PUBLIC 2
/** OpenSSL failed (out of memory, key generation failed). */
#define CSS_ERR_CRYPTO 3
/** Decryption found no valid PKCS#7 padding (wrong key, IV or ciphertext). */
#define CSS_ERR_PADDING 4

/** The size of the group's prime, private values, public values and the shared secret: 128 bytes. */
#define CSS_DH_BYTES 128
/**
 * The length of a private value css_dh_generate draws: 256 bits, top bit set. RFC 3526 §8 and
 * RFC 7919 §5.2 ask for at least twice the group's security strength (about 80 bits for this
 * 1,024-bit group; 2 × 112 for 2,048 bits); the best known attack on a short exponent (Pollard's
 * lambda) costs 2^128 here, more than the group's own discrete logarithm. A full-length exponent
 * would make each agreement four times slower for nothing.
 */
#define CSS_DH_PRIVATE_BITS 256
/** AES-128's key size. */
#define CSS_AES_KEY_BYTES 16
/** AES's block size, which is also the IV's size. */
#define CSS_AES_BLOCK_BYTES 16

/** A byte string: `len` bytes at `ptr`. */
typedef struct {
    const uint8_t *ptr;
    size_t len;
} css_bytes;

/** The group's prime p (RFC 2409 §6.2, from OpenSSL's BN_get_rfc2409_prime_1024), 128 bytes into `out`. */
int css_dh_prime(uint8_t *out, size_t out_len);

/** A new key pair of the group: x (CSS_DH_PRIVATE_BITS bits) into `priv`, g^x mod p into `pub`, each left-padded to 128 bytes. */
int css_dh_generate(uint8_t *priv, size_t priv_len, uint8_t *pub, size_t pub_len);

/** g^x mod p for the private value `priv` (1 to 128 bytes, 0 < x < p − 1), left-padded to 128 bytes into `pub`. */
int css_dh_public(css_bytes priv, uint8_t *pub, size_t pub_len);

/** CSS_OK if `peer` (1 to 128 bytes) is a public value of the group (OpenSSL's EVP_PKEY_public_check for the range, the Legendre symbol for the order-q subgroup), CSS_ERR_BAD_PUBLIC if not. */
int css_dh_check_public(css_bytes peer);

/**
 * The shared secret peer^x mod p for our private value `priv` and the peer's public value `peer`,
 * left-padded to 128 bytes into `out` (EVP_PKEY_derive with padding on). The peer is checked first.
 */
int css_dh_shared_secret(css_bytes priv, css_bytes peer, uint8_t *out, size_t out_len);

/**
 * css_dh_shared_secret with our public value `pub` (128 bytes: what css_dh_generate gave with
 * `priv`) given instead of computed again; only x's range is checked, not that `pub` is g^x.
 */
int css_dh_shared_secret_pair(css_bytes priv, css_bytes pub, css_bytes peer, uint8_t *out, size_t out_len);

/** HKDF-SHA256 (RFC 5869) of `ikm` with no salt (HashLen zero bytes) and empty info, `out_len` bytes into `out`. */
int css_hkdf_sha256(css_bytes ikm, uint8_t *out, size_t out_len);

/**
 * AES-128-CBC of `plaintext` with PKCS#7 padding under `key` (16 bytes) and `iv` (16 bytes). The
 * ciphertext (the padded length, a multiple of 16, at least 16) goes into `out`, which must hold
 * plaintext.len + 16 bytes; its length into `*out_len`.
 */
int css_aes128_cbc_encrypt(css_bytes key, css_bytes iv, css_bytes plaintext, uint8_t *out, size_t out_cap, size_t *out_len);

/**
 * The inverse: `ciphertext` (a non-zero multiple of 16 bytes) decrypted into `out` (at least
 * ciphertext.len + 16 bytes, as OpenSSL asks), the padding checked and removed, the plaintext's length into `*out_len`.
 * CSS_ERR_PADDING, with `out` wiped, when the padding is not PKCS#7.
 */
int css_aes128_cbc_decrypt(css_bytes key, css_bytes iv, css_bytes ciphertext, uint8_t *out, size_t out_cap, size_t *out_len);

#ifdef __cplusplus
}
#endif

#endif
