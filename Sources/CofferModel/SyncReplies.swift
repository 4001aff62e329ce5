/// Keychain sync's requests and replies (issue #29, WireProtocol.md "Sync"): what the agent's sync
/// answers `coffer sync`, in model values the service core returns and the protocol encodes.

/// SYNC_SETUP's operation.
public enum SyncSetupOperation: UInt8, Sendable {
    /// `coffer sync init`: found a circle on an empty remote.
    case initialize = 1
    /// `coffer sync join`: ask to join the circle on the remote.
    case join = 2
}

/// SYNC_CIRCLE's operation.
public enum SyncCircleOperation: UInt8, Sendable {
    /// Admit the device with this pairing code (argument: the code).
    case approve = 1
    /// Remove a device (argument: its id or unique name) and rotate the circle key.
    case remove = 2
    /// List the devices (no argument).
    case devices = 3
    /// The circle's fingerprint as this machine knows it (no argument; SYNC_CODE, the name empty).
    case circle = 4
}

/// SYNC_CODE: a device's name and pairing code (the code empty for `init`).
public struct SyncCode: Sendable, Equatable {
    public var name: String
    public var code: String
    public init(name: String, code: String) {
        self.name = name
        self.code = code
    }
}

/// One device of the circle (SYNC_DEVICES).
public struct SyncDeviceInfo: Sendable, Equatable {
    /// The device's id (lowercase hex).
    public var id: String
    public var name: String
    /// A member now (approved, not removed).
    public var member: Bool
    /// The agent's own device.
    public var thisDevice: Bool
    public init(id: String, name: String, member: Bool, thisDevice: Bool) {
        self.id = id
        self.name = name
        self.member = member
        self.thisDevice = thisDevice
    }
}

/// SYNC_STATUS_REPLY: where the agent's background sync is.
public struct SyncStatus: Sendable, Equatable {
    /// What this machine is in the circle.
    public enum State: UInt8, Sendable {
        /// Sync was never set up here.
        case off = 0
        /// Joined, waiting for a member to approve it.
        case waiting = 1
        /// A member of the circle.
        case member = 2
        /// Not known yet: the keybag has stayed locked since the agent started (the sync state is sealed).
        case unknown = 3
    }
    /// Where a running sync is (WireProtocol.md, SYNC_STATUS_REPLY): what ``done`` and ``total`` count.
    public enum Phase: UInt8, Sendable {
        /// No sync is running (or one is starting: done and total 0).
        case idle = 0
        /// git is fetching the remote (done and total 0).
        case fetching = 1
        /// Reading, verifying and opening the records that arrived: done of total.
        case verifying = 2
        /// Applying them to the keychain in one transaction: done and total the records verified.
        case applying = 3
        /// Pushing this machine's records: done and total the records this sync verified.
        case pushing = 4
    }
    public var state: State
    /// A sync is running now.
    public var running: Bool
    /// When the last sync completed (Unix milliseconds; 0: none since the agent started).
    public var lastSuccessMillis: UInt64
    /// When the last attempt ended, successful or not (Unix milliseconds; 0: none).
    public var lastAttemptMillis: UInt64
    /// Why the last attempt failed (empty: it succeeded or there was none). Never an item's contents.
    public var lastError: String
    /// The background pull interval in seconds.
    public var intervalSeconds: UInt32
    /// Conflicts kept (the losing versions).
    public var conflicts: UInt32
    /// Changes of other machines applied here since the agent started.
    public var applied: UInt32
    /// Local changes recorded (sent) since the agent started.
    public var recorded: UInt32
    /// The running sync's phase (``Phase/idle`` when ``running`` is false) and its counts (done ≤ total).
    public var phase: Phase
    public var done: UInt32
    public var total: UInt32

    public init(state: State, running: Bool = false, lastSuccessMillis: UInt64 = 0, lastAttemptMillis: UInt64 = 0, lastError: String = "",
                intervalSeconds: UInt32 = 0, conflicts: UInt32 = 0, applied: UInt32 = 0, recorded: UInt32 = 0,
                phase: Phase = .idle, done: UInt32 = 0, total: UInt32 = 0) {
        self.state = state
        self.running = running
        self.lastSuccessMillis = lastSuccessMillis
        self.lastAttemptMillis = lastAttemptMillis
        self.lastError = lastError
        self.intervalSeconds = intervalSeconds
        self.conflicts = conflicts
        self.applied = applied
        self.recorded = recorded
        self.phase = phase
        self.done = done
        self.total = total
    }
}

/// One kept conflict (SYNC_CONFLICTS_REPLY): which item, and the version that lost.
public struct SyncConflictInfo: Sendable, Equatable {
    /// The conflict's id (its losing record: `DEVICEHEX-SEQ`), for a restore.
    public var id: String
    /// The item's class (genp, inet, cert, keys).
    public var itemClass: String
    /// The item's service (genp) or server (inet); empty for the other classes.
    public var service: String
    /// The item's account (empty when it has none).
    public var account: String
    /// The winning version's time (Unix milliseconds of its hybrid logical clock).
    public var winnerMillis: UInt64
    /// The losing version's time and the device that wrote it (its name; its id if unknown).
    public var loserMillis: UInt64
    public var loserDevice: String
    /// The losing version was a deletion.
    public var loserDeleted: Bool
    public init(id: String, itemClass: String, service: String, account: String, winnerMillis: UInt64, loserMillis: UInt64,
                loserDevice: String, loserDeleted: Bool) {
        self.id = id
        self.itemClass = itemClass
        self.service = service
        self.account = account
        self.winnerMillis = winnerMillis
        self.loserMillis = loserMillis
        self.loserDevice = loserDevice
        self.loserDeleted = loserDeleted
    }
}
