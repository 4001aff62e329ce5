import ArgumentParser
import CofferClient
import CofferCrypto
import CofferModel
import Glibc

/// Where a secret comes from: `--secret-stdin` or `--secret-fd N` (never argv or the environment),
/// or, with neither and a terminal on standard input, the person typing it with echo off.
struct SecretSource: ParsableArguments {
    @Flag(name: .customLong("secret-stdin"), help: "Read the secret from standard input (one trailing newline is dropped).")
    var stdin = false

    @Option(name: .customLong("secret-fd"), help: "Read the secret from this open file descriptor.")
    var fd: Int32?

    var isGiven: Bool { stdin || fd != nil }

    /// Given, or asked for on the terminal.
    var isAvailable: Bool { isGiven || SecretInput.personAtTerminal }

    func validate() throws {
        if stdin && fd != nil { throw ValidationError("use either --secret-stdin or --secret-fd") }
    }

    /// The secret from the option, else from the terminal: asked twice when `confirm` (a secret to
    /// store), once otherwise.
    func read(prompt: String = "Secret: ", confirm: Bool = false) throws(SecError) -> SecureBytes {
        if isGiven { return try SecretInput.read(fd: fd ?? 0, what: "secret") }
        if confirm { return try SecretInput.readNewFromTerminal(prompt: prompt, again: "Same secret again: ", what: "secret") }
        return try SecretInput.readFromTerminal(prompt: prompt, what: "secret")
    }
}

/// Where a passcode comes from: `--passcode-stdin` or `--passcode-fd N`, or, with neither and a
/// terminal on standard input, the person typing it with echo off.
struct PasscodeSource: ParsableArguments {
    @Flag(name: .customLong("passcode-stdin"), help: "Read the passcode from standard input (on a terminal, without it: asked with echo off).")
    var stdin = false

    @Option(name: .customLong("passcode-fd"), help: "Read the passcode from this open file descriptor.")
    var fd: Int32?

    var isGiven: Bool { stdin || fd != nil }

    func validate() throws {
        if stdin && fd != nil { throw ValidationError("give exactly one of --passcode-stdin or --passcode-fd N") }
        if !isGiven && !SecretInput.personAtTerminal {
            throw ValidationError("give exactly one of --passcode-stdin or --passcode-fd N (or run it on a terminal to be asked)")
        }
    }

    /// The passcode from the option, else asked once on the terminal.
    func read(prompt: String = "Passcode: ") throws(SecError) -> SecureBytes {
        if isGiven { return try SecretInput.read(fd: fd ?? 0, what: "passcode") }
        return try SecretInput.readFromTerminal(prompt: prompt)
    }

    /// A new passcode: from the option, else asked twice on the terminal (errSecParam if they differ).
    func readNew(prompt: String = "New passcode (your login password): ") throws(SecError) -> SecureBytes {
        if isGiven { return try SecretInput.read(fd: fd ?? 0, what: "passcode") }
        return try SecretInput.readNewFromTerminal(prompt: prompt, again: "Same passcode again: ", what: "passcode")
    }

    /// The current and the new passcode: two lines from the option, else asked on the terminal
    /// (the new one twice).
    func readChange() throws(SecError) -> (current: SecureBytes, new: SecureBytes) {
        if isGiven { return try SecretInput.splitTwoLines(try SecretInput.read(fd: fd ?? 0, what: "passcode"), what: "passcode") }
        let current = try SecretInput.readFromTerminal(prompt: "Current passcode: ")
        return (current, try readNew(prompt: "New passcode (your new login password): "))
    }
}

/// A password given by descriptor (`--password-fd N`), or asked on the terminal without it.
struct PasswordSource: ParsableArguments {
    @Option(name: .customLong("password-fd"), help: "Read the backup password from this descriptor (on a terminal, without it: asked with echo off).")
    var fd: Int32?

    func validate() throws {
        if fd == nil && !SecretInput.personAtTerminal {
            throw ValidationError("give the backup password with --password-fd N (or run it on a terminal to be asked)")
        }
    }

    /// The password from the descriptor, else from the terminal (twice when `confirm`: a new backup).
    func read(confirm: Bool) throws(SecError) -> SecureBytes {
        if let fd { return try SecretInput.read(fd: fd, what: "backup password") }
        if confirm {
            return try SecretInput.readNewFromTerminal(prompt: "Backup password: ", again: "Same backup password again: ", what: "backup password")
        }
        return try SecretInput.readFromTerminal(prompt: "Backup password: ", what: "backup password")
    }
}
