#!/usr/bin/env bash
# Builds release binaries and prints Coffer's benchmark tables (Markdown). Not a test: numbers vary
# with the machine; the table shows the machine's own floors (socket echo, /bin/true) beside them.
#   contrib/bench/run.sh [ITEMS]      (default 100000)
set -eu
cd "$(dirname "$0")/../.."
bash contrib/deps.sh
items="${1:-100000}"
swift build -c release --product cofferd >/dev/null
swift build -c release --product coffer >/dev/null
swift build -c release --product coffer-cli >/dev/null
swift build -c release --product coffer-bench >/dev/null
bin="$(swift build -c release --show-bin-path)"
echo "## Keychain library (no agent)"
echo
"$bin/coffer-bench" keychain 1000 "$items"
echo
echo "## Agent over its socket ($items items)"
echo
"$bin/coffer-bench" agent "$bin" "$items"
