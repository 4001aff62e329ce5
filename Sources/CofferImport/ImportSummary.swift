public import CofferClient
public import CofferModel
import CofferSystem

/// What an import did, entry by entry: `coffer import pass` and `coffer import secret-service` print
/// one line per entry as it happens (``ImportSummary/record(_:_:)``) and the counts at the end.
/// Entries are named by their place in the source (a password-store path, a provider's item path and
/// label), never by a secret.
public struct ImportSummary: Sendable {
    /// What became of one entry.
    public enum Outcome: Sendable, Equatable {
        /// Stored as a new Coffer item (or, with `--dry-run`, would be).
        case imported
        /// An equal item already exists; nothing was changed.
        case duplicate
        /// Not imported, for this reason (no secret in it).
        case failed(String)
    }

    /// Names of the entries imported, in order.
    public private(set) var imported: [String] = []
    /// Names of the entries skipped because an equal item exists.
    public private(set) var duplicates: [String] = []
    /// Names of the entries that failed, with the reason.
    public private(set) var failed: [(name: String, reason: String)] = []
    /// True when nothing is stored (`--dry-run`).
    public let dryRun: Bool

    public init(dryRun: Bool) { self.dryRun = dryRun }

    /// Records the outcome of entry `name` and prints its line on standard output:
    /// `imported NAME` (`would import NAME` in a dry run), `duplicate NAME`, or `failed NAME: REASON`
    /// (control characters escaped).
    public mutating func record(_ name: String, _ outcome: Outcome) {
        let shown = TerminalSafeText.escaped(name)
        switch outcome {
        case .imported:
            imported.append(name)
            StandardStreams.print((dryRun ? "would import " : "imported ") + shown)
        case .duplicate:
            duplicates.append(name)
            StandardStreams.print("duplicate " + shown + " (an equal item exists; left as it is)")
        case .failed(let reason):
            failed.append((name, reason))
            StandardStreams.print("failed " + shown + ": " + TerminalSafeText.escaped(reason))
        }
    }

    /// The closing line: `N imported, N skipped as duplicates, N failed` (`would be imported` in a dry run).
    public var totals: String {
        "\(imported.count) \(dryRun ? "would be imported" : "imported"), \(duplicates.count) skipped as duplicates, \(failed.count) failed"
    }

    /// The exit status docs/cli.md's table gives an import that ran to its end: 0 when nothing
    /// failed, ``ImportSummary/someFailedExitStatus`` otherwise.
    public var exitStatus: Int32 { failed.isEmpty ? 0 : Self.someFailedExitStatus }

    /// Exit status of an import in which at least one entry failed (the others were imported or
    /// skipped; each failure is listed). Not an OSStatus: the entries' reasons differ.
    public static let someFailedExitStatus: Int32 = 15
}

/// What both importers check before reading anything from their source.
public enum ImportTarget {
    /// Throws errSecInteractionNotAllowed unless the keybag is unlocked: imported items are
    /// *WhenUnlocked*, and a locked keychain would only turn every entry into a failure after its
    /// source had been read (gpg's passphrase asked for nothing, a provider's prompt shown for nothing).
    public static func requireUnlocked(_ connection: AgentConnection) throws(SecError) {
        guard try connection.status().lockState == .unlocked else {
            throw .interactionNotAllowed("the keychain is locked: nothing was imported")
        }
    }
}
