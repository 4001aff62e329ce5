#!/usr/bin/env bash
# Prints what failed in a `swift test` log, so a failure is the last thing a long run shows (used by
# contrib/testrun.py for each failed suite, and contrib/sanitizers.sh). Swift Testing marks a failed test, suite
# or expectation with ✘; XCTest says "error:" / "failed ("; a Swift trap says "Fatal error". -a: a log may hold
# a child's binary output.
#   contrib/failures.sh LOG [MAX_LINES]     (default 60)
grep -aE '✘|: error: |\bfailed \(|Fatal error' "$1" | head -"${2:-60}" || true
