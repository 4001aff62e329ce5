public import CofferCrypto
import CofferModel
import CofferSystem

/// A device's acknowledgement `seen/DEVICE.seen` (SyncFormat.md, "Compaction"): up to which sequence
/// number it applied every writer's records. Only its device writes it; a writer compacts only what
/// every current member acknowledged.
public struct SyncSeen: Sendable, Equatable {
    public static let magic: [UInt8] = Array("CSA1".utf8)
    public static let version: UInt8 = 1

    public let device: SyncDeviceID
    public let applied: [SyncDeviceID: UInt64]

    public init(device: SyncDeviceID, applied: [SyncDeviceID: UInt64]) {
        self.device = device
        self.applied = applied
    }

    public static func path(_ device: SyncDeviceID) -> String { "seen/\(device.hex).seen" }
    public var path: String { Self.path(device) }

    private func body() -> [UInt8] {
        var w = ByteWriter(capacity: 16 + applied.count * 24)
        w.raw(Self.magic)
        w.u8(Self.version)
        w.u32(UInt32(applied.count))
        for (d, s) in applied.sorted(by: { $0.key < $1.key }) { w.raw(d.bytes); w.u64(s) }
        return w.take()
    }

    /// The file, signed by `keys` (whose device this is).
    public func encoded(signedWith keys: SyncDeviceKeys) -> [UInt8] {
        keys.signFile(body(), path: path)
    }

    /// Reads `seen/ID.seen` of `writer`, refusing a bad signature (or one over another path).
    public static func decode(_ bytes: [UInt8], writer: SyncDevice) throws(SyncError) -> SyncSeen {
        let path = Self.path(writer.id)
        var r = ByteReader(bytes)
        var applied: [SyncDeviceID: UInt64] = [:]
        do throws(DecodeError) {
            guard Array(try r.raw(4, "magic")) == magic else { throw DecodeError("not a Coffer sync acknowledgement") }
            let v = try r.u8("version")
            guard v == version else { throw DecodeError("acknowledgement version \(v) is not supported (this Coffer reads \(version))") }
            let n = try r.u32("count")
            guard Int(n) <= CircleEpoch.maxDevices * 64 else { throw DecodeError("too many writers") }
            var last: SyncDeviceID? = nil
            for _ in 0..<n {
                let d = SyncDeviceID(bytes: try r.raw(16, "device"))!
                if let l = last, !(l < d) { throw DecodeError("writers not in ascending order") }
                last = d
                applied[d] = try r.u64("applied")
            }
            _ = try r.raw(Ed25519.signatureBytes, "signature")
            try r.expectEnd("the acknowledgement")
        } catch {
            throw .malformed("\(path): \(error.reason)")
        }
        guard writer.signed(bytes, at: path) else { throw .forged("\(path) is not signed by device \(writer.id.hex)") }
        return SyncSeen(device: writer.id, applied: applied)
    }
}

/// A writer's checkpoint `checkpoints/DEVICE.checkpoint` (SyncFormat.md, "Compaction"): its records up
/// to `through` that are not listed in `kept` were removed on purpose (each was superseded knowingly),
/// and `bases` (sealed) carries the versions those removed records named as their basis, so that a
/// later reader decides every item as it would have with all the records.
public struct SyncCheckpoint: Sendable {
    public static let magic: [UInt8] = Array("CSK1".utf8)
    public static let version: UInt8 = 1

    public let device: SyncDeviceID
    public let epoch: UInt64
    public let through: UInt64
    /// The records up to `through` still in the directory, ascending.
    public let kept: [UInt64]
    /// Per item key (hex), the bases of the removed records.
    public let bases: [String: Set<HLCTimestamp>]

    public init(device: SyncDeviceID, epoch: UInt64, through: UInt64, kept: [UInt64], bases: [String: Set<HLCTimestamp>]) {
        self.device = device
        self.epoch = epoch
        self.through = through
        self.kept = kept
        self.bases = bases
    }

    public static func path(_ device: SyncDeviceID) -> String { "checkpoints/\(device.hex).checkpoint" }
    /// The most a checkpoint file may hold (its kept sequence numbers and sealed bases): a larger one
    /// is refused before it is read whole.
    public static let maxBytes = 64 << 20
    public var path: String { Self.path(device) }

    private static func header(epoch: UInt64, through: UInt64) -> [UInt8] { SyncRecord.fileHeader(magic, version, epoch, through) }

    private static func ad(_ header: [UInt8], _ device: SyncDeviceID) -> [UInt8] {
        header + device.bytes + Array(path(device).utf8)
    }

    /// The file, its bases sealed under epoch `epoch`'s `key` and signed by `keys`.
    public func encoded(key: SecureBytes, keys: SyncDeviceKeys) -> [UInt8] {
        let h = Self.header(epoch: epoch, through: through)
        var p = ByteWriter(capacity: 64 + bases.count * 64)
        p.u32(UInt32(bases.count))
        for (k, times) in bases.sorted(by: { $0.key < $1.key }) {
            p.blob(Hex.decode(k) ?? [])
            p.u32(UInt32(times.count))
            for t in times.sorted() { p.u64(t.wallMillis); p.u32(t.counter); p.raw(t.device.bytes) }
        }
        var plainBytes = p.take()
        let plain = SecureBytes(consuming: &plainBytes)
        let sealed = AEAD.seal(plain, key: key, ad: Self.ad(h, device))
        plain.wipe()
        var w = ByteWriter(capacity: h.count + kept.count * 8 + sealed.count + 80)
        w.raw(h)
        w.u32(UInt32(kept.count))
        for s in kept { w.u64(s) }
        w.blob(sealed)
        return keys.signFile(w.take(), path: path)
    }

    /// The checkpoint's epoch, read without opening it (to pick the key).
    public static func epoch(of bytes: [UInt8]) throws(SyncError) -> (epoch: UInt64, through: UInt64) {
        var r = ByteReader(bytes)
        do throws(DecodeError) {
            guard Array(try r.raw(4, "magic")) == magic else { throw DecodeError("not a Coffer sync checkpoint") }
            let v = try r.u8("version")
            guard v == version else { throw DecodeError("checkpoint version \(v) is not supported (this Coffer reads \(version))") }
            return (try r.u64("epoch"), try r.u64("through"))
        } catch {
            throw .malformed("checkpoint: \(error.reason)")
        }
    }

    /// Opens `checkpoints/ID.checkpoint` of `writer`: its format, the writer's signature over it and its
    /// path, and its seal under `key`.
    public static func decode(_ bytes: [UInt8], writer: SyncDevice, key: SecureBytes) throws(SyncError) -> SyncCheckpoint {
        let path = Self.path(writer.id)
        var r = ByteReader(bytes)
        let h: [UInt8], sealed: [UInt8]
        var kept: [UInt64] = []
        let epoch: UInt64, through: UInt64
        do throws(DecodeError) {
            h = Array(try r.raw(21, "header"))
            guard Array(h[0..<4]) == magic else { throw DecodeError("not a Coffer sync checkpoint") }
            guard h[4] == version else { throw DecodeError("checkpoint version \(h[4]) is not supported (this Coffer reads \(version))") }
            var hr = ByteReader(Array(h[5...]))
            epoch = try hr.u64("epoch")
            through = try hr.u64("through")
            let n = try r.u32("kept count")
            guard UInt64(n) <= through, Int(n) * 8 <= r.remaining else { throw DecodeError("kept count \(n) is impossible") }
            for _ in 0..<n {
                let s = try r.u64("kept record")
                guard s >= 1, s <= through, s > (kept.last ?? 0) else { throw DecodeError("kept records not ascending within 1…\(through)") }
                kept.append(s)
            }
            sealed = Array(try r.blob(max: bytes.count, "sealed bases"))
            _ = try r.raw(Ed25519.signatureBytes, "signature")
            try r.expectEnd("the checkpoint")
        } catch {
            throw .malformed("\(path): \(error.reason)")
        }
        guard writer.signed(bytes, at: path) else { throw .forged("\(path) is not signed by device \(writer.id.hex) for this path") }
        let plain: SecureBytes
        do { plain = try AEAD.open(sealed[...], key: key, ad: ad(h, writer.id)) } catch {
            throw .forged("\(path) does not open under its circle epoch's key")
        }
        defer { plain.wipe() }
        var bases: [String: Set<HLCTimestamp>] = [:]
        do throws(DecodeError) {
            var p = ByteReader(unsafe plain.withUnsafeBytes { unsafe Array($0) })
            for _ in 0..<(try p.u32("item count")) {
                let k = Array(try p.blob(max: SyncChange.maxItemKeyBytes, "item key"))
                var times: Set<HLCTimestamp> = []
                for _ in 0..<(try p.u32("basis count")) {
                    let wall = try p.u64("basis time"), counter = try p.u32("basis counter")
                    times.insert(HLCTimestamp(wallMillis: wall, counter: counter, device: SyncDeviceID(bytes: try p.raw(16, "basis device"))!))
                }
                bases[Hex.encode(k)] = times
            }
            try p.expectEnd("the checkpoint's bases")
        } catch {
            throw .malformed("\(path): \(error.reason)")
        }
        return SyncCheckpoint(device: writer.id, epoch: epoch, through: through, kept: kept, bases: bases)
    }
}

extension SyncReplica {
    /// Writes this device's acknowledgement (``SyncSeen``) of the state it committed: how far it applied
    /// every writer's records. Call after the state a pull returned is durably stored (the agent's sync
    /// does), never before: a writer may then remove records this device no longer needs.
    public func acknowledge() throws(SyncError) {
        var applied = state.applied
        applied[keys.id] = state.nextSeq - 1
        let seen = SyncSeen(device: keys.id, applied: applied.filter { $0.value > 0 })
        let bytes = seen.encoded(signedWith: keys)
        if let old = try? read(seen.path, max: 1 << 20), old == bytes { return }
        try write(seen.path, bytes)
    }

    /// What a compaction did.
    public struct Compaction: Sendable, Equatable {
        /// The checkpoint's new `through` (0: nothing could be compacted).
        public var through: UInt64 = 0
        /// Records removed from the directory.
        public var removed = 0
        /// Records up to `through` kept (winning versions, tombstones, possible conflicts' losers).
        public var kept = 0

        public init(through: UInt64 = 0, removed: Int = 0, kept: Int = 0) {
            self.through = through
            self.removed = removed
            self.kept = kept
        }
    }

    /// The acknowledgements of the current members (a member without a valid one acknowledged nothing).
    func acknowledgements(_ c: SyncCircle) -> [SyncDeviceID: [SyncDeviceID: UInt64]] {
        var out: [SyncDeviceID: [SyncDeviceID: UInt64]] = [:]
        for m in c.current.members {
            guard let device = c.devices[m.device], let bytes = try? read(SyncSeen.path(m.device), max: 1 << 20),
                  let seen = try? SyncSeen.decode(bytes, writer: device) else { continue }
            out[m.device] = seen.applied
        }
        return out
    }

    /// The checkpoint of `device` in the directory, verified (nil if it wrote none).
    func checkpoint(of device: SyncDeviceID, _ c: SyncCircle, _ keysByEpoch: [UInt64: SecureBytes]) throws(SyncError) -> SyncCheckpoint? {
        let path = SyncCheckpoint.path(device)
        guard Files.exists(self.path(path)) else { return nil }
        // Not read at all for a device the circle never had, and never more than a checkpoint can hold.
        guard c.devices[device] != nil else { throw .forged("\(path) is from a device that was never in the circle") }
        let bytes = try read(path, max: SyncCheckpoint.maxBytes)
        let (epoch, through) = try SyncCheckpoint.epoch(of: bytes)
        guard through < UInt64.max else { throw .forged("\(path) claims every sequence number (through \(through))") }
        guard let writer = c.devices[device], c.admits(device: device, seq: through, epoch: epoch) else {
            throw .forged("\(path) is from a device that was not in the circle at epoch \(epoch)")
        }
        guard let key = keysByEpoch[epoch] else { throw .forged("\(path) names epoch \(epoch), which this device has no key for") }
        return try SyncCheckpoint.decode(bytes, writer: writer, key: key)
    }

    /// Compacts this device's own records (SyncFormat.md, "Compaction"): of its records up to the
    /// highest sequence number every current member acknowledged, those superseded knowingly (a
    /// record of the item names their version as its basis) are removed, and a new checkpoint says so
    /// and carries their bases. Winning versions, tombstones and versions that may be a conflict's loser
    /// stay. Call after a pull whose state is committed; the caller stores the returned state (the
    /// replica's own) and pushes (the transport commits the removals). Changes nothing if no member
    /// acknowledged more than the last checkpoint.
    @discardableResult
    public func compact() throws(SyncError) -> Compaction {
        let c = try circle()
        let keysByEpoch = try c.keys(for: keys)
        let acks = acknowledgements(c)
        var limit = state.nextSeq - 1
        for m in c.current.members where m.device != keys.id { limit = min(limit, acks[m.device]?[keys.id] ?? 0) }
        let previous = try checkpoint(of: keys.id, c, keysByEpoch)
        let from = previous?.through ?? 0
        guard limit > from else { return Compaction(through: from) }
        var carried = previous?.bases ?? [:]
        var kept: [UInt64] = [], removed: [SyncRecordName] = []
        let present = Set(sequenceNumbers(of: keys.id))
        let candidates = (previous?.kept ?? []) + Array((from + 1)...limit)
        for seq in candidates {
            let name = SyncRecordName(device: keys.id, seq: seq)
            guard present.contains(seq) else { throw .rolledBack("this device's record \(name.path) is gone from the sync directory") }
            let change = try open(name, c, keysByEpoch)
            let k = Hex.encode(change.itemKey)
            if state.bases[k]?.contains(change.time) == true {
                removed.append(name)
                if let b = change.basis { carried[k, default: []].insert(b) }
            } else {
                kept.append(seq)
            }
        }
        let cp = SyncCheckpoint(device: keys.id, epoch: c.current.epoch, through: limit, kept: kept, bases: carried)
        // The checkpoint first: a crash before the removals leaves records it already covers, which readers skip.
        try write(cp.path, cp.encoded(key: keysByEpoch[c.current.epoch]!, keys: keys))
        for name in removed { try remove(name.path) }
        do { try Files.syncFilesystem(of: directory) } catch { throw .transport("cannot make the compaction durable: \(error)") }
        state.checkpoints[keys.id] = limit
        return Compaction(through: limit, removed: removed.count, kept: kept.count)
    }
}
