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
    public mutating func u16(_ v: UInt16) { withUnsafeBytes(of: v.bigEndian) { bytes.append(contentsOf: $0) } }
    public mutating func u32(_ v: UInt32) { withUnsafeBytes(of: v.bigEndian) { bytes.append(contentsOf: $0) } }
    public mutating func u64(_ v: UInt64) { withUnsafeBytes(of: v.bigEndian) { bytes.append(contentsOf: $0) } }
    /// Raw bytes with no length prefix.
    public mutating func raw<C: Collection>(_ b: C) where C.Element == UInt8 { bytes.append(contentsOf: b) }
    /// A u32 length followed by the bytes.
    public mutating func blob<C: Collection>(_ b: C) where C.Element == UInt8 { u32(UInt32(b.count)); bytes.append(contentsOf: b) }
    /// A u16 length followed by UTF-8; a longer string is cut at the last whole character within
    /// 65,535 bytes (the encoder never traps on text it did not make).
    public mutating func shortString(_ s: String) {
        let n = s.utf8.count
        guard n > Int(UInt16.max) else { u16(UInt16(n)); bytes.append(contentsOf: s.utf8); return }
        let u = Array(s.utf8).clampedToUTF8(UInt16.max)
        u16(UInt16(u.count)); bytes.append(contentsOf: u)
    }
    /// A u32 length followed by UTF-8 (copied straight from the string's storage).
    public mutating func string(_ s: String) { u32(UInt32(s.utf8.count)); bytes.append(contentsOf: s.utf8) }

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
        return try Self.utf8(take(n, what()), what())
    }
    /// A u32-length-prefixed UTF-8 string of at most `max` bytes.
    public mutating func string(max: Int, _ what: @autoclosure () -> String = "string") throws(DecodeError) -> String {
        try Self.utf8(blob(max: max, what()), what())
    }
    static func utf8(_ b: ArraySlice<UInt8>, _ what: @autoclosure () -> String) throws(DecodeError) -> String {
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
        // ASCII is never repaired. Otherwise a repair changes the bytes; a changed count shows it
        // without comparing them. (Comparing every string's bytes was the codec's largest cost.)
        guard Self.isASCII(bytes) || (s.utf8.count == bytes.count && s.withUTF8({ $0.elementsEqual(bytes) })) else { return nil }
        self = s
    }

    /// Whether this string's UTF-8 bytes sort before `other`'s (a shorter string first when it is a
    /// prefix of the other): the order of attribute names and of an event's group names on the wire,
    /// which is not `<` (that compares normalised forms). Compared in the strings' own storage.
    public func precedesInUTF8(_ other: String) -> Bool {
        var a = self, b = other
        return a.withUTF8 { x in b.withUTF8 { y in AttributeCodec.precedes(x, y) } }
    }

    /// Whether every byte is below 0x80, read eight at a time.
    @usableFromInline
    static func isASCII(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        let raw = UnsafeRawBufferPointer(bytes)
        var i = 0, seen: UInt64 = 0
        while i + 8 <= raw.count { seen |= raw.loadUnaligned(fromByteOffset: i, as: UInt64.self); i += 8 }
        while i < raw.count { seen |= UInt64(raw[i]); i += 1 }
        return seen & 0x8080_8080_8080_8080 == 0
    }
}

/// Canonical binary form of attribute dictionaries: used in encrypted rows, primary-key hashes and the wire.
///
/// `u16 count`, then per attribute sorted by name: `u16-string name`, `u8 tag`, value
/// (1 string: u32-string; 2 integer: i64; 3 data: u32-blob; 4 bool: u8 0/1; 5 date: f64 bits).
public enum AttributeCodec {
    /// Largest encoded value (64 KiB).
    public static let maxValueBytes = 64 * 1024
    /// Most attributes in one dictionary (128 general attributes and the catalog's).
    public static let maxCount = 256
    /// Longest attribute name (bytes of UTF-8): a general attribute's 255 and its `@`.
    public static let maxNameBytes = 256

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
        // Each entry with its name's first 8 bytes as a big-endian number, zero-padded: names nearly
        // always differ there, so the sort compares integers, and only a tie compares whole names.
        // (Sorting the (name, value) pairs by their UTF-8 views was two thirds of encoding an item.)
        var order: [(prefix: UInt64, index: Attributes.Index)] = []
        order.reserveCapacity(attrs.count)
        var i = attrs.startIndex
        while i != attrs.endIndex {
            order.append((namePrefix(attrs[i].key), i))
            attrs.formIndex(after: &i)
        }
        order.sort { $0.prefix != $1.prefix ? $0.prefix < $1.prefix : attrs[$0.index].key.precedesInUTF8(attrs[$1.index].key) }
        for (_, index) in order {
            let (name, value) = attrs[index]
            w.shortString(name)
            encode(value, into: &w)
        }
    }

    /// A name's first 8 UTF-8 bytes as a big-endian number, zero-padded: when two differ, they order
    /// the names as their bytes do (a shorter name that is a prefix of the other, padded with zeros,
    /// sorts first); when equal, the names must be compared whole.
    static func namePrefix(_ name: String) -> UInt64 {
        var v: UInt64 = 0, n: UInt64 = 0
        for b in name.utf8 {
            guard n < 8 else { break }
            v = v << 8 | UInt64(b); n += 1
        }
        return v << (8 * (8 - n))
    }

    /// Whether bytes `x` sort before bytes `y` (shorter first when one is a prefix of the other).
    static func precedes(_ x: UnsafeBufferPointer<UInt8>, _ y: UnsafeBufferPointer<UInt8>) -> Bool {
        for i in 0..<min(x.count, y.count) where x[i] != y[i] { return x[i] < y[i] }
        return x.count < y.count
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
        var w = ByteWriter(capacity: encodedSize(attrs))
        encode(attrs, into: &w)
        return w.bytes
    }

    /// Decodes a dictionary, refusing duplicates and unsorted names (only the canonical form is accepted).
    public static func decodeAttributes(from r: inout ByteReader) throws(DecodeError) -> Attributes {
        let n = Int(try r.u16("attribute count"))
        guard n <= maxCount else { throw DecodeError("too many attributes (the limit is \(maxCount))") }
        var out = Attributes(minimumCapacity: n)
        var last: ArraySlice<UInt8> = []
        for i in 0..<n {
            let bytes = try r.raw(Int(try r.u16("attribute name length")), "attribute name")
            let name = try ByteReader.utf8(bytes, "attribute name")
            guard bytes.count <= maxNameBytes, !bytes.isEmpty else { throw DecodeError("bad attribute name length (names are 1 to \(maxNameBytes) bytes; a general attribute's 1 to \(maxNameBytes - 1) after the @)") }
            if i > 0, !(last.withUnsafeBufferPointer { l in bytes.withUnsafeBufferPointer { precedes(l, $0) } }) {
                throw DecodeError("attribute names not sorted or repeated")
            }
            last = bytes
            // Two spellings of one name (canonically equivalent, other bytes) are one dictionary key.
            guard out.updateValue(try decodeValue(from: &r), forKey: name) == nil else {
                throw DecodeError("attribute names repeated (two spellings of one name)")
            }
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
