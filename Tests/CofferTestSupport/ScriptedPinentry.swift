import Foundation

/// A shell-script pinentry (GnuPG's Assuan pinentry protocol) for tests: answers each GETPIN with
/// the next of its pins (`^^` in one starts another D line, as a pinentry splits a long answer),
/// or misbehaves as told. Every command it gets is logged (never an answer), and its pid is in
/// `pidFile` once it runs.
public struct ScriptedPinentry: Sendable {
    /// What the pinentry does.
    public enum Behaviour: Sendable {
        /// Answers each GETPIN with the next pin (and CONFIRM with OK).
        case answer
        /// Answers GETPIN with GnuPG's cancel error.
        case cancel
        /// Greets, then hangs at the first GETPIN (the dialog nobody answers).
        case hangAtGetpin
        /// Like ``hangAtGetpin``, and ignores SIGTERM (only SIGKILL ends it).
        case hangIgnoringTerm
        /// Never greets.
        case hangAtGreeting
        /// Greets, then dies of SIGSEGV at the first GETPIN.
        case crashAtGetpin
        /// Exits at once, before the greeting.
        case exitAtOnce
        /// Answers GETPIN with lines that are not the protocol.
        case garbageLines
        /// Answers GETPIN with 16 KiB without a line end.
        case endlessLine
        /// Hangs at the first MESSAGE (a message dialog nobody closes).
        case hangAtMessage
        /// Answers each GETPIN with the next pin, and leaves a CONFIRM open (a "touch the sensor" dialog
        /// nobody dismisses: the sensor answers, and the client stops the pinentry).
        case waitAtConfirm
    }

    /// The executable.
    public let program: String
    /// Its log: one line per command received.
    public let log: String
    /// Where it writes its pid.
    public let pidFile: String

    /// Writes the script into `dir`.
    public init(in dir: TemporaryDirectory, pins: [String] = [], _ behaviour: Behaviour = .answer) throws {
        log = dir.file("pinentry.log")
        program = dir.file("pinentry-scripted")
        pidFile = dir.file("pinentry.pid")
        let answers = pins.map { "'\($0)'" }.joined(separator: " ")
        let getpin: String
        switch behaviour {
        case .answer, .waitAtConfirm: getpin = "printf '%s\\n' \"$1\" | sed 's/\\^\\^/\\nD /g; s/^/D /'; echo OK; shift"
        case .cancel: getpin = "echo 'ERR 83886179 Operation cancelled'"
        case .hangAtGetpin: getpin = "exec sleep 3600"
        case .hangIgnoringTerm: getpin = "trap '' TERM; exec sleep 3600"
        case .crashAtGetpin: getpin = "kill -SEGV $$"
        case .garbageLines: getpin = "echo 'HELLO THERE'; echo 'D not'; echo OK"
        case .endlessLine: getpin = "head -c 16384 /dev/zero | tr '\\000' x"
        case .hangAtGreeting, .exitAtOnce, .hangAtMessage: getpin = "echo OK"
        }
        let start: String
        switch behaviour {
        case .hangAtGreeting: start = "exec sleep 3600"
        case .exitAtOnce: start = "exit 0"
        default: start = "echo 'OK Pleased to meet you'"
        }
        try """
            #!/bin/sh
            echo $$ > '\(pidFile)'
            set -- \(answers)
            \(start)
            while IFS= read -r line; do
              printf '%s\\n' "$line" >> '\(log)'
              case "$line" in
                GETPIN) \(getpin);;
                CONFIRM*) \(behaviour == .waitAtConfirm ? "exec sleep 3600" : "echo OK");;
                MESSAGE) \(behaviour == .hangAtMessage ? "exec sleep 3600" : "echo OK");;
                BYE) echo OK; exit 0;;
                *) echo OK;;
              esac
            done

            """.write(toFile: program + ".src", atomically: true, encoding: .utf8)
        try Self.install(program + ".src", at: program)
    }

    /// Copies `source` to `path` through `cp` and makes it executable. The file to run is never open
    /// for writing in this process: a `fork` by another test's thread would inherit that descriptor,
    /// and while the child holds it, running the file fails with ETXTBSY.
    public static func install(_ source: String, at path: String) throws {
        let cp = Process()
        cp.executableURL = URL(fileURLWithPath: "/bin/cp")
        cp.arguments = [source, path]
        try cp.run()
        cp.waitUntilExit()
        guard cp.terminationStatus == 0, chmod(path, 0o755) == 0 else {
            throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: path])
        }
    }

    /// The commands received so far.
    public var commands: [String] {
        ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    /// The pid it wrote (nil before it ran).
    public var pid: Int32? {
        (try? String(contentsOfFile: pidFile, encoding: .utf8)).flatMap { Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
    }

    /// True while its process exists (not yet reaped).
    public var isRunning: Bool {
        guard let pid else { return false }
        return kill(pid, 0) == 0
    }
}
