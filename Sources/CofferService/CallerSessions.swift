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

    /// Whether a login session's leader is the very process it was (``LoginSessions/isLive(_:)`` in
    /// the agent; tests of the core give their own).
    private let sessionIsLive: @Sendable (CallerIdentity.LoginSession) -> Bool
    /// Whether the process with this pid and start time is still there, not a zombie (an item
    /// grant's holder): `/proc/PID/stat` in the agent, the tests' own in theirs.
    private let processIsLive: @Sendable (_ pid: Int32, _ startTime: UInt64) -> Bool

    package init(sessionIsLive: @escaping @Sendable (CallerIdentity.LoginSession) -> Bool,
                 processIsLive: @escaping @Sendable (_ pid: Int32, _ startTime: UInt64) -> Bool = CallerSessions.processIsLive) {
        self.sessionIsLive = sessionIsLive
        self.processIsLive = processIsLive
    }

    /// `/proc/PID/stat` says a live process with that pid started at `startTime`.
    package static let processIsLive: @Sendable (Int32, UInt64) -> Bool = { pid, startTime in
        ProcessStat.of(pid: pid)?.startTime == startTime
    }

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
    package var count: Int { grants.withLock { $0.count } + itemGrants.withLock { $0.count } }

    /// Ends the grants that can never be served again (the agent's timer calls it about once a
    /// second): a caller's grants once its login session's leader has exited (the session is over; a
    /// recreated one with the same id is another caller), a process's item grants once it has
    /// exited. What such a grant carries (an application password among them) is not kept for
    /// nobody. Grants of a caller with no login session end with their window or the next lock.
    /// Each session and process (as its grants name it) is looked at once, however many grants it has.
    /// Returns how many ended.
    @discardableResult
    package func endThoseOfEndedSessions() -> Int {
        let sessions = grants.withLock { g in Set(g.compactMap { $0.0.caller.session }) }
        let holders = itemGrants.withLock { g in Set(g.map(\.process)) }
        guard !sessions.isEmpty || !holders.isEmpty else { return 0 }
        // Looked at outside the locks: /proc is slow next to a grant lookup.
        let endedSessions = sessions.filter { !sessionIsLive($0) }
        let goneHolders = holders.filter { !processIsLive($0.pid, $0.startTime) }
        var ended = 0
        if !endedSessions.isEmpty {
            ended += grants.withLock { g in
                let before = g.count
                g.removeAll { $0.0.caller.session.map(endedSessions.contains) ?? false }
                return before - g.count
            }
        }
        if !goneHolders.isEmpty {
            ended += itemGrants.withLock { g in
                let before = g.count
                g.removeAll { goneHolders.contains($0.process) }
                return before - g.count
            }
        }
        return ended
    }

    /// Forgets every grant (a lock: they could not be served after it anyway).
    package func endAll() {
        grants.withLock { $0.removeAll() }
        itemGrants.withLock { $0.removeAll() }
    }

    // MARK: Item grants of one process

    /// One process, as nothing else can be: its caller (identity, uid, login session), its pid and
    /// that process's start time. A pid that comes back belongs to a process with another start time.
    package struct Process: Hashable, Sendable {
        let caller: Caller
        let pid: Int32
        let startTime: UInt64

        /// The process `identity` names; nil when its start time is unknown (nothing is granted then).
        package init?(_ identity: CallerIdentity) {
            guard let t = identity.processStartTime, identity.pid > 0 else { return nil }
            caller = Caller(identity)
            pid = identity.pid
            startTime = t
        }
    }

    /// How long an item grant lasts (seconds): a Secret Service prompt's read is the client's for
    /// this long after the person answered (its GetSecret follows at once; Chromium's, a script's).
    package static let itemGrantSeconds = 60.0
    /// Most item grants kept (the oldest go first).
    package static let maximumItemGrants = 1024

    /// The item grants in the order they were given (oldest first).
    private let itemGrants = Protected<[(process: Process, item: [UInt8], carried: CallerContext.CarriedAuthorization)]>([])

    /// Grants `identity`'s process the items `items` (persistent references) with `carried`: what
    /// the person's authentication for a prompt's read authorized. A process whose start time is
    /// unknown gets nothing (its later reads ask again).
    package func grant(_ items: [[UInt8]], to identity: CallerIdentity, _ carried: CallerContext.CarriedAuthorization,
                       now: Double, generation: Int) {
        guard let process = Process(identity), !items.isEmpty else { return }
        itemGrants.withLock { g in
            // Expired ones go here too (an application password a grant holds is not kept past its end
            // for longer than the next grant or read).
            g.removeAll { ($0.process == process && items.contains($0.item)) || $0.carried.live(now: now, generation: generation) == nil }
            for item in items { g.append((process, item, carried)) }
            if g.count > Self.maximumItemGrants { g.removeFirst(g.count - Self.maximumItemGrants) }
        }
    }

    /// The live item grants of `identity`'s process (item → what it authorizes); expired ones are
    /// dropped. Empty for any other process, a recreated pid among them.
    package func itemGrants(for identity: CallerIdentity, now: Double, generation: Int) -> [[UInt8]: AuthorizationContext] {
        guard let process = Process(identity) else { return [:] }
        return itemGrants.withLock { g in
            guard !g.isEmpty else { return [:] }
            g.removeAll { $0.carried.live(now: now, generation: generation) == nil }
            var out: [[UInt8]: AuthorizationContext] = [:]
            for e in g where e.process == process { out[e.item] = e.carried.live(now: now, generation: generation) }
            return out
        }
    }
}
