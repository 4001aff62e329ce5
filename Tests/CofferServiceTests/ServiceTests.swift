import Foundation
import CofferAudit
import CofferCrypto
import CofferKeychain
import CofferModel
import CofferPolicy
import CofferService
import CofferServiceTestSupport
import CofferSystem
import CofferTestSupport
import Testing

/// Every operation of the protocol-free service core, called directly: a caller context, a scripted
/// authentication channel, a fake clock, a real keychain (``ServiceRig``, composed as `cofferd`
/// composes the service). No frame, request id or wire type appears here: the target imports no wire module.
@Suite struct ServiceTests {
    static let passcode = AuthenticationAnswer.passcode(secret(ServiceRig.passcode))

    /// A rig unlocked by `context`'s caller (unsigned unless given).
    static func ready(_ caller: ((ServiceRig) -> CallerIdentity)? = nil) throws -> (ServiceRig, CallerContext) {
        let rig = try ServiceRig()
        let context = CallerContext(caller: caller?(rig) ?? rig.unsignedCaller)
        try rig.service.unlock(secret(ServiceRig.passcode), context)
        return (rig, context)
    }

    static func item(_ service: String, rule: String? = nil, secret value: String = "s3cret") -> NewItem {
        var attributes: Attributes = ["svce": .string(service), "acct": .string("me")]
        if let rule { attributes[AccessControl.attributeName] = .data(AccessControl(parsing: rule)!.encoded()) }
        return NewItem(itemClass: .genericPassword, attributes: attributes, secret: secret(value))
    }

    static func query(_ service: String, data: Bool = true) -> ItemQuery {
        ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string(service)], returnData: data)
    }

    /// The secret the service reads for `service` (nil: none).
    static func read(_ rig: ServiceRig, _ service: String, _ context: inout CallerContext, _ channel: (any AuthChannel)?) throws(SecError) -> String? {
        try rig.service.search(query(service), &context, channel) { page in text(page.items.first?.data) }
    }

    /// The status `body` failed with (nil: it did not fail).
    static func status(_ body: () throws(SecError) -> Void) -> SecStatus? {
        do { try body(); return nil } catch { return error.status }
    }

    @Test func itemsAreAddedReadUpdatedAndDeletedInTheCallersScope() throws {
        var (rig, context) = try Self.ready { $0.signedCaller("com.example.mail", ["mail"]) }
        let added = try rig.service.add(Self.item("imap"), returning: .init(attributes: true), &context, nil)
        #expect(added.attributes?["agrp"] == .string("mail"), "the caller's default group")
        #expect(try Self.read(rig, "imap", &context, nil) == "s3cret")
        #expect(try rig.service.update(Self.query("imap", data: false), ItemChanges(secret: secret("new")), &context, nil) == 1)
        #expect(try Self.read(rig, "imap", &context, nil) == "new")
        // Another app does not see it.
        var other = CallerContext(caller: rig.signedCaller("com.example.chat", ["chat"]))
        #expect(throws: SecError.self) { try Self.read(rig, "imap", &other, nil) }
        #expect(try rig.service.delete(Self.query("imap", data: false), &context, nil) == 1)
        // The gate audits every item operation.
        let operations = AuditReader.read(directory: rig.dir.path).records.map(\.operation)
        #expect(["add", "get", "update", "get", "get", "delete"].allSatisfy(operations.contains))
    }

    @Test func anAddRefusedByTheFrontEndWritesNothing() throws {
        var (rig, context) = try Self.ready()
        #expect(throws: SecError.self) {
            _ = try rig.service.add(Self.item("big"), returning: .init(data: true), &context, nil) { _ throws(SecError) in
                throw SecError(.allocate, "the front end cannot send it")
            }
        }
        #expect(try rig.keychain.count() == 0)
    }

    @Test func aPagedSearchKeepsItsFirstPagesAuthorizationForItsLaterPages() throws {
        var (rig, context) = try Self.ready()
        for n in 0..<3 { _ = try rig.service.add(Self.item("s\(n)", rule: "user-presence"), returning: .init(), &context, nil) }
        let all = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("me")], limit: .all, returnData: true)
        let channel = ScriptedChannel([.answer(Self.passcode)])
        rig.sensor.queue(.cancelled)
        var fitted = 0
        let first = try rig.service.search(all, paged: true, &context, channel, fits: { _ in fitted += 1; return fitted <= 2 }) { $0 }
        #expect(first.items.count == 2 && !first.isComplete)
        // The next page needs no person: the scripted channel has nothing left to answer.
        let second = try rig.service.search(all, after: UInt64(first.lastRowID), paged: true, &context, nil) { $0 }
        #expect(second.items.count == 1 && second.isComplete)
        #expect(channel.asked.count == 1)
    }

    @Test func aProtectedItemIsReadThroughTheChannelAndTheOptionsApply() throws {
        var (rig, context) = try Self.ready()
        _ = try rig.service.add(Self.item("bank", rule: "biometry-any"), returning: .init(), &context, nil)
        rig.sensor.queue(.match())
        let channel = ScriptedChannel([.waitForStop])
        #expect(try Self.read(rig, "bank", &context, channel) == "s3cret")
        #expect(channel.asked.first?.methods.contains(.biometry) == true)
        // No user interface: refused without asking.
        rig.service.setAuthOptions(AuthenticationOptions(noUserInterface: true), &context)
        #expect(throws: SecError.self) { try Self.read(rig, "bank", &context, ScriptedChannel([])) }
        // A reuse window: one touch covers the next read (the fake clock has not moved).
        rig.service.setAuthOptions(AuthenticationOptions(reuseSeconds: 60), &context)
        rig.sensor.queue(.match())
        #expect(try Self.read(rig, "bank", &context, ScriptedChannel([.waitForStop])) == "s3cret")
        #expect(try Self.read(rig, "bank", &context, nil) == "s3cret")
        rig.clock.advance(61)
        #expect(throws: SecError.self) { try Self.read(rig, "bank", &context, nil) }
    }

    @Test func statusWhoamiLockAndUnlock() throws {
        let (rig, context) = try Self.ready { $0.signedCaller("com.example.mail", ["mail", "shared"]) }
        var status = try rig.service.status()
        #expect(status.lockState == .unlocked && status.passcodeSet && status.itemCount == 0 && status.agentVersion == CofferVersion.current)
        let me = rig.service.whoami(context)
        #expect(me.kind == .signedManifest && me.appID == "com.example.mail" && me.accessGroups == ["mail", "shared"])
        try rig.service.lock(requestedBy: "a test")
        status = try rig.service.status()
        #expect(status.lockState != .unlocked)
        #expect(rig.events.all.contains(.locked))
        #expect(throws: SecError.self) { try rig.service.unlock(secret("wrong"), context) }
        try rig.service.unlock(secret(ServiceRig.passcode), context)
        #expect(rig.keychain.status.lockState == .unlocked && rig.events.all.last == .unlocked)
    }

    @Test func theIdleLockFollowsActivityOnTheFakeClock() throws {
        let rig = try ServiceRig(idleSeconds: 60, graceSeconds: 0)
        try rig.service.unlock(secret(ServiceRig.passcode), CallerContext(caller: rig.unsignedCaller))
        rig.clock.advance(50)
        rig.service.noteActivity()
        rig.clock.advance(50)
        rig.schedule.tick()
        #expect(rig.keychain.status.lockState == .unlocked, "activity 50 s ago")
        rig.clock.advance(11)
        rig.schedule.tick()
        #expect(rig.keychain.status.lockState != .unlocked)
    }

    /// The core notes activity for every item operation, whichever front end asked: a call straight
    /// to the service (as the ssh-agent front end signs with a keychain key) keeps the keychain
    /// unlocked like a native request (issue #42; before, only the native adapter noted it).
    /// A key with a reuse window (issue #42): the core keeps the grant, per caller and key, across the
    /// caller's connections (each a new context); another program, a recreated session with the same
    /// id, another key, or a lock asks again. No front end is involved.
    @Test func theCoreKeepsReuseGrantsPerCallerAcrossConnectionsUntilALock() throws {
        let (rig, _) = try Self.ready()
        let caller = rig.signedCaller("com.example.ssh", ["keys"], sessionID: 700, leaderStart: 11)
        func key(_ label: String, reuse: Int64) -> NewItem {
            NewItem(itemClass: .key, attributes: [
                "labl": .string(label), "klbl": .data(Array(label.utf8)), "kcls": .integer(KeyItem.KeyClass.private.rawValue), "extr": .bool(false),
                KeyItem.publicKeyAttribute: .data(Array(label.utf8)), KeyItem.reuseAttribute: .integer(reuse),
                AccessControl.attributeName: .data(AccessControl(parsing: "device-passcode")!.encoded()),
            ], secret: secret("private half of \(label)"))
        }
        var adding = CallerContext(caller: caller)
        for (label, reuse) in [("reused", Int64(300)), ("other", Int64(300)), ("each time", Int64(0))] {
            _ = try rig.service.addKey(key(label, reuse: reuse), returning: .init(), &adding, nil)
        }
        /// Uses key `label` as `who` on a new connection; returns how many times the person was asked.
        func use(_ label: String, as who: CallerIdentity) throws -> Int {
            var context = CallerContext(caller: who)
            let channel = ScriptedChannel([.answer(Self.passcode)])
            rig.sensor.queue(.cancelled)
            let used = try rig.service.useKey(matching: ItemQuery(itemClass: .key, attributes: ["labl": .string(label)]), what: "sign",
                                              &context, channel) { (secret, _) throws(SecError) in text(secret) }
            #expect(used == "private half of \(label)")
            return channel.asked.count
        }
        #expect(try use("reused", as: caller) == 1)
        #expect(try use("reused", as: caller) == 0, "the same caller's next connection reuses the grant")
        #expect(rig.service.sessions.count == 1)
        // Another program, the same session id recreated (another leader start time), or no session: asked.
        #expect(try use("reused", as: rig.signedCaller("com.example.other", ["keys"], sessionID: 700, leaderStart: 11)) == 1)
        #expect(try use("reused", as: rig.signedCaller("com.example.ssh", ["keys"], sessionID: 700, leaderStart: 12)) == 1)
        #expect(try use("reused", as: rig.signedCaller("com.example.ssh", ["keys"])) == 1)
        // Another key is another grant; a key without a window asks every time and keeps nothing.
        #expect(try use("other", as: caller) == 1)
        #expect(try use("each time", as: caller) == 1 && (try use("each time", as: caller)) == 1)
        #expect(try use("reused", as: caller) == 0 && (try use("other", as: caller)) == 0)
        // A lock ends every grant.
        rig.schedule.lockNow(reason: "test")
        #expect(rig.service.sessions.count == 0)
        try rig.service.unlock(secret(ServiceRig.passcode), CallerContext(caller: caller))
        #expect(try use("reused", as: caller) == 1)
    }

    /// Issue #42: "a session ends when its leader exits". The agent's timer (about once a second) ends
    /// the key grants of a caller whose login session's leader has exited, and the item grants of a
    /// process that has exited; grants of live sessions and processes stay.
    @Test func grantsEndWhenTheirSessionsLeaderOrTheirProcessExits() throws {
        let (rig, _) = try Self.ready()
        let caller = rig.signedCaller("com.example.ssh", ["keys"], sessionID: 700, leaderStart: 11)
        let other = rig.signedCaller("com.example.ssh", ["keys"], sessionID: 800, leaderStart: 12)
        var adding = CallerContext(caller: caller)
        _ = try rig.service.addKey(NewItem(itemClass: .key, attributes: [
            "labl": .string("reused"), "klbl": .data(Array("reused".utf8)), "kcls": .integer(KeyItem.KeyClass.private.rawValue),
            "extr": .bool(false), KeyItem.publicKeyAttribute: .data(Array("reused".utf8)), KeyItem.reuseAttribute: .integer(300),
            AccessControl.attributeName: .data(AccessControl(parsing: "device-passcode")!.encoded()),
        ], secret: secret("private half")), returning: .init(), &adding, nil)
        func use(as who: CallerIdentity) throws -> Int {
            var context = CallerContext(caller: who)
            let channel = ScriptedChannel([.answer(Self.passcode)])
            rig.sensor.queue(.cancelled)
            _ = try rig.service.useKey(matching: ItemQuery(itemClass: .key, attributes: ["labl": .string("reused")]), what: "sign",
                                       &context, channel) { (secret, _) throws(SecError) in text(secret) }
            return channel.asked.count
        }
        #expect(try use(as: caller) == 1 && (try use(as: other)) == 1)
        // Item grants of two processes (a prompt's read, as the Secret Service front end gets them).
        var holder = CallerContext(caller: caller.withProcessStartTime(5))
        holder.setAuthOptions(AuthenticationOptions(reuseSeconds: 60))
        holder.recordAuthorization(AuthorizationContext(passcodeVerified: true), now: rig.clock.now(), generation: rig.gate.lockGeneration)
        let carried = try #require(holder.carriedAuthorization(now: rig.clock.now()))
        let gone = CallerIdentity(pid: 4242, uid: caller.uid, establishedBy: caller.establishedBy, accessGroups: caller.accessGroups,
                                  session: other.session).withProcessStartTime(6)
        rig.service.sessions.grant([[1]], to: caller.withProcessStartTime(5), carried, now: rig.clock.now(), generation: rig.gate.lockGeneration)
        rig.service.sessions.grant([[2]], to: gone, carried, now: rig.clock.now(), generation: rig.gate.lockGeneration)
        #expect(rig.service.sessions.count == 4)
        func ticks(_ n: Int) { for _ in 0..<n { rig.schedule.tick() } }
        ticks(LockSchedule.ticksPerSweep)
        #expect(rig.service.sessions.count == 4, "every session and process is live: nothing ends")
        // Session 700's leader exits, and process 4242: their grants end at the next sweep, not before.
        rig.endedSessions.withLock { _ = $0.insert(caller.session!) }
        rig.exitedProcesses.withLock { _ = $0.insert(4242) }
        ticks(LockSchedule.ticksPerSweep - 1)
        #expect(rig.service.sessions.count == 4)
        ticks(1)
        #expect(rig.service.sessions.count == 2, "session 800's key grant and the live process's item grant stay")
        #expect(try use(as: other) == 0, "a live session's grant is still served")
        #expect(rig.service.sessions.itemGrants(for: caller.withProcessStartTime(5), now: rig.clock.now(), generation: rig.gate.lockGeneration).count == 1)
        #expect(rig.service.sessions.itemGrants(for: gone, now: rig.clock.now(), generation: rig.gate.lockGeneration).isEmpty)
    }

    /// The agent's own check of an item grant's holder, on a real process: live with its start time,
    /// not with another, and not once it has exited.
    @Test func aGrantHoldersLivenessIsItsPidAndStartTime() throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/bin/sleep")
        p.arguments = ["60"]
        try p.run()
        let pid = p.processIdentifier
        let start = try #require(ProcessStat.of(pid: pid)?.startTime)
        #expect(CallerSessions.processIsLive(pid, start))
        #expect(!CallerSessions.processIsLive(pid, start + 1), "another start time is another process")
        kill(pid, SIGKILL)
        p.waitUntilExit()
        #expect(!CallerSessions.processIsLive(pid, start))
    }

    @Test func everyItemOperationOfTheCoreIsActivity() throws {
        let rig = try ServiceRig(idleSeconds: 60, graceSeconds: 0)
        var context = CallerContext(caller: rig.unsignedCaller)
        try rig.service.unlock(secret(ServiceRig.passcode), context)
        rig.clock.advance(50)
        _ = try rig.service.add(Self.item("active"), returning: .init(), &context, nil)
        rig.clock.advance(50)
        rig.schedule.tick()
        #expect(rig.keychain.status.lockState == .unlocked, "an add 50 s ago")
        rig.clock.advance(11)
        rig.schedule.tick()
        #expect(rig.keychain.status.lockState != .unlocked)
    }

    @Test func noIdleLockStartsWhileARequestRunsAndIdleTimeCountsFromItsEnd() throws {
        let rig = try ServiceRig(idleSeconds: 60, graceSeconds: 0)
        let context = CallerContext(caller: rig.unsignedCaller)
        // A passcode set whose KDF outlasts the idle time: the timer ticks while it runs, and its
        // `unlocked` is the last word, not a lock that raced it.
        rig.service.asActivity {
            try? rig.service.unlock(secret(ServiceRig.passcode), context)
            rig.clock.advance(61)
            rig.schedule.tick()
        }
        #expect(rig.keychain.status.lockState == .unlocked && rig.events.all.last == .unlocked)
        rig.clock.advance(59)
        rig.schedule.tick()
        #expect(rig.keychain.status.lockState == .unlocked, "the request ended 59 s ago")
        rig.clock.advance(2)
        rig.schedule.tick()
        #expect(rig.keychain.status.lockState != .unlocked && rig.events.all.last == .locked)
    }

    @Test func thePasscodeIsChangedSyncedAndRemoved() throws {
        let (rig, context) = try Self.ready()
        try rig.service.setPasscode(current: secret(ServiceRig.passcode), new: secret(ServiceRig.passcode), context)
        // The login password changed outside Coffer: out of sync until synced with the old one.
        _ = rig.keychain.lock()
        rig.verifier.accepted = "new login"
        #expect(throws: SecError.self) { try rig.service.unlock(secret("new login"), context) }
        #expect(rig.service.passcodeOutOfSync)
        try rig.service.syncPasscode(old: secret(ServiceRig.passcode), context)
        #expect(!rig.service.passcodeOutOfSync && rig.keychain.status.lockState == .unlocked)
        try rig.service.removePasscode(current: secret("new login"), context)
        #expect(try !rig.service.status().passcodeSet)
    }

    @Test func backupsChecksAndEscrowNeedThePersonAndAWholeKeychainCaller() throws {
        var (rig, context) = try Self.ready()
        _ = try rig.service.add(Self.item("kept"), returning: .init(), &context, nil)
        let path = rig.dir.file("all.cfbu")
        #expect(try rig.service.createBackup(path: path, password: secret("backup pw"), &context, ScriptedChannel([.answer(Self.passcode)])) == 1)
        let dry = try rig.service.restoreBackup(path: path, password: secret("backup pw"), dryRun: true, &context,
                                                ScriptedChannel([.answer(Self.passcode)]))
        #expect(dry.duplicates == 1 && dry.added == 0)
        #expect(try rig.service.check(.verify, context).findings.isEmpty)
        let escrow = try rig.service.createEscrow(&context, ScriptedChannel([.answer(Self.passcode)]))
        _ = rig.keychain.lock()
        try rig.service.unlock(escrowSecret: escrow, context)
        #expect(rig.keychain.status.lockState == .unlocked)
        try rig.service.revokeEscrow(passcode: secret(ServiceRig.passcode), context)
        // A signed app reaches only its groups: none of this is for it.
        var app = CallerContext(caller: rig.signedCaller("com.example.mail", ["mail"]))
        #expect(Self.status { () throws(SecError) in _ = try rig.service.check(.verify, app) } == .missingEntitlement)
        let channel = ScriptedChannel([.answer(Self.passcode)])
        #expect(Self.status { () throws(SecError) in _ = try rig.service.createEscrow(&app, channel) } == .missingEntitlement)
        #expect(channel.asked.isEmpty, "refused before the person is asked")
    }

    /// Subscribers of item changes hear one `itemsChanged` for each write that succeeded, one for a
    /// restore that added items, and nothing for a failed write, a read or a dry run.
    @Test func everySuccessfulWriteAndRestoreIsOneItemsChangedEvent() throws {
        var (rig, context) = try Self.ready()
        func changes() -> Int { rig.events.all.filter { $0.topic == .items }.count }
        rig.events.clear()
        _ = try rig.service.add(Self.item("kept"), returning: .init(), &context, nil)
        #expect(changes() == 1)
        #expect(Self.status { () throws(SecError) in _ = try rig.service.add(Self.item("kept"), returning: .init(), &context, nil) } == .duplicateItem)
        #expect(changes() == 1, "a failed add changes nothing")
        #expect(try Self.read(rig, "kept", &context, nil) == "s3cret")
        #expect(try rig.service.update(Self.query("kept"), ItemChanges(attributes: ["labl": .string("l")]), &context, nil) == 1)
        #expect(changes() == 2)
        let path = rig.dir.file("events.cfbu")
        #expect(try rig.service.createBackup(path: path, password: secret("backup pw"), &context, ScriptedChannel([.answer(Self.passcode)])) == 1)
        #expect(try rig.service.delete(Self.query("kept"), &context, nil) == 1)
        #expect(changes() == 3)
        #expect(Self.status { () throws(SecError) in _ = try rig.service.delete(Self.query("kept"), &context, nil) } == .itemNotFound)
        _ = try rig.service.restoreBackup(path: path, password: secret("backup pw"), dryRun: true, &context, ScriptedChannel([.answer(Self.passcode)]))
        #expect(changes() == 3, "a failed delete and a dry run change nothing")
        let restored = try rig.service.restoreBackup(path: path, password: secret("backup pw"), dryRun: false, &context,
                                                     ScriptedChannel([.answer(Self.passcode)]))
        #expect(restored.added == 1 && changes() == 4)
        // Lock events are not item changes.
        _ = rig.keychain.lock()
        #expect(changes() == 4)
    }

    /// Each write's event names exactly the access groups whose items it changed: an add its item's
    /// group (the caller's default when it names none), an update or delete without a group every
    /// group it touched and no other, an update that moves items both groups. A restore names none.
    @Test func everyWriteNamesTheGroupsItChanged() throws {
        var (rig, context) = try Self.ready { $0.signedCaller("com.example.mail", ["mail", "shared", "other"]) }
        func last() -> LockEvent? { rig.events.all.last { $0.topic == .items } }
        func item(_ service: String, _ group: String?) -> NewItem {
            var item = Self.item(service)
            if let group { item.attributes["agrp"] = .string(group) }
            return item
        }
        _ = try rig.service.add(item("a", nil), returning: .init(), &context, nil)
        #expect(last() == .itemsChanged(groups: ["mail"]), "an add without agrp goes to the default group")
        _ = try rig.service.add(item("a", "shared"), returning: .init(), &context, nil)
        #expect(last() == .itemsChanged(groups: ["shared"]))
        _ = try rig.service.add(item("b", "other"), returning: .init(), &context, nil)
        #expect(last() == .itemsChanged(groups: ["other"]))
        // No group named: the update reaches both "a" items, in mail and shared, and nothing in other.
        #expect(try rig.service.update(Self.query("a", data: false), ItemChanges(attributes: ["labl": .string("l")]), &context, nil) == 2)
        #expect(last() == .itemsChanged(groups: ["mail", "shared"]))
        var moved = Self.query("b", data: false)
        moved.attributes["agrp"] = .string("other")
        #expect(try rig.service.update(moved, ItemChanges(attributes: ["agrp": .string("mail")]), &context, nil) == 1)
        #expect(last() == .itemsChanged(groups: ["mail", "other"]), "a move changes both groups")
        let count = rig.events.all.count
        #expect(Self.status { () throws(SecError) in _ = try rig.service.delete(moved, &context, nil) } == .itemNotFound)
        #expect(rig.events.all.count == count, "a failed delete is no event")
        #expect(try rig.service.delete(Self.query("b", data: false), &context, nil) == 1)
        #expect(last() == .itemsChanged(groups: ["mail"]))
        #expect(try rig.service.delete(Self.query("a", data: false), &context, nil) == 2)
        #expect(last() == .itemsChanged(groups: ["mail", "shared"]))
    }

    /// The handler run after each write (the sync service's) runs at the same stack depth after
    /// thousands of writes as after the first. It was once kept as a `Protected` closure, which an
    /// unoptimised build wrapped in two more thunks at every write: the agent's stack overflowed
    /// after a few thousand writes (the short stress run's 64 clients killed a debug agent).
    @Test func theWriteHandlerDoesNotGrowDeeperWithEachWrite() throws {
        var (rig, context) = try Self.ready()
        // Frames on the stack when the handler runs (counted, not measured by address: a sanitizer
        // may keep locals on a stack of its own). Counted at the first and the last write only.
        let calls = Protected(0), depths = Protected<[Int]>([])
        let writes = 20_002
        rig.service.onItemsWritten {
            let n = calls.withLock { $0 += 1; return $0 }
            if n == 1 || n == writes { depths.withLock { $0.append(Thread.callStackReturnAddresses.count) } }
        }
        _ = try rig.service.add(Self.item("first"), returning: .init(), &context, nil)
        for _ in 0..<(writes - 2) { rig.service.noteItemsWritten() }
        #expect(try rig.service.delete(Self.query("first"), &context, nil) == 1)
        #expect(calls.withLock { $0 } == writes, "the handler ran once per write")
        let seen = depths.withLock { $0 }
        // The first and last writes go through the same calls (an add and a delete): the same depth,
        // give or take a frame. The old code was two frames deeper per write.
        #expect(seen.count == 2 && abs(seen[0] - seen[1]) <= 4, "frames at the first and the last write: \(seen)")
    }

    @Test func theShellHelperIsAuthorizedForAnotherGroup() throws {
        let (rig, _) = try Self.ready()
        var shell = CallerContext(caller: rig.signedCaller(AccessPolicy.defaultShellAppID, ["shell"]))
        var mail = CallerContext(caller: rig.signedCaller("com.example.mail", ["mail"]))
        _ = try rig.service.add(Self.item("imap"), returning: .init(), &mail, nil)
        #expect(throws: SecError.self) { try Self.read(rig, "imap", &shell, nil) }
        try rig.service.authorizeGroup("mail", passcode: secret(ServiceRig.passcode), &shell)
        var q = Self.query("imap")
        q.attributes["agrp"] = .string("mail")
        #expect(try rig.service.search(q, &shell, nil) { text($0.items.first?.data) } == "s3cret")
        // Not for an app.
        #expect(throws: SecError.self) { try rig.service.authorizeGroup("chat", passcode: secret(ServiceRig.passcode), &mail) }
    }

    @Test func localAuthenticationAndBiometry() throws {
        var (rig, context) = try Self.ready()
        #expect(rig.service.canEvaluate(.deviceOwnerAuthenticationWithBiometrics, context).error == nil)
        rig.sensor.queue(.match())
        #expect(rig.service.evaluate(.deviceOwnerAuthentication, reason: "test", &context, ScriptedChannel([.waitForStop])).error == nil)
        #expect(rig.service.evaluate(.deviceOwnerAuthentication, reason: "test", &context, ScriptedChannel([.answer(.cancel)])).error == .userCancel)
        let before = rig.service.biometryStatus()
        #expect(before.authenticator == "fake-sensor" && before.available && !before.lockedOut)
        try rig.service.changeEnrollment(enroll: true, name: "thumb", &context, ScriptedChannel([.answer(Self.passcode)]))
        #expect(rig.service.biometryStatus().domainState != before.domainState, "a new finger changes the domain state")
        // A touch (the emulator's control command) answers the next evaluation.
        try rig.service.presentFinger("thumb")
        #expect(rig.service.evaluate(.deviceOwnerAuthenticationWithBiometrics, reason: "test", &context,
                                     ScriptedChannel([.waitForStop])).error == nil)
    }
}
