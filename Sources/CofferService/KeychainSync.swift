public import CofferKeychain
public import CofferSync
import CofferCrypto
import CofferSystem
public import CofferModel

/// A keychain's sync (issue #29): this device's keys and state from the keychain, its records in the
/// state directory's `sync` directory (a git clone of the person's remote). One ``sync(now:)``
/// records the local changes noted since the last one, pulls and applies what the others wrote (the
/// changes and the new state in one keychain transaction), and pushes. Not thread-safe: one caller
/// at a time (the agent's sync thread).
public final class KeychainSync {
    public let keychain: Keychain
    let replica: SyncReplica
    let git: GitTransport

    init(keychain: Keychain, replica: SyncReplica, git: GitTransport) {
        self.keychain = keychain
        self.replica = replica
        self.git = git
    }

    /// What one ``sync(now:)`` did.
    public struct Report: Sendable {
        /// False while this device waits for a member to approve it.
        public var member = false
        /// Local changes recorded.
        public var recorded = 0
        /// Changes of the others applied here.
        public var applied = 0
        /// Conflicts this pull found (the losers kept).
        public var conflicts = 0
        /// Records and changes refused, with why (no item contents).
        public var refused: [String] = []
        /// The pairing's step, while this machine joins.
        public var pairing: SyncReplica.PairingProgress? = nil
    }

    /// This device's sync as the keychain keeps it; nil if sync was never set up here.
    /// `report` receives what git printed when a git command fails (GitTransport), for the log.
    public static func open(keychain: Keychain, git: String? = nil,
                            report: @escaping @Sendable (String) -> Void = { _ in }) throws(SecError) -> KeychainSync? {
        guard let secret = try keychain.syncDeviceSecret(), let stateBytes = try keychain.syncState() else { return nil }
        do {
            let keys = try Self.keys(secret)
            let state = try SyncState.decode(stateBytes.withUnsafeBytes { Array($0) })
            let transport = try GitTransport(directory: keychain.syncDirectory, git: git, report: report)
            return KeychainSync(keychain: keychain, replica: SyncReplica(directory: keychain.syncDirectory, keys: keys, state: state), git: transport)
        } catch {
            throw Self.mapped(error)
        }
    }

    /// A keychain or sync error as the keychain error it is (SyncError carries its SecStatus).
    static func mapped(_ error: any Error) -> SecError {
        if let e = error as? SecError { return e }
        if let e = error as? SyncError { return e.secError }
        return SecError(.io, "sync failed: \(error)")
    }

    private static func keys(_ secret: SecureBytes) throws(SyncError) -> SyncDeviceKeys {
        guard secret.count == 64 else { throw .malformed("the stored sync device keys are not 64 bytes") }
        let seed = secret.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<32])) }
        let box = secret.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[32..<64])) }
        return try SyncDeviceKeys.restore(ed25519Seed: seed, x25519SecretKey: box)
    }

    /// Keeps the device keys and the first state, noting every item that syncs now (from then on local changes are noted).
    private static func start(_ keychain: Keychain, _ keys: SyncDeviceKeys, _ replica: SyncReplica) throws(SecError) {
        try keychain.startSync(deviceSecret: keys.exportSecret(), state: replica.state.encoded())
    }

    /// `coffer sync init --remote URL`: founds a circle on an empty remote with this device alone, and
    /// records every item that syncs.
    public static func initialize(keychain: Keychain, remote: String, name: String, now: UInt64, git: String? = nil,
                                  report: @escaping @Sendable (String) -> Void = { _ in }) throws(SecError) -> KeychainSync {
        guard try keychain.syncState() == nil else { throw .param("sync is already set up on this machine") }
        do {
            let transport = try GitTransport.clone(remote: remote, into: keychain.syncDirectory, git: git, report: report)
            let head = try transport.pull(lastSeen: "")
            let keys = SyncDeviceKeys.generate()
            let replica = try SyncReplica.found(directory: transport.directory, keys: keys, name: name, now: now)
            var s = replica.state
            s.remoteHead = head
            replica.commit(s)
            try start(keychain, keys, replica)
            let sync = KeychainSync(keychain: keychain, replica: replica, git: transport)
            _ = try sync.sync(now: now)
            return sync
        } catch {
            // A setup that failed leaves nothing behind (no clone, no state): a second attempt starts clean.
            try? keychain.stopSync()
            throw Self.mapped(error)
        }
    }

    /// `coffer sync join --remote URL`: asks to join the circle on `remote` (SyncFormat.md, "Pairing");
    /// returns the pairing code the person types on a member (``approve(code:now:timeout:pollSeconds:)``).
    /// A machine whose earlier join never made it a member (its pairing failed, or was never
    /// approved) starts again from nothing.
    public static func join(keychain: Keychain, remote: String, name: String, now: UInt64, git: String? = nil,
                            report: @escaping @Sendable (String) -> Void = { _ in }) throws(SecError) -> (sync: KeychainSync, code: String) {
        if try keychain.syncState() != nil {
            guard let earlier = try open(keychain: keychain, git: git, report: report), try earlier.mayJoinAgain() else {
                throw .param("sync is already set up on this machine")
            }
            try keychain.stopSync()
        }
        do {
            let transport = try GitTransport.clone(remote: remote, into: keychain.syncDirectory, git: git, report: report)
            let head = try transport.pull(lastSeen: "")
            let keys = SyncDeviceKeys.generate()
            let (replica, code) = try SyncReplica.requestJoin(directory: transport.directory, keys: keys, name: name, now: now)
            var s = replica.state
            s.remoteHead = head
            replica.commit(s)
            try start(keychain, keys, replica)
            let sync = KeychainSync(keychain: keychain, replica: replica, git: transport)
            try sync.push()
            return (sync, code)
        } catch {
            try? keychain.stopSync()
            throw Self.mapped(error)
        }
    }

    /// Commits this device's files, pushes, and keeps the remote head seen.
    private func push() throws(SecError) {
        do throws(SyncError) {
            var s = replica.state
            s.remoteHead = try git.push(lastSeen: s.remoteHead, message: "coffer-sync")
            replica.commit(s)
        } catch {
            throw error.secError
        }
        try keychain.commitSyncRecorded(through: 0, state: replica.state.encoded())
    }

    /// `coffer sync approve CODE` (a member; SyncFormat.md, "Pairing"): answers the pairing request
    /// the code names, then pulls every `pollSeconds` (at most `timeout` seconds) until the joining
    /// machine's confirmation is there and, if it proves the code, admits the device. Returns its name
    /// and the circle's fingerprint, which both screens show. The request gets this one answer
    /// whatever happens: a wrong code, a refusal or a timeout ends it (the joiner starts again).
    public func approve(code: String, now: UInt64, timeout: Double = 120, pollSeconds: Double = 1) throws(SecError) -> (name: String, fingerprint: String) {
        let clock = { Threads.monotonicSeconds() }
        _ = try sync(now: now)
        let approval: SyncReplica.Approval
        do throws(SyncError) { approval = try replica.answer(code: code) } catch { throw error.secError }
        try keychain.commitSyncRecorded(through: 0, state: replica.state.encoded())
        try push()
        let deadline = clock() + timeout
        while true {
            Threads.sleep(seconds: pollSeconds)
            do throws(SyncError) {
                var s = replica.state
                s.remoteHead = try git.pull(lastSeen: s.remoteHead)
                replica.commit(s)
            } catch {
                if clock() >= deadline { throw error.secError }
                continue
            }
            let admitted: SyncDevice?
            do throws(SyncError) {
                admitted = try replica.admit(approval)
            } catch {
                try? push()   // the response goes: the run is over
                throw error.secError
            }
            if let device = admitted {
                try push()
                let fingerprint: String
                do throws(SyncError) { fingerprint = try replica.circle().fingerprint } catch { throw error.secError }
                return (device.name, fingerprint)
            }
            if clock() >= deadline {
                replica.abandon(approval)
                try? push()
                throw SecError(.io, "the joining machine did not confirm within \(Int(timeout)) s (is its agent running and unlocked?); "
                               + "run coffer sync join again there for a new code")
            }
        }
    }

    /// True if this machine may set sync up again with `join`: its earlier join never made it a member
    /// (its pairing failed or was never approved, or it asked under the earlier pairing), or a member
    /// removed it from the circle.
    public func mayJoinAgain() throws(SecError) -> Bool {
        if replica.state.joining != nil { return true }
        // Not a member (removed, or waiting under the earlier pairing); a circle that cannot be read
        // now (a remote gone back) keeps the state: nothing is thrown away on an error.
        do throws(SyncError) { return try !replica.isMember() } catch { return false }
    }

    /// The circle's fingerprint as this machine knows it (empty before its pairing proved a circle).
    public func fingerprint() -> String {
        if let j = replica.state.joining { return j.stage == .confirmed ? j.note : "" }
        return (try? replica.circle().fingerprint) ?? ""
    }

    /// Records the local changes noted since the last sync (at the first sync as a member, every item
    /// that synced when sync was set up here), pulls and applies the others' changes with the new state in one keychain
    /// transaction, and pushes. Local changes are recorded before the pull, so a concurrent edit meets
    /// the other one as a conflict (decided by the clock, the loser kept) rather than silently on top.
    /// `progress` hears where it is (the phase, and the records done and in all: SyncStatus.Phase),
    /// as often as every record while verifying: the caller keeps it cheap.
    public func sync(now: UInt64, progress: (SyncStatus.Phase, _ done: Int, _ total: Int) -> Void = { _, _, _ in }) throws(SecError) -> Report {
        var report = Report()
        var verified = 0
        do {
            progress(.fetching, 0, 0)
            var head = replica.state.remoteHead
            head = try git.pull(lastSeen: head)
            var s = replica.state
            s.remoteHead = head
            replica.commit(s)
            if replica.state.joining != nil {
                let before = replica.state.joining
                report.pairing = try replica.advancePairing()
                if replica.state.joining != before {
                    try keychain.commitSyncRecorded(through: 0, state: replica.state.encoded())
                    try push()
                }
                if case .failed(let why) = report.pairing {
                    throw SecError(.authFailed, "pairing failed: \(why); run coffer sync join again for a new code")
                }
            }
            report.member = try replica.isMember()
            if !report.member, replica.state.joining == nil {
                if try replica.wasRemoved() {
                    throw SecError(.notAvailable, "this machine was removed from the circle by another member: it reads nothing written since "
                                   + "(coffer sync join sets it up again, with new keys and a member's approval)")
                }
                // Asked to join under the earlier pairing (format 2), which no member can approve any more.
                throw SecError(.notAvailable, "this machine asked to join under an earlier pairing that can no longer be approved: "
                               + "run coffer sync join again for a new code")
            }
            guard report.member else {
                try keychain.commitSyncRecorded(through: 0, state: replica.state.encoded())
                return report
            }
            // Local changes first.
            let pending = try keychain.pendingSyncChanges(limit: Int.max)
            // A record carries at most SyncChange.maxPayloadBytes (1 MiB; what every release reads): an
            // item larger than that (a secret near the 1 MiB limit with its attributes) stays on this
            // machine, and the report says so; the rest sync as ever.
            let changes = pending.changes.filter { ($0.payload?.count ?? 0) <= SyncChange.maxPayloadBytes }
            let tooLarge = pending.changes.count - changes.count
            if !changes.isEmpty { try replica.record(changes.map { ($0.itemKey, $0.payload) }, now: now) }
            try keychain.commitSyncRecorded(through: pending.through, state: replica.state.encoded())
            report.recorded = changes.count
            // Then the others'.
            let p = try replica.pull { done, total in
                verified = done
                progress(.verifying, done, total)
            }
            progress(.applying, verified, verified)
            let result = try keychain.applySync(p.apply.map { ($0.itemKey, $0.kind == .delete ? nil : $0.payload) }, state: p.state.encoded())
            replica.commit(p.state)
            try replica.acknowledge()   // only once the state is stored: writers may then compact what it applied
            report.applied = result.applied
            report.conflicts = p.conflicts.count
            report.refused = p.refused.map { "\($0.path): \($0.error.message)" } + result.refused
            if tooLarge > 0 {
                report.refused.append("\(tooLarge) changed item\(tooLarge == 1 ? " is" : "s are") larger than a sync record carries "
                                      + "(\(SyncChange.maxPayloadBytes) bytes sealed) and stay\(tooLarge == 1 ? "s" : "") on this machine only")
            }
        } catch {
            throw Self.mapped(error)
        }
        progress(.pushing, verified, verified)
        try push()
        return report
    }

    /// `coffer sync remove DEVICE` (a member): removes the device named by its id or its (unique) name
    /// and rotates the circle key, so it reads nothing written afterwards and its new records are refused.
    public func remove(device: String, now: UInt64) throws(SecError) {
        _ = try sync(now: now)
        let matches = try devices().filter { $0.id == device.lowercased() || $0.name == device }
        guard matches.count == 1, let id = SyncDeviceID(hex: matches[0].id) else {
            throw .param(matches.isEmpty ? "no device of the circle has that id or name" : "\(matches.count) devices have that name; give the id")
        }
        do throws(SyncError) { try replica.remove(device: id) } catch { throw error.secError }
        try push()
    }

    /// `coffer sync compact` (and the agent, now and then): syncs, then removes this device's records that
    /// every current member has applied and that were superseded knowingly, writing its checkpoint
    /// (SyncFormat.md, "Compaction"), and pushes the removals. Returns what it removed; nothing while a
    /// member has not caught up (a lost device blocks compaction until it is removed from the circle).
    @discardableResult
    public func compact(now: UInt64, progress: (SyncStatus.Phase, _ done: Int, _ total: Int) -> Void = { _, _, _ in }) throws(SecError) -> SyncReplica.Compaction {
        _ = try sync(now: now, progress: progress)
        let done: SyncReplica.Compaction
        do throws(SyncError) { done = try replica.compact() } catch { throw error.secError }
        try keychain.commitSyncRecorded(through: 0, state: replica.state.encoded())
        progress(.pushing, 0, 0)
        try push()
        return done
    }

    /// The devices of the circle (name, id, member now or not).
    public func devices() throws(SecError) -> [(id: String, name: String, member: Bool)] {
        do throws(SyncError) {
            let c = try replica.circle()
            return c.devices.values.sorted { $0.name < $1.name }.map { ($0.id.hex, $0.name, c.current.isMember($0.id)) }
        } catch {
            throw error.secError
        }
    }

    /// The conflicts kept so far (each the losing version's record, restorable with ``restore(conflict:)``).
    public var conflicts: [SyncState.Conflict] { replica.state.conflicts }

    /// A conflict's id: its losing record's device and sequence number (`DEVICEHEX-SEQ`).
    public static func id(of conflict: SyncState.Conflict) -> String { "\(conflict.loser.device.hex)-\(conflict.loser.seq)" }

    /// `coffer sync conflicts --restore ID`: writes the losing version back as a local change (the
    /// item as it was, or its deletion), which the next sync sends to the others as the newest
    /// version, and forgets the conflict. errSecItemNotFound if no kept conflict has that id.
    public func restore(conflict id: String) throws(SecError) {
        guard let conflict = replica.state.conflicts.first(where: { Self.id(of: $0) == id }) else {
            throw .itemNotFound("no kept conflict has the id \(id) (coffer sync conflicts lists them)")
        }
        let change: SyncChange
        do throws(SyncError) { change = try replica.open(conflict.loser) } catch { throw error.secError }
        // The record of this change will name the loser as its basis: every member settles the conflict.
        var restoring = replica.state
        restoring.restoring[Hex.encode(conflict.itemKey)] = conflict.loserTime
        replica.commit(restoring)
        let (cls, key) = try SyncItem.decodeItemKey(conflict.itemKey)
        let query = ItemQuery(itemClass: cls, attributes: key)
        if change.kind == .delete {
            do { _ = try keychain.delete(query, scope: .unrestricted) } catch where error.status == .itemNotFound {}
        } else {
            var (payloadClass, attrs, secret) = try SyncItem.decodePayload(change.payload)
            defer { secret.wipe() }
            attrs["cdat"] = nil
            attrs["mdat"] = nil
            do {
                _ = try keychain.update(query, ItemChanges(attributes: attrs, secret: secret), scope: .unrestricted)
            } catch where error.status == .itemNotFound {
                try keychain.add(NewItem(itemClass: payloadClass, attributes: attrs, secret: secret), scope: .unrestricted)
            }
        }
        var s = replica.state
        s.conflicts.removeAll { $0 == conflict }
        replica.commit(s)
        try keychain.commitSyncRecorded(through: 0, state: replica.state.encoded())
    }
}
