/* The C ABI of authenticator plugins is a header (include/coffer/coffer_plugin.h); SwiftPM needs a
 * source file to build the target. Nothing here is linked into plugins or the host. */
#include "coffer/coffer_plugin.h"

_Static_assert(sizeof(((struct coffer_plugin_v1 *)0)->abi_version) == 4, "abi_version is a u32");
