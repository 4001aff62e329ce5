import CofferPluginClient
import CofferPluginProtocol
import Foundation
import Testing

/// The software fingerprint sensor behind the real host.
@Suite(.enabled(if: PluginBinaries.available, "coffer-plugin-host and the plugin libraries are not built"), .serialized)
struct BiometricEmulatorTests {
    static let bio = "biometric-emulator"

    func evaluateInBackground(_ host: PluginHost, timeout: Double = 20) -> Background<Result<EvaluationResult, PluginHostError>> {
        Background { Result { () throws(PluginHostError) in
            try host.evaluate(plugin: Self.bio, reason: "unlock the vault", app: "vault", timeout: timeout)
        } }
    }

    /// `present` from another thread until an evaluation is waiting for it.
    func touch(_ host: PluginHost, _ finger: String) -> Bool {
        eventually { (try? host.control(plugin: Self.bio, command: "present", arguments: [finger]).code) == 0 }
    }

    @Test func nothingEnrolledIsBiometryNotEnrolled() throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        let info = try #require(host.plugins.first { $0.name == Self.bio })
        #expect(info.kind == 2 && info.enrolledCount == 0 && info.domainState == [UInt8](repeating: 0, count: 32))
        #expect(try host.evaluate(plugin: Self.bio, reason: "r", app: "a", timeout: 5).code == .biometryNotEnrolled)
    }

    @Test func anEvaluationWaitsForAnEnrolledFinger() throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        #expect(try host.control(plugin: Self.bio, command: "enroll", arguments: ["alice-thumb"]).code == 0)
        // A touch with nobody waiting is not remembered.
        #expect(try host.control(plugin: Self.bio, command: "present", arguments: ["alice-thumb"]).code == 1)
        let pending = evaluateInBackground(host)
        usleep(200_000)
        #expect(try host.control(plugin: Self.bio, command: "status").text.contains("waiting: yes"))
        #expect(touch(host, "alice-thumb"))
        let result = try #require(pending.join()).get()
        #expect(result.code == .success)
        #expect(result.domainState == (try host.state(plugin: Self.bio)).domainState)
    }

    @Test(arguments: [["--unknown"], ["bob-index"]])
    func anUnknownFingerFails(_ args: [String]) throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        _ = try host.control(plugin: Self.bio, command: "enroll", arguments: ["alice-thumb"])
        let pending = evaluateInBackground(host)
        #expect(eventually { (try? host.control(plugin: Self.bio, command: "present", arguments: args).code) == 0 })
        #expect(try pending.join()?.get().code == .authenticationFailed)
    }

    @Test func noTouchBeforeTheDeadlineIsSystemCancel() throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        _ = try host.control(plugin: Self.bio, command: "enroll", arguments: ["alice-thumb"])
        #expect(try host.evaluate(plugin: Self.bio, reason: "r", app: "a", timeout: 0.3).code == .systemCancel)
        #expect(host.starts == 1)
    }

    @Test func theDomainStateChangesWithTheEnrolledSetAndPersists() throws {
        let box = try PluginSandbox()
        let host = try box.start()
        defer { host.shutdown() }
        let empty = try host.state(plugin: Self.bio)
        #expect(empty.code == 0 && empty.enrolledCount == 0)
        _ = try host.control(plugin: Self.bio, command: "enroll", arguments: ["alice-thumb"])
        let one = try host.state(plugin: Self.bio)
        #expect(one.enrolledCount == 1 && one.domainState != empty.domainState)
        #expect(try host.control(plugin: Self.bio, command: "enroll", arguments: ["alice-thumb"]).code == 1) // already enrolled
        #expect(try host.state(plugin: Self.bio) == one)                                                    // nothing changed
        _ = try host.control(plugin: Self.bio, command: "enroll", arguments: ["alice-index"])
        let two = try host.state(plugin: Self.bio)
        #expect(two.enrolledCount == 2 && two.domainState != one.domainState)
        _ = try host.control(plugin: Self.bio, command: "remove", arguments: ["alice-index"])
        let back = try host.state(plugin: Self.bio)
        #expect(back.enrolledCount == 1 && back.domainState != two.domainState && back.domainState != one.domainState)
        #expect(try host.control(plugin: Self.bio, command: "enroll", arguments: ["../etc"]).code == 3)

        // The state file is private and survives a restart of the host.
        let file = box.stateDir + "/biometric-emulator/fingers"
        #expect(Files_mode(file) == 0o600)
        _ = try host.control(plugin: "test", command: "crash")
        _ = try? host.evaluate(plugin: "test", reason: "r", app: "a", timeout: 5)
        #expect(try host.state(plugin: Self.bio) == back)
        #expect(host.starts == 2)
        #expect(try host.control(plugin: Self.bio, command: "status").text.contains("fingers: alice-thumb"))
    }
}

func Files_mode(_ path: String) -> mode_t? {
    var st = stat()
    return stat(path, &st) == 0 ? st.st_mode & 0o7777 : nil
}
