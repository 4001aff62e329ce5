public import CofferModel

/// Why a sync operation failed or a record was refused. Each case maps to a stable ``SecStatus``
/// (``status``), as every Coffer error does; messages name files and devices, never item contents.
public enum SyncError: Error, Equatable, Sendable, CustomStringConvertible {
    /// A file is not in the format it claims (truncated, wrong magic or version, bad field).
    case malformed(String)
    /// A signature or a seal does not verify, or the writer is not in the circle when it wrote.
    case forged(String)
    /// The remote went back to an earlier state than one this device already saw.
    case rolledBack(String)
    /// This device is not (or no longer) a member of the circle: nothing can be read.
    case notAMember(String)
    /// A caller's argument is unusable (an unknown pairing code, an item key too long).
    case param(String)
    /// The directory or the transport (`git`) failed.
    case transport(String)

    /// The OSStatus-style code.
    public var status: SecStatus {
        switch self {
        case .malformed: .decode
        case .forged: .authFailed
        case .rolledBack: .decode
        case .notAMember: .notAvailable
        case .param: .param
        case .transport: .io
        }
    }

    public var message: String {
        switch self {
        case .malformed(let m), .forged(let m), .rolledBack(let m), .notAMember(let m), .param(let m), .transport(let m): m
        }
    }

    /// `errSecName (code): message`, as the CLI prints errors.
    public var description: String { "\(status.name) (\(status.rawValue)): \(message)" }

    /// As a keychain error.
    public var secError: SecError { SecError(status, message) }
}
