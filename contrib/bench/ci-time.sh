#!/usr/bin/env bash
# Measures CI as CI runs it: RUNS fresh clones of this checkout's HEAD (default 3), one after the other, each
# in a new directory under a 0700 one, each `bash .ci/run` with CI=true and no standard input; then a table of
# each phase's time per run (the `== phases:` line contrib/test.sh ends on) with the median, and each run's
# total wall time. The dependencies are installed by the first run; the `deps` phase of the others shows what
# an installed machine costs.
#
#   contrib/bench/ci-time.sh [RUNS]
#
# Exit status: 0 when every run passed, 1 otherwise (the failed run's log is kept and named).
set -eu
runs="${1:-3}"
here="$(cd "$(dirname "$0")/../.." && pwd)"
head="$(git -C "$here" rev-parse HEAD)"
top="$(mktemp -d /tmp/coffer-ci-time-XXXXXX)"
chmod 700 "$top"
status=0
logs=()
echo "ci-time: $runs fresh clones of $(git -C "$here" log -1 --format='%h %s' | cut -c1-80) under $top"
for i in $(seq 1 "$runs"); do
    clone="$top/run$i/coffer"
    mkdir -p "$top/run$i"
    git clone -q --no-hardlinks "$here" "$clone"
    git -C "$clone" checkout -q "$head"
    log="$top/run$i.log"
    t0=$(date +%s)
    set +e
    (cd "$clone" && env -u COFFER_CI CI=true bash .ci/run < /dev/null > "$log" 2>&1)
    rc=$?
    set -e
    t1=$(date +%s)
    echo "run $i: exit $rc in $((t1 - t0)) s; $(grep -a '^== phases:' "$log" | tail -1)"
    if [ "$rc" -ne 0 ]; then
        status=1
        echo "run $i FAILED; its log is $log:"
        tail -40 "$log"
    else
        logs+=("$log")
        rm -rf "$top/run$i"   # the clone and its build (several GiB); the log stays
    fi
done
[ ${#logs[@]} -gt 0 ] || { echo "ci-time: no run passed" >&2; exit 1; }
# One row per phase: each run's seconds, then the median of the runs that passed.
python3 - "${logs[@]}" <<'PY'
import re, statistics, sys
runs = []
for path in sys.argv[1:]:
    line = [l for l in open(path, encoding="utf-8", errors="replace") if l.startswith("== phases:")][-1]
    phases = dict((m.group(1), int(m.group(2))) for m in re.finditer(r"([\w-]+) (\d+) s", line.split(";")[0]))
    phases["total"] = int(re.search(r"total (\d+) s", line).group(1))
    runs.append(phases)
names = list(dict.fromkeys(n for r in runs for n in r))
print("\n| phase | " + " | ".join(f"run {i + 1} (s)" for i in range(len(runs))) + " | median (s) |")
print("|---|" + "---:|" * (len(runs) + 1))
for n in names:
    values = [r[n] for r in runs if n in r]
    print(f"| {n} | " + " | ".join(str(r.get(n, "")) for r in runs) + f" | {statistics.median(values):g} |")
total = statistics.median(r["total"] for r in runs)
print(f"\nmedian total {total:g} s ({total / 60:.1f} min); slowest {max(r['total'] for r in runs)} s")
PY
exit "$status"
