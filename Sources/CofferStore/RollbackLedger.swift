import CSQLite
package import CofferModel

/// One item row as the rollback ledger digests it: every column of `items`.
package struct LedgerRow: Sendable {
    /// SQLite row id.
    package var id: Int64
    /// Persistent reference.
    package var persistentRef: [UInt8]
    /// Primary-key hash.
    package var primaryKeyHash: [UInt8]
    /// Protection class raw value (as stored, not checked).
    package var protectionClass: Int64
    /// Sealed attributes.
    package var meta: [UInt8]
    /// Sealed secret.
    package var secret: [UInt8]

    /// Makes a ledger row.
    package init(id: Int64, persistentRef: [UInt8], primaryKeyHash: [UInt8], protectionClass: Int64, meta: [UInt8], secret: [UInt8]) {
        self.id = id
        self.persistentRef = persistentRef
        self.primaryKeyHash = primaryKeyHash
        self.protectionClass = protectionClass
        self.meta = meta
        self.secret = secret
    }
}

/// One rollback record (table `rollback`, store schema 5): a bucket's set hash, row count, epoch and tag.
package struct RollbackRecord: Equatable, Sendable {
    /// The bucket (the keychain's index tier: 16 device, 17 passcode).
    package var bucket: Int64
    /// The sum, modulo 2^256, of the bucket's row digests (32 bytes, little-endian).
    package var root: [UInt8]
    /// Rows in the bucket.
    package var count: Int64
    /// The anchor epoch: the TPM counter value the record was sealed at (0 while anchoring).
    package var epoch: Int64
    /// The keyed tag over the other fields.
    package var tag: [UInt8]

    /// Makes a record.
    package init(bucket: Int64, root: [UInt8], count: Int64, epoch: Int64, tag: [UInt8]) {
        self.bucket = bucket
        self.root = root
        self.count = count
        self.epoch = epoch
        self.tag = tag
    }
}

/// The keyed half of rollback detection, given by the keychain (the store knows no keys): the digest
/// of a row and the tag of a record, each under the key of the row's bucket.
package protocol RowLedger: AnyObject {
    /// The bucket a row of this protection class (as stored) belongs to.
    func bucket(protectionClass: Int64) -> Int64
    /// The bucket and 32-byte keyed digest of `row`; throws if the bucket's key is not in memory.
    func digest(_ row: LedgerRow) throws(SecError) -> (bucket: Int64, digest: [UInt8])
    /// The tag of `record` (its `tag` field ignored) under its bucket's key.
    func tag(_ record: RollbackRecord) throws(SecError) -> [UInt8]
}

/// What one transaction adds to and removes from a bucket.
struct LedgerDelta {
    var added = [UInt8](repeating: 0, count: 32)
    var removed = [UInt8](repeating: 0, count: 32)
    var count: Int64 = 0
}

/// Sums of 256-bit little-endian numbers modulo 2^256 (the set hash's group: MSet-Add-Hash).
package enum SetHashArithmetic {
    /// `a + b` mod 2^256.
    package static func add(_ a: [UInt8], _ b: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var carry: UInt16 = 0
        for i in 0..<32 {
            let v = UInt16(a[i]) + UInt16(b[i]) + carry
            out[i] = UInt8(truncatingIfNeeded: v)
            carry = v >> 8
        }
        return out
    }

    /// `a - b` mod 2^256.
    package static func subtract(_ a: [UInt8], _ b: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var borrow: Int16 = 0
        for i in 0..<32 {
            var v = Int16(a[i]) - Int16(b[i]) - borrow
            borrow = v < 0 ? 1 : 0
            if v < 0 { v += 256 }
            out[i] = UInt8(v)
        }
        return out
    }
}

extension ItemStore {
    /// The row `id` with every column, for the ledger (nil if there is none).
    func ledgerRow(id: Int64) throws(SecError) -> LedgerRow? {
        guard ledger != nil else { return nil }
        let s = try db.statement("SELECT id, pref, pk, pclass, meta, secret FROM items WHERE id = ?1")
        s.bind(1, id)
        defer { unsafe sqlite3_reset(s.stmt) }
        return try s.step() ? Self.ledgerRow(s) : nil
    }

    private static func ledgerRow(_ s: Statement) -> LedgerRow {
        LedgerRow(id: s.int64(0), persistentRef: s.blob(1), primaryKeyHash: s.blob(2), protectionClass: s.int64(3),
                  meta: s.blob(4), secret: s.blob(5))
    }

    /// Counts `row` into the open transaction's delta (nothing without a ledger).
    func account(added row: LedgerRow) throws(SecError) {
        guard let ledger else { return }
        let (bucket, d) = try ledger.digest(row)
        var delta = pending[bucket] ?? LedgerDelta()
        delta.added = SetHashArithmetic.add(delta.added, d)
        delta.count += 1
        pending[bucket] = delta
    }

    /// Counts `row` (if any) out of the open transaction's delta.
    func account(removed row: LedgerRow?) throws(SecError) {
        guard let ledger, let row else { return }
        let (bucket, d) = try ledger.digest(row)
        var delta = pending[bucket] ?? LedgerDelta()
        delta.removed = SetHashArithmetic.add(delta.removed, d)
        delta.count -= 1
        pending[bucket] = delta
    }

    /// Applies the transaction's deltas to the rollback records, in the transaction: each record's tag
    /// is checked first (a record edited outside Coffer is never re-sealed as if it were right). Buckets
    /// without a record (not anchored yet) are left to the anchoring, which computes them whole.
    func commitLedger() throws(SecError) {
        defer { pending = [:] }
        guard let ledger, !pending.isEmpty else { return }
        for (bucket, delta) in pending.sorted(by: { $0.key < $1.key }) {
            guard var record = try rollbackRecord(bucket: bucket) else { continue }
            guard try ledger.tag(record) == record.tag else {
                throw .decode("rollback detected: the keychain's rollback record was edited outside Coffer; nothing was written (restore a backup or use the escrow)")
            }
            record.root = SetHashArithmetic.subtract(SetHashArithmetic.add(record.root, delta.added), delta.removed)
            record.count += delta.count
            record.tag = try ledger.tag(record)
            try writeRollbackRecord(record)
        }
    }

    /// The rollback record of `bucket`, if there is one.
    package func rollbackRecord(bucket: Int64) throws(SecError) -> RollbackRecord? {
        let s = try db.statement("SELECT bucket, root, n, epoch, tag FROM rollback WHERE bucket = ?1")
        s.bind(1, bucket)
        defer { unsafe sqlite3_reset(s.stmt) }
        guard try s.step() else { return nil }
        return RollbackRecord(bucket: s.int64(0), root: s.blob(1), count: s.int64(2), epoch: s.int64(3), tag: s.blob(4))
    }

    /// Every rollback record, by bucket.
    package func rollbackRecords() throws(SecError) -> [RollbackRecord] {
        let s = try db.statement("SELECT bucket, root, n, epoch, tag FROM rollback ORDER BY bucket")
        defer { unsafe sqlite3_reset(s.stmt) }
        var out: [RollbackRecord] = []
        while try s.step() { out.append(RollbackRecord(bucket: s.int64(0), root: s.blob(1), count: s.int64(2), epoch: s.int64(3), tag: s.blob(4))) }
        return out
    }

    /// Writes (inserting or replacing) a rollback record; call inside ``transaction(_:)``.
    package func writeRollbackRecord(_ r: RollbackRecord) throws(SecError) {
        let s = try db.statement("INSERT OR REPLACE INTO rollback(bucket, root, n, epoch, tag) VALUES (?1, ?2, ?3, ?4, ?5)")
        s.bind(1, r.bucket)
        s.bind(2, r.root)
        s.bind(3, r.count)
        s.bind(4, r.epoch)
        s.bind(5, r.tag)
        try s.run()
    }

    /// The set hash and count of every bucket computed from the rows themselves (a full scan, at unlock
    /// and when anchoring), with `ledger`'s digests.
    /// `buckets`: only rows of these buckets (nil: all), given by ``RowLedger/bucket(protectionClass:)``.
    package func scanLedger(_ ledger: any RowLedger, buckets: Set<Int64>? = nil) throws(SecError) -> [Int64: (root: [UInt8], count: Int64)] {
        let s = try db.statement("SELECT id, pref, pk, pclass, meta, secret FROM items")
        defer { unsafe sqlite3_reset(s.stmt) }
        var out: [Int64: (root: [UInt8], count: Int64)] = [:]
        while try s.step() {
            if let buckets, !buckets.contains(ledger.bucket(protectionClass: s.int64(3))) { continue }
            let (bucket, d) = try ledger.digest(Self.ledgerRow(s))
            let old = out[bucket] ?? ([UInt8](repeating: 0, count: 32), 0)
            out[bucket] = (SetHashArithmetic.add(old.root, d), old.count + 1)
        }
        return out
    }
}
