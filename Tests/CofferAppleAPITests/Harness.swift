import CofferTestSupport
import Foundation
import Security

/// A real `cofferd` for these tests (private state directory, socket and PAM stack, pam_matrix), with the
/// passcode set and the keychain unlocked, and the Security module's sessions pointed at it. Binaries are
/// found beside this test runner, so nothing depends on where the checkout lives.
final class TestAgent: @unchecked Sendable {
    static let password = "correct horse"
    let dir = TemporaryDirectory("coffer-apple-api")
    let process = Process()
    let socket: String
    let binaries: String
    let pinentry: ScriptedPinentry
    /// The scripted pinentry's log (one line per command it got).
    var pinentryLog: String { pinentry.log }
    /// A path in the agent's private directory.
    func file(_ name: String) -> String { dir.file(name) }

    /// The one agent of this test process.
    static let shared: TestAgent = {
        do { return try TestAgent() } catch { fatalError("cannot start cofferd: \(error)") }
    }()

    init() throws {
        socket = dir.file("run/coffer/agent.sock")
        // The person's answers come from a scripted pinentry: the login password, every time.
        pinentry = try ScriptedPinentry(in: dir, pins: [Self.password])
        let exe = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        binaries = URL(fileURLWithPath: exe).deletingLastPathComponent().path
        let pam = dir.file("pam"), passdb = dir.file("passdb")
        try FileManager.default.createDirectory(atPath: pam, withIntermediateDirectories: true)
        try "\(currentUser):\(Self.password):coffer\n".write(toFile: passdb, atomically: true, encoding: .utf8)
        try "auth required \(PAMWrapper.matrix) passdb=\(passdb)\naccount required \(PAMWrapper.matrix) passdb=\(passdb)\n"
            .write(toFile: pam + "/coffer", atomically: true, encoding: .utf8)
        process.executableURL = URL(fileURLWithPath: binaries + "/cofferd")
        process.arguments = ["--foreground", "--socket", socket, "--state-dir", dir.file("state"), "--pam-confdir", pam,
                             "--pam-service", "coffer", "--kdf-ops", "1"]
        process.standardError = FileHandle(forWritingAtPath: "/dev/null")
        process.standardOutput = FileHandle.nullDevice
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline, !FileManager.default.fileExists(atPath: socket) { usleep(5000) }
        usleep(20000)
        let r = runProcess(binaries + "/coffer", ["passcode", "set", "--passcode-stdin"], stdin: Self.password,
                           environment: ["COFFER_SOCKET": socket])
        guard r.status == 0 else { throw SetupError(text: "passcode set: \(r)") }
        setenv("COFFER_PINENTRY", pinentry.program, 1)
        AgentSession.socket = socket
    }

    struct SetupError: Error { let text: String }

    deinit {
        process.terminate()
        process.waitUntilExit()
    }
}
