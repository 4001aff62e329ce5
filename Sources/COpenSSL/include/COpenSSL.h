/*
 * COpenSSL: Coffer's one C wall over OpenSSL 3 libcrypto (linked with -lcrypto). It holds three
 * walls, one header and one .c file each, and their users:
 *
 *   CSSHCrypto.h (csshcrypto.c, cssh_*)               ECDSA and RSA SSH keys, for CofferSSHKeys;
 *   CSecretServiceCrypto.h (csecretservicecrypto.c, css_*)
 *                                                     the Secret Service's DH, HKDF and AES-128-CBC,
 *                                                     for CofferSecretServiceCrypto;
 *   CSecurityX509.h (csecurityx509.c, csx_*)          the X.509 parser, for the Security module's
 *                                                     SecCertificate.
 *
 * The wall's rule: what is written in C here is only calls into libcrypto and the copying around
 * them (caller buffers in, caller buffers out, OpenSSL objects freed before a call returns, with
 * the clearing functions when they held a secret). No protocol, encoding or cryptography of its
 * own, and no OpenSSL object handed to Swift. Each Swift module calls only its own wall's
 * functions (CofferArchitectureTests checks the prefixes).
 */
#ifndef COPENSSL_H
#define COPENSSL_H

#include "CSSHCrypto.h"
#include "CSecretServiceCrypto.h"
#include "CSecurityX509.h"

#endif
