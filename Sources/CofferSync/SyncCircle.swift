public import CofferCrypto
import CofferModel

/// One epoch of a sync circle: the file `circle/EPOCH-SIGNER.circle` (SyncFormat.md). It lists the
/// member devices with the epoch's circle key sealed to each, the devices removed so far with the
/// last record of theirs that still counts, and every earlier epoch's key sealed under this one's,
/// so a member that joins later reads the records written before it. It is signed by a member of
/// the epoch before it (the founder for epoch 1) and names that epoch's file by its hash.
public struct CircleEpoch: Sendable {
    public static let magic: [UInt8] = Array("CSC1".utf8)
    public static let version: UInt8 = 1
    /// Size of a circle key.
    public static let keyBytes = 32
    /// Most members and removed devices one epoch lists.
    public static let maxDevices = 1024

    public struct Member: Sendable {
        public let device: SyncDeviceID
        /// The epoch's key, sealed to the device's X25519 key.
        public let wrappedKey: [UInt8]
    }

    public let epoch: UInt64
    /// SHA-256 of the previous epoch's file (32 zero bytes for epoch 1).
    public let previous: [UInt8]
    public let signer: SyncDeviceID
    public let members: [Member]
    /// Removed devices and the sequence number of the last record of theirs that counts.
    public let removed: [SyncDeviceID: UInt64]
    /// Earlier epochs' keys sealed under this epoch's key (empty for epoch 1).
    let earlierKeys: [UInt8]
    /// The file's bytes, as signed.
    public let encoded: [UInt8]

    /// SHA-256 of the file: what the next epoch names.
    public var hash: [UInt8] { SHA256.hash(encoded) }
    /// The repository path of this epoch's file.
    public var path: String { Self.path(epoch: epoch, signer: signer) }
    public static func path(epoch: UInt64, signer: SyncDeviceID) -> String {
        let e = String(epoch, radix: 16)
        return "circle/" + String(repeating: "0", count: 16 - e.count) + e + "-" + signer.hex + ".circle"
    }

    public func isMember(_ d: SyncDeviceID) -> Bool { members.contains { $0.device == d } }

    private static func earlierAD(_ epoch: UInt64) -> [UInt8] {
        var w = ByteWriter()
        w.raw(Array("coffer-sync earlier keys".utf8))
        w.u64(epoch)
        return w.take()
    }

    /// Makes and signs an epoch. `keys`: every earlier epoch's key (epoch → key); `key`: this epoch's.
    static func make(epoch: UInt64, previous: [UInt8], signer: SyncDeviceKeys, members: [SyncDevice], removed: [SyncDeviceID: UInt64],
                     key: SecureBytes, earlier: [(UInt64, SecureBytes)]) throws(SyncError) -> CircleEpoch {
        guard !members.isEmpty, members.count <= maxDevices, removed.count <= maxDevices else {
            throw .param("a circle has 1 to \(maxDevices) members")
        }
        var w = ByteWriter()
        w.raw(magic)
        w.u8(version)
        w.u64(epoch)
        w.raw(previous)
        w.raw(signer.id.bytes)
        let sorted = members.sorted { $0.id < $1.id }
        w.u16(UInt16(sorted.count))
        for m in sorted {
            guard let wrapped = SealedBox.seal(key, to: m.boxPublicKey) else { throw .param("device \(m.id.hex) has an unusable box key") }
            w.raw(m.id.bytes)
            w.raw(wrapped)
        }
        w.u16(UInt16(removed.count))
        for (d, seq) in removed.sorted(by: { $0.key < $1.key }) {
            w.raw(d.bytes)
            w.u64(seq)
        }
        if earlier.isEmpty {
            w.blob([UInt8]())
        } else {
            let plain = SecureBytes(count: earlier.count * 40)
            unsafe plain.withUnsafeMutableBytes { p in
                for (i, (e, k)) in earlier.enumerated() {
                    for b in 0..<8 { unsafe p[i * 40 + b] = UInt8((e >> UInt64(56 - 8 * b)) & 0xff) }
                    unsafe k.withUnsafeBytes { kb in unsafe (p.baseAddress! + i * 40 + 8).copyMemory(from: kb.baseAddress!, byteCount: keyBytes) }
                }
            }
            w.blob(AEAD.seal(plain, key: key, ad: earlierAD(epoch)))
        }
        var body = w.take()
        body += signer.sign(body)
        return try decode(body)
    }

    /// Reads an epoch file's format (not its signature or place in the chain: ``SyncCircle`` checks those).
    public static func decode(_ bytes: [UInt8]) throws(SyncError) -> CircleEpoch {
        var r = ByteReader(bytes)
        do throws(DecodeError) {
            guard Array(try r.raw(4, "magic")) == magic else { throw DecodeError("not a Coffer sync circle file") }
            let v = try r.u8("version")
            guard v == version else { throw DecodeError("circle file version \(v) is not supported (this Coffer reads \(version))") }
            let epoch = try r.u64("epoch")
            guard epoch >= 1 else { throw DecodeError("epoch 0") }
            let previous = Array(try r.raw(32, "previous epoch hash"))
            let signer = SyncDeviceID(bytes: try r.raw(16, "signer"))!
            let n = Int(try r.u16("member count"))
            guard n >= 1, n <= maxDevices else { throw DecodeError("\(n) members") }
            var members: [Member] = []
            for _ in 0..<n {
                let d = SyncDeviceID(bytes: try r.raw(16, "member"))!
                guard members.last.map({ $0.device < d }) ?? true else { throw DecodeError("members not in ascending order") }
                members.append(Member(device: d, wrappedKey: Array(try r.raw(keyBytes + SealedBox.overhead, "wrapped key"))))
            }
            let m = Int(try r.u16("removed count"))
            guard m <= maxDevices else { throw DecodeError("\(m) removed devices") }
            var removed: [SyncDeviceID: UInt64] = [:]
            var last: SyncDeviceID? = nil
            for _ in 0..<m {
                let d = SyncDeviceID(bytes: try r.raw(16, "removed device"))!
                guard last.map({ $0 < d }) ?? true else { throw DecodeError("removed devices not in ascending order") }
                last = d
                removed[d] = try r.u64("final sequence number")
            }
            let earlier = Array(try r.blob(max: 40 * 65_536 + AEAD.overhead, "earlier keys"))
            guard (epoch == 1) == earlier.isEmpty else { throw DecodeError("earlier keys where there can be none, or none where there must be") }
            _ = try r.raw(Ed25519.signatureBytes, "signature")
            try r.expectEnd("the circle file")
            return CircleEpoch(epoch: epoch, previous: previous, signer: signer, members: members, removed: removed,
                               earlierKeys: earlier, encoded: bytes)
        } catch {
            throw .malformed("circle file: \(error.reason)")
        }
    }

    /// True if the signature verifies under `signer`'s key.
    func isSigned(by signer: SyncDevice) -> Bool {
        let body = Array(encoded.dropLast(Ed25519.signatureBytes))
        return Ed25519.verify(signature: Array(encoded.suffix(Ed25519.signatureBytes)), message: body, publicKey: signer.signingPublicKey)
    }

    /// This epoch's key and every earlier one's, opened with a member's keys.
    func openKeys(with keys: SyncDeviceKeys) throws(SyncError) -> [UInt64: SecureBytes] {
        guard let mine = members.first(where: { $0.device == keys.id }) else {
            throw .notAMember("this device is not a member of circle epoch \(epoch)")
        }
        let key: SecureBytes
        do { key = try SealedBox.open(mine.wrappedKey[...], publicKey: keys.boxPublicKey, secretKey: keys.boxSecretKey) } catch {
            throw .forged("circle epoch \(epoch)'s key for this device does not open")
        }
        var out: [UInt64: SecureBytes] = [epoch: key]
        guard !earlierKeys.isEmpty else { return out }
        let plain: SecureBytes
        do { plain = try AEAD.open(earlierKeys[...], key: key, ad: Self.earlierAD(epoch)) } catch {
            throw .forged("circle epoch \(epoch)'s earlier keys do not open")
        }
        guard plain.count % 40 == 0 else { throw .malformed("circle epoch \(epoch)'s earlier keys are not whole") }
        unsafe plain.withUnsafeBytes { p in
            for i in 0..<(p.count / 40) {
                var e: UInt64 = 0
                for b in 0..<8 { e = e << 8 | UInt64(unsafe p[i * 40 + b]) }
                out[e] = unsafe SecureBytes(copying: UnsafeRawBufferPointer(rebasing: p[(i * 40 + 8)..<(i * 40 + 40)]))
            }
        }
        return out
    }
}

/// The circle as the epoch files in a sync directory make it (SyncFormat.md, "The circle"): the
/// chain of epochs from the first, each signed by a member of the one before and naming it by hash;
/// where two members wrote the same epoch at once, the file whose signer sorts first is the epoch
/// and the other is ignored (its writer sees that and tries again on top).
public struct SyncCircle: Sendable {
    /// The chain, epoch 1 first.
    public let epochs: [CircleEpoch]
    /// Every device file that verified, by id.
    public let devices: [SyncDeviceID: SyncDevice]

    public var current: CircleEpoch { epochs[epochs.count - 1] }

    /// Follows the chain through `epochFiles` (path → bytes). `first`: the hash of the first epoch of
    /// the circle this device belongs to (fixed by the pairing or the founding); `pinned`: the newest
    /// epoch it accepted, number and hash. With either, the chain is the one that leads to them,
    /// whatever else the directory holds: a competing first epoch, a fork below the pinned epoch, or a
    /// rewind is never followed (the files are listed in `rejected`), and a directory without that
    /// chain is refused naming the circle's fingerprint. Above the pinned epoch, where two members
    /// wrote the same epoch at once, the valid file whose signer sorts first is the epoch. With
    /// neither (a directory read before any pairing), the chain is the one sort order gives, and
    /// nothing may trust it. Invalid files are skipped and reported in `rejected`.
    public static func resolve(epochFiles: [String: [UInt8]], devices: [SyncDeviceID: SyncDevice],
                               pinned: (epoch: UInt64, hash: [UInt8])?, first: [UInt8]? = nil) throws(SyncError) -> (circle: SyncCircle, rejected: [String]) {
        var byEpoch: [UInt64: [CircleEpoch]] = [:], byHash: [[UInt8]: CircleEpoch] = [:]
        var rejected: [String] = []
        for (path, bytes) in epochFiles.sorted(by: { $0.key < $1.key }) {
            guard let e = try? CircleEpoch.decode(bytes), e.path == path else { rejected.append(path); continue }
            byEpoch[e.epoch, default: []].append(e)
            byHash[e.hash] = e
        }
        /// True if `e` may follow `prev` (nil: `e` is a first epoch).
        func follows(_ e: CircleEpoch, _ prev: CircleEpoch?) -> Bool {
            guard let signer = devices[e.signer], e.isSigned(by: signer) else { return false }
            guard e.members.allSatisfy({ devices[$0.device] != nil }) else { return false }
            if let prev {
                return e.epoch == prev.epoch + 1 && e.previous == prev.hash && prev.isMember(e.signer)
                    && prev.removed.allSatisfy { e.removed[$0.key] == $0.value }
            }
            return e.epoch == 1 && e.previous == [UInt8](repeating: 0, count: 32) && e.isMember(e.signer) && e.removed.isEmpty
        }
        let circleName = first.map { "circle \(fingerprint(firstEpochHash: $0))" } ?? "this device's circle"
        var chain: [CircleEpoch] = []
        if pinned != nil || first != nil {
            // Anchored: back from the pinned epoch (or from the first) by the hashes each epoch names.
            if let pinned, pinned.epoch >= 1 {
                guard var e = byHash[pinned.hash], e.epoch == pinned.epoch else {
                    throw .rolledBack("the remote does not hold epoch \(pinned.epoch) of \(circleName), which this device already saw "
                                      + "(the remote went back or was rewritten)")
                }
                chain = [e]
                while e.epoch > 1 {
                    guard let prev = byHash[e.previous], prev.epoch == e.epoch - 1 else {
                        throw .rolledBack("the remote lacks an epoch of \(circleName) below epoch \(e.epoch) (it was rewritten)")
                    }
                    chain.insert(prev, at: 0)
                    e = prev
                }
            } else if let first {
                guard let e = byHash[first], e.epoch == 1 else {
                    throw .notAMember("the remote does not hold \(circleName) (its first epoch is missing)")
                }
                chain = [e]
            }
            if let first, chain[0].hash != first {
                throw .forged("the remote's circle is not \(circleName): its chain starts at another first epoch (circle \(fingerprint(firstEpochHash: chain[0].hash)))")
            }
            for (i, e) in chain.enumerated() where !follows(e, i == 0 ? nil : chain[i - 1]) {
                throw .forged("epoch \(e.epoch) of \(circleName) does not verify (signature, signer or members)")
            }
        } else if let e = (byEpoch[1] ?? []).filter({ follows($0, nil) }).sorted(by: { $0.signer < $1.signer }).first {
            chain = [e]
        }
        guard !chain.isEmpty else { throw .notAMember("the sync directory holds no valid circle") }
        // Beyond what this device saw: members' changes, the first in signer order where two collide.
        while let candidates = byEpoch[chain[chain.count - 1].epoch + 1],
              let next = candidates.filter({ follows($0, chain[chain.count - 1]) }).sorted(by: { $0.signer < $1.signer }).first {
            chain.append(next)
        }
        let kept = Set(chain.map(\.path))
        rejected += byEpoch.values.flatMap { $0 }.map(\.path).filter { !kept.contains($0) }.sorted()
        return (SyncCircle(epochs: chain, devices: devices), rejected)
    }

    /// The epoch `n` (1-based), if the chain has it.
    public func epoch(_ n: UInt64) -> CircleEpoch? { n >= 1 && n <= UInt64(epochs.count) ? epochs[Int(n) - 1] : nil }

    /// True if a record from `device` with sequence number `seq`, sealed in epoch `n`, counts: the
    /// device was a member of that epoch and, if it has since been removed, the record is not newer
    /// than its last one that counts.
    public func admits(device: SyncDeviceID, seq: UInt64, epoch n: UInt64) -> Bool {
        guard let e = epoch(n), e.isMember(device) else { return false }
        if let final = current.removed[device] { return seq <= final }
        return true
    }

    /// Every epoch key this device can open (from the latest epoch that lists it).
    public func keys(for keys: SyncDeviceKeys) throws(SyncError) -> [UInt64: SecureBytes] {
        guard let e = epochs.last(where: { $0.isMember(keys.id) }) else {
            throw .notAMember("this device (\(keys.id.hex)) is not a member of the circle")
        }
        if current.removed[keys.id] != nil || !current.isMember(keys.id) {
            throw .notAMember("this device (\(keys.id.hex)) was removed from the circle at an epoch after \(e.epoch)")
        }
        return try e.openKeys(with: keys)
    }

    /// A new circle founded by `keys`' device: epoch 1 with only it, and the circle key.
    public static func found(by keys: SyncDeviceKeys, device: SyncDevice) throws(SyncError) -> CircleEpoch {
        try CircleEpoch.make(epoch: 1, previous: [UInt8](repeating: 0, count: 32), signer: keys, members: [device], removed: [:],
                             key: SecureBytes.random(count: CircleEpoch.keyBytes), earlier: [])
    }

    /// The next epoch, signed by `keys` (a current member): the members `adding` added, the devices in
    /// `removing` (with the last sequence number of theirs that counts) taken out. Removing rotates the
    /// key (a removed device reads nothing written after); adding keeps it.
    public func next(signedBy keys: SyncDeviceKeys, adding: [SyncDevice] = [], removing: [SyncDeviceID: UInt64] = [:]) throws(SyncError) -> CircleEpoch {
        guard current.isMember(keys.id) else { throw .notAMember("only a member of the circle can change it") }
        let all = try self.keys(for: keys)
        var memberIDs = Set(current.members.map(\.device))
        for d in adding {
            guard current.removed[d.id] == nil else { throw .param("device \(d.id.hex) was removed from this circle; it must join with new keys") }
            memberIDs.insert(d.id)
        }
        for d in removing.keys {
            guard memberIDs.contains(d) else { throw .param("device \(d.hex) is not a member") }
            memberIDs.remove(d)
        }
        guard !memberIDs.isEmpty else { throw .param("a circle keeps at least one member") }
        var known = devices
        for d in adding { known[d.id] = d }
        let members = try memberIDs.map { (id: SyncDeviceID) throws(SyncError) -> SyncDevice in
            guard let d = known[id] else { throw .param("device \(id.hex) has no device file") }
            return d
        }
        var removed = current.removed
        for (d, s) in removing { removed[d] = s }
        let key = removing.isEmpty ? all[current.epoch]! : SecureBytes.random(count: CircleEpoch.keyBytes)
        let earlier = all.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
        return try CircleEpoch.make(epoch: current.epoch + 1, previous: current.hash, signer: keys, members: members, removed: removed,
                                    key: key, earlier: earlier)
    }
}
