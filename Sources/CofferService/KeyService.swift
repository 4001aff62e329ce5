package import CofferCrypto
import CofferKeychain
import CofferSystem
package import CofferModel

/// Keys as keychain items (class `keys`): the service core's side of SecKeyCreateRandomKey and
/// SecKeyCreateSignature. The key material itself (generating a key pair, encoding it, signing) is the
/// front end's: the core stores an item whose secret it never interprets, and lends a key's private half
/// to the agent's own code for one use, after the caller's scope and the key's access control allowed it.
/// No request of any protocol returns a non-extractable key's private half (``KeyItem``).
extension KeychainService {
    /// Adds a key the agent made (generated in the agent, or imported through it): `item`'s secret is
    /// the private half; its agent-set attributes (``KeyItem/agentSet``) are filled in by the caller. The
    /// key is non-extractable and stays on this device: `pdmn` defaults to
    /// WhenUnlockedThisDeviceOnly, and a class that goes into backups is errSecParam.
    package func addKey(_ item: NewItem, returning: Returning, _ context: inout CallerContext,
                        _ channel: (any AuthChannel)?) throws(SecError) -> ItemResult {
        // Activity for the idle lock, from its start to its end, whichever front end asked.
        schedule.beginActivity()
        defer { schedule.endActivity() }
        guard item.itemClass == .key, KeyItem.isNonExtractable(item.attributes),
              item.attributes[KeyItem.publicKeyAttribute] != nil else {
            throw .param("internal: a key the agent adds is a non-extractable key item with its public half")
        }
        var item = item
        if item.attributes["pdmn"] == nil { item.attributes["pdmn"] = .string(ProtectionClass.whenUnlockedThisDeviceOnly.shortCode) }
        guard case .string(let code)? = item.attributes["pdmn"], let p = ProtectionClass(parsing: code), p.isThisDeviceOnly else {
            throw .param("a key made in the agent must be in a ThisDeviceOnly class (it never leaves this device, not even in a backup)")
        }
        return try add(item, returning: returning, &context, channel)
    }

    /// The key items the caller's scope may see among `query`'s matches (class `keys`), with their
    /// attributes and never a secret. A locked keybag hides the keys of the classes it cannot open
    /// (WhenUnlocked ones): the others are still listed, as `ssh-add -l` lists what it may.
    package func keys(matching query: ItemQuery, _ context: inout CallerContext) throws(SecError) -> [ItemResult] {
        // Activity for the idle lock, from its start to its end, whichever front end asked.
        schedule.beginActivity()
        defer { schedule.endActivity() }
        var q = query
        q.itemClass = .key
        q.limit = .all
        q.returnAttributes = true
        q.returnData = false
        q.skipsLockedItems = true
        do {
            return try search(q, &context, nil) { page in page.items }
        } catch where error.status == .itemNotFound {
            return []
        }
    }

    /// Lends the private half of the first key `query` matches to `body`, for one use in the agent (a
    /// signature), after the caller's scope allowed it and the key's access control was satisfied
    /// (through `channel`: the agent's own prompter or sensor; with the conversation's reuse window).
    /// `what` is what a prompt says the person authorizes. Audited as `use-key`. The secret is wiped
    /// when `body` returns.
    ///
    /// Reuse: a key whose `reus` attribute allows N seconds (at most 300) lets the person's
    /// authentication serve the same caller's uses of it for that long, across its connections (each
    /// `ssh` opens its own), as LocalAuthentication's reuse duration does; a lock ends it. The core
    /// keeps that grant (``CallerSessions``, keyed by the caller's pinned identity and the key's
    /// persistent reference); no front end does.
    package func useKey<T>(matching query: ItemQuery, what: String, _ context: inout CallerContext, _ channel: (any AuthChannel)?,
                           _ body: (SecureBytes, Attributes) throws(SecError) -> T) throws(SecError) -> T {
        // Activity for the idle lock, from its start to its end, whichever front end asked.
        schedule.beginActivity()
        defer { schedule.endActivity() }
        var q = query
        q.itemClass = .key
        q.limit = .one
        q.returnData = true
        q.returnAttributes = true
        q.usesKeyInPlace = true
        var grant: CallerSessions.Grant? = nil
        defer { if let grant { sessions.keep(context.carriedAuthorization(now: clock.now()), for: grant) } }
        return try itemOperation(&context, "use-key", group: q.attributes.accessGroup, itemClass: .key) { (scope, context) throws(SecError) in
            // The key's reuse duration, from its attributes (no secret opened), before anyone is asked.
            var look = q
            look.returnData = false
            look.usesKeyInPlace = false
            look.returnPersistentRef = true
            let found = try keychain.copyMatching(look, scope: scope).first
            if case .integer(let n)? = found?.attributes?[KeyItem.reuseAttribute], n > 0, let ref = found?.persistentRef {
                let seconds = UInt32(min(n, Int64(AuthenticationOptions.maximumReuseSeconds)))
                context.setAuthOptions(AuthenticationOptions(reuseSeconds: seconds))
                let g = CallerSessions.Grant(caller: context.caller, target: ref)
                grant = g
                if let carried = sessions.take(g) { context.adopt(carried) }
            }
            let page = try authorized(q, scope, &context, channel, what: what) { (auth, _) throws(SecError) in
                try keychain.copyMatchingPage(q, scope: scope, after: 0, authorization: auth, fits: { _ in true })
            }
            guard let item = page.items.first, let secret = item.data else { throw .itemNotFound() }
            defer { for i in page.items { i.data?.wipe() } }
            return try body(secret, item.attributes ?? [:])
        }
    }
}
