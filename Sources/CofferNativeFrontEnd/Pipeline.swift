package import CofferAgentPrompt
import CofferCrypto
package import CofferIdentity
import CofferKeybag
import CofferKeychain
package import CofferModel
import CofferPolicy
import CofferPrompt
import CofferProtocol
import CofferSSHKeyItems
package import CofferService
import CofferSocketServer
import CofferSystem
import Glibc
import Logging

/// The native protocol's adapter onto the service core, without a socket: one decoded request and its
/// connection's ``Session`` in, one response out. The server (``Agent``) reads frames, calls
/// ``handle(_:session:channel:)``, and writes the reply; tests call it directly.
///
/// What is the protocol's stays here: HELLO first, which requests count as activity for the idle lock,
/// reply sizes (`WireFormat`'s frame and page limits), subscriptions and AUTH_OPTIONS. Everything else
/// is one call of ``KeychainService`` (CofferService) with the session's ``CallerContext``, its answer
/// encoded as an ``AgentResponse``.
package final class Pipeline: Sendable {
    /// The service core every front end shares.
    let service: KeychainService
    /// Identifies the process a DELEGATE hands over (nil: DELEGATE is refused, as by an agent that
    /// identifies no caller).
    let resolver: IdentityResolver?
    /// The agent's own prompter (its configured pinentry, on the person's login session) for
    /// PROMPT_UNLOCK and PROMPT_READ, or why nobody can be asked; nil: nobody can be asked.
    let promptChannel: (@Sendable () -> Result<AgentPromptChannel, PromptUnavailable>)?
    /// The keychain sync (nil: the SYNC requests answer that this agent does not sync).
    let sync: SyncService?
    /// Protected directories (nil: FILES answers that this agent has none).
    let files: FileProtectionService?
    /// What PROMPTER answers: the agent's pinentry and why, and where its dialogs appear now (nil:
    /// this agent has no prompter).
    let prompterReport: (@Sendable () -> PrompterReply)?
    var logger: Logger { service.logger }
    /// Native connections greeted and requests handled (COUNTERS).
    private let served = Protected<(connections: UInt64, requests: UInt64)>((0, 0))

    package init(service: KeychainService, resolver: IdentityResolver? = nil,
         promptChannel: (@Sendable () -> Result<AgentPromptChannel, PromptUnavailable>)? = nil, sync: SyncService? = nil,
         prompterReport: (@Sendable () -> PrompterReply)? = nil, files: FileProtectionService? = nil) {
        self.service = service
        self.sync = sync
        self.files = files
        self.resolver = resolver
        self.promptChannel = promptChannel
        self.prompterReport = prompterReport
    }

    /// Runs one request. A refused HELLO marks the session closing (``Session/mustClose``); the server
    /// then sends this reply and closes, and a session already closing runs nothing more.
    func handle(_ request: AgentRequest, session: inout Session, channel: (any AuthChannel)? = nil) -> AgentResponse {
        served.withLock { $0.requests &+= 1 }
        guard !session.mustClose else { return .error(.param("the connection is closing")) }
        guard session.isGreeted else { return greet(request, &session) }
        // Activity for the idle lock: requests that use the keychain, not STATUS or SUBSCRIBE
        // (a status poller or a lock-screen watcher must not keep the keys unlocked).
        // A request that runs past the idle time is not cut short by an idle lock, and idle time counts
        // from its end (a passcode set whose KDF outlasts the idle time is followed by `unlocked`, not
        // by a lock that raced it).
        switch request {
        case .status, .protections, .prompter, .counters, .subscribe, .subscribeTo, .whoami, .laCanEvaluate, .syncStatus(now: false), .files(.status),
             .noteAccess:
            return run(request, &session, channel)
        default:
            return service.asActivity { run(request, &session, channel) }
        }
    }

    private func run(_ request: AgentRequest, _ session: inout Session, _ channel: (any AuthChannel)?) -> AgentResponse {
        do {
            try Self.requireCarried(request, version: session.protocolVersion)
            return try respond(to: request, &session, channel)
        } catch {
            service.logFailure(error, peer: "\(session.peer)")
            return .error(error)
        }
    }

    /// A frame that could not be decoded: errSecParam with a message naming the field (never its
    /// bytes). Before HELLO was accepted this also ends the conversation, like any other first message
    /// that is not an acceptable HELLO (a malformed HELLO included): nothing pipelined behind it runs.
    /// After HELLO the connection stays open (the frame boundary is known, so the next frame is safe).
    func refuse(_ error: ProtocolError, session: inout Session) -> AgentResponse {
        if !session.isGreeted { session.close() }
        return .error(error.secError)
    }

    /// The first message must be HELLO with a version range that holds one of ours; anything else
    /// closes. The connection speaks the highest version in both ranges.
    private func greet(_ request: AgentRequest, _ session: inout Session) -> AgentResponse {
        guard case .hello(let minV, let maxV, let client) = request else {
            session.close()
            return .error(.param("the first message must be HELLO"))
        }
        let version = min(maxV, WireFormat.version)
        guard minV <= maxV, version >= max(minV, WireFormat.minimumVersion) else {
            session.close()
            // Names no number the client sent: only the versions this agent speaks.
            return .error(.param("no protocol version this agent speaks (\(WireFormat.minimumVersion) to \(WireFormat.version)) is in the HELLO's range"))
        }
        session.greeted(version: version, clientName: client)
        served.withLock { $0.connections &+= 1 }
        logger.debug("hello", metadata: ["client": "\(client)", "peer": "\(session.peer)", "version": "\(version)"])
        return .helloReply(version: version, agentVersion: CofferVersion.current)
    }

    /// One service call per request kind.
    private func respond(to request: AgentRequest, _ session: inout Session, _ channel: (any AuthChannel)?) throws(SecError) -> AgentResponse {
        switch request {
        case .authOptions(let options):
            service.setAuthOptions(options, &session.context)
            return .ok
        case .bio(let operation, let name):
            switch operation {
            case .status: return .bioStatus(service.biometryStatus())
            case .enroll, .remove: try service.changeEnrollment(enroll: operation == .enroll, name: name, &session.context, channel)
            case .present: try service.presentFinger(name)
            case .presentUnknown: try service.presentFinger(nil)
            }
            return .ok
        case .backupCreate(let path, let password):
            let count = try service.createBackup(path: path, password: password, &session.context, channel)
            return .backupSummary(added: UInt32(count), duplicates: 0, otherDevice: 0)
        case .backupRestore(let path, let password, let dryRun):
            let r = try service.restoreBackup(path: path, password: password, dryRun: dryRun, &session.context, channel)
            return .backupSummary(added: UInt32(r.added), duplicates: UInt32(r.duplicates), otherDevice: UInt32(r.otherDevice))
        case .check(let operation):
            // Unpaged (the first form): a report that does not fit fails before anything is moved.
            return .checkReport(try service.check(operation, wholeOrNothing: true, session.context,
                                                  fits: Self.findingsFit(header: WireFormat.checkReportHeaderBytes)))
        case .checkPage(let operation, let cursor):
            return .checkReportPage(try service.check(operation, after: cursor, session.context,
                                                      fits: Self.findingsFit(header: WireFormat.checkReportPageHeaderBytes)))
        case .escrowCreate:
            return .escrowSecret(try service.createEscrow(&session.context, channel))
        case .escrowUnlock(let secret):
            try service.unlock(escrowSecret: secret, session.context)
            return .ok
        case .escrowRevoke(let passcode):
            try service.revokeEscrow(passcode: passcode, session.context)
            return .ok
        case .removePasscode(let current):
            try service.removePasscode(current: current, session.context)
            return .ok
        case .passcodeSync(nil):
            return .count(service.passcodeOutOfSync ? 1 : 0)
        case .passcodeSync(let old?):
            try service.syncPasscode(old: old, session.context)
            return .ok
        case .authResponse:
            // The server drops an AUTH_RESPONSE that arrives after its request finished (a race the
            // protocol allows); one reaching the pipeline answers nothing that waits.
            throw .param("no authentication is waiting for an answer")
        case .laCanEvaluate(let policy):
            return .laResult(service.canEvaluate(policy, session.context))
        case .laEvaluate(let policy, let reason):
            return .laResult(service.evaluate(policy, reason: reason, &session.context, channel))
        case .hello:
            throw .param("HELLO was already received")
        case .delegate:
            // Reached only without the frame's descriptors (the server sends DELEGATE to ``delegate``).
            throw .param("DELEGATE must carry the process's pidfd")
        case .portalSecret(let appID):
            return .portalSecret(try service.portalSecret(appID: appID, session.context))
        case .status:
            return .status(try service.status())
        case .syncSetup, .syncCircle, .syncStatus, .syncConflicts:
            return try syncRequest(request, &session, channel)
        case .files(let operation):
            return try filesRequest(operation, session)
        case .protections:
            return .protections(service.protections())
        case .loginSession(let opened):
            try service.loginSession(opened: opened, session.context)
            return .ok
        case .noteAccess(let access):
            try service.noteAccess(access, session.context)
            return .ok
        case .counters:
            try service.mayReadCounters(session.context)
            let (connections, requests) = served.withLock { ($0.connections, $0.requests) }
            return .counters(AgentCounters(connections: connections, requests: requests, identifications: resolver?.identifications ?? 0,
                                           searches: UInt64(service.searchCount)))
        case .prompter:
            return .prompter(prompterReport?() ?? PrompterReply(program: nil, reason: "this agent has no prompter", hasDisplay: false,
                                                                display: "this agent has no prompter"))
        case .promptUnlock:
            try promptUnlock(session, client: (channel as? ConnectionAuthChannel)?.conn.fd ?? -1)
            return .ok
        case .promptRead(let query):
            return try promptRead(query, &session, client: (channel as? ConnectionAuthChannel)?.conn.fd ?? -1)
        case .unlock(let passcode):
            try service.unlock(passcode, session.context)
            return .ok
        case .lock:
            try service.lock(requestedBy: "\(session.peer)")
            return .ok
        case .setPasscode(let current, let new):
            try service.setPasscode(current: current, new: new, session.context)
            return .ok
        case .whoami:
            return .whoami(service.whoami(session.context))
        case .authorize(let group, let passcode):
            try service.authorizeGroup(group, passcode: passcode, &session.context)
            return .ok
        case .add(let item, let flags):
            let returning = KeychainService.Returning(data: flags.contains(.data), attributes: flags.contains(.attributes),
                                                      persistentRef: flags.contains(.persistentRef))
            let limit = WireFormat.maximumBodyBytes(version: session.protocolVersion)
            let r = try service.add(item, returning: returning, &session.context, channel) { (scope) throws(SecError) in
                guard !flags.isEmpty else { return }
                // Refuse before adding an item whose reply could not be sent: the reply holds the
                // given attributes plus those the keychain fills in (pdmn, agrp, sync, cdat, mdat).
                let filledIn = flags.contains(.attributes) ? 64 + scope.defaultGroup.utf8.count : 0
                let bound = WireFormat.itemsHeaderBytes + filledIn + WireFormat.encodedSize(of: ItemResult(
                    itemClass: item.itemClass, attributes: flags.contains(.attributes) ? item.attributes : nil,
                    data: flags.contains(.data) ? item.secret : nil,
                    persistentRef: flags.contains(.persistentRef) ? [UInt8](repeating: 0, count: WireFormat.persistentRefBytes) : nil))
                guard bound <= limit else { throw Self.tooLarge("the new item (with the parts asked for)", limit: limit) }
            }
            return .items(flags.isEmpty ? [] : [r])
        case .keyCreate(let creation, let attributes, let flags):
            // The key is made (or checked) here in the agent; the reply never holds its private half.
            let item: NewItem
            if let key = creation.key {
                item = try SSHKeyItems.imported(wire: key, attributes: attributes)
            } else {
                item = try SSHKeyItems.generated(attributes)
            }
            defer { item.secret.wipe() }
            let r = try service.addKey(item, returning: KeychainService.Returning(attributes: flags.contains(.attributes),
                                                                                  persistentRef: flags.contains(.persistentRef)),
                                       &session.context, channel)
            return .items(flags.isEmpty ? [] : [r])
        case .keySign(let query, let data, let flags):
            return .signature(try signWithKey(query, data: data, flags: flags, &session.context, channel))
        case .copyMatching(let query):
            return try page(query, after: 0, paged: false, version: session.protocolVersion, &session.context, channel)
        case .copyMatchingPage(let query, let cursor):
            return try page(query, after: cursor, paged: true, version: session.protocolVersion, &session.context, channel)
        case .update(let query, let changes):
            return .count(UInt64(try service.update(query, changes, &session.context, channel)))
        case .delete(let query):
            return .count(UInt64(try service.delete(query, &session.context, channel)))
        case .subscribe:
            session.eventTopics.insert(.lock)
            return .ok
        case .subscribeTo(let topics):
            if !topics.isDisjoint(with: EventTopics.itemChanges) { try service.mayHearItemChanges(session.context) }
            session.eventTopics.formUnion(topics)
            return .ok
        }
    }

    /// DELEGATE (WireProtocol.md, Delegated identity): a front end whose manifest grants
    /// `delegate-identity` hands over, as its first request after HELLO, the process it serves as a
    /// pidfd (`descriptors`: what arrived with the frame); the agent identifies that process itself
    /// and from then on the connection is that process's. The checks, in order, and their statuses:
    /// not the first request after HELLO, -50; the front end not entitled, -34018; no descriptor or
    /// several, -50; not a pidfd, -50; a process of another uid, -34018; a process that is gone, is
    /// not `pid`, or has another start time (or cannot be identified), -25291. Every refusal closes
    /// the connection after its reply (a front end never goes on under its own identity by mistake);
    /// every outcome is audited (operation `delegate`, the front end as the caller).
    func delegate(pid: Int32, startTime: UInt64, descriptors: PassedDescriptors, firstAfterHello: Bool,
                  session: inout Session) -> AgentResponse {
        served.withLock { $0.requests &+= 1 }
        guard !session.mustClose else { return .error(.param("the connection is closing")) }
        let frontEnd = session.caller
        func refuse(_ error: SecError, _ why: String) -> AgentResponse {
            descriptors.closeAll()
            session.close()
            service.auditDelegation(by: frontEnd, for: nil, status: error.status, refusal: why)
            logger.notice("refused a DELEGATE", metadata: ["peer": "\(session.peer)", "caller": "\(frontEnd)", "why": "\(error)"])
            return .error(error)
        }
        guard firstAfterHello else {
            return refuse(.param(session.delegatedBy != nil ? "DELEGATE was already received on this connection"
                                    : "DELEGATE must be the first request after HELLO"), "not-first")
        }
        guard frontEnd.mayDelegate, let resolver else {
            return refuse(SecError(.missingEntitlement, "the caller's manifest does not grant the delegate-identity entitlement"), "not-entitled")
        }
        let count = descriptors.count, overflowed = descriptors.overflowed
        guard let pidfd = descriptors.takeOnly() else {
            return count == 0 && !overflowed
                ? refuse(.param("DELEGATE carries no descriptor (pass the process's pidfd with SCM_RIGHTS)"), "no-descriptor")
                : refuse(.param("DELEGATE carries several descriptors (pass exactly one: the process's pidfd)"), "several-descriptors")
        }
        let delegated: CallerIdentity
        do {
            delegated = try resolver.identify(pidfd: pidfd, pid: pid, uid: getuid(), startTime: startTime)
        } catch {
            switch error.underlying.errno {
            case EBADF: return refuse(.param("the descriptor DELEGATE carries is not a pidfd"), "not-a-pidfd")
            case EACCES: return refuse(SecError(.missingEntitlement, "the process DELEGATE names is another user's"), "another-user")
            default:
                return refuse(SecError(.notAvailable, "the process DELEGATE names is gone, or is not the one its pid and start time describe"),
                              "gone")
            }
        }
        session.delegate(to: delegated, startTime: startTime)
        service.auditDelegation(by: frontEnd, for: delegated, status: .success)
        logger.debug("delegated identity", metadata: ["peer": "\(session.peer)", "front end": "\(frontEnd)", "caller": "\(delegated)"])
        return .ok
    }

    /// Below version 4 a request's attributes keep to what those versions' decoders take (names of at
    /// most 32 bytes, at most 128 of them), as before: longer names and more attributes are version 4's
    /// (WireProtocol.md, Versioning). Names no attribute.
    static func requireCarried(_ request: AgentRequest, version: UInt16?) throws(SecError) {
        guard (version ?? 0) < WireFormat.largeFramesVersion else { return }
        let attributes: [Attributes]
        switch request {
        case .add(let item, _): attributes = [item.attributes]
        case .copyMatching(let q), .copyMatchingPage(let q, _), .delete(let q), .promptRead(let q), .keySign(let q, _, _): attributes = [q.attributes]
        case .update(let q, let changes): attributes = [q.attributes, changes.attributes]
        case .keyCreate(_, let a, _): attributes = [a]
        default: return
        }
        guard attributes.allSatisfy({ WireFormat.carries($0, version: version) }) else {
            throw .param("attribute names longer than \(WireFormat.legacyMaximumAttributeNameBytes) bytes, and more than "
                         + "\(WireFormat.legacyMaximumAttributes) attributes, need protocol version \(WireFormat.largeFramesVersion)")
        }
    }

    /// A budget of findings for one CHECK_REPORT(_PAGE) frame after `header` bytes.
    static func findingsFit(header: Int) -> (CheckFinding) -> Bool {
        var room = WireFormat.maximumBodyBytes - header
        return { finding in
            let size = WireFormat.encodedSize(of: finding)
            guard size <= room else { return false }
            room -= size
            return true
        }
    }

    /// errSecAllocate for a reply that cannot fit in one frame of `limit` bytes (names no value).
    static func tooLarge(_ what: String, limit: Int = WireFormat.maximumBodyBytes) -> SecError {
        SecError(.allocate, "\(what) does not fit in one reply (\(limit) bytes)")
    }

    /// One ITEMS_PAGE (`paged`) or one whole ITEMS reply: as many matches after `cursor` as fit in one
    /// frame of the connection's `version`. A match that does not fit even alone is errSecAllocate; so
    /// is a whole (unpaged) result that does not fit.
    private func page(_ query: ItemQuery, after cursor: UInt64, paged: Bool, granting: Bool = false, version: UInt16?,
                      _ context: inout CallerContext, _ channel: (any AuthChannel)?) throws(SecError) -> AgentResponse {
        let header = !paged ? WireFormat.itemsHeaderBytes
            : query.skipUnreadable ? WireFormat.itemsPageSkippingHeaderBytes : WireFormat.itemsPageHeaderBytes
        let limit = WireFormat.maximumBodyBytes(version: version)
        let itemLimit = WireFormat.maximumItemBytesPerPage(version: version)
        var room = limit - header
        return try service.search(query, after: cursor, paged: paged, granting: granting, &context, channel, fits: { item in
            // One rule for both forms: an item larger than a page can carry is refused, so that a
            // `get` (COPY_MATCHING) and a listing (pages) agree on which items can be returned.
            let size = WireFormat.encodedSize(of: item)
            guard size <= room, size <= itemLimit, WireFormat.carries(item.attributes ?? [:], version: version) else { return false }
            room -= size
            return true
        }) { (page) throws(SecError) -> AgentResponse in
            if page.items.isEmpty && !page.isComplete {
                throw (version ?? 0) < WireFormat.largeFramesVersion
                    ? SecError(.allocate, "a matching item (with the parts asked for) does not fit in one reply (\(limit) bytes), "
                               + "or has attributes only protocol version \(WireFormat.largeFramesVersion) carries")
                    : Self.tooLarge("a matching item (with the parts asked for)", limit: limit)
            }
            guard paged else {
                guard page.isComplete else { throw Self.tooLarge("the whole result; use COPY_MATCHING_PAGE (paged)", limit: limit) }
                // PROMPT_READ: the secrets were opened to check the reads; the grant is the answer, not them.
                guard granting else { return .items(page.items) }
                return .items(page.items.map { item in
                    var i = item
                    i.data?.wipe()
                    i.data = nil
                    return i
                })
            }
            let next = page.isComplete ? 0 : UInt64(page.lastRowID)
            if query.skipUnreadable { return .itemsPageSkipping(page.items, nextCursor: next, unreadable: UInt32(clamping: page.unreadable)) }
            return .itemsPage(page.items, nextCursor: next)
        }
    }
}

extension Pipeline {
    /// The SYNC requests (WireProtocol.md, Sync): the owner's own tools only, so never on a delegated
    /// connection (a front end serving an app); the service refuses a sandboxed app and an unentitled caller.
    func syncRequest(_ request: AgentRequest, _ session: inout Session, _ channel: (any AuthChannel)?) throws(SecError) -> AgentResponse {
        guard let sync else { throw SecError(.unimplemented, "this agent does not sync") }
        switch request {
        case .syncSetup(let operation, let remote, let name):
            return .syncCode(try sync.setup(operation, remote: remote, name: name, session.context))
        case .syncCircle(.approve, let code):
            return .syncCode(try sync.approve(code: code, &session.context, channel))
        case .syncCircle(.remove, let device):
            try sync.remove(device: device, session.context)
            return .ok
        case .syncCircle(.devices, _):
            return .syncDevices(try sync.devices(session.context))
        case .syncCircle(.circle, _):
            return .syncCode(try sync.circle(session.context))
        case .syncStatus(let now):
            return .syncStatus(try sync.status(now: now, session.context))
        case .syncConflicts(let id?):
            try sync.restore(conflict: id, &session.context, channel)
            return .ok
        default:
            // SYNC_CONFLICTS: newest first, as many as fit one frame.
            var room = WireFormat.maximumBodyBytes - WireFormat.syncConflictsHeaderBytes
            return .syncConflicts(Array(try sync.conflicts(session.context).prefix { c in
                let size = WireFormat.encodedSize(of: c)
                guard size <= room else { return false }
                room -= size
                return true
            }))
        }
    }

    /// FILES (WireProtocol.md, Protected directories): one call of the core's ``FileProtectionService``;
    /// a status reply holds as many directories as fit one frame, in path order.
    func filesRequest(_ operation: FilesOperation, _ session: Session) throws(SecError) -> AgentResponse {
        guard let files else { throw SecError(.unimplemented, "this agent has no protected directories") }
        let dirs: [ProtectedDirectoryStatus]
        switch operation {
        case .protect(let path, let protection): dirs = [try files.protect(path: path, protection: protection, session.context)]
        case .status(let path): dirs = try files.status(path: path, session.context)
        case .lockAll: dirs = try files.lockAll(session.context)
        case .drop(let path, let name, let data):
            defer { data.wipe() }
            dirs = [try files.drop(path: path, name: name, data: data, session.context)]
        case .dropPart(let path, let name, let part, let data):
            defer { data.wipe() }
            dirs = [try files.dropPart(path: path, name: name, part: part, data: data, session.context)]
        }
        var room = WireFormat.maximumBodyBytes - WireFormat.filesReplyHeaderBytes
        return .files(Array(dirs.prefix { d in
            let size = WireFormat.encodedSize(of: d)
            guard size <= room else { return false }
            room -= size
            return true
        }))
    }

    /// PROMPT_UNLOCK (WireProtocol.md, Prompting for a front end): on a delegated connection only,
    /// the passcode is asked with the agent's own prompter, the dialog naming the delegated app as the
    /// agent identified it, and checked exactly as UNLOCK checks one (PAM, the attempt schedule); at
    /// most ``Authenticator/passcodeAttempts`` wrong ones. Already unlocked: OK without asking.
    /// Nobody can be asked (no pinentry, no display): interactionNotAllowed at once. The client
    /// hanging up (a front end whose caller dismissed the prompt) closes the pinentry: userCanceled.
    func promptUnlock(_ session: Session, client: Int32) throws(SecError) {
        // The rules and the loop are the core's (one prompted unlock for every front end); this adapter
        // opens the prompter when the core asks for it and tells a hung-up client from a person who
        // cancelled.
        var channel: LazyPromptChannel? = nil
        defer { channel?.end() }
        try service.unlockPrompted(session.context, channel: { () throws(SecError) -> any AuthChannel in
            let prompter = try openPrompter()
            let opened = LazyPromptChannel({ prompter }, client: client)
            channel = opened
            return opened
        }, gone: {
            channel?.clientHungUp == true ? "the front end went away (the prompt was dismissed)" : "the person cancelled"
        })
    }

    /// The agent's prompter for a request that needs the person now; interactionNotAllowed when
    /// nobody can be asked (no pinentry, no display: ``PromptUnavailable``).
    private func openPrompter() throws(SecError) -> AgentPromptChannel {
        guard let promptChannel else { throw PromptUnavailable.noPinentry("this agent has no prompter").error }
        switch promptChannel() {
        case .success(let channel): return channel
        case .failure(let why): throw why.error
        }
    }

    /// PROMPT_READ (WireProtocol.md, Prompting for a front end): COPY_MATCHING on a delegated
    /// connection (the service core's rule), every authentication the items' access controls need
    /// answered by the agent's own prompter (``LazyPromptChannel``: the pinentry, opened only if the
    /// person is needed, naming the delegated app, beside the biometric sensor) instead of the client.
    /// The answer is a grant, not the secrets: the items the person authenticated for are the
    /// delegated process's to read for ``CallerSessions/itemGrantSeconds`` (on any of its
    /// connections: the front end's GetSecret reads them as any read), and the reply's items carry no
    /// data. Nobody can be asked (no pinentry, no display): interactionNotAllowed at once. The client
    /// hanging up (a dismissed prompt) closes the pinentry: userCanceled.
    func promptRead(_ query: ItemQuery, _ session: inout Session, client: Int32) throws(SecError) -> AgentResponse {
        try service.requireDelegated(session.context, for: "PROMPT_READ")
        guard query.returnData else { throw .param("PROMPT_READ authorizes reading secrets: its query must ask for data (return flag 0)") }
        let prompter = try openPrompter()
        let channel = LazyPromptChannel({ prompter }, client: client)
        defer { channel.end() }
        do {
            // Version 3: a grant to the delegated process, no secrets; an older front end gets them.
            let granting = (session.protocolVersion ?? 0) >= WireFormat.grantingVersion
            return try page(query, after: 0, paged: false, granting: granting, version: session.protocolVersion,
                            &session.context, channel)
        } catch where channel.clientHungUp {
            throw SecError(.userCanceled, "the front end went away (the prompt was dismissed)")
        }
    }
}
