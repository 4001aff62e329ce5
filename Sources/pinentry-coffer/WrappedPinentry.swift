import CofferClient
import CofferCrypto
import CofferPrompt
import CofferModel
import CofferSystem
import Glibc

/// The real pinentry (pinentry-curses, pinentry-gnome3, …), started only when the person has to be
/// asked, over a private socket pair on its stdin and stdout, with the display- and terminal-related
/// environment only. gpg-agent's OPTIONs and settings reach it by replay (``Session``).
final class WrappedPinentry {
    let program: String
    let arguments: [String]
    private(set) var channel: LineChannel?
    private var pid: Int32 = -1
    private var socket: Int32 = -1

    /// What a pinentry needs of the environment: the display, the terminal, the locale.
    static let passedEnvironment = ["DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY", "DBUS_SESSION_BUS_ADDRESS", "TERM", "GPG_TTY",
                                    "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "HOME", "PATH", "XDG_RUNTIME_DIR",
                                    "XDG_SESSION_TYPE", "XDG_CURRENT_DESKTOP", "PINENTRY_USER_DATA"]

    init(program: String, arguments: [String]) {
        self.program = program
        self.arguments = arguments
    }

    deinit { stop() }

    var isRunning: Bool { channel != nil }

    /// Starts the program and reads its greeting; false (and nothing running) if that fails.
    func start() -> Bool {
        if channel != nil { return true }
        let env = ThisProcess.environment(Self.passedEnvironment).map { "\($0.key)=\($0.value)" }
        guard let child = try? Subprocess.spawn(executable: program, arguments: arguments, environment: env, socketAt: [0, 1]) else {
            return false
        }
        pid = child.pid
        socket = child.takeSocket().release()
        channel = LineChannel(input: socket, output: socket)
        guard let greeting = channel?.readLine(), AssuanLine.keyword(greeting) == "OK" else {
            stop()
            return false
        }
        return true
    }

    /// Sends `command` and waits for its OK or ERR (status and comment lines are dropped); true for OK.
    @discardableResult
    func transact(_ command: String) -> Bool {
        guard let channel, channel.send(command) else { return false }
        return waitForCompletion()
    }

    /// Reads to the end of the current command's reply; true for OK. D lines are wiped unread.
    func waitForCompletion() -> Bool {
        while let line = channel?.readLine() {
            defer { line.wipe() }
            switch AssuanLine.keyword(line) {
            case "OK": return true
            case "ERR": return false
            default: continue
            }
        }
        stop()
        return false
    }

    /// Says BYE and ends the child (SIGTERM if it lingers).
    func stop() {
        if let channel { channel.send("BYE") }
        channel = nil
        if socket >= 0 {
            close(socket)
            socket = -1
        }
        guard pid > 0 else { return }
        var status: Int32 = 0
        for _ in 0..<100 {
            if waitpid(pid, &status, WNOHANG) == pid { pid = -1; return }
            usleep(10_000)
        }
        kill(pid, SIGTERM)
        _ = waitpid(pid, &status, 0)
        pid = -1
    }
}

/// Item 6 of issue #17: a protected item's prompt, asked through the wrapped pinentry (the same
/// dialog style as the GnuPG passphrase's), since pinentry-coffer has no terminal of its own.
/// The agent's sentence goes to SETDESC, GETPIN's answer is the passcode or application password;
/// a sensor-only request shows a one-button CONFIRM whose button cancels.
final class WrappedPinentryAuthentication: AuthenticationDelegate {
    private unowned let session: Session
    private var current: AuthenticationRequest?
    private var pin: SecureBytes?
    /// A GETPIN or CONFIRM is open in the wrapped pinentry.
    private var outstanding = false

    init(session: Session) { self.session = session }

    var inputDescriptor: Int32 { session.wrapped?.channel?.input ?? -1 }

    func begin(_ request: AuthenticationRequest) -> Bool {
        current = request
        return ask(request, error: nil)
    }

    private func ask(_ request: AuthenticationRequest, error: String?) -> Bool {
        guard let wrapped = session.prepareOwnDialog() else { return false }
        let wantsText = request.methods.contains(.passcode) || request.methods.contains(.applicationPassword)
        let description = request.prompt + (request.methods.contains(.biometry) ? "\n\nYou can also touch the sensor." : "")
        var commands = ["SETTITLE Coffer", "SETDESC " + Assuan.escape(description)]
        if let error { commands.append("SETERROR " + Assuan.escape(error)) }
        if wantsText {
            commands.append("SETPROMPT " + (request.methods == [.applicationPassword] ? "Application password:" : "Passcode:"))
        } else {
            commands.append("SETOK Cancel")
        }
        for c in commands where !wrapped.transact(c) { return false }
        guard let channel = wrapped.channel, channel.send(wantsText ? "GETPIN" : "CONFIRM --one-button") else { return false }
        outstanding = true
        return true
    }

    func inputReady() -> AuthenticationAnswer? {
        guard let channel = session.wrapped?.channel, channel.fill() else { outstanding = false; return .cancel }
        while let line = channel.takeLine() {
            defer { line.wipe() }
            if AssuanLine.isData(line) {
                // A long answer comes as several D lines: they add up.
                let piece = AssuanLine.data(line)
                pin = pin.map { SecureBytes(concatenating: [$0, piece]) } ?? piece
                continue
            }
            switch AssuanLine.keyword(line) {
            case "OK":
                outstanding = false
                guard let p = pin, p.count > 0, let methods = current?.methods,
                      methods.contains(.passcode) || methods.contains(.applicationPassword) else { return .cancel }
                pin = nil
                return methods == [.applicationPassword] ? .applicationPassword(p) : .passcode(p)
            case "ERR":
                outstanding = false
                pin = nil
                return .cancel
            default: continue // status lines, comments
            }
        }
        return nil
    }

    func feedback(_ text: String, kind: AuthFeedbackKind?) {
        // The dialog closed with the answer: ask again, showing why.
        guard let current, !outstanding else { return }
        _ = ask(current, error: text)
    }

    func end() {
        pin?.wipe()
        pin = nil
        // A dialog still open (the sensor answered first) cannot be taken back: end that pinentry;
        // the next question starts a fresh one.
        if outstanding { session.wrapped?.stop() }
        outstanding = false
    }
}
