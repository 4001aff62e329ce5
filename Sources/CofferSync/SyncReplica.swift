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
        // Before a pairing (or the founding) fixed which circle this device belongs to, nothing on the
        // remote is followed: whoever can write it could put any circle there.
        guard state.pinned != nil || !state.pinnedFirst.isEmpty else {
            throw .notAMember("this device is not in a circle yet: its pairing has not proved one")
        }
        // Device and epoch files are never rewritten, only added: the names (and the epoch this device
        // trusts) say whether the chain must be followed again.
        let key = entries("devices") + ["/"] + entries("circle") + ["/\(state.pinnedEpoch)", Hex.encode(state.pinnedHash), Hex.encode(state.pinnedFirst)]
        if let cached = cachedCircle, cached.key == key { return cached.circle }
        let devices = loadDevices().devices
        var files: [String: [UInt8]] = [:]
        for name in entries("circle") where name.hasSuffix(".circle") {
            files["circle/" + name] = try read("circle/" + name, max: 1 << 20)
        }
        let c = try SyncCircle.resolve(epochFiles: files, devices: devices, pinned: state.pinned,
                                       first: state.pinnedFirst.isEmpty ? nil : state.pinnedFirst).circle
        // A state from before the first epoch was pinned (format 2): the chain back from its pinned
        // epoch proves which circle it joined; from now on that first epoch is pinned too.
        if state.pinnedFirst.isEmpty && state.pinned != nil { state.pinnedFirst = c.epochs[0].hash }
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
        r.state.pinnedFirst = first.hash
        return r
    }

    /// Asks to join the circle in `directory` (SyncFormat.md, "Pairing"): writes this device's file
    /// and a pairing request under a fresh code (or `code`), and returns the code, which the person
    /// types on a member (``answer(code:)``). Nothing on the remote is trusted yet: the circle this
    /// device will belong to is the one the response that proves the code names
    /// (``advancePairing()``).
    public static func requestJoin(directory: String, keys: SyncDeviceKeys, name: String, now: UInt64,
                                   code: SyncPairingCode? = nil) throws(SyncError) -> (replica: SyncReplica, code: String) {
        let r = SyncReplica(directory: directory, keys: keys, state: SyncState())
        let device = SyncDevice(keys: keys, name: name, createdMillis: now)
        let file = device.encoded(signedWith: keys)
        let code = code ?? SyncPairingCode.random()
        let (joining, request) = try SyncPairing.start(code: code, deviceFile: file)
        try r.write(device.path, file)
        try r.write(code.directory + "/request", request.encoded)
        r.state.joining = joining
        return (r, code.text)
    }

    /// True once a member has admitted this device into the circle its pairing proved (the circle's
    /// current epoch lists it). False while the pairing has not proved a circle: nothing on the remote
    /// is followed before that.
    public func isMember() throws(SyncError) -> Bool {
        if let j = state.joining, j.stage != .confirmed { return false }
        return try circle().current.isMember(keys.id)
    }

    /// True if a member removed this device from the circle (the current epoch lists it as removed).
    public func wasRemoved() throws(SyncError) -> Bool { try circle().current.removed[keys.id] != nil }

    /// What ``advancePairing()`` did.
    public enum PairingProgress: Sendable, Equatable {
        /// Nothing to do (no pairing, or no response yet).
        case waiting
        /// A response proved the code: the circle (its fingerprint) is pinned, the confirmation written.
        case confirmed(fingerprint: String)
        /// The response did not prove the code: the run is over, and the refusal written.
        case failed(String)
        /// The pairing ended: this device is a member, its pairing files removed.
        case member(fingerprint: String)
    }

    /// The joiner's next pairing step, run at each sync while it is not a member: reads the response to
    /// its request and, if it proves the code, pins the circle it names (its first epoch, and its
    /// current epoch) and writes its confirmation; if it does not (a wrong code typed, a guess, a
    /// replayed or malformed response), writes a refusal and ends the run (join again with a new code).
    /// Once confirmed, waits for the epoch that admits it, then removes its pairing files.
    @discardableResult
    public func advancePairing() throws(SyncError) -> PairingProgress {
        guard var j = state.joining else { return .waiting }
        let dir = j.code.directory
        switch j.stage {
        case .failed:
            return .failed(j.note)
        case .confirmed:
            guard try circle().current.isMember(keys.id) else { return .waiting }
            try remove(dir + "/request")
            try remove(dir + "/confirm")
            state.joining = nil
            return .member(fingerprint: j.note)
        case .requested:
            guard Files.exists(path(dir + "/response")) else { return .waiting }
            do throws(SyncError) {
                let response = try SyncPairing.Response.decode(try read(dir + "/response", max: 4096))
                let tag = try SyncPairing.verify(response, joining: j)
                try write(dir + "/confirm", try SyncPairing.Confirm.make(sid: j.sid, tag: tag).encoded)
                state.pinnedFirst = response.firstEpochHash
                state.pinnedEpoch = response.epoch
                state.pinnedHash = response.epochHash
                j.stage = .confirmed
                j.note = SyncCircle.fingerprint(firstEpochHash: response.firstEpochHash)
                state.joining = j
                return .confirmed(fingerprint: j.note)
            } catch {
                if case .transport = error { throw error }
                try write(dir + "/confirm", try SyncPairing.Confirm.make(sid: j.sid, tag: nil).encoded)
                try remove(dir + "/request")
                j.stage = .failed
                j.note = error.message
                state.joining = j
                return .failed(error.message)
            }
        }
    }

    /// An approval under way on a member: the request answered and the session key to check the
    /// joiner's confirmation with.
    public struct Approval: Sendable {
        public let code: SyncPairingCode
        public let request: SyncPairing.Request
        let isk: SecureBytes
        /// The joining device, as its request names it (not admitted yet).
        public var device: SyncDevice { request.device }
    }

    /// A member answers the pairing request the person's `code` names (SyncFormat.md, "Pairing"):
    /// writes its response, vouching for this circle, and notes the request as answered (each request
    /// gets one answer: one guess per code). Then ``admit(_:)`` once the joiner's confirmation is there.
    public func answer(code text: String) throws(SyncError) -> Approval {
        guard let code = SyncPairingCode.parse(text) else {
            throw .param("\(text) is not a pairing code (XXXX-XXXX-XXXX, as coffer sync join shows it on the joining machine)")
        }
        let c = try circle()
        guard c.current.isMember(keys.id) else { throw .notAMember("only a member of the circle can approve a device") }
        guard Files.exists(path(code.directory + "/request")) else {
            throw .param("no machine waits with the code \(code.text): it was used, the joining machine gave up, or the code is mistyped")
        }
        let request = try SyncPairing.Request.decode(try read(code.directory + "/request", max: 8192))
        guard !state.answered.contains(request.sid) else {
            throw .param("the code \(code.text) was already used: run coffer sync join again on the joining machine")
        }
        guard !c.current.isMember(request.device.id), c.current.removed[request.device.id] == nil else {
            throw .param("the device that asked with \(code.text) is already a member, or was removed (it must join with new keys)")
        }
        // One answer per request, whatever follows: noted before the response exists.
        state.answered.append(request.sid)
        if state.answered.count > SyncState.maxAnswered { state.answered.removeFirst(state.answered.count - SyncState.maxAnswered) }
        let (response, isk) = try SyncPairing.respond(to: request, code: code, approver: keys.id, circle: c)
        try write(code.directory + "/response", response.encoded)
        return Approval(code: code, request: request, isk: isk)
    }

    /// Gives `approval` up (the joiner never confirmed): this device's response goes; the request
    /// stays answered, so the code can never be tried again.
    public func abandon(_ approval: Approval) {
        approval.isk.wipe()
        try? remove(approval.code.directory + "/response")
    }

    /// Finishes `approval` once the joiner's confirmation is in the directory: nil while it is not; the
    /// admitted device once it proves the code (the next epoch, with the circle key sealed to it, is
    /// written). `.forged` if the joiner refused or its confirmation does not prove the code. Either
    /// way this device's response is removed once the run is over.
    public func admit(_ approval: Approval) throws(SyncError) -> SyncDevice? {
        let dir = approval.code.directory
        guard Files.exists(path(dir + "/confirm")) else { return nil }
        defer { try? remove(dir + "/response") }
        let confirm = try SyncPairing.Confirm.decode(try read(dir + "/confirm", max: 4096))
        try SyncPairing.check(confirm, request: approval.request, isk: approval.isk)
        approval.isk.wipe()
        let c = try circle()
        let e = try c.next(signedBy: keys, adding: [approval.device])
        try write(e.path, e.encoded)
        return approval.device
    }

    /// Removes `device` from the circle (a member only) and rotates the circle key: records it
    /// writes afterwards are refused and it cannot open anything written afterwards. Its records up
    /// to the last one this device applied still count.
    public func remove(device: SyncDeviceID) throws(SyncError) {
        guard device != keys.id else { throw .param("a device leaves by being removed from another member") }
        let c = try circle()
        let e = try c.next(signedBy: keys, removing: [device: state.applied[device] ?? 0])
        try write(e.path, e.encoded)
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
            // A restore's record names the loser it brought back (the winner is superseded too).
            let current = s.versions[k]?.time, restored = s.restoring.removeValue(forKey: k)
            let basis = restored ?? current
            let change = SyncChange(kind: payload == nil ? .delete : .put, time: time, basis: basis, itemKey: itemKey,
                                    payload: payload ?? SecureBytes(count: 0))
            let sealed = try SyncRecord.seal(change, seq: s.nextSeq, epoch: epoch, key: all[epoch]!, keys: keys)
            try writeUnsynced(sealed.name.path, sealed.bytes)
            s.nextSeq += 1
            s.applied[keys.id] = sealed.name.seq
            if let basis { s.bases[k, default: []].insert(basis) }
            if restored != nil, let current { s.bases[k, default: []].insert(current) }
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
            if let b = change.basis {
                s.bases[k, default: []].insert(b)
                // A version written on top of a conflict's loser is a restore of it: that conflict is
                // settled on every member (its winner superseded knowingly too), not listed forever.
                func settles(_ c: SyncState.Conflict) -> Bool { c.itemKey == change.itemKey && c.loserTime == b }
                for c in s.conflicts.filter(settles) + result.conflicts.filter(settles) { s.bases[k, default: []].insert(c.winner) }
                s.conflicts.removeAll(where: settles)
                result.conflicts.removeAll(where: settles)
            }
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
