@testable import CofferAgent
@testable import CofferNativeFrontEnd
import CofferAudit
import CofferCrypto
import CofferKeychain
import CofferModel
import CofferProtocol
import CofferService
import CofferServiceTestSupport
import CofferSystem
import CofferTestSupport
import CofferTrust
import Glibc
import Logging
import Testing

/// A running agent (the test's passcode verifier and fake sensor) with the native socket and the line socket.
final class TwoListeners {
    let dir = TemporaryDirectory("coffer-lines")
    let sensor = FakeSensor()
    let agent: Agent
    var native: String { dir.file("native.sock") }
    var lines: String { dir.file("lines.sock") }

    init(channel: @escaping @Sendable () -> (any AuthChannel)?, configure: (inout AgentConfiguration) -> Void = { _ in },
         verifier: (any PasscodeVerifier)? = nil) throws {
        let state = dir.file("state")
        var configuration = AgentConfiguration(socketPath: dir.file("native.sock"), stateDirectory: state, userName: "tester")
        configuration.kdfPolicy = cheapKDF
        configuration.trust.standardTrustDirectories = false
        configure(&configuration)
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        agent = try Agent(configuration: configuration, logger: logger, verifier: verifier ?? StubVerifier(accepting: ServiceRig.passcode), sensor: sensor)
        try agent.listen("lines", path: dir.file("lines.sock"), framing: LineFraming(),
                         handler: LineFrontEnd(service: agent.pipeline.service, channel: channel))
        agent.start()
    }

    deinit { agent.shutdown() }

    /// One native request and its response (HELLO first on every new connection).
    func native(_ requests: [AgentRequest]) throws -> [AgentResponse] {
        let fd = try UnixSocket.connect(path: native)
        defer { close(fd) }
        var out: [AgentResponse] = []
        for (n, request) in ([.hello(minVersion: WireFormat.version, maxVersion: WireFormat.version, clientName: "test")] + requests).enumerated() {
            let frame = request.encodeFrame(requestID: UInt32(n + 1))
            #expect(frame.withUnsafeBytes { UnixSocket.writeAll(fd, $0) })
            var header = [UInt8](repeating: 0, count: 4)
            #expect(header.withUnsafeMutableBytes { UnixSocket.readExactly(fd, into: $0) })
            let length = header.reduce(0) { $0 << 8 | Int($1) }
            var body = [UInt8](repeating: 0, count: length)
            #expect(body.withUnsafeMutableBytes { UnixSocket.readExactly(fd, into: $0) })
            out.append(try body.withUnsafeBytes { b throws(ProtocolError) in try AgentResponse.decodeBody(b).1 })
        }
        return Array(out.dropFirst())
    }

    /// One line request on the line socket and its reply line ("" if the agent closed without one).
    func line(_ request: String) throws -> String {
        let fd = try UnixSocket.connect(path: lines)
        defer { close(fd) }
        _ = Array((request + "\n").utf8).withUnsafeBytes { UnixSocket.writeAll(fd, $0) }
        var reply: [UInt8] = []
        var byte: UInt8 = 0
        while withUnsafeMutableBytes(of: &byte, { UnixSocket.readExactly(fd, into: $0) }), byte != UInt8(ascii: "\n") { reply.append(byte) }
        return String(decoding: reply, as: UTF8.self)
    }

    static func add(_ service: String, _ value: String, rule: String? = nil) -> AgentRequest {
        var attributes: Attributes = ["svce": .string(service), "acct": .string("me")]
        if let rule { attributes[AccessControl.attributeName] = .data(AccessControl(parsing: rule)!.encoded()) }
        return .add(NewItem(itemClass: .genericPassword, attributes: attributes, secret: secret(value)), [])
    }
}

/// The toy line front end (``LineFrontEnd``) on a second listener of one in-process agent, beside the
/// native socket: one keychain, one lock state, one audit log, two protocols.
@Suite struct LineFrontEndTests {
    @Test func anItemAddedOnTheNativeSocketIsReadOnTheLineSocketAndAnotherGroupIsDenied() throws {
        let agent = try TwoListeners { nil }
        let added = try agent.native([.setPasscode(current: secret(""), new: secret(ServiceRig.passcode)), TwoListeners.add("mail", "hunter2")])
        guard case .ok = added.first, case .items = added.last else { Issue.record("\(added)"); return }
        #expect(try agent.line("GET mail me") == "OK hunter2")
        // The policy: an unsigned caller may not name a signed app's group.
        let denied = try agent.line("GET mail me com.example.bank")
        #expect(denied.hasPrefix("ERR \(SecStatus.missingEntitlement.rawValue) "), "\(denied)")
        #expect(try agent.line("GET nothing me").hasPrefix("ERR \(SecStatus.itemNotFound.rawValue) "))
        #expect(try agent.line("PUT mail me").hasPrefix("ERR \(SecStatus.param.rawValue) usage"))
        // One audit log for both front ends; one lock state: a lock on the native socket locks the line socket's reads.
        let records = AuditReader.read(directory: agent.dir.file("state")).records
        #expect(records.contains { $0.operation == "add" && $0.result == 0 })
        #expect(records.contains { $0.operation == "get" && $0.result == SecStatus.missingEntitlement.rawValue })
        guard case .ok? = try agent.native([.lock]).first else { Issue.record("lock"); return }
        #expect(try agent.line("GET mail me").hasPrefix("ERR \(SecStatus.interactionNotAllowed.rawValue) "))
    }

    /// The listeners share one connection registry: the per-process cap counts both sockets.
    @Test func theConnectionCapHoldsAcrossListeners() throws {
        let agent = try TwoListeners(channel: { nil }) { $0.maxConnectionsPerProcess = 1 }
        // A native connection held open (past HELLO, so its own first-frame timeout is met).
        let held = try UnixSocket.connect(path: agent.dir.file("native.sock"))
        let hello = AgentRequest.hello(minVersion: WireFormat.version, maxVersion: WireFormat.version, clientName: "held").encodeFrame(requestID: 1)
        #expect(hello.withUnsafeBytes { UnixSocket.writeAll(held, $0) })
        var header = [UInt8](repeating: 0, count: 4)
        #expect(header.withUnsafeMutableBytes { UnixSocket.readExactly(held, into: $0) })
        var body = [UInt8](repeating: 0, count: header.reduce(0) { $0 << 8 | Int($1) })
        #expect(body.withUnsafeMutableBytes { UnixSocket.readExactly(held, into: $0) })
        // This process has its one connection: the line socket refuses the next (closed, no reply).
        #expect(try agent.line("GET mail me") == "")
        close(held)
        // Once the native connection is gone, the line socket serves again (polled: its thread ends soon after).
        var reply = ""
        for _ in 0..<300 {
            reply = try agent.line("GET mail me")
            if !reply.isEmpty { break }
            usleep(100_000)
        }
        #expect(reply.hasPrefix("ERR "), "\(reply)")
    }

    /// The first-frame timeout closes a silent line connection as it closes a native one that sends no HELLO.
    @Test func aSilentLineConnectionIsClosedAtTheFirstFrameTimeout() throws {
        let agent = try TwoListeners(channel: { nil }) { $0.helloTimeoutSeconds = 0.2 }
        let silent = try UnixSocket.connect(path: agent.dir.file("lines.sock"))
        defer { close(silent) }
        var byte: UInt8 = 0
        #expect(UnixSocket.waitReadable(silent, timeoutMillis: 30_000), "closed within 30 s")
        #expect(!withUnsafeMutableBytes(of: &byte) { UnixSocket.readExactly(silent, into: $0) }, "end of file, no reply")
    }

    @Test func aProtectedItemIsAnsweredThroughTheAgentsOwnChannel() throws {
        let agent = try TwoListeners { ScriptedChannel([.waitForStop]) }
        _ = try agent.native([.setPasscode(current: secret(""), new: secret(ServiceRig.passcode)), TwoListeners.add("bank", "pin 1234", rule: "biometry-any")])
        agent.sensor.queue(.match())
        #expect(try agent.line("GET bank me") == "OK pin 1234")
        #expect(agent.sensor.evaluations == 1)
        // A failed match and then the channel's script ends: nobody authenticated, nothing is read.
        agent.sensor.queue(.cancelled)
        let refused = try agent.line("GET bank me")
        #expect(refused.hasPrefix("ERR "), "\(refused)")
        #expect(!refused.contains("pin 1234"))
    }
}
