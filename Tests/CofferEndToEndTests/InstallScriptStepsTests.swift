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
        let done = Self.install(real.path, "--verbose --no-systemd --enable-pam-login --enable-secret-service")
        try #require(done.status == 0, "\(done)")
        let listed = Self.install(dry.path, "--dry-run --no-systemd --enable-pam-login --enable-secret-service")
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

    /// The ssh-agent socket unit and the environment.d file that points SSH_AUTH_SOCK at it, installed
    /// beside the agent's units.
    @Test func installsTheSSHAgentSocketUnitAndSSHAuthSock() throws {
        let root = TemporaryDirectory("coffer-install")
        let r = Self.install(root.path, "--systemd")
        try #require(r.status == 0, "\(r)")
        #expect(r.stdout.contains("systemctl --user enable --now coffer-agent.socket coffer-ssh-agent.socket"), "\(r.stdout)")
        let units = root.file("usr/lib/systemd/user"), environment = root.file("usr/lib/environment.d/60-coffer-ssh-agent.conf")
        for f in [units + "/coffer-ssh-agent.socket", environment] { #expect(Files.mode(f) == 0o644, "\(f)") }
        let socket = (try? String(contentsOfFile: units + "/coffer-ssh-agent.socket", encoding: .utf8)) ?? ""
        for line in ["ListenStream=%t/coffer/ssh-agent.sock", "SocketMode=0600", "DirectoryMode=0700", "FileDescriptorName=ssh-agent",
                     "Service=coffer-agent.service"] {
            #expect(socket.split(separator: "\n").contains(Substring(line)), "coffer-ssh-agent.socket lacks \(line)")
        }
        let native = (try? String(contentsOfFile: units + "/coffer-agent.socket", encoding: .utf8)) ?? ""
        #expect(native.split(separator: "\n").contains("FileDescriptorName=agent"))
    }

    /// The Secret Service front end: installed, signed with the delegation entitlement, its user unit
    /// beside the agent's; its D-Bus activation file only with --enable-secret-service (it is in progress).
    @Test func installsTheSecretServiceFrontEndAndItsActivationFileOnlyWhenAsked() throws {
        let root = TemporaryDirectory("coffer-install")
        var r = Self.install(root.path, "--systemd")
        try #require(r.status == 0, "\(r)")
        let activation = root.file("usr/local/share/dbus-1/services/org.freedesktop.secrets.service")
        #expect(!FileManager.default.fileExists(atPath: activation), "the activation file without --enable-secret-service")
        let unit = root.file("usr/lib/systemd/user/coffer-secret-service.service")
        #expect(Files.mode(unit) == 0o644 && Files.mode(root.file("usr/local/bin/coffer-secret-service")) == 0o755)
        #expect(Files.mode(root.file("usr/local/bin/coffer-secret-service-import")) == 0o755, "what coffer import secret-service runs")
        let unitText = (try? String(contentsOfFile: unit, encoding: .utf8)) ?? ""
        for line in ["Type=dbus", "BusName=org.freedesktop.secrets", "ExecStart=/usr/local/bin/coffer-secret-service", "RestartPreventExitStatus=69"] {
            #expect(unitText.split(separator: "\n").contains(Substring(line)), "coffer-secret-service.service lacks \(line)")
        }
        r = runCLI(["manifest", "verify", root.file("etc/coffer/manifests.d/coffer-secret-service.manifest"),
                    "--trusted-keys", root.file("etc/coffer/trusted-keys.d")])
        #expect(r.status == 0 && r.stdout.contains("app: coffer.secret-service") && r.stdout.contains("entitlement: delegate-identity\n"), "\(r)")

        r = Self.install(root.path, "--systemd --enable-secret-service")
        try #require(r.status == 0, "\(r)")
        #expect(Files.mode(activation) == 0o644)
        let text = (try? String(contentsOfFile: activation, encoding: .utf8)) ?? ""
        for line in ["[D-BUS Service]", "Name=org.freedesktop.secrets", "Exec=/usr/local/bin/coffer-secret-service",
                     "SystemdService=coffer-secret-service.service"] {
            #expect(text.split(separator: "\n").contains(Substring(line)), "org.freedesktop.secrets.service lacks \(line)")
        }
    }

    /// systemd's unit checker accepts the user units (ExecStart at the built cofferd).
    @Test(.enabled(if: SystemdTools.has(SystemdTools.analyze), "needs systemd-analyze (apt: systemd)"))
    func systemdAcceptsTheUnits() {
        let check = TemporaryDirectory("coffer-units")
        let verify = runShell("""
            cp '\(Binaries.packageRoot)/contrib/systemd/'coffer-*.socket '\(Binaries.packageRoot)/contrib/systemd/'coffer-*.service '\(check.path)/' \
            && cd '\(check.path)' \
            && sed -i 's|^ExecStart=/usr/local/bin/cofferd|ExecStart=\(Binaries.cofferd)|' coffer-agent.service \
            && sed -i 's|^ExecStart=/usr/local/bin/coffer-secret-service|ExecStart=\(Binaries.directory)/coffer-secret-service|' coffer-secret-service.service \
            && \(SystemdTools.analyze) verify --man=no coffer-ssh-agent.socket coffer-agent.socket coffer-agent.service coffer-secret-service.service
            """, socket: "")
        #expect(verify.status == 0 && verify.stderr.isEmpty && verify.stdout.isEmpty, "\(verify)")
    }

    /// systemd's environment.d generator, as the user manager runs it at login, expands the file
    /// (here from a user's ~/.config/environment.d) to the ssh-agent socket's path.
    @Test(.enabled(if: SystemdTools.has(SystemdTools.environmentGenerator), "needs systemd's environment.d generator (apt: systemd)"))
    func theEnvironmentFileSetsSSHAuthSockAtLogin() throws {
        let home = TemporaryDirectory("coffer-home")
        try FileManager.default.createDirectory(atPath: home.file("config/environment.d"), withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: Binaries.packageRoot + "/contrib/systemd/60-coffer-ssh-agent.conf",
                                         toPath: home.file("config/environment.d/60-coffer-ssh-agent.conf"))
        let expanded = runShell("env -i HOME='\(home.path)' XDG_CONFIG_HOME='\(home.file("config"))' XDG_RUNTIME_DIR=/run/user/4321 \(SystemdTools.environmentGenerator)",
                                socket: "")
        #expect(expanded.status == 0 && expanded.stdout.split(separator: "\n").contains("SSH_AUTH_SOCK=/run/user/4321/coffer/ssh-agent.sock"),
                "\(expanded)")
    }
}
