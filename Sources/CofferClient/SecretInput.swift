public import CofferCrypto
public import CofferModel
import CofferProtocol
import CofferSystem
import Glibc

/// Reading secrets and passcodes from stdin or a descriptor, straight into secure memory: what a
/// command-line client does instead of taking them from argv or the environment.
public enum SecretInput {
    /// Largest secret accepted: the protocol's limit for a secret or passcode field
    /// (``CofferProtocol/WireFormat/maximumSecretBytes``; the frame limit leaves room for attributes).
    public static let maxBytes = WireFormat.maximumSecretBytes

    /// Reads all of `fd` (up to ``maxBytes``) into secure memory, dropping one trailing newline
    /// (`\n` only: every other byte, `\r` included, belongs to the secret).
    public static func read(fd: Int32, what: String) throws(SecError) -> SecureBytes {
        // Room for a secret of the largest size, its trailing newline, and one byte more to tell that
        // the input was longer.
        let buffer = SecureBytes(count: maxBytes + 2)
        let read = buffer.withUnsafeMutableBytes { b in Result { () throws(SystemError) in try Files.readAll(fd: fd, into: b) } }
        guard case .success(let total) = read else { throw .io("cannot read the \(what) from file descriptor \(fd)") }
        let trimmed = buffer.withUnsafeBytes { b -> Int in
            var n = total
            // Exactly one trailing "\n", as documented; a "\r" before it is part of the secret.
            if n > 0 && b[n - 1] == 0x0A { n -= 1 }
            return n
        }
        guard total <= maxBytes + 1, trimmed <= maxBytes else { throw .param("the \(what) is larger than \(maxBytes) bytes") }
        guard trimmed > 0 else { throw .param("the \(what) is empty") }
        return buffer.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<trimmed])) }
    }

    /// Splits a buffer holding two secrets separated by one `\n` (current, new); like a trailing
    /// newline, only `\n` separates: a `\r` belongs to the secret.
    public static func splitTwoLines(_ s: SecureBytes, what: String) throws(SecError) -> (SecureBytes, SecureBytes) {
        let parts: (SecureBytes, SecureBytes)? = s.withUnsafeBytes { b in
            guard let nl = b.firstIndex(of: 0x0A) else { return nil }
            let first = SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[0..<nl]))
            let second = SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[(nl + 1)...]))
            return (first, second)
        }
        guard let parts, parts.0.count > 0, parts.1.count > 0 else {
            throw .param("expected the current and the new \(what) on two lines")
        }
        return parts
    }

    /// True when standard input is a terminal: a person is there, and a command given no
    /// `--…-stdin`/`--…-fd` option asks them (``readFromTerminal(prompt:what:)``) instead of
    /// refusing, as `sudo`, `passwd` and `ssh-add` do.
    public static var personAtTerminal: Bool { isatty(0) == 1 }

    /// Asks twice on the terminal for a new secret (a passcode to set, a secret to store, a backup
    /// password): typed blind, a typo would otherwise be stored unnoticed. errSecParam if the two
    /// differ (nothing is sent anywhere); otherwise as ``readFromTerminal(prompt:what:)``.
    public static func readNewFromTerminal(prompt: String, again: String, what: String) throws(SecError) -> SecureBytes {
        let first = try readFromTerminal(prompt: prompt, what: what)
        let second = try readFromTerminal(prompt: again, what: what)
        defer { second.wipe() }
        guard first.constantTimeEquals(second) else {
            first.wipe()
            throw .param("the two \(what)s you typed differ; nothing was changed")
        }
        return first
    }

    /// Asks for a passcode (or `what`) on the controlling terminal (`/dev/tty`, never stdin, which a
    /// script may feed): writes `prompt`, reads one line with echo off into secure memory, restores
    /// the terminal. Ctrl-D or an empty line cancels (errSecUserCanceled); Ctrl-C restores the
    /// terminal and ends the process by SIGINT (status 130 in the shell), as `sudo` and `passwd` do,
    /// so a script or loop that ran the command stops too.
    /// errSecInteractionNotAllowed if the process has no terminal: nobody is there to authenticate.
    public static func readFromTerminal(prompt: String, what: String = "passcode") throws(SecError) -> SecureBytes {
        guard let tty = try? FileDescriptor.open("/dev/tty", O_RDWR | O_NOCTTY) else {
            throw .interactionNotAllowed("this needs you to authenticate, and there is no terminal to ask on")
        }
        let fd = tty.rawValue
        // Echo off, and back on even if Ctrl-C ends the process at the prompt.
        let saved = silenceEcho(fd)
        defer {
            if let saved {
                restoreEcho(fd, saved)
                show("\n", on: tty)
            }
        }
        show(prompt, on: tty)
        let buffer = SecureBytes(count: maxBytes)
        var n = 0
        let failed: Bool = buffer.withUnsafeMutableBytes { b in
            var byte: UInt8 = 0
            while n < b.count {
                let r = (try? withUnsafeMutableBytes(of: &byte) { try tty.read(into: $0) }) ?? -1
                if r <= 0 { return n == 0 }
                if byte == 0x0A || byte == 0x0D { break }
                b[n] = byte
                n += 1
            }
            byte = 0
            return false
        }
        guard !failed, n > 0 else { throw SecError(.userCanceled, "no \(what) was entered") }
        return buffer.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
    }

    /// Writes `text` to the terminal (best effort: a prompt that cannot be shown does not stop the read).
    private static func show(_ text: String, on tty: borrowing FileDescriptor) {
        var text = text
        _ = text.withUTF8 { try? tty.writeAll(UnsafeRawBufferPointer($0)) }
    }
}
