#!/usr/bin/env bash
# Prints what failed in a `swift test` log, so a failure is the last thing a long run shows (used by
# contrib/test.sh and contrib/sanitizers.sh). Swift Testing marks a failed test, suite or expectation
# with ✘; XCTest says "error:" / "failed (".
#   contrib/failures.sh LOG [MAX_LINES]     (default 60)
grep -E '✘|: error: |\bfailed \(' "$1" | head -"${2:-60}" || true
