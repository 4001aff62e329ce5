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
    /// arrived, or nothing comes for `quiet` seconds.
    static func exchange(_ path: String, _ bytes: [UInt8], wanted: Int = .max, quiet: Double = 1.5) throws -> Exchange {
        let fd = try UnixSocket.connect(path: path)
        defer { close(fd) }
        UnixSocket.setTimeouts(fd, send: 5, receive: quiet)
        #expect(bytes.withUnsafeBytes { UnixSocket.writeAll(fd, $0) })
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
        let helloBody = Array(Self.helloFrame[4...])
        let badFirst: [(String, [UInt8])] = [
            ("not HELLO", AgentRequest.status.encodeFrame(requestID: 5)),
            // Used to be dropped without a reply: the HELLO behind it was answered and the ADD ran.
            ("AUTH_RESPONSE", AgentRequest.authResponse(.cancel).encodeFrame(requestID: 5)),
            ("unknown type", Self.frame([0x42, 0, 0, 0, 5])),
            ("HELLO cut short", Self.frame(Array(helloBody.dropLast(3)))),
            ("HELLO with a trailing byte", Self.frame(helloBody + [0])),
            ("HELLO with a client name that is not UTF-8", Self.frame([1, 0, 0, 0, 5, 0, 1, 0, 1, 0, 2, 0xC3, 0x28])),
            ("HELLO without version 1", AgentRequest.hello(minVersion: 2, maxVersion: 9, clientName: "x").encodeFrame(requestID: 5)),
            ("HELLO with min above max", AgentRequest.hello(minVersion: 2, maxVersion: 1, clientName: "x").encodeFrame(requestID: 5)),
        ]
        for (i, (what, first)) in badFirst.enumerated() {
            let add = AgentRequest.add(newPassword("bad-first", "\(i)", "x"), []).encodeFrame(requestID: 6)
            let got = try Self.exchange(path, first + Self.helloFrame + add)
            #expect(got.frames.count == 1, "\(what): \(got.frames.map { $0.type })")
            #expect(Self.errorStatus(got.frames.first?.response) == .param, "\(what)")
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
        let deadline = Date().addingTimeInterval(5)
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
        let agent = try AgentProcess(extraArguments: ["--lock-grace", "1"])
        agent.setPasscode()
        let fd = try UnixSocket.connect(path: agent.socketPath)
        defer { close(fd) }
        UnixSocket.setTimeouts(fd, send: 5, receive: 30)
        func send(_ r: AgentRequest, _ id: UInt32) { #expect(r.encodeFrame(requestID: id).withUnsafeBytes { UnixSocket.writeAll(fd, $0) }) }
        func next() -> (UInt32, AgentResponse)? {
            guard let f = ConnectionLimitTests.readFrame(fd) else { return nil }
            return try? Array(f[4...]).withUnsafeBytes { try AgentResponse.decodeBody($0) }
        }
        func expect(_ wanted: [String], _ note: String) {
            var seen: [String] = []
            for _ in wanted {
                guard let (id, r) = next() else { break }
                switch r {
                case .event(let e): seen.append("event \(e) id \(id)")
                case .ok: seen.append("ok \(id)")
                case .status(let s): seen.append("status \(s.lockState) \(id)")
                case .helloReply: seen.append("hello \(id)")
                default: seen.append("\(r) \(id)")
                }
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
        kill(agent.pid, SIGUSR1)
        expect(["event willLock(graceMillis: 1000) id 0"], "session lock")
        send(.unlock(passcode: secret(AgentProcess.password)), 7)
        expect(["event unlocked id 0", "ok 7"], "an unlock during the grace period")
        Thread.sleep(forTimeInterval: 1.5)
        send(.status, 8)
        expect(["status unlocked 8"], "the cancelled lock never happens")
    }
}
