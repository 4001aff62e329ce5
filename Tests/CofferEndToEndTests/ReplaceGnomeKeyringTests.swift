import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Issue #43: `install.sh --replace-gnome-keyring` switches what Debian's gnome-keyring (and gcr)
/// start to Coffer — the D-Bus activation file, the user units, the XDG autostart entries for secrets
/// and ssh — printing each step; `--restore-gnome-keyring` undoes exactly that; both idempotent. Run
/// as docs/secret-service.md's "Making Coffer the session's provider" says (install, then replace), on this machine's
/// real /etc, /usr and /var seen through overlays in a private mount namespace, so nothing outside
/// the test changes: the real gnome-keyring package files, the real dpkg-divert and its database,
/// and systemctl's own reading of the units (`systemctl --global is-enabled`).
@Suite(.enabled(if: GnomeKeyringSwitchRig.available,
                "needs root, unshare, overlayfs, systemctl, dpkg-divert and Debian's gnome-keyring (apt: gnome-keyring)"))
struct ReplaceGnomeKeyringTests {
    @Test func replacingAndRestoringGnomeKeyringAreExactAndIdempotent() throws {
        let t = TemporaryDirectory("coffer-replace-gk")
        let install = "bash '\(Binaries.packageRoot)/contrib/install.sh'"
        // Everything the script does, in one private mount namespace; each step's output in a file.
        let script = """
            set -u
            t='\(t.path)'
            for d in etc usr var; do
                mkdir -p "$t/$d-up" "$t/$d-work"
                mount -t overlay overlay -o "lowerdir=/$d,upperdir=$t/$d-up,workdir=$t/$d-work" "/$d" || exit 90
            done
            # What the switch touches: every entry (type, link target) and every regular file's digest,
            # the diversions, and what systemd makes of the units.
            snapshot() {
                for p in /etc/systemd/user /etc/xdg/autostart /usr/local/share/dbus-1/services; do
                    [ -d "$p" ] && find "$p" -mindepth 1 -printf '%p %y %l\\n'
                    [ -d "$p" ] && find "$p" -type f -exec md5sum {} +
                done | sort
                dpkg-divert --list | grep -i keyring | sort
                systemctl --global is-enabled gnome-keyring-daemon.socket gnome-keyring-daemon.service 2>&1
            }
            \(install) --bin-dir '\(Binaries.directory)' --no-systemd > "$t/install.out" 2>&1 || exit 91
            snapshot > "$t/before"
            \(install) --dry-run --replace-gnome-keyring > "$t/dry.out" 2>&1 || exit 92
            snapshot > "$t/after-dry"
            \(install) --replace-gnome-keyring > "$t/replace1.out" 2>&1 || exit 93
            snapshot > "$t/replaced"
            cp /etc/coffer/replaced-gnome-keyring "$t/record"
            \(install) --replace-gnome-keyring > "$t/replace2.out" 2>&1 || exit 94
            snapshot > "$t/replaced-again"
            \(install) --restore-gnome-keyring > "$t/restore1.out" 2>&1 || exit 95
            snapshot > "$t/restored"
            \(install) --restore-gnome-keyring > "$t/restore2.out" 2>&1 || exit 96
            snapshot > "$t/restored-again"
            """
        let r = runShell("/usr/bin/unshare --mount --propagation private /bin/bash -c \(shellQuote(script))", socket: "")
        func read(_ name: String) -> String { (try? String(contentsOfFile: t.file(name), encoding: .utf8)) ?? "" }
        try #require(r.status == 0, "\(r)\ninstall: \(read("install.out"))\nreplace: \(read("replace1.out"))\nrestore: \(read("restore1.out"))")

        let before = read("before"), replaced = read("replaced")
        #expect(before.contains("enabled") && !before.contains("masked"), "\(before)")
        #expect(read("after-dry") == before, "--dry-run changed something")
        // Replaced: Coffer's activation file, the units masked (systemd says so), the entries diverted by dpkg.
        #expect(replaced.contains("/usr/local/share/dbus-1/services/org.freedesktop.secrets.service f"), "\(replaced)")
        #expect(replaced.contains("/etc/systemd/user/gnome-keyring-daemon.socket l /dev/null")
                && replaced.contains("/etc/systemd/user/gnome-keyring-daemon.service l /dev/null"), "\(replaced)")
        #expect(replaced.split(separator: "\n").suffix(2) == ["masked", "masked"], "\(replaced)")
        for entry in ["gnome-keyring-secrets.desktop", "gnome-keyring-ssh.desktop"] {
            #expect(!replaced.contains("/etc/xdg/autostart/\(entry) f"), "\(entry) still starts")
            #expect(replaced.contains("/etc/xdg/autostart/\(entry).coffer-disabled f"), "\(replaced)")
            #expect(replaced.contains("local diversion of /etc/xdg/autostart/\(entry) to /etc/xdg/autostart/\(entry).coffer-disabled"), "\(replaced)")
        }
        // The PKCS#11 component is not Coffer's business: left alone.
        #expect(replaced.contains("/etc/xdg/autostart/gnome-keyring-pkcs11.desktop f"))
        // Each step printed; the dry run listed the same steps.
        let steps = read("replace1.out").split(separator: "\n").filter { $0.hasPrefix("+ ") }
        #expect(steps.count >= 5 && steps.contains { $0.contains("ln -s /dev/null /etc/systemd/user/gnome-keyring-daemon.socket") }
                && steps.contains { $0.contains("dpkg-divert") && $0.contains("gnome-keyring-ssh.desktop") }, "\(read("replace1.out"))")
        #expect(read("dry.out").split(separator: "\n").filter { $0.hasPrefix("+ ") } == steps, "dry run:\n\(read("dry.out"))")
        #expect(read("record").contains("divert /etc/xdg/autostart/gnome-keyring-secrets.desktop"), "\(read("record"))")
        // Idempotent: the second run does nothing and says so.
        #expect(read("replaced-again") == replaced)
        let again = read("replace2.out")
        #expect(!again.contains("\n+ ") && !again.hasPrefix("+ ") && again.contains("already: gnome-keyring-daemon.socket is masked"), "\(again)")
        // Restored: exactly as before, and again nothing more to do.
        #expect(read("restored") == before, "before:\n\(before)\nrestored:\n\(read("restored"))")
        #expect(read("restored-again") == before)
        #expect(read("restore2.out").contains("nothing to restore"), "\(read("restore2.out"))")
    }

    @Test func replacingBeforeCofferIsInstalledIsRefusedAndChangesNothing() throws {
        let root = TemporaryDirectory("coffer-replace-gk-staging")
        let r = runShell("DESTDIR='\(root.path)' bash '\(Binaries.packageRoot)/contrib/install.sh' --replace-gnome-keyring", socket: "")
        #expect(r.status == 1 && r.stderr.contains("run contrib/install.sh first"), "\(r)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: root.path).isEmpty)
        let nothing = runShell("DESTDIR='\(root.path)' bash '\(Binaries.packageRoot)/contrib/install.sh' --restore-gnome-keyring", socket: "")
        #expect(nothing.status == 0 && nothing.stdout.contains("nothing to restore"), "\(nothing)")
    }

    func shellQuote(_ s: String) -> String { "'" + s.replacingOccurrences(of: "'", with: "'\\''") + "'" }
}

enum GnomeKeyringSwitchRig {
    static var available: Bool {
        getuid() == 0
            && ["/usr/bin/unshare", "/usr/bin/systemctl", "/usr/bin/dpkg-divert"].allSatisfy { FileManager.default.isExecutableFile(atPath: $0) }
            && FileManager.default.fileExists(atPath: "/usr/lib/systemd/user/gnome-keyring-daemon.socket")
            && FileManager.default.fileExists(atPath: "/etc/xdg/autostart/gnome-keyring-secrets.desktop")
            && ((try? String(contentsOfFile: "/proc/filesystems", encoding: .utf8)) ?? "").contains("overlay")
    }
}
