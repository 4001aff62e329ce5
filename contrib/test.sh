#!/usr/bin/env bash
# Builds Coffer and runs every test: unit tests, then end-to-end tests that start the real agent
# over a real socket with a private PAM stack. Usage: contrib/test.sh [extra swift test args]
#
# With CI=true (what .ci/run sets) it then runs the short form of each reliability run:
#   stress (64-client style load, hostile frames beside a working client, kill -9 crash trials),
#   15 s of libFuzzer per decoder (three decoders; the suite and the sanitizer passes take most of the 30 minutes CI may use), and the whole suite again under AddressSanitizer and
#   most of it under ThreadSanitizer (contrib/sanitizers.sh says which). The full-size runs are contrib/stress/run.sh and contrib/fuzz/run SECONDS.
set -eu
cd "$(dirname "$0")/.."
bash contrib/deps.sh
# In CI every compiler warning is an error (Package.swift reads COFFER_CI).
if [ "${CI:-}" = true ]; then export COFFER_CI=1; fi
# SwiftPM refuses a target that imports a package target outside its dependencies' closure; the
# CofferArchitectureTests suite checks the rest (every import declared, layers one way).
swift build --build-tests --explicit-target-dependency-import-check error
if [ -x contrib/pam_coffer/build.sh ]; then bash contrib/pam_coffer/build.sh; fi
# Swift Testing's closing line counts only its own tests; the exit status is what counts.
swift test --skip-build "$@"
if [ "${CI:-}" = true ]; then
    step() { echo; echo "== $1 ($(date +%T))"; }
    step "stress, short form"
    bash contrib/stress/run.sh --short
    step "fuzzing, 15 s per decoder"
    bash contrib/fuzz/run 15
    step "sanitizers"
    bash contrib/sanitizers.sh
fi
