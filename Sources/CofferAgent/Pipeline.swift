import CofferCrypto
import CofferKeychain
import CofferModel
import CofferProtocol
import CofferSystem
import Logging

/// The agent's request path without a socket: one decoded request and its connection's ``Session``
/// in, one response out. The server (``Agent``) reads frames, calls ``handle(_:session:)``, and writes
/// the reply; tests call it directly.
///
/// Stages: the session (HELLO first), activity for the idle lock, then one short handler per request
/// kind. Identity and policy plug in here (the session will carry the caller, and policy will pick the
/// ``AccessScope`` each item request runs with); today every request runs with
/// ``AccessScope/unrestricted``.
final class Pipeline: Sendable {
    let keychain: Keychain
    let unlocking: UnlockService
    let schedule: LockSchedule
    let logger: Logger
    /// Reported in STATUS.
    let idleLockSeconds: UInt32
    /// The groups item requests may see and write (until access groups arrive: all of them).
    let scope: AccessScope

    init(keychain: Keychain, unlocking: UnlockService, schedule: LockSchedule, logger: Logger, idleLockSeconds: UInt32,
         scope: AccessScope = .unrestricted) {
        self.keychain = keychain
        self.unlocking = unlocking
        self.schedule = schedule
        self.logger = logger
        self.idleLockSeconds = idleLockSeconds
        self.scope = scope
    }

    /// Runs one request. A refused HELLO marks the session closing (``Session/mustClose``); the server
    /// then sends this reply and closes, and a session already closing runs nothing more.
    func handle(_ request: AgentRequest, session: inout Session) -> AgentResponse {
        guard !session.mustClose else { return .error(.param("the connection is closing")) }
        guard session.isGreeted else { return greet(request, &session) }
        // Activity for the idle lock: requests that use the keychain, not STATUS or SUBSCRIBE
        // (a status poller or a lock-screen watcher must not keep the keys unlocked).
        switch request {
        case .status, .subscribe: break
        default: schedule.touch()
        }
        do {
            return try respond(to: request, &session)
        } catch {
            logger.debug("request failed", metadata: ["status": "\(error.status.name)", "peer": "\(session.peer)"])
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

    /// The first message must be HELLO with a version range that holds ours; anything else closes.
    private func greet(_ request: AgentRequest, _ session: inout Session) -> AgentResponse {
        guard case .hello(let minV, let maxV, let client) = request else {
            session.close()
            return .error(.param("the first message must be HELLO"))
        }
        guard minV <= WireFormat.version, WireFormat.version <= maxV else {
            session.close()
            // Names no number the client sent: only the version this agent speaks.
            return .error(.param("no protocol version this agent speaks (\(WireFormat.version)) is in the HELLO's range"))
        }
        session.greeted(version: WireFormat.version, clientName: client)
        logger.debug("hello", metadata: ["client": "\(client)", "peer": "\(session.peer)"])
        return .helloReply(version: WireFormat.version, agentVersion: Agent.version)
    }

    /// One short handler per request kind.
    private func respond(to request: AgentRequest, _ session: inout Session) throws(SecError) -> AgentResponse {
        switch request {
        case .hello:
            throw .param("HELLO was already received")
        case .status:
            let status = keychain.status
            return .status(StatusReply(
                lockState: status.lockState, passcodeSet: status.passcodeSet,
                itemCount: UInt64(try keychain.count()), agentVersion: Agent.version,
                lockedMemoryBytes: UInt64(SecureMemory.lockedBytes() ?? 0),
                idleLockSeconds: idleLockSeconds))
        case .unlock(let passcode):
            try unlocking.unlock(passcode)
            schedule.didUnlock()
            return .ok
        case .lock:
            guard keychain.status.passcodeSet else {
                throw .notAvailable("no passcode is set, so nothing protects the keys; set one with 'coffer passcode set'")
            }
            schedule.lockNow(reason: "requested by \(session.peer)")
            return .ok
        case .setPasscode(let current, let new):
            try unlocking.setPasscode(current: current, new: new)
            schedule.didUnlock()
            return .ok
        case .add(let item, let flags):
            if !flags.isEmpty {
                // Refuse before adding an item whose reply could not be sent: the reply holds the
                // given attributes plus those the keychain fills in (pdmn, agrp, sync, cdat, mdat).
                let filledIn = flags.contains(.attributes) ? 64 + scope.defaultGroup.utf8.count : 0
                let bound = WireFormat.itemsHeaderBytes + filledIn + WireFormat.encodedSize(of: ItemResult(
                    itemClass: item.itemClass, attributes: flags.contains(.attributes) ? item.attributes : nil,
                    data: flags.contains(.data) ? item.secret : nil,
                    persistentRef: flags.contains(.persistentRef) ? [UInt8](repeating: 0, count: WireFormat.persistentRefBytes) : nil))
                guard bound <= WireFormat.maximumBodyBytes else { throw Self.tooLarge("the new item (with the parts asked for)") }
            }
            let r = try keychain.add(item, scope: scope, returnData: flags.contains(.data),
                                     returnAttributes: flags.contains(.attributes),
                                     returnPersistentRef: flags.contains(.persistentRef))
            return .items(flags.isEmpty ? [] : [r])
        case .copyMatching(let query):
            return try page(query, after: 0, paged: false)
        case .copyMatchingPage(let query, let cursor):
            return try page(query, after: cursor, paged: true)
        case .update(let query, let changes):
            return .count(UInt64(try keychain.update(query, changes, scope: scope)))
        case .delete(let query):
            return .count(UInt64(try keychain.delete(query, scope: scope)))
        case .subscribe:
            session.wantsEvents = true
            return .ok
        }
    }

    /// errSecAllocate for a reply that cannot fit in one frame (names no value).
    static func tooLarge(_ what: String) -> SecError {
        SecError(.allocate, "\(what) does not fit in one reply (\(WireFormat.maximumBodyBytes) bytes)")
    }

    /// One ITEMS_PAGE (`paged`) or one whole ITEMS reply: as many matches after `cursor` as fit in one
    /// frame. A match that does not fit even alone is errSecAllocate; so is a whole (unpaged) result
    /// that does not fit.
    private func page(_ query: ItemQuery, after cursor: UInt64, paged: Bool) throws(SecError) -> AgentResponse {
        let header = paged ? WireFormat.itemsPageHeaderBytes : WireFormat.itemsHeaderBytes
        var room = WireFormat.maximumBodyBytes - header
        let page = try keychain.copyMatchingPage(query, scope: scope, after: Int64(exactly: cursor) ?? Int64.max) { item in
            // One rule for both forms: an item larger than a page can carry is refused, so that a
            // `get` (COPY_MATCHING) and a listing (pages) agree on which items can be returned.
            let size = WireFormat.encodedSize(of: item)
            guard size <= room, size <= WireFormat.maximumItemBytesPerPage else { return false }
            room -= size
            return true
        }
        if page.items.isEmpty && !page.isComplete {
            throw Self.tooLarge("a matching item (with the parts asked for)")
        }
        guard paged else {
            guard page.isComplete else { throw Self.tooLarge("the whole result; use COPY_MATCHING_PAGE (paged)") }
            return .items(page.items)
        }
        return .itemsPage(page.items, nextCursor: page.isComplete ? 0 : UInt64(page.lastRowID))
    }
}
