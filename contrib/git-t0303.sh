#!/usr/bin/env bash
# Runs git's own conformance suite for credential helpers, t/t0303-credential-external.sh, against
# the INSTALLED git, with the helper `git credential-WORD` (WORD is one word: put a wrapper script
# named git-credential-WORD on PATH to pass arguments).
#
#   contrib/git-t0303.sh WORD
#
# git's t/ at the installed version comes from Debian's source archive through apt with a private
# sources list and lists directory (nothing under /etc changes, nothing lands in the checkout), and is
# cached in ${COFFER_GIT_T_CACHE:-/var/tmp/coffer-git-t}/VERSION. Nothing is compiled: test-lib.sh
# runs with GIT_TEST_INSTALLED and gets the few files it insists on written by hand.
#
# Exit status: 0 every test passed; 1 a test failed (the TAP output is printed); 77 cannot run here
# (no network, no source for this version), with the reason on standard error.
# COFFER_T0303_VERBOSE=1 runs t0303 with -v; COFFER_T0303_TIMEOUT_HELPER names a helper for its
# timeout tests (GIT_TEST_CREDENTIAL_HELPER_TIMEOUT).
set -eu
[ $# -eq 1 ] || { echo "usage: $0 HELPER-WORD" >&2; exit 2; }
helper="$1"
cannot() { echo "git-t0303.sh: cannot run git's t0303 here: $*" >&2; exit 77; }
# shellcheck source=contrib/debian-source.sh
. "$(dirname "$0")/debian-source.sh"

git_bin="$(command -v git)" || cannot "git is not installed"
version="$(git --version | awk '{print $3}')"
cache="${COFFER_GIT_T_CACHE:-/var/tmp/coffer-git-t}"
tree="$cache/$version"

# Unpacks t/ from git's upstream tarball $1 into $2, with what test-lib.sh insists on beside t/.
fill() {
    # Only the top-level t/ (not contrib/*/t).
    tar -xf "$1" -C "$2" --strip-components=1 --wildcards --no-wildcards-match-slash '*/t' \
        || cannot "cannot extract t/ from $1"
    [ -f "$2/t/t0303-credential-external.sh" ] || cannot "$1 has no t/t0303-credential-external.sh"
    # What test-lib.sh insists on beside t/, even with GIT_TEST_INSTALLED.
    cat > "$2/GIT-BUILD-OPTIONS" <<OPTIONS
SHELL_PATH='/bin/sh'
TEST_SHELL_PATH='/bin/sh'
PERL_PATH='/usr/bin/perl'
PYTHON_PATH='/usr/bin/python3'
DIFF='diff'
TAR='tar'
PAGER_ENV='LESS=FRX LV=-c'
NO_CURL=''
NO_EXPAT=''
NO_PERL=''
NO_PTHREADS=''
NO_PYTHON=''
NO_UNIX_SOCKETS=''
NO_GETTEXT=''
NO_REGEX=''
X=''
OPTIONS
    mkdir -p "$2/templates"
    cp -r /usr/share/git-core/templates "$2/templates/blt"
    mkdir -p "$2/t/helper"
    printf '#!/bin/sh\necho "test-tool stub: $*" >&2\nexit 1\n' > "$2/t/helper/test-tool"
    chmod 0755 "$2/t/helper/test-tool"
    mkdir -p "$2/bin-wrappers"
}
debian_source_tree COFFER_GIT_T_CACHE "$tree" t/t0303-credential-external.sh git "$version" fill "git=1:$version-*" git

run="$(mktemp -d /tmp/coffer-t0303-XXXXXX)"
trap 'rm -rf "$run"' EXIT
args=()
[ "${COFFER_T0303_VERBOSE:-}" = 1 ] && args+=(-v)
status=0
(
    cd "$tree/t"
    export GIT_TEST_INSTALLED="$(dirname "$git_bin")" GIT_TEST_CREDENTIAL_HELPER="$helper"
    # test-lib.sh writes t/test-results/ beside the test: keep that out of the (shared) cache too.
    export TEST_OUTPUT_DIRECTORY_OVERRIDE="$run"
    [ -n "${COFFER_T0303_TIMEOUT_HELPER:-}" ] && export GIT_TEST_CREDENTIAL_HELPER_TIMEOUT="$COFFER_T0303_TIMEOUT_HELPER"
    # The trash directory goes to a fresh place of our own (the cache may be shared and read-only).
    sh ./t0303-credential-external.sh --root="$run" "${args[@]}"
) > "$run.out" 2>&1 || status=$?
cat "$run.out"
if [ "$status" -eq 0 ] && grep -q '^# passed all' "$run.out" && ! grep -q '^not ok' "$run.out"; then
    rm -f "$run.out"
    exit 0
fi
rm -f "$run.out"
echo "git-t0303.sh: t0303 failed (exit $status)" >&2
exit 1
