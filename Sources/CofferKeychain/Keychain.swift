public import CofferCrypto
public import CofferKeybag
public import CofferModel
import CofferStore
package import CofferSystem
import Glibc

/// The keychain: SecItem semantics (add, copyMatching, update, delete) over the keybag and the
/// encrypted item store.
///
/// Every item operation takes an ``AccessScope`` (the groups it may see and write), never a caller:
/// who asks is the agent's business.
///
/// Thread-safe: operations are serialised on one mutex, which owns the store (SQLite work is short);
/// slow work such as Argon2id in ``unlock(passcode:)`` runs outside it. Lock order: the keychain's
/// mutex, then the keybag's (never the other way round).
public final class Keychain: Sendable {
    /// The keybag holding the class keys. Not handed out: the agent reads ``status`` and calls
    /// ``lock()``, ``unlock(passcode:)`` and ``setPasscode(current:new:kdf:)``.
    let keybag: Keybag
    /// The store and the migration log, owned by the keychain's mutex.
    let guarded: Protected<State>

    struct State {
        let store: ItemStore
        /// What the migrations of this process did (one line each, no attribute values).
        var migrations: [String] = []
        /// How many of `migrations` ``takeMigrationReport()`` returned already.
        var reported = 0
    }

    /// Index searches so far (``searchCount``).
    let searches = Protected(0)

    /// How many searches of the blind indexes (a search, an update's or a delete's matching,
    /// ``accessRequirements(_:scope:for:)``) this keychain has made; an item opened by its persistent
    /// reference, or the rows of a ``MatchHandle``, is not one. A protected read costs one (the
    /// attempt, which finds what the items need; the read once the person authenticated opens the
    /// attempt's matches), which the agent's tests and the benchmark check.
    public var searchCount: Int { searches.withLock { $0 } }

    /// Argon2id settings for new application-password items.
    let appPasswordKDF: ItemCrypto.AppPasswordKDF
    /// Failed application-password attempts per item, and their schedule.
    let appPasswordAttempts: ApplicationPasswordAttempts
    /// The directory the keychain lives in (the escrow record is kept there).
    let stateDirectory: String
    /// Rollback detection (nil: off): the counter, the ledger and the batching of NV writes.
    let rollback: RollbackGuard?
    /// True if this keychain's keybag was created at this open (an erased or new keychain).
    private let keybagIsNew: Bool

    /// The state directory's lock, when this keychain took it (``init(directory:deviceKey:applicationPasswordKDF:lockingStateDirectory:)``).
    private let stateLock: StateDirectoryLock?

    /// File names inside the state directory.
    public enum FileNames {
        /// The SQLite item database.
        public static let database = "keychain.db"
        /// The embedded default device key.
        public static let deviceKey = "device.key"
        /// The device key sealed by the TPM (``TPMDeviceKey``).
        public static let tpmDeviceKey = TPMDeviceKey.fileName
        /// The sync directory (a git working tree, SyncFormat.md), created when sync is set up.
        public static let syncDirectory = "sync"
    }

    /// Opens (creating on first use) the keychain in `directory` with `deviceKey` (default: the
    /// file `device.key` in the same directory). Application-password attempts wait
    /// `applicationPasswordDelays` (see ``ApplicationPasswordAttempts``) on `clock`'s time (wall-clock).
    ///
    /// `rollbackCounter`: turns rollback detection on (the RollbackAnchor article), anchored to that
    /// counter; item writes are anchored at most every `rollbackInterval` seconds and at every lock.
    ///
    /// `lockingStateDirectory`: takes the state directory's lock (``StateDirectoryLock``) first and
    /// holds it as long as this keychain lives, as every program but the agent must (the agent takes it
    /// itself, before it daemonises). errSecNotAvailable, naming the holder, if an agent or another
    /// program has it.
    package init(directory: String, deviceKey: DeviceKeySource? = nil,
                 applicationPasswordKDF: KDFParameters = KDFParameters(opsLimit: 2, memLimit: 64 << 20),
                 applicationPasswordDelays: [Double], clock: any MonotonicClock,
                 rollbackCounter: (any RollbackCounter)? = nil, rollbackInterval: Double = Keychain.defaultRollbackInterval,
                 lockingStateDirectory: Bool, migratingDeviceKey: Bool = false) throws(SecError) {
        if lockingStateDirectory {
            do {
                stateLock = try StateDirectoryLock.acquire(directory: directory, socket: nil)
            } catch {
                throw .notAvailable("\(error)")
            }
        } else {
            stateLock = nil
        }
        appPasswordKDF = ItemCrypto.AppPasswordKDF(opsLimit: applicationPasswordKDF.opsLimit, memLimit: applicationPasswordKDF.memLimit)
        appPasswordAttempts = ApplicationPasswordAttempts(path: directory + "/" + ApplicationPasswordAttempts.fileName,
                                                          delays: applicationPasswordDelays, clock: clock)
        stateDirectory = directory
        let source = deviceKey ?? FileDeviceKey(path: directory + "/" + FileNames.deviceKey)
        try Self.checkDeviceKeyFiles(directory, source, migrating: migratingDeviceKey)
        keybag = try Keybag.openOrCreate(directory: directory, deviceKey: source, migrating: migratingDeviceKey)
        if source.kind == .tpm && keybag.isTPMBound && Files.exists(directory + "/" + FileNames.deviceKey) {
            // A migration that a crash stopped after its commit: the file key opens nothing any more.
            try Self.removeFileDeviceKey(directory)
        }
        keybagIsNew = keybag.isNew
        let store = try ItemStore(path: directory + "/" + FileNames.database)
        rollback = rollbackCounter.map { RollbackGuard(counter: $0, interval: rollbackInterval, now: Self.now()) }
        if let rollback {
            rollback.ledger.load(from: keybag)
            store.ledger = rollback.ledger
        }
        guarded = Protected(State(store: store))
        // An escrow record beside a new keybag was made for one that is gone (erased, or its files
        // removed): it must never unlock this one.
        if keybag.isNew, hasEscrow { deleteEscrow() }
        if keybag.needsRekey { try migrateAtOpen() }
        // Without a passcode every key is in memory now: the rollback check runs at open.
        if rollback != nil && !keybag.isPasscodeSet { try checkRollback() }
    }

    /// Opens (creating on first use) the keychain in `directory` with `deviceKey` (default: the
    /// file `device.key` in the same directory), with the standard application-password schedule.
    /// `lockingStateDirectory`: as above; on by default, so a library caller cannot open a running
    /// agent's state by accident (only a process that holds the lock itself, as the agent does, passes
    /// false). `migratingDeviceKey`: a ``TPMDeviceKey`` that sealed the file key may open a format-2
    /// keybag (see ``migrateDeviceKey(passcode:)``).
    public convenience init(directory: String, deviceKey: DeviceKeySource? = nil,
                            applicationPasswordKDF: KDFParameters = KDFParameters(opsLimit: 2, memLimit: 64 << 20),
                            rollbackCounter: (any RollbackCounter)? = nil, rollbackInterval: Double = Keychain.defaultRollbackInterval,
                            lockingStateDirectory: Bool = true, migratingDeviceKey: Bool = false) throws(SecError) {
        try self.init(directory: directory, deviceKey: deviceKey, applicationPasswordKDF: applicationPasswordKDF,
                      applicationPasswordDelays: ApplicationPasswordAttempts.standardDelays, clock: SystemWallClock(),
                      rollbackCounter: rollbackCounter, rollbackInterval: rollbackInterval,
                      lockingStateDirectory: lockingStateDirectory, migratingDeviceKey: migratingDeviceKey)
    }

    /// Refuses a device key that does not match the state directory's files, before anything is
    /// created: a TPM keychain never falls back to a file key (nor a file keychain to a new TPM key).
    private static func checkDeviceKeyFiles(_ directory: String, _ source: DeviceKeySource, migrating: Bool) throws(SecError) {
        let hasFileKey = Files.exists(directory + "/" + FileNames.deviceKey)
        let hasTPMKey = Files.exists(directory + "/" + FileNames.tpmDeviceKey)
        let hasKeybag = Files.exists(directory + "/keybag.key") || Files.exists(directory + "/keybag")
        switch source.kind {
        case .file where hasTPMKey && !hasFileKey:
            throw .notAvailable("the keychain in \(directory) keeps its device key in the TPM (\(FileNames.tpmDeviceKey)); the agent is "
                + "configured for the file device key: set 'device-key = tpm' (and 'tpm-tcti' if the TPM is not at /dev/tpmrm0) in cofferd.conf")
        case .tpm where hasKeybag && !hasTPMKey && !migrating:
            throw .notAvailable("the keychain in \(directory) uses the file device key (\(FileNames.deviceKey)): move it to the TPM with "
                + "'coffer device-key migrate --to tpm' (agent stopped), or set 'device-key = file'")
        default: break
        }
    }

    /// Removes `device.key` durably (unlink, fsync of the directory).
    static func removeFileDeviceKey(_ directory: String) throws(SecError) {
        let path = directory + "/" + FileNames.deviceKey
        guard unsafe unlink(path) == 0 || errno == ENOENT else { throw .io("cannot remove \(path): errno \(errno)") }
        do { try Files.syncDirectory(of: path) } catch { throw .io("cannot sync \(directory): \(error)") }
    }

    /// Where the device key lives.
    public var deviceKeyKind: DeviceKeyKind { keybag.deviceKeyKind }

    /// Releases what the device key source holds (a kept TPM connection and its storage primary),
    /// at the agent's shutdown; the next use opens it again.
    public func releaseDeviceKey() { keybag.releaseDeviceKey() }

    /// True if wrong passcodes are counted by the TPM (a TPM device key with a passcode set).
    public var attemptsCountedByTPM: Bool { keybag.attemptsCountedByTPM }

    /// Whether the TPM that counts wrong passcodes has a lockout authorization (asked now): false when
    /// anyone who reaches the TPM can reset its count, so that the `attempts` file is the bound on
    /// guesses through the agent; nil without a TPM device key, or when the TPM never answered.
    public var tpmLockoutAuthorizationSet: Bool? { keybag.lockoutAuthorizationSet }

    /// Derives the passcode key of `passcode` without unlocking anything: with a TPM-bound passcode the
    /// TPM checks it (and counts it if wrong). For the agent, which also sends every passcode PAM
    /// refuses through the TPM, so deleting the `attempts` file earns no guesses.
    public func checkPasscode(_ passcode: SecureBytes) throws(SecError) {
        _ = try keybag.derivePasscodeKey(passcode)
    }

    // MARK: Keybag pass-through

    /// Unlocks the keybag (the passcode was checked by PAM first, in the agent).
    ///
    /// Argon2id runs outside the keychain mutex. If a rekey is pending (a format-1 keybag, or a passcode
    /// change a crash interrupted), it is finished here, holding the mutex, before the keys are handed out.
    public func unlock(passcode: SecureBytes?) throws(SecError) {
        let derived = try keybag.derivePasscodeKey(passcode)
        try guarded.withLock { (s: inout State) throws(SecError) in
            let version = keybag.formatVersion
            let needed = keybag.needsRekey
            let store = s.store
            var line: String? = nil
            do throws(SecError) {
                try keybag.unlock(derived: derived) { keys throws(SecError) in line = try self.resealRows(store, keys, from: version) }
            } catch {
                if let line { s.migrations.append(line) }
                throw error
            }
            if let line { s.migrations.append(line) }
            if needed { s.migrations.append("keybag rekey finished at unlock (keybag format \(version) → \(keybag.formatVersion))") }
            try checkRollback(&s)
        }
    }

    /// The unlock's rollback check (nothing without rollback detection): on a finding the keybag is
    /// locked again and the finding thrown; nothing else changes.
    func checkRollback() throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in try checkRollback(&s) }
    }

    private func checkRollback(_ s: inout State) throws(SecError) {
        guard let rollback else { return }
        rollback.ledger.load(from: keybag)
        do {
            if let line = try rollback.check(s.store, keybagIsNew: keybagIsNew, now: Self.now()) { s.migrations.append(line) }
        } catch {
            keybag.lock()
            throw error
        }
    }

    /// Anchors the item writes made since the last NV increment, if any (a lock, a clean stop, the
    /// batching interval). A failure (no TPM now) leaves them for the next try.
    func flushRollback(_ store: ItemStore) {
        guard let rollback else { return }
        try? rollback.flush(store, now: Self.now())
    }

    /// Item writes are anchored to the counter at most this often (seconds) and at every lock.
    public static let defaultRollbackInterval: Double = 60

    /// True if rollback detection is on.
    public var rollbackDetection: Bool { rollback != nil }

    /// Locks the keybag (wipes the WhenUnlocked keys). True if this call locked it (it was unlocked),
    /// decided in the same critical section as the wipe, so of two concurrent callers one sees true.
    @discardableResult
    public func lock() -> Bool {
        guarded.withLock { flushRollback($0.store) }
        return keybag.lock()
    }

    /// The lock state and whether a passcode is set, read together in one critical section.
    public var status: LockStatus { keybag.status }

    /// The Argon2id parameters chosen at passcode set (nil with no passcode).
    public var kdfParameters: KDFParameters? { keybag.kdfParameters }

    /// True if the keybag files are no longer those this keychain loaded or wrote (another process
    /// rewrote them): every write is then refused with errSecNotAvailable until the agent restarts.
    public var keybagFilesChanged: Bool { (try? keybag.checkUnchanged()) == nil }

    /// Number of items (all classes, locked or not).
    public func count() throws(SecError) -> Int { try guarded.withLock { (s: inout State) throws(SecError) in try s.store.count() } }

    /// Runs SQLite's integrity check on the database.
    public func integrityCheck() throws(SecError) -> Bool { try guarded.withLock { (s: inout State) throws(SecError) in try s.store.integrityCheck() } }

    /// Erases everything (too many failed passcode attempts, when the agent is configured to): the
    /// keybag is destroyed (keys wiped, files deleted: every item is unrecoverable), the escrow record
    /// deleted, every row deleted (the sync state and device keys with them), the sync directory removed,
    /// and the application-password attempts forgotten (their file too). This
    /// keychain object is unusable afterwards; open the directory again for a fresh one.
    public func eraseEverything() {
        keybag.destroy()
        deleteEscrow()
        guarded.withLock { s in
            appPasswordAttempts.erase()
            let store = s.store
            try? store.transaction { () throws(SecError) in try store.deleteAll() }
            store.checkpoint()
        }
        // The sync clone goes too (its state and device keys went with the rows): nothing of the circle stays.
        try? Files.removeTree(syncDirectory)
    }

    /// Checkpoints the write-ahead log (clean shutdown).
    public func checkpoint() {
        guarded.withLock { s in
            flushRollback(s.store)
            s.store.checkpoint()
        }
    }

    static func now() -> Double {
        var ts = timespec()
        unsafe clock_gettime(CLOCK_REALTIME, &ts)
        return (Double(ts.tv_sec) + Double(ts.tv_nsec / 1000) / 1_000_000)
    }
}
