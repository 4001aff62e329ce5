#!/usr/bin/env bash
# Coffer beside the tools people use today: the same shell workloads, in one run, each peer in its
# own temporary HOME:
#   gnome-keyring   gnome-keyring-daemon + secret-tool, inside dbus-run-session
#   pass            GnuPG; the key has a passphrase, preset into gpg-agent (no pinentry)
#   keyctl          the kernel keyring (a floor: no encryption at rest, no daemon, no unlock)
#
#   contrib/bench/peers.sh [N ...]      (default: 1000 10000 100000)
#
# Every command is a whole process started by the shell, timed with bash's EPOCHREALTIME; every
# fetch is checked to print the right secret. Prints a Markdown table per N (medians, fetch p90,
# Coffer's speed-up over each peer), then the issue's targets, each as a ratio from this run.
#
# Filling: through the agent or the API a store is one fsync (Coffer) or a rewrite of the whole
# keyring file (gnome-keyring: ~0.7 s per store at 10,000 items), so the stores are filled
# directly, the same way every time: Coffer's through its library (coffer-bench fill), gnome-keyring's
# by writing its keyring file in its own format (gnome-keyring-fill.py; the daemon then loads,
# unlocks and serves it), pass's with one `gpg --multifile --encrypt`, the kernel's by add_key(2).
# Only the timed operations go through each tool's own command.
#
# The fetch is timed a second way, without a shell: `hyperfine -N` starts `coffer get` and `keyctl
# pipe` itself (fork + exec, no bash in between), and beside them two floors built in the same run:
# a static C program that only exits (what exec + exit cost here) and a static Swift program that
# only exits (what the Swift runtime's start-up adds, linked as `coffer` is). `coffer get` minus that
# Swift floor is everything Coffer does for a fetch: parse, connect, HELLO, the agent's identity and
# lookup, print.
set -eu
cd "$(dirname "$0")/../.."
root="$PWD"
bash contrib/deps.sh
need=""
for c in secret-tool gnome-keyring-daemon dbus-run-session pass gpg keyctl hyperfine; do command -v "$c" >/dev/null || need=1; done
/usr/bin/python3 -c 'import cryptography' 2>/dev/null || need=1
if [ -n "$need" ]; then
    [ "$(id -u)" = 0 ] || { echo "peers.sh: needs gnome-keyring libsecret-tools dbus pass gnupg keyutils hyperfine python3-cryptography (run as root to install)" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gnome-keyring libsecret-tools dbus pass gnupg keyutils hyperfine python3-cryptography >/dev/null
fi
sizes="${*:-1000 10000 100000}"

work="$(mktemp -d /tmp/coffer-peers-XXXXXX)"
cleanup() {
    pkill -TERM -f -- "--state-dir $work/" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
results="$work/results"; mkdir -p "$results"
bench=peers.sh
. contrib/bench/lib.sh
bench_install cofferd coffer coffer-cli coffer-bench
cc -O2 -o "$work/gk-unlock" contrib/bench/gk-unlock.c
printf 'x\n' > "$work/new-secret-line"
# The floors under any fetch command: a static C program and a static Swift program that only exit.
printf 'int main(void) { return 0; }\n' > "$work/noop.c"; cc -O2 -static -o "$bin/noop-c" "$work/noop.c"
printf 'if CommandLine.argc > 99 { print(CommandLine.arguments) }\n' > "$work/noop.swift"
swiftc -O -static-executable -Xlinker -s -o "$bin/noop-swift" "$work/noop.swift" 2>/dev/null

# hf NAME CMD: CMD (one string, split on spaces, no shell) timed by `hyperfine -N`; NAME's median in µs
# goes to $results/NAME.hf.
hf() {
    hyperfine -N --style none --warmup 20 --runs "$REPS_HF" --export-csv "$results/$1.hf.csv" "$2" >/dev/null 2>&1 ||
        { echo "peers.sh: hyperfine failed: $2" >&2; return 1; }
    awk -F, 'NR == 2 { printf "%d\n", $4 * 1000000 }' "$results/$1.hf.csv" > "$results/$1.hf"
}
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
reps_store() { if [ "$1" -ge 100000 ]; then echo 5; else echo 20; fi; }
REPS_FETCH=101 REPS_SEARCH=21 REPS_UNLOCK=9 WARMUP=10 REPS_HF=500
export -f rss_kib reps_store hf
export work results bin root REPS_FETCH REPS_SEARCH REPS_UNLOCK WARMUP REPS_HF

coffer_run() { # N
    local n=$1 out="$results/$1.coffer"
    (
        coffer_agent "$n" fill
        local k; k=$(pick 1 "$n"); expect "secret-$k" "$bin/coffer" get --service "svc$((k % 97))" --account "acct$k"
        for r in $(seq $WARMUP); do k=$(pick "$r" "$n"); "$bin/coffer" get --service "svc$((k % 97))" --account "acct$k" >/dev/null; done
        for r in $(seq $REPS_FETCH); do k=$(pick "$r" "$n"); time_us "$bin/coffer" get --service "svc$((k % 97))" --account "acct$k"; done > "$out.fetch"
        k=$(pick 5 "$n"); hf "$n.coffer" "$bin/coffer get --service svc$((k % 97)) --account acct$k"
        for r in $(seq "$(reps_store "$n")"); do IN="$work/new-secret" time_us "$bin/coffer" add --service new --account "a$r" --secret-stdin; done > "$out.store"
        for r in $(seq $REPS_SEARCH); do time_us "$bin/coffer" find --service "svc$r" --limit all; done > "$out.search"
        for r in $(seq $REPS_UNLOCK); do "$bin/coffer" lock; IN="$work/password" time_us "$bin/coffer" unlock --passcode-stdin; done > "$out.unlock"
        rss_kib "$(pgrep -f -- "--state-dir $state" | head -1)" > "$out.rss"
        coffer_agent_stop
    ) || echo "Coffer run failed at N=$n" >&2
}

gnome_keyring_run() { # N
    local n=$1 out="$results/$1.gk"
    (
        export HOME="$work/gk-$n" XDG_RUNTIME_DIR="$work/gk-$n/run" XDG_DATA_HOME="$work/gk-$n/data"
        mkdir -p "$XDG_RUNTIME_DIR" "$XDG_DATA_HOME/keyrings"; chmod 700 "$XDG_RUNTIME_DIR"
        /usr/bin/python3 "$root/contrib/bench/gnome-keyring-fill.py" "$XDG_DATA_HOME/keyrings/login.keyring" "$n" < "$work/password"
        sync
        export n out
        dbus-run-session -- bash -c '
            set -eu
            # --unlock takes all of stdin as the password (no newline) and returns before the
            # daemon has unlocked: wait until it owns the Secret Service name.
            eval "$(gnome-keyring-daemon --unlock --components=secrets < "$work/password-raw")"
            until busctl --user status org.freedesktop.secrets >/dev/null 2>&1; do sleep 0.01; done
            k=$(pick 1 "$n"); expect "secret-$k" secret-tool lookup service "svc$((k % 97))" account "acct$k"
            for r in $(seq $WARMUP); do k=$(pick "$r" "$n"); secret-tool lookup service "svc$((k % 97))" account "acct$k" >/dev/null; done
            for r in $(seq $REPS_FETCH); do k=$(pick "$r" "$n"); time_us secret-tool lookup service "svc$((k % 97))" account "acct$k"; done > "$out.fetch"
            for r in $(seq "$(reps_store "$n")"); do IN="$work/new-secret" time_us secret-tool store --label=l service new account "a$r"; done > "$out.store"
            # Lock over D-Bus, unlock with the password over the control socket (as pam_gnome_keyring).
            for r in $(seq $REPS_UNLOCK); do
                dbus-send --session --print-reply --dest=org.freedesktop.secrets /org/freedesktop/secrets \
                    org.freedesktop.Secret.Service.Lock array:objpath:/org/freedesktop/secrets/collection/login >/dev/null
                IN="$work/password" time_us "$work/gk-unlock"
            done > "$out.unlock"
            k=$(pick 3 "$n"); expect "secret-$k" secret-tool lookup service "svc$((k % 97))" account "acct$k"
            rss_kib "$(pgrep -u "$(id -u)" -n gnome-keyring-d)" > "$out.rss"
            # Last, because at 100,000 items it outlasts libsecret'"'"'s 25 s D-Bus timeout (each
            # matching item costs the daemon ~0.1 s) and leaves the daemon busy for a minute more.
            for r in $(seq $REPS_SEARCH); do
                time_us timeout 60 secret-tool search --all service "svc$r" >> "$out.search" || { echo timeout > "$out.search-failed"; break; }
            done
            pkill -u "$(id -u)" -n gnome-keyring-d || true
        '
    ) || echo "gnome-keyring run failed at N=$n" >&2
}

pass_run() { # N
    local n=$1 out="$results/$1.pass"
    (
        export HOME="$work/pass-$n" GNUPGHOME="$work/pass-$n/gnupg" PASSWORD_STORE_DIR="$work/pass-$n/store"
        mkdir -p "$HOME"; mkdir -m 700 "$GNUPGHOME"
        # pass at its fastest: gpg-agent caches the passphrase, not the unprotected key, so every
        # decrypt re-runs the key's S2K. With gpg's calibrated default that is ~0.35 s per `pass show`
        # on the dev VM; the minimum count (65,536) makes it ~1 ms.
        printf 'allow-preset-passphrase\ns2k-count 65536\n' > "$GNUPGHOME/gpg-agent.conf"
        gpg --batch --quiet --pinentry-mode loopback --passphrase-file "$work/password" --quick-gen-key "coffer-bench <bench@example.invalid>" ed25519 cert never
        local fpr; fpr=$(gpg --list-keys --with-colons | awk -F: '/^fpr/ {print $10; exit}')
        gpg --batch --quiet --pinentry-mode loopback --passphrase-file "$work/password" --quick-add-key "$fpr" cv25519 encr never
        preset() { for g in $(gpg --with-keygrip --with-colons --list-secret-keys | awk -F: '/^grp/ {print $10}'); do
            /usr/lib/gnupg/gpg-preset-passphrase --preset "$g" < "$work/password"; done; }
        preset
        pass init "$fpr" >/dev/null
        # Fill: pass's own layout (SERVICE/ACCOUNT.gpg holding "secret-i\n"), one gpg for all files.
        for i in $(seq "$n"); do d="$PASSWORD_STORE_DIR/svc$((i % 97))"; [ -d "$d" ] || mkdir "$d"; printf 'secret-%s\n' "$i" > "$d/acct$i"; echo "$d/acct$i"; done |
            gpg --batch --quiet --yes -r "$fpr" --compress-algo=none --no-encrypt-to --multifile --encrypt 2>/dev/null
        find "$PASSWORD_STORE_DIR" -type f ! -name '*.gpg' ! -name .gpg-id -delete
        sync
        local k; k=$(pick 1 "$n"); expect "secret-$k" pass show "svc$((k % 97))/acct$k"
        for r in $(seq $WARMUP); do k=$(pick "$r" "$n"); pass show "svc$((k % 97))/acct$k" >/dev/null; done
        for r in $(seq $REPS_FETCH); do k=$(pick "$r" "$n"); time_us pass show "svc$((k % 97))/acct$k"; done > "$out.fetch"
        for r in $(seq "$(reps_store "$n")"); do IN="$work/new-secret-line" time_us pass insert -e "new/a$r"; done > "$out.store"
        for r in $(seq $REPS_SEARCH); do time_us pass ls "svc$r"; done > "$out.search"
        # Unlock: forget the cached passphrase, then decrypt one entry giving it (S2K + decrypt).
        k=$(pick 2 "$n")
        for r in $(seq $REPS_UNLOCK); do
            gpgconf --reload gpg-agent
            IN="$work/password" time_us gpg --batch --quiet --pinentry-mode loopback --passphrase-fd 0 -d "$PASSWORD_STORE_DIR/svc$((k % 97))/acct$k.gpg"
        done > "$out.unlock"
        rss_kib "$(pgrep -u "$(id -u)" -f -- "gpg-agent --homedir $GNUPGHOME" | head -1)" > "$out.rss"
        gpgconf --kill gpg-agent
    ) >/dev/null || echo "pass run failed at N=$n" >&2
}

keyctl_run() { # N
    local n=$1 out="$results/$1.keyctl"
    export n out
    keyctl session - bash -c '
        set -eu
        python3 -c "
import ctypes, sys
k = ctypes.CDLL(\"libkeyutils.so.1\")
k.add_key.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int32]
for i in range(1, int(sys.argv[1]) + 1):
    p = b\"secret-%d\" % i
    if k.add_key(b\"user\", b\"svc%d:acct%d\" % (i % 97, i), p, len(p), -3) < 0: sys.exit(\"add_key failed at %d (key quota: /proc/sys/kernel/keys)\" % i)
" "$n"
        k=$(pick 1 "$n"); expect "secret-$k" keyctl pipe "%user:svc$((k % 97)):acct$k"
        for r in $(seq $WARMUP); do k=$(pick "$r" "$n"); keyctl pipe "%user:svc$((k % 97)):acct$k" >/dev/null; done
        for r in $(seq $REPS_FETCH); do k=$(pick "$r" "$n"); time_us keyctl pipe "%user:svc$((k % 97)):acct$k"; done > "$out.fetch"
        k=$(pick 5 "$n"); hf "$n.keyctl" "keyctl pipe %user:svc$((k % 97)):acct$k"
        for r in $(seq "$(reps_store "$n")"); do IN="$work/new-secret" time_us keyctl padd user "new:a$r" @s; done > "$out.store"
    ' >/dev/null || echo "keyctl run failed at N=$n (a non-root user may hold only 200 keys: /proc/sys/kernel/keys/maxkeys)" >&2
}

# figure N PEER WORKLOAD [median|p90] -> milliseconds, or "-" when the peer has no figure.
figure() {
    local f="$results/$1.$2.$3"
    [ -s "$f" ] || { echo -; return; }
    sort -n "$f" | awk -v q="${4:-median}" '{a[NR]=$1} END {i = (q == "p90") ? int(NR*0.9) : int((NR+1)/2); if (i < 1) i = 1; printf "%.2f", a[i]/1000}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.1f×", b/a; else printf "–" }'; }
mib() { [ -s "$results/$1.$2.rss" ] && awk '{printf "%.1f", $1/1024}' "$results/$1.$2.rss" || echo -; }

hf noop-c "$bin/noop-c"; hf noop-swift "$bin/noop-swift"
div() { awk -v a="$1" -v b="$2" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.1f", a/b; else printf "-" }'; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f", a-b; else printf "-" }'; }
for n in $sizes; do
    echo "peers.sh: N = $n" >&2
    coffer_run "$n"; gnome_keyring_run "$n"; pass_run "$n"; keyctl_run "$n"
    echo
    echo "### N = $n items"
    echo
    echo "| workload (ms) | Coffer | gnome-keyring | pass | keyctl (floor) | Coffer vs gnome-keyring | Coffer vs pass | Coffer vs keyctl |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    for w in "fetch one secret by attributes: median|fetch|median" "fetch: p90|fetch|p90" "store one: median|store|median" \
             "search by one attribute: median|search|median" "unlock with the password: median|unlock|median"; do
        IFS='|' read -r label key q <<< "$w"
        c=$(figure "$n" coffer "$key" "$q"); g=$(figure "$n" gk "$key" "$q"); p=$(figure "$n" pass "$key" "$q"); k=$(figure "$n" keyctl "$key" "$q")
        [ "$key" = search ] && [ -e "$results/$n.gk.search-failed" ] && g="> 25 s (libsecret timed out)"
        echo "| $label | $c | $g | $p | $k | $(ratio "$c" "$g") | $(ratio "$c" "$p") | $(ratio "$c" "$k") |"
    done
    echo "| daemon RSS (MiB) | $(mib "$n" coffer) | $(mib "$n" gk) | $(mib "$n" pass) (gpg-agent) | – (in the kernel) | | | |"
done

hfms() { [ -s "$results/$1.hf" ] && awk '{printf "%.2f", $1/1000}' "$results/$1.hf" || echo -; }
echo
echo "### The fetch without a shell (\`hyperfine -N\`, $REPS_HF runs after 20, medians in ms)"
echo
echo "| N | \`coffer get\` | \`keyctl pipe\` | ratio | static C no-op | static Swift no-op | Swift start-up (Swift − C) | \`coffer get\` − Swift no-op | \`keyctl pipe\` − C no-op |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for n in $sizes; do
    c=$(hfms "$n.coffer") k=$(hfms "$n.keyctl") nc=$(hfms noop-c) ns=$(hfms noop-swift)
    echo "| $n | $c | $k | $(awk -v a="$c" -v b="$k" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f×", a/b; else printf "–" }') | $nc | $ns | $(sub "$ns" "$nc") | $(sub "$c" "$ns") | $(sub "$k" "$nc") |"
done
echo
echo "### Targets (ratios from this run)"
echo
echo "| target | figure | met |"
echo "|---|---:|:---:|"
div2() { awk -v a="$1" -v b="$2" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f", a/b; else printf "-" }'; }
check() { # label value op threshold
    local ok; ok=$(awk -v v="$2" -v t="$4" -v op="$3" 'BEGIN { if (v == "" || v == "-") { print "–"; exit } if ((op == ">=" && v+0 >= t+0) || (op == "<=" && v+0 <= t+0)) print "yes"; else print "**no**" }')
    echo "| $1 | $2 | $ok |"
}
for n in $sizes; do
    check "\`coffer get\` within 1.2× of \`keyctl pipe\`, N = $n (bash-timed)" "$(div2 "$(figure "$n" coffer fetch)" "$(figure "$n" keyctl fetch)")" "<=" 1.2
    check "\`coffer get\` within 1.2× of \`keyctl pipe\`, N = $n (\`hyperfine -N\`)" "$(div2 "$(hfms "$n.coffer")" "$(hfms "$n.keyctl")")" "<=" 1.2
    [ "$n" = 10000 ] && check "agent RSS after the workload, N = 10,000 (MiB)" "$(mib 10000 coffer)" "<=" 16
    check "\`coffer get\` ≥ 5× faster than \`secret-tool lookup\`, N = $n" "$(div "$(figure "$n" gk fetch)" "$(figure "$n" coffer fetch)")" ">=" 5
    check "\`coffer get\` ≥ 10× faster than \`pass show\`, N = $n" "$(div "$(figure "$n" pass fetch)" "$(figure "$n" coffer fetch)")" ">=" 10
done
for n in $sizes; do
    [ "$n" = 10000 ] && check "\`coffer add\` ≥ 100× faster than \`secret-tool store\`, N = 10,000" "$(div "$(figure 10000 gk store)" "$(figure 10000 coffer store)")" ">=" 100
done
first=${sizes%% *}; last=${sizes##* }
if [ "$first" != "$last" ]; then
    check "\`coffer add\` at N = $last vs N = $first (≤ 1.5×)" "$(div "$(figure "$last" coffer store)" "$(figure "$first" coffer store)")" "<=" 1.5
    # The same Argon2id parameters at every N, so any growth with the item count is the difference.
    check "Coffer unlock at N = $last minus at N = $first, ms (independent of item count: ≤ 20)" "$(sub "$(figure "$last" coffer unlock)" "$(figure "$first" coffer unlock)")" "<=" 20
fi
