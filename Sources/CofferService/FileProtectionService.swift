package import CofferCrypto
import CofferFiles
import CofferKeychain
package import CofferModel
import CofferSystem
import Glibc
import Logging

/// Protected directories (issue #45, FileProtectionFormat.md): each directory's fscrypt key, kept
/// wrapped by its class key in the keychain, is added to and removed from the kernel as its class says.
///
/// - Complete and CompleteUnlessOpen: added at unlock, removed at lock (the `locked` event, after the
///   lock schedule's grace). Files still open keep the key incompletely removed: the worker asks the
///   kernel again every ``retrySeconds`` until they are closed (the kernel cannot revoke an open file).
/// - UntilFirstUserAuthentication: added at the first unlock after the agent starts, kept across locks,
///   removed by ``lockAll(_:)``.
/// - None: added when the agent starts (``start()``).
///
/// The decisions are here; a front end only translates FILES requests to these calls.
package final class FileProtectionService: Sendable {
    let service: KeychainService
    var keychain: Keychain { service.keychain }
    var logger: Logger { service.logger }
    /// How often a removal that found files open is asked again.
    package let retrySeconds: Double

    private struct State {
        /// Directories whose removal found files open (by path): asked again until absent.
        var pending: [String: [UInt8]] = [:]
        /// Files being written in parts (FILES drop part), by drop id: the next part expected.
        var uploads: [[UInt8]: Upload] = [:]
        /// Drop ids whose last part came and whose file is not written yet: not to be used again.
        var finished: Set<[UInt8]> = []
        var stopping = false
        var workerRunning = false
    }
    private let state = Protected(State())

    /// A file being written in parts: where to, the next index, the bytes so far, and when its last
    /// part came (seconds, monotonic).
    private struct Upload {
        let path: String
        let name: String
        var next: UInt32
        var bytes: Int
        var touched: Double
    }

    /// The most one file written in parts holds (its parts together).
    package static let maximumPartedFileBytes = 64 << 20
    /// An upload without a new part for this long is abandoned: its parts are discarded at the next delivery.
    package static let abandonedUploadSeconds = 600.0
    private let clock = SystemClock()

    package init(service: KeychainService, retrySeconds: Double = 0.25) {
        self.service = service
        self.retrySeconds = retrySeconds
    }

    // MARK: Lifecycle

    /// At the agent's start: finishes migrations a crash interrupted after their swap, removes keys a
    /// crashed agent left in the kernel for classes that are not available now, and adds the None keys
    /// (and, with no passcode set, every key: nothing locks then).
    package func start() {
        service.onDirectoriesRestored { [weak self] restored in self?.restored(restored) }
        service.onLastSessionEnded { [weak self] in self?.lastSessionEnded() }
        let records = (try? keychain.fileKeyRecords()) ?? []
        for r in records where policyMatches(r) {
            do { try ProtectedDirectories.finishMigration(of: r.path) } catch {
                logger.warning("could not remove the old copy of a migrated protected directory", metadata: ["dir": "\(r.path)", "why": "\(error)"])
            }
        }
        if service.isLocked {
            for r in records where r.protection != .none { remove(r, reason: "agent start, keychain locked") }
            for r in records where r.protection == .none { add(r) }
        } else {
            for r in records { add(r) }
            deliverDrops()
        }
        let running = state.withLock { s -> Bool in
            defer { s.workerRunning = true }
            return s.workerRunning
        }
        if !running { _ = Threads.detach(stackBytes: 256 << 10) { [self] in worker() } }
    }

    /// Ends the retry worker; removes the keys of every class but None (nothing enforces a lock once the
    /// agent is gone).
    package func stop() {
        state.withLock { $0.stopping = true }
        state.broadcast()
        for r in (try? keychain.fileKeyRecords()) ?? [] where r.protection != .none { remove(r, reason: "agent stopping") }
    }

    /// A lock event (from the lock schedule, without its locks held).
    package func observe(_ event: LockEvent) {
        switch event {
        case .unlocked:
            // Cleared before the keys are added back: the retry worker removes only what is still pending.
            state.withLock { $0.pending = [:] }
            for r in (try? keychain.fileKeyRecords()) ?? [] { add(r) }
            deliverDrops()
        case .locked:
            for r in (try? keychain.fileKeyRecords()) ?? [] where r.protection == .complete || r.protection == .completeUnlessOpen {
                remove(r, reason: "lock")
            }
        case .willLock, .itemsChanged:
            break
        }
    }

    /// The user's last login session closed (pam_coffer's SESSION): UntilFirstUserAuthentication keys go
    /// (the lock that follows removes Complete and CompleteUnlessOpen's); the next unlock adds them back.
    private func lastSessionEnded() {
        for r in (try? keychain.fileKeyRecords()) ?? [] where r.protection == .untilFirstUserAuthentication {
            remove(r, reason: "last login session closed")
        }
    }

    /// Directories a backup restore recorded: each whose directory carries its policy gets its key as its
    /// class says now (the restore needed the keychain unlocked, so every class is available: Complete
    /// and CompleteUnlessOpen are added while it stays unlocked, and removed at the next lock as usual).
    private func restored(_ records: [FileKeyRecord]) {
        for r in records {
            guard policyMatches(r) else {
                logger.warning("a restored protected directory does not carry its encryption policy here; its key is kept for when it does",
                               metadata: ["dir": "\(r.path)"])
                continue
            }
            if service.isLocked && r.protection != .none { continue }
            add(r)
            logger.info("restored a protected directory's key", metadata: ["dir": "\(r.path)", "class": "\(r.protection)"])
        }
    }

    /// Writes the files written while locked into their (now unlocked) CompleteUnlessOpen directories,
    /// each synced before its sealed copy is forgotten (FileProtectionFormat.md, "Writing while locked").
    /// A file written in parts goes in once all its parts are there, one part in memory at a time; the
    /// parts of an upload that was abandoned (no part for ``abandonedUploadSeconds``, or begun before the
    /// agent restarted) are discarded.
    private func deliverDrops() {
        // On a thread of its own: the unlock (or last part) that asked answers at once, however much there
        // is to write. One delivery at a time (an unlock and a last part may ask at once): a file is written once.
        let started = Threads.detach(stackBytes: 256 << 10) { [self] in delivering.withLock { _ in deliverDropsNow() } }
        if !started { delivering.withLock { _ in deliverDropsNow() } }
    }

    /// One file delivery at a time (``deliverDrops()``).
    private let delivering = Protected(())

    private func deliverDropsNow() {
        // Which uploads are still being written, taken BEFORE the list of drops: an upload that ends after
        // this counts as in progress here (its last part's own delivery, after this one, writes it), and
        // one that ended before has all its parts in the list.
        let now = clock.now()
        let inProgress = state.withLock { s -> Set<[UInt8]> in
            s.uploads = s.uploads.filter { now - $0.value.touched < Self.abandonedUploadSeconds }
            return Set(s.uploads.keys)
        }
        let entries: [FileDropEntry]
        do {
            entries = try keychain.dropEntries()
        } catch {
            logger.warning("could not open the files written while locked", metadata: ["why": "\(error)"])
            return
        }
        for e in entries where e.part == nil {
            guard let d = try? keychain.openDrop(id: e.id) else { continue }
            defer { d.data.wipe() }
            do {
                let written = try ProtectedDirectories.deliver(d.data, name: d.name, into: d.path, tag: d.id)
                try keychain.removeDrop(id: d.id)
                logger.info("wrote a file written while locked into its directory", metadata: ["dir": "\(d.path)", "name": "\(written)"])
            } catch {
                logger.warning("could not write a file written while locked; kept for the next unlock",
                               metadata: ["dir": "\(d.path)", "why": "\(error)"])
            }
        }
        var groups: [[UInt8]: [FileDropEntry]] = [:]
        var order: [[UInt8]] = []
        for e in entries {
            guard let p = e.part else { continue }
            if groups[p.dropID] == nil { order.append(p.dropID) }
            groups[p.dropID, default: []].append(e)
        }
        for id in order {
            let parts = groups[id]!.sorted { $0.part!.index < $1.part!.index }
            let first = parts[0]
            let complete = parts.enumerated().allSatisfy { i, e in
                e.part!.index == UInt32(i) && e.path == first.path && e.name == first.name && e.part!.final == (i == parts.count - 1)
            }
            if !complete {
                if inProgress.contains(id) { continue }
                for e in parts { try? keychain.removeDrop(id: e.id) }
                _ = state.withLock { $0.finished.remove(id) }
                logger.warning("discarded the parts of a file written while locked whose upload did not finish",
                               metadata: ["dir": "\(first.path)", "parts": "\(parts.count)"])
                continue
            }
            do {
                let written = try ProtectedDirectories.deliver(parts: parts.count, { (i: Int) throws(FileProtectionError) -> SecureBytes in
                    guard let d = try? keychain.openDrop(id: parts[i].id) else {
                        throw FileProtectionError.system(operation: "open a part of", path: first.path + "/" + first.name, errno: EIO)
                    }
                    return d.data
                }, name: first.name, into: first.path, tag: first.id)
                for e in parts { try keychain.removeDrop(id: e.id) }
                _ = state.withLock { $0.finished.remove(id) }
                logger.info("wrote a file written while locked into its directory", metadata: ["dir": "\(first.path)", "name": "\(written)",
                                                                                              "parts": "\(parts.count)"])
            } catch {
                logger.warning("could not write a file written while locked; kept for the next unlock",
                               metadata: ["dir": "\(first.path)", "why": "\(error)"])
            }
        }
    }

    /// Adds `record`'s key to its filesystem (its class key must be available); logs a failure.
    private func add(_ record: FileKeyRecord) {
        do {
            let key = try keychain.fileKey(record)
            defer { key.wipe() }
            let id = try Fscrypt.addKey(key, filesystemOf: parent(record))
            if id != record.identifier { logger.error("a protected directory's key has another identifier than its record", metadata: ["dir": "\(record.path)"]) }
        } catch {
            logger.warning("could not add a protected directory's key", metadata: ["dir": "\(record.path)", "why": "\(error)"])
        }
    }

    /// Removes `record`'s key; files still open leave it pending for the worker.
    private func remove(_ record: FileKeyRecord, reason: String) {
        do {
            let r = try Fscrypt.removeKey(record.identifier, filesystemOf: parent(record))
            if r.filesBusy {
                state.withLock { $0.pending[record.path] = record.identifier }
                state.broadcast()
                logger.info("protected directory has files open: its key is removed when they close",
                            metadata: ["dir": "\(record.path)", "reason": "\(reason)"])
            } else {
                _ = state.withLock { $0.pending.removeValue(forKey: record.path) }
            }
        } catch {
            logger.warning("could not remove a protected directory's key", metadata: ["dir": "\(record.path)", "why": "\(error)"])
        }
    }

    /// Asks the kernel again, every ``retrySeconds``, to finish the removals that found files open.
    private func worker() {
        while true {
            let work: [String: [UInt8]]? = state.withLock(waitingUntil: { !$0.pending.isEmpty || $0.stopping }, timeout: nil) { s in
                s.stopping ? nil : s.pending
            } ?? [:]
            guard let work else { return }
            Threads.sleep(seconds: retrySeconds)
            for (path, id) in work {
                // Under the lock: an unlock meanwhile cleared `pending` (and added the key back), and
                // this retry must then not remove it.
                let finished: Bool = state.withLock { s in
                    guard s.pending[path] == id, let r = try? Fscrypt.removeKey(id, filesystemOf: Filesystems.parent(of: path)) else { return false }
                    if r.filesBusy { return false }
                    s.pending.removeValue(forKey: path)
                    return true
                }
                if finished { logger.info("protected directory locked: its last open files were closed", metadata: ["dir": "\(path)"]) }
            }
        }
    }

    private func parent(_ record: FileKeyRecord) -> String { Filesystems.parent(of: record.path) }

    /// True if the directory carries the policy its record names.
    private func policyMatches(_ record: FileKeyRecord) -> Bool {
        (try? Fscrypt.policy(of: record.path)) == .v2(identifier: record.identifier)
    }

    // MARK: Requests

    /// Only the owner's own tools manage protected directories (as sync): not a delegated connection,
    /// not a sandboxed or other signed app.
    private func mayManage(_ context: CallerContext, _ what: String) throws(SecError) {
        guard !context.isDelegated else {
            throw SecError(.missingEntitlement, "protected directories are managed only by the owner's coffer, not on a delegated connection")
        }
        try service.mayManageKeychain(context.caller, what)
    }

    /// FILES protect: makes the directory `path` (absolute) a protected directory of class `protection`
    /// with a new random key (FileProtectionFormat.md, "Protecting a directory"). Refused, with nothing
    /// changed, for what ``ProtectedDirectories/check(_:uid:)`` refuses, for a directory that holds a
    /// protected one, and while the class key is not available (the keychain locked).
    package func protect(path: String, protection: FileProtection, _ context: CallerContext) throws(SecError) -> ProtectedDirectoryStatus {
        try mayManage(context, "protect a directory")
        if protection != .none && service.isLocked {
            throw FileProtectionError.classLocked(path).secError
        }
        let records = try keychain.fileKeyRecords()
        let candidate: ProtectedDirectories.Candidate
        do {
            candidate = try ProtectedDirectories.check(path, uid: getuid())
        } catch {
            throw error.secError
        }
        if let inner = records.first(where: { $0.path.hasPrefix(path == "/" ? "/" : path + "/") }) {
            throw FileProtectionError.cannotCopy(path, what: "the protected directory \(inner.path)").secError
        }
        if let stale = records.first(where: { $0.path == path }) {
            // An earlier protect that a crash interrupted before its swap: its key never encrypted anything.
            _ = try? Fscrypt.removeKey(stale.identifier, filesystemOf: candidate.parent)
            try keychain.removeFileKey(path: path)
            try? ProtectedDirectories.discardStaging(of: path)
            logger.notice("replaced the record of an interrupted protect", metadata: ["dir": "\(path)"])
        }
        let key = SecureBytes.random(count: Fscrypt.keyBytes)
        defer { key.wipe() }
        let identifier: [UInt8]
        do {
            identifier = try Fscrypt.addKey(key, filesystemOf: candidate.parent)
        } catch {
            throw error.secError
        }
        do {
            // The record first: a crash after the policy is set must find the key.
            try keychain.addFileKey(path: path, protection: protection, identifier: identifier, key: key)
        } catch {
            _ = try? Fscrypt.removeKey(identifier, filesystemOf: candidate.parent)
            throw error
        }
        do {
            try ProtectedDirectories.protect(candidate, identifier: identifier)
        } catch {
            _ = try? keychain.removeFileKey(path: path)
            _ = try? Fscrypt.removeKey(identifier, filesystemOf: candidate.parent)
            throw error.secError
        }
        logger.info("protected a directory", metadata: ["dir": "\(path)", "class": "\(protection.cliName)",
                                                       "migrated": "\(!candidate.isEmpty)"])
        return status(of: FileKeyRecord(path: path, protection: protection, identifier: identifier, version: 1))
    }

    /// FILES status: every protected directory (or only `path`), its class, whether its key is in the
    /// kernel now, and who holds files open in it while its removal waits.
    package func status(path: String?, _ context: CallerContext) throws(SecError) -> [ProtectedDirectoryStatus] {
        try mayManage(context, "list protected directories")
        let records = try keychain.fileKeyRecords()
        guard let path else { return records.map(status(of:)) }
        guard let r = records.first(where: { $0.path == path }) else { throw FileProtectionError.notProtected(path).secError }
        return [status(of: r)]
    }

    /// FILES drop: writes `data` as the file `name` of the CompleteUnlessOpen directory `path`. Unlocked
    /// (its key in the kernel): written now. Locked: sealed to the directory's drop public key and kept in
    /// the keychain until the next unlock writes it (no class key is needed to seal; reading needs the
    /// unlock, as on iOS).
    package func drop(path: String, name: String, data: SecureBytes, _ context: CallerContext) throws(SecError) -> ProtectedDirectoryStatus {
        let r = try dropTarget(path: path, name: name, bytes: data.count, context,
                               tooLarge: "a file written with one request holds at most \(Keychain.maximumDropBytes) bytes (a larger one goes in parts)")
        if (try? Fscrypt.keyState(r.identifier, filesystemOf: parent(r))) == .present && !service.isLocked {
            do {
                try ProtectedDirectories.deliver(data, name: name, into: path, tag: Int64.random(in: 1...Int64.max))
            } catch {
                throw error.secError
            }
        } else {
            try keychain.addDrop(path: path, name: name, data: data)
            logger.info("kept a file written while locked for the next unlock", metadata: ["dir": "\(path)"])
        }
        return status(of: r)
    }

    /// FILES drop part: one part of the file `name` of the CompleteUnlessOpen directory `path`, written in
    /// several requests (a file larger than one request). The parts of one drop id come in order from
    /// index 0, the last one `final`, at most ``maximumPartedFileBytes`` together. Each is sealed to the
    /// directory's drop key and kept, locked or not; the file is written in once its last part is there
    /// and the directory is unlocked (else at the next unlock). A part out of order, of an unknown upload
    /// (one the agent did not see begin: it restarted) or past the size is `-50`, and the upload is over.
    package func dropPart(path: String, name: String, part: FileDropPart, data: SecureBytes, _ context: CallerContext) throws(SecError)
        -> ProtectedDirectoryStatus {
        let r = try dropTarget(path: path, name: name, bytes: data.count, context,
                               tooLarge: "a part holds at most \(Keychain.maximumDropBytes) bytes")
        guard part.dropID.count == 16 else { throw SecError(.param, "a drop id is 16 bytes") }
        let now = clock.now()
        try state.withLock { (s: inout State) throws(SecError) in
            let upload = s.uploads[part.dropID]
            if part.index == 0 {
                guard upload == nil, !s.finished.contains(part.dropID) else {
                    throw SecError(.param, "this drop id was already used for a file being written")
                }
            } else {
                guard let upload, upload.path == path, upload.name == name, upload.next == part.index else {
                    s.uploads[part.dropID] = nil
                    throw SecError(.param, "part \(part.index) does not continue a file being written (the agent restarted, or a part is missing): write the file again from its first part")
                }
            }
            let bytes = (upload?.bytes ?? 0) + data.count
            guard bytes <= Self.maximumPartedFileBytes else {
                s.uploads[part.dropID] = nil
                throw SecError(.param, "a file written this way holds at most \(Self.maximumPartedFileBytes >> 20) MiB")
            }
            // Kept under the upload's lock, so two parts of one file never interleave.
            try keychain.addDrop(path: path, name: name, data: data, part: part)
            s.uploads[part.dropID] = part.final ? nil : Upload(path: path, name: name, next: part.index + 1, bytes: bytes, touched: now)
            if part.final { s.finished.insert(part.dropID) }
        }
        if part.final {
            if (try? Fscrypt.keyState(r.identifier, filesystemOf: parent(r))) == .present && !service.isLocked {
                deliverDrops()
            } else {
                logger.info("kept a file written while locked for the next unlock", metadata: ["dir": "\(path)", "parts": "\(part.index + 1)"])
            }
        }
        return status(of: r)
    }

    /// What FILES drop and drop part check first, in this order: the caller may manage, the file name, the
    /// request's size (refused before the directory is looked at, locked or not), then the directory: a
    /// protected one of class CompleteUnlessOpen. Its record.
    private func dropTarget(path: String, name: String, bytes: Int, _ context: CallerContext, tooLarge: String) throws(SecError) -> FileKeyRecord {
        try mayManage(context, "write into a protected directory")
        guard ProtectedDirectories.isFileName(name) else { throw FileProtectionError.badFileName(name).secError }
        guard bytes <= Keychain.maximumDropBytes else { throw SecError(.param, tooLarge) }
        guard let r = try keychain.fileKeyRecords().first(where: { $0.path == path }) else { throw FileProtectionError.notProtected(path).secError }
        guard r.protection == .completeUnlessOpen else { throw FileProtectionError.notCompleteUnlessOpen(path, r.protection).secError }
        return r
    }

    /// FILES lock --all: removes every protected directory's key now, whatever its class (None and
    /// UntilFirstUserAuthentication included); they come back at the next unlock.
    package func lockAll(_ context: CallerContext) throws(SecError) -> [ProtectedDirectoryStatus] {
        try mayManage(context, "lock protected directories")
        let records = try keychain.fileKeyRecords()
        for r in records { remove(r, reason: "lock --all") }
        return records.map(status(of:))
    }

    private func status(of record: FileKeyRecord) -> ProtectedDirectoryStatus {
        var s = ProtectedDirectoryStatus(path: record.path, protection: record.protection, keyIdentifier: record.identifier, keyState: .unknown)
        do {
            s.keyState = try Fscrypt.keyState(record.identifier, filesystemOf: parent(record))
        } catch {
            s.problem = "\(error)"
            return s
        }
        if !policyMatches(record) {
            s.problem = "the directory does not carry its encryption policy (a protect was interrupted, or it was replaced): run coffer files protect again"
        }
        if s.keyState == .incompletelyRemoved { s.holders = FileHolders.holding(record.path) }
        return s
    }
}
