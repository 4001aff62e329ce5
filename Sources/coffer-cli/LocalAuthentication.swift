import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferModel
import CofferProtocol
import Glibc

/// `coffer la …`: LocalAuthentication's canEvaluatePolicy / evaluatePolicy through the agent.
struct LocalAuthentication: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "la",
        abstract: "LocalAuthentication: can the person be authenticated, and authenticate them.",
        discussion: """
            Policies: biometrics (deviceOwnerAuthenticationWithBiometrics: the sensor only) and device-owner \
            (deviceOwnerAuthentication: the sensor or the passcode). Failures print the LAError name and code and \
            exit with a stable status: 21 authenticationFailed, 22 userCancel, 23 userFallback, 24 systemCancel, \
            25 passcodeNotSet, 26 biometryNotAvailable, 27 biometryNotEnrolled, 28 biometryLockout, 29 notInteractive.
            """,
        subcommands: [CanEvaluate.self, Evaluate.self])

    static func policy(_ text: String) throws -> LAPolicy {
        guard let p = LAPolicy.allCases.first(where: { $0.name == text }) else {
            throw ValidationError("--policy is biometrics or device-owner")
        }
        return p
    }

    /// Prints an LA_RESULT and exits with its status.
    static func finish(_ r: LAResult) throws {
        if let e = r.error {
            Output.printError("coffer: \(e.name) (\(e.rawValue)): \(Output.escapedText(r.message))")
            throw ExitCode(e.exitCode)
        }
        Output.print("ok" + (r.domainState.isEmpty ? "" : " (domain state \(r.domainState.prefix(8).map { String(format2: $0) }.joined()))"))
    }

    struct CanEvaluate: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "can-evaluate", abstract: "Could the policy be evaluated now? (Asks nobody.)")
        @OptionGroup var connect: Connect
        @Option(help: "biometrics or device-owner.") var policy: String
        func validate() throws { _ = try LocalAuthentication.policy(policy) }
        func run() throws {
            var result: LAResult? = nil
            try reporting { () throws(SecError) in result = try connect.open().canEvaluate(try! LocalAuthentication.policy(policy)) }
            if let result { try LocalAuthentication.finish(result) }
        }
    }

    struct Evaluate: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Authenticate the person at this terminal for the policy.")
        @OptionGroup var connect: Connect
        @Option(help: "biometrics or device-owner.") var policy: String
        @Option(help: "Why (shown to the person; required).") var reason: String
        @Flag(name: .customLong("no-auth-ui"), help: "Never ask (fails with notInteractive).") var noAuthUI = false
        func validate() throws {
            _ = try LocalAuthentication.policy(policy)
            guard !reason.isEmpty else { throw ValidationError("--reason must not be empty") }
        }
        func run() throws {
            var result: LAResult? = nil
            try reporting { () throws(SecError) in
                let c = try connect.open()
                if noAuthUI { try c.setAuthenticationOptions(AuthenticationOptions(noUserInterface: true)) }
                result = try c.evaluate(try! LocalAuthentication.policy(policy), reason: reason)
            }
            if let result { try LocalAuthentication.finish(result) }
        }
    }
}

extension String {
    /// Two lowercase hex digits.
    init(format2 byte: UInt8) {
        let digits = Array("0123456789abcdef")
        self = String([digits[Int(byte >> 4)], digits[Int(byte & 15)]])
    }
}
