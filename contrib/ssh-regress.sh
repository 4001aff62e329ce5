#!/usr/bin/env bash
# Runs OpenSSH's own regression scripts for the agent against the INSTALLED OpenSSH programs, with
# cofferd as the agent (issue #27).
#
#   contrib/ssh-regress.sh COFFERD [SCRIPT...]      (default: agent agent-getpeereid agent-timeout
#                                                    agent-restrict agent-ptrace)
#
# regress/ at the installed OpenSSH's version comes from Debian's source archive through apt with a
# private sources list (contrib/debian-source.sh; nothing under /etc changes, nothing lands in the
# checkout) and is cached in ${COFFER_SSH_REGRESS_CACHE:-/var/tmp/coffer-openssh-regress}/VERSION.
# Nothing else is compiled (OpenSSH's sk-dummy FIDO middleware aside, contrib/sk-dummy.sh, so that the
# scripts' loops include FIDO keys): each script runs under regress/test-exec.sh with the TEST_SSH_* variables
# naming /usr/bin/ssh, ssh-add, ssh-keygen and /usr/sbin/sshd, and TEST_SSH_SSHAGENT naming
# contrib/ssh-regress-agent.sh, which gives ssh-agent's command line (-s, -a, -d, -k) to cofferd.
# sshd runs in inetd mode under each connection's ProxyCommand, as test-exec.sh sets it up: no port.
#
# COFFER_SSH_REGRESS_AGENT=openssh runs the same scripts with /usr/bin/ssh-agent instead (a baseline:
# every difference between the two runs is cofferd's).
#
# Output: `FIDO-KEYS yes` (the scripts' loops include FIDO keys) or `FIDO-KEYS no`, each script's own
# output, then one line per script:
#   RESULT <script> pass
#   RESULT <script> fail: <each failure the script reported, separated by " | ">
#   RESULT <script> skip: <the script's own reason>
# Exit status: 0 all scripts ran (whatever their results: the caller judges them, see
# Tests/CofferEndToEndTests/SSHOpenSSHTests.swift and contrib/ssh-regress.md); 1 a script could not
# be run; 77 cannot run here (no network, no source for this version, no sshd), reason on stderr.
set -eu
[ $# -ge 1 ] || { echo "usage: $0 COFFERD [SCRIPT...]" >&2; exit 2; }
cofferd="$1"
shift
scripts=("$@")
[ ${#scripts[@]} -gt 0 ] || scripts=(agent agent-getpeereid agent-timeout agent-restrict agent-ptrace)
here="$(cd "$(dirname "$0")" && pwd)"
cannot() { echo "ssh-regress.sh: cannot run OpenSSH's regression scripts here: $*" >&2; exit 77; }
# shellcheck source=contrib/debian-source.sh
. "$here/debian-source.sh"

for tool in /usr/bin/ssh /usr/bin/ssh-add /usr/bin/ssh-keygen /usr/sbin/sshd; do
    [ -x "$tool" ] || cannot "$tool is not installed (apt: openssh-client, openssh-server)"
done
# "OpenSSH_9.2p1 Debian-2+deb12u6, OpenSSL …" → 9.2p1
version="$(/usr/bin/ssh -V 2>&1 | sed -n 's/^OpenSSH_\([0-9.p]*\).*/\1/p')"
[ -n "$version" ] || cannot "cannot tell the installed OpenSSH's version from ssh -V"
tree="${COFFER_SSH_REGRESS_CACHE:-/var/tmp/coffer-openssh-regress}/$version"

# Unpacks regress/ from OpenSSH's upstream tarball $1 into $2.
fill() {
    tar -xf "$1" -C "$2" --strip-components=1 --wildcards '*/regress' || cannot "cannot extract regress/ from $1"
}
debian_source_tree COFFER_SSH_REGRESS_CACHE "$tree" regress/test-exec.sh openssh "$version" fill "openssh=1:$version-*" openssh

# sshd refuses to start as root without its privilege separation directory (the package makes it
# at boot through systemd-tmpfiles, which a container may never run).
if [ "$(id -u)" -eq 0 ] && [ ! -d /run/sshd ]; then
    mkdir -m 0755 /run/sshd 2>/dev/null || cannot "sshd needs /run/sshd and it cannot be made"
fi

run="$(mktemp -d /tmp/coffer-ssh-regress-XXXXXX)"
# Stops every agent a script left running (a script that stops at `fatal` never runs ssh-agent -k),
# and only those: the agents file lists what ssh-regress-agent.sh started, and a pid counts only
# while its command line still names this run's directory (a pid reused by another process does not).
ours() { tr '\0' ' ' 2>/dev/null < "/proc/$1/cmdline" | grep -qF "$run/"; }
cleanup() {
    if [ -f "$run/agents" ]; then
        while read -r pid _; do
            if ours "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
        done < "$run/agents"
        sleep 1
        while read -r pid _; do
            if ours "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
        done < "$run/agents"
    fi
    [ -n "${COFFER_SSH_REGRESS_KEEP:-}" ] && echo "kept $run" >&2 || rm -rf "$run"
}
trap cleanup EXIT

# test-exec.sh's objects: a config.h saying what the installed OpenSSH was built with, where a
# script asks (config_defined); the few helper programs of a build tree are not needed by these scripts.
mkdir -p "$run/build"
printf '#define HAVE_SO_PEERCRED 1\n' > "$run/build/config.h"

# FIDO keys: Debian's OpenSSH is built with them (ENABLE_SK), and test-exec.sh adds the sk-* key types to
# every script's loops when it finds OpenSSH's sk-dummy middleware in the script's object directory (it
# then starts the agent with -P/*). contrib/sk-dummy.sh builds it from the same source (cached); where
# it cannot (no compiler), the scripts run without FIDO keys, as test-exec.sh does without sk-dummy.
# COFFER_SSH_REGRESS_SK=no leaves them out.
sk_dummy=""
if [ "${COFFER_SSH_REGRESS_SK:-yes}" != no ]; then
    if sk_dummy="$("$here/sk-dummy.sh")"; then
        printf '#define ENABLE_SK 1\n' >> "$run/build/config.h"
    else
        echo "ssh-regress.sh: running without FIDO keys: contrib/sk-dummy.sh could not build sk-dummy (above)" >&2
        sk_dummy=""
    fi
fi
echo "FIDO-KEYS $([ -n "$sk_dummy" ] && echo yes || echo no)"

if [ "${COFFER_SSH_REGRESS_AGENT:-cofferd}" = openssh ]; then
    agent=/usr/bin/ssh-agent
else
    [ -x "$cofferd" ] || { echo "ssh-regress.sh: $cofferd is not executable" >&2; exit 2; }
    agent="$here/ssh-regress-agent.sh"
fi

status=0
results=()
for script in "${scripts[@]}"; do
    script="${script%.sh}"
    [ -f "$tree/regress/$script.sh" ] || { echo "ssh-regress.sh: no regress/$script.sh in $tree" >&2; exit 1; }
    obj="$run/$script"
    mkdir -p "$obj"
    if [ -n "$sk_dummy" ]; then
        mkdir -p "$obj/misc/sk-dummy" && cp "$sk_dummy" "$obj/misc/sk-dummy/sk-dummy.so"
    fi
    echo "== $script.sh"
    out="$run/$script.out"
    rc=0
    # Each script in a fresh environment of its own: no agent of the caller's, no sudo.
    (
        cd "$obj"
        unset SSH_AUTH_SOCK SSH_AGENT_PID SUDO
        export COFFER_SSH_REGRESS_COFFERD="$cofferd" COFFER_SSH_REGRESS_RUN="$run"
        export TEST_SHELL=sh TEST_SSH_UNSAFE_PERMISSIONS=1 BUILDDIR="$run/build" OBJ="$obj"
        export TEST_SSH_SSH=/usr/bin/ssh TEST_SSH_SSHD=/usr/sbin/sshd TEST_SSH_SSHADD=/usr/bin/ssh-add
        export TEST_SSH_SSHKEYGEN=/usr/bin/ssh-keygen TEST_SSH_SSHKEYSCAN=/usr/bin/ssh-keyscan TEST_SSH_SSHAGENT="$agent"
        exec timeout -k 10 600 sh "$tree/regress/test-exec.sh" "$obj" "$tree/regress/$script.sh"
    ) > "$out" 2>&1 || rc=$?
    cat "$out"
    # test-exec.sh's `fail` appends its log since the last `trace` to failed-regress.log: "trace: step"
    # lines, then "FAIL: message" (`fatal` adds "FATAL: message" first). Each failure is reported
    # as "[step] message", once.
    failures="$(awk '/^trace: / { step = substr($0, 8) } /^FAIL: / { print "[" step "] " substr($0, 7) }' "$obj/failed-regress.log" 2>/dev/null \
        | awk '!seen[$0]++' | paste -sd'|' - | sed 's/|/ | /g' || true)"
    # `skip` prints "SKIPPED: reason"; a few scripts print "skipped (…)" / "Skipped: …" and exit 0.
    skipped="$(grep -m1 -i -E '^(SKIPPED: |skipped)' "$out" | sed -E 's/^(SKIPPED: |Skipped: )//' || true)"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        results+=("RESULT $script fail: timed out after 600 s")
    elif [ "$rc" -ne 0 ] || [ -n "$failures" ]; then
        results+=("RESULT $script fail: ${failures:-exit status $rc}")
    elif [ -n "$skipped" ]; then
        results+=("RESULT $script skip: $skipped")
    elif grep -q "^ok " "$out"; then
        results+=("RESULT $script pass")
    else
        results+=("RESULT $script fail: no result line (exit status $rc)")
    fi
done
printf '%s\n' "${results[@]}"
exit "$status"
