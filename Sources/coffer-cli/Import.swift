// `coffer import pass` and `coffer import secret-service`: moving in from a password-store or from the
// Secret Service provider on the session bus (the importers are CofferImport's; this is their wiring).
import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferImport
import CofferModel

struct ImportCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Move in: copy a password-store or another Secret Service provider's items into Coffer.",
        discussion: """
            Existing items are never overwritten: an entry for which an equal item exists is reported as a \
            duplicate and skipped, so running an import twice is harmless. One line per entry on standard \
            output (imported, duplicate, failed with the reason), then the totals. Exit 0 when no entry \
            failed, \(ImportSummary.someFailedExitStatus) when some did (the others are imported).
            """,
        subcommands: [Pass.self])

    struct Pass: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Import a password-store (pass) through your gpg.",
            discussion: """
                Every NAME.gpg under the store (default $PASSWORD_STORE_DIR, else ~/.password-store) is \
                decrypted by `gpg --decrypt --batch` (your gpg-agent asks for the key's passphrase) and becomes \
                a generic password: service 'pass', account NAME, label NAME, the first line the secret, the \
                other lines the item's comment (icmt). Afterwards: coffer get --service pass --account NAME.
                """)
        @OptionGroup var connect: Connect
        @Option(help: "The store's directory (default: $PASSWORD_STORE_DIR, else ~/.password-store).") var store: String?
        @Option(help: "The access group the items go to (default: yours).") var group: String?
        @Flag(name: .customLong("dry-run"), help: "Decrypt and report, store nothing.") var dryRun = false

        func run() throws {
            var status: Int32 = 0
            try reporting { () throws(SecError) in
                let root = try PassImport.storeDirectory(explicit: store)
                let c = try connect.open()
                try authorizeGroup(c, group)
                let summary = try PassImport.run(store: root, group: group, dryRun: dryRun, on: c)
                Output.print(summary.totals)
                status = summary.exitStatus
            }
            if status != 0 { throw ExitCode(status) }
        }
    }
}

/// Asks for `group` up front (a listing of it, through the CLI's authorization when it is another
/// app's group), so that every item of the import goes there on the one authorized connection.
func authorizeGroup(_ c: AgentConnection, _ group: String?) throws(SecError) {
    guard let group else { return }
    do {
        _ = try authorizingIfNeeded(c, group: group) { c throws(SecError) in
            try c.copyMatching(ItemQuery(attributes: ["agrp": .string(group)], limit: .one, returnAttributes: true))
        }
    } catch where error.status == .itemNotFound {}
}
