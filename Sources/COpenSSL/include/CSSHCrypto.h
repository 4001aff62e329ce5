/*
 * CSSHCrypto (in the COpenSSL target): the thin C wall between CofferSSHKeys and OpenSSL 3
 * libcrypto, for the SSH key types libsodium does not have (ECDSA over the NIST curves, RSA).
 * Plain C, byte buffers in and out, raw components only (no SSH wire encoding). Only CofferSSHKeys
 * calls it (COpenSSL.h has the wall's rule).
 *
 * Every function imports the key it needs from the caller's buffers (EVP_PKEY_fromdata), uses it
 * and frees it (EVP_PKEY_free, BN_clear_free), so no key outlives the call inside OpenSSL. Private
 * components are written only into caller-provided buffers (CofferSSHKeys passes secure memory).
 * Numbers are big-endian, unsigned.
 */
#ifndef CSSHCRYPTO_H
#define CSSHCRYPTO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Results. */
#define CSSH_OK 0
/** A caller error: unknown curve or hash, a buffer of the wrong size. */
#define CSSH_ERR_ARGUMENT 1
/** The components do not form a valid key (off the curve, d·G ≠ Q, p·q ≠ n, …). */
#define CSSH_ERR_BAD_KEY 2
/** OpenSSL failed (out of memory, key generation or signing failed). */
#define CSSH_ERR_CRYPTO 3
/** The signature does not verify (from the verify functions only). */
#define CSSH_ERR_SIGNATURE 4

/* Digests (the SSH signature hashes). */
#define CSSH_HASH_SHA1 1
#define CSSH_HASH_SHA256 2
#define CSSH_HASH_SHA384 3
#define CSSH_HASH_SHA512 4

/** A byte string: `len` bytes at `ptr`. */
typedef struct {
    const uint8_t *ptr;
    size_t len;
} cssh_bytes;

/* ---- ECDSA over NIST P-256, P-384, P-521 (curve given by its bit size: 256, 384, 521) ---- */

/** The size of a field element (32, 48, 66) of `curve`, or 0 for an unknown curve. */
size_t cssh_ec_field_bytes(int curve);

/** A new key: Q uncompressed (0x04 ‖ X ‖ Y, 2·field+1 bytes) into `q`, d (field bytes, left-padded) into `d`. */
int cssh_ec_generate(int curve, uint8_t *q, size_t q_len, uint8_t *d, size_t d_len);

/** CSSH_OK if Q is a point of the curve (EVP_PKEY_public_check). */
int cssh_ec_check_public(int curve, cssh_bytes q);

/** CSSH_OK if Q is on the curve, d in range and d·G == Q (EVP_PKEY_check). */
int cssh_ec_check(int curve, cssh_bytes q, cssh_bytes d);

/**
 * Signs `msg` with the hash SSH uses for `curve` (RFC 5656: SHA-256, SHA-384, SHA-512). r and s
 * are written unsigned and minimal into `r`, `s` (each at least field bytes), their lengths into
 * `r_len`, `s_len`.
 */
int cssh_ec_sign(int curve, cssh_bytes q, cssh_bytes d, cssh_bytes msg,
                 uint8_t *r, size_t *r_len, uint8_t *s, size_t *s_len);

/** CSSH_OK if (r, s) is a signature of `msg` by Q, CSSH_ERR_SIGNATURE if not. */
int cssh_ec_verify(int curve, cssh_bytes q, cssh_bytes msg, cssh_bytes r, cssh_bytes s);

/* ---- RSA ---- */

/** An RSA private key's components (the ones OpenSSH stores: n, e, d, p, q, iqmp). */
typedef struct {
    cssh_bytes n, e, d, p, q, iqmp;
} cssh_rsa_key;

/**
 * A new `bits`-bit key with e = 65537. Each component is written left-padded: n and d into
 * bits/8 bytes, p, q and iqmp into bits/16 bytes; e is 65537 (the caller knows it). `bits` must
 * be a multiple of 16.
 */
int cssh_rsa_generate(unsigned bits, uint8_t *n, uint8_t *d, uint8_t *p, uint8_t *q, uint8_t *iqmp);

/** CSSH_OK if the components form a consistent key: p·q = n, e·d ≡ 1, iqmp = q⁻¹ mod p (EVP_PKEY_check). */
int cssh_rsa_check(cssh_rsa_key key);

/** The PKCS#1 v1.5 signature of `msg` with `hash`, written into `sig` (exactly the modulus length `sig_len`). */
int cssh_rsa_sign(cssh_rsa_key key, int hash, cssh_bytes msg, uint8_t *sig, size_t sig_len);

/** CSSH_OK if `sig` is a PKCS#1 v1.5 signature of `msg` with `hash` by (n, e), CSSH_ERR_SIGNATURE if not. */
int cssh_rsa_verify(cssh_bytes n, cssh_bytes e, int hash, cssh_bytes msg, cssh_bytes sig);

#ifdef __cplusplus
}
#endif

#endif
