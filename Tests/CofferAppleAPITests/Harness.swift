import CofferTestSupport
import Foundation
import Security

/// The pid of the agent the process-exit handler stops (0: none).
nonisolated(unsafe) var runningAgent: Int32 = 0

/// A real `cofferd` for these tests (private state directory, socket and PAM stack, pam_matrix), with the
/// passcode set and the keychain unlocked, and the Security module's sessions pointed at it. Binaries are
/// found beside this test runner, so nothing depends on where the checkout lives.
final class TestAgent: @unchecked Sendable {
    static let password = "correct horse"
    let dir = TemporaryDirectory("coffer-apple-api")
    private(set) var process: Process
    let arguments: [String]
    let socket: String
    let binaries: String
    let pinentry: ScriptedPinentry
    /// The scripted pinentry's log (one line per command it got).
    var pinentryLog: String { pinentry.log }
    /// A path in the agent's private directory.
    func file(_ name: String) -> String { dir.file(name) }

    /// The one agent of this test process, stopped when the process exits (a static is never deinitialised).
    static let shared: TestAgent = {
        do {
            let agent = try TestAgent()
            runningAgent = agent.process.processIdentifier
            atexit { if runningAgent > 0 { kill(runningAgent, SIGTERM) } }
            return agent
        } catch {
            fatalError("cannot start cofferd: \(error)")
        }
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
        arguments = ["--foreground", "--socket", socket, "--state-dir", dir.file("state"), "--pam-confdir", pam,
                     "--pam-service", "coffer", "--kdf-ops", "1"]
        process = try Self.start(binaries + "/cofferd", arguments, socket: socket)
        let r = runProcess(binaries + "/coffer", ["passcode", "set", "--passcode-stdin"], stdin: Self.password,
                           environment: ["COFFER_SOCKET": socket])
        guard r.status == 0 else { throw SetupError(text: "passcode set: \(r)") }
        AgentSession.pinentry = pinentry.program
        AgentSession.socket = socket
    }

    struct SetupError: Error { let text: String }

    /// Starts `cofferd` and waits until its socket accepts.
    static func start(_ executable: String, _ arguments: [String], socket: String) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = arguments
        p.standardError = FileHandle(forWritingAtPath: "/dev/null")
        p.standardOutput = FileHandle.nullDevice
        p.standardInput = FileHandle.nullDevice
        try p.run()
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline, !FileManager.default.fileExists(atPath: socket) { usleep(5000) }
        usleep(20000)
        return p
    }

    /// Stops the agent and starts it again on the same state, and unlocks it (the keybag starts locked).
    func restart() throws {
        process.terminate()
        process.waitUntilExit()
        process = try Self.start(binaries + "/cofferd", arguments, socket: socket)
        runningAgent = process.processIdentifier
        let r = runProcess(binaries + "/coffer", ["unlock", "--passcode-stdin"], stdin: Self.password, environment: ["COFFER_SOCKET": socket])
        guard r.status == 0 else { throw SetupError(text: "unlock: \(r)") }
    }

    deinit {
        process.terminate()
        process.waitUntilExit()
    }
}
