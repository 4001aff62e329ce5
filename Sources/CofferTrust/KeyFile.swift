package import CofferCrypto
package import CofferManifest
package import CofferModel
import CofferSystem
import Glibc

/// The two key files of manifest signing.
///
/// - A **public key file** (`NAME.pub`, what goes into `trusted-keys.d`): text lines; each line is
///   an Ed25519 public key as 64 lowercase hex digits (the form of a manifest's `signed-by` line),
///   or empty, or a comment starting with `#`. At least one key, at most 4096 bytes.
/// - A **secret key file** (written by `coffer manifest keygen`, mode 0600): exactly 65 bytes, the
///   32-byte Ed25519 seed as 64 lowercase hex digits and an LF. It is read straight into locked,
///   wiped memory (``SecureBytes``) and refused if group or others may read or write it.
package enum KeyFile {
    /// Largest public key file.
    package static let maximumBytes = 4096
    /// Size of a secret key file.
    package static let secretFileBytes = 2 * Ed25519.seedBytes + 1

    /// The keys in a public key file, or why it is refused (a line number, never the line).
    package static func parsePublicKeys(_ bytes: [UInt8]) -> Result<[SignerKey], RefusalReason> {
        guard bytes.count <= maximumBytes else { return .failure(RefusalReason("key file larger than \(maximumBytes) bytes")) }
        guard bytes.last == 0x0A else { return .failure(RefusalReason("key file does not end with a newline")) }
        var keys: [SignerKey] = []
        for (i, line) in bytes.dropLast().split(separator: 0x0A, omittingEmptySubsequences: false).enumerated() {
            if line.isEmpty || line.first == 0x23 { continue }
            guard line.count == 64, let k = SignerKey(hex: String(decoding: line, as: UTF8.self)) else {
                return .failure(RefusalReason("line \(i + 1): not an Ed25519 public key (64 lowercase hex digits)"))
            }
            keys.append(k)
        }
        guard !keys.isEmpty else { return .failure(RefusalReason("no key in the file")) }
        return .success(keys)
    }

    /// The text of a public key file for `key`.
    package static func publicKeyText(_ key: SignerKey) -> String { key.description + "\n" }

    /// Creates a new signing key: a random seed written to `path` (mode 0600, `O_EXCL`: an existing
    /// file is never overwritten) and its public key to `path.pub` (mode 0644). Returns the public key.
    /// The seed never leaves locked memory except into the file.
    package static func generate(secretPath: String) throws(SecError) -> SignerKey {
        let seed = SecureBytes.random(count: Ed25519.seedBytes)
        let (pk, sk) = Ed25519.keyPair(seed: seed)
        sk.wipe()
        let text = SecureBytes(count: secretFileBytes)
        let digits = Array("0123456789abcdef".utf8)
        seed.withUnsafeBytes { s in
            text.withUnsafeMutableBytes { t in
                for i in 0..<s.count {
                    t[2 * i] = digits[Int(s[i] >> 4)]
                    t[2 * i + 1] = digits[Int(s[i] & 0x0F)]
                }
                t[secretFileBytes - 1] = 0x0A
            }
        }
        seed.wipe()
        let result = text.withUnsafeBytes { b in
            Result { () throws(SystemError) -> Bool in try Files.createExclusively(secretPath, bytes: b, mode: 0o600) }
        }
        text.wipe()
        let created: Bool
        switch result {
        case .success(let c): created = c
        case .failure(let error): throw .io("cannot write the secret key: \(error)")
        }
        guard created else { throw .param("\(secretPath) already exists; refusing to overwrite a key") }
        let key = SignerKey(pk)!
        let pub = Array(publicKeyText(key).utf8)
        let pubPath = secretPath + TrustConfiguration.keySuffix
        let written = pub.withUnsafeBytes { b in
            Result { () throws(SystemError) -> Bool in try Files.createExclusively(pubPath, bytes: b, mode: 0o644) }
        }
        switch written {
        case .success(true): break
        case .success(false): throw .io("secret key written, but \(pubPath) already exists")
        case .failure(let error): throw .io("secret key written, but not the public key file: \(error)")
        }
        return key
    }

    /// Reads a secret key file: the 64-byte libsodium secret key, in secure memory. Refused
    /// (errSecParam) if it is not exactly the format, not a regular file, a symbolic link, or
    /// readable or writable by group or others (like ssh's "UNPROTECTED PRIVATE KEY FILE").
    package static func readSecretKey(_ path: String) throws(SecError) -> SecureBytes {
        let fd: FileDescriptor
        do throws(SystemError) { fd = try FileDescriptor.open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY) } catch {
            throw .io("cannot open the secret key \(path) (errno \(error.errno))")
        }
        guard let st = try? fd.status(path: path), st.st_mode & S_IFMT == S_IFREG else { throw .param("\(path) is not a regular file") }
        guard st.st_mode & 0o077 == 0 else {
            throw .param("the secret key \(path) has mode \(Files.octal(st.st_mode & 0o7777)): group or others may use it; 'chmod 600' it")
        }
        guard st.st_size == secretFileBytes else { throw .param("\(path) is not a Coffer manifest secret key (wrong size)") }
        let text = SecureBytes(count: secretFileBytes)
        defer { text.wipe() }
        let raw = fd.rawValue
        let got = try? text.withUnsafeMutableBytes { b throws(SystemError) in try Files.readAll(fd: raw, into: b, path: path) }
        guard got == secretFileBytes else { throw .io("cannot read the secret key \(path)") }
        let seed = SecureBytes(count: Ed25519.seedBytes)
        defer { seed.wipe() }
        let ok = text.withUnsafeBytes { t in
            seed.withUnsafeMutableBytes { s in
                guard t[secretFileBytes - 1] == 0x0A else { return false }
                for i in 0..<s.count {
                    guard let hi = nibble(t[2 * i]), let lo = nibble(t[2 * i + 1]) else { return false }
                    s[i] = hi << 4 | lo
                }
                return true
            }
        }
        guard ok else { throw .param("\(path) is not a Coffer manifest secret key (64 lowercase hex digits and a newline)") }
        return Ed25519.keyPair(seed: seed).secretKey
    }

    private static func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x30...0x39: c - 0x30
        case 0x61...0x66: c - 0x61 + 10
        default: nil
        }
    }
}

/// Why a file was refused (for ``RefusedFile``).
package struct RefusalReason: Error, Equatable, Sendable, CustomStringConvertible {
    package let description: String
    package init(_ text: String) { description = text }
}
