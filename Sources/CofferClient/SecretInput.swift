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
        let buffer = SecureBytes(count: maxBytes + 1)
        let read = buffer.withUnsafeMutableBytes { b in Result { () throws(SystemError) in try Files.readAll(fd: fd, into: b) } }
        guard case .success(let total) = read else { throw .io("cannot read the \(what) from file descriptor \(fd)") }
        guard total <= maxBytes else { throw .param("the \(what) is larger than \(maxBytes) bytes") }
        let trimmed = buffer.withUnsafeBytes { b -> Int in
            var n = total
            // Exactly one trailing "\n", as documented; a "\r" before it is part of the secret.
            if n > 0 && b[n - 1] == 0x0A { n -= 1 }
            return n
        }
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
}
