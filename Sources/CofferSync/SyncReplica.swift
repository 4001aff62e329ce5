public import CofferCrypto
import CofferModel
import CofferSystem
import Glibc

/// One device's view of a sync directory (a git working tree, or a folder a file-sync engine
/// replicates): it writes this device's records and device file there, reads everyone's, and
/// decides which version of each item wins (SyncFormat.md, "Merging"). It never touches the
/// keychain: ``pull()`` says what to apply, and the caller applies that and ``commit(_:)``s the new
/// state together, so a crash leaves both as they were or both as they became.
public final class SyncReplica {
    public let directory: String
    public let keys: SyncDeviceKeys
    public internal(set) var state: SyncState

    /// What a pull found.
    public struct Pull: Sendable {
        /// The changes to apply to the keychain, in order: each the new winning version of its item.
        public var apply: [SyncChange] = []
        /// Conflicts found by this pull (also in ``state``'s list once committed).
        public var conflicts: [SyncState.Conflict] = []
        /// Records refused (forged, malformed, from outside the circle), with why; nothing of theirs is applied.
        public var refused: [(path: String, error: SyncError)] = []
        /// Devices whose next record is missing while later ones are present (applied once it arrives).
        public var waiting: [SyncDeviceID: UInt64] = [:]
        /// The state to commit with the changes.
        public var state: SyncState
    }

    public init(directory: String, keys: SyncDeviceKeys, state: SyncState) {
        self.directory = directory
        self.keys = keys
        self.state = state
    }

    // MARK: Files

    func path(_ relative: String) -> String { directory + "/" + relative }

    func entries(_ relative: String) -> [String] {
        guard let fd = try? FileDescriptor.open(path(relative), O_RDONLY | O_DIRECTORY | O_CLOEXEC) else { return [] }
        return fd.directoryEntries()
    }

    func read(_ relative: String, max: Int = SyncChange.maxPayloadBytes + 4096) throws(SyncError) -> [UInt8] {
        do { return try Files.read(path(relative), maxBytes: max) } catch { throw .transport("cannot read \(relative): \(error)") }
    }

    /// Removes a file this device may remove (its own record, compacted) and its directory once empty.
    func remove(_ relative: String) throws(SyncError) {
        let full = path(relative)
        if unsafe unlink(full) != 0 && errno != ENOENT { throw .transport("cannot remove \(relative): errno \(errno)") }
        unsafe rmdir(Files.directoryName(full))   // only succeeds once the shard is empty
    }

    func write(_ relative: String, _ bytes: [UInt8]) throws(SyncError) {
        let full = path(relative)
        do {
            try Files.makePrivateDirectory(Files.directoryName(full), mode: 0o755)
            try Files.writeAtomically(full, bytes, mode: 0o644)
        } catch {
            throw .transport("cannot write \(relative): \(error)")
        }
    }

    /// Every device file that verifies, by id (invalid ones are left out and reported by ``pull()``).
    func loadDevices() -> (devices: [SyncDeviceID: SyncDevice], rejected: [(String, SyncError)]) {
        var out: [SyncDeviceID: SyncDevice] = [:], rejected: [(String, SyncError)] = []
        for name in entries("devices") where name.hasSuffix(".device") {
            let rel = "devices/" + name
            do throws(SyncError) {
                guard let id = SyncDeviceID(hex: String(name.dropLast(7))) else { throw .malformed("\(rel) is not named by a device id") }
                out[id] = try SyncDevice.decode(try read(rel, max: 4096), expected: id)
            } catch {
                rejected.append((rel, error))
            }
        }
        return (out, rejected)
    }

    /// The circle as the directory holds it, checked against the epoch this device trusts.
    public func circle() throws(SyncError) -> SyncCircle {
        // Device and epoch files are never rewritten, only added: the names (and the epoch this device
        // trusts) say whether the chain must be followed again.
        let key = entries("devices") + ["/"] + entries("circle") + ["/\(state.pinnedEpoch)", Hex.encode(state.pinnedHash)]
        if let cached = cachedCircle, cached.key == key { return cached.circle }
        let devices = loadDevices().devices
        var files: [String: [UInt8]] = [:]
        for name in entries("circle") where name.hasSuffix(".circle") {
            files["circle/" + name] = try read("circle/" + name, max: 1 << 20)
        }
        let c = try SyncCircle.resolve(epochFiles: files, devices: devices, pinned: state.pinned).circle
        cachedCircle = (key, c)
        return c
    }

    private var cachedCircle: (key: [String], circle: SyncCircle)? = nil

    /// The sequence numbers of `device`'s records in the directory, ascending.
    func sequenceNumbers(of device: SyncDeviceID) -> [UInt64] {
        var seqs: [UInt64] = []
        for shardName in entries("records/" + device.hex) {
            guard let shard = SyncRecordName.shard(directoryName: shardName) else { continue }
            for f in entries("records/\(device.hex)/\(shardName)") {
                if let s = SyncRecordName.seq(fileName: f), s >> 8 == shard { seqs.append(s) }
            }
        }
        return seqs.sorted()
    }

    /// Makes the state the caller has durably stored with the changes it applied the current one.
    public func commit(_ newState: SyncState) { state = newState }

    // MARK: The circle

    /// Founds a circle in an empty directory: this device's file and epoch 1 with only it.
    public static func found(directory: String, keys: SyncDeviceKeys, name: String, now: UInt64) throws(SyncError) -> SyncReplica {
        let r = SyncReplica(directory: directory, keys: keys, state: SyncState())
        guard r.entries("circle").isEmpty else { throw .param("\(directory) already holds a circle: join it instead") }
        let device = SyncDevice(keys: keys, name: name, createdMillis: now)
        try r.write(device.path, device.encoded(signedWith: keys))
        let first = try SyncCircle.found(by: keys, device: device)
        try r.write(first.path, first.encoded)
        r.state.pinnedEpoch = 1
        r.state.pinnedHash = first.hash
        return r
    }

    /// Asks to join the circle in `directory`: writes this device's file and returns its pairing
    /// code, which a member passes to ``approve(code:)``. The circle this device will trust is the
    /// one it sees now (its first epoch pinned by hash).
    public static func requestJoin(directory: String, keys: SyncDeviceKeys, name: String, now: UInt64) throws(SyncError) -> (replica: SyncReplica, code: String) {
        let r = SyncReplica(directory: directory, keys: keys, state: SyncState())
        let c = try r.circle()
        r.state.pinnedEpoch = 1
        r.state.pinnedHash = c.epochs[0].hash
        let device = SyncDevice(keys: keys, name: name, createdMillis: now)
        try r.write(device.path, device.encoded(signedWith: keys))
        return (r, device.pairingCode)
    }

    /// True once a member has approved this device (the circle's current epoch lists it).
    public func isMember() throws(SyncError) -> Bool { try circle().current.isMember(keys.id) }

    /// Adds the device whose pairing code is `code` (a member only): writes the next epoch with the
    /// circle key sealed to it. Returns the device, whose name and code the member should compare.
    @discardableResult
    public func approve(code: String) throws(SyncError) -> SyncDevice {
        guard let wanted = SyncDevice.normalizedPairingCode(code) else { throw .param("\(code) is not a pairing code (ABCD-EFGH)") }
        let c = try circle()
        let candidates = c.devices.values.filter { $0.pairingCode == wanted && !c.current.isMember($0.id) && c.current.removed[$0.id] == nil }
        guard candidates.count == 1, let device = candidates.first else {
            throw .param(candidates.isEmpty ? "no device waiting to join has the code \(wanted)"
                                            : "\(candidates.count) waiting devices have the code \(wanted); ask each to join again")
        }
        let e = try c.next(signedBy: keys, adding: [device])
        try write(e.path, e.encoded)
        state.pinnedEpoch = e.epoch
        state.pinnedHash = e.hash
        return device
    }

    /// Removes `device` from the circle (a member only) and rotates the circle key: records it
    /// writes afterwards are refused and it cannot open anything written afterwards. Its records up
    /// to the last one this device applied still count.
    public func remove(device: SyncDeviceID) throws(SyncError) {
        guard device != keys.id else { throw .param("a device leaves by being removed from another member") }
        let c = try circle()
        let e = try c.next(signedBy: keys, removing: [device: state.applied[device] ?? 0])
        try write(e.path, e.encoded)
        state.pinnedEpoch = e.epoch
        state.pinnedHash = e.hash
    }

    // MARK: Changes

    private static func keyHex(_ k: [UInt8]) -> String { Hex.encode(k) }

    /// Writes this device's record of a local change to `itemKey` (a new version, or a deletion with
    /// `payload` nil) at wall-clock time `now` (milliseconds), and makes it the item's winning version.
    @discardableResult
    public func record(itemKey: [UInt8], payload: SecureBytes?, now: UInt64) throws(SyncError) -> SyncRecordName {
        try record([(itemKey, payload)], now: now)[0]
    }

    /// Writes the records of several local changes at once (the first sync of a keychain's items):
    /// each file written and renamed into place, then one `syncfs` makes them all durable before this
    /// returns, so the caller may then commit the state that counts them.
    @discardableResult
    public func record(_ changes: [(itemKey: [UInt8], payload: SecureBytes?)], now: UInt64) throws(SyncError) -> [SyncRecordName] {
        let c = try circle()
        let all = try c.keys(for: keys)
        let epoch = c.current.epoch
        var s = state
        var clock = HybridLogicalClock(device: keys.id, wallMillis: s.clockWall, counter: s.clockCounter)
        var names: [SyncRecordName] = []
        for (itemKey, payload) in changes {
            let time = clock.tick(now: now)
            let k = Self.keyHex(itemKey)
            let basis = s.versions[k]?.time
            let change = SyncChange(kind: payload == nil ? .delete : .put, time: time, basis: basis, itemKey: itemKey,
                                    payload: payload ?? SecureBytes(count: 0))
            let sealed = try SyncRecord.seal(change, seq: s.nextSeq, epoch: epoch, key: all[epoch]!, keys: keys)
            try writeUnsynced(sealed.name.path, sealed.bytes)
            s.nextSeq += 1
            s.applied[keys.id] = sealed.name.seq
            if let basis { s.bases[k, default: []].insert(basis) }
            s.versions[k] = SyncState.Version(time: time, record: sealed.name, deleted: payload == nil)
            names.append(sealed.name)
        }
        s.clockWall = clock.wallMillis
        s.clockCounter = clock.counter
        do { try Files.syncFilesystem(of: directory) } catch {
            throw .transport("cannot make the records durable: \(error)")
        }
        state = s
        return names
    }

    /// Writes a new file under a temporary name and renames it into place (a reader or file-sync
    /// engine never sees half a record); durability comes from the caller's `syncfs`.
    private func writeUnsynced(_ relative: String, _ bytes: [UInt8]) throws(SyncError) {
        let full = path(relative), tmp = full + ".tmp"
        do {
            try Files.makePrivateDirectory(Files.directoryName(full), mode: 0o755)
            unsafe unlink(tmp)
            let fd = try FileDescriptor.open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode: 0o644)
            unsafe try bytes.withUnsafeBytes { b in Result { () throws(SystemError) in unsafe try fd.writeAll(b, path: tmp) } }.get()
            try fd.close(path: tmp)
            _ = try Syscall.retrying("rename", full) { unsafe rename(tmp, full) }
        } catch {
            throw .transport("cannot write \(relative): \(error)")
        }
    }

    /// Reads every record not yet applied and decides (SyncFormat.md, "Merging"): returns the
    /// changes to apply and the state to commit with them. Changes nothing itself. Throws
    /// `rolledBack` if a record this device already applied is gone (the directory went back).
    /// `progress` is called with the records read, verified and opened so far and the records that
    /// arrived (those past what this device applied), first with 0, then after each record, its
    /// counts never going down; a stream that stops early (a refused or missing record) leaves done short.
    public func pull(progress: (_ done: Int, _ total: Int) -> Void = { _, _ in }) throws(SyncError) -> Pull {
        let c = try circle()
        let keysByEpoch = try c.keys(for: keys)
        var result = Pull(state: state)
        result.refused = loadDevices().rejected.map { ($0.0, $0.1) }
        var incoming: [(SyncRecordName, SyncChange)] = []
        var newBases: [[String: Set<HLCTimestamp>]] = [], covered: [SyncDeviceID: UInt64] = [:]
        // Every writer with records, a checkpoint, or records this device applied (a directory gone whole went back too).
        var writers = Set(entries("records").compactMap { SyncDeviceID(hex: $0) })
        writers.formUnion(entries("checkpoints").compactMap { $0.hasSuffix(".checkpoint") ? SyncDeviceID(hex: String($0.dropLast(11))) : nil })
        writers.formUnion(state.applied.filter { $0.value > 0 }.keys)
        let sorted = writers.sorted()
        let seqsOf = sorted.map { sequenceNumbers(of: $0) }
        let arrived = zip(sorted, seqsOf).reduce(0) { n, w in n + w.1.count(where: { $0 > state.applied[w.0] ?? 0 }) }
        var opened = 0
        progress(0, arrived)
        for (device, seqs) in zip(sorted, seqsOf) {
            let done = state.applied[device] ?? 0
            // The writer's checkpoint (SyncFormat.md, "Compaction"): records up to `through` not kept were removed on purpose.
            let pinnedThrough = state.checkpoints[device] ?? 0
            var cp: SyncCheckpoint? = nil
            do throws(SyncError) { cp = try checkpoint(of: device, c, keysByEpoch) } catch {
                // One this device relied on and can no longer verify went back or was altered: refuse the pull.
                if pinnedThrough > 0 { throw error }
                result.refused.append((SyncCheckpoint.path(device), error))
            }
            let through = cp?.through ?? 0
            guard through >= pinnedThrough else {
                throw .rolledBack("the checkpoint of device \(device.hex) went back (through \(through), this device saw \(pinnedThrough))")
            }
            let kept = cp?.kept ?? []
            let keptSet = Set(kept)
            func expected(_ s: UInt64) -> Bool { s > through || keptSet.contains(s) }
            // Every record already applied and not removed by a checkpoint must still be there.
            let mustHave = kept.count(where: { $0 <= done }) + Int(done > through ? done - through : 0)
            if seqs.count(where: { $0 <= done && expected($0) }) != mustHave {
                throw .rolledBack("records of device \(device.hex) up to \(done) were applied here but are no longer all in the sync directory")
            }
            // A removed device still holds its keys: the bases of its checkpoint are never taken (they
            // would decide other devices' items and their compaction); its own records stay bounded by
            // its final sequence number.
            if let cp, through > pinnedThrough, c.current.removed[device] == nil { newBases.append(cp.bases) }
            var pendingKept = kept.filter { $0 > done }[...]
            var next = max(done, through) &+ 1
            for s in seqs where s > done && expected(s) {
                let want = pendingKept.first ?? next
                guard s == want else { result.waiting[device] = want; break }
                let name = SyncRecordName(device: device, seq: s)
                do throws(SyncError) {
                    let bytes = try read(name.path)
                    let epoch = try SyncRecord.epoch(of: bytes)
                    guard let writer = c.devices[device], c.admits(device: device, seq: s, epoch: epoch) else {
                        throw .forged("record \(name.path) is from a device that was not in the circle at epoch \(epoch)")
                    }
                    guard let key = keysByEpoch[epoch] else { throw .forged("record \(name.path) names epoch \(epoch), which this device has no key for") }
                    incoming.append((name, try SyncRecord.open(bytes, name: name, writer: writer, key: key)))
                    opened += 1
                    progress(min(opened, arrived), arrived)
                } catch {
                    // A refused record stops its device's stream: later ones wait until a good copy appears.
                    result.refused.append((name.path, error))
                    result.waiting[device] = s
                    break
                }
                if pendingKept.isEmpty { next += 1 } else { pendingKept.removeFirst() }
            }
            if pendingKept.isEmpty && through > done { covered[device] = through }
            if let cp { result.state.checkpoints[device] = max(pinnedThrough, cp.through) }
        }
        // Apply in clock order, so a version and the one written on top of it arrive in that order.
        incoming.sort { $0.1.time < $1.1.time }
        var s = result.state
        // The bases a new checkpoint carries count before any record: the versions its removed records superseded.
        for carried in newBases { for (k, b) in carried { s.bases[k, default: []].formUnion(b) } }
        var clock = HybridLogicalClock(device: keys.id, wallMillis: s.clockWall, counter: s.clockCounter)
        for (name, change) in incoming {
            clock.observe(change.time)
            s.applied[name.device] = max(s.applied[name.device] ?? 0, name.seq)
            let k = Self.keyHex(change.itemKey)
            if let b = change.basis { s.bases[k, default: []].insert(b) }
            let known = s.bases[k] ?? []
            let incomingVersion = SyncState.Version(time: change.time, record: name, deleted: change.kind == .delete)
            guard let current = s.versions[k] else {
                s.versions[k] = incomingVersion
                result.apply.append(change)
                continue
            }
            if change.time > current.time {
                if !known.contains(current.time) {
                    let lost = SyncState.Conflict(itemKey: change.itemKey, winner: change.time, loser: current.record,
                                                  loserTime: current.time, loserDeleted: current.deleted)
                    result.conflicts.append(lost)
                }
                s.versions[k] = incomingVersion
                result.apply.append(change)
            } else if change.time < current.time, !known.contains(change.time) {
                result.conflicts.append(SyncState.Conflict(itemKey: change.itemKey, winner: current.time, loser: name,
                                                           loserTime: change.time, loserDeleted: change.kind == .delete))
            }
        }
        // A writer's checkpoint covers every sequence number up to its `through` once its kept records are applied.
        for (device, through) in covered { s.applied[device] = max(s.applied[device] ?? 0, through) }
        s.clockWall = clock.wallMillis
        s.clockCounter = clock.counter
        s.conflicts += result.conflicts
        s.pinnedEpoch = c.current.epoch
        s.pinnedHash = c.current.hash
        result.state = s
        return result
    }

    /// Reopens a record this device applied or kept as a conflict's loser (to restore a lost version).
    public func open(_ name: SyncRecordName) throws(SyncError) -> SyncChange {
        let c = try circle()
        return try open(name, c, try c.keys(for: keys))
    }

    func open(_ name: SyncRecordName, _ c: SyncCircle, _ keysByEpoch: [UInt64: SecureBytes]) throws(SyncError) -> SyncChange {
        let bytes = try read(name.path)
        let epoch = try SyncRecord.epoch(of: bytes)
        guard let writer = c.devices[name.device], c.admits(device: name.device, seq: name.seq, epoch: epoch),
              let key = keysByEpoch[epoch] else {
            throw .forged("record \(name.path) is not from the circle")
        }
        return try SyncRecord.open(bytes, name: name, writer: writer, key: key)
    }
}
