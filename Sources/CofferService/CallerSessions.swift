package import CofferModel
import CofferSystem

/// The reuse grants the service core keeps for callers across their connections (architecture
/// review §5, issue #42): the one place that decides whether two connections are "the same caller".
/// A front end keeps no grant of its own; an operation that allows reuse (a key whose `reus`
/// attribute allows N seconds) takes the caller's grant for its target here and gives it back.
///
/// A caller is its identity as the agent established it (signed app, Flatpak app, or unsigned
/// executable with the unsigned reason), its uid and its login session told apart from every later
/// one with the same id (``CallerIdentity/LoginSession``: the leader's pid and start time, and the
/// audit session): another program, a traced one, or a recreated session with a reused id asks
/// again. A grant ends with its window or at the next lock (the carried authorization holds the lock
/// generation, which the core checks before it serves it).
package final class CallerSessions: Sendable {
    /// Who holds a grant: the parts of a ``CallerIdentity`` that cannot be taken over by another process.
    package struct Caller: Hashable, Sendable {
        let uid: UInt32
        let establishedBy: CallerIdentity.Establishment
        let session: CallerIdentity.LoginSession?

        package init(_ identity: CallerIdentity) {
            uid = identity.uid
            establishedBy = identity.establishedBy
            session = identity.session
        }
    }

    /// A grant's holder and target (an item's or key's persistent reference).
    package struct Grant: Hashable, Sendable {
        let caller: Caller
        let target: [UInt8]

        package init(caller: CallerIdentity, target: [UInt8]) {
            self.caller = Caller(caller)
            self.target = target
        }
    }

    /// Most grants kept (the oldest go first): one per caller and protected target in use.
    package static let maximumGrants = 256
    /// The grants in the order they were given (oldest first), with what each carries.
    private let grants = Protected<[(Grant, CallerContext.CarriedAuthorization)]>([])

    package init() {}

    /// The grant for `grant`, taken out while one operation runs (nil: none).
    package func take(_ grant: Grant) -> CallerContext.CarriedAuthorization? {
        grants.withLock { g in
            guard let i = g.firstIndex(where: { $0.0 == grant }) else { return nil }
            return g.remove(at: i).1
        }
    }

    /// Keeps `carried` (nil: nothing) for `grant`, replacing any it had.
    package func keep(_ carried: CallerContext.CarriedAuthorization?, for grant: Grant) {
        guard let carried else { return }
        grants.withLock { g in
            g.removeAll { $0.0 == grant }
            if g.count >= Self.maximumGrants { g.removeFirst(g.count - Self.maximumGrants + 1) }
            g.append((grant, carried))
        }
    }

    /// How many grants are kept (for tests and the architecture's counters).
    package var count: Int { grants.withLock { $0.count } }

    /// Forgets every grant (a lock: they could not be served after it anyway).
    package func endAll() { grants.withLock { $0.removeAll() } }
}
