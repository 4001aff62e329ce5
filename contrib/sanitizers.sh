#!/usr/bin/env bash
# Runs the whole test suite under AddressSanitizer, then ThreadSanitizer, each in its own build
# directory (they cannot share one). Usage: contrib/sanitizers.sh [address|thread ...]
set -eu
cd "$(dirname "$0")/.."
bash contrib/deps.sh
for s in "${@:-address thread}"; do
    for san in $s; do
        echo "== swift test --sanitize=$san"
        LSAN_OPTIONS="suppressions=$PWD/contrib/lsan.supp:print_suppressions=0" SWIFT_BACKTRACE=enable=no \
            swift test --sanitize="$san" --scratch-path ".build-$san"
    done
done
