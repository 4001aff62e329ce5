#!/usr/bin/env bash
# git's credential helpers side by side, in one run: `git credential fill` (what git does before
# every authenticated fetch or push) and `git credential approve` (after one), each a whole `git`
# process, through
#   coffer      git-credential-coffer on a Coffer agent (release build, copied as an install would)
#   store       git-credential-store (a plain-text file, read by git itself)
#   libsecret   git-credential-libsecret on gnome-keyring (built from the source Debian's git
#               ships), inside dbus-run-session, as a desktop runs it
#   git alone   a helper answering from the shell git starts for it (`!f() { …; }; f`), no program
#               of its own: what git's part costs, the floor under every helper's fill
#   a program   the cheapest helper that is a program: static C that drains the request and prints a
#               fixed answer (no store, no IPC): the floor under every helper git has to start
#
#   contrib/bench/git-credential.sh [N]      (default 200 runs per measure)
#
# COFFER_BENCH_SKIP_COFFER=1 measures only store and libsecret (no Swift build, no agent).
#
# The same run also times `git-credential-coffer get` alone beside `coffer get --server … --account …`
# of the same item, alternating one with the other N times (issue #42: the helper within 0.2 ms of a
# fetch, and the whole fill at least 4x libsecret's speed).
#
# Every helper gets its own temporary HOME and only itself as credential.helper; a fill is checked to
# print the right password before it is timed. Prints a Markdown table (median and p95 in ms, and
# Coffer's speed-up over each peer) and the issue's goal: fill at least 5x faster than libsecret.
set -eu
cd "$(dirname "$0")/../.."
root="$PWD"
N="${1:-200}"
WARMUP=10
need=""
for c in git gnome-keyring-daemon dbus-run-session busctl pkg-config cc; do command -v "$c" >/dev/null || need=1; done
pkg-config --exists libsecret-1 2>/dev/null || need=1
if [ -n "$need" ]; then
    [ "$(id -u)" = 0 ] || { echo "git-credential.sh: needs git gnome-keyring dbus libsecret-1-dev pkg-config gcc (run as root to install)" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git gnome-keyring dbus libsecret-1-dev pkg-config gcc >/dev/null
fi
skip_coffer="${COFFER_BENCH_SKIP_COFFER:-}"
[ "$skip_coffer" = 1 ] || for p in cofferd coffer coffer-cli git-credential-coffer; do swift build -c release --product "$p" >/dev/null; done

work="$(mktemp -d /tmp/coffer-gitbench-XXXXXX)"
cleanup() {
    # The agent this script started, by its pid (nothing else is stopped).
    if [ -s "$work/cofferd.pid" ]; then
        agent=$(cat "$work/cofferd.pid"); kill -TERM "$agent" 2>/dev/null || true
        while kill -0 "$agent" 2>/dev/null; do sleep 0.01; done
    fi
    rm -rf "$work"
}
trap cleanup EXIT
bin="$work/bin"; mkdir -p "$bin"
[ "$skip_coffer" = 1 ] || for p in cofferd coffer coffer-cli git-credential-coffer; do install -m 0755 "$(swift build -c release --show-bin-path)/$p" "$bin/"; done
libsecret_src=/usr/share/doc/git/contrib/credential/libsecret/git-credential-libsecret.c
if [ ! -f "$libsecret_src" ] && [ -f "$libsecret_src.gz" ]; then  # (Debian's docs may be gzipped)
    gzip -dc "$libsecret_src.gz" > "$work/git-credential-libsecret.c"; libsecret_src="$work/git-credential-libsecret.c"
fi
[ -f "$libsecret_src" ] || { echo "git-credential.sh: $libsecret_src is missing (Debian's git package ships it)" >&2; exit 1; }
# shellcheck disable=SC2046
cc -O2 -o "$bin/git-credential-libsecret" "$libsecret_src" $(pkg-config --cflags --libs libsecret-1 glib-2.0)
# The cheapest possible helper program: static, no libraries to load, reads the request and answers.
cat > "$work/answer.c" <<'C'
#include <unistd.h>
int main(void) {
    char b[4096], last = 0; ssize_t n;
    while ((n = read(0, b, sizeof b)) > 0) {     /* up to the blank line (or the end) */
        int done = 0;
        for (ssize_t i = 0; i < n; i++) { if (b[i] == '\n' && last == '\n') done = 1; last = b[i]; }
        if (done) break;
    }
    static const char a[] = "username=alice\npassword=s3cret-program\n";
    return write(1, a, sizeof a - 1) == (ssize_t)(sizeof a - 1) ? 0 : 1;
}
C
cc -O2 -static -o "$bin/git-credential-answer" "$work/answer.c"
# The agent hashes an executable modified in the last 2 s on every connection (it could still be
# changing): let the copies age as an installed binary has.
sleep 2.1
PASSWORD="bench password"                     # the keyring password: on stdin only
printf '%s\n' "$PASSWORD" > "$work/password"
printf '%s' "$PASSWORD" > "$work/password-raw"
results="$work/results"; mkdir -p "$results"
export work bin results N WARMUP

# time_us CMD...: runs CMD (stdin from $IN), prints its µs; a failure is never timed.
time_us() {
    local t0 t1 rc=0
    t0=$EPOCHREALTIME
    "$@" <"${IN:-/dev/null}" >/dev/null 2>&1 || rc=$?
    t1=$EPOCHREALTIME
    [ "$rc" = 0 ] || { echo "git-credential.sh: failed ($rc): $*" >&2; return 1; }
    echo $(( ${t1/./} - ${t0/./} ))
}
# gitc HELPER ACTION: `git credential ACTION` with only HELPER configured.
gitc() { git -c credential.helper= -c "credential.helper=$1" credential "$2"; }
# measure NAME HELPER DIRECT...: the timed loops for one helper (its HOME and daemon already set
# up); DIRECT is the helper's own command, run as git runs it (`DIRECT get`, the request on stdin).
measure() {
    local name=$1 helper=$2 r; shift 2
    printf 'protocol=https\nhost=git.example.com\nusername=alice\npassword=s3cret-%s\n\n' "$name" > "$work/approve-$name"
    printf 'protocol=https\nhost=git.example.com\n\n' > "$work/fill"
    gitc "$helper" approve < "$work/approve-$name"
    local got; got="$(gitc "$helper" fill < "$work/fill" | grep '^password=')" || true
    [ "$got" = "password=s3cret-$name" ] || { echo "git-credential.sh: $name filled '$got', expected password=s3cret-$name" >&2; return 1; }
    for r in $(seq "$WARMUP"); do gitc "$helper" fill < "$work/fill" >/dev/null; done
    for r in $(seq "$N"); do IN="$work/fill" time_us gitc "$helper" fill; done > "$results/$name.fill"
    for r in $(seq "$N"); do IN="$work/approve-$name" time_us gitc "$helper" approve; done > "$results/$name.approve"
    got="$("$@" get < "$work/fill" | grep '^password=')" || true
    [ "$got" = "password=s3cret-$name" ] || { echo "git-credential.sh: $name's helper printed '$got'" >&2; return 1; }
    for r in $(seq "$N"); do IN="$work/fill" time_us "$@" get; done > "$results/$name.get"
}
export -f time_us gitc measure

common_env() { # HOME
    export HOME="$1" XDG_CONFIG_HOME="$1/config" GIT_CONFIG_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0 GIT_ASKPASS= SSH_ASKPASS=
    mkdir -p "$HOME"
}

[ "$skip_coffer" = 1 ] || (   # Coffer: an agent with a passcode, unlocked, as after login.
    common_env "$work/coffer"
    export XDG_RUNTIME_DIR="$work/coffer/run"; mkdir -p "$XDG_RUNTIME_DIR" "$HOME/pam"; chmod 700 "$XDG_RUNTIME_DIR"
    export COFFER_SOCKET="$XDG_RUNTIME_DIR/agent.sock"
    matrix=/usr/lib/x86_64-linux-gnu/pam_wrapper/pam_matrix.so
    printf '%s:%s:coffer\n' "$(id -un)" "$PASSWORD" > "$HOME/passdb"
    printf 'auth required %s passdb=%s\naccount required %s passdb=%s\n' $matrix "$HOME/passdb" $matrix "$HOME/passdb" > "$HOME/pam/coffer"
    # In the foreground, in the background of this shell: its pid is known, and it is ready once its
    # log says so.
    "$bin/cofferd" --foreground --socket "$COFFER_SOCKET" --state-dir "$work/coffer/state" --pam-confdir "$HOME/pam" \
        2>"$work/cofferd.log" </dev/null >/dev/null &
    echo $! > "$work/cofferd.pid"
    until grep -q 'agent ready' "$work/cofferd.log"; do
        kill -0 "$(cat "$work/cofferd.pid")" 2>/dev/null || { echo "git-credential.sh: cofferd exited:" >&2; cat "$work/cofferd.log" >&2; exit 1; }
        sleep 0.01
    done
    "$bin/coffer" passcode set --passcode-stdin < "$work/password"
    measure coffer "$bin/git-credential-coffer" "$bin/git-credential-coffer"
    # The helper beside a fetch of the same item by `coffer get`, one after the other in each round
    # (which goes first alternates), so that both see the same machine.
    got="$("$bin/coffer" get --server git.example.com --account alice)"
    [ "$got" = "s3cret-coffer" ] || { echo "git-credential.sh: coffer get printed '$got'" >&2; exit 1; }
    pair_helper() { IN="$work/fill" time_us "$bin/git-credential-coffer" get >> "$results/pair.helper"; }
    pair_fetch() { time_us "$bin/coffer" get --server git.example.com --account alice >> "$results/pair.fetch"; }
    for r in $(seq "$WARMUP"); do pair_helper; pair_fetch; done
    : > "$results/pair.helper"; : > "$results/pair.fetch"
    for r in $(seq "$N"); do
        if [ $((r % 2)) = 1 ]; then pair_helper; pair_fetch; else pair_fetch; pair_helper; fi
    done
)
(   # git alone: the shell git runs a helper with answers itself; nothing else is started.
    common_env "$work/floor"
    # (dash's read and printf are builtins: the request is drained and answered without a process.)
    answer="while read -r l && [ -n \"\$l\" ]; do :; done; printf 'username=alice\\npassword=s3cret-floor\\n'"
    measure floor "!f() { $answer; }; f" sh -c "$answer" sh
)
(   # a program: the cheapest helper git has to start.
    common_env "$work/program"
    measure program "$bin/git-credential-answer" "$bin/git-credential-answer"
)
(   # git-credential-store: a plain-text file.
    common_env "$work/store"
    measure store "store --file $work/store/credentials" git credential-store --file "$work/store/credentials"
)
(   # libsecret on gnome-keyring, unlocked, over the session bus.
    common_env "$work/libsecret"
    export XDG_RUNTIME_DIR="$work/libsecret/run" XDG_DATA_HOME="$work/libsecret/data"
    mkdir -p "$XDG_RUNTIME_DIR" "$XDG_DATA_HOME/keyrings"; chmod 700 "$XDG_RUNTIME_DIR"
    dbus-run-session -- bash -c '
        set -eu
        eval "$(gnome-keyring-daemon --unlock --components=secrets < "$work/password-raw")"
        until busctl --user status org.freedesktop.secrets >/dev/null 2>&1; do sleep 0.01; done
        measure libsecret "$bin/git-credential-libsecret" "$bin/git-credential-libsecret"
        # This session'"'"'s daemon only (the user may have a keyring of their own running).
        pid=$(busctl --user status org.freedesktop.secrets 2>/dev/null | sed -n "s/^PID=//p")
        [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
    '
)

# stat PEER OP median|p95 -> ms, or "–" when PEER was not measured
stat() {
    [ -s "$results/$1.$2" ] || { printf '–'; return; }
    sort -n "$results/$1.$2" | awk -v q="$3" '{a[NR]=$1} END {i = (q == "p95") ? int(NR*0.95) : int((NR+1)/2); if (i < 1) i = 1; printf "%.2f", a[i]/1000}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.1f×", b / a; else printf "–" }'; }
echo
echo "git credential helpers, $N runs each ($(git --version), $(nproc) cores); whole git process, ms"
echo
echo "| operation | coffer median / p95 | store median / p95 | libsecret median / p95 | coffer vs store | coffer vs libsecret |"
echo "|---|---:|---:|---:|---:|---:|"
for op in fill approve get; do
    c=$(stat coffer $op median); s=$(stat store $op median); l=$(stat libsecret $op median)
    what="\`git credential $op\`"; [ $op = get ] && what="the helper alone (\`HELPER get\`, as git runs it)"
    echo "| $what | $c / $(stat coffer $op p95) | $s / $(stat store $op p95) | $l / $(stat libsecret $op p95) | $(ratio "$c" "$s") | $(ratio "$c" "$l") |"
done
verdict() { awk -v c="$1" -v l="$2" 'BEGIN { if (c+0 > 0 && l+0 > 0) printf "%.1f× (%s)", l / c, (l / c >= 5) ? "met" : "NOT met"; else printf "not measured" }'; }
echo
echo "Goal (issue #17): at least 5× faster than libsecret. The helper alone: $(verdict "$(stat coffer get median)" "$(stat libsecret get median)");"
floor=$(stat floor fill median)
echo "the whole \`git credential fill\`: $(verdict "$(stat coffer fill median)" "$(stat libsecret fill median)"). git's own part is in every figure:"
echo "with a helper that answers from the shell git starts (nothing else run) a fill takes $floor ms (p95 $(stat floor fill p95)),"
echo "so no helper can make that ratio larger than $(awk -v s="$floor" -v l="$(stat libsecret fill median)" 'BEGIN { if (s+0 > 0) printf "%.1f×", l / s; else printf "–" }');"
echo "Coffer's fill is $(awk -v c="$(stat coffer fill median)" -v s="$floor" 'BEGIN { if (c+0 > 0 && s+0 > 0) printf "%.2f ms", c - s; else printf "–" }') above that floor."
helper=$(stat pair helper median); fetch=$(stat pair fetch median)
echo
echo "The helper beside a fetch of the same item (\`coffer get --server git.example.com --account alice\`), alternated, $N runs each; ms:"
echo
echo "| \`git-credential-coffer get\` median / p95 | \`coffer get\` median / p95 | difference of the medians |"
echo "|---:|---:|---:|"
echo "| $helper / $(stat pair helper p95) | $fetch / $(stat pair fetch p95) | $(awk -v h="$helper" -v f="$fetch" 'BEGIN { if (h+0 > 0 && f+0 > 0) printf "%+.2f", h - f; else printf "–" }') |"
echo
echo "Goals (issue #42): the helper within 0.20 ms of the fetch: $(awk -v h="$helper" -v f="$fetch" 'BEGIN { if (h+0 > 0 && f+0 > 0) printf "%.2f ms (%s)", h - f, (h - f <= 0.2) ? "met" : "NOT met"; else printf "not measured" }');"
echo "the whole \`git credential fill\` at least 4× libsecret: $(awk -v c="$(stat coffer fill median)" -v l="$(stat libsecret fill median)" 'BEGIN { if (c+0 > 0 && l+0 > 0) printf "%.1f× (%s)", l / c, (l / c >= 4) ? "met" : "NOT met"; else printf "not measured" }')."
echo
program=$(stat program fill median)
echo "The cheapest helper that is a program (static C printing a fixed answer: no store, no IPC) fills in $program ms"
echo "(p95 $(stat program fill p95)); alone, $(stat program get median) ms. No helper git must start can make the fill ratio larger than"
echo "$(awk -v s="$program" -v l="$(stat libsecret fill median)" 'BEGIN { if (s+0 > 0) printf "%.1f×", l / s; else printf "–" }'); Coffer's fill is $(awk -v c="$(stat coffer fill median)" -v s="$program" 'BEGIN { if (c+0 > 0 && s+0 > 0) printf "%.2f ms", c - s; else printf "–" }') above that program's."
