import CofferKeychain
package import CofferModel
import CofferSync
package import CofferSystem
import Logging

/// The agent's keychain sync (issue #29, WireProtocol.md "Sync"): `coffer sync`'s operations and the
/// background sync. One worker thread runs every background sync: at unlock, at the interval, a short
/// delay after a write (the writes of that delay go in one push), and again after a failure (the
/// remote unreachable: the next attempt catches up). A request never waits for it: items are served by
/// ``KeychainService`` as before, since ``KeychainSync`` takes the keychain's serialisation only for
/// its short reads and the one transaction that applies a pull, never while `git` runs. A locked
/// keybag syncs nothing (its sync state is sealed under a WhenUnlocked key).
///
/// The ``KeychainSync`` is used by one thread at a time (``engine``'s lock): the worker, or a `coffer
/// sync` request (init, join, approve, remove, devices, conflicts), which then waits for a running sync.
/// SYNC_STATUS never waits: it reads ``work``.
package final class SyncService: Sendable {
    /// The agent configuration's sync settings.
    package struct Settings: Sendable {
        /// Pull at least this often while unlocked (config key `sync-interval`, seconds).
        package var intervalSeconds: Double = 300
        /// Push this long after a write, collecting the writes meanwhile (config key `sync-push-delay`).
        package var pushDelaySeconds: Double = 2
        /// After a failed sync, try again this long after (at most the interval).
        package var retrySeconds: Double = 30
        /// While this machine's pairing runs, pull this often (config key `sync-pairing-poll`); an
        /// approval pulls this often too while it waits for the joiner's confirmation.
        package var pairingPollSeconds: Double = 2
        /// How long an approval waits for the joining machine's confirmation (config key
        /// `sync-pairing-timeout`, seconds).
        package var pairingTimeoutSeconds: Double = 120
        /// The git program (config key `sync-git`; nil: `git` in `PATH`).
        package var git: String? = nil
        /// Compact this device's superseded records (SyncFormat.md, "Compaction") after a successful
        /// sync at most this often (config key `sync-compact-interval`, seconds; the first after the start).
        package var compactIntervalSeconds: Double = 86_400
        package init() {}
    }

    let service: KeychainService
    let settings: Settings
    var keychain: Keychain { service.keychain }
    var logger: Logger { service.logger }
    let clock: any MonotonicClock
    let wallClock: any MonotonicClock
    /// The sync engine (nil until opened: sync set up here and the keybag unlocked once), one user at a time.
    private let engine = Protected<KeychainSync?>(nil)
    /// The worker's schedule and what SYNC_STATUS reports.
    private let work: Protected<Work>

    private struct Work {
        /// When (monotonic) the next sync is due; nil: none planned.
        var dueAt: Double? = nil
        /// Bumped at every change that may wake the worker.
        var generation = 0
        var stopping = false
        /// Syncs ended (for a SYNC_STATUS that waits for one).
        var finished = 0
        /// True/false once known; nil while the keybag has stayed locked since the start.
        var configured: Bool? = nil
        /// When (monotonic) this process last compacted; nil: not yet.
        var compactedAt: Double? = nil
        var status = SyncStatus(state: .unknown)
        /// The circle's fingerprint as last known (after a sync, a setup or an approval): SYNC_CIRCLE
        /// circle reads it without waiting for a running sync.
        var fingerprint = ""
        /// The phase last put in ``status`` and when (monotonic): progress is noted at most every 0.2 s within a phase.
        var progressShown: (SyncStatus.Phase, Double)? = nil
    }

    package init(service: KeychainService, settings: Settings, clock: any MonotonicClock = SystemClock(),
                 wallClock: any MonotonicClock = SystemWallClock()) {
        self.service = service
        self.settings = settings
        self.clock = clock
        self.wallClock = wallClock
        work = Protected(Work(status: SyncStatus(state: .unknown, intervalSeconds: UInt32(clamping: Int(settings.intervalSeconds)))))
    }

    // MARK: The background sync

    /// Starts the worker thread; a sync is due at once (it does nothing while the keybag is locked).
    package func start() {
        service.onItemsWritten { [weak self] in self?.noteWrite() }
        schedule(in: 0)
        _ = Threads.detach(stackBytes: 1 << 20) { [self] in workerLoop() }
    }

    /// Ends the worker after the sync it runs, if any.
    package func stop() {
        work.withLock { $0.stopping = true; $0.generation += 1 }
        work.broadcast()
    }

    /// A lock event: at unlock a pull is due at once.
    package func observe(_ event: LockEvent) {
        if event == .unlocked { schedule(in: 0) }
    }

    /// A write succeeded: a push is due after the push delay (one push for every write until then).
    /// Nothing when sync is known not to be set up.
    func noteWrite() {
        guard work.withLock({ $0.configured }) != false else { return }
        schedule(in: settings.pushDelaySeconds)
    }

    /// Plans a sync `seconds` from now unless one is planned sooner.
    private func schedule(in seconds: Double) {
        let at = clock.now() + seconds
        work.withLock { w in
            w.dueAt = min(w.dueAt ?? at, at)
            w.generation += 1
        }
        work.broadcast()
    }

    private func workerLoop() {
        while true {
            let due: Bool? = work.withLock { w in
                if w.stopping { return nil }
                guard let d = w.dueAt, d <= clock.now() else { return false }
                w.dueAt = nil
                w.status.running = true
                return true
            }
            guard let due else { return }
            if due {
                runOnce()
                continue
            }
            let (generation, timeout) = work.withLock { ($0.generation, $0.dueAt.map { max(0.01, $0 - clock.now()) }) }
            _ = work.withLock(waitingUntil: { $0.generation != generation }, timeout: timeout) { _ in }
        }
    }

    /// One background sync (or nothing: locked keybag, sync not set up), its outcome in the status and the log.
    private func runOnce() {
        var next: Double? = settings.intervalSeconds
        var outcome: Result<KeychainSync.Report, SecError>? = nil
        if service.isLocked {
            next = nil   // the unlock schedules the next one
        } else {
            outcome = engine.withLock { (e: inout KeychainSync?) -> Result<KeychainSync.Report, SecError>? in
                do throws(SecError) {
                    if e == nil { e = try KeychainSync.open(keychain: keychain, git: settings.git, report: gitReport) }
                    guard let sync = e else { return nil }
                    let report = try sync.sync(now: wallMillis()) { phase, done, total in noteProgress(phase, done, total) }
                    let fingerprint = sync.fingerprint()
                    work.withLock { $0.fingerprint = fingerprint }
                    if report.member { compactIfDue(sync) }
                    return .success(report)
                } catch {
                    return .failure(error)
                }
            }
            if outcome == nil { next = nil }
        }
        let conflicts = engine.withLock { $0.map { UInt32(clamping: $0.conflicts.count) } }
        let now = wallMillis()
        work.withLock { w in
            w.status.running = false
            (w.status.phase, w.status.done, w.status.total) = (.idle, 0, 0)
            w.progressShown = nil
            w.finished += 1
            switch outcome {
            case nil:
                if !service.isLocked {
                    w.configured = false
                    w.status.state = .off
                }
            case .success(let r)?:
                w.configured = true
                w.status.state = r.member ? .member : .waiting
                // A pairing under way is answered within seconds, not at the next interval.
                if !r.member { next = min(next ?? settings.pairingPollSeconds, settings.pairingPollSeconds) }
                w.status.lastSuccessMillis = now
                w.status.lastAttemptMillis = now
                w.status.lastError = ""
                w.status.applied &+= UInt32(clamping: r.applied)
                w.status.recorded &+= UInt32(clamping: r.recorded)
            case .failure(let error)?:
                w.configured = true
                w.status.lastAttemptMillis = now
                w.status.lastError = "\(error.status.name): \(Self.redacted(error.message))"
                next = min(settings.intervalSeconds, settings.retrySeconds)
            }
            if let conflicts { w.status.conflicts = conflicts }
            if let next {
                let at = clock.now() + next
                w.dueAt = min(w.dueAt ?? at, at)
            }
            w.generation += 1
        }
        work.broadcast()
        switch outcome {
        case .success(let r)?:
            if r.applied > 0 { service.schedule.announceItemsChanged() }
            if r.applied > 0 || r.recorded > 0 || r.conflicts > 0 || !r.refused.isEmpty {
                logger.info("sync", metadata: ["recorded": "\(r.recorded)", "applied": "\(r.applied)", "conflicts": "\(r.conflicts)",
                                               "refused": "\(r.refused.count)"])
            }
            for why in r.refused { logger.warning("sync refused a record or change", metadata: ["why": "\(why)"]) }
        case .failure(let error)?:
            logger.warning("sync failed; will try again", metadata: ["status": "\(error.status.name)", "error": "\(Self.redacted(error.message))"])
        case nil:
            break
        }
    }

    /// The running sync's phase and counts into the status SYNC_STATUS reads: at every new phase and
    /// end of a count, else at most every 0.2 s (the engine may call this for every record).
    private func noteProgress(_ phase: SyncStatus.Phase, _ done: Int, _ total: Int) {
        let now = clock.now()
        work.withLock { w in
            if let (p, at) = w.progressShown, p == phase, done < total, now - at < 0.2 { return }
            w.progressShown = (phase, now)
            w.status.phase = phase
            w.status.total = UInt32(clamping: total)
            w.status.done = min(UInt32(clamping: done), w.status.total)
        }
    }

    /// After a successful sync, at most every ``Settings/compactIntervalSeconds``: this device's
    /// records every member has applied and that were superseded are removed under a checkpoint. A
    /// failure is logged and tried again at the next interval; the sync itself stands.
    private func compactIfDue(_ sync: KeychainSync) {
        let now = clock.now()
        let due = work.withLock { w -> Bool in
            guard w.compactedAt.map({ now - $0 >= settings.compactIntervalSeconds }) ?? true else { return false }
            w.compactedAt = now
            return true
        }
        guard due else { return }
        do throws(SecError) {
            let done = try sync.compact(now: wallMillis()) { phase, done, total in noteProgress(phase, done, total) }
            service.schedule.announceItemsChanged() // (a compaction syncs first, and may apply records)
            if done.removed > 0 {
                logger.info("sync compacted", metadata: ["removed": "\(done.removed)", "kept": "\(done.kept)", "through": "\(done.through)"])
            }
        } catch {
            logger.warning("sync compaction failed; will try again", metadata: ["status": "\(error.status.name)",
                                                                               "error": "\(Self.redacted(error.message))"])
        }
    }

    /// `text` with the user and password of every URL in it (`scheme://user:token@host`) replaced by
    /// `***`: git's messages name the remote, which may carry a token.
    /// Where git's output goes when a git command of the sync fails: the log, credentials in URLs
    /// redacted and every control character escaped (what a remote prints cannot forge a log line).
    private var gitReport: @Sendable (String) -> Void {
        { [logger] text in logger.warning("git failed", metadata: ["output": "\(TerminalSafeText.escaped(Self.redacted(text)))"]) }
    }

    package static func redacted(_ text: String) -> String {
        let c = Array(text)
        var out = "", i = 0
        while i < c.count {
            out.append(c[i])
            guard i + 2 < c.count, c[i] == ":", c[i + 1] == "/", c[i + 2] == "/" else { i += 1; continue }
            out += "//"
            i += 3
            var end = i
            while end < c.count, !"/ \t\n'\"".contains(c[end]) { end += 1 }
            if let at = c[i..<end].lastIndex(of: "@") {
                out += "***"
                i = at
            }
        }
        return out
    }

    private func wallMillis() -> UInt64 { UInt64(max(0, wallClock.now() * 1000)) }

    // MARK: `coffer sync`

    /// Only the owner's own tools: a caller that may manage the whole keychain (the shell helper, or an
    /// unsigned process when they share a group), never a sandboxed app, and never through a front end
    /// (a delegated conversation).
    private func mayDriveSync(_ context: CallerContext, _ what: String) throws(SecError) {
        guard !context.isDelegated else {
            throw SecError(.missingEntitlement, "sync is managed only by the owner's coffer, not on a delegated connection")
        }
        try service.mayManageKeychain(context.caller, what)
    }

    /// ``mayDriveSync(_:_:)``, and the keybag unlocked.
    private func mayUseSync(_ context: CallerContext, _ what: String) throws(SecError) {
        try mayDriveSync(context, what)
        guard !service.isLocked else { throw SecError(.interactionNotAllowed, "the keychain is locked: unlock it first (coffer unlock)") }
    }

    /// SYNC_SETUP: founds a circle on `remote` (init) or asks to join it (join); this device's name and
    /// the pairing code to compare (empty for init).
    package func setup(_ operation: SyncSetupOperation, remote: String, name: String, _ context: CallerContext) throws(SecError) -> SyncCode {
        try mayUseSync(context, operation == .initialize ? "set up sync" : "join a sync circle")
        let now = wallMillis()
        let code = try engine.withLock { (e: inout KeychainSync?) throws(SecError) -> String in
            let stored = try keychain.syncState()
            if operation == .join, stored != nil {
                // A join that never made this machine a member (its pairing failed or was never
                // approved) starts again; anything else set up stays.
                if e == nil { e = try KeychainSync.open(keychain: keychain, git: settings.git, report: gitReport) }
                guard try e?.mayJoinAgain() == true else { throw .param("sync is already set up on this machine") }
                e = nil
            } else {
                guard e == nil && stored == nil else { throw .param("sync is already set up on this machine") }
            }
            switch operation {
            case .initialize:
                e = try KeychainSync.initialize(keychain: keychain, remote: remote, name: name, now: now, git: settings.git, report: gitReport)
                let fingerprint = e?.fingerprint() ?? ""
                work.withLock { $0.fingerprint = fingerprint }
                return ""
            case .join:
                work.withLock { $0.fingerprint = "" }
                let (sync, code) = try KeychainSync.join(keychain: keychain, remote: remote, name: name, now: now, git: settings.git, report: gitReport)
                e = sync
                return code
            }
        }
        work.withLock { w in
            w.configured = true
            w.status.state = operation == .initialize ? .member : .waiting
        }
        logger.notice(operation == .initialize ? "sync circle founded" : "asked to join a sync circle", metadata: ["device": "\(name)"])
        schedule(in: operation == .initialize ? settings.intervalSeconds : 0)
        return SyncCode(name: name, code: code)
    }

    /// Runs `body` with the engine (opened if needed); errSecItemNotFound-like refusal if sync is not set up.
    private func withEngine<T>(_ body: (KeychainSync) throws(SecError) -> T) throws(SecError) -> T {
        try engine.withLock { (e: inout KeychainSync?) throws(SecError) -> T in
            if e == nil { e = try KeychainSync.open(keychain: keychain, git: settings.git, report: gitReport) }
            guard let sync = e else { throw SecError(.notAvailable, "sync is not set up on this machine (coffer sync init or join)") }
            return try body(sync)
        }
    }

    /// SYNC_CIRCLE approve: the person authenticates (the new device will read every synced item),
    /// then the pairing request `code` names is answered and, once the joining machine's confirmation
    /// proves the code, the device is admitted: its name and the circle's fingerprint, which the
    /// joining machine shows too.
    package func approve(code: String, _ context: inout CallerContext, _ channel: (any AuthChannel)?) throws(SecError) -> SyncCode {
        try mayUseSync(context, "approve a device")
        try service.withPasscode(&context, channel, what: "let a new device into your sync circle (it will read every synced item)")
        let (name, fingerprint) = try withEngine { (s) throws(SecError) in
            try s.approve(code: code, now: wallMillis(), timeout: settings.pairingTimeoutSeconds, pollSeconds: settings.pairingPollSeconds / 2)
        }
        service.schedule.announceItemsChanged() // (an approval syncs, and may apply records)
        work.withLock { $0.fingerprint = fingerprint }
        logger.notice("sync device approved", metadata: ["device": "\(name)", "circle": "\(fingerprint)"])
        return SyncCode(name: name, code: fingerprint)
    }

    /// SYNC_CIRCLE circle: the circle's fingerprint as this machine knows it (empty while its pairing
    /// has not proved one), for the person to compare across machines.
    package func circle(_ context: CallerContext) throws(SecError) -> SyncCode {
        try mayDriveSync(context, "read the sync circle")
        // Never waits for a running sync (a slow remote): the fingerprint as the last one left it.
        return SyncCode(name: "", code: work.withLock { $0.fingerprint })
    }

    /// SYNC_CIRCLE remove: removes the device (id or unique name) and rotates the circle key.
    package func remove(device: String, _ context: CallerContext) throws(SecError) {
        try mayUseSync(context, "remove a sync device")
        try withEngine { (s) throws(SecError) in try s.remove(device: device, now: wallMillis()) }
        service.schedule.announceItemsChanged() // (a removal syncs, and may apply records)
        logger.notice("sync device removed", metadata: ["device": "\(device)"])
    }

    /// SYNC_CIRCLE devices.
    package func devices(_ context: CallerContext) throws(SecError) -> [SyncDeviceInfo] {
        try mayUseSync(context, "list the sync devices")
        return try withEngine { (s) throws(SecError) in
            let me = s.replica.keys.id.hex
            return try s.devices().map { SyncDeviceInfo(id: $0.id, name: $0.name, member: $0.member, thisDevice: $0.id == me) }
        }
    }

    /// SYNC_STATUS: the status now (never waits for a sync); `now`: runs a sync first, waiting for it
    /// (at most `timeout` seconds, then the status as it is).
    package func status(now: Bool, _ context: CallerContext, timeout: Double = 600) throws(SecError) -> SyncStatus {
        try mayDriveSync(context, "read the sync status")
        guard now else { return work.withLock { $0.status } }
        guard !service.isLocked else { throw SecError(.interactionNotAllowed, "the keychain is locked: a locked keychain syncs nothing") }
        let before = work.withLock { $0.finished }
        schedule(in: 0)
        return work.withLock(waitingUntil: { $0.finished > before || $0.stopping }, timeout: timeout) { $0.status }
            ?? work.withLock { $0.status }
    }

    /// SYNC_CONFLICTS restore: the person authenticates (a version of an item comes back on every
    /// machine), the conflict's losing version is written back as a local change, and a sync is due.
    package func restore(conflict id: String, _ context: inout CallerContext, _ channel: (any AuthChannel)?) throws(SecError) {
        try mayUseSync(context, "restore a sync conflict")
        try service.withPasscode(&context, channel, what: "restore a version of an item that lost a sync conflict, on every machine")
        try withEngine { (s) throws(SecError) in try s.restore(conflict: id) }
        service.schedule.announceItemsChanged()
        logger.notice("sync conflict restored", metadata: ["conflict": "\(id)"])
        schedule(in: 0)
    }

    /// SYNC_CONFLICTS: the conflicts kept, newest loser first.
    package func conflicts(_ context: CallerContext) throws(SecError) -> [SyncConflictInfo] {
        try mayUseSync(context, "list the sync conflicts")
        return try withEngine { (s) throws(SecError) in
            let names = Dictionary((try s.devices()).map { ($0.id, $0.name) }, uniquingKeysWith: { a, _ in a })
            return s.conflicts.sorted { $0.loserTime > $1.loserTime }.map { c in
                var cls = "?", service = "", account = ""
                if let (k, attrs) = try? SyncItem.decodeItemKey(c.itemKey) {
                    cls = k.rawValue
                    if case .string(let v)? = attrs["svce"] ?? attrs["srvr"] { service = v }
                    if case .string(let v)? = attrs["acct"] { account = v }
                }
                let device = c.loser.device.hex
                return SyncConflictInfo(id: KeychainSync.id(of: c), itemClass: cls, service: service, account: account, winnerMillis: c.winner.wallMillis,
                                        loserMillis: c.loserTime.wallMillis, loserDevice: names[device] ?? device, loserDeleted: c.loserDeleted)
            }
        }
    }
}
