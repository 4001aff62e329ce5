package import CofferAudit
import CofferIdentity
import CofferKeychain
package import CofferModel
package import CofferPolicy
package import CofferSystem
import Glibc
package import Logging

/// The policy stage of the request path (request → identity → **policy** → keychain): turns the
/// session's caller into the ``AccessScope`` of each item request (``AccessPolicy``), keeps the groups
/// the user authorized for the shell helper (``AuthorizationBook``), and writes the audit log. The
/// keychain only ever sees the scope.
package final class AccessGate: Sendable {
    package let policy: AccessPolicy
    private let book = Protected(AuthorizationBook())
    private let audit: AuditLog?
    private let clock: any MonotonicClock
    private let logger: Logger
    /// True while a terminal session's leader is the process that started it (``LoginSessions/isLive(_:)``;
    /// tests give their own).
    private let sessionIsLive: @Sendable (CallerIdentity.LoginSession) -> Bool

    package init(policy: AccessPolicy, audit: AuditLog?, clock: any MonotonicClock, logger: Logger,
         sessionIsLive: @escaping @Sendable (CallerIdentity.LoginSession) -> Bool = LoginSessions.isLive) {
        self.policy = policy
        self.audit = audit
        self.clock = clock
        self.logger = logger
        self.sessionIsLive = sessionIsLive
    }

    /// The scope of the caller's next item request.
    package func scope(for context: CallerContext) -> AccessDecision {
        var authorized = context.authorizedGroups(generation: lockGeneration)
        if policy.authorizationReuseSeconds > 0, let key = AuthorizationBook.key(for: context.caller) {
            let now = clock.now()
            authorized.formUnion(book.withLock { $0.groups(for: key, now: now, sessionIsLive: sessionIsLive) })
        }
        return policy.decide(context.caller, authorized: authorized)
    }

    /// The user authorized `group` for this context's caller: for the rest of its conversation (one
    /// command of the shell helper) and with a reuse window for the same app in the same terminal
    /// session, until the window ends, the session's leader exits, or the keybag locks (or the passcode
    /// is removed).
    package func authorized(_ group: String, context: inout CallerContext) {
        context.authorize(group, generation: lockGeneration)
        if policy.authorizationReuseSeconds > 0, let key = AuthorizationBook.key(for: context.caller) {
            let until = clock.now() + policy.authorizationReuseSeconds
            book.withLock { $0.grant(group, to: key, until: until) }
        }
    }

    /// Forgets every reusable authorization (the keybag locked).
    package func forgetAuthorizations() { book.withLock { $0.removeAll() } }

    /// The lock schedule's events: a lock ends every reuse window (the agent routes every event here).
    package func observe(_ event: LockEvent) {
        if event == .locked { endAuthentications() }
    }

    /// Ends every authentication kept for reuse and every authorized group: after a lock, and after
    /// the passcode is removed (access-controlled items then cannot be opened until one is set again).
    package func endAuthentications() {
        forgetAuthorizations()
        generation.withLock { $0 += 1 }
    }

    /// How many locks there have been: an authentication kept for reuse belongs to one generation.
    package var lockGeneration: Int { generation.withLock { $0 } }
    private let generation = Protected(0)

    /// What `coffer whoami` shows: the caller's identity and the groups its item requests run with.
    package func whoami(_ caller: CallerIdentity) -> WhoAmIReply {
        let kind: WhoAmIReply.Kind
        var note = ""
        switch caller.establishedBy {
        case .signedManifest: kind = .signedManifest
        case .flatpak: kind = .flatpak
        case .unsigned(_, let reason):
            kind = .unsigned
            note = reason.description
        }
        var groups: [String] = []
        switch policy.decide(caller) {
        case .allowed(let scope):
            groups = [scope.defaultGroup] + caller.accessGroups.filter { $0 != scope.defaultGroup && scope.contains($0) }
            for g in (scope.groups ?? []).sorted() where !groups.contains(g) { groups.append(g) }
        case .denied(let why):
            note = note.isEmpty ? why : note + "; " + why
        }
        return WhoAmIReply(kind: kind, appID: caller.appID ?? "", pid: UInt32(bitPattern: caller.pid),
                           executable: caller.executable ?? "", note: note, accessGroups: groups,
                           mayAuthorize: policy.mayRequestAuthorization(caller))
    }

    /// Writes one audit record (never a secret or an attribute value). A failing log is reported,
    /// at most once a minute, and does not fail the request.
    /// `key`, `destination`, `reason`: an ssh-agent signature's key fingerprint, destination host and
    /// why it was allowed or refused.
    package func record(_ caller: CallerIdentity, operation: String, group: String?, itemClass: ItemClass?, status: SecStatus,
                        key: String? = nil, destination: String? = nil, reason: String? = nil) {
        guard let audit else { return }
        let record = AuditRecord(time: Self.wallClock(), pid: caller.pid, app: caller.appID, executable: caller.executable,
                                 operation: operation, accessGroup: group, itemClass: itemClass, result: status.rawValue,
                                 key: key, destination: destination, reason: reason)
        do {
            try audit.append(record)
        } catch {
            if auditFailures.admit("audit") != nil {
                logger.error("the audit log cannot be written", metadata: ["error": "\(error)"])
            }
        }
    }

    private let auditFailures = LogThrottle(interval: 60)

    private static func wallClock() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}
