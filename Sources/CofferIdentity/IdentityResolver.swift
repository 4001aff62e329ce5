package import CofferManifest
package import CofferModel
package import CofferSystem
import Glibc

/// Where the resolver finds the manifests that may vouch for an executable: verified manifests
/// only (trust roots and the manifest directories are loaded and checked elsewhere).
package protocol ManifestSource: Sendable {
    /// The verified manifests whose `executable` is `path` (others are ignored anyway).
    func manifests(forExecutable path: String) -> [Manifest]
    /// Moves whenever the set of manifests may have changed (a reload): identities the resolver
    /// remembers (``KnownProcesses``) from an earlier generation are established afresh.
    var generation: UInt64 { get }
}

extension ManifestSource {
    /// A source that never changes.
    package var generation: UInt64 { 0 }
}

/// A fixed list of already verified manifests.
package struct StaticManifestSource: ManifestSource {
    package let manifests: [Manifest]
    package init(_ manifests: [Manifest]) { self.manifests = manifests }
    package func manifests(forExecutable path: String) -> [Manifest] {
        manifests.filter { $0.executable.utf8.elementsEqual(path.utf8) }
    }
}

/// Why a connection got no identity at all (as opposed to an unsigned one): the peer could not be
/// pinned, or exited before identification ended. The connection must be refused.
package struct IdentityError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The failure, naming a system call or check (no values).
    package let underlying: SystemError
    package init(_ underlying: SystemError) { self.underlying = underlying }
    package var description: String { "caller could not be identified: \(underlying)" }
    /// errSecMissingEntitlement: an unidentified caller is entitled to nothing.
    package var secError: SecError { SecError(.missingEntitlement, description) }
}

/// Turns a connection, a pidfd or a pid into a ``CallerIdentity``: request → identity → policy → keychain.
///
/// The peer is pinned by a pidfd (``ProcessHandle``) and everything is read through its
/// `/proc/PID` directory: the executable is opened through `/proc/PID/exe` and that open file is
/// hashed (cached by file version) when a manifest names its path, and the pidfd is checked to be alive at the end, so a pid that
/// was reused meanwhile gives an error, never another process's identity. Refused (an error): a
/// zombie peer (the process that connected has exited while another holds the socket), a process in
/// a nested pid namespace whose executable or root cannot be read, an invalid `.flatpak-info` — a
/// caller is never taken for an unsigned one outside any sandbox for want of evidence. In order:
/// 1. a process whose root holds a valid `.flatpak-info` is `flatpak:APP_ID`;
/// 2. a traced process (`TracerPid` ≠ 0) is unsigned;
/// 3. a deleted or replaced executable (`(deleted)`, no links) is unsigned, and so is one on a
///    filesystem a process serves (FUSE: ``UntrustedFilesystem``);
/// 4. a verified manifest matching the executable's path and SHA-256 gives its app id and groups;
/// 5. anything else is unsigned (the unsigned policy is applied by the caller).
package struct IdentityResolver: Sendable {
    package let manifests: any ManifestSource
    package let hashes: ExecutableHashCache
    /// The identities established so far, by pinned process: a process's next connection (a front
    /// end's, a DELEGATE naming the same client) reuses its identity while it reads the same.
    package let known: KnownProcesses
    /// False forces the `pidfd_open` fallback of kernels before 6.5 (for tests).
    package let usePeerPIDFD: Bool

    package init(manifests: any ManifestSource, hashes: ExecutableHashCache = ExecutableHashCache(),
                 known: KnownProcesses = KnownProcesses(), usePeerPIDFD: Bool = true) {
        self.manifests = manifests
        self.hashes = hashes
        self.known = known
        self.usePeerPIDFD = usePeerPIDFD
    }

    /// Identity resolutions so far (COUNTERS: what an action costs, measured): a connection given a
    /// remembered identity (``KnownProcesses``) is not one.
    private let resolutions = Protected<UInt64>(0)
    package var identifications: UInt64 { resolutions.withLock { $0 } }

    /// The identity of the peer of the connected Unix socket `fd`. Throws if the peer cannot be
    /// pinned (already reaped) or exits before identification ends. Reads the peer's credentials: a
    /// server that read them when it accepted the connection calls ``identify(socket:peer:)``.
    package func identify(socket fd: Int32) throws(IdentityError) -> CallerIdentity {
        let peer: PeerIdentity
        do { peer = try PeerIdentity.of(socket: fd) } catch { throw IdentityError(error) }
        return try identify(socket: fd, peer: peer)
    }

    /// The identity of the peer of the connected Unix socket `fd`, whose credentials `peer` were
    /// read when the connection was accepted (`SO_PEERCRED` is not read again).
    package func identify(socket fd: Int32, peer: PeerIdentity) throws(IdentityError) -> CallerIdentity {
        let process: ProcessHandle
        do { process = try ProcessHandle.peer(ofSocket: fd, credentials: peer, usePeerPIDFD: usePeerPIDFD) } catch { throw IdentityError(error) }
        return try identify(process)
    }

    /// The identity of the process behind `pidfd` (a bus daemon's `ProcessFD`: no socket of its own
    /// connects the caller to the agent). Throws if that process has been reaped or exits before
    /// identification ends.
    package func identify(pidfd: consuming FileDescriptor) throws(IdentityError) -> CallerIdentity {
        let process: ProcessHandle
        do { process = try ProcessHandle.open(pidfd: pidfd) } catch { throw IdentityError(error) }
        return try identify(process)
    }

    /// The identity of the process that had `pid`, with effective uid `uid`, when the caller learned
    /// of it (a bus sender's credentials), and that started at `startTime` (clock ticks after boot,
    /// field 22 of `/proc/PID/stat`, as ``startTime(ofPID:)`` reads it when the caller learns the pid).
    /// The pid is pinned by a pidfd, and the uid and start time are read again through it: a process
    /// that is gone, or another one that has the pid now, is refused, never identified.
    /// Without `startTime` it is read just before pinning, so only a process that changes between
    /// that read and the pidfd is caught: a caller that can record the start time earlier should.
    package func identify(pid: Int32, uid: UInt32, startTime: UInt64?) throws(IdentityError) -> CallerIdentity {
        guard let expected = startTime ?? Self.startTime(ofPID: pid) else {
            throw IdentityError(SystemError(refusing: "pid \(pid)", "is not a live process", errno: ESRCH))
        }
        let process: ProcessHandle
        do { process = try ProcessHandle.open(pid: pid) } catch { throw IdentityError(error) }
        try Self.recheck(process, pid: pid, uid: uid, startTime: expected)
        return try identify(process, startTime: expected)
    }

    /// The identity of the process behind `pidfd`, handed over by a front end (DELEGATE) that says it
    /// is `pid` with start time `startTime` (read when the front end learned of it), checked again
    /// through the pidfd with the uid, which must be `uid` (the agent's user), as in
    /// ``identify(pid:uid:startTime:)``. The errors' errno tells the refusals apart: EBADF for a
    /// descriptor that is not a pidfd, EACCES for a process of another uid, ESRCH or another for a
    /// process that is gone or is not the one described.
    package func identify(pidfd: consuming FileDescriptor, pid: Int32, uid: UInt32, startTime: UInt64) throws(IdentityError) -> CallerIdentity {
        guard ProcessHandle.isPIDFD(pidfd) else {
            throw IdentityError(SystemError(refusing: "the descriptor passed", "is not a pidfd", errno: EBADF))
        }
        let process: ProcessHandle
        do { process = try ProcessHandle.open(pidfd: pidfd) } catch { throw IdentityError(error) }
        try Self.recheck(process, pid: pid, uid: uid, startTime: startTime)
        return try identify(process, startTime: startTime)
    }

    /// Checks through the pinned `process` what the caller knew of it: its pid, its effective uid
    /// (EACCES when it is another's) and its start time (`/proc/PID/stat` field 22).
    private static func recheck(_ process: borrowing ProcessHandle, pid: Int32, uid: UInt32, startTime expected: UInt64) throws(IdentityError) {
        func changed(_ why: String, errno: Int32 = ESRCH) -> IdentityError { IdentityError(SystemError(refusing: "pid \(pid)", why, errno: errno)) }
        guard process.pid == pid else { throw changed("is not the process behind the pidfd") }
        guard process.uid == uid else { throw changed("is not of uid \(uid)", errno: EACCES) }
        let stat: [UInt8]
        do { stat = try process.read("stat", maximumBytes: 4096) } catch { throw IdentityError(error) }
        guard let fields = LoginSessions.parseStat(stat[...]), fields.pid == pid else { throw changed("has an unreadable stat line") }
        guard fields.startTime == expected else { throw changed("is another process than the one that had it (another start time)") }
    }

    /// The start time of the live process `pid` (clock ticks after boot), for ``identify(pid:uid:startTime:)``.
    package static func startTime(ofPID pid: Int32) -> UInt64? { ProcessStat.of(pid: pid)?.startTime }

    /// The identity of a pinned process (see ``identify(socket:)``); `startTime` is its start time when
    /// the caller has already checked it through the pinned process (``recheck(_:pid:uid:startTime:)``).
    package func identify(_ process: borrowing ProcessHandle, startTime: UInt64? = nil) throws(IdentityError) -> CallerIdentity {
        // The start time, read through the pinned process, names this process apart from any later
        // one with its pid (what the agent grants one process is keyed by it).
        let ticks = startTime ?? (try? process.read("stat", maximumBytes: 4096)).flatMap { LoginSessions.parseStat($0[...]) }.flatMap {
            $0.pid == process.pid ? $0.startTime : nil
        }
        let identity = try examine(process, startTime: ticks).withProcessStartTime(ticks)
        guard process.isAlive() else {
            throw IdentityError(SystemError(refusing: "pid \(process.pid)", "exited during identification", errno: ESRCH))
        }
        return identity
    }

    /// The process's identity: remembered (``known``) if it was established for this process (its
    /// `startTime`) and what it rested on reads the same, else resolved (counted) and remembered.
    private func examine(_ process: borrowing ProcessHandle, startTime: UInt64?) throws(IdentityError) -> CallerIdentity {
        var reused = false
        defer { if !reused { resolutions.withLock { $0 &+= 1 } } }
        // The status file is world-readable: what it says is known even of a process whose
        // executable and root only its owner with ptrace rights may see. Without it, nothing is.
        // (Read when the process was pinned: ProcessHandle.status.)
        let status = process.status
        func refuse(_ why: String) -> IdentityError {
            IdentityError(SystemError(refusing: "pid \(process.pid)", why, errno: EPERM))
        }
        // A zombie (it connected, then exited; another process holds the socket) has no executable
        // or root left to examine: whoever holds the connection cannot be told, so nobody gets one.
        if let state = status["State"], state.hasPrefix("Z") || state.hasPrefix("X") {
            throw refuse("the peer is a zombie (the process that connected has exited)")
        }
        // In a pid namespace below the agent's (a sandbox: Flatpak always makes one), a process
        // whose root or executable cannot be read is refused, never taken for an unsigned caller
        // outside any sandbox.
        let nested = (status["NSpid"]?.split(whereSeparator: { $0 == "\t" || $0 == " " }).count ?? 1) > 1
        // The session id (the first of NSsid's per-namespace values: as the agent's namespace sees it).
        let sessionID = status["NSsid"]?.split(separator: "\t").first.flatMap { Int32($0) }
        // ...and what makes it unique (the leader's start time, the audit session): a session id
        // alone can be had again by any process that gets the old leader's pid and calls setsid().
        let session = sessionID.flatMap { LoginSessions.session(id: $0, auditSessionBytes: try? process.read("sessionid", maximumBytes: 32)) }
        let pathBytes: [UInt8]
        do { pathBytes = try process.executablePath() } catch {
            if nested { throw refuse("a sandboxed process whose executable cannot be read: \(error)") }
            return CallerIdentity(pid: process.pid, uid: process.uid,
                                  establishedBy: .unsigned(executablePath: "", reason: .unreadable("\(error)")), accessGroups: [],
                                  sessionID: sessionID, session: session)
        }
        let path = String(decoding: pathBytes, as: UTF8.self)
        func unsigned(_ path: String, _ reason: CallerIdentity.UnsignedReason) -> CallerIdentity {
            CallerIdentity(pid: process.pid, uid: process.uid, establishedBy: .unsigned(executablePath: path, reason: reason),
                           accessGroups: [], sessionID: sessionID, session: session)
        }

        // A process seen before, untraced, running the same file in the same session: its identity
        // then stands (KnownProcesses says what is read again, and why the rest cannot change).
        // The executable is opened once, for this and for step 3.
        let untraced = status["TracerPid"] == "0"
        if !untraced, let startTime { known.forget(uid: process.uid, pid: process.pid, startTime: startTime) }
        var exe: FileDescriptor? = nil
        var exeStatus: stat? = nil
        if untraced, let e = try? process.openExecutable() {
            exeStatus = try? e.status(path: "/proc/\(process.pid)/exe")
            if exeStatus != nil { exe = consume e }
        }
        let evidence = startTime == nil ? nil : exeStatus.map {
            KnownProcesses.Evidence(executablePath: pathBytes, status: $0, sessionID: sessionID, session: session, nested: nested)
        }
        let generation = manifests.generation
        if let startTime, let evidence,
           let known = known.identity(uid: process.uid, pid: process.pid, startTime: startTime, evidence: evidence, generation: generation) {
            reused = true
            return known
        }
        let identity = try resolve(process, status: status, path: path, pathBytes: pathBytes, exe: exe.take(), exeStatus: exeStatus, nested: nested,
                                   unsigned: unsigned, refuse: refuse, sessionID: sessionID, session: session)
        if let startTime, let evidence, let st = exeStatus, !hashes.isRacy(st) {
            known.remember(identity, uid: process.uid, pid: process.pid, startTime: startTime, evidence: evidence, generation: generation)
        }
        return identity
    }

    /// Steps 1 to 5 of the type's documentation, for a process whose status, executable path and
    /// session were read (the executable opened, when it could be: `exe`, whose status is `exeStatus`).
    private func resolve(_ process: borrowing ProcessHandle, status: [String: String], path: String, pathBytes: [UInt8],
                         exe opened: consuming FileDescriptor?, exeStatus: stat?, nested: Bool,
                         unsigned: (String, CallerIdentity.UnsignedReason) -> CallerIdentity, refuse: (String) -> IdentityError,
                         sessionID: Int32?, session: CallerIdentity.LoginSession?) throws(IdentityError) -> CallerIdentity {

        // 1. Flatpak: the sandbox is the boundary, no manifest needed (and a tracer inside it changes
        //    nothing: the app id is the sandbox's, not the executable's).
        do {
            if let info = try process.readInRoot(".flatpak-info", maximumBytes: FlatpakInfo.maximumBytes) {
                guard let app = FlatpakInfo.appID(from: info) else { throw refuse("invalid .flatpak-info") }
                return CallerIdentity(pid: process.pid, uid: process.uid, establishedBy: .flatpak(appID: app),
                                      accessGroups: [CallerIdentity.flatpakGroupPrefix + app], executable: path, sessionID: sessionID, session: session)
            }
        } catch let e as IdentityError {
            throw e
        } catch let e as SystemError where !nested && (e.errno == EACCES || e.errno == EPERM) {
            // A process outside any sandbox that its owner made non-dumpable: its root is not ours
            // to read. It is the user's, like any unsigned caller.
            return unsigned(path, .unreadable("\(e)"))
        } catch {
            // A .flatpak-info that is a link, a directory or too large, or a sandbox's root that
            // cannot be read: a sandbox it is, and which one cannot be told.
            throw refuse("the caller's .flatpak-info cannot be used: \(error)")
        }

        // 2. Traced: whatever runs may not be what the executable says.
        guard let field = status["TracerPid"], let tracer = Int32(field) else {
            return unsigned(path, .unreadable("no TracerPid in status"))
        }
        if tracer != 0 { return unsigned(path, .traced(tracerPID: tracer)) }

        // 3. The running file itself, never its path.
        let exe: FileDescriptor, st: stat
        if let given = opened.take(), let known = exeStatus {
            exe = given
            st = known
        } else {
            do { exe = try process.openExecutable() } catch { return unsigned(path, .unreadable("\(error)")) }
            do { st = try exe.status(path: "/proc/\(process.pid)/exe") } catch { return unsigned(path, .unreadable("\(error)")) }
        }
        if st.st_nlink == 0 || pathBytes.reversed().starts(with: Array(" (deleted)".utf8).reversed()) {
            return unsigned(path, .executableDeleted)
        }
        if let kind = UntrustedFilesystem.kind(ofOpenFile: exe) { return unsigned(path, .untrustedFilesystem(kind)) }
        // 4. A verified manifest for this path and hash. The file is hashed only when a manifest names
        //    its path: the hash is compared with nothing else, and reading a large program that no
        //    manifest could match (a shell, an interpreter, a browser) is the slowest part of a first
        //    identification.
        let candidates = manifests.manifests(forExecutable: path)
        if candidates.isEmpty { return unsigned(path, .noMatchingManifest) }
        let digest: [UInt8]
        do { digest = try hashes.sha256(fileDescriptor: exe.rawValue, status: st) } catch { return unsigned(path, .unreadable("\(error)")) }
        for m in candidates where m.matches(executablePath: pathBytes, sha256: digest) {
            return CallerIdentity(pid: process.pid, uid: process.uid, establishedBy: .signedManifest(appID: m.app),
                                  accessGroups: m.accessGroups, executable: path, sessionID: sessionID, session: session,
                                  mayDelegate: m.entitlements.contains(.delegateIdentity),
                                  mayServePortalSecrets: m.entitlements.contains(.portalSecret))
        }
        return unsigned(path, candidates.isEmpty ? .noMatchingManifest : .executableChanged)
    }
}
