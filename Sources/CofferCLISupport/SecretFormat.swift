package import CofferCrypto
import CofferModel

/// Renderings of a secret for `coffer get --format` and `coffer run` / `inject`, built in secure
/// memory: the secret is never a Swift `String` and the buffers are wiped when released.
package enum SecretFormat {
    /// Why a secret cannot be rendered as asked.
    package enum Failure: Error, Equatable {
        /// Not valid UTF-8 (JSON's `secret` field; the caller falls back to hex).
        case notUTF8
        /// Contains a NUL byte (an environment variable cannot hold one).
        case containsNUL
    }

    /// `prefix`, then `secret` as the contents of a JSON string (quotes included), then `suffix`.
    /// Throws ``Failure/notUTF8`` if the secret is not valid UTF-8. Control characters, DEL and the
    /// scalars a terminal acts on are escaped (``TerminalSafeText``), so the output is safe to show.
    package static func json(prefix: String, secret: SecureBytes, suffix: String) throws(Failure) -> SecureBytes {
        let pre = Array(prefix.utf8), post = Array(suffix.utf8)
        let out = SecureBytes(count: pre.count + 2 + secret.count * 6 + post.count)
        let written = try out.withUnsafeMutableBytes { (o: UnsafeMutableRawBufferPointer) throws(Failure) -> Int in
            var n = 0
            func put(_ b: UInt8) { o[n] = b; n += 1 }
            for b in pre { put(b) }
            put(UInt8(ascii: "\""))
            try secret.withUnsafeBytes { (s: UnsafeRawBufferPointer) throws(Failure) in
                var i = 0
                while i < s.count {
                    guard let (scalar, length) = decodeScalar(s, at: i) else { throw .notUTF8 }
                    switch scalar {
                    case 0x22: put(UInt8(ascii: "\\")); put(UInt8(ascii: "\""))
                    case 0x5C: put(UInt8(ascii: "\\")); put(UInt8(ascii: "\\"))
                    case 0x0A: put(UInt8(ascii: "\\")); put(UInt8(ascii: "n"))
                    case 0x0D: put(UInt8(ascii: "\\")); put(UInt8(ascii: "r"))
                    case 0x09: put(UInt8(ascii: "\\")); put(UInt8(ascii: "t"))
                    case _ where scalar < 0x20 || scalar == 0x7F || TerminalSafeText.isTerminalHazard(Unicode.Scalar(scalar)!):
                        for c in "\\u".utf8 { put(c) }
                        for shift in stride(from: 12, through: 0, by: -4) { put(hexDigit(UInt8((scalar >> UInt32(shift)) & 0xF))) }
                    default:
                        for k in 0..<length { put(s[i + k]) }
                    }
                    i += length
                }
            }
            put(UInt8(ascii: "\""))
            for b in post { put(b) }
            return n
        }
        defer { out.wipe() }
        return out.slice(0..<written)
    }

    /// `prefix`, then `secret` as a JSON string of lowercase hex digits (quotes included), then `suffix`.
    package static func hexJSON(prefix: String, secret: SecureBytes, suffix: String) -> SecureBytes {
        let pre = Array(prefix.utf8), post = Array(suffix.utf8)
        let out = SecureBytes(count: pre.count + 2 + secret.count * 2 + post.count)
        out.withUnsafeMutableBytes { o in
            var n = 0
            func put(_ b: UInt8) { o[n] = b; n += 1 }
            for b in pre { put(b) }
            put(UInt8(ascii: "\""))
            secret.withUnsafeBytes { s in
                for b in s { put(hexDigit(b >> 4)); put(hexDigit(b & 0xF)) }
            }
            put(UInt8(ascii: "\""))
            for b in post { put(b) }
        }
        return out
    }

    /// `NAME='secret'` and a newline, the secret in POSIX shell single quotes (each `'` written as
    /// `'\''`), for `eval "$(coffer get --format env …)"`. Throws ``Failure/containsNUL`` (a shell
    /// variable cannot hold a NUL).
    package static func shellAssignment(name: String, secret: SecureBytes) throws(Failure) -> SecureBytes {
        let pre = Array((name + "='").utf8)
        let out = SecureBytes(count: pre.count + secret.count * 4 + 2)
        let written = try out.withUnsafeMutableBytes { (o: UnsafeMutableRawBufferPointer) throws(Failure) -> Int in
            var n = 0
            func put(_ b: UInt8) { o[n] = b; n += 1 }
            for b in pre { put(b) }
            try secret.withUnsafeBytes { (s: UnsafeRawBufferPointer) throws(Failure) in
                for b in s {
                    if b == 0 { throw .containsNUL }
                    if b == UInt8(ascii: "'") { for c in "'\\''".utf8 { put(c) } } else { put(b) }
                }
            }
            put(UInt8(ascii: "'"))
            put(UInt8(ascii: "\n"))
            return n
        }
        defer { out.wipe() }
        return out.slice(0..<written)
    }

    /// `NAME=secret` and a terminating NUL: one `envp` entry for execve.
    package static func environmentEntry(name: String, secret: SecureBytes) throws(Failure) -> SecureBytes {
        let pre = Array((name + "=").utf8)
        let out = SecureBytes(count: pre.count + secret.count + 1)
        try out.withUnsafeMutableBytes { (o: UnsafeMutableRawBufferPointer) throws(Failure) in
            for (k, b) in pre.enumerated() { o[k] = b }
            try secret.withUnsafeBytes { (s: UnsafeRawBufferPointer) throws(Failure) in
                for (k, b) in s.enumerated() {
                    if b == 0 { throw .containsNUL }
                    o[pre.count + k] = b
                }
            }
            o[pre.count + secret.count] = 0
        }
        return out
    }

    /// Whether `name` is a portable environment variable name (`[A-Za-z_][A-Za-z0-9_]*`).
    package static func isVariableName(_ name: String) -> Bool {
        guard let first = name.utf8.first, !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first) else { return false }
        return name.utf8.allSatisfy { c in
            (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(c) || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(c)
                || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(c) || c == UInt8(ascii: "_")
        }
    }

    /// A variable name made from an item's service or server: `api.github.com` → `API_GITHUB_COM`.
    package static func variableName(from text: String) -> String {
        var out = String(text.unicodeScalars.map { u -> Character in
            let c = Character(u)
            return (u.isASCII && (c.isLetter || c.isNumber)) ? Character(c.uppercased()) : "_"
        })
        if out.isEmpty || out.first!.isNumber { out = "_" + out }
        return out
    }

    private static func hexDigit(_ v: UInt8) -> UInt8 { v < 10 ? UInt8(ascii: "0") + v : UInt8(ascii: "a") + v - 10 }

    /// One UTF-8 scalar at `i` (shortest form, no surrogates, ≤ U+10FFFF) and its length.
    static func decodeScalar(_ s: UnsafeRawBufferPointer, at i: Int) -> (UInt32, Int)? {
        let b0 = s[i]
        if b0 < 0x80 { return (UInt32(b0), 1) }
        let length: Int, minimum: UInt32
        var value: UInt32
        switch b0 {
        case 0xC2...0xDF: length = 2; value = UInt32(b0 & 0x1F); minimum = 0x80
        case 0xE0...0xEF: length = 3; value = UInt32(b0 & 0x0F); minimum = 0x800
        case 0xF0...0xF4: length = 4; value = UInt32(b0 & 0x07); minimum = 0x10000
        default: return nil
        }
        guard i + length <= s.count else { return nil }
        for k in 1..<length {
            let b = s[i + k]
            guard b & 0xC0 == 0x80 else { return nil }
            value = value << 6 | UInt32(b & 0x3F)
        }
        guard value >= minimum, value <= 0x10FFFF, !(0xD800...0xDFFF).contains(value) else { return nil }
        return (value, length)
    }
}
