import CofferCrypto
import CofferSSHAgentProtocol
import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// What the ssh-agent socket asks before a signature (issue #27): `ssh-add -c` keys through the
/// agent's own prompter (a scripted pinentry here), `ssh-add -h` keys only on the hops OpenSSH's
/// ssh-agent would allow, and every signature in the audit log.
@Suite(.enabled(if: SSHTools.available, "needs OpenSSH's ssh-add and ssh-keygen in /usr/bin (apt: openssh-client)"))
struct SSHAgentPolicyTests {
    /// An agent whose pinentry is the scripted one (or `pinentry`), with `timeout` as its authentication timeout
    /// (also used by SSHKeyItemTests).
    final class Prompted: @unchecked Sendable {
        let dir = PinentryHarness.ShortDirectory()
        let fake: PinentryHarness.FakePinentry
        let f: SSHAgentTests.Fixture

        /// `pin` and `passcode`: what the scripted pinentry answers a GETPIN (``PinentryHarness/FakePinentry``).
        init(confirm: String = "ok", timeout: Int = 120, pinentry: String? = nil, pin: String = "cancel", passcode: String = "cancel") throws {
            fake = try PinentryHarness.FakePinentry(in: dir, pin: pin, passcode: passcode, confirm: confirm)
            let config = dir.file("cofferd.conf")
            var lines = ["authentication-timeout = \(timeout)"]
            lines.append("pinentry = \(pinentry ?? fake.path)")
            // The agent's dialogs appear only on a display logind or the configuration names (issue #41,
            // F1): here no logind session, so a configured one, which the scripted pinentry never opens.
            lines.append("prompt-display = \(SSHAgentPolicyTests.promptDisplay)")
            try (lines.joined(separator: "\n") + "\n").write(toFile: config, atomically: true, encoding: .utf8)
            f = try SSHAgentTests.Fixture(extraArguments: ["--config", config])
        }

        /// A keychain key made with `coffer ssh keygen` that needs the device passcode, whose one
        /// authentication serves the same program's signatures for 300 s; its public key is saved as
        /// LABEL.pub (returned).
        func reuseKey(_ label: String = "reused") throws -> String {
            let made = f.agent.cli(["ssh", "keygen", "--label", label, "--access-control", "device-passcode", "--reuse-seconds", "300"])
            guard made.status == 0 else { throw SignedApps.Failure("ssh keygen: \(made)") }
            return SSHKeyItemTests.savePublic(made.stdout, f, label)
        }

        /// The descriptions of the CONFIRM dialogs shown so far (Assuan-escaped: `%0A` is a line break).
        var confirmations: [String] {
            ((try? String(contentsOfFile: dir.file("confirm-desc.log"), encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        }
    }

    /// The `prompt-display` of the agents whose pinentry is scripted (it opens no display).
    static let promptDisplay = ":0"

    /// The agent's `ssh-sign` audit records.
    static func signatures(_ agent: AgentProcess) -> [[String: Any]] { auditRecords(agent).filter { $0["operation"] as? String == "ssh-sign" } }

    /// The public key blob of a `.pub` file.
    static func blob(_ publicKeyFile: String) throws -> [UInt8] {
        let line = try String(contentsOfFile: publicKeyFile, encoding: .utf8)
        let fields = line.split(separator: " ")
        guard fields.count >= 2, let data = Data(base64Encoded: String(fields[1])) else { throw CocoaError(.fileReadCorruptFile) }
        return Array(data)
    }

    @Test func aConfirmKeyAsksThePersonForEachSignatureNamingKeyAndCaller() throws {
        let p = try Prompted(confirm: "ok")
        let f = p.f
        let key = f.generate("ed25519", name: "id_confirm")
        let added = f.run("ssh-add", ["-c", key])
        #expect(added.status == 0, "ssh-add -c is accepted: \(added)")
        let fingerprint = f.fingerprint(key + ".pub")
        #expect(f.listed() == [fingerprint])
        try FileManager.default.removeItem(atPath: key)
        let document = f.dir.file("document")
        try "signed only with consent\n".write(toFile: document, atomically: true, encoding: .utf8)

        // OK: signed, and the dialog named the key (fingerprint, comment) and the program as identified.
        let (signed, verified) = f.signAndVerify(publicKey: key + ".pub", file: document)
        #expect(signed.status == 0, "\(signed)")
        #expect(verified?.status == 0, "\(verified.map { "\($0)" } ?? "")")
        let asked = p.confirmations
        #expect(asked.count == 1, "\(asked)")
        #expect(asked.first.map { $0.contains(fingerprint) && $0.contains("id_confirm@test") && $0.contains("Requested by: ssh-keygen") } == true,
                "\(asked)")

        // Cancel: refused; each signature asks again.
        try p.fake.set(confirm: "cancel")
        #expect(f.signAndVerify(publicKey: key + ".pub", file: document).signed.status != 0, "signed without consent")
        #expect(p.confirmations.count == 2)

        // Both in the audit log: the key, the caller as the agent identified it, allowed or refused and why.
        let records = Self.signatures(f.agent)
        #expect(records.count == 2, "\(records)")
        #expect(records.allSatisfy { $0["key"] as? String == fingerprint && ($0["executable"] as? String)?.hasSuffix("/ssh-keygen") == true },
                "\(records)")
        #expect(records.map { $0["result"] as? Int } == [0, -128], "\(records)")
        #expect(records.map { $0["reason"] as? String } == ["confirmed", "cancelled"], "\(records)")
    }

    @Test func aSignatureNobodyCanConfirmIsRefusedAtOnce() throws {
        for (pinentry, reason) in [("none", "nobody-to-ask"), ("/nonexistent/pinentry", "pinentry-failed"), ("/bin/false", "pinentry-failed")] {
            let p = try Prompted(pinentry: pinentry)
            let f = p.f
            let key = f.generate("ecdsa", name: "id_nobody")
            #expect(f.run("ssh-add", ["-c", key]).status == 0)
            try FileManager.default.removeItem(atPath: key)
            let document = f.dir.file("document")
            try "x\n".write(toFile: document, atomically: true, encoding: .utf8)
            let started = Date()
            #expect(f.signAndVerify(publicKey: key + ".pub", file: document).signed.status != 0, "\(pinentry): signed with nobody asked")
            // At once: well inside the 120 s deadline even on a loaded machine.
            #expect(Date().timeIntervalSince(started) < 60, "\(pinentry)")
            let records = Self.signatures(f.agent)
            #expect(records.map { $0["reason"] as? String } == [reason], "\(pinentry): \(records)")
            // Unconstrained keys still sign.
            let plain = f.generate("ed25519", name: "id_plain")
            #expect(f.run("ssh-add", [plain]).status == 0)
            #expect(f.signAndVerify(publicKey: plain + ".pub", file: document).signed.status == 0, "\(pinentry)")
            #expect(Self.signatures(f.agent).last?["reason"] as? String == "no-confirmation-needed")
        }
    }

    @Test func aPromptNobodyAnswersEndsAtTheDeadline() throws {
        let p = try Prompted(confirm: "hang", timeout: 10)
        let f = p.f
        let key = f.generate("ed25519", name: "id_deadline")
        #expect(f.run("ssh-add", ["-c", key]).status == 0)
        try FileManager.default.removeItem(atPath: key)
        let document = f.dir.file("document")
        try "x\n".write(toFile: document, atomically: true, encoding: .utf8)
        #expect(f.signAndVerify(publicKey: key + ".pub", file: document).signed.status != 0)
        #expect(Self.signatures(f.agent).map { $0["reason"] as? String } == ["timed-out"])
        let pid = Int32((try? String(contentsOfFile: p.dir.file("hung.pid"), encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? 0
        #expect(pid > 0 && kill(pid, 0) != 0, "the pinentry outlived its request")
    }

    /// The client hangs up while the person is asked: the dialog ends (the pinentry is stopped), the
    /// refusal is audited, and meanwhile the agent serves other connections and other signatures.
    @Test func aClientThatHangsUpEndsThePromptAndOthersAreServedMeanwhile() throws {
        let p = try Prompted(confirm: "hang")
        let f = p.f
        let key = f.generate("ed25519", name: "id_hangup")
        let plain = f.generate("ecdsa", name: "id_other")
        #expect(f.run("ssh-add", ["-c", key]).status == 0)
        #expect(f.run("ssh-add", [plain]).status == 0)
        let fd = try SSHAgentTests.connect(f)
        #expect(UnixSocket.writeAll(fd, try SSHAgentRequest.signRequest(keyBlob: try Self.blob(key + ".pub"), data: [1, 2, 3], flags: 0).encodeFrame()))
        var pid: Int32 = 0
        let deadline = Date().addingTimeInterval(60)
        while pid == 0, Date() < deadline {
            pid = Int32((try? String(contentsOfFile: p.dir.file("hung.pid"), encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? 0
            usleep(50_000)
        }
        #expect(pid > 0, "the person was not asked: \(f.agent.log)")

        // While the dialog is open: listing and another key's signature are served.
        #expect(f.listed().count == 2)
        let document = f.dir.file("document")
        try "x\n".write(toFile: document, atomically: true, encoding: .utf8)
        #expect(f.signAndVerify(publicKey: plain + ".pub", file: document).signed.status == 0)

        close(fd)
        var gone = false
        let end = Date().addingTimeInterval(60)
        while !gone, Date() < end {
            gone = kill(pid, 0) != 0
            if !gone { usleep(50_000) }
        }
        #expect(gone, "the dialog outlived the client")
        var reasons: [String] = []
        while Date() < end {
            reasons = Self.signatures(f.agent).compactMap { $0["reason"] as? String }
            if reasons.contains("client-gone") { break }
            usleep(50_000)
        }
        #expect(reasons.contains("client-gone"), "\(reasons)")
    }

    @Test func concurrentConfirmationsDoNotBlockEachOther() throws {
        let p = try Prompted(confirm: "ok")
        let f = p.f
        let key = f.generate("ed25519", name: "id_many")
        #expect(f.run("ssh-add", ["-c", key]).status == 0)
        let results = Protected([Int32]())
        let done = DispatchSemaphore(value: 0)
        // Threads of their own (not the dispatch pool, which runCLI itself needs): four clients at once.
        for i in 0..<4 {
            Thread {
                let document = f.dir.file("document-\(i)")
                try? "document \(i)\n".write(toFile: document, atomically: true, encoding: .utf8)
                let r = f.run("ssh-keygen", ["-Y", "sign", "-f", key + ".pub", "-n", "file", document])
                results.withLock { $0.append(r.status) }
                done.signal()
            }.start()
        }
        for _ in 0..<4 { #expect(done.wait(timeout: .now() + 300) == .success, "a signature never came back") }
        #expect(results.withLock { $0 } == [0, 0, 0, 0])
        #expect(p.confirmations.count == 4)
        #expect(Self.signatures(f.agent).map { $0["reason"] as? String } == Array(repeating: "confirmed", count: 4))
    }

    // MARK: restrict-destination (ssh-add -h)

    /// A userauth request as ssh has the agent sign it (RFC 4252 §7; publickey-hostbound when `hostKey` is given).
    static func userauth(session: [UInt8], user: String, algorithm: String, key: [UInt8], hostKey: [UInt8]?) -> [UInt8] {
        var w = SSHWireWriter()
        w.writeString(session)
        w.writeByte(50)
        w.writeText(user)
        w.writeText("ssh-connection")
        w.writeText(hostKey == nil ? "publickey" : "publickey-hostbound-v00@openssh.com")
        w.writeByte(1)
        w.writeText(algorithm)
        w.writeString(key)
        if let hostKey { w.writeString(hostKey) }
        return w.bytes
    }

    /// A session-bind for `session` signed by the agent's own (unconstrained) key `hostKey`, which
    /// plays the server's host key.
    static func bind(_ fd: Int32, hostKey: [UInt8], session: [UInt8], forwarding: Bool) throws -> SSHSessionBind {
        guard case .signResponse(let signature)? = SSHAgentTests.exchange(fd, try SSHAgentRequest.signRequest(keyBlob: hostKey, data: session, flags: 0)
            .encodeFrame()) else { throw CocoaError(.featureUnsupported) }
        return SSHSessionBind(hostKey: hostKey, sessionIdentifier: session, signature: signature, isForwarding: forwarding)
    }

    static func listed(_ fd: Int32) -> [[UInt8]]? {
        guard case .identities(let ids)? = SSHAgentTests.exchange(fd, try! SSHAgentRequest.requestIdentities.encodeFrame()) else { return nil }
        return ids.map(\.keyBlob)
    }

    static func signs(_ fd: Int32, _ key: [UInt8], _ data: [UInt8]) -> Bool {
        guard case .signResponse? = SSHAgentTests.exchange(fd, try! SSHAgentRequest.signRequest(keyBlob: key, data: data, flags: 0).encodeFrame()) else {
            return false
        }
        return true
    }

    /// `ssh-add -h alice@server.example` (the host's key from a known_hosts file): the key signs only
    /// alice's userauth request on a connection bound to that host, with that session id and host key,
    /// and is listed only where it could be used, as OpenSSH's ssh-agent decides.
    @Test func aDestinationConstrainedKeySignsOnlyForItsHops() throws {
        let f = try SSHAgentTests.Fixture()
        let host = f.generate("ed25519", name: "host_key"), other = f.generate("ed25519", name: "other_host_key")
        let user = f.generate("ed25519", name: "id_restricted")
        let knownHosts = f.dir.file("known_hosts")
        try "server.example \(try String(contentsOfFile: host + ".pub", encoding: .utf8))".write(toFile: knownHosts, atomically: true, encoding: .utf8)
        // The host keys live in the agent unconstrained, to sign the session-binds.
        #expect(f.run("ssh-add", [host, other]).status == 0)
        let added = f.run("ssh-add", ["-H", knownHosts, "-h", "alice@server.example", user])
        #expect(added.status == 0, "ssh-add -h is accepted: \(added)")
        let (h, g, k) = (try Self.blob(host + ".pub"), try Self.blob(other + ".pub"), try Self.blob(user + ".pub"))
        let document = f.dir.file("document")
        try "x\n".write(toFile: document, atomically: true, encoding: .utf8)
        try FileManager.default.removeItem(atPath: user)

        // Local use (no bind): listed, but it signs nothing (not even ssh-keygen -Y sign).
        let fd = try SSHAgentTests.connect(f)
        defer { close(fd) }
        #expect(Self.listed(fd)?.contains(k) == true)
        #expect(!Self.signs(fd, k, [1, 2, 3]), "signed on an unbound connection")
        #expect(f.signAndVerify(publicKey: user + ".pub", file: document).signed.status != 0, "ssh-keygen -Y sign signed with a restricted key")

        // Bound to server.example for authentication: alice's userauth request only.
        let session = (0..<32).map { _ in UInt8.random(in: 0...255) }
        #expect(SSHAgentTests.exchange(fd, try SSHAgentRequest.extension(.sessionBind(try Self.bind(fd, hostKey: h, session: session, forwarding: false)))
            .encodeFrame()) == .success)
        #expect(Self.listed(fd)?.contains(k) == true)
        #expect(Self.signs(fd, k, Self.userauth(session: session, user: "alice", algorithm: "ssh-ed25519", key: k, hostKey: h)))
        #expect(Self.signs(fd, k, Self.userauth(session: session, user: "alice", algorithm: "ssh-ed25519", key: k, hostKey: nil)),
                "plain publickey on the first hop")
        #expect(!Self.signs(fd, k, Self.userauth(session: session, user: "bob", algorithm: "ssh-ed25519", key: k, hostKey: h)), "another user")
        var otherSession = session
        otherSession[0] ^= 1
        #expect(!Self.signs(fd, k, Self.userauth(session: otherSession, user: "alice", algorithm: "ssh-ed25519", key: k, hostKey: h)),
                "another session")
        #expect(!Self.signs(fd, k, Self.userauth(session: session, user: "alice", algorithm: "ssh-ed25519", key: k, hostKey: g)),
                "another host key in the request")
        #expect(!Self.signs(fd, k, Self.userauth(session: session, user: "alice", algorithm: "ssh-ed25519", key: h, hostKey: h)),
                "a request for another key")
        #expect(!Self.signs(fd, k, Array("SSHSIG".utf8) + session), "something other than a userauth request")

        // Bound to another host: hidden and refused.
        let elsewhere = try SSHAgentTests.connect(f)
        defer { close(elsewhere) }
        let session2 = (0..<32).map { _ in UInt8.random(in: 0...255) }
        #expect(SSHAgentTests.exchange(elsewhere, try SSHAgentRequest.extension(.sessionBind(try Self.bind(elsewhere, hostKey: g, session: session2,
                                                                                                            forwarding: false))).encodeFrame()) == .success)
        #expect(Self.listed(elsewhere).map { !$0.contains(k) && $0.contains(h) } == true, "listed on a connection to another host")
        #expect(!Self.signs(elsewhere, k, Self.userauth(session: session2, user: "alice", algorithm: "ssh-ed25519", key: k, hostKey: g)))

        // Forwarded to server.example: no hop beyond it is allowed, so hidden there, and no signature on a forwarding hop.
        let forwarded = try SSHAgentTests.connect(f)
        defer { close(forwarded) }
        let session3 = (0..<32).map { _ in UInt8.random(in: 0...255) }
        #expect(SSHAgentTests.exchange(forwarded, try SSHAgentRequest.extension(.sessionBind(try Self.bind(forwarded, hostKey: h, session: session3,
                                                                                                            forwarding: true))).encodeFrame()) == .success)
        #expect(Self.listed(forwarded).map { !$0.contains(k) } == true, "listed beyond its last hop")
        #expect(!Self.signs(forwarded, k, Self.userauth(session: session3, user: "alice", algorithm: "ssh-ed25519", key: k, hostKey: h)))

        // A bind that failed: not local use any more, so hidden.
        let failed = try SSHAgentTests.connect(f)
        defer { close(failed) }
        var forged = try Self.bind(failed, hostKey: h, session: session3, forwarding: false)
        forged.sessionIdentifier[1] ^= 1
        #expect(SSHAgentTests.exchange(failed, try SSHAgentRequest.extension(.sessionBind(forged)).encodeFrame()) == .failure)
        #expect(Self.listed(failed).map { !$0.contains(k) } == true, "listed after a failed bind")

        // Every signature by the restricted key is audited with its reason; the allowed ones name the destination.
        let records = Self.signatures(f.agent).filter { $0["key"] as? String == f.fingerprint(user + ".pub") }
        let reasons = records.compactMap { $0["reason"] as? String }
        #expect(reasons == ["destination-unbound-connection", "destination-unbound-connection", "no-confirmation-needed",
                            "no-confirmation-needed", "destination-not-permitted", "destination-session-mismatch",
                            "destination-hostkey-mismatch", "destination-not-userauth", "destination-not-userauth",
                            "destination-not-permitted", "destination-not-permitted"], "\(records)")
        #expect(records.filter { $0["result"] as? Int == 0 }.allSatisfy { ($0["destination"] as? String)?.contains("server.example") == true },
                "\(records)")
    }

    // MARK: The keychain's lock

    /// With a passcode set, `ssh-add -x` locks the keychain itself and `ssh-add -X` unlocks it with
    /// the passcode, under the native unlock's attempt schedule (shared with `coffer unlock`); while
    /// the keychain is locked (`ssh-add -x` or `coffer lock`), ssh-add keys are not listed and do not sign.
    @Test func sshAddLockIsTheKeychainsLockAndUnlockNeedsThePasscode() throws {
        let conf = TemporaryDirectory("coffer-sshlock")
        // No wait after the first failure in a row, 10 minutes after the second.
        try "unlock-delays = 0,600\n".write(toFile: conf.file("cofferd.conf"), atomically: true, encoding: .utf8)
        let f = try SSHAgentTests.Fixture(extraArguments: ["--config", conf.file("cofferd.conf")])
        f.agent.setPasscode()
        let key = f.generate("ed25519", name: "id_keychain_lock"), other = f.generate("ecdsa", name: "id_other")
        #expect(f.run("ssh-add", [key]).status == 0)
        let fingerprint = f.fingerprint(key + ".pub")
        try FileManager.default.removeItem(atPath: key)
        let document = f.dir.file("document")
        try "x\n".write(toFile: document, atomically: true, encoding: .utf8)
        func locked() -> Bool { f.agent.cli(["status"]).stdout.contains("state: locked") }

        // ssh-add -x: the keychain locks; the agent behaves as OpenSSH's locked agent.
        let lock = f.run("ssh-add", ["-x"], passphrase: "some lock words")
        #expect(lock.status == 0, "\(lock)")
        #expect(locked(), "ssh-add -x did not lock the keychain")
        #expect(f.run("ssh-add", ["-l"]).status == 1, "a locked keychain's agent listed keys")
        #expect(f.signAndVerify(publicKey: key + ".pub", file: document).signed.status != 0, "signed while the keychain is locked")
        // ssh-keygen asks for nothing it does not see listed: a client that asks anyway is refused, and audited.
        let fd = try SSHAgentTests.connect(f)
        defer { close(fd) }
        #expect(!Self.signs(fd, try Self.blob(key + ".pub"), [1, 2, 3]), "signed while the keychain is locked")
        #expect(Self.signatures(f.agent).last.map { $0["reason"] as? String == "keychain-locked" && $0["key"] as? String == fingerprint } == true)
        #expect(f.run("ssh-add", [other]).status != 0, "a locked agent took a key")

        // ssh-add -X: the passcode (checked by PAM), not the lock's words.
        #expect(f.run("ssh-add", ["-X"], passphrase: "some lock words").status != 0, "unlocked without the passcode")
        #expect(locked())
        let unlock = f.run("ssh-add", ["-X"], passphrase: AgentProcess.password)
        #expect(unlock.status == 0, "\(unlock)\n\(f.agent.log)")
        #expect(!locked())
        #expect(f.listed() == [fingerprint])
        #expect(f.signAndVerify(publicKey: key + ".pub", file: document).signed.status == 0)
        let unlocks = auditRecords(f.agent).filter { $0["operation"] as? String == "unlock" }.map { $0["result"] as? Int }
        #expect(unlocks == [-25293, 0], "the native unlock's audit records: \(unlocks)")

        // coffer lock: the same for ssh-add keys; coffer unlock gives them back.
        #expect(f.agent.cli(["lock"]).status == 0)
        #expect(f.run("ssh-add", ["-l"]).status == 1)
        #expect(f.signAndVerify(publicKey: key + ".pub", file: document).signed.status != 0, "signed after coffer lock")
        #expect(f.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(f.listed() == [fingerprint])

        // The attempt schedule is the native one: after two wrong passcodes in a row, the right one waits
        // its 10 minutes whichever socket it comes through.
        #expect(f.run("ssh-add", ["-x"], passphrase: "x").status == 0)
        #expect(f.run("ssh-add", ["-X"], passphrase: "wrong 1").status != 0)
        #expect(f.run("ssh-add", ["-X"], passphrase: "wrong 2").status != 0)
        #expect(f.run("ssh-add", ["-X"], passphrase: AgentProcess.password).status != 0, "the attempt schedule was skipped")
        #expect(f.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status != 0)
        #expect(locked())
    }

    // MARK: A real ssh and sshd

    /// `ssh` to a local sshd with keys in cofferd: an `ssh-add -h` key logs in to the host it names
    /// (ssh's own session-bind and hostbound userauth), not as another user than it allows, and is
    /// not offered at all to a host it does not name; an `ssh-add -c` key logs in only when allowed.
    @Test(.enabled(if: SSHDaemon.available && FileManager.default.isExecutableFile(atPath: "/usr/bin/ssh"), "needs OpenSSH's sshd and ssh (apt: openssh-server, openssh-client)"))
    func realSSHHonoursDestinationAndConfirmConstraints() throws {
        let p = try Prompted(confirm: "ok")
        let f = p.f
        let host = f.generate("ed25519", name: "ssh_host_ed25519_key")
        let user = f.generate("ed25519", name: "id_login")
        let hostLine = try String(contentsOfFile: host + ".pub", encoding: .utf8)
        // known_hosts: the server under two names; only "testserver" has its real key, "elsewhere" another one.
        let elsewhereKey = f.generate("ed25519", name: "elsewhere_host_key")
        let fingerprint = f.fingerprint(user + ".pub"), hostFingerprint = f.fingerprint(host + ".pub")
        let sshd = try SSHDaemon(authorizedKeys: [try String(contentsOfFile: user + ".pub", encoding: .utf8)], hostKey: host)
        try ("testserver " + hostLine + "elsewhere " + (try String(contentsOfFile: elsewhereKey + ".pub", encoding: .utf8)))
            .write(toFile: f.dir.file("known_hosts"), atomically: true, encoding: .utf8)
        try sshd.writeClientConfig(f.dir.file("ssh_config"), knownHosts: f.dir.file("known_hosts"))
        // The private key stays in the test's directory, which ssh is never pointed at: only the agent signs.
        let config = f.dir.file("ssh_config"), known = f.dir.file("known_hosts")
        func login() -> CLIResult { f.run("ssh", ["-F", config, "testserver", "echo", "logged-in"]) }
        func records() -> [[String: Any]] { Self.signatures(f.agent).filter { $0["key"] as? String == fingerprint } }
        func readd(_ args: [String]) {
            _ = f.run("ssh-add", ["-D"])
            let r = f.run("ssh-add", args + [user])
            #expect(r.status == 0, "ssh-add \(args): \(r)")
        }

        // Restricted to this host: ssh logs in; the audit record names the host and the user.
        readd(["-H", known, "-h", "testserver"])
        var r = login()
        #expect(r.status == 0 && r.stdout.contains("logged-in"), "\(r)\n\(f.agent.log)\n\(sshd.log)")
        #expect(records().last.map { $0["result"] as? Int == 0 && ($0["destination"] as? String)?.contains("testserver") == true
            && ($0["destination"] as? String)?.contains(currentUser) == true } == true, "\(records())")

        // Restricted to another user at this host: offered, but the signature for this user is refused.
        readd(["-H", known, "-h", "someone-else@testserver"])
        r = login()
        #expect(r.status != 0 && !r.stdout.contains("logged-in"), "logged in as a user the key does not allow: \(r)")
        #expect(records().last?["reason"] as? String == "destination-not-permitted", "\(records())")

        // Restricted to another host: not even offered here.
        readd(["-H", known, "-h", "elsewhere"])
        let before = records().count
        r = login()
        #expect(r.status != 0 && !r.stdout.contains("logged-in"), "logged in to a host the key does not name: \(r)")
        #expect(records().count == before, "a key hidden from this host was asked to sign: \(records())")

        // ssh-add -c: the person allows the login, or refuses it.
        readd(["-c"])
        r = login()
        #expect(r.status == 0 && r.stdout.contains("logged-in"), "\(r)")
        try p.fake.set(confirm: "cancel")
        r = login()
        #expect(r.status != 0 && !r.stdout.contains("logged-in"), "logged in though the person refused: \(r)")
        #expect(records().suffix(2).map { $0["reason"] as? String } == ["confirmed", "cancelled"], "\(records())")
        // ssh bound the session, so the dialog named the server by its host key.
        #expect(p.confirmations.last?.contains(hostFingerprint) == true, "\(p.confirmations)")
    }

    /// `ssh-add -H known_hosts -h host` where known_hosts names the host only by a `@cert-authority`
    /// line and sshd presents a host certificate by that CA (OpenSSH's match_key_hop): the key logs in
    /// to the host the certificate names, and is not offered there when restricted to another name
    /// the same CA vouches for.
    @Test(.enabled(if: SSHDaemon.available && FileManager.default.isExecutableFile(atPath: "/usr/bin/ssh"), "needs OpenSSH's sshd and ssh (apt: openssh-server, openssh-client)"))
    func realSSHHonoursHostCertificateDestinations() throws {
        let f = try SSHAgentTests.Fixture()
        let host = f.generate("ed25519", name: "ssh_host_ed25519_key"), ca = f.generate("ed25519", name: "host_ca")
        let user = f.generate("ed25519", name: "id_login")
        let signed = f.run("ssh-keygen", ["-q", "-s", ca, "-I", "testserver", "-n", "testserver", "-h", host + ".pub"])
        #expect(signed.status == 0, "ssh-keygen -s: \(signed)")
        let sshd = try SSHDaemon(authorizedKeys: [try String(contentsOfFile: user + ".pub", encoding: .utf8)], hostKey: host,
                                 hostCertificate: host + "-cert.pub")
        let caLine = try String(contentsOfFile: ca + ".pub", encoding: .utf8)
        let known = f.dir.file("known_hosts")
        try "@cert-authority testserver,elsewhere \(caLine)".write(toFile: known, atomically: true, encoding: .utf8)
        let fingerprint = f.fingerprint(user + ".pub")
        try sshd.writeClientConfig(f.dir.file("ssh_config"), knownHosts: known)
        func login(_ alias: String) -> CLIResult { f.run("ssh", ["-F", f.dir.file("ssh_config"), alias, "echo", "logged-in"]) }
        func records() -> [[String: Any]] { Self.signatures(f.agent).filter { $0["key"] as? String == fingerprint } }
        func readd(_ destination: String) {
            _ = f.run("ssh-add", ["-D"])
            let r = f.run("ssh-add", ["-H", known, "-h", destination, user])
            #expect(r.status == 0, "ssh-add -h \(destination): \(r)")
        }

        // The certificate names testserver: the key bound to testserver's CA logs in.
        readd("testserver")
        var r = login("testserver")
        #expect(r.status == 0 && r.stdout.contains("logged-in"), "\(r)\n\(f.agent.log)\n\(sshd.log)")
        #expect(records().last.map { $0["result"] as? Int == 0 && ($0["destination"] as? String)?.contains("testserver") == true } == true,
                "\(records())")

        // Restricted to "elsewhere", which the same CA vouches for: testserver's certificate does not
        // name it, so the key is not offered to testserver.
        readd("elsewhere")
        let before = records().count
        r = login("testserver")
        #expect(r.status != 0 && !r.stdout.contains("logged-in"), "logged in with a key restricted to elsewhere: \(r)")
        #expect(records().count == before, "a key hidden from this host was asked to sign: \(records())")
    }
}
