import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// "Apps" for the access-group tests: copies of the built `coffer-cli` (a static executable, so it
/// runs from anywhere, even alone in a bwrap sandbox) at their own paths, each with its own tag
/// appended so that its SHA-256 differs, signed with `coffer manifest sign`. The trust roots live
/// in a private directory that passes StrictModes (0755 directories, files written by this uid),
/// and the agent is pointed at them, and only at them, by a config file.
final class SignedApps: @unchecked Sendable {
    let tmp = TemporaryDirectory("coffer-apps")
    /// The directory's resolved path (manifests name resolved paths, as `/proc/PID/exe` shows them).
    let root: String
    var keysDir: String { root + "/keys" }
    var manifestsDir: String { root + "/manifests" }
    var configPath: String { root + "/cofferd.conf" }

    init() throws {
        root = String(decoding: try StableFile.canonicalPath(tmp.path), as: UTF8.self)
        chmod(root, 0o755)
        for d in ["keys", "manifests", "other-keys", "apps", "secret"] { mkdir(root + "/" + d, 0o755) }
        chmod(root + "/secret", 0o700)
        try keygen("admin", trustIn: "keys")
        try keygen("stranger", trustIn: "other-keys")
    }

    func file(_ name: String) -> String { root + "/" + name }

    /// `coffer manifest keygen`; the public half copied into `trustIn` (only `keys` is trusted).
    func keygen(_ name: String, trustIn dir: String) throws {
        let secret = file("secret/" + name)
        let r = runCLI(["manifest", "keygen", "--out", secret])
        guard r.status == 0 else { throw Failure("keygen \(name): \(r)") }
        try FileManager.default.copyItem(atPath: secret + ".pub", toPath: file(dir + "/" + name + ".pub"))
    }

    /// The path of app `name`'s executable (`apps/NAME/coffer-cli`).
    func executable(_ name: String) -> String { file("apps/\(name)/coffer-cli") }

    /// Writes a copy of the built `coffer-cli` (or of the program `source`, e.g. OpenSSH's ssh-add:
    /// the copy is still named coffer-cli) with `tag` appended at `executable(name)` (replacing the file
    /// by rename if it exists, as a package update does).
    @discardableResult
    func install(_ name: String, tag: String? = nil, source: String = Binaries.directory + "/coffer-cli") throws -> String {
        mkdir(file("apps/\(name)"), 0o755)
        var bytes = try Data(contentsOf: URL(fileURLWithPath: source))
        bytes.append(Data("\ncoffer-test-app \(tag ?? name)\n".utf8))
        let path = executable(name)
        let temporary = path + ".new"
        try bytes.write(to: URL(fileURLWithPath: temporary))
        chmod(temporary, 0o755)
        guard rename(temporary, path) == 0 else { throw Failure("rename \(temporary): errno \(errno)") }
        return path
    }

    /// Signs app `name`'s executable (or the file at `path`) as `appID` with `groups` and `entitlements`
    /// (manifest `manifests/NAME.manifest`, replaced if it exists), by the trusted key unless `key`
    /// says otherwise.
    func sign(_ name: String, appID: String, groups: [String], key: String = "admin", path: String? = nil,
              entitlements: [String] = []) throws {
        let manifest = manifestPath(name)
        try? FileManager.default.removeItem(atPath: manifest)
        let r = runCLI(["manifest", "sign", "--key", file("secret/" + key), "--app-id", appID, "--executable", path ?? executable(name)]
                       + groups.flatMap { ["--group", $0] } + entitlements.flatMap { ["--entitlement", $0] } + ["--out", manifest])
        guard r.status == 0 else { throw Failure("sign \(name): \(r)") }
    }

    func manifestPath(_ name: String) -> String { manifestsDir + "/\(name).manifest" }

    /// Installs and signs app `name`; returns its executable.
    @discardableResult
    func app(_ name: String, appID: String, groups: [String], key: String = "admin",
             source: String = Binaries.directory + "/coffer-cli") throws -> String {
        try install(name, source: source)
        try sign(name, appID: appID, groups: groups, key: key)
        return executable(name)
    }

    /// Writes the agent's config file (only these trust roots, plus `extra` lines) and starts the agent.
    func startAgent(_ extra: [String] = []) throws -> AgentProcess {
        try AgentProcess(extraArguments: ["--config", writeAgentConfig(extra)])
    }

    /// Writes the agent's configuration (these trust and manifest directories, and `extra` lines); its path.
    func writeAgentConfig(_ extra: [String] = []) throws -> String {
        try (["standard-trust-dirs = no", "trusted-keys-dir = \(keysDir)", "manifests-dir = \(manifestsDir)"] + extra)
            .joined(separator: "\n").appending("\n").write(toFile: configPath, atomically: true, encoding: .utf8)
        return configPath
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }
}

/// Runs `executable ARGS` (stdin piped, never a terminal), feeding `stdin`.
func runProgram(_ executable: String, _ args: [String], stdin: String? = nil) -> CLIResult {
    runProcess(executable, args, stdin: stdin)
}

/// An app (a `coffer-cli` copy) talking to one agent: item commands with `--socket`.
struct AppClient {
    let executable: String
    let agent: AgentProcess
    /// A command run before the app's executable (`strace -f -o /dev/null`, `bwrap …`).
    var wrapper: [String] = []

    func run(_ args: [String], stdin: String? = nil) -> CLIResult {
        let command = wrapper + [executable] + args
        return runProgram(command[0], Array(command.dropFirst()) + ["--socket", agent.socketPath], stdin: stdin)
    }

    func add(_ service: String, _ account: String, secret: String, group: String? = nil) -> CLIResult {
        run(["add", "--service", service, "--account", account, "--secret-stdin"] + groupArgs(group), stdin: secret)
    }

    func get(_ service: String, _ account: String, group: String? = nil) -> CLIResult {
        run(["get", "--service", service, "--account", account] + groupArgs(group))
    }

    func find(_ service: String, group: String? = nil) -> CLIResult {
        run(["find", "--service", service, "--json"] + groupArgs(group))
    }

    func update(_ service: String, _ account: String, secret: String, group: String? = nil) -> CLIResult {
        run(["update", "--service", service, "--account", account, "--secret-stdin"] + groupArgs(group), stdin: secret)
    }

    func delete(_ service: String, _ account: String, group: String? = nil) -> CLIResult {
        run(["delete", "--service", service, "--account", account] + groupArgs(group))
    }

    private func groupArgs(_ group: String?) -> [String] { group.map { ["--access-group", $0] } ?? [] }

    /// `whoami --json`, parsed.
    func whoami() throws -> WhoAmI {
        let r = run(["whoami", "--json"])
        guard r.status == 0, let o = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any] else {
            throw SignedApps.Failure("whoami: \(r)")
        }
        return WhoAmI(kind: o["kind"] as? String ?? "", app: o["app"] as? String, note: o["note"] as? String ?? "",
                      groups: o["accessGroups"] as? [String] ?? [], mayAuthorize: o["mayAuthorize"] as? Bool ?? false,
                      executable: o["executable"] as? String ?? "")
    }

    struct WhoAmI {
        var kind: String
        var app: String?
        var note: String
        var groups: [String]
        var mayAuthorize: Bool
        var executable: String
    }
}

/// Exit statuses of the CLI (``CofferModel/SecStatus/exitCode``).
enum Exit {
    static let notFound: Int32 = 3
    static let duplicate: Int32 = 4
    static let authFailed: Int32 = 5
    static let missingEntitlement: Int32 = 11
}

/// The agent's audit log records (JSON lines in `STATE_DIR/audit.log`).
func auditRecords(_ agent: AgentProcess) -> [[String: Any]] {
    let text = (try? String(contentsOfFile: agent.stateDir + "/audit.log", encoding: .utf8)) ?? ""
    return text.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
}

/// Waits up to 5 s for `needle` in the agent's log (past its first `offset` bytes).
func waitForLog(_ agent: AgentProcess, _ needle: String, after offset: Int = 0) -> Bool {
    for _ in 0..<100 {
        let log = Array(agent.log.utf8)
        if log.count > offset, String(decoding: log[offset...], as: UTF8.self).contains(needle) { return true }
        usleep(50_000)
    }
    return false
}

/// Waits up to 5 s for one line of the agent's log (past its first `offset` bytes) holding all of `needles`.
func waitForLogLine(_ agent: AgentProcess, _ needles: [String], after offset: Int = 0) -> Bool {
    for _ in 0..<100 {
        let log = Array(agent.log.utf8)
        if log.count > offset,
           String(decoding: log[offset...], as: UTF8.self).split(separator: "\n").contains(where: { line in needles.allSatisfy { line.contains($0) } }) {
            return true
        }
        usleep(50_000)
    }
    return false
}

/// A command run under a pseudo-terminal by util-linux `script -qec CMD /dev/null`: what the user
/// would type is written to script's standard input only once `prompt` shows on the terminal (so
/// echo is already off), and standard input stays open until the command ends.
struct TerminalRun {
    var status: Int32
    var output: String
    var prompted: Bool

    /// util-linux `script`, and `setsid` for the runs without a controlling terminal.
    static let available = FileManager.default.isExecutableFile(atPath: "/usr/bin/script")
        && FileManager.default.isExecutableFile(atPath: "/usr/bin/setsid")

    static func run(_ command: [String], typing answer: String?, prompt: String = "type your passcode",
                    timeout: Double = 120) -> TerminalRun {
        let r = run(command, steps: answer.map { [(prompt, $0)] } ?? [], timeout: timeout)
        return TerminalRun(status: r.status, output: r.output, prompted: r.output.contains(prompt))
    }

    /// `word` as one word for /bin/sh: in single quotes, each `'` in it written `'\''`.
    static func shellWord(_ word: String) -> String {
        "'" + word.replacingOccurrences(of: "'", with: "'\\''") + "'"
    }

    /// `words` as one /bin/sh command line (``shellWord(_:)`` each).
    static func shellCommand(_ words: [String]) -> String {
        words.map(shellWord).joined(separator: " ")
    }

    /// As ``run(_:typing:prompt:timeout:)`` with several answers: each is typed (then Enter) once its
    /// prompt shows after the previous answer's. `prompted`: every prompt showed. The whole output is
    /// returned: a thread reads it until the end of the stream (every writer gone), not until the
    /// command has exited.
    static func run(_ command: [String], steps: [(prompt: String, answer: String)], timeout: Double = 120) -> TerminalRun {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/script")
        // SIGINT and SIGQUIT at their defaults, as on a person's terminal: a test runner started in the background
        // by a shell ignores them, every child inherits that, and a shell cannot trap a signal ignored on entry.
        p.arguments = ["-qec", shellCommand(["/usr/bin/env", "--default-signal=INT,QUIT"] + command), "/dev/null"]
        let out = Pipe(), inp = Pipe()
        p.standardOutput = out
        p.standardError = out
        p.standardInput = inp
        do { try p.run() } catch { return TerminalRun(status: -1, output: "\(error)", prompted: false) }
        // Only `script` may hold the write end, so the stream ends when it exits.
        try? out.fileHandleForWriting.close()
        let collected = ManifestCLITests.Collected()
        let ended = DispatchSemaphore(value: 0)
        let reader = out.fileHandleForReading
        Thread.detachNewThread {
            while true {
                let data = reader.availableData
                if data.isEmpty { break }
                collected.append(data)
            }
            ended.signal()
        }
        var typed = 0
        var searchFrom = 0
        let deadline = Date().addingTimeInterval(timeout)
        while p.isRunning && Date() < deadline {
            let text = Array(collected.text.utf8)
            if typed < steps.count, text.count > searchFrom,
               let found = String(decoding: text[searchFrom...], as: UTF8.self).range(of: steps[typed].prompt) {
                searchFrom += String(decoding: text[searchFrom...], as: UTF8.self)[..<found.upperBound].utf8.count
                inp.fileHandleForWriting.write(Data((steps[typed].answer + "\n").utf8))
                typed += 1
            }
            usleep(10_000)
        }
        if p.isRunning {
            // SIGKILL: the test runner's blocked SIGTERM is inherited by its children.
            kill(p.processIdentifier, SIGKILL)
        }
        p.waitUntilExit()
        try? inp.fileHandleForWriting.close()
        let complete = ended.wait(timeout: .now() + 120) == .success
        let text = collected.text + (complete ? "" : "\n[TerminalRun: the output had not ended 120 s after the command]")
        return TerminalRun(status: p.terminationStatus, output: text, prompted: typed == steps.count)
    }
}
