import CofferCrypto
import CofferModel
import CofferSync
import CofferTestSupport
import Foundation
import Testing

/// The sync formats (SyncFormat.md): clocks, device files, circle epochs and records, each refused
/// when altered, moved or written by a device outside the circle; and the article's vectors.
@Suite struct SyncFormatTests {
    static func id(_ b: UInt8) -> SyncDeviceID { SyncDeviceID(bytes: [UInt8](repeating: b, count: 16))! }

    @Test func hybridClockOrdersEventsAndFollowsOtherDevices() {
        var a = HybridLogicalClock(device: Self.id(1))
        let t1 = a.tick(now: 1000), t2 = a.tick(now: 1000), t3 = a.tick(now: 999)
        #expect(t1 < t2 && t2 < t3, "the clock never goes back, even when the wall clock does")
        #expect(t3.wallMillis == 1000 && t3.counter == 2)
        var b = HybridLogicalClock(device: Self.id(2))
        b.observe(HLCTimestamp(wallMillis: 5000, counter: 7, device: Self.id(1)))
        let t4 = b.tick(now: 10)
        #expect(t4 > HLCTimestamp(wallMillis: 5000, counter: 7, device: Self.id(1)), "a reading follows every one observed")
        #expect(HLCTimestamp(wallMillis: 1, counter: 0, device: Self.id(1)) < HLCTimestamp(wallMillis: 1, counter: 0, device: Self.id(2)),
                "equal clocks are ordered by device")
    }

    @Test func deviceFilesAreSelfSignedAndNamedByTheirKeys() throws {
        let keys = SyncDeviceKeys.generate()
        let device = SyncDevice(keys: keys, name: "laptop", createdMillis: 42)
        let bytes = device.encoded(signedWith: keys)
        #expect(try SyncDevice.decode(bytes, expected: keys.id) == device)
        var altered = bytes
        altered[10] ^= 1
        #expect(throws: SyncError.self) { try SyncDevice.decode(altered) }
        #expect(throws: SyncError.self) { try SyncDevice.decode(bytes, expected: SyncDeviceKeys.generate().id) }
        #expect(throws: SyncError.self) { try SyncDevice.decode(Array(bytes.dropLast())) }
    }

    @Test func recordsOpenOnlyWhereTheyWereWrittenUnderTheirKey() throws {
        let keys = SyncDeviceKeys.generate()
        let writer = SyncDevice(keys: keys, name: "a", createdMillis: 1)
        let key = SecureBytes.random(count: 32)
        let change = SyncChange(kind: .put, time: HLCTimestamp(wallMillis: 7, counter: 1, device: keys.id), basis: nil,
                                itemKey: Array("genp/g/svc/acct".utf8), payload: secure(Array("s3cret".utf8)))
        let sealed = try SyncRecord.seal(change, seq: 3, epoch: 1, key: key, keys: keys)
        #expect(sealed.name.path == "records/\(keys.id.hex)/00000000000000/0000000000000003.record")
        #expect(!containsSubsequence(sealed.bytes, Array("s3cret".utf8)) && !containsSubsequence(sealed.bytes, Array("genp/g".utf8)),
                "neither the content nor the item key is readable in the file")
        let opened = try SyncRecord.open(sealed.bytes, name: sealed.name, writer: writer, key: key)
        #expect(opened.itemKey == change.itemKey && opened.time == change.time && opened.kind == .put)
        #expect(opened.payload.withUnsafeBytes { Array($0) } == Array("s3cret".utf8))
        // Moved to another sequence number, or to another device's directory: refused.
        #expect(throws: SyncError.self) { try SyncRecord.open(sealed.bytes, name: SyncRecordName(device: keys.id, seq: 4), writer: writer, key: key) }
        let other = SyncDeviceKeys.generate()
        #expect(throws: SyncError.self) {
            try SyncRecord.open(sealed.bytes, name: SyncRecordName(device: other.id, seq: 3),
                                writer: SyncDevice(keys: other, name: "b", createdMillis: 1), key: key)
        }
        // Any byte changed: refused.
        for i in stride(from: 0, to: sealed.bytes.count, by: 7) {
            var b = sealed.bytes
            b[i] ^= 0x40
            #expect(throws: SyncError.self) { try SyncRecord.open(b, name: sealed.name, writer: writer, key: key) }
        }
        #expect(throws: SyncError.self) { try SyncRecord.open(sealed.bytes, name: sealed.name, writer: writer, key: SecureBytes.random(count: 32)) }
    }

    /// SyncFormat.md's vectors: fixed device keys give the stated id, and the stated
    /// record file opens under the stated circle key to the stated change.
    @Test func theArticlesVectorsHold() throws {
        let blocks = specVectorBlocks("Sources/CofferSync/CofferSync.docc/SyncFormat.md")
        #expect(blocks.count >= 2, "SyncFormat.md has its vectors")
        for v in blocks {
            let seed = try #require(v["ed25519-seed"].flatMap(hexDecode)), box = try #require(v["x25519-secret"].flatMap(hexDecode))
            let keys = try SyncDeviceKeys.restore(ed25519Seed: secure(seed), x25519SecretKey: secure(box))
            #expect(keys.id.hex == v["device-id"])
            let device = SyncDevice(keys: keys, name: v["name"] ?? "", createdMillis: UInt64(v["created"] ?? "") ?? 0)
            #expect(Hex.encode(device.encoded(signedWith: keys)) == v["device-file"], "Ed25519 signatures are deterministic")
            if let record = v["record"].flatMap(hexDecode), let key = v["circle-key"].flatMap(hexDecode) {
                let name = SyncRecordName(device: keys.id, seq: try #require(UInt64(v["seq"] ?? "")))
                #expect(name.path == v["path"])
                let change = try SyncRecord.open(record, name: name, writer: device, key: secure(key))
                #expect(Hex.encode(change.itemKey) == v["item-key"])
                #expect(Hex.encode(change.payload.withUnsafeBytes { Array($0) }) == v["payload"])
                #expect("\(change.time.wallMillis).\(change.time.counter)" == v["time"])
                #expect(change.kind == (v["kind"] == "delete" ? .delete : .put))
            }
            if let seen = v["seen"].flatMap(hexDecode), let applied = v["seen-applied"] {
                var a: [SyncDeviceID: UInt64] = [:]
                for pair in applied.split(separator: " ") {
                    let kv = pair.split(separator: "=")
                    a[try #require(SyncDeviceID(hex: String(kv[0])))] = UInt64(kv[1])
                }
                #expect(Hex.encode(SyncSeen(device: keys.id, applied: a).encoded(signedWith: keys)) == Hex.encode(seen))
                #expect(try SyncSeen.decode(seen, writer: device).applied == a)
                var bad = seen
                bad[10] ^= 1
                #expect(throws: SyncError.self) { try SyncSeen.decode(bad, writer: device) }
            }
            if let cpBytes = v["checkpoint"].flatMap(hexDecode), let key = v["circle-key"].flatMap(hexDecode) {
                let cp = try SyncCheckpoint.decode(cpBytes, writer: device, key: secure(key))
                #expect(cp.path == "checkpoints/\(keys.id.hex).checkpoint")
                #expect("\(cp.epoch)" == v["checkpoint-epoch"] && "\(cp.through)" == v["checkpoint-through"])
                #expect(cp.kept.map { "\($0)" }.joined(separator: " ") == v["checkpoint-kept"])
                let bases = cp.bases.flatMap { k, ts in ts.map { "\(k)=\($0.wallMillis).\($0.counter)" } }.sorted().joined(separator: " ")
                #expect(bases == v["checkpoint-bases"] && cp.bases.values.allSatisfy { $0.allSatisfy { $0.device == keys.id } })
                for i in stride(from: 0, to: cpBytes.count, by: 5) {
                    var b = cpBytes
                    b[i] ^= 0x40
                    #expect(throws: SyncError.self) { try SyncCheckpoint.decode(b, writer: device, key: secure(key)) }
                }
            }
        }
    }

    @Test func stateRoundTripsAndRefusesOtherVersions() throws {
        var s = SyncState()
        s.pinnedEpoch = 3
        s.pinnedHash = [UInt8](repeating: 9, count: 32)
        s.nextSeq = 12
        s.applied[Self.id(1)] = 5
        let t = HLCTimestamp(wallMillis: 9, counter: 1, device: Self.id(1))
        s.versions["6b"] = SyncState.Version(time: t, record: SyncRecordName(device: Self.id(1), seq: 5), deleted: false)
        s.bases["6b"] = [HLCTimestamp(wallMillis: 8, counter: 0, device: Self.id(2))]
        s.conflicts.append(SyncState.Conflict(itemKey: [0x6b], winner: t, loser: SyncRecordName(device: Self.id(2), seq: 1),
                                              loserTime: HLCTimestamp(wallMillis: 8, counter: 0, device: Self.id(2)), loserDeleted: true))
        s.remoteHead = "abc"
        // Format 3 ends in the first epoch's hash (a blob), the answered pairings (u16 count), the
        // pairing flag and the restores (u32 count): 11 bytes when all are empty. A version-1 state (before compaction) reads as one
        // that saw no checkpoint, a version-2 one (before pairing) as one with no first epoch pinned,
        // no pairing and none answered.
        var v1 = Array(s.encoded().dropLast(11 + 4))
        v1[4] = 1
        #expect(try SyncState.decode(v1) == s)
        s.checkpoints[Self.id(2)] = 9
        var v2 = Array(s.encoded().dropLast(11))
        v2[4] = 2
        #expect(try SyncState.decode(v2) == s)
        #expect(try SyncState.decode(s.encoded()) == s)
        // A joiner's pairing and an approver's answered sessions round-trip.
        s.pinnedFirst = [UInt8](repeating: 7, count: 32)
        s.answered = [[UInt8](repeating: 1, count: 16), [UInt8](repeating: 2, count: 16)]
        let phone = SyncDeviceKeys.generate()
        let (joining, _) = try SyncPairing.start(code: try #require(SyncPairingCode.parse("abcd-efgh-ijkl")),
                                                 deviceFile: SyncDevice(keys: phone, name: "phone", createdMillis: 1).encoded(signedWith: phone))
        s.joining = joining
        s.restoring["6b"] = HLCTimestamp(wallMillis: 8, counter: 0, device: Self.id(2))
        let decoded = try SyncState.decode(s.encoded())
        #expect(decoded == s && decoded.joining?.code.text == "ABCD-EFGH-IJKL" && decoded.joining?.stage == .requested)
        var other = s.encoded()
        other[4] = 4
        #expect(throws: SyncError.self) { try SyncState.decode(other) }
        #expect(throws: SyncError.self) { try SyncState.decode(Array(s.encoded().dropLast())) }
    }
}
