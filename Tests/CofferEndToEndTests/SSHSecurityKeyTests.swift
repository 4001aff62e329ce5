import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// FIDO keys on cofferd's ssh-agent socket (issue #43): `sk-ssh-ed25519@openssh.com` and
/// `sk-ecdsa-sha2-nistp256@openssh.com` keys made by OpenSSH's `ssh-keygen` and added by its `ssh-add`,
/// signing through OpenSSH's own `sk-dummy` middleware (an authenticator in software that implements
/// the middleware interface, built from the installed OpenSSH's source by contrib/sk-dummy.sh), run by
/// `coffer-plugin-host --sk-sign`, never by the agent itself.
@Suite(.enabled(if: SSHTools.available, "needs OpenSSH's ssh-add and ssh-keygen in /usr/bin (apt: openssh-client)"))
struct SSHSecurityKeyTests {
    /// contrib/sk-dummy.sh's answer, once per test process: the built library's path, or why it cannot be built here.
    static let skDummy: Result<String, SkipReason> = {
        let r = runCLI([Binaries.packageRoot + "/contrib/sk-dummy.sh"], executable: "/bin/bash", timeout: 1800)
        let path = r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        if r.status == 0, FileManager.default.fileExists(atPath: path) { return .success(path) }
        return .failure(SkipReason(status: r.status, text: r.stderr.trimmingCharacters(in: .whitespacesAndNewlines)))
    }()

    struct SkipReason: Error { let status: Int32; let text: String }

    /// The library, or the test is cancelled (no network, no compiler: the reason is reported) or fails
    /// (the build itself failed).
    static func skDummyPath() throws -> String {
        switch skDummy {
        case .success(let path): return path
        case .failure(let why) where why.status == 77: try Test.cancel("OpenSSH's sk-dummy middleware cannot be built here: \(why.text)")
        case .failure(let why): Issue.record("contrib/sk-dummy.sh failed (\(why.status)): \(why.text)"); throw why
        }
    }

    /// An agent whose allow-list is one directory of the test's (``providers``), with sk-dummy copied
    /// in (``middleware``), and optionally a scripted pinentry.
    final class Fixture: @unchecked Sendable {
        let providers = TemporaryDirectory("coffer-sk-providers")
        let outside = TemporaryDirectory("coffer-sk-outside")
        let pinentryDir = PinentryHarness.ShortDirectory()
        let fake: PinentryHarness.FakePinentry?
        let f: SSHAgentTests.Fixture
        /// The allowed directory and the other one, as realpath(3) names them (the agent logs resolved paths).
        let allowed: String, elsewhere: String
        /// sk-dummy, in the allowed directory.
        let middleware: String

        init(allowList: String? = nil, pinentry: Bool = false, extraConfig: [String] = []) throws {
            let built = try SSHSecurityKeyTests.skDummyPath()
            allowed = Self.resolved(providers.path)
            elsewhere = Self.resolved(outside.path)
            middleware = allowed + "/sk-dummy.so"
            try FileManager.default.copyItem(atPath: built, toPath: middleware)
            chmod(middleware, 0o755)
            // The allow-list matches resolved paths: the directory as realpath(3) names it.
            var lines = ["ssh-allowed-providers = \(allowList ?? allowed + "/*")"] + extraConfig
            if pinentry {
                let fake = try PinentryHarness.FakePinentry(in: pinentryDir, confirm: "ok")
                self.fake = fake
                lines += ["pinentry = \(fake.path)", "prompt-display = \(SSHAgentPolicyTests.promptDisplay)"]
            } else {
                fake = nil
            }
            let config = pinentryDir.file("cofferd.conf")
            try (lines.joined(separator: "\n") + "\n").write(toFile: config, atomically: true, encoding: .utf8)
            f = try SSHAgentTests.Fixture(extraArguments: ["--config", config])
        }

        /// `path` with every symbolic link and `//` resolved (realpath(3)).
        static func resolved(_ path: String) -> String {
            guard let p = realpath(path, nil) else { return path }
            defer { free(p) }
            return String(cString: p)
        }

        /// Makes a FIDO key (`ed25519-sk` or `ecdsa-sk`) with sk-dummy as the authenticator; returns its path.
        func generate(_ type: String, name: String, options: [String] = []) -> String {
            let path = f.dir.file(name)
            let r = f.run("ssh-keygen", ["-q", "-t", type, "-w", middleware, "-N", "", "-C", "\(name)@test", "-f", path] + options.flatMap { ["-O", $0] })
            #expect(r.status == 0, "ssh-keygen -t \(type): \(r)")
            return path
        }

        /// `ssh-add [args] -S provider key` (the provider sk-dummy unless named).
        func add(_ key: String, provider: String? = nil, _ args: [String] = []) -> CLIResult {
            f.run("ssh-add", args + ["-S", provider ?? middleware, key])
        }

        /// The agent log's lines that contain every one of `parts`.
        func logLines(_ parts: String...) -> [String] {
            f.agent.log.split(separator: "\n").map(String.init).filter { line in parts.allSatisfy { line.contains($0) } }
        }
    }

    /// Compiles `source` (C) into a shared object named `name` in `dir`; the test is cancelled without a compiler.
    static func compile(_ source: String, name: String, in dir: String) throws -> String {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/cc") else { try Test.cancel("needs a C compiler, /usr/bin/cc (apt: gcc)") }
        let c = dir + "/" + name + ".c", so = dir + "/" + name
        try source.write(toFile: c, atomically: true, encoding: .utf8)
        let r = runCLI(["-shared", "-fPIC", "-o", so, c], executable: "/usr/bin/cc", timeout: 300)
        #expect(r.status == 0, "cc \(name): \(r)")
        return so
    }

    /// The sk-api prototypes a test middleware implements (OpenSSH's sk-api.h, version 0x000a0000).
    static let middlewareHeader = """
        #include <stdint.h>
        #include <stddef.h>
        #include <stdlib.h>
        #include <string.h>
        struct sk_sign_response { uint8_t flags; uint32_t counter; uint8_t *sig_r; size_t sig_r_len; uint8_t *sig_s; size_t sig_s_len; };
        int sk_enroll(void) { return -2; }
        int sk_load_resident_keys(void) { return -2; }

        """

    /// `ssh-add -S` adds both FIDO key types; `ssh-add -l`/`-L` list them as OpenSSH names them;
    /// signatures made through the agent (ssh-keygen -Y sign with only the public key) verify with
    /// OpenSSH's own verifier; the log names the middleware, the audit log each signature; `ssh-add -d`
    /// and `-D` remove them.
    @Test func fidoKeysAreAddedListedAndSignThroughTheirMiddleware() throws {
        let s = try Fixture()
        let f = s.f
        let keys = [("ed25519-sk", "ED25519-SK"), ("ecdsa-sk", "ECDSA-SK")].map { (type, name) in (type, name, s.generate(type, name: "id_\(type)")) }
        for (type, _, key) in keys {
            let added = s.add(key)
            #expect(added.status == 0 && added.stderr.contains("Identity added"), "\(type): \(added)\n\(f.agent.log.suffix(2000))")
            #expect(!s.logLines("ssh-agent: added a key", "key=\(f.fingerprint(key + ".pub"))", "middleware=\(s.middleware)").isEmpty,
                    "\(type): \(f.agent.log.suffix(2000))")
        }
        let listed = f.run("ssh-add", ["-l"])
        for (type, name, key) in keys {
            let fingerprint = f.fingerprint(key + ".pub")
            #expect(listed.stdout.split(separator: "\n").contains { $0.contains(fingerprint) && $0.hasSuffix("(\(name))") && $0.hasPrefix("256 ") },
                    "\(type): \(listed)")
        }
        let full = f.run("ssh-add", ["-L"])
        for (_, _, key) in keys {
            let line = try String(contentsOfFile: key + ".pub", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(full.stdout.split(separator: "\n").contains(Substring(line)), "ssh-add -L lacks \(line):\n\(full.stdout)")
        }

        // Only the agent (and the authenticator behind it) can sign now.
        for (_, _, key) in keys { try FileManager.default.removeItem(atPath: key) }
        let document = f.dir.file("document")
        try "signed by an authenticator\n".write(toFile: document, atomically: true, encoding: .utf8)
        for (type, name, key) in keys {
            let (signed, verified) = f.signAndVerify(publicKey: key + ".pub", file: document)
            #expect(signed.status == 0, "\(type): \(signed)\n\(f.agent.log.suffix(2000))")
            #expect(verified?.status == 0 && verified?.stdout.contains("Good \"file\" signature for signer@test with \(name) key") == true,
                    "\(type): \(verified.map { "\($0)" } ?? "")")
            #expect(!s.logLines("ssh-agent: signed", "key=\(f.fingerprint(key + ".pub"))", "algorithm=sk-").isEmpty, "\(type)")
        }
        let records = SSHAgentPolicyTests.signatures(f.agent)
        #expect(records.count == 2 && records.allSatisfy { $0["result"] as? Int == 0 }, "\(records)")

        // ssh-add -d removes one (named by its public key), ssh-add -D the rest.
        #expect(f.run("ssh-add", ["-d", keys[0].2 + ".pub"]).status == 0)
        #expect(f.listed() == [f.fingerprint(keys[1].2 + ".pub")])
        #expect(f.signAndVerify(publicKey: keys[0].2 + ".pub", file: document).signed.status != 0, "a removed key still signs")
        #expect(f.run("ssh-add", ["-D"]).status == 0)
        #expect(f.run("ssh-add", ["-l"]).status == 1)
        // The key handle is never logged (sk-dummy's handle of an ed25519 key is its private key).
        #expect(!f.agent.log.contains("PRIVATE KEY"))
    }

    /// `ssh` logs in to an sshd that knows only the FIDO keys' public halves, the agent signing through
    /// the middleware for each key type; with the keys gone from the agent, it cannot.
    @Test(.enabled(if: SSHDaemon.available, "needs /usr/sbin/sshd (apt: openssh-server)"),
          .enabled(if: !SSHOpenSSHTests.sanitized, "the plain (unsanitized) run only: OpenSSH's programs do most of the work"))
    func sshLogsInWithFIDOKeysInTheAgent() throws {
        let s = try Fixture()
        let f = s.f
        let keys = ["ed25519-sk", "ecdsa-sk"].map { ($0, s.generate($0, name: "id_login_\($0)")) }
        let sshd = try SSHDaemon(authorizedKeys: try keys.map { try String(contentsOfFile: $0.1 + ".pub", encoding: .utf8) })
        for (type, key) in keys {
            #expect(s.add(key).status == 0)
            try FileManager.default.removeItem(atPath: key)
            let fingerprint = f.fingerprint(key + ".pub")
            let r = f.run("ssh", sshd.clientArguments(in: f.dir) + ["true"])
            #expect(r.status == 0, "\(type): ssh through the agent failed: \(r.stderr.suffix(3000))\nsshd: \(sshd.log.suffix(3000))")
            #expect(SSHOpenSSHTests.hasLine(sshd.log, "Accepted publickey for \(SSHDaemon.user)", fingerprint),
                    "\(type): sshd did not accept \(fingerprint): \(sshd.log.suffix(3000))")
            #expect(f.run("ssh-add", ["-D"]).status == 0)
            let refused = f.run("ssh", sshd.clientArguments(in: f.dir) + ["true"])
            #expect(refused.status == 255 && refused.stderr.contains("Permission denied"), "\(type): logged in with no key in the agent: \(refused)")
        }
    }

    /// Confirm (`ssh-add -c`) and destination constraints (`ssh-add -h`) apply to a FIDO key as to any
    /// other: the person is asked before the authenticator is, and a cancel refuses; a key restricted to
    /// a host signs nothing locally (and, with an sshd, logs in to that host).
    @Test func confirmAndDestinationConstraintsApplyToFIDOKeys() throws {
        let s = try Fixture(pinentry: true)
        let f = s.f
        let fake = try #require(s.fake)
        let key = s.generate("ed25519-sk", name: "id_constrained")
        let fingerprint = f.fingerprint(key + ".pub")
        let document = f.dir.file("document")
        try "x\n".write(toFile: document, atomically: true, encoding: .utf8)
        func records() -> [[String: Any]] { SSHAgentPolicyTests.signatures(f.agent).filter { $0["key"] as? String == fingerprint } }

        #expect(s.add(key, ["-c"]).status == 0)
        let (signed, verified) = f.signAndVerify(publicKey: key + ".pub", file: document)
        #expect(signed.status == 0 && verified?.status == 0, "\(signed)\n\(f.agent.log.suffix(2000))")
        try fake.set(confirm: "cancel")
        #expect(f.signAndVerify(publicKey: key + ".pub", file: document).signed.status != 0, "signed though the person refused")
        #expect(records().map { $0["reason"] as? String } == ["confirmed", "cancelled"], "\(records())")
        let asked = ((try? String(contentsOfFile: s.pinentryDir.file("confirm-desc.log"), encoding: .utf8)) ?? "").split(separator: "\n")
        #expect(asked.count == 2 && asked.allSatisfy { $0.contains(fingerprint) }, "\(asked)")
        // Refused before the authenticator was asked: one signature went to the middleware.
        #expect(s.logLines("ssh-agent: signed", "key=\(fingerprint)").count == 1, "\(f.agent.log.suffix(2000))")

        // Restricted to a host: a local signature (no session-bind) is refused, and audited so.
        let host = f.generate("ed25519", name: "host_key")
        try "testserver \(try String(contentsOfFile: host + ".pub", encoding: .utf8))".write(toFile: f.dir.file("known_hosts"), atomically: true, encoding: .utf8)
        #expect(f.run("ssh-add", ["-D"]).status == 0)
        try fake.set(confirm: "ok")
        let restricted = s.add(key, ["-H", f.dir.file("known_hosts"), "-h", "testserver"])
        #expect(restricted.status == 0, "\(restricted)\n\(f.agent.log.suffix(2000))")
        #expect(f.signAndVerify(publicKey: key + ".pub", file: document).signed.status != 0, "a destination-constrained key signed locally")
        #expect(records().last?["reason"] as? String == "destination-unbound-connection", "\(records())")

        // With an sshd: the restricted key logs in to the host it names.
        guard SSHDaemon.available, !SSHOpenSSHTests.sanitized else { return }
        let sshd = try SSHDaemon(authorizedKeys: [try String(contentsOfFile: key + ".pub", encoding: .utf8)], hostKey: host)
        try sshd.writeClientConfig(f.dir.file("ssh_config"), knownHosts: f.dir.file("known_hosts"))
        let login = f.run("ssh", ["-F", f.dir.file("ssh_config"), "testserver", "echo", "logged-in"])
        #expect(login.status == 0 && login.stdout.contains("logged-in"), "\(login)\n\(f.agent.log.suffix(3000))\n\(sshd.log.suffix(3000))")
        #expect(records().last.map { $0["result"] as? Int == 0 && ($0["destination"] as? String)?.contains("testserver") == true } == true,
                "\(records())")
    }

    /// The middleware a key names must resolve into the allow-list (OpenSSH ssh-agent's `-P` rule):
    /// a copy elsewhere, a symbolic link in the allowed directory to one elsewhere, a verify-required
    /// key, and any test path under the default allow-list (`/usr/lib*/*,/usr/local/lib*/*`) are
    /// refused, each with its reason in the log.
    @Test func middlewaresOutsideTheAllowListAreRefused() throws {
        let s = try Fixture()
        let f = s.f
        let key = s.generate("ed25519-sk", name: "id_refused")
        let fingerprint = f.fingerprint(key + ".pub")
        let elsewhere = s.elsewhere + "/sk-dummy.so"
        try FileManager.default.copyItem(atPath: s.middleware, toPath: elsewhere)
        let outsideAdd = s.add(key, provider: elsewhere)
        #expect(outsideAdd.status != 0 && outsideAdd.stderr.contains("agent refused operation"), "\(outsideAdd)")
        #expect(!s.logLines("refused a FIDO key", "\(elsewhere) is not in ssh-allowed-providers", "key=\(fingerprint)").isEmpty, "\(f.agent.log.suffix(2000))")

        let link = s.allowed + "/link.so"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: elsewhere)
        #expect(s.add(key, provider: link).status != 0, "a link out of the allowed directory was followed")
        #expect(s.logLines("refused a FIDO key", "\(elsewhere) is not in ssh-allowed-providers").count == 2, "\(f.agent.log.suffix(2000))")

        // A key that wants a PIN or a fingerprint for each signature.
        let verifying = s.generate("ecdsa-sk", name: "id_verify", options: ["verify-required"])
        #expect(s.add(verifying).status != 0)
        #expect(!s.logLines("refused a FIDO key", "verify-required", "key=\(f.fingerprint(verifying + ".pub"))").isEmpty, "\(f.agent.log.suffix(2000))")

        #expect(f.run("ssh-add", ["-l"]).status == 1, "a refused key was listed")
        // The allowed one is still taken.
        #expect(s.add(key).status == 0)

        // OpenSSH's default allow-list: nothing of the test's (under /tmp) is allowed.
        let defaults = try Fixture(allowList: "/usr/lib*/*,/usr/local/lib*/*")
        let other = defaults.generate("ed25519-sk", name: "id_default")
        #expect(defaults.add(other).status != 0)
        #expect(!defaults.logLines("refused a FIDO key", "is not in ssh-allowed-providers (/usr/lib*/*,/usr/local/lib*/*)").isEmpty,
                "\(defaults.f.agent.log.suffix(2000))")
    }

    /// `ssh-add` without a middleware names OpenSSH's built-in support, `internal`, which runs in
    /// OpenSSH's own ssh-sk-helper, as with OpenSSH's agent: the key is taken (whatever the allow-list
    /// says), and a signature goes to that helper, which finds no authenticator here (no device): the
    /// helper's answer is in the log, the client gets SSH_AGENT_FAILURE, and the agent goes on.
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/lib/openssh/ssh-sk-helper"),
                   "needs OpenSSH's /usr/lib/openssh/ssh-sk-helper (apt: openssh-client)"))
    func internalRunsInOpenSSHsOwnHelper() throws {
        let s = try Fixture()
        let f = s.f
        let key = s.generate("ecdsa-sk", name: "id_internal")
        let fingerprint = f.fingerprint(key + ".pub")
        let added = f.run("ssh-add", [key])
        #expect(added.status == 0, "\(added)\n\(f.agent.log.suffix(2000))")
        #expect(!s.logLines("ssh-agent: added a key", "key=\(fingerprint)", "middleware=internal").isEmpty, "\(f.agent.log.suffix(2000))")
        let document = f.dir.file("document")
        try "x\n".write(toFile: document, atomically: true, encoding: .utf8)
        try FileManager.default.removeItem(atPath: key)
        #expect(f.signAndVerify(publicKey: key + ".pub", file: document).signed.status != 0, "signed with no authenticator")
        #expect(!s.logLines("ssh-agent: the authenticator did not sign", "key=\(fingerprint)", "middleware=internal",
                            "OpenSSH's ssh-sk-helper failed: no authenticator found (-60)").isEmpty, "\(f.agent.log.suffix(2000))")
        #expect(f.listed() == [fingerprint])
    }

    /// A middleware that crashes, returns a signature that does not verify, implements another API
    /// version or may be written by others costs that signature (SSH_AGENT_FAILURE, the reason in the
    /// log), never the agent: it goes on listing and signing with sk-dummy.
    @Test func aFailingMiddlewareRefusesTheSignatureAndTheAgentGoesOn() throws {
        let s = try Fixture()
        let f = s.f
        let crash = try Self.compile(Self.middlewareHeader + """
            uint32_t sk_api_version(void) { return 0x000a0000; }
            int sk_sign(uint32_t alg, const uint8_t *d, size_t dl, const char *app, const uint8_t *kh, size_t khl, uint8_t flags,
                        const char *pin, void **options, struct sk_sign_response **out) { abort(); }
            """, name: "sk-crash.so", in: s.allowed)
        let forged = try Self.compile(Self.middlewareHeader + """
            uint32_t sk_api_version(void) { return 0x000a0000; }
            int sk_sign(uint32_t alg, const uint8_t *d, size_t dl, const char *app, const uint8_t *kh, size_t khl, uint8_t flags,
                        const char *pin, void **options, struct sk_sign_response **out) {
                struct sk_sign_response *r = calloc(1, sizeof(*r));
                r->flags = flags; r->counter = 1; r->sig_r_len = 64; r->sig_r = calloc(1, 64); memset(r->sig_r, 7, 64);
                *out = r;
                return 0;
            }
            """, name: "sk-forged.so", in: s.allowed)
        let older = try Self.compile(Self.middlewareHeader + """
            uint32_t sk_api_version(void) { return 0x00090000; }
            int sk_sign(void) { abort(); }
            """, name: "sk-older.so", in: s.allowed)
        let writable = s.allowed + "/sk-writable.so"
        try FileManager.default.copyItem(atPath: s.middleware, toPath: writable)
        chmod(writable, 0o777)

        let key = s.generate("ed25519-sk", name: "id_failing")
        let fingerprint = f.fingerprint(key + ".pub")
        let document = f.dir.file("document")
        try "x\n".write(toFile: document, atomically: true, encoding: .utf8)
        for (middleware, reason) in [(crash, "killed by signal \(SIGABRT)"), (forged, "does not verify"),
                                     (older, "implements the middleware API version 0x00090000"), (writable, "world-writable")] {
            #expect(f.run("ssh-add", ["-D"]).status == 0)
            #expect(s.add(key, provider: middleware).status == 0, "the key is taken (a middleware is not loaded to add one)")
            let signed = f.signAndVerify(publicKey: key + ".pub", file: document).signed
            #expect(signed.status != 0 && signed.stderr.contains("agent refused operation"), "\(middleware): \(signed)")
            #expect(!s.logLines("ssh-agent: the authenticator did not sign", "key=\(fingerprint)", "middleware=\(middleware)", reason).isEmpty,
                    "\(middleware): \(f.agent.log.suffix(3000))")
            // The agent goes on.
            #expect(f.listed() == [fingerprint], "\(middleware)")
        }
        #expect(f.run("ssh-add", ["-D"]).status == 0)
        #expect(s.add(key).status == 0)
        let (signed, verified) = f.signAndVerify(publicKey: key + ".pub", file: document)
        #expect(signed.status == 0 && verified?.status == 0, "sk-dummy after the failures: \(signed)\n\(f.agent.log.suffix(2000))")
        // No crash report of the helper carries its memory into the log.
        let hostLog = (try? String(contentsOfFile: f.agent.dir.file("state/plugin-host.log"), encoding: .utf8)) ?? ""
        #expect(!hostLog.contains("Registers:") && !hostLog.contains("Backtracing"), "\(hostLog.suffix(2000))")
    }
}
