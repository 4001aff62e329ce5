/// Hexadecimal and %-escapes, written once for every module: manifests (lowercase only), the CLI's
/// `--gena-hex` style options, Assuan's %XX escapes, secret references and git's URLs.
public enum Hex {
    private static let digits = Array("0123456789abcdef".utf8)

    /// The value of one hex digit (either case), or nil.
    public static func digitValue(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    /// Lowercase hex of `bytes`.
    public static func encode<C: Collection>(_ bytes: C) -> String where C.Element == UInt8 {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for b in bytes { out.append(digits[Int(b >> 4)]); out.append(digits[Int(b & 0x0F)]) }
        return String(decoding: out, as: UTF8.self)
    }

    /// The bytes of an even number of hex digits (either case), or nil.
    public static func decode(_ s: String) -> [UInt8]? {
        let u = Array(s.utf8)
        guard u.count % 2 == 0 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(u.count / 2)
        for i in stride(from: 0, to: u.count, by: 2) {
            guard let hi = digitValue(u[i]), let lo = digitValue(u[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
        }
        return out
    }

    /// Exactly `byteCount` bytes as `2 × byteCount` lowercase hex digits (the only form signed
    /// manifests allow), or nil.
    public static func decodeLowercase(_ s: ArraySlice<UInt8>, byteCount: Int) -> [UInt8]? {
        guard s.count == byteCount * 2,
              s.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else { return nil }
        return decode(String(decoding: s, as: UTF8.self))
    }

    /// `bytes` with each `%XX` replaced by its byte, or nil if a `%` does not start two hex digits.
    public static func percentDecodedBytes<C: Collection>(_ bytes: C) -> [UInt8]? where C.Element == UInt8 {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var rest = Array(bytes)[...]
        while let b = rest.popFirst() {
            guard b == UInt8(ascii: "%") else { out.append(b); continue }
            guard rest.count >= 2, let hi = digitValue(rest[rest.startIndex]), let lo = digitValue(rest[rest.startIndex + 1]) else {
                return nil
            }
            out.append(hi << 4 | lo)
            rest = rest.dropFirst(2)
        }
        return out
    }
}
