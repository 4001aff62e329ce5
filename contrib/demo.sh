#!/usr/bin/env bash
# Builds Coffer and runs the agent in a throwaway sandbox: a temporary state directory (SQLite
# keychain + file device key), a private socket, and a private PAM stack (pam_matrix from
# libpam-wrapper) that accepts one sandbox password. Then it walks through
#   passcode set -> unlock -> add -> get -> lock -> get refused -> unlock -> get
# Nothing under /etc or your home is touched. KEEP=1 leaves the agent running afterwards.
set -eu
cd "$(dirname "$0")/.."
bash contrib/deps.sh
echo "== building (swift build --product cofferd / coffer / coffer-cli)"
for p in cofferd coffer coffer-cli; do swift build --product "$p" >/dev/null; done
bin="$(swift build --show-bin-path)"

sandbox="$(mktemp -d /tmp/coffer-demo-XXXXXX)"
user="$(id -un)"
password="demo-login-password"   # the sandbox PAM stack's password for $user (not a real secret)
mkdir -p "$sandbox/pam" "$sandbox/run"
matrix=/usr/lib/x86_64-linux-gnu/pam_wrapper/pam_matrix.so
printf '%s:%s:coffer\n' "$user" "$password" > "$sandbox/passdb"
printf 'auth required %s passdb=%s\naccount required %s passdb=%s\n' "$matrix" "$sandbox/passdb" "$matrix" "$sandbox/passdb" > "$sandbox/pam/coffer"
export COFFER_SOCKET="$sandbox/run/coffer/agent.sock"

stop_agent() { pkill -TERM -f -- "--socket $COFFER_SOCKET" 2>/dev/null || true; }
if [ "${KEEP:-0}" != 1 ]; then trap stop_agent EXIT; fi

echo "== starting cofferd (state: $sandbox/state, socket: $COFFER_SOCKET)"
"$bin/cofferd" --socket "$COFFER_SOCKET" --state-dir "$sandbox/state" --pam-confdir "$sandbox/pam" --pam-service coffer

coffer() { "$bin/coffer" "$@"; }
show() { echo; echo "\$ $*"; }
run() { show "$@"; "$@" || echo "(exit status $?)"; }
run coffer status
show "printf %s '$password' | coffer passcode set --passcode-stdin   # PAM checks it first"
printf %s "$password" | "$bin/coffer" passcode set --passcode-stdin
show "printf %s 'wrong' | coffer unlock --passcode-stdin"
printf %s 'wrong' | "$bin/coffer" unlock --passcode-stdin || echo "(exit status $?)"
show "printf %s '$password' | coffer unlock --passcode-stdin"
printf %s "$password" | "$bin/coffer" unlock --passcode-stdin
show "printf %s 's3cr3t-t0ken' | coffer add --service github --account demo --label 'GitHub token' --secret-stdin"
printf %s 's3cr3t-t0ken' | "$bin/coffer" add --service github --account demo --label 'GitHub token' --secret-stdin
run coffer get --service github --account demo
echo
run coffer find --service github
run coffer lock
run coffer get --service github --account demo
show "printf %s '$password' | coffer unlock --passcode-stdin"
printf %s "$password" | "$bin/coffer" unlock --passcode-stdin
run coffer get --service github --account demo
echo
run coffer status
echo
echo "== files in $sandbox/state:"
ls -l "$sandbox/state"
if [ "${KEEP:-0}" = 1 ]; then
    echo "== the agent keeps running: export COFFER_SOCKET=$COFFER_SOCKET"
else
    echo "== stopping the agent (SIGTERM wipes its keys)"
fi
