#!/usr/bin/env bash
# Builds pam_coffer.so with the C compiler only: no Swift runtime in a module that login, sshd or a
# display manager loads. Usage: contrib/pam_coffer/build.sh [OUTPUT]
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/pam_coffer.so}"
cc -shared -fPIC -O2 -Wall -Wextra -Werror -fstack-protector-strong -D_FORTIFY_SOURCE=2 \
   -I "$here/../../Sources/CCofferABI/include" \
   -Wl,-z,relro,-z,now -o "$out" "$here/pam_coffer.c" -lpam
echo "$out"
