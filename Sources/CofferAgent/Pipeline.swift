import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import CofferPolicy
import CofferProtocol
import CofferSystem
import Logging

/// The agent's request path without a socket: one decoded request and its connection's ``Session``
/// in, one response out. The server (``Agent``) reads frames, calls ``handle(_:session:)``, and writes
/// the reply; tests call it directly.
///
/// Stages: the session (HELLO first, its caller identified at accept), activity for the idle lock, the
/// policy (``AccessGate``: the caller's ``AccessScope`` for each item request, and an audit record of
/// every item request, allowed or denied), then one short handler per request kind. The keychain gets
/// the scope, never the caller.
final class Pipeline: Sendable {
    let keychain: Keychain
    let unlocking: UnlockService
    let schedule: LockSchedule
    let logger: Logger
    /// Reported in STATUS.
    let idleLockSeconds: UInt32
    /// The policy stage: scopes, authorizations, the audit log.
    let gate: AccessGate
    /// Argon2id settings for backup passwords.
    var backupKDF: KDFParameters { unlocking.backupKDF }
    /// Authentication for items with access controls and LocalAuthentication.
    let authenticator: Authenticator
    private let clock: any MonotonicClock

    init(keychain: Keychain, unlocking: UnlockService, schedule: LockSchedule, gate: AccessGate, authenticator: Authenticator,
         clock: any MonotonicClock, logger: Logger, idleLockSeconds: UInt32) {
        self.keychain = keychain
        self.unlocking = unlocking
        self.schedule = schedule
        self.gate = gate
        self.authenticator = authenticator
        self.clock = clock
        self.logger = logger
        self.idleLockSeconds = idleLockSeconds
    }

    /// Runs one request. A refused HELLO marks the session closing (``Session/mustClose``); the server
    /// then sends this reply and closes, and a session already closing runs nothing more.
    func handle(_ request: AgentRequest, session: inout Session, channel: (any AuthChannel)? = nil) -> AgentResponse {
        guard !session.mustClose else { return .error(.param("the connection is closing")) }
        guard session.isGreeted else { return greet(request, &session) }
        // Activity for the idle lock: requests that use the keychain, not STATUS or SUBSCRIBE
        // (a status poller or a lock-screen watcher must not keep the keys unlocked).
        switch request {
        case .status, .subscribe, .whoami, .laCanEvaluate: break
        default: schedule.touch()
        }
        do {
            return try respond(to: request, &session, channel)
        } catch {
            logger.debug("request failed", metadata: ["status": "\(error.status.name)", "peer": "\(session.peer)"])
            if error.status == .notAvailable && keychain.keybagFilesChanged {
                logger.error("refused a write: \(error.message)", metadata: ["peer": "\(session.peer)"])
            }
            return .error(error)
        }
    }

    /// A frame that could not be decoded: errSecParam with a message naming the field (never its
    /// bytes). Before HELLO was accepted this also ends the conversation, like any other first message
    /// that is not an acceptable HELLO (a malformed HELLO included): nothing pipelined behind it runs.
    /// After HELLO the connection stays open (the frame boundary is known, so the next frame is safe).
    func refuse(_ error: ProtocolError, session: inout Session) -> AgentResponse {
        if !session.isGreeted { session.close() }
        return .error(error.secError)
    }

    /// The first message must be HELLO with a version range that holds one of ours; anything else
    /// closes. The connection speaks the highest version in both ranges.
    private func greet(_ request: AgentRequest, _ session: inout Session) -> AgentResponse {
        guard case .hello(let minV, let maxV, let client) = request else {
            session.close()
            return .error(.param("the first message must be HELLO"))
        }
        let version = min(maxV, WireFormat.version)
        guard minV <= maxV, version >= max(minV, WireFormat.minimumVersion) else {
            session.close()
            // Names no number the client sent: only the versions this agent speaks.
            return .error(.param("no protocol version this agent speaks (\(WireFormat.minimumVersion) to \(WireFormat.version)) is in the HELLO's range"))
        }
        session.greeted(version: version, clientName: client)
        logger.debug("hello", metadata: ["client": "\(client)", "peer": "\(session.peer)", "version": "\(version)"])
        return .helloReply(version: version, agentVersion: Agent.version)
    }

    /// One short handler per request kind.
    private func respond(to request: AgentRequest, _ session: inout Session, _ channel: (any AuthChannel)?) throws(SecError) -> AgentResponse {
        switch request {
        case .authOptions(let options):
            session.setAuthOptions(options)
            return .ok
        case .bio(let operation, let name):
            return try bio(operation, name, &session, channel)
        case .backupCreate(let path, let password):
            return try audited(session.caller, "backup-create") { () throws(SecError) -> AgentResponse in
                try mayManageKeychain(session.caller, "write a backup")
                _ = try authenticator.authorize(rules: [AccessControl(factors: [.devicePasscode])!], session: &session, channel: channel,
                                                what: "write a backup of every item to \u{201C}\(TerminalSafeText.escaped(path))\u{201D}")
                let (bytes, count) = try keychain.backup(password: password, kdf: backupKDF)
                do { try Files.writeAtomically(path, bytes, mode: 0o600, temporary: .unique) } catch { throw SecError(.io, "cannot write the backup: \(error)") }
                logger.notice("backup written", metadata: ["items": "\(count)", "caller": "\(session.caller)"])
                return .backupSummary(added: UInt32(count), duplicates: 0, otherDevice: 0)
            }
        case .backupRestore(let path, let password, let dryRun):
            return try audited(session.caller, dryRun ? "backup-check" : "backup-restore") { () throws(SecError) -> AgentResponse in
                try mayManageKeychain(session.caller, dryRun ? "read a backup" : "restore a backup")
                _ = try authenticator.authorize(rules: [AccessControl(factors: [.devicePasscode])!], session: &session, channel: channel,
                                                what: dryRun ? "read the backup \u{201C}\(TerminalSafeText.escaped(path))\u{201D}"
                                                    : "restore the backup \u{201C}\(TerminalSafeText.escaped(path))\u{201D} into this keychain")
                let bytes: [UInt8]
                do { bytes = try Files.read(path, maxBytes: 1 << 30) } catch { throw SecError(.io, "cannot read the backup: \(error)") }
                let r = try keychain.restoreBackup(bytes, password: password, dryRun: dryRun)
                if !dryRun { logger.notice("backup restored", metadata: ["added": "\(r.added)", "duplicates": "\(r.duplicates)"]) }
                return .backupSummary(added: UInt32(r.added), duplicates: UInt32(r.duplicates), otherDevice: UInt32(r.otherDevice))
            }
        case .check(let operation):
            // Every group's rows (references and reasons, never values): whole-keychain callers only.
            return try audited(session.caller, "check") { () throws(SecError) -> AgentResponse in
                try mayManageKeychain(session.caller, "check every item")
                let report = try keychain.check(operation)
                if operation != .verify && operation != .listQuarantine {
                    logger.notice("check", metadata: ["operation": "\(operation == .quarantine ? "quarantine" : "restore")",
                                                      "findings": "\(report.findings.count)"])
                }
                return .checkReport(report)
            }
        case .escrowCreate:
            // An escrow opens everything without the person later: making one needs the person now.
            return try audited(session.caller, "escrow-create") { () throws(SecError) -> AgentResponse in
                try mayManageKeychain(session.caller, "create an escrow record")
                _ = try authenticator.authorize(rules: [AccessControl(factors: [.devicePasscode])!], session: &session, channel: channel,
                                                what: "create an escrow record (it unlocks this keychain without you)")
                let secret = try keychain.createEscrow()
                logger.notice("escrow record created", metadata: ["caller": "\(session.caller)"])
                return .escrowSecret(secret)
            }
        case .escrowUnlock(let secret):
            try audited(session.caller, "escrow-unlock") { () throws(SecError) in
                try mayTryPasscode(session.caller, "unlock the keychain")
                try unlocking.unlock(escrowSecret: secret)
            }
            schedule.didUnlock()
            return .ok
        case .escrowRevoke(let passcode):
            try audited(session.caller, "escrow-revoke") { () throws(SecError) in
                try mayManageKeychain(session.caller, "revoke the escrow record")
                try unlocking.revokeEscrow(passcode: passcode)
            }
            schedule.didUnlock()
            return .ok
        case .removePasscode(let current):
            try audited(session.caller, "remove-passcode") { () throws(SecError) in
                try mayManageKeychain(session.caller, "remove the passcode")
                try unlocking.removePasscode(current: current)
            }
            gate.endAuthentications()
            schedule.didUnlock()
            return .ok
        case .passcodeSync(nil):
            return .count(unlocking.isOutOfSync ? 1 : 0)
        case .passcodeSync(let old?):
            guard old.count > 0 else { throw .param("the old passcode is empty") }
            try audited(session.caller, "passcode-sync") { () throws(SecError) in
                try mayTryPasscode(session.caller, "sync the passcode")
                try unlocking.sync(oldPasscode: old)
            }
            schedule.didUnlock()
            LegacyGroups.migrate(keychain, logger: logger)
            return .ok
        case .authResponse:
            // The server drops an AUTH_RESPONSE that arrives after its request finished (a race the
            // protocol allows); one reaching the pipeline answers nothing that waits.
            throw .param("no authentication is waiting for an answer")
        case .laCanEvaluate(let policy):
            let error = authenticator.canEvaluate(policy, caller: session.caller)
            let b = authenticator.biometry
            return .laResult(LAResult(error: error?.code, biometryType: b.available ? 1 : 0, domainState: b.enrolled ? b.domainState : [],
                                      message: error?.message ?? ""))
        case .laEvaluate(let policy, let reason):
            let caller = session.caller
            do throws(LAError) {
                try authenticator.evaluate(policy, reason: reason, session: &session, channel: channel)
            } catch {
                gate.record(caller, operation: "la-evaluate", group: nil, itemClass: nil, status: error.code.secStatus)
                let b = authenticator.biometry
                return .laResult(LAResult(error: error.code, biometryType: b.available ? 1 : 0, domainState: [], message: error.message))
            }
            gate.record(caller, operation: "la-evaluate", group: nil, itemClass: nil, status: .success)
            let b = authenticator.biometry
            return .laResult(LAResult(error: nil, biometryType: b.available ? 1 : 0, domainState: b.enrolled ? b.domainState : [], message: ""))
        case .hello:
            throw .param("HELLO was already received")
        case .status:
            let status = keychain.status
            return .status(StatusReply(
                lockState: status.lockState, passcodeSet: status.passcodeSet,
                itemCount: UInt64(try keychain.count()), agentVersion: Agent.version,
                lockedMemoryBytes: UInt64(SecureMemory.lockedBytes() ?? 0),
                idleLockSeconds: idleLockSeconds))
        case .unlock(let passcode):
            try audited(session.caller, "unlock") { () throws(SecError) in
                try mayTryPasscode(session.caller, "unlock the keychain")
                try unlocking.unlock(passcode)
            }
            schedule.didUnlock()
            LegacyGroups.migrate(keychain, logger: logger)
            return .ok
        case .lock:
            guard keychain.status.passcodeSet else {
                throw .notAvailable("no passcode is set, so nothing protects the keys; set one with 'coffer passcode set'")
            }
            schedule.lockNow(reason: "requested by \(session.peer)")
            return .ok
        case .setPasscode(let current, let new):
            try audited(session.caller, "set-passcode") { () throws(SecError) in
                try mayTryPasscode(session.caller, "set or change the passcode")
                try unlocking.setPasscode(current: current, new: new)
            }
            schedule.didUnlock()
            LegacyGroups.migrate(keychain, logger: logger)
            return .ok
        case .whoami:
            return .whoami(gate.whoami(session.caller))
        case .authorize(let group, let passcode):
            let caller = session.caller
            try audited(caller, "authorize", group: group) { () throws(SecError) in
                guard gate.policy.mayRequestAuthorization(caller) else {
                    throw SecError(.missingEntitlement, "only the shell helper (app \(gate.policy.shellAppID ?? "none")) may ask to use another access group")
                }
                try unlocking.authorize(passcode)
            }
            gate.authorized(group, session: &session)
            logger.notice("the user authorized another access group", metadata: ["group": "\(group)", "caller": "\(caller)"])
            return .ok
        case .add(let item, let flags):
            let named = Self.group(item.attributes)
            var item = item
            try recordDomainState(&item)
            return try itemRequest(&session, "add", group: named, itemClass: item.itemClass) { (scope, session) throws(SecError) in
                if !flags.isEmpty {
                    // Refuse before adding an item whose reply could not be sent: the reply holds the
                    // given attributes plus those the keychain fills in (pdmn, agrp, sync, cdat, mdat).
                    let filledIn = flags.contains(.attributes) ? 64 + scope.defaultGroup.utf8.count : 0
                    let bound = WireFormat.itemsHeaderBytes + filledIn + WireFormat.encodedSize(of: ItemResult(
                        itemClass: item.itemClass, attributes: flags.contains(.attributes) ? item.attributes : nil,
                        data: flags.contains(.data) ? item.secret : nil,
                        persistentRef: flags.contains(.persistentRef) ? [UInt8](repeating: 0, count: WireFormat.persistentRefBytes) : nil))
                    guard bound <= WireFormat.maximumBodyBytes else { throw Self.tooLarge("the new item (with the parts asked for)") }
                }
                let password = try applicationPasswordForNewItem(item, &session, channel)
                let r = try keychain.add(item, scope: scope, returnData: flags.contains(.data),
                                         returnAttributes: flags.contains(.attributes),
                                         returnPersistentRef: flags.contains(.persistentRef), applicationPassword: password)
                return .items(flags.isEmpty ? [] : [r])
            }
        case .copyMatching(let query):
            return try itemRequest(&session, Self.operation(query), group: Self.group(query.attributes), itemClass: query.itemClass) {
                (scope, session) throws(SecError) in
                try authorized(query, scope, .useSecret, &session, channel, what: Self.describe("read the secret of", query)) {
                    (auth) throws(SecError) in try page(query, scope: scope, after: 0, paged: false, authorization: auth)
                }
            }
        case .copyMatchingPage(let query, let cursor):
            return try itemRequest(&session, Self.operation(query), group: Self.group(query.attributes), itemClass: query.itemClass) {
                (scope, session) throws(SecError) in
                var used = AuthorizationContext.none
                let reply = try authorized(query, scope, .useSecret, &session, channel, what: Self.describe("read the secrets of", query),
                                           continuing: cursor) { (auth) throws(SecError) in
                    used = auth
                    return try page(query, scope: scope, after: cursor, paged: true, authorization: auth)
                }
                let next: UInt64
                switch reply {
                case .itemsPage(_, let n), .itemsPageSkipping(_, let n, _): next = n
                default: return reply
                }
                if cursor == 0 {
                    session.recordPagingAuthorization(used, query: query, nextCursor: next, now: clock.now(), generation: gate.lockGeneration)
                } else {
                    session.advancePaging(query, from: cursor, to: next)
                }
                return reply
            }
        case .update(let query, let changes):
            return try itemRequest(&session, "update", group: Self.group(query.attributes), itemClass: query.itemClass) {
                (scope, session) throws(SecError) in
                try authorized(query, scope, .update, &session, channel, what: Self.describe("change", query)) { (auth) throws(SecError) in
                    .count(UInt64(try keychain.update(query, changes, scope: scope, authorization: auth)))
                }
            }
        case .delete(let query):
            return try itemRequest(&session, "delete", group: Self.group(query.attributes), itemClass: query.itemClass) {
                (scope, session) throws(SecError) in
                try authorized(query, scope, .delete, &session, channel, what: Self.describe("delete", query)) { (auth) throws(SecError) in
                    .count(UInt64(try keychain.delete(query, scope: scope, authorization: auth)))
                }
            }
        case .subscribe:
            session.wantsEvents = true
            return .ok
        }
    }

    /// Operations on the whole keychain (every group's items, or who may open them) are for the shell
    /// helper and, when unsigned callers share a group, for the user's unsigned processes: never for a
    /// confined or other signed app, even one that knows the passcode
    /// (``AccessPolicy/mayManageKeychain(_:)``). Checked before the person is asked for anything.
    /// Passcode tries (unlock, escrow unlock, set, change, sync) are not for sandboxed apps
    /// (``AccessPolicy/mayTryPasscode(_:)``): checked before the try counts.
    private func mayTryPasscode(_ caller: CallerIdentity, _ what: String) throws(SecError) {
        guard !gate.policy.mayTryPasscode(caller) else { return }
        throw SecError(.missingEntitlement, "a sandboxed app may not \(what): its tries would count toward the throttle and erase-after")
    }

    private func mayManageKeychain(_ caller: CallerIdentity, _ what: String) throws(SecError) {
        guard !gate.policy.mayManageKeychain(caller) else { return }
        let shell = gate.policy.shellAppID.map { "the shell helper (app \($0))" } ?? "no app (shell-app = none)"
        let unsigned = gate.policy.unsignedCallers == .shared ? " or a process without a signed identity" : ""
        throw SecError(.missingEntitlement, "only \(shell)\(unsigned) may \(what): it reaches every access group")
    }

    /// Runs an item request with the scope the policy gives the session's caller, and audits it
    /// (allowed or denied, with its result). An add without `agrp` is recorded with the group it went to.
    private func itemRequest(_ session: inout Session, _ operation: String, group: String?, itemClass: ItemClass?,
                             _ body: (AccessScope, inout Session) throws(SecError) -> AgentResponse) throws(SecError) -> AgentResponse {
        let decision = gate.scope(for: session)
        var recorded = group
        if recorded == nil, operation == "add", case .allowed(let scope) = decision { recorded = scope.defaultGroup }
        let caller = session.caller
        return try audited(caller, operation, group: recorded, itemClass: itemClass) { () throws(SecError) in
            try body(try decision.scope(), &session)
        }
    }

    /// `coffer bio …`: enrolling or removing a finger changes who can open biometric items, so it needs
    /// the passcode (as on iOS); a touch (the emulator) and the status need nothing.
    private func bio(_ operation: BioOperation, _ name: String, _ session: inout Session,
                     _ channel: (any AuthChannel)?) throws(SecError) -> AgentResponse {
        let sensor = authenticator.sensor
        let caller = session.caller
        switch operation {
        case .status:
            let b = authenticator.biometry
            let detail = (try? sensor.control("status", []))?.text ?? ""
            return .bioStatus(BioStatus(authenticator: sensor.name, available: b.available, enrolledCount: b.enrolledCount,
                                        lockedOut: b.lockedOut, domainState: b.enrolled ? b.domainState : [],
                                        detail: String(detail.prefix(1024)).split(separator: "\n", omittingEmptySubsequences: false)
                                            .map { TerminalSafeText.escaped(String($0)) }.joined(separator: "\n")))
        case .enroll, .remove:
            let verb = operation == .enroll ? "enroll" : "remove"
            return try audited(caller, "bio-\(verb)") { () throws(SecError) -> AgentResponse in
                try mayManageKeychain(caller, "\(verb) a finger")
                _ = try sensor.control("status", []) // no authenticator: say so before asking for the passcode
                _ = try authenticator.authorize(rules: [AccessControl(factors: [.devicePasscode])!], session: &session, channel: channel,
                                                what: "\(verb) the finger \u{201C}\(TerminalSafeText.escaped(name))\u{201D}")
                let (code, text) = try sensor.control(verb, [name])
                guard code == 0 else { throw .param("the biometric authenticator refused: \(TerminalSafeText.escaped(String(text.prefix(256))))") }
                logger.notice("biometry: a finger was \(verb == "enroll" ? "enrolled" : "removed")", metadata: ["caller": "\(caller)"])
                return .ok
            }
        case .present, .presentUnknown:
            let (code, text) = try sensor.control("present", operation == .present ? [name] : ["--unknown"])
            guard code == 0 else { throw .notAvailable("the sensor did not take the touch: \(TerminalSafeText.escaped(String(text.prefix(256))))") }
            return .ok
        }
    }

    /// Runs `operation` on `query`'s matches with what the session already holds (a live reuse, or a
    /// paged search's first-page authorization), and only if the keychain says an item's access control
    /// needs more (``SecError/needsAuthentication``, carrying the rules of every match) lets the person
    /// authenticate (``Authenticator``) and runs it again: a request touching no protected item costs
    /// nothing extra, one inside its reuse window does not search twice, and one that needs the
    /// person searches twice (the attempt and the operation).
    private func authorized<T>(_ query: ItemQuery, _ scope: AccessScope, _ operation: AccessControl.Operations, _ session: inout Session,
                               _ channel: (any AuthChannel)?, what: String, continuing cursor: UInt64 = 0,
                               _ body: (AuthorizationContext) throws(SecError) -> T) throws(SecError) -> T {
        let now = clock.now()
        var held = session.reusableAuthorization(now: now, generation: gate.lockGeneration) ?? .none
        if cursor > 0, let p = session.pagingAuthorization(for: query, cursor: cursor, now: now, generation: gate.lockGeneration) { held = p }
        let caller = session.caller
        do {
            return try body(auditingApplicationPasswords(held, caller))
        } catch where error.needsAuthentication {
            // The attempt's answer names what the matches need: no second search for it.
            let rules = error.accessRequirements
            guard !rules.isEmpty else { throw error }
            let (searches, trips) = (keychain.searchCount, authenticator.sensor.roundTrips)
            let context = try audited(caller, "authenticate", group: Self.group(query.attributes), itemClass: query.itemClass) {
                () throws(SecError) in try authenticator.authorize(rules: rules, session: &session, channel: channel, what: what)
            }
            let result = try body(auditingApplicationPasswords(context, caller))
            // What the authentication stage cost (the benchmark reads it from a debug log): searches
            // including the attempt, and round trips to the plugin host.
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

    /// The application password a new item's rule needs: given in advance (AUTH_OPTIONS) or asked for.
    private func applicationPasswordForNewItem(_ item: NewItem, _ session: inout Session,
                                               _ channel: (any AuthChannel)?) throws(SecError) -> SecureBytes? {
        guard case .data(let bytes)? = item.attributes[AccessControl.attributeName], let acl = AccessControl(encoded: bytes),
              acl.factors.contains(.applicationPassword) else { return nil }
        let rule = AccessControl(factors: [.applicationPassword])!
        // Audited like every authentication.
        let context = try audited(session.caller, "authenticate", group: Self.group(item.attributes), itemClass: item.itemClass) {
            () throws(SecError) in
            try authenticator.authorize(rules: [rule], session: &session, channel: channel,
                                        what: Self.describe("protect with an application password", ItemQuery(attributes: item.attributes)))
        }
        return context.applicationPassword
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
    static func describe(_ verb: String, _ query: ItemQuery) -> String {
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
    static func operation(_ query: ItemQuery) -> String { query.returnData ? "get" : "find" }

    /// The access group an item or query names (nil: none).
    static func group(_ attributes: Attributes) -> String? {
        if case .string(let g)? = attributes["agrp"] { return g }
        return nil
    }

    /// errSecAllocate for a reply that cannot fit in one frame (names no value).
    static func tooLarge(_ what: String) -> SecError {
        SecError(.allocate, "\(what) does not fit in one reply (\(WireFormat.maximumBodyBytes) bytes)")
    }

    /// One ITEMS_PAGE (`paged`) or one whole ITEMS reply: as many matches after `cursor` as fit in one
    /// frame. A match that does not fit even alone is errSecAllocate; so is a whole (unpaged) result
    /// that does not fit.
    private func page(_ query: ItemQuery, scope: AccessScope, after cursor: UInt64, paged: Bool,
                      authorization: AuthorizationContext) throws(SecError) -> AgentResponse {
        let header = !paged ? WireFormat.itemsHeaderBytes
            : query.skipUnreadable ? WireFormat.itemsPageSkippingHeaderBytes : WireFormat.itemsPageHeaderBytes
        var room = WireFormat.maximumBodyBytes - header
        let page = try keychain.copyMatchingPage(query, scope: scope, after: Int64(exactly: cursor) ?? Int64.max,
                                                 authorization: authorization) { item in
            // One rule for both forms: an item larger than a page can carry is refused, so that a
            // `get` (COPY_MATCHING) and a listing (pages) agree on which items can be returned.
            let size = WireFormat.encodedSize(of: item)
            guard size <= room, size <= WireFormat.maximumItemBytesPerPage else { return false }
            room -= size
            return true
        }
        if page.items.isEmpty && !page.isComplete {
            throw Self.tooLarge("a matching item (with the parts asked for)")
        }
        guard paged else {
            guard page.isComplete else { throw Self.tooLarge("the whole result; use COPY_MATCHING_PAGE (paged)") }
            return .items(page.items)
        }
        let next = page.isComplete ? 0 : UInt64(page.lastRowID)
        if query.skipUnreadable { return .itemsPageSkipping(page.items, nextCursor: next, unreadable: UInt32(clamping: page.unreadable)) }
        return .itemsPage(page.items, nextCursor: next)
    }
}
