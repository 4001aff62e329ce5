import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferCrypto
import CofferModel
import CofferProtocol

/// `coffer whoami`: the identity the agent gives this process (the CLI itself: its manifest, or why
/// it has none) and the access groups its requests use.
struct WhoAmI: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "whoami",
        abstract: "Show the identity the agent gives this command and the access groups it may use.")
    @OptionGroup var connect: Connect
    @Flag(help: "Print a JSON object.") var json = false

    func run() throws {
        try reporting { () throws(SecError) in
            let w = try connect.open().whoami()
            let how: String
            switch w.kind {
            case .signedManifest: how = "signed manifest"
            case .flatpak: how = "flatpak sandbox"
            case .unsigned: how = "unsigned"
            }
            if json {
                Output.print("{\"kind\":\(Output.json(how)),\"app\":\(w.appID.isEmpty ? "null" : Output.json(w.appID)),"
                             + "\"pid\":\(w.pid),\"executable\":\(Output.json(w.executable)),\"note\":\(Output.json(w.note)),"
                             + "\"accessGroups\":[\(w.accessGroups.map(Output.json).joined(separator: ","))],"
                             + "\"mayAuthorize\":\(w.mayAuthorize)}")
                return
            }
            var lines = ["identity: \(how)" + (w.appID.isEmpty ? "" : " (app \(Output.escapedText(w.appID)))"),
                         "pid: \(w.pid)",
                         "executable: \(w.executable.isEmpty ? "-" : Output.escapedText(w.executable))"]
            if !w.note.isEmpty { lines.append("note: \(Output.escapedText(w.note))") }
            if w.accessGroups.isEmpty {
                lines.append("access groups: none (every item request is refused)")
            } else {
                lines.append("access groups: " + w.accessGroups.enumerated().map { i, g in
                    Output.escapedText(g) + (i == 0 ? " (default)" : "")
                }.joined(separator: ", "))
            }
            lines.append("other groups: " + (w.mayAuthorize ? "after you authenticate, on the terminal" : "never"))
            Output.print(lines.joined(separator: "\n"))
        }
    }
}

/// Runs `body` on `connection`; if the agent refuses it because `group` is not one of this app's
/// groups, and this app may ask (the shell helper), asks the user for the passcode on the terminal,
/// sends AUTHORIZE, and runs `body` once more. Without a terminal the refusal stands: a script cannot
/// reach another app's items through the CLI.
func authorizingIfNeeded<T>(_ connection: AgentConnection, group: String?,
                            _ body: (AgentConnection) throws(SecError) -> T) throws(SecError) -> T {
    do {
        return try body(connection)
    } catch where error.status == .missingEntitlement {
        let refusal = error
        guard let group, let me = try? connection.whoami(), !me.accessGroups.contains(group) else { throw refusal }
        let shown = Output.escapedText(group)
        guard me.mayAuthorize else {
            throw refusal.withHint("'\(shown)' is another app's group, which this caller may never be authorized for; "
                                   + "only an app whose signed manifest lists it can use it (coffer whoami, coffer manifest list)")
        }
        let passcode: SecureBytes
        do {
            passcode = try SecretInput.readFromTerminal(
                prompt: "coffer: access group '\(shown)' belongs to another app; "
                    + "type your passcode to use it for this command: ")
        } catch where error.status == .interactionNotAllowed {
            // No terminal: the refusal stands (a script cannot reach another app's items through the CLI).
            throw SecError(.missingEntitlement, refusal.message + "; another app's group needs your passcode, typed on a terminal, and there is none")
                .withHint("run the same command on a terminal: coffer asks for your passcode there and authorizes '\(shown)' for that one command")
        }
        try connection.authorize(accessGroup: group, passcode: passcode)
        return try body(connection)
    }
}
