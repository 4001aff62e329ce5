import ArgumentParser
import CofferCLISupport
import CofferClient
import CofferCrypto
import CofferModel

/// `coffer escrow create|unlock|revoke`: the escrow keybag, for unattended unlocks.
struct Escrow: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "An escrow record: unlock this keychain without the passcode (a headless server after a reboot).",
        discussion: """
            'create' (asks for your passcode) prints a secret once: whoever has it and this machine's device key \
            can unlock the keychain. Keep it where the unattended unlock runs, or with an administrator. A passcode \
            change makes the record stale; 'revoke' deletes it and rotates the keys, so a copy opens nothing.
            """,
        subcommands: [Create.self, Unlock.self, Revoke.self])

    struct Create: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create an escrow record; prints its secret (64 hex digits) once.")
        @OptionGroup var connect: Connect
        @OptionGroup var auth: AuthenticationArguments
        func run() throws {
            try reporting { () throws(SecError) in
                let c = try connect.open()
                try auth.apply(to: c)
                let secret = try c.createEscrow()
                // Hex straight into secure memory: the secret is never in an ordinary string.
                let digits = Array("0123456789abcdef".utf8)
                let hex = SecureBytes(count: 2 * secret.count)
                hex.withUnsafeMutableBytes { h in
                    secret.withUnsafeBytes { b in
                        for i in 0..<b.count {
                            h[2 * i] = digits[Int(b[i] >> 4)]
                            h[2 * i + 1] = digits[Int(b[i] & 15)]
                        }
                    }
                }
                try CLISupport.printSecret(hex)
            }
        }
    }

    struct Unlock: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Unlock with the escrow secret (64 hex digits) from stdin or a descriptor (on a terminal: asks).")
        @OptionGroup var connect: Connect
        @OptionGroup var secret: SecretSource
        func validate() throws {
            guard secret.isAvailable else { throw ValidationError("give the secret with --secret-stdin or --secret-fd N (or run it on a terminal to be asked)") }
        }
        func run() throws {
            try reporting { () throws(SecError) in
                let text = try secret.read(prompt: "Escrow secret (64 hex digits): ")
                let raw: SecureBytes? = text.withUnsafeBytes { t in
                    guard t.count == 64 else { return nil }
                    let out = SecureBytes(count: 32)
                    var ok = true
                    out.withUnsafeMutableBytes { o in
                        for i in 0..<32 {
                            guard let hi = Self.nibble(t[2 * i]), let lo = Self.nibble(t[2 * i + 1]) else { ok = false; return }
                            o[i] = hi << 4 | lo
                        }
                    }
                    return ok ? out : nil
                }
                guard let raw else { throw .param("the escrow secret is 64 hex digits") }
                try connect.open().unlock(escrowSecret: raw)
            }
        }
        static func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
            default: nil
            }
        }
    }

    struct Revoke: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete the escrow record and rotate the keys (reads your passcode).")
        @OptionGroup var connect: Connect
        @OptionGroup var passcode: PasscodeSource
        func run() throws {
            try reporting { () throws(SecError) in try connect.open().revokeEscrow(passcode: try passcode.read()) }
        }
    }
}
