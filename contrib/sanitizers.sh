#!/usr/bin/env bash
# Runs the test suite under AddressSanitizer, then ThreadSanitizer, each in its own build directory
# (they cannot share one). The end-to-end tests start the agent and CLI of the same sanitized build,
# so the agent runs under the sanitizer too. Every report, from the test runner or from any agent it
# started, is written to a log directory; any report fails the run. At the end it names every test
# that failed in each pass, so a failure is the last thing printed, not buried under a later pass.
# Usage: contrib/sanitizers.sh [--short] [address|thread ...]
#   --short (the quick check before a stop): AddressSanitizer only, on one end-to-end suite per C
#   wall of the agent and its front ends (what other processes send them). Neither form is in CI:
#   its 30 minutes on two cores hold no second build of the suite on a slow day (contrib/test.sh);
#   the whole run is this script without --short.
set -eu
cd "$(dirname "$0")/.."
short=false
if [ "${1:-}" = "--short" ]; then short=true; shift; fi
bash contrib/deps.sh
reports="$(mktemp -d /tmp/coffer-sanitizers-XXXXXX)"
logs="$(mktemp -d /tmp/coffer-sanitizer-logs-XXXXXX)"
trap 'rm -rf "$reports" "$logs"' EXIT
default="address thread"
if $short; then default=address; fi
status=0
failed=()
for san in ${@:-$default}; do
    echo "== swift test --sanitize=$san"
    select=()
    if [ "$san" = thread ]; then
        # ThreadSanitizer runs every target but the end-to-end one, whose agent is a separate program
        # started per test: the agent's code runs in-process under TSan in CofferAgentTests, and the
        # end-to-end AgentTests (many concurrent clients, concurrent locks) still run here. ASan runs
        # those that drive C walls.
        echo "(ThreadSanitizer: the end-to-end suites other than AgentTests are skipped; AddressSanitizer runs those that drive C walls)"
        select=(--skip 'CofferEndToEndTests\.(?!AgentTests\b)')
    else
        # AddressSanitizer runs every target but, of the end-to-end suites (each test a sanitized agent
        # and CLI started anew, slow under ASan), only those that drive the agent's C walls and its
        # parsing of what other processes send: hostile and concurrent frames, delegation, the Secret
        # Service front end (sd-bus, OpenSSL), the portal backend, the ssh-agent socket, the plugin
        # host (biometry, fprintd over sd-bus), PAM, locked memory. The others repeat Swift-only
        # paths that the unit suites run in-process under ASan; the plain run runs them all.
        # --short runs only one end-to-end suite per C wall, each with the sanitized agent and the
        # programs it starts: frames and delegation (the native socket), the Secret Service bus
        # (sd-bus, OpenSSL's DH session), the ssh-agent socket, PAM. The unit suites (Swift paths,
        # run in-process) are left to the whole run.
        if $short; then
            kept='ProtocolConformanceTests|DelegationTests|SecretServiceBusTests|SSHAgentTests|PAMModuleTests'
            echo "(AddressSanitizer, short form: only ${kept//|/, } run here; the plain run runs them all)"
            select=(--filter "CofferEndToEndTests\\.($kept)\\b")
        else
            kept='AgentTests|ProtocolConformanceTests|ConnectionLimitTests|DelegationTests|LockedMemoryTests|MemoryHygieneTests'
            kept="$kept|SecretServiceBusTests|SecretServiceItemTests|SecretServicePromptTests|SecretServiceAccessControlTests"
            kept="$kept|SecretPortalTests|SSHAgentTests|SSHAgentPolicyTests|FprintdTests|BiometryTests|PAMModuleTests"
            echo "(AddressSanitizer: of the end-to-end suites, only ${kept//|/, } run here; the plain run runs them all)"
            select=(--skip "CofferEndToEndTests\\.(?!($kept)\\b)")
        fi
    fi
    # `coffer` links dynamically here: sanitizer runtimes cannot go into a static executable.
    # COFFER_SANITIZED: tests too slow to repeat under a sanitizer (OpenSSH's regression scripts) skip with a message.
    set +e
    COFFER_DYNAMIC_CLI=1 COFFER_SANITIZED="$san" SWIFT_BACKTRACE=enable=no \
        LSAN_OPTIONS="suppressions=$PWD/contrib/lsan.supp:print_suppressions=0" \
        ASAN_OPTIONS="log_path=$reports/asan" TSAN_OPTIONS="log_path=$reports/tsan" \
        swift test --sanitize="$san" --scratch-path ".build-$san" ${select[@]+"${select[@]}"} 2>&1 | tee "$logs/$san"
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" -ne 0 ]; then status=1; failed+=("$san (exit $rc)"); fi
done
for r in "$reports"/*; do
    [ -e "$r" ] || continue
    echo "== sanitizer report $(basename "$r")"
    cat "$r"
    status=1
done
echo
echo "== sanitizers: summary"
for san in ${@:-$default}; do
    echo "$san: $(grep -E '^. Test run with' "$logs/$san" | tail -1 || echo 'no closing line')"
    bash contrib/failures.sh "$logs/$san" 40
done
if [ "$status" -ne 0 ]; then echo "sanitizers FAILED: ${failed[*]:-} $(ls "$reports" 2>/dev/null | tr '\n' ' ')"; fi
exit "$status"
