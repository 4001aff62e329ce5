package import CofferClient
package import CofferCrypto
package import CofferModel
import CofferSystem
import Glibc

/// What every Coffer command-line tool does the same way: report an error as
/// `coffer: errSecName (code): message` (then `coffer: hint: …` when the error says what to do next) with the stable exit status of docs/cli.md's table, and
/// print a secret exactly (a newline after it only on a terminal, so `$(coffer get …)` and pipes get
/// the secret byte for byte).
///
/// Used by `coffer` (the fast path: this module links neither Foundation nor swift-argument-parser,
/// so it keeps `coffer` a small static executable) and by `coffer-cli`.
package enum CLISupport {
    /// The prefix of every message the CLI prints on standard error.
    package static let messagePrefix = "coffer: "

    /// Runs `body`; returns 0, or prints the error as `coffer: errSecName (code): message` on
    /// standard error and returns its exit status (``CofferModel/SecStatus/exitCode``).
    package static func reporting(_ body: () throws(SecError) -> Void) -> Int32 {
        do {
            try body()
            return 0
        } catch {
            report(error)
            return error.status.exitCode
        }
    }

    /// Prints `error` as `coffer: errSecName (code): message` on standard error, and its hint, if it
    /// has one, as `coffer: hint: …` on the next line (the first line's form stays as scripts parse it).
    package static func report(_ error: SecError) {
        let error = explained(error)
        StandardStreams.printError(messagePrefix + error.description)
        if let hint = error.hint { StandardStreams.printError(messagePrefix + "hint: " + hint) }
    }

    /// The agent connection the command talks to (``connected(_:)``), kept to the end of the process.
    nonisolated(unsafe) private static var commandConnection: AgentConnection?

    /// Remembers `connection` as the command's own: an errSecInteractionNotAllowed the command
    /// reports is then explained on it (``explained(_:)``). Returns `connection`.
    package static func connected(_ connection: AgentConnection) -> AgentConnection {
        commandConnection = connection
        return connection
    }

    /// `error`, with `coffer unlock` as its hint when it is errSecInteractionNotAllowed and the
    /// keychain is locked. The CLI asks, not the client library (apps and git-credential-coffer make
    /// no request they did not ask for): one STATUS on the command's own connection, whose request
    /// has ended (the agent answers in order, so nothing else is on the way), given 10 s to answer.
    static func explained(_ error: SecError) -> SecError {
        guard error.status == .interactionNotAllowed, error.hint == nil, let c = commandConnection else { return error }
        c.setReplyTimeout(10)
        guard let s = try? c.status(), s.lockState != .unlocked else { return error }
        return error.withHint("the keychain is locked; unlock it with: coffer unlock" + Hints.socketOption(c.path))
    }

    /// Writes `secret` to standard output as is, then a newline only if standard output is a
    /// terminal. Throws errSecIO if standard output does not take every byte.
    package static func printSecret(_ secret: SecureBytes) throws(SecError) {
        let ok = secret.withUnsafeBytes { StandardStreams.write(1, $0) }
        if isatty(1) == 1 { _ = [UInt8(0x0A)].withUnsafeBytes { StandardStreams.write(1, $0) } }
        if !ok { throw .io("cannot write to standard output") }
    }
}
