import CofferCrypto
public import CofferModel
import CofferSystem
import Glibc

/// Why a pinentry gave no answer that a person chose (a cancel in the dialog is not a failure).
public enum PinentryFailure: Sendable, Equatable, CustomStringConvertible {
    /// The program could not be started, or did not greet (exited at once, or said something else).
    case couldNotStart
    /// It exited or closed its end in the middle of the conversation (crashed, killed).
    case exited
    /// It wrote something that is not the Assuan pinentry protocol (or a line too long).
    case protocolError
    /// It did not reply to a command in time.
    case noReply

    public var description: String {
        switch self {
        case .couldNotStart: "the pinentry could not be started"
        case .exited: "the pinentry exited in the middle of the dialog"
        case .protocolError: "the pinentry does not speak the Assuan pinentry protocol"
        case .noReply: "the pinentry did not reply in time"
        }
    }
}

/// Runs one pinentry program (GnuPG's Assuan pinentry: `pinentry-gnome3`, `pinentry-curses`, …)
/// through an authentication: the client library's pinentry delegate and the agent's own prompter
/// both drive it. The request's prompt goes to SETDESC (it names the calling app and the operation),
/// the question to SETPROMPT, and GETPIN's answer is the passcode or application password; a cancel
/// in the dialog is a cancel. A biometry-only request shows a CONFIRM dialog whose button cancels.
/// The program gets only the environment it is given (no secret ever goes there or into its
/// arguments), talks over a private socket pair, and is stopped when the request ends (SIGTERM,
/// then SIGKILL if it is still there after a grace period). The secret it returns goes straight
/// into secure memory. Nothing here blocks longer than ``replyTimeout`` or past ``deadline``.
public final class Pinentry {
    private let program: String
    private let environment: [String]
    private let identifiesApp: Bool
    private var child: Int32 = -1
    private var fd: Int32 = -1
    private var buffer = SecureBytes(count: 8192)
    private var filled = 0
    private var pin: SecureBytes? = nil
    private var current: AuthenticationRequest? = nil
    /// True while a GETPIN or CONFIRM waits for the person (the pinentry reads no command until it ends).
    private var dialogOpen = false

    /// Longest wait for the greeting and for each command's reply, in seconds.
    public var replyTimeout: Double = 10
    /// A monotonic time (``CofferSystem/Threads/monotonicSeconds()``) after which no reply is waited
    /// for at all (nil: only ``replyTimeout`` bounds each wait).
    public var deadline: Double? = nil
    /// Why the last conversation ended without a person's answer (nil: it did not, or a person cancelled).
    public private(set) var failure: PinentryFailure? = nil

    /// The environment a pinentry needs (the display, the terminal type and the locale).
    public static let passedEnvironment = ["DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY", "DBUS_SESSION_BUS_ADDRESS", "TERM", "LANG",
                                           "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "HOME", "PATH", "XDG_RUNTIME_DIR"]

    /// `program`: the pinentry's absolute path; `environment`: its whole environment (`KEY=VALUE`).
    /// `identifiesApp`: the title names ``AuthenticationRequest/app`` and the description starts with
    /// it (the agent's own prompter, whose client shows nothing itself); else the title is `Coffer`
    /// and the prompt is shown as it is (the client library, where the prompt already names the app).
    public init(program: String, environment: [String], identifiesApp: Bool = false) {
        self.program = program
        self.environment = environment
        self.identifiesApp = identifiesApp
    }

    deinit { end() }

    /// The descriptor to watch for the answer (-1 when no pinentry runs).
    public var inputDescriptor: Int32 { fd }

    /// True while a pinentry runs.
    public var isRunning: Bool { fd >= 0 }

    /// Starts the pinentry if it is not running and asks for `request`. False if it could not
    /// (``failure`` says why).
    public func begin(_ request: AuthenticationRequest) -> Bool {
        failure = nil
        return begin(request, error: nil)
    }

    /// Starts the pinentry if it is not running, then asks.
    private func begin(_ request: AuthenticationRequest, error: String?) -> Bool {
        current = request
        return start() && ask(request, error: error)
    }

    /// Starts the pinentry if it is not running and waits for its greeting.
    private func start() -> Bool {
        guard fd < 0 else { return true }
        guard let started = try? Subprocess.spawn(executable: program, environment: environment, socketAt: [0, 1]) else {
            failure = .couldNotStart
            return false
        }
        child = started.pid
        fd = dup(started.socket.rawValue)
        guard fd >= 0, let greeting = readLine(), greeting.hasPrefix("OK") else {
            if failure == nil || failure == .exited || failure == .protocolError { failure = .couldNotStart }
            stopProgram()
            return false
        }
        return true
    }

    /// Shows `text` in a one-button message dialog (Assuan MESSAGE) about `app`'s request (why it
    /// ended: the attempt schedule's wait, too many wrong passcodes) and waits until the person
    /// closes it, never past ``deadline`` (nor longer than `seconds`). An open question is closed
    /// first. False if it could not be shown.
    @discardableResult
    public func message(_ text: String, app: String, seconds: Double) -> Bool {
        if dialogOpen { stopProgram() }
        failure = nil
        guard start() else { return false }
        let title = identifiesApp ? "Coffer: \(app)" : "Coffer"
        let body = identifiesApp ? "Requested by: \(app)\n\n" + text : text
        for c in ["SETTITLE " + Assuan.escape(title), "SETDESC " + Assuan.escape(body)] {
            guard send(c), let reply = readLine(), reply.hasPrefix("OK") else {
                stopProgram()
                return false
            }
        }
        guard send("MESSAGE") else { stopProgram(); return false }
        // The person closes it (OK), or the time is up: either way the pinentry goes.
        let closed = readLine(timeout: seconds).map { $0.hasPrefix("OK") || $0.hasPrefix("ERR") } ?? false
        stopProgram()
        return closed
    }

    /// Asks the person to allow or refuse something (Assuan CONFIRM with two buttons, `ok` and
    /// `cancel`): `description` says what; the title (and the description's first line) names `app`
    /// as the agent identified it. The answer arrives later on ``inputDescriptor``: read it with
    /// ``confirmationReady()``. False if the dialog could not be shown (``failure`` says why).
    public func beginConfirmation(_ description: String, app: String, ok: String, cancel: String) -> Bool {
        failure = nil
        current = nil
        guard start() else { return false }
        let title = identifiesApp ? "Coffer: \(app)" : "Coffer"
        let body = identifiesApp ? "Requested by: \(app)\n\n" + description : description
        for c in ["SETTITLE " + Assuan.escape(title), "SETDESC " + Assuan.escape(body), "SETOK " + Assuan.escape(ok),
                  "SETCANCEL " + Assuan.escape(cancel)] {
            guard send(c), let reply = readLine(), reply.hasPrefix("OK") else {
                if failure == nil { failure = .protocolError }
                stopProgram()
                return false
            }
        }
        dialogOpen = send("CONFIRM")
        if !dialogOpen { failure = .exited; stopProgram() }
        return dialogOpen
    }

    /// The input is readable while a confirmation is open: true if the person allowed, false if they
    /// refused (or the pinentry broke off: ``failure`` is set and it is stopped), nil to keep waiting.
    public func confirmationReady() -> Bool? {
        guard fill() else {
            _ = broken(filled >= buffer.count ? .protocolError : .exited)
            return false
        }
        while var line = takeLine() {
            defer { secureZero(&line) }
            if line.starts(with: Array("OK".utf8)) {
                dialogOpen = false
                return true
            } else if line.starts(with: Array("ERR".utf8)) {
                dialogOpen = false
                return false
            } else if !(line.first == UInt8(ascii: "S") || line.first == UInt8(ascii: "#") || line.isEmpty) {
                _ = broken(.protocolError)
                return false
            }
        }
        return nil
    }

    /// Describes the request and starts GETPIN (or CONFIRM for the sensor alone); the answer arrives
    /// later on ``inputDescriptor``.
    private func ask(_ request: AuthenticationRequest, error: String?) -> Bool {
        var description = request.prompt + (request.methods.contains(.biometry) ? "\n\nYou can also touch the sensor." : "")
        if identifiesApp { description = "Requested by: \(request.app)\(request.identity.map { " (\($0))" } ?? "")\n\n" + description }
        var commands = ["SETTITLE " + Assuan.escape(identifiesApp ? "Coffer: \(request.app)" : "Coffer"), "SETDESC " + Assuan.escape(description)]
        if let error { commands.append("SETERROR " + Assuan.escape(error)) }
        let wantsText = request.methods.contains(.passcode) || request.methods.contains(.applicationPassword)
        if wantsText {
            commands.append("SETPROMPT " + Assuan.escape(request.methods == [.applicationPassword] ? "Application password:" : "Passcode:"))
        } else {
            commands.append("SETOK Cancel")
        }
        for c in commands {
            guard send(c), let reply = readLine(), reply.hasPrefix("OK") else {
                if failure == nil { failure = .protocolError }
                stopProgram()
                return false
            }
        }
        dialogOpen = send(wantsText ? "GETPIN" : "CONFIRM --one-button")
        if !dialogOpen { failure = .exited; stopProgram() }
        return dialogOpen
    }

    /// The input is readable: the answer, or nil to keep waiting. A pinentry that exited, broke the
    /// protocol or filled the buffer without a line gives `.cancel` with ``failure`` set.
    public func inputReady() -> AuthenticationAnswer? {
        guard fill() else { return broken(filled >= buffer.count ? .protocolError : .exited) }
        while var line = takeLine() {
            defer { secureZero(&line) }
            if line.count >= 2, line[0] == UInt8(ascii: "D"), line[1] == UInt8(ascii: " ") {
                // A long answer comes as several D lines: they add up.
                let piece = Assuan.unescape(line, from: 2)
                pin = pin.map { SecureBytes(concatenating: [$0, piece]) } ?? piece
            } else if line.starts(with: Array("OK".utf8)) {
                guard let p = pin, p.count > 0, let methods = current?.methods, methods.contains(.passcode) || methods.contains(.applicationPassword) else {
                    pin = nil
                    dialogOpen = false
                    return .cancel
                }
                pin = nil
                dialogOpen = false
                return methods == [.applicationPassword] ? .applicationPassword(p) : .passcode(p)
            } else if line.starts(with: Array("ERR".utf8)) {
                pin = nil
                dialogOpen = false
                return .cancel
            } else if !(line.first == UInt8(ascii: "S") || line.first == UInt8(ascii: "#") || line.isEmpty) {
                // Status lines (S …) and comments are ignored; anything else is not a pinentry talking.
                return broken(.protocolError)
            }
        }
        return nil
    }

    /// Ends a conversation that went wrong: the pinentry is stopped, and the answer is a cancel.
    private func broken(_ why: PinentryFailure) -> AuthenticationAnswer {
        stopProgram()
        failure = why
        return .cancel
    }

    /// Shows the agent's feedback as the dialog's error line. A wrong passcode closed the dialog with
    /// its answer: it is asked again. Other feedback comes while the dialog is still open (a failed
    /// match, the sensor's own message, biometry out for the request): Assuan cannot change an open
    /// dialog, so that pinentry is stopped and a new one shows the message with the same question
    /// (without "touch the sensor" once only the passcode is left). Feedback while no dialog is open
    /// and no answer is due (the passcode given is being checked) is not shown.
    public func feedback(_ text: String, kind: AuthFeedbackKind?) {
        guard var request = current else { return }
        if kind == .passcodeOnly { request.methods.remove(.biometry) }
        if dialogOpen {
            stopProgram()
        } else if kind == .notice || kind == .noMatch || fd < 0 {
            return
        }
        if !begin(request, error: text) { stopProgram() }
    }

    /// The request ended: the pinentry is stopped.
    public func end() {
        stopProgram()
        current = nil
    }

    /// How long a pinentry has after SIGTERM before it gets SIGKILL.
    static let terminationGraceSeconds = 2.0

    /// Stops the pinentry (closing its dialog) and forgets what it had sent. Never waits long: a
    /// pinentry that ignores SIGTERM is killed.
    private func stopProgram() {
        dialogOpen = false
        if fd >= 0 {
            _ = send("BYE")
            close(fd)
            fd = -1
        }
        if child > 0 {
            kill(child, SIGTERM)
            var status: Int32 = 0
            let killAt = Threads.monotonicSeconds() + Self.terminationGraceSeconds
            while waitpid(child, &status, WNOHANG) == 0 {
                if Threads.monotonicSeconds() >= killAt {
                    kill(child, SIGKILL)
                    while waitpid(child, &status, 0) < 0 && errno == EINTR {}
                    break
                }
                usleep(5000)
            }
            child = -1
        }
        buffer.withUnsafeMutableBytes { b in _ = memset(b.baseAddress!, 0, b.count) }
        filled = 0
        pin = nil
    }

    /// Writes one command line without blocking (a pinentry that stopped reading cannot hold us).
    private func send(_ line: String) -> Bool {
        guard fd >= 0 else { return false }
        let bytes = Array((line + "\n").utf8)
        return bytes.withUnsafeBytes { UnixSocket.writeAll(fd, $0, dontWait: true) }
    }

    /// Reads what is there into the buffer; false at end of file, on an error, or with the buffer full.
    private func fill() -> Bool {
        guard fd >= 0, filled < buffer.count else { return false }
        let n = buffer.withUnsafeMutableBytes { b in Glibc.read(fd, b.baseAddress! + filled, b.count - filled) }
        if n <= 0 { return n < 0 && (errno == EINTR || errno == EAGAIN) }
        filled += n
        return true
    }

    /// The next complete line (without its LF), consumed from the buffer; the copy is wiped by the caller's scope.
    private func takeLine() -> [UInt8]? {
        let line: [UInt8]? = buffer.withUnsafeMutableBytes { b in
            guard let nl = (0..<filled).first(where: { b[$0] == 0x0A }) else { return nil }
            let l = Array(b[0..<nl])
            let rest = filled - nl - 1
            if rest > 0 { memmove(b.baseAddress!, b.baseAddress! + nl + 1, rest) }
            memset(b.baseAddress! + rest, 0, nl + 1)
            filled = rest
            return l
        }
        return line
    }

    /// A whole line, waiting for it (the greeting and command replies), at most `timeout` (default
    /// ``replyTimeout``) and never past ``deadline``; nil (with ``failure`` set) if none came.
    private func readLine(timeout: Double? = nil) -> String? {
        let deadline = min(Threads.monotonicSeconds() + (timeout ?? replyTimeout), self.deadline ?? .infinity)
        while true {
            if let l = takeLine() { return String(decoding: l, as: UTF8.self) }
            let left = Int32(max(0, (deadline - Threads.monotonicSeconds()) * 1000))
            guard left > 0 else { failure = .noReply; return nil }
            guard UnixSocket.waitReadable(fd, timeoutMillis: left) else { continue }
            guard fill() else { failure = filled >= buffer.count ? .protocolError : .exited; return nil }
        }
    }
}
