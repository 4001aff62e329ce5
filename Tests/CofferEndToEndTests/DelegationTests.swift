import CofferClient
import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// Delegated identity (issue #26, part 2), end to end: the real `cofferd` over a real socket, this
/// test process as the front end (its own executable signed with the `delegate-identity`
/// entitlement, through `coffer manifest sign --entitlement`), handing the agent pidfds of live
/// processes (a signed "app", an unsigned program) and every kind of bad descriptor.
@Suite struct DelegationTests {
    /// This test process's executable, resolved (what the agent reads from `/proc/PID/exe`).
    static var selfExecutable: String {
        String(decoding: (try? StableFile.canonicalPath("/proc/self/exe")) ?? [], as: UTF8.self)
    }

    /// A signed front end (this process, app `com.example.frontend`, group `fe`, the entitlement when
    /// `entitled`), a signed app `com.example.a` (group `a`: a copy of sleep), and an agent trusting both.
    static func setUp(entitled: Bool = true) throws -> (apps: SignedApps, agent: AgentProcess) {
        let apps = try SignedApps()
        try apps.sign("frontend", appID: "com.example.frontend", groups: ["fe"], path: selfExecutable,
                      entitlements: entitled ? ["delegate-identity"] : [])
        try apps.install("appA", source: sleepPath)
        try apps.sign("appA", appID: "com.example.a", groups: ["a"])
        let agent = try apps.startAgent()
        agent.setPasscode()
        return (apps, agent)
    }

    static let sleepPath = String(decoding: (try? StableFile.canonicalPath("/usr/bin/sleep")) ?? [], as: UTF8.self)

    /// A child that sleeps until stopped: `command` (its program execs `executable` in the end).
    final class Sleeper {
        let process = Process()
        var pid: Int32 { process.processIdentifier }

        init(_ executable: String, launcher: [String] = []) throws {
            let command = launcher + [executable, "60"]
            process.executableURL = URL(fileURLWithPath: command[0])
            process.arguments = Array(command.dropFirst())
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            // Running `executable` (after any launcher's exec), so that it is what the agent sees.
            for _ in 0..<500 {
                if let exe = try? StableFile.canonicalPath("/proc/\(pid)/exe"), String(decoding: exe, as: UTF8.self) == executable { return }
                usleep(10_000)
            }
            throw SignedApps.Failure("\(command) did not start")
        }

        /// Its start time (field 22 of /proc/PID/stat).
        var startTime: UInt64 { DelegationTests.startTime(of: pid) ?? 0 }

        func stop() {
            kill(pid, SIGKILL) // the test runner's blocked SIGTERM is inherited by its children
            process.waitUntilExit()
        }

        deinit { if process.isRunning { stop() } }
    }

    static func startTime(of pid: Int32) -> UInt64? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        return fields.count > 19 ? UInt64(fields[19]) : nil   // fields from 3 (state) on: 22 is index 19
    }

    static func items(_ c: AgentConnection) throws -> [String] {
        let query = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("delegation")], limit: .all, returnAttributes: true)
        var found: [ItemResult] = []
        if let e = failure({ () throws(SecError) in found = try c.copyMatching(query) }) {
            guard e.status == .itemNotFound else { throw e }
            return []
        }
        return found.map { r in
            let account = if case .string(let a)? = r.attributes?["acct"] { a } else { "?" }
            let group = if case .string(let g)? = r.attributes?["agrp"] { g } else { "?" }
            return "\(account)@\(group)"
        }.sorted()
    }

    static func add(_ c: AgentConnection, _ account: String, group: String? = nil) throws(SecError) {
        var attributes: Attributes = ["svce": .string("delegation"), "acct": .string(account)]
        if let group { attributes["agrp"] = .string(group) }
        try c.add(NewItem(itemClass: .genericPassword, attributes: attributes, secret: secret("s-\(account)")))
    }

    /// A new connection of this process (the front end's own identity).
    static func connect(_ agent: AgentProcess) throws -> AgentConnection { try AgentConnection(path: agent.socketPath, clientName: "delegation-test") }

    /// DELEGATE on a new connection with `descriptors`; the status it failed with (nil: accepted),
    /// and whether the agent closed the connection afterwards.
    static func delegate(_ agent: AgentProcess, descriptors: [Int32], pid: Int32, startTime: UInt64) throws -> (SecStatus?, closed: Bool) {
        let c = try connect(agent)
        let status = failure { () throws(SecError) in try c.delegate(descriptors: descriptors, pid: pid, startTime: startTime) }?.status
        let after = failure { () throws(SecError) in _ = try c.whoami() }
        return (status, after?.status == .io)
    }

    /// How many pidfds the agent holds open.
    static func agentPIDFDs(_ agent: AgentProcess) -> Int {
        guard let pid = agent.process?.processIdentifier,
              let fds = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd") else { return -1 }
        return fds.filter { (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)")) == "anon_inode:[pidfd]" }.count
    }

    // MARK: Delegating for a signed app and for an unsigned program

    @Test func aDelegatedConnectionIsTheProcessItPointsAt() throws {
        let (apps, agent) = try Self.setUp()
        let own = try Self.connect(agent)
        let me = try own.whoami()
        #expect(me.kind == .signedManifest && me.appID == "com.example.frontend" && me.accessGroups == ["fe"], "\(me)\n\(agent.log)")
        try Self.add(own, "frontend")
        #expect(agent.cli(["add", "--service", "delegation", "--account", "unsigned", "--secret-stdin"], stdin: "u").status == 0)

        // (a) The signed app: the connection has exactly its identity, groups and items.
        let app = try Sleeper(apps.executable("appA"))
        let pidfd = try ProcessHandle.pidfd(of: app.pid).release()
        defer { close(pidfd) }
        let d = try Self.connect(agent)
        try d.delegate(pidfd: pidfd, pid: app.pid, startTime: app.startTime)
        let w = try d.whoami()
        #expect(w.kind == .signedManifest && w.appID == "com.example.a" && w.accessGroups == ["a"] && w.pid == UInt32(app.pid)
                && w.executable == apps.executable("appA"), "\(w)")
        try Self.add(d, "app-a")
        #expect(try Self.items(d) == ["app-a@a"], "the app's items only, not the front end's")
        #expect(try Self.items(own) == ["frontend@fe"], "the front end's own connection does not see the app's")
        #expect(failure { () throws(SecError) in try Self.add(d, "x", group: "fe") }?.status == .missingEntitlement,
                "the front end's group is not the delegated connection's")
        // A second DELEGATE is refused, and the connection closes.
        let other = try Sleeper(Self.sleepPath)
        let otherFD = try ProcessHandle.pidfd(of: other.pid).release()
        defer { close(otherFD) }
        #expect(failure { () throws(SecError) in try d.delegate(pidfd: otherFD, pid: other.pid, startTime: other.startTime) }?.status == .param)
        #expect(failure { () throws(SecError) in _ = try d.whoami() }?.status == .io, "closed after the refusal")

        // (b) An unsigned program: the shared `unsigned` group.
        let u = try Self.connect(agent)
        try u.delegate(pidfd: otherFD, pid: other.pid, startTime: other.startTime)
        let wu = try u.whoami()
        #expect(wu.kind == .unsigned && wu.accessGroups == ["unsigned"] && wu.pid == UInt32(other.pid), "\(wu)")
        #expect(try Self.items(u) == ["unsigned@unsigned"])
        #expect(Self.agentPIDFDs(agent) == 0, "the agent keeps no pidfd once a delegation is done")

        // Audited: the front end as the caller, whom it delegated for as the reason.
        let records = auditRecords(agent).filter { ($0["operation"] as? String) == "delegate" }
        #expect(records.contains { ($0["result"] as? Int) == 0 && ($0["app"] as? String) == "com.example.frontend"
                                   && (($0["reason"] as? String) ?? "").contains("app com.example.a") }, "\(records)")
        #expect(records.contains { ($0["result"] as? Int) == 0 && (($0["reason"] as? String) ?? "").contains("unsigned \(Self.sleepPath)") }, "\(records)")
        #expect(records.contains { ($0["result"] as? Int) == -50 && ($0["reason"] as? String) == "not-first" }, "\(records)")
        app.stop()
        other.stop()
    }

    // MARK: Refusals

    @Test func badDelegationsAreRefusedEachWithItsCodeAndTheAgentServesOn() throws {
        let (_, agent) = try Self.setUp()
        let live = try Sleeper(Self.sleepPath)
        let pidfd = try ProcessHandle.pidfd(of: live.pid).release()
        defer { close(pidfd) }

        // A process that has exited and been reaped.
        let dead = try Sleeper(Self.sleepPath)
        let deadFD = try ProcessHandle.pidfd(of: dead.pid).release()
        defer { close(deadFD) }
        let deadStart = dead.startTime
        dead.stop()
        var r = try Self.delegate(agent, descriptors: [deadFD], pid: dead.pid, startTime: deadStart)
        #expect(r.0 == .notAvailable && r.closed, "dead: \(r)")
        // A live process, but not the one described (another start time: a reused pid; another pid).
        r = try Self.delegate(agent, descriptors: [pidfd], pid: live.pid, startTime: live.startTime + 1)
        #expect(r.0 == .notAvailable && r.closed, "start time: \(r)")
        r = try Self.delegate(agent, descriptors: [pidfd], pid: getpid(), startTime: live.startTime)
        #expect(r.0 == .notAvailable && r.closed, "pid: \(r)")
        // A plain file instead of a pidfd, no descriptor, two descriptors.
        let plain = try FileDescriptor.open("/dev/null", O_RDONLY).release()
        defer { close(plain) }
        r = try Self.delegate(agent, descriptors: [plain], pid: live.pid, startTime: live.startTime)
        #expect(r.0 == .param && r.closed, "plain file: \(r)")
        r = try Self.delegate(agent, descriptors: [], pid: live.pid, startTime: live.startTime)
        #expect(r.0 == .param && r.closed, "no descriptor: \(r)")
        r = try Self.delegate(agent, descriptors: [pidfd, pidfd], pid: live.pid, startTime: live.startTime)
        #expect(r.0 == .param && r.closed, "two descriptors: \(r)")
        // DELEGATE after another request.
        let late = try Self.connect(agent)
        _ = try late.whoami()
        #expect(failure { () throws(SecError) in try late.delegate(pidfd: pidfd, pid: live.pid, startTime: live.startTime) }?.status == .param)
        #expect(failure { () throws(SecError) in _ = try late.whoami() }?.status == .io)
        // A malformed body: a clear -50, and the connection closes.
        let hello = ProtocolConformanceTests.helloFrame
        for (what, body) in [("cut short", [0x1A, 0, 0, 0, 2, 0, 0, 0, 1]), ("pid 0", [0x1A, 0, 0, 0, 2] + [UInt8](repeating: 0, count: 12)),
                             ("trailing bytes", [0x1A, 0, 0, 0, 2, 0, 0, 0, 1] + [UInt8](repeating: 0, count: 9))] as [(String, [UInt8])] {
            let x = try ProtocolConformanceTests.exchange(agent.socketPath, hello + ProtocolConformanceTests.frame(body))
            guard x.frames.count == 2, case .error(let e)? = x.frames[1].response else {
                Issue.record("\(what): \(x.frames.map { ($0.type, $0.response.map { "\($0)" } ?? "-") })")
                continue
            }
            #expect(e.status == .param && e.description.contains("malformed message"), "\(what): \(e)")
            #expect(x.closed, "\(what): the connection closes")
        }
        // Which frame a descriptor belongs to (WireProtocol.md, Delegated identity): the one holding
        // the first byte of the sendmsg that carried it. HELLO and DELEGATE by one sendmsg: the pidfd
        // is HELLO's (closed), the DELEGATE has none (-50, closed). HELLO by one sendmsg and DELEGATE
        // by the next, without waiting for HELLO's reply: accepted.
        let delegateFrame = AgentRequest.delegate(pid: live.pid, startTime: live.startTime).encodeFrame(requestID: 2)
        let shared = try ProtocolConformanceTests.exchange(agent.socketPath, sends: [(hello + delegateFrame, [pidfd])])
        #expect(shared.frames.count == 2 && ProtocolConformanceTests.errorStatus(shared.frames[1].response) == .param && shared.closed,
                "one sendmsg: \(shared.frames.map { ($0.type, $0.response.map { "\($0)" } ?? "-") })")
        let pipelined = try ProtocolConformanceTests.exchange(agent.socketPath, sends: [(hello, []), (delegateFrame, [pidfd])], wanted: 2)
        #expect(pipelined.frames.count == 2 && ProtocolConformanceTests.errorStatus(pipelined.frames[1].response) == nil && !pipelined.closed,
                "two sendmsgs: \(pipelined.frames.map { ($0.type, $0.response.map { "\($0)" } ?? "-") })")
        // Nothing refused leaked a descriptor, descriptors passed with any other message are closed,
        // and the agent serves on.
        let raw = try UnixSocket.connect(path: agent.socketPath)
        defer { close(raw) }
        UnixSocket.setTimeouts(raw, send: 5, receive: 10)
        #expect(hello.withUnsafeBytes { UnixSocket.writeAll(raw, $0) })
        let whoami = AgentRequest.whoami.encodeFrame(requestID: 2)
        #expect(whoami.withUnsafeBytes { UnixSocket.writeAll(raw, $0, passing: [pidfd, plain, pidfd]) })
        for _ in 0..<2 {
            var header = [UInt8](repeating: 0, count: 4)
            #expect(recv(raw, &header, 4, Int32(MSG_WAITALL)) == 4)
            let n = Int(header[0]) << 24 | Int(header[1]) << 16 | Int(header[2]) << 8 | Int(header[3])
            #expect(UnixSocket.readExactly(raw, count: n)?.first.map { $0 == MessageType.helloReply.rawValue || $0 == MessageType.whoamiReply.rawValue } == true)
        }
        #expect(Self.agentPIDFDs(agent) == 0, "the agent holds none of the pidfds passed to it")
        let own = try Self.connect(agent)
        #expect(try own.whoami().appID == "com.example.frontend")
        let refusals = auditRecords(agent).filter { ($0["operation"] as? String) == "delegate" }.compactMap { $0["reason"] as? String }
        for reason in ["gone", "not-a-pidfd", "no-descriptor", "several-descriptors", "not-first"] {
            #expect(refusals.contains(reason), "audited: \(reason) in \(refusals)")
        }
        live.stop()
    }

    static let canRunAsAnotherUser = getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv")

    /// A pidfd of another user's process (uid 65534, started through setpriv: only root can).
    @Test(.enabled(if: canRunAsAnotherUser, "needs root (and setpriv) to start a process of another uid"))
    func aProcessOfAnotherUserIsRefused() throws {
        let (_, agent) = try Self.setUp()
        let stranger = try Sleeper(Self.sleepPath, launcher: ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
        let strangerFD = try ProcessHandle.pidfd(of: stranger.pid).release()
        defer { close(strangerFD) }
        let r = try Self.delegate(agent, descriptors: [strangerFD], pid: stranger.pid, startTime: stranger.startTime)
        #expect(r.0 == .missingEntitlement && r.closed, "another uid: \(r)")
        #expect(auditRecords(agent).contains { ($0["reason"] as? String) == "another-user" && ($0["result"] as? Int) == -34018 })
        #expect(try Self.connect(agent).whoami().appID == "com.example.frontend", "the agent serves on")
        stranger.stop()
    }

    /// `coffer manifest verify` and `list` show the entitlement (a version-2 manifest); a manifest
    /// without one is version 1 as before.
    @Test func theCLIShowsTheEntitlement() throws {
        let apps = try SignedApps()
        try apps.sign("frontend", appID: "com.example.frontend", groups: ["fe"], path: Self.selfExecutable, entitlements: ["delegate-identity"])
        try apps.install("appA", source: Self.sleepPath)
        try apps.sign("appA", appID: "com.example.a", groups: ["a"])
        #expect(try String(contentsOfFile: apps.manifestPath("frontend"), encoding: .utf8).hasPrefix("coffer-manifest 2\n"))
        #expect(try String(contentsOfFile: apps.manifestPath("appA"), encoding: .utf8).hasPrefix("coffer-manifest 1\n"))
        var r = runCLI(["manifest", "verify", apps.manifestPath("frontend"), "--trusted-keys", apps.keysDir])
        #expect(r.status == 0 && r.stdout.contains("access-group: fe\nentitlement: delegate-identity\n"), "\(r)")
        r = runCLI(["manifest", "list", "--no-default-dirs", "--key-dir", apps.keysDir, "--manifest-dir", apps.manifestsDir, "--json"])
        let json = try #require(try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any], "\(r)")
        let byApp = Dictionary(uniqueKeysWithValues: try #require(json["manifests"] as? [[String: Any]]).map { ($0["app"] as? String ?? "", $0) })
        #expect(byApp["com.example.frontend"]?["entitlements"] as? [String] == ["delegate-identity"], "\(json)")
        #expect(byApp["com.example.a"]?["entitlements"] as? [String] == [], "\(json)")
        r = runCLI(["manifest", "sign", "--key", apps.file("secret/admin"), "--app-id", "x", "--executable", Self.sleepPath, "--group", "x",
                    "--entitlement", "delegate-everything"])
        #expect(r.status != 0 && r.stderr.contains("unknown --entitlement"), "\(r)")
    }

    // MARK: Item changes for a delegating front end

    /// A front end subscribed to item changes (SUBSCRIBE_EVENTS) hears `itemsChanged` after every
    /// add, update and delete, whoever made it (another connection, the CLI, a delegated app) and in
    /// whatever group; one that asked for the groups (topic bit 2) hears the group each changed, and
    /// nothing else of it; a subscriber of lock events alone never does; a delegated connection (the
    /// app it acts for) may not subscribe to them.
    @Test func anEntitledFrontEndHearsThatItemsChangedAndNothingElse() throws {
        let (apps, agent) = try Self.setUp()
        let watcher = try Self.connect(agent), namer = try Self.connect(agent), lockOnly = try Self.connect(agent)
        try watcher.subscribe(to: [.lock, .items])
        try namer.subscribe(to: [.lock, .itemGroups])
        try lockOnly.subscribe(to: .lock)
        for c in [watcher, namer, lockOnly] { c.setReplyTimeout(20) }
        func expectItemsChanged(_ what: String, in group: String) {
            for (c, expected) in [(watcher, LockEvent.itemsChanged(groups: nil)), (namer, .itemsChanged(groups: [group]))] {
                var event: LockEvent?
                let error = failure { () throws(SecError) in event = try c.nextEvent() }
                #expect(error == nil && event == expected, "\(what): \(String(describing: event)) \(String(describing: error))\n\(agent.log)")
            }
        }
        // Another connection of the front end's own identity, in its own group.
        let writer = try Self.connect(agent)
        try Self.add(writer, "one")
        expectItemsChanged("an add", in: "fe")
        let query = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("delegation"), "acct": .string("one")], limit: .all)
        #expect(try writer.update(query, ItemChanges(attributes: ["labl": .string("renamed")])) == 1)
        expectItemsChanged("an update", in: "fe")
        #expect(try writer.delete(query) == 1)
        expectItemsChanged("a delete", in: "fe")
        // The CLI (another process, unsigned).
        let added = agent.cli(["add", "--service", "from-cli", "--account", "x", "--secret-stdin"], stdin: "pw")
        #expect(added.status == 0, "\(added)")
        expectItemsChanged("the CLI's add", in: "unsigned")
        // An app the front end acts for: its write is heard, but it may not listen itself.
        let app = try Sleeper(apps.executable("appA"))
        defer { app.stop() }
        let pidfd = try ProcessHandle.pidfd(of: app.pid).release()
        defer { close(pidfd) }
        let delegated = try Self.connect(agent)
        // DELEGATE and WHOAMI in one round trip: the identity is the app's.
        #expect(try delegated.delegateAndIdentify(pidfd: pidfd, pid: app.pid, startTime: app.startTime).accessGroups == ["a"])
        try Self.add(delegated, "app's")
        expectItemsChanged("a delegated app's add", in: "a")
        #expect(failure { () throws(SecError) in try delegated.subscribe(to: [.lock, .items]) }?.status == .missingEntitlement)
        #expect(failure { () throws(SecError) in try delegated.subscribe(to: .itemGroups) }?.status == .missingEntitlement)
        try delegated.subscribe(to: .lock) // the refusal left the connection open and usable
        // A failed write is no change: nothing is sent for it.
        #expect(failure { () throws(SecError) in try Self.add(writer, "app's", group: "a") }?.status == .missingEntitlement)
        // Lock events still reach both, in order: the lock-only subscriber's first event is the lock
        // (no item change before it), and the watcher's next one too (nothing for the failed add).
        try writer.lock()
        #expect(try lockOnly.nextEvent() == .locked)
        #expect(try watcher.nextEvent() == .locked)
        #expect(try namer.nextEvent() == .locked)
    }

    @Test func aFrontEndWithoutTheEntitlementIsRefused() throws {
        let (apps, agent) = try Self.setUp(entitled: false)
        let app = try Sleeper(apps.executable("appA"))
        let pidfd = try ProcessHandle.pidfd(of: app.pid).release()
        defer { close(pidfd) }
        let r = try Self.delegate(agent, descriptors: [pidfd], pid: app.pid, startTime: app.startTime)
        #expect(r.0 == .missingEntitlement && r.closed, "\(r)\n\(agent.log)")
        #expect(auditRecords(agent).contains { ($0["operation"] as? String) == "delegate" && ($0["result"] as? Int) == -34018
                                               && ($0["reason"] as? String) == "not-entitled" })
        #expect(try Self.items(try Self.connect(agent)) == [], "still served, as itself")
        // With WHOAMI pipelined behind the refused DELEGATE: the refusal, never the front end's own identity.
        let pipelined = try Self.connect(agent)
        #expect(failure { () throws(SecError) in
            _ = try pipelined.delegateAndIdentify(pidfd: pidfd, pid: app.pid, startTime: app.startTime)
        }?.status == .missingEntitlement)
        app.stop()
    }
}
