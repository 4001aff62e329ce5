import CofferModel

/// What one device remembers about the circle between pulls (SyncFormat.md, "Local state"): the
/// epoch it trusts, its own next sequence number and clock, how far it has applied each device's
/// records, the winning version of every item, and the conflicts it kept. No item content; while a
/// pairing runs, the joiner's CPace secret and code (the agent keeps the state sealed in the
/// keychain, under a WhenUnlocked key): the agent stores it beside the items and commits it in the
/// same transaction as the changes a pull applies, so a crash never leaves one without the other.
public struct SyncState: Sendable, Equatable {
    /// 2 adds the checkpoints seen (compaction); 3 the first epoch's pinned hash, the pairing under
    /// way, the pairing sessions answered (SyncFormat.md, "Pairing") and the restores not yet recorded. An earlier state reads as one
    /// with none of them: its first epoch is taken from the chain that leads to its pinned epoch.
    public static let version: UInt8 = 3

    /// The winning version of an item on this device.
    public struct Version: Sendable, Equatable {
        public let time: HLCTimestamp
        public let record: SyncRecordName
        public let deleted: Bool

        public init(time: HLCTimestamp, record: SyncRecordName, deleted: Bool) {
            self.time = time
            self.record = record
            self.deleted = deleted
        }
    }

    /// A version that lost to another written concurrently; its record stays in the directory, so
    /// it can be restored.
    public struct Conflict: Sendable, Equatable {
        public let itemKey: [UInt8]
        /// The version that won (and is on the keychain).
        public let winner: HLCTimestamp
        /// The record of the version that lost.
        public let loser: SyncRecordName
        public let loserTime: HLCTimestamp
        public let loserDeleted: Bool

        public init(itemKey: [UInt8], winner: HLCTimestamp, loser: SyncRecordName, loserTime: HLCTimestamp, loserDeleted: Bool) {
            self.itemKey = itemKey
            self.winner = winner
            self.loser = loser
            self.loserTime = loserTime
            self.loserDeleted = loserDeleted
        }
    }

    /// The circle epoch and its file's hash this device trusts (nil before it joined).
    public var pinnedEpoch: UInt64 = 0
    public var pinnedHash: [UInt8] = []
    /// The hash of the circle's first epoch, as the pairing (or the founding) fixed it: the circle
    /// this device belongs to (empty before it is known).
    public var pinnedFirst: [UInt8] = []
    /// The joiner's pairing under way (nil once it is a member, and on every member).
    public var joining: SyncPairing.Joining? = nil
    /// The session ids of the pairing requests this device answered as an approver (the newest
    /// ``maxAnswered``): each request gets one answer, so each code one guess.
    public var answered: [[UInt8]] = []
    public static let maxAnswered = 64
    /// Per item key (hex), the losing version a restore brought back, until the restore is recorded:
    /// its record names that loser as its basis, so every member sees the conflict settled.
    public var restoring: [String: HLCTimestamp] = [:]
    /// The sequence number of this device's next record.
    public var nextSeq: UInt64 = 1
    public var clockWall: UInt64 = 0
    public var clockCounter: UInt32 = 0
    /// Per device, the highest sequence number up to which every record was applied.
    public var applied: [SyncDeviceID: UInt64] = [:]
    /// Per item key (hex), its winning version.
    public var versions: [String: Version] = [:]
    /// Per item key (hex), the versions other versions were written on top of (their bases).
    public var bases: [String: Set<HLCTimestamp>] = [:]
    public var conflicts: [Conflict] = []
    /// The transport's last seen remote state (for `git`, the commit), to refuse a remote that goes back.
    public var remoteHead: String = ""
    /// Per writer, the `through` of the newest checkpoint this device accepted (SyncFormat.md,
    /// "Compaction"): a directory whose checkpoint is older, or gone, went back.
    public var checkpoints: [SyncDeviceID: UInt64] = [:]

    public init() {}

    var pinned: (epoch: UInt64, hash: [UInt8])? { pinnedEpoch == 0 ? nil : (pinnedEpoch, pinnedHash) }

    // MARK: Encoding

    private static func write(_ t: HLCTimestamp, _ w: inout ByteWriter) {
        w.u64(t.wallMillis)
        w.u32(t.counter)
        w.raw(t.device.bytes)
    }

    private static func read(_ r: inout ByteReader) throws(DecodeError) -> HLCTimestamp {
        let wall = try r.u64("time"), counter = try r.u32("counter")
        return HLCTimestamp(wallMillis: wall, counter: counter, device: SyncDeviceID(bytes: try r.raw(16, "device"))!)
    }

    private static func write(_ n: SyncRecordName, _ w: inout ByteWriter) {
        w.raw(n.device.bytes)
        w.u64(n.seq)
    }

    private static func readName(_ r: inout ByteReader) throws(DecodeError) -> SyncRecordName {
        let d = SyncDeviceID(bytes: try r.raw(16, "device"))!
        return SyncRecordName(device: d, seq: try r.u64("sequence number"))
    }

    /// The versioned encoding (SyncFormat.md, "Local state").
    public func encoded() -> [UInt8] {
        var w = ByteWriter(capacity: 256 + versions.count * 80)
        w.raw(Array("CSS1".utf8))
        w.u8(Self.version)
        w.u64(pinnedEpoch)
        w.blob(pinnedHash)
        w.u64(nextSeq)
        w.u64(clockWall)
        w.u32(clockCounter)
        w.u32(UInt32(applied.count))
        for (d, s) in applied.sorted(by: { $0.key < $1.key }) { w.raw(d.bytes); w.u64(s) }
        w.u32(UInt32(versions.count))
        for (k, v) in versions.sorted(by: { $0.key < $1.key }) {
            w.string(k)
            Self.write(v.time, &w)
            Self.write(v.record, &w)
            w.u8(v.deleted ? 1 : 0)
            let b = bases[k] ?? []
            w.u32(UInt32(b.count))
            for t in b.sorted() { Self.write(t, &w) }
        }
        w.u32(UInt32(conflicts.count))
        for c in conflicts {
            w.blob(c.itemKey)
            Self.write(c.winner, &w)
            Self.write(c.loser, &w)
            Self.write(c.loserTime, &w)
            w.u8(c.loserDeleted ? 1 : 0)
        }
        w.string(remoteHead)
        w.u32(UInt32(checkpoints.count))
        for (d, t) in checkpoints.sorted(by: { $0.key < $1.key }) { w.raw(d.bytes); w.u64(t) }
        w.blob(pinnedFirst)
        w.u16(UInt16(min(answered.count, Self.maxAnswered)))
        for sid in answered.suffix(Self.maxAnswered) { w.raw(sid) }
        if let joining { w.u8(1); w.blob(joining.encoded()) } else { w.u8(0) }
        w.u32(UInt32(restoring.count))
        for (k, t) in restoring.sorted(by: { $0.key < $1.key }) { w.string(k); Self.write(t, &w) }
        return w.take()
    }

    public static func decode(_ bytes: [UInt8]) throws(SyncError) -> SyncState {
        var r = ByteReader(bytes)
        var s = SyncState()
        do throws(DecodeError) {
            guard Array(try r.raw(4, "magic")) == Array("CSS1".utf8) else { throw DecodeError("not Coffer sync state") }
            let v = try r.u8("version")
            guard v >= 1 && v <= version else { throw DecodeError("sync state version \(v) is not supported (this Coffer reads \(version))") }
            s.pinnedEpoch = try r.u64("pinned epoch")
            s.pinnedHash = Array(try r.blob(max: 32, "pinned hash"))
            s.nextSeq = try r.u64("next sequence number")
            s.clockWall = try r.u64("clock")
            s.clockCounter = try r.u32("clock counter")
            for _ in 0..<(try r.u32("device count")) {
                let d = SyncDeviceID(bytes: try r.raw(16, "device"))!
                s.applied[d] = try r.u64("applied")
            }
            for _ in 0..<(try r.u32("item count")) {
                let k = try r.string(max: 2 * SyncChange.maxItemKeyBytes, "item key")
                let t = try read(&r), n = try readName(&r)
                let deleted = try r.u8("deleted") == 1
                s.versions[k] = Version(time: t, record: n, deleted: deleted)
                var b: Set<HLCTimestamp> = []
                for _ in 0..<(try r.u32("basis count")) { b.insert(try read(&r)) }
                if !b.isEmpty { s.bases[k] = b }
            }
            for _ in 0..<(try r.u32("conflict count")) {
                let k = Array(try r.blob(max: SyncChange.maxItemKeyBytes, "item key"))
                let winner = try read(&r), loser = try readName(&r), loserTime = try read(&r)
                s.conflicts.append(Conflict(itemKey: k, winner: winner, loser: loser, loserTime: loserTime, loserDeleted: try r.u8("deleted") == 1))
            }
            s.remoteHead = try r.string(max: 256, "remote head")
            if v >= 2 {
                for _ in 0..<(try r.u32("checkpoint count")) {
                    let d = SyncDeviceID(bytes: try r.raw(16, "device"))!
                    s.checkpoints[d] = try r.u64("checkpoint")
                }
            }
            if v >= 3 {
                s.pinnedFirst = Array(try r.blob(max: 32, "first epoch hash"))
                guard s.pinnedFirst.isEmpty || s.pinnedFirst.count == 32 else { throw DecodeError("first epoch hash of \(s.pinnedFirst.count) bytes") }
                for _ in 0..<(try r.u16("answered count")) { s.answered.append(Array(try r.raw(SyncPairing.sidBytes, "answered session id"))) }
                if try r.u8("pairing flag") == 1 {
                    var inner = ByteReader(Array(try r.blob(max: 16_384, "pairing")))
                    s.joining = try SyncPairing.Joining.decode(&inner)
                    try inner.expectEnd("the pairing")
                }
                for _ in 0..<(try r.u32("restoring count")) {
                    let k = try r.string(max: 2 * SyncChange.maxItemKeyBytes, "item key")
                    s.restoring[k] = try read(&r)
                }
            }
            try r.expectEnd("the sync state")
        } catch {
            throw .malformed("sync state: \(error.reason)")
        }
        return s
    }
}
