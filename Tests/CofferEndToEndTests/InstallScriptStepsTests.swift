import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// `install.sh --dry-run` lists every step the real install takes, and changes nothing; without
/// systemd the session line starts the agent. Everything goes into temporary roots (DESTDIR).
@Suite struct InstallScriptStepsTests {
    static func install(_ destdir: String, _ options: String) -> CLIResult {
        runShell("DESTDIR='\(destdir)' bash '\(Binaries.packageRoot)/contrib/install.sh' --bin-dir '\(Binaries.directory)' \(options)", socket: "")
    }

    static func steps(_ output: String) -> [String] {
        output.split(separator: "\n").map(String.init).filter { $0.hasPrefix("+ ") }
    }

    @Test func dryRunListsEveryStepTheInstallTakesAndChangesNothing() throws {
        let real = TemporaryDirectory("coffer-install"), dry = TemporaryDirectory("coffer-install")
        let done = Self.install(real.path, "--verbose --no-systemd --enable-pam-login")
        try #require(done.status == 0, "\(done)")
        let listed = Self.install(dry.path, "--dry-run --no-systemd --enable-pam-login")
        #expect(listed.status == 0, "\(listed)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: dry.path).isEmpty, "--dry-run changed the staging root")

        // The same steps, in the same order, as the install that ran.
        let done1 = Self.steps(done.stdout), listed1 = Self.steps(listed.stdout).map { $0.replacingOccurrences(of: dry.path, with: real.path) }
        #expect(done1.count > 20)
        #expect(listed1 == done1, "dry run:\n\(listed1.joined(separator: "\n"))\ninstall:\n\(done1.joined(separator: "\n"))")
        #expect(listed.stdout.contains("manifest keygen --out \(dry.path)/etc/coffer/install-signing.key"), "\(listed.stdout)")

        // Every file the install made is named by a step: its path, or its directory and its name.
        let words = Set(listed.stdout.split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "'" }).map(String.init))
        let made = runShell("cd '\(real.path)' && find . -type f -o -type l", socket: "").stdout.split(separator: "\n").map { String($0.dropFirst(2)) }
        #expect(made.count > 20)
        for rel in made {
            let target = dry.path + "/" + rel
            let dir = Files.directoryName(target), name = String(rel.split(separator: "/").last ?? "")
            let named = words.contains(target) || ((words.contains(dir) || words.contains(dir + "/")) && words.contains { $0.hasSuffix("/" + name) })
            #expect(named, "\(rel) is made by a step --dry-run does not list")
        }
    }

    @Test func withoutSystemdTheSessionLineStartsTheAgent() throws {
        let root = TemporaryDirectory("coffer-install")
        var r = Self.install(root.path, "--systemd --enable-pam-login")
        try #require(r.status == 0, "\(r)")
        let session = root.file("etc/pam.d/common-session")
        var text = (try? String(contentsOfFile: session, encoding: .utf8)) ?? ""
        #expect(text == "session optional pam_coffer.so\n", "\(text)")
        #expect(r.stdout.contains("systemctl --user enable --now coffer-agent.socket"))

        // The machine moved off systemd (or the first run guessed wrong): the existing line gains agent=,
        // no second line, and running again changes nothing.
        for _ in 0..<2 {
            r = Self.install(root.path, "--no-systemd --enable-pam-login")
            #expect(r.status == 0, "\(r)")
            text = (try? String(contentsOfFile: session, encoding: .utf8)) ?? ""
            #expect(text == "session optional pam_coffer.so agent=/usr/local/bin/cofferd\n", "\(text)")
        }
        #expect(!r.stdout.contains("systemctl") && r.stdout.contains("Without systemd"), "\(r.stdout)")
        let auth = (try? String(contentsOfFile: root.file("etc/pam.d/common-auth"), encoding: .utf8)) ?? ""
        #expect(auth == "auth optional pam_coffer.so\n", "agent= belongs on the session line only: \(auth)")

        // A fresh install without systemd writes the agent= line from the start.
        let fresh = TemporaryDirectory("coffer-install")
        r = Self.install(fresh.path, "--no-systemd --enable-pam-login")
        #expect(r.status == 0, "\(r)")
        #expect((try? String(contentsOfFile: fresh.file("etc/pam.d/common-session"), encoding: .utf8)) == "session optional pam_coffer.so agent=/usr/local/bin/cofferd\n")
    }
}
