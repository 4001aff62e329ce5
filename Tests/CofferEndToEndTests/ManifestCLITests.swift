import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// `coffer manifest …` and `coffer audit` as users run them: real `coffer` processes (which exec
/// `coffer-cli`), real key, manifest and log files. None of these commands needs the agent.
@Suite struct ManifestCLITests {
    /// A temporary directory by its resolved path (manifests name resolved paths).
    final class Place: @unchecked Sendable {
        let tmp = TemporaryDirectory("coffer-manifest-cli")
        let root: String
        init() throws {
            root = String(decoding: try StableFile.canonicalPath(tmp.path), as: UTF8.self)
            for d in ["keys", "manifests", "other-keys"] { mkdir(root + "/" + d, 0o755) }
        }
        func file(_ name: String) -> String { root + "/" + name }

        /// A copy of /usr/bin/true named `name` with `tag` appended (its own SHA-256).
        func executable(_ name: String, tag: String = "") throws -> String {
            var bytes = try Data(contentsOf: URL(fileURLWithPath: "/usr/bin/true"))
            bytes.append(Data(tag.utf8))
            try bytes.write(to: URL(fileURLWithPath: file(name)))
            chmod(file(name), 0o755)
            return file(name)
        }

        /// `coffer manifest keygen --out NAME`, the .pub copied into `keysDir`; returns the public key.
        func keygen(_ name: String, trustIn keysDir: String = "keys") throws -> String {
            let r = runCLI(["manifest", "keygen", "--out", file(name)])
            guard r.status == 0 else { throw CLIFailure(result: r) }
            try FileManager.default.copyItem(atPath: file(name + ".pub"), toPath: file(keysDir + "/" + name + ".pub"))
            return r.stdout.trimmingCharacters(in: .newlines)
        }

        func sign(key: String, app: String, exe: String, groups: [String], out: String, extra: [String] = []) -> CLIResult {
            runCLI(["manifest", "sign", "--key", file(key), "--app-id", app, "--executable", exe]
                   + groups.flatMap { ["--group", $0] } + ["--out", out] + extra)
        }

        func list() -> CLIResult {
            runCLI(["manifest", "list", "--no-default-dirs", "--key-dir", file("keys"), "--manifest-dir", file("manifests")])
        }
    }

    struct CLIFailure: Error { let result: CLIResult }

    @Test func keygenSignVerifyRoundTrip() throws {
        let p = try Place()
        let pub = try p.keygen("admin")
        #expect(pub.count == 64 && pub.allSatisfy { $0.isHexDigit })
        // The secret: 0600, 64 hex digits and LF, never printed.
        #expect(Files.mode(p.file("admin")) == 0o600)
        let secret = try String(contentsOfFile: p.file("admin"), encoding: .utf8)
        #expect(secret.count == 65 && secret.hasSuffix("\n") && secret.dropLast() != pub)
        #expect(try String(contentsOfFile: p.file("admin.pub"), encoding: .utf8) == pub + "\n")
        // A second keygen never overwrites it.
        var r = runCLI(["manifest", "keygen", "--out", p.file("admin")])
        #expect(r.status == 2 && r.stderr.contains("already exists"), "\(r)")
        #expect(try String(contentsOfFile: p.file("admin"), encoding: .utf8) == secret)
        #expect(!r.stdout.contains(String(secret.dropLast())) && !r.stderr.contains(String(secret.dropLast())))

        let exe = try p.executable("mail")
        let manifest = p.file("manifests/mail.manifest")
        r = p.sign(key: "admin", app: "com.example.mail", exe: exe, groups: ["mail", "shared"], out: manifest)
        #expect(r.status == 0 && r.stdout.isEmpty, "\(r)")
        let text = try String(contentsOfFile: manifest, encoding: .utf8)
        let sha = runShell("sha256sum '\(exe)'", socket: "").stdout.prefix(64)
        #expect(text.hasPrefix("coffer-manifest 1\napp: com.example.mail\nexecutable: \(exe)\nexecutable-sha256: \(sha)\n"
            + "access-group: mail\naccess-group: shared\nsigned-by: \(pub)\nsignature: "), "\(text)")

        r = runCLI(["manifest", "verify", manifest, "--trusted-keys", p.file("keys"), "--check-executable"])
        #expect(r.status == 0, "\(r)")
        #expect(r.stdout.contains("\(manifest): ok\n") && r.stdout.contains("executable-sha256: \(sha) (matches the file)")
                && r.stdout.contains("signed-by: \(pub) (trusted: \(p.file("keys/admin.pub")))"), "\(r)")

        r = p.list()
        #expect(r.status == 0, "\(r)")
        #expect(r.stdout == "trusted key \(pub) from \(p.file("keys/admin.pub"))\n"
            + "manifest \(manifest): app com.example.mail for \(exe), groups mail, shared; signed by \(p.file("keys/admin.pub"))\n", "\(r)")
        r = runCLI(["manifest", "list", "--no-default-dirs", "--key-dir", p.file("keys"), "--manifest-dir", p.file("manifests"), "--json"])
        let json = try #require(try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any], "\(r)")
        let ms = try #require(json["manifests"] as? [[String: Any]])
        #expect(ms.first?["accessGroups"] as? [String] == ["mail", "shared"] && (json["refused"] as? [Any])?.isEmpty == true)
    }

    /// `coffer manifest list` lists the directories the agent reads: those its configuration file
    /// names (trusted-keys-dir, manifests-dir), not only the default ones (issue #43).
    @Test func manifestListListsTheAgentsConfiguredDirectories() throws {
        let apps = try SignedApps()
        _ = try apps.app("listed", appID: "com.example.listed", groups: ["listed"])
        let xdg = TemporaryDirectory("coffer-xdg")
        mkdir(xdg.file("coffer"), 0o700)
        try "standard-trust-dirs = no\ntrusted-keys-dir = \(apps.keysDir)\nmanifests-dir = \(apps.manifestsDir)\n"
            .write(toFile: xdg.file("coffer/cofferd.conf"), atomically: true, encoding: .utf8)
        let r = runCLI(["manifest", "list"], environment: ["XDG_CONFIG_HOME": xdg.path])
        #expect(r.status == 0 && r.stdout.contains("app com.example.listed"), "\(r)")
        // Named explicitly, the same; without it (no file at the default place), not listed.
        let explicit = runCLI(["manifest", "list", "--agent-config", xdg.file("coffer/cofferd.conf")])
        #expect(explicit.status == 0 && explicit.stdout.contains("app com.example.listed"), "\(explicit)")
        let elsewhere = TemporaryDirectory("coffer-xdg-empty")
        #expect(!runCLI(["manifest", "list"], environment: ["XDG_CONFIG_HOME": elsewhere.path]).stdout.contains("com.example.listed"))
    }

    @Test func untrustedSignerIsRefusedWithTheReason() throws {
        let p = try Place()
        _ = try p.keygen("admin")
        _ = try p.keygen("stranger", trustIn: "other-keys")
        let exe = try p.executable("b")
        let manifest = p.file("manifests/b.manifest")
        #expect(p.sign(key: "stranger", app: "com.example.b", exe: exe, groups: ["b"], out: manifest).status == 0)
        var r = runCLI(["manifest", "verify", manifest, "--trusted-keys", p.file("keys")])
        #expect(r.status == 11 && r.stderr == "coffer: errSecMissingEntitlement (-34018): manifest signed by a key that is not trusted\n", "\(r)")
        r = p.list()
        #expect(r.stdout.contains("refused \(manifest): manifest signed by a key that is not trusted\n") && !r.stdout.contains("\nmanifest "), "\(r)")
        // Trusting the other directory makes it verify.
        #expect(runCLI(["manifest", "verify", manifest, "--trusted-keys", p.file("other-keys")]).status == 0)
    }

    @Test func aChangedExecutableIsReportedByVerify() throws {
        let p = try Place()
        _ = try p.keygen("admin")
        let exe = try p.executable("c")
        let manifest = p.file("manifests/c.manifest")
        #expect(p.sign(key: "admin", app: "com.example.c", exe: exe, groups: ["c"], out: manifest).status == 0)
        let handle = try #require(FileHandle(forWritingAtPath: exe))
        handle.seekToEndOfFile()
        handle.write(Data("patched".utf8))
        try handle.close()
        // Without the check the signature is still fine; with it the mismatch is an error.
        #expect(runCLI(["manifest", "verify", manifest, "--trusted-keys", p.file("keys")]).status == 0)
        let r = runCLI(["manifest", "verify", manifest, "--trusted-keys", p.file("keys"), "--check-executable"])
        #expect(r.status == 11 && r.stderr.contains("errSecMissingEntitlement (-34018): executable \(exe) has SHA-256")
                && r.stderr.contains("changed since signing") && r.stdout.isEmpty, "\(r)")
    }

    @Test func worldWritableManifestAndGroupWritableDirectoryAreRefused() throws {
        let p = try Place()
        _ = try p.keygen("admin")
        let exe = try p.executable("d")
        let manifest = p.file("manifests/d.manifest")
        #expect(p.sign(key: "admin", app: "com.example.d", exe: exe, groups: ["d"], out: manifest).status == 0)
        chmod(manifest, 0o666)
        var r = p.list()
        #expect(r.stdout.contains("refused \(manifest): file is world-writable (mode 0666)\n"), "\(r)")
        chmod(manifest, 0o644)
        chmod(p.file("manifests"), 0o775)
        r = p.list()
        #expect(r.stdout.contains("refused \(p.file("manifests")): directory is group-writable (mode 0775); nothing in it is trusted\n")
                && !r.stdout.contains("\nmanifest "), "\(r)")
    }

    @Test(.enabled(if: getuid() == 0, "needs root to chown a manifest to another user"))
    func manifestOwnedByAnotherUserIsRefused() throws {
        let p = try Place()
        _ = try p.keygen("admin")
        let exe = try p.executable("e")
        let manifest = p.file("manifests/e.manifest")
        #expect(p.sign(key: "admin", app: "com.example.e", exe: exe, groups: ["e"], out: manifest).status == 0)
        #expect(chown(manifest, 65534, 65534) == 0)
        let r = p.list()
        #expect(r.stdout.contains("refused \(manifest): file is owned by uid 65534, neither root nor you (uid 0)\n"), "\(r)")
    }

    @Test func interpretersAreRefusedUnlessForced() throws {
        let p = try Place()
        _ = try p.keygen("admin")
        // A file called python3.11 is treated as Python, whatever it contains; /bin/sh resolves to an interpreter.
        let python = try p.executable("python3.11")
        var r = p.sign(key: "admin", app: "com.example.py", exe: python, groups: ["py"], out: p.file("py.manifest"))
        #expect(r.status == 2 && r.stderr.contains("is an interpreter (python)") && r.stderr.contains("--force"), "\(r)")
        #expect(!FileManager.default.fileExists(atPath: p.file("py.manifest")))
        r = p.sign(key: "admin", app: "com.example.sh", exe: "/bin/sh", groups: ["sh"], out: p.file("sh.manifest"))
        #expect(r.status == 2 && r.stderr.contains("is an interpreter"), "\(r)")
        r = p.sign(key: "admin", app: "com.example.py", exe: python, groups: ["py"], out: p.file("py.manifest"), extra: ["--force"])
        #expect(r.status == 0 && FileManager.default.fileExists(atPath: p.file("py.manifest")), "\(r)")
    }

    @Test func signRefusesAnUnprotectedKeyAndBadValues() throws {
        let p = try Place()
        _ = try p.keygen("admin")
        let exe = try p.executable("f")
        var r = p.sign(key: "admin", app: "com.example.f", exe: exe, groups: ["bad/group"], out: p.file("f.manifest"))
        #expect(r.status == 2 && r.stderr.contains("access-group must be"), "\(r)")
        chmod(p.file("admin"), 0o644)
        r = p.sign(key: "admin", app: "com.example.f", exe: exe, groups: ["f"], out: p.file("f.manifest"))
        #expect(r.status == 2 && r.stderr.contains("group or others may use it"), "\(r)")
    }

    // MARK: - coffer audit

    static func line(time: String, pid: Int, exe: String, op: String = "get", group: String = "mail", result: Int = 0) -> String {
        "{\"time\":\(time),\"pid\":\(pid),\"app\":\"com.example.mail\",\"executable\":\(exe),\"operation\":\"\(op)\","
            + "\"accessGroup\":\"\(group)\",\"class\":\"genp\",\"result\":\(result)}\n"
    }

    @Test func auditReadsTheLogWithSinceAndJSON() throws {
        let p = try Place()
        let state = p.file("state")
        mkdir(state, 0o700)
        // 2026-11-23T20:00:00Z = 1795464000; rotated file first, then the live one, and a torn line.
        try Self.line(time: "1795464000.5", pid: 10, exe: "\"/usr/bin/mail\"")
            .write(toFile: state + "/audit.log.1", atomically: false, encoding: .utf8)
        try (Self.line(time: "1795467600.25", pid: 11, exe: "\"/tmp/x\\u001b[31m\\nfake\"", op: "find", result: -34018) + "{\"time\":17")
            .write(toFile: state + "/audit.log", atomically: false, encoding: .utf8)
        var r = runCLI(["audit", "--state-dir", state])
        #expect(r.status == 0, "\(r)")
        #expect(r.stdout == "2026-11-23T20:00:00.500Z  errSecSuccess (0)  get  app=com.example.mail  exe=/usr/bin/mail  pid=10  group=mail  class=genp\n"
            + "2026-11-23T21:00:00.250Z  errSecMissingEntitlement (-34018)  find  app=com.example.mail  exe=/tmp/x\\x1b[31m\\nfake  pid=11  group=mail  class=genp\n", "\(r)")
        #expect(!r.stdout.contains("\u{1b}"))

        r = runCLI(["audit", "--state-dir", state, "--since", "2026-11-23T20:30:00Z"])
        #expect(r.stdout.split(separator: "\n").count == 1 && r.stdout.contains("pid=11"), "\(r)")
        r = runCLI(["audit", "--state-dir", state, "--since", "1795464000.6"])
        #expect(r.stdout.split(separator: "\n").count == 1 && r.stdout.contains("pid=11"), "\(r)")
        r = runCLI(["audit", "--state-dir", state, "--since", "100000d"])
        #expect(r.status == 0 && r.stdout.split(separator: "\n").count == 2, "\(r)")
        r = runCLI(["audit", "--state-dir", state, "--since", "yesterday-ish"])
        #expect(r.status == 64 && r.stderr.contains("--since"), "\(r)")

        r = runCLI(["audit", "--state-dir", state, "--json"])
        let lines = r.stdout.split(separator: "\n")
        #expect(lines.count == 2, "\(r)")
        for l in lines {
            let o = try #require(try JSONSerialization.jsonObject(with: Data(l.utf8)) as? [String: Any])
            #expect(Set(o.keys) == ["time", "pid", "app", "executable", "operation", "accessGroup", "class", "result"])
        }
        #expect(lines.last?.contains("\"executable\":\"/tmp/x\\u001b[31m\\nfake\"") == true && lines.last?.contains("\"result\":-34018") == true)
    }

    @Test func auditFollowPrintsNewRecordsAcrossRotation() throws {
        let p = try Place()
        let state = p.file("state")
        mkdir(state, 0o700)
        try Self.line(time: "1000", pid: 1, exe: "null").write(toFile: state + "/audit.log", atomically: false, encoding: .utf8)
        let proc = Process()
        proc.executableURL = URL(fileURLWithPath: Binaries.coffer)
        proc.arguments = ["audit", "--state-dir", state, "--follow"]
        let out = Pipe()
        proc.standardOutput = out
        proc.standardError = FileHandle.nullDevice
        try proc.run()
        // SIGKILL: the test runner's blocked SIGTERM is inherited by its children.
        defer { if proc.isRunning { kill(proc.processIdentifier, SIGKILL) }; proc.waitUntilExit() }
        let collected = Collected()
        out.fileHandleForReading.readabilityHandler = { h in collected.append(h.availableData) }
        func waitFor(_ needle: String) -> Bool {
            for _ in 0..<100 { if collected.text.contains(needle) { return true }; usleep(50_000) }
            return false
        }
        #expect(waitFor("pid=1 "))
        let h = try #require(FileHandle(forWritingAtPath: state + "/audit.log"))
        h.seekToEndOfFile()
        h.write(Data(Self.line(time: "1001", pid: 2, exe: "null").utf8))
        try h.close()
        #expect(waitFor("pid=2 "))
        // Rotation: the live file is renamed away and a new one starts.
        rename(state + "/audit.log", state + "/audit.log.1")
        try Self.line(time: "1002", pid: 3, exe: "null").write(toFile: state + "/audit.log", atomically: false, encoding: .utf8)
        #expect(waitFor("pid=3 "), "\(collected.text)")
        out.fileHandleForReading.readabilityHandler = nil
        #expect(collected.text.components(separatedBy: "pid=2 ").count == 2, "each record once: \(collected.text)")
    }

    final class Collected: @unchecked Sendable {
        private let lock = NSLock()
        private var data = Data()
        func append(_ d: Data) { lock.lock(); data.append(d); lock.unlock() }
        var text: String { lock.lock(); defer { lock.unlock() }; return String(decoding: data, as: UTF8.self) }
    }
}
