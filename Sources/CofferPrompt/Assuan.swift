public import CofferCrypto
import CofferModel

/// Assuan's line escaping (GnuPG's IPC protocol: gpg-agent ↔ pinentry): in command arguments and
/// data (`D`) lines `%`, CR and LF travel as `%25`, `%0D` and `%0A`; a receiver decodes every `%XX`.
/// Secrets (a pin in a `D` line) are escaped and decoded in secure memory.
public enum Assuan {
    /// The longest line Assuan allows (`ASSUAN_LINELENGTH`), LF included.
    public static let maximumLineBytes = 1000

    /// `s` with `%`, CR and LF percent-escaped (a command argument such as SETDESC's text).
    public static func escape(_ s: String) -> String {
        var out = ""
        for u in s.unicodeScalars {
            switch u {
            case "%": out += "%25"
            case "\r": out += "%0D"
            case "\n": out += "%0A"
            default: out.unicodeScalars.append(u)
            }
        }
        return out
    }

    /// `s` with every `%XX` decoded (a malformed escape stays as it is). For public text only.
    public static func unescape(_ s: String) -> String {
        let bytes = Array(s.utf8)
        let decoded = unescape(bytes, from: 0)
        defer { decoded.wipe() }
        return decoded.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
    }

    /// The bytes of `line` from `start` on, percent-decoded, in secure memory (a `D` line's data:
    /// `start` 2 skips `D `).
    public static func unescape(_ line: [UInt8], from start: Int) -> SecureBytes {
        line.withUnsafeBytes { unescape($0, from: start) }
    }

    /// The bytes of `line` from `start` on, percent-decoded, in secure memory.
    public static func unescape(_ line: UnsafeRawBufferPointer, from start: Int) -> SecureBytes {
        let out = SecureBytes(count: max(0, line.count - start))
        var n = 0
        out.withUnsafeMutableBytes { o in
            var i = start
            while i < line.count {
                if line[i] == UInt8(ascii: "%"), i + 2 < line.count, let hi = Hex.digitValue(line[i + 1]), let lo = Hex.digitValue(line[i + 2]) {
                    o[n] = hi << 4 | lo
                    i += 3
                } else {
                    o[n] = line[i]
                    i += 1
                }
                n += 1
            }
        }
        defer { out.wipe() }
        return out.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
    }

    /// `D` lines (each `D ` + escaped data + LF, at most ``maximumLineBytes`` long) carrying `data`,
    /// in secure memory, ready to write. Empty data gives no line (Assuan sends none).
    public static func dataLines(_ data: SecureBytes) -> SecureBytes {
        // Every byte escaped at worst (3×), plus "D " and LF for each line of at least 990 bytes.
        let capacity = data.count * 3 + (data.count * 3 / 990 + 2) * 3
        let out = SecureBytes(count: capacity)
        var n = 0
        data.withUnsafeBytes { d in
            out.withUnsafeMutableBytes { o in
                var lineLength = 0
                func put(_ b: UInt8) { o[n] = b; n += 1; lineLength += 1 }
                for byte in d {
                    if lineLength == 0 { put(UInt8(ascii: "D")); put(UInt8(ascii: " ")) }
                    switch byte {
                    case UInt8(ascii: "%"), 0x0D, 0x0A:
                        put(UInt8(ascii: "%"))
                        put(hexDigit(byte >> 4))
                        put(hexDigit(byte & 0x0F))
                    default: put(byte)
                    }
                    if lineLength >= maximumLineBytes - 4 { o[n] = 0x0A; n += 1; lineLength = 0 }
                }
                if lineLength > 0 { o[n] = 0x0A; n += 1 }
            }
        }
        defer { out.wipe() }
        return out.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
    }

    private static func hexDigit(_ v: UInt8) -> UInt8 {
        v < 10 ? UInt8(ascii: "0") + v : UInt8(ascii: "A") + v - 10
    }
}
