/*
 * coffer_sk_api.h — what Coffer uses of OpenSSH's FIDO middleware interface (OpenSSH's sk-api.h,
 * API version 0x000a0000, OpenSSH 8.9 to 9.x), declared here with Coffer's names and the same
 * layout, for `coffer-plugin-host --sk-sign` (the process that loads a middleware; the agent never
 * does).
 *
 * A middleware is a shared object exporting (at least) these two symbols, as OpenSSH's
 * ssh-sk-helper finds them with dlsym:
 *
 *     uint32_t sk_api_version(void);
 *     int sk_sign(uint32_t alg, const uint8_t *data, size_t data_len, const char *application,
 *                 const uint8_t *key_handle, size_t key_handle_len, uint8_t flags, const char *pin,
 *                 struct sk_option **options, struct sk_sign_response **sign_response);
 *
 * sk_sign hashes `data` itself (SHA-256) and returns a response it allocated with malloc (and its
 * sig_r and sig_s); the caller frees them with free(). It returns 0 or one of the negative
 * COFFER_SK_ERR_* codes. Coffer passes no PIN (NULL) and no options (NULL), as OpenSSH's agent does.
 */
#ifndef COFFER_SK_API_H
#define COFFER_SK_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The API version this header describes, and the mask of its major part (sk_api_version() & mask). */
#define COFFER_SK_VERSION_MAJOR 0x000a0000
#define COFFER_SK_VERSION_MAJOR_MASK 0xffff0000

/** Algorithms (sk_sign's alg). */
#define COFFER_SK_ECDSA 0x00
#define COFFER_SK_ED25519 0x01

/** Error codes sk_sign returns. */
#define COFFER_SK_ERR_GENERAL -1
#define COFFER_SK_ERR_UNSUPPORTED -2
#define COFFER_SK_ERR_PIN_REQUIRED -3
#define COFFER_SK_ERR_DEVICE_NOT_FOUND -4
#define COFFER_SK_ERR_CREDENTIAL_EXISTS -5

/** The symbols a middleware exports. */
#define COFFER_SK_API_VERSION_SYMBOL "sk_api_version"
#define COFFER_SK_SIGN_SYMBOL "sk_sign"

/** OpenSSH's struct sk_sign_response. */
struct coffer_sk_sign_response {
    uint8_t flags;
    uint32_t counter;
    uint8_t *sig_r;
    size_t sig_r_len;
    uint8_t *sig_s;
    size_t sig_s_len;
};

/** OpenSSH's struct sk_option (Coffer passes none). */
struct coffer_sk_option {
    char *name;
    char *value;
    uint8_t required;
};

typedef uint32_t (*coffer_sk_api_version_fn)(void);
typedef int (*coffer_sk_sign_fn)(uint32_t alg, const uint8_t *data, size_t data_len, const char *application,
                                 const uint8_t *key_handle, size_t key_handle_len, uint8_t flags, const char *pin,
                                 struct coffer_sk_option **options, struct coffer_sk_sign_response **sign_response);

#ifdef __cplusplus
}
#endif

#endif /* COFFER_SK_API_H */
