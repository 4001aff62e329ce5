import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferModel
import Foundation

/// `coffer backup create|restore`: encrypted backups written and read by the agent.
struct Backup: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Encrypted backups (asks for your passcode; the backup password comes from a descriptor, or is asked on a terminal).",
        discussion: """
            A backup holds every item but when-passcode-set items and items with an access control, under keys \
            protected by the backup password. ThisDeviceOnly items restore only on this machine. A restore keeps \
            items already present (same primary key) and skips the backup's copy; --dry-run says what it would do.
            """,
        subcommands: [Create.self, Restore.self])

    /// The absolute path the agent is to use for `path` (relative to this command's directory).
    static func absolute(_ path: String) -> String {
        path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
    }

    struct Create: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Write a backup.")
        @OptionGroup var connect: Connect
        @OptionGroup var auth: AuthenticationArguments
        @Option(help: "The backup file to write (0600).") var out: String
        @OptionGroup var password: PasswordSource
        func run() throws {
            try reporting { () throws(SecError) in
                let password = try password.read(confirm: true)
                let c = try connect.open()
                try auth.apply(to: c)
                let n = try c.createBackup(path: Backup.absolute(out), password: password)
                Output.printError("coffer: backed up \(n) item\(n == 1 ? "" : "s")")
            }
        }
    }

    struct Restore: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Merge a backup into the keychain.")
        @OptionGroup var connect: Connect
        @OptionGroup var auth: AuthenticationArguments
        @Argument(help: "The backup file.") var file: String
        @OptionGroup var password: PasswordSource
        @Flag(name: .customLong("dry-run"), help: "Only say what would change.") var dryRun = false
        func run() throws {
            try reporting { () throws(SecError) in
                let password = try password.read(confirm: false)
                let c = try connect.open()
                try auth.apply(to: c)
                let r = try c.restoreBackup(path: Backup.absolute(file), password: password, dryRun: dryRun)
                Output.print("\(dryRun ? "would add" : "added"): \(r.added)\nkept (already present): \(r.duplicates)\nskipped (another device's): \(r.otherDevice)")
            }
        }
    }
}
