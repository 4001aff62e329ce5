/* CTPM: see include/CTPM.h. One TPM command per function; no decisions. */
#include "CTPM.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <tss2/tss2_esys.h>
#include <tss2/tss2_mu.h>
#include <tss2/tss2_rc.h>
#include <tss2/tss2_tctildr.h>

struct ctpm_context {
    TSS2_TCTI_CONTEXT *tcti;
    ESYS_CONTEXT *esys;
};

/* A caller buffer too small, or an argument out of range: reported in tss2-mu's layer as BAD_SIZE / BAD_VALUE. */
#define CTPM_RC_BAD_SIZE (TSS2_MU_RC_LAYER | TSS2_BASE_RC_BAD_SIZE)
#define CTPM_RC_BAD_VALUE (TSS2_MU_RC_LAYER | TSS2_BASE_RC_BAD_VALUE)

uint32_t ctpm_open(const char *tcti_conf, ctpm_context **out) {
    *out = NULL;
    ctpm_context *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL) return TSS2_ESYS_RC_MEMORY;
    TSS2_RC rc = Tss2_TctiLdr_Initialize(tcti_conf, &ctx->tcti);
    if (rc != TSS2_RC_SUCCESS) {
        free(ctx);
        return rc;
    }
    rc = Esys_Initialize(&ctx->esys, ctx->tcti, NULL);
    if (rc != TSS2_RC_SUCCESS) {
        Tss2_TctiLdr_Finalize(&ctx->tcti);
        free(ctx);
        return rc;
    }
    *out = ctx;
    return TSS2_RC_SUCCESS;
}

void ctpm_close(ctpm_context *ctx) {
    if (ctx == NULL) return;
    Esys_Finalize(&ctx->esys);
    Tss2_TctiLdr_Finalize(&ctx->tcti);
    free(ctx);
}

const char *ctpm_rc_text(uint32_t rc) { return Tss2_RC_Decode(rc); }

uint32_t ctpm_owner_hierarchy(void) { return ESYS_TR_RH_OWNER; }

static TSS2_RC unmarshal_public(const uint8_t *bytes, size_t len, TPM2B_PUBLIC *pub) {
    size_t off = 0;
    memset(pub, 0, sizeof *pub);
    TSS2_RC rc = Tss2_MU_TPM2B_PUBLIC_Unmarshal(bytes, len, &off, pub);
    if (rc != TSS2_RC_SUCCESS) return rc;
    return off == len ? TSS2_RC_SUCCESS : CTPM_RC_BAD_SIZE;
}

uint32_t ctpm_create_primary(ctpm_context *ctx, uint32_t hierarchy, const uint8_t *template_pub, size_t template_len,
                             uint32_t *handle, uint8_t *name, size_t *name_len) {
    TPM2B_PUBLIC in_public;
    TSS2_RC rc = unmarshal_public(template_pub, template_len, &in_public);
    if (rc != TSS2_RC_SUCCESS) return rc;
    TPM2B_SENSITIVE_CREATE in_sensitive = {0};
    TPM2B_DATA outside = {0};
    TPML_PCR_SELECTION pcrs = {0};
    ESYS_TR object = ESYS_TR_NONE;
    rc = Esys_CreatePrimary(ctx->esys, hierarchy, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE, &in_sensitive, &in_public,
                            &outside, &pcrs, &object, NULL, NULL, NULL, NULL);
    if (rc != TSS2_RC_SUCCESS) return rc;
    TPM2B_NAME *n = NULL;
    rc = Esys_TR_GetName(ctx->esys, object, &n);
    if (rc == TSS2_RC_SUCCESS && n->size > *name_len) rc = CTPM_RC_BAD_SIZE;
    if (rc != TSS2_RC_SUCCESS) {
        Esys_Free(n);
        Esys_FlushContext(ctx->esys, object);
        return rc;
    }
    memcpy(name, n->name, n->size);
    *name_len = n->size;
    Esys_Free(n);
    *handle = object;
    return TSS2_RC_SUCCESS;
}

/*
 * Starts an HMAC session (SHA-256) salted to the loaded key `salt_key`, with AES-128-CFB parameter
 * encryption in the directions `attributes` names (TPMA_SESSION_DECRYPT: the command's first
 * parameter; TPMA_SESSION_ENCRYPT: the response's) and continueSession clear, so the command that
 * uses it ends it. A session that could not be set up is flushed.
 */
static TSS2_RC salted_session(ctpm_context *ctx, ESYS_TR salt_key, TPMA_SESSION attributes, ESYS_TR *session) {
    TPMT_SYM_DEF symmetric = {.algorithm = TPM2_ALG_AES, .keyBits = {.aes = 128}, .mode = {.aes = TPM2_ALG_CFB}};
    *session = ESYS_TR_NONE;
    TSS2_RC rc = Esys_StartAuthSession(ctx->esys, salt_key, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, NULL,
                                       TPM2_SE_HMAC, &symmetric, TPM2_ALG_SHA256, session);
    if (rc != TSS2_RC_SUCCESS) return rc;
    rc = Esys_TRSess_SetAttributes(ctx->esys, *session, attributes, 0xFF);
    if (rc != TSS2_RC_SUCCESS) {
        (void)Esys_FlushContext(ctx->esys, *session);
        *session = ESYS_TR_NONE;
    }
    return rc;
}

uint32_t ctpm_create(ctpm_context *ctx, uint32_t parent, const uint8_t *template_pub, size_t template_len,
                     const uint8_t *auth, size_t auth_len,
                     uint8_t *pub, size_t *pub_len, uint8_t *priv, size_t *priv_len) {
    TPM2B_PUBLIC in_public;
    TSS2_RC rc = unmarshal_public(template_pub, template_len, &in_public);
    if (rc != TSS2_RC_SUCCESS) return rc;
    TPM2B_SENSITIVE_CREATE in_sensitive = {0};
    if (auth_len > sizeof in_sensitive.sensitive.userAuth.buffer) return CTPM_RC_BAD_VALUE;
    if (auth_len > 0) memcpy(in_sensitive.sensitive.userAuth.buffer, auth, auth_len);
    in_sensitive.sensitive.userAuth.size = (UINT16)auth_len;
    TPM2B_DATA outside = {0};
    TPML_PCR_SELECTION pcrs = {0};
    TPM2B_PRIVATE *out_private = NULL;
    TPM2B_PUBLIC *out_public = NULL;
    /* The sensitive part (the new key's auth) is the first parameter: encrypted in a session salted to the parent. */
    ESYS_TR session = ESYS_TR_NONE;
    rc = salted_session(ctx, parent, TPMA_SESSION_DECRYPT, &session);
    if (rc == TSS2_RC_SUCCESS) {
        rc = Esys_Create(ctx->esys, parent, session, ESYS_TR_NONE, ESYS_TR_NONE, &in_sensitive, &in_public, &outside,
                         &pcrs, &out_private, &out_public, NULL, NULL, NULL);
        if (rc != TSS2_RC_SUCCESS) (void)Esys_FlushContext(ctx->esys, session);
    }
    explicit_bzero(&in_sensitive, sizeof in_sensitive);
    if (rc == TSS2_RC_SUCCESS) {
        size_t off = 0;
        rc = Tss2_MU_TPM2B_PUBLIC_Marshal(out_public, pub, *pub_len, &off);
        *pub_len = off;
        if (rc == TSS2_RC_SUCCESS) {
            off = 0;
            rc = Tss2_MU_TPM2B_PRIVATE_Marshal(out_private, priv, *priv_len, &off);
            *priv_len = off;
        }
    }
    Esys_Free(out_private);
    Esys_Free(out_public);
    return rc;
}

uint32_t ctpm_load(ctpm_context *ctx, uint32_t parent, const uint8_t *pub, size_t pub_len,
                   const uint8_t *priv, size_t priv_len, uint32_t *handle) {
    TPM2B_PUBLIC in_public;
    TSS2_RC rc = unmarshal_public(pub, pub_len, &in_public);
    if (rc != TSS2_RC_SUCCESS) return rc;
    TPM2B_PRIVATE in_private;
    memset(&in_private, 0, sizeof in_private);
    size_t off = 0;
    rc = Tss2_MU_TPM2B_PRIVATE_Unmarshal(priv, priv_len, &off, &in_private);
    if (rc != TSS2_RC_SUCCESS) return rc;
    if (off != priv_len) return CTPM_RC_BAD_SIZE;
    ESYS_TR object = ESYS_TR_NONE;
    rc = Esys_Load(ctx->esys, parent, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE, &in_private, &in_public, &object);
    if (rc != TSS2_RC_SUCCESS) return rc;
    *handle = object;
    return TSS2_RC_SUCCESS;
}

uint32_t ctpm_flush(ctpm_context *ctx, uint32_t handle) { return Esys_FlushContext(ctx->esys, handle); }

uint32_t ctpm_hmac(ctpm_context *ctx, uint32_t key, uint32_t salt_key, const uint8_t *auth, size_t auth_len, uint16_t hash_alg,
                   const uint8_t *input, size_t input_len, uint8_t *out, size_t *out_len) {
    TPM2B_AUTH a = {0};
    if (auth_len > sizeof a.buffer) return CTPM_RC_BAD_VALUE;
    TPM2B_MAX_BUFFER buffer = {0};
    if (input_len > sizeof buffer.buffer) return CTPM_RC_BAD_VALUE;
    if (auth_len > 0) memcpy(a.buffer, auth, auth_len);
    a.size = (UINT16)auth_len;
    TSS2_RC rc = Esys_TR_SetAuth(ctx->esys, key, &a);
    explicit_bzero(&a, sizeof a);
    if (rc != TSS2_RC_SUCCESS) return rc;
    if (input_len > 0) memcpy(buffer.buffer, input, input_len);
    buffer.size = (UINT16)input_len;
    ESYS_TR session = ESYS_TR_NONE;
    rc = salted_session(ctx, salt_key, TPMA_SESSION_ENCRYPT, &session);
    TPM2B_DIGEST *digest = NULL;
    if (rc == TSS2_RC_SUCCESS) rc = Esys_HMAC(ctx->esys, key, session, ESYS_TR_NONE, ESYS_TR_NONE, &buffer, hash_alg, &digest);
    /* A session the command did not end (a failure, or the start failed half-way) is flushed here. */
    if (rc != TSS2_RC_SUCCESS && session != ESYS_TR_NONE) (void)Esys_FlushContext(ctx->esys, session);
    explicit_bzero(&buffer, sizeof buffer);
    TPM2B_AUTH empty = {0};
    (void)Esys_TR_SetAuth(ctx->esys, key, &empty);
    if (rc == TSS2_RC_SUCCESS) {
        if (digest->size > *out_len) {
            rc = CTPM_RC_BAD_SIZE;
        } else {
            memcpy(out, digest->buffer, digest->size);
            *out_len = digest->size;
        }
        explicit_bzero(digest, sizeof *digest);
    }
    Esys_Free(digest);
    return rc;
}

uint32_t ctpm_get_properties(ctpm_context *ctx, uint32_t first, uint32_t count, uint32_t *props, uint32_t *values, uint32_t *got) {
    TPMI_YES_NO more = TPM2_NO;
    TPMS_CAPABILITY_DATA *data = NULL;
    *got = 0;
    TSS2_RC rc = Esys_GetCapability(ctx->esys, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, TPM2_CAP_TPM_PROPERTIES, first, count,
                                    &more, &data);
    if (rc != TSS2_RC_SUCCESS) return rc;
    uint32_t n = data->data.tpmProperties.count;
    if (n > count) n = count;
    for (uint32_t i = 0; i < n; i++) {
        props[i] = data->data.tpmProperties.tpmProperty[i].property;
        values[i] = data->data.tpmProperties.tpmProperty[i].value;
    }
    *got = n;
    Esys_Free(data);
    return TSS2_RC_SUCCESS;
}

uint32_t ctpm_nv_defined(ctpm_context *ctx, uint32_t index, int *defined) {
    TPMI_YES_NO more = TPM2_NO;
    TPMS_CAPABILITY_DATA *data = NULL;
    *defined = 0;
    TSS2_RC rc = Esys_GetCapability(ctx->esys, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, TPM2_CAP_HANDLES, index, 1, &more, &data);
    if (rc != TSS2_RC_SUCCESS) return rc;
    /* The handles from `index` upwards: the first is `index` itself when it is defined. */
    if (data->data.handles.count > 0 && data->data.handles.handle[0] == index) *defined = 1;
    Esys_Free(data);
    return TSS2_RC_SUCCESS;
}

/* The ESYS_TR of an NV index (ESAPI reads its public area); close it with Esys_TR_Close. */
static TSS2_RC nv_handle(ctpm_context *ctx, uint32_t index, ESYS_TR *tr) {
    *tr = ESYS_TR_NONE;
    return Esys_TR_FromTPMPublic(ctx->esys, index, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, tr);
}

uint32_t ctpm_nv_read_public(ctpm_context *ctx, uint32_t index, uint32_t *attributes, uint16_t *data_size, uint16_t *name_alg) {
    ESYS_TR tr;
    TSS2_RC rc = nv_handle(ctx, index, &tr);
    if (rc != TSS2_RC_SUCCESS) return rc;
    TPM2B_NV_PUBLIC *pub = NULL;
    rc = Esys_NV_ReadPublic(ctx->esys, tr, ESYS_TR_NONE, ESYS_TR_NONE, ESYS_TR_NONE, &pub, NULL);
    if (rc == TSS2_RC_SUCCESS) {
        *attributes = pub->nvPublic.attributes;
        *data_size = pub->nvPublic.dataSize;
        *name_alg = pub->nvPublic.nameAlg;
    }
    Esys_Free(pub);
    Esys_TR_Close(ctx->esys, &tr);
    return rc;
}

uint32_t ctpm_nv_define(ctpm_context *ctx, uint32_t index, uint32_t attributes, uint16_t data_size, uint16_t name_alg) {
    TPM2B_AUTH auth = {0};
    TPM2B_NV_PUBLIC info = {0};
    info.nvPublic.nvIndex = index;
    info.nvPublic.nameAlg = name_alg;
    info.nvPublic.attributes = attributes;
    info.nvPublic.dataSize = data_size;
    ESYS_TR tr = ESYS_TR_NONE;
    TSS2_RC rc = Esys_NV_DefineSpace(ctx->esys, ESYS_TR_RH_OWNER, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE, &auth, &info, &tr);
    if (rc == TSS2_RC_SUCCESS) Esys_TR_Close(ctx->esys, &tr);
    return rc;
}

uint32_t ctpm_nv_increment(ctpm_context *ctx, uint32_t index) {
    ESYS_TR tr;
    TSS2_RC rc = nv_handle(ctx, index, &tr);
    if (rc != TSS2_RC_SUCCESS) return rc;
    rc = Esys_NV_Increment(ctx->esys, ESYS_TR_RH_OWNER, tr, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE);
    Esys_TR_Close(ctx->esys, &tr);
    return rc;
}

uint32_t ctpm_nv_read(ctpm_context *ctx, uint32_t index, uint8_t *out, uint16_t size) {
    if (size > 64) return CTPM_RC_BAD_VALUE;
    ESYS_TR tr;
    TSS2_RC rc = nv_handle(ctx, index, &tr);
    if (rc != TSS2_RC_SUCCESS) return rc;
    TPM2B_MAX_NV_BUFFER *data = NULL;
    rc = Esys_NV_Read(ctx->esys, ESYS_TR_RH_OWNER, tr, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE, size, 0, &data);
    if (rc == TSS2_RC_SUCCESS) {
        if (data->size != size) rc = CTPM_RC_BAD_SIZE;
        else memcpy(out, data->buffer, size);
    }
    Esys_Free(data);
    Esys_TR_Close(ctx->esys, &tr);
    return rc;
}

uint32_t ctpm_nv_undefine(ctpm_context *ctx, uint32_t index) {
    ESYS_TR tr;
    TSS2_RC rc = nv_handle(ctx, index, &tr);
    if (rc != TSS2_RC_SUCCESS) return rc;
    rc = Esys_NV_UndefineSpace(ctx->esys, ESYS_TR_RH_OWNER, tr, ESYS_TR_PASSWORD, ESYS_TR_NONE, ESYS_TR_NONE);
    if (rc != TSS2_RC_SUCCESS) Esys_TR_Close(ctx->esys, &tr);
    return rc;
}
