#!/usr/bin/env bash
# Protected directories (issue #45): what the kernel's fscrypt costs against a plain directory on the
# same ext4 (sequential write and read of 256 MiB, a tree of 10,000 small files written and read
# back), and what a lock and an unlock cost per protected directory. Root only: it makes its own ext4
# with the encrypt feature on a loop device, and runs its own agent (a private PAM stack, pam_matrix).
# Prints a Markdown table. The data path is the kernel's (AES-256-XTS on every block, AES-256-CTS on
# every name): Coffer is not on it; the ratios show that cost.
#
#   contrib/bench/files.sh BIN_DIR      (cofferd, coffer and coffer-cli in BIN_DIR)
set -eu
bin="${1:?usage: contrib/bench/files.sh BIN_DIR}"
if [ "$(id -u)" != 0 ]; then echo "skipped: protected directories need a loop device (run as root)"; exit 0; fi
if [ ! -e /sys/fs/ext4/features/encryption ]; then echo "skipped: this kernel's ext4 has no encryption"; exit 0; fi
if ! losetup -f >/dev/null 2>&1; then echo "skipped: no free loop device"; exit 0; fi
matrix=/usr/lib/x86_64-linux-gnu/pam_wrapper/pam_matrix.so
if [ ! -e "$matrix" ]; then echo "skipped: pam_matrix.so (libpam-wrapper) is missing"; exit 0; fi

work="$(mktemp -d /tmp/coffer-bench-files-XXXXXX)"
mnt="$work/mnt" loop="" agent=""
cleanup() {
    set +e   # every step runs, whatever the one before it returned
    if [ -n "$agent" ]; then kill -9 "$agent" 2>/dev/null; wait "$agent" 2>/dev/null; fi
    if mountpoint -q "$mnt"; then umount "$mnt"; fi
    if [ -n "$loop" ]; then losetup -d "$loop"; fi
    rm -rf "$work"
}
trap cleanup EXIT
mkdir "$mnt"
truncate -s 1400M "$work/fs.img"
mkfs.ext4 -q -F -O encrypt "$work/fs.img"
loop="$(losetup --find --show "$work/fs.img")"
mount "$loop" "$mnt"

user="$(id -un)" password="bench password"
mkdir "$work/pam"
echo "$user:$password:coffer-bench" > "$work/passdb"
printf 'auth required %s passdb=%s\naccount required %s passdb=%s\n' "$matrix" "$work/passdb" "$matrix" "$work/passdb" > "$work/pam/coffer-bench"
export COFFER_SOCKET="$work/run/agent.sock"
"$bin/cofferd" --foreground --socket "$COFFER_SOCKET" --state-dir "$work/state" --ssh-agent-socket none \
    --pam-confdir "$work/pam" --pam-service coffer-bench --log-level warning 2> "$work/cofferd.log" &
agent=$!
for _ in $(seq 200); do [ -S "$COFFER_SOCKET" ] && break; sleep 0.05; done
printf '%s' "$password" | "$bin/coffer" passcode set --passcode-stdin >/dev/null

now() { date +%s%N; }
ms() { echo $(( ($2 - $1) / 1000000 )); }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

mkdir "$mnt/plain" "$mnt/protected"
"$bin/coffer" files protect "$mnt/protected" --class complete >/dev/null

# write DIR: 256 MiB in 1 MiB blocks, fsynced; read DIR: the same, from a cold cache.
write() { drop; local t0; t0=$(now); dd if=/dev/zero of="$1/big" bs=1M count=256 conv=fsync status=none; ms "$t0" "$(now)"; }
read_() { drop; local t0; t0=$(now); dd if="$1/big" of=/dev/null bs=1M status=none; ms "$t0" "$(now)"; }
small_write() {
    drop; local t0; t0=$(now)
    python3 - "$1/tree" <<'PY'
import os, sys
root = sys.argv[1]
block = os.urandom(4096)
for d in range(100):
    os.makedirs(f"{root}/{d:03}")
    for f in range(100):
        with open(f"{root}/{d:03}/{f:03}.txt", "wb") as out:
            out.write(block)
PY
    sync -f "$1"; ms "$t0" "$(now)"
}
small_read() {
    drop; local t0; t0=$(now)
    python3 - "$1/tree" <<'PY'
import os, sys
n = 0
for dirpath, _, files in os.walk(sys.argv[1]):
    for f in files:
        with open(os.path.join(dirpath, f), "rb") as inp:
            n += len(inp.read())
assert n == 10000 * 4096, n
PY
    ms "$t0" "$(now)"
}
ratio() { python3 -c "print(f'{$2 / max($1, 1):.2f}')"; }

pw=$(write "$mnt/plain");         ew=$(write "$mnt/protected")
pr=$(read_ "$mnt/plain");         er=$(read_ "$mnt/protected")
psw=$(small_write "$mnt/plain");  esw=$(small_write "$mnt/protected")
psr=$(small_read "$mnt/plain");   esr=$(small_read "$mnt/protected")

echo "| on the same ext4 (cold cache) | plain | protected (complete) | ratio |"
echo "|---|---:|---:|---:|"
echo "| write 256 MiB, 1 MiB blocks, fsync | $pw ms | $ew ms | $(ratio "$pw" "$ew") |"
echo "| read 256 MiB | $pr ms | $er ms | $(ratio "$pr" "$er") |"
echo "| write 10,000 files of 4 KiB in 100 directories, sync | $psw ms | $esw ms | $(ratio "$psw" "$esw") |"
echo "| read them back (walk, open, read) | $psr ms | $esr ms | $(ratio "$psr" "$esr") |"

# Lock and unlock: `coffer lock` returns once every key is out of the kernel, `coffer unlock` once every
# key is back (the agent does both before it answers). Median of 7, with 1 and with 51 directories.
timed() { local t0; t0=$(now); "$@" >/dev/null; ms "$t0" "$(now)"; }
median() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
cycle() {
    local locks=() unlocks=() alls=()
    for _ in 1 2 3 4 5 6 7; do
        locks+=("$(timed "$bin/coffer" lock)")
        unlocks+=("$(printf '%s' "$password" | { t0=$(now); "$bin/coffer" unlock --passcode-stdin >/dev/null; ms "$t0" "$(now)"; })")
        alls+=("$(timed "$bin/coffer" files lock --all)")
        printf '%s' "$password" | "$bin/coffer" unlock --passcode-stdin >/dev/null   # (already unlocked: adds the keys back)
        "$bin/coffer" lock >/dev/null; printf '%s' "$password" | "$bin/coffer" unlock --passcode-stdin >/dev/null
    done
    echo "$(median "${locks[@]}") $(median "${unlocks[@]}") $(median "${alls[@]}")"
}
read -r l1 u1 a1 <<<"$(cycle)"
for i in $(seq 50); do mkdir "$mnt/d$i"; "$bin/coffer" files protect "$mnt/d$i" --class complete >/dev/null; done
read -r l51 u51 a51 <<<"$(cycle)"
echo
echo "| lock and unlock (median of 7) | 1 protected directory | 51 | per added directory |"
echo "|---|---:|---:|---:|"
echo "| coffer lock (keys removed) | $l1 ms | $l51 ms | $(python3 -c "print(f'{($l51 - $l1) / 50:.2f}')") ms |"
echo "| coffer unlock (keys added; includes PAM and Argon2id, which vary more than the keys cost) | $u1 ms | $u51 ms | $(python3 -c "print(f'{($u51 - $u1) / 50:.2f}')") ms |"
echo "| coffer files lock --all (every key removed, no passcode work) | $a1 ms | $a51 ms | $(python3 -c "print(f'{($a51 - $a1) / 50:.2f}')") ms |"
