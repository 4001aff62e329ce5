/*
 * CSecurityX509: X.509 certificates through OpenSSL 3 (d2i_X509 and the X509_* accessors). See
 * include/CSecurityX509.h for the contract. The error queue is cleared on every failure: callers
 * get NULL, never OpenSSL's text.
 */
#include "CSecurityX509.h"

#include <openssl/asn1.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <stdlib.h>
#include <string.h>

static int copy_bytes(csx_bytes *out, const unsigned char *p, size_t n)
{
    out->ptr = NULL;
    out->len = 0;
    if (n == 0) return 1;
    out->ptr = malloc(n);
    if (out->ptr == NULL) return 0;
    memcpy(out->ptr, p, n);
    out->len = n;
    return 1;
}

/* The content of a DER TLV that i2d produced (the bytes after its tag and length). */
static int copy_content(csx_bytes *out, const unsigned char *der, long der_len)
{
    const unsigned char *p = der;
    long content_len = 0;
    int tag = 0, xclass = 0;
    int r = ASN1_get_object(&p, &content_len, &tag, &xclass, der_len);
    /* 0x80: an error; 0x01: an indefinite length (never from i2d). */
    if ((r & 0x80) != 0 || (r & 0x01) != 0 || p + content_len != der + der_len) return 0;
    return copy_bytes(out, p, (size_t)content_len);
}

/* i2d of `name` into `out` as content (without the outer SEQUENCE). */
static int name_content(csx_bytes *out, const X509_NAME *name)
{
    unsigned char *der = NULL;
    int n = i2d_X509_NAME(name, &der);
    if (n <= 0) return 0;
    int ok = copy_content(out, der, n);
    OPENSSL_free(der);
    return ok;
}

/* Apple's normalization of a PrintableString (RFC 5280 §7.1's older rules, as the keychain applies
   them): ASCII letters in upper case, each run of blanks one space, none at either end. Writes at
   most `n` bytes into `out`; returns how many. */
static size_t normalize_printable(const unsigned char *in, size_t n, unsigned char *out)
{
    size_t w = 0;
    int blank = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = in[i];
        if (c == ' ' || c == '\t') {
            if (!blank && w > 0) out[w++] = ' ';
            blank = 1;
            continue;
        }
        blank = 0;
        out[w++] = (c >= 'a' && c <= 'z') ? (unsigned char)(c - 'a' + 'A') : c;
    }
    if (w > 0 && out[w - 1] == ' ') w--;
    return w;
}

/* The normalized content of `src`: a copy of the name with its PrintableString values normalized,
   re-encoded by OpenSSL. Multi-valued RDNs stay multi-valued. */
static int normalized_name(csx_bytes *out, const X509_NAME *src)
{
    X509_NAME *n = X509_NAME_new();
    if (n == NULL) return 0;
    int ok = 1, previous_set = -1;
    for (int i = 0; ok && i < X509_NAME_entry_count(src); i++) {
        const X509_NAME_ENTRY *e = X509_NAME_get_entry(src, i);
        const ASN1_OBJECT *obj = X509_NAME_ENTRY_get_object(e);
        const ASN1_STRING *v = X509_NAME_ENTRY_get_data(e);
        int set = X509_NAME_ENTRY_set(e);
        int type = ASN1_STRING_type(v);
        const unsigned char *bytes = ASN1_STRING_get0_data(v);
        int len = ASN1_STRING_length(v);
        unsigned char *normal = NULL;
        if (type == V_ASN1_PRINTABLESTRING && len > 0) {
            normal = malloc((size_t)len);
            if (normal == NULL) { ok = 0; break; }
            len = (int)normalize_printable(bytes, (size_t)len, normal);
            bytes = normal;
        }
        static const unsigned char empty[1] = { 0 };
        ok = X509_NAME_add_entry_by_OBJ(n, obj, type, len > 0 ? bytes : empty, len, -1,
                                        (i > 0 && set == previous_set) ? -1 : 0);
        previous_set = set;
        free(normal);
    }
    if (ok) ok = name_content(out, n);
    X509_NAME_free(n);
    return ok;
}

static int entry_kind(int nid)
{
    switch (nid) {
    case NID_commonName: return CSX_ENTRY_COMMON_NAME;
    case NID_organizationalUnitName: return CSX_ENTRY_ORGANIZATIONAL_UNIT;
    case NID_organizationName: return CSX_ENTRY_ORGANIZATION;
    case NID_description: return CSX_ENTRY_DESCRIPTION;
    case NID_pkcs9_emailAddress: return CSX_ENTRY_EMAIL_ADDRESS;
    default: return CSX_ENTRY_OTHER;
    }
}

static int subject_entries(csx_certificate *c, const X509_NAME *subject)
{
    int count = X509_NAME_entry_count(subject);
    if (count <= 0) return 1;
    c->subject = calloc((size_t)count, sizeof *c->subject);
    if (c->subject == NULL) return 0;
    for (int i = 0; i < count; i++) {
        const X509_NAME_ENTRY *e = X509_NAME_get_entry(subject, i);
        csx_entry *out = &c->subject[c->subject_count++];
        out->kind = entry_kind(OBJ_obj2nid(X509_NAME_ENTRY_get_object(e)));
        unsigned char *utf8 = NULL;
        int n = ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(e));
        if (n >= 0) {
            out->has_text = 1;
            int ok = copy_bytes(&out->utf8, utf8, (size_t)n);
            OPENSSL_free(utf8);
            if (!ok) return 0;
        } else {
            ERR_clear_error();
        }
    }
    return 1;
}

static int alternative_names(csx_certificate *c, const X509 *x)
{
    int critical = 0;
    GENERAL_NAMES *names = X509_get_ext_d2i(x, NID_subject_alt_name, &critical, NULL);
    if (names == NULL) {
        ERR_clear_error();
        return 1;
    }
    int count = sk_GENERAL_NAME_num(names), ok = 1;
    if (count > 0) {
        c->san_emails = calloc((size_t)count, sizeof *c->san_emails);
        c->san_dns = calloc((size_t)count, sizeof *c->san_dns);
        ok = c->san_emails != NULL && c->san_dns != NULL;
    }
    for (int i = 0; ok && i < count; i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(names, i);
        if (g->type == GEN_EMAIL) {
            ok = copy_bytes(&c->san_emails[c->san_email_count++], ASN1_STRING_get0_data(g->d.rfc822Name),
                            (size_t)ASN1_STRING_length(g->d.rfc822Name));
        } else if (g->type == GEN_DNS) {
            ok = copy_bytes(&c->san_dns[c->san_dns_count++], ASN1_STRING_get0_data(g->d.dNSName),
                            (size_t)ASN1_STRING_length(g->d.dNSName));
        }
    }
    GENERAL_NAMES_free(names);
    return ok;
}

/* The public key's raw form for the algorithms a SecKey can hold here. */
static int public_key(csx_certificate *c, const X509 *x)
{
    EVP_PKEY *key = X509_get0_pubkey(x);
    if (key == NULL) {
        ERR_clear_error();
        return 1;
    }
    switch (EVP_PKEY_get_base_id(key)) {
    case EVP_PKEY_RSA:
        c->key_kind = CSX_KEY_RSA;
        return 1;
    case EVP_PKEY_ED25519: {
        unsigned char raw[32];
        size_t n = sizeof raw;
        if (EVP_PKEY_get_raw_public_key(key, raw, &n) != 1 || n != 32) {
            ERR_clear_error();
            return 1;
        }
        c->key_kind = CSX_KEY_ED25519;
        return copy_bytes(&c->public_key, raw, n);
    }
    case EVP_PKEY_EC: {
        char group[64];
        size_t field = 0;
        int kind = CSX_KEY_OTHER;
        if (EVP_PKEY_get_group_name(key, group, sizeof group, NULL) != 1) {
            ERR_clear_error();
            return 1;
        }
        if (strcmp(group, "prime256v1") == 0) { field = 32; kind = CSX_KEY_P256; }
        else if (strcmp(group, "secp384r1") == 0) { field = 48; kind = CSX_KEY_P384; }
        else if (strcmp(group, "secp521r1") == 0) { field = 66; kind = CSX_KEY_P521; }
        else return 1;
        /* The affine coordinates, whatever point form the certificate used. */
        BIGNUM *bx = NULL, *by = NULL;
        int ok = 1;
        unsigned char point[1 + 2 * 66];
        if (EVP_PKEY_get_bn_param(key, OSSL_PKEY_PARAM_EC_PUB_X, &bx) == 1 && EVP_PKEY_get_bn_param(key, OSSL_PKEY_PARAM_EC_PUB_Y, &by) == 1
            && BN_bn2binpad(bx, point + 1, (int)field) == (int)field && BN_bn2binpad(by, point + 1 + field, (int)field) == (int)field) {
            point[0] = 0x04;
            c->key_kind = kind;
            ok = copy_bytes(&c->public_key, point, 1 + 2 * field);
        } else {
            ERR_clear_error();
        }
        BN_free(bx);
        BN_free(by);
        return ok;
    }
    default:
        return 1;
    }
}

csx_certificate *csx_parse(const uint8_t *der, size_t len)
{
    if (der == NULL || len == 0 || len > 0x7fffffff) return NULL;
    const unsigned char *p = der;
    X509 *x = d2i_X509(NULL, &p, (long)len);
    if (x == NULL || p != der + len) {
        X509_free(x);
        ERR_clear_error();
        return NULL;
    }
    /* DER, not merely something OpenSSL reads: encoding it again gives the same bytes. */
    unsigned char *again = NULL;
    int n = i2d_X509(x, &again);
    int same = n > 0 && (size_t)n == len && memcmp(again, der, len) == 0;
    OPENSSL_free(again);
    csx_certificate *c = same ? calloc(1, sizeof *c) : NULL;
    int ok = c != NULL;
    if (ok) {
        c->version = (int)X509_get_version(x) + 1;
        unsigned char *serial = NULL;
        int serial_len = i2d_ASN1_INTEGER(X509_get0_serialNumber(x), &serial);
        ok = serial_len > 0 && copy_content(&c->serial, serial, serial_len);
        OPENSSL_free(serial);
    }
    ok = ok && normalized_name(&c->normalized_subject, X509_get_subject_name(x))
        && normalized_name(&c->normalized_issuer, X509_get_issuer_name(x));
    if (ok) {
        const ASN1_OCTET_STRING *skid = X509_get0_subject_key_id(x);
        if (skid != NULL) {
            c->has_subject_key_id = 1;
            ok = copy_bytes(&c->subject_key_id, ASN1_STRING_get0_data(skid), (size_t)ASN1_STRING_length(skid));
        }
        ERR_clear_error();
    }
    if (ok) {
        const ASN1_BIT_STRING *bits = X509_get0_pubkey_bitstr(x);
        unsigned int digest_len = 0;
        ok = bits != NULL && EVP_Digest(ASN1_STRING_get0_data(bits), (size_t)ASN1_STRING_length(bits), c->public_key_sha1, &digest_len,
                                        EVP_sha1(), NULL) == 1 && digest_len == 20;
    }
    ok = ok && subject_entries(c, X509_get_subject_name(x)) && alternative_names(c, x) && public_key(c, x);
    X509_free(x);
    ERR_clear_error();
    if (!ok) {
        csx_free(c);
        return NULL;
    }
    return c;
}

void csx_free(csx_certificate *c)
{
    if (c == NULL) return;
    free(c->normalized_subject.ptr);
    free(c->normalized_issuer.ptr);
    free(c->serial.ptr);
    free(c->subject_key_id.ptr);
    for (size_t i = 0; i < c->subject_count; i++) free(c->subject[i].utf8.ptr);
    free(c->subject);
    for (size_t i = 0; i < c->san_email_count; i++) free(c->san_emails[i].ptr);
    free(c->san_emails);
    for (size_t i = 0; i < c->san_dns_count; i++) free(c->san_dns[i].ptr);
    free(c->san_dns);
    free(c->public_key.ptr);
    free(c);
}
