#!/usr/bin/env bash
# Builds Coffer and runs every test: unit tests, then end-to-end tests that start the real agent
# over a real socket with a private PAM stack. Usage: contrib/test.sh [extra swift test args]
set -eu
cd "$(dirname "$0")/.."
bash contrib/deps.sh
swift build --build-tests
if [ -x contrib/pam_coffer/build.sh ]; then bash contrib/pam_coffer/build.sh; fi
# Swift Testing's closing line counts only its own tests; the exit status is what counts.
swift test --skip-build "$@"
# In CI (CI=true), also fuzz the wire decoders for 60 s (libFuzzer + AddressSanitizer).
if [ "${CI:-}" = true ]; then bash contrib/fuzz/run 60; fi
