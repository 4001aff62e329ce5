import CofferSystem
import Glibc

/// Where the agent's own dialogs may appear: the person's login session as systemd-logind reports it
/// (``LoginSessions/promptDisplay(uid:loginctl:timeoutSeconds:)``), or the display the agent's
/// configuration names (`prompt-display`, ``init(configured:)``). Never a display a process chose
/// at prompt time: not the systemd user manager's environment, not a client's.
public struct PromptDisplay: Sendable, Equatable, CustomStringConvertible {
    /// Where the display came from.
    public enum Origin: Sendable, Equatable {
        /// logind's session with this id.
        case loginSession(String)
        /// The agent's configuration (`prompt-display`).
        case configuration
    }

    /// The X11 display (`DISPLAY`), nil if none.
    public let x11: String?
    /// The Wayland compositor's socket (`WAYLAND_DISPLAY`: a name in ``runtimeDirectory``, or an
    /// absolute path), nil if none.
    public let wayland: String?
    /// The directory a relative ``wayland`` socket name is in (`XDG_RUNTIME_DIR`; nil: the agent's own).
    public let runtimeDirectory: String?
    public let origin: Origin

    public init(x11: String?, wayland: String?, runtimeDirectory: String? = nil, origin: Origin) {
        self.x11 = x11
        self.wayland = wayland
        self.runtimeDirectory = runtimeDirectory
        self.origin = origin
    }

    /// A display named in the agent's configuration (`prompt-display = VALUE`): an X11 display
    /// (`:0`, `:1.0`, `host:0`) or a Wayland socket (`wayland-0`, or an absolute path); nil for
    /// anything else.
    public init?(configured value: String) {
        if Self.isX11DisplayName(value, localOnly: false) {
            self.init(x11: value, wayland: nil, origin: .configuration)
        } else if Self.isWaylandSocketName(value) {
            self.init(x11: nil, wayland: value, origin: .configuration)
        } else {
            return nil
        }
    }

    /// The variables that place a pinentry's dialog here (`DISPLAY`, `WAYLAND_DISPLAY`, and
    /// `XDG_RUNTIME_DIR` for a Wayland socket in logind's runtime directory).
    public var variables: [String: String] {
        var v: [String: String] = [:]
        if let x11 { v["DISPLAY"] = x11 }
        if let wayland { v["WAYLAND_DISPLAY"] = wayland }
        if let runtimeDirectory { v["XDG_RUNTIME_DIR"] = runtimeDirectory }
        return v
    }

    public var description: String {
        let shown = [x11, wayland.map { w in runtimeDirectory.map { $0 + "/" + w } ?? w }].compactMap { $0 }.joined(separator: ", ")
        switch origin {
        case .loginSession(let id): return "the login session \(id)'s display (\(shown))"
        case .configuration: return "the configured display (\(shown))"
        }
    }

    /// An X11 display name `[host]:N[.S]`; with `localOnly`, only `:N[.S]` (a display on this
    /// machine, which is what logind's `Display` is for a local session).
    static func isX11DisplayName(_ s: String, localOnly: Bool) -> Bool {
        guard let colon = s.lastIndex(of: ":") else { return false }
        let host = s[..<colon], rest = s[s.index(after: colon)...]
        if localOnly && !host.isEmpty { return false }
        guard host.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || ".-_/".contains($0)) }) else { return false }
        let parts = rest.split(separator: ".", omittingEmptySubsequences: false)
        return (1...2).contains(parts.count) && parts.allSatisfy { !$0.isEmpty && $0.count <= 5 && $0.allSatisfy { $0.isASCII && $0.isNumber } }
    }

    /// A Wayland socket: `wayland-NAME` (in the runtime directory) or an absolute path, without
    /// white space or control characters.
    static func isWaylandSocketName(_ s: String) -> Bool {
        guard s.hasPrefix("wayland-") && !s.contains("/") || s.hasPrefix("/") && s.count > 1 else { return false }
        return s.unicodeScalars.allSatisfy { $0.value > 0x20 && $0.value != 0x7f } && s.utf8.count <= 107
    }
}

/// A login session as systemd-logind reports it (`loginctl show-session`): the properties that
/// decide whether the agent's dialogs may appear on it.
public struct LoginSession: Sendable, Equatable {
    public let id: String
    /// The session's owner (`User`; nil if logind did not say).
    public let uid: UInt32?
    /// `x11`, `wayland`, `tty`, `mir`, `unspecified`.
    public let type: String
    /// `user`, `greeter`, `lock-screen`, `background`.
    public let sessionClass: String
    /// The X11 display the session manager registered (empty: none).
    public let display: String
    public let active: Bool
    public let remote: Bool

    public init(id: String, uid: UInt32?, type: String, sessionClass: String, display: String, active: Bool, remote: Bool) {
        self.id = id
        self.uid = uid
        self.type = type
        self.sessionClass = sessionClass
        self.display = display
        self.active = active
        self.remote = remote
    }

    /// A session from `loginctl show-session` properties (`Id`, `User`, `Type`, `Class`, `Display`,
    /// `Active`, `Remote`); nil without an `Id`.
    init?(properties p: [String: String]) {
        guard let id = p["Id"], !id.isEmpty else { return nil }
        self.init(id: id, uid: p["User"].flatMap { UInt32($0) }, type: p["Type"] ?? "", sessionClass: p["Class"] ?? "",
                  display: p["Display"] ?? "", active: p["Active"] == "yes", remote: p["Remote"] != "no")
    }

    /// Where a dialog for `uid` may appear on this session, nil if nowhere: only on `uid`'s own,
    /// active, local (`Remote=no`), graphical session of class `user` (not a greeter, a lock screen
    /// or a background session). X11: logind's `Display` (a local `:N`). Wayland: logind records no
    /// socket, so the compositor's conventional one, `wayland-0` in `runtimePath` (logind's
    /// `RuntimePath` of the user), with logind's `Display` too if it has one (Xwayland).
    public func promptDisplay(for uid: UInt32, runtimePath: String?) -> PromptDisplay? {
        guard self.uid == uid, active, !remote, sessionClass == "user" else { return nil }
        let x11 = PromptDisplay.isX11DisplayName(display, localOnly: true) ? display : nil
        switch type {
        case "x11":
            guard let x11 else { return nil }
            return PromptDisplay(x11: x11, wayland: nil, origin: .loginSession(id))
        case "wayland":
            guard let runtimePath, runtimePath.hasPrefix("/") else { return nil }
            return PromptDisplay(x11: x11, wayland: "wayland-0", runtimeDirectory: runtimePath, origin: .loginSession(id))
        default:
            return nil
        }
    }
}

/// The person's login sessions, read from systemd-logind with the real `loginctl` (over the system
/// bus, whose logind root's session manager fills when a session starts and the user cannot change):
/// where the agent's dialogs may appear.
public enum LoginSessions {
    /// systemd's `loginctl`.
    public static let loginctl = "/usr/bin/loginctl"
    /// At most this many of the user's sessions are looked at.
    static let maximumSessions = 16

    /// Why no session display was found.
    public enum LookupError: Error, Sendable, Equatable, CustomStringConvertible {
        /// logind gave no sessions of the user: it could not be asked (no loginctl, no system bus, no
        /// logind, no answer in time), or it knows the user has none.
        case unreachable(String)
        /// logind answered: the user has no active, local, graphical session.
        case noGraphicalSession(uid: UInt32, sessions: [String])

        public var description: String {
            switch self {
            case .unreachable(let why): "systemd-logind gave no login session of this user (\(why))"
            case .noGraphicalSession(let uid, let sessions):
                "systemd-logind reports no active, local, graphical session of uid \(uid)"
                    + (sessions.isEmpty ? " (it has no session)" : " (its sessions: \(sessions.joined(separator: ", ")))")
            }
        }
    }

    /// The display of `uid`'s active, local, graphical login session (``LoginSession/promptDisplay(for:runtimePath:)``),
    /// as `loginctl` reads it from logind: first the session logind made the user's display session
    /// (`show-user`'s `Display`), then the user's other sessions in logind's order. `loginctl` gets
    /// only `DBUS_SYSTEM_BUS_ADDRESS` (if this process has one), `PATH` and `LANG=C`; every run of it
    /// ends within the shared `timeoutSeconds` (it is killed then).
    public static func promptDisplay(uid: UInt32, loginctl: String = loginctl,
                                     timeoutSeconds: Double = 3) -> Result<PromptDisplay, LookupError> {
        let deadline = Threads.monotonicSeconds() + timeoutSeconds
        var env = ["LANG=C", "PATH=" + (ThisProcess.environment(["PATH"])["PATH"] ?? "/usr/bin:/bin")]
        if let bus = ThisProcess.environment(["DBUS_SYSTEM_BUS_ADDRESS"])["DBUS_SYSTEM_BUS_ADDRESS"] { env.append("DBUS_SYSTEM_BUS_ADDRESS=" + bus) }
        let user: [String: String]
        switch BoundedProgram.run(loginctl, ["--no-pager", "show-user", String(uid), "-p", "Display", "-p", "Sessions", "-p", "RuntimePath"],
                                  environment: env, deadline: deadline) {
        case .failure(let why): return .failure(.unreachable(why.reason))
        case .success(let text): user = properties(text)
        }
        let ids = candidateSessions(user)
        for id in ids {
            guard case .success(let text) = BoundedProgram.run(
                loginctl, ["--no-pager", "show-session", id, "-p", "Id", "-p", "User", "-p", "Type", "-p", "Class", "-p", "Display",
                           "-p", "Active", "-p", "Remote"], environment: env, deadline: deadline) else {
                // Gone since show-user, or logind stopped answering: the next one, within the deadline.
                continue
            }
            guard let session = LoginSession(properties: properties(text)), session.id == id else { continue }
            if let display = session.promptDisplay(for: uid, runtimePath: user["RuntimePath"]) { return .success(display) }
        }
        return .failure(.noGraphicalSession(uid: uid, sessions: ids))
    }

    /// `KEY=VALUE` lines (`loginctl show-*` output) as a dictionary; other lines are ignored, and a
    /// key given twice keeps its first value.
    static func properties(_ text: String) -> [String: String] {
        var out: [String: String] = [:]
        for line in text.split(separator: "\n") {
            guard let eq = line.firstIndex(of: "="), eq != line.startIndex else { continue }
            let key = String(line[..<eq])
            guard key.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber) }), out[key] == nil else { continue }
            out[key] = String(line[line.index(after: eq)...])
        }
        return out
    }

    /// The session ids to look at, in order: the user's display session (`Display`), then its
    /// `Sessions` (space-separated); ids that are not logind's form (letters, digits, `-`, `_`, not
    /// starting with `-`) are left out, as are `self` and `auto` (which GetSession resolves to the
    /// caller's own session), and at most ``maximumSessions``.
    static func candidateSessions(_ user: [String: String]) -> [String] {
        var ids: [String] = []
        for id in [user["Display"] ?? ""] + (user["Sessions"] ?? "").split(separator: " ").map(String.init) {
            guard !id.isEmpty, !id.hasPrefix("-"), id != "self", id != "auto", id.count <= 64,
                  id.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") }), !ids.contains(id) else { continue }
            ids.append(id)
        }
        return Array(ids.prefix(maximumSessions))
    }
}

/// Runs a read-only program to completion with a hard time bound: what the agent's prompter asks of
/// `loginctl` and `systemctl`.
enum BoundedProgram {
    /// Why a program gave no answer, in a few words.
    struct Failure: Error {
        let reason: String
        init(_ reason: String) { self.reason = reason }
    }

    /// Runs `program` with `arguments` and exactly `environment`, reading its output from the
    /// descriptors `outputs` (`[1]`: standard output; `[1, 2]`: with standard error) until it exits;
    /// at `deadline` (monotonic seconds) it is killed and reaped. Success: what it wrote (at most
    /// 1 MiB), when it exited with status 0. Failure: why, in a few words (with the first line of
    /// what it said when it failed).
    static func run(_ program: String, _ arguments: [String], environment: [String], outputs: [Int32] = [1, 2],
                    deadline: Double) -> Result<String, Failure> {
        guard let child = try? Subprocess.spawn(executable: program, arguments: arguments, environment: environment, socketAt: outputs) else {
            return .failure(Failure("\(program) could not be started"))
        }
        let pid = child.pid
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        var ended = false
        while out.count < 1 << 20 {
            let left = Int32((deadline - Threads.monotonicSeconds()) * 1000)
            guard left > 0 else { break }
            guard UnixSocket.waitReadable(child.socket.rawValue, timeoutMillis: left) else { continue }
            let n = chunk.withUnsafeMutableBytes { Glibc.read(child.socket.rawValue, $0.baseAddress!, $0.count) }
            if n == 0 { ended = true; break }
            if n < 0 { if errno == EINTR { continue }; break }
            out += chunk[0..<n]
        }
        // Closing its output is not exiting: the wait is bounded too.
        var status: Int32 = 0
        var reaped = false
        while ended {
            let r = waitpid(pid, &status, WNOHANG)
            if r == pid { reaped = true; break }
            if r < 0 && errno != EINTR { break }
            if Threads.monotonicSeconds() >= deadline { break }
            Threads.sleep(seconds: 0.002)
        }
        if !reaped {
            kill(pid, SIGKILL)
            while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        }
        let text = String(decoding: out, as: UTF8.self)
        guard reaped else { return .failure(Failure("\(program) gave no answer in time")) }
        let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        guard code == 0 else {
            let said = text.split(separator: "\n").first.map { line in
                ": " + String(line.prefix(200).filter { c in c.asciiValue.map { $0 >= 0x20 && $0 != 0x7f } ?? !c.isNewline })
            } ?? ""
            return .failure(Failure("\(program) exited with status \(code)\(said)"))
        }
        return .success(text)
    }
}
