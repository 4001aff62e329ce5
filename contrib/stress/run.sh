#!/usr/bin/env bash
# Reliability runs against a real agent, each printing a table and failing on any error:
#   load     64 clients x 10,000 mixed operations (add/get/update/delete/status): zero errors, p99 reported
#   hostile  10,000 random, mutated and truncated frames from an unsigned caller while a well-behaved client
#            (signed, its item in a group the hostile caller cannot reach) keeps working; each of its failures
#            is printed
#   crash    100 trials of kill -9 during a mixed add/update/delete load: every item exactly as its last
#            acknowledged write left it (the one write in flight may or may not have landed), integrity_check ok
# Usage: contrib/stress/run.sh [--short]   (--short: 64 x 300, 2,000 frames, 10 trials, debug build; what CI runs)
set -eu
cd "$(dirname "$0")/../.."
bash contrib/deps.sh
# The full runs use release builds (the figures in the README). --short uses the debug build the
# test pass already made (CI then compiles nothing more for it; the checks are the same).
config=release
if [ "${1:-}" = "--short" ]; then config=debug; fi
swift build -c "$config" --product cofferd >/dev/null
swift build -c "$config" --product coffer-bench >/dev/null
swift build -c "$config" --product coffer >/dev/null # signs the well-behaved client of the hostile run
swift build -c "$config" --product coffer-cli >/dev/null # coffer hands manifest commands to it
bin="$(swift build -c "$config" --show-bin-path)"
if [ "${1:-}" = "--short" ]; then
    "$bin/coffer-bench" stress "$bin" load 64 300
    "$bin/coffer-bench" stress "$bin" hostile 2000
    "$bin/coffer-bench" stress "$bin" crash 10
else
    "$bin/coffer-bench" stress "$bin" load 64 10000
    "$bin/coffer-bench" stress "$bin" hostile 10000
    "$bin/coffer-bench" stress "$bin" crash 100
fi
