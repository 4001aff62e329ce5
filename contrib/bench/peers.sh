#!/usr/bin/env bash
# Coffer beside the peers people use today, same workloads, same run, each peer in its own
# temporary HOME: gnome-keyring-daemon + secret-tool (in dbus-run-session), pass (GnuPG; the key has
# no passphrase so no pinentry is involved), and the kernel keyring via keyctl as a floor.
#   contrib/bench/peers.sh [N ...]     (default: 1000)
# Prints one Markdown table per N: medians (and p90 for fetch) in ms, and Coffer's speed-up.
set -eu
cd "$(dirname "$0")/../.."
bash contrib/deps.sh
if ! command -v secret-tool >/dev/null || ! command -v pass >/dev/null || ! command -v keyctl >/dev/null; then
    [ "$(id -u)" = 0 ] || { echo "peers.sh: needs gnome-keyring libsecret-tools pass gnupg keyutils dbus (run as root to install)" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnome-keyring libsecret-tools pass gnupg keyutils dbus >/dev/null
fi
swift build -c release --product cofferd >/dev/null
swift build -c release --product coffer >/dev/null
bin="$(swift build -c release --show-bin-path)"
sizes="${*:-1000}"
REPS_FETCH=50; REPS_STORE=20

# stats FILE -> "median p90" in ms (input: one duration in µs per line)
stats() { sort -n "$1" | awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; p=a[int(NR*0.9)]; if(!p)p=m; printf "%.2f %.2f", m/1000, p/1000}'; }
# time_us CMD...: runs CMD, prints elapsed µs
time_us() { local t0=$EPOCHREALTIME; "$@" >/dev/null 2>&1; local t1=$EPOCHREALTIME; echo $(( (${t1/./} - ${t0/./}) )); }
rss_mib() { awk '/VmRSS/ {printf "%.0f", $2/1024}' "/proc/$1/status" 2>/dev/null || echo "?"; }

for n in $sizes; do
    work="$(mktemp -d /tmp/coffer-peers-XXXXXX)"
    declare -A R=()

    # ---- Coffer
    (
        export HOME="$work/coffer" XDG_RUNTIME_DIR="$work/coffer/run"; mkdir -p "$XDG_RUNTIME_DIR"
        matrix=/usr/lib/x86_64-linux-gnu/pam_wrapper/pam_matrix.so
        mkdir -p "$HOME/pam"; printf '%s:pw:coffer\n' "$(id -un)" > "$HOME/passdb"
        printf 'auth required %s passdb=%s\naccount required %s passdb=%s\n' $matrix "$HOME/passdb" $matrix "$HOME/passdb" > "$HOME/pam/coffer"
        export COFFER_SOCKET="$XDG_RUNTIME_DIR/agent.sock"
        "$bin/cofferd" --socket "$COFFER_SOCKET" --state-dir "$HOME/state" --pam-confdir "$HOME/pam"
        printf pw | "$bin/coffer" passcode set --passcode-stdin
        for i in $(seq 1 "$n"); do printf 'secret-%s' "$i" | "$bin/coffer" add --service "svc$((i % 97))" --account "acct$i" --secret-stdin; done
        for r in $(seq 1 $REPS_FETCH); do k=$(( (r * 7919) % n + 1 )); time_us "$bin/coffer" get --service "svc$((k % 97))" --account "acct$k"; done > "$work/c.fetch"
        for r in $(seq 1 $REPS_STORE); do time_us sh -c "printf x | '$bin/coffer' add --service new --account a$r --secret-stdin"; done > "$work/c.store"
        for r in $(seq 1 $REPS_STORE); do time_us "$bin/coffer" find --service "svc$r" --limit all; done > "$work/c.search"
        "$bin/coffer" lock
        for r in $(seq 1 5); do time_us sh -c "printf pw | '$bin/coffer' unlock --passcode-stdin"; "$bin/coffer" lock; done > "$work/c.unlock"
        pid=$(pgrep -f -- "--socket $COFFER_SOCKET" | head -1); rss_mib "$pid" > "$work/c.rss"
        pkill -TERM -f -- "--socket $COFFER_SOCKET"
    )

    # ---- gnome-keyring + secret-tool
    (
        export HOME="$work/gk" XDG_RUNTIME_DIR="$work/gk/run" XDG_DATA_HOME="$work/gk/data"; mkdir -p "$XDG_RUNTIME_DIR" "$XDG_DATA_HOME"; chmod 700 "$XDG_RUNTIME_DIR"
        dbus-run-session -- bash -c '
            set -eu
            eval "$(printf pw | gnome-keyring-daemon --unlock --components=secrets)"
            export GNOME_KEYRING_CONTROL
            for i in $(seq 1 '"$n"'); do printf "secret-%s" "$i" | secret-tool store --label=l service "svc$((i % 97))" account "acct$i"; done
            '"$(declare -f time_us rss_mib)"'
            for r in $(seq 1 '"$REPS_FETCH"'); do k=$(( (r * 7919) % '"$n"' + 1 )); time_us secret-tool lookup service "svc$((k % 97))" account "acct$k"; done > '"$work"'/g.fetch
            for r in $(seq 1 '"$REPS_STORE"'); do time_us sh -c "printf x | secret-tool store --label=l service new account a$r"; done > '"$work"'/g.store
            for r in $(seq 1 '"$REPS_STORE"'); do time_us secret-tool search --all service "svc$r"; done > '"$work"'/g.search
            pid=$(pgrep -u "$(id -u)" -n gnome-keyring-d); rss_mib "$pid" > '"$work"'/g.rss
            kill "$pid" 2>/dev/null || true
        ' >/dev/null 2>&1 || echo "gnome-keyring run failed" >&2
    )

    # ---- pass
    (
        export HOME="$work/pass" GNUPGHOME="$work/pass/gnupg" PASSWORD_STORE_DIR="$work/pass/store"; mkdir -p "$GNUPGHOME"; chmod 700 "$GNUPGHOME"
        gpg --batch --quiet --passphrase '' --quick-gen-key "coffer-bench <bench@example.invalid>" ed25519 cert never 2>/dev/null
        fpr=$(gpg --list-keys --with-colons | awk -F: '/^fpr/ {print $10; exit}')
        gpg --batch --quiet --passphrase '' --quick-add-key "$fpr" cv25519 encr never 2>/dev/null
        pass init "$fpr" >/dev/null
        for i in $(seq 1 "$n"); do printf 'secret-%s\n' "$i" | pass insert -e "svc$((i % 97))/acct$i" >/dev/null; done
        for r in $(seq 1 $REPS_FETCH); do k=$(( (r * 7919) % n + 1 )); time_us pass show "svc$((k % 97))/acct$k"; done > "$work/p.fetch"
        for r in $(seq 1 $REPS_STORE); do time_us sh -c "printf 'x\n' | pass insert -e new/a$r"; done > "$work/p.store"
        for r in $(seq 1 $REPS_STORE); do time_us pass find "acct$r"; done > "$work/p.search"
        gpgconf --kill gpg-agent
    ) >/dev/null 2>&1 || echo "pass run failed" >&2

    # ---- kernel keyring (floor): a fresh session keyring
    keyctl session - bash -c '
        '"$(declare -f time_us)"'
        for i in $(seq 1 '"$n"'); do printf "secret-%s" "$i" | keyctl padd user "svc$((i % 97)):acct$i" @s >/dev/null; done
        for r in $(seq 1 '"$REPS_FETCH"'); do k=$(( (r * 7919) % '"$n"' + 1 )); time_us sh -c "keyctl pipe \$(keyctl search @s user svc$((k % 97)):acct$k)"; done > '"$work"'/k.fetch
        for r in $(seq 1 '"$REPS_STORE"'); do time_us sh -c "printf x | keyctl padd user new:a$r @s"; done > '"$work"'/k.store
    ' >/dev/null 2>&1 || echo "keyctl run failed (key quota? see /proc/sys/kernel/keys)" >&2

    echo
    echo "### N = $n items"
    echo
    echo "| workload (ms, median) | Coffer | gnome-keyring | pass | keyctl | Coffer vs gnome-keyring | Coffer vs pass |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    row() { # label suffix
        local c g p k; c=$( [ -s "$work/c.$2" ] && stats "$work/c.$2" | cut -d' ' -f1 || echo -); g=$( [ -s "$work/g.$2" ] && stats "$work/g.$2" | cut -d' ' -f1 || echo -)
        p=$( [ -s "$work/p.$2" ] && stats "$work/p.$2" | cut -d' ' -f1 || echo -); k=$( [ -s "$work/k.$2" ] && stats "$work/k.$2" | cut -d' ' -f1 || echo -)
        ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.1f×", b/a; else printf "-" }'; }
        echo "| $1 | $c | $g | $p | $k | $(ratio "$c" "$g") | $(ratio "$c" "$p") |"
    }
    row "fetch one secret by attributes (shell command)" fetch
    echo "| fetch p90 | $(stats "$work/c.fetch" | cut -d' ' -f2) | $( [ -s "$work/g.fetch" ] && stats "$work/g.fetch" | cut -d' ' -f2 || echo -) | $( [ -s "$work/p.fetch" ] && stats "$work/p.fetch" | cut -d' ' -f2 || echo -) | $( [ -s "$work/k.fetch" ] && stats "$work/k.fetch" | cut -d' ' -f2 || echo -) | | |"
    row "store one" store
    row "search by one attribute" search
    echo "| unlock with the password | $(stats "$work/c.unlock" | cut -d' ' -f1) | - | - | - | | |"
    echo "| daemon RSS (MiB) | $(cat "$work/c.rss" 2>/dev/null || echo ?) | $(cat "$work/g.rss" 2>/dev/null || echo ?) | - | - | | |"
    rm -rf "$work"
done
