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

    /// Match passes so far (``searchCount``).
    private let searches = Protected(0)

    /// How many passes over the items matching a query (a search, an update's or a delete's matching,
    /// ``accessRequirements(_:scope:for:)``) this keychain has made: a protected read costs two (the
    /// attempt, which finds what the items need, and the read once the person authenticated), which
    /// the agent's tests and the benchmark check.
    public var searchCount: Int { searches.withLock { $0 } }

    /// Argon2id settings for new application-password items.
    private let appPasswordKDF: ItemCrypto.AppPasswordKDF
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
    private static func removeFileDeviceKey(_ directory: String) throws(SecError) {
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

    /// Moves this keychain (opened with a ``TPMDeviceKey`` that sealed the file key, `migratingDeviceKey`)
    /// to the TPM: the keybag rekey of ``Keybag/migrateDeviceKey(passcode:reseal:)`` (every non-Always
    /// item re-sealed under fresh keys, as at a passcode change), then `device.key` removed, only once
    /// the format-3 keybag is durable. A keybag already in format 3 (an earlier run a crash stopped)
    /// is finished: its pending rekey at this unlock, then the file key removed.
    public func migrateDeviceKey(passcode: SecureBytes?) throws(SecError) {
        guard keybag.deviceKeyKind == .tpm else { throw .param("open the keychain with the TPM device key to migrate it") }
        if keybag.isTPMBound {
            if keybag.needsRekey, keybag.isPasscodeSet { try unlock(passcode: passcode) }
        } else {
            try guarded.withLock { (s: inout State) throws(SecError) in
                let version = keybag.formatVersion
                let store = s.store
                var line: String? = nil
                defer { if let line { s.migrations.append(line) } }
                // The rekey re-seals the rollback records under the new passcode tier (resealRows), as a
                // passcode change does; without the counter they would no longer open after the move.
                try verifyBeforeRekey(store)
                defer { rollback?.ledger.load(from: keybag) }
                try keybag.migrateDeviceKey(passcode: passcode) { keys throws(SecError) in
                    line = try self.resealRows(store, keys, from: version)
                }
                // Sealed at value + 1: counted now, or at the next unlock after a crash (rule 5's value + 1).
                if let rollback, (try? rollback.records(store))??.device.epoch ?? 0 > 0 { _ = try? rollback.counter.increment() }
            }
        }
        CrashPoint.hit("migrate-committed")
        try Self.removeFileDeviceKey(stateDirectory)
        CrashPoint.hit("migrate-done")
    }

    /// What the migrations of this process did (one line each, no attribute values), for the agent's log.
    public var migrationReport: [String] { guarded.withLock { $0.migrations } }

    /// The lines of ``migrationReport`` not taken before (the agent logs each once).
    public func takeMigrationReport() -> [String] {
        guarded.withLock { s in
            defer { s.reported = s.migrations.count }
            return Array(s.migrations[s.reported...])
        }
    }

    /// A keybag of format 1 (or one a crash left mid-rekey) at open: re-pads the Always rows now (their
    /// keys never change), and without a passcode finishes the whole rekey now; with a passcode the
    /// first unlock does (see ``unlock(passcode:)``).
    private func migrateAtOpen() throws(SecError) {
        let version = keybag.formatVersion
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            let repadded = try store.transaction { () throws(SecError) in try repadAlwaysRows(store) }
            if repadded > 0 { s.migrations.append("keychain: \(repadded) Always-class items re-padded (item format 2)") }
            if !keybag.isPasscodeSet {
                var line: String? = nil
                defer { if let line { s.migrations.append(line) } }
                try keybag.finishRekeyWithoutPasscode { keys throws(SecError) in line = try self.resealRows(store, keys, from: version) }
            } else {
                s.migrations.append("keybag format \(version) with a passcode: the remaining items are migrated at the first unlock")
            }
        }
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

    /// A rekey re-seals the rollback records: first they must match the counter and the rows (what the
    /// keys in memory can check), or a passcode change would bless a keychain.db put back. Called before
    /// the keybag changes anything, and again inside the rekey (a rekey finished at unlock).
    private func verifyBeforeRekey(_ store: ItemStore) throws(SecError) {
        guard let rollback, let (d, p) = try rollback.records(store), d.epoch > 0 else { return }
        try rollback.verify(store, device: d, passcode: p, counter: try rollback.counter.read())
    }

    /// Anchors the item writes made since the last NV increment, if any (a lock, a clean stop, the
    /// batching interval). A failure (no TPM now) leaves them for the next try.
    private func flushRollback(_ store: ItemStore) {
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

    /// Sets or changes the keybag passcode: a rekey that re-seals every non-Always item under fresh
    /// keys (holding the keychain mutex throughout: seconds at 100,000 items).
    public func setPasscode(current: SecureBytes?, new: SecureBytes, kdf: KDFPolicy = .standard) throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let version = keybag.formatVersion
            let store = s.store
            var line: String? = nil
            defer { if let line { s.migrations.append(line) } }
            try verifyBeforeRekey(store)
            defer { rollback?.ledger.load(from: keybag) }
            try keybag.setPasscode(current: current, new: new, kdf: kdf) { keys throws(SecError) in
                line = try self.resealRows(store, keys, from: version)
            }
            // The rekey sealed the records at value + 1: count it now. The change is done either way: a
            // crash or an unreachable TPM here leaves the increment to the next unlock (rule 5's value + 1).
            if let rollback, (try? rollback.records(store))??.device.epoch ?? 0 > 0 { _ = try? rollback.counter.increment() }
        }
    }

    /// Removes the passcode (`coffer passcode remove`; the agent checked it through PAM first): every
    /// WhenPasscodeSetThisDeviceOnly item is deleted (its class key is destroyed: unrecoverable), every
    /// other item is re-sealed under fresh keys the device key wraps, in one transaction (crash-safe
    /// through the rekey mechanism). Items with an access control stay but cannot be opened while no
    /// passcode is set (nobody can authenticate).
    public func removePasscode(current: SecureBytes) throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let version = keybag.formatVersion
            let store = s.store
            var line: String? = nil
            defer { if let line { s.migrations.append(line) } }
            try verifyBeforeRekey(store)
            defer { rollback?.ledger.load(from: keybag) }
            try keybag.removePasscode(current: current) { keys throws(SecError) in
                line = try self.resealRows(store, keys, from: version)
            }
            // The rekey sealed the records at value + 1: count it now. The change is done either way: a
            // crash or an unreachable TPM here leaves the increment to the next unlock (rule 5's value + 1).
            if let rollback, (try? rollback.records(store))??.device.epoch ?? 0 > 0 { _ = try? rollback.counter.increment() }
        }
    }

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

    // MARK: SecItemAdd

    /// Adds an item (SecItemAdd) to its `agrp`, or to `scope`'s default group. errSecDuplicateItem if
    /// its class's primary key exists (`agrp` is part of it), errSecMissingEntitlement if its group is
    /// outside `scope`, errSecInteractionNotAllowed if its class key is locked, errSecNotAvailable for
    /// WhenPasscodeSetThisDeviceOnly with no passcode, errSecParam for bad attributes.
    @discardableResult
    public func add(_ item: NewItem, scope: AccessScope, returnData: Bool = false, returnAttributes: Bool = false,
                    returnPersistentRef: Bool = false, applicationPassword: SecureBytes? = nil) throws(SecError) -> ItemResult {
        try Validation.check(item.attributes, for: item.itemClass, writing: true)
        let (attrs, protection) = try completed(item.attributes, scope)
        let ref = Random.bytes(16)
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            let (content, otherTiers) = try unsafe item.secret.withUnsafeBytes { s throws(SecError) in
                try unsafe seal(itemClass: item.itemClass, attributes: attrs, secret: s, protection: protection, ref: ref,
                         applicationPassword: applicationPassword)
            }
            // The row and its index entries commit together (one transaction) or not at all.
            try writing(store) { () throws(SecError) in
                try checkNoDuplicate(store, otherTiers, except: nil)
                _ = try store.insert(content)
                try notePendingSync(store, item.itemClass, attrs)
            }
            return unsafe ItemResult(itemClass: item.itemClass,
                              attributes: returnAttributes ? attrs : nil,
                              data: returnData ? SecureBytes(copying: item.secret.withUnsafeBytes { unsafe $0 }) : nil,
                              persistentRef: returnPersistentRef ? ref : nil)
        }
    }

    /// Adds many items in one transaction: all of them or none (imports, restores).
    public func add(contentsOf items: [NewItem], scope: AccessScope) throws(SecError) {
        var prepared: [(NewItem, Attributes, ProtectionClass)] = []
        for item in items {
            try Validation.check(item.attributes, for: item.itemClass, writing: true)
            let (attrs, protection) = try completed(item.attributes, scope)
            prepared.append((item, attrs, protection))
        }
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            try writing(store) { () throws(SecError) in
                for (item, attrs, protection) in prepared {
                    let (content, otherTiers) = try unsafe item.secret.withUnsafeBytes { s throws(SecError) in
                        try unsafe seal(itemClass: item.itemClass, attributes: attrs, secret: s, protection: protection, ref: Random.bytes(16))
                    }
                    try checkNoDuplicate(store, otherTiers, except: nil)
                    try store.insert(content)
                    try notePendingSync(store, item.itemClass, attrs)
                }
            }
        }
    }

    /// Restores items from a backup in one transaction (all of them or none): an item whose primary key
    /// is already present is kept as it is and the backup's copy counted as a duplicate (the documented
    /// policy). `dryRun` does the same work and rolls it back: what a restore would do, changing nothing.
    public func restore(_ items: [NewItem], dryRun: Bool) throws(SecError) -> (added: Int, duplicates: Int) {
        let r = try restore(items, directories: [], dryRun: dryRun)
        return (r.added, r.duplicates)
    }

    /// Restores `items` and the protected directories `directories` in one transaction: a directory
    /// whose path is already recorded is kept as it is and counted as a duplicate. Returns the records
    /// of the directories restored.
    func restore(_ items: [NewItem], directories: [RestoredDirectory], dryRun: Bool) throws(SecError)
        -> (added: Int, duplicates: Int, directories: [FileKeyRecord]) {
        var prepared: [(NewItem, Attributes, ProtectionClass)] = []
        for item in items {
            try Validation.check(item.attributes, for: item.itemClass, writing: true)
            let (attrs, protection) = try completed(item.attributes, .unrestricted)
            prepared.append((item, attrs, protection))
        }
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            // Wrapped under the class keys inside the lock: a passcode change (a rekey of the class keys)
            // cannot slip between the wrap and the insert and leave a key wrapped under the old class key.
            var directoryRows: [ItemStore.FileKeyRow] = []
            for d in directories {
                directoryRows.append(try fileKeyRow(path: d.path, protection: d.protection, identifier: d.identifier, key: d.key))
            }
            var added = 0, duplicates = 0
            var restoredDirectories: [FileKeyRecord] = []
            do throws(SecError) {
                try writing(store) { () throws(SecError) in
                    let recorded = Set(try store.fileKeys().map(\.path))
                    for row in directoryRows {
                        if recorded.contains(row.path) {
                            duplicates += 1
                            continue
                        }
                        try store.insertFileKey(row)
                        restoredDirectories.append(FileKeyRecord(path: String(decoding: row.path, as: UTF8.self),
                                                                 protection: FileProtection(rawValue: row.fileClass)!,
                                                                 identifier: row.identifier, version: row.wrapped.first ?? 0))
                        added += 1
                    }
                    for (item, attrs, protection) in prepared {
                        let (content, otherTiers) = try unsafe item.secret.withUnsafeBytes { s throws(SecError) in
                            try unsafe seal(itemClass: item.itemClass, attributes: attrs, secret: s, protection: protection, ref: Random.bytes(16))
                        }
                        if try store.rowID(primaryKey: content.primaryKeyHash) != nil {
                            duplicates += 1
                            continue
                        }
                        do throws(SecError) {
                            try checkNoDuplicate(store, otherTiers, except: nil)
                        } catch {
                            duplicates += 1
                            continue
                        }
                        _ = try store.insert(content)
                        try notePendingSync(store, item.itemClass, attrs)
                        added += 1
                    }
                    if dryRun { throw SecError(.userCanceled, "dry run") }
                }
            } catch {
                // A dry run rolls back on purpose; anything else is a failure (nothing was written).
                guard dryRun && error.status == .userCanceled && error.message == "dry run" else { throw error }
                restoredDirectories = []
            }
            return (added, duplicates, restoredDirectories)
        }
    }

    /// Fills in the defaults an added item gets: protection, access group, sync, dates; checks the group is in scope.
    private func completed(_ given: Attributes, _ scope: AccessScope) throws(SecError) -> (Attributes, ProtectionClass) {
        var attrs = given
        let given = try Validation.protection(of: attrs)
        var protection = given ?? .defaultForNewItems
        if try Validation.accessControl(of: attrs) != nil {
            // An item with an access control needs a passcode (the seeds' WhenPasscodeSet rule: without
            // one there is nobody to authenticate) and never leaves this device.
            guard keybag.isPasscodeSet else {
                throw .notAvailable("an item with an access control needs a passcode; set one with 'coffer passcode set'")
            }
            if let given, !given.isThisDeviceOnly {
                throw .param("an item with an access control must be ThisDeviceOnly (it never goes into a backup)")
            }
            protection = given ?? .whenUnlockedThisDeviceOnly
        }
        attrs["pdmn"] = .string(protection.shortCode)
        if attrs["agrp"] == nil { attrs["agrp"] = .string(scope.defaultGroup) }
        try Validation.checkEntitled(attrs, in: scope)
        if attrs["sync"] == nil { attrs["sync"] = .bool(false) }
        let now = AttributeValue.date(Self.now())
        attrs["cdat"] = now
        attrs["mdat"] = now
        return (attrs, protection)
    }

    // MARK: SecItemCopyMatching

    /// Finds items (SecItemCopyMatching): the first match unless `limit` says otherwise.
    /// errSecItemNotFound when nothing matches; errSecInteractionNotAllowed when a candidate's
    /// class key is locked (its attributes cannot even be compared). Items outside `scope` are invisible.
    public func copyMatching(_ query: ItemQuery, scope: AccessScope,
                             authorization: AuthorizationContext = .none,
                             grants: [[UInt8]: AuthorizationContext] = [:]) throws(SecError) -> [ItemResult] {
        try Validation.check(query)
        try Validation.checkEntitled(query.attributes, in: scope)
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            var results: [ItemResult] = []
            var needs = Requirements(operation: .useSecret, authorization: authorization, grants: grants)
            let complete = try store.reading { () throws(SecError) in
                try forEachMatch(store, query, scope, limit: query.limit.bound, namingLocked: true, locked: { row in
                    results.append(ItemResult(itemClass: query.itemClass ?? .genericPassword, persistentRef: row.persistentRef, locked: true))
                }) { (row, cls, attrs) throws(SecError) in
                    if query.returnData { try Self.checkExtractable(query, cls, attrs); guard try needs.admit(attrs, row.persistentRef) else { return } }
                    var r = ItemResult(itemClass: cls)
                    if query.returnAttributes { r.attributes = attrs }
                    if query.returnPersistentRef { r.persistentRef = row.persistentRef }
                    if query.reportsAccessState { r.needsAuthentication = try needs.wouldNeedPerson(attrs, row.persistentRef) }
                    if query.returnData { r.data = try openSecret(row, cls, attrs, needs.authorization(for: row.persistentRef, attrs)) }
                    results.append(r)
                }
            }
            // Never a silent partial answer: a match may sit in a tier that could not be searched.
            guard complete || query.skipsLockedItems else { throw Self.notFound(false) }
            try needs.throwIfUnsatisfied()
            guard !results.isEmpty else { throw Self.notFound(complete) }
            return results
        }
    }

    // MARK: SecItemCopyMatching, one page at a time

    /// One page of a search (``copyMatchingPage(_:after:fits:)``).
    public struct MatchPage: Sendable {
        /// The results, oldest first.
        public var items: [ItemResult]
        /// Row id of the last result (the cursor of the next page); the given cursor when empty.
        public var lastRowID: Int64
        /// True when nothing is left: the matches ran out or `query.limit` items were returned.
        public var isComplete: Bool
        /// Rows this page skipped because they fail authentication (only with `query.skipUnreadable`).
        public var unreadable = 0
    }

    /// SecItemCopyMatching for a paged reply: the matches after row id `cursor` (0: from the start),
    /// oldest first, at most `query.limit`, each offered to `fits` in turn; the first result `fits`
    /// refuses ends the page (incomplete; that result is dropped). errSecItemNotFound only when
    /// nothing matches from the start (`cursor` 0); a later page may be empty and complete. Items
    /// outside `scope` are invisible.
    public func copyMatchingPage(_ query: ItemQuery, scope: AccessScope, after cursor: Int64,
                                 authorization: AuthorizationContext = .none,
                                 grants: [[UInt8]: AuthorizationContext] = [:],
                                 fits: (ItemResult) -> Bool) throws(SecError) -> MatchPage {
        try Validation.check(query)
        try Validation.checkEntitled(query.attributes, in: scope)
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            var items: [ItemResult] = []
            var lastRowID = cursor, refused = false, skippedIDs: [Int64] = []
            let skip: ((StoredRow) throws(SecError) -> Void)? = query.skipUnreadable ? { [keybag] row throws(SecError) in
                // Counted for the caller unless its index says another group's (a row without index
                // entries, forged or damaged, may be anyone's: counted).
                if let groups = scope.groups, let p = ProtectionClass(rawValue: row.protectionClass) {
                    let mine = try unsafe keybag.withIndexKey(IndexTier.of(p)) { k in Set(groups.map { unsafe Self.blindHash(k, "agrp", .string($0)) }) }
                    let index = try store.indexHashes(item: row.id)
                    if !index.isEmpty && mine.isDisjoint(with: index) { return }
                }
                skippedIDs.append(row.id)
            } : nil
            var needs = Requirements(operation: .useSecret, authorization: authorization, grants: grants)
            let complete = try store.reading { () throws(SecError) in
                try forEachMatch(store, query, scope, limit: query.limit.bound, after: cursor, until: { refused },
                                 unreadable: skip, namingLocked: true, locked: { row in
                    let r = ItemResult(itemClass: query.itemClass ?? .genericPassword, persistentRef: row.persistentRef, locked: true)
                    guard fits(r) else { refused = true; return }
                    items.append(r)
                    lastRowID = row.id
                }) { (row, cls, attrs) throws(SecError) in
                    if query.returnData { try Self.checkExtractable(query, cls, attrs); guard try needs.admit(attrs, row.persistentRef) else { return } }
                    var r = ItemResult(itemClass: cls)
                    if query.returnAttributes { r.attributes = attrs }
                    if query.returnPersistentRef { r.persistentRef = row.persistentRef }
                    if query.reportsAccessState { r.needsAuthentication = try needs.wouldNeedPerson(attrs, row.persistentRef) }
                    if query.returnData {
                        do throws(SecError) {
                            r.data = try openSecret(row, cls, attrs, needs.authorization(for: row.persistentRef, attrs))
                        } catch where error.status == .decode && skip != nil {
                            // A secret that fails authentication is damage like an attribute block's: a
                            // listing that tolerates damage skips the row and reports it.
                            try skip?(row)
                            return
                        }
                    }
                    guard fits(r) else { refused = true; return }
                    items.append(r)
                    lastRowID = row.id
                }
            }
            try needs.throwIfUnsatisfied()
            // A page cut short by `fits` is resumed after its last item: rows skipped beyond it are met
            // (and counted) again by the next page, so this one does not count them.
            let unreadable = refused ? skippedIDs.count(where: { $0 < lastRowID }) : skippedIDs.count
            guard complete || query.skipsLockedItems else { throw Self.notFound(false) }
            guard !items.isEmpty || refused || cursor > 0 || unreadable > 0 else { throw Self.notFound(complete) }
            return MatchPage(items: items, lastRowID: lastRowID, isComplete: !refused, unreadable: unreadable)
        }
    }

    // MARK: Access control

    /// The access controls that guard `operation` on the items `query` matches in `scope` (distinct,
    /// in match order): what the agent's policy must satisfy before running the operation. For a
    /// search, only one returning data (`.useSecret`) can need any. Empty if nothing matches or no
    /// match is protected. The same errors as a search (a locked class key, a bad query).
    public func accessRequirements(_ query: ItemQuery, scope: AccessScope,
                                   for operation: AccessControl.Operations) throws(SecError) -> [AccessControl] {
        try Validation.check(query)
        try Validation.checkEntitled(query.attributes, in: scope)
        let limit = operation == .useSecret ? query.limit.bound : nil
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            var out: [AccessControl] = []
            _ = try store.reading { () throws(SecError) in
                try forEachMatch(store, query, scope, limit: limit) { (_, _, attrs) throws(SecError) in
                    if let acl = try Self.accessControl(attrs), acl.guards(operation), !out.contains(acl) { out.append(acl) }
                }
            }
            return out
        }
    }

    /// The stored access control of an item's attributes; errSecDecode if it is there but unreadable
    /// (fail closed: a damaged rule never means "no rule").
    private static func accessControl(_ attrs: Attributes) throws(SecError) -> AccessControl? {
        guard let v = attrs[AccessControl.attributeName] else { return nil }
        guard case .data(let b) = v, let acl = AccessControl(encoded: b) else {
            throw .decode("an item's access control is damaged")
        }
        return acl
    }

    /// One pass's access-control check: every match goes through ``admit(_:)``; the first whose rule
    /// `authorization` does not satisfy stops the operation's work (nothing more is opened), but the
    /// pass goes on collecting the rules of the remaining matches, so that the
    /// ``SecError/authenticationNeeded(_:requirements:)`` it ends with carries everything the agent
    /// must ask the person for: no second search for the requirements.
    private struct Requirements {
        let operation: AccessControl.Operations
        let held: AuthorizationContext
        /// Per item (persistent reference): what a grant the caller holds for it carries (a Secret
        /// Service prompt's read), which stands instead of `held` for that item alone.
        let grants: [[UInt8]: AuthorizationContext]
        /// The distinct rules guarding `operation` on the matches so far.
        private(set) var rules: [AccessControl] = []
        /// The persistent references of the matches those rules guard, in match order.
        private(set) var targets: [[UInt8]] = []
        /// The first rule `authorization` does not satisfy.
        private var unsatisfied: AccessControl? = nil

        init(operation: AccessControl.Operations, authorization: AuthorizationContext, grants: [[UInt8]: AuthorizationContext] = [:]) {
            self.operation = operation
            self.held = authorization
            self.grants = grants
        }

        /// What authorizes the operation on the item `ref` guarded by `acl`: what the caller holds if
        /// that satisfies the rule, else the caller's grant for this item if it has one.
        private func authorization(for ref: [UInt8]?, _ acl: AccessControl) -> AuthorizationContext {
            guard !grants.isEmpty, !acl.isSatisfied(by: held), let ref, let g = grants[ref] else { return held }
            return g
        }

        /// What opens the secret of the item `ref` with attributes `attrs` (an application password
        /// among it): ``authorization(for:_:)`` for its rule.
        func authorization(for ref: [UInt8], _ attrs: Attributes) throws(SecError) -> AuthorizationContext {
            guard !grants.isEmpty, let acl = try Keychain.accessControl(attrs), acl.guards(operation) else { return held }
            return authorization(for: ref, acl)
        }

        /// True if the operation may go on with this match (nothing unsatisfied so far, this one included).
        mutating func admit(_ attrs: Attributes, _ ref: [UInt8]? = nil) throws(SecError) -> Bool {
            guard let acl = try Keychain.accessControl(attrs), acl.guards(operation) else { return unsatisfied == nil }
            if !rules.contains(acl) { rules.append(acl) }
            if let ref { targets.append(ref) }
            if unsatisfied == nil && !acl.isSatisfied(by: authorization(for: ref, acl)) { unsatisfied = acl }
            return unsatisfied == nil
        }

        /// True if `operation` on this match would need the person now: its rule is not satisfied by
        /// what the caller holds for it (never counted as a refusal: a listing reports it).
        func wouldNeedPerson(_ attrs: Attributes, _ ref: [UInt8]) throws(SecError) -> Bool {
            guard let acl = try Keychain.accessControl(attrs), acl.guards(operation) else { return false }
            return !acl.isSatisfied(by: authorization(for: ref, acl))
        }

        /// errSecInteractionNotAllowed (needs authentication, with the rules) if a match was not admitted.
        func throwIfUnsatisfied() throws(SecError) {
            guard let acl = unsatisfied else { return }
            throw .authenticationNeeded("the item's access control (\(acl)) needs authentication for this operation",
                                        requirements: rules, targets: targets)
        }
    }

    /// errSecInteractionNotAllowed unless `authorization` satisfies the item's access control for
    /// `operation` (the policy decided before; this is the keychain's own check of that decision).
    private static func checkAuthorized(_ attrs: Attributes, _ operation: AccessControl.Operations,
                                        _ authorization: AuthorizationContext) throws(SecError) {
        guard let acl = try accessControl(attrs), acl.guards(operation), !acl.isSatisfied(by: authorization) else { return }
        throw .authenticationNeeded("the item's access control (\(acl)) needs authentication for this operation")
    }

    /// For an operation the item's rule lets through only because an application password was given,
    /// and that never opens the old secret (a delete, an update replacing the secret), proves the
    /// password by opening the secret: a wrong one is errSecAuthFailed, as on a read, so a party that
    /// does not know it can neither delete the item nor replace its secret.
    private func proveApplicationPassword(_ row: StoredRow, _ cls: ItemClass, _ attrs: Attributes, _ operation: AccessControl.Operations,
                                          _ authorization: AuthorizationContext) throws(SecError) {
        guard authorization.hasApplicationPassword, let acl = try Self.accessControl(attrs), acl.guards(operation) else { return }
        var without = authorization
        without.applicationPassword = nil
        guard !acl.isSatisfied(by: without) else { return }
        try openSecret(row, cls, attrs, authorization).wipe()
    }

    // MARK: SecItemUpdate

    /// Updates every matching item (SecItemUpdate); returns how many. A new `pdmn` re-wraps the item
    /// under that class; otherwise its protection is kept. All changes commit together or none do.
    /// Items outside `scope` are invisible; moving items to a group outside it is errSecMissingEntitlement.
    /// `touched` hears, while the changes are written, each changed item's access group (and the
    /// group it moved to): called again for the same group, and for the writes of a transaction that
    /// then fails (the caller counts them only once the update returns).
    @discardableResult
    public func update(_ query: ItemQuery, _ changes: ItemChanges, scope: AccessScope,
                       authorization: AuthorizationContext = .none, touched: (String) -> Void = { _ in }) throws(SecError) -> Int {
        var changes = changes
        let clearsGeneral = changes.attributes[GeneralAttributes.noneKey] == .string("")
        if clearsGeneral { changes.attributes.removeValue(forKey: GeneralAttributes.noneKey) }
        try Validation.check(query)
        try Validation.checkEntitled(query.attributes, in: scope)
        try Validation.check(changes.attributes, for: nil, writing: true)
        if changes.attributes[AccessControl.attributeName] != nil {
            throw .param("an item's access control (accc) cannot be changed; delete the item and add it again")
        }
        guard !changes.attributes.isEmpty || changes.secret != nil || clearsGeneral else { throw .param("nothing to update") }
        try Validation.checkEntitled(changes.attributes, in: scope)
        let newProtection = try Validation.protection(of: changes.attributes)
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            try keybag.checkUnchanged() // before matching: rows re-sealed elsewhere would not even be found
            var matches: [(StoredRow, ItemClass, Attributes)] = []
            let complete = try forEachMatch(store, query, scope, limit: nil) { (row, cls, attrs) throws(SecError) in matches.append((row, cls, attrs)) }
            // An update acts on every match: not on some while others may sit in a tier not searchable.
            guard complete, !matches.isEmpty else { throw Self.notFound(complete) }
            // Every match's rule before anything is written, so that an authentication-needed answer
            // names them all (the agent asks once, then updates).
            var needs = Requirements(operation: .update, authorization: authorization)
            for (_, cls, old) in matches {
                try Validation.check(changes.attributes, for: cls, writing: true)
                if cls == .key, KeyItem.isNonExtractable(old) { try Self.checkKeyChanges(changes, newProtection) }
                _ = try needs.admit(old)
            }
            try needs.throwIfUnsatisfied()
            return try writing(store) { () throws(SecError) in
                for (row, cls, old) in matches {
                    try Validation.check(changes.attributes, for: cls, writing: true)
                    try Self.checkAuthorized(old, .update, authorization)
                    let oldProtection = ProtectionClass(rawValue: row.protectionClass)!
                    // The protection class of an item with an access control is part of that control (as
                    // on iOS, where kSecAttrAccessControl carries it): changing it with the update right
                    // alone could move the secret to a class the device key opens offline, around a read
                    // rule that asks for biometry or the passcode.
                    if old[AccessControl.attributeName] != nil, let p = newProtection, p != oldProtection {
                        throw .param("the protection class (pdmn) of an item with an access control cannot be changed; delete the item and add it again")
                    }
                    // General attributes are replaced as a set (as the Secret Service's Attributes
                    // property is): an update naming any of them leaves the item exactly those.
                    let replacesGeneral = clearsGeneral || changes.attributes.keys.contains(where: GeneralAttributes.isGeneral)
                    let base = replacesGeneral ? old.withoutGeneralAttributes : old
                    var attrs = base.merging(changes.attributes) { $1 }
                    attrs["mdat"] = .date(Self.now())
                    let protection = newProtection ?? oldProtection
                    attrs["pdmn"] = .string(protection.shortCode)
                    let secret: SecureBytes
                    if let s = changes.secret {
                        try proveApplicationPassword(row, cls, old, .update, authorization)
                        secret = s
                    } else {
                        secret = try openSecret(row, cls, old, authorization)
                    }
                    let (content, otherTiers) = try unsafe secret.withUnsafeBytes { s throws(SecError) in
                        try unsafe seal(itemClass: cls, attributes: attrs, secret: s, protection: protection, ref: row.persistentRef,
                                 applicationPassword: authorization.applicationPassword)
                    }
                    try store.replace(id: row.id, with: content)
                    try checkNoDuplicate(store, otherTiers, except: row.id)
                    // Both versions: a changed primary key or `sync` turned off is a deletion of the old one.
                    try notePendingSync(store, cls, old)
                    try notePendingSync(store, cls, attrs)
                    for version in [old, attrs] { if let g = version.accessGroup { touched(g) } }
                }
                return matches.count
            }
        }
    }

    /// What an UPDATE may not do to a non-extractable key: replace its private half, change what the
    /// agent set when it made the key (its type, size, public half, `extr`), or move it to a class that
    /// goes into backups (it would leave the device that way).
    private static func checkKeyChanges(_ changes: ItemChanges, _ newProtection: ProtectionClass?) throws(SecError) {
        if changes.secret != nil { throw .param("a non-extractable key's private half cannot be replaced; create another key") }
        if let name = changes.attributes.keys.sorted().first(where: { KeyItem.agentSet.contains($0) }) {
            throw .param("attribute '\(name)' of a non-extractable key is set by the agent and cannot be changed")
        }
        if let p = newProtection, !p.isThisDeviceOnly {
            throw .param("a non-extractable key stays in a ThisDeviceOnly class (it never goes into a backup)")
        }
    }

    // MARK: SecItemDelete

    /// Deletes every matching item (SecItemDelete); returns how many. Items outside `scope` are invisible.
    /// `touched` hears each deleted item's access group, as in ``update(_:_:scope:authorization:touched:)``.
    @discardableResult
    public func delete(_ query: ItemQuery, scope: AccessScope,
                       authorization: AuthorizationContext = .none, touched: (String) -> Void = { _ in }) throws(SecError) -> Int {
        try Validation.check(query)
        try Validation.checkEntitled(query.attributes, in: scope)
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            try keybag.checkUnchanged() // before matching, as in an update
            var ids: [Int64] = []
            var refs: [[UInt8]] = []
            var deleted: [(ItemClass, Attributes)] = []
            var needs = Requirements(operation: .delete, authorization: authorization)
            let complete = try forEachMatch(store, query, scope, limit: nil) { (row, cls, attrs) throws(SecError) in
                guard try needs.admit(attrs) else { return }
                try proveApplicationPassword(row, cls, attrs, .delete, authorization)
                ids.append(row.id)
                refs.append(row.persistentRef)
                deleted.append((cls, attrs))
            }
            try needs.throwIfUnsatisfied()
            // A delete acts on every match: not on some while others may sit in a tier not searchable.
            guard complete, !ids.isEmpty else { throw Self.notFound(complete) }
            try writing(store) { () throws(SecError) in
                for id in ids { try store.delete(id: id) }
                for (cls, attrs) in deleted {
                    try notePendingSync(store, cls, attrs)
                    if let g = attrs.accessGroup { touched(g) }
                }
            }
            appPasswordAttempts.forget(refs: refs)
            return ids.count
        }
    }

    // MARK: Checking (coffer check)

    /// Runs a CHECK: verifies every row whose keys are in memory (see ``verify(_:_:)``), moves those
    /// that cannot be opened (they fail authentication, or their class or protection does not match
    /// their row) into the quarantine table (`.quarantine`), lists the quarantine, or restores one row
    /// from it (errSecItemNotFound if no quarantined row has that reference; errSecDuplicateItem if an
    /// item with its primary key was added since). Nothing is ever deleted. Every row, every access
    /// group: the agent allows it to whole-keychain callers only.
    ///
    /// Paged: only rows after `cursor` (a row id for verify and quarantine, a quarantine id for the
    /// list; 0 from the start), and each finding is offered to `fits` (a front end's reply size); the
    /// first it refuses ends the page, whose `nextCursor` then says where the next page starts (0: the
    /// end was reached). A quarantine page moves its own rows in one transaction, after its findings
    /// are known. With `wholeOrNothing` a refused finding instead fails the whole request with
    /// errSecAllocate before anything is moved (a front end that cannot page).
    public func check(_ operation: CheckOperation, after cursor: Int64 = 0, wholeOrNothing: Bool = false,
                      fits: (CheckFinding) -> Bool = { _ in true }) throws(SecError) -> CheckReport {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            func full() -> SecError { SecError(.allocate, "the check report does not fit in one reply; use the paged check") }
            switch operation {
            case .listQuarantine:
                var findings: [CheckFinding] = [], next: UInt64 = 0
                try store.reading { () throws(SecError) in
                    var last = cursor
                    for row in try store.quarantined(after: cursor) {
                        let f = CheckFinding(persistentRef: row.persistentRef, reason: CheckFinding.Reason(rawValue: row.code) ?? .authentication,
                                             quarantined: true, detail: row.reason)
                        guard fits(f) else {
                            if wholeOrNothing || findings.isEmpty { throw full() }
                            next = UInt64(last)
                            return
                        }
                        findings.append(f)
                        last = row.quarantineID
                    }
                }
                return CheckReport(checked: 0, skipped: 0, findings: findings, nextCursor: next)
            case .restore(let ref):
                let restored = try writing(store) { () throws(SecError) in try store.restoreQuarantined(persistentRef: ref) }
                guard restored else { throw .itemNotFound("no quarantined item has that persistent reference") }
                return CheckReport(checked: 0, skipped: 0, findings: [
                    CheckFinding(persistentRef: ref, reason: .authentication, quarantined: false, detail: "restored")])
            case .verify, .quarantine:
                var checked: UInt32 = 0, skipped: UInt32 = 0, next: UInt64 = 0
                var findings: [(Int64, CheckFinding)] = []
                try store.reading { () throws(SecError) in
                    var last = cursor
                    for (id, _) in try store.rowClasses() where id > cursor {
                        guard let row = try store.row(id: id) else { continue }
                        switch try verify(store, row) {
                        case .none: checked += 1
                        case .some(nil): skipped += 1
                        case .some(.some(let f)):
                            guard fits(f) else {
                                if wholeOrNothing || findings.isEmpty { throw full() }
                                next = UInt64(last)
                                return
                            }
                            checked += 1
                            findings.append((id, f))
                        }
                        last = id
                    }
                }
                if operation == .quarantine {
                    let unopenable: Set<CheckFinding.Reason> = [.authentication, .itemClass]
                    let failing = findings.indices.filter { unopenable.contains(findings[$0].1.reason) }
                    if !failing.isEmpty {
                        let moved = try writing(store) { () throws(SecError) -> [Bool] in
                            var moved: [Bool] = []
                            for i in failing {
                                moved.append(try store.quarantine(id: findings[i].0, reason: findings[i].1.detail,
                                                                  code: findings[i].1.reason.rawValue))
                            }
                            return moved
                        }
                        for (i, ok) in zip(failing, moved) {
                            if ok {
                                findings[i].1.quarantined = true
                            } else {
                                findings[i].1.detail = "not quarantined: its persistent reference is invalid or already in the quarantine (a forged copy?)"
                            }
                        }
                    }
                }
                return CheckReport(checked: checked, skipped: skipped, findings: findings.map(\.1), nextCursor: next)
            }
        }
    }

    /// Verifies one row: nil if it is sound, `.some(nil)` if its keys are not in memory (not
    /// checked), else what is wrong. Sound means: a valid class and reference; attributes and secret
    /// that open (AEAD authentication under the current keys; a secret behind an application password
    /// is checked up to that layer); a class and protection in the attributes matching the row; an
    /// access group; and the primary-key hash and blind-index entries its attributes give.
    private func verify(_ store: ItemStore, _ row: StoredRow) throws(SecError) -> CheckFinding?? {
        func finding(_ reason: CheckFinding.Reason, _ detail: String) -> CheckFinding?? {
            .some(CheckFinding(persistentRef: row.persistentRef, reason: reason, quarantined: false, detail: detail))
        }
        guard let p = ProtectionClass(rawValue: row.protectionClass), row.persistentRef.count == 16 else {
            return finding(.itemClass, "invalid protection class or persistent reference")
        }
        guard keybag.isAvailable(p) else { return .some(nil) }
        let opened: (ItemClass, Attributes)
        do {
            opened = try openAttributes(row)
        } catch where error.status == .decode {
            let plainOpens = unsafe (try? keybag.withMetadataKey(p) { k throws(SecError) in
                try unsafe ItemCrypto.openMeta(row.meta, classKey: k, ref: row.persistentRef, protection: p)
            }) != nil
            return plainOpens ? finding(.itemClass, "its item class or protection does not match its row")
                : finding(.authentication, "its attributes fail authentication (altered, forged, or sealed under a key the keybag no longer holds)")
        }
        let (cls, attrs) = opened
        let secretOK = try unsafe keybag.withClassKey(p) { k -> Bool in
            if ItemCrypto.needsApplicationPassword(row.secret) {
                return unsafe ItemCrypto.unwraps(row.secret, classKey: k, ref: row.persistentRef, protection: p, keyRole: .secretKey)
            }
            guard let plain = try? unsafe ItemCrypto.openSecret(row.secret, classKey: k, ref: row.persistentRef, protection: p) else { return false }
            plain.wipe()
            return true
        }
        guard secretOK else { return finding(.authentication, "its secret fails authentication") }
        guard let group = attrs.accessGroup, !group.isEmpty else { return finding(.group, "it has no access group") }
        var full = attrs
        full["class"] = .string(cls.rawValue)
        let (pk, index) = try unsafe keybag.withIndexKey(IndexTier.of(p)) { k in unsafe Self.hashes(k, cls, full) }
        guard try store.primaryKeyHash(id: row.id) == pk, Set(try store.indexHashes(item: row.id)) == Set(index) else {
            return finding(.index, "its primary-key hash or index entries do not match its attributes (searches may miss it)")
        }
        return nil
    }

    // MARK: Internals (hold the keychain mutex: `store` comes from its state)

    /// A write transaction, refused first (errSecNotAvailable) if the keybag files changed under this
    /// process: its keys in memory may have been rotated elsewhere, and what it sealed now would be lost.
    func writing<R>(_ store: ItemStore, _ body: () throws(SecError) -> R) throws(SecError) -> R {
        try keybag.checkUnchanged()
        let r = try store.transaction(body)
        if let rollback {
            rollback.markDirty()
            if rollback.due(now: Self.now()) { flushRollback(store) }
        }
        return r
    }

    /// Visits matching items oldest first. Candidates come from the blind indexes; each is decrypted
    /// and compared in full, so a tampered index can never return a wrong item.
    ///
    /// The blind hashes are computed under every index key in memory (tier D, and tier P after the
    /// first unlock) and the union visited in row-id order: at most twice today's index seeks. Returns
    /// false if a tier that could hold matches was not searchable (tier P before the first unlock).
    ///
    /// Paging: only rows after row id `cursor`, and `done` (asked after each match) ends the visit early.
    /// The visit is lazy (a page decrypts what it returns plus at most ``mergeChunk`` rows per tier),
    /// so listing a large keychain page by page stays linear.
    @discardableResult
    private func forEachMatch(_ store: ItemStore, _ q: ItemQuery, _ scope: AccessScope, limit: Int?, after cursor: Int64 = 0, until done: () -> Bool = { false },
                              unreadable: ((StoredRow) throws(SecError) -> Void)? = nil,
                              namingLocked: Bool = false, locked lockedMatch: (StoredRow) throws(SecError) -> Void = { _ in },
                              _ body: (StoredRow, ItemClass, Attributes) throws(SecError) -> Void) throws(SecError) -> Bool {
        searches.withLock { $0 += 1 }
        var found = 0
        /// A locked row a ``ItemQuery/listsLockedItems`` search names (to `lockedMatch`): its index
        /// entries, under its own tier's key, hold the query's class, every attribute it names, and
        /// one of the scope's groups; `pdmn` is the row's clear protection class. The index is all
        /// that can be read of it: a tampered index can make a row be named, never be read.
        func lockedRowMatches(_ row: StoredRow) throws(SecError) -> Bool {
            guard let protection = ProtectionClass(rawValue: row.protectionClass), let cls = q.itemClass else { return false }
            if let wanted = try Validation.protection(of: q.attributes), wanted != protection { return false }
            let (needed, groups) = try unsafe keybag.withIndexKey(IndexTier.of(protection)) { k in
                unsafe (q.attributes.filter { $0.key != "pdmn" }.map { unsafe Self.blindHash(k, $0.key, $0.value) }
                        + [Self.blindHash(k, "class", .string(cls.rawValue))],
                        scope.groups.map { Set($0.map { unsafe Self.blindHash(k, "agrp", .string($0)) }) })
            }
            let index = Set(try store.indexHashes(item: row.id))
            guard needed.allSatisfy(index.contains) else { return false }
            return groups.map { !$0.isDisjoint(with: index) } ?? true
        }
        enum Candidate { case item(ItemClass, Attributes), locked }
        /// A candidate's attributes; nil for one whose class key is locked away and whose access
        /// group (by its blind-index entry) is outside `scope`: a locked keychain must not tell an
        /// app, by errSecInteractionNotAllowed, that another group holds an item matching its query.
        ///
        /// A row's index entries are under its own tier's key only. Before the first unlock the
        /// passcode tier's key is not in memory, so such a row's group cannot be told: it stays
        /// errSecInteractionNotAllowed (it may be the caller's own; skipping it would turn a listing
        /// into a silent partial answer). That reveals nothing: before the first unlock every query
        /// that could reach the passcode tier is answered errSecInteractionNotAllowed anyway.
        func open(_ row: StoredRow) throws(SecError) -> Candidate? {
            do {
                let (cls, attrs) = try openAttributes(row)
                return .item(cls, attrs)
            } catch where error.status == .decode && unreadable != nil {
                // A listing that tolerates damage: the row is skipped and reported (`coffer check`).
                try unreadable?(row)
                return nil
            } catch where error.status == .interactionNotAllowed {
                if q.skipsLockedItems { return nil }
                if q.listsLockedItems, namingLocked { return try lockedRowMatches(row) ? .locked : nil }
                guard let groups = scope.groups, let protection = ProtectionClass(rawValue: row.protectionClass),
                      let inScope = try scopeHashes(IndexTier.of(protection), groups) else { throw error }   // tier not searchable yet
                if !inScope.isDisjoint(with: try store.indexHashes(item: row.id)) { throw error }
                return nil
            }
        }
        /// The row as a match of the query: opened and compared in full, or a locked match; nil if it
        /// does not match (or is left out).
        func candidate(_ row: StoredRow) throws(SecError) -> Candidate? {
            switch try open(row) {
            case .item(let cls, let attrs)?: Self.matches(q, scope, cls, attrs) ? .item(cls, attrs) : nil
            case .locked?: .locked
            case nil: nil
            }
        }
        /// The `agrp` blind hashes of the scope's groups under each tier's index key, computed once per
        /// visit (a locked keychain may hold many rows of other groups); nil for a tier whose key is not
        /// in memory.
        var tierHashes: [IndexTier: Set<[UInt8]>?] = [:]
        func scopeHashes(_ tier: IndexTier, _ groups: Set<String>) throws(SecError) -> Set<[UInt8]>? {
            if let known = tierHashes[tier] { return known }
            let hashes = try unsafe keybag.withIndexKeys { keys throws(SecError) -> Set<[UInt8]>? in
                guard let k = unsafe keys.first(where: { unsafe $0.0 == tier })?.1 else { return nil }
                return Set(groups.map { unsafe Self.blindHash(k, "agrp", .string($0)) })
            }
            tierHashes[tier] = .some(hashes)
            return hashes
        }
        /// Hands one match to `body` (a locked one to `lockedMatch`); false once the visit must stop.
        func deliver(_ row: StoredRow, _ match: Candidate) throws(SecError) -> Bool {
            switch match {
            case .item(let cls, let attrs): try body(row, cls, attrs)
            case .locked: try lockedMatch(row)
            }
            found += 1
            return !done() && (limit.map { found < $0 } ?? true)
        }
        if let ref = q.persistentRef {
            if let row = try store.row(persistentRef: ref), row.id > cursor, let match = try candidate(row) {
                _ = try deliver(row, match)
            }
            return true
        }
        var probe = q.attributes.filter { AttributeCatalog.isIndexed($0.key) }
        if let c = q.itemClass { probe["class"] = .string(c.rawValue) }
        // The tiers that can hold a match: the one of the query's protection class, or both.
        let wanted = try Validation.protection(of: q.attributes).map { [IndexTier.of($0)] } ?? IndexTier.allCases
        let tiers = try unsafe keybag.withIndexKeys { keys throws(SecError) -> [[[UInt8]]] in
            unsafe keys.filter { unsafe wanted.contains($0.0) }.map { _, k in
                // The common lookup (service + account, server + account) has its own entry: one seek, a
                // handful of candidates at most, each compared in full after decryption anyway.
                if let compound = unsafe Self.compoundHashes(k, q.attributes).first { return [compound] }
                return probe.map { unsafe Self.blindHash(k, $0.key, $0.value) }
            }
        }
        // A tier whose index key is not in memory (tier P before the first unlock) is searched only
        // if it holds no row at all: otherwise any of its rows may match, and the search is incomplete.
        let unsearched = ProtectionClass.allCases.filter { wanted.contains(IndexTier.of($0)) && IndexTier.of($0) != .device }
        let unsearchedHasRows = tiers.count == wanted.count ? false : try store.hasItem(inProtectionClasses: unsearched.map { Int($0.rawValue) })
        let complete = !unsearchedHasRows
        let scans = Array(tiers.prefix(probe.isEmpty ? 1 : tiers.count)) // no hashes: one scan covers every row
        if scans.count == 1 {
            try store.forEachRow(matchingAll: scans[0], after: cursor) { (row) throws(SecError) -> Bool in
                guard let match = try candidate(row) else { return true }
                return try deliver(row, match)
            }
            return complete
        }
        // Several tiers: merged by row id a chunk at a time. Each tier yields up to `mergeChunk` matches
        // after `from`; every match up to the lowest id where a tier stopped short is in order and final.
        var from = cursor
        while true {
            var batch: [(StoredRow, Candidate)] = []
            var boundary = Int64.max
            for hashes in scans {
                var n = 0
                try store.forEachRow(matchingAll: hashes, after: from) { (row) throws(SecError) -> Bool in
                    guard let match = try candidate(row) else { return true }
                    batch.append((row, match))
                    n += 1
                    guard n < Self.mergeChunk else { boundary = min(boundary, row.id); return false }
                    return true
                }
            }
            batch.sort { $0.0.id < $1.0.id }
            for (row, match) in batch where row.id <= boundary {
                guard try deliver(row, match) else { return complete }
            }
            guard boundary != .max else { return complete }
            from = boundary
        }
    }

    /// Matches each index tier contributes per round when several are merged (see ``forEachMatch``).
    static let mergeChunk = 64

    /// Nothing matched: errSecItemNotFound, or errSecInteractionNotAllowed if a tier could not be searched
    /// (before the first unlock, an item of a non-Always class can be neither found nor ruled out).
    private static func notFound(_ complete: Bool) -> SecError {
        complete ? .itemNotFound()
            : .interactionNotAllowed("items of the non-Always classes cannot be searched before the first unlock; "
                                     + "a search naming an Always class (pdmn dk or dku) can")
    }

    /// errSecDuplicateItem if a row other than `except` has one of `primaryKeys` (the item's primary-key
    /// hash under the index tiers other than its own; its own tier is the UNIQUE constraint's).
    ///
    /// Limit: in boot state only tier D is in memory, so an Always item added then cannot be compared
    /// with passcode-tier rows (a later unlock does not detect that pair either; both rows stay readable).
    func checkNoDuplicate(_ store: ItemStore, _ primaryKeys: [[UInt8]], except: Int64?) throws(SecError) {
        for pk in primaryKeys {
            if let id = try store.rowID(primaryKey: pk), id != except { throw .duplicateItem() }
        }
    }

    private static func matches(_ q: ItemQuery, _ scope: AccessScope, _ cls: ItemClass, _ attrs: Attributes) -> Bool {
        if let c = q.itemClass, c != cls { return false }
        guard scope.admits(attrs) else { return false }
        for (k, v) in q.attributes {
            if GeneralAttributes.isGeneral(k) {
                guard Self.sameBytes(attrs, k, v) else { return false }
            } else if attrs[k] != v {
                return false
            }
        }
        return true
    }

    /// True if `attrs` has attribute `name` with string value `value`, both byte for byte (Swift's
    /// `String` equality is canonical equivalence: a general attribute matches exactly, as its
    /// blind-index entry does, whichever way a search reaches the item).
    private static func sameBytes(_ attrs: Attributes, _ name: String, _ value: AttributeValue) -> Bool {
        guard let i = attrs.index(forKey: name), attrs[i].key.utf8.elementsEqual(name.utf8),
              case .string(let have) = attrs[i].value, case .string(let want) = value else { return false }
        return have.utf8.elementsEqual(want.utf8)
    }

    /// Seals an item for its row; also returns its primary-key hash under the other index tiers in
    /// memory (for ``checkNoDuplicate(_:_:except:)``).
    func seal(itemClass: ItemClass, attributes: Attributes, secret: UnsafeRawBufferPointer,
                      protection: ProtectionClass, ref: [UInt8], applicationPassword: SecureBytes? = nil) throws(SecError) -> (RowContent, [[UInt8]]) {
        let appPassword = try Self.accessControl(attributes)?.factors.contains(.applicationPassword) == true
        if appPassword && applicationPassword == nil { throw .authFailed("this item needs its application password") }
        var full = attributes
        full["class"] = .string(itemClass.rawValue)
        var encoded = AttributeCodec.encode(full)
        defer { secureZero(&encoded) }
        let meta = try unsafe keybag.withMetadataKey(protection) { k in
            unsafe encoded.withUnsafeBytes { unsafe ItemCrypto.sealMeta($0, classKey: k, ref: ref, protection: protection) }
        }
        let kdf = appPasswordKDF
        let sealedSecret = try unsafe keybag.withClassKey(protection) { k throws(SecError) in
            if appPassword, let applicationPassword {
                return try unsafe ItemCrypto.sealSecret(secret, classKey: k, ref: ref, protection: protection,
                                                 applicationPassword: applicationPassword, kdf: kdf)
            }
            return unsafe ItemCrypto.sealSecret(secret, classKey: k, ref: ref, protection: protection)
        }
        let tier = IndexTier.of(protection)
        let (pk, index) = try unsafe keybag.withIndexKey(tier) { k throws(SecError) in unsafe Self.hashes(k, itemClass, full) }
        let others = try unsafe keybag.withIndexKeys { keys throws(SecError) in
            unsafe keys.filter { unsafe $0.0 != tier }.map { unsafe Self.primaryKeyHash($0.1, itemClass, full) }
        }
        return (RowContent(primaryKeyHash: pk, persistentRef: ref, protectionClass: protection.rawValue,
                           meta: meta, secret: sealedSecret, indexHashes: index), others)
    }

    /// A row's primary-key hash and blind-index entries under index key `k` (`full` includes `class`).
    private static func hashes(_ k: UnsafeRawBufferPointer, _ itemClass: ItemClass, _ full: Attributes) -> ([UInt8], [[UInt8]]) {
        unsafe (primaryKeyHash(k, itemClass, full),
         full.filter { AttributeCatalog.isIndexed($0.key) }.map { unsafe blindHash(k, $0.key, $0.value) } + compoundHashes(k, full))
    }

    func openAttributes(_ row: StoredRow) throws(SecError) -> (ItemClass, Attributes) {
        guard let protection = ProtectionClass(rawValue: row.protectionClass), row.persistentRef.count == 16 else {
            throw .decode("an item row has an invalid protection class or reference")
        }
        let plain = try unsafe keybag.withMetadataKey(protection) { k throws(SecError) in
            try unsafe ItemCrypto.openMeta(row.meta, classKey: k, ref: row.persistentRef, protection: protection)
        }
        return try Self.decodeAttributes(plain, protection)
    }

    private static func decodeAttributes(_ plain: SecureBytes, _ protection: ProtectionClass) throws(SecError) -> (ItemClass, Attributes) {
        var attrs: Attributes
        do {
            var bytes = unsafe plain.withUnsafeBytes { unsafe Array($0) }
            defer { secureZero(&bytes) }
            var r = ByteReader(bytes)
            attrs = try AttributeCodec.decodeAttributes(from: &r)
            try r.expectEnd("attributes")
        } catch {
            throw .decode("an item's attributes are malformed: \(error)")
        }
        guard case .string(let c)? = attrs.removeValue(forKey: "class"), let cls = ItemClass(rawValue: c),
              attrs["pdmn"] == .string(protection.shortCode) else {
            throw .decode("an item's class or protection does not match its row")
        }
        return (cls, attrs)
    }

    /// Opens a row's secret with the request's application password, if any. Opening an item that
    /// needs one with one given is a counted attempt on that item (``ApplicationPasswordAttempts``):
    /// refused early while its delay runs, reported to `authorization` when failed or refused.
    /// A non-extractable key's private half never leaves the agent: a search returning data that meets
    /// one fails (before anyone is asked to authenticate), unless the agent itself uses the key in place.
    private static func checkExtractable(_ query: ItemQuery, _ cls: ItemClass, _ attrs: Attributes) throws(SecError) {
        guard cls == .key, KeyItem.isNonExtractable(attrs), !query.usesKeyInPlace else { return }
        throw .notAvailable("a non-extractable key's private half is never returned: the agent uses it in place (e.g. coffer ssh)")
    }

    func openSecret(_ row: StoredRow, _ cls: ItemClass, _ attrs: Attributes,
                            _ authorization: AuthorizationContext) throws(SecError) -> SecureBytes {
        let protection = ProtectionClass(rawValue: row.protectionClass)!
        let open = { () throws(SecError) -> SecureBytes in
            try unsafe self.keybag.withClassKey(protection) { k throws(SecError) in
                try unsafe ItemCrypto.openSecret(row.secret, classKey: k, ref: row.persistentRef, protection: protection,
                                          applicationPassword: authorization.applicationPassword)
            }
        }
        guard authorization.hasApplicationPassword, ItemCrypto.needsApplicationPassword(row.secret) else { return try open() }
        let group = attrs.accessGroup
        return try appPasswordAttempts.attempt(ref: row.persistentRef, report: { outcome in
            authorization.onApplicationPasswordAttempt?(ApplicationPasswordAttempt(outcome: outcome, accessGroup: group, itemClass: cls))
        }, open)
    }

    // MARK: Rekey and migration (hold the keychain mutex)

    /// Step 2 of a rekey: in one transaction, re-seals every row of a rotated class under the new keys
    /// (re-wrapping its item keys; re-padding a format-1 secret) and recomputes its primary-key and
    /// blind-index hashes under the new tier-P key.
    /// Idempotent: a row whose item key already unwraps under the new key is left alone.
    private func resealRows(_ store: ItemStore, _ keys: RekeyKeys, from keybagVersion: Int) throws(SecError) -> String {
        let t0 = Self.now()
        var resealed = 0, deleted = 0, rewrapped = 0
        // Runs inside the keybag's mutex: nothing here may call the keybag (the keys come in `keys`).
        // The Always rows need nothing: their keys do not rotate, and `migrateAtOpen` re-padded them.
        // Rollback records: not kept incrementally here (the passcode bucket's key changes); computed
        // whole under the new key at the end, in the same transaction.
        let ledger = store.ledger
        store.ledger = nil
        defer { store.ledger = ledger }
        try verifyBeforeRekey(store)
        let previousKey = rollback?.ledger.key(RollbackLedger.passcodeBucket)
        if let rollback { unsafe keys.passcodeIndexKey.withUnsafeBytes { unsafe rollback.ledger.setKey(bucket: RollbackLedger.passcodeBucket, indexKey: $0) } }
        do {
        try store.transaction { () throws(SecError) in
            let rows = try store.rowClasses()
            for (i, (id, pclass)) in rows.enumerated() {
                if i == rows.count / 2 { CrashPoint.hit("rekey-reseal-half") }
                guard let p = ProtectionClass(rawValue: pclass), p.availability != .always else { continue }
                if p.requiresPasscode && keys.classKey(p, previous: false) == nil {
                    // The passcode was removed: its class key is gone, and so is the item.
                    try store.delete(id: id)
                    deleted += 1
                    continue
                }
                guard let row = try store.row(id: id) else { continue }
                if try resealRow(store, row, p, keys) { resealed += 1 }
            }
            try resealSyncBlobs(store, keys)
            rewrapped = try rewrapFileKeys(store, keys)
            if let rollback, let (d, _) = try rollback.records(store) {
                guard rollback.ledger.verifies(d) else { throw RollbackFinding.recordsEdited.secError }
                var epoch: Int64 = 0
                if d.epoch > 0 {
                    guard let value = try rollback.counter.read() else { throw RollbackFinding.counterMissing.secError }
                    epoch = Int64(value + 1)
                }
                try rollback.writeRecords(store, epoch: epoch)
            }
        }
        } catch {
            rollback?.ledger.restore(bucket: RollbackLedger.passcodeBucket, previousKey)
            throw error
        }
        return ("keybag rekey from format \(keybagVersion): \(resealed) items re-sealed"
            + (rewrapped > 0 ? ", \(rewrapped) protected directory keys re-wrapped" : "")
            + (deleted > 0 ? ", \(deleted) WhenPasscodeSet items deleted (passcode removed)" : "") + " in \(Int((Self.now() - t0) * 1000)) ms")
    }

    private func resealRow(_ store: ItemStore, _ row: StoredRow, _ p: ProtectionClass, _ keys: RekeyKeys) throws(SecError) -> Bool {
        guard row.persistentRef.count == 16, let newMK = keys.metadataKey(p, previous: false),
              let newCK = keys.classKey(p, previous: false) else {
            throw .decode("an item row has an invalid protection class or reference")
        }
        let ref = row.persistentRef
        if unsafe newMK.withUnsafeBytes({ unsafe ItemCrypto.unwraps(row.meta, classKey: $0, ref: ref, protection: p, keyRole: .metaKey) }) {
            return false // re-sealed by an earlier run of this rekey
        }
        guard let oldMK = keys.metadataKey(p, previous: true), let oldCK = keys.classKey(p, previous: true) else {
            throw .decode("an item is sealed under neither the new nor the previous keys of its class")
        }
        let plain = try unsafe oldMK.withUnsafeBytes { k throws(SecError) in try unsafe ItemCrypto.openMeta(row.meta, classKey: k, ref: ref, protection: p) }
        let (cls, attrs) = try Self.decodeAttributes(plain, p)
        let meta = try unsafe oldMK.withUnsafeBytes { o throws(SecError) in
            try unsafe newMK.withUnsafeBytes { n throws(SecError) in
                try unsafe ItemCrypto.rewrap(row.meta, from: o, to: n, ref: ref, protection: p, keyRole: .metaKey)
            }
        }
        let secret = try unsafe oldCK.withUnsafeBytes { o throws(SecError) -> [UInt8] in
            try unsafe newCK.withUnsafeBytes { n throws(SecError) -> [UInt8] in
                if (ItemCrypto.version(of: row.secret) ?? 0) >= ItemCrypto.secretVersion {
                    return try unsafe ItemCrypto.rewrap(row.secret, from: o, to: n, ref: ref, protection: p, keyRole: .secretKey)
                }
                let s = try unsafe ItemCrypto.openSecret(row.secret, classKey: o, ref: ref, protection: p)
                return unsafe s.withUnsafeBytes { unsafe ItemCrypto.sealSecret($0, classKey: n, ref: ref, protection: p) }
            }
        }
        var full = attrs
        full["class"] = .string(cls.rawValue)
        let (pk, index) = unsafe keys.passcodeIndexKey.withUnsafeBytes { unsafe Self.hashes($0, cls, full) }
        try store.replace(id: row.id, with: RowContent(primaryKeyHash: pk, persistentRef: ref, protectionClass: p.rawValue,
                                                      meta: meta, secret: secret, indexHashes: index))
        return true
    }

    /// Re-pads the format-1 secrets of Always-class rows (keys unchanged, so idempotent); call inside a
    /// transaction. Returns how many rows changed.
    private func repadAlwaysRows(_ store: ItemStore) throws(SecError) -> Int {
        var n = 0
        for (id, pclass) in try store.rowClasses() {
            guard let p = ProtectionClass(rawValue: pclass), p.availability == .always,
                  let row = try store.row(id: id), ItemCrypto.version(of: row.secret) == 1 else { continue }
            let sealed = try unsafe keybag.withClassKey(p) { k throws(SecError) in
                let s = try unsafe ItemCrypto.openSecret(row.secret, classKey: k, ref: row.persistentRef, protection: p)
                return unsafe s.withUnsafeBytes { unsafe ItemCrypto.sealSecret($0, classKey: k, ref: row.persistentRef, protection: p) }
            }
            try store.replaceSecret(id: id, with: sealed)
            n += 1
        }
        return n
    }

    /// Attribute pairs that get a combined blind-index entry, for the lookups scripts make most.
    static let compoundKeys: [(String, String)] = [("svce", "acct"), ("srvr", "acct")]

    /// Combined entries for every pair in ``compoundKeys`` that `attrs` holds in full.
    static func compoundHashes(_ key: UnsafeRawBufferPointer, _ attrs: Attributes) -> [[UInt8]] {
        compoundKeys.compactMap { a, b in
            guard let va = attrs[a], let vb = attrs[b] else { return nil }
            var w = ByteWriter()
            AttributeCodec.encode(va, into: &w)
            AttributeCodec.encode(vb, into: &w)
            return unsafe KeyedHash.hash(key: key, parts: [Array("coffer index v1".utf8), Array("\(a)+\(b)".utf8), [0], w.bytes], outputBytes: 16)
        }
    }

    /// Blind index entry: 16 bytes of BLAKE2b(indexKey, "coffer index v1" ‖ name ‖ 0 ‖ value).
    static func blindHash(_ key: UnsafeRawBufferPointer, _ name: String, _ value: AttributeValue) -> [UInt8] {
        var w = ByteWriter()
        AttributeCodec.encode(value, into: &w)
        return unsafe KeyedHash.hash(key: key, parts: [Array("coffer index v1".utf8), Array(name.utf8), [0], w.bytes], outputBytes: 16)
    }

    /// Uniqueness key: BLAKE2b(indexKey, "coffer pk v1" ‖ canonical encoding of the class's primary-key attributes).
    static func primaryKeyHash(_ key: UnsafeRawBufferPointer, _ cls: ItemClass, _ attrs: Attributes) -> [UInt8] {
        var pk: Attributes = ["class": .string(cls.rawValue)]
        for name in cls.primaryKey { if let v = attrs[name] { pk[name] = v } }
        return unsafe KeyedHash.hash(key: key, parts: [Array("coffer pk v1".utf8), AttributeCodec.encode(pk)])
    }

    static func now() -> Double {
        var ts = timespec()
        unsafe clock_gettime(CLOCK_REALTIME, &ts)
        return (Double(ts.tv_sec) + Double(ts.tv_nsec / 1000) / 1_000_000)
    }
}
