/// Who is calling: the app a connection belongs to and the access groups it may use, established
/// from the peer process (see `CofferIdentity.IdentityResolver`). The keychain never sees this: the
/// agent's policy turns it into an ``AccessScope``.
public struct CallerIdentity: Sendable, Hashable, CustomStringConvertible {
    /// How the identity was established.
    public enum Establishment: Sendable, Hashable {
        /// A trusted, verified manifest names the peer's executable path and its SHA-256.
        case signedManifest(appID: String)
        /// The peer runs in a Flatpak sandbox (`.flatpak-info` in its root): group `flatpak:APP_ID`.
        case flatpak(appID: String)
        /// Nothing vouches for the peer. The policy for unsigned callers (deny, or the shared group
        /// `unsigned`) is applied by the caller of the resolver, not here.
        case unsigned(executablePath: String, reason: UnsignedReason)
    }

    /// Why a caller got no signed identity.
    public enum UnsignedReason: Sendable, Hashable, CustomStringConvertible {
        /// No verified manifest names this executable path.
        case noMatchingManifest
        /// A verified manifest names this path, but the file's SHA-256 is not the one it pins: the
        /// executable changed since it was signed (an update, or a replaced file) and must be re-signed.
        case executableChanged
        /// The process is being traced (`TracerPid` is this pid): its memory may not be its executable's.
        case traced(tracerPID: Int32)
        /// The executable was deleted or replaced since the process started (`(deleted)`).
        case executableDeleted
        /// The executable is on a filesystem whose contents a process serves (FUSE, named here): it
        /// can give the agent's read other bytes than the kernel's exec, so no hash vouches for it.
        case untrustedFilesystem(String)
        /// The process or its executable could not be examined or hashed (a system error, a file
        /// changing while hashed, too large, an invalid `.flatpak-info`): what failed, never a value.
        case unreadable(String)

        public var description: String {
            switch self {
            case .noMatchingManifest: "no trusted manifest names the executable"
            case .executableChanged: "the executable's SHA-256 is not the one its manifest pins (changed since signing; re-sign it)"
            case .traced(let tracer): "process is traced (tracer pid \(tracer))"
            case .executableDeleted: "executable was deleted or replaced"
            case .untrustedFilesystem(let kind): "executable is on a \(kind) filesystem, whose contents a process serves: its hash vouches for nothing"
            case .unreadable(let why): "process could not be examined: \(why)"
            }
        }
    }

    /// The prefix of a Flatpak app's access group (`flatpak:org.example.App`).
    public static let flatpakGroupPrefix = "flatpak:"

    /// The peer's process id when identified.
    public let pid: Int32
    /// The peer's uid.
    public let uid: UInt32
    /// The peer process's start time (clock ticks after boot, `/proc/PID/stat` field 22), read through
    /// the pidfd that pinned it; nil if unknown. With ``pid`` it names this one process: a pid that
    /// comes back belongs to a process with another start time. It keys what the agent grants one
    /// process (a Secret Service prompt's read, ``CallerSessions``).
    public private(set) var processStartTime: UInt64? = nil
    /// How the identity was established.
    public let establishedBy: Establishment
    /// The access groups the caller may use, default (first) group first; empty for unsigned callers.
    public let accessGroups: [String]
    /// The peer's executable (`/proc/PID/exe`), for logs and the audit log; nil if unknown.
    public let executable: String?
    /// The peer's session id (`NSsid`); nil if unknown. A number only: once the session's leader
    /// has exited, any process that gets that pid can `setsid()` and have it again.
    public let sessionID: Int32?
    /// The peer's session as something that cannot be recreated (see ``LoginSession``), which keys an
    /// authorization's reuse window; nil if the session's leader is gone or the session is unknown.
    public let session: LoginSession?
    /// True if the caller's verified manifest grants the `delegate-identity` entitlement: it may
    /// hand the agent another process of its user (DELEGATE), whose identity its connection then
    /// takes. Only a signed manifest grants it (a Flatpak app or an unsigned caller never has it).
    public let mayDelegate: Bool
    /// True if the caller's verified manifest grants the `portal-secret` entitlement: it may ask for
    /// the desktop portal's per-app secret of a Flatpak app it names (PORTAL_SECRET), and for nothing
    /// else of that app's group. Only a signed manifest grants it.
    public let mayServePortalSecrets: Bool

    /// One terminal session, told apart from every later session with the same id: a session id is
    /// the pid of the process that called `setsid()`, and a pid comes back, but a pid together with
    /// the start time of the process holding it does not (sudo keys its timestamps the same way). The
    /// kernel's audit session id (`/proc/PID/sessionid`, a kernel counter's next value when
    /// `pam_loginuid` sets the login uid at login; an unprivileged process cannot change it once set)
    /// is added where it is set.
    public struct LoginSession: Sendable, Hashable, CustomStringConvertible {
        /// The session id: the leader's pid, in the agent's pid namespace.
        public let id: Int32
        /// The leader's start time (`/proc/SID/stat` field 22: clock ticks after boot).
        public let leaderStartTime: UInt64
        /// The caller's audit session id; nil where none is set (4294967295) or the kernel has no audit.
        public let auditSessionID: UInt32?

        public init(id: Int32, leaderStartTime: UInt64, auditSessionID: UInt32?) {
            self.id = id
            self.leaderStartTime = leaderStartTime
            self.auditSessionID = auditSessionID
        }

        public var description: String {
            "session \(id) (leader started at tick \(leaderStartTime)\(auditSessionID.map { ", audit session \($0)" } ?? ""))"
        }
    }

    public init(pid: Int32, uid: UInt32, establishedBy: Establishment, accessGroups: [String],
                executable: String? = nil, sessionID: Int32? = nil, session: LoginSession? = nil, mayDelegate: Bool = false,
                mayServePortalSecrets: Bool = false) {
        self.mayDelegate = mayDelegate
        self.mayServePortalSecrets = mayServePortalSecrets
        self.pid = pid
        self.uid = uid
        self.establishedBy = establishedBy
        self.accessGroups = accessGroups
        if executable == nil, case .unsigned(let path, _) = establishedBy, !path.isEmpty {
            self.executable = path
        } else {
            self.executable = executable
        }
        self.sessionID = sessionID ?? session?.id
        self.session = session
    }

    /// This identity with the process's start time (``processStartTime``), as the resolver read it.
    public func withProcessStartTime(_ ticks: UInt64?) -> CallerIdentity {
        var c = self
        c.processStartTime = ticks
        return c
    }

    /// The app identifier (manifest `app`, or Flatpak app id); nil for unsigned callers.
    public var appID: String? {
        switch establishedBy {
        case .signedManifest(let id), .flatpak(let id): id
        case .unsigned: nil
        }
    }

    /// True if a manifest or a Flatpak sandbox vouches for the caller.
    public var isSigned: Bool { appID != nil }

    /// The group an added item without `agrp` goes to (nil for unsigned callers: policy decides).
    public var defaultAccessGroup: String? { accessGroups.first }

    public var description: String {
        switch establishedBy {
        case .signedManifest(let id): "app \(id) (signed manifest, pid \(pid))"
        case .flatpak(let id): "flatpak \(id) (pid \(pid))"
        case .unsigned(let path, let reason): "unsigned \(path) (pid \(pid): \(reason))"
        }
    }
}
