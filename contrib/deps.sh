#!/usr/bin/env bash
# Installs the Debian packages Coffer builds and tests with (Debian 12). Run as root; a no-op
# when everything is already installed.
set -eu
# libssl-dev: OpenSSL libcrypto (COpenSSL: ECDSA and RSA SSH keys, the Secret Service's DH session, X.509); openssl: the tool the SSH key tests check against.
# openssh-client, openssh-server: ssh-add, ssh-keygen, ssh and the sshd the ssh-agent tests log in to (the tests start
# their own sshd on 127.0.0.1 with a private configuration; the package's own service is not needed).
# python3-secretstorage: an independent Secret Service client the session-algorithm tests check against (CofferSecretServiceCrypto),
# and the client of the front end's tests on a private session bus (dbus-daemon, gdbus: SecretServiceBusTests).
# libsecret-tools, gir1.2-secret-1, python3-gi, python3-keyring: the real Secret Service clients the front end's item tests drive
# (secret-tool, libsecret through GObject introspection, Python's keyring library; SecretServiceItemTests).
# swtpm, swtpm-tools, tpm2-tools, libtss2-dev: the TPM 2.0 device key (issue #28): tpm2-tss's ESAPI, TCTI loader, marshalling and
# response-code libraries (CTPM links them), the software TPM the CofferTPM tests start, and tpm2-tools they check against.
# pass: the password-store `coffer import pass` reads (ImportPassTests make their stores with `pass init` and `pass insert`).
# gnome-keyring, libsecret-tools: the provider `coffer import secret-service` reads and the `secret-tool` that fills it
# (ImportSecretServiceTests run gnome-keyring-daemon on a private session bus).
# xdg-desktop-portal: the real portal in front of coffer-portal-secret (RealPortalTests run it on a private bus).
# xvfb, x11-utils: the X servers (Xvfb) of the login session and of an attacker, and xdpyinfo, with which SessionDisplayTests'
# pinentry notes the screen it reached (issue #41, F1: the agent's dialogs appear on logind's session display only).
# pinentry-gtk2, xdotool, chromium: a real GUI pinentry on Xvfb answered by xdotool, for secret-tool and headless
# Chromium (GUIPromptTests, ChromiumPromptTests, issue #43).
# gcc, make: OpenSSH's sk-dummy FIDO middleware, built from Debian's openssh source (contrib/sk-dummy.sh) for
# SSHSecurityKeyTests and the regress scripts' FIDO keys (issue #43); without them those skip.
packages="libsodium-dev libpam0g-dev libsqlite3-dev libssl-dev openssl libpam-wrapper pamtester gcc make pkg-config xxd procps bubblewrap bindfs strace libsystemd-dev fprintd libfprint-2-2 python3-dbusmock dbus-daemon libglib2.0-bin git gnupg gpg-agent pinentry-curses man-db groff-base zsh fish xz-utils openssh-client openssh-server python3-secretstorage libsecret-tools gir1.2-secret-1 python3-gi python3-keyring swtpm swtpm-tools tpm2-tools libtss2-dev pass gnome-keyring xdg-desktop-portal xvfb x11-utils pinentry-gtk2 xdotool chromium"
missing=""
for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "coffer: missing packages:$missing (run as root, or: sudo apt-get install$missing)" >&2
        exit 1
    fi
    echo "coffer: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq $missing >/dev/null
fi
