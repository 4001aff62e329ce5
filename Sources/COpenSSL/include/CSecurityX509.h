/*
 * CSecurityX509 (in the COpenSSL target): the thin C wall between the Security module's
 * SecCertificate and OpenSSL 3 libcrypto's X.509 parser (d2i_X509). Plain C, byte buffers in and out: the Swift side never sees
 * an OpenSSL object. Only the Security module calls it (COpenSSL.h has the wall's rule).
 *
 * csx_parse reads one certificate and copies out, once, everything SecCertificate offers (names,
 * serial number, key identifiers, the public key's raw form); the OpenSSL object is freed before
 * csx_parse returns. Nothing here does ASN.1 or cryptography of its own: decoding, re-encoding a
 * name and SHA-1 are OpenSSL's.
 */
#ifndef CSECURITYX509_H
#define CSECURITYX509_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The kind of a subject attribute (csx_entry.kind), as SecCertificateCopySubjectSummary ranks them. */
#define CSX_ENTRY_OTHER 0
#define CSX_ENTRY_COMMON_NAME 1
#define CSX_ENTRY_ORGANIZATIONAL_UNIT 2
#define CSX_ENTRY_ORGANIZATION 3
#define CSX_ENTRY_DESCRIPTION 4
#define CSX_ENTRY_EMAIL_ADDRESS 5

/* The public key's algorithm (csx_certificate.key_kind). */
#define CSX_KEY_OTHER 0
#define CSX_KEY_P256 1
#define CSX_KEY_P384 2
#define CSX_KEY_P521 3
#define CSX_KEY_ED25519 4
#define CSX_KEY_RSA 5

/* A byte string owned by the certificate (freed by csx_free); `len` 0 with `ptr` NULL when absent. */
typedef struct {
    uint8_t *ptr;
    size_t len;
} csx_bytes;

/* One attribute of the subject name, in the certificate's order. `utf8` is its value as UTF-8
   (OpenSSL's ASN1_STRING_to_UTF8); `has_text` is 0 for a value that is not a string. */
typedef struct {
    int kind;
    int has_text;
    csx_bytes utf8;
} csx_entry;

/* What a certificate holds, copied out of OpenSSL. */
typedef struct {
    /* 1, 2 or 3. */
    int version;
    /* The content (no outer SEQUENCE tag and length) of the subject and issuer Names, normalized as
       Apple's keychain stores them (kSecAttrSubject, kSecAttrIssuer): PrintableString values in upper
       case, runs of blanks one space, no leading or trailing blanks. */
    csx_bytes normalized_subject;
    csx_bytes normalized_issuer;
    /* The serial number's INTEGER content (two's complement, big-endian). */
    csx_bytes serial;
    /* The subject key identifier extension's key identifier (absent: len 0). */
    csx_bytes subject_key_id;
    int has_subject_key_id;
    /* SHA-1 of the subjectPublicKey BIT STRING's bytes (kSecAttrPublicKeyHash). */
    uint8_t public_key_sha1[20];
    /* The subject's attributes. */
    csx_entry *subject;
    size_t subject_count;
    /* The subject alternative name's rfc822Name and dNSName entries, as they are (IA5 strings). */
    csx_bytes *san_emails;
    size_t san_email_count;
    csx_bytes *san_dns;
    size_t san_dns_count;
    /* The public key: CSX_KEY_…; for the NIST curves the uncompressed point 04 ‖ X ‖ Y, for Ed25519
       the 32-byte key, else absent. */
    int key_kind;
    csx_bytes public_key;
} csx_certificate;

/* Parses `der` (`len` bytes) as exactly one DER-encoded X.509 certificate, nothing before or after
   it. NULL if it is not one, or on allocation failure. Free the result with csx_free. */
csx_certificate *csx_parse(const uint8_t *der, size_t len);

/* Frees what csx_parse returned (NULL is fine). */
void csx_free(csx_certificate *certificate);

#ifdef __cplusplus
}
#endif

#endif
