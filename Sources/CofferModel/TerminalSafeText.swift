/// Strings from callers or files made safe to print: as JSON strings, or as escaped text. Used by
/// every place that shows such a value (the CLI's `find`, `audit`, `manifest`; the audit log's JSON
/// lines), so a crafted label, app id or path can neither forge a line of output nor send a
/// terminal escape sequence.
package enum TerminalSafeText {
    /// Unicode scalars above ASCII that a terminal acts on or that reorder or break what is shown:
    /// C1 controls (some terminals act on U+009B as CSI), the line and paragraph separators, and
    /// bidirectional formatting controls.
    package static func isTerminalHazard(_ u: Unicode.Scalar) -> Bool {
        switch u.value {
        case 0x80...0x9F, 0x2028, 0x2029, 0x061C, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069: true
        default: false
        }
    }

    /// `s` as a JSON string; every control character, DEL and ``isTerminalHazard(_:)`` scalar
    /// escaped as `\uXXXX` (valid JSON unescaped, but not safe on a terminal).
    package static func json(_ s: String) -> String {
        var out = "\""
        for u in s.unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where u.value < 0x20 || u.value == 0x7F || isTerminalHazard(u): out += "\\u" + hex4(u.value)
            default: out.unicodeScalars.append(u)
            }
        }
        return out + "\""
    }

    /// The text form: printable as is, except `\` → `\\`, newline → `\n`, carriage return → `\r`,
    /// tab → `\t`, other C0 controls and DEL → `\xHH`, and ``isTerminalHazard(_:)`` scalars →
    /// `\u{HHHH}`. Unambiguous (every backslash starts an escape).
    package static func escaped(_ s: String) -> String {
        var out = ""
        for u in s.unicodeScalars {
            switch u {
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where u.value < 0x20 || u.value == 0x7F: out += "\\x" + String(hex4(u.value).suffix(2))
            case _ where isTerminalHazard(u): out += "\\u{" + hex4(u.value) + "}"
            default: out.unicodeScalars.append(u)
            }
        }
        return out
    }

    /// Four lowercase hex digits (the scalars escaped here are all below U+10000).
    private static func hex4(_ v: UInt32) -> String {
        let digits = Array("0123456789abcdef".unicodeScalars)
        var out = ""
        for shift in stride(from: 12, through: 0, by: -4) { out.unicodeScalars.append(digits[Int((v >> UInt32(shift)) & 0xF)]) }
        return out
    }
}
