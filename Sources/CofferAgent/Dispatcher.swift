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
        return conn.send(frame)
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
            let r = try keychain.add(item, returnData: flags.contains(.data), returnAttributes: flags.contains(.attributes),
                                     returnPersistentRef: flags.contains(.persistentRef))
            return .items(flags.isEmpty ? [] : [r])
        case .copyMatching(let query):
            return .items(try keychain.copyMatching(query))
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
                try keychain.unlock(passcode: passcode)
            } catch {
                locks.recordFailure()
                if let pamError = error as? PAMFailure {
                    logger.notice("PAM refused the passcode", metadata: ["pam": "\(pamError)"])
                }
                throw .authFailed("authentication failed")
            }
        }
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
        logger.info(isSet ? "passcode changed" : "passcode set")
        locks.didUnlock()
    }
}
