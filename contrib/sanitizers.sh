#!/usr/bin/env bash
# Runs the test suite under AddressSanitizer (all but the slowest end-to-end suites), then
# ThreadSanitizer (all but most end-to-end suites), see below, each in its own build directory (they
# cannot share one). The end-to-end tests start the agent and CLI of the same
# sanitized build, so the agent runs under the sanitizer too. Every report, from the test runner
# or from any agent it started, is written to a log directory; any report fails the run.
# Usage: contrib/sanitizers.sh [address|thread ...]
set -eu
cd "$(dirname "$0")/.."
bash contrib/deps.sh
reports="$(mktemp -d /tmp/coffer-sanitizers-XXXXXX)"
trap 'rm -rf "$reports"' EXIT
status=0
for san in ${@:-address thread}; do
    echo "== swift test --sanitize=$san"
    skip=()
    if [ "$san" = thread ]; then
        # ThreadSanitizer runs every target but the end-to-end one, whose agent is a separate program
        # started per test: the agent's code runs in-process under TSan in CofferAgentTests, and the
        # end-to-end AgentTests (many concurrent clients, concurrent locks) still run here. ASan runs
        # most of them. CI's 30 minutes on two cores do not hold three full passes.
        echo "(ThreadSanitizer: the end-to-end suites other than AgentTests are skipped; AddressSanitizer runs most of them)"
        skip=(--skip 'CofferEndToEndTests\.(?!AgentTests\b)')
    else
        # AddressSanitizer runs every target, but not the end-to-end suites whose time goes to other
        # programs and to waiting (three agents and git, swtpm, kill -9 trials, git's own test script,
        # terminals, install scripts, man pages). The code they drive runs in-process under ASan in the
        # unit suites (KeychainSyncTests, SyncReplicaTests, TPMHMACKeyTests, RollbackDetectionTests,
        # RekeyAndTierTests, GitCredentialParsingTests); the plain run runs them all.
        slow='SyncAgentTests|TPMAgentTests|RekeyCrashTests|RollbackAgentTests|GitT0303Tests|TerminalTests'
        slow="$slow|SystemdTests|WithoutSystemdTests|InstallScriptTests|InstallScriptStepsTests|ManPageTests|SSHOpenSSHTests"
        echo "(AddressSanitizer: these end-to-end suites run in the plain run only: ${slow//|/, })"
        skip=(--skip "CofferEndToEndTests\\.($slow)\\b")
    fi
    # `coffer` links dynamically here: sanitizer runtimes cannot go into a static executable.
    # COFFER_SANITIZED: tests too slow to repeat under a sanitizer (OpenSSH's regression scripts) skip with a message.
    COFFER_DYNAMIC_CLI=1 COFFER_SANITIZED="$san" SWIFT_BACKTRACE=enable=no \
        LSAN_OPTIONS="suppressions=$PWD/contrib/lsan.supp:print_suppressions=0" \
        ASAN_OPTIONS="log_path=$reports/asan" TSAN_OPTIONS="log_path=$reports/tsan" \
        swift test --sanitize="$san" --scratch-path ".build-$san" ${skip[@]+"${skip[@]}"} || status=1
done
for r in "$reports"/*; do
    [ -e "$r" ] || continue
    echo "== sanitizer report $(basename "$r")"
    cat "$r"
    status=1
done
exit "$status"
