import ArgumentParser
import CofferClient
import CofferCrypto
import CofferModel
import Glibc

/// Where a secret comes from: `--secret-stdin` or `--secret-fd N` (never argv or the environment).
struct SecretSource: ParsableArguments {
    @Flag(name: .customLong("secret-stdin"), help: "Read the secret from standard input (one trailing newline is dropped).")
    var stdin = false

    @Option(name: .customLong("secret-fd"), help: "Read the secret from this open file descriptor.")
    var fd: Int32?

    var isGiven: Bool { stdin || fd != nil }

    func validate() throws {
        if stdin && fd != nil { throw ValidationError("use either --secret-stdin or --secret-fd") }
    }

    func read() throws(SecError) -> SecureBytes {
        try SecretInput.read(fd: fd ?? 0, what: "secret")
    }
}

/// Where a passcode comes from: `--passcode-stdin` or `--passcode-fd N`.
struct PasscodeSource: ParsableArguments {
    @Flag(name: .customLong("passcode-stdin"), help: "Read the passcode from standard input.")
    var stdin = false

    @Option(name: .customLong("passcode-fd"), help: "Read the passcode from this open file descriptor.")
    var fd: Int32?

    func validate() throws {
        guard stdin != (fd != nil) else { throw ValidationError("give exactly one of --passcode-stdin or --passcode-fd N") }
    }

    func read() throws(SecError) -> SecureBytes {
        try SecretInput.read(fd: fd ?? 0, what: "passcode")
    }
}
