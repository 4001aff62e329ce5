public import CofferCrypto

/// Writes SSH wire primitives (RFC 4251 §5). Writers that carry secrets reserve their final size
/// first, so the array never reallocates and leaves no unwiped copy behind; the owner wipes it.
public struct SSHWireWriter: Sendable {
    /// The bytes written so far.
    public private(set) var bytes: [UInt8] = []

    /// An empty writer with room for `capacity` bytes.
    public init(capacity: Int = 0) { bytes.reserveCapacity(capacity) }

    /// One byte.
    public mutating func writeByte(_ b: UInt8) { bytes.append(b) }

    /// A `boolean` (0 or 1).
    public mutating func writeBool(_ b: Bool) { bytes.append(b ? 1 : 0) }

    /// A big-endian `uint32`.
    public mutating func writeUInt32(_ v: UInt32) {
        bytes.append(contentsOf: [UInt8(v >> 24), UInt8(v >> 16 & 0xff), UInt8(v >> 8 & 0xff), UInt8(v & 0xff)])
    }

    /// Raw bytes with no length.
    public mutating func writeRaw(_ b: [UInt8]) { bytes.append(contentsOf: b) }

    /// A `string` of bytes.
    public mutating func writeString(_ b: [UInt8]) {
        writeUInt32(UInt32(b.count))
        bytes.append(contentsOf: b)
    }

    /// A `string` of UTF-8 text.
    public mutating func writeText(_ s: String) { writeString(Array(s.utf8)) }

    /// A `string` whose bytes are secret.
    public mutating func writeSecretString(_ s: SecureBytes) {
        writeUInt32(UInt32(s.count))
        unsafe s.withUnsafeBytes { unsafe bytes.append(contentsOf: $0) }
    }

    /// A non-negative `mpint` from a big-endian magnitude (leading zeros allowed in the input):
    /// minimal, with a 0x00 prefix when the high bit is set (RFC 4251 §5).
    public mutating func writePositiveMPInt(_ magnitude: [UInt8]) {
        unsafe magnitude.withUnsafeBytes { unsafe writeMPInt($0) }
    }

    /// ``writePositiveMPInt(_:)`` from guarded memory.
    public mutating func writeSecretMPInt(_ magnitude: SecureBytes) {
        unsafe magnitude.withUnsafeBytes { unsafe writeMPInt($0) }
    }

    private mutating func writeMPInt(_ m: UnsafeRawBufferPointer) {
        let start = unsafe m.firstIndex { $0 != 0 } ?? m.count
        let n = m.count - start
        let pad = unsafe n > 0 && m[start] & 0x80 != 0
        writeUInt32(UInt32(n + (pad ? 1 : 0)))
        if pad { bytes.append(0) }
        unsafe bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: m[start...]))
    }

    /// The encoded size of a non-negative mpint of `magnitude` (for reserving capacity).
    static func mpintSize(_ magnitudeCount: Int) -> Int { 4 + magnitudeCount + 1 }
}

/// Strips leading zero bytes from a big-endian magnitude.
func minimalMagnitude(_ m: [UInt8]) -> [UInt8] { Array(m.drop { $0 == 0 }) }
