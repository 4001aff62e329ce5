# What the shell benchmarks share (sourced by peers.sh and secret-service.sh, never run alone): the
# timing and checking helpers, and a Coffer agent set up the same way every time.
#
# The sourcing script sets `bench` (its name, for messages) and `work` (its temporary directory,
# holding bin/ with the installed binaries) before calling anything here.

PASSWORD="bench password"                     # a dummy: handed over on stdin, never in argv

# bench_install PRODUCT...: the release builds, copied into $work/bin as an install would copy them
# (a freshly linked file measured up to 0.3 ms slower to start than the same file copied), and the
# password files the runs read ($work/password with a newline, password-raw without, new-secret).
bench_install() {
    local p
    for p in "$@"; do swift build -c release --product "$p" >/dev/null; done
    bin="$work/bin"; mkdir -p "$bin"
    for p in "$@"; do install -m 0755 "$(swift build -c release --show-bin-path)/$p" "$bin/"; done
    printf '%s\n' "$PASSWORD" > "$work/password"
    printf '%s' "$PASSWORD" > "$work/password-raw"
    printf 'x' > "$work/new-secret"
}

# time_us CMD...: runs CMD (stdin from $IN, default /dev/null; output discarded), prints its µs;
# fails if CMD fails, so an error is never timed as an answer.
time_us() {
    local t0 t1 rc=0
    t0=$EPOCHREALTIME
    "$@" <"${IN:-/dev/null}" >/dev/null 2>&1 || rc=$?
    t1=$EPOCHREALTIME
    [ "$rc" = 0 ] || { echo "$bench: failed ($rc): $*" >&2; return 1; }
    echo $(( ${t1/./} - ${t0/./} ))
}
# expect WANT CMD...: CMD must print exactly WANT (a fetch is checked before it is timed).
expect() {
    local want="$1" got; shift
    got="$("$@" </dev/null 2>&1)" || true
    [ "$got" = "$want" ] || { echo "$bench: $* printed '$got', expected '$want'" >&2; return 1; }
}
# key i: the item each peer stores as service svc(i % 97), account acct(i), secret secret-i.
pick() { echo $(( ($1 * 7919) % $2 + 1 )); }
# median FILE: the median of FILE's numbers (0 for none).
median() { sort -n "$1" | awk '{ a[NR] = $1 } END { if (NR == 0) print "0"; else print a[int((NR + 1) / 2)] }'; }
export -f time_us expect pick median
export bench

# coffer_agent N FILL [cofferd argument...]: in the caller's (sub)shell, a Coffer agent with its own
# HOME under $work, PAM through pam_matrix with $PASSWORD, the passcode set, N items filled directly
# by `coffer-bench FILL` while the agent is stopped, then the agent started again and unlocked.
# Exports HOME, XDG_RUNTIME_DIR and COFFER_SOCKET; sets `state` and `agent` (the command that starts it).
coffer_agent() {
    local n=$1 fill=$2; shift 2
    export HOME="$work/coffer-$n" XDG_RUNTIME_DIR="$work/coffer-$n/run"
    mkdir -p "$XDG_RUNTIME_DIR" "$HOME/pam"; chmod 700 "$XDG_RUNTIME_DIR"
    export COFFER_SOCKET="$XDG_RUNTIME_DIR/agent.sock"
    local matrix=/usr/lib/x86_64-linux-gnu/pam_wrapper/pam_matrix.so
    state="$HOME/state"
    printf '%s:%s:coffer\n' "$(id -un)" "$PASSWORD" > "$HOME/passdb"
    printf 'auth required %s passdb=%s\naccount required %s passdb=%s\n' $matrix "$HOME/passdb" $matrix "$HOME/passdb" > "$HOME/pam/coffer"
    agent=("$bin/cofferd" --socket "$COFFER_SOCKET" --state-dir "$state" --pam-confdir "$HOME/pam" "$@")
    "${agent[@]}"
    "$bin/coffer" passcode set --passcode-stdin < "$work/password"
    coffer_agent_stop
    "$bin/coffer-bench" "$fill" "$state" "$n" < "$work/password"
    sync # (after every fill: a flush of the fill's dirty pages must not land in the timings)
    "${agent[@]}"
    "$bin/coffer" unlock --passcode-stdin < "$work/password"
}
# coffer_agent_stop: stops the agent of $state and waits for the process (the socket goes before the
# agent lets go of the state directory's lock).
coffer_agent_stop() {
    pkill -TERM -f -- "--state-dir $state" || true
    while pgrep -f -- "--state-dir $state" >/dev/null; do sleep 0.01; done
}
