import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferModel
import CofferProtocol

/// `coffer bio …`: the biometric authenticator (the plugin the agent's `biometry` setting names).
struct Biometry: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bio",
        abstract: "The biometric authenticator: its state, enrolled fingers, and (for the emulator) touches.",
        discussion: """
            Enrolling or removing a finger asks for your passcode (it changes who can open biometric items; \
            biometry-current-set items made before become unusable). `present` touches the biometric emulator's \
            sensor while an evaluation waits; a real reader (fprintd) is touched with a finger.
            """,
        subcommands: [Status.self, Enroll.self, Remove.self, Present.self])

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Which authenticator serves biometry, and its state.")
        @OptionGroup var connect: Connect
        @Flag(help: "Print a JSON object.") var json = false
        func run() throws {
            try reporting { () throws(SecError) in
                let b = try connect.open().bioStatus()
                if json {
                    Output.print("{\"authenticator\":\(b.authenticator.isEmpty ? "null" : Output.json(b.authenticator)),\"available\":\(b.available),"
                                 + "\"enrolled\":\(b.enrolledCount),\"lockedOut\":\(b.lockedOut),\"detail\":\(Output.json(b.detail))}")
                    return
                }
                guard !b.authenticator.isEmpty else {
                    Output.print("biometry: none configured (set biometry = biometric-emulator or a reader's plugin in the agent's configuration)")
                    return
                }
                Output.print("""
                    authenticator: \(Output.escapedText(b.authenticator))\(b.available ? "" : " (not answering)")
                    enrolled: \(b.enrolledCount)
                    locked out: \(b.lockedOut ? "yes (type your passcode once to re-enable biometry)" : "no")
                    """)
                if !b.detail.isEmpty { Output.print(b.detail) }
            }
        }
    }

    struct Enroll: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Enroll a finger (the emulator; asks for your passcode).")
        @OptionGroup var connect: Connect
        @OptionGroup var auth: AuthenticationArguments
        @Argument(help: "The finger's name, e.g. right-thumb.") var name: String
        func run() throws {
            try reporting { () throws(SecError) in
                let c = try connect.open()
                try auth.apply(to: c)
                try c.bio(.enroll, name: name)
            }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Remove an enrolled finger (asks for your passcode).")
        @OptionGroup var connect: Connect
        @OptionGroup var auth: AuthenticationArguments
        @Argument(help: "The finger's name.") var name: String
        func run() throws {
            try reporting { () throws(SecError) in
                let c = try connect.open()
                try auth.apply(to: c)
                try c.bio(.remove, name: name)
            }
        }
    }

    struct Present: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Touch the emulator's sensor with a finger while an evaluation waits.")
        @OptionGroup var connect: Connect
        @Flag(help: "A finger that is not enrolled (a failed match).") var unknown = false
        @Argument(help: "The finger's name.") var name: String?
        func validate() throws {
            guard unknown != (name != nil) else { throw ValidationError("give a finger's name, or --unknown") }
        }
        func run() throws {
            try reporting { () throws(SecError) in
                try connect.open().bio(unknown ? .presentUnknown : .present, name: name ?? "")
            }
        }
    }
}
