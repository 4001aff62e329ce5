import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferModel

/// `coffer passcode sync`: follow a login password changed outside Coffer.
struct PasscodeSync: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sync",
        abstract: "Follow a login password changed outside Coffer: reads your previous password once.",
        discussion: """
            When your login password was changed by an administrator, a directory service or a reset, it no \
            longer opens the keybag; logging in (or 'coffer unlock') with it tells the agent, and 'coffer status' \
            says 'out of sync'. This re-wraps the keybag under the new login password, given the previous one. \
            Nothing is lost either way.
            """)
    @OptionGroup var connect: Connect
    @OptionGroup var passcode: PasscodeSource

    func run() throws {
        try reporting { () throws(SecError) in
            let c = try connect.open()
            guard try c.isPasscodeOutOfSync() else {
                throw .notAvailable("the passcode is in sync with your login password (unlock with your login password first if it changed)")
            }
            try c.syncPasscode(oldPasscode: try passcode.read(prompt: "Previous login password: "))
        }
    }
}

/// `coffer passcode remove`.
struct PasscodeRemove: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "remove",
        abstract: "Remove the passcode: reads the current one. WhenPasscodeSet items are deleted for good.",
        discussion: """
            Without a passcode nothing protects the keys: every class is wrapped by the device key alone and the \
            keybag is always unlocked. Items of the when-passcode-set-this-device-only class are deleted (their key \
            is destroyed: they cannot be recovered), and items with an access control cannot be opened until a \
            passcode is set again.
            """)
    @OptionGroup var connect: Connect
    @OptionGroup var passcode: PasscodeSource

    func run() throws {
        try reporting { () throws(SecError) in
            try connect.open().removePasscode(current: try passcode.read(prompt: "Current passcode: "))
        }
    }
}
