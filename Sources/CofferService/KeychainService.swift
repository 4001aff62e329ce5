package import CofferCrypto
package import CofferKeybag
package import CofferKeychain
package import CofferModel
import CofferPolicy
package import CofferSystem
package import Logging

/// The agent's operations without a protocol: each takes the caller's ``CallerContext`` (identity and
/// authorization state) and, where a person may have to authenticate, an ``AuthChannel``; each
/// answers in model values (items, counts, ``StatusReply``, ``LAResult``, …) or a ``SecError``. A
/// front end (the native protocol's `Pipeline`, a line protocol in the tests) decodes its requests,
/// calls these, and encodes the answers; none of this knows a frame, a request id or a wire type.
///
/// Stages: the policy (``AccessGate``: the caller's ``AccessScope`` for each item operation, and an
/// audit record of every item operation, allowed or denied), the authentication (``Authenticator``,
/// asked only when the keychain answers that a match's access control needs more), then the keychain,
/// which gets the scope, never the caller.
package final class KeychainService: Sendable {
    package let keychain: Keychain
    /// Index searches the keychain has made (COUNTERS), for a front end that need not know the keychain.
    package var searchCount: Int { keychain.searchCount }
    /// Whether a passcode is set, for a front end that need not know the keychain.
    package var passcodeSet: Bool { keychain.status.passcodeSet }
    package let unlocking: UnlockService
    package let schedule: LockSchedule
    package let logger: Logger
    /// Reported in ``status()``.
    package let idleLockSeconds: UInt32
    /// The agent's version, reported in ``status()``.
    package let agentVersion: String
    /// The policy stage: scopes, authorizations, the audit log.
    package let gate: AccessGate
    /// Authentication for items with access controls and LocalAuthentication.
    package let authenticator: Authenticator
    /// The reuse grants callers hold across their connections (``CallerSessions``; ended at every lock).
    package var sessions: CallerSessions { schedule.sessions }
    /// Argon2id settings for backup passwords.
    package var backupKDF: KDFParameters { unlocking.backupKDF }
    /// True while a passcode is set and the keybag is locked (`coffer lock`, the idle or session
    /// lock, before the first unlock): what every front end reports as a locked keychain.
    package var isLocked: Bool {
        let status = keychain.status
        return status.passcodeSet && status.lockState != .unlocked
    }
    let clock: any MonotonicClock
    /// Called after every add, update or delete that succeeded (the agent's sync pushes soon after).
    /// Held in a class: a closure that is itself a `Protected`'s state is wrapped in two more
    /// reabstraction thunks by every `withLock` of an unoptimised build (the generic `inout` state is
    /// converted to the closure's own representation and back, and written back), so each write made
    /// the next call deeper, until a connection thread's stack overflowed after a few thousand writes.
    private let itemsWritten = Protected<ItemsWrittenHandler?>(nil)

    /// Sets what runs after every successful item write (``noteItemsWritten()``).
    package func onItemsWritten(_ run: @escaping @Sendable () -> Void) {
        itemsWritten.withLock { $0 = ItemsWrittenHandler(run) }
    }

    /// Runs the handler set with ``onItemsWritten(_:)``, if any (outside the lock).
    package func noteItemsWritten() {
        itemsWritten.withLock { $0 }?.run()
    }

    /// What runs after a restore that recorded protected directories (the file protection service adds
    /// their keys to the kernel as their classes say); held in a class for the reason given above.
    private let directoriesRestored = Protected<DirectoriesRestoredHandler?>(nil)

    /// The user's login sessions as pam_coffer tells them (SESSION: opened minus closed, never below 0).
    private let loginSessions = Protected(0)
    /// What runs when the last of them closes (the file protection service removes the keys that last
    /// until the last logout); held in a class for the reason given above.
    private let lastSessionEnded = Protected<ItemsWrittenHandler?>(nil)

    /// Sets what runs when the user's last login session closes.
    package func onLastSessionEnded(_ run: @escaping @Sendable () -> Void) {
        lastSessionEnded.withLock { $0 = ItemsWrittenHandler(run) }
    }

    /// SESSION (pam_coffer's open and close_session): counts the user's login sessions. When the last one
    /// closes the person has logged out everywhere: the keychain locks (after its grace, as any lock
    /// request) and what lasts until the last logout ends (UntilFirstUserAuthentication directories'
    /// keys). Only the owner's tools (pam_coffer runs as the user), never a delegated connection. Returns
    /// the sessions open now.
    @discardableResult
    package func loginSession(opened: Bool, _ context: CallerContext) throws(SecError) -> Int {
        guard !context.isDelegated else { throw SecError(.missingEntitlement, "login sessions are reported by pam_coffer, not on a delegated connection") }
        try mayManageKeychain(context.caller, "report a login session")
        let (open, last) = loginSessions.withLock { n -> (Int, Bool) in
            if opened { n += 1; return (n, false) }
            guard n > 0 else { return (0, false) }
            n -= 1
            return (n, n == 0)
        }
        logger.info(opened ? "a login session opened" : "a login session closed", metadata: ["open": "\(open)"])
        // With no passcode nothing locks, and nothing would add the keys back: the last logout changes nothing.
        if last && keychain.status.passcodeSet {
            logger.notice("the last login session closed: locking")
            schedule.requestLock(reason: "the last login session closed")
            lastSessionEnded.withLock { $0 }?.run()
        }
        return open
    }

    /// NOTE_ACCESS: what a front end's client did with an item the front end holds itself (not the
    /// keychain's), written to the audit log under the client's identity (the connection's delegated
    /// caller), with the group the policy gives it and the reason `held-by-front-end`. Only on a
    /// delegated connection: the front end speaks for its client there, and nowhere else.
    package func noteAccess(_ access: NotedAccess, _ context: CallerContext) throws(SecError) {
        guard context.isDelegated else {
            throw SecError(.missingEntitlement, "NOTE_ACCESS is a front end's, on a connection delegated to its client")
        }
        var group: String? = nil
        if case .allowed(let scope) = gate.scope(for: context) { group = scope.defaultGroup }
        gate.record(context.caller, operation: access.operation, group: group, itemClass: .genericPassword, status: .success,
                    reason: "held-by-front-end")
    }

    /// Sets what runs after a backup restore recorded protected directories.
    package func onDirectoriesRestored(_ run: @escaping @Sendable ([FileKeyRecord]) -> Void) {
        directoriesRestored.withLock { $0 = DirectoriesRestoredHandler(run) }
    }

    package init(keychain: Keychain, unlocking: UnlockService, schedule: LockSchedule, gate: AccessGate, authenticator: Authenticator,
                 clock: any MonotonicClock, logger: Logger, idleLockSeconds: UInt32, agentVersion: String) {
        self.keychain = keychain
        self.unlocking = unlocking
        self.schedule = schedule
        self.gate = gate
        self.authenticator = authenticator
        self.clock = clock
        self.logger = logger
        self.idleLockSeconds = idleLockSeconds
        self.agentVersion = agentVersion
    }

    /// A request that uses the keychain (not a status poll, a subscription, whoami or canEvaluate):
    /// activity for the idle lock.
    package func noteActivity() { schedule.touch() }

    /// Runs `body`, a request that uses the keychain: activity for the idle lock from its start to its
    /// end, and no idle lock while it runs (``LockSchedule/beginActivity()``).
    package func asActivity<T>(_ body: () -> T) -> T {
        schedule.beginActivity()
        defer { schedule.endActivity() }
        return body()
    }

    /// Whether `context` may hear that items changed (WireProtocol.md, Events): only a caller whose
    /// manifest grants `delegate-identity`, on a connection that is not delegated. To any other caller
    /// it would be a clock of other apps' writes; a front end trusted to act for the user's processes
    /// could learn as much by acting for them.
    package func mayHearItemChanges(_ context: CallerContext) throws(SecError) {
        guard context.caller.mayDelegate, !context.isDelegated else {
            throw SecError(.missingEntitlement, "only a caller whose manifest grants delegate-identity may subscribe to item changes")
        }
    }

    /// Logs a failed operation (a refused write after the keybag files changed is an error).
    package func logFailure(_ error: SecError, peer: String) {
        logger.debug("request failed", metadata: ["status": "\(error.status.name)", "peer": "\(peer)"])
        if error.status == .notAvailable && keychain.keybagFilesChanged {
            logger.error("refused a write: \(error.message)", metadata: ["peer": "\(peer)"])
        }
    }

    // MARK: The conversation

    /// How the caller's later requests may authenticate (an `LAContext`'s settings).
    package func setAuthOptions(_ options: AuthenticationOptions, _ context: inout CallerContext) {
        context.setAuthOptions(options)
    }

    /// The keychain's state.
    package func status() throws(SecError) -> StatusReply {
        let status = keychain.status
        return StatusReply(lockState: status.lockState, passcodeSet: status.passcodeSet,
                           itemCount: UInt64(try keychain.count()), agentVersion: agentVersion,
                           lockedMemoryBytes: UInt64(SecureMemory.lockedBytes() ?? 0), idleLockSeconds: idleLockSeconds)
    }

    /// Which protections are active: the device key's place, who counts wrong passcodes (and whether
    /// anyone can reset the TPM's count: its lockout authorization, asked now; a TPM that does not
    /// answer is taken at its last answer, and as empty if it never gave one), and whether a TPM
    /// counter anchors the keychain against rollback, as the keychain has them now.
    package func protections() -> ProtectionsReply {
        let counted = keychain.attemptsCountedByTPM
        return ProtectionsReply(deviceKeyInTPM: keychain.deviceKeyKind == .tpm, attemptsCountedByTPM: counted,
                                tpmLockoutAuthorizationEmpty: counted && keychain.tpmLockoutAuthorizationSet != true,
                                rollbackDetection: keychain.rollbackDetection)
    }

    /// What `coffer whoami` shows for the caller.
    package func whoami(_ context: CallerContext) -> WhoAmIReply { gate.whoami(context.caller) }

    // MARK: Unlocking and the passcode

    /// Unlocks the keybag with the passcode.
    package func unlock(_ passcode: SecureBytes, _ context: CallerContext) throws(SecError) {
        try audited(context.caller, "unlock") { () throws(SecError) in
            try mayTryPasscode(context.caller, "unlock the keychain")
            try unlocking.unlock(passcode)
        }
        schedule.didUnlock()
        LegacyGroups.migrate(keychain, logger: logger)
    }

    /// Locks the keybag now (`who` names the requester in the log).
    package func lock(requestedBy who: String) throws(SecError) {
        guard keychain.status.passcodeSet else {
            throw .notAvailable("no passcode is set, so nothing protects the keys; set one with 'coffer passcode set'")
        }
        schedule.lockNow(reason: "requested by \(who)")
    }

    /// Sets or changes the passcode.
    package func setPasscode(current: SecureBytes, new: SecureBytes, _ context: CallerContext) throws(SecError) {
        try audited(context.caller, "set-passcode") { () throws(SecError) in
            try mayTryPasscode(context.caller, "set or change the passcode")
            try unlocking.setPasscode(current: current, new: new)
        }
        schedule.didUnlock()
        LegacyGroups.migrate(keychain, logger: logger)
    }

    /// Removes the passcode (every reused authentication ends).
    package func removePasscode(current: SecureBytes, _ context: CallerContext) throws(SecError) {
        try audited(context.caller, "remove-passcode") { () throws(SecError) in
            try mayManageKeychain(context.caller, "remove the passcode")
            try unlocking.removePasscode(current: current)
        }
        gate.endAuthentications()
        schedule.didUnlock()
    }

    /// True if the login password changed and the keybag still has the old one.
    package var passcodeOutOfSync: Bool { unlocking.isOutOfSync }

    /// Re-wraps the keybag under the login password, given the old one.
    package func syncPasscode(old: SecureBytes, _ context: CallerContext) throws(SecError) {
        guard old.count > 0 else { throw .param("the old passcode is empty") }
        try audited(context.caller, "passcode-sync") { () throws(SecError) in
            try mayTryPasscode(context.caller, "sync the passcode")
            try unlocking.sync(oldPasscode: old)
        }
        schedule.didUnlock()
        LegacyGroups.migrate(keychain, logger: logger)
    }

    /// The shell helper asks the user to let it use `group` (the passcode proves the user).
    package func authorizeGroup(_ group: String, passcode: SecureBytes, _ context: inout CallerContext) throws(SecError) {
        let caller = context.caller
        try audited(caller, "authorize", group: group) { () throws(SecError) in
            guard gate.policy.mayRequestAuthorization(caller) else {
                throw SecError(.missingEntitlement, "only the shell helper (app \(gate.policy.shellAppID ?? "none")) may ask to use another access group")
            }
            try unlocking.authorize(passcode)
        }
        gate.authorized(group, context: &context)
        logger.notice("the user authorized another access group", metadata: ["group": "\(group)", "caller": "\(caller)"])
    }

    // MARK: Backups, checks, escrow

    /// Writes a backup of every item to `path`; the number of items.
    package func createBackup(path: String, password: SecureBytes, _ context: inout CallerContext,
                              _ channel: (any AuthChannel)?) throws(SecError) -> Int {
        try audited(context.caller, "backup-create") { () throws(SecError) -> Int in
            try mayManageKeychain(context.caller, "write a backup")
            try withPasscode(&context, channel, what: "write a backup of every item to \u{201C}\(TerminalSafeText.escaped(path))\u{201D}")
            let (bytes, count) = try keychain.backup(password: password, kdf: backupKDF)
            do { try Files.writeAtomically(path, bytes, mode: 0o600, temporary: .unique) } catch { throw SecError(.io, "cannot write the backup: \(error)") }
            logger.notice("backup written", metadata: ["items": "\(count)", "caller": "\(context.caller)"])
            return count
        }
    }

    /// Restores the backup at `path` (or, `dryRun`, only reads it).
    package func restoreBackup(path: String, password: SecureBytes, dryRun: Bool, _ context: inout CallerContext,
                               _ channel: (any AuthChannel)?) throws(SecError) -> Keychain.RestoreSummary {
        try audited(context.caller, dryRun ? "backup-check" : "backup-restore") { () throws(SecError) -> Keychain.RestoreSummary in
            try mayManageKeychain(context.caller, dryRun ? "read a backup" : "restore a backup")
            try withPasscode(&context, channel, what: dryRun ? "read the backup \u{201C}\(TerminalSafeText.escaped(path))\u{201D}"
                                                        : "restore the backup \u{201C}\(TerminalSafeText.escaped(path))\u{201D} into this keychain")
            let bytes: [UInt8]
            do { bytes = try Files.read(path, maxBytes: 1 << 30) } catch { throw SecError(.io, "cannot read the backup: \(error)") }
            let r = try keychain.restoreBackup(bytes, password: password, dryRun: dryRun)
            if !dryRun {
                logger.notice("backup restored", metadata: ["added": "\(r.added)", "duplicates": "\(r.duplicates)",
                                                            "directories": "\(r.directories.count)"])
            }
            if !dryRun, r.added > r.directories.count { schedule.announceItemsChanged() }
            if !dryRun, !r.directories.isEmpty { directoriesRestored.withLock { $0 }?.run(r.directories) }
            return r
        }
    }

    /// Checks every group's items (references and reasons, never values): whole-keychain callers only.
    /// Paged as ``Keychain/check(_:after:wholeOrNothing:fits:)`` is (`fits`: the front end's reply size).
    package func check(_ operation: CheckOperation, after cursor: UInt64 = 0, wholeOrNothing: Bool = false, _ context: CallerContext,
                       fits: (CheckFinding) -> Bool = { _ in true }) throws(SecError) -> CheckReport {
        try audited(context.caller, "check") { () throws(SecError) -> CheckReport in
            try mayManageKeychain(context.caller, "check every item")
            let report = try keychain.check(operation, after: Int64(clamping: cursor), wholeOrNothing: wholeOrNothing, fits: fits)
            if operation != .verify && operation != .listQuarantine {
                logger.notice("check", metadata: ["operation": "\(operation == .quarantine ? "quarantine" : "restore")",
                                                  "findings": "\(report.findings.count)"])
                if !report.findings.isEmpty { schedule.announceItemsChanged() } // items left or came back
            }
            return report
        }
    }

    /// Makes an escrow record; its secret. It opens everything without the person later: making one
    /// needs the person now.
    package func createEscrow(_ context: inout CallerContext, _ channel: (any AuthChannel)?) throws(SecError) -> SecureBytes {
        try audited(context.caller, "escrow-create") { () throws(SecError) -> SecureBytes in
            try mayManageKeychain(context.caller, "create an escrow record")
            try withPasscode(&context, channel, what: "create an escrow record (it unlocks this keychain without you)")
            let secret = try keychain.createEscrow()
            logger.notice("escrow record created", metadata: ["caller": "\(context.caller)"])
            return secret
        }
    }

    /// Unlocks with an escrow record's secret.
    package func unlock(escrowSecret secret: SecureBytes, _ context: CallerContext) throws(SecError) {
        try audited(context.caller, "escrow-unlock") { () throws(SecError) in
            try mayTryPasscode(context.caller, "unlock the keychain")
            try unlocking.unlock(escrowSecret: secret)
        }
        schedule.didUnlock()
    }

    /// Revokes the escrow record.
    package func revokeEscrow(passcode: SecureBytes, _ context: CallerContext) throws(SecError) {
        try audited(context.caller, "escrow-revoke") { () throws(SecError) in
            try mayManageKeychain(context.caller, "revoke the escrow record")
            try unlocking.revokeEscrow(passcode: passcode)
        }
        schedule.didUnlock()
    }

    // MARK: LocalAuthentication

    /// LAContext.canEvaluatePolicy for the caller (no person involved).
    package func canEvaluate(_ policy: LAPolicy, _ context: CallerContext) -> LAResult {
        let error = authenticator.canEvaluate(policy, caller: context.caller)
        let b = authenticator.biometry
        return LAResult(error: error?.code, biometryType: b.available ? 1 : 0, domainState: b.enrolled ? b.domainState : [],
                        message: error?.message ?? "")
    }

    /// LAContext.evaluatePolicy: one round with the person.
    package func evaluate(_ policy: LAPolicy, reason: String, _ context: inout CallerContext, _ channel: (any AuthChannel)?) -> LAResult {
        let caller = context.caller
        do throws(LAError) {
            try authenticator.evaluate(policy, reason: reason, context: &context, channel: channel)
        } catch {
            gate.record(caller, operation: "la-evaluate", group: nil, itemClass: nil, status: error.code.secStatus)
            let b = authenticator.biometry
            return LAResult(error: error.code, biometryType: b.available ? 1 : 0, domainState: [], message: error.message)
        }
        gate.record(caller, operation: "la-evaluate", group: nil, itemClass: nil, status: .success)
        let b = authenticator.biometry
        return LAResult(error: nil, biometryType: b.available ? 1 : 0, domainState: b.enrolled ? b.domainState : [], message: "")
    }

    // MARK: Biometry

    /// The biometric authenticator as the agent sees it.
    package func biometryStatus() -> BioStatus {
        let sensor = authenticator.sensor
        let b = authenticator.biometry
        let detail = (try? sensor.control("status", []))?.text ?? ""
        return BioStatus(authenticator: sensor.name, available: b.available, enrolledCount: b.enrolledCount,
                         lockedOut: b.lockedOut, domainState: b.enrolled ? b.domainState : [],
                         detail: String(detail.prefix(1024)).split(separator: "\n", omittingEmptySubsequences: false)
                             .map { TerminalSafeText.escaped(String($0)) }.joined(separator: "\n"))
    }

    /// Enrolls (`enroll`) or removes a finger: it changes who can open biometric items, so it needs
    /// the passcode (as on iOS).
    package func changeEnrollment(enroll: Bool, name: String, _ context: inout CallerContext, _ channel: (any AuthChannel)?) throws(SecError) {
        let sensor = authenticator.sensor
        let caller = context.caller
        let verb = enroll ? "enroll" : "remove"
        try audited(caller, "bio-\(verb)") { () throws(SecError) in
            try mayManageKeychain(caller, "\(verb) a finger")
            _ = try sensor.control("status", []) // no authenticator: say so before asking for the passcode
            try withPasscode(&context, channel, what: "\(verb) the finger \u{201C}\(TerminalSafeText.escaped(name))\u{201D}")
            let (code, text) = try sensor.control(verb, [name])
            guard code == 0 else { throw .param("the biometric authenticator refused: \(TerminalSafeText.escaped(String(text.prefix(256))))") }
            logger.notice("biometry: a finger was \(enroll ? "enrolled" : "removed")", metadata: ["caller": "\(caller)"])
        }
    }

    /// A touch of the sensor (the biometric emulator): `name`'s finger, or nil for an unknown one.
    /// An evaluation this agent has started may not be waiting in the plugin yet (the plugin host starts it
    /// a round trip after `AUTH_NEEDED` went out): while one is running, a touch that finds none waiting is
    /// tried again for up to ``touchWaitSeconds``. With no evaluation running it is refused at once (a
    /// touch is never remembered for a later evaluation).
    package func presentFinger(_ name: String?) throws(SecError) {
        // Real time (the plugin host's), not the service's clock, which tests drive by hand.
        let realTime = SystemClock()
        let deadline = realTime.now() + Self.touchWaitSeconds
        while true {
            let (code, text) = try authenticator.sensor.control("present", name.map { [$0] } ?? ["--unknown"])
            if code == 0 { return }
            guard BiometricEvaluation.running > 0, realTime.now() < deadline else {
                throw .notAvailable("the sensor did not take the touch: \(TerminalSafeText.escaped(String(text.prefix(256))))")
            }
            Threads.sleep(seconds: 0.02)
        }
    }

    /// How long a touch waits for an evaluation that is starting (a loaded machine may take seconds
    /// between AUTH_NEEDED and the plugin's wait).
    package static let touchWaitSeconds = 10.0

    // MARK: Items

    /// What an added item's answer holds.
    package struct Returning: Sendable, Equatable {
        package var data = false
        package var attributes = false
        package var persistentRef = false
        package init(data: Bool = false, attributes: Bool = false, persistentRef: Bool = false) {
            self.data = data
            self.attributes = attributes
            self.persistentRef = persistentRef
        }
        package var isEmpty: Bool { !data && !attributes && !persistentRef }
    }

    /// SecItemAdd in the caller's scope. `admit` sees the scope before anything is written (a front end
    /// refuses there an item whose answer it could not send); an application-password rule asks for
    /// the password (given in advance or through `channel`).
    package func add(_ item: NewItem, returning: Returning, _ context: inout CallerContext, _ channel: (any AuthChannel)?,
                     admit: (AccessScope) throws(SecError) -> Void = { _ in }) throws(SecError) -> ItemResult {
        // Activity for the idle lock, from its start to its end, whichever front end asked.
        schedule.beginActivity()
        defer { schedule.endActivity() }
        let named = item.attributes.accessGroup
        var item = item
        try recordDomainState(&item)
        var group = named
        let result = try itemOperation(&context, "add", group: named, itemClass: item.itemClass) { (scope, context) throws(SecError) in
            try admit(scope)
            let password = try applicationPasswordForNewItem(item, &context, channel)
            group = named ?? scope.defaultGroup
            return try keychain.add(item, scope: scope, returnData: returning.data, returnAttributes: returning.attributes,
                                    returnPersistentRef: returning.persistentRef, applicationPassword: password)
        }
        didWrite(group.map { [$0] } ?? [])
        return result
    }

    /// SecItemCopyMatching in the caller's scope: the matches after `cursor` (0: from the start), each
    /// offered to `fits` (a front end's reply size); `reply` turns the page into the front end's
    /// answer inside the audited operation (so a page that cannot be sent is audited as failing).
    /// A `paged` search keeps its first page's authorization for its later pages.
    ///
    /// Items the caller's process holds a grant for (``CallerSessions``: a Secret Service prompt read
    /// them for it) are read with that grant, without asking again. With `granting`, the items the
    /// person authenticated for are granted to the caller's process for
    /// ``CallerSessions/itemGrantSeconds`` (PROMPT_READ: the front end's client reads them next).
    package func search<R>(_ query: ItemQuery, after cursor: UInt64 = 0, paged: Bool = false, granting: Bool = false,
                           _ context: inout CallerContext,
                           _ channel: (any AuthChannel)?, fits: (ItemResult) -> Bool = { _ in true },
                           reply: (Keychain.MatchPage) throws(SecError) -> R) throws(SecError) -> R {
        // Activity for the idle lock, from its start to its end, whichever front end asked.
        schedule.beginActivity()
        defer { schedule.endActivity() }
        return try itemOperation(&context, Self.operation(query), group: query.attributes.accessGroup, itemClass: query.itemClass) {
            (scope, context) throws(SecError) in
            var used = AuthorizationContext.none
            let what = Self.describe(paged ? "read the secrets of" : "read the secret of", query)
            // A grant's application password is tried like any other: counted by the throttle, and
            // its failures and refusals audited.
            let grants = query.returnData || query.reportsAccessState
                ? sessions.itemGrants(for: context.caller, now: clock.now(), generation: gate.lockGeneration)
                    .mapValues { auditingApplicationPasswords($0, context.caller) } : [:]
            let page = try authorized(query, scope, &context, channel, what: what, continuing: paged ? cursor : 0, granting: granting) {
                (auth, handle) throws(SecError) in
                used = auth
                return try keychain.copyMatchingPage(query, scope: scope, after: Int64(exactly: cursor) ?? Int64.max,
                                                     authorization: auth, grants: grants, matching: handle, fits: fits)
            }
            let r = try reply(page)
            guard paged else { return r }
            let next = page.isComplete ? 0 : UInt64(page.lastRowID)
            if cursor == 0 {
                context.recordPagingAuthorization(used, query: query, nextCursor: next, now: clock.now(), generation: gate.lockGeneration)
            } else {
                context.advancePaging(query, from: cursor, to: next)
            }
            return r
        }
    }

    /// SecItemUpdate in the caller's scope; how many items changed.
    package func update(_ query: ItemQuery, _ changes: ItemChanges, _ context: inout CallerContext,
                        _ channel: (any AuthChannel)?) throws(SecError) -> Int {
        // Activity for the idle lock, from its start to its end, whichever front end asked.
        schedule.beginActivity()
        defer { schedule.endActivity() }
        var groups = Set<String>()
        let count = try itemOperation(&context, "update", group: query.attributes.accessGroup, itemClass: query.itemClass) {
            (scope, context) throws(SecError) in
            try authorized(query, scope, &context, channel, what: Self.describe("change", query)) { (auth, _) throws(SecError) in
                try keychain.update(query, changes, scope: scope, authorization: auth) { groups.insert($0) }
            }
        }
        didWrite(groups)
        return count
    }

    /// SecItemDelete in the caller's scope; how many items went.
    package func delete(_ query: ItemQuery, _ context: inout CallerContext, _ channel: (any AuthChannel)?) throws(SecError) -> Int {
        // Activity for the idle lock, from its start to its end, whichever front end asked.
        schedule.beginActivity()
        defer { schedule.endActivity() }
        var groups = Set<String>()
        let count = try itemOperation(&context, "delete", group: query.attributes.accessGroup, itemClass: query.itemClass) {
            (scope, context) throws(SecError) in
            try authorized(query, scope, &context, channel, what: Self.describe("delete", query)) { (auth, _) throws(SecError) in
                try keychain.delete(query, scope: scope, authorization: auth) { groups.insert($0) }
            }
        }
        didWrite(groups)
        return count
    }

    // MARK: Stages

    /// Operations on the whole keychain (every group's items, or who may open them) are for the shell
    /// helper and, when unsigned callers share a group, for the user's unsigned processes: never for a
    /// confined or other signed app, even one that knows the passcode
    /// (``AccessPolicy/mayManageKeychain(_:)``). Checked before the person is asked for anything.
    /// Passcode tries (unlock, escrow unlock, set, change, sync) are not for sandboxed apps
    /// (``AccessPolicy/mayTryPasscode(_:)``): checked before the try counts.
    func mayTryPasscode(_ caller: CallerIdentity, _ what: String) throws(SecError) {
        guard !gate.policy.mayTryPasscode(caller) else { return }
        throw SecError(.missingEntitlement, "a sandboxed app may not \(what): its tries would count toward the throttle and erase-after")
    }

    func mayManageKeychain(_ caller: CallerIdentity, _ what: String) throws(SecError) {
        guard !gate.policy.mayManageKeychain(caller) else { return }
        let shell = gate.policy.shellAppID.map { "the shell helper (app \($0))" } ?? "no app (shell-app = none)"
        let unsigned = gate.policy.unsignedCallers == .shared ? " or a process without a signed identity" : ""
        throw SecError(.missingEntitlement, "only \(shell)\(unsigned) may \(what): it reaches every access group")
    }

    /// The person proves themselves with the passcode before a whole-keychain operation.
    func withPasscode(_ context: inout CallerContext, _ channel: (any AuthChannel)?, what: String) throws(SecError) {
        _ = try authenticator.authorize(rules: [AccessControl(factors: [.devicePasscode])!], context: &context, channel: channel, what: what)
    }

    /// Runs an item operation with the scope the policy gives the caller, and audits it (allowed or
    /// denied, with its result). An add without `agrp` is recorded with the group it went to.
    func itemOperation<T>(_ context: inout CallerContext, _ operation: String, group: String?, itemClass: ItemClass?,
                                  _ body: (AccessScope, inout CallerContext) throws(SecError) -> T) throws(SecError) -> T {
        let decision = gate.scope(for: context)
        var recorded = group
        if recorded == nil, operation == "add", case .allowed(let scope) = decision { recorded = scope.defaultGroup }
        let result = try audited(context.caller, operation, group: recorded, itemClass: itemClass) { () throws(SecError) in
            try body(try decision.scope(), &context)
        }
        return result
    }

    /// After a successful add, update or delete: the sync's push, and subscribers told which access
    /// groups' items changed (before the reply goes).
    func didWrite(_ groups: Set<String>) {
        noteItemsWritten()
        schedule.announceItemsChanged(in: groups)
    }

    /// Runs `operation` on `query`'s matches with what the caller already holds (a live reuse, or a
    /// paged search's first-page authorization), and only if the keychain says an item's access control
    /// needs more (``SecError/needsAuthentication``, carrying the rules of every match) lets the person
    /// authenticate (``Authenticator``) and runs it again: a request touching no protected item costs
    /// nothing extra, one inside its reuse window does not search twice, and one that needs the
    /// person searches once (a search's retry opens the attempt's matches: ``MatchHandle``).
    func authorized<T>(_ query: ItemQuery, _ scope: AccessScope, _ context: inout CallerContext,
                               _ channel: (any AuthChannel)?, what: String, continuing cursor: UInt64 = 0, granting: Bool = false,
                               _ body: (AuthorizationContext, MatchHandle?) throws(SecError) -> T) throws(SecError) -> T {
        let now = clock.now()
        // The lock generation the operation starts in: a grant made from it is stamped with it, so a lock
        // anywhere between here and the grant (which ends every grant) also voids this one.
        let generation = gate.lockGeneration
        var held = context.reusableAuthorization(now: now, generation: generation) ?? .none
        if cursor > 0, let p = context.pagingAuthorization(for: query, cursor: cursor, now: now, generation: gate.lockGeneration) { held = p }
        let caller = context.caller
        do {
            return try body(auditingApplicationPasswords(held, caller), nil)
        } catch where error.needsAuthentication {
            // The attempt's answer names what the matches need: no second search for it.
            let rules = error.accessRequirements
            guard !rules.isEmpty else { throw error }
            let (searches, trips) = (keychain.searchCount, authenticator.sensor.roundTrips)
            let authorization = try audited(caller, "authenticate", group: query.attributes.accessGroup, itemClass: query.itemClass) {
                () throws(SecError) in try authenticator.authorize(rules: rules, context: &context, channel: channel, what: what)
            }
            // The attempt's matches, opened again without a second search while nothing changed.
            let result = try body(auditingApplicationPasswords(authorization, caller), error.matchHandle)
            if granting {
                // The items the person authenticated for are the caller's process's to read again for
                // a while (CallerSessions); a lock ends the grant.
                let now = clock.now()
                sessions.grant(error.accessTargets, to: caller,
                               CallerContext.CarriedAuthorization(authorization, until: now + CallerSessions.itemGrantSeconds,
                                                                  generation: generation),
                               now: now, generation: gate.lockGeneration)
            }
            // What the authentication stage cost (the benchmark reads it from a debug log): index searches
            // including the attempt's (the retry of a search opens its matches: none), and round trips
            // to the plugin host.
            logger.debug("authenticated operation", metadata: ["searches": "\(1 + keychain.searchCount - searches)",
                                                               "host-round-trips": "\(authenticator.sensor.roundTrips - trips)"])
            return result
        }
    }

    /// `context`, telling the audit log and the log of each application-password attempt the keychain
    /// counts (`app-password-failed`) or refuses before checking (`app-password-refused`); never the password.
    private func auditingApplicationPasswords(_ context: AuthorizationContext, _ caller: CallerIdentity) -> AuthorizationContext {
        guard context.hasApplicationPassword else { return context }
        var c = context
        c.onApplicationPasswordAttempt = { [gate, logger] attempt in
            switch attempt.outcome {
            case .failed(let failures, let nextDelay):
                logger.warning("failed application-password attempt", metadata: [
                    "failures": "\(failures)", "next-attempt-delay-s": "\(nextDelay)", "pid": "\(caller.pid)"])
                gate.record(caller, operation: "app-password-failed", group: attempt.accessGroup, itemClass: attempt.itemClass,
                            status: .authFailed)
            case .refused(let failures, let wait):
                logger.notice("application-password attempt refused: too early", metadata: [
                    "failures": "\(failures)", "wait-s": "\(Int(wait.rounded(.up)))", "pid": "\(caller.pid)"])
                gate.record(caller, operation: "app-password-refused", group: attempt.accessGroup, itemClass: attempt.itemClass,
                            status: .authFailed)
            }
        }
        return c
    }

    /// The application password a new item's rule needs: given in advance (the options) or asked for.
    private func applicationPasswordForNewItem(_ item: NewItem, _ context: inout CallerContext,
                                               _ channel: (any AuthChannel)?) throws(SecError) -> SecureBytes? {
        guard case .data(let bytes)? = item.attributes[AccessControl.attributeName], let acl = AccessControl(encoded: bytes),
              acl.factors.contains(.applicationPassword) else { return nil }
        let rule = AccessControl(factors: [.applicationPassword])!
        // Audited like every authentication.
        let authorization = try audited(context.caller, "authenticate", group: item.attributes.accessGroup, itemClass: item.itemClass) {
            () throws(SecError) in
            try authenticator.authorize(rules: [rule], context: &context, channel: channel,
                                        what: Self.describe("protect with an application password", ItemQuery(attributes: item.attributes)))
        }
        return authorization.applicationPassword
    }

    /// A biometryCurrentSet rule records the enrolled set's domain state when its item is added.
    private func recordDomainState(_ item: inout NewItem) throws(SecError) {
        guard case .data(let bytes)? = item.attributes[AccessControl.attributeName], let acl = AccessControl(encoded: bytes),
              acl.factors.contains(.biometryCurrentSet), acl.domainState.isEmpty else { return }
        let b = authenticator.biometry
        guard b.available, b.enrolled, !b.domainState.isEmpty else {
            throw .notAvailable("biometry-current-set needs enrolled biometry (enroll a finger first)")
        }
        item.attributes[AccessControl.attributeName] = .data(acl.with(domainState: b.domainState).encoded())
    }

    /// The operation as a prompt shows it: `read the secret of "SERVICE"`, naming the service or
    /// server the query gives (what the person recognises), else just the item class.
    package static func describe(_ verb: String, _ query: ItemQuery) -> String {
        for key in ["svce", "srvr", "labl"] {
            if case .string(let v)? = query.attributes[key] { return "\(verb) \"\(TerminalSafeText.escaped(v))\"" }
        }
        return "\(verb) a \(query.itemClass?.rawValue ?? "keychain") item"
    }

    /// Runs `body` and writes its audit record with the status it ended with.
    private func audited<T>(_ caller: CallerIdentity, _ operation: String, group: String? = nil, itemClass: ItemClass? = nil,
                            _ body: () throws(SecError) -> T) throws(SecError) -> T {
        do {
            let r = try body()
            gate.record(caller, operation: operation, group: group, itemClass: itemClass, status: .success)
            return r
        } catch {
            gate.record(caller, operation: operation, group: group, itemClass: itemClass, status: error.status)
            throw error
        }
    }

    /// The audit name of a search: `get` when it returns secrets, `find` when it does not.
    package static func operation(_ query: ItemQuery) -> String { query.returnData ? "get" : "find" }
}

/// What runs after every successful item write (``KeychainService/onItemsWritten(_:)``).
final class ItemsWrittenHandler: Sendable {
    let run: @Sendable () -> Void
    init(_ run: @escaping @Sendable () -> Void) { self.run = run }
}

/// ``KeychainService/onDirectoriesRestored(_:)``'s handler.
final class DirectoriesRestoredHandler: Sendable {
    let run: @Sendable ([FileKeyRecord]) -> Void
    init(_ run: @escaping @Sendable ([FileKeyRecord]) -> Void) { self.run = run }
}
