public import Foundation

/// What a program run by ``runProcess(_:_:stdin:environment:unset:directory:timeout:)`` left: its exit
/// status and both outputs.
public struct CLIResult: CustomStringConvertible, Sendable {
    public var status: Int32
    public var stdout: String
    public var stderr: String
    public init(status: Int32, stdout: String, stderr: String) {
        self.status = status
        self.stdout = stdout
        self.stderr = stderr
    }
    public var description: String { "status \(status)\nstdout: \(stdout)\nstderr: \(stderr)" }
}

/// Runs `executable ARGS` (stdin a pipe, never a terminal) and feeds it `stdin`, in the test
/// runner's environment without `COFFER_SOCKET` and the names in `unset`, plus `environment`, in
/// `directory` if given. Both output pipes are read at once (a full stderr pipe must not stall a
/// child while stdout is read); after `timeout` seconds the child is killed (SIGKILL: the runner's
/// blocked SIGTERM is inherited by children). A program that cannot start is status -1.
public func runProcess(_ executable: String, _ args: [String], stdin: String? = nil, environment: [String: String] = [:],
                       unset: [String] = [], directory: URL? = nil, timeout: Double = 300) -> CLIResult {
    var env = ProcessInfo.processInfo.environment
    for k in ["COFFER_SOCKET"] + unset { env.removeValue(forKey: k) }
    env.merge(environment) { $1 }
    var started: (Process, Pipe, Pipe, Pipe)? = nil
    // A program another test thread has just written (a signed app's copy) can be "busy" for an
    // instant: a child forked meanwhile by another thread holds the writer's descriptor until its own
    // exec (ETXTBSY). That is the test process's race, not the program's: try again (a new Process)
    // for up to 2 s.
    for attempt in 0..<40 {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = args
        p.environment = env
        if let directory { p.currentDirectoryURL = directory }
        let (out, err, inp) = (Pipe(), Pipe(), Pipe())
        p.standardOutput = out
        p.standardError = err
        p.standardInput = inp
        do {
            try p.run()
            started = (p, out, err, inp)
            break
        } catch {
            let busy = ((error as NSError).domain == NSPOSIXErrorDomain && (error as NSError).code == Int(ETXTBSY))
                || "\(error)".localizedCaseInsensitiveContains("busy")
            guard busy, attempt < 39 else { return CLIResult(status: -1, stdout: "", stderr: "\(error)") }
            usleep(50_000)
        }
    }
    guard let (p, out, err, inp) = started else { return CLIResult(status: -1, stdout: "", stderr: "not started") }
    // The watchdog holds the process weakly: a cancelled work item stays queued until its deadline,
    // and holding `p` (with its pipes) that long kept three descriptors open per run for five minutes
    // (over a thousand by the end of the suite).
    let watchdog = DispatchWorkItem { [weak p] in if let p, p.isRunning { kill(p.processIdentifier, SIGKILL) } }
    DispatchQueue.global().asyncAfter(deadline: .now() + timeout, execute: watchdog)
    defer {
        try? out.fileHandleForReading.close()
        try? err.fileHandleForReading.close()
    }
    nonisolated(unsafe) var errData = Data()
    let group = DispatchGroup()
    DispatchQueue.global().async(group: group) { errData = err.fileHandleForReading.readDataToEndOfFile() }
    // Standard input is written on its own thread, beside the reads: a child that answers before it has
    // read all of a large input (or never reads it) must not block this writer, nor kill the test
    // process with SIGPIPE when it exits first (EPIPE is then only the end of the write).
    signal(SIGPIPE, SIG_IGN)
    DispatchQueue.global().async(group: group) {
        if let stdin { try? inp.fileHandleForWriting.write(contentsOf: Data(stdin.utf8)) }
        try? inp.fileHandleForWriting.close()
    }
    let o = out.fileHandleForReading.readDataToEndOfFile()
    group.wait()
    p.waitUntilExit()
    watchdog.cancel()
    return CLIResult(status: p.terminationStatus, stdout: String(decoding: o, as: UTF8.self), stderr: String(decoding: errData, as: UTF8.self))
}
