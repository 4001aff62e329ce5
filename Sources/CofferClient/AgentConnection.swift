public import CofferCrypto
public import CofferModel
public import CofferProtocol
import CofferSystem
import Glibc

/// A blocking connection to the Coffer agent: one request at a time, replies in order.
///
/// Not thread-safe (use one per thread, or ``CofferClient`` from async code). Frames that carried a
/// passcode or secret are wiped after use; secrets arrive in ``CofferCrypto/SecureBytes``.
public final class AgentConnection {
    private let fd: Int32
    /// The socket path this connection uses.
    public let path: String
    /// The protocol version agreed in HELLO.
    public private(set) var version: UInt16 = 0
    /// The agent's version string from HELLO.
    public private(set) var agentVersion = ""
    private var nextID: UInt32 = 1
    private var pendingEvents: [LockEvent] = []
    /// Who answers when the agent needs the person (AUTH_NEEDED): a terminal prompt in the CLI. Nil:
    /// such a request fails with errSecInteractionNotAllowed (the agent is told "cancel").
    public var authenticationDelegate: (any AuthenticationDelegate)?
    /// How long to poll for a reply before sleeping in `recv`, learnt from this connection's last replies
    /// (``AdaptiveSpin``): most take tens of microseconds, less than a scheduler wake-up costs; a search of
    /// a large keychain on a busy machine, longer; the agent's work for a front end acting for others
    /// (identifying a new process), often longer than polling pays for. Slow replies (unlock, PAM, the
    /// person) block as usual.
    private var replySpin = AdaptiveSpin(initialMicros: 60, ceilingMicros: 200)

    /// The socket to use: `explicit`, else `$COFFER_SOCKET`, else `$XDG_RUNTIME_DIR/coffer/agent.sock`,
    /// else `/run/user/UID/coffer/agent.sock` (``CofferModel/AgentPaths/defaultSocket(explicit:environment:uid:)``,
    /// the same answer the agent and `pam_coffer` reach, also from cron or sudo where
    /// `XDG_RUNTIME_DIR` is unset).
    public static func socketPath(explicit: String? = nil) -> String {
        AgentPaths.defaultSocket(explicit: explicit, environment: ThisProcess.environment(["COFFER_SOCKET", "XDG_RUNTIME_DIR"]),
                                 uid: geteuid())
    }

    /// Connects and says HELLO. With `pipelineHello`, HELLO goes out without waiting for its reply,
    /// which is read with the first request's (one round trip fewer for a one-request client such as
    /// `coffer get`); ``version`` and ``agentVersion`` are then known only after the first request,
    /// and a refused HELLO is thrown by it.
    ///
    /// With a `replyTimeout` (seconds, 0: none), a reply that does not come in time fails the
    /// request with errSecIO instead of waiting for it: for a caller that must never hang on a stuck
    /// agent, such as shell completion.
    /// `maximumVersion` caps the protocol versions announced (default: every version this library
    /// speaks): a client may keep to an older version's limits, as tests of those versions do.
    public init(path: String, clientName: String = "CofferClient", pipelineHello: Bool = false,
                replyTimeout: Double = 0, maximumVersion: UInt16 = WireFormat.version) throws(SecError) {
        self.path = path
        let socket: Int32
        do {
            socket = try UnixSocket.connect(path: path)
        } catch {
            let (reason, hint) = Hints.unreachable(socket: path, errno: error.errno)
            let e = SecError(.io, "cannot reach the agent at \(path): \(reason)")
            throw hint.map { e.withHint($0) } ?? e
        }
        if let refusal = Self.checkServer(of: socket, path: path) {
            close(socket)
            throw refusal
        }
        fd = socket
        if replyTimeout > 0 { setReplyTimeout(replyTimeout) }
        // Any version this library speaks: an agent of version 1 answers 1 (feedback then has no kind).
        let hello = AgentRequest.hello(minVersion: WireFormat.minimumVersion, maxVersion: min(maximumVersion, WireFormat.version),
                                       clientName: clientName)
        if pipelineHello {
            try send(hello, id: takeID())
            helloPending = true
        } else {
            try acceptHello(try roundTrip(hello))
        }
    }

    private var helloPending = false

    /// Who serves the socket, checked before a single byte is sent (passcodes and secrets must reach
    /// only the user's own agent; a socket planted by another uid gets nothing). One getsockopt.
    static func checkServer(of fd: Int32, path: String) -> SecError? {
        let server: UInt32
        do {
            server = try UnixSocket.peerUID(fd)
        } catch {
            return .io("cannot tell who serves the socket \(path) (SO_PEERCRED: \(String(cString: strerror(error.errno)))); refusing to talk to it")
        }
        let me = geteuid()
        guard server == me else {
            return .io("the socket \(path) is served by uid \(server), not by you (uid \(me)); refusing to talk to it")
        }
        return nil
    }

    private func acceptHello(_ reply: AgentResponse) throws(SecError) {
        guard case .helloReply(let v, let agent) = reply else { throw unexpected(reply) }
        version = v
        agentVersion = agent
    }

    deinit { close(fd) }

    /// From now on, a request whose reply (or the next part of it) takes longer than `seconds` fails
    /// with errSecIO, and so do a send the agent does not take in that time and a ``nextEvent()``
    /// that waits longer (0: wait as long as it takes). The time a person takes to answer the
    /// ``authenticationDelegate``'s prompt is not bounded. The connection is not usable after such a
    /// failure.
    public func setReplyTimeout(_ seconds: Double) {
        UnixSocket.setTimeouts(fd, send: seconds, receive: seconds)
        replyTimeout = seconds
    }

    private var replyTimeout = 0.0

    /// True once the agent has closed its end (it exited or restarted) or the socket failed: no
    /// request on this connection can succeed, and a new one must be opened. One poll, no wait;
    /// bytes waiting to be read (an EVENT) do not count.
    public var isHungUp: Bool {
        var p = pollfd(fd: fd, events: Int16(0x2000 /* POLLRDHUP */), revents: 0)
        guard poll(&p, 1, 0) > 0 else { return false }
        return p.revents & Int16(0x2000 | POLLHUP | POLLERR | POLLNVAL) != 0
    }

    /// True if the agent speaks protocol version 3 on this connection: PROMPT_READ answers with a
    /// grant to the delegated process, and a search may ask for each match's access state.
    public var grantsPromptReads: Bool { version >= WireFormat.grantingVersion }

    /// True if bytes from the agent wait to be read (an EVENT not yet taken by ``nextEvent()``). One
    /// poll, no wait; safe from another thread than the one reading.
    public var hasUnreadBytes: Bool {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&p, 1, 0) > 0 else { return false }
        return p.revents & Int16(POLLIN) != 0
    }

    /// The connection ended (or, with a reply timeout, the agent did not answer in time).
    private func closed(_ how: String = "closed the connection") -> SecError {
        .io("the agent at \(path) \(how)" + (replyTimeout > 0 ? " or did not answer within \(replyTimeout) s" : ""))
    }

    // MARK: Operations

    /// STATUS.
    public func status() throws(SecError) -> StatusReply {
        let r = try roundTrip(.status)
        guard case .status(let s) = r else { throw unexpected(r) }
        return s
    }

    /// UNLOCK with the passcode (checked by PAM, then the keybag).
    public func unlock(passcode: SecureBytes) throws(SecError) { try expectOK(.unlock(passcode: passcode)) }

    /// PROTECTIONS: the device key's place, who counts wrong passcodes, rollback detection. An agent
    /// from before issue #28 answers errSecParam (unknown message type).
    public func protections() throws(SecError) -> ProtectionsReply {
        let r = try roundTrip(.protections)
        guard case .protections(let p) = r else { throw unexpected(r) }
        return p
    }

    /// COUNTERS: what the agent has done since it started (connections, requests, identity
    /// resolutions, keychain searches). An agent from before issue #42's counters answers errSecParam.
    public func counters() throws(SecError) -> AgentCounters {
        let r = try roundTrip(.counters)
        guard case .counters(let c) = r else { throw unexpected(r) }
        return c
    }

    /// NOTE_ACCESS: on a connection delegated to a client, tells the agent what the client did with an
    /// item this front end holds itself, for the audit log. errSecMissingEntitlement on a connection
    /// that was not delegated; an agent from before it answers errSecParam (unknown message type).
    public func noteAccess(_ access: NotedAccess) throws(SecError) {
        try expectOK(.noteAccess(access))
    }

    /// PROMPTER: the pinentry the agent runs for its own dialogs and why, and where they appear. An
    /// agent from before issue #43 answers errSecParam (unknown message type).
    public func prompter() throws(SecError) -> PrompterReply {
        let r = try roundTrip(.prompter)
        guard case .prompter(let p) = r else { throw unexpected(r) }
        return p
    }

    /// LOCK now.
    public func lock() throws(SecError) { try expectOK(.lock) }

    /// PROMPT_UNLOCK (a delegated connection only): the agent asks the person for the passcode with
    /// its own pinentry and unlocks the keybag. Waits as long as the person takes (the agent's
    /// prompter bounds it); ``cancel()`` from another thread ends it (the agent's pinentry closes).
    public func promptUnlock() throws(SecError) { try expectOK(.promptUnlock) }

    /// PROMPT_READ (a delegated connection only): COPY_MATCHING (`query`, at most one frame of
    /// results) whose authentication the agent's own prompter answers (its pinentry, the biometric
    /// sensor). Waits as long as the person takes; ``cancel()`` from another thread ends it.
    public func promptRead(_ query: ItemQuery) throws(SecError) -> [ItemResult] {
        let r = try roundTrip(.promptRead(query))
        guard case .items(let items) = r else { throw unexpected(r) }
        return items
    }

    /// Ends the connection at once, from any thread: a request waiting for its reply fails, and the
    /// agent sees the hang-up (a prompt it shows for this connection closes).
    public func cancel() { _ = shutdown(fd, Int32(SHUT_RDWR)) }

    /// Sets the first passcode (`current` nil) or changes it.
    public func setPasscode(current: SecureBytes?, new: SecureBytes) throws(SecError) {
        try expectOK(.setPasscode(current: current ?? SecureBytes(count: 0), new: new))
    }

    /// SecItemAdd; returns the parts named in `returning` (nil when empty).
    @discardableResult
    public func add(_ item: NewItem, returning flags: ReturnFlags = []) throws(SecError) -> ItemResult? {
        let r = try roundTrip(.add(item, flags))
        guard case .items(let items) = r else { throw unexpected(r) }
        counted(item.attributes)
        return items.first
    }

    /// How many ADD, KEY_CREATE, UPDATE and DELETE requests this connection sent that succeeded: each is one
    /// `itemsChanged` event to the agent's subscribers (WireProtocol.md, Events), so a front end can
    /// tell its own changes from others'.
    public private(set) var writes = 0

    /// ``writes`` by the access group each request named (`agrp` of the new item, or of the query,
    /// and of the changes when an update moves items): a request that names its group is announced
    /// in that group alone, so a front end whose writes all name theirs can tell its own changes from
    /// others' group by group. A request naming none is counted under "".
    public private(set) var writesByGroup: [String: Int] = [:]

    private func counted(_ attributes: Attributes, _ moved: Attributes = [:]) {
        writes += 1
        var groups: Set<String> = []
        for a in [attributes, moved] { if let g = a.accessGroup { groups.insert(g) } }
        if groups.isEmpty { groups = [""] }
        for g in groups { writesByGroup[g, default: 0] += 1 }
    }

    /// SecKeyCreateRandomKey with a permanent key (KEY_CREATE): the agent makes the key (`creation`
    /// `.generate`, its algorithm in `attributes`' `type` and `bsiz`) or stores the one given, as a
    /// non-extractable key item; returns the parts named in `returning` (never the private half).
    @discardableResult
    public func createKey(_ creation: KeyCreation, attributes: Attributes, returning flags: ReturnFlags = []) throws(SecError) -> ItemResult? {
        let r = try roundTrip(.keyCreate(creation, attributes: attributes, flags))
        guard case .items(let items) = r else { throw unexpected(r) }
        counted(attributes)
        return items.first
    }

    /// SecKeyCreateSignature with a key made in the agent (KEY_SIGN): the SSH signature blob (string
    /// algorithm ‖ string signature) of `data` by the key item `query` names. The key's access control is
    /// answered on this connection, as for COPY_MATCHING: an evaluation it holds (LA_EVALUATE with a reuse
    /// duration) covers it. `flags`: ssh-agent's signature flags (RSA's hash; 0 for other keys). An agent
    /// older than KEY_SIGN answers errSecParam "unknown message type".
    public func signWithKey(_ query: ItemQuery, data: [UInt8], flags: UInt32 = 0) throws(SecError) -> [UInt8] {
        let r = try roundTrip(.keySign(query, data: data, flags: flags))
        guard case .signature(let blob) = r else { throw unexpected(r) }
        return blob
    }

    /// SecItemCopyMatching. A search for one item is one COPY_MATCHING round trip; any other
    /// limit is fetched page by page (``forEachPage(_:_:)``), so a result of any size arrives.
    public func copyMatching(_ query: ItemQuery) throws(SecError) -> [ItemResult] {
        guard query.limit != .one else {
            let r = try roundTrip(.copyMatching(query))
            // A locked match (present 0x14) answers only a query that asked for them.
            guard case .items(let items) = r, query.listsLockedItems || !items.contains(where: \.locked) else { throw unexpected(r) }
            return items
        }
        var all: [ItemResult] = []
        try forEachPage(query) { page in all.append(contentsOf: page) }
        return all
    }

    /// SecItemUpdate; returns how many items changed.
    @discardableResult
    public func update(_ query: ItemQuery, _ changes: ItemChanges) throws(SecError) -> Int {
        let r = try roundTrip(.update(query, changes))
        guard case .count(let n) = r else { throw unexpected(r) }
        counted(query.attributes, changes.attributes)
        return Int(n)
    }

    /// SecItemDelete; returns how many items were deleted.
    @discardableResult
    public func delete(_ query: ItemQuery) throws(SecError) -> Int {
        let r = try roundTrip(.delete(query))
        guard case .count(let n) = r else { throw unexpected(r) }
        counted(query.attributes)
        return Int(n)
    }

    /// The identity the agent gives this process and the access groups its item requests use.
    public func whoami() throws(SecError) -> WhoAmIReply {
        let r = try roundTrip(.whoami)
        guard case .whoami(let w) = r else { throw unexpected(r) }
        return w
    }

    /// AUTHORIZE: the user's passcode lets this connection use `accessGroup` (the shell helper only;
    /// others get errSecMissingEntitlement, a wrong passcode errSecAuthFailed).
    public func authorize(accessGroup: String, passcode: SecureBytes) throws(SecError) {
        try expectOK(.authorize(accessGroup: accessGroup, passcode: passcode))
    }

    /// AUTH_OPTIONS: how this connection's later requests may authenticate (an `LAContext`: no user
    /// interface, an operation prompt, a passcode given in advance, a reuse duration).
    public func setAuthenticationOptions(_ options: AuthenticationOptions) throws(SecError) { try expectOK(.authOptions(options)) }

    /// AUTH_OPTIONS without waiting for the agent's OK: it is read before the next request's reply
    /// (the agent answers in order and applies the options first), so options and request cost one
    /// round trip. If the agent refuses the options, the next request throws that refusal and the
    /// connection is closed: the request behind them ran under options the caller did not want.
    public func pipelineAuthenticationOptions(_ options: AuthenticationOptions) throws(SecError) {
        let id = takeID()
        try send(.authOptions(options), id: id)
        pendingOKs.append(id)
    }

    /// Requests sent by ``pipelineAuthenticationOptions(_:)`` whose OK is still to be read, oldest first.
    private var pendingOKs: [UInt32] = []

    /// Reads the replies owed before the next one: a pipelined HELLO's, then each pipelined OK.
    private func awaitPipelined() throws(SecError) {
        if helloPending { try awaitHello() }
        while !pendingOKs.isEmpty {
            let id = pendingOKs.removeFirst()
            while true {
                let (rid, r) = try readResponse()
                if case .event(let e) = r { pendingEvents.append(e); continue }
                guard rid == id, case .ok = r else {
                    pendingOKs = []
                    _ = shutdown(fd, Int32(SHUT_RDWR))
                    if case .error(let e) = r { throw e }
                    throw unexpected(r)
                }
                break
            }
        }
    }

    /// LocalAuthentication's canEvaluatePolicy.
    public func canEvaluate(_ policy: LAPolicy) throws(SecError) -> LAResult {
        let r = try roundTrip(.laCanEvaluate(policy))
        guard case .laResult(let l) = r else { throw unexpected(r) }
        return l
    }

    /// LocalAuthentication's evaluatePolicy (the ``authenticationDelegate`` talks to the person).
    public func evaluate(_ policy: LAPolicy, reason: String) throws(SecError) -> LAResult {
        let r: AgentResponse
        do {
            r = try roundTrip(.laEvaluate(policy, reason: reason))
        } catch where error.status == .interactionNotAllowed {
            // Nobody to ask (no delegate): LocalAuthentication's notInteractive.
            return LAResult(error: .notInteractive, biometryType: 0, domainState: [], message: error.message)
        }
        guard case .laResult(let l) = r else { throw unexpected(r) }
        return l
    }

    /// CHECK: verifies every item (`.verify`), also quarantines those failing authentication
    /// (`.quarantine`), lists the quarantine, or restores one quarantined item.
    public func check(_ operation: CheckOperation) throws(SecError) -> CheckReport {
        let r = try roundTrip(.check(operation))
        guard case .checkReport(let report) = r else { throw unexpected(r) }
        return report
    }

    /// CHECK_PAGE, page after page until the agent says the end is reached: the whole report however
    /// many findings it holds (`checked` and `skipped` summed). `page` sees each page as it arrives
    /// (a quarantine commits page by page). Restore is not paged: use ``check(_:)``.
    public func checkAll(_ operation: CheckOperation, page: (CheckReport) -> Void = { _ in }) throws(SecError) -> CheckReport {
        var total = CheckReport(checked: 0, skipped: 0, findings: [])
        var cursor: UInt64 = 0
        repeat {
            let r = try roundTrip(.checkPage(operation, cursor: cursor))
            guard case .checkReportPage(let report) = r else { throw unexpected(r) }
            page(report)
            total.checked &+= report.checked
            total.skipped &+= report.skipped
            total.findings += report.findings
            guard report.nextCursor == 0 || report.nextCursor > cursor else {
                throw SecError.decode("the agent's check pages do not advance")
            }
            cursor = report.nextCursor
        } while cursor != 0
        return total
    }

    /// Has the agent write a backup to `path` (absolute); returns how many items it holds.
    public func createBackup(path: String, password: SecureBytes) throws(SecError) -> Int {
        let r = try roundTrip(.backupCreate(path: path, password: password))
        guard case .backupSummary(let n, _, _) = r else { throw unexpected(r) }
        return Int(n)
    }

    /// Has the agent merge the backup at `path` (or, `dryRun`, only say what it would do).
    public func restoreBackup(path: String, password: SecureBytes, dryRun: Bool) throws(SecError) -> (added: Int, duplicates: Int, otherDevice: Int) {
        let r = try roundTrip(.backupRestore(path: path, password: password, dryRun: dryRun))
        guard case .backupSummary(let a, let d, let o) = r else { throw unexpected(r) }
        return (Int(a), Int(d), Int(o))
    }

    /// Creates an escrow record (the delegate asks the person for the passcode) and returns its secret.
    public func createEscrow() throws(SecError) -> SecureBytes {
        let r = try roundTrip(.escrowCreate)
        guard case .escrowSecret(let s) = r else { throw unexpected(r) }
        return s
    }

    /// PORTAL_SECRET: the desktop portal's per-app secret of Flatpak app `appID`, made by the agent on
    /// first use (the portal secret backend; its manifest must grant `portal-secret`).
    public func portalSecret(appID: String) throws(SecError) -> SecureBytes {
        let r = try roundTrip(.portalSecret(appID: appID))
        guard case .portalSecret(let s) = r else { throw unexpected(r) }
        return s
    }

    /// SYNC_SETUP (`coffer sync init` / `join`): this device's name and, for join, the pairing code a
    /// member approves. An agent from before issue #29 answers errSecParam (unknown message type).
    public func syncSetup(_ operation: SyncSetupOperation, remote: String, name: String) throws(SecError) -> SyncCode {
        let r = try roundTrip(.syncSetup(operation, remote: remote, name: name))
        guard case .syncCode(let c) = r else { throw unexpected(r) }
        return c
    }

    /// SYNC_CIRCLE approve: answers the pairing `code` names and admits the device once it confirms
    /// (the person authenticates); its name and the circle's fingerprint.
    public func syncApprove(code: String) throws(SecError) -> SyncCode {
        let r = try roundTrip(.syncCircle(.approve, argument: code))
        guard case .syncCode(let c) = r else { throw unexpected(r) }
        return c
    }

    /// SYNC_CIRCLE circle: the circle's fingerprint as the agent knows it (empty before a pairing proved one).
    public func syncCircleFingerprint() throws(SecError) -> String {
        let r = try roundTrip(.syncCircle(.circle, argument: ""))
        guard case .syncCode(let c) = r else { throw unexpected(r) }
        return c.code
    }

    /// SYNC_CIRCLE remove: removes a device (its id or unique name) and rotates the circle key.
    public func syncRemove(device: String) throws(SecError) { try expectOK(.syncCircle(.remove, argument: device)) }

    /// SYNC_CIRCLE devices.
    public func syncDevices() throws(SecError) -> [SyncDeviceInfo] {
        let r = try roundTrip(.syncCircle(.devices, argument: ""))
        guard case .syncDevices(let d) = r else { throw unexpected(r) }
        return d
    }

    /// FILES (issue #45): protects a directory, reports the protected directories, or locks them all;
    /// every directory the request concerns, with its state.
    public func files(_ operation: FilesOperation) throws(SecError) -> [ProtectedDirectoryStatus] {
        let r = try roundTrip(.files(operation))
        guard case .files(let dirs) = r else { throw unexpected(r) }
        return dirs
    }

    /// Makes the directory at the absolute path `path` a protected directory of class `protection`
    /// (Apple: setting `FileProtectionType` on a directory's files; FileProtectionFormat.md maps the classes).
    public func protectDirectory(_ path: String, as protection: FileProtection) throws(SecError) -> ProtectedDirectoryStatus {
        guard let d = try files(.protect(path: path, protection: protection)).first else { throw SecError(.decode, "FILES_REPLY without the directory") }
        return d
    }

    /// The protection class of the absolute path `path`: that of the protected directory it is, or is
    /// inside; nil when it is in none (Apple: the `protectionKey` resource value).
    public func fileProtection(ofPath path: String) throws(SecError) -> FileProtection? {
        var p = path
        while p.count > 1 && p.hasSuffix("/") { p.removeLast() }
        return try files(.status(path: nil)).filter { p == $0.path || p.hasPrefix($0.path == "/" ? "/" : $0.path + "/") }
            .max { $0.path.utf8.count < $1.path.utf8.count }?.protection
    }

    /// Writes `contents` as the file `name` of the complete-unless-open directory `directory`, also while
    /// the keychain is locked (then sealed and written in at the next unlock; Apple: a file of class
    /// `completeUnlessOpen` created while locked).
    /// A file larger than one request carries (``maximumFileDropBytes``) goes in parts (FILES drop part), up
    /// to ``maximumPartedFileBytes``.
    public func writeFile(_ contents: SecureBytes, named name: String, into directory: String) throws(SecError) {
        if contents.count <= Self.maximumFileDropBytes {
            _ = try files(.drop(path: directory, name: name, data: contents))
            return
        }
        var offset = 0
        try writeFile(named: name, into: directory) { () throws(SecError) -> SecureBytes? in
            guard offset < contents.count else { return nil }
            let n = min(Self.maximumFileDropBytes, contents.count - offset)
            defer { offset += n }
            return contents.slice(offset..<offset + n)
        }
    }

    /// Writes the file `name` of the complete-unless-open directory `directory` from the pieces `next`
    /// gives (nil: the end), each at most ``maximumFileDropBytes``, in FILES drop parts, also while locked;
    /// at most ``maximumPartedFileBytes`` in all. The file appears once its last part reached the agent
    /// (at the next unlock, if locked). Each piece is wiped once sent.
    public func writeFile(named name: String, into directory: String, from next: () throws(SecError) -> SecureBytes?) throws(SecError) {
        let dropID = Random.bytes(16)
        var index: UInt32 = 0
        var current = try next()
        repeat {
            let piece = current ?? SecureBytes(count: 0)
            defer { piece.wipe() }
            guard piece.count <= Self.maximumFileDropBytes else { throw SecError(.param, "a part holds at most \(Self.maximumFileDropBytes) bytes") }
            current = current == nil ? nil : try next()
            _ = try files(.dropPart(path: directory, name: name, part: FileDropPart(dropID: dropID, index: index, final: current == nil), data: piece))
            index += 1
        } while current != nil
    }

    /// The most one FILES drop (or drop part) carries.
    public static let maximumFileDropBytes = 196_096 - 256
    /// The most a file written in parts holds.
    public static let maximumPartedFileBytes = 64 << 20

    /// SYNC_STATUS; `now`: the agent syncs first and answers when that sync ended.
    public func syncStatus(now: Bool = false) throws(SecError) -> SyncStatus {
        let r = try roundTrip(.syncStatus(now: now))
        guard case .syncStatus(let s) = r else { throw unexpected(r) }
        return s
    }

    /// SYNC_CONFLICTS: the conflicts kept, newest first.
    public func syncConflicts() throws(SecError) -> [SyncConflictInfo] {
        let r = try roundTrip(.syncConflicts(restore: nil))
        guard case .syncConflicts(let c) = r else { throw unexpected(r) }
        return c
    }

    /// SYNC_CONFLICTS restore: writes back the losing version of conflict `id` (the person authenticates).
    public func syncRestore(conflict id: String) throws(SecError) { try expectOK(.syncConflicts(restore: id)) }

    /// Unlocks with an escrow secret.
    public func unlock(escrowSecret: SecureBytes) throws(SecError) { try expectOK(.escrowUnlock(secret: escrowSecret)) }

    /// Deletes the escrow record and rotates the keys (the passcode, checked by PAM).
    public func revokeEscrow(passcode: SecureBytes) throws(SecError) { try expectOK(.escrowRevoke(passcode: passcode)) }

    /// Removes the passcode (WhenPasscodeSetThisDeviceOnly items are deleted for good).
    public func removePasscode(current: SecureBytes) throws(SecError) { try expectOK(.removePasscode(current: current)) }

    /// True if the login password changed outside Coffer and the keybag still has the old one.
    public func isPasscodeOutOfSync() throws(SecError) -> Bool {
        let r = try roundTrip(.passcodeSync(oldPasscode: nil))
        guard case .count(let n) = r else { throw unexpected(r) }
        return n == 1
    }

    /// Re-wraps the keybag under the current login password, given the previous one.
    public func syncPasscode(oldPasscode: SecureBytes) throws(SecError) { try expectOK(.passcodeSync(oldPasscode: oldPasscode)) }

    /// `coffer bio enroll|remove|present`: OK, or the error (enroll and remove ask for the passcode).
    public func bio(_ operation: BioOperation, name: String = "") throws(SecError) {
        try expectOK(.bio(operation, name: name))
    }

    /// The biometric authenticator's state.
    public func bioStatus() throws(SecError) -> BioStatus {
        let r = try roundTrip(.bio(.status, name: ""))
        guard case .bioStatus(let b) = r else { throw unexpected(r) }
        return b
    }

    /// Subscribes this connection to lock-state events (read them with ``nextEvent()``).
    public func subscribe() throws(SecError) { try expectOK(.subscribe) }

    /// SUBSCRIBE to `topics` (WireProtocol.md, Events): ``EventTopics/items`` needs a manifest granting
    /// `delegate-identity` (-34018 otherwise); an agent older than item events answers -50.
    public func subscribe(to topics: EventTopics) throws(SecError) {
        try expectOK(topics == .lock ? .subscribe : .subscribeTo(topics))
    }

    /// Blocks until the agent sends a lock-state event. `beforeReading` runs once the event's bytes are
    /// there and before they are taken off the socket (not for an event read earlier, behind a reply): a
    /// watcher that others ask "is an event waiting?" (``hasUnreadBytes``) marks itself busy there, so
    /// that no moment passes in which the event is neither waiting nor handled.
    public func nextEvent(beforeReading: () -> Void = {}) throws(SecError) -> LockEvent {
        try awaitPipelined()
        if !pendingEvents.isEmpty { return pendingEvents.removeFirst() }
        // Interrupted: wait again; any other failure of the wait is left to the read, which reports it.
        while !UnixSocket.waitReadable(fd, timeoutMillis: -1) && errno == EINTR {}
        beforeReading()
        while true {
            let (_, r) = try readResponse()
            if case .event(let e) = r { return e }
        }
    }

    // MARK: Framing

    /// DELEGATE, for a front end whose manifest grants `delegate-identity` (WireProtocol.md,
    /// Delegated identity): must be the first request on this connection. Hands the agent the
    /// process behind `pidfd` (a pidfd the caller keeps, and closes when it likes), which the caller
    /// says is `pid` with start time `startTime` (field 22 of `/proc/PID/stat`, read when the caller
    /// learned the pid, before it opened the pidfd); from then on this connection acts as that process, with
    /// its access groups. A refusal closes the connection (-34018 not entitled or another user's
    /// process, -25291 a process that is gone or not the one described, -50 otherwise).
    public func delegate(pidfd: Int32, pid: Int32, startTime: UInt64) throws(SecError) {
        try delegate(descriptors: [pidfd], pid: pid, startTime: startTime)
    }

    /// ``delegate(pidfd:pid:startTime:)`` and ``whoami()`` in one round trip: WHOAMI goes out right
    /// behind DELEGATE (the agent answers in order, and runs nothing after a refused DELEGATE: it
    /// closes the connection), so the answer is the delegated process's identity.
    public func delegateAndIdentify(pidfd: Int32, pid: Int32, startTime: UInt64) throws(SecError) -> WhoAmIReply {
        let delegated = takeID()
        try send(.delegate(pid: pid, startTime: startTime), id: delegated, passing: [pidfd])
        let asked = takeID()
        // A refused DELEGATE closes the connection, perhaps before WHOAMI is written: its answer,
        // still there to read, is the error to report, not the failed write.
        var unsent: SecError?
        do { try send(.whoami, id: asked) } catch { unsent = error }
        let r = try reply(to: delegated)
        guard case .ok = r else { throw unexpected(r) }
        if let unsent { throw unsent }
        let w = try reply(to: asked)
        guard case .whoami(let who) = w else { throw unexpected(w) }
        return who
    }

    /// DELEGATE with any number of descriptors beside it (tests of the agent's refusals).
    package func delegate(descriptors: [Int32], pid: Int32, startTime: UInt64) throws(SecError) {
        let r = try roundTrip(.delegate(pid: pid, startTime: startTime), passing: descriptors)
        guard case .ok = r else { throw unexpected(r) }
    }

    private func expectOK(_ request: AgentRequest) throws(SecError) {
        let r = try roundTrip(request)
        guard case .ok = r else { throw unexpected(r) }
    }

    private func unexpected(_ r: AgentResponse) -> SecError {
        SecError(.internalComponent, "unexpected reply from the agent")
    }

    private func takeID() -> UInt32 {
        let id = nextID
        nextID = nextID == UInt32.max ? 1 : nextID + 1
        return id
    }

    private func send(_ request: AgentRequest, id: UInt32, passing descriptors: [Int32] = []) throws(SecError) {
        var frame = request.encodeFrame(requestID: id)
        // A request larger than a version 1-3 frame behind a pipelined HELLO waits for the HELLO's
        // reply: only an agent of version 4 takes it.
        if frame.count - 4 > WireFormat.maximumBodyBytes, helloPending {
            do { try awaitHello() } catch {
                if request.carriesSecret { secureZero(&frame) }
                throw error
            }
        }
        // A frame the agent could only close the connection over (WireProtocol.md, Frames) is not
        // sent: the caller gets -50 naming the limits, and the connection stays usable.
        let limit = WireFormat.maximumBodyBytes(version: version)
        guard frame.count - 4 <= limit else {
            if request.carriesSecret { secureZero(&frame) }
            throw .param("the request is too large to send: a frame is at most \(limit) bytes "
                         + (version < WireFormat.largeFramesVersion
                            ? "(the agent speaks protocol version \(version); large frames, for secrets up to \(WireFormat.maximumSecretBytes) bytes, need version \(WireFormat.largeFramesVersion))"
                            : "(a secret at most \(WireFormat.maximumSecretBytes) bytes, attributes the rest)"))
        }
        let sent = frame.withUnsafeBytes { UnixSocket.writeAll(fd, $0, passing: descriptors) }
        if request.carriesSecret { secureZero(&frame) }
        guard sent else { throw closed() }
    }

    /// Reads the reply to a pipelined HELLO. The agent answers in order: HELLO's reply first. If it
    /// refused HELLO it has closed, without running what followed.
    private func awaitHello() throws(SecError) {
        helloPending = false
        let (_, reply) = try readResponse()
        if case .error(let e) = reply { throw e }
        try acceptHello(reply)
    }

    /// Sends `request` and waits for its reply (events that arrive meanwhile are kept for ``nextEvent()``).
    private func roundTrip(_ request: AgentRequest, passing descriptors: [Int32] = []) throws(SecError) -> AgentResponse {
        let id = takeID()
        try send(request, id: id, passing: descriptors)
        return try reply(to: id)
    }

    /// The reply to request `id`, sent already (HELLO's and pipelined options' first; events on the
    /// way are kept for ``nextEvent()``).
    private func reply(to id: UInt32) throws(SecError) -> AgentResponse {
        try awaitPipelined()
        while true {
            let (rid, r) = try readResponse()
            if case .event(let e) = r { pendingEvents.append(e); continue }
            if case .authNeeded(let request) = r, rid == id { return try authenticate(request, id: id) }
            if case .error(let e) = r { throw e }
            guard rid == id else { throw SecError(.internalComponent, "reply for request \(rid), expected \(id)") }
            return r
        }
    }

    /// The conversation of WireProtocol.md's Authentication section: the delegate shows the prompt and
    /// reads the person's answer while this waits for the agent too (a finger may match first); returns
    /// the request's final reply.
    private func authenticate(_ request: AuthenticationRequest, id: UInt32) throws(SecError) -> AgentResponse {
        guard let delegate = authenticationDelegate, delegate.begin(request) else {
            try send(.authResponse(.cancel), id: id)
            _ = try? finalReply(id)
            throw .interactionNotAllowed("authentication is needed, and there is no way to ask (no terminal, no pinentry)")
        }
        defer { delegate.end() }
        var answered = false
        while true {
            let input = answered ? -1 : delegate.inputDescriptor
            let ready: [Bool]
            do throws(SystemError) { ready = try Poll.readable([fd, input], timeoutMillis: 1000) } catch {
                throw .io("poll failed while authenticating")
            }
            if ready[0] {
                let (rid, r) = try readResponse()
                switch r {
                case .event(let e): pendingEvents.append(e)
                case .authFeedback(let text, let kind) where rid == id: delegate.feedback(text, kind: kind)
                case .authNeeded(let next) where rid == id:
                    // The next factor of an "and" rule, or a new round.
                    answered = false
                    guard delegate.begin(next) else {
                        try send(.authResponse(.cancel), id: id)
                        return try finalReply(id)
                    }
                case .error(let e): throw e
                default:
                    guard rid == id else { throw SecError(.internalComponent, "reply for request \(rid), expected \(id)") }
                    return r
                }
                continue
            }
            if input >= 0, ready[1], let answer = delegate.inputReady() {
                try send(.authResponse(answer), id: id)
                if case .cancel = answer { answered = true } // nothing more to read; the final reply follows
            }
        }
    }

    /// Reads until the final reply of request `id` (events kept, feedback dropped).
    private func finalReply(_ id: UInt32) throws(SecError) -> AgentResponse {
        while true {
            let (rid, r) = try readResponse()
            switch r {
            case .event(let e): pendingEvents.append(e)
            case .authFeedback, .authNeeded: continue
            case .error(let e) where rid == id: throw e
            default: if rid == id { return r }
            }
        }
    }

    private func readResponse() throws(SecError) -> (UInt32, AgentResponse) {
        let start = Threads.monotonicSeconds()
        // A reply already there (the second of pipelined requests' replies) says nothing of the agent's pace.
        let waiting = !UnixSocket.spinUntilReadable(fd, spinMicros: replySpin.budgetMicros)
        var header: (UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0)
        let ok = withUnsafeMutableBytes(of: &header) { UnixSocket.readExactly(fd, into: $0) }
        guard ok else { throw closed() }
        if waiting { replySpin.record(waitedMicros: (Threads.monotonicSeconds() - start) * 1e6) }
        let length: Int
        switch withUnsafeBytes(of: &header, { WireFormat.bodyLength(header: $0, maximum: WireFormat.maximumBodyBytes(version: version)) }) {
        case .success(let n): length = n
        case .failure(let bad): throw SecError(.decode, "the agent sent a frame of \(bad.length) bytes")
        }
        let body = SecureBytes(count: length) // replies may carry secrets
        let got = body.withUnsafeMutableBytes { UnixSocket.readExactly(fd, into: $0) }
        guard got else { throw closed("closed the connection mid-reply") }
        do {
            return try body.withUnsafeBytes { b throws(ProtocolError) in try AgentResponse.decodeBody(b) }
        } catch {
            throw SecError(.decode, "malformed reply from the agent: \(error.description)")
        }
    }

    // MARK: Paged search (COPY_MATCHING_PAGE)

    /// One COPY_MATCHING_PAGE round trip: the matches after `cursor` (0: from the start) that fit in
    /// one frame, and the cursor of the next page (0: there is none).
    public func copyMatchingPage(_ query: ItemQuery, cursor: UInt64) throws(SecError) -> (items: [ItemResult], nextCursor: UInt64) {
        let (items, next, _) = try page(query, cursor: cursor)
        return (items, next)
    }

    /// One page and how many unreadable items it skipped (with ``ItemQuery/skipUnreadable``).
    private func page(_ query: ItemQuery, cursor: UInt64) throws(SecError) -> (items: [ItemResult], nextCursor: UInt64, unreadable: Int) {
        let r = try roundTrip(.copyMatchingPage(query, cursor: cursor))
        if !query.listsLockedItems, case .itemsPage(let items, _) = r, items.contains(where: \.locked) { throw unexpected(r) }
        switch r {
        case .itemsPage(let items, let next) where !query.skipUnreadable: return (items, next, 0)
        case .itemsPageSkipping(let items, let next, let n) where query.skipUnreadable: return (items, next, Int(n))
        default: throw unexpected(r)
        }
    }

    /// A listing that does not fail on items failing authentication (a damaged or forged row): the
    /// items that can be read, and how many could not (`coffer check` reports and quarantines them).
    /// Against an agent older than ITEMS_PAGE_SKIPPING (errSecParam for the flag) it lists as
    /// ``copyMatching(_:)`` does.
    public func copyMatchingSkippingUnreadable(_ query: ItemQuery) throws(SecError) -> (items: [ItemResult], unreadable: Int) {
        guard query.limit != .one else { return (try copyMatching(query), 0) }
        var q = query
        q.skipUnreadable = true
        var all: [ItemResult] = []
        do {
            let unreadable = try forEachPage(q) { page in all.append(contentsOf: page) }
            return (all, unreadable)
        } catch where error.status == .param && error.message.contains("undefined flag bits") {
            return (try copyMatching(query), 0)
        }
    }

    /// Runs a search page by page, handing each page to `body` in order (oldest items first) and
    /// honouring the query's limit across pages: each next page asks only for what is still missing.
    /// Returns how many unreadable items the pages skipped (always 0 without ``ItemQuery/skipUnreadable``).
    @discardableResult
    public func forEachPage(_ query: ItemQuery, _ body: ([ItemResult]) throws(SecError) -> Void) throws(SecError) -> Int {
        var q = query, cursor: UInt64 = 0, unreadable = 0
        var remaining = query.limit.bound
        while true {
            let (items, next, skipped) = try page(q, cursor: cursor)
            unreadable += skipped
            if let r = remaining, items.count > r { throw SecError(.decode, "the agent returned more items than asked for") }
            try body(items)
            guard next != 0 else { return unreadable }
            guard !items.isEmpty else { throw SecError(.decode, "the agent sent an empty page with a next cursor") }
            cursor = next
            if let r = remaining {
                let left = r - items.count
                guard left > 0 else { return unreadable }
                remaining = left
                q.limit = .count(left)
            }
        }
    }
}

/// The person's side of an authentication (AUTH_NEEDED): shows the agent's prompt and reads the
/// answer from an input the connection polls together with the agent's socket.
public protocol AuthenticationDelegate: AnyObject {
    /// The agent needs the person for `request`. False if nobody can be asked (the request then fails
    /// with errSecInteractionNotAllowed).
    func begin(_ request: AuthenticationRequest) -> Bool
    /// The descriptor to watch for the person's input (the terminal).
    var inputDescriptor: Int32 { get }
    /// The input is readable: an answer to send now, or nil to keep waiting.
    func inputReady() -> AuthenticationAnswer?
    /// Something the agent wants shown (a failed match, a wrong passcode); `kind` says whether the
    /// agent now waits for another answer (nil: an agent of protocol version 1, which does not say).
    func feedback(_ text: String, kind: AuthFeedbackKind?)
    /// The request ended (its final reply arrived): stop prompting, restore the terminal.
    func end()
}
