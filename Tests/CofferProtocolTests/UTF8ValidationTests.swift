import CofferModel
@testable import CofferProtocol
import Testing

/// Strings on the wire and in sealed rows MUST be valid UTF-8. Both decoders take a fast path
/// (decode, then require the bytes back unchanged); these cases pin that it still rejects every
/// kind of ill-formed sequence and keeps every well-formed one byte for byte.
@Suite struct UTF8ValidationTests {
    static let illFormed: [(String, [UInt8])] = [
        ("lone continuation byte", [0x61, 0x80]),
        ("truncated two-byte sequence", [0xC3]),
        ("truncated three-byte sequence", [0xE2, 0x82]),
        ("overlong slash", [0xC0, 0xAF]),
        ("overlong NUL", [0xE0, 0x80, 0x80]),
        ("UTF-16 surrogate", [0xED, 0xA0, 0x80]),
        ("beyond U+10FFFF", [0xF4, 0x90, 0x80, 0x80]),
        ("0xFF", [0x61, 0xFF, 0x62]),
        ("the replacement character's bytes, then a stray byte", [0xEF, 0xBF, 0xBD, 0xBF]),
    ]
    static let wellFormed = ["", "plain", "ünïcødé", "日本語", "🔐 key", "\u{FFFD}", "a\u{0}b", "\u{10FFFF}"]

    /// A canonical attribute dictionary {"labl": string value with these bytes}.
    static func attributes(valueBytes: [UInt8]) -> [UInt8] {
        var w = ByteWriter()
        w.u16(1)
        w.shortString("labl")
        w.u8(1)
        w.blob(valueBytes)
        return w.bytes
    }

    @Test(arguments: illFormed)
    func attributeCodecRejects(_ c: (String, [UInt8])) {
        var r = ByteReader(Self.attributes(valueBytes: c.1))
        #expect(throws: DecodeError("string value is not valid UTF-8"), "\(c.0)") { try AttributeCodec.decodeAttributes(from: &r) }
    }

    @Test(arguments: illFormed)
    func attributeNamesAreCheckedToo(_ c: (String, [UInt8])) {
        var w = ByteWriter()
        w.u16(1)
        w.u16(UInt16(c.1.count)); w.raw(c.1)
        w.u8(2); w.u64(1)
        var r = ByteReader(w.bytes)
        #expect(throws: DecodeError.self, "\(c.0)") { try AttributeCodec.decodeAttributes(from: &r) }
    }

    @Test(arguments: wellFormed)
    func attributeCodecKeepsValidStrings(_ s: String) throws {
        var r = ByteReader(Self.attributes(valueBytes: Array(s.utf8)))
        let decoded = try AttributeCodec.decodeAttributes(from: &r)
        guard case .string(let back) = decoded["labl"] else { Issue.record("no string"); return }
        #expect(Array(back.utf8) == Array(s.utf8))
    }

    /// The decoders skip the comparison for ASCII, read eight bytes at a time: an ill-formed sequence
    /// is still found at every offset of a longer string, in the eight-byte words and in the tail, and
    /// a well-formed non-ASCII character there is kept.
    @Test(arguments: illFormed)
    func illFormedBytesAreFoundAtEveryOffset(_ c: (String, [UInt8])) throws {
        for length in [8, 9, 16, 23, 40] {
            for at in 0...(length - 1) {
                var bytes = [UInt8](repeating: UInt8(ascii: "x"), count: length)
                bytes.replaceSubrange(at..<min(length, at + c.1.count), with: c.1.prefix(length - at))
                guard String(validating: bytes, as: UTF8.self) == nil else { continue } // cut to a valid prefix
                var r = ByteReader(Self.attributes(valueBytes: bytes))
                #expect(throws: DecodeError("string value is not valid UTF-8"), "\(c.0) at \(at) of \(length)") {
                    try AttributeCodec.decodeAttributes(from: &r)
                }
            }
        }
        for length in [8, 9, 16, 23] {
            for at in 0...(length - 2) {
                var bytes = [UInt8](repeating: UInt8(ascii: "x"), count: length)
                bytes.replaceSubrange(at..<at + 2, with: Array("é".utf8))
                var r = ByteReader(Self.attributes(valueBytes: bytes))
                #expect(try AttributeCodec.decodeAttributes(from: &r)["labl"] == .string(String(decoding: bytes, as: UTF8.self)))
            }
        }
    }

    /// HELLO's client name is an `sstr`: the wire decoder's own UTF-8 check.
    static func hello(nameBytes: [UInt8]) -> [UInt8] {
        var w = ByteWriter()
        w.u8(0x01); w.u32(1)
        w.u16(1); w.u16(1)
        w.u16(UInt16(nameBytes.count)); w.raw(nameBytes)
        return w.bytes
    }

    @Test(arguments: illFormed)
    func wireStringsAreRejected(_ c: (String, [UInt8])) {
        do {
            _ = try Self.hello(nameBytes: c.1).withUnsafeBytes { try AgentRequest.decodeBody($0) }
            Issue.record("decoded \(c.0)")
        } catch let e as ProtocolError {
            #expect(e.description.hasSuffix("is not valid UTF-8"), "\(c.0): \(e.description)")
        } catch {
            Issue.record("untyped error")
        }
    }

    @Test(arguments: wellFormed)
    func wireStringsRoundTrip(_ s: String) throws {
        let (_, r) = try Self.hello(nameBytes: Array(s.utf8)).withUnsafeBytes { try AgentRequest.decodeBody($0) }
        guard case .hello(_, _, let name) = r else { Issue.record("not hello"); return }
        #expect(Array(name.utf8) == Array(s.utf8))
    }

    /// Attribute values inside a request go through both decoders.
    @Test(arguments: illFormed)
    func attributeValuesInRequestsAreRejected(_ c: (String, [UInt8])) {
        var w = ByteWriter()
        w.u8(0x07); w.u32(1); w.u8(0)
        w.raw(Self.attributes(valueBytes: c.1))
        w.u8(0); w.u32(0); w.u8(0); w.blob([UInt8]()) // limit one, no flags, no persistent ref
        do {
            _ = try w.bytes.withUnsafeBytes { try AgentRequest.decodeBody($0) }
            Issue.record("decoded \(c.0)")
        } catch let e as ProtocolError {
            #expect(e.description.contains("not valid UTF-8"), "\(c.0): \(e.description)")
        } catch {
            Issue.record("untyped error")
        }
    }
}
