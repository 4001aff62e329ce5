import CofferPluginClient
import CofferPluginProtocol
import Foundation
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
        // A failed RESULT, then a successful one: the failure stands.
        _ = try host.control(plugin: "test", command: "fail-then-succeed")
        #expect(try host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5).code == .authenticationFailed)
        try Self.stillServes(host)
    }
}
