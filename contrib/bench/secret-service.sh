#!/usr/bin/env bash
# The Secret Service on Coffer beside gnome-keyring (issue #26), through the same client: libsecret's
# `secret-tool`, each a whole process started by the shell, each provider on its own private session
# bus (dbus-run-session) in its own temporary HOME.
#   Coffer          cofferd + coffer-secret-service (signed with delegate-identity by a key made here)
#   gnome-keyring   gnome-keyring-daemon --components=secrets
#
#   contrib/bench/secret-service.sh [N ...]      (default: 1000 10000)
#
# Both stores hold the same N items (service svc(i % 97), account acct(i), secret secret-i, label l),
# filled directly: Coffer's through its library in the form its front end makes them (coffer-bench
# fill-secret-service), gnome-keyring's by writing its keyring file (gnome-keyring-fill.py). Only the
# timed operations go through the bus. Every lookup is checked to print the right secret. Prints one
# Markdown table per N: medians, and Coffer's ratio to gnome-keyring (below 1: Coffer is faster).
set -eu
cd "$(dirname "$0")/../.."
root="$PWD"
bash contrib/deps.sh
for p in cofferd coffer coffer-cli coffer-bench coffer-secret-service; do swift build -c release --product "$p" >/dev/null; done
sizes="${*:-1000 10000}"
work="$(mktemp -d /tmp/coffer-ss-bench-XXXXXX)"
cleanup() {
    pkill -KILL -f -- "$work/bin/coffer-secret-service" 2>/dev/null || true
    pkill -TERM -f -- "--state-dir $work/" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
bin="$work/bin"; mkdir -p "$bin"
for p in cofferd coffer coffer-cli coffer-bench coffer-secret-service; do install -m 0755 "$(swift build -c release --show-bin-path)/$p" "$bin/"; done
PASSWORD="bench password"                     # a dummy: handed over on stdin, never in argv
printf '%s\n' "$PASSWORD" > "$work/password"
printf '%s' "$PASSWORD" > "$work/password-raw"
printf 'x' > "$work/new-secret"
# The front end acts for each client (DELEGATE): signed here, with a key only this run trusts.
mkdir -p "$work/trust/keys" "$work/trust/manifests"
"$bin/coffer-cli" manifest keygen --out "$work/trust/sign.key" >/dev/null 2>&1
cp "$work/trust/sign.key.pub" "$work/trust/keys/bench.pub"
"$bin/coffer-cli" manifest sign --key "$work/trust/sign.key" --app-id coffer.secret-service --executable "$bin/coffer-secret-service" \
    --installed-as "$bin/coffer-secret-service" --group secret-service --entitlement delegate-identity \
    --out "$work/trust/manifests/coffer-secret-service.manifest" >/dev/null
printf 'standard-trust-dirs = no\nuser-trusted-keys = no\ntrusted-keys-dir = %s\nmanifests-dir = %s\n' \
    "$work/trust/keys" "$work/trust/manifests" > "$work/cofferd.conf"

time_us() { # CMD...: its µs; fails if CMD fails (an error is never timed as an answer)
    local t0 t1 rc=0
    t0=$EPOCHREALTIME
    "$@" <"${IN:-/dev/null}" >/dev/null 2>&1 || rc=$?
    t1=$EPOCHREALTIME
    [ "$rc" = 0 ] || { echo "secret-service.sh: failed ($rc): $*" >&2; return 1; }
    echo $(( ${t1/./} - ${t0/./} ))
}
expect() { # WANT CMD...
    local want="$1" got; shift
    got="$("$@" </dev/null 2>&1)" || true
    [ "$got" = "$want" ] || { echo "secret-service.sh: $* printed '$got', expected '$want'" >&2; return 1; }
}
pick() { echo $(( ($1 * 7919) % $2 + 1 )); }
median() { sort -n "$1" | awk '{ a[NR] = $1 } END { if (NR == 0) print "0"; else print a[int((NR + 1) / 2)] }'; }
# The client's workloads, the same for both providers: lookups, stores, a search, the store's first call.
workloads() { # N OUT
    local n=$1 out=$2 k r
    k=$(pick 1 "$n"); expect "secret-$k" secret-tool lookup service "svc$((k % 97))" account "acct$k"
    for r in $(seq 10); do k=$(pick "$r" "$n"); secret-tool lookup service "svc$((k % 97))" account "acct$k" >/dev/null; done
    for r in $(seq 101); do k=$(pick "$r" "$n"); time_us secret-tool lookup service "svc$((k % 97))" account "acct$k"; done > "$out.lookup"
    for r in $(seq 21); do IN="$work/new-secret" time_us secret-tool store --label=l service new account "a$r"; done > "$out.store"
    for r in $(seq 11); do time_us secret-tool search --all service "svc$r"; done > "$out.search"
    k=$(pick 2 "$n"); expect "secret-$k" secret-tool lookup service "svc$((k % 97))" account "acct$k"
}
REPS=1
export -f time_us expect pick workloads
export work bin REPS

coffer_run() { # N
    local n=$1 out="$work/results.$1.coffer"
    (
        export HOME="$work/coffer-$n" XDG_RUNTIME_DIR="$work/coffer-$n/run"
        mkdir -p "$XDG_RUNTIME_DIR" "$HOME/pam"; chmod 700 "$XDG_RUNTIME_DIR"
        export COFFER_SOCKET="$XDG_RUNTIME_DIR/agent.sock"
        local matrix=/usr/lib/x86_64-linux-gnu/pam_wrapper/pam_matrix.so state="$HOME/state"
        printf '%s:%s:coffer\n' "$(id -un)" "$PASSWORD" > "$HOME/passdb"
        printf 'auth required %s passdb=%s\naccount required %s passdb=%s\n' $matrix "$HOME/passdb" $matrix "$HOME/passdb" > "$HOME/pam/coffer"
        local agent=("$bin/cofferd" --socket "$COFFER_SOCKET" --state-dir "$state" --pam-confdir "$HOME/pam" --config "$work/cofferd.conf")
        "${agent[@]}"
        "$bin/coffer" passcode set --passcode-stdin < "$work/password"
        pkill -TERM -f -- "--state-dir $state"; while pgrep -f -- "--state-dir $state" >/dev/null; do sleep 0.01; done
        "$bin/coffer-bench" fill-secret-service "$state" "$n" < "$work/password"
        sync
        "${agent[@]}"
        "$bin/coffer" unlock --passcode-stdin < "$work/password"
        export n out
        dbus-run-session -- bash -c '
            set -eu
            "$bin/coffer-secret-service" </dev/null >/dev/null 2>"$out.frontend-log" &
            until busctl --user status org.freedesktop.secrets >/dev/null 2>&1; do sleep 0.01; done
            workloads "$n" "$out"
            kill -KILL $! || true
        '
        pkill -TERM -f -- "--state-dir $state"
    ) || echo "Coffer run failed at N=$n" >&2
}

gnome_keyring_run() { # N
    local n=$1 out="$work/results.$1.gk"
    (
        export HOME="$work/gk-$n" XDG_RUNTIME_DIR="$work/gk-$n/run" XDG_DATA_HOME="$work/gk-$n/data"
        mkdir -p "$XDG_RUNTIME_DIR" "$XDG_DATA_HOME/keyrings"; chmod 700 "$XDG_RUNTIME_DIR"
        /usr/bin/python3 "$root/contrib/bench/gnome-keyring-fill.py" "$XDG_DATA_HOME/keyrings/login.keyring" "$n" < "$work/password"
        sync
        export n out
        dbus-run-session -- bash -c '
            set -eu
            eval "$(gnome-keyring-daemon --unlock --components=secrets < "$work/password-raw")"
            until busctl --user status org.freedesktop.secrets >/dev/null 2>&1; do sleep 0.01; done
            workloads "$n" "$out"
            pkill -u "$(id -u)" -n gnome-keyring-d || true
        '
    ) || echo "gnome-keyring run failed at N=$n" >&2
}

for n in $sizes; do
    coffer_run "$n"
    gnome_keyring_run "$n"
    echo
    echo "| N = $n, secret-tool (ms, median) | Coffer | gnome-keyring | Coffer / gnome-keyring |"
    echo "|---|---:|---:|---:|"
    for w in lookup store search; do
        c=$(median "$work/results.$n.coffer.$w" 2>/dev/null || echo 0); g=$(median "$work/results.$n.gk.$w" 2>/dev/null || echo 0)
        awk -v w="$w" -v c="$c" -v g="$g" 'BEGIN {
            names["lookup"] = "`secret-tool lookup` (one item by two attributes)"
            names["store"] = "`secret-tool store` (a new item)"
            names["search"] = "`secret-tool search --all` (≈ N/97 items)"
            printf "| %s | %.1f | %.1f | %s |\n", names[w], c / 1000, g / 1000, (g > 0 && c > 0) ? sprintf("%.2f×", c / g) : "–" }'
    done
done
