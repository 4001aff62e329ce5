import CofferCrypto
public import CofferModel
import CofferSystem
import Glibc

/// The saved terminal settings, restored by the SIGINT/SIGTERM handler while echo is off (a C signal
/// handler cannot capture context). Heap memory allocated once: a global of the imported `termios`
/// type got less storage than `tcsetattr` writes (AddressSanitizer caught it).
nonisolated(unsafe) private let savedTerminal: UnsafeMutablePointer<termios> = {
    let p = UnsafeMutablePointer<termios>.allocate(capacity: 1)
    p.initialize(to: termios())
    return p
}()
nonisolated(unsafe) private var savedTerminalFD: Int32 = -1
nonisolated(unsafe) private var previousHandlers: (interrupt: sighandler_t?, terminate: sighandler_t?) = (nil, nil)

/// Echo off on the terminal `fd` (line mode kept on), with SIGINT and SIGTERM restoring it before
/// the process dies, so Ctrl-C at a prompt never leaves the shell without echo. Returns the settings
/// to give back to ``restoreEcho(_:_:)``, or nil if `fd` is not a terminal (nothing changed).
func silenceEcho(_ fd: Int32) -> termios? {
    var saved = termios()
    guard tcgetattr(fd, &saved) == 0 else { return nil }
    var quiet = saved
    quiet.c_lflag &= ~tcflag_t(ECHO)
    quiet.c_lflag |= tcflag_t(ICANON)
    savedTerminal.pointee = saved
    savedTerminalFD = fd
    previousHandlers = (signal(SIGINT, restoreAndExit), signal(SIGTERM, restoreAndExit))
    // TCSANOW, not TCSAFLUSH: what was typed ahead stays.
    _ = tcsetattr(fd, TCSANOW, &quiet)
    return saved
}

/// Gives the terminal back its settings and the process its signal handlers.
func restoreEcho(_ fd: Int32, _ saved: termios) {
    var saved = saved
    _ = tcsetattr(fd, TCSANOW, &saved)
    signal(SIGINT, previousHandlers.interrupt ?? SIG_DFL)
    signal(SIGTERM, previousHandlers.terminate ?? SIG_DFL)
    previousHandlers = (nil, nil)
    savedTerminalFD = -1
}

/// Asks the person on the controlling terminal (`/dev/tty`, never stdin), like sudo: shows the agent's
/// prompt, reads a passcode with echo off (the terminal's line mode: the answer is read once the
/// person presses Enter), and shows the agent's feedback. A finger on the sensor needs no typing: the
/// agent's final reply ends the prompt. Ctrl-D cancels; Ctrl-C too (the terminal is restored).
public final class TerminalAuthentication: AuthenticationDelegate {
    private var fd: Int32 = -1
    private var saved: termios? = nil
    private var current: AuthenticationRequest? = nil
    private let name: String

    /// `name` starts each line (`coffer`).
    public init(name: String = "coffer") { self.name = name }

    deinit { end() }

    /// True if this process has a controlling terminal to ask on.
    public static var isAvailable: Bool {
        (try? FileDescriptor.open("/dev/tty", O_RDWR | O_NOCTTY)) != nil
    }

    public func begin(_ request: AuthenticationRequest) -> Bool {
        if fd < 0 {
            guard let tty = try? FileDescriptor.open("/dev/tty", O_RDWR | O_NOCTTY) else { return false }
            fd = tty.release()
            saved = silenceEcho(fd)
        }
        current = request
        say("\(name): \(TerminalSafeText.escaped(request.prompt))\n" + question(request.methods))
        return true
    }

    public var inputDescriptor: Int32 { fd }

    public func inputReady() -> AuthenticationAnswer? {
        let buffer = SecureBytes(count: 4096)
        let read = buffer.withUnsafeMutableBytes { b in
            Result { () throws(SystemError) in try Syscall.interruptible("read", "/dev/tty") { Glibc.read(fd, b.baseAddress!, b.count) } }
        }
        let n: Int
        switch read {
        case .success(let count?): n = count
        case .success(nil): return nil // interrupted: wait again
        case .failure(let error): return error.errno == EAGAIN ? nil : .cancel
        }
        if n == 0 { return .cancel } // Ctrl-D
        let length = buffer.withUnsafeBytes { b -> Int in
            var m = n
            while m > 0 && (b[m - 1] == 0x0A || b[m - 1] == 0x0D) { m -= 1 }
            return m
        }
        let methods = current?.methods ?? []
        if methods == [.applicationPassword] {
            guard length > 0 else { say("\n" + question(methods)); return nil }
            say("\n")
            return .applicationPassword(buffer.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<length])) })
        }
        if length == 0 {
            // Enter alone: with the sensor only, that cancels; otherwise ask again.
            if !methods.contains(.passcode) { return .cancel }
            say("\n" + question(methods))
            return nil
        }
        guard methods.contains(.passcode) else { return .fallback }
        say("\n")
        return .passcode(buffer.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<length])) })
    }

    public func feedback(_ text: String, kind: AuthFeedbackKind?) {
        // Once biometry is out for this request, only the passcode is left to ask for.
        if kind == .passcodeOnly { current?.methods.remove(.biometry) }
        say("\(name): \(TerminalSafeText.escaped(text))\n" + question(current?.methods ?? [.passcode]))
    }

    public func end() {
        guard fd >= 0 else { return }
        if let saved { restoreEcho(fd, saved) }
        saved = nil
        say("\n")
        close(fd)
        fd = -1
    }

    private func question(_ methods: AuthenticationMethods) -> String {
        if methods == [.applicationPassword] { return "Application password: " }
        switch (methods.contains(.biometry), methods.contains(.passcode)) {
        case (true, true): return "Touch the sensor, or type your passcode: "
        case (true, false): return "Touch the sensor (Enter to cancel): "
        default: return "Passcode: "
        }
    }

    private func say(_ text: String) {
        var text = text
        _ = text.withUTF8 { StandardStreams.write(fd, UnsafeRawBufferPointer($0)) }
    }
}

/// SIGINT/SIGTERM while the terminal's echo is off: restore it, end the prompt's line, then die of
/// the signal as usual (a shell sees status 130 for Ctrl-C, and a script or loop that ran the command
/// stops too, as with `sudo` and `passwd`). Only async-signal-safe calls.
private func restoreAndExit(_ sig: Int32) {
    if savedTerminalFD >= 0 {
        _ = tcsetattr(savedTerminalFD, TCSANOW, savedTerminal)
        _ = write(savedTerminalFD, "\n", 1)
    }
    signal(sig, SIG_DFL)
    raise(sig)
}
