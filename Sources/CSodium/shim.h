#include <sodium.h>

/* Keyed BLAKE2b over several parts. The state is on the stack (Swift does not import the
   64-byte-aligned state type) and is wiped before return. */
static inline int coffer_keyed_hash(unsigned char *out, size_t outlen,
                                    const unsigned char *key, size_t keylen,
                                    const unsigned char *const *parts, const size_t *lens, size_t n) {
    crypto_generichash_state st;
    int rc = crypto_generichash_init(&st, key, keylen, outlen);
    for (size_t i = 0; rc == 0 && i < n; i++) rc = crypto_generichash_update(&st, parts[i], lens[i]);
    if (rc == 0) rc = crypto_generichash_final(&st, out, outlen);
    sodium_memzero(&st, sizeof st);
    return rc;
}
