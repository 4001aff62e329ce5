import CofferCrypto
import CofferKeychain
import CofferModel
import CofferPAM
import CofferProtocol
import CofferSystem
import Glibc
import Logging

extension Agent {
    /// Decodes one frame body, runs the request, sends the reply. Returns false to close the connection.
    func handle(frame body: SecureBytes, on conn: Connection) -> Bool {
        let requestID: UInt32
        let request: Request
        do {
            (requestID, request) = try body.withUnsafeBytes { b throws(ProtocolError) in try Request.decodeBody(b) }
        } catch {
            let id = body.withUnsafeBytes { WireFormat.requestID(ofBody: $0) } ?? 0
            return reply(.error(error.secError), id: id, on: conn)
        }
        if !conn.greeted {
            guard case .hello(let minV, let maxV, let client) = request else {
                _ = reply(.error(.param("the first message must be HELLO")), id: requestID, on: conn)
                return false
            }
            guard minV <= WireFormat.version, WireFormat.version <= maxV else {
                _ = reply(.error(.param("protocol version \(minV)...\(maxV) not supported (agent speaks \(WireFormat.version))")),
                          id: requestID, on: conn)
                return false
            }
            conn.greeted = true
            logger.debug("hello", metadata: ["client": "\(client)", "peer": "\(conn.peer)"])
            return reply(.helloReply(version: WireFormat.version, agentVersion: Agent.version), id: requestID, on: conn)
        }
        // Activity for the idle lock: requests that use the keychain, not STATUS or SUBSCRIBE
        // (a status poller or a lock-screen watcher must not keep the keys unlocked).
        switch request {
        case .status, .subscribe: break
        default: locks.touch()
        }
        let response: Response
        do {
            response = try respond(to: request, on: conn)
        } catch {
            logger.debug("request failed", metadata: ["status": "\(error.status.name)", "peer": "\(conn.peer)"])
            response = .error(error)
        }
        return reply(response, id: requestID, on: conn)
    }

    private func reply(_ response: Response, id: UInt32, on conn: Connection) -> Bool {
        var frame = response.encodeFrame(requestID: id)
        defer { if response.carriesSecret { secureZero(&frame) } }
        guard frame.count - 4 <= WireFormat.maximumBodyBytes else {
            // Never reached by design (each reply is sized before it is built); a last guard, so the
            // agent never sends a frame the client must refuse.
            logger.error("a reply exceeded the frame limit", metadata: ["bytes": "\(frame.count - 4)", "peer": "\(conn.peer)"])
            return conn.send(Response.error(Self.tooLarge("the reply")).encodeFrame(requestID: id))
        }
        return conn.send(frame)
    }

    /// errSecAllocate for a reply that cannot fit in one frame (names no value).
    static func tooLarge(_ what: String) -> SecError {
        SecError(.allocate, "\(what) does not fit in one reply (\(WireFormat.maximumBodyBytes) bytes)")
    }

    /// One ITEMS_PAGE (`paged`) or one whole ITEMS reply: as many matches after `cursor` as fit in one
    /// frame. A match that does not fit even alone is errSecAllocate; so is a whole (unpaged) result
    /// that does not fit.
    private func page(_ query: ItemQuery, after cursor: UInt64, paged: Bool) throws(SecError) -> Response {
        let header = paged ? WireFormat.itemsPageHeaderBytes : WireFormat.itemsHeaderBytes
        var room = WireFormat.maximumBodyBytes - header
        let page = try keychain.copyMatchingPage(query, after: Int64(exactly: cursor) ?? Int64.max) { item in
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

    /// One short handler per request kind.
    private func respond(to request: Request, on conn: Connection) throws(SecError) -> Response {
        switch request {
        case .hello:
            throw .param("HELLO was already received")
        case .status:
            return .status(StatusReply(
                lockState: keychain.keybag.state.rawValue, passcodeSet: keychain.keybag.isPasscodeSet,
                itemCount: UInt64(try keychain.count()), agentVersion: Agent.version,
                lockedMemoryBytes: UInt64(SecureMemory.lockedBytes() ?? 0),
                idleLockSeconds: configuration.idleLockSeconds))
        case .unlock(let passcode):
            try unlock(passcode)
            return .ok
        case .lock:
            guard keychain.keybag.isPasscodeSet else {
                throw .notAvailable("no passcode is set, so nothing protects the keys; set one with 'coffer passcode set'")
            }
            locks.lockNow(reason: "requested by \(conn.peer)")
            return .ok
        case .setPasscode(let current, let new):
            try setPasscode(current: current, new: new)
            return .ok
        case .add(let item, let flags):
            if !flags.isEmpty {
                // Refuse before adding an item whose reply could not be sent: the reply holds the
                // given attributes plus those the keychain fills in (pdmn, agrp, sync, cdat, mdat).
                let filledIn = flags.contains(.attributes) ? 64 + keychain.defaultAccessGroup.utf8.count : 0
                let bound = WireFormat.itemsHeaderBytes + filledIn + WireFormat.encodedSize(of: ItemResult(
                    itemClass: item.itemClass, attributes: flags.contains(.attributes) ? item.attributes : nil,
                    data: flags.contains(.data) ? item.secret : nil,
                    persistentRef: flags.contains(.persistentRef) ? [UInt8](repeating: 0, count: WireFormat.persistentRefBytes) : nil))
                guard bound <= WireFormat.maximumBodyBytes else { throw Self.tooLarge("the new item (with the parts asked for)") }
            }
            let r = try keychain.add(item, returnData: flags.contains(.data), returnAttributes: flags.contains(.attributes),
                                     returnPersistentRef: flags.contains(.persistentRef))
            return .items(flags.isEmpty ? [] : [r])
        case .copyMatching(let query):
            return try page(query, after: 0, paged: false)
        case .copyMatchingPage(let query, let cursor):
            return try page(query, after: cursor, paged: true)
        case .update(let query, let changes):
            return .count(UInt64(try keychain.update(query, changes)))
        case .delete(let query):
            return .count(UInt64(try keychain.delete(query)))
        case .subscribe:
            conn.subscribe()
            return .ok
        }
    }

    /// PAM first, then the keybag; both failures are the same errSecAuthFailed.
    private func unlock(_ passcode: SecureBytes) throws(SecError) {
        guard keychain.keybag.isPasscodeSet else {
            throw .notAvailable("no passcode is set; set one with 'coffer passcode set'")
        }
        try locks.unlockGate.withLock { () throws(SecError) in
            locks.waitForRetryWindow()
            do {
                try pam.authenticate(user: configuration.userName, passcode: passcode)
            } catch {
                locks.recordFailure()
                logger.notice("PAM refused the passcode", metadata: ["pam": "\(error)"])
                throw .authFailed("authentication failed")
            }
            do throws(SecError) {
                try keychain.unlock(passcode: passcode)
            } catch where error.status == .authFailed {
                locks.recordFailure()
                throw .authFailed("authentication failed")
            } catch {
                // Not a wrong passcode (an I/O error finishing a migration or a key rotation): no failed
                // attempt is counted, and the caller learns what went wrong.
                logger.error("unlock failed", metadata: ["status": "\(error.status.name)", "reason": "\(error.message)"])
                logMigrations()
                throw error
            }
        }
        logMigrations()
        logger.info("unlocked")
        locks.didUnlock()
    }

    /// First set: the new passcode must pass PAM. Change: the current one must open the keybag and
    /// the new one must pass PAM (the keybag passcode follows the login password).
    private func setPasscode(current: SecureBytes, new: SecureBytes) throws(SecError) {
        guard new.count > 0 else { throw .param("the new passcode is empty") }
        let isSet = keychain.keybag.isPasscodeSet
        if isSet && current.count == 0 { throw .authFailed("the current passcode is required") }
        if !isSet && current.count > 0 { throw .param("no passcode is set yet; leave the current passcode empty") }
        try locks.unlockGate.withLock { () throws(SecError) in
            locks.waitForRetryWindow()
            do {
                try pam.authenticate(user: configuration.userName, passcode: new)
            } catch {
                locks.recordFailure()
                logger.notice("PAM refused the new passcode", metadata: ["pam": "\(error)"])
                throw .authFailed("the new passcode was not accepted by PAM (it must be your login password)")
            }
            do throws(SecError) {
                try keychain.setPasscode(current: isSet ? current : nil, new: new, kdf: configuration.kdfPolicy)
            } catch {
                if error.status == .authFailed { locks.recordFailure() }
                throw error
            }
        }
        logMigrations()
        logger.info(isSet ? "passcode changed" : "passcode set")
        locks.didUnlock()
    }

    /// Logs what the keychain migrated since the last call (counts only, never values).
    func logMigrations() {
        for line in keychain.takeMigrationReport() { logger.notice("migrated", metadata: ["what": "\(line)"]) }
    }
}
