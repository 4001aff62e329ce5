#!/usr/bin/env bash
# Large items (issue #44, protocol version 4): what storing and fetching a secret of 1 KiB, 64 KiB,
# 256 KiB and 1 MiB costs through `coffer add` / `coffer get` on a real agent (release builds, PAM
# through pam_matrix, 100 items filled first), each the median of RUNS runs, with its ratio to the
# 1 KiB secret measured in the same run; and the agent's resident and locked memory (VmRSS, VmLck)
# after each size. Prints a Markdown table.
#
#   contrib/bench/large.sh [RUNS]      (default 21)
set -eu
runs="${1:-21}"
bench=large
cd "$(dirname "$0")/../.."
work="$(mktemp -d /tmp/coffer-bench-large-XXXXXX)"
trap 'coffer_agent_stop 2>/dev/null || true; rm -rf "$work"' EXIT
. contrib/bench/lib.sh
bench_install cofferd coffer coffer-cli coffer-bench
coffer_agent 100 fill
pid="$(pgrep -f -- "--state-dir $state" | head -1)"
mem() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$pid/status"; }
# Warm up first (the agent's first requests after its start ran ~10x slower in a first run of this
# script, and the 1 KiB row is every ratio's base).
printf 'warm' | "$bin/coffer" add --service large --account warm --secret-stdin
for i in $(seq 1 50); do "$bin/coffer" get --service large --account warm >/dev/null; done

printf '| secret | add (ms) | × 1 KiB | get (ms) | × 1 KiB | agent VmRSS after (KiB) | VmLck after (KiB) |\n|---|---:|---:|---:|---:|---:|---:|\n'
base_add="" base_get=""
for size in 1024 65536 262144 1048576; do
    head -c "$size" /dev/urandom | base64 -w 0 | head -c "$size" > "$work/secret-$size"
    : > "$work/add.us"; : > "$work/get.us"
    for i in $(seq 1 "$runs"); do
        IN="$work/secret-$size" time_us "$bin/coffer" add --service large --account "$size-$i" --secret-stdin >> "$work/add.us"
        time_us "$bin/coffer" get --service large --account "$size-$i" >> "$work/get.us"
    done
    "$bin/coffer" get --service large --account "$size-1" | cmp -s - "$work/secret-$size" || { echo "$bench: $size bytes did not round-trip" >&2; exit 1; }
    add=$(median "$work/add.us") get=$(median "$work/get.us")
    [ -n "$base_add" ] || { base_add=$add; base_get=$get; }
    awk -v s="$size" -v a="$add" -v g="$get" -v ba="$base_add" -v bg="$base_get" -v r="$(mem VmRSS)" -v l="$(mem VmLck)" 'BEGIN {
        printf "| %d KiB | %.2f | %.2f | %.2f | %.2f | %d | %d |\n", s / 1024, a / 1000, a / ba, g / 1000, g / bg, r, l }'
done
