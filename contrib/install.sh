#!/usr/bin/env bash
# Installs Coffer system-wide (as root): binaries, pam_coffer.so, the PAM service, systemd user units
# (and SSH_AUTH_SOCK for them: environment.d),
# the GnuPG helper (pinentry-coffer), the git credential helper (git-credential-coffer), man pages and shell completions.
#
#   contrib/install.sh [--dry-run] [--verbose] [--enable-pam-login] [--enable-secret-service] [--enable-portal-secret] [--systemd|--no-systemd] [--bin-dir DIR]
#   contrib/install.sh --replace-gnome-keyring | --restore-gnome-keyring [--dry-run]
#
# Binaries come from .build/release, built by this script when missing (swift build -c release
# --product P for cofferd, coffer, coffer-cli, pinentry-coffer, git-credential-coffer,
# coffer-secret-service, coffer-secret-service-import (what `coffer import secret-service` runs),
# coffer-portal-secret with --enable-portal-secret, coffer-plugin-host and the passcode and fprintd
# plugins), or from --bin-dir DIR, which must hold them.
# DESTDIR=/some/root installs into a staging tree. Idempotent. Does not edit common-* PAM files
# unless --enable-pam-login is given (then it adds one line to each, once). --dry-run prints every
# step (one "+ " line each) and changes nothing; --verbose prints the same lines while doing them.
# --enable-secret-service also installs the Secret Service front end's D-Bus activation file (in progress).
# --enable-portal-secret also installs the desktop portal's secret backend for Flatpak apps
# (coffer-portal-secret: its binary, manifest, man page, D-Bus activation file and coffer.portal).
# Without systemd (PID 1 is not systemd, detected as sd_booted does: no /run/systemd/system; or
# --no-systemd) the session line starts the agent (agent=/usr/local/bin/cofferd): see docs/INSTALL.md.
# --replace-gnome-keyring (run after the install) makes Coffer the provider of every user's session
# in place of what Debian's gnome-keyring (and gcr) start: Coffer's D-Bus activation file for
# org.freedesktop.secrets, the user units gnome-keyring-daemon.socket/.service and
# gcr-ssh-agent.socket/.service masked for every user (/etc/systemd/user), and the XDG autostart
# entries gnome-keyring-secrets.desktop and gnome-keyring-ssh.desktop diverted (dpkg-divert --local
# --rename: package upgrades keep them out of the way). It prints each step, does only what is not
# done yet, and records what it did in /etc/coffer/replaced-gnome-keyring; --restore-gnome-keyring
# undoes exactly that. Both are idempotent; both change only these files and do nothing else.
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
dry=0; verbose=0; pam_login=0; secret_service=0; portal_secret=0; bin_dir="$root/.build/release"; switch=""
if [ -d /run/systemd/system ]; then systemd=1; else systemd=0; fi
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry=1 ;;
        --verbose) verbose=1 ;;
        --enable-pam-login) pam_login=1 ;;
        --systemd) systemd=1 ;;
        --no-systemd) systemd=0 ;;
        --bin-dir) bin_dir="$2"; shift ;;
        --enable-secret-service) secret_service=1 ;;
        --enable-portal-secret) portal_secret=1 ;;
        --replace-gnome-keyring) switch=replace ;;
        --restore-gnome-keyring) switch=restore ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
D="${DESTDIR:-}"
# Every step goes through one of these, so --dry-run lists them all: `step TEXT` prints a step done
# some other way, `run CMD…` prints and runs a command, `run_quiet CMD…` the same with its output dropped.
step() { if [ "$dry" = 1 ] || [ "$verbose" = 1 ]; then echo "+ $*"; fi; }
run() { step "$@"; if [ "$dry" = 0 ]; then "$@"; fi; }
run_quiet() { step "$@"; if [ "$dry" = 0 ]; then "$@" >/dev/null; fi; }

# Switching from gnome-keyring and back: every step prints one "+ " line (done, or listed with
# --dry-run) or says why it is skipped; the record lists what was done, one "KIND PATH" line each.
if [ -n "$switch" ]; then
    record="$D/etc/coffer/replaced-gnome-keyring"
    dbus_file="$D/usr/local/share/dbus-1/services/org.freedesktop.secrets.service"
    units="gnome-keyring-daemon.socket gnome-keyring-daemon.service gcr-ssh-agent.socket gcr-ssh-agent.service"
    autostart="gnome-keyring-secrets.desktop gnome-keyring-ssh.desktop"
    say() { echo "+ $*"; }
    act() { say "$@"; if [ "$dry" = 0 ]; then "$@"; fi; }
    note() { if [ "$dry" = 0 ]; then mkdir -p "$(dirname "$record")" && echo "$1 $2" >> "$record"; fi; }
    recorded() { [ -f "$record" ] && grep -qxF "$1 $2" "$record"; }
    # dpkg-divert where dpkg keeps the package database (a staging DESTDIR without one: a plain rename).
    divert() {
        if command -v dpkg-divert >/dev/null && [ -f "$D/var/lib/dpkg/diversions" ]; then
            act dpkg-divert ${D:+--root "$D"} --local --rename --divert "$2.coffer-disabled" "$1" "$2"
        elif [ "$1" = --add ]; then act mv "$D$2" "$D$2.coffer-disabled"
        else act mv "$D$2.coffer-disabled" "$D$2"
        fi
    }
    if [ "$switch" = replace ]; then
        if [ ! -x "$D/usr/local/bin/coffer-secret-service" ] || [ ! -x "$D/usr/local/bin/cofferd" ]; then
            echo "install.sh: Coffer is not installed in $D/usr/local/bin (cofferd, coffer-secret-service): run contrib/install.sh first" >&2; exit 1
        fi
        # 1. D-Bus activation: Coffer's file, which the session bus reads before gnome-keyring's.
        if [ -f "$dbus_file" ] && cmp -s "$here/dbus/org.freedesktop.secrets.service" "$dbus_file"; then
            echo "already: $dbus_file is Coffer's"
        else
            act install -D -m 0644 "$here/dbus/org.freedesktop.secrets.service" "$dbus_file"
            recorded dbus "$dbus_file" || note dbus "$dbus_file"
        fi
        # 2. The user units, masked for every user.
        for u in $units; do
            link="$D/etc/systemd/user/$u"
            if [ ! -e "$D/usr/lib/systemd/user/$u" ]; then echo "skipped: $u is not installed"
            elif [ "$(readlink "$link" 2>/dev/null)" = /dev/null ]; then echo "already: $u is masked"
            elif [ -e "$link" ] || [ -L "$link" ]; then echo "skipped: $link exists and is not a mask (an administrator's own unit): left as it is"
            else
                act mkdir -p "$D/etc/systemd/user"
                act ln -s /dev/null "$link"
                note mask "$link"
            fi
        done
        # 3. The autostart entries (gnome-keyring-daemon --start for secrets and ssh), moved aside.
        for f in $autostart; do
            entry="/etc/xdg/autostart/$f"
            if [ -e "$D$entry.coffer-disabled" ]; then echo "already: $entry is diverted"
            elif [ ! -e "$D$entry" ]; then echo "skipped: $entry is not installed"
            else
                divert --add "$entry"
                note divert "$entry"
            fi
        done
        cat <<MSG
gnome-keyring is replaced for sessions started from now on: each user logs out and in, then
  busctl --user status org.freedesktop.secrets   names coffer-secret-service, and
  echo \$SSH_AUTH_SOCK                           is Coffer's ssh-agent socket.
Import what gnome-keyring holds first if you have not (coffer import secret-service, while it still runs).
Undo with: contrib/install.sh --restore-gnome-keyring
MSG
    else
        if [ ! -f "$record" ]; then echo "nothing to restore: $record does not exist (gnome-keyring was not replaced by install.sh)"; exit 0; fi
        # Undone in reverse, each only if it is still as install.sh left it.
        tac "$record" | while read -r kind path; do
            case "$kind" in
                divert)
                    if [ -e "$D$path.coffer-disabled" ] && [ ! -e "$D$path" ]; then divert --remove "$path"
                    else echo "skipped: $path is not diverted any more"; fi ;;
                mask)
                    if [ "$(readlink "$path" 2>/dev/null)" = /dev/null ]; then act rm "$path"
                    else echo "skipped: $path is not a mask any more"; fi ;;
                dbus)
                    if [ -f "$path" ] && cmp -s "$here/dbus/org.freedesktop.secrets.service" "$path"; then act rm "$path"
                    else echo "skipped: $path is not Coffer's any more"; fi ;;
                *) echo "install.sh: $record: unknown line '$kind'" >&2; exit 1 ;;
            esac
        done
        act rm "$record"
        echo "gnome-keyring is back for sessions started from now on: each user logs out and in. Coffer's items stay in Coffer."
    fi
    exit 0
fi

# The PAM module directory: where pam_unix.so lives.
security_dir=""
for d in /lib/x86_64-linux-gnu/security /usr/lib/x86_64-linux-gnu/security /lib/security /usr/lib/security /lib64/security; do
    if [ -e "$d/pam_unix.so" ]; then security_dir="$d"; break; fi
done
[ -n "$security_dir" ] || { echo "install.sh: cannot find the PAM module directory (pam_unix.so)" >&2; exit 1; }

binaries="cofferd coffer coffer-cli pinentry-coffer git-credential-coffer coffer-secret-service coffer-secret-service-import"
if [ "$portal_secret" = 1 ]; then binaries="$binaries coffer-portal-secret"; fi
# Builds what it installs: with the default --bin-dir (this checkout's .build/release), every product
# not built yet is built first (swift build -c release --product P), the plugin host and the
# passcode and fprintd plugins too; with --bin-dir DIR the binaries must be there.
if [ "$bin_dir" = "$root/.build/release" ]; then
    products=""
    for b in $binaries coffer-plugin-host; do [ -x "$bin_dir/$b" ] || products="$products $b"; done
    for p in Passcode Fprintd; do [ -f "$bin_dir/libCofferPlugin$p.so" ] || products="$products CofferPlugin$p"; done
    if [ -n "$products" ]; then
        command -v swift >/dev/null || [ "$dry" = 1 ] || { echo "install.sh: swift is not in PATH: build the products first (docs/INSTALL.md)" >&2; exit 1; }
        for b in $products; do run_quiet swift build -c release --package-path "$root" --product "$b"; done
    fi
fi
for b in $binaries; do
    [ -x "$bin_dir/$b" ] || [ "$dry" = 1 ] || { echo "install.sh: $bin_dir/$b not built" >&2; exit 1; }
done

run install -d "$D/usr/local/bin" "$D$security_dir" "$D/etc/pam.d" "$D/usr/lib/systemd/user" "$D/usr/local/share/coffer" \
    "$D/usr/local/include/coffer" "$D/usr/lib/environment.d"
# shellcheck disable=SC2086
run install -m 0755 $(for b in $binaries; do printf '%s ' "$bin_dir/$b"; done) "$D/usr/local/bin/"
# Authenticator plugins (when built): the host beside cofferd, the passcode and fprintd plugins in the
# root-only system plugin directory. The biometric emulator and the test plugin are for tests only.
if [ -x "$bin_dir/coffer-plugin-host" ]; then
    run install -m 0755 "$bin_dir/coffer-plugin-host" "$D/usr/local/bin/"
    run install -d -m 0755 "$D/usr/local/lib/coffer/plugins"
    for p in Passcode Fprintd; do
        if [ -f "$bin_dir/libCofferPlugin$p.so" ]; then
            run install -m 0644 "$bin_dir/libCofferPlugin$p.so" "$D/usr/local/lib/coffer/plugins/"
        fi
    done
fi
# Man pages, and completions generated by the installed CLI (so they always match it).
run install -d "$D/usr/local/share/man/man1" "$D/usr/local/share/man/man8" "$D/usr/local/share/bash-completion/completions" \
    "$D/usr/local/share/zsh/site-functions" "$D/usr/local/share/fish/vendor_completions.d"
run install -m 0644 "$here/man/coffer.1" "$here/man/pinentry-coffer.1" "$here/man/git-credential-coffer.1" \
    "$here/man/coffer-secret-service.1" "$D/usr/local/share/man/man1/"
run install -m 0644 "$here/man/cofferd.8" "$here/man/pam_coffer.8" "$D/usr/local/share/man/man8/"
completion() { # shell destination
    step "$D/usr/local/bin/coffer-cli --generate-completion-script $1 > $2"
    if [ "$dry" = 1 ]; then return; fi
    "$D/usr/local/bin/coffer-cli" --generate-completion-script "$1" > "$2.tmp" && chmod 0644 "$2.tmp" && mv "$2.tmp" "$2"
}
completion bash "$D/usr/local/share/bash-completion/completions/coffer"
completion zsh "$D/usr/local/share/zsh/site-functions/_coffer"
completion fish "$D/usr/local/share/fish/vendor_completions.d/coffer.fish"
run_quiet bash "$here/pam_coffer/build.sh" "$D$security_dir/pam_coffer.so"
run chmod 0644 "$D$security_dir/pam_coffer.so"
run install -m 0644 "$here/pam.d/coffer" "$D/etc/pam.d/coffer"
run install -m 0644 "$here/systemd/coffer-agent.socket" "$here/systemd/coffer-agent.service" "$here/systemd/coffer-ssh-agent.socket" \
    "$here/systemd/coffer-secret-service.service" "$D/usr/lib/systemd/user/"
# The Secret Service front end's D-Bus activation file, only when asked for: it is still in progress
# (OpenSession and Session.Close only), and with the file installed a client that finds no provider
# on the bus starts Coffer's instead of gnome-keyring's.
if [ "$secret_service" = 1 ]; then
    run install -d "$D/usr/local/share/dbus-1/services"
    run install -m 0644 "$here/dbus/org.freedesktop.secrets.service" "$D/usr/local/share/dbus-1/services/"
fi
# SSH_AUTH_SOCK at cofferd's ssh-agent socket for every user's systemd user manager (environment.d).
run install -m 0644 "$here/systemd/60-coffer-ssh-agent.conf" "$D/usr/lib/environment.d/"
run install -m 0755 "$here/systemd/coffer-lock-on-screensaver.sh" "$D/usr/local/share/coffer/"
# The wire protocol's constants for C clients and plugins.
run install -m 0644 "$here/../Sources/CCofferABI/include/coffer/coffer_wire.h" "$D/usr/local/include/coffer/"

# The shell helper is an app too (access groups): a signing key made here on first install (root-only,
# kept for re-signing after upgrades), trusted by every agent, and manifests for coffer and coffer-cli
# as app coffer.shell with the groups shell (default) and unsigned. Re-running re-signs the binaries.
etc="$D/etc/coffer"
run install -d -m 0755 "$etc" "$etc/trusted-keys.d" "$etc/manifests.d"
if [ ! -f "$etc/install-signing.key" ]; then
    run_quiet "$bin_dir/coffer-cli" manifest keygen --out "$etc/install-signing.key"
fi
run install -m 0644 "$etc/install-signing.key.pub" "$etc/trusted-keys.d/coffer-install.pub"
for b in coffer coffer-cli; do
    run "$bin_dir/coffer-cli" manifest sign --key "$etc/install-signing.key" --app-id coffer.shell \
        --executable "$D/usr/local/bin/$b" --installed-as "/usr/local/bin/$b" --group shell --group unsigned \
        --out "$etc/manifests.d/coffer-shell-$b.manifest"
done
# The GnuPG and git helpers are apps of their own, each with its own group: GnuPG's passphrases and
# git's passwords are not the shell's (`coffer find --access-group git …` from a terminal asks for
# the passcode).
run "$bin_dir/coffer-cli" manifest sign --key "$etc/install-signing.key" --app-id coffer.gnupg \
    --executable "$D/usr/local/bin/pinentry-coffer" --installed-as /usr/local/bin/pinentry-coffer --group gnupg \
    --out "$etc/manifests.d/coffer-gnupg.manifest"
run "$bin_dir/coffer-cli" manifest sign --key "$etc/install-signing.key" --app-id coffer.git \
    --executable "$D/usr/local/bin/git-credential-coffer" --installed-as /usr/local/bin/git-credential-coffer --group git \
    --out "$etc/manifests.d/coffer-git.manifest"
# The Secret Service front end acts for each bus client (DELEGATE): the delegate-identity entitlement.
# Its own group holds nothing; its clients' items are in their own groups.
run "$bin_dir/coffer-cli" manifest sign --key "$etc/install-signing.key" --app-id coffer.secret-service \
    --executable "$D/usr/local/bin/coffer-secret-service" --installed-as /usr/local/bin/coffer-secret-service \
    --group secret-service --entitlement delegate-identity --out "$etc/manifests.d/coffer-secret-service.manifest"
# The desktop portal's secret backend (only with --enable-portal-secret): xdg-desktop-portal finds it
# through coffer.portal (a portals.conf must choose it for org.freedesktop.impl.portal.Secret: see
# docs/secret-service.md), the bus starts it; its manifest grants portal-secret, which reaches the per-app portal
# secret of the Flatpak app the portal names and nothing else.
if [ "$portal_secret" = 1 ]; then
    run install -d "$D/usr/local/share/dbus-1/services" "$D/usr/share/xdg-desktop-portal/portals"
    run install -m 0644 "$here/dbus/org.freedesktop.impl.portal.desktop.coffer.service" "$D/usr/local/share/dbus-1/services/"
    run install -m 0644 "$here/portal/coffer.portal" "$D/usr/share/xdg-desktop-portal/portals/"
    run install -m 0644 "$here/man/coffer-portal-secret.1" "$D/usr/local/share/man/man1/"
    run "$bin_dir/coffer-cli" manifest sign --key "$etc/install-signing.key" --app-id coffer.portal-secret \
        --executable "$D/usr/local/bin/coffer-portal-secret" --installed-as /usr/local/bin/coffer-portal-secret \
        --group portal-secret --entitlement portal-secret --out "$etc/manifests.d/coffer-portal-secret.manifest"
fi

add_line() { # file line: appends once
    if [ -f "$1" ] && grep -qF "$2" "$1"; then return; fi
    step "echo '$2' >> $1"
    if [ "$dry" = 0 ]; then echo "$2" >> "$1"; fi
}
# The session line: with systemd the user's socket unit starts the agent; without it pam_coffer starts
# it (agent= works on the session line only: the auth line only remembers the password). An earlier
# pam_coffer session line gets agent= added, rather than a second line beside it.
agent_arg="agent=/usr/local/bin/cofferd"
if [ "$systemd" = 1 ]; then session_line="session optional pam_coffer.so"; else session_line="session optional pam_coffer.so $agent_arg"; fi
set_session_line() { # file
    local pattern='^[[:space:]]*session[[:space:]].*pam_coffer\.so'
    if [ -f "$1" ] && grep -q "$pattern" "$1"; then
        if [ "$systemd" = 0 ] && grep "$pattern" "$1" | grep -qv 'agent='; then
            step "sed -i '/$pattern/{/agent=/!s|\$| $agent_arg|}' $1"
            if [ "$dry" = 0 ]; then sed -i "/$pattern/{/agent=/!s|\$| $agent_arg|}" "$1"; fi
        fi
    else
        add_line "$1" "$session_line"
    fi
}
if [ "$pam_login" = 1 ]; then
    add_line "$D/etc/pam.d/common-auth" "auth optional pam_coffer.so"
    set_session_line "$D/etc/pam.d/common-session"
    add_line "$D/etc/pam.d/common-password" "password optional pam_coffer.so"
else
    cat <<MSG
Installed. To unlock Coffer at login and follow password changes, add (or rerun with --enable-pam-login):
  /etc/pam.d/common-auth:     auth optional pam_coffer.so      (after pam_unix.so)
  /etc/pam.d/common-session:  $session_line
  /etc/pam.d/common-password: password optional pam_coffer.so  (after pam_unix.so)
MSG
fi
if [ "$systemd" = 1 ]; then
    echo "Each user then runs: systemctl --user enable --now coffer-agent.socket coffer-ssh-agent.socket"
    echo "(SSH_AUTH_SOCK points at the ssh-agent socket from the next login: /usr/lib/environment.d/60-coffer-ssh-agent.conf.)"
else
    cat <<MSG
No systemd here: pam_coffer starts cofferd when a session opens, and makes /run/user/UID (owned by the
user, mode 0700) when nothing else has. Without pam_coffer in the session stack, each user starts it:
  mkdir -p -m 0700 "\${XDG_RUNTIME_DIR:?}" && cofferd   (see "Without systemd" in docs/INSTALL.md)
MSG
fi
