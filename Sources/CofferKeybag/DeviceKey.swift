public import CofferCrypto
public import CofferModel
import CofferSystem
import Glibc

/// Where the 32-byte device key comes from: the Linux stand-in for the Secure Enclave's UID key.
///
/// The embedded default is ``FileDeviceKey``. A TPM2-sealed key or a privileged helper that never
/// reveals the key can replace it behind this protocol.
public protocol DeviceKeySource: Sendable {
    /// Loads the device key into secure memory, creating it on first use if this source can.
    func loadDeviceKey() throws(SecError) -> SecureBytes
    /// A short description for status output and logs (no key material).
    var description: String { get }
}

/// A device key in a file of exactly 32 random bytes, created once with mode 0600.
///
/// Threat model: anyone who can read this file as the user (or root) holds the device key; it stops
/// an attacker who copies only the keybag and database elsewhere, not one running as the user.
public struct FileDeviceKey: DeviceKeySource {
    /// The key file's path.
    public let path: String
    /// Size of a device key.
    public static let keyBytes = 32

    /// A source reading (or creating) `path`.
    public init(path: String) { self.path = path }

    public var description: String { "file \(path)" }

    public func loadDeviceKey() throws(SecError) -> SecureBytes {
        if !Files.exists(path) { try create() }
        guard let mode = Files.mode(path), mode & 0o077 == 0 else {
            throw SecError(.authFailed, "device key \(path) is readable by other users; refusing to use it (chmod 600)")
        }
        let key = SecureBytes(count: Self.keyBytes)
        do {
            unsafe try key.withUnsafeMutableBytes { b throws(SystemError) in unsafe try Files.readExactly(path, into: b) }
        } catch {
            throw SecError(.decode, "device key \(path) is unreadable or not \(Self.keyBytes) bytes: \(error)")
        }
        return key
    }

    private func create() throws(SecError) {
        let key = SecureBytes.random(count: Self.keyBytes)
        do {
            // false: another process created it first; it is read as usual.
            _ = unsafe try key.withUnsafeBytes { b throws(SystemError) in unsafe try Files.createExclusively(path, bytes: b, mode: 0o600) }
        } catch {
            throw .io("cannot create device key \(path): \(error)")
        }
    }
}
