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
#   tests      every Swift Testing suite, JOBS processes at once (contrib/testrun.py; default 3): one line per
#              suite, then what failed, the quarantine list and `tests: N passed, N failed, N skipped`
# With CI=true (what .ci/run sets) or --full, the short reliability runs follow:
#   stress     the short stress run on the binaries of the build above (64 clients x 300 operations,
#              2,000 hostile frames beside a working client, 10 kill -9 crash trials)
#   fuzz-build the fuzz harnesses (release, libFuzzer + AddressSanitizer, .build-fuzz; incremental), started
#              at a lower priority beside the test pass so that it takes the cycles the tests leave idle
#   fuzz       15 s of libFuzzer per decoder (three decoders)
# --full adds what CI has no room for (run it before a change that touches those areas):
#   stress-full  contrib/stress/run.sh (release build; 64 x 10,000, 10,000 frames, 100 crash trials)
#   fuzz-long    contrib/fuzz/run 300 (five minutes per decoder) instead of 15 s
#   sanitizers   contrib/sanitizers.sh: the suites under AddressSanitizer, then ThreadSanitizer
# --timings prints the 25 slowest tests and suites of the run. --filter/--skip choose suites (Target.Suite
# regular expressions) and skip the reliability runs. Exit status: that of the first phase that failed.
set -eu
cd "$(dirname "$0")/.."
full=false timings=() runner=() jobs=3 selected=false
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
if [ "${CI:-}" = true ]; then export COFFER_CI=1; fi
# SwiftPM refuses a target that imports a package target outside its dependencies' closure; the
# CofferArchitectureTests suite checks the rest (every import declared, layers one way).
phase build swift build --build-tests --explicit-target-dependency-import-check error
bin="$(swift build --show-bin-path)"
if [ -x contrib/pam_coffer/build.sh ]; then phase pam bash contrib/pam_coffer/build.sh; fi

# The fuzz harnesses build beside the test pass, niced: the tests wait more than they compute.
# In a session of its own (setsid), so that a run that stops early ends the whole build with it.
fuzzlog="$(mktemp /tmp/coffer-fuzz-build-XXXXXX)"
fuzz_pid=""
trap 'rm -f "$fuzzlog"; if [ -n "$fuzz_pid" ]; then kill -- -"$fuzz_pid" 2>/dev/null || true; fi' EXIT
if $reliability; then
    fuzz_t0=$(now_ms)
    setsid nice -n 15 bash contrib/fuzz/run --build-only > "$fuzzlog" 2>&1 &
    fuzz_pid=$!
fi

phase tests python3 contrib/testrun.py --bundle "$bin/CofferPackageTests.xctest" --jobs "$jobs" \
    ${timings[@]+"${timings[@]}"} ${runner[@]+"${runner[@]}"}

if $reliability; then
    phase stress bash contrib/stress/run.sh --short --bin "$bin"
    echo; echo "== fuzz-build (started beside the tests, niced; waiting for it at $(date +%T))"
    set +e; wait "$fuzz_pid"; rc=$?; set -e
    fuzz_pid=""
    cat "$fuzzlog"
    record fuzz-build $(( $(now_ms) - fuzz_t0 )) "$rc"
    if $full; then
        phase fuzz-long bash contrib/fuzz/run 300
        phase stress-full bash contrib/stress/run.sh
        phase sanitizers bash contrib/sanitizers.sh
    else
        phase fuzz bash contrib/fuzz/run 15
    fi
fi
summary
