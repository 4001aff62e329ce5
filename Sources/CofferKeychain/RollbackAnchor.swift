import CofferCrypto
import CofferKeybag
public import CofferModel
import CofferStore
import CofferSystem
public import CofferTPM
import Glibc

/// A monotonic counter rollback detection anchors a keychain to (the RollbackAnchor article): in
/// production a TPM NV counter (``TPMRollbackCounter``). One counter per keychain.
public protocol RollbackCounter: AnyObject, Sendable {
    /// What the counter is, for messages (an index and a TCTI; never a secret).
    var name: String { get }
    /// The counter's value, or nil if it does not exist (this keychain was never anchored).
    func read() throws(SecError) -> UInt64?
    /// Creates the counter if it does not exist; returns its value.
    func create() throws(SecError) -> UInt64
    /// Adds one (one NV write) and returns the new value.
    func increment() throws(SecError) -> UInt64
}

/// A ``RollbackCounter`` in a TPM NV index (``CofferTPM/TPMNVCounter``), reached through a TCTI.
/// The connection is opened at first use and dropped after a failure (the next call opens it again).
public final class TPMRollbackCounter: RollbackCounter {
    /// The TCTI configuration string.
    public let tcti: String
    /// The NV index.
    public let index: UInt32
    private let connection = Protected<TPM?>(nil)

    /// A counter at `index` (default ``CofferTPM/TPMNVCounter/defaultIndex``) through `tcti`.
    public init(tcti: String, index: UInt32 = TPMNVCounter.defaultIndex) {
        self.tcti = tcti
        self.index = index
    }

    /// "TPM NV counter 0x… (TCTI)".
    public var name: String { "TPM NV counter \(TPMNVCounter.hex(index)) (\(tcti))" }

    public func read() throws(SecError) -> UInt64? {
        try withTPM { tpm throws(TPMError) -> UInt64? in
            guard try TPMNVCounter.isDefined(index: index, on: tpm) else { return nil }
            return try TPMNVCounter(index: index).read(on: tpm)
        }
    }

    public func create() throws(SecError) -> UInt64 {
        try withTPM { tpm throws(TPMError) in try TPMNVCounter.define(index: index, on: tpm).read(on: tpm) }
    }

    public func increment() throws(SecError) -> UInt64 {
        try withTPM { tpm throws(TPMError) in try TPMNVCounter(index: index).increment(on: tpm) }
    }

    private func withTPM<R>(_ body: (TPM) throws(TPMError) -> R) throws(SecError) -> R {
        try connection.withLock { (c: inout TPM?) throws(SecError) -> R in
            do throws(TPMError) {
                let tpm: TPM
                if let open = c { tpm = open } else { tpm = try TPM(tcti: tcti) }
                c = tpm
                return try body(tpm)
            } catch {
                c = nil
                throw SecError(SecStatus(rawValue: error.osStatus) ?? .internalComponent, "rollback detection (\(name)): \(error)")
            }
        }
    }
}

/// What an unlock found when the keychain's files do not match its rollback anchor. Each case names
/// what was found; ``secError`` carries errSecDecode (-26275) and a message saying how to recover.
public enum RollbackFinding: Equatable, Sendable, CustomStringConvertible {
    /// The keybag does not open the passcode bucket's record while the device bucket's is current:
    /// an older keybag was put back (after a passcode change, a passcode removal or an escrow revoke).
    case olderKeybag
    /// The records are tagged right but sealed at an epoch older than the counter: keychain.db (with or
    /// without its keybag) was put back from an earlier copy.
    case olderDatabase(epoch: UInt64, counter: UInt64)
    /// The rows do not add up to their bucket's record: rows were replaced by earlier copies, put back
    /// after deletion, deleted or edited outside Coffer.
    case rowsChanged(bucket: Int64, expectedRows: Int64, foundRows: Int64)
    /// The counter exists but keychain.db has no rollback records (a keychain.db from before rollback
    /// detection was put back, or the records were deleted).
    case recordsMissing
    /// A record's tag does not verify under the device bucket's key, or the records disagree: edited.
    case recordsEdited
    /// The records exist but the counter does not: the TPM was cleared, or this is another TPM.
    case counterMissing
    /// The counter is behind the records: another TPM, or a counter that was undefined and made again.
    case counterBehind(epoch: UInt64, counter: UInt64)

    public var description: String {
        switch self {
        case .olderKeybag:
            "an older keybag was put back: it does not open keychain.db's rollback record (the keys changed since: a passcode change, removal or escrow revoke), or that record was edited"
        case .olderDatabase(let e, let c):
            "keychain.db was put back from an earlier copy: it was anchored at counter value \(e), the counter is at \(c)"
        case .rowsChanged(let b, let expected, let found):
            "rows of keychain.db were replaced by earlier copies, put back or removed outside Coffer (bucket \(b): \(expected) rows recorded, \(found) found, or their contents differ)"
        case .recordsMissing:
            "keychain.db has no rollback records though this keychain is anchored (a copy from before rollback detection was put back, or the records were deleted)"
        case .recordsEdited:
            "keychain.db's rollback records were edited outside Coffer"
        case .counterMissing:
            "the rollback counter is gone (the TPM was cleared, or this is another TPM)"
        case .counterBehind(let e, let c):
            "the rollback counter (\(c)) is behind keychain.db (anchored at \(e)): another TPM, or the counter was reset"
        }
    }

    /// errSecDecode with what was found and how to recover; nothing was changed by the refusal.
    public var secError: SecError {
        .decode("rollback detected: \(self). Nothing was changed. Recover by restoring a backup (coffer backup restore) "
                + "or unlocking with the escrow record; see coffer(1), ROLLBACK DETECTION")
    }
}

/// The keyed half of rollback detection: the two buckets' keys, derived from the keybag's index keys
/// (tier D: always in memory; tier P: from the first unlock on, replaced at every rekey).
final class RollbackLedger: RowLedger, @unchecked Sendable {
    // @unchecked Sendable: `keys` is a Protected.
    static let deviceBucket = Int64(IndexTier.device.rawValue)
    static let passcodeBucket = Int64(IndexTier.passcode.rawValue)
    private let keys = Protected<[Int64: SecureBytes]>([:])

    /// K_b = BLAKE2b-256(index key of tier b, "coffer rollback v1").
    func setKey(bucket: Int64, indexKey: UnsafeRawBufferPointer) {
        let k = unsafe KeyedHash.deriveKey(key: indexKey, parts: [Array("coffer rollback v1".utf8)])
        keys.withLock { $0[bucket]?.wipe(); $0[bucket] = k }
    }

    /// True if both buckets' keys are in memory.
    var complete: Bool { keys.withLock { $0.count == 2 } }

    /// Loads the keys the keybag has in memory now.
    func load(from keybag: Keybag) {
        try? unsafe keybag.withIndexKeys { pairs in for unsafe (tier, k) in unsafe pairs { unsafe setKey(bucket: Int64(tier.rawValue), indexKey: k) } }
    }

    /// A copy of bucket `b`'s key (for restoring it after a failed rekey).
    func key(_ b: Int64) -> SecureBytes? { keys.withLock { $0[b].map { unsafe $0.withUnsafeBytes { unsafe SecureBytes(copying: $0) } } } }

    func restore(bucket: Int64, _ k: SecureBytes?) { keys.withLock { $0[bucket] = k } }

    private func withKey<R>(_ bucket: Int64, _ body: (UnsafeRawBufferPointer) -> R) throws(SecError) -> R {
        try keys.withLock { (k: inout [Int64: SecureBytes]) throws(SecError) -> R in
            guard let key = k[bucket] else {
                throw .interactionNotAllowed("the rollback key of bucket \(bucket) is not in memory before the first unlock")
            }
            return unsafe key.withUnsafeBytes { unsafe body($0) }
        }
    }

    /// The bucket of a row: its index tier (an invalid class counts in the passcode bucket).
    static func bucket(_ protectionClass: Int64) -> Int64 {
        guard let p = ProtectionClass(rawValue: UInt8(clamping: protectionClass)), Int64(p.rawValue) == protectionClass else { return passcodeBucket }
        return Int64(IndexTier.of(p).rawValue)
    }

    func bucket(protectionClass: Int64) -> Int64 { Self.bucket(protectionClass) }

    /// D(row) = BLAKE2b-256(K_b, "coffer rollback row v1" ‖ u64 id ‖ u64 pclass ‖ blob pref ‖ blob pk ‖ blob meta ‖ blob secret),
    /// integers big-endian, blob = u32 length ‖ bytes.
    func digest(_ row: LedgerRow) throws(SecError) -> (bucket: Int64, digest: [UInt8]) {
        let b = Self.bucket(row.protectionClass)
        var head = ByteWriter()
        head.raw(Array("coffer rollback row v1".utf8))
        head.u64(UInt64(bitPattern: row.id))
        head.u64(UInt64(bitPattern: row.protectionClass))
        func len(_ x: [UInt8]) -> [UInt8] { var w = ByteWriter(); w.u32(UInt32(x.count)); return w.bytes }
        let parts = [head.bytes, len(row.persistentRef), row.persistentRef, len(row.primaryKeyHash), row.primaryKeyHash,
                     len(row.meta), row.meta, len(row.secret), row.secret]
        return (b, try unsafe withKey(b) { unsafe KeyedHash.hash(key: $0, parts: parts) })
    }

    /// T = BLAKE2b-256(K_b, "coffer rollback record v1" ‖ u64 bucket ‖ root (32) ‖ u64 count ‖ u64 epoch).
    func tag(_ r: RollbackRecord) throws(SecError) -> [UInt8] {
        var w = ByteWriter()
        w.raw(Array("coffer rollback record v1".utf8))
        w.u64(UInt64(bitPattern: r.bucket))
        w.raw(r.root)
        w.u64(UInt64(bitPattern: r.count))
        w.u64(UInt64(bitPattern: r.epoch))
        return try unsafe withKey(r.bucket) { unsafe KeyedHash.hash(key: $0, parts: [w.bytes]) }
    }

    /// True if `r`'s tag verifies (compared in constant time); false also when its key is not in memory.
    func verifies(_ r: RollbackRecord) -> Bool {
        guard let t = try? tag(r), t.count == r.tag.count else { return false }
        return zip(t, r.tag).reduce(UInt8(0)) { $0 | ($1.0 ^ $1.1) } == 0
    }
}

/// Rollback detection's state in a keychain: the counter, the ledger and the batching of NV writes.
final class RollbackGuard: @unchecked Sendable {
    // @unchecked Sendable: `batch` is a Protected; the rest is immutable.
    let counter: any RollbackCounter
    let ledger = RollbackLedger()
    /// Item writes are anchored (an NV increment) at most this often (seconds), and at every lock.
    let interval: Double
    private struct Batch { var dirty = false; var last: Double = 0 }
    /// True once this process's check scanned every row: later unlocks check the records and the counter
    /// only (the scan costs a few µs per item); rows written under a running agent are scanned at its next start.
    private let scanned = Protected(false)
    private let batch = Protected(Batch())

    /// `now`: the batching interval counts from the open (the previous process anchored at its lock or stop).
    init(counter: any RollbackCounter, interval: Double, now: Double) {
        self.counter = counter
        self.interval = interval
        batch.withLock { $0.last = now }
    }

    var dirty: Bool { batch.withLock { $0.dirty } }
    func markDirty() { batch.withLock { $0.dirty = true } }
    /// True if a write now should anchor (dirty and the interval has passed since the last increment).
    func due(now: Double) -> Bool { batch.withLock { $0.dirty && now - $0.last >= interval } }
    func anchored(now: Double) { batch.withLock { $0 = Batch(dirty: false, last: now) } }

    /// Both records, in bucket order, or nil if keychain.db has none; recordsEdited if only one exists.
    func records(_ store: ItemStore) throws(SecError) -> (device: RollbackRecord, passcode: RollbackRecord)? {
        let all = try store.rollbackRecords()
        if all.isEmpty { return nil }
        guard all.count == 2, all[0].bucket == RollbackLedger.deviceBucket, all[1].bucket == RollbackLedger.passcodeBucket else {
            throw RollbackFinding.recordsEdited.secError
        }
        return (all[0], all[1])
    }

    /// Writes both records from a full scan at `epoch` (anchoring, a rekey); call inside a transaction.
    func writeRecords(_ store: ItemStore, epoch: Int64) throws(SecError) {
        let scan = try store.scanLedger(ledger)
        for b in [RollbackLedger.deviceBucket, RollbackLedger.passcodeBucket] {
            let (root, n) = scan[b] ?? ([UInt8](repeating: 0, count: 32), 0)
            var r = RollbackRecord(bucket: b, root: root, count: n, epoch: epoch, tag: [])
            r.tag = try ledger.tag(r)
            try store.writeRollbackRecord(r)
        }
    }

    /// Re-seals both records (tags checked first) at `epoch`; call inside a transaction.
    func reseal(_ store: ItemStore, epoch: Int64) throws(SecError) {
        guard let (d, p) = try records(store) else { return }
        for var r in [d, p] {
            guard ledger.verifies(r) else { throw RollbackFinding.recordsEdited.secError }
            r.epoch = epoch
            r.tag = try ledger.tag(r)
            try store.writeRollbackRecord(r)
        }
    }

    /// The unlock check (both keys in memory): the records against the counter and the rows, then the
    /// anchoring a crash interrupted is finished. Throws a ``RollbackFinding`` and changes nothing if
    /// they do not match. Returns a line for the migration report when it anchored the keychain.
    func check(_ store: ItemStore, keybagIsNew: Bool, now: Double) throws(SecError) -> String? {
        guard ledger.complete else { return nil }
        let value = try counter.read()
        guard let (d, p) = try records(store) else {
            if value != nil && !keybagIsNew { throw RollbackFinding.recordsMissing.secError }
            return try anchor(store, now: now)
        }
        // Epoch 0: an anchoring a crash interrupted after its first step (the records, tagged by us).
        if ledger.verifies(d) && ledger.verifies(p) && d.epoch == 0 && p.epoch == 0 { return try anchor(store, now: now) }
        try verify(store, device: d, passcode: p, counter: value, scanning: !scanned.withLock { $0 })
        scanned.withLock { $0 = true }
        // Sealed at value + 1 but not counted: a flush or rekey that a crash cut before its NV increment.
        if let value, UInt64(d.epoch) == value + 1 {
            _ = try counter.increment()
            anchored(now: now)
        }
        return nil
    }

    /// Throws the finding if the records do not match the counter's `value` and the rows (rule 5 of the
    /// RollbackAnchor article). Without the passcode bucket's key (a rekey before the first unlock) only
    /// the device bucket and the epoch are checked.
    /// `scanning` false: the records and the counter only, not the rows.
    func verify(_ store: ItemStore, device d: RollbackRecord, passcode p: RollbackRecord, counter value: UInt64?,
                scanning: Bool = true) throws(SecError) {
        let both = ledger.complete
        guard ledger.verifies(d) else { throw RollbackFinding.recordsEdited.secError }
        if both { guard ledger.verifies(p) else { throw RollbackFinding.olderKeybag.secError } }
        guard d.epoch == p.epoch, d.epoch > 0 else { throw RollbackFinding.recordsEdited.secError }
        guard let value else { throw RollbackFinding.counterMissing.secError }
        let epoch = UInt64(d.epoch)
        if epoch < value { throw RollbackFinding.olderDatabase(epoch: epoch, counter: value).secError }
        if epoch > value + 1 { throw RollbackFinding.counterBehind(epoch: epoch, counter: value).secError }
        guard scanning else { return }
        let scan = try store.scanLedger(ledger, buckets: both ? nil : [RollbackLedger.deviceBucket])
        for r in both ? [d, p] : [d] {
            let (root, n) = scan[r.bucket] ?? ([UInt8](repeating: 0, count: 32), 0)
            guard root == r.root, n == r.count else { throw RollbackFinding.rowsChanged(bucket: r.bucket, expectedRows: r.count, foundRows: n).secError }
        }
    }

    /// Anchors the keychain: records at epoch 0 (one transaction), the counter created, records at
    /// value + 1, the increment. A crash after any step resumes at the next unlock.
    private func anchor(_ store: ItemStore, now: Double) throws(SecError) -> String {
        try store.transaction { () throws(SecError) in try writeRecords(store, epoch: 0) }
        let value = try counter.create()
        try store.transaction { () throws(SecError) in try reseal(store, epoch: Int64(value + 1)) }
        CrashPoint.hit("rollback-anchor-before-increment")
        let now1 = try counter.increment()
        anchored(now: now)
        return "rollback detection: keychain anchored to the \(counter.name) at \(now1) (\(try store.count()) items)"
    }

    /// Anchors the item writes made since the last increment (lock, the batching interval, a clean
    /// stop): the records re-sealed at value + 1, then the increment. Nothing to do if no write
    /// happened, if the keychain is not anchored, or before the first unlock (the passcode bucket's key
    /// is needed).
    func flush(_ store: ItemStore, now: Double) throws(SecError) {
        guard dirty, ledger.complete, try records(store) != nil else { return }
        guard let value = try counter.read() else { throw RollbackFinding.counterMissing.secError }
        try store.transaction { () throws(SecError) in try reseal(store, epoch: Int64(value + 1)) }
        CrashPoint.hit("rollback-flush-before-increment")
        _ = try counter.increment()
        anchored(now: now)
    }
}
