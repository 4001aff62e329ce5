#!/usr/bin/env bash
# Runs python-secretstorage's own test suite (its tests/ directory) with the INSTALLED secretstorage
# (Debian's python3-secretstorage) against whatever serves org.freedesktop.secrets on the session bus
# in DBUS_SESSION_BUS_ADDRESS: gnome-keyring, or Coffer's front end (issue #44: it must pass as it
# does on gnome-keyring).
#
#   DBUS_SESSION_BUS_ADDRESS=… contrib/secretstorage-suite.sh
#
# tests/ at the installed version comes from the upstream release on PyPI (Debian's source archive
# carries the same tarball, but its mirror may not serve sources), checked against the SHA-256 PyPI's
# index gives for it, and is cached in ${COFFER_SECRETSTORAGE_CACHE:-/var/tmp/coffer-secretstorage}/VERSION;
# nothing lands in the checkout and nothing of it is committed.
#
# Exit status: 0 the suite passed (unittest's report on standard error: "Ran N tests", "OK (skipped=K)");
# 1 it failed; 77 cannot run here (no network, no release of this version), with the reason.
set -eu
cannot() { echo "secretstorage-suite.sh: cannot run python-secretstorage's suite here: $*" >&2; exit 77; }

[ -n "${DBUS_SESSION_BUS_ADDRESS:-}" ] || { echo "secretstorage-suite.sh: DBUS_SESSION_BUS_ADDRESS is not set" >&2; exit 2; }
python=/usr/bin/python3
[ -x "$python" ] || cannot "no $python"
full="$(dpkg-query -W -f='${Version}' python3-secretstorage 2>/dev/null)" || cannot "python3-secretstorage is not installed"
version="${full%-*}"
version="${version#*:}"
cache="${COFFER_SECRETSTORAGE_CACHE:-/var/tmp/coffer-secretstorage}"
tree="$cache/$version"

if [ ! -f "$tree/tests/test_item.py" ]; then
    mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] || cannot "$cache is not writable by $(id -un) (set COFFER_SECRETSTORAGE_CACHE)"
    work="$(mktemp -d "$cache/.prepare-XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    # The release's sdist, found in PyPI's simple index with its SHA-256, downloaded and checked.
    "$python" - "$version" "$work/release.tar.gz" <<'PY' || cannot "the SecretStorage $version release could not be fetched from PyPI (no network?)"
import hashlib, re, sys, urllib.request
version, out = sys.argv[1], sys.argv[2]
index = urllib.request.urlopen("https://pypi.org/simple/secretstorage/", timeout=60).read().decode()
name = "SecretStorage-%s.tar.gz" % version
links = [l for l in re.findall(r'href="([^"]+)"', index) if l.split("#")[0].endswith("/" + name) and "#sha256=" in l]
if not links:
    sys.exit("no %s in the index" % name)
url, digest = links[0].split("#sha256=")
data = urllib.request.urlopen(url, timeout=120).read()
if hashlib.sha256(data).hexdigest() != digest:
    sys.exit("%s does not have the SHA-256 the index gives" % name)
open(out, "wb").write(data)
PY
    mkdir -p "$work/tree"
    tar -xzf "$work/release.tar.gz" -C "$work/tree" --strip-components=1 --wildcards --no-wildcards-match-slash '*/tests' \
        || cannot "cannot extract tests/ from the release"
    [ -f "$work/tree/tests/test_item.py" ] || cannot "the release has no tests/test_item.py"
    if [ ! -f "$tree/tests/test_item.py" ]; then
        rm -rf "$tree.old"
        [ ! -e "$tree" ] || mv -T "$tree" "$tree.old"
        mv -T "$work/tree" "$tree" 2>/dev/null || true
    fi
    rm -rf "$work"
    trap - EXIT
fi

# The suite runs from a copy (the cache may be shared and read-only), with the installed module: the
# copy holds tests/ alone, so `import secretstorage` finds Debian's.
run="$(mktemp -d /tmp/coffer-secretstorage-XXXXXX)"
trap 'rm -rf "$run"' EXIT
cp -r "$tree/tests" "$run/tests"
cd "$run"
exec "$python" -m unittest discover -s tests -t . -v
