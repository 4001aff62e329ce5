#if os(Linux)
// The process's way to the agent: one persistent connection, shared by every Security call and used by one
// call at a time. Each LAContext has a session of its own (its evaluation and options live on its connection).
package import CofferClient
package import CofferCrypto
package import CofferModel
import CofferSystem
import Glibc

/// A connection to the agent opened on first use, used under a lock (so from any thread), reopened once
/// when the agent went away (it restarted). The options an LAContext or a call asks for are sent as
/// AUTH_OPTIONS only when they differ from what the connection has: a plain call costs one round trip.
package final class AgentSession: @unchecked Sendable {
    // @unchecked Sendable: every mutable field is guarded by `mutex`.
    private let mutex = PThreadMutex()
    private var connection: AgentConnection? {
        didSet { liveMutex.withLock { live = connection } }
    }
    /// The connection as ``invalidate()`` sees it while a call holds `mutex`, and whether the session was
    /// invalidated; guarded by `liveMutex` (never held while waiting for the agent).
    private let liveMutex = PThreadMutex()
    private var live: AgentConnection?
    private var invalidated = false
    /// The options the connection was last given (nil: none sent, the agent's defaults).
    private var applied: OptionsKey?
    /// Bumped when a credential changes, so that options with a new credential are sent again.
    private var credentialGeneration = 0
    private var passcode: SecureBytes?
    private var applicationPassword: SecureBytes?

    /// The session every call without an LAContext uses.
    package static let shared = AgentSession()

    /// A session whose evaluations are reused (an LAContext's): a new operation prompt alone is not sent, since
    /// any AUTH_OPTIONS ends the agent's reuse window; the prompt in force is the one sent last.
    private let keepsReuse: Bool

    package init(keepsReuse: Bool = false) { self.keepsReuse = keepsReuse }

    /// The socket the sessions use (tests point them at their own agent); nil: the default
    /// (`$COFFER_SOCKET`, else `$XDG_RUNTIME_DIR/coffer/agent.sock`). Changing it closes the shared connection.
    package static var socket: String? {
        get { socketMutex.withLock { socketOverride } }
        set {
            socketMutex.withLock { socketOverride = newValue }
            shared.disconnect()
        }
    }
    private static let socketMutex = PThreadMutex()
    nonisolated(unsafe) private static var socketOverride: String?

    /// The pinentry new connections ask the person through (tests name a scripted one); nil: `$COFFER_PINENTRY`,
    /// else the terminal.
    package static var pinentry: String? {
        get { socketMutex.withLock { pinentryOverride } }
        set { socketMutex.withLock { pinentryOverride = newValue } }
    }
    nonisolated(unsafe) private static var pinentryOverride: String?

    /// The options a call runs with: what the agent must not do (ask) and what to show, plus, for an
    /// LAContext's session, its reuse duration and credentials.
    package struct Options: Equatable, Sendable {
        package var noUserInterface = false
        package var operationPrompt = ""
        package var reuseSeconds: UInt32 = 0
        /// An evaluation covers the session's later calls until it closes (an LAContext's, until `invalidate()`).
        package var keepsForConnection = false
        package init(noUserInterface: Bool = false, operationPrompt: String = "", reuseSeconds: UInt32 = 0, keepsForConnection: Bool = false) {
            self.noUserInterface = noUserInterface
            self.operationPrompt = operationPrompt
            self.reuseSeconds = reuseSeconds
            self.keepsForConnection = keepsForConnection
        }
    }

    private struct OptionsKey: Equatable {
        let options: Options
        let credentials: Int
    }

    /// Sets (or clears) the passcode or application password later requests of this session use
    /// (LAContext.setCredential); kept in secure memory, sent with the next request's options.
    package func setCredential(passcode: SecureBytes?, applicationPassword: SecureBytes?) {
        mutex.withLock {
            self.passcode = passcode
            self.applicationPassword = applicationPassword
            credentialGeneration += 1
        }
    }

    /// Closes the connection (LAContext.invalidate, a new socket): the agent forgets its options and reuse.
    package func disconnect() {
        mutex.withLock {
            connection = nil
            applied = nil
        }
    }

    /// Ends the session for good (LAContext.invalidate): a call waiting on its connection (an evaluation
    /// waiting for the person) is cut off at once, the agent sees the connection end and forgets what it
    /// held for it, and every later call fails with errSecAuthFailed without connecting.
    package func invalidate() {
        let c = liveMutex.withLock { () -> AgentConnection? in
            invalidated = true
            return live
        }
        c?.cancel()
    }

    /// True once ``invalidate()`` ran.
    package var isInvalidated: Bool { liveMutex.withLock { invalidated } }

    private static let invalidatedFailure = SecFailure(errSecAuthFailed, "the LAContext was invalidated")

    /// Runs `body` on the connection with `options` in force. A connection the agent hung up is reopened
    /// first; a request that fails because the connection broke under it is retried once on a new
    /// connection only when `retry` (a search: running it twice changes nothing). An invalidated session
    /// runs nothing: errSecAuthFailed.
    package func run<T>(options: Options = Options(), retry: Bool = true,
                        _ body: (AgentConnection) throws(AgentError) -> T) throws(SecFailure) -> T {
        try mutex.withLock { () throws(SecFailure) -> T in
            guard !isInvalidated else {
                connection = nil
                throw Self.invalidatedFailure
            }
            do throws(SecError) {
                return try attempt(options, retry: retry, body)
            } catch let e where retry && e.brokeConnection && !isInvalidated {
                connection = nil
                applied = nil
                do throws(SecError) { return try attempt(options, retry: false, body) } catch { throw SecFailure(error) }
            } catch {
                if error.brokeConnection || isInvalidated { connection = nil; applied = nil }
                if isInvalidated { throw Self.invalidatedFailure }
                throw SecFailure(error)
            }
        }
    }

    /// One try on the live connection. A request that may be retried goes out without first asking the kernel
    /// whether the agent hung up (one poll less per call): if it did, the request fails and is retried.
    private func attempt<T>(_ options: Options, retry: Bool, _ body: (AgentConnection) throws(SecError) -> T) throws(SecError) -> T {
        let c = try open(checkingHangUp: !retry)
        var options = options
        if keepsReuse, let applied { options.operationPrompt = applied.options.operationPrompt }
        let key = OptionsKey(options: options, credentials: credentialGeneration)
        // A fresh connection has the agent's defaults: nothing to send for default options.
        if applied != key && !(applied == nil && options == Options() && passcode == nil && applicationPassword == nil) {
            do {
                try c.setAuthenticationOptions(AuthenticationOptions(
                    noUserInterface: options.noUserInterface, operationPrompt: options.operationPrompt, passcode: passcode,
                    reuseSeconds: options.reuseSeconds, applicationPassword: applicationPassword, keepsForConnection: options.keepsForConnection))
            } catch where options.keepsForConnection && error.status == .param {
                // An agent from before the keep-for-the-connection flag: its longest window instead.
                try c.setAuthenticationOptions(AuthenticationOptions(
                    noUserInterface: options.noUserInterface, operationPrompt: options.operationPrompt, passcode: passcode,
                    reuseSeconds: AuthenticationOptions.maximumReuseSeconds, applicationPassword: applicationPassword))
            }
            applied = key
        } else if applied == nil {
            applied = key
        }
        return try body(c)
    }

    /// The live connection, or a new one. A socket nobody answers on is errSecNotAvailable, with a line on
    /// stderr saying how to start the agent.
    private func open(checkingHangUp: Bool) throws(SecError) -> AgentConnection {
        if let c = connection {
            if !checkingHangUp || !c.isHungUp { return c }
            connection = nil
            applied = nil
        }
        let path = AgentConnection.socketPath(explicit: Self.socket)
        do throws(SecError) {
            let c = try AgentConnection(path: path, clientName: Self.clientName)
            // A program using Apple's API is usually an app: the pinentry it names (a dialog) first, else its terminal.
            c.authenticationDelegate = Self.pinentry.map { PinentryAuthentication(program: $0) }
                ?? PinentryAuthentication.fromEnvironment() ?? PinentryAuthentication.standard()
            connection = c
            // An invalidate() that ran while this connection was being made saw no live connection to cut
            // off: the connection is published first (`live`), then the flag is read, so one of the two
            // always sees the other.
            if isInvalidated {
                c.cancel()
                connection = nil
                throw SecError(.authFailed, "the LAContext was invalidated")
            }
            return c
        } catch {
            guard error.status == .io else { throw error }
            Self.logUnreachable(error)
            throw SecError(.notAvailable, error.message).withHint(error.hint ?? "start the agent with: cofferd")
        }
    }

    /// One line on stderr for a program that finds no agent (Apple's keychain is always there; this one
    /// must be started), at most once a second.
    private static func logUnreachable(_ error: SecError) {
        let now = time(nil)
        let log = logMutex.withLock { () -> Bool in
            defer { lastLog = now }
            return now != lastLog
        }
        guard log else { return }
        let line = "Security (Coffer): no keychain agent: \(error.message); \(error.hint ?? "start the agent with: cofferd")\n"
        var bytes = Array(line.utf8)
        _ = bytes.withUnsafeMutableBytes { write(2, $0.baseAddress, $0.count) }
    }
    private static let logMutex = PThreadMutex()
    nonisolated(unsafe) private static var lastLog = 0

    /// The name HELLO gives the agent (its log and audit use the identity the agent establishes itself).
    private static let clientName = "Security"
}

/// The agent's errors (Apple's OSStatus numbers and a message).
package typealias AgentError = SecError

extension SecError {
    /// True if the connection cannot be used after this error (the agent closed it, or the socket failed).
    var brokeConnection: Bool {
        status == .io && (message.contains("closed the connection") || message.contains("closed the connection mid-reply"))
    }
}
#endif
