/// Why bytes could not be decoded.
public struct DecodeError: Error, Equatable, Sendable, CustomStringConvertible {
    /// What was wrong, e.g. "truncated string".
    public let reason: String
    /// Makes an error.
    public init(_ reason: String) { self.reason = reason }
    public var description: String { reason }
}

/// Appends big-endian integers and length-prefixed fields to a byte array.
public struct ByteWriter: Sendable {
    /// The bytes written so far.
    public private(set) var bytes: [UInt8] = []

    /// An empty writer.
    public init(capacity: Int = 64) { bytes.reserveCapacity(capacity) }

    public mutating func u8(_ v: UInt8) { bytes.append(v) }
    public mutating func u16(_ v: UInt16) { bytes.append(UInt8(v >> 8)); bytes.append(UInt8(v & 0xff)) }
    public mutating func u32(_ v: UInt32) { for s in stride(from: 24, through: 0, by: -8) { bytes.append(UInt8((v >> UInt32(s)) & 0xff)) } }
    public mutating func u64(_ v: UInt64) { for s in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8((v >> UInt64(s)) & 0xff)) } }
    /// Raw bytes with no length prefix.
    public mutating func raw<C: Collection>(_ b: C) where C.Element == UInt8 { bytes.append(contentsOf: b) }
    /// A u32 length followed by the bytes.
    public mutating func blob<C: Collection>(_ b: C) where C.Element == UInt8 { u32(UInt32(b.count)); bytes.append(contentsOf: b) }
    /// A u16 length followed by UTF-8.
    /// A u16 length followed by UTF-8; a longer string is cut at the last whole character within
    /// 65,535 bytes (the encoder never traps on text it did not make).
    public mutating func shortString(_ s: String) {
        let u = Array(s.utf8).clampedToUTF8(UInt16.max)
        u16(UInt16(u.count)); bytes.append(contentsOf: u)
    }
    /// A u32 length followed by UTF-8.
    public mutating func string(_ s: String) { blob(Array(s.utf8)) }

    /// Overwrites four bytes at `offset` with `v` (big-endian), in place.
    public mutating func patchU32(at offset: Int, _ v: UInt32) {
        for i in 0..<4 { bytes[offset + i] = UInt8((v >> UInt32(24 - 8 * i)) & 0xff) }
    }

    /// Moves the bytes out without copying them (the writer is left empty). Use this, not `bytes`,
    /// when the buffer holds a secret: a copy-on-write copy would leave an unwiped original behind.
    public mutating func take() -> [UInt8] {
        var out: [UInt8] = []
        swap(&out, &bytes)
        return out
    }
}

/// Reads what ``ByteWriter`` writes, refusing truncated or oversized fields.
public struct ByteReader: Sendable {
    private let bytes: ArraySlice<UInt8>
    private var index: Int

    /// A reader over `bytes`.
    public init(_ bytes: ArraySlice<UInt8>) { self.bytes = bytes; self.index = bytes.startIndex }
    /// A reader over `bytes`.
    public init(_ bytes: [UInt8]) { self.init(bytes[...]) }

    /// Bytes not yet read.
    public var remaining: Int { bytes.endIndex - index }
    /// True when every byte has been read.
    public var isAtEnd: Bool { index == bytes.endIndex }

    // `what` names the field for the error message; it is an autoclosure so that the happy path
    // (every lookup decodes dozens of fields) never builds a string.
    private mutating func take(_ n: Int, _ what: @autoclosure () -> String) throws(DecodeError) -> ArraySlice<UInt8> {
        guard n >= 0, remaining >= n else { throw DecodeError("truncated \(what())") }
        defer { index += n }
        return bytes[index..<index + n]
    }

    public mutating func u8(_ what: @autoclosure () -> String = "byte") throws(DecodeError) -> UInt8 { try take(1, what()).first! }
    public mutating func u16(_ what: @autoclosure () -> String = "u16") throws(DecodeError) -> UInt16 {
        try take(2, what()).reduce(0) { $0 << 8 | UInt16($1) }
    }
    public mutating func u32(_ what: @autoclosure () -> String = "u32") throws(DecodeError) -> UInt32 {
        try take(4, what()).reduce(0) { $0 << 8 | UInt32($1) }
    }
    public mutating func u64(_ what: @autoclosure () -> String = "u64") throws(DecodeError) -> UInt64 {
        try take(8, what()).reduce(0) { $0 << 8 | UInt64($1) }
    }
    /// Exactly `n` raw bytes.
    public mutating func raw(_ n: Int, _ what: @autoclosure () -> String = "bytes") throws(DecodeError) -> ArraySlice<UInt8> { try take(n, what()) }
    /// A u32-length-prefixed field of at most `max` bytes.
    public mutating func blob(max: Int, _ what: @autoclosure () -> String = "field") throws(DecodeError) -> ArraySlice<UInt8> {
        let n = Int(try u32("\(what()) length"))
        guard n <= max else { throw DecodeError("\(what()) too long (the limit is \(max) bytes)") }
        return try take(n, what())
    }
    /// A u16-length-prefixed UTF-8 string.
    public mutating func shortString(_ what: @autoclosure () -> String = "string") throws(DecodeError) -> String {
        let n = Int(try u16("\(what()) length"))
        return try utf8(take(n, what()), what())
    }
    /// A u32-length-prefixed UTF-8 string of at most `max` bytes.
    public mutating func string(max: Int, _ what: @autoclosure () -> String = "string") throws(DecodeError) -> String {
        try utf8(blob(max: max, what()), what())
    }
    private func utf8(_ b: ArraySlice<UInt8>, _ what: @autoclosure () -> String) throws(DecodeError) -> String {
        guard let s = b.withUnsafeBufferPointer(String.init(validUTF8:)) else { throw DecodeError("\(what()) is not valid UTF-8") }
        return s
    }
    /// Throws unless every byte was consumed.
    public func expectEnd(_ what: String) throws(DecodeError) {
        guard isAtEnd else { throw DecodeError("unexpected trailing bytes after \(what)") }
    }
}

extension String {
    /// `bytes` as a string if they are valid UTF-8; nil otherwise (never repaired). Every decoder of
    /// untrusted strings uses this.
    ///
    /// `String(decoding:)` takes the standard library's fast, specialised path but repairs invalid
    /// input with U+FFFD, so valid UTF-8 is exactly the input that comes back unchanged.
    /// (`String(validating:)` on a slice runs unspecialised generic code: a third of a lookup.)
    public init?(validUTF8 bytes: UnsafeBufferPointer<UInt8>) {
        var s = String(decoding: bytes, as: UTF8.self)
        guard s.withUTF8({ $0.elementsEqual(bytes) }) else { return nil }
        self = s
    }
}

/// Canonical binary form of attribute dictionaries: used in encrypted rows, primary-key hashes and the wire.
///
/// `u16 count`, then per attribute sorted by name: `u16-string name`, `u8 tag`, value
/// (1 string: u32-string; 2 integer: i64; 3 data: u32-blob; 4 bool: u8 0/1; 5 date: f64 bits).
public enum AttributeCodec {
    /// Largest encoded value (64 KiB).
    public static let maxValueBytes = 64 * 1024
    /// Most attributes in one dictionary.
    public static let maxCount = 128

    /// Encodes one value (tag + body).
    public static func encode(_ v: AttributeValue, into w: inout ByteWriter) {
        switch v {
        case .string(let s): w.u8(1); w.string(s)
        case .integer(let i): w.u8(2); w.u64(UInt64(bitPattern: i))
        case .data(let d): w.u8(3); w.blob(d)
        case .bool(let b): w.u8(4); w.u8(b ? 1 : 0)
        case .date(let t): w.u8(5); w.u64(t.bitPattern)
        }
    }

    /// Decodes one value.
    public static func decodeValue(from r: inout ByteReader) throws(DecodeError) -> AttributeValue {
        switch try r.u8("value tag") {
        case 1: return .string(try r.string(max: maxValueBytes, "string value"))
        case 2: return .integer(Int64(bitPattern: try r.u64("integer value")))
        case 3: return .data(Array(try r.blob(max: maxValueBytes, "data value")))
        case 4:
            let b = try r.u8("bool value")
            guard b <= 1 else { throw DecodeError("bool value must be 0 or 1") }
            return .bool(b == 1)
        case 5:
            let t = Double(bitPattern: try r.u64("date value"))
            guard t.isFinite else { throw DecodeError("date value is not finite") }
            return .date(t)
        default: throw DecodeError("unknown value tag")
        }
    }

    /// Encodes a dictionary canonically (sorted by the bytes of the names, as the wire spec says:
    /// Swift's `<` on strings compares their normalised forms, which differs for a name that is not NFC).
    public static func encode(_ attrs: Attributes, into w: inout ByteWriter) {
        w.u16(UInt16(attrs.count))
        for name in attrs.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) {
            w.shortString(name)
            encode(attrs[name]!, into: &w)
        }
    }

    /// The bytes ``encode(_:into:)`` writes for `v`, without encoding it.
    public static func encodedSize(_ v: AttributeValue) -> Int {
        switch v {
        case .string(let s): 5 + s.utf8.count
        case .integer, .date: 9
        case .data(let d): 5 + d.count
        case .bool: 2
        }
    }

    /// The bytes ``encode(_:)`` gives for `attrs`, without sorting, copying or writing anything (a
    /// reply is sized item by item before it is built: encoding each item twice cost a third of a
    /// large search's time).
    public static func encodedSize(_ attrs: Attributes) -> Int {
        var n = 2
        for (name, value) in attrs {
            let c = name.utf8.count
            n += 2 + (c <= Int(UInt16.max) ? c : Array(name.utf8).clampedToUTF8(UInt16.max).count) + encodedSize(value)
        }
        return n
    }

    /// Encodes a dictionary canonically into new bytes.
    public static func encode(_ attrs: Attributes) -> [UInt8] {
        var w = ByteWriter()
        encode(attrs, into: &w)
        return w.bytes
    }

    /// Decodes a dictionary, refusing duplicates and unsorted names (only the canonical form is accepted).
    public static func decodeAttributes(from r: inout ByteReader) throws(DecodeError) -> Attributes {
        let n = Int(try r.u16("attribute count"))
        guard n <= maxCount else { throw DecodeError("too many attributes (the limit is \(maxCount))") }
        var out = Attributes(minimumCapacity: n)
        var last: String? = nil
        for _ in 0..<n {
            let name = try r.shortString("attribute name")
            guard name.utf8.count <= 32, !name.isEmpty else { throw DecodeError("bad attribute name length (names are 1 to 32 bytes; a general attribute's 1 to 31 after the @)") }
            if let l = last, !l.utf8.lexicographicallyPrecedes(name.utf8) { throw DecodeError("attribute names not sorted or repeated") }
            // Two spellings of one name (canonically equivalent, other bytes) are one dictionary key.
            guard out[name] == nil else { throw DecodeError("attribute names repeated (two spellings of one name)") }
            last = name
            out[name] = try decodeValue(from: &r)
        }
        return out
    }
}

extension Array where Element == UInt8 {
    /// At most `limit` bytes of this UTF-8 text, cut before a continuation byte so no character is
    /// split.
    public func clampedToUTF8(_ limit: some BinaryInteger) -> ArraySlice<UInt8> {
        let n = Int(limit)
        guard count > n else { return self[...] }
        var end = n
        while end > 0 && self[end] & 0xC0 == 0x80 { end -= 1 }
        return self[..<end]
    }
}

extension String {
    /// This string cut to at most `limit` UTF-8 bytes at a character boundary (for text stored or sent
    /// with a length bound, such as a check finding's reason).
    public func clampedToUTF8(_ limit: Int) -> String {
        String(decoding: Array(utf8).clampedToUTF8(limit), as: UTF8.self)
    }
}
