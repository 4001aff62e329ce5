package import CofferCrypto
package import CofferModel

/// Who is calling and what it may already do: the caller's identity and the authorization state one
/// conversation accumulates (groups the user authorized, authentication options, a reusable
/// authentication, a paged search's first-page authorization). Every service operation takes one; a
/// front end keeps one per conversation (the native protocol: per connection) beside its own wire
/// state. A value owned by the thread serving the conversation: it needs no lock.
package struct CallerContext: Sendable {
    /// The caller's identity, established once (CofferIdentity): what the policy turns into the
    /// access groups of every item request.
    package let caller: CallerIdentity
    /// True if a front end handed this conversation to the caller's process (the native protocol's
    /// DELEGATE): only then may the agent's own prompter ask the person for it (PROMPT_READ).
    package let isDelegated: Bool
    /// Groups the user authorized (AUTHORIZE) for the rest of this conversation: the shell helper's one
    /// command (a paged search is several requests), in the lock generation they were given in (a
    /// lock or the passcode's removal ends them, as it ends every reused authentication).
    private var authorized: (groups: Set<String>, generation: Int) = ([], 0)
    /// How this conversation's requests may authenticate (an `LAContext`).
    package private(set) var authOptions = AuthenticationOptions()
    /// An authentication this conversation may reuse (the options' reuse duration), until when, and
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

    package init(caller: CallerIdentity, delegated: Bool = false) {
        self.caller = caller
        isDelegated = delegated
    }

    /// Lets this conversation's item requests use `group` too, while the lock generation stays `generation`.
    package mutating func authorize(_ group: String, generation: Int) {
        if authorized.generation != generation { authorized = ([], generation) }
        authorized.groups.insert(group)
    }

    /// The groups authorized for this conversation in lock generation `generation` (none from an earlier one).
    package func authorizedGroups(generation: Int) -> Set<String> {
        authorized.generation == generation ? authorized.groups : []
    }

    /// New authentication options; they also invalidate what was reused (LAContext.invalidate).
    package mutating func setAuthOptions(_ options: AuthenticationOptions) {
        authOptions = options
        reuse = nil
        pagingAuthorization = nil
    }

    /// The passcode given in advance, if any.
    package func takePresetPasscode() -> SecureBytes? { authOptions.passcode }

    /// A live reusable authentication.
    package func reusableAuthorization(now: Double, generation: Int) -> AuthorizationContext? {
        guard let r = reuse, r.until > now, r.generation == generation else { return nil }
        return r.context
    }

    /// Replaces the context of a live reuse (an application password added to it), keeping its end.
    package mutating func updateReusedAuthorization(_ context: AuthorizationContext) {
        guard let r = reuse else { return }
        reuse = (context, r.until, r.generation)
    }

    /// A reusable authentication carried from one conversation to another of the same caller (the
    /// ssh-agent front end keeps one per caller and key across its connections: each `ssh` opens its
    /// own). It stays bound to its end and its lock generation.
    package struct CarriedAuthorization: Sendable {
        fileprivate let context: AuthorizationContext
        fileprivate let until: Double
        fileprivate let generation: Int
    }

    /// This conversation's live reuse, to carry into another; nil when there is none.
    package func carriedAuthorization(now: Double) -> CarriedAuthorization? {
        guard let r = reuse, r.until > now else { return nil }
        return CarriedAuthorization(context: r.context, until: r.until, generation: r.generation)
    }

    /// Takes over a reuse carried from another conversation (it ends when it would have there).
    package mutating func adopt(_ carried: CarriedAuthorization) {
        reuse = (carried.context, carried.until, carried.generation)
    }

    /// Keeps `context` for reuse if the options ask for it.
    package mutating func recordAuthorization(_ context: AuthorizationContext, now: Double, generation: Int) {
        guard authOptions.reuseSeconds > 0 || authOptions.keepsForConnection, context != .none else { return }
        // Kept for the connection: until it closes, the keybag locks (the generation) or other options arrive.
        reuse = (context, authOptions.keepsForConnection ? .infinity : now + Double(authOptions.reuseSeconds), generation)
    }

    /// Keeps the authorization of a paged search's first page for its later pages (a minute at most):
    /// `query`'s pages from `nextCursor` on, while the lock generation stays `generation`. A last page
    /// (`nextCursor` 0) keeps nothing.
    package mutating func recordPagingAuthorization(_ context: AuthorizationContext, query: ItemQuery, nextCursor: UInt64,
                                                    now: Double, generation: Int) {
        pagingAuthorization = context == .none || nextCursor == 0 ? nil
            : PagingAuthorization(context: context, until: now + 60, generation: generation, query: query, nextCursor: nextCursor)
    }

    /// The first page's authorization, if this request continues that very search where its last page
    /// ended (same query, the cursor it returned) within the minute and without a lock since.
    package func pagingAuthorization(for query: ItemQuery, cursor: UInt64, now: Double, generation: Int) -> AuthorizationContext? {
        guard let p = pagingAuthorization, p.until > now, p.generation == generation, p.nextCursor == cursor, p.query == query else { return nil }
        return p.context
    }

    /// A later page of `query` from `cursor` was returned: if that continued the kept search, the next
    /// one continues from `nextCursor` (0: it was the last). Any other page leaves the search as it was.
    package mutating func advancePaging(_ query: ItemQuery, from cursor: UInt64, to nextCursor: UInt64) {
        guard let p = pagingAuthorization, p.nextCursor == cursor, p.query == query else { return }
        if nextCursor == 0 { pagingAuthorization = nil } else { pagingAuthorization?.nextCursor = nextCursor }
    }
}

extension CallerContext.CarriedAuthorization {
    /// An authorization kept for a caller outside any conversation (a Secret Service prompt's grant:
    /// ``CallerSessions``), until `until`, in lock generation `generation`.
    package init(_ context: AuthorizationContext, until: Double, generation: Int) {
        self.context = context
        self.until = until
        self.generation = generation
    }

    /// What it authorizes, while it lives: before its end and in the lock generation it was given in.
    package func live(now: Double, generation: Int) -> AuthorizationContext? {
        until > now && self.generation == generation ? context : nil
    }
}
