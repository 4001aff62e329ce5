import CofferCrypto
import CofferModel
import CofferSystem

/// One connection's conversation state, owned by the thread serving it (a value: nothing else sees
/// it, so it needs no lock).
struct Session: Sendable {
    /// Who connected (SO_PEERCRED at accept time, and /proc/PID/exe).
    let peer: PeerIdentity
    /// The caller's identity, established once when the connection was accepted (CofferIdentity):
    /// what the policy turns into the access groups of every item request.
    let caller: CallerIdentity
    /// The protocol version agreed in HELLO; nil until HELLO was accepted.
    private(set) var protocolVersion: UInt16? = nil
    /// The client's self-description from HELLO (for logs; never trusted).
    private(set) var clientName: String? = nil
    /// True once the client asked for lock events (the serving thread subscribes its connection).
    var wantsEvents = false
    /// True once the connection must close after the reply now being sent (a refused HELLO): nothing
    /// after it runs, not even requests the client already pipelined behind it.
    private(set) var mustClose = false
    /// Groups the user authorized (AUTHORIZE) for the rest of this connection: the shell helper's one
    /// command (a paged search is several requests), in the lock generation they were given in (a
    /// lock or the passcode's removal ends them, as it ends every reused authentication).
    private var authorized: (groups: Set<String>, generation: Int) = ([], 0)
    /// How this connection's requests may authenticate (AUTH_OPTIONS; an `LAContext`).
    private(set) var authOptions = AuthenticationOptions()
    /// An authentication this connection may reuse (AUTH_OPTIONS' reuse duration), until when, and
    /// the lock generation it belongs to (a lock voids it).
    private var reuse: (context: AuthorizationContext, until: Double, generation: Int)? = nil
    /// The authorization the first page of a paged search obtained, for its later pages: only that
    /// query's, from the cursor the last page returned, in the same lock generation, for a minute.
    private var pagingAuthorization: PagingAuthorization? = nil

    private struct PagingAuthorization {
        let context: AuthorizationContext
        let until: Double
        let generation: Int
        let query: ItemQuery
        var nextCursor: UInt64
    }

    init(peer: PeerIdentity, caller: CallerIdentity) {
        self.peer = peer
        self.caller = caller
    }

    /// True once HELLO was accepted.
    var isGreeted: Bool { protocolVersion != nil }

    /// Records an accepted HELLO.
    mutating func greeted(version: UInt16, clientName: String) {
        protocolVersion = version
        self.clientName = clientName
    }

    /// Ends the conversation after the current reply.
    mutating func close() { mustClose = true }

    /// Lets this connection's item requests use `group` too, while the lock generation stays `generation`.
    mutating func authorize(_ group: String, generation: Int) {
        if authorized.generation != generation { authorized = ([], generation) }
        authorized.groups.insert(group)
    }

    /// The groups authorized for this connection in lock generation `generation` (none from an earlier one).
    func authorizedGroups(generation: Int) -> Set<String> {
        authorized.generation == generation ? authorized.groups : []
    }

    /// New authentication options; they also invalidate what was reused (LAContext.invalidate).
    mutating func setAuthOptions(_ options: AuthenticationOptions) {
        authOptions = options
        reuse = nil
        pagingAuthorization = nil
    }

    /// The passcode given in advance, if any.
    func takePresetPasscode() -> SecureBytes? { authOptions.passcode }

    /// A live reusable authentication.
    func reusableAuthorization(now: Double, generation: Int) -> AuthorizationContext? {
        guard let r = reuse, r.until > now, r.generation == generation else { return nil }
        return r.context
    }

    /// Replaces the context of a live reuse (an application password added to it), keeping its end.
    mutating func updateReusedAuthorization(_ context: AuthorizationContext) {
        guard let r = reuse else { return }
        reuse = (context, r.until, r.generation)
    }

    /// Keeps `context` for reuse if the options ask for it.
    mutating func recordAuthorization(_ context: AuthorizationContext, now: Double, generation: Int) {
        guard authOptions.reuseSeconds > 0, context != .none else { return }
        reuse = (context, now + Double(authOptions.reuseSeconds), generation)
    }

    /// Keeps the authorization of a paged search's first page for its later pages (a minute at most):
    /// `query`'s pages from `nextCursor` on, while the lock generation stays `generation`. A last page
    /// (`nextCursor` 0) keeps nothing.
    mutating func recordPagingAuthorization(_ context: AuthorizationContext, query: ItemQuery, nextCursor: UInt64,
                                            now: Double, generation: Int) {
        pagingAuthorization = context == .none || nextCursor == 0 ? nil
            : PagingAuthorization(context: context, until: now + 60, generation: generation, query: query, nextCursor: nextCursor)
    }

    /// The first page's authorization, if this request continues that very search where its last page
    /// ended (same query, the cursor it returned) within the minute and without a lock since.
    func pagingAuthorization(for query: ItemQuery, cursor: UInt64, now: Double, generation: Int) -> AuthorizationContext? {
        guard let p = pagingAuthorization, p.until > now, p.generation == generation, p.nextCursor == cursor, p.query == query else { return nil }
        return p.context
    }

    /// A later page of `query` from `cursor` was returned: if that continued the kept search, the next
    /// one continues from `nextCursor` (0: it was the last). Any other page leaves the search as it was.
    mutating func advancePaging(_ query: ItemQuery, from cursor: UInt64, to nextCursor: UInt64) {
        guard let p = pagingAuthorization, p.nextCursor == cursor, p.query == query else { return }
        if nextCursor == 0 { pagingAuthorization = nil } else { pagingAuthorization?.nextCursor = nextCursor }
    }
}
