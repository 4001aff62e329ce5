public import CofferCrypto
public import CofferModel
import CofferSystem
import Glibc

/// Where the 32-byte device key comes from: the Linux stand-in for the Secure Enclave's UID key.
///
/// The embedded default is ``FileDeviceKey``; ``TPMDeviceKey`` seals the key in the machine's TPM 2.0
/// and binds the passcode to the TPM (``bindsPasscode``).
public protocol DeviceKeySource: Sendable {
    /// Loads the device key into secure memory, creating it on first use if this source can.
    func loadDeviceKey() throws(SecError) -> SecureBytes
    /// A short description for status output and logs (no key material).
    var description: String { get }
    /// Where the key lives (for status output and the keybag's format check).
    var kind: DeviceKeyKind { get }
    /// True if the passcode key is also tangled with a counted key in this source (the TPM): new
    /// passcodes get one (``createPasscodeKey(authorization:)``), each unlock uses it (``passcodeHMAC(blob:input:authorization:)``).
    var bindsPasscode: Bool { get }
    /// A new counted key authorized by `authorization`; its blob (kept in the keybag).
    func createPasscodeKey(authorization: SecureBytes) throws(SecError) -> [UInt8]
    /// The counted key's HMAC of `input`; a wrong `authorization` is errSecAuthFailed (and counted).
    func passcodeHMAC(blob: [UInt8], input: [UInt8], authorization: SecureBytes) throws(SecError) -> SecureBytes
    /// Releases what the source keeps open (a TPM connection), e.g. at shutdown.
    func release()
    /// For a source that binds the passcode to a counting TPM: whether the TPM's lockout authorization
    /// is set, so that only its holder can reset the count of wrong passcodes (false: anyone who
    /// reaches the TPM can). nil for any other source, or when the TPM never answered.
    func lockoutAuthorizationSet() -> Bool?
}

/// Where a device key lives.
public enum DeviceKeyKind: String, Sendable {
    /// A file in the state directory (``FileDeviceKey``).
    case file
    /// Sealed by the TPM 2.0 (``TPMDeviceKey``).
    case tpm
}

extension DeviceKeySource {
    public var kind: DeviceKeyKind { .file }
    public var bindsPasscode: Bool { false }
    public func release() {}
    public func lockoutAuthorizationSet() -> Bool? { nil }
    public func createPasscodeKey(authorization: SecureBytes) throws(SecError) -> [UInt8] {
        throw SecError(.unimplemented, "the \(kind.rawValue) device key does not bind a passcode")
    }
    public func passcodeHMAC(blob: [UInt8], input: [UInt8], authorization: SecureBytes) throws(SecError) -> SecureBytes {
        throw SecError(.unimplemented, "the \(kind.rawValue) device key does not bind a passcode")
    }
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
