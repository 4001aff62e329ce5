import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Issue #41 L1: the ssh-agent protocol's LOCK and UNLOCK (`ssh-add -x`, `-X`) act on a lock every
/// app shares (the keychain's, or without a passcode the `ssh-add` keys'), and the socket is given to
/// callers for signing, Flatpak apps among them (`--socket=ssh-auth`). So only a caller that may
/// manage the whole keychain sends them (the service core decides); refusals, which a client can
/// repeat at will, are logged once per interval with a count. Real agent, real `ssh-add`, a real
/// bwrap sandbox with a `.flatpak-info`.
@Suite(.enabled(if: SSHTools.available, "needs OpenSSH's ssh-add and ssh-keygen in /usr/bin (apt: openssh-client)"))
struct SSHAgentLockGrantTests {
    /// The keychain's state as `coffer status` reports it (`locked`, `unlocked`, …).
    static func state(_ agent: AgentProcess) -> String {
        let out = agent.cli(["status"]).stdout
        return out.split(separator: "\n").first { $0.hasPrefix("state: ") }.map { String($0.dropFirst(7)) } ?? "(no state: \(out))"
    }

    /// `/usr/bin/ssh-add` in a sandbox as `flatpak run` makes one for app `org.example.App` given the
    /// ssh-agent socket (its directory bound in) and the fixture's directory (its askpass) read-only.
    static func sandboxedSSHAdd(_ f: SSHAgentTests.Fixture) throws -> [String] {
        let info = f.dir.file("flatpak-info")
        try "[Application]\nname=org.example.App\n".write(toFile: info, atomically: true, encoding: .utf8)
        let socketDir = URL(fileURLWithPath: f.sshSocket).deletingLastPathComponent().path
        return AccessGroupTests.flatpakWrapper(info: info, readOnly: [f.dir.path], writable: [socketDir]) + ["/usr/bin/ssh-add"]
    }

    /// The audit records of refused ssh-agent LOCKs and UNLOCKs, as "operation result app".
    static func refusals(_ agent: AgentProcess) -> [String] {
        auditRecords(agent).filter { $0["reason"] as? String == "ssh-agent" }.map {
            "\($0["operation"] as? String ?? "?") \($0["result"] as? Int ?? 0) \($0["app"] as? String ?? "unsigned")"
        }
    }

    /// The attack of the finding: a Flatpak app holding the ssh-agent socket locks the keychain for
    /// every app with `ssh-add -x`. Refused now, as is its `ssh-add -X` even with the right passcode
    /// (not tried: nothing counts toward the attempt schedule); the person's own ssh-add still does both.
    @Test(.enabled(if: AccessGroupTests.canRunBwrap, "needs a bwrap that can create namespaces here (apt: bubblewrap)"))
    func aSandboxedAppCannotLockOrUnlockTheKeychainThroughTheSSHAgentSocket() throws {
        let f = try SSHAgentTests.Fixture()
        f.agent.setPasscode()
        let sandboxed = try Self.sandboxedSSHAdd(f)
        // It is served as the app it is (the listing answers: the keychain has no keys for it).
        let listed = f.run("ssh-add", ["-l"], command: sandboxed)
        #expect(listed.status == 1 && listed.stdout.contains("no identities"), "\(listed)\n\(f.agent.log)")

        let t0 = Date()
        for _ in 0..<3 {
            let lock = f.run("ssh-add", ["-x"], passphrase: "some lock words", command: sandboxed)
            #expect(lock.status != 0, "\(lock)")
            #expect(Self.state(f.agent) == "unlocked", "a sandboxed app locked the keychain for every app:\n\(f.agent.log)")
        }
        #expect(f.agent.cli(["lock"]).status == 0)
        for _ in 0..<3 {
            let unlock = f.run("ssh-add", ["-X"], passphrase: AgentProcess.password, command: sandboxed)
            #expect(unlock.status != 0, "\(unlock)")
            #expect(Self.state(f.agent) == "locked", "a sandboxed app unlocked the keychain")
        }
        let took = Date().timeIntervalSince(t0)
        #expect(Self.refusals(f.agent) == Array(repeating: "lock -34018 org.example.App", count: 3)
                + Array(repeating: "unlock -34018 org.example.App", count: 3), "\(auditRecords(f.agent))")
        #expect(!auditRecords(f.agent).contains { $0["operation"] as? String == "unlock" && $0["reason"] == nil },
                "the passcode was tried for the sandboxed app")
        // Logged, at most once per log-repeat-interval (10 s) and kind.
        let lines = f.agent.log.split(separator: "\n").filter { $0.contains("ssh-agent: lock refused") || $0.contains("ssh-agent: unlock refused") }
        #expect(!lines.isEmpty && lines.count <= 2 * (1 + Int(took / 10) + 1), "\(lines)")
        #expect(lines.first?.contains("org.example.App") == true, "\(lines)")

        // The person's ssh-add, outside any sandbox (unsigned, and unsigned callers share a group): both.
        #expect(f.run("ssh-add", ["-X"], passphrase: AgentProcess.password).status == 0)
        #expect(Self.state(f.agent) == "unlocked")
        #expect(f.run("ssh-add", ["-x"], passphrase: "x").status == 0)
        #expect(Self.state(f.agent) == "locked")
    }

    /// Without a passcode, LOCK locks the `ssh-add` keys every client of the socket uses, with a
    /// passphrase the sandboxed app would choose: refused too, and so is its UNLOCK, even knowing the words.
    @Test(.enabled(if: AccessGroupTests.canRunBwrap, "needs a bwrap that can create namespaces here (apt: bubblewrap)"))
    func withoutAPasscodeASandboxedAppCannotLockTheSSHAddKeys() throws {
        let f = try SSHAgentTests.Fixture()
        let key = f.generate("ed25519", name: "id_shared")
        #expect(f.run("ssh-add", [key]).status == 0)
        let fingerprint = f.fingerprint(key + ".pub")
        let sandboxed = try Self.sandboxedSSHAdd(f)

        #expect(f.run("ssh-add", ["-x"], passphrase: "the app's words", command: sandboxed).status != 0)
        #expect(f.listed() == [fingerprint], "a sandboxed app locked every client's ssh-add keys")
        #expect(f.run("ssh-add", ["-x"], passphrase: "the person's words").status == 0)
        #expect(f.listed().isEmpty)
        #expect(f.run("ssh-add", ["-X"], passphrase: "the person's words", command: sandboxed).status != 0)
        #expect(f.listed().isEmpty, "a sandboxed app unlocked the agent")
        #expect(f.run("ssh-add", ["-X"], passphrase: "the person's words").status == 0)
        #expect(f.listed() == [fingerprint])
        #expect(Self.refusals(f.agent) == ["lock -34018 org.example.App", "unlock -34018 org.example.App"], "\(auditRecords(f.agent))")
    }

    /// "Any caller without a grant for it": a signed app other than the shell helper is refused, and
    /// under `unsigned-callers = deny` so is an unsigned ssh-add; the shell helper (a copy of ssh-add
    /// signed as `coffer.shell` here) may, under either policy.
    @Test func onlyACallerThatMayManageTheKeychainLocksThroughTheSSHAgentSocket() throws {
        let apps = try SignedApps()
        let appSSHAdd = try apps.app("ssh-app", appID: "com.example.ssh", groups: ["ssh"], source: "/usr/bin/ssh-add")
        let shellSSHAdd = try apps.app("ssh-shell", appID: "coffer.shell", groups: ["shell", "unsigned"], source: "/usr/bin/ssh-add")

        let f = SSHAgentTests.Fixture(agent: try apps.startAgent())
        f.agent.setPasscode()
        #expect(f.run("ssh-add", ["-x"], passphrase: "w", command: [appSSHAdd]).status != 0)
        #expect(Self.state(f.agent) == "unlocked", "a signed app locked the keychain for every app")
        #expect(f.run("ssh-add", ["-x"], passphrase: "w").status == 0, "the unsigned ssh-add may, while unsigned callers share a group")
        #expect(Self.state(f.agent) == "locked")
        #expect(f.run("ssh-add", ["-X"], passphrase: AgentProcess.password, command: [appSSHAdd]).status != 0)
        #expect(Self.state(f.agent) == "locked", "a signed app unlocked the keychain")
        #expect(f.run("ssh-add", ["-X"], passphrase: AgentProcess.password, command: [shellSSHAdd]).status == 0)
        #expect(Self.state(f.agent) == "unlocked")
        #expect(Self.refusals(f.agent) == ["lock -34018 com.example.ssh", "unlock -34018 com.example.ssh"], "\(auditRecords(f.agent))")
        f.agent.stop()

        let denying = SSHAgentTests.Fixture(agent: try apps.startAgent(["unsigned-callers = deny"]))
        denying.agent.setPasscode()
        let refused = denying.run("ssh-add", ["-x"], passphrase: "w")
        #expect(refused.status != 0, "\(refused)")
        #expect(Self.state(denying.agent) == "unlocked", "an unsigned caller locked the keychain under unsigned-callers = deny")
        #expect(denying.run("ssh-add", ["-x"], passphrase: "w", command: [shellSSHAdd]).status == 0)
        #expect(Self.state(denying.agent) == "locked")
        #expect(denying.run("ssh-add", ["-X"], passphrase: AgentProcess.password).status != 0)
        #expect(Self.state(denying.agent) == "locked")
        #expect(denying.run("ssh-add", ["-X"], passphrase: AgentProcess.password, command: [shellSSHAdd]).status == 0)
        #expect(Self.state(denying.agent) == "unlocked")
        #expect(denying.agent.log.contains("ssh-agent: lock refused: only the shell helper (app coffer.shell) may lock"), "\(denying.agent.log)")
    }

    /// A refused UNLOCK is one log line per `log-repeat-interval` (2 s here) with the count of those left
    /// out, however fast they come: many `ssh-add -X` the attempt schedule refuses at once (two wrong
    /// passcodes, then ten minutes' wait). No sleep: refusals go on until one line reports a count,
    /// and the bounds are computed from the time the run took, so a slow machine only adds lines.
    @Test func refusedUnlocksAreLoggedOncePerIntervalWithACount() throws {
        let conf = TemporaryDirectory("coffer-sshlog")
        let interval = 2.0
        try "unlock-delays = 0,600\nlog-repeat-interval = \(Int(interval))\n".write(toFile: conf.file("cofferd.conf"), atomically: true, encoding: .utf8)
        let f = try SSHAgentTests.Fixture(extraArguments: ["--config", conf.file("cofferd.conf")])
        f.agent.setPasscode()
        #expect(f.agent.cli(["lock"]).status == 0)
        func lines() -> [String] { f.agent.log.split(separator: "\n").map(String.init).filter { $0.contains("ssh-agent: keychain unlock refused") } }
        func suppressed(_ line: String) -> Int {
            guard let r = line.range(of: "suppressed=") else { return 0 }
            return Int(line[r.upperBound...].prefix { $0.isNumber }) ?? 0
        }

        let t0 = Date()
        var sent = 0, counted = false
        // At least 40 refusals, until the last one's line reports a count; 90 s or 2,000 refusals are failure bounds.
        while !counted && sent < 2000 && Date().timeIntervalSince(t0) < 90 {
            let before = lines().count
            let r = f.run("ssh-add", ["-X"], passphrase: sent < 2 ? "wrong passcode \(sent)" : AgentProcess.password)
            #expect(r.status != 0, "an UNLOCK the attempt schedule should refuse was served: \(r)")
            sent += 1
            let now = lines()
            counted = sent >= 40 && now.count > before && suppressed(now.last ?? "") > 0
        }
        let took = Date().timeIntervalSince(t0)
        let all = lines()
        #expect(counted, "no line with a count after \(sent) refused UNLOCKs in \(took) s (\(all.count) lines)")
        #expect(all.count <= 2 + Int(took / interval), "\(all.count) lines for \(sent) refused UNLOCKs in \(took) s")
        #expect(all.count + all.map(suppressed).reduce(0, +) == sent, "a refusal neither logged nor counted: \(all)")
        #expect(Self.state(f.agent) == "locked")
        #expect(!f.agent.log.contains(AgentProcess.password) && !f.agent.log.contains("wrong passcode"), "a passcode reached the log")
    }
}
