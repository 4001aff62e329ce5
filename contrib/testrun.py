#!/usr/bin/env python3
"""Runs the built test bundle's Swift Testing suites in several processes at once (contrib/test.sh's test pass).

The end-to-end suites spend most of their time waiting (agent start-up, Argon2id, sockets, child programs), and
one test process runs only as many blocking tests at once as the machine has cores (Swift's cooperative pool):
several processes keep both cores busy. Each top-level suite runs in one process (its tests still run
concurrently there, or one by one for a `.serialized` suite); suites are handed out longest first (the solo
wall times in contrib/test-weights.txt; a suite missing there goes first) to JOBS workers. Every process gets its
own temporary root (TMPDIR), kept when it failed. Nothing is retried.

Prints one line per suite as it ends, then what failed (each failed suite's failure lines and the tail of its
log), the quarantine list (contrib/quarantine.txt), and the totals, ending on the plain closing line
`tests: N passed, N failed, N skipped`. Exit status 0 when every suite passed, 1 otherwise, 2 on a usage error.

    testrun.py --bundle PATH [--jobs N] [--filter REGEX] [--skip REGEX] [--timings] [--write-weights FILE]
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# A suite that has not finished after this long is stopped and counted as failed: a failure bound, far above any
# suite's normal time (the slowest takes about a minute alone), so only a hang reaches it.
SUITE_TIMEOUT = 1200

# Swift Testing's console lines (with or without colour): a test's end, a skip, a known issue, a run's end. Searched
# anywhere in a line, not only at its start: its lines are not written whole, and one was seen inside another
# ('◇ Test case passing 1 argument name → "plain✔ Test plainCarriesTheSecretAsItIs() passed after 0.036 seconds.').
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TEST_END = re.compile(r"[✔✘━] Test (?!case |run with )(.+?) (passed|failed) after ([0-9.]+) seconds")
TEST_SKIP = re.compile(r"➜ Test (?!case )(.+?) (?:skipped|was cancelled)")
KNOWN = re.compile(r"━ Test .* recorded a known issue")
RUN_END = re.compile(r"[✔✘━] Test run with (\d+) tests? (?:in \d+ suites? )?(passed|failed)")


def list_tests(bundle):
    out = subprocess.run([bundle, "--testing-library", "swift-testing", "--list-tests"], capture_output=True, text=True,
                         check=True).stdout
    return [line.strip() for line in out.splitlines() if "/" in line]


def read_weights(path):
    """{unit: seconds} and the suites marked `split` (each of their tests is a unit of its own)."""
    weights, split = {}, set()
    if os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2:
                weights[fields[0]] = float(fields[1])
                if "split" in fields[2:]:
                    split.add(fields[0])
    return weights, split


def read_quarantine(path):
    if not os.path.exists(path):
        return []
    return [line.rstrip("\n") for line in open(path, encoding="utf-8") if line.strip() and not line.startswith("#")]


class Result:
    def __init__(self, suite):
        self.suite = suite
        self.passed = self.failed = self.skipped = self.known = 0
        self.tests = []          # (seconds, test name)
        self.reported = set()    # the names of the tests that passed, failed or were skipped
        self.run_count = None    # the test count of the run's closing line
        self.status = None
        self.seconds = 0.0
        self.cpu = 0.0
        self.log = ""
        self.tmp = ""
        self.timed_out = False
        self.leftovers = []      # processes still running after the suite ended, killed then

    @property
    def ok(self):
        return self.status == 0 and self.failed == 0 and not self.timed_out and self.run_count is not None


def parse(result, text):
    for raw in text.splitlines():
        line = ANSI.sub("", raw)
        m = TEST_END.search(line)
        if m:
            name = m.group(1).split(" with ", 1)[0]
            result.reported.add(name)
            if m.group(2) == "passed":
                result.passed += 1
            else:
                result.failed += 1
            result.tests.append((float(m.group(3)), f"{result.suite.split('/', 1)[0]}/{name}"))
            continue
        m = TEST_SKIP.search(line)
        if m:
            result.skipped += 1
            result.reported.add(m.group(1))
        elif KNOWN.search(line):
            result.known += 1
        else:
            m = RUN_END.search(line)
            if m:
                result.run_count = int(m.group(1))


def run_suite(bundle, suite, root, index):
    r = Result(suite)
    r.tmp = tempfile.mkdtemp(prefix=f"s{index:03d}-", dir=root)
    os.chmod(r.tmp, 0o755)  # as /tmp is: a test may let another uid traverse to a directory it made here
    r.log = os.path.join(r.tmp, "test.log")
    env = dict(os.environ, TMPDIR=r.tmp)
    pattern = "^" + re.escape(suite) + ("" if "/" in suite else "/")
    t0 = time.monotonic()
    with open(r.log, "wb") as log:
        p = subprocess.Popen([bundle, "--testing-library", "swift-testing", "--filter", pattern], stdin=subprocess.DEVNULL,
                             stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                             preexec_fn=default_signals)

    def stop():
        r.timed_out = True
        kill_group(p.pid)
    timer = threading.Timer(SUITE_TIMEOUT, stop)
    timer.start()
    # wait4, for this process's own CPU time (and that of the children it waited for: agents, CLIs).
    _, status, usage = os.wait4(p.pid, 0)
    timer.cancel()
    p.returncode = r.status = os.waitstatus_to_exitcode(status)
    # Whatever the suite left behind goes too: its process group, and every process whose command line names the
    # suite's temporary root (agents and front ends, which Foundation's Process starts in sessions of their own).
    kill_group(p.pid)
    r.leftovers = kill_naming(r.tmp + "/")
    r.seconds = time.monotonic() - t0
    r.cpu = usage.ru_utime + usage.ru_stime
    parse(r, open(r.log, encoding="utf-8", errors="replace").read())
    return r


def default_signals():
    """SIGINT and SIGQUIT at their defaults in a test process: a runner started in the background by a shell has them
    ignored, and its children would inherit that (a terminal test's Ctrl-C would then interrupt nothing)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_naming(text):
    """SIGKILLs every process whose command line contains `text`; returns their command lines."""
    killed = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(cmdline.strip())
            except OSError:
                pass
    return killed


def failure_lines(result, limit=60):
    """What failed in the suite's log, through the project's one printer of that (contrib/failures.sh)."""
    out = subprocess.run(["bash", os.path.join(HERE, "failures.sh"), result.log, str(limit)], capture_output=True,
                         text=True, errors="replace").stdout
    return [ANSI.sub("", line) for line in out.splitlines()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="the built test bundle (.build/debug/CofferPackageTests.xctest)")
    ap.add_argument("--jobs", type=int, default=3, help="test processes at once (default 3)")
    ap.add_argument("--filter", help="run only suites whose id (Target.Suite) matches this regular expression")
    ap.add_argument("--skip", help="skip suites whose id matches this regular expression")
    ap.add_argument("--timings", action="store_true", help="also print the 25 slowest tests and suites")
    ap.add_argument("--weights", default=os.path.join(HERE, "test-weights.txt"))
    ap.add_argument("--write-weights", metavar="FILE", help="write each suite's wall time of this run to FILE")
    ap.add_argument("--keep", action="store_true", help="keep every suite's temporary root and log")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")

    tests = list_tests(args.bundle)
    suites = sorted({t.split("/", 1)[0] for t in tests})
    if args.filter:
        suites = [s for s in suites if re.search(args.filter, s)]
    if args.skip:
        suites = [s for s in suites if not re.search(args.skip, s)]
    chosen = set(suites)
    expected = sum(1 for t in tests if t.split("/", 1)[0] in chosen)
    weights, split = read_weights(args.weights)
    # A unit is a suite, or one test of a suite marked `split` (long tests that share nothing but their suite's
    # name: each then runs in a process of its own, and the longest no longer waits behind its siblings).
    units = []
    for suite in suites:
        if suite in split:
            units += [t for t in tests if t.split("/", 1)[0] == suite]
        else:
            units.append(suite)
    if not units:
        print("testrun: no suite matches; nothing ran", file=sys.stderr)
        return 1
    unknown = max(weights.values(), default=1.0) + 1
    queue = sorted(units, key=lambda u: (-weights.get(u, weights.get(u.split("/", 1)[0], unknown)), u))

    root = tempfile.mkdtemp(prefix="coffer-tests-", dir="/tmp")
    os.chmod(root, 0o755)
    print(f"testrun: {len(queue)} units (suites, or tests of a split suite), {expected} tests, {args.jobs} processes at once; temporary roots under {root}",
          flush=True)
    lock = threading.Lock()
    results = []
    next_index = [0]
    t0 = time.monotonic()

    def worker():
        while True:
            with lock:
                if next_index[0] >= len(queue):
                    return
                i = next_index[0]
                next_index[0] += 1
            r = run_suite(args.bundle, queue[i], root, i)
            with lock:
                results.append(r)
                mark = "✔" if r.ok else "✘"
                extra = f", {r.known} known issues" if r.known else ""
                why = " (TIMED OUT)" if r.timed_out else ("" if r.ok else f" (exit {r.status})")
                print(f"{mark} [{len(results):3d}/{len(queue)}] {r.suite}: {r.passed} passed, {r.failed} failed, "
                      f"{r.skipped} skipped{extra} in {r.seconds:.1f} s{why}", flush=True)

    threads = [threading.Thread(target=worker) for _ in range(min(args.jobs, len(queue)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0

    failed = [r for r in results if not r.ok]
    passed = sum(r.passed for r in results)
    failures = sum(r.failed for r in results) + sum(1 for r in failed if r.failed == 0)
    skipped = sum(r.skipped for r in results)
    known = sum(r.known for r in results)
    ran = sum(r.passed + r.failed + r.skipped for r in results)

    if args.timings:
        print("\n== the 25 slowest tests (wall time in their process, beside the others running then)")
        for seconds, name in sorted((t for r in results for t in r.tests), reverse=True)[:25]:
            print(f"{seconds:8.2f} s  {name}")
        print("\n== the 25 slowest suites (wall time of the suite's process; CPU time of it and its children)")
        for r in sorted(results, key=lambda r: -r.seconds)[:25]:
            print(f"{r.seconds:8.2f} s  {r.cpu:8.2f} s CPU  {r.suite}")
        print("\n== the 25 suites that used the most CPU (of %.0f s CPU in all, %.0f s wall)"
              % (sum(r.cpu for r in results), wall))
        for r in sorted(results, key=lambda r: -r.cpu)[:25]:
            print(f"{r.cpu:8.2f} s CPU  {r.seconds:8.2f} s  {r.suite}")
    if args.write_weights:
        with open(args.write_weights, "w", encoding="utf-8") as f:
            f.write("# Each suite's wall time (s) in a run of contrib/testrun.py: the order suites are handed out in,\n"
                    "# longest first. Written by contrib/test.sh --write-weights; a suite missing here goes first.\n")
            for suite in sorted(split & chosen):
                total = sum(r.seconds for r in results if r.suite.startswith(suite + "/"))
                f.write(f"{suite} {total:.2f} split\n")
            for r in sorted(results, key=lambda r: r.suite):
                f.write(f"{r.suite} {r.seconds:.2f}\n")

    quarantine = read_quarantine(os.path.join(HERE, "quarantine.txt"))
    print(f"\n== quarantined tests (contrib/quarantine.txt): {len(quarantine) or 'none'}")
    for line in quarantine:
        print("   " + line)

    if failed:
        print(f"\n== {len(failed)} of {len(results)} units FAILED; what failed:")
        for r in failed:
            why = "timed out after %d s" % SUITE_TIMEOUT if r.timed_out else f"exit status {r.status}"
            if r.run_count is None and not r.timed_out:
                why += ", no closing line (the process crashed?)"
            print(f"\n--- {r.suite} ({why}); log {r.log}")
            for line in failure_lines(r):
                print(line)
            print("  (last lines of the log)")
            for line in open(r.log, encoding="utf-8", errors="replace").read().splitlines()[-15:]:
                print("  | " + ANSI.sub("", line))
    incomplete = False
    for r in results:
        unit_tests = [t for t in tests if t == r.suite or t.startswith(r.suite.rstrip("/") + "/")]
        missing = [t for t in unit_tests if t.rsplit("/", 1)[1] not in r.reported]
        for t in missing:
            incomplete = True
            print(f"testrun: {t} never reported an end; its log: {r.log}")
        if r.ok and not missing and not args.keep:
            subprocess.run(["rm", "-rf", r.tmp])
    if not failed and not incomplete and not args.keep:
        try:
            os.rmdir(root)
        except OSError:
            pass

    for r in results:
        for cmdline in r.leftovers:
            print(f"testrun: {r.suite} left a process running (killed): {cmdline[:200]}")
    print(f"\n{ran} of {expected} tests ran in {wall:.1f} s ({len(results)} units, {args.jobs} processes at once)"
          + (f", {known} known issues" if known else ""))
    if ran < expected:
        print(f"testrun: {expected - ran} tests never reported an end (a crashed process?)")
        failures += expected - ran if not failed else 0
    print(f"tests: {passed} passed, {failures} failed, {skipped} skipped")
    return 0 if not failed and ran == expected else 1


if __name__ == "__main__":
    sys.exit(main())
