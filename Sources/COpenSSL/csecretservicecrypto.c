/*
 * CSecretServiceCrypto: the Secret Service's DH, HKDF and AES-CBC through OpenSSL 3's EVP, EVP_KDF
 * and OSSL_PARAM interfaces (no deprecated DH_* calls). See include/CSecretServiceCrypto.h for the
 * contract.
 *
 * The group is built from OpenSSL's own copy of the RFC 2409 prime with g = 2; a peer's value is
 * range-checked by OpenSSL and tested for the order-q subgroup, q = (p − 1) / 2, by its Legendre
 * symbol (p is a safe prime, and 2 generates the order-q subgroup because p ≡ 7 mod 8). Private values enter OpenSSL as secure
 * BIGNUMs (BN_secure_new); every key, number, context and parameter block is freed with the
 * functions that clear (EVP_PKEY_free, BN_clear_free, OSSL_PARAM_free, EVP_CIPHER_CTX_free).
 */
#include "CSecretServiceCrypto.h"
#include "secure_bignum.h"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/dh.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/param_build.h>

#include <string.h>

/* `rc`, with OpenSSL's error queue emptied when it is a failure. */
static int finish(int rc)
{
    if (rc != CSS_OK)
        ERR_clear_error();
    return rc;
}

/* The group's p, g and q as new BIGNUMs; 0 on failure (nothing left allocated). */
static int group(BIGNUM **p, BIGNUM **g, BIGNUM **q)
{
    *p = BN_get_rfc2409_prime_1024(NULL);
    *g = BN_new();
    *q = BN_new();
    if (*p == NULL || *g == NULL || *q == NULL || !BN_set_word(*g, 2) || !BN_rshift1(*q, *p)) {
        BN_free(*p);
        BN_free(*g);
        BN_free(*q);
        *p = *g = *q = NULL;
        return 0;
    }
    return 1;
}

/*
 * A DH key of the group from `pub` and, when `priv` is not NULL, the private value (a secure
 * BIGNUM) — or only the domain parameters when both are NULL. With `with_q` the parameters include
 * q, which EVP_PKEY_public_check needs for the subgroup test; without it (key generation and
 * derivation) they are p and g alone: OpenSSL 3.0's generator refuses q without FIPS 186-4 seeds,
 * and a derivation needs both keys to carry the same parameters. NULL on failure.
 */
static EVP_PKEY *import(const BIGNUM *pub, const BIGNUM *priv, int with_q)
{
    BIGNUM *p = NULL, *g = NULL, *q = NULL;
    OSSL_PARAM_BLD *bld = NULL;
    OSSL_PARAM *params = NULL;
    EVP_PKEY_CTX *ctx = NULL;
    EVP_PKEY *pkey = NULL;
    int selection = priv != NULL ? EVP_PKEY_KEYPAIR : pub != NULL ? EVP_PKEY_PUBLIC_KEY : EVP_PKEY_KEY_PARAMETERS;
    if (!group(&p, &g, &q) || (bld = OSSL_PARAM_BLD_new()) == NULL
        || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_FFC_P, p) || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_FFC_G, g)
        || (with_q && !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_FFC_Q, q))
        || (pub != NULL && !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_PUB_KEY, pub))
        || (priv != NULL && !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_PRIV_KEY, priv))
        || (params = OSSL_PARAM_BLD_to_param(bld)) == NULL)
        goto done;
    ctx = EVP_PKEY_CTX_new_from_name(NULL, "DH", NULL);
    if (ctx == NULL || EVP_PKEY_fromdata_init(ctx) <= 0 || EVP_PKEY_fromdata(ctx, &pkey, selection, params) <= 0)
        pkey = NULL;
done:
    EVP_PKEY_CTX_free(ctx);
    OSSL_PARAM_free(params);
    OSSL_PARAM_BLD_free(bld);
    BN_free(p);
    BN_free(g);
    BN_free(q);
    return pkey;
}

/*
 * The peer's value as a public key of the group, checked: OpenSSL's EVP_PKEY_public_check over p
 * and g (1 < y < p − 1), then membership of the order-q subgroup by the Legendre symbol (y/p) = 1
 * (BN_kronecker). p is a safe prime, so the order-q subgroup is exactly the quadratic residues,
 * and this is the same test as y^q ≡ 1 (mod p) at a small fraction of its cost: a Jacobi-symbol
 * reduction instead of a 1,023-bit exponentiation (y is public, so its timing tells nothing).
 * NULL with *rc set.
 */
static EVP_PKEY *import_peer(css_bytes peer, int *rc)
{
    *rc = CSS_ERR_BAD_PUBLIC;
    if (peer.ptr == NULL || peer.len == 0 || peer.len > CSS_DH_BYTES)
        return NULL;
    BIGNUM *y = BN_bin2bn(peer.ptr, (int)peer.len, NULL), *p = NULL, *g = NULL, *q = NULL;
    BN_CTX *bctx = BN_CTX_new();
    EVP_PKEY *pkey = NULL;
    EVP_PKEY_CTX *ctx = NULL;
    if (y == NULL || bctx == NULL || !group(&p, &g, &q) || (pkey = import(y, NULL, 0)) == NULL
        || (ctx = EVP_PKEY_CTX_new_from_pkey(NULL, pkey, NULL)) == NULL) {
        *rc = CSS_ERR_CRYPTO;
    } else if (EVP_PKEY_public_check(ctx) == 1) {
        int symbol = BN_kronecker(y, p, bctx);
        *rc = symbol == 1 ? CSS_OK : symbol == -2 ? CSS_ERR_CRYPTO : CSS_ERR_BAD_PUBLIC;
    }
    if (*rc != CSS_OK) {
        EVP_PKEY_free(pkey);
        pkey = NULL;
    }
    EVP_PKEY_CTX_free(ctx);
    BN_CTX_free(bctx);
    BN_free(y);
    BN_free(p);
    BN_free(g);
    BN_free(q);
    return pkey;
}

/* A secure BIGNUM holding `b`, or NULL. */
static BIGNUM *secret_bn(css_bytes b)
{
    return secure_bn_from_bytes(b.ptr, b.len);
}

/* CSS_OK if the secure BIGNUM x is in (0, p − 1), CSS_ERR_ARGUMENT if not. */
static int in_range(const BIGNUM *x)
{
    int rc = CSS_ERR_CRYPTO;
    BIGNUM *p = NULL, *g = NULL, *q = NULL, *limit = BN_new();
    if (limit != NULL && group(&p, &g, &q) && BN_sub(limit, p, BN_value_one()))
        rc = BN_is_zero(x) || BN_is_negative(x) || BN_cmp(x, limit) >= 0 ? CSS_ERR_ARGUMENT : CSS_OK;
    BN_free(limit);
    BN_free(p);
    BN_free(g);
    BN_free(q);
    return rc;
}

/* g^x mod p for the secure BIGNUM x, left-padded into `pub`; CSS_ERR_ARGUMENT when x is not in (0, p − 1). */
static int public_of(const BIGNUM *x, uint8_t *pub, size_t pub_len)
{
    int rc = CSS_ERR_CRYPTO;
    BIGNUM *p = NULL, *g = NULL, *q = NULL, *y = BN_new(), *limit = BN_new();
    BN_CTX *bctx = BN_CTX_secure_new();
    if (y == NULL || limit == NULL || bctx == NULL || !group(&p, &g, &q) || !BN_sub(limit, p, BN_value_one()))
        goto done;
    if (BN_is_zero(x) || BN_is_negative(x) || BN_cmp(x, limit) >= 0) {
        rc = CSS_ERR_ARGUMENT;
        goto done;
    }
    if (BN_mod_exp_mont_consttime(y, g, x, p, bctx, NULL) && BN_bn2binpad(y, pub, (int)pub_len) == (int)pub_len)
        rc = CSS_OK;
done:
    BN_CTX_free(bctx);
    BN_free(y);
    BN_free(limit);
    BN_free(p);
    BN_free(g);
    BN_free(q);
    return rc;
}

int css_dh_prime(uint8_t *out, size_t out_len)
{
    if (out == NULL || out_len != CSS_DH_BYTES)
        return CSS_ERR_ARGUMENT;
    BIGNUM *p = BN_get_rfc2409_prime_1024(NULL);
    int rc = p != NULL && BN_bn2binpad(p, out, (int)out_len) == (int)out_len ? CSS_OK : CSS_ERR_CRYPTO;
    BN_free(p);
    return finish(rc);
}

int css_dh_generate(uint8_t *priv, size_t priv_len, uint8_t *pub, size_t pub_len)
{
    if (priv == NULL || pub == NULL || priv_len != CSS_DH_BYTES || pub_len != CSS_DH_BYTES)
        return CSS_ERR_ARGUMENT;
    int rc = CSS_ERR_CRYPTO;
    EVP_PKEY *params = import(NULL, NULL, 0), *pkey = NULL;
    EVP_PKEY_CTX *ctx = params != NULL ? EVP_PKEY_CTX_new_from_pkey(NULL, params, NULL) : NULL;
    BIGNUM *x = NULL, *y = NULL;
    if (ctx == NULL || EVP_PKEY_keygen_init(ctx) <= 0)
        goto done;
    /* A private value of CSS_DH_PRIVATE_BITS bits (the top one set), not the prime's 1,023. */
    int bits = CSS_DH_PRIVATE_BITS;
    OSSL_PARAM length[] = { OSSL_PARAM_int(OSSL_PKEY_PARAM_DH_PRIV_LEN, &bits), OSSL_PARAM_END };
    if (EVP_PKEY_CTX_set_params(ctx, length) <= 0 || EVP_PKEY_generate(ctx, &pkey) <= 0)
        goto done;
    if (EVP_PKEY_get_bn_param(pkey, OSSL_PKEY_PARAM_PRIV_KEY, &x) == 1
        && EVP_PKEY_get_bn_param(pkey, OSSL_PKEY_PARAM_PUB_KEY, &y) == 1
        && BN_bn2binpad(x, priv, (int)priv_len) == (int)priv_len && BN_bn2binpad(y, pub, (int)pub_len) == (int)pub_len)
        rc = CSS_OK;
done:
    BN_clear_free(x);
    BN_free(y);
    EVP_PKEY_free(pkey);
    EVP_PKEY_CTX_free(ctx);
    EVP_PKEY_free(params);
    if (rc != CSS_OK) {
        OPENSSL_cleanse(priv, priv_len);
        memset(pub, 0, pub_len);
    }
    return finish(rc);
}

int css_dh_public(css_bytes priv, uint8_t *pub, size_t pub_len)
{
    if (priv.ptr == NULL || priv.len == 0 || priv.len > CSS_DH_BYTES || pub == NULL || pub_len != CSS_DH_BYTES)
        return CSS_ERR_ARGUMENT;
    BIGNUM *x = secret_bn(priv);
    if (x == NULL)
        return finish(CSS_ERR_CRYPTO);
    int rc = public_of(x, pub, pub_len);
    BN_clear_free(x);
    return finish(rc);
}

int css_dh_check_public(css_bytes peer)
{
    int rc;
    EVP_PKEY *pkey = import_peer(peer, &rc);
    EVP_PKEY_free(pkey);
    return finish(rc);
}

/* peer^x mod p (see css_dh_shared_secret); our public value `given_pub` (128 bytes) when the caller
 * has it from css_dh_generate, else it is computed (OpenSSL's DH key pairs carry it). */
static int shared_secret(css_bytes priv, const uint8_t *given_pub, css_bytes peer, uint8_t *out, size_t out_len)
{
    if (priv.ptr == NULL || priv.len == 0 || priv.len > CSS_DH_BYTES || out == NULL || out_len != CSS_DH_BYTES)
        return CSS_ERR_ARGUMENT;
    int rc;
    EVP_PKEY *theirs = import_peer(peer, &rc), *ours = NULL;
    if (theirs == NULL)
        return finish(rc);
    rc = CSS_ERR_CRYPTO;
    uint8_t pub[CSS_DH_BYTES];
    BIGNUM *x = secret_bn(priv), *y = NULL;
    EVP_PKEY_CTX *ctx = NULL;
    size_t len = out_len;
    if (x == NULL)
        goto done;
    if (given_pub == NULL) {
        /* Compute it (and check x's range) first. */
        if ((rc = public_of(x, pub, sizeof pub)) != CSS_OK)
            goto done;
    } else {
        if ((rc = in_range(x)) != CSS_OK)
            goto done;
        memcpy(pub, given_pub, sizeof pub);
    }
    rc = CSS_ERR_CRYPTO;
    if ((y = BN_bin2bn(pub, sizeof pub, NULL)) == NULL || (ours = import(y, x, 0)) == NULL)
        goto done;
    ctx = EVP_PKEY_CTX_new_from_pkey(NULL, ours, NULL);
    /* Padding on: the secret is always the prime's length, leading zeros kept (as libsecret and gnome-keyring do). */
    if (ctx != NULL && EVP_PKEY_derive_init(ctx) > 0 && EVP_PKEY_CTX_set_dh_pad(ctx, 1) > 0
        && EVP_PKEY_derive_set_peer(ctx, theirs) > 0 && EVP_PKEY_derive(ctx, out, &len) > 0 && len == out_len)
        rc = CSS_OK;
done:
    EVP_PKEY_CTX_free(ctx);
    EVP_PKEY_free(ours);
    EVP_PKEY_free(theirs);
    BN_clear_free(x);
    BN_free(y);
    if (rc != CSS_OK)
        OPENSSL_cleanse(out, out_len);
    return finish(rc);
}

int css_dh_shared_secret(css_bytes priv, css_bytes peer, uint8_t *out, size_t out_len)
{
    return shared_secret(priv, NULL, peer, out, out_len);
}

int css_dh_shared_secret_pair(css_bytes priv, css_bytes pub, css_bytes peer, uint8_t *out, size_t out_len)
{
    if (pub.ptr == NULL || pub.len != CSS_DH_BYTES)
        return CSS_ERR_ARGUMENT;
    return shared_secret(priv, pub.ptr, peer, out, out_len);
}

int css_hkdf_sha256(css_bytes ikm, uint8_t *out, size_t out_len)
{
    if (ikm.ptr == NULL || out == NULL || out_len == 0 || out_len > 255 * 32)
        return CSS_ERR_ARGUMENT;
    int rc = CSS_ERR_CRYPTO;
    EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
    EVP_KDF_CTX *kctx = kdf != NULL ? EVP_KDF_CTX_new(kdf) : NULL;
    OSSL_PARAM params[3];
    /* No salt and no info: RFC 5869 then uses HashLen zero bytes as the salt, as libsecret's NULL salt does. */
    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0);
    params[1] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)ikm.ptr, ikm.len);
    params[2] = OSSL_PARAM_construct_end();
    if (kctx != NULL && EVP_KDF_derive(kctx, out, out_len, params) > 0)
        rc = CSS_OK;
    EVP_KDF_CTX_free(kctx);
    EVP_KDF_free(kdf);
    if (rc != CSS_OK)
        OPENSSL_cleanse(out, out_len);
    return finish(rc);
}

/* AES-128-CBC with OpenSSL's PKCS#7 padding, either way. */
static int cbc(int encrypt, css_bytes key, css_bytes iv, css_bytes in, uint8_t *out, size_t *out_len)
{
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (ctx == NULL)
        return CSS_ERR_CRYPTO;
    int rc = CSS_ERR_CRYPTO, n = 0, tail = 0;
    if (EVP_CipherInit_ex(ctx, EVP_aes_128_cbc(), NULL, key.ptr, iv.ptr, encrypt) == 1
        && EVP_CIPHER_CTX_set_padding(ctx, 1) == 1
        && (in.len == 0 || EVP_CipherUpdate(ctx, out, &n, in.ptr, (int)in.len) == 1)) {
        if (EVP_CipherFinal_ex(ctx, out + n, &tail) == 1) {
            *out_len = (size_t)n + (size_t)tail;
            rc = CSS_OK;
        } else if (!encrypt) {
            rc = CSS_ERR_PADDING;
        }
    }
    EVP_CIPHER_CTX_free(ctx);
    return rc;
}

int css_aes128_cbc_encrypt(css_bytes key, css_bytes iv, css_bytes plaintext, uint8_t *out, size_t out_cap, size_t *out_len)
{
    if (key.ptr == NULL || key.len != CSS_AES_KEY_BYTES || iv.ptr == NULL || iv.len != CSS_AES_BLOCK_BYTES
        || (plaintext.ptr == NULL && plaintext.len != 0) || plaintext.len > (size_t)INT32_MAX - CSS_AES_BLOCK_BYTES
        || out == NULL || out_len == NULL || out_cap < plaintext.len + CSS_AES_BLOCK_BYTES)
        return CSS_ERR_ARGUMENT;
    int rc = cbc(1, key, iv, plaintext, out, out_len);
    if (rc != CSS_OK)
        OPENSSL_cleanse(out, out_cap);
    return finish(rc);
}

int css_aes128_cbc_decrypt(css_bytes key, css_bytes iv, css_bytes ciphertext, uint8_t *out, size_t out_cap, size_t *out_len)
{
    if (key.ptr == NULL || key.len != CSS_AES_KEY_BYTES || iv.ptr == NULL || iv.len != CSS_AES_BLOCK_BYTES
        || ciphertext.ptr == NULL || ciphertext.len == 0 || ciphertext.len % CSS_AES_BLOCK_BYTES != 0
        || ciphertext.len > (size_t)INT32_MAX - CSS_AES_BLOCK_BYTES || out == NULL || out_len == NULL
        || out_cap < ciphertext.len + CSS_AES_BLOCK_BYTES)
        return CSS_ERR_ARGUMENT;
    int rc = cbc(0, key, iv, ciphertext, out, out_len);
    if (rc != CSS_OK)
        OPENSSL_cleanse(out, out_cap);
    return finish(rc);
}
