import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferModel
import CofferSystem
import Glibc

/// `coffer sync …`: keychain sync across the person's machines through a git remote (issue #29).
struct SyncCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sync",
        abstract: "Sync items across your machines through a git remote, end-to-end encrypted.",
        discussion: """
            Items added with --sync (in a class without this-device-only, without an access control) go to \
            every machine of your circle. 'coffer sync init --remote URL' on the first machine; on each other \
            one 'coffer sync join --remote URL', then 'coffer sync approve CODE' on a machine already in the \
            circle, comparing the code both screens show. The agent syncs in the background: at unlock, every \
            sync-interval seconds, and shortly after a write.
            """,
        subcommands: [Init.self, Join.self, Approve.self, Devices.self, Remove.self, Status.self, Conflicts.self])

    /// This machine's name by default: its host name.
    static func hostName() -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "machine" }
        let name = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return name.isEmpty ? "machine" : String(name.prefix(64))
    }

    struct Init: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Start a circle on an empty git remote with this machine as its first member.")
        @OptionGroup var connect: Connect
        @Option(help: "The git remote (a URL or path git can push to; it must be empty).") var remote: String
        @Option(help: "This machine's name in the circle (default: its host name).") var name: String?

        func run() throws {
            try reporting { () throws(SecError) in
                let c = try connect.open().syncSetup(.initialize, remote: remote, name: name ?? SyncCommand.hostName())
                Output.print("sync circle started on \(Output.escapedText(remote)) with this machine, \(Output.escapedText(c.name))")
                Output.print("on another machine: coffer sync join --remote \(Output.escapedText(remote))")
            }
        }
    }

    struct Join: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Ask to join the circle on a git remote: prints a pairing code and waits for a member to approve it.")
        @OptionGroup var connect: Connect
        @Option(help: "The circle's git remote.") var remote: String
        @Option(help: "This machine's name in the circle (default: its host name).") var name: String?
        @Option(help: "Seconds to wait for the approval (0: do not wait; the agent keeps checking in the background).") var wait: Int = 600

        func run() throws {
            try reporting { () throws(SecError) in
                let conn = try connect.open()
                let c = try conn.syncSetup(.join, remote: remote, name: name ?? SyncCommand.hostName())
                Output.print("pairing code: \(Output.escapedText(c.code))")
                Output.print("on a machine of the circle run: coffer sync approve \(Output.escapedText(c.code))")
                Output.print("the code is shown only here and never leaves this machine; type it there yourself.")
                guard wait > 0 else { return }
                Output.printError("coffer: waiting for the approval (up to \(wait) s)…")
                let line = SyncProgressLine.start(connect)
                defer { line?.finish() }
                let deadline = Double(time(nil)) + Double(wait)
                while Double(time(nil)) < deadline {
                    let s = try conn.syncStatus(now: true)
                    if s.state == .member {
                        line?.finish()
                        let fingerprint = try conn.syncCircleFingerprint()
                        Output.print("approved: this machine is in the circle \(Output.escapedText(fingerprint)); items arrive in the background")
                        Output.print("check that the approving machine showed the same circle fingerprint.")
                        return
                    }
                    if s.lastError.contains("pairing failed") {
                        // "errSecAuthFailed: pairing failed: why": the agent's words after the status name.
                        let why = s.lastError.split(separator: ":", maxSplits: 1).last.map { String($0.drop(while: { $0 == " " })) }
                        throw SecError(.authFailed, why ?? s.lastError)
                    }
                    sleep(1)
                }
                throw .notAvailable("not approved yet; the agent keeps checking in the background (coffer sync status)")
            }
        }
    }

    struct Approve: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Let the machine that shows CODE into the circle (asks for your passcode); both then show the circle's fingerprint to compare.")
        @OptionGroup var connect: Connect
        @OptionGroup var auth: AuthenticationArguments
        @Argument(help: "The pairing code the joining machine shows (XXXX-XXXX-XXXX).") var code: String

        func run() throws {
            try reporting { () throws(SecError) in
                let conn = try connect.open()
                try auth.apply(to: conn)
                Output.printError("coffer: waiting for the joining machine to confirm…")
                let c = try conn.syncApprove(code: code)
                Output.print("approved \(Output.escapedText(c.name)) into the circle \(Output.escapedText(c.code))")
                Output.print("check that \(Output.escapedText(c.name)) shows the same circle fingerprint")
            }
        }
    }

    struct Devices: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the circle's machines.")
        @OptionGroup var connect: Connect

        func run() throws {
            try reporting { () throws(SecError) in
                for d in try connect.open().syncDevices() {
                    Output.print("\(Output.escapedText(d.name))\t\(d.id)\t\(d.member ? "member" : "not a member")\(d.thisDevice ? "\tthis machine" : "")")
                }
            }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a machine (its name or id) and rotate the circle key: it reads nothing written afterwards.")
        @OptionGroup var connect: Connect
        @Argument(help: "The machine's name or id (coffer sync devices).") var device: String

        func run() throws {
            try reporting { () throws(SecError) in
                try connect.open().syncRemove(device: device)
                Output.printError("coffer: removed \(Output.escapedText(device)) from the circle; the circle key was rotated")
            }
        }
    }

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show the background sync: state, last sync, last failure.")
        @OptionGroup var connect: Connect
        @Flag(help: "Sync now first and show the outcome.") var now = false

        func run() throws {
            try reporting { () throws(SecError) in
                let conn = try connect.open()
                let line = now ? SyncProgressLine.start(connect) : nil
                let s = try { () throws(SecError) in
                    defer { line?.finish() }
                    return try conn.syncStatus(now: now)
                }()
                let state = switch s.state {
                case .off: "off (coffer sync init or join)"
                case .waiting where s.lastError.contains("removed from the circle"):
                    "removed from the circle by another member (coffer sync join sets it up again)"
                case .waiting where s.lastError.contains("earlier pairing"):
                    "asked to join under an earlier pairing (coffer sync join again for a new code)"
                case .waiting where s.lastError.contains("pairing failed"):
                    "pairing failed (coffer sync join again for a new code)"
                case .waiting: "waiting for approval (coffer sync approve CODE on a member)"
                case .member: "member of the circle"
                case .unknown: "unknown until the keychain is unlocked"
                }
                // The circle's fingerprint, to compare across machines (an agent older than it: none).
                let circle = s.state == .off ? "" : ((try? conn.syncCircleFingerprint()) ?? "")
                Output.print("""
                    sync: \(state)
                    circle: \(circle.isEmpty ? "none yet" : Output.escapedText(circle))
                    running: \(s.running ? "yes (" + SyncCommand.progress(s) + ")" : "no")
                    last sync: \(Self.ago(s.lastSuccessMillis))
                    last attempt: \(Self.ago(s.lastAttemptMillis))
                    last error: \(s.lastError.isEmpty ? "none" : Output.escapedText(s.lastError))
                    interval: \(s.intervalSeconds) s
                    applied: \(s.applied)
                    sent: \(s.recorded)
                    conflicts: \(s.conflicts)
                    """)
                // --now reports the sync it ran: a failed one fails the command, with the failure's
                // own status ("errSecAuthFailed: pairing failed: …" exits as errSecAuthFailed).
                if now, !s.lastError.isEmpty {
                    let name = s.lastError.prefix { $0 != ":" }
                    let status = SecStatus.allCases.first { $0.name == name } ?? .io
                    throw SecError(status, "the sync failed: \(s.lastError.drop { $0 != ":" }.dropFirst().drop { $0 == " " })")
                }
            }
        }

        static func ago(_ millis: UInt64) -> String {
            guard millis > 0 else { return "never (since the agent started)" }
            let ago = max(0, Int64(time(nil)) - Int64(millis / 1000))
            return "\(ago) s ago"
        }
    }

    /// Where a running sync is, for a person: `verifying 3,200 of 10,000 records`.
    static func progress(_ s: SyncStatus) -> String {
        func n(_ v: UInt32) -> String {
            var digits = Array(String(v)), out = ""
            while digits.count > 3 { out = "," + String(digits.suffix(3)) + out; digits.removeLast(3) }
            return String(digits) + out
        }
        return switch s.phase {
        case .idle: "starting"
        case .fetching: "fetching"
        case .verifying: "verifying \(n(s.done)) of \(n(s.total)) records"
        case .applying: "applying \(n(s.total)) records"
        case .pushing: s.total > 0 ? "pushing (\(n(s.total)) records received)" : "pushing"
        }
    }

    struct Conflicts: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List the conflicts: versions that lost to a later edit on another machine (kept, not dropped); --restore ID brings one back.")
        @OptionGroup var connect: Connect
        @OptionGroup var auth: AuthenticationArguments
        @Option(help: "Write back the losing version of this conflict (asks for your passcode): it becomes the newest version on every machine.")
        var restore: String?

        func run() throws {
            try reporting { () throws(SecError) in
                let conn = try connect.open()
                if let restore {
                    try auth.apply(to: conn)
                    try conn.syncRestore(conflict: restore)
                    Output.printError("coffer: restored the losing version of \(Output.escapedText(restore)); it goes to your other machines at the next sync")
                    return
                }
                let list = try conn.syncConflicts()
                guard !list.isEmpty else {
                    Output.printError("coffer: no conflicts")
                    return
                }
                for c in list {
                    let what = c.loserDeleted ? "a deletion" : "an edit"
                    // Times as people read them (UTC), not raw milliseconds.
                    Output.print("\(Output.escapedText(c.id))\t\(c.itemClass)\t\(Output.escapedText(c.service))\t\(Output.escapedText(c.account))\tlost: \(what) by \(Output.escapedText(c.loserDevice)) at \(Self.time(c.loserMillis))\twinner at \(Self.time(c.winnerMillis))")
                }
            }
        }

        /// `millis` (Unix milliseconds) as `2026-12-06 05:40:12 UTC`.
        static func time(_ millis: UInt64) -> String {
            var t = time_t(millis / 1000), parts = tm()
            guard gmtime_r(&t, &parts) != nil else { return "\(millis) ms" }
            func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
            return "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday)) \(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) UTC"
        }
    }
}


/// One line on standard error that keeps showing where the agent's sync is (`sync: verifying 3,200 of
/// 10,000 records`) while a `coffer sync` command waits for a sync: a thread polls SYNC_STATUS, which
/// never waits, over a second connection every 0.2 s and rewrites the line; ``finish()`` clears it.
/// Only when standard error is a terminal: a script sees no progress noise.
final class SyncProgressLine: @unchecked Sendable {
    private let poller: AgentConnection
    private let state = Protected((stop: false, stopped: false))

    private init(_ poller: AgentConnection) { self.poller = poller }

    /// Starts the line's thread; nil (no line) when standard error is not a terminal or the second
    /// connection or thread cannot be had (the command goes on without progress).
    static func start(_ connect: Connect) -> SyncProgressLine? {
        guard isatty(2) == 1, let conn = try? connect.open() else { return nil }
        let line = SyncProgressLine(conn)
        return Threads.detach { line.run() } ? line : nil
    }

    private func run() {
        var shown = ""
        while !state.withLock({ $0.stop }) {
            if let s = try? poller.syncStatus(now: false) {
                let text = s.running ? "sync: " + SyncCommand.progress(s) : ""
                if text != shown {
                    Self.put("\r\u{1B}[K" + text)
                    shown = text
                }
            }
            _ = state.withLock(waitingUntil: { $0.stop }, timeout: 0.2) { _ in }
        }
        if !shown.isEmpty { Self.put("\r\u{1B}[K") }
        state.withLock { $0.stopped = true }
        state.broadcast()
    }

    private static func put(_ text: String) {
        _ = Array(text.utf8).withUnsafeBytes { Output.write(2, $0) }
    }

    /// Ends the polling and clears the line (waits for the thread, at most a few seconds).
    func finish() {
        state.withLock { $0.stop = true }
        state.broadcast()
        _ = state.withLock(waitingUntil: { $0.stopped }, timeout: 5) { _ in }
    }
}
