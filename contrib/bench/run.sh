#!/usr/bin/env bash
# Every Coffer benchmark, one command; prints Markdown tables (not a test: numbers vary with the
# machine, so each table carries the machine's own floors — a bare socket echo, /bin/true, keyctl —
# measured in the same run).
#
#   contrib/bench/run.sh [all]      Coffer alone, then Coffer beside its peers (~12 min on the 2-core VM)
#   contrib/bench/run.sh coffer     Coffer alone: the keychain library at 1k/100k items (lookups, adds,
#                                   passcode change with key rotation), and a real
#                                   agent at 1k/100k/1M items (round trip, throughput at 1/4/16/64
#                                   clients, unlock vs Argon2id, cold start, CLI process, RSS, VmLck),
#                                   where a new connection's time goes (accept, thread, HELLO,
#                                   identity, first GET), and what identifying callers costs (below)
#   contrib/bench/run.sh access-control  Only what access control costs (a protected read in its reuse
#                                   window vs a plain one; an evaluation through the plugin host)
#   contrib/bench/run.sh ssh        Only cofferd's ssh-agent socket beside OpenSSH's ssh-agent on the same 100
#                                   keys (also part of `all`): SIGN_REQUEST round trip, `ssh-add -l`, `ssh -T`
#                                   to an sshd started on 127.0.0.1 (needs openssh-client; the `ssh -T` row is
#                                   skipped, with the reason, without sshd from openssh-server)
#   contrib/bench/run.sh identity   Only what identifying callers costs (also part of `coffer`): a signed
#                                   caller vs `identify-callers = no`, SHA-256 of a 50 MiB executable (~1 min)
#   contrib/bench/run.sh apple-api [N…]  Only Apple's API (issue #46): SecItemCopyMatching of one item through the
#                                   Security module on a warm process against the native client's call on a
#                                   persistent connection, at N items (default 1000 10000), and the first call
#                                   of a process of each (connect, HELLO, identification), reported apart
#   contrib/bench/run.sh peers [N…] Coffer, gnome-keyring, pass and keyctl at N items (default 1k/10k/100k)
#   contrib/bench/run.sh git [N]    git's credential helpers: coffer, store, libsecret on gnome-keyring
#                                   (also part of `all` and `peers`; N runs each, default 200)
#   contrib/bench/run.sh secret-service [N…]  Only the Secret Service beside gnome-keyring and a floor
#                                   provider, through secret-tool and one python3-dbus process reading
#                                   1,000 secrets at once (also part of `all`; default N 1000 10000;
#                                   COFFER_BENCH_BASELINE=FRONT-END adds a column for another front end)
#   contrib/bench/run.sh codec [N]  Only the attribute codec's share of a search returning N items' attributes
#                                   (also part of `coffer`; default 1000): the keychain's search, the agent's
#                                   reply frame, the front end's decode of it, the codec alone
#   contrib/bench/run.sh files      Only protected directories (issue #45; root): 256 MiB and 10,000 small files
#                                   in a protected directory against a plain one on the same ext4, and the
#                                   lock and unlock time per protected directory (contrib/bench/files.sh)
#   contrib/bench/run.sh sync [N]   Only the sync engine (issue #29; also part of `all`): N item changes
#                                   recorded and pushed to a local bare git remote, a second machine's first
#                                   sync, one change's way across, the remote's size and growth per change,
#                                   what compaction leaves (tree, shallow clone); beside git alone moving
#                                   the same bytes (default N 10000)
#
# Sizes for the Coffer-alone part: COFFER_BENCH_SIZES (default "1000 100000 1000000").
set -eu
cd "$(dirname "$0")/../.."
what="${1:-all}"
case "$what" in
    all|coffer|identity|access-control|ssh|peers|git|sync|codec|secret-service|apple-api|files) ;;
    *) echo "usage: contrib/bench/run.sh [all | coffer | identity | access-control | ssh | apple-api [N ...] | peers [N ...] | git [N] | sync [N] | codec [N] | secret-service [N ...] | files]" >&2; exit 2 ;;
esac
if [ "$what" = files ]; then
    bash contrib/deps.sh
    for p in cofferd coffer coffer-cli; do swift build -c release --product "$p" >/dev/null; done
    echo "## Protected directories (fscrypt)"
    echo
    bash contrib/bench/files.sh "$(swift build -c release --show-bin-path)"
    exit 0
fi
if [ "$what" = git ]; then
    shift
    echo "## git credential helpers"
    bash contrib/bench/git-credential.sh "$@"
    exit 0
fi
if [ "$what" = secret-service ]; then
    shift
    echo "## The Secret Service beside gnome-keyring"
    bash contrib/bench/secret-service.sh "$@"
    exit 0
fi
# bench_alone TITLE ARGUMENT...: one coffer-bench run under its heading, on a release build.
bench_alone() {
    bash contrib/deps.sh
    swift build -c release --product coffer-bench >/dev/null
    echo "## $1"
    echo
    "$(swift build -c release --show-bin-path)/coffer-bench" "${@:2}"
    exit 0
}
codec_title="The attribute codec in a search returning every item's attributes"
if [ "$what" = sync ]; then bench_alone "The sync engine over git" sync "${2:-10000}"; fi
if [ "$what" = codec ]; then bench_alone "$codec_title" codec "${2:-1000}"; fi
if [ "$what" = apple-api ]; then
    shift
    bash contrib/deps.sh
    for p in cofferd coffer coffer-bench; do swift build -c release --product "$p" >/dev/null; done
    echo "## Apple's API (import Security) beside the native client"
    echo
    echo "One agent per size; SecItemCopyMatching (service and account, kSecReturnData) on this process's one"
    echo "connection against AgentConnection.copyMatching on a persistent connection, alternating in blocks of 100."
    echo
    if [ $# -eq 0 ]; then set -- 1000 10000; fi
    "$(swift build -c release --show-bin-path)/coffer-bench" apple-api "$(swift build -c release --show-bin-path)" "$@"
    exit 0
fi
if [ "$what" != peers ]; then
    bash contrib/deps.sh
    for p in cofferd coffer coffer-cli coffer-bench coffer-plugin-host CofferPluginTest; do swift build -c release --product "$p" >/dev/null; done
    # Measure the binaries as installed (copied), not from the build tree (see peers.sh).
    bin="$(mktemp -d /tmp/coffer-bench-bin-XXXXXX)"
    trap 'rm -rf "$bin"' EXIT
    for p in cofferd coffer coffer-cli coffer-bench coffer-plugin-host libCofferPluginTest.so; do
        install -m 0755 "$(swift build -c release --show-bin-path)/$p" "$bin/"
    done
    if [ "$what" != identity ] && [ "$what" != access-control ] && [ "$what" != ssh ]; then
        echo "## The keychain library (no agent, no IPC)"
        echo
        "$bin/coffer-bench" keychain 1000 100000
        echo
        echo "## $codec_title"
        echo
        "$bin/coffer-bench" codec 1000
        echo
        echo "## Passcode change (key rotation: every non-Always item re-sealed)"
        echo
        "$bin/coffer-bench" rekey 1000 100000
        echo
        echo "## Backup create and restore"
        echo
        "$bin/coffer-bench" backup 1000 100000
        echo
        echo "## A real agent over its socket"
        echo
        # shellcheck disable=SC2086
        "$bin/coffer-bench" agent "$bin" ${COFFER_BENCH_SIZES:-1000 100000 1000000}
        echo
    fi
    if [ "$what" != identity ] && [ "$what" != access-control ] && [ "$what" != ssh ]; then
        echo "## Where a new connection's time goes"
        echo
        "$bin/coffer-bench" connection "$bin"
        echo
    fi
    if [ "$what" != access-control ] && [ "$what" != ssh ]; then
        echo "## What identifying callers costs (access groups)"
        echo
        echo "Two agents serve the same keychain (1,000 items per group) with the same configuration but one"
        echo "line: one identifies each connection at accept (pidfd, /proc/PID, the executable's SHA-256 from"
        echo "the cache, a verified manifest), the other has \`identify-callers = no\` (every caller unsigned,"
        echo "not examined). The caller is coffer-bench itself, signed by a temporary key."
        echo
        "$bin/coffer-bench" identity "$bin"
        echo
    fi
    if [ "$what" != identity ] && [ "$what" != ssh ]; then
        echo "## What access control costs (item ACLs, the plugin host)"
        echo
        echo "One agent with its plugin host (the Test plugin as the biometric sensor, answering at once):"
        echo "a protected item read inside its connection's reuse window against a plain item of the same size,"
        echo "alternating; and an evaluation that needs no person against a STATUS round trip."
        echo
        "$bin/coffer-bench" access-control "$bin"
    fi
    if [ "$what" = all ] || [ "$what" = ssh ]; then
        # OpenSSH's agent and client programs are needed (installed as root when missing; no service
        # comes with them). sshd is not installed here: installing openssh-server starts a system sshd.
        # When it is there, the benchmark starts its own on 127.0.0.1; sshd needs its privilege
        # separation directory, which the ssh service would otherwise create at start.
        if ! command -v ssh-agent >/dev/null && [ "$(id -u)" = 0 ]; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-client >/dev/null
        fi
        if [ -x /usr/sbin/sshd ] && [ ! -d /run/sshd ] && [ "$(id -u)" = 0 ]; then install -d -m 0755 /run/sshd; fi
        echo
        echo "## Beside OpenSSH's ssh-agent (the ssh-agent socket)"
        echo
        echo "cofferd's ssh-agent socket and an OpenSSH \`ssh-agent -D\` started for the run, holding the same 100"
        echo "Ed25519 keys (added with ADD_IDENTITY, as ssh-add does); measures alternate between the agents."
        echo
        "$bin/coffer-bench" ssh "$bin"
    fi
    if [ "$what" = all ]; then
        echo
        echo "## The sync engine over git"
        echo
        "$bin/coffer-bench" sync 10000
    fi
fi
if [ "$what" != coffer ] && [ "$what" != identity ] && [ "$what" != access-control ] && [ "$what" != ssh ]; then
    if [ $# -gt 0 ]; then shift; fi
    echo
    echo "## Beside gnome-keyring, pass and the kernel keyring"
    bash contrib/bench/peers.sh "$@"
    echo
    echo "## git credential helpers"
    bash contrib/bench/git-credential.sh
    echo
    echo "## The Secret Service beside gnome-keyring"
    bash contrib/bench/secret-service.sh
fi
