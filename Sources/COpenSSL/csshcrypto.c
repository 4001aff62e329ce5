/*
 * CSSHCrypto: ECDSA and RSA through OpenSSL 3's EVP and OSSL_PARAM interfaces (no deprecated
 * RSA_* or EC_KEY_* calls). See include/CSSHCrypto.h for the contract.
 *
 * Private numbers enter OpenSSL as secure BIGNUMs (BN_secure_new), so the parameter blocks built
 * from them are secure too; every key, number and parameter block is freed with the functions that
 * clear (EVP_PKEY_free, BN_clear_free, OSSL_PARAM_free). The error queue is cleared on every
 * failure: callers get a result code, never OpenSSL's text.
 */
#include "CSSHCrypto.h"
#include "secure_bignum.h"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/rsa.h>

#include <string.h>

static const char *ec_group(int curve)
{
    switch (curve) {
    case 256: return "prime256v1";
    case 384: return "secp384r1";
    case 521: return "secp521r1";
    default: return NULL;
    }
}

size_t cssh_ec_field_bytes(int curve)
{
    switch (curve) {
    case 256: return 32;
    case 384: return 48;
    case 521: return 66;
    default: return 0;
    }
}

/* RFC 5656 §6.2.1: the hash follows the curve size. */
static const EVP_MD *ec_digest(int curve)
{
    switch (curve) {
    case 256: return EVP_sha256();
    case 384: return EVP_sha384();
    case 521: return EVP_sha512();
    default: return NULL;
    }
}

static const EVP_MD *digest(int hash)
{
    switch (hash) {
    case CSSH_HASH_SHA1: return EVP_sha1();
    case CSSH_HASH_SHA256: return EVP_sha256();
    case CSSH_HASH_SHA384: return EVP_sha384();
    case CSSH_HASH_SHA512: return EVP_sha512();
    default: return NULL;
    }
}

/* `rc`, with OpenSSL's error queue emptied when it is a failure. */
static int finish(int rc)
{
    if (rc != CSSH_OK)
        ERR_clear_error();
    return rc;
}

/* A secure BIGNUM holding `b`, or NULL. */
static BIGNUM *secret_bn(cssh_bytes b)
{
    return secure_bn_from_bytes(b.ptr, b.len);
}

/* A key of type `name` from `params` (`selection`: EVP_PKEY_PUBLIC_KEY or EVP_PKEY_KEYPAIR), or NULL. */
static EVP_PKEY *from_params(const char *name, int selection, OSSL_PARAM *params)
{
    EVP_PKEY *pkey = NULL;
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, name, NULL);
    if (ctx == NULL || EVP_PKEY_fromdata_init(ctx) <= 0 || EVP_PKEY_fromdata(ctx, &pkey, selection, params) <= 0)
        pkey = NULL;
    EVP_PKEY_CTX_free(ctx);
    return pkey;
}

/* The EC key (Q, and d when `d` is not NULL) on `curve`, or NULL with *rc set. */
static EVP_PKEY *ec_import(int curve, cssh_bytes q, const cssh_bytes *d, int *rc)
{
    size_t field = cssh_ec_field_bytes(curve);
    const char *group = ec_group(curve);
    if (group == NULL) {
        *rc = CSSH_ERR_ARGUMENT;
        return NULL;
    }
    if (q.len != 2 * field + 1 || q.ptr == NULL || q.ptr[0] != 0x04 || (d != NULL && (d->len != field || d->ptr == NULL))) {
        *rc = CSSH_ERR_BAD_KEY;
        return NULL;
    }
    EVP_PKEY *pkey = NULL;
    BIGNUM *priv = NULL;
    OSSL_PARAM *params = NULL;
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    *rc = CSSH_ERR_CRYPTO;
    if (bld == NULL
        || !OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, group, 0)
        || !OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, q.ptr, q.len))
        goto done;
    if (d != NULL && ((priv = secret_bn(*d)) == NULL || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_PRIV_KEY, priv)))
        goto done;
    if ((params = OSSL_PARAM_BLD_to_param(bld)) == NULL)
        goto done;
    pkey = from_params("EC", d != NULL ? EVP_PKEY_KEYPAIR : EVP_PKEY_PUBLIC_KEY, params);
    /* A point that does not decode (off the curve) fails here. */
    *rc = pkey != NULL ? CSSH_OK : CSSH_ERR_BAD_KEY;
done:
    OSSL_PARAM_free(params);
    OSSL_PARAM_BLD_free(bld);
    BN_clear_free(priv);
    return pkey;
}

/* CSSH_OK if `pkey` passes the full check (with the private part) or the public check. */
static int check(EVP_PKEY *pkey, int with_private)
{
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_pkey(NULL, pkey, NULL);
    if (ctx == NULL)
        return CSSH_ERR_CRYPTO;
    int ok = with_private ? EVP_PKEY_check(ctx) : EVP_PKEY_public_check(ctx);
    EVP_PKEY_CTX_free(ctx);
    return ok == 1 ? CSSH_OK : CSSH_ERR_BAD_KEY;
}

/* Signs `msg` with `md` into a new OPENSSL_malloc'd buffer (*sig, *sig_len). */
static int sign(EVP_PKEY *pkey, const EVP_MD *md, cssh_bytes msg, uint8_t **sig, size_t *sig_len)
{
    int rc = CSSH_ERR_CRYPTO;
    *sig = NULL;
    EVP_MD_CTX *mctx = EVP_MD_CTX_new();
    size_t len = 0;
    if (mctx == NULL || EVP_DigestSignInit_ex(mctx, NULL, EVP_MD_get0_name(md), NULL, NULL, pkey, NULL) <= 0
        || EVP_DigestSign(mctx, NULL, &len, msg.ptr, msg.len) <= 0 || (*sig = OPENSSL_malloc(len)) == NULL
        || EVP_DigestSign(mctx, *sig, &len, msg.ptr, msg.len) <= 0) {
        OPENSSL_free(*sig);
        *sig = NULL;
    } else {
        *sig_len = len;
        rc = CSSH_OK;
    }
    EVP_MD_CTX_free(mctx);
    return rc;
}

/* CSSH_OK if `sig` verifies over `msg` with `md`, else CSSH_ERR_SIGNATURE (or CSSH_ERR_CRYPTO). */
static int verify(EVP_PKEY *pkey, const EVP_MD *md, cssh_bytes msg, const uint8_t *sig, size_t sig_len)
{
    EVP_MD_CTX *mctx = EVP_MD_CTX_new();
    if (mctx == NULL)
        return CSSH_ERR_CRYPTO;
    int rc = CSSH_ERR_SIGNATURE;
    if (EVP_DigestVerifyInit_ex(mctx, NULL, EVP_MD_get0_name(md), NULL, NULL, pkey, NULL) > 0
        && EVP_DigestVerify(mctx, sig, sig_len, msg.ptr, msg.len) == 1)
        rc = CSSH_OK;
    EVP_MD_CTX_free(mctx);
    return rc;
}

/* Writes the private BIGNUM parameter `name` of `pkey` into `out`, left-padded to `len` bytes. */
static int export_bn(EVP_PKEY *pkey, const char *name, uint8_t *out, size_t len)
{
    BIGNUM *bn = NULL;
    if (EVP_PKEY_get_bn_param(pkey, name, &bn) != 1)
        return 0;
    int ok = BN_bn2binpad(bn, out, (int)len) == (int)len;
    BN_clear_free(bn);
    return ok;
}

int cssh_ec_generate(int curve, uint8_t *q, size_t q_len, uint8_t *d, size_t d_len)
{
    size_t field = cssh_ec_field_bytes(curve);
    if (field == 0 || q == NULL || d == NULL || q_len != 2 * field + 1 || d_len != field)
        return CSSH_ERR_ARGUMENT;
    EVP_PKEY *pkey = EVP_PKEY_Q_keygen(NULL, NULL, "EC", ec_group(curve));
    if (pkey == NULL)
        return finish(CSSH_ERR_CRYPTO);
    size_t written = 0;
    int rc = CSSH_ERR_CRYPTO;
    if (EVP_PKEY_get_octet_string_param(pkey, OSSL_PKEY_PARAM_PUB_KEY, q, q_len, &written) == 1 && written == q_len
        && q[0] == 0x04 && export_bn(pkey, OSSL_PKEY_PARAM_PRIV_KEY, d, d_len))
        rc = CSSH_OK;
    EVP_PKEY_free(pkey);
    if (rc != CSSH_OK)
        OPENSSL_cleanse(d, d_len);
    return finish(rc);
}

int cssh_ec_check_public(int curve, cssh_bytes q)
{
    int rc;
    EVP_PKEY *pkey = ec_import(curve, q, NULL, &rc);
    if (pkey != NULL) {
        rc = check(pkey, 0);
        EVP_PKEY_free(pkey);
    }
    return finish(rc);
}

int cssh_ec_check(int curve, cssh_bytes q, cssh_bytes d)
{
    int rc;
    EVP_PKEY *pkey = ec_import(curve, q, &d, &rc);
    if (pkey != NULL) {
        rc = check(pkey, 1);
        EVP_PKEY_free(pkey);
    }
    return finish(rc);
}

int cssh_ec_sign(int curve, cssh_bytes q, cssh_bytes d, cssh_bytes msg,
                 uint8_t *r, size_t *r_len, uint8_t *s, size_t *s_len)
{
    size_t field = cssh_ec_field_bytes(curve);
    if (field == 0 || r == NULL || s == NULL || r_len == NULL || s_len == NULL || *r_len < field || *s_len < field)
        return CSSH_ERR_ARGUMENT;
    int rc;
    EVP_PKEY *pkey = ec_import(curve, q, &d, &rc);
    if (pkey == NULL)
        return finish(rc);
    uint8_t *der = NULL;
    size_t der_len = 0;
    ECDSA_SIG *sig = NULL;
    rc = sign(pkey, ec_digest(curve), msg, &der, &der_len);
    if (rc == CSSH_OK) {
        const unsigned char *p = der;
        const BIGNUM *br = NULL, *bs = NULL;
        rc = CSSH_ERR_CRYPTO;
        if ((sig = d2i_ECDSA_SIG(NULL, &p, (long)der_len)) != NULL) {
            ECDSA_SIG_get0(sig, &br, &bs);
            if ((size_t)BN_num_bytes(br) <= field && (size_t)BN_num_bytes(bs) <= field) {
                *r_len = (size_t)BN_bn2bin(br, r);
                *s_len = (size_t)BN_bn2bin(bs, s);
                rc = CSSH_OK;
            }
        }
    }
    ECDSA_SIG_free(sig);
    OPENSSL_free(der);
    EVP_PKEY_free(pkey);
    return finish(rc);
}

int cssh_ec_verify(int curve, cssh_bytes q, cssh_bytes msg, cssh_bytes r, cssh_bytes s)
{
    size_t field = cssh_ec_field_bytes(curve);
    if (field == 0)
        return CSSH_ERR_ARGUMENT;
    /* Out of range (or absurdly long) numbers cannot be a signature: refuse before any work. */
    if (r.len == 0 || s.len == 0 || r.len > field + 1 || s.len > field + 1 || r.ptr == NULL || s.ptr == NULL)
        return CSSH_ERR_SIGNATURE;
    int rc;
    EVP_PKEY *pkey = ec_import(curve, q, NULL, &rc);
    if (pkey == NULL)
        return finish(rc);
    ECDSA_SIG *sig = ECDSA_SIG_new();
    BIGNUM *br = BN_bin2bn(r.ptr, (int)r.len, NULL), *bs = BN_bin2bn(s.ptr, (int)s.len, NULL);
    unsigned char *der = NULL;
    int der_len = -1;
    rc = CSSH_ERR_CRYPTO;
    if (sig != NULL && br != NULL && bs != NULL && ECDSA_SIG_set0(sig, br, bs) == 1) {
        br = bs = NULL; /* owned by sig now */
        if ((der_len = i2d_ECDSA_SIG(sig, &der)) > 0)
            rc = verify(pkey, ec_digest(curve), msg, der, (size_t)der_len);
    }
    BN_free(br);
    BN_free(bs);
    ECDSA_SIG_free(sig);
    OPENSSL_free(der);
    EVP_PKEY_free(pkey);
    return finish(rc);
}

int cssh_rsa_generate(unsigned bits, uint8_t *n, uint8_t *d, uint8_t *p, uint8_t *q, uint8_t *iqmp)
{
    if (bits < 1024 || bits > 16384 || bits % 16 != 0 || n == NULL || d == NULL || p == NULL || q == NULL || iqmp == NULL)
        return CSSH_ERR_ARGUMENT;
    EVP_PKEY *pkey = NULL;
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, "RSA", NULL);
    int rc = CSSH_ERR_CRYPTO;
    /* e defaults to 65537. */
    if (ctx != NULL && EVP_PKEY_keygen_init(ctx) > 0 && EVP_PKEY_CTX_set_rsa_keygen_bits(ctx, (int)bits) > 0
        && EVP_PKEY_generate(ctx, &pkey) > 0
        && export_bn(pkey, OSSL_PKEY_PARAM_RSA_N, n, bits / 8)
        && export_bn(pkey, OSSL_PKEY_PARAM_RSA_D, d, bits / 8)
        && export_bn(pkey, OSSL_PKEY_PARAM_RSA_FACTOR1, p, bits / 16)
        && export_bn(pkey, OSSL_PKEY_PARAM_RSA_FACTOR2, q, bits / 16)
        && export_bn(pkey, OSSL_PKEY_PARAM_RSA_COEFFICIENT1, iqmp, bits / 16))
        rc = CSSH_OK;
    EVP_PKEY_free(pkey);
    EVP_PKEY_CTX_free(ctx);
    if (rc != CSSH_OK) {
        OPENSSL_cleanse(d, bits / 8);
        OPENSSL_cleanse(p, bits / 16);
        OPENSSL_cleanse(q, bits / 16);
        OPENSSL_cleanse(iqmp, bits / 16);
    }
    return finish(rc);
}

static int nonempty(cssh_bytes b) { return b.ptr != NULL && b.len > 0 && b.len <= 2048; }

/* The private RSA key of `key`, or NULL with *rc set. OpenSSL 3.0 wants the CRT exponents as well:
 * d mod (p-1) and d mod (q-1), computed here from the caller's d, p and q. */
static EVP_PKEY *rsa_import(cssh_rsa_key key, int *rc)
{
    if (!nonempty(key.n) || !nonempty(key.e) || !nonempty(key.d) || !nonempty(key.p) || !nonempty(key.q) || !nonempty(key.iqmp)) {
        *rc = CSSH_ERR_BAD_KEY;
        return NULL;
    }
    EVP_PKEY *pkey = NULL;
    OSSL_PARAM *params = NULL;
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    BN_CTX *bctx = BN_CTX_secure_new();
    BIGNUM *n = BN_bin2bn(key.n.ptr, (int)key.n.len, NULL), *e = BN_bin2bn(key.e.ptr, (int)key.e.len, NULL);
    BIGNUM *d = secret_bn(key.d), *p = secret_bn(key.p), *q = secret_bn(key.q), *iqmp = secret_bn(key.iqmp);
    BIGNUM *p1 = BN_secure_new(), *q1 = BN_secure_new(), *dmp1 = BN_secure_new(), *dmq1 = BN_secure_new();
    *rc = CSSH_ERR_CRYPTO;
    if (bld == NULL || bctx == NULL || n == NULL || e == NULL || d == NULL || p == NULL || q == NULL || iqmp == NULL
        || p1 == NULL || q1 == NULL || dmp1 == NULL || dmq1 == NULL)
        goto done;
    if (BN_is_zero(p) || BN_is_zero(q) || BN_is_one(p) || BN_is_one(q)) {
        *rc = CSSH_ERR_BAD_KEY;
        goto done;
    }
    if (!BN_sub(p1, p, BN_value_one()) || !BN_sub(q1, q, BN_value_one())
        || !BN_mod(dmp1, d, p1, bctx) || !BN_mod(dmq1, d, q1, bctx))
        goto done;
    if (!OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, n) || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, e)
        || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_D, d)
        || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_FACTOR1, p)
        || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_FACTOR2, q)
        || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_EXPONENT1, dmp1)
        || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_EXPONENT2, dmq1)
        || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_COEFFICIENT1, iqmp)
        || (params = OSSL_PARAM_BLD_to_param(bld)) == NULL)
        goto done;
    pkey = from_params("RSA", EVP_PKEY_KEYPAIR, params);
    *rc = pkey != NULL ? CSSH_OK : CSSH_ERR_BAD_KEY;
done:
    OSSL_PARAM_free(params);
    OSSL_PARAM_BLD_free(bld);
    BN_CTX_free(bctx);
    BN_free(n);
    BN_free(e);
    BN_clear_free(d);
    BN_clear_free(p);
    BN_clear_free(q);
    BN_clear_free(iqmp);
    BN_clear_free(p1);
    BN_clear_free(q1);
    BN_clear_free(dmp1);
    BN_clear_free(dmq1);
    return pkey;
}

int cssh_rsa_check(cssh_rsa_key key)
{
    int rc;
    EVP_PKEY *pkey = rsa_import(key, &rc);
    if (pkey != NULL) {
        rc = check(pkey, 1);
        EVP_PKEY_free(pkey);
    }
    return finish(rc);
}

int cssh_rsa_sign(cssh_rsa_key key, int hash, cssh_bytes msg, uint8_t *sig, size_t sig_len)
{
    const EVP_MD *md = digest(hash);
    if (md == NULL || sig == NULL)
        return CSSH_ERR_ARGUMENT;
    int rc;
    EVP_PKEY *pkey = rsa_import(key, &rc);
    if (pkey == NULL)
        return finish(rc);
    uint8_t *out = NULL;
    size_t out_len = 0;
    if (EVP_PKEY_get_size(pkey) != (int)sig_len)
        rc = CSSH_ERR_ARGUMENT;
    else if ((rc = sign(pkey, md, msg, &out, &out_len)) == CSSH_OK) {
        if (out_len == sig_len)
            memcpy(sig, out, sig_len);
        else
            rc = CSSH_ERR_CRYPTO;
    }
    OPENSSL_free(out);
    EVP_PKEY_free(pkey);
    return finish(rc);
}

int cssh_rsa_verify(cssh_bytes n, cssh_bytes e, int hash, cssh_bytes msg, cssh_bytes sig)
{
    const EVP_MD *md = digest(hash);
    if (md == NULL)
        return CSSH_ERR_ARGUMENT;
    if (!nonempty(n) || !nonempty(e) || sig.ptr == NULL)
        return CSSH_ERR_BAD_KEY;
    EVP_PKEY *pkey = NULL;
    OSSL_PARAM *params = NULL;
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    BIGNUM *bn = BN_bin2bn(n.ptr, (int)n.len, NULL), *be = BN_bin2bn(e.ptr, (int)e.len, NULL);
    int rc = CSSH_ERR_CRYPTO;
    if (bld != NULL && bn != NULL && be != NULL && OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn)
        && OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, be) && (params = OSSL_PARAM_BLD_to_param(bld)) != NULL) {
        pkey = from_params("RSA", EVP_PKEY_PUBLIC_KEY, params);
        rc = pkey == NULL ? CSSH_ERR_BAD_KEY : verify(pkey, md, msg, sig.ptr, sig.len);
    }
    EVP_PKEY_free(pkey);
    OSSL_PARAM_free(params);
    OSSL_PARAM_BLD_free(bld);
    BN_free(bn);
    BN_free(be);
    return finish(rc);
}
