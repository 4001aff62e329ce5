#!/usr/bin/env bash
# The Secret Service on Coffer beside gnome-keyring (issue #26), through the same clients, each
# provider on its own private session bus (dbus-run-session) in its own temporary HOME:
#   Coffer          cofferd + coffer-secret-service (signed with delegate-identity by a key made here)
#   Coffer before   the same agent and items with another coffer-secret-service binary, when
#                   COFFER_BENCH_BASELINE names one (e.g. main's build, to measure a change in one run)
#   gnome-keyring   gnome-keyring-daemon --components=secrets
#   floor           ss-floor.c: a provider answering from constants (no store, no crypto), the floor
#                   under any provider for these clients (libsecret falls back to a plain session)
#   DH floor        ss-floor --dh: the same, but agreeing the DH session libsecret asks for first (as
#                   Coffer and gnome-keyring do) with Coffer's own C wall: the floor under any provider
#                   that speaks it, the client's half of the agreement included
#
#   contrib/bench/secret-service.sh [N ...]      (default: 1000 10000)
#
# Both stores hold the same N items (service svc(i % 97), account acct(i), secret secret-i, label l),
# filled directly: Coffer's through its library in the form its front end makes them (coffer-bench
# fill-secret-service), gnome-keyring's by writing its keyring file (gnome-keyring-fill.py). Only the
# timed operations go through the bus. The clients: libsecret's `secret-tool` (each call a whole
# process started by the shell, so each a new bus sender), and one python3-dbus process timing one
# SearchItems of every item and one GetSecrets of 1,000 of them, or all N if fewer (bulk.py). All providers run at once
# and every repetition goes to each in turn, so a change of the machine's load falls on all of them.
# Every lookup is checked to print the right secret. Prints one Markdown table per N: medians, and
# Coffer's ratio to gnome-keyring (below 1: Coffer is faster).
set -eu
cd "$(dirname "$0")/../.."
root="$PWD"
bash contrib/deps.sh
sizes="${*:-1000 10000}"
baseline="${COFFER_BENCH_BASELINE:-}"
work="$(mktemp -d /tmp/coffer-ss-bench-XXXXXX)"
cleanup() {
    touch "$work/stop"
    # Each provider's own process, by the pid its bus names (never another session's daemon).
    for f in "$work"/*.provider-pid; do if [ -s "$f" ]; then kill -KILL "$(cat "$f")" 2>/dev/null || true; fi; done
    pkill -TERM -f -- "--state-dir $work/" 2>/dev/null || true
    sleep 0.5
    rm -rf "$work"
}
trap cleanup EXIT
bench=secret-service.sh
. contrib/bench/lib.sh
bench_install cofferd coffer coffer-cli coffer-bench coffer-secret-service
# shellcheck disable=SC2046
cc -O2 -o "$bin/ss-floor" contrib/bench/ss-floor.c $(pkg-config --cflags --libs libsystemd)
# shellcheck disable=SC2046
cc -O2 -DSS_FLOOR_DH -I Sources/COpenSSL/include -o "$bin/ss-floor-dh" contrib/bench/ss-floor.c \
    Sources/COpenSSL/csecretservicecrypto.c $(pkg-config --cflags --libs libsystemd libcrypto)
[ -z "$baseline" ] || install -m 0755 "$baseline" "$bin/coffer-secret-service-before"
# The front end acts for each client (DELEGATE): signed here, with a key only this run trusts.
mkdir -p "$work/trust/keys" "$work/trust/manifests"
"$bin/coffer-cli" manifest keygen --out "$work/trust/sign.key" >/dev/null 2>&1
cp "$work/trust/sign.key.pub" "$work/trust/keys/bench.pub"
for fe in coffer-secret-service ${baseline:+coffer-secret-service-before}; do
    "$bin/coffer-cli" manifest sign --key "$work/trust/sign.key" --app-id "coffer.$fe" --executable "$bin/$fe" \
        --installed-as "$bin/$fe" --group secret-service --entitlement delegate-identity --out "$work/trust/manifests/$fe.manifest" >/dev/null
done
printf 'standard-trust-dirs = no\nuser-trusted-keys = no\ntrusted-keys-dir = %s\nmanifests-dir = %s\n' \
    "$work/trust/keys" "$work/trust/manifests" > "$work/cofferd.conf"
# The agent hashes an executable modified in the last 2 s on every connection: let the copies age.
sleep 2.1
export work bin root

# provider NAME COMMAND: on a new private bus, runs COMMAND (which must end up owning the name) and
# keeps the bus until $work/stop appears; the bus address goes to $work/NAME.bus, the provider's pid
# (as the bus names it) to $work/NAME.provider-pid.
provider() {
    local name=$1 command=$2
    rm -f "$work/$name.bus"
    export name command
    dbus-run-session -- bash -c '
        set -eu
        eval "$command"
        until busctl --user status org.freedesktop.secrets >/dev/null 2>&1; do sleep 0.01; done
        busctl --user call org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus GetConnectionUnixProcessID s \
            org.freedesktop.secrets | awk "{print \$2}" > "$work/$name.provider-pid"
        echo "$DBUS_SESSION_BUS_ADDRESS" > "$work/$name.bus"
        while [ ! -e "$work/stop" ]; do sleep 0.2; done
        kill -KILL "$(cat "$work/$name.provider-pid")" 2>/dev/null || true
        rm -f "$work/$name.bus"
    ' 2>>"$work/$name.log" &
    until [ -s "$work/$name.bus" ]; do sleep 0.05; kill -0 $! 2>/dev/null || { echo "$bench: $name did not start: $(cat "$work/$name.log")" >&2; return 1; }; done
}
stop_providers() {
    touch "$work/stop"
    while compgen -G "$work/*.bus" >/dev/null; do sleep 0.1; done
    rm -f "$work/stop" "$work"/*.provider-pid
}

run_n() { # N
    local n=$1 k r p peers
    (
        coffer_agent "$n" fill-secret-service --config "$work/cofferd.conf"
        # bulk.py reads over a plain session (no transport encryption to time), which the front end
        # serves only when allowed.
        printf 'plain-sessions = allow\n' > "$work/secret-service.conf"
        provider coffer '"$bin/coffer-secret-service" --config "$work/secret-service.conf" </dev/null >/dev/null 2>&1 &'
        [ -z "$baseline" ] || provider before '"$bin/coffer-secret-service-before" --config "$work/secret-service.conf" </dev/null >/dev/null 2>&1 &'
        provider floor '"$bin/ss-floor" </dev/null >/dev/null 2>&1 &'
        provider floordh '"$bin/ss-floor-dh" --dh </dev/null >/dev/null 2>&1 &'
        (
            export HOME="$work/gk-$n" XDG_RUNTIME_DIR="$work/gk-$n/run" XDG_DATA_HOME="$work/gk-$n/data"
            mkdir -p "$XDG_RUNTIME_DIR" "$XDG_DATA_HOME/keyrings"; chmod 700 "$XDG_RUNTIME_DIR"
            /usr/bin/python3 "$root/contrib/bench/gnome-keyring-fill.py" "$XDG_DATA_HOME/keyrings/login.keyring" "$n" < "$work/password"
            sync
            # --unlock takes all of stdin as the password (no newline) and returns before the
            # daemon has unlocked: provider waits until it owns the name.
            provider gk 'eval "$(gnome-keyring-daemon --unlock --components=secrets < "$work/password-raw")"'
        )
        peers="coffer ${baseline:+before} gk floor floordh"
        on() { DBUS_SESSION_BUS_ADDRESS="$(cat "$work/$1.bus")" "${@:2}"; }
        k=$(pick 1 "$n")
        for p in coffer ${baseline:+before} gk; do expect "secret-$k" on "$p" secret-tool lookup service "svc$((k % 97))" account "acct$k"; done
        expect "secret-1" on floor secret-tool lookup service x account y
        expect "secret-1" on floordh secret-tool lookup service x account y
        for r in $(seq 10); do k=$(pick "$r" "$n"); for p in $peers; do on "$p" secret-tool lookup service "svc$((k % 97))" account "acct$k" >/dev/null; done; done
        for r in $(seq 101); do
            k=$(pick "$r" "$n")
            for p in $peers; do on "$p" time_us secret-tool lookup service "svc$((k % 97))" account "acct$k" >> "$work/$n.$p.lookup"; done
        done
        # (Before the stores: every item found is then one of the N, with its secret-i.)
        for r in $(seq 5); do for p in coffer ${baseline:+before} gk; do on "$p" /usr/bin/python3 "$root/contrib/bench/bulk.py" "$(( n < 1000 ? n : 1000 ))" >> "$work/$n.$p.bulk"; done; done
        for r in $(seq 21); do for p in $peers; do IN="$work/new-secret" on "$p" time_us secret-tool store --label=l service new account "a$r" >> "$work/$n.$p.store"; done; done
        for r in $(seq 11); do for p in coffer ${baseline:+before} gk; do on "$p" time_us secret-tool search --all service "svc$r" >> "$work/$n.$p.search"; done; done
        k=$(pick 2 "$n")
        for p in coffer ${baseline:+before} gk; do expect "secret-$k" on "$p" secret-tool lookup service "svc$((k % 97))" account "acct$k"; done
        stop_providers
        coffer_agent_stop
    ) || echo "$bench: the run at N=$n failed" >&2
}

ms() { [ -s "$1" ] && awk -v v="$(median "$1")" 'BEGIN { printf "%.1f", v / 1000 }' || echo "–"; }
ratio() { awk -v c="$1" -v g="$2" 'BEGIN { if (c + 0 > 0 && g + 0 > 0) printf "%.2f×", c / g; else printf "–" }'; }
for n in $sizes; do
    run_n "$n"
    echo
    echo "| N = $n (ms, median) | Coffer |${baseline:+ Coffer before |} gnome-keyring | Coffer / gnome-keyring | floor (ss-floor) | DH floor (ss-floor --dh) |"
    echo "|---|---:|${baseline:+---:|}---:|---:|---:|---:|"
    for w in lookup store search bulk; do
        c=$(ms "$work/$n.coffer.$w"); g=$(ms "$work/$n.gk.$w"); f=$(ms "$work/$n.floor.$w"); d=$(ms "$work/$n.floordh.$w")
        name=$(case $w in
            lookup) echo "\`secret-tool lookup\` (one item by two attributes)" ;;
            store) echo "\`secret-tool store\` (a new item)" ;;
            search) echo "\`secret-tool search --all\` (≈ N/97 items)" ;;
            bulk) echo "SearchItems (all N) + GetSecrets ($(( n < 1000 ? n : 1000 )) items), one process" ;;
        esac)
        echo "| $name | $c |${baseline:+ $(ms "$work/$n.before.$w") |} $g | $(ratio "$c" "$g") | $f | $d |"
    done
done
