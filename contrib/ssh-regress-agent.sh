#!/usr/bin/env bash
# ssh-agent's command line in front of cofferd, for OpenSSH's regression scripts run by
# contrib/ssh-regress.sh (which names this script as the scripts' ssh-agent, TEST_SSH_SSHAGENT).
#
#   ssh-regress-agent.sh [-s] [-a SOCKET]   start an agent in the background; print the
#                                            SSH_AUTH_SOCK / SSH_AGENT_PID lines `ssh-agent -s` prints
#   ssh-regress-agent.sh -d|-D [-a SOCKET]  the same agent in the foreground (this process becomes cofferd)
#   ssh-regress-agent.sh -k                 stop the agent named by SSH_AGENT_PID
#   -P PATTERNS (with -s or -d)              the FIDO middlewares keys may name (cofferd's ssh-allowed-providers)
#
# Each agent gets a private directory under $COFFER_SSH_REGRESS_RUN (state, native socket, a PAM
# service that refuses everything: nothing here needs a passcode) and serves the ssh-agent protocol
# on SOCKET (default: ssh-agent.sock in that directory). Every agent started is listed in
# $COFFER_SSH_REGRESS_RUN/agents, so the harness can stop any a script left running; -k stops only
# agents listed there. Options of ssh-agent these scripts do not use (-c, -t, -E, -O, a command to
# run) are refused, not ignored.
set -u
cofferd="${COFFER_SSH_REGRESS_COFFERD:?COFFER_SSH_REGRESS_COFFERD names the cofferd to run}"
run="${COFFER_SSH_REGRESS_RUN:?COFFER_SSH_REGRESS_RUN names the run directory of contrib/ssh-regress.sh}"
me="ssh-agent (cofferd)"

mode=background socket="" providers=""
while getopts ":a:dDksP:" o; do
    case "$o" in
    a) socket="$OPTARG" ;;
    P) providers="$OPTARG" ;;
    d|D) mode=foreground ;;
    k) mode=kill ;;
    s) ;;
    *) echo "$me: option -${OPTARG:-$o} is not supported by this wrapper" >&2; exit 1 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || { echo "$me: running a command under the agent is not supported by this wrapper" >&2; exit 1; }

# True while PID is a live (not zombie) process.
alive() { [ -r "/proc/$1/stat" ] && ! awk '{ exit ($3 == "Z") ? 0 : 1 }' "/proc/$1/stat" 2>/dev/null; }

if [ "$mode" = kill ]; then
    pid="${SSH_AGENT_PID:-}"
    [ -n "$pid" ] || { echo "$me: SSH_AGENT_PID not set, cannot kill agent" >&2; exit 1; }
    # Only an agent started here, still running with its directory under this run (not a reused pid).
    grep -q "^$pid " "$run/agents" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF "$run/" \
        || { echo "$me: $pid is not a running agent this harness started" >&2; exit 1; }
    kill -TERM "$pid" 2>/dev/null || { echo "$me: kill $pid failed" >&2; exit 1; }
    for _ in $(seq 300); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then echo "$me: agent $pid did not stop within 30 s" >&2; exit 1; fi
    echo "unset SSH_AUTH_SOCK;"
    echo "unset SSH_AGENT_PID;"
    echo "echo Agent pid $pid killed;"
    exit 0
fi

dir="$(mktemp -d "$run/agent-XXXXXX")" || exit 1
mkdir -p "$dir/pam" "$dir/run"
printf 'auth requisite pam_deny.so\naccount requisite pam_deny.so\n' > "$dir/pam/coffer-regress"
[ -n "$socket" ] || socket="$dir/run/ssh-agent.sock"
args=(--foreground --socket "$dir/run/agent.sock" --ssh-agent-socket "$socket" --state-dir "$dir/state"
      --pam-confdir "$dir/pam" --pam-service coffer-regress --log-level debug --kdf-ops 1)
if [ -n "$providers" ]; then
    # ssh-agent -P: the same allow-list, as cofferd's configuration key.
    printf 'ssh-allowed-providers = %s\n' "$providers" > "$dir/cofferd.conf"
    args+=(--config "$dir/cofferd.conf")
fi

if [ "$mode" = foreground ]; then
    # ssh-agent -d prints the variables, then serves in the foreground with its log on stderr.
    echo "$$ $dir" >> "$run/agents"
    echo "SSH_AUTH_SOCK=$socket; export SSH_AUTH_SOCK;"
    echo "echo Agent pid $$;"
    exec "$cofferd" "${args[@]}" < /dev/null
fi

"$cofferd" "${args[@]}" < /dev/null > "$dir/cofferd.log" 2>&1 &
pid=$!
echo "$pid $dir" >> "$run/agents"
# Ready once it says so (a loaded machine, a sanitizer build: up to a minute).
for _ in $(seq 600); do
    grep -q "agent ready" "$dir/cofferd.log" 2>/dev/null && break
    alive "$pid" || break
    sleep 0.1
done
if ! grep -q "agent ready" "$dir/cofferd.log" 2>/dev/null; then
    echo "$me: cofferd did not get ready:" >&2
    cat "$dir/cofferd.log" >&2
    exit 1
fi
echo "SSH_AUTH_SOCK=$socket; export SSH_AUTH_SOCK;"
echo "SSH_AGENT_PID=$pid; export SSH_AGENT_PID;"
echo "echo Agent pid $pid;"
