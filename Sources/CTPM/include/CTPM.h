/*
 * CTPM: the thin C wall between CofferTPM and tpm2-tss's ESAPI (tss2-esys), its TCTI loader
 * (tss2-tctildr), its marshalling (tss2-mu) and its response-code decoder (tss2-rc). Only
 * CofferTPM imports it.
 *
 * Thin: every function is one TPM command (or one ESAPI bookkeeping call) over byte buffers in the
 * TPM's own marshalled form. Templates, attributes, indices and what an error means are decided by
 * the Swift module; nothing here chooses. Every function returns the TSS2_RC of the call (0 is
 * success); ctpm_rc_text decodes one.
 *
 * Secrets: authorization values and HMAC results pass only through caller buffers and stack copies
 * that are wiped (explicit_bzero) before a call returns; ESAPI's own copies are freed by Esys_Free
 * after being wiped.
 *
 * Handles are ESAPI's ESYS_TR values. Every transient object a caller loads (ctpm_create_primary,
 * ctpm_load) must be flushed with ctpm_flush: without a resource manager (swtpm) it otherwise stays
 * in the TPM's few object slots.
 */
#ifndef CTPM_H
#define CTPM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** An open ESAPI context over a TCTI. */
typedef struct ctpm_context ctpm_context;

/** Success. */
#define CTPM_OK 0u
/** The layer bits of a TSS2_RC (0 for the TPM itself). */
#define CTPM_RC_LAYER_MASK 0x00FF0000u
/** This wall's own errors: a caller buffer too small or a marshalled input that does not parse (tss2-mu's layer). */
#define CTPM_RC_MU_LAYER 0x00090000u

/**
 * Opens a TCTI by its configuration string (Tss2_TctiLdr_Initialize: "device:/dev/tpmrm0",
 * "swtpm:host=127.0.0.1,port=2321") and an ESAPI context over it.
 */
uint32_t ctpm_open(const char *tcti_conf, ctpm_context **out);

/** Finalizes the ESAPI context and the TCTI. NULL is allowed. */
void ctpm_close(ctpm_context *ctx);

/** The text tss2-rc gives for `rc` (Tss2_RC_Decode; a static buffer of the library, copy it at once). */
const char *ctpm_rc_text(uint32_t rc);

/**
 * TPM2_CreatePrimary in the hierarchy `hierarchy` (an ESYS_TR, e.g. ESYS_TR_RH_OWNER; its auth
 * empty, a password session) from `template_pub` (a marshalled TPM2B_PUBLIC) and an empty
 * sensitive part. The new object's ESYS_TR into `*handle`, its Name (a marshalled-free TPM2B_NAME
 * body: nameAlg + digest) into `name` (`*name_len` in: capacity, out: length).
 */
uint32_t ctpm_create_primary(ctpm_context *ctx, uint32_t hierarchy, const uint8_t *template_pub, size_t template_len,
                             uint32_t *handle, uint8_t *name, size_t *name_len);

/**
 * TPM2_Create under `parent` (its auth empty) from `template_pub` (a marshalled TPM2B_PUBLIC) with
 * the sensitive part's userAuth `auth` (at most 64 bytes; no data: the TPM makes the key), in an
 * HMAC session salted to `parent` that encrypts the sensitive part on its way to the TPM. The new object's TPM2B_PUBLIC and TPM2B_PRIVATE, marshalled by tss2-mu, into `pub` and
 * `priv` (`*pub_len`, `*priv_len` in: capacity, out: length).
 */
uint32_t ctpm_create(ctpm_context *ctx, uint32_t parent, const uint8_t *template_pub, size_t template_len,
                     const uint8_t *auth, size_t auth_len,
                     uint8_t *pub, size_t *pub_len, uint8_t *priv, size_t *priv_len);

/**
 * TPM2_Load under `parent` (its auth empty) of a marshalled TPM2B_PUBLIC and TPM2B_PRIVATE (each
 * must unmarshal exactly, with nothing left over); the object's ESYS_TR into `*handle`.
 */
uint32_t ctpm_load(ctpm_context *ctx, uint32_t parent, const uint8_t *pub, size_t pub_len,
                   const uint8_t *priv, size_t priv_len, uint32_t *handle);

/** TPM2_FlushContext of a transient object (or session) this context loaded. */
uint32_t ctpm_flush(ctpm_context *ctx, uint32_t handle);

/**
 * TPM2_HMAC with the loaded key `key` and hash algorithm `hash_alg` (a TPM_ALG_ID) over `input`
 * (at most 1024 bytes), authorized with `auth` (at most 64 bytes) in an HMAC session
 * (TPM2_StartAuthSession, SHA-256) salted to the loaded key `salt_key`, with AES-128-CFB encryption
 * of the response and continueSession clear: the auth value never crosses the bus, the HMAC crosses
 * it encrypted. The session ends with the command (flushed here if the command failed). The HMAC
 * into `out` (`*out_len` in: capacity, out: length). The key's auth is reset to empty before return.
 */
uint32_t ctpm_hmac(ctpm_context *ctx, uint32_t key, uint32_t salt_key, const uint8_t *auth, size_t auth_len, uint16_t hash_alg,
                   const uint8_t *input, size_t input_len, uint8_t *out, size_t *out_len);

/**
 * TPM2_GetCapability(TPM_CAP_TPM_PROPERTIES) from property `first` for at most `count` properties:
 * the tags into `props`, the values into `values`, how many into `*got` (at most `count`).
 */
uint32_t ctpm_get_properties(ctpm_context *ctx, uint32_t first, uint32_t count, uint32_t *props, uint32_t *values, uint32_t *got);

/**
 * TPM2_GetCapability(TPM_CAP_HANDLES) from `index` for one handle: `*defined` 1 when the NV index
 * `index` exists, 0 when it does not. Asks without naming the index as a handle, so an absent index
 * is no error to anyone (ESAPI logs every failed command, and TPM2_NV_ReadPublic of an absent index
 * is one).
 */
uint32_t ctpm_nv_defined(ctpm_context *ctx, uint32_t index, int *defined);

/**
 * TPM2_NV_ReadPublic of the NV index `index` (a TPM handle, 0x01xxxxxx): its attributes, data size
 * and name algorithm. The TPM's TPM_RC_HANDLE when the index is not defined.
 */
uint32_t ctpm_nv_read_public(ctpm_context *ctx, uint32_t index, uint32_t *attributes, uint16_t *data_size, uint16_t *name_alg);

/**
 * TPM2_NV_DefineSpace by the owner (owner auth empty, a password session) of `index` with
 * `attributes`, `data_size`, name algorithm `name_alg`, an empty auth and no policy.
 */
uint32_t ctpm_nv_define(ctpm_context *ctx, uint32_t index, uint32_t attributes, uint16_t data_size, uint16_t name_alg);

/** TPM2_NV_Increment of the counter index `index`, authorized by the owner (auth empty). */
uint32_t ctpm_nv_increment(ctpm_context *ctx, uint32_t index);

/** TPM2_NV_Read of `size` bytes at offset 0 of `index` (at most 64), authorized by the owner (auth empty), into `out`. */
uint32_t ctpm_nv_read(ctpm_context *ctx, uint32_t index, uint8_t *out, uint16_t size);

/** TPM2_NV_UndefineSpace of `index` by the owner (auth empty). For tests and administrators' tools. */
uint32_t ctpm_nv_undefine(ctpm_context *ctx, uint32_t index);

/** ESYS_TR_RH_OWNER, the owner (storage) hierarchy, for ctpm_create_primary. */
uint32_t ctpm_owner_hierarchy(void);

#ifdef __cplusplus
}
#endif

#endif
