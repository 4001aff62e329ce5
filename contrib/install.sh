#!/usr/bin/env bash
# Installs Coffer system-wide (as root): binaries, pam_coffer.so, the PAM service, systemd user units.
#
#   contrib/install.sh [--dry-run] [--enable-pam-login] [--bin-dir DIR]
#
# Binaries come from .build/release (build them first: swift build -c release
# --product cofferd, and the same for coffer and coffer-cli), or --bin-dir.
# DESTDIR=/some/root installs into a staging tree. Idempotent. Does not edit common-* PAM files
# unless --enable-pam-login is given (then it adds one line to each, once).
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
dry=0; pam_login=0; bin_dir="$root/.build/release"
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry=1 ;;
        --enable-pam-login) pam_login=1 ;;
        --bin-dir) bin_dir="$2"; shift ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
D="${DESTDIR:-}"
run() { if [ "$dry" = 1 ]; then echo "+ $*"; else "$@"; fi; }

# The PAM module directory: where pam_unix.so lives.
security_dir=""
for d in /lib/x86_64-linux-gnu/security /usr/lib/x86_64-linux-gnu/security /lib/security /usr/lib/security /lib64/security; do
    if [ -e "$d/pam_unix.so" ]; then security_dir="$d"; break; fi
done
[ -n "$security_dir" ] || { echo "install.sh: cannot find the PAM module directory (pam_unix.so)" >&2; exit 1; }

for b in cofferd coffer coffer-cli; do
    [ -x "$bin_dir/$b" ] || [ "$dry" = 1 ] || { echo "install.sh: $bin_dir/$b not built" >&2; exit 1; }
done

run install -d "$D/usr/local/bin" "$D$security_dir" "$D/etc/pam.d" "$D/usr/lib/systemd/user" "$D/usr/local/share/coffer" \
    "$D/usr/local/include/coffer"
run install -m 0755 "$bin_dir/cofferd" "$bin_dir/coffer" "$bin_dir/coffer-cli" "$D/usr/local/bin/"
if [ "$dry" = 1 ]; then
    echo "+ $here/pam_coffer/build.sh $D$security_dir/pam_coffer.so"
else
    bash "$here/pam_coffer/build.sh" "$D$security_dir/pam_coffer.so" >/dev/null
    chmod 0644 "$D$security_dir/pam_coffer.so"
fi
run install -m 0644 "$here/pam.d/coffer" "$D/etc/pam.d/coffer"
run install -m 0644 "$here/systemd/coffer-agent.socket" "$here/systemd/coffer-agent.service" "$D/usr/lib/systemd/user/"
run install -m 0755 "$here/systemd/coffer-lock-on-screensaver.sh" "$D/usr/local/share/coffer/"
# The wire protocol's constants for C clients and plugins.
run install -m 0644 "$here/../Sources/CCofferABI/include/coffer/coffer_wire.h" "$D/usr/local/include/coffer/"

# The shell helper is an app too (access groups): a signing key made here on first install (root-only,
# kept for re-signing after upgrades), trusted by every agent, and manifests for coffer and coffer-cli
# as app coffer.shell with the groups shell (default) and unsigned. Re-running re-signs the binaries.
etc="$D/etc/coffer"
run install -d -m 0755 "$etc" "$etc/trusted-keys.d" "$etc/manifests.d"
if [ ! -f "$etc/install-signing.key" ]; then
    run "$bin_dir/coffer-cli" manifest keygen --out "$etc/install-signing.key" >/dev/null
fi
run install -m 0644 "$etc/install-signing.key.pub" "$etc/trusted-keys.d/coffer-install.pub"
for b in coffer coffer-cli; do
    run "$bin_dir/coffer-cli" manifest sign --key "$etc/install-signing.key" --app-id coffer.shell \
        --executable "$D/usr/local/bin/$b" --installed-as "/usr/local/bin/$b" --group shell --group unsigned \
        --out "$etc/manifests.d/coffer-shell-$b.manifest"
done

add_line() { # file line: appends once
    if [ -f "$1" ] && grep -qF "$2" "$1"; then return; fi
    if [ "$dry" = 1 ]; then echo "+ echo '$2' >> $1"; else echo "$2" >> "$1"; fi
}
if [ "$pam_login" = 1 ]; then
    add_line "$D/etc/pam.d/common-auth" "auth optional pam_coffer.so"
    add_line "$D/etc/pam.d/common-session" "session optional pam_coffer.so"
    add_line "$D/etc/pam.d/common-password" "password optional pam_coffer.so"
else
    cat <<MSG
Installed. To unlock Coffer at login and follow password changes, add (or rerun with --enable-pam-login):
  /etc/pam.d/common-auth:     auth optional pam_coffer.so      (after pam_unix.so)
  /etc/pam.d/common-session:  session optional pam_coffer.so
  /etc/pam.d/common-password: password optional pam_coffer.so  (after pam_unix.so)
Each user then runs: systemctl --user enable --now coffer-agent.socket
MSG
fi
