public import CofferModel
import CofferSystem
import Glibc

/// What ``PinentryPrompter/await(stop:wake:within:)`` saw.
public enum PromptEvent: Sendable {
    /// The person answered (a passcode, an application password) or cancelled in the dialog.
    case answer(AuthenticationAnswer)
    /// `stop()` became true (the caller has something to do: the sensor answered).
    case stopped
    /// The deadline passed: the pinentry was stopped (killed if it had to be).
    case timedOut
    /// The pinentry could not be asked or broke off the conversation; it is stopped.
    case failed(PinentryFailure)
}

/// Asks the person through the user's pinentry on behalf of a caller that cannot prompt itself
/// (the agent's own prompter: for front ends such as the Secret Service bridge and the ssh-agent
/// socket). One prompter serves one authentication request: ``ask(_:)`` starts the dialog,
/// ``await(stop:wake:within:)`` waits for the answer, ``feedback(_:kind:)`` shows "wrong
/// passcode" (and asks again) between tries, ``end()`` closes it.
///
/// It never hangs: everything it waits for is bounded by a hard deadline that starts with the
/// first ``ask(_:)`` (``timeoutSeconds``), each command reply by ``Pinentry/replyTimeout``, and a
/// pinentry that does not go when told is killed. A pinentry that cannot start, exits, crashes or
/// writes something that is not the pinentry protocol ends the request at once
/// (``PromptEvent/failed(_:)``). Answers go straight into secure memory; nothing secret is ever in
/// the pinentry's arguments or environment, and no log line here carries one.
public final class PinentryPrompter {
    private let pinentry: Pinentry
    /// Longest the whole request may take with the person, in seconds.
    public let timeoutSeconds: Double
    private var hardDeadline: Double? = nil
    private var failure: PinentryFailure? = nil

    /// `program`: the pinentry's absolute path; `environment`: its environment (see
    /// ``PinentryEnvironment``); `timeoutSeconds`: the request's hard deadline; `replyTimeout`: the
    /// longest wait for the pinentry's greeting and each reply.
    public init(program: String, environment: [String], timeoutSeconds: Double = 120, replyTimeout: Double = 10) {
        pinentry = Pinentry(program: program, environment: environment, identifiesApp: true)
        pinentry.replyTimeout = replyTimeout
        self.timeoutSeconds = timeoutSeconds
    }

    deinit { pinentry.end() }

    /// Starts the dialog for `request` (the first call starts the deadline). False if the pinentry
    /// could not be asked; ``await(stop:wake:within:)`` then reports why at once.
    @discardableResult
    public func ask(_ request: AuthenticationRequest) -> Bool {
        let deadline = hardDeadline ?? Threads.monotonicSeconds() + timeoutSeconds
        hardDeadline = deadline
        pinentry.deadline = deadline
        failure = nil
        guard pinentry.begin(request) else {
            failure = pinentry.failure ?? .couldNotStart
            return false
        }
        return true
    }

    /// Waits for the person's answer, at most `within` seconds and never past the hard deadline;
    /// returns `.stopped` as soon as `stop()` is true (checked whenever `wake` becomes readable, and
    /// at least every second).
    public func await(stop: () -> Bool, wake: Int32 = -1, within: Double = .infinity) -> PromptEvent {
        let deadline = min(hardDeadline ?? Threads.monotonicSeconds() + timeoutSeconds, Threads.monotonicSeconds() + within)
        while true {
            if let failure { return .failed(failure) }
            if stop() { return .stopped }
            let now = Threads.monotonicSeconds()
            if now >= deadline {
                pinentry.end()
                return .timedOut
            }
            let input = pinentry.inputDescriptor
            guard input >= 0 else {
                // A feedback could not show its new dialog: the pinentry is gone.
                failure = pinentry.failure ?? .exited
                continue
            }
            var fds = [pollfd(fd: input, events: Int16(POLLIN), revents: 0), pollfd(fd: wake, events: Int16(POLLIN), revents: 0)]
            let millis = Int32(max(1, min(1000, (deadline - now) * 1000)))
            let n = fds.withUnsafeMutableBufferPointer { Glibc.poll($0.baseAddress, wake >= 0 ? 2 : 1, millis) }
            guard n > 0, fds[0].revents != 0 else { continue }
            guard let answer = pinentry.inputReady() else { continue }
            if case .cancel = answer, let why = pinentry.failure {
                failure = why
                continue
            }
            return .answer(answer)
        }
    }

    /// What ``confirm(_:app:ok:cancel:hangup:)`` saw.
    public enum ConfirmationEvent: Sendable, Equatable {
        /// The person chose `ok`.
        case allowed
        /// The person chose `cancel` (or closed the dialog).
        case refused
        /// The descriptor watched for a hang-up was hung up (the client went away): the dialog closed.
        case hungUp
        /// The deadline passed: the pinentry was stopped.
        case timedOut
        /// The pinentry could not be asked or broke off the conversation; it is stopped.
        case failed(PinentryFailure)
    }

    /// Asks the person to allow something (a two-button CONFIRM dialog naming `app`) and waits for the
    /// answer, never past the hard deadline; ends the dialog at once when `hangup` (a connected socket,
    /// or -1) is hung up by its peer. The pinentry is stopped before this returns.
    public func confirm(_ description: String, app: String, ok: String = "Allow", cancel: String = "Refuse",
                        hangup: Int32 = -1) -> ConfirmationEvent {
        let deadline = hardDeadline ?? Threads.monotonicSeconds() + timeoutSeconds
        hardDeadline = deadline
        pinentry.deadline = deadline
        defer { pinentry.end() }
        guard pinentry.beginConfirmation(description, app: app, ok: ok, cancel: cancel) else {
            return .failed(pinentry.failure ?? .couldNotStart)
        }
        while true {
            let now = Threads.monotonicSeconds()
            if now >= deadline { return .timedOut }
            let input = pinentry.inputDescriptor
            guard input >= 0 else { return .failed(pinentry.failure ?? .exited) }
            // The peer's hang-up only (POLLRDHUP; POLLHUP and POLLERR come unasked): a client that
            // sends more meanwhile does not wake this loop.
            var fds = [pollfd(fd: input, events: Int16(POLLIN), revents: 0), pollfd(fd: hangup, events: Self.pollRDHUP, revents: 0)]
            let millis = Int32(max(1, min(1000, (deadline - now) * 1000)))
            let n = fds.withUnsafeMutableBufferPointer { Glibc.poll($0.baseAddress, hangup >= 0 ? 2 : 1, millis) }
            guard n > 0 else { continue }
            if hangup >= 0, fds[1].revents != 0 { return .hungUp }
            guard fds[0].revents != 0, let allowed = pinentry.confirmationReady() else { continue }
            if let why = pinentry.failure { return .failed(why) }
            return allowed ? .allowed : .refused
        }
    }

    /// Linux's POLLRDHUP (the peer shut its end down), which Glibc's module does not export.
    static let pollRDHUP: Int16 = 0x2000

    /// Shows `text` between tries (a wrong passcode: the question is asked again with it; biometry
    /// out: the dialog is shown again without "touch the sensor"). Bounded by the deadline like every wait.
    public func feedback(_ text: String, kind: AuthFeedbackKind) {
        pinentry.feedback(text, kind: kind)
        if !pinentry.isRunning, let why = pinentry.failure { failure = why }
    }

    /// Tells the person why the request ended without success (the attempt schedule's wait, too many
    /// wrong passcodes) in a one-button message dialog, and waits until it is closed: at most
    /// `seconds`, never past the hard deadline. The pinentry is stopped afterwards.
    @discardableResult
    public func tell(_ text: String, app: String, seconds: Double = 30) -> Bool {
        if hardDeadline == nil { hardDeadline = Threads.monotonicSeconds() + timeoutSeconds }
        pinentry.deadline = hardDeadline
        return pinentry.message(text, app: app, seconds: seconds)
    }

    /// The request ended: the dialog closes and the pinentry is stopped.
    public func end() { pinentry.end() }
}

/// The environment the agent's pinentry gets (only the names of ``Pinentry/passedEnvironment``):
/// the display variables of the ``PromptDisplay`` it is shown on, and nothing else that places the
/// dialog — `DISPLAY` and `WAYLAND_DISPLAY` never come from the agent's environment, the systemd user
/// manager's or a client's, which any process of the user can set. `XAUTHORITY` (a cookie file's
/// path, which cannot move a dialog to another display) comes from the agent's environment, or where
/// the agent has none, from the systemd user manager's (`systemctl --user show-environment`, as
/// `dbus-update-activation-environment --systemd` and GNOME set it). The rest is the agent's own.
public enum PinentryEnvironment {
    /// The variables that say where a dialog appears: only a ``PromptDisplay`` sets them.
    static let displayNames = ["DISPLAY", "WAYLAND_DISPLAY"]
    /// What the systemd user manager may supply where the agent has none of it.
    static let managerNames = ["XAUTHORITY"]

    /// The environment for a dialog on `display`, as `KEY=VALUE` lines: `display`'s variables, the
    /// agent's own (`own`) for the rest of ``Pinentry/passedEnvironment`` but the display names, and
    /// ``managerNames`` from `manager` (the user manager's environment) where `own` lacks them.
    public static func merge(own: [String: String], display: PromptDisplay, manager: [String: String]?) -> [String] {
        var env: [String: String] = [:]
        for name in Pinentry.passedEnvironment where !displayNames.contains(name) {
            let fromManager = managerNames.contains(name) ? manager?[name].flatMap { $0.isEmpty ? nil : $0 } : nil
            if let v = own[name], !v.isEmpty || fromManager == nil { env[name] = v } else if let v = fromManager { env[name] = v }
        }
        env.merge(display.variables) { $1 }
        return env.keys.sorted().map { "\($0)=\(env[$0]!)" }
    }

    /// The pinentry environment for a dialog on `display` now (``merge(own:display:manager:)``): the
    /// user manager is asked only for an X11 display and an agent without `XAUTHORITY`.
    public static func current(on display: PromptDisplay, systemctl: String = "/usr/bin/systemctl") -> [String] {
        let own = ThisProcess.environment(Pinentry.passedEnvironment)
        let needsManager = display.x11 != nil && (own["XAUTHORITY"] ?? "").isEmpty
        return merge(own: own, display: display, manager: needsManager ? userManager(systemctl: systemctl) : nil)
    }

    /// The systemd user manager's environment (`systemctl --user show-environment`), nil if it
    /// cannot be read within `timeoutSeconds` (the program is killed then). Values systemctl quotes
    /// (`$'…'`, for control characters) are left out.
    public static func userManager(systemctl: String = "/usr/bin/systemctl", timeoutSeconds: Double = 3) -> [String: String]? {
        let passed = ThisProcess.environment(["XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS", "HOME", "PATH"]).map { "\($0.key)=\($0.value)" }
        guard case .success(let text) = BoundedProgram.run(systemctl, ["--user", "show-environment"], environment: passed, outputs: [1],
                                                           deadline: Threads.monotonicSeconds() + timeoutSeconds) else { return nil }
        var env: [String: String] = [:]
        for line in text.split(separator: "\n") {
            guard let eq = line.firstIndex(of: "=") else { continue }
            let value = line[line.index(after: eq)...]
            if value.hasPrefix("$'") { continue }
            env[String(line[..<eq])] = String(value)
        }
        return env
    }
}
