public import CofferCrypto
import CofferModel

/// One change to one item, as a device wrote it (SyncFormat.md, "Records"): a new version of the
/// item (`put`) or its deletion (a tombstone).
public struct SyncChange: Sendable {
    public enum Kind: UInt8, Sendable { case put = 1, delete = 2 }
    public let kind: Kind
    /// When the change was made, on the writer's hybrid logical clock.
    public let time: HLCTimestamp
    /// The version the writer replaced (nil: it knew no earlier version). A change whose basis is
    /// not the version a device holds was made concurrently with it: a conflict.
    public let basis: HLCTimestamp?
    /// The item's identity in the circle: the same bytes on every device for the same item (the
    /// agent uses its class, access group and primary key). At most ``maxItemKeyBytes``.
    public let itemKey: [UInt8]
    /// The item's sealed-away content (empty for a deletion). At most ``maxPayloadBytes``.
    public let payload: SecureBytes

    public static let maxItemKeyBytes = 1024
    public static let maxPayloadBytes = 1 << 20

    public init(kind: Kind, time: HLCTimestamp, basis: HLCTimestamp?, itemKey: [UInt8], payload: SecureBytes) {
        self.kind = kind
        self.time = time
        self.basis = basis
        self.itemKey = itemKey
        self.payload = payload
    }
}

/// Where a record sits and who wrote it: `records/DEVICE/SHARD/SEQUENCE.record`, the sequence number
/// 16 lowercase hex digits and SHARD its first 14 (256 records a directory, so that a push rewrites
/// small git trees, not one listing every record the device ever wrote). Only DEVICE writes in its
/// directory, so no two devices ever write one path.
public struct SyncRecordName: Hashable, Comparable, Sendable {
    public let device: SyncDeviceID
    public let seq: UInt64

    public init(device: SyncDeviceID, seq: UInt64) {
        self.device = device
        self.seq = seq
    }

    public var path: String { "records/\(device.hex)/\(Self.shard(seq))/\(Self.fileName(seq))" }

    /// The shard directory's name for `seq`: its 16 hex digits but the last two.
    static func shard(_ seq: UInt64) -> String {
        let h = String(seq >> 8, radix: 16)
        return String(repeating: "0", count: 14 - h.count) + h
    }

    /// The shard a directory name stands for; nil if the name is not one.
    static func shard(directoryName: String) -> UInt64? {
        guard directoryName.utf8.count == 14, directoryName.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else {
            return nil
        }
        return UInt64(directoryName, radix: 16)
    }

    static func fileName(_ seq: UInt64) -> String {
        let h = String(seq, radix: 16)
        return String(repeating: "0", count: 16 - h.count) + h + ".record"
    }

    /// The sequence number a record file name carries; nil if the name is not one.
    static func seq(fileName: String) -> UInt64? {
        guard fileName.hasSuffix(".record"), fileName.utf8.count == 23 else { return nil }
        let digits = String(fileName.dropLast(7))
        guard digits.utf8.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else { return nil }
        return UInt64(digits, radix: 16)
    }

    public static func < (a: SyncRecordName, b: SyncRecordName) -> Bool { (a.device, a.seq) < (b.device, b.seq) }
}

/// Sealing and opening record files (SyncFormat.md, "Records").
public enum SyncRecord {
    public static let magic: [UInt8] = Array("CSR1".utf8)
    public static let version: UInt8 = 1

    private static func header(epoch: UInt64, seq: UInt64) -> [UInt8] { fileHeader(magic, version, epoch, seq) }

    /// The 21-byte header of a record or checkpoint: magic ‖ version ‖ u64 epoch ‖ u64 `second`.
    static func fileHeader(_ magic: [UInt8], _ version: UInt8, _ epoch: UInt64, _ second: UInt64) -> [UInt8] {
        var w = ByteWriter()
        w.raw(magic)
        w.u8(version)
        w.u64(epoch)
        w.u64(second)
        return w.take()
    }

    private static func bound(_ header: [UInt8], _ name: SyncRecordName) -> [UInt8] {
        header + name.device.bytes + Array(name.path.utf8)
    }

    /// The file for `change`, written by `keys`' device as its record `seq`, sealed under epoch `epoch`'s `key`.
    public static func seal(_ change: SyncChange, seq: UInt64, epoch: UInt64, key: SecureBytes,
                            keys: SyncDeviceKeys) throws(SyncError) -> (name: SyncRecordName, bytes: [UInt8]) {
        guard !change.itemKey.isEmpty, change.itemKey.count <= SyncChange.maxItemKeyBytes else {
            throw .param("an item key has 1 to \(SyncChange.maxItemKeyBytes) bytes")
        }
        guard change.payload.count <= SyncChange.maxPayloadBytes, change.kind == .put || change.payload.count == 0 else {
            throw .param("an item's content is at most \(SyncChange.maxPayloadBytes) bytes, and a deletion has none")
        }
        guard change.time.device == keys.id else { throw .param("a device writes records only with its own clock") }
        let name = SyncRecordName(device: keys.id, seq: seq)
        var p = ByteWriter(capacity: 64 + change.itemKey.count)
        p.u8(change.kind.rawValue)
        p.u64(change.time.wallMillis)
        p.u32(change.time.counter)
        if let b = change.basis {
            p.u8(1)
            p.u64(b.wallMillis)
            p.u32(b.counter)
            p.raw(b.device.bytes)
        } else {
            p.u8(0)
        }
        p.blob(change.itemKey)
        let head = p.take()
        // The payload is a secret: assembled in secure memory, never in an ordinary array.
        let plain = SecureBytes(count: head.count + 4 + change.payload.count)
        unsafe plain.withUnsafeMutableBytes { o in
            unsafe head.withUnsafeBytes { unsafe o.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: head.count) }
            let n = UInt32(change.payload.count)
            for i in 0..<4 { unsafe o[head.count + i] = UInt8((n >> UInt32(24 - 8 * i)) & 0xff) }
            unsafe change.payload.withUnsafeBytes { s in
                if s.count > 0 { unsafe (o.baseAddress! + head.count + 4).copyMemory(from: s.baseAddress!, byteCount: s.count) }
            }
        }
        let h = header(epoch: epoch, seq: seq)
        let sealed = AEAD.seal(plain, key: key, ad: bound(h, name))
        plain.wipe()
        var w = ByteWriter(capacity: h.count + sealed.count + 80)
        w.raw(h)
        w.blob(sealed)
        return (name, keys.signFile(w.take(), path: name.path))
    }

    /// The record's epoch, read without opening it (to pick the key).
    public static func epoch(of bytes: [UInt8]) throws(SyncError) -> UInt64 {
        var r = ByteReader(bytes)
        do throws(DecodeError) {
            guard Array(try r.raw(4, "magic")) == magic else { throw DecodeError("not a Coffer sync record") }
            let v = try r.u8("version")
            guard v == version else { throw DecodeError("record version \(v) is not supported (this Coffer reads \(version))") }
            return try r.u64("epoch")
        } catch {
            throw .malformed(error.reason)
        }
    }

    /// Opens the record file `bytes` found at `name`'s path: its format, its writer's signature over
    /// it and its path (a record moved to another path or another device's directory fails), and its
    /// seal under `key`.
    public static func open(_ bytes: [UInt8], name: SyncRecordName, writer: SyncDevice, key: SecureBytes) throws(SyncError) -> SyncChange {
        var r = ByteReader(bytes)
        let h: [UInt8], sealed: [UInt8]
        do throws(DecodeError) {
            let hb = Array(try r.raw(4 + 1 + 8 + 8, "header"))
            guard Array(hb[0..<4]) == magic else { throw DecodeError("not a Coffer sync record") }
            guard hb[4] == version else { throw DecodeError("record version \(hb[4]) is not supported (this Coffer reads \(version))") }
            h = hb
            sealed = Array(try r.blob(max: SyncChange.maxPayloadBytes + SyncChange.maxItemKeyBytes + 256, "sealed change"))
            _ = try r.raw(Ed25519.signatureBytes, "signature")
            try r.expectEnd("the record")
        } catch {
            throw .malformed("record \(name.path): \(error.reason)")
        }
        var seq: UInt64 = 0
        for b in h[13..<21] { seq = seq << 8 | UInt64(b) }
        guard seq == name.seq else { throw .forged("record \(name.path) carries sequence number \(seq): it was moved") }
        guard writer.id == name.device, writer.signed(bytes, at: name.path) else {
            throw .forged("record \(name.path) is not signed by device \(name.device.hex) for this path")
        }
        let plain: SecureBytes
        do { plain = try AEAD.open(sealed[...], key: key, ad: bound(h, name)) } catch {
            throw .forged("record \(name.path) does not open under its circle epoch's key")
        }
        defer { plain.wipe() }
        return try unsafe plain.withUnsafeBytes { (p: UnsafeRawBufferPointer) throws(SyncError) -> SyncChange in
            do throws(DecodeError) {
                // Only the public head is copied out; the payload goes from secure memory to secure memory.
                // The head's length from its two length-bearing fields: the basis flag and the item key's length.
                guard p.count >= 14 else { throw DecodeError("truncated change") }
                let fixed = 14 + (unsafe p[13] == 1 ? 28 : 0)
                guard p.count >= fixed + 4 else { throw DecodeError("truncated change") }
                var keyLength = 0
                for i in 0..<4 { keyLength = keyLength << 8 | Int(unsafe p[fixed + i]) }
                guard keyLength <= SyncChange.maxItemKeyBytes, p.count >= fixed + 4 + keyLength else { throw DecodeError("truncated item key") }
                let headMax = fixed + 4 + keyLength
                var rd = ByteReader(unsafe Array(UnsafeRawBufferPointer(rebasing: p[0..<headMax])))
                guard let kind = SyncChange.Kind(rawValue: try rd.u8("kind")) else { throw DecodeError("unknown change kind") }
                let wall = try rd.u64("time"), counter = try rd.u32("counter")
                var basis: HLCTimestamp? = nil
                switch try rd.u8("basis flag") {
                case 0: break
                case 1:
                    let bw = try rd.u64("basis time"), bc = try rd.u32("basis counter")
                    basis = HLCTimestamp(wallMillis: bw, counter: bc, device: SyncDeviceID(bytes: try rd.raw(16, "basis device"))!)
                default: throw DecodeError("bad basis flag")
                }
                let itemKey = Array(try rd.blob(max: SyncChange.maxItemKeyBytes, "item key"))
                guard !itemKey.isEmpty else { throw DecodeError("empty item key") }
                let used = headMax - rd.remaining
                guard p.count - used >= 4 else { throw DecodeError("truncated payload length") }
                var n = 0
                for i in 0..<4 { n = n << 8 | Int(unsafe p[used + i]) }
                guard n == p.count - used - 4, n <= SyncChange.maxPayloadBytes else { throw DecodeError("payload length \(n) does not match") }
                guard kind == .put || n == 0 else { throw DecodeError("a deletion with content") }
                let payload = unsafe SecureBytes(copying: UnsafeRawBufferPointer(rebasing: p[(used + 4)...]))
                return SyncChange(kind: kind, time: HLCTimestamp(wallMillis: wall, counter: counter, device: name.device), basis: basis,
                                  itemKey: itemKey, payload: payload)
            } catch {
                throw .malformed("record \(name.path): \(error.reason)")
            }
        }
    }
}
