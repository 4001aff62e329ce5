#!/usr/bin/env bash
# Builds OpenSSH's `sk-dummy` FIDO middleware (regress/misc/sk-dummy: an authenticator in software that
# implements OpenSSH's middleware interface, sk-api.h) for the INSTALLED OpenSSH, and prints its path.
#
#   contrib/sk-dummy.sh
#
# The source is the installed OpenSSH's version from Debian's source archive, fetched through apt with a
# private sources list (contrib/debian-source.sh: nothing under /etc changes, nothing lands in the
# checkout). The library is built once per version and cached as
# ${COFFER_SK_DUMMY_CACHE:-/var/tmp/coffer-sk-dummy}/VERSION/sk-dummy.so (the source is not kept).
# The cheapest build that is still OpenSSH's own: `./configure` for config.h (about half a minute of
# CPU), then the five files OpenSSH's Makefile links into sk-dummy.so (sk-dummy.c, fatal.c, ed25519.c,
# hash.c, and openbsd-compat's sha2.c in place of the whole compat library), with the compiler flags
# configure chose, against libcrypto.
#
# Exit status: 0 and the path on stdout; 1 the build failed (its log on stderr); 77 cannot run here
# (no network, no source for this version, no compiler or libcrypto headers), reason on stderr.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
cannot() { echo "sk-dummy.sh: cannot build OpenSSH's sk-dummy here: $*" >&2; exit 77; }
# shellcheck source=contrib/debian-source.sh
. "$here/debian-source.sh"

[ -x /usr/bin/ssh ] || cannot "/usr/bin/ssh is not installed (apt: openssh-client)"
command -v cc > /dev/null || cannot "no C compiler (cc; apt: gcc)"
command -v make > /dev/null || cannot "no make (apt: make)"
[ -r /usr/include/openssl/evp.h ] || cannot "no libcrypto headers (apt: libssl-dev)"
# "OpenSSH_9.2p1 Debian-2+deb12u6, OpenSSL …" → 9.2p1
version="$(/usr/bin/ssh -V 2>&1 | sed -n 's/^OpenSSH_\([0-9.p]*\).*/\1/p')"
[ -n "$version" ] || cannot "cannot tell the installed OpenSSH's version from ssh -V"
tree="${COFFER_SK_DUMMY_CACHE:-/var/tmp/coffer-sk-dummy}/$version"

# Builds sk-dummy.so from OpenSSH's upstream tarball $1 into $2 (the source is unpacked in $2/src and
# removed once the library is there).
fill() {
    local src="$2/src"
    mkdir -p "$src"
    tar -xf "$1" -C "$src" --strip-components=1 || cannot "cannot unpack $1"
    [ -f "$src/regress/misc/sk-dummy/sk-dummy.c" ] || cannot "$1 has no regress/misc/sk-dummy"
    # Only config.h is wanted: no optional library is looked for.
    (cd "$src" && ./configure --without-zlib --without-pam --without-selinux --without-kerberos5 --without-libedit \
        --with-security-key-builtin=no > "$2/configure.log" 2>&1) || { tail -30 "$2/configure.log" >&2; exit 1; }
    # The flags configure chose, as its Makefile compiles sk-dummy's objects (.c.lo: CFLAGS_NOPIE PICFLAG CPPFLAGS).
    local flags
    flags="$(cd "$src" && printf 'print-flags:\n\t@echo $(CFLAGS_NOPIE) $(PICFLAG) $(CPPFLAGS)\n' | make -s -f Makefile -f - print-flags 2>/dev/null)" || true
    [ -n "$flags" ] || { echo "sk-dummy.sh: cannot read the compiler flags from OpenSSH's configured Makefile" >&2; exit 1; }
    # shellcheck disable=SC2086 # the flags are words
    (cd "$src" && cc $flags -shared -o "$2/sk-dummy.so" regress/misc/sk-dummy/sk-dummy.c regress/misc/sk-dummy/fatal.c \
        ed25519.c hash.c openbsd-compat/sha2.c -lcrypto -Wl,--no-undefined > "$2/build.log" 2>&1) \
        || { cat "$2/build.log" >&2; exit 1; }
    rm -rf "$src"
}
debian_source_tree COFFER_SK_DUMMY_CACHE "$tree" sk-dummy.so openssh "$version" fill "openssh=1:$version-*" openssh
echo "$tree/sk-dummy.so"
