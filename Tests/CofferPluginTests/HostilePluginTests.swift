@testable import CofferPluginClient
import CofferPluginProtocol
import CofferSystem
import Foundation
import Glibc
import Testing

/// Issue #24, a hostile plugin: the C test plugin's hostile modes write frames of their own onto the
/// host's socket to the agent (garbage, an oversized header, an over-long text, replies out of order,
/// twice, or for evaluations never started). None may turn into a success the plugin did not return
/// for that evaluation, and the agent's client keeps serving: the host is restarted when the stream
/// is broken, and the next evaluations (of this plugin and of another) are answered as usual.
/// (Crashes, hangs and wedges are in ``PluginHostTests``.)
@Suite(.enabled(if: PluginBinaries.available, "coffer-plugin-host and the plugin libraries are not built"), .serialized)
struct HostilePluginTests {
    /// The host still serves: the test plugin's next evaluation succeeds and the emulator answers.
    static func stillServes(_ host: PluginHost) throws {
        _ = try host.control(plugin: "test", command: "succeed")
        #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5).code == .success)
        #expect(try host.evaluate(plugin: "biometric-emulator", reason: "r", app: "a", timeout: 5).code == .biometryNotEnrolled)
    }

    @Test(arguments: ["garbage", "oversized", "long-text"])
    func aBrokenStreamFailsTheEvaluationAndTheHostRestarts(mode: String) throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        #expect(try host.control(plugin: "test", command: mode) == (0, "ok"))
        // The plugin then returns success, but its stream is broken first: no success reaches the agent.
        #expect(throws: PluginHostError.hostCrashed) { try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5) }
        try Self.stillServes(host)
        #expect(host.starts == 2)
    }

    /// Coverage, not a regression test: the client dropped replies for ids that are not pending before
    /// the hostile modes existed too.
    @Test func aMatchForAnEvaluationNeverStartedIsDropped() throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        _ = try host.control(plugin: "test", command: "stray")
        // Successes for the next ids, for 0 and for 0xFFFFFFFF, then this evaluation's failure.
        #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5).code == .authenticationFailed)
        // The next evaluations (the ids the strays named) get their plugin's own results.
        for _ in 0..<3 {
            _ = try host.control(plugin: "test", command: "fail")
            #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5).code == .authenticationFailed)
        }
        try Self.stillServes(host)
        #expect(host.starts == 1)
    }

    @Test func aSecondReplyDoesNotReplaceTheFirst() throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        // A CONTROL_REPLY for an evaluation, then a successful RESULT (the plugin fails): the wrong reply
        // type is the answer.
        _ = try host.control(plugin: "test", command: "out-of-order")
        #expect(throws: PluginHostError.protocolError("unexpected reply type")) {
            try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5)
        }
        // A failed RESULT, then a successful one: the failure stands. (Through the real host this cannot
        // control when the waiting thread wakes: PluginReplyReaderTests checks the same deterministically.)
        _ = try host.control(plugin: "test", command: "fail-then-succeed")
        #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5).code == .authenticationFailed)
        try Self.stillServes(host)
    }

    @Test func aForgedHelloReplyDoesNotReplaceThePluginList() throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        let loaded = host.plugins
        #expect(loaded.map(\.name).contains("test"))
        // A HELLO_REPLY listing no plugin, then the evaluation's failure: the reader has handled the
        // forged frame by the time the evaluation returns (frames are read in order).
        _ = try host.control(plugin: "test", command: "hello")
        #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5).code == .authenticationFailed)
        #expect(host.plugins == loaded)
        try Self.stillServes(host)
        #expect(host.starts == 1)
    }
}

/// The client's frame reader alone, on a socket pair whose frames are all written (and the writing end
/// closed) before it reads: no waiting thread can take a reply between two frames, so these fail on a
/// reader that lets a later frame replace an earlier one whatever the scheduling (the tests above go
/// through the real host, where a waiter woken between the two frames hides such a bug).
@Suite struct PluginReplyReaderTests {
    static func core() -> Core {
        Core(PluginHost.Configuration(executable: "/nonexistent/coffer-plugin-host", pluginDirectories: [],
                                      stateDirectory: "/nonexistent"))
    }

    /// Writes `frames`, closes the writing end and runs the reader until the end of the stream.
    static func read(_ frames: [[UInt8]], into core: Core) throws {
        var fds: [Int32] = [-1, -1]
        try #require(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        defer { close(fds[0]) }
        let bytes = frames.flatMap { $0 }
        let written = bytes.withUnsafeBytes { send(fds[1], $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }
        close(fds[1])
        try #require(written == bytes.count)
        core.readFrames(fds[0])
    }

    static func result(_ code: LACode) -> HostResponse { .result(code: code.rawValue, domainState: nil) }

    @Test func aFailedResultFollowedByASuccessStaysAFailure() throws {
        let core = Self.core()
        core.state.withLock { $0.pending[7] = Core.Pending(generation: 0, feedback: nil) }
        try Self.read([Self.result(.authenticationFailed).encodeFrame(id: 7), Self.result(.success).encodeFrame(id: 7)], into: core)
        #expect(core.state.withLock { $0.pending[7]?.response } == Self.result(.authenticationFailed))
    }

    @Test func onlyTheFirstHelloReplyWithIDZeroCounts() throws {
        let core = Self.core()
        let test = PluginInfo(name: "test", kind: 1, capabilities: 1, enrolledCount: 0, domainState: nil)
        func hello(_ plugins: [PluginInfo], id: UInt32) -> [UInt8] {
            HostResponse.helloReply(version: PluginWire.version, plugins: plugins, refused: []).encodeFrame(id: id)
        }
        // A HELLO_REPLY with another id is no answer to HELLO; then the answer; then a forged one.
        try Self.read([hello([], id: 5), hello([test], id: 0), hello([], id: 0)], into: core)
        #expect(core.state.withLock { $0.ready })
        #expect(core.state.withLock { $0.plugins } == [test])
    }
}
