#!/usr/bin/env bash
# Reliability runs against a real agent, each printing a table and failing on any error:
#   load     64 clients x 10,000 mixed operations (add/get/update/delete/status): zero errors, p99 reported
#   hostile  10,000 random, mutated and truncated frames from an unsigned caller while a well-behaved client
#            (signed, its item in a group the hostile caller cannot reach) keeps working; each of its failures
#            is printed
#   crash    100 trials of kill -9 during a mixed add/update/delete load: every item exactly as its last
#            acknowledged write left it (the one write in flight may or may not have landed), integrity_check ok
# Usage: contrib/stress/run.sh [--short] [--bin DIR]   (--short: 64 x 300, 2,000 frames, 10 trials, debug build;
#   what CI runs. --bin DIR: the binaries of a build already made, e.g. contrib/test.sh's; nothing is built)
set -eu
cd "$(dirname "$0")/../.."
short=false bin=""
# cofferd and coffer-bench; coffer signs the well-behaved client of the hostile run and hands manifest commands
# to coffer-cli.
programs="cofferd coffer-bench coffer coffer-cli"
while [ $# -gt 0 ]; do
    case "$1" in
        --short) short=true ;;
        --bin) bin="$2"; shift ;;
        *) echo "usage: contrib/stress/run.sh [--short] [--bin DIR]" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$bin" ]; then
    bash contrib/deps.sh
    # The full runs use release builds (the figures in docs/TESTING.md's Reliability table). --short uses the debug build the
    # test pass already made (compiling nothing more for it; the checks are the same).
    config=release
    if $short; then config=debug; fi
    for product in $programs; do swift build -c "$config" --product "$product" >/dev/null; done
    bin="$(swift build -c "$config" --show-bin-path)"
fi
for program in $programs; do
    [ -x "$bin/$program" ] || { echo "stress: $bin/$program is not built" >&2; exit 1; }
done
if $short; then
    "$bin/coffer-bench" stress "$bin" load 64 300
    "$bin/coffer-bench" stress "$bin" hostile 2000
    "$bin/coffer-bench" stress "$bin" crash 10
else
    "$bin/coffer-bench" stress "$bin" load 64 10000
    "$bin/coffer-bench" stress "$bin" hostile 10000
    "$bin/coffer-bench" stress "$bin" crash 100
fi
