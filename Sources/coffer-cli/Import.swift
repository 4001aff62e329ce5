// `coffer import pass` and `coffer import secret-service`: moving in from a password-store or from the
// Secret Service provider on the session bus (the importers are CofferImport's; this is their wiring).
import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferImport
import CofferModel
import CofferSystem
import Glibc

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
        subcommands: [Pass.self, SecretService.self])

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

extension ImportCommand {
    struct SecretService: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "secret-service",
            abstract: "Import every item of the Secret Service provider on the session bus (gnome-keyring, KeePassXC, KWallet).",
            discussion: """
                Reads the provider that owns org.freedesktop.secrets now, as a client (a DH-encrypted session; a                 locked collection is unlocked through the provider's own prompt, or reported). Each item becomes                 the Secret Service item Coffer's front end serves: its label, its attributes (as general                 attributes, so coffer find --attr NAME=VALUE finds it), its content type and its collection.                 An item with the same collection, label and attributes is a duplicate. Refused when the provider                 is coffer-secret-service itself. Items go to the importer's own group, `unsigned` (the one                 libsecret apps see), unless --group says otherwise.
                """)
        @OptionGroup var connect: Connect
        @Option(help: "Only this collection of the provider (its name, as in its object path, or its label).") var collection: String?
        @Option(help: "The access group the items go to (default: unsigned, the group libsecret apps see).") var group: String?
        @Flag(name: .customLong("dry-run"), help: "Read and report, store nothing.") var dryRun = false

        /// The importer executable, beside this one or in ../libexec/coffer/ (as coffer finds coffer-cli).
        static let helper = "coffer-secret-service-import"

        func run() throws {
            try reporting { () throws(SecError) in
                guard let exe = ThisProcess.executablePath(), let slash = exe.lastIndex(of: "/") else {
                    throw SecError(.internalComponent, "cannot find this program's directory")
                }
                let dir = String(exe[..<slash])
                let candidates: [String] = [dir + "/" + Self.helper, dir + "/../libexec/coffer/" + Self.helper]
                guard let path = candidates.first(where: { access($0, X_OK) == 0 }) else {
                    throw SecError(.internalComponent, "\(Self.helper) is not installed beside coffer-cli")
                }
                var args: [String] = []
                if let socket = connect.socket { args += ["--socket", socket] }
                if let collection { args += ["--collection", collection] }
                if let group { args += ["--group", group] }
                if dryRun { args.append("--dry-run") }
                let failure = ThisProcess.exec(path, arguments: [Self.helper] + args)
                throw SecError(.internalComponent, "cannot run \(path): \(failure)")
            }
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
