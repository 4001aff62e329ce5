import CofferTestSupport
import CofferClient
import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSystem
import Foundation
import Glibc
import Testing

/// WireProtocol.md's rules about framing, closing and ordering, checked against the real agent over
/// a real socket with hand-built frames (issue #12).
@Suite struct ProtocolConformanceTests {
    /// What the agent sent on one raw connection: the frames, and whether it closed the connection.
    struct Exchange {
        var frames: [(id: UInt32, type: UInt8, response: AgentResponse?)] = []
        var closed = false
    }

    /// Writes `bytes` on a new connection and reads frames until the agent closes, `wanted` frames
    /// arrived, or nothing comes for `quiet` seconds. Every caller ends on a close or on `wanted`, so
    /// `quiet` only bounds a broken agent: generous, as a loaded machine answers slowly (1.5 s once
    /// cut off a reply that was on its way, and the test counted one frame short).
    static func exchange(_ path: String, _ bytes: [UInt8], wanted: Int = .max, quiet: Double = 30) throws -> Exchange {
        try exchange(path, sends: [(bytes, [])], wanted: wanted, quiet: quiet)
    }

    /// ``exchange(_:_:wanted:quiet:)`` with the bytes written by one `sendmsg` each (the loop of
    /// writes for one is retried as one write is), each passing its descriptors (`SCM_RIGHTS`).
    static func exchange(_ path: String, sends: [(bytes: [UInt8], descriptors: [Int32])], wanted: Int = .max, quiet: Double = 30) throws -> Exchange {
        let fd = try UnixSocket.connect(path: path)
        defer { close(fd) }
        UnixSocket.setTimeouts(fd, send: 5, receive: quiet)
        for send in sends {
            #expect(send.bytes.withUnsafeBytes { send.descriptors.isEmpty ? UnixSocket.writeAll(fd, $0) : UnixSocket.writeAll(fd, $0, passing: send.descriptors) })
        }
        var out = Exchange()
        while out.frames.count < wanted {
            var header = [UInt8](repeating: 0, count: 4)
            let n = recv(fd, &header, 4, Int32(MSG_WAITALL))
            if n == 0 || (n < 0 && errno == ECONNRESET) { out.closed = true; break }
            guard n == 4 else { break } // quiet: still open
            var body = [UInt8](repeating: 0, count: Int(header[0]) << 24 | Int(header[1]) << 16 | Int(header[2]) << 8 | Int(header[3]))
            guard body.withUnsafeMutableBytes({ UnixSocket.readExactly(fd, into: $0) }) else { break }
            let decoded = try? body.withUnsafeBytes { try AgentResponse.decodeBody($0) }
            out.frames.append((decoded?.0 ?? WireFormat.requestID(ofBody: body.withUnsafeBytes { $0 }) ?? 0, body[0], decoded?.1))
        }
        return out
    }

    static func frame(_ body: [UInt8]) -> [UInt8] {
        let n = UInt32(body.count)
        return [UInt8(n >> 24), UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff)] + body
    }

    static let helloFrame = AgentRequest.hello(minVersion: 1, maxVersion: 1, clientName: "conformance").encodeFrame(requestID: 1)

    static func errorStatus(_ r: AgentResponse?) -> SecStatus? {
        if case .error(let e)? = r { return e.status }
        return nil
    }

    // MARK: Item 2: a bad first message

    /// Every first frame that is not an acceptable, well-formed HELLO gets ERROR -50 and the agent
    /// closes before anything behind it runs. A malformed HELLO used to leave the connection open, so
    /// a good HELLO and an ADD pipelined behind it ran.
    @Test func aBadFirstFrameClosesBeforeAnythingPipelinedBehindItRuns() throws {
        let agent = try AgentProcess()
        let path = agent.socketPath
        // Request id 5: neither the HELLO (1) nor the ADD (6) pipelined behind it.
        let helloBody = Array(AgentRequest.hello(minVersion: 1, maxVersion: 1, clientName: "conformance").encodeFrame(requestID: 5)[4...])
        let badFirst: [(String, [UInt8])] = [
            ("not HELLO", AgentRequest.status.encodeFrame(requestID: 5)),
            // Used to be dropped without a reply: the HELLO behind it was answered and the ADD ran.
            ("AUTH_RESPONSE", AgentRequest.authResponse(.cancel).encodeFrame(requestID: 5)),
            ("unknown type", Self.frame([0x42, 0, 0, 0, 5])),
            ("HELLO cut short", Self.frame(Array(helloBody.dropLast(3)))),
            ("HELLO with a trailing byte", Self.frame(helloBody + [0])),
            ("HELLO with a client name that is not UTF-8", Self.frame([1, 0, 0, 0, 5, 0, 1, 0, 1, 0, 2, 0xC3, 0x28])),
            ("HELLO without a version the agent speaks", AgentRequest.hello(minVersion: WireFormat.version + 1, maxVersion: 9, clientName: "x").encodeFrame(requestID: 5)),
            ("HELLO with min above max", AgentRequest.hello(minVersion: 2, maxVersion: 1, clientName: "x").encodeFrame(requestID: 5)),
        ]
        for (i, (what, first)) in badFirst.enumerated() {
            let add = AgentRequest.add(newPassword("bad-first", "\(i)", "x"), []).encodeFrame(requestID: 6)
            let got = try Self.exchange(path, first + Self.helloFrame + add)
            #expect(got.frames.count == 1, "\(what): \(got.frames.map { $0.type })")
            #expect(Self.errorStatus(got.frames.first?.response) == .param, "\(what)")
            #expect(got.frames.first?.id == 5, "\(what): the ERROR carries the bad frame's own request id")
            #expect(got.closed, "\(what): the agent must close")
        }
        let c = try AgentConnection(path: path)
        #expect(status { try c.copyMatching(ItemQuery(attributes: ["svce": .string("bad-first")])) } == .itemNotFound,
                "a request pipelined behind a bad first frame ran")
    }

    /// After HELLO, a malformed request or a second HELLO is ERROR -50 and the connection stays open.
    @Test func afterHelloAMalformedRequestOrASecondHelloKeepsTheConnection() throws {
        let agent = try AgentProcess()
        let got = try Self.exchange(agent.socketPath, Self.helloFrame + Self.frame([0x02, 0, 0, 0, 2, 0xAA]) + Self.helloFrame
                                    + AgentRequest.status.encodeFrame(requestID: 3), wanted: 4)
        #expect(got.frames.map { $0.type } == [0x81, 0xFF, 0xFF, 0x82] && !got.closed)
        #expect(got.frames.map { $0.id } == [1, 2, 1, 3])
    }

    // MARK: Item 6: a complete request followed by a close

    /// HELLO + ADD in one write, then close: the ADD is executed although neither reply can be sent.
    /// Shutting the client's read side first makes the agent's very first reply fail (EPIPE), the
    /// case that used to end the connection before the ADD was read.
    @Test func aCompleteRequestFollowedByACloseIsExecuted() throws {
        let agent = try AgentProcess()
        let path = agent.socketPath
        for i in 0..<10 {
            let fd = try UnixSocket.connect(path: path)
            if i % 2 == 0 { shutdown(fd, Int32(SHUT_RD)) } // the agent's replies fail at once
            let add = AgentRequest.add(newPassword("closed", "\(i)", "v\(i)"), []).encodeFrame(requestID: 2)
            let cut = AgentRequest.add(newPassword("closed", "cut\(i)", "x"), []).encodeFrame(requestID: 3).dropLast(2)
            #expect((Self.helloFrame + add + cut).withUnsafeBytes { UnixSocket.writeAll(fd, $0) })
            close(fd)
        }
        let c = try AgentConnection(path: path)
        let deadline = Date().addingTimeInterval(60)
        var found = 0
        repeat {
            found = (try? c.copyMatching(ItemQuery(attributes: ["svce": .string("closed")], limit: .all, returnAttributes: true)))?.count ?? 0
            if found >= 10 { break }
            usleep(50_000)
        } while Date() < deadline
        for i in 0..<10 {
            #expect(text(try? c.copyMatching(password("closed", "\(i)")).first?.data) == "v\(i)", "the ADD of connection \(i) was dropped")
            #expect(status { try c.copyMatching(password("closed", "cut\(i)")) } == .itemNotFound, "a cut-off request had an effect")
        }
        #expect(agent.process?.isRunning == true)
    }

    // MARK: Item 3: UPDATE and DELETE act on every match

    /// A "limit one" DELETE removed all three matches: a limit other than all, or return flags, is
    /// now ERROR -50 and changes nothing; the library and the CLI (default query) act on every match.
    @Test func updateAndDeleteRefuseLimitsAndReturnFlags() throws {
        let agent = try AgentProcess()
        let c = try AgentConnection(path: agent.socketPath)
        for a in ["a", "b", "c"] { try c.add(newPassword("three", a, "x")) }
        let match = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("three")])
        // A DELETE whose query says limit one: the COPY_MATCHING encoding of the same query, retyped.
        var limitOne = AgentRequest.copyMatching(match).encodeFrame(requestID: 2)
        limitOne[4] = MessageType.delete.rawValue
        var returning = match; returning.limit = .all; returning.returnAttributes = true
        var deleteReturning = AgentRequest.copyMatching(returning).encodeFrame(requestID: 3)
        deleteReturning[4] = MessageType.delete.rawValue
        var counted = match; counted.limit = .count(1)
        let frames = Self.helloFrame + limitOne + deleteReturning + AgentRequest.delete(counted).encodeFrame(requestID: 4)
            + AgentRequest.update(counted, ItemChanges(attributes: ["labl": .string("l")])).encodeFrame(requestID: 5)
        let got = try Self.exchange(agent.socketPath, frames, wanted: 5)
        #expect(got.frames.count == 5)
        for f in got.frames.dropFirst() { #expect(Self.errorStatus(f.response) == .param, "request \(f.id)") }
        #expect(try c.status().itemCount == 3, "a refused DELETE deleted something")
        #expect(status { try c.update(counted, ItemChanges(attributes: ["labl": .string("l")])) } == .param)
        #expect(try c.update(match, ItemChanges(attributes: ["labl": .string("l")])) == 3)
        let cli = agent.cli(["delete", "--service", "three"])
        #expect(cli.status == 0 && cli.stderr.contains("deleted 3 items"), "\(cli)")
    }

    // MARK: Request ids, result order, persistent references

    /// Any request id is allowed (0 too) and echoed; results come oldest first, an updated item keeps
    /// its place; a persistent reference survives an update and a restart of the agent.
    @Test func requestIdsOrderAndPersistentReferences() throws {
        let agent = try AgentProcess()
        let ids: [UInt32] = [0, 0xFFFF_FFFF, 7]
        let got = try Self.exchange(agent.socketPath, Self.helloFrame + ids.flatMap { AgentRequest.status.encodeFrame(requestID: $0) }, wanted: 4)
        #expect(got.frames.map { $0.id } == [1] + ids && got.frames.dropFirst().allSatisfy { $0.type == 0x82 })

        var c = try AgentConnection(path: agent.socketPath)
        var refs: [[UInt8]] = []
        for a in ["first", "second", "third"] {
            let r = try c.add(newPassword("order", a, a, "dk"), returning: .persistentRef)
            refs.append(try #require(r?.persistentRef))
        }
        _ = try c.update(ItemQuery(attributes: ["svce": .string("order"), "acct": .string("first")]),
                         ItemChanges(secret: secret("changed")))
        let all = try c.copyMatching(ItemQuery(attributes: ["svce": .string("order")], limit: .all, returnAttributes: true,
                                               returnPersistentRef: true))
        #expect(all.map { $0.attributes?["acct"] } == ["first", "second", "third"].map { .string($0) })
        #expect(all.map(\.persistentRef) == refs)
        try agent.restart()
        c = try AgentConnection(path: agent.socketPath)
        let byRef = try c.copyMatching(ItemQuery(returnData: true, persistentRef: refs[0]))
        #expect(text(byRef.first?.data) == "changed", "a persistent reference did not survive a restart")
    }

    // MARK: Events

    /// Events caused by a subscriber's own request come before that request's reply; a LOCK while
    /// locked sends no event; an UNLOCK during a grace period cancels the lock and sends `unlocked`.
    @Test func eventOrderingAndLockStates() throws {
        let grace = 3.0
        let agent = try AgentProcess(extraArguments: ["--lock-grace", "\(Int(grace))"])
        agent.setPasscode()
        let fd = try UnixSocket.connect(path: agent.socketPath)
        defer { close(fd) }
        UnixSocket.setTimeouts(fd, send: 5, receive: 30)
        func send(_ r: AgentRequest, _ id: UInt32) { #expect(r.encodeFrame(requestID: id).withUnsafeBytes { UnixSocket.writeAll(fd, $0) }) }
        func next() -> (UInt32, AgentResponse)? {
            guard let f = ConnectionLimitTests.readFrame(fd) else { return nil }
            return try? Array(f[4...]).withUnsafeBytes { try AgentResponse.decodeBody($0) }
        }
        /// The next frame as one line (nil: none).
        func nextLine() -> String? {
            guard let (id, r) = next() else { return nil }
            switch r {
            case .event(let e): return "event \(e) id \(id)"
            case .ok: return "ok \(id)"
            case .status(let s): return "status \(s.lockState) \(id)"
            case .helloReply: return "hello \(id)"
            default: return "\(r) \(id)"
            }
        }
        func expect(_ wanted: [String], _ note: String) {
            var seen: [String] = []
            for _ in wanted {
                guard let line = nextLine() else { break }
                seen.append(line)
            }
            #expect(seen == wanted, "\(note)")
        }
        send(.hello(minVersion: 1, maxVersion: 1, clientName: "events"), 1)
        send(.subscribe, 2)
        expect(["hello 1", "ok 2"], "subscribe")
        send(.lock, 3)
        expect(["event locked id 0", "ok 3"], "the subscriber's own LOCK: the event first, then the reply")
        send(.lock, 4)
        send(.status, 5)
        expect(["ok 4", "status locked 5"], "a LOCK while locked sends no event")
        send(.unlock(passcode: secret(AgentProcess.password)), 6)
        expect(["event unlocked id 0", "ok 6"], "unlock")
        // A session lock, then an UNLOCK within its grace: the lock is cancelled (`unlocked`, no `locked`). On a
        // loaded machine the grace can run out before the UNLOCK is served; the agent then locks first, which is
        // right too, and the round is tried again (an unlock must land inside a grace at least once).
        var cancelled = false
        for round in 0..<5 where !cancelled {
            kill(agent.pid, SIGUSR1)
            expect(["event willLock(graceMillis: \(Int(grace * 1000))) id 0"], "session lock")
            let id = UInt32(7 + round)
            send(.unlock(passcode: secret(AgentProcess.password)), id)
            var seen: [String] = []
            while seen.last != "ok \(id)", seen.count < 3, let line = nextLine() { seen.append(line) }
            if seen == ["event unlocked id 0", "ok \(id)"] {
                cancelled = true
                continue
            }
            guard seen == ["event locked id 0", "event unlocked id 0", "ok \(id)"] else {
                Issue.record("neither an unlock within the grace nor one after it: \(seen)")
                return
            }
        }
        #expect(cancelled, "no unlock arrived within the \(grace) s grace in 5 rounds")
        Thread.sleep(forTimeInterval: grace + 0.5)
        send(.status, 20)
        expect(["status unlocked 20"], "the cancelled lock never happens")
    }

    // MARK: Issue 23, item 6: what the spec used to leave to guessing

    /// One raw connection for a conversation frame by frame.
    final class Conversation {
        let fd: Int32
        init(_ path: String, version: ClosedRange<UInt16> = 1...WireFormat.version) throws {
            fd = try UnixSocket.connect(path: path)
            UnixSocket.setTimeouts(fd, send: 5, receive: 60)
            send(.hello(minVersion: version.lowerBound, maxVersion: version.upperBound, clientName: "conformance"), 1)
        }
        deinit { close(fd) }
        func send(_ r: AgentRequest, _ id: UInt32) { #expect(r.encodeFrame(requestID: id).withUnsafeBytes { UnixSocket.writeAll(fd, $0) }) }
        /// The next frame: its id, type byte and decoded response (nil: closed, or not decodable).
        func next() -> (id: UInt32, type: UInt8, response: AgentResponse?)? {
            guard let f = ConnectionLimitTests.readFrame(fd) else { return nil }
            let decoded = try? Array(f[4...]).withUnsafeBytes { try AgentResponse.decodeBody($0) }
            return (decoded?.0 ?? 0, f[4], decoded?.1)
        }
    }

    static func protectedItem(_ service: String, _ factor: AccessControl.Factor = .devicePasscode, pdmn: String? = nil) -> NewItem {
        var attributes: Attributes = ["svce": .string(service), "acct": .string("a"),
                                      "accc": .data(AccessControl(factors: [factor])!.encoded())]
        if let pdmn { attributes["pdmn"] = .string(pdmn) }
        return NewItem(itemClass: .genericPassword, attributes: attributes, secret: secret("protected \(service)"))
    }

    /// A client that announced version 2 learns from AUTH_FEEDBACK_KIND that a wrong passcode needs
    /// another answer; a client of version 1 alone still gets plain AUTH_FEEDBACK (same text).
    @Test func feedbackSaysWhetherAnotherAnswerIsDue() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        try AgentConnection(path: agent.socketPath).add(Self.protectedItem("fb"))
        for (range, feedbackType) in [(UInt16(1)...2, MessageType.authFeedbackKind), (1...1, .authFeedback)] {
            let c = try Conversation(agent.socketPath, version: range)
            guard case .helloReply(let v, _)? = c.next()?.response else { Issue.record("no HELLO_REPLY"); return }
            #expect(v == range.upperBound)
            c.send(.copyMatching(password("fb", "a")), 2)
            guard case .authNeeded(let asked)? = c.next()?.response else { Issue.record("no AUTH_NEEDED"); return }
            #expect(asked.methods == [.passcode])
            c.send(.authResponse(.passcode(secret("wrong"))), 2)
            let feedback = c.next()
            #expect(feedback?.id == 2 && feedback?.type == feedbackType.rawValue, "version \(range): \(String(describing: feedback))")
            guard case .authFeedback(let shown, let kind)? = feedback?.response else { Issue.record("no feedback"); return }
            #expect(shown.hasPrefix("Wrong passcode. Try again") && kind == (range.upperBound >= 2 ? .wrongPasscode : nil))
            c.send(.authResponse(.passcode(secret(AgentProcess.password))), 2)
            guard case .items(let items)? = c.next()?.response else { Issue.record("no ITEMS"); return }
            #expect(text(items.first?.data) == "protected fb")
        }
    }

    /// COPY_MATCHING with returnFlags 0 answers ITEMS with one bare item (class, present 0) per match,
    /// limit as asked, and, reading nothing, needs no authentication.
    @Test func copyMatchingWithoutReturnFlagsListsBareItems() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        let c = try AgentConnection(path: agent.socketPath)
        try c.add(Self.protectedItem("bare"))
        try c.add(newPassword("bare", "b", "x"))
        for (limit, count) in [(MatchLimit.one, 1), (.all, 2), (.count(1), 1)] {
            let r = try c.copyMatching(ItemQuery(attributes: ["svce": .string("bare")], limit: limit))
            #expect(r.count == count && r.allSatisfy { $0.itemClass == .genericPassword && $0.data == nil && $0.attributes == nil
                && $0.persistentRef == nil }, "\(limit): \(r)")
        }
    }

    /// A request too large for one frame is never sent: the client library answers -50 naming the
    /// limits, and the connection stays usable (the agent would have closed it as a framing error).
    /// At version 3 a 300 KB secret is too large; at version 4 a 1.5 MiB one (whatever the agent would
    /// say of its size, the frame itself cannot be sent).
    @Test func aRequestTooLargeForAFrameIsRefusedBeforeItIsSent() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        let v3 = try AgentConnection(path: agent.socketPath, maximumVersion: 3)
        let huge = NewItem(itemClass: .genericPassword, attributes: ["svce": .string("huge"), "acct": .string("a")],
                           secret: secret(String(repeating: "x", count: 300_000)))
        let refused3 = failure { () throws(SecError) in _ = try v3.add(huge) }
        #expect(refused3?.status == .param && refused3?.message.contains("\(WireFormat.maximumBodyBytes)") == true, "\(String(describing: refused3))")
        let c = try AgentConnection(path: agent.socketPath)
        let larger = NewItem(itemClass: .genericPassword, attributes: ["svce": .string("huge"), "acct": .string("a")],
                             secret: secret(count: WireFormat.maximumLargeBodyBytes))
        let refused = failure { () throws(SecError) in _ = try c.add(larger) }
        #expect(refused?.status == .param && refused?.message.contains("\(WireFormat.maximumLargeBodyBytes)") == true, "\(String(describing: refused))")
        try c.add(newPassword("huge", "b", "small"))
        #expect(text(try c.copyMatching(password("huge", "b")).first?.data) == "small")
    }

    /// The spec's vector *add genp acct=me svce=web sync=true*, as bytes on a raw connection: `OK`,
    /// never -50 (the error table once listed `sync` true among ADD's -50 reasons), and the item
    /// reads back with `sync` true.
    @Test func anAddWithSyncTrueIsAccepted() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        let add = "00000032060000000801000300046163637401000000026d650004737663650100000003776562000473796e63040100000002707700"
        let bytes = stride(from: 0, to: add.count, by: 2).map { i in
            UInt8(add[add.index(add.startIndex, offsetBy: i)..<add.index(add.startIndex, offsetBy: i + 2)], radix: 16)!
        }
        let x = try Self.exchange(agent.socketPath, Self.helloFrame + bytes, wanted: 2)
        #expect(x.frames.count == 2 && Self.errorStatus(x.frames[1].response) == nil && x.frames[1].id == 8, "\(x.frames)")
        let c = try AgentConnection(path: agent.socketPath)
        let r = try c.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("web")], returnAttributes: true))
        #expect(r.first?.attributes?["sync"] == .bool(true))
    }

    /// An access control needs a passcode (-25291, checked first) and then a ThisDeviceOnly class
    /// (-50 for ak, ck, dk; the default is aku).
    @Test func anAccessControlNeedsAPasscodeThenAThisDeviceOnlyClass() throws {
        let agent = try AgentProcess()
        let c = try AgentConnection(path: agent.socketPath)
        #expect(status { try c.add(Self.protectedItem("tdo", pdmn: "ak")) } == .notAvailable)
        agent.setPasscode()
        for pdmn in ["ak", "ck", "dk"] { #expect(status { try c.add(Self.protectedItem("tdo-\(pdmn)", pdmn: pdmn)) } == .param, "\(pdmn)") }
        for pdmn in ["aku", "cku", "dku", "akpu"] { #expect(status { try c.add(Self.protectedItem("tdo-\(pdmn)", pdmn: pdmn)) } == nil, "\(pdmn)") }
        try c.add(Self.protectedItem("tdo-default"))
        let stored = try c.copyMatching(ItemQuery(attributes: ["svce": .string("tdo-default")], returnAttributes: true))
        #expect(stored.first?.attributes?["pdmn"] == .string("aku"))
    }

    /// LA_EVALUATE: a cancel is userCancel (-2), no user interface notInteractive (-1004); neither is
    /// an ERROR frame. Without a passcode: passcodeNotSet (-5).
    @Test func laEvaluateCodesOnCancelAndWithoutUI() throws {
        let agent = try AgentProcess()
        let c = try Conversation(agent.socketPath)
        _ = c.next()
        c.send(.laEvaluate(.deviceOwnerAuthentication, reason: "test"), 2)
        guard case .laResult(let none)? = c.next()?.response else { Issue.record("no LA_RESULT"); return }
        #expect(none.error == .passcodeNotSet)
        agent.setPasscode()
        c.send(.laEvaluate(.deviceOwnerAuthentication, reason: "test"), 3)
        guard case .authNeeded? = c.next()?.response else { Issue.record("no AUTH_NEEDED"); return }
        c.send(.authResponse(.cancel), 3)
        guard case .laResult(let cancelled)? = c.next()?.response else { Issue.record("no LA_RESULT"); return }
        #expect(cancelled.error == .userCancel)
        c.send(.authOptions(AuthenticationOptions(noUserInterface: true)), 4)
        guard case .ok? = c.next()?.response else { Issue.record("AUTH_OPTIONS"); return }
        c.send(.laEvaluate(.deviceOwnerAuthentication, reason: "test"), 5)
        guard case .laResult(let noUI)? = c.next()?.response else { Issue.record("no LA_RESULT"); return }
        #expect(noUI.error == .notInteractive)
    }

    /// ESCROW unlock: subscribers get `unlocked` (as after UNLOCK); a secret that is not 32 bytes is
    /// -25300 without a record, else -25293 and a failed attempt like a wrong passcode.
    @Test func escrowUnlockSendsUnlockedAndCountsAWrongLengthSecret() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        let c = try AgentConnection(path: agent.socketPath)
        #expect(status { try c.unlock(escrowSecret: secret("short")) } == .itemNotFound)
        try c.setAuthenticationOptions(AuthenticationOptions(passcode: secret(AgentProcess.password)))
        let escrow = try c.createEscrow()
        #expect(escrow.count == 32)
        try c.lock()
        let watcher = try Conversation(agent.socketPath)
        _ = watcher.next()
        watcher.send(.subscribe, 2)
        guard case .ok? = watcher.next()?.response else { Issue.record("SUBSCRIBE"); return }
        #expect(status { try c.unlock(escrowSecret: secret("short")) } == .authFailed)
        let attempts = (try? String(contentsOfFile: agent.stateDir + "/attempts", encoding: .utf8)) ?? ""
        #expect(attempts.hasPrefix("coffer attempts v1 1 "), "a wrong-length secret is a failed attempt: \(attempts)")
        #expect(try c.status().lockState == .locked)
        try c.unlock(escrowSecret: escrow)
        guard case .event(.unlocked)? = watcher.next()?.response else { Issue.record("no unlocked event"); return }
    }

    /// BACKUP restore: `added` counts the items written (a dry run: that would be), `duplicates` the
    /// backup's items already present (kept as they are).
    @Test func backupRestoreCountsAddedAndDuplicates() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        let c = try AgentConnection(path: agent.socketPath)
        for a in ["1", "2", "3"] { try c.add(newPassword("bk", a, "v\(a)")) }
        try c.setAuthenticationOptions(AuthenticationOptions(passcode: secret(AgentProcess.password), reuseSeconds: 300))
        let path = agent.dir.file("keys.cfbu")
        #expect(try c.createBackup(path: path, password: secret("pw")) == 3)
        _ = try c.delete(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("bk"), "acct": .string("2")]))
        let dry = try c.restoreBackup(path: path, password: secret("pw"), dryRun: true)
        #expect(dry == (1, 2, 0) as (Int, Int, Int), "\(dry)")
        #expect(status { try c.copyMatching(password("bk", "2")) } == .itemNotFound, "a dry run wrote")
        let real = try c.restoreBackup(path: path, password: secret("pw"), dryRun: false)
        #expect(real == (1, 2, 0) as (Int, Int, Int), "\(real)")
        #expect(text(try c.copyMatching(password("bk", "2")).first?.data) == "v2")
    }
}
