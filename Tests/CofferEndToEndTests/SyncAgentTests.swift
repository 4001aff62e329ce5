import CofferClient
import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Keychain sync through three real agents (issue #29): each its own state directory, device key and
/// passcode, set up with `coffer sync` and syncing in the background through a local bare repository
/// with the real `git`.
@Suite(.serialized) struct SyncAgentTests {
    let shared = TemporaryDirectory("coffer-syncagent")
    var remote: String { shared.file("remote.git") }
    /// While this file exists, the agents' git (a wrapper named by `sync-git`) waits before running:
    /// a remote that is slow for as long as a test wants.
    var slowMarker: String { shared.file("slow") }
    /// While this file exists, the wrapper's `git add` (the start of a push) waits: a sync holds in its
    /// pushing phase, after it verified and applied what arrived, for as long as a test wants.
    var slowPushMarker: String { shared.file("slow-push") }

    /// A started agent whose configuration syncs every 2 s, pushes 0.3 s after a write, retries after
    /// 1 s, runs git through the wrapper; its own passcode.
    final class Machine: @unchecked Sendable {
        let agent: AgentProcess
        let name: String
        let passcode: String

        init(_ name: String, config: String) throws {
            self.name = name
            passcode = "pass-\(name)-horse"
            agent = try AgentProcess(extraArguments: ["--config", config], start: false)
            try "\(currentUser):\(passcode):coffer\n".write(toFile: agent.passdb, atomically: true, encoding: .utf8)
            try agent.start()
            let r = agent.cli(["passcode", "set", "--passcode-stdin"], stdin: passcode)
            #expect(r.status == 0, "passcode set on \(name): \(r)")
        }

        func cli(_ args: [String], stdin: String? = nil) -> CLIResult { agent.cli(args, stdin: stdin) }

        /// The secret of mail/`account`, or nil (not there, locked).
        func password(_ account: String) -> String? {
            let r = cli(["get", "--service", "mail", "--account", account])
            return r.status == 0 ? r.stdout.trimmingCharacters(in: .newlines) : nil
        }

        func add(_ account: String, _ secret: String, _ extra: [String] = ["--sync"]) {
            let r = cli(["add", "--service", "mail", "--account", account, "--secret-stdin"] + extra, stdin: secret)
            #expect(r.status == 0, "add \(account) on \(name): \(r)")
        }

        func status() -> String { cli(["sync", "status"]).stdout }
    }

    func config(_ name: String, extra: String = "") throws -> String {
        let wrapper = shared.file("git-wrapper")
        if !FileManager.default.fileExists(atPath: wrapper) {
            try writeExecutable("""
                #!/bin/sh
                while [ -e '\(slowMarker)' ]; do sleep 0.1; done
                case " $* " in *" add -A -- "*) while [ -e '\(slowPushMarker)' ]; do sleep 0.1; done ;; esac
                exec /usr/bin/git "$@"

                """, to: wrapper)
        }
        let path = shared.file("\(name).conf")
        try """
            sync-interval = 2
            sync-push-delay = 0.3
            sync-retry = 1
            sync-git = \(wrapper)
            \(extra)
            """.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// Polls `check` every 0.1 s until it holds or `seconds` pass.
    func eventually(_ seconds: Double = 120, _ check: () -> Bool) -> Bool {
        let end = Date().addingTimeInterval(seconds)
        while Date() < end {
            if check() { return true }
            usleep(100_000)
        }
        return check()
    }

    /// The pairing code a `coffer sync join` printed.
    static func code(in output: String) -> String? {
        output.split(separator: "\n").first { $0.hasPrefix("pairing code: ") }.map { String($0.dropFirst("pairing code: ".count)) }
    }

    /// A (laptop) founds the circle with one item; B (desktop) joins through a `coffer sync join` that
    /// waits for the approval, C (server) through one that does not wait; A approves both.
    func circle(extra: String = "") throws -> (a: Machine, b: Machine, c: Machine) {
        let r = runProcess("/usr/bin/git", ["init", "-q", "--bare", remote])
        try #require(r.status == 0, "git init --bare: \(r)")
        let a = try Machine("laptop", config: try config("a", extra: extra))
        let b = try Machine("desktop", config: try config("b", extra: extra))
        let c = try Machine("server", config: try config("c", extra: extra))
        a.add("before", "pw0")
        let founded = a.cli(["sync", "init", "--remote", remote, "--name", "laptop"])
        try #require(founded.status == 0, "sync init: \(founded)\n\(a.agent.log)")

        // B: join waits for the approval, printing the code first.
        let out = shared.file("join-b.out")
        _ = FileManager.default.createFile(atPath: out, contents: nil)
        let join = Process()
        join.executableURL = URL(fileURLWithPath: Binaries.coffer)
        join.arguments = ["sync", "join", "--remote", remote, "--name", "desktop", "--wait", "300", "--socket", b.agent.socketPath]
        join.standardOutput = FileHandle(forWritingAtPath: out)
        join.standardError = FileHandle.nullDevice
        join.standardInput = FileHandle.nullDevice
        try join.run()
        var codeB: String? = nil
        #expect(eventually { codeB = Self.code(in: (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""); return codeB != nil })
        let b1 = try #require(codeB, "join printed no code\n\(b.agent.log)")
        // The approval asks for A's passcode (the new machine will read every synced item).
        let refused = a.cli(["sync", "approve", b1, "--no-auth-ui"])
        #expect(refused.status != 0, "approve without the passcode: \(refused)")
        let approved = a.cli(["sync", "approve", b1, "--auth-passcode-fd", "0"], stdin: a.passcode)
        try #require(approved.status == 0, "approve: \(approved)\n\(a.agent.log)")
        // Both screens show one circle fingerprint: the one the pairing proved.
        let fingerprint = approved.stdout.split(separator: "\n").first { $0.hasPrefix("approved desktop into the circle ") }
            .map { String($0.dropFirst("approved desktop into the circle ".count)) }
        #expect(fingerprint?.count == 17, "\(approved)")
        #expect(eventually { !join.isRunning })
        join.waitUntilExit()
        #expect(join.terminationStatus == 0)
        let joinOutput = (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
        #expect(joinOutput.contains("approved: this machine is in the circle \(fingerprint ?? "?")"), "\(joinOutput)")

        // C: join without waiting, then approve; C finds out in the background.
        let joined = c.cli(["sync", "join", "--remote", remote, "--name", "server", "--wait", "0"])
        let c1 = try #require(Self.code(in: joined.stdout), "join: \(joined)")
        #expect(c.status().contains("waiting for approval"))
        let approvedC = a.cli(["sync", "approve", c1, "--auth-passcode-fd", "0"], stdin: a.passcode)
        try #require(approvedC.status == 0, "approve: \(approvedC)")
        #expect(eventually { c.status().contains("member of the circle") }, "\(c.status())\n\(c.agent.log)")
        return (a, b, c)
    }

    /// The secret of the item this test syncs, and looks for in logs and the remote: with a "-" after
    /// "pw1", so no random temporary path (letters, digits, "_"; the test runner's `s024-…`) can hold
    /// it, as one once did ("…/s024-f6pw1h3l/…" in a CI run's agent log).
    static let synced = "pw1-synced"

    @Test func itemsReachEveryMachineInTheBackgroundAndLocalOnlyItemsNeverLeave() throws {
        // This test process is a front end entitled to delegate, so it may hear B's item changes.
        let apps = try SignedApps()
        try apps.sign("frontend", appID: "com.example.frontend", groups: ["fe"], path: DelegationTests.selfExecutable,
                      entitlements: ["delegate-identity"])
        let (a, b, c) = try circle(extra: "standard-trust-dirs = no\ntrusted-keys-dir = \(apps.keysDir)\nmanifests-dir = \(apps.manifestsDir)")
        // The item A had before the circle reaches both by the background pulls.
        #expect(eventually { b.password("before") == "pw0" }, "\(b.status())\n\(b.agent.log)")
        #expect(eventually { c.password("before") == "pw0" }, "\(c.status())")
        let devices = a.cli(["sync", "devices"])
        #expect(devices.status == 0)
        #expect(devices.stdout.split(separator: "\n").map { $0.split(separator: "\t")[0] } == ["desktop", "laptop", "server"], "\(devices)")
        #expect(devices.stdout.contains("laptop\t") && devices.stdout.contains("\tthis machine"))

        // A write on A is pushed after it and pulled by the others, without anyone asking; B's
        // subscribers of item changes hear that items changed when B applies it.
        let watcher = try AgentConnection(path: b.agent.socketPath, clientName: "sync-watcher")
        try watcher.subscribe(to: .items)
        watcher.setReplyTimeout(120)
        a.add("new", Self.synced)
        // ThisDeviceOnly and access-controlled items are written, never sent.
        a.add("tdo", "secret-tdo", ["--sync", "--accessible", "when-unlocked-this-device-only"])
        a.add("acl", "secret-acl", ["--sync", "--access-control", "device-passcode"])
        #expect(eventually { b.password("new") == Self.synced && c.password("new") == Self.synced }, "\(b.status())\n\(c.status())")
        var heard: LockEvent?
        let silent = failure { () throws(SecError) in heard = try watcher.nextEvent() }
        #expect(silent == nil && heard == .itemsChanged(groups: nil), "B's sync applied A's item: \(String(describing: heard)) \(String(describing: silent))")
        // The new item came after the local-only ones: a pull that brought it brought them if they had gone.
        #expect(b.password("tdo") == nil && c.password("tdo") == nil)
        #expect(b.password("acl") == nil && c.password("acl") == nil)
        let log = runProcess("/usr/bin/git", ["--git-dir", remote, "log", "-p", "--all"])
        #expect(!log.stdout.contains("secret-tdo") && !log.stdout.contains("secret-acl") && !log.stdout.contains(Self.synced))
        // Nothing of an item in the agents' logs.
        for m in [a, b, c] { #expect(!m.agent.log.contains(Self.synced) && !m.agent.log.contains("secret-")) }

        // An update on C and a deletion on B come back to A.
        #expect(c.cli(["update", "--service", "mail", "--account", "new", "--secret-stdin"], stdin: "pw2").status == 0)
        #expect(eventually { a.password("new") == "pw2" })
        #expect(b.cli(["delete", "--service", "mail", "--account", "new"]).status == 0)
        #expect(eventually { a.password("new") == nil && c.password("new") == nil })
    }

    /// The agents compact on their own (`sync-compact-interval`): once every member applied A's edits
    /// of one item, A removes the superseded records from the remote's tree under its checkpoint, and
    /// every machine still has the current value; a change after the compaction still crosses.
    @Test func theAgentsCompactTheirSupersededRecordsInTheBackground() throws {
        let (a, b, c) = try circle(extra: "sync-compact-interval = 1\n")
        #expect(eventually { b.password("before") == "pw0" && c.password("before") == "pw0" }, "\(b.status())\n\(c.status())")
        let id = try #require(a.cli(["sync", "devices"]).stdout.split(separator: "\n").first { $0.contains("this machine") }?
            .split(separator: "\t").dropFirst().first, "A's device id")
        /// A's record files: in the remote's newest tree (`now`), or ever added to it.
        func recordsOfA(ever: Bool = false) -> Int {
            let r = ever
                ? runProcess("/usr/bin/git", ["--git-dir", remote, "log", "--format=", "--name-only", "--diff-filter=A", "coffer-sync", "--", "records/\(id)/"])
                : runProcess("/usr/bin/git", ["--git-dir", remote, "ls-tree", "-r", "--name-only", "coffer-sync", "--", "records/\(id)/"])
            return r.status == 0 ? Set(r.stdout.split(separator: "\n")).count : -1
        }
        for i in 1...6 {
            #expect(a.cli(["update", "--service", "mail", "--account", "before", "--secret-stdin"], stdin: "pw0-\(i)").status == 0)
            #expect(eventually { b.password("before") == "pw0-\(i)" && c.password("before") == "pw0-\(i)" }, "edit \(i)")
        }
        #expect(recordsOfA(ever: true) >= 7, "A wrote a record per change: \(recordsOfA(ever: true))")
        #expect(eventually { a.agent.log.contains("sync compacted") && recordsOfA() < recordsOfA(ever: true) - 3 },
                "A did not compact (\(recordsOfA()) of \(recordsOfA(ever: true)) records left):\n\(a.agent.log)")
        let tree = runProcess("/usr/bin/git", ["--git-dir", remote, "ls-tree", "-r", "--name-only", "coffer-sync"]).stdout
        #expect(tree.contains("checkpoints/"), "the compaction's checkpoint is in the remote: \(tree)")
        for m in [a, b, c] { #expect(m.password("before") == "pw0-6", "\(m.name) kept the current value") }
        c.add("after", "pw-after")
        #expect(eventually { a.password("after") == "pw-after" && b.password("after") == "pw-after" }, "\(a.status())")
    }

    @Test(.enabled(if: !SSHOpenSSHTests.sanitized, "the plain (unsanitized) run only: three agents and git per test are slow under a sanitizer, and CI's 30 minutes are short"))
    func aLockedAgentSyncsNothingAndCatchesUpAtUnlock() throws {
        let (a, b, c) = try circle()
        #expect(eventually { c.password("before") == "pw0" })
        #expect(c.cli(["lock"]).status == 0)
        // A sync C started before the lock ends; from then on C attempts nothing.
        #expect(eventually { c.status().contains("running: no") })
        let quietFrom = Date().timeIntervalSince1970
        a.add("while-locked", "pw-l")
        #expect(eventually { b.password("while-locked") == "pw-l" })
        // Three of C's intervals (2 s) pass without an attempt of C's: its last one is from before.
        #expect(eventually { Date().timeIntervalSince1970 > quietFrom + 7 })
        #expect(Self.attemptAge(c.status()) >= 6, "\(c.status())")
        #expect(c.cli(["sync", "status", "--now"]).status == 6)   // errSecInteractionNotAllowed: locked
        let unlocked = c.cli(["unlock", "--passcode-stdin"], stdin: c.passcode)
        #expect(unlocked.status == 0, "\(unlocked)")
        #expect(eventually { c.password("while-locked") == "pw-l" }, "\(c.status())")
    }

    /// The `last attempt:` line of a status.
    static func attempt(_ status: String) -> Substring? { status.split(separator: "\n").first { $0.hasPrefix("last attempt:") } }
    /// Seconds since the last attempt (0 if never).
    static func attemptAge(_ status: String) -> Int {
        guard let line = attempt(status), let n = line.split(separator: " ").dropFirst(2).first.flatMap({ Int($0) }) else { return 0 }
        return n
    }

    @Test(.enabled(if: !SSHOpenSSHTests.sanitized, "the plain (unsanitized) run only: three agents and git per test are slow under a sanitizer, and CI's 30 minutes are short"))
    func anUnreachableRemoteThenConcurrentEditsTheLaterWinsAndTheLoserIsListedAndRestorable() throws {
        let (a, b, c) = try circle()
        #expect(eventually { b.password("before") == "pw0" && c.password("before") == "pw0" })
        // The remote goes away: every machine goes on serving and writing, and records the failure.
        let away = shared.file("remote-away.git")
        try FileManager.default.moveItem(atPath: remote, toPath: away)
        #expect(b.cli(["update", "--service", "mail", "--account", "before", "--secret-stdin"], stdin: "from-b").status == 0)
        #expect(eventually { !Self.lastError(b.status()).isEmpty }, "\(b.status())")
        // A sync run now that fails fails the command too (it exited 0 before), with git's status.
        let failed = b.cli(["sync", "status", "--now"])
        #expect(failed.status == SecStatus.io.exitCode && failed.stderr.contains("the sync failed"), "\(failed)")
        #expect(c.cli(["update", "--service", "mail", "--account", "before", "--secret-stdin"], stdin: "from-c").status == 0)
        #expect(eventually { !Self.lastError(c.status()).isEmpty }, "\(c.status())")
        #expect(b.password("before") == "from-b" && c.password("before") == "from-c")
        // A change is stamped by the hybrid logical clock when its machine records it, at its first sync
        // that reaches the remote: C is locked (it syncs nothing) until B has caught up, so C's edit is the later one.
        #expect(c.cli(["lock"]).status == 0)
        try FileManager.default.moveItem(atPath: away, toPath: remote)
        #expect(eventually { a.password("before") == "from-b" && Self.lastError(b.status()).isEmpty }, "\(b.status())")
        #expect(c.cli(["unlock", "--passcode-stdin"], stdin: c.passcode).status == 0)
        #expect(eventually { [a, b, c].allSatisfy { $0.password("before") == "from-c" } },
                "\(a.password("before") ?? "-") \(b.password("before") ?? "-") \(c.password("before") ?? "-")\n\(b.status())")
        #expect(eventually { Self.lastError(b.status()).isEmpty && Self.lastError(c.status()).isEmpty })
        // The losing edit is kept and listed (on the machines whose pull met both).
        var listed: [String] = []
        #expect(eventually {
            listed = [a, b, c].map { $0.cli(["sync", "conflicts"]).stdout }
            return listed.contains { $0.contains("genp\tmail\tbefore\tlost: an edit by desktop") }
        }, "\(listed)")
        #expect(!listed.joined().contains("from-b"))   // the list names the item, never a secret
        #expect(listed.joined().contains(" UTC\twinner at "), "times as people read them: \(listed)")
        // Restoring the loser (on a machine that kept it; the passcode first) makes it the newest version everywhere.
        let keeper = try #require(zip([a, b, c], listed).first { $0.1.contains("lost: an edit by desktop") })
        let line = try #require(keeper.1.split(separator: "\n").first { $0.contains("lost: an edit by desktop") })
        let id = String(line.split(separator: "\t")[0])
        #expect(keeper.0.cli(["sync", "conflicts", "--restore", id, "--no-auth-ui"]).status != 0)
        let restored = keeper.0.cli(["sync", "conflicts", "--restore", id, "--auth-passcode-fd", "0"], stdin: keeper.0.passcode)
        #expect(restored.status == 0, "\(restored)")
        #expect(eventually { [a, b, c].allSatisfy { $0.password("before") == "from-b" } },
                "\(a.password("before") ?? "-") \(b.password("before") ?? "-") \(c.password("before") ?? "-")")
        #expect(!keeper.0.cli(["sync", "conflicts"]).stdout.contains(id))
        #expect(keeper.0.cli(["sync", "conflicts", "--restore", id, "--auth-passcode-fd", "0"], stdin: keeper.0.passcode).status == 3)
        // The restore settled the conflict on every member, not only on the one that restored it.
        #expect(eventually { [a, b, c].allSatisfy { !$0.cli(["sync", "conflicts"]).stdout.contains("lost: an edit by desktop") } },
                "\([a, b, c].map { $0.cli(["sync", "conflicts"]).stdout })")
    }

    /// The `last error:` value of a status ("" when none).
    static func lastError(_ status: String) -> String {
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("last error: ") }) else { return "?" }
        let value = String(line.dropFirst("last error: ".count))
        return value == "none" ? "" : value
    }

    @Test(.enabled(if: !SSHOpenSSHTests.sanitized, "the plain (unsanitized) run only: three agents and git per test are slow under a sanitizer, and CI's 30 minutes are short"))
    func requestsAreServedWhileTheRemoteIsSlow() throws {
        let (a, _, _) = try circle()
        // git now hangs until the marker goes: the next sync of A is slow for as long as the test wants.
        _ = FileManager.default.createFile(atPath: slowMarker, contents: nil)
        defer { try? FileManager.default.removeItem(atPath: slowMarker) }
        a.add("during", "pw-d")   // its push starts a sync that hangs in git
        #expect(eventually { a.status().contains("running: yes") }, "\(a.status())")
        // Reads, writes and the status are answered while that sync waits on the network.
        #expect(a.password("during") == "pw-d")
        a.add("during-2", "pw-d2")
        #expect(a.password("during-2") == "pw-d2")
        #expect(a.status().contains("running: yes"))
        try FileManager.default.removeItem(atPath: slowMarker)
        #expect(eventually { a.status().contains("running: no") })
    }

    @Test(.enabled(if: !SSHOpenSSHTests.sanitized, "the plain (unsanitized) run only: three agents and git per test are slow under a sanitizer, and CI's 30 minutes are short"))
    func aKillDuringAPullLeavesItBeforeOrAfterAndTheNextSyncCompletes() throws {
        let (a, _, c) = try circle()
        #expect(eventually { c.password("before") == "pw0" })
        c.agent.stop()
        let n = 120
        for i in 0..<n { a.add("bulk-\(i)", "v\(i)") }
        #expect(eventually { Self.sent(a.status()) >= n }, "\(a.status())")
        func bulk() -> Int {
            let r = c.cli(["find", "--service", "mail", "--limit", "all"])
            return r.stdout.split(separator: "\n").filter { $0.hasPrefix("acct: bulk-") }.count
        }
        // C starts and unlocks, which starts its pull of the n records, and is killed at a later point
        // each round (fetching, applying, or done). Whatever the point, a search sees none of the pull
        // or all of it; the rounds end once it is all there.
        var rounds: [Int] = []
        for delay in [0, 20_000, 50_000, 100_000, 200_000, 400_000, 800_000, 1_600_000] {
            try c.agent.start()
            #expect(c.cli(["unlock", "--passcode-stdin"], stdin: c.passcode).status == 0)
            usleep(useconds_t(delay))
            c.agent.kill9()
            try c.agent.start()
            #expect(c.cli(["unlock", "--passcode-stdin"], stdin: c.passcode).status == 0)
            let seen = bulk()
            rounds.append(seen)
            #expect(seen == 0 || seen == n, "half a pull applied: \(seen) of \(n) (rounds \(rounds))")
            if seen == n { break }
            c.agent.kill9()
        }
        // The next sync completes.
        if c.agent.process?.isRunning != true {
            try c.agent.start()
            #expect(c.cli(["unlock", "--passcode-stdin"], stdin: c.passcode).status == 0)
        }
        #expect(eventually { bulk() == n }, "\(c.status())\n\(c.agent.log)")
        #expect(c.password("bulk-7") == "v7")
    }

    /// The `running:` line of a status.
    static func running(_ status: String) -> String {
        status.split(separator: "\n").first { $0.hasPrefix("running: ") }.map { String($0.dropFirst("running: ".count)) } ?? "?"
    }

    @Test(.enabled(if: !SSHOpenSSHTests.sanitized, "the plain (unsanitized) run only: three agents and git per test are slow under a sanitizer, and CI's 30 minutes are short"))
    func aLongCatchUpShowsItsPhaseAndCountsInTheStatus() throws {
        let (a, _, c) = try circle()
        #expect(eventually { c.password("before") == "pw0" })
        c.agent.stop()
        let n = 250
        for i in 0..<n { a.add("bulk-\(i)", "v\(i)") }
        #expect(eventually { Self.sent(a.status()) >= n }, "\(a.status())")
        // C's first sync after its start verifies and applies the n records, then holds in its push.
        _ = FileManager.default.createFile(atPath: slowPushMarker, contents: nil)
        defer { try? FileManager.default.removeItem(atPath: slowPushMarker) }
        try c.agent.start()
        #expect(c.cli(["unlock", "--passcode-stdin"], stdin: c.passcode).status == 0)
        var seen = ""
        #expect(eventually { seen = Self.running(c.status()); return seen.hasPrefix("yes (pushing (") }, "\(seen)\n\(c.agent.log)")
        // Every record A wrote since C last synced arrived, was verified and is counted.
        let received = Int(seen.dropFirst("yes (pushing (".count).prefix { $0 != " " }.filter { $0 != "," }) ?? 0
        #expect(received >= n, "\(seen)")
        try FileManager.default.removeItem(atPath: slowPushMarker)
        #expect(eventually { Self.running(c.status()) == "no" }, "\(c.status())")
        #expect(c.password("bulk-\(n - 1)") == "v\(n - 1)")
    }

    @Test(.enabled(if: TerminalRun.available, "needs util-linux script and setsid"), .enabled(if: !SSHOpenSSHTests.sanitized, "the plain (unsanitized) run only: three agents and git per test are slow under a sanitizer, and CI's 30 minutes are short"))
    func syncNowShowsAProgressLineOnATerminalAndNoneOnAPipe() throws {
        let (a, _, _) = try circle()
        _ = FileManager.default.createFile(atPath: slowPushMarker, contents: nil)
        defer { try? FileManager.default.removeItem(atPath: slowPushMarker) }
        // On a terminal: the progress line shows while the sync holds in its push; then the sh that runs
        // the command reads the line typed once it showed, removes the marker and waits for the command.
        let coffer = [Binaries.coffer, "sync", "status", "--now", "--socket", a.agent.socketPath]
        let t = TerminalRun.run(["/bin/sh", "-c", "m=$1; shift; \"$@\" & read go; rm -f \"$m\"; wait $!", "sh", slowPushMarker] + coffer,
                                steps: [("sync: pushing", "go")])
        #expect(t.status == 0 && t.prompted, "\(t)\n\(a.agent.log)")
        // The status it prints after the sync it waited for: that one ended without error (`running:` may already
        // show the next 2-s sync on a loaded machine, as a stress-ng run showed).
        #expect(t.output.contains("last error: none") && t.output.contains("\r\u{1B}[Ksync: pushing"), "\(t.output)")

        // On a pipe: the same wait, and not a byte of progress.
        _ = FileManager.default.createFile(atPath: slowPushMarker, contents: nil)
        let piped = Protected<CLIResult?>(nil)
        Thread.detachNewThread { piped.withLock { $0 = a.cli(["sync", "status", "--now"]) } }
        #expect(eventually { Self.running(a.status()).hasPrefix("yes (pushing") }, "\(a.status())")
        usleep(1_000_000)   // several of the 0.2 s polls a terminal would get
        try FileManager.default.removeItem(atPath: slowPushMarker)
        #expect(eventually { piped.withLock { $0 != nil } })
        let r = try #require(piped.withLock { $0 })
        #expect(r.status == 0 && r.stdout.contains("last error: none"), "\(r)")
        #expect(r.stderr.isEmpty, "progress on a pipe: \(r.stderr)")
    }

    @Test func onlyTheOwnersToolsMaySync() throws {
        // Unsigned callers denied (no shell app is signed in these tests): the CLI is refused before anything runs.
        let conf = shared.file("deny.conf")
        try "unsigned-callers = deny\n".write(toFile: conf, atomically: true, encoding: .utf8)
        let agent = try AgentProcess(extraArguments: ["--config", conf])
        let r = agent.cli(["sync", "status"])
        #expect(r.status == 11, "\(r)")   // errSecMissingEntitlement
        let setup = agent.cli(["sync", "init", "--remote", remote])
        #expect(setup.status == 11, "\(setup)")
        #expect(!FileManager.default.fileExists(atPath: agent.stateDir + "/sync"))
    }

    /// The `sent:` count of a status.
    static func sent(_ status: String) -> Int {
        status.split(separator: "\n").first { $0.hasPrefix("sent: ") }.flatMap { Int($0.dropFirst("sent: ".count)) } ?? 0
    }
}
