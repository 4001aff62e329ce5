public import CofferCrypto

/// Why bytes are not a well-formed SSH agent message, key blob, signature blob or stored key.
/// Every decoder in this module throws only this; none traps on any input.
public enum SSHAgentWireError: Error, Equatable, Sendable {
    /// The input ended inside a field.
    case truncated
    /// Bytes were left over after the last field (how many).
    case trailingBytes(Int)
    /// A length prefix above ``SSHAgentFraming/maximumBodyBytes`` (the length read).
    case oversize(Int)
    /// A frame whose body is empty (no message type).
    case emptyMessage
    /// An mpint that is not minimal two's complement (RFC 4251 §5).
    case nonMinimalMPInt
    /// A negative mpint where a non-negative number is required.
    case negativeMPInt
    /// A key or signature algorithm this codec does not know (the name, lossily decoded).
    case unknownKeyType(String)
    /// A key, point, scalar or signature of the wrong size for its type.
    case badLength
    /// An ECDSA curve name that does not match the key type, or a point not in uncompressed form.
    case badCurve
    /// An ed25519 private key whose second half is not its public key.
    case inconsistentKey
    /// A boolean byte other than 0 or 1.
    case badBoolean(UInt8)
    /// A text field (comment, name, user, host) that is not valid UTF-8.
    case badUTF8
    /// A key constraint type this codec does not know.
    case unknownConstraint(UInt8)
    /// A constraint extension whose name this codec does not know (its data cannot be delimited).
    case unknownConstraintExtension(String)
    /// A constraint given twice in one request.
    case duplicateConstraint
    /// A destination constraint that breaks PROTOCOL.agent's consistency rules, or a reserved field that is not empty.
    case badDestinationConstraint
    /// A reply type this codec does not know.
    case unknownReply(UInt8)
    /// A stored key whose format version is not 1 (the version read).
    case unsupportedStoredVersion(UInt8)
    /// An OpenSSH certificate whose type is neither user (1) nor host (2), with more than 256
    /// principals, a principal or key id holding a NUL, or a malformed options section.
    case badCertificate
    /// A FIDO key whose application string is empty or holds a NUL (OpenSSH reads it as a C string).
    case badApplication
}

/// Reads SSH wire primitives (RFC 4251 §5) from a byte array, bounds-checked: every read throws
/// ``SSHAgentWireError/truncated`` rather than trapping.
public struct SSHWireReader: Sendable {
    private let bytes: [UInt8]
    private var offset: Int

    /// A reader over `bytes`, from the start.
    public init(_ bytes: [UInt8]) { self.bytes = bytes; offset = 0 }

    /// Bytes not read yet.
    public var remaining: Int { bytes.count - offset }

    /// Throws ``SSHAgentWireError/trailingBytes(_:)`` unless everything was read.
    public func finish() throws(SSHAgentWireError) {
        if remaining != 0 { throw .trailingBytes(remaining) }
    }

    /// One byte.
    public mutating func readByte() throws(SSHAgentWireError) -> UInt8 {
        guard remaining >= 1 else { throw .truncated }
        defer { offset += 1 }
        return bytes[offset]
    }

    /// A `boolean`: 0 or 1, nothing else.
    public mutating func readBool() throws(SSHAgentWireError) -> Bool {
        let b = try readByte()
        guard b <= 1 else { throw .badBoolean(b) }
        return b == 1
    }

    /// A big-endian `uint32`.
    public mutating func readUInt32() throws(SSHAgentWireError) -> UInt32 {
        guard remaining >= 4 else { throw .truncated }
        defer { offset += 4 }
        return UInt32(bytes[offset]) << 24 | UInt32(bytes[offset + 1]) << 16 | UInt32(bytes[offset + 2]) << 8 | UInt32(bytes[offset + 3])
    }

    /// `count` raw bytes.
    public mutating func readBytes(_ count: Int) throws(SSHAgentWireError) -> [UInt8] {
        guard count >= 0, remaining >= count else { throw .truncated }
        defer { offset += count }
        return Array(bytes[offset..<offset + count])
    }

    /// A big-endian `uint64`.
    public mutating func readUInt64() throws(SSHAgentWireError) -> UInt64 {
        let high = try readUInt32()
        return UInt64(high) << 32 | UInt64(try readUInt32())
    }

    /// The length of a `string` and the offset of its bytes, checked against what is left.
    private mutating func stringRange() throws(SSHAgentWireError) -> Range<Int> {
        let n = Int(try readUInt32())
        guard remaining >= n else { throw .truncated }
        defer { offset += n }
        return offset..<offset + n
    }

    /// A `string` as bytes.
    public mutating func readString() throws(SSHAgentWireError) -> [UInt8] {
        Array(bytes[try stringRange()])
    }

    /// A `string` that must be UTF-8 text.
    public mutating func readText() throws(SSHAgentWireError) -> String {
        let raw = try readString()
        guard let s = String(validating: raw, as: UTF8.self) else { throw .badUTF8 }
        return s
    }

    /// A `string` copied straight into guarded memory (a passphrase, a PIN, a private key part).
    public mutating func readSecretString() throws(SSHAgentWireError) -> SecureBytes {
        let r = try stringRange()
        return unsafe bytes.withUnsafeBytes { unsafe SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[r])) }
    }

    /// The magnitude of a non-negative `mpint`, big-endian without leading zeros (empty for 0),
    /// enforcing RFC 4251 §5: minimal encoding, and no negative numbers.
    public mutating func readPositiveMPInt() throws(SSHAgentWireError) -> [UInt8] {
        Array(bytes[try positiveMPIntRange()])
    }

    /// ``readPositiveMPInt()`` into guarded memory (a private scalar or factor).
    public mutating func readSecretMPInt() throws(SSHAgentWireError) -> SecureBytes {
        let r = try positiveMPIntRange()
        return unsafe bytes.withUnsafeBytes { unsafe SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[r])) }
    }

    private mutating func positiveMPIntRange() throws(SSHAgentWireError) -> Range<Int> {
        let r = try stringRange()
        guard let first = r.first else { return r }
        if bytes[first] & 0x80 != 0 { throw .negativeMPInt }
        if bytes[first] == 0 {
            // A leading zero is allowed only to clear the sign bit of the next byte.
            guard r.count > 1, bytes[first + 1] & 0x80 != 0 else { throw .nonMinimalMPInt }
            return first + 1..<r.upperBound
        }
        return r
    }
}
