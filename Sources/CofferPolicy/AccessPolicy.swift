package import CofferModel

/// How a caller's identity becomes the access groups its keychain requests run with: request →
/// identity → **policy** → keychain. Pure: no processes, files, clocks or PAM; the agent supplies the
/// identity, the time and the groups the user authorized (see ``AuthorizationBook``).
///
/// - A caller with a signed manifest or a Flatpak sandbox gets exactly its groups, the first one
///   being where an add without `agrp` goes.
/// - Callers without a valid manifest get ``UnsignedCallers``: the one shared group
///   ``unsignedGroup`` (default) or nothing (`deny`: errSecMissingEntitlement for every item
///   request). They never get a signed app's group.
/// - Flatpak sandbox identities get their `flatpak:APP_ID` group unless ``flatpakCallers`` says
///   `deny` — which it does, unless set otherwise, when unsigned callers are denied: unconfined code
///   of the user can run itself in its own `bwrap` with a made-up `/.flatpak-info`, so under `deny`
///   a sandbox identity would otherwise be the way around it.
/// - The shell helper (the app ``shellAppID``) may reach another group for one request, or for a short
///   reuse window, after the user authenticates (AUTHORIZE): that is what keeps a script from
///   laundering an app's secrets by calling the CLI.
package struct AccessPolicy: Sendable, Equatable {
    /// What callers without a signed identity get (config key `unsigned-callers`).
    package enum UnsignedCallers: String, Sendable, Equatable, CaseIterable {
        /// Every item request is errSecMissingEntitlement.
        case deny
        /// The one shared group ``AccessPolicy/unsignedGroup``.
        case shared = "unsigned"
    }

    /// The group every unsigned caller shares (when ``UnsignedCallers/shared``). Items the agent held
    /// before access groups existed (group `coffer.default`, readable by every process of the user)
    /// are moved here: the same visibility they always had.
    package static let unsignedGroup = "unsigned"
    /// The group items had before access groups were enforced (``AccessScope/defaultAccessGroup``).
    package static let legacyGroup = AccessScope.defaultAccessGroup
    /// The app id the install script signs the CLI's manifest with.
    package static let defaultShellAppID = "coffer.shell"

    /// Whether Flatpak sandbox identities are honoured (config key `flatpak-callers`).
    package enum FlatpakCallers: String, Sendable, Equatable, CaseIterable {
        /// Every item request of a sandboxed caller is errSecMissingEntitlement.
        case deny
        /// A sandboxed caller gets its `flatpak:APP_ID` group.
        case allow
    }

    /// What unsigned callers get.
    package var unsignedCallers: UnsignedCallers
    /// What Flatpak sandbox identities get when set; nil follows ``unsignedCallers`` (see
    /// ``effectiveFlatpakCallers``).
    package var flatpakCallers: FlatpakCallers?
    /// The app that may ask for another group after the user authenticates (nil: none may).
    package var shellAppID: String?
    /// Seconds an authorization for another group stays valid for the same app in the same login
    /// session (0: only the next item request of the connection that authorized).
    package var authorizationReuseSeconds: Double

    package init(unsignedCallers: UnsignedCallers = .shared, flatpakCallers: FlatpakCallers? = nil,
                 shellAppID: String? = defaultShellAppID, authorizationReuseSeconds: Double = 0) {
        self.unsignedCallers = unsignedCallers
        self.flatpakCallers = flatpakCallers
        self.shellAppID = shellAppID
        self.authorizationReuseSeconds = authorizationReuseSeconds
    }

    /// The scope of `caller`'s item requests, with `authorized` (groups the user authorized for this
    /// caller; ignored unless the caller may ask for them) added to what its identity grants.
    package func decide(_ caller: CallerIdentity, authorized: Set<String> = []) -> AccessDecision {
        if case .flatpak = caller.establishedBy, effectiveFlatpakCallers == .deny {
            return .denied(flatpakCallers == nil
                ? "Flatpak sandbox identities are denied with unsigned-callers = deny (any process of the user can make one; set flatpak-callers = allow to accept them)"
                : "Flatpak sandbox identities are denied (flatpak-callers = deny)")
        }
        if caller.isSigned {
            guard let first = caller.accessGroups.first else {
                return .denied("app \(caller.appID ?? "") has no access group")
            }
            var groups = Set(caller.accessGroups)
            if mayRequestAuthorization(caller) { groups.formUnion(authorized) }
            return .allowed(AccessScope(groups: groups, defaultGroup: first))
        }
        switch unsignedCallers {
        case .deny:
            return .denied("callers without a signed identity are denied (unsigned-callers = deny)")
        case .shared:
            return .allowed(AccessScope(groups: [Self.unsignedGroup], defaultGroup: Self.unsignedGroup))
        }
    }

    /// What Flatpak sandbox identities get: ``flatpakCallers`` if set, otherwise `deny` when unsigned
    /// callers are denied and `allow` when they share a group. A sandbox identity is not proof against
    /// the user's own unconfined code (it can start `bwrap` with any `/.flatpak-info`), so where
    /// unsigned code gets nothing, a sandbox identity must not be its way in unless the user says so.
    package var effectiveFlatpakCallers: FlatpakCallers {
        flatpakCallers ?? (unsignedCallers == .deny ? .deny : .allow)
    }

    /// True if `caller` may ask the user to authorize another group: only the shell helper, by its
    /// signed manifest (a Flatpak app with the same id does not qualify).
    package func mayRequestAuthorization(_ caller: CallerIdentity) -> Bool {
        guard let shellAppID, case .signedManifest(let app) = caller.establishedBy else { return false }
        return app == shellAppID
    }

    /// True if `caller` may run an operation on the whole keychain rather than on its groups' items —
    /// backup create and restore, escrow create and revoke, passcode removal, enrolling or removing a
    /// finger: the shell helper, and callers without a signed identity when ``unsignedCallers`` is
    /// ``UnsignedCallers/shared``. Never a Flatpak app or another signed app, whatever it knows: these
    /// operations reach every group (a backup holds all of them), so the passcode they also ask for is
    /// not enough to let a confined app out of its own groups.
    ///
    /// Unsigned callers qualify under `shared` because they are any process of the user, which can run
    /// the (signed) shell helper and type the passcode into it anyway; refusing them would add a step,
    /// not a boundary. Under ``UnsignedCallers/deny`` they get nothing, this included.
    package func mayManageKeychain(_ caller: CallerIdentity) -> Bool {
        switch caller.establishedBy {
        case .signedManifest: mayRequestAuthorization(caller)
        case .flatpak: false
        case .unsigned: unsignedCallers == .shared
        }
    }

    /// True if `caller` may try the passcode on the keybag — unlock, escrow unlock, set, change or sync
    /// the passcode: every caller outside a sandbox. A Flatpak app may not: each wrong try counts
    /// toward the throttle (up to an hour's wait for the person) and, with `erase-after`, toward
    /// erasing the keychain, and a confined app, which cannot touch the state directory, must not be
    /// able to do either; nor is a throttled oracle for the login password its business. The person
    /// unlocks from the login (pam_coffer) or the shell. Unsigned callers qualify even under
    /// ``UnsignedCallers/deny``: the login process that hands over the password is one.
    package func mayTryPasscode(_ caller: CallerIdentity) -> Bool {
        if case .flatpak = caller.establishedBy { return false }
        return true
    }
}

/// A policy outcome: the scope the keychain gets, or why there is none (errSecMissingEntitlement).
package enum AccessDecision: Sendable, Equatable {
    case allowed(AccessScope)
    case denied(String)

    /// The scope, or errSecMissingEntitlement naming the reason.
    package func scope() throws(SecError) -> AccessScope {
        switch self {
        case .allowed(let s): return s
        case .denied(let why): throw SecError(.missingEntitlement, why)
        }
    }
}

/// Groups the user authorized the shell helper to reach, for a reuse window, keyed by the app and the
/// terminal session — not by its session id alone, which is a pid and comes back, but by the session's
/// leader and its start time, and the audit session (``CallerIdentity/LoginSession``), as sudo keys its
/// timestamp. A grant holds only while that leader lives: the agent checks it before each use
/// (``groups(for:now:sessionIsLive:)``), so a grant ends with the terminal session that got it. A value:
/// the agent keeps it under a lock and passes the time.
package struct AuthorizationBook: Sendable, Equatable {
    package struct Key: Sendable, Hashable {
        package let appID: String
        package let uid: UInt32
        /// The caller's session; callers without one (no session, or its leader gone) never share an
        /// authorization.
        package let session: CallerIdentity.LoginSession
        package init(appID: String, uid: UInt32, session: CallerIdentity.LoginSession) {
            self.appID = appID
            self.uid = uid
            self.session = session
        }
    }

    private var grants: [Key: [String: Double]] = [:]

    package init() {}

    /// The key of `caller`'s authorizations, nil if it has no app id or no live session.
    package static func key(for caller: CallerIdentity) -> Key? {
        guard let app = caller.appID, let session = caller.session, session.id > 0 else { return nil }
        return Key(appID: app, uid: caller.uid, session: session)
    }

    /// Records that `group` is authorized for `key` until `expiry` (monotonic seconds).
    package mutating func grant(_ group: String, to key: Key, until expiry: Double) {
        grants[key, default: [:]][group] = max(expiry, grants[key]?[group] ?? expiry)
    }

    /// The groups still authorized for `key` at `now` while its session lives (`sessionIsLive`: its
    /// leader is still the process that started it); drops expired ones, and all of a session that
    /// ended.
    package mutating func groups(for key: Key, now: Double, sessionIsLive: (CallerIdentity.LoginSession) -> Bool) -> Set<String> {
        guard var g = grants[key] else { return [] }
        guard sessionIsLive(key.session) else {
            grants[key] = nil
            return []
        }
        g = g.filter { $0.value > now }
        grants[key] = g.isEmpty ? nil : g
        return Set(g.keys)
    }

    /// Forgets every authorization (the keybag locked, or the agent reloaded its policy).
    package mutating func removeAll() { grants = [:] }

    /// Number of keys with live grants (for tests).
    package var count: Int { grants.count }
}
