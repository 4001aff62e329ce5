@testable import CofferAgent
@testable import CofferNativeFrontEnd
import CofferAudit
import CofferKeychain
import CofferModel
import CofferPolicy
import CofferProtocol
import CofferService
import CofferServiceTestSupport
import CofferSystem
import CofferTestSupport
import Foundation
import Logging
import Testing

/// Issue #13's enforcement rules through `Pipeline.handle`: callers with synthetic identities (what the
/// resolver makes of a signed manifest, a Flatpak or an unsigned process), a real keychain.
@Suite struct AccessGroupTests {
    static func item(_ service: String, _ account: String = "acct", group: String? = nil, secretText: String = "s3cret") -> AgentRequest {
        var attrs: Attributes = ["svce": .string(service), "acct": .string(account)]
        if let group { attrs["agrp"] = .string(group) }
        return .add(NewItem(itemClass: .genericPassword, attributes: attrs, secret: secret(secretText)), [.persistentRef])
    }

    static func query(_ service: String, group: String? = nil, data: Bool = true) -> ItemQuery {
        var attrs: Attributes = ["svce": .string(service)]
        if let group { attrs["agrp"] = .string(group) }
        return ItemQuery(itemClass: .genericPassword, attributes: attrs, limit: .all, returnData: data, returnAttributes: true)
    }

    static func persistentRef(_ r: AgentResponse) -> [UInt8]? {
        guard case .items(let items) = r else { return nil }
        return items.first?.persistentRef
    }

    @Test func appsSeeOnlyTheirOwnGroupsAndTheGroupsTheyShare() throws {
        let rig = try AgentRig(passcodeSet: false)
        var a = rig.greetedSession(as: rig.signedCaller("app.a", ["a", "shared"]))
        var b = rig.greetedSession(as: rig.signedCaller("app.b", ["b", "shared"]))
        var u = rig.greetedSession()
        let refA = try #require(Self.persistentRef(rig.pipeline.handle(Self.item("svc"), session: &a)))

        // B: the item does not exist (by query, by persistent reference, for update and delete).
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(Self.query("svc")), session: &b)) == .itemNotFound)
        let byRef = ItemQuery(limit: .one, returnData: true, persistentRef: refA)
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(byRef), session: &b)) == .itemNotFound)
        #expect(errorStatus(rig.pipeline.handle(.update(Self.query("svc", data: false), ItemChanges(secret: secret("mine"))), session: &b)) == .itemNotFound)
        #expect(errorStatus(rig.pipeline.handle(.delete(ItemQuery(itemClass: .genericPassword, limit: .all)), session: &b)) == .itemNotFound)
        // Naming A's group is an entitlement error, for every operation.
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(Self.query("svc", group: "a")), session: &b)) == .missingEntitlement)
        #expect(errorStatus(rig.pipeline.handle(Self.item("other", group: "a"), session: &b)) == .missingEntitlement)
        #expect(errorStatus(rig.pipeline.handle(.delete(Self.query("svc", group: "a", data: false)), session: &b)) == .missingEntitlement)
        // A duplicate-probing add says nothing: B's copy is B's own item.
        guard case .items = rig.pipeline.handle(Self.item("svc", secretText: "b's"), session: &b) else { Issue.record("B's add"); return }
        // Moving an item into a group one lacks is refused.
        #expect(errorStatus(rig.pipeline.handle(.update(Self.query("svc", data: false), ItemChanges(attributes: ["agrp": .string("a")])), session: &b))
                == .missingEntitlement)

        // A still reads its own, unchanged; the shared group works both ways.
        guard case .items(let mine) = rig.pipeline.handle(.copyMatching(Self.query("svc")), session: &a) else { Issue.record("A's get"); return }
        #expect(mine.count == 1 && text(mine.first?.data) == "s3cret" && mine.first?.attributes?["agrp"] == .string("a"))
        guard case .items = rig.pipeline.handle(Self.item("together", group: "shared"), session: &a) else { Issue.record("shared add"); return }
        guard case .items(let shared) = rig.pipeline.handle(.copyMatching(Self.query("together")), session: &b) else { Issue.record("shared get"); return }
        #expect(shared.count == 1)
        // An unsigned caller sees none of it, and its own items go to `unsigned`.
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(Self.query("svc")), session: &u)) == .itemNotFound)
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(Self.query("together")), session: &u)) == .itemNotFound)
        guard case .items = rig.pipeline.handle(Self.item("plain"), session: &u) else { Issue.record("unsigned add"); return }
        guard case .items(let plain) = rig.pipeline.handle(.copyMatching(Self.query("plain")), session: &u) else { Issue.record("unsigned get"); return }
        #expect(plain.first?.attributes?["agrp"] == .string(AccessPolicy.unsignedGroup))
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(Self.query("plain")), session: &a)) == .itemNotFound)
    }

    @Test func denyRefusesEveryItemRequestOfUnsignedCallersButNotUnlock() throws {
        let rig = try AgentRig(policy: AccessPolicy(unsignedCallers: .deny))
        var u = rig.greetedSession()
        #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &u)) == nil)
        #expect(errorStatus(rig.pipeline.handle(Self.item("svc"), session: &u)) == .missingEntitlement)
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(Self.query("svc")), session: &u)) == .missingEntitlement)
        #expect(errorStatus(rig.pipeline.handle(.delete(ItemQuery(limit: .all)), session: &u)) == .missingEntitlement)
        guard case .whoami(let w) = rig.pipeline.handle(.whoami, session: &u) else { Issue.record("whoami"); return }
        #expect(w.kind == .unsigned && w.accessGroups.isEmpty && w.note.contains("deny"))
        var a = rig.greetedSession(as: rig.signedCaller("app.a", ["a"]))
        guard case .items = rig.pipeline.handle(Self.item("svc"), session: &a) else { Issue.record("signed add under deny"); return }
    }

    @Test func aFlatpakAppGetsItsSandboxGroup() throws {
        let rig = try AgentRig(passcodeSet: false)
        let caller = CallerIdentity(pid: rig.peer.pid, uid: rig.peer.uid, establishedBy: .flatpak(appID: "org.example.App"),
                                    accessGroups: ["flatpak:org.example.App"])
        var f = rig.greetedSession(as: caller)
        var u = rig.greetedSession()
        guard case .items = rig.pipeline.handle(Self.item("svc"), session: &f) else { Issue.record("flatpak add"); return }
        guard case .whoami(let w) = rig.pipeline.handle(.whoami, session: &f) else { Issue.record("whoami"); return }
        #expect(w.kind == .flatpak && w.appID == "org.example.App" && w.accessGroups == ["flatpak:org.example.App"] && !w.mayAuthorize)
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(Self.query("svc")), session: &u)) == .itemNotFound)
        // A Flatpak with the shell's app id is not the shell.
        let fakeShell = CallerIdentity(pid: rig.peer.pid, uid: rig.peer.uid, establishedBy: .flatpak(appID: AccessPolicy.defaultShellAppID),
                                       accessGroups: ["flatpak:" + AccessPolicy.defaultShellAppID])
        var fs = rig.greetedSession(as: fakeShell)
        #expect(errorStatus(rig.pipeline.handle(.authorize(accessGroup: "flatpak:org.example.App", passcode: secret(AgentRig.passcode)),
                                                session: &fs)) == .missingEntitlement)
    }

    /// Backup, restore, escrow, passcode removal and finger enrollment reach every group: a Flatpak app
    /// or another signed app may not run them even with the passcode in hand (refused before anything is
    /// asked, and audited); the shell helper and, under `unsigned`, an unsigned caller may.
    @Test func onlyTheShellAndUnsignedCallersManageTheWholeKeychain() throws {
        func operations(_ rig: AgentRig) -> [(String, AgentRequest)] {
            [("backup-create", .backupCreate(path: rig.dir.file("all.cfbu"), password: secret("backup pw"))),
             ("backup-check", .backupRestore(path: rig.dir.file("all.cfbu"), password: secret("backup pw"), dryRun: true)),
             ("backup-restore", .backupRestore(path: rig.dir.file("all.cfbu"), password: secret("backup pw"), dryRun: false)),
             ("escrow-create", .escrowCreate),
             ("escrow-revoke", .escrowRevoke(passcode: secret(AgentRig.passcode))),
             ("check", .check(.quarantine)),
             ("bio-enroll", .bio(.enroll, name: "left-index")),
             ("remove-passcode", .removePasscode(current: secret(AgentRig.passcode)))]
        }
        /// Runs every operation as `caller` with the passcode given in advance; the statuses, in order.
        func run(as caller: CallerIdentity?, policy: AccessPolicy = AccessPolicy()) throws -> (AgentRig, [SecStatus?]) {
            let rig = try AgentRig(policy: policy)
            var owner = rig.greetedSession(as: rig.signedCaller("app.a", ["a"]))
            _ = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &owner)
            guard case .items = rig.pipeline.handle(Self.item("mail"), session: &owner) else { Issue.record("add"); return (rig, []) }
            var s = rig.greetedSession(as: caller)
            _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(passcode: secret(AgentRig.passcode))), session: &s)
            return (rig, operations(rig).map { errorStatus(rig.pipeline.handle($0.1, session: &s)) })
        }
        let rigForNames = try AgentRig()
        let names = operations(rigForNames).map(\.0)
        let flatpak = CallerIdentity(pid: rigForNames.peer.pid, uid: rigForNames.peer.uid, establishedBy: .flatpak(appID: AccessPolicy.defaultShellAppID),
                                     accessGroups: ["flatpak:" + AccessPolicy.defaultShellAppID])
        let refused: [(String, CallerIdentity?, AccessPolicy)] = [
            ("a Flatpak app (even one named like the shell)", flatpak, AccessPolicy()),
            ("another signed app", rigForNames.signedCaller("app.b", ["b"]), AccessPolicy()),
            ("an unsigned caller under deny", nil, AccessPolicy(unsignedCallers: .deny)),
            ("the shell app when shell-app = none", rigForNames.signedCaller(AccessPolicy.defaultShellAppID, ["shell"]), AccessPolicy(shellAppID: nil)),
        ]
        for (who, caller, policy) in refused {
            let (rig, statuses) = try run(as: caller, policy: policy)
            #expect(statuses == Array(repeating: .missingEntitlement, count: names.count), "\(who): \(statuses)")
            #expect(!FileManager.default.fileExists(atPath: rig.dir.file("all.cfbu")), "\(who) wrote a backup")
            #expect(rig.keychain.status.passcodeSet, "\(who) removed the passcode")
            #expect(rig.sensor.state().domainState == [UInt8](repeating: 1, count: 32), "\(who) enrolled a finger")
            let audit = AuditReader.read(directory: rig.dir.path).records.filter { names.contains($0.operation) }
            #expect(audit.map(\.operation) == names && audit.allSatisfy { $0.result == -34018 }, "\(who): \(audit)")
        }
        for (who, caller) in [("the shell helper", rigForNames.signedCaller(AccessPolicy.defaultShellAppID, ["shell", "unsigned"])),
                              ("an unsigned caller", nil)] as [(String, CallerIdentity?)] {
            let (rig, statuses) = try run(as: caller)
            // The restore finds the item already there (a duplicate): it succeeds and adds nothing.
            #expect(statuses.allSatisfy { $0 == nil }, "\(who): \(zip(names, statuses).map { "\($0) \(String(describing: $1))" })")
            #expect(!rig.keychain.status.passcodeSet, "\(who): the passcode is still set")
        }
    }

    /// A sandboxed app never tries the passcode: its wrong tries would count toward the throttle (and
    /// erase-after) of a keychain it cannot otherwise touch. Refused before PAM is asked, audited; the
    /// person's own unlock afterwards is not delayed. Unsigned and signed callers outside a sandbox
    /// still unlock (pam_coffer's login process is unsigned, even under unsigned-callers = deny).
    @Test func aSandboxedAppNeverTriesThePasscode() throws {
        let rig = try AgentRig()
        rig.schedule.lockNow(reason: "test")
        let flatpak = CallerIdentity(pid: rig.peer.pid, uid: rig.peer.uid, establishedBy: .flatpak(appID: "org.example.App"),
                                     accessGroups: ["flatpak:org.example.App"])
        var f = rig.greetedSession(as: flatpak)
        let calls = rig.verifier.callCount
        let tries: [(String, AgentRequest)] = [
            ("unlock", .unlock(passcode: secret("wrong"))), ("escrow-unlock", .escrowUnlock(secret: secret("wrong"))),
            ("set-passcode", .setPasscode(current: secret("wrong"), new: secret("new"))), ("passcode-sync", .passcodeSync(oldPasscode: secret("wrong"))),
        ]
        for _ in 0..<6 {
            for (_, request) in tries { #expect(errorStatus(rig.pipeline.handle(request, session: &f)) == .missingEntitlement) }
        }
        // Even the right passcode: unlocking is not a sandboxed app's to do.
        #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &f)) == .missingEntitlement)
        #expect(rig.verifier.callCount == calls, "PAM was never asked")
        #expect(rig.keychain.status.lockState != .unlocked)
        let audit = AuditReader.read(directory: rig.dir.path).records.filter { $0.app == "org.example.App" }
        #expect(audit.count == 6 * tries.count + 1 && audit.allSatisfy { $0.result == -34018 }, "\(audit)")
        #expect(Set(audit.map(\.operation)) == Set(tries.map(\.0)))
        // No try was counted: the person unlocks at once, from outside the sandbox.
        for (who, signed, policy) in [("unsigned under deny", false, AccessPolicy(unsignedCallers: .deny)), ("a signed app", true, AccessPolicy()),
                                      ("unsigned", false, AccessPolicy())] {
            let other = try AgentRig(policy: policy)
            other.schedule.lockNow(reason: "test")
            var s = other.greetedSession(as: signed ? other.signedCaller("app.a", ["a"]) : nil)
            #expect(errorStatus(other.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &s)) == nil, "\(who)")
            #expect(other.keychain.status.lockState == .unlocked, "\(who)")
        }
        var person = rig.greetedSession()
        #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &person)) == nil)
        #expect(rig.keychain.status.lockState == .unlocked)
    }

    @Test func theShellReachesAnotherGroupOnlyAfterThePasscodeAndOnlyOnThatConnection() throws {
        let rig = try AgentRig()
        var a = rig.greetedSession(as: rig.signedCaller("app.a", ["a"]))
        _ = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &a)
        guard case .items = rig.pipeline.handle(Self.item("svc"), session: &a) else { Issue.record("add"); return }
        let shell = rig.signedCaller(AccessPolicy.defaultShellAppID, ["shell", "unsigned"], sessionID: 77)
        var sh = rig.greetedSession(as: shell)
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(Self.query("svc", group: "a")), session: &sh)) == .missingEntitlement)
        let calls = rig.verifier.callCount
        #expect(errorStatus(rig.pipeline.handle(.authorize(accessGroup: "a", passcode: secret("wrong")), session: &sh)) == .authFailed)
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(Self.query("svc", group: "a")), session: &sh)) == .missingEntitlement)
        #expect(errorStatus(rig.pipeline.handle(.authorize(accessGroup: "a", passcode: secret(AgentRig.passcode)), session: &sh)) == nil)
        #expect(rig.verifier.callCount == calls + 2, "the passcode goes to the verifier (PAM) every time")
        guard case .items(let got) = rig.pipeline.handle(.copyMatching(Self.query("svc", group: "a")), session: &sh) else {
            Issue.record("authorized get"); return
        }
        #expect(text(got.first?.data) == "s3cret")
        // A new connection of the same shell (the next command) must authenticate again: no reuse by default.
        var next = rig.greetedSession(as: shell)
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(Self.query("svc", group: "a")), session: &next)) == .missingEntitlement)
        // A non-shell app can never authorize, even with the right passcode; nor can an unsigned caller.
        var b = rig.greetedSession(as: rig.signedCaller("app.b", ["b"]))
        #expect(errorStatus(rig.pipeline.handle(.authorize(accessGroup: "a", passcode: secret(AgentRig.passcode)), session: &b)) == .missingEntitlement)
        var u = rig.greetedSession()
        #expect(errorStatus(rig.pipeline.handle(.authorize(accessGroup: "a", passcode: secret(AgentRig.passcode)), session: &u)) == .missingEntitlement)

        // Every step is in the audit log, with the app and the group, never a value.
        let records = AuditReader.read(directory: rig.dir.path).records
        let shellRecords = records.filter { $0.app == AccessPolicy.defaultShellAppID }
        #expect(shellRecords.map(\.operation) == ["get", "authorize", "get", "authorize", "get", "get"])
        #expect(shellRecords.map(\.result) == [-34018, -25293, -34018, 0, 0, -34018])
        #expect(shellRecords.allSatisfy { $0.accessGroup == "a" })
        #expect(records.contains { $0.app == "app.b" && $0.operation == "authorize" && $0.result == -34018 })
        let log = String(decoding: fileBytes(rig.dir.file(AuditLog.fileName)), as: UTF8.self)
        #expect(!log.contains("s3cret") && !log.contains("svc") && !log.contains(AgentRig.passcode))
    }

    @Test func aReuseWindowCoversTheSameAppInTheSameLoginSessionUntilItEndsOrTheKeybagLocks() throws {
        let rig = try AgentRig(policy: AccessPolicy(authorizationReuseSeconds: 60))
        var a = rig.greetedSession(as: rig.signedCaller("app.a", ["a"]))
        _ = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &a)
        guard case .items = rig.pipeline.handle(Self.item("svc"), session: &a) else { Issue.record("add"); return }
        let get = AgentRequest.copyMatching(Self.query("svc", group: "a"))
        var first = rig.greetedSession(as: rig.signedCaller(AccessPolicy.defaultShellAppID, ["shell"], sessionID: 500))
        #expect(errorStatus(rig.pipeline.handle(.authorize(accessGroup: "a", passcode: secret(AgentRig.passcode)), session: &first)) == nil)
        // The next command in the same login session, within the window: no new prompt.
        var second = rig.greetedSession(as: rig.signedCaller(AccessPolicy.defaultShellAppID, ["shell"], sessionID: 500))
        #expect(errorStatus(rig.pipeline.handle(get, session: &second)) == nil)
        // Another login session (another terminal) is not covered.
        var elsewhere = rig.greetedSession(as: rig.signedCaller(AccessPolicy.defaultShellAppID, ["shell"], sessionID: 501))
        #expect(errorStatus(rig.pipeline.handle(get, session: &elsewhere)) == .missingEntitlement)
        // After the window, again a prompt.
        rig.clock.advance(61)
        var late = rig.greetedSession(as: rig.signedCaller(AccessPolicy.defaultShellAppID, ["shell"], sessionID: 500))
        #expect(errorStatus(rig.pipeline.handle(get, session: &late)) == .missingEntitlement)
        // Locking forgets every authorization.
        #expect(errorStatus(rig.pipeline.handle(.authorize(accessGroup: "a", passcode: secret(AgentRig.passcode)), session: &late)) == nil)
        rig.schedule.lockNow(reason: "test")
        _ = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &a)
        var afterLock = rig.greetedSession(as: rig.signedCaller(AccessPolicy.defaultShellAppID, ["shell"], sessionID: 500))
        #expect(errorStatus(rig.pipeline.handle(get, session: &afterLock)) == .missingEntitlement)
        // ...and the connection that authorized it, still open across the lock, has it no more.
        #expect(errorStatus(rig.pipeline.handle(get, session: &late)) == .missingEntitlement)
    }

    /// Issue #24 (2): a grant belongs to one terminal session — its leader and that leader's start
    /// time, not the session id, which a same-uid process gets again by forking until it holds the old
    /// leader's pid and calling setsid() — and ends when that leader exits.
    @Test func aGrantEndsWithItsTerminalSessionAndIsNotInheritedByAReusedSessionID() throws {
        let rig = try AgentRig(policy: AccessPolicy(authorizationReuseSeconds: 300))
        var a = rig.greetedSession(as: rig.signedCaller("app.a", ["a"]))
        _ = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &a)
        guard case .items = rig.pipeline.handle(Self.item("svc"), session: &a) else { Issue.record("add"); return }
        let get = AgentRequest.copyMatching(Self.query("svc", group: "a"))
        func shell(_ sid: Int32?, leaderStart: UInt64) -> Session {
            rig.greetedSession(as: rig.signedCaller(AccessPolicy.defaultShellAppID, ["shell"], sessionID: sid, leaderStart: leaderStart))
        }
        var first = shell(500, leaderStart: 1000)
        #expect(errorStatus(rig.pipeline.handle(.authorize(accessGroup: "a", passcode: secret(AgentRig.passcode)), session: &first)) == nil)
        var next = shell(500, leaderStart: 1000)
        #expect(errorStatus(rig.pipeline.handle(get, session: &next)) == nil, "the same terminal session reuses the grant")
        // The attack: the same session id, made again by a process that got pid 500 and called setsid().
        var forged = shell(500, leaderStart: 1001)
        #expect(errorStatus(rig.pipeline.handle(get, session: &forged)) == .missingEntitlement)
        // A caller whose session's leader is already gone has no session to reuse.
        var orphan = rig.greetedSession(as: CallerIdentity(pid: rig.peer.pid, uid: rig.peer.uid,
                                                            establishedBy: .signedManifest(appID: AccessPolicy.defaultShellAppID),
                                                            accessGroups: ["shell"], sessionID: 500))
        #expect(errorStatus(rig.pipeline.handle(get, session: &orphan)) == .missingEntitlement)
        // The leader exits: the grant ends, also for a connection of that session opened before.
        var opened = shell(500, leaderStart: 1000)
        rig.endedSessions.withLock { _ = $0.insert(CallerIdentity.LoginSession(id: 500, leaderStartTime: 1000, auditSessionID: nil)) }
        #expect(errorStatus(rig.pipeline.handle(get, session: &opened)) == .missingEntitlement)
        var after = shell(500, leaderStart: 1000)
        #expect(errorStatus(rig.pipeline.handle(get, session: &after)) == .missingEntitlement)
        // The connection that authorized keeps its group for its own command (its connection's grant).
        #expect(errorStatus(rig.pipeline.handle(get, session: &first)) == nil)
    }

    /// Removing the passcode ends the groups a connection authorized with it, as it ends every
    /// reused authentication.
    @Test func removingThePasscodeEndsAnAuthorizedGroup() throws {
        let rig = try AgentRig()
        var a = rig.greetedSession(as: rig.signedCaller("app.a", ["a"]))
        _ = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &a)
        guard case .items = rig.pipeline.handle(Self.item("svc"), session: &a) else { Issue.record("add"); return }
        var sh = rig.greetedSession(as: rig.signedCaller(AccessPolicy.defaultShellAppID, ["shell", "unsigned"], sessionID: 78))
        #expect(errorStatus(rig.pipeline.handle(.authorize(accessGroup: "a", passcode: secret(AgentRig.passcode)), session: &sh)) == nil)
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(Self.query("svc", group: "a")), session: &sh)) == nil)
        var owner = rig.greetedSession()
        #expect(errorStatus(rig.pipeline.handle(.removePasscode(current: secret(AgentRig.passcode)), session: &owner)) == nil)
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(Self.query("svc", group: "a")), session: &sh)) == .missingEntitlement)
    }

    @Test func whoamiReportsTheIdentityAndTheGroupsDefaultFirst() throws {
        let rig = try AgentRig(passcodeSet: false)
        var a = rig.greetedSession(as: rig.signedCaller("app.a", ["zeta", "alpha"]))
        guard case .whoami(let w) = rig.pipeline.handle(.whoami, session: &a) else { Issue.record("whoami"); return }
        #expect(w.kind == .signedManifest && w.appID == "app.a" && w.accessGroups == ["zeta", "alpha"] && !w.mayAuthorize)
        #expect(w.executable == "/opt/app.a/bin/app" && w.pid == UInt32(rig.peer.pid))
        var u = rig.greetedSession()
        guard case .whoami(let uw) = rig.pipeline.handle(.whoami, session: &u) else { Issue.record("whoami"); return }
        #expect(uw.kind == .unsigned && uw.appID.isEmpty && uw.accessGroups == [AccessPolicy.unsignedGroup] && !uw.note.isEmpty)
        var sh = rig.greetedSession(as: rig.signedCaller(AccessPolicy.defaultShellAppID, ["shell", "unsigned"]))
        guard case .whoami(let sw) = rig.pipeline.handle(.whoami, session: &sh) else { Issue.record("whoami"); return }
        #expect(sw.mayAuthorize && sw.accessGroups == ["shell", "unsigned"])
    }

    /// Random operations from several identities; after each, no identity ever observed an item of a
    /// group it does not hold (by search, by persistent reference, by a count from update or delete).
    @Test(arguments: [UInt64(1), 2, 3])
    func propertyNoIdentityObservesAnotherGroupsItem(seed: UInt64) throws {
        let rig = try AgentRig(passcodeSet: false)
        var rng = SplitMix(seed: seed)
        let callers: [CallerIdentity] = [
            rig.signedCaller("app.a", ["a", "ab"]), rig.signedCaller("app.b", ["b", "ab"]), rig.signedCaller("app.c", ["c"]),
            rig.unsignedCaller,
            CallerIdentity(pid: rig.peer.pid, uid: rig.peer.uid, establishedBy: .flatpak(appID: "org.x"), accessGroups: ["flatpak:org.x"]),
        ]
        let allGroups = ["a", "b", "ab", "c", AccessPolicy.unsignedGroup, "flatpak:org.x"]
        var sessions = callers.map { rig.greetedSession(as: $0) }
        var refs: [[UInt8]] = []
        func allowed(_ i: Int) -> Set<String> { i == 3 ? [AccessPolicy.unsignedGroup] : Set(callers[i].accessGroups) }
        for step in 0..<300 {
            let i = Int(rng.next() % UInt64(callers.count))
            let mine = allowed(i)
            let service = "s\(rng.next() % 4)"
            var group: String? = rng.next() % 3 == 0 ? allGroups[Int(rng.next() % UInt64(allGroups.count))] : nil
            let request: AgentRequest
            switch rng.next() % 6 {
            case 0, 1: request = Self.item(service, "acct\(rng.next() % 3)", group: group)
            case 2: request = .copyMatching(Self.query(service, group: group))
            case 3 where !refs.isEmpty:
                group = nil
                request = .copyMatching(ItemQuery(limit: .one, returnAttributes: true, persistentRef: refs[Int(rng.next() % UInt64(refs.count))]))
            case 4: request = .update(Self.query(service, group: group, data: false), ItemChanges(secret: secret("u\(step)")))
            default: request = .delete(Self.query(service, group: group, data: false))
            }
            let response = rig.pipeline.handle(request, session: &sessions[i])
            if let g = group, !mine.contains(g) {
                #expect(errorStatus(response) == .missingEntitlement, "step \(step): caller \(i) named group \(g)")
            }
            if case .items(let items) = response {
                for it in items {
                    if let ref = it.persistentRef, case .add = request { refs.append(ref) }
                    if case .string(let g)? = it.attributes?["agrp"] { #expect(mine.contains(g), "step \(step): caller \(i) saw group \(g)") }
                }
            }
        }
        // The final state: each item is in a group its writer held, and each caller's full listing holds only its groups.
        for i in callers.indices {
            guard case .items(let items) = rig.pipeline.handle(.copyMatching(ItemQuery(limit: .all, returnAttributes: true)), session: &sessions[i]) else { continue }
            for it in items {
                if case .string(let g)? = it.attributes?["agrp"] { #expect(allowed(i).contains(g)) }
            }
            let total = try rig.keychain.copyMatching(ItemQuery(limit: .all, returnAttributes: true), scope: .unrestricted)
            let visible = total.filter { if case .string(let g)? = $0.attributes?["agrp"] { return allowed(i).contains(g) }; return false }
            #expect(items.count == visible.count, "caller \(i) sees exactly the items of its groups")
        }
    }

    /// Items of the pre-access-group default group (a v1 fixture written by an earlier Coffer) move to
    /// `unsigned`: unsigned callers and the shell keep seeing them; signed apps do not.
    @Test func legacyItemsMoveToTheUnsignedGroup() throws {
        let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("CofferKeychainTests/Fixtures/v1-nopasscode").path
        let dir = TemporaryDirectory("coffer-legacy")
        for f in ["device.key", "keybag", "keybag.key", "keychain.db"] {
            try FileManager.default.copyItem(atPath: fixture + "/" + f, toPath: dir.file(f))
            chmod(dir.file(f), 0o600)
        }
        chmod(dir.path, 0o700)
        let kc = try Keychain(directory: dir.path)
        let all = ItemQuery(limit: .all, returnAttributes: true)
        let before = try kc.copyMatching(all, scope: .unrestricted)
        #expect(!before.isEmpty && before.allSatisfy { $0.attributes?["agrp"] == .string(AccessPolicy.legacyGroup) })
        LegacyGroups.migrate(kc, logger: .init(label: "test"))
        let after = try kc.copyMatching(all, scope: .unrestricted)
        #expect(after.count == before.count && after.allSatisfy { $0.attributes?["agrp"] == .string(AccessPolicy.unsignedGroup) })
        // Idempotent, and what an unsigned caller's scope sees is everything.
        LegacyGroups.migrate(kc, logger: .init(label: "test"))
        let unsignedScope = try AccessPolicy().decide(CallerIdentity(pid: 1, uid: 0, establishedBy: .unsigned(executablePath: "/x", reason: .noMatchingManifest),
                                                                      accessGroups: [])).scope()
        #expect(try kc.copyMatching(all, scope: unsignedScope).count == before.count)
        #expect((try? kc.copyMatching(all, scope: AccessScope(groups: ["a"], defaultGroup: "a"))) == nil)
    }
}

extension AccessGroupTests {
    /// An item with an access control in the old group (only the keychain library can put one there)
    /// stays where it is; the others of its class still move.
    @Test func legacyMigrationLeavesProtectedItemsAlone() throws {
        let rig = try AgentRig()
        let old = AccessScope.unrestricted
        try rig.keychain.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("plain")], secret: secret("a")), scope: old)
        try rig.keychain.add(NewItem(itemClass: .genericPassword,
                                     attributes: ["svce": .string("guarded"),
                                                  AccessControl.attributeName: .data(AccessControl(parsing: "device-passcode")!.encoded())],
                                     secret: secret("b")), scope: old)
        LegacyGroups.migrate(rig.keychain, logger: .init(label: "test"))
        let all = try rig.keychain.copyMatching(ItemQuery(itemClass: .genericPassword, limit: .all, returnAttributes: true), scope: .unrestricted)
        let groups = Dictionary(uniqueKeysWithValues: all.compactMap { r -> (String, AttributeValue)? in
            guard case .string(let s)? = r.attributes?["svce"], let g = r.attributes?["agrp"] else { return nil }
            return (s, g)
        })
        #expect(groups["plain"] == .string(AccessPolicy.unsignedGroup) && groups["guarded"] == .string(AccessPolicy.legacyGroup))
    }
}

/// The policy alone (pure).
@Suite struct AccessPolicyTests {
    let signed = CallerIdentity(pid: 1, uid: 1, establishedBy: .signedManifest(appID: "app"), accessGroups: ["g1", "g2"])
    let unsigned = CallerIdentity(pid: 1, uid: 1, establishedBy: .unsigned(executablePath: "/x", reason: .noMatchingManifest), accessGroups: [])

    @Test func signedCallersGetTheirGroupsFirstOneDefault() throws {
        let s = try AccessPolicy().decide(signed).scope()
        #expect(s.groups == ["g1", "g2"] && s.defaultGroup == "g1")
        // Authorized groups count only for the shell.
        #expect(try AccessPolicy().decide(signed, authorized: ["x"]).scope().groups == ["g1", "g2"])
        #expect(try AccessPolicy(shellAppID: "app").decide(signed, authorized: ["x"]).scope().groups == ["g1", "g2", "x"])
    }

    /// Issue #24 (3): a Flatpak identity follows `unsigned-callers = deny` unless `flatpak-callers`
    /// says otherwise (any process of the user can make one), and `flatpak-callers = deny` holds alone.
    @Test func flatpakIdentitiesFollowDenyUnlessAllowed() throws {
        let flatpak = CallerIdentity(pid: 1, uid: 1, establishedBy: .flatpak(appID: "org.example.App"), accessGroups: ["flatpak:org.example.App"])
        #expect(try AccessPolicy().decide(flatpak).scope().groups == ["flatpak:org.example.App"])
        #expect(throws: SecError.self) { try AccessPolicy(unsignedCallers: .deny).decide(flatpak).scope() }
        #expect(try AccessPolicy(unsignedCallers: .deny, flatpakCallers: .allow).decide(flatpak).scope().groups == ["flatpak:org.example.App"])
        #expect(throws: SecError.self) { try AccessPolicy(flatpakCallers: .deny).decide(flatpak).scope() }
        guard case .denied(let why) = AccessPolicy(unsignedCallers: .deny).decide(flatpak) else { Issue.record("allowed"); return }
        #expect(why.contains("flatpak-callers = allow"))
        // Signed callers are untouched by either setting.
        let signed = CallerIdentity(pid: 1, uid: 1, establishedBy: .signedManifest(appID: "s"), accessGroups: ["s"])
        #expect(try AccessPolicy(unsignedCallers: .deny, flatpakCallers: .deny).decide(signed).scope().groups == ["s"])
        // The configuration key.
        var config = AgentConfiguration(socketPath: "/x", stateDirectory: "/y", userName: "u")
        try config.apply(configFile: "unsigned-callers = deny\nflatpak-callers = allow\n", name: "c")
        #expect(config.policy.flatpakCallers == .allow && config.policy.effectiveFlatpakCallers == .allow)
        #expect(throws: AgentError.self) { try config.apply(configFile: "flatpak-callers = maybe\n", name: "c") }
    }

    @Test func unsignedCallersGetTheSharedGroupOrNothing() throws {
        #expect(try AccessPolicy().decide(unsigned).scope() == AccessScope(groups: ["unsigned"], defaultGroup: "unsigned"))
        #expect(throws: SecError.self) { try AccessPolicy(unsignedCallers: .deny).decide(unsigned).scope() }
        #expect(try AccessPolicy().decide(unsigned, authorized: ["g1"]).scope().groups == ["unsigned"])
        // A signed caller with no group (the manifest parser refuses one, but the policy does not rely on it).
        let empty = CallerIdentity(pid: 1, uid: 1, establishedBy: .signedManifest(appID: "e"), accessGroups: [])
        #expect(throws: SecError.self) { try AccessPolicy().decide(empty).scope() }
    }

    @Test func authorizationsExpireAndAreKeyedBySession() {
        var book = AuthorizationBook()
        func session(_ id: Int32, start: UInt64 = 7, audit: UInt32? = nil) -> CallerIdentity.LoginSession {
            CallerIdentity.LoginSession(id: id, leaderStartTime: start, auditSessionID: audit)
        }
        let k1 = AuthorizationBook.Key(appID: "shell", uid: 1, session: session(10))
        let k2 = AuthorizationBook.Key(appID: "shell", uid: 1, session: session(11))
        // The same session id with another leader (its pid reused, setsid() called again), or in
        // another audit session, is another session.
        let reborn = AuthorizationBook.Key(appID: "shell", uid: 1, session: session(10, start: 8))
        let otherLogin = AuthorizationBook.Key(appID: "shell", uid: 1, session: session(10, audit: 3))
        let live: (CallerIdentity.LoginSession) -> Bool = { _ in true }
        book.grant("a", to: k1, until: 100)
        #expect(book.groups(for: k1, now: 99, sessionIsLive: live) == ["a"] && book.groups(for: k2, now: 99, sessionIsLive: live).isEmpty)
        #expect(book.groups(for: reborn, now: 99, sessionIsLive: live).isEmpty && book.groups(for: otherLogin, now: 99, sessionIsLive: live).isEmpty)
        #expect(book.groups(for: k1, now: 100, sessionIsLive: live).isEmpty && book.count == 0)
        // A session whose leader is gone loses its grants at once.
        book.grant("a", to: k1, until: 100)
        #expect(book.groups(for: k1, now: 50, sessionIsLive: { $0 != k1.session }).isEmpty && book.count == 0)
        #expect(book.groups(for: k1, now: 50, sessionIsLive: live).isEmpty, "gone for good")
        #expect(AuthorizationBook.key(for: unsigned) == nil, "no app id, no reuse")
        let noSession = CallerIdentity(pid: 1, uid: 1, establishedBy: .signedManifest(appID: "shell"), accessGroups: ["s"])
        #expect(AuthorizationBook.key(for: noSession) == nil, "no session id, no reuse")
        let leaderGone = CallerIdentity(pid: 1, uid: 1, establishedBy: .signedManifest(appID: "shell"), accessGroups: ["s"], sessionID: 10)
        #expect(AuthorizationBook.key(for: leaderGone) == nil, "a session id without its leader: no reuse")
    }
}

/// A small deterministic generator for the property test.
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// General attributes do not reach across access groups: two signed apps and an unsigned caller with
/// items of the same general attributes each find only their own, by any subset (issue #26 part 4).
@Suite struct GeneralAttributeGroupTests {
    @Test func anotherGroupsItemWithTheSameGeneralAttributesIsNotFound() throws {
        let rig = try AgentRig(passcodeSet: false)
        let general: Attributes = ["@xdg:schema": .string("org.example.Password"), "@user": .string("alice")]
        var sessions = [rig.greetedSession(as: rig.signedCaller("app.a", ["a"])), rig.greetedSession(as: rig.signedCaller("app.b", ["b"])),
                        rig.greetedSession()]
        for i in sessions.indices {
            let add = AgentRequest.add(NewItem(itemClass: .genericPassword, attributes: general.merging(["svce": .string("s\(i)")]) { $1 },
                                               secret: secret("secret \(i)")), [])
            guard case .items = rig.pipeline.handle(add, session: &sessions[i]) else { Issue.record("add \(i)"); return }
        }
        for i in sessions.indices {
            for probe in [general, ["@user": .string("alice")]] {
                let q = ItemQuery(attributes: probe, limit: .all, returnData: true, returnAttributes: true)
                guard case .items(let found) = rig.pipeline.handle(.copyMatching(q), session: &sessions[i]) else { Issue.record("search \(i)"); return }
                #expect(found.count == 1 && text(found.first?.data) == "secret \(i)" && found.first?.attributes?["svce"] == .string("s\(i)"))
            }
        }
        // Deleting by them deletes only one's own.
        guard case .count(let deleted) = rig.pipeline.handle(.delete(ItemQuery(attributes: general, limit: .all)), session: &sessions[0]) else {
            Issue.record("a's delete"); return
        }
        #expect(deleted == 1)
        let q = ItemQuery(attributes: general, limit: .all)
        #expect(errorStatus(rig.pipeline.handle(.copyMatching(q), session: &sessions[0])) == .itemNotFound)
        guard case .items(let left) = rig.pipeline.handle(.copyMatching(q), session: &sessions[1]) else { Issue.record("b's search"); return }
        #expect(left.count == 1)
    }
}
