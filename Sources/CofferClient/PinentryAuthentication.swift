import CofferCrypto
public import CofferModel
import CofferSystem
import Glibc

/// Asks the person through a pinentry program (GnuPG's Assuan pinentry: `pinentry-gnome3`,
/// `pinentry-curses`, …), for clients without a terminal: a desktop app, or the CLI started from one.
/// The agent's prompt goes to SETDESC (it names the calling app and the operation), the question to
/// SETPROMPT, and GETPIN's answer is the passcode or application password; a cancel in the dialog is a
/// cancel. A biometry-only request shows a CONFIRM dialog whose button cancels. The program runs with
/// only the display-related environment, talks over a private socket pair, and is stopped when the
/// request ends. The secret it returns goes straight into secure memory.
public final class PinentryAuthentication: AuthenticationDelegate {
    private let program: String
    private var child: Int32 = -1
    private var fd: Int32 = -1
    private var buffer = SecureBytes(count: 8192)
    private var filled = 0
    private var pin: SecureBytes? = nil
    private var current: AuthenticationRequest? = nil
    private var error: String? = nil
    /// True while a GETPIN or CONFIRM waits for the person (the pinentry reads no command until it ends).
    private var dialogOpen = false

    /// The environment a pinentry gets (it needs the display, the terminal type and the locale).
    static let passedEnvironment = ["DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY", "DBUS_SESSION_BUS_ADDRESS", "TERM", "LANG",
                                    "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "HOME", "PATH", "XDG_RUNTIME_DIR"]

    /// `program`: the pinentry's absolute path.
    public init(program: String) { self.program = program }

    /// How this process can ask the person: its terminal if it has one, else the pinentry
    /// `COFFER_PINENTRY` names, else nobody (requests that need the person then fail with
    /// errSecInteractionNotAllowed at once).
    public static func standard() -> (any AuthenticationDelegate)? {
        if TerminalAuthentication.isAvailable { return TerminalAuthentication() }
        return fromEnvironment()
    }

    /// The pinentry `COFFER_PINENTRY` names (an absolute path), if any.
    public static func fromEnvironment() -> PinentryAuthentication? {
        guard let p = ThisProcess.environment(["COFFER_PINENTRY"])["COFFER_PINENTRY"], p.hasPrefix("/") else { return nil }
        return PinentryAuthentication(program: p)
    }

    deinit { end() }

    public var inputDescriptor: Int32 { fd }

    public func begin(_ request: AuthenticationRequest) -> Bool {
        begin(request, error: nil)
    }

    /// Starts the pinentry if it is not running, then asks.
    private func begin(_ request: AuthenticationRequest, error: String?) -> Bool {
        current = request
        if fd < 0 {
            let env = ThisProcess.environment(Self.passedEnvironment).map { "\($0.key)=\($0.value)" }
            guard let started = try? Subprocess.spawn(executable: program, environment: env, socketAt: [0, 1]) else { return false }
            child = started.pid
            fd = dup(started.socket.rawValue)
            guard fd >= 0, let greeting = readLine(), greeting.hasPrefix("OK") else { end(); return false }
        }
        return ask(request, error: error)
    }

    /// Describes the request and starts GETPIN (or CONFIRM for the sensor alone); the answer arrives
    /// later on ``inputDescriptor``.
    private func ask(_ request: AuthenticationRequest, error: String?) -> Bool {
        let description = request.prompt + (request.methods.contains(.biometry) ? "\n\nYou can also touch the sensor." : "")
        var commands = ["SETTITLE Coffer", "SETDESC " + Assuan.escape(description)]
        if let error { commands.append("SETERROR " + Assuan.escape(error)) }
        let wantsText = request.methods.contains(.passcode) || request.methods.contains(.applicationPassword)
        if wantsText {
            commands.append("SETPROMPT " + Assuan.escape(request.methods == [.applicationPassword] ? "Application password:" : "Passcode:"))
        } else {
            commands.append("SETOK Cancel")
        }
        for c in commands {
            guard send(c), let reply = readLine(), reply.hasPrefix("OK") else { end(); return false }
        }
        dialogOpen = send(wantsText ? "GETPIN" : "CONFIRM --one-button")
        return dialogOpen
    }

    public func inputReady() -> AuthenticationAnswer? {
        guard fill() else { return .cancel }
        while var line = takeLine() {
            defer { secureZero(&line) }
            if line.count >= 2, line[0] == UInt8(ascii: "D"), line[1] == UInt8(ascii: " ") {
                // A long answer comes as several D lines: they add up.
                let piece = Assuan.unescape(line, from: 2)
                pin = pin.map { SecureBytes(concatenating: [$0, piece]) } ?? piece
            } else if line.starts(with: Array("OK".utf8)) {
                guard let p = pin, p.count > 0, let methods = current?.methods, methods.contains(.passcode) || methods.contains(.applicationPassword) else {
                    return .cancel
                }
                pin = nil
                dialogOpen = false
                return methods == [.applicationPassword] ? .applicationPassword(p) : .passcode(p)
            } else if line.starts(with: Array("ERR".utf8)) {
                pin = nil
                dialogOpen = false
                return .cancel
            }
            // Status lines (S …, #comments) are ignored.
        }
        return nil
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

    public func end() {
        stopProgram()
        current = nil
    }

    /// Stops the pinentry (closing its dialog) and forgets what it had sent.
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
            _ = waitpid(child, &status, 0)
            child = -1
        }
        buffer.withUnsafeMutableBytes { b in _ = memset(b.baseAddress!, 0, b.count) }
        filled = 0
        pin = nil
    }

    private func send(_ line: String) -> Bool {
        let bytes = Array((line + "\n").utf8)
        return bytes.withUnsafeBytes { UnixSocket.writeAll(fd, $0) }
    }

    /// Reads what is there into the buffer; false at end of file or on an error.
    private func fill() -> Bool {
        guard filled < buffer.count else { return false }
        let n = buffer.withUnsafeMutableBytes { b in Glibc.read(fd, b.baseAddress! + filled, b.count - filled) }
        if n <= 0 { return n < 0 && errno == EINTR }
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

    /// A whole line, waiting for it (the greeting and command replies), at most 10 s.
    private func readLine() -> String? {
        let deadline = Threads.monotonicSeconds() + 10
        while true {
            if let l = takeLine() { return String(decoding: l, as: UTF8.self) }
            let left = Int32(max(0, (deadline - Threads.monotonicSeconds()) * 1000))
            guard left > 0, UnixSocket.waitReadable(fd, timeoutMillis: left), fill() else { return nil }
        }
    }
}
