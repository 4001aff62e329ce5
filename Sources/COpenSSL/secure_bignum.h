/* What this target's OpenSSL walls share inside it. Private: not under include/, so no Swift module
 * sees it, and it carries no wall's prefix. */
#ifndef COFFER_OPENSSL_SECURE_BIGNUM_H
#define COFFER_OPENSSL_SECURE_BIGNUM_H

#include <openssl/bn.h>
#include <stddef.h>
#include <stdint.h>

/* A secure BIGNUM (OpenSSL's secure heap, cleared when freed) holding the big-endian `len` bytes at
 * `ptr`, or NULL. */
static inline BIGNUM *secure_bn_from_bytes(const uint8_t *ptr, size_t len)
{
    BIGNUM *bn = BN_secure_new();
    if (bn == NULL)
        return NULL;
    if (BN_bin2bn(ptr, (int)len, bn) == NULL) {
        BN_clear_free(bn);
        return NULL;
    }
    return bn;
}

#endif
