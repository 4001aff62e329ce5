/* The C ABI of authenticator plugins is a header (include/coffer/coffer_plugin.h), and so is what Coffer
 * uses of OpenSSH's FIDO middleware interface (include/coffer/coffer_sk_api.h); SwiftPM needs a
 * source file to build the target. Nothing here is linked into plugins or the host. */
#include "coffer/coffer_plugin.h"

_Static_assert(sizeof(((struct coffer_plugin_v1 *)0)->abi_version) == 4, "abi_version is a u32");

/* The middleware interface's response must have OpenSSH's struct sk_sign_response layout (LP64). */
#include "coffer/coffer_sk_api.h"
_Static_assert(offsetof(struct coffer_sk_sign_response, counter) == 4, "sk_sign_response.counter");
_Static_assert(offsetof(struct coffer_sk_sign_response, sig_r) == sizeof(void *), "sk_sign_response.sig_r");
_Static_assert(offsetof(struct coffer_sk_sign_response, sig_s_len) == 4 * sizeof(void *), "sk_sign_response.sig_s_len");
