#!/usr/bin/env bash
# Builds Coffer once and runs every test: unit tests, then end-to-end tests that start the real agent over a
# real socket with a private PAM stack.
#
#   contrib/test.sh [--full] [--timings] [--jobs N] [--filter REGEX] [--skip REGEX] [--write-weights FILE]
#
# Phases, each timed, with a one-line summary of them all at the end:
#   deps       the Debian packages (contrib/deps.sh)
#   build      `swift build --build-tests`: the one build of the package; nothing later rebuilds it
#   pam        pam_coffer.so (cc only)
#   tests      every Swift Testing suite, JOBS processes at once (contrib/testrun.py; default 4): one line per
#              suite, then what failed, the quarantine list and `tests: N passed, N failed, N skipped`
# With CI=true (what .ci/run sets) or --full, the short reliability runs follow:
#   stress     the short stress run on the binaries of the build above (64 clients x 300 operations,
#              2,000 hostile frames beside a working client, 10 kill -9 crash trials)
#   fuzz-build the fuzz harnesses (release, libFuzzer + AddressSanitizer, .build-fuzz; incremental), and
#   fuzz       1,000,000 libFuzzer inputs per decoder (three decoders, at once): both started at the lowest
#              priority beside the test pass, so that they take the cycles the tests leave idle; each phase's
#              time is its own, beside the tests
#   fuzz-wait  how long the run then still waited for them: what fuzzing adds to CI's time
# With CI=true the build has no debug information (-gnone): DWARF costs about a fifth of the build's time,
# and a CI log needs none (failures carry Swift Testing's file:line; a crash's backtrace names functions).
# --full adds what CI has no room for (run it before a change that touches those areas):
#   stress-full  contrib/stress/run.sh (release build; 64 x 10,000, 10,000 frames, 100 crash trials)
#   fuzz-long    contrib/fuzz/run 300 (five minutes per decoder) instead of 15 s
#   sanitizers   contrib/sanitizers.sh: the suites under AddressSanitizer, then ThreadSanitizer
# --timings prints the 25 slowest tests and suites of the run. --filter/--skip choose suites (Target.Suite
# regular expressions) and skip the reliability runs. Exit status: that of the first phase that failed.
set -eu
cd "$(dirname "$0")/.."
full=false timings=() runner=() jobs=4 selected=false
while [ $# -gt 0 ]; do
    case "$1" in
        --full) full=true ;;
        --timings) timings=(--timings) ;;
        --jobs) jobs="$2"; shift ;;
        --filter|--skip) runner+=("$1" "$2"); selected=true; shift ;;
        --write-weights) runner+=("$1" "$2"); shift ;;
        *) echo "usage: contrib/test.sh [--full] [--timings] [--jobs N] [--filter REGEX] [--skip REGEX] [--write-weights FILE]" >&2
           exit 2 ;;
    esac
    shift
done
reliability=false
if { [ "${CI:-}" = true ] || $full; } && ! $selected; then reliability=true; fi

phases=()
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
started=$(now_ms)
# phase NAME COMMAND...: runs COMMAND as a timed phase (record).
phase() {
    local name="$1" t0 t1 rc
    shift
    echo; echo "== $name ($(date +%T))"
    t0=$(now_ms)
    set +e
    "$@"
    rc=$?
    set -e
    record "$name" $(( $(now_ms) - t0 )) "$rc"
}
# record NAME MILLISECONDS STATUS: prints and records a phase's duration; a failed phase ends the run with its status.
record() {
    phases+=("$1 $(( ($2 + 500) / 1000 )) s$([ "$3" -eq 0 ] || echo " (exit $3)")")
    echo "== $1: $(( $2 / 1000 )).$(( $2 % 1000 / 100 )) s"
    if [ "$3" -ne 0 ]; then summary; echo "== $1 FAILED (exit $3)"; exit "$3"; fi
}
summary() {
    local all="" p
    for p in "${phases[@]}"; do all="${all:+$all, }$p"; done
    echo; echo "== phases: $all; total $(( ($(now_ms) - started + 500) / 1000 )) s"
}

phase deps bash contrib/deps.sh
# In CI every compiler warning is an error (Package.swift reads COFFER_CI).
flags=()
if [ "${CI:-}" = true ]; then export COFFER_CI=1; flags=(-Xswiftc -gnone); fi
# SwiftPM refuses a target that imports a package target outside its dependencies' closure; the
# CofferArchitectureTests suite checks the rest (every import declared, layers one way).
phase build swift build --build-tests --explicit-target-dependency-import-check error ${flags[@]+"${flags[@]}"}
bin="$(swift build --show-bin-path ${flags[@]+"${flags[@]}"})"
if [ -x contrib/pam_coffer/build.sh ]; then phase pam bash contrib/pam_coffer/build.sh; fi

# The fuzz harnesses build and then fuzz beside the test pass, at the lowest priority: the tests wait more
# than they compute. In a session of its own (setsid), so that a run that stops early ends it all with it.
fuzzdir="$(mktemp -d /tmp/coffer-fuzz-XXXXXX)"
fuzz_pid=""
trap 'rm -rf "$fuzzdir"; if [ -n "$fuzz_pid" ]; then kill -- -"$fuzz_pid" 2>/dev/null || true; fi' EXIT
if $reliability; then
    # Each step writes "MILLISECONDS STATUS" to its own file as it ends; fuzzing starts only on a good build.
    setsid nice -n 19 bash -c '
        t0=$(date +%s%N); bash contrib/fuzz/run --build-only > "$1/build.log" 2>&1; rc=$?
        echo "$(( ($(date +%s%N) - t0) / 1000000 )) $rc" > "$1/build.time"; [ "$rc" -eq 0 ] || exit "$rc"
        t0=$(date +%s%N); bash contrib/fuzz/run --no-build --parallel --runs 1000000 > "$1/fuzz.log" 2>&1; rc=$?
        echo "$(( ($(date +%s%N) - t0) / 1000000 )) $rc" > "$1/fuzz.time"; exit "$rc"' fuzz "$fuzzdir" &
    fuzz_pid=$!
fi

phase tests python3 contrib/testrun.py --bundle "$bin/CofferPackageTests.xctest" --jobs "$jobs" \
    ${timings[@]+"${timings[@]}"} ${runner[@]+"${runner[@]}"}

if $reliability; then
    phase stress bash contrib/stress/run.sh --short --bin "$bin"
    echo; echo "== fuzz-build and fuzz (started beside the tests at the lowest priority; waiting for them at $(date +%T))"
    wait_t0=$(now_ms)
    set +e; wait "$fuzz_pid"; set -e
    fuzz_pid=""
    waited=$(( $(now_ms) - wait_t0 ))
    cat "$fuzzdir/build.log"
    read -r ms rc < "$fuzzdir/build.time" || { ms=0 rc=1; }
    record fuzz-build "$ms" "$rc"
    cat "$fuzzdir/fuzz.log"
    read -r ms rc < "$fuzzdir/fuzz.time" || { ms=0 rc=1; }
    record fuzz "$ms" "$rc"
    record fuzz-wait "$waited" 0
    if $full; then
        phase fuzz-long bash contrib/fuzz/run --no-build 300
        phase stress-full bash contrib/stress/run.sh
        phase sanitizers bash contrib/sanitizers.sh
    fi
fi
summary
