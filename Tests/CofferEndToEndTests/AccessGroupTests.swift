import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Access groups as a boundary, end to end (issue #13): the real `cofferd` identifies each
/// connection's process, signed "apps" (copies of `coffer-cli` with their own SHA-256, signed by
/// `coffer manifest sign`, trusted through the agent's config file) run as separate processes, and
/// every refusal is checked for its status, its log line and its audit record.
@Suite struct AccessGroupTests {
    static let canRunBwrap: Bool = {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/bwrap") else { return false }
        return runProgram("/usr/bin/bwrap", ["--ro-bind", "/", "/", "/bin/true"]).status == 0
    }()
    static let hasStrace = FileManager.default.isExecutableFile(atPath: "/usr/bin/strace")

    /// The test's own `coffer-cli`, which no manifest names.
    static var unsignedCLI: String { Binaries.directory + "/coffer-cli" }

    // MARK: 1. Two apps, a shared group, an unsigned caller

    @Test func appsSeeOnlyTheirOwnGroupsAndTheSharedOne() throws {
        let apps = try SignedApps()
        let aPath = try apps.app("appA", appID: "com.example.a", groups: ["a", "shared"])
        let bPath = try apps.app("appB", appID: "com.example.b", groups: ["b", "shared"])
        let agent = try apps.startAgent()
        let a = AppClient(executable: aPath, agent: agent), b = AppClient(executable: bPath, agent: agent)
        let u = AppClient(executable: Self.unsignedCLI, agent: agent)
        agent.setPasscode()

        // Who each one is.
        let wa = try a.whoami(), wb = try b.whoami(), wu = try u.whoami()
        #expect(wa.kind == "signed manifest" && wa.app == "com.example.a" && wa.groups == ["a", "shared"] && !wa.mayAuthorize, "\(wa)")
        #expect(wb.kind == "signed manifest" && wb.app == "com.example.b" && wb.groups == ["b", "shared"] && !wb.mayAuthorize, "\(wb)")
        #expect(wa.executable == a.executable && wb.executable == b.executable)
        #expect(wu.kind == "unsigned" && wu.app == nil && wu.groups == ["unsigned"] && wu.note.contains("no trusted manifest"), "\(wu)")

        // A adds an item (to its default group, a).
        var r = a.add("mail", "me", secret: "secret-of-a")
        #expect(r.status == 0, "\(r)\n\(agent.log)")
        r = a.get("mail", "me")
        #expect(r.status == 0 && r.stdout == "secret-of-a", "\(r)")
        r = a.find("mail")
        #expect(r.status == 0 && r.stdout.contains("\"agrp\":\"a\""), "\(r)")

        // B cannot find, read, update or delete it: not found, not a refusal that admits it exists.
        for (what, res) in [("get", b.get("mail", "me")), ("find", b.find("mail")),
                            ("update", b.update("mail", "me", secret: "overwritten-by-b")), ("delete", b.delete("mail", "me"))] {
            #expect(res.status == Exit.notFound && res.stderr.contains("errSecItemNotFound") && !res.stdout.contains("secret-of-a"),
                    "B \(what): \(res)")
        }
        // Naming A's group is a refusal (errSecMissingEntitlement), whatever the operation.
        r = b.add("mail", "other", secret: "x", group: "a")
        #expect(r.status == Exit.missingEntitlement && r.stderr.contains("errSecMissingEntitlement (-34018)"), "B add in a: \(r)")
        for (what, res) in [("get", b.get("mail", "me", group: "a")), ("find", b.find("mail", group: "a")),
                            ("update", b.update("mail", "me", secret: "x", group: "a")), ("delete", b.delete("mail", "me", group: "a"))] {
            #expect(res.status == Exit.missingEntitlement && res.stderr.contains("errSecMissingEntitlement (-34018)"), "B \(what) in a: \(res)")
        }
        // A duplicate-probing add succeeds: the duplicate check sees only B's groups.
        r = b.add("mail", "me", secret: "secret-of-b")
        #expect(r.status == 0, "B's add of the same service/account must not leak errSecDuplicateItem: \(r)")
        #expect(b.add("mail", "me", secret: "again").status == Exit.duplicate, "a duplicate in B's own group is one")
        #expect(b.get("mail", "me").stdout == "secret-of-b")
        #expect(a.get("mail", "me").stdout == "secret-of-a", "A's item untouched by B's update, delete and add")
        r = b.find("mail")
        #expect(r.status == 0 && r.stdout.contains("\"agrp\":\"b\"") && !r.stdout.contains("\"agrp\":\"a\""), "\(r)")
        // And the other way round.
        #expect(a.add("mail", "me", secret: "x", group: "b").status == Exit.missingEntitlement)
        #expect(a.get("mail", "me", group: "b").status == Exit.missingEntitlement)
        #expect(b.delete("mail", "me").status == 0)
        #expect(a.get("mail", "me").stdout == "secret-of-a", "B's delete took only its own item")

        // The shared group: both read and write it.
        #expect(a.add("team", "ci", secret: "shared-token", group: "shared").status == 0)
        r = b.get("team", "ci")
        #expect(r.status == 0 && r.stdout == "shared-token", "B reads the shared item without naming the group: \(r)")
        #expect(b.get("team", "ci", group: "shared").stdout == "shared-token")
        #expect(b.update("team", "ci", secret: "rotated-by-b", group: "shared").status == 0)
        #expect(a.get("team", "ci", group: "shared").stdout == "rotated-by-b")

        // The unsigned caller sees none of a, b, shared; it has the group `unsigned`.
        for (what, res) in [("get mail", u.get("mail", "me")), ("get team", u.get("team", "ci")), ("find mail", u.find("mail")),
                            ("find team", u.find("team")), ("delete team", u.delete("team", "ci"))] {
            #expect(res.status == Exit.notFound, "unsigned \(what): \(res)")
        }
        for g in ["a", "b", "shared"] {
            #expect(u.add("team", "ci", secret: "x", group: g).status == Exit.missingEntitlement, "unsigned adding to \(g)")
            #expect(u.get("team", "ci", group: g).status == Exit.missingEntitlement, "unsigned naming \(g)")
        }
        #expect(u.add("mail", "me", secret: "secret-of-nobody").status == 0)
        r = u.find("mail")
        #expect(r.status == 0 && r.stdout.contains("\"agrp\":\"unsigned\""), "\(r)")
        #expect(a.get("mail", "me").stdout == "secret-of-a" && b.get("mail", "me").status == Exit.notFound,
                "signed apps never see the unsigned group")
        // The fast path `coffer` (also unsigned) agrees.
        #expect(agent.cli(["get", "--service", "mail", "--account", "me"]).stdout == "secret-of-nobody")

        // Every refusal was audited with the group named and the app.
        let denied = auditRecords(agent).filter { ($0["result"] as? Int) == -34018 && ($0["app"] as? String) == "com.example.b" }
        #expect(denied.contains { ($0["operation"] as? String) == "add" } && denied.allSatisfy { ($0["accessGroup"] as? String) == "a" }, "\(denied)")
        #expect(Set(denied.compactMap { $0["operation"] as? String }) == ["get", "find", "update", "delete", "add"], "\(denied)")
    }

    // MARK: 2. unsigned-callers = deny

    @Test func denyRefusesUnsignedCallersEverything() throws {
        let apps = try SignedApps()
        let aPath = try apps.app("appA", appID: "com.example.a", groups: ["a"])
        let agent = try apps.startAgent(["unsigned-callers = deny"])
        let a = AppClient(executable: aPath, agent: agent)
        let u = AppClient(executable: Self.unsignedCLI, agent: agent)
        agent.setPasscode()

        for (what, res) in [("add", u.add("svc", "me", secret: "x")), ("get", u.get("svc", "me")), ("find", u.find("svc")),
                            ("add in unsigned", u.add("svc", "me", secret: "x", group: "unsigned")),
                            ("update", u.update("svc", "me", secret: "y")), ("delete", u.delete("svc", "me"))] {
            #expect(res.status == Exit.missingEntitlement && res.stderr.contains("-34018"), "unsigned \(what): \(res)")
        }
        let w = try u.whoami()
        #expect(w.kind == "unsigned" && w.groups.isEmpty && !w.note.isEmpty, "\(w)")
        #expect(u.run(["whoami"]).stdout.contains("access groups: none"))

        // A signed app still works, and its item stays out of the unsigned caller's reach.
        #expect(a.add("svc", "me", secret: "secret-of-a").status == 0)
        #expect(a.get("svc", "me").stdout == "secret-of-a")
        #expect(u.get("svc", "me").status == Exit.missingEntitlement)
        #expect(auditRecords(agent).contains { ($0["operation"] as? String) == "add" && ($0["result"] as? Int) == -34018 && $0["app"] is NSNull })
    }

    // MARK: 3. Bad cases: untrusted signer, changed binary, world-writable manifest, replaced executable

    @Test func badManifestsAndChangedExecutablesGiveNoIdentity() throws {
        let apps = try SignedApps()
        let aPath = try apps.app("appA", appID: "com.example.a", groups: ["a"])
        try apps.app("stranger", appID: "com.example.stranger", groups: ["a"], key: "stranger")
        let changedPath = try apps.app("changed", appID: "com.example.changed", groups: ["a"])
        let handle = try #require(FileHandle(forWritingAtPath: changedPath))
        handle.seekToEndOfFile()
        handle.write(Data("patched after signing".utf8))
        try handle.close()
        try apps.app("open", appID: "com.example.open", groups: ["a"])
        #expect(chmod(apps.manifestPath("open"), 0o666) == 0)

        let agent = try apps.startAgent()
        agent.setPasscode()
        let a = AppClient(executable: aPath, agent: agent)
        #expect(try a.whoami().groups == ["a"])
        #expect(a.add("bank", "me", secret: "secret-of-a").status == 0)

        // Signed by a key the agent does not trust: the manifest is refused at load, the app is unsigned.
        #expect(agent.log.contains("trust: refused \(apps.manifestPath("stranger")): manifest signed by a key that is not trusted"), "\(agent.log)")
        let stranger = AppClient(executable: apps.executable("stranger"), agent: agent)
        var w = try stranger.whoami()
        #expect(w.kind == "unsigned" && w.app == nil && w.groups == ["unsigned"], "\(w)")
        #expect(stranger.get("bank", "me").status == Exit.notFound && stranger.add("x", "me", secret: "x", group: "a").status == Exit.missingEntitlement)
        #expect(stranger.get("bank", "me", group: "a").status == Exit.missingEntitlement)

        // A world-writable manifest: refused at load with the reason.
        #expect(agent.log.contains("trust: refused \(apps.manifestPath("open")): file is world-writable (mode 0666)"), "\(agent.log)")
        let open = AppClient(executable: apps.executable("open"), agent: agent)
        w = try open.whoami()
        #expect(w.kind == "unsigned" && w.groups == ["unsigned"], "\(w)")
        #expect(open.get("bank", "me").status == Exit.notFound && open.add("x", "me", secret: "x", group: "a").status == Exit.missingEntitlement)
        #expect(open.get("bank", "me", group: "a").status == Exit.missingEntitlement)

        // The binary changed after signing: unsigned, the note and the log say why.
        let changed = AppClient(executable: changedPath, agent: agent)
        w = try changed.whoami()
        #expect(w.kind == "unsigned" && w.groups == ["unsigned"] && w.note.contains("SHA-256"), "\(w)")
        #expect(changed.get("bank", "me").status == Exit.notFound && changed.add("x", "me", secret: "x", group: "a").status == Exit.missingEntitlement)
        #expect(changed.get("bank", "me", group: "a").status == Exit.missingEntitlement)
        #expect(waitForLogLine(agent, ["warning", changedPath, "caller gets no signed identity: the executable's SHA-256"]), "\(agent.log)")

        // Replacing A's executable on disk (an update by rename) revokes A's access to its items.
        try apps.install("appA", tag: "version 2")
        w = try a.whoami()
        #expect(w.kind == "unsigned" && w.note.contains("SHA-256"), "\(w)")
        var r = a.get("bank", "me")
        #expect(r.status == Exit.notFound && !r.stdout.contains("secret-of-a"), "\(r)")
        #expect(a.add("x", "me", secret: "x", group: "a").status == Exit.missingEntitlement)
        #expect(a.get("bank", "me", group: "a").status == Exit.missingEntitlement)
        #expect(waitForLogLine(agent, ["warning", aPath, "caller gets no signed identity: the executable's SHA-256"]), "\(agent.log)")

        // Re-signing it and SIGHUP restore it, without restarting the agent.
        try apps.sign("appA", appID: "com.example.a", groups: ["a"])
        let before = agent.log.utf8.count
        let pid = agent.pid
        #expect(kill(pid, SIGHUP) == 0)
        #expect(waitForLog(agent, "trust roots reloaded", after: before), "\(agent.log)")
        #expect(agent.pid == pid && agent.process?.isRunning == true)
        r = a.get("bank", "me")
        #expect(r.status == 0 && r.stdout == "secret-of-a", "\(r)\n\(agent.log)")
        #expect(try a.whoami().app == "com.example.a")
        // The reload still refuses the bad files, and says so again.
        let reloadLog = String(decoding: Array(agent.log.utf8)[before...], as: UTF8.self)
        #expect(reloadLog.contains("trust: refused \(apps.manifestPath("open"))") && reloadLog.contains("trust: refused \(apps.manifestPath("stranger"))"))
    }

    /// Issue #24 (SIGHUP): reloads racing identifications. The app's manifest alternates between two
    /// whole sets (app `com.example.one` with group `one`, `com.example.two` with group `two`; each file
    /// replaced by rename, so the disk always holds one set) while SIGHUP reloads them and clients
    /// identify all the while: every answer is one whole set's identity, never an unsigned caller (a
    /// store caught empty or half-loaded) nor a mix.
    @Test func reloadsRacingConnectionsJudgeEachAgainstOneWholeSet() throws {
        let apps = try SignedApps()
        let path = try apps.app("app", appID: "com.example.one", groups: ["one"])
        let setOne = apps.file("set-one"), setTwo = apps.file("set-two")
        #expect(rename(apps.manifestPath("app"), setOne) == 0)
        try apps.sign("app", appID: "com.example.two", groups: ["two"])
        #expect(rename(apps.manifestPath("app"), setTwo) == 0)
        func install(_ set: String) throws {
            let staged = apps.manifestsDir + "/app.staged"
            try? FileManager.default.removeItem(atPath: staged)
            try FileManager.default.copyItem(atPath: set, toPath: staged)
            guard rename(staged, apps.manifestPath("app")) == 0 else { throw SignedApps.Failure("rename: errno \(errno)") }
        }
        try install(setOne)
        let agent = try apps.startAgent()
        let client = AppClient(executable: path, agent: agent)
        #expect(try client.whoami().app == "com.example.one")

        let answers = Protected([String]())
        let done = Protected(false)
        let group = DispatchGroup()
        let socket = agent.socketPath
        for _ in 0..<3 {
            DispatchQueue.global().async(group: group) {
                while !done.withLock({ $0 }) {
                    let r = runProgram(path, ["whoami", "--json", "--socket", socket])
                    var answer = "status \(r.status): \(r.stderr)"
                    if r.status == 0, let o = try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any] {
                        answer = "\(o["app"] as? String ?? "-") \((o["accessGroups"] as? [String] ?? []).joined(separator: ","))"
                    }
                    answers.withLock { $0.append(answer) }
                }
            }
        }
        for i in 0..<20 {
            try install(i % 2 == 0 ? setTwo : setOne)
            let before = agent.log.utf8.count
            #expect(kill(agent.pid, SIGHUP) == 0)
            #expect(waitForLog(agent, "trust roots reloaded", after: before), "\(agent.log)")
        }
        done.withLock { $0 = true }
        group.wait()
        let all = answers.withLock { $0 }
        let wrong = all.filter { $0 != "com.example.one one" && $0 != "com.example.two two" }
        #expect(!all.isEmpty && wrong.isEmpty, "\(wrong.count) of \(all.count) answers belong to no whole set: \(wrong.prefix(5))")
        // And the last reload's set is the one in force.
        try install(setTwo)
        let before = agent.log.utf8.count
        #expect(kill(agent.pid, SIGHUP) == 0)
        #expect(waitForLog(agent, "trust roots reloaded", after: before))
        let last = try client.whoami()
        #expect(last.app == "com.example.two" && last.groups == ["two"], "\(last)")
    }

    // MARK: 4. A traced client

    @Test(.enabled(if: hasStrace, "strace is not installed (apt: strace)"))
    func aTracedClientIsUnsigned() throws {
        let apps = try SignedApps()
        let aPath = try apps.app("appA", appID: "com.example.a", groups: ["a"])
        let agent = try apps.startAgent()
        agent.setPasscode()
        let a = AppClient(executable: aPath, agent: agent)
        #expect(a.add("bank", "me", secret: "secret-of-a").status == 0)
        // LeakSanitizer cannot run under ptrace (a sanitizer build's app would fail at exit): off for this run.
        let traced = AppClient(executable: aPath, agent: agent,
                               wrapper: ["/usr/bin/env", "ASAN_OPTIONS=detect_leaks=0", "/usr/bin/strace", "-f", "-o", "/dev/null"])
        let w = try traced.whoami()
        #expect(w.kind == "unsigned" && w.app == nil && w.groups == ["unsigned"] && w.note.contains("traced"), "\(w)")
        #expect(traced.get("bank", "me").status == Exit.notFound)
        #expect(traced.add("x", "me", secret: "x", group: "a").status == Exit.missingEntitlement)
        #expect(traced.get("bank", "me", group: "a").status == Exit.missingEntitlement)
        #expect(waitForLogLine(agent, ["warning", aPath, "caller gets no signed identity: process is traced"]), "\(agent.log)")
        // Untraced, the same executable is A again.
        #expect(a.get("bank", "me").stdout == "secret-of-a")
    }

    // MARK: 5. Flatpak under bwrap

    /// `executable` run in a bwrap sandbox as `flatpak run` would make one: a runtime (the host's
    /// /usr, /etc and /opt read-only: a sanitizer build's coffer-cli is dynamic and needs its libraries,
    /// as a Flatpak app needs its runtime), the app's directory, the socket's directory, and `info` as
    /// `.flatpak-info` at the sandbox's root.
    static func sandboxed(_ executable: String, agent: AgentProcess, info: String) -> AppClient {
        let runDir = URL(fileURLWithPath: agent.socketPath).deletingLastPathComponent().path
        let appDir = URL(fileURLWithPath: executable).deletingLastPathComponent().path
        return AppClient(executable: executable, agent: agent, wrapper: flatpakWrapper(info: info, readOnly: [appDir], writable: [runDir]))
    }

    /// The `bwrap` command line (to put before a program and its arguments) of a sandbox as `flatpak
    /// run` makes one: the host's /usr, /etc and /opt read-only as the runtime, the directories
    /// `readOnly` and `writable` (an app's, a socket's), and `info` as `.flatpak-info` at its root.
    static func flatpakWrapper(info: String, readOnly: [String] = [], writable: [String] = []) -> [String] {
        var runtime: [String] = []
        for top in ["usr", "etc", "opt"] where FileManager.default.fileExists(atPath: "/" + top) { runtime += ["--ro-bind", "/" + top, "/" + top] }
        for link in ["bin", "lib", "lib64", "sbin"] {
            if let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/" + link) {
                runtime += ["--symlink", target, "/" + link]
            } else if FileManager.default.fileExists(atPath: "/" + link) {
                runtime += ["--ro-bind", "/" + link, "/" + link]
            }
        }
        return ["/usr/bin/bwrap"] + runtime + readOnly.flatMap { ["--ro-bind", $0, $0] } + writable.flatMap { ["--bind", $0, $0] }
            + ["--ro-bind", info, "/.flatpak-info", "--proc", "/proc", "--dev", "/dev", "--unshare-ipc"]
    }

    /// Issue #24 (3): under `unsigned-callers = deny`, unconfined code that runs itself in its own
    /// bwrap with a made-up `.flatpak-info` gets nothing either — unless `flatpak-callers = allow`.
    @Test(.enabled(if: canRunBwrap, "needs a bwrap that can create namespaces here (apt: bubblewrap)"))
    func denyAlsoDeniesAForgedSandboxUnlessFlatpakCallersAreAllowed() throws {
        let apps = try SignedApps()
        let info = apps.file("forged-info")
        try "[Application]\nname=org.example.Forged\n".write(toFile: info, atomically: true, encoding: .utf8)
        // The unsigned test CLI, copied where bwrap can bind it: what any process of the user can do.
        let forger = try apps.install("forger")
        let agent = try apps.startAgent(["unsigned-callers = deny"])
        agent.setPasscode()
        let forged = Self.sandboxed(forger, agent: agent, info: info)
        let w = try forged.whoami()
        #expect(w.kind == "flatpak sandbox" && w.app == "org.example.Forged" && w.groups.isEmpty && w.note.contains("flatpak-callers"), "\(w)")
        for (what, r) in [("add", forged.add("loot", "me", secret: "x")), ("get", forged.get("loot", "me")), ("find", forged.find("loot"))] {
            #expect(r.status == Exit.missingEntitlement && r.stderr.contains("-34018"), "forged sandbox \(what): \(r)")
        }
        #expect(AppClient(executable: forger, agent: agent).add("loot", "me", secret: "x").status == Exit.missingEntitlement)
        agent.stop()

        // The user may choose to accept sandbox identities under deny (knowing they can be forged).
        let allowing = try apps.startAgent(["unsigned-callers = deny", "flatpak-callers = allow"])
        allowing.setPasscode()
        let sandbox = Self.sandboxed(forger, agent: allowing, info: info)
        #expect(sandbox.add("chat", "me", secret: "s").status == 0)
        #expect(sandbox.get("chat", "me").stdout == "s")
        #expect(AppClient(executable: forger, agent: allowing).get("chat", "me").status == Exit.missingEntitlement, "outside: still unsigned")
        allowing.stop()

        // And under the default (unsigned callers share a group) one may deny them explicitly.
        let denying = try apps.startAgent(["flatpak-callers = deny"])
        denying.setPasscode()
        #expect(Self.sandboxed(forger, agent: denying, info: info).add("chat", "me", secret: "s").status == Exit.missingEntitlement)
        #expect(AppClient(executable: forger, agent: denying).add("plain", "me", secret: "s").status == 0)
    }

    @Test(.enabled(if: canRunBwrap, "needs a bwrap that can create namespaces here (apt: bubblewrap)"))
    func aFlatpakClientGetsItsOwnGroup() throws {
        let apps = try SignedApps()
        let aPath = try apps.app("appA", appID: "com.example.a", groups: ["a"])
        let flat = try apps.install("flat")
        let info = apps.file("flatpak-info")
        try "[Application]\nname=org.example.App\n".write(toFile: info, atomically: true, encoding: .utf8)
        let agent = try apps.startAgent()
        agent.setPasscode()
        let sandboxed = Self.sandboxed(flat, agent: agent, info: info)
        let w = try sandboxed.whoami()
        #expect(w.kind == "flatpak sandbox" && w.app == "org.example.App" && w.groups == ["flatpak:org.example.App"], "\(w)\n\(agent.log)")
        var r = sandboxed.add("chat", "me", secret: "secret-of-flatpak")
        #expect(r.status == 0, "\(r)")
        r = sandboxed.get("chat", "me")
        #expect(r.status == 0 && r.stdout == "secret-of-flatpak", "\(r)")
        #expect(sandboxed.find("chat").stdout.contains("\"agrp\":\"flatpak:org.example.App\""))
        #expect(sandboxed.add("x", "me", secret: "x", group: "a").status == Exit.missingEntitlement)
        #expect(sandboxed.get("chat", "me", group: "a").status == Exit.missingEntitlement)

        // Knowing the passcode does not let it (nor the signed app A) act on the whole keychain.
        for (who, c) in [("flatpak", sandboxed), ("app A", AppClient(executable: aPath, agent: agent))] {
            r = c.run(["escrow", "create", "--auth-passcode-fd", "0"], stdin: AgentProcess.password)
            #expect(r.status == Exit.missingEntitlement && r.stderr.contains("only the shell helper"), "\(who) escrow: \(r)")
            r = c.run(["passcode", "remove", "--passcode-stdin"], stdin: AgentProcess.password)
            #expect(r.status == Exit.missingEntitlement, "\(who) passcode remove: \(r)")
        }
        #expect(agent.cli(["status"]).stdout.contains("passcode: set"), "the passcode was removed")
        // Nor may it try the passcode: a confined app's wrong tries would throttle the person's unlock
        // (or, with erase-after, erase the keychain), and it cannot touch the state directory otherwise.
        #expect(agent.cli(["lock"]).status == 0)
        for _ in 0..<5 {
            r = sandboxed.run(["unlock", "--passcode-stdin"], stdin: "wrong guess")
            #expect(r.status == Exit.missingEntitlement && r.stderr.contains("sandboxed app"), "\(r)")
        }
        r = agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password)
        #expect(r.status == 0, "the sandbox's tries did not count, so nothing waits: \(r)")

        // Outside: the same binary unsigned, the signed app A, and the test's CLI see nothing.
        for (who, exe) in [("same binary outside", flat), ("app A", aPath), ("unsigned", Self.unsignedCLI)] {
            let c = AppClient(executable: exe, agent: agent)
            #expect(c.get("chat", "me").status == Exit.notFound, "\(who)")
            #expect(c.find("chat").status == Exit.notFound, "\(who)")
            #expect(c.add("x", "me", secret: "x", group: "flatpak:org.example.App").status == Exit.missingEntitlement, "\(who)")
            #expect(c.get("chat", "me", group: "flatpak:org.example.App").status == Exit.missingEntitlement, "\(who)")
        }
    }

    // MARK: 6. The shell helper authorizes on a terminal, audited

    @Test(.enabled(if: TerminalRun.available, "util-linux script and setsid are not installed"))
    func theShellAppReadsAnotherGroupOnlyAfterTheUserAuthenticatesOnATerminal() throws {
        let apps = try SignedApps()
        let aPath = try apps.app("appA", appID: "com.example.a", groups: ["a"])
        let bPath = try apps.app("appB", appID: "com.example.b", groups: ["b"])
        let shellPath = try apps.app("shell", appID: "coffer.shell", groups: ["shell", "unsigned"])
        let agent = try apps.startAgent()
        agent.setPasscode()
        let a = AppClient(executable: aPath, agent: agent)
        #expect(a.add("vault", "me", secret: "secret-of-a").status == 0)
        let shell = AppClient(executable: shellPath, agent: agent)
        let w = try shell.whoami()
        #expect(w.app == "coffer.shell" && w.groups == ["shell", "unsigned"] && w.mayAuthorize, "\(w)")
        let getA = ["get", "--socket", agent.socketPath, "--access-group", "a", "--service", "vault", "--account", "me"]
        func records(_ op: String, app: String, result: Int) -> Int {
            auditRecords(agent).filter {
                ($0["operation"] as? String) == op && ($0["accessGroup"] as? String) == "a" && ($0["app"] as? String) == app
                    && ($0["result"] as? Int) == result
            }.count
        }

        // No terminal (stdin piped, a new session without a controlling terminal): refused, audited.
        var r = runProgram("/usr/bin/setsid", ["-w", shellPath] + getA, stdin: AgentProcess.password + "\n")
        #expect(r.stdout.isEmpty && records("authorize", app: "coffer.shell", result: 0) == 0, "\(r)")
        #expect(r.status == Exit.missingEntitlement && r.stderr.contains("-34018"), "\(r)")
        // The line after the error says which command authorizes the group.
        #expect(r.stderr.contains("\ncoffer: hint: run the same command on a terminal: coffer asks for your passcode there and authorizes 'a' for that one command"), "\(r)")
        #expect(records("get", app: "coffer.shell", result: -34018) == 1, "\(auditRecords(agent))")

        // A or B cannot authorize, even on a terminal: no prompt, the refusal stands.
        for (exe, other) in [(bPath, "a"), (aPath, "b")] {
            let t = TerminalRun.run([exe, "get", "--socket", agent.socketPath, "--access-group", other, "--service", "vault", "--account", "me"],
                                    typing: AgentProcess.password)
            #expect(!t.prompted && !t.output.contains("secret-of-a"), "\(exe): \(t)")
            #expect(t.status == Exit.missingEntitlement, "\(exe): \(t)")
            #expect(t.output.contains("coffer: hint: '\(other)' is another app's group, which this caller may never be authorized for"), "\(exe): \(t)")
        }
        #expect(!auditRecords(agent).contains { ($0["operation"] as? String) == "authorize" })

        // Ctrl-C at the prompt ends the command and gives the terminal its echo back (the shell
        // around it traps the interrupt and then shows the terminal's settings).
        let interrupted = TerminalRun.run(["/bin/sh", "-c", "trap 'echo interrupted' INT; \"$@\"; stty -a", "sh", shellPath] + getA,
                                          typing: "\u{03}")
        #expect(interrupted.prompted && interrupted.output.contains("interrupted"), "\(interrupted)")
        #expect(interrupted.output.contains(" echo ") && !interrupted.output.contains(" -echo "), "echo is back on: \(interrupted)")
        #expect(!interrupted.output.contains("secret-of-a"))

        // A wrong passcode: errSecAuthFailed, no secret.
        var t = TerminalRun.run([shellPath] + getA, typing: "wrong horse")
        #expect(t.prompted && t.status == Exit.authFailed && t.output.contains("errSecAuthFailed"), "\(t)")
        #expect(!t.output.contains("secret-of-a") && !t.output.contains("wrong horse"))
        #expect(records("authorize", app: "coffer.shell", result: -25293) == 1, "\(auditRecords(agent))")
        #expect(records("get", app: "coffer.shell", result: 0) == 0)

        // The right passcode on the terminal: the secret, an authorize record and a get record for group a.
        t = TerminalRun.run([shellPath] + getA, typing: AgentProcess.password)
        #expect(t.prompted && t.status == 0 && t.output.contains("secret-of-a"), "\(t)\n\(agent.log)")
        #expect(!t.output.contains(AgentProcess.password), "the passcode is never echoed")
        #expect(records("authorize", app: "coffer.shell", result: 0) == 1, "\(auditRecords(agent))")
        #expect(records("get", app: "coffer.shell", result: 0) == 1, "\(auditRecords(agent))")
        #expect(!((try? String(contentsOfFile: agent.stateDir + "/audit.log", encoding: .utf8)) ?? "").contains("secret-of-a"))

        // The authorization lasted one command: the next one without a terminal gets nothing.
        r = runProgram("/usr/bin/setsid", ["-w", shellPath] + getA)
        #expect(r.status != 0 && r.stdout.isEmpty, "\(r)")
    }

    /// Issue #24 (2): with `authorization-reuse`, a grant covers the terminal session that got it and
    /// ends when that session's leader exits — a process left behind in the session (or one that gets
    /// the old session id again) reads nothing more without a prompt. The session here: util-linux
    /// script's shell on a pseudo-terminal, which authorizes on the terminal; a member of the same
    /// session that ignores SIGHUP runs the CLI once while the leader lives and once after it exited.
    @Test(.enabled(if: TerminalRun.available, "util-linux script and setsid are not installed"))
    func aReusedAuthorizationEndsWithItsTerminalSession() throws {
        let apps = try SignedApps()
        let aPath = try apps.app("appA", appID: "com.example.a", groups: ["a"])
        let shellPath = try apps.app("shell", appID: "coffer.shell", groups: ["shell", "unsigned"])
        let agent = try apps.startAgent(["authorization-reuse = 300"])
        agent.setPasscode()
        #expect(AppClient(executable: aPath, agent: agent).add("vault", "me", secret: "secret-of-a").status == 0)
        let getA = ["get", "--socket", agent.socketPath, "--access-group", "a", "--service", "vault", "--account", "me"]
        let d = apps.file("session")
        mkdir(d, 0o700)
        // The member waits for the leader's command, runs its own, then waits until the session's
        // leader (pid = session id, field 6 of its stat) is gone and runs it again.
        try """
            trap '' HUP
            d="$1"; shift
            sid=$(cut -d ' ' -f 6 /proc/$$/stat)
            until [ -e "$d/go" ]; do sleep 0.05; done
            "$@" > "$d/first" 2>&1; echo $? > "$d/first.tmp"; mv "$d/first.tmp" "$d/first.status"
            while kill -0 "$sid" 2> /dev/null; do sleep 0.05; done
            "$@" > "$d/second" 2>&1; echo $? > "$d/second.tmp"; mv "$d/second.tmp" "$d/second.status"

            """.write(toFile: d + "/member.sh", atomically: true, encoding: .utf8)
        try """
            d="$1"; shift
            /bin/sh "$d/member.sh" "$d" "$@" < /dev/null > /dev/null 2>&1 &
            "$@"
            touch "$d/go"
            until [ -e "$d/first.status" ]; do sleep 0.05; done

            """.write(toFile: d + "/leader.sh", atomically: true, encoding: .utf8)
        func waitFor(_ name: String) -> String? {
            let deadline = Date().addingTimeInterval(120)
            while Date() < deadline {
                if let s = try? String(contentsOfFile: d + "/" + name, encoding: .utf8) { return s }
                usleep(50_000)
            }
            return nil
        }

        // The session's leader authorizes on its terminal; the member, in the same session while the
        // leader lives, reuses the grant without a prompt. (script returns once the member is done:
        // the member holds a descriptor Foundation waits on.)
        let t = TerminalRun.run(["/bin/sh", d + "/leader.sh", d, shellPath] + getA, typing: AgentProcess.password, timeout: 120)
        #expect(t.prompted && t.output.contains("secret-of-a"), "\(t)\n\(agent.log)")
        #expect(waitFor("first.status") == "0\n", "the same session within the window: \(waitFor("first") ?? "")")
        #expect(waitFor("first") == "secret-of-a")

        // The leader exited (script reaped it): the member's next command got nothing.
        let status = waitFor("second.status")
        let output = waitFor("second") ?? ""
        #expect(status == "\(Exit.missingEntitlement)\n" && !output.contains("secret-of-a"), "\(status ?? "no answer"): \(output)")
    }
}
