#!/usr/bin/env bash
# Runs the test suite under AddressSanitizer (all but most end-to-end suites), then
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
        # those that drive C walls. CI's 30 minutes on two cores do not hold three full passes.
        echo "(ThreadSanitizer: the end-to-end suites other than AgentTests are skipped; AddressSanitizer runs those that drive C walls)"
        skip=(--skip 'CofferEndToEndTests\.(?!AgentTests\b)')
    else
        # AddressSanitizer runs every target but, of the end-to-end suites (each test a sanitized agent
        # and CLI started anew, slow under ASan), only those that drive the agent's C walls and its
        # parsing of what other processes send: hostile and concurrent frames, delegation, the Secret
        # Service front end (sd-bus, OpenSSL), the portal backend, the ssh-agent socket, the plugin
        # host (biometry, fprintd over sd-bus), PAM, locked memory. The others repeat Swift-only
        # paths that the unit suites run in-process under ASan; the plain run runs them all.
        kept='AgentTests|ProtocolConformanceTests|ConnectionLimitTests|DelegationTests|LockedMemoryTests|MemoryHygieneTests'
        kept="$kept|SecretServiceBusTests|SecretServiceItemTests|SecretServicePromptTests|SecretServiceAccessControlTests"
        kept="$kept|SecretPortalTests|SSHAgentTests|SSHAgentPolicyTests|FprintdTests|BiometryTests|PAMModuleTests"
        echo "(AddressSanitizer: of the end-to-end suites, only ${kept//|/, } run here; the plain run runs them all)"
        skip=(--skip "CofferEndToEndTests\\.(?!($kept)\\b)")
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
