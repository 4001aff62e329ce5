import CofferTestSupport
import Foundation
import Security

/// The pid of the agent the process-exit handler stops (0: none).
nonisolated(unsafe) var runningAgent: Int32 = 0

/// At the test process's exit: SIGTERM to the agent, then a wait (at most 5 s) until it has exited, so
/// that no agent outlives the process that started it (the test runner reports one that does).
func stopRunningAgent() {
    let pid = runningAgent
    guard pid > 0, kill(pid, SIGTERM) == 0 else { return }
    for _ in 0..<500 {
        // Reaped here, or already by Foundation's Process (ECHILD): gone.
        let r = waitpid(pid, nil, WNOHANG)
        if r == pid || (r < 0 && errno == ECHILD) { return }
        usleep(10_000)
    }
}

/// A real `cofferd` for these tests (private state directory, socket and PAM stack, pam_matrix), with the
/// passcode set and the keychain unlocked, and the Security module's sessions pointed at it. Binaries are
/// found beside this test runner, so nothing depends on where the checkout lives.
final class TestAgent: @unchecked Sendable {
    static let password = "correct horse"
    let dir = TemporaryDirectory("coffer-apple-api")
    private(set) var process: Process
    private(set) var arguments: [String] = []
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
            atexit { stopRunningAgent() }
            return agent
        } catch {
            fatalError("cannot start cofferd: \(error)")
        }
    }()

    /// `biometry`: the agent's biometric authenticator is Coffer's emulator (copies of the built plugins in
    /// the agent's private directory), and the scripted pinentry leaves a "touch the sensor" dialog open
    /// (``touch(_:)`` answers it) instead of dismissing it.
    init(biometry: Bool = false) throws {
        socket = dir.file("run/coffer/agent.sock")
        // The person's answers come from a scripted pinentry: the login password, every time.
        pinentry = try ScriptedPinentry(in: dir, pins: [Self.password], biometry ? .waitAtConfirm : .answer)
        let exe = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        binaries = URL(fileURLWithPath: exe).deletingLastPathComponent().path
        let pam = dir.file("pam"), passdb = dir.file("passdb")
        try FileManager.default.createDirectory(atPath: pam, withIntermediateDirectories: true)
        try "\(currentUser):\(Self.password):coffer\n".write(toFile: passdb, atomically: true, encoding: .utf8)
        try "auth required \(PAMWrapper.matrix) passdb=\(passdb)\naccount required \(PAMWrapper.matrix) passdb=\(passdb)\n"
            .write(toFile: pam + "/coffer", atomically: true, encoding: .utf8)
        var arguments = ["--foreground", "--socket", socket, "--state-dir", dir.file("state"), "--pam-confdir", pam,
                         "--pam-service", "coffer", "--kdf-ops", "1"]
        if biometry {
            let plugins = dir.file("plugins")
            try FileManager.default.createDirectory(atPath: plugins, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
            for so in ["libCofferPluginBiometricEmulator.so"] {
                try FileManager.default.copyItem(atPath: binaries + "/" + so, toPath: plugins + "/" + so)
                chmod(plugins + "/" + so, 0o644)
            }
            let config = dir.file("cofferd.conf")
            try ["biometry = biometric-emulator", "plugin-dir = \(plugins)", "plugin-host = \(binaries)/coffer-plugin-host",
                 "authentication-timeout = 15", ""].joined(separator: "\n").write(toFile: config, atomically: true, encoding: .utf8)
            arguments += ["--config", config]
        }
        self.arguments = arguments
        process = try Self.start(binaries + "/cofferd", arguments, socket: socket)
        let r = cli(["passcode", "set", "--passcode-stdin"], stdin: Self.password)
        guard r.status == 0 else { throw SetupError(text: "passcode set: \(r)") }
        if !biometry {
            AgentSession.pinentry = pinentry.program
            AgentSession.socket = socket
        }
    }

    /// `coffer ARGS` against this agent.
    func cli(_ args: [String], stdin: String? = nil) -> CLIResult {
        runProcess(binaries + "/coffer", args, stdin: stdin, environment: ["COFFER_SOCKET": socket])
    }

    /// Runs `body` with the Security module's sessions (the process's and new LAContexts') pointed at this
    /// agent and its pinentry; then back at the shared agent.
    func serving<T>(_ body: () async throws -> T) async rethrows -> T {
        let saved = (AgentSession.socket, AgentSession.pinentry)
        AgentSession.socket = socket
        AgentSession.pinentry = pinentry.program
        defer {
            AgentSession.socket = saved.0
            AgentSession.pinentry = saved.1
        }
        return try await body()
    }

    /// Enrolls finger `name` with the emulator (the passcode given).
    func enroll(_ name: String) throws {
        let r = cli(["bio", "enroll", name, "--auth-passcode-fd", "0"], stdin: Self.password)
        guard r.status == 0 else { throw SetupError(text: "bio enroll: \(r)") }
    }

    /// Touches the emulated sensor with finger `name` (nil: a finger that is not enrolled) as soon as an
    /// evaluation waits for one; false if none did within `seconds`.
    @discardableResult
    func touch(_ name: String?, within seconds: Double = 10) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if cli(["bio", "present"] + [name ?? "--unknown"]).status == 0 { return true }
            usleep(30_000)
        }
        return false
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
        let r = cli(["unlock", "--passcode-stdin"], stdin: Self.password)
        guard r.status == 0 else { throw SetupError(text: "unlock: \(r)") }
    }

    deinit {
        process.terminate()
        process.waitUntilExit()
    }
}
