import CofferModel
import CofferSystem
import Glibc

/// Text and JSON renderings of attributes (never secrets).
enum Output {
    static func json(_ s: String) -> String {
        var out = "\""
        for u in s.unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where u.value < 0x20 || u.value == 0x7F || isTerminalHazard(u):
                // DEL, C1 controls (some terminals act on U+009B as CSI), line separators and
                // bidirectional controls are valid JSON unescaped, but not safe on a terminal.
                let h = Hex.encode([UInt8(u.value >> 8), UInt8(u.value & 0xFF)])
                out += "\\u" + h
            default: out.unicodeScalars.append(u)
            }
        }
        return out + "\""
    }

    /// Unicode scalars above ASCII that a terminal acts on or that reorder or break what is shown:
    /// C1 controls, the line and paragraph separators, and bidirectional formatting controls.
    static func isTerminalHazard(_ u: Unicode.Scalar) -> Bool {
        switch u.value {
        case 0x80...0x9F, 0x2028, 0x2029, 0x061C, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069: true
        default: false
        }
    }

    /// The text form of a string: printable as is, except `\` → `\\`, newline → `\n`, carriage
    /// return → `\r`, tab → `\t`, other C0 controls and DEL → `\xHH`, and the scalars of
    /// ``isTerminalHazard(_:)`` → `\u{HHHH}`. Unambiguous (every backslash starts an escape), and
    /// a value can neither start a new line of output nor send a terminal escape sequence.
    static func escapedText(_ s: String) -> String {
        var out = ""
        for u in s.unicodeScalars {
            switch u {
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where u.value < 0x20 || u.value == 0x7F: out += "\\x" + Hex.encode([UInt8(u.value)])
            case _ where isTerminalHazard(u):
                out += "\\u{" + Hex.encode([UInt8(u.value >> 8), UInt8(u.value & 0xFF)]) + "}"
            default: out.unicodeScalars.append(u)
            }
        }
        return out
    }

    /// ISO 8601 UTC, e.g. 2026-11-22T22:51:57Z.
    static func iso8601(_ t: Double) -> String {
        var secs = time_t(t.rounded(.down))
        var tmv = tm()
        gmtime_r(&secs, &tmv)
        var buf = [CChar](repeating: 0, count: 32)
        let n = strftime(&buf, buf.count, "%Y-%m-%dT%H:%M:%SZ", &tmv)
        return String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    static func text(_ v: AttributeValue) -> String {
        switch v {
        case .string(let s): escapedText(s)
        case .integer(let i): String(i)
        case .bool(let b): b ? "true" : "false"
        case .date(let t): iso8601(t)
        case .data(let d): "hex:" + Hex.encode(d)
        }
    }

    static func jsonValue(_ v: AttributeValue) -> String {
        switch v {
        case .string(let s): json(s)
        case .integer(let i): String(i)
        case .bool(let b): b ? "true" : "false"
        case .date(let t): json(iso8601(t))
        case .data(let d): json("hex:" + Hex.encode(d))
        }
    }

    /// `{"class":"genp","acct":"…",…}` with keys sorted (class first).
    static func jsonObject(_ cls: ItemClass, _ attrs: Attributes) -> String {
        let fields = [json("class") + ":" + json(cls.rawValue)]
            + attrs.keys.sorted().map { json($0) + ":" + jsonValue(attrs[$0]!) }
        return "{" + fields.joined(separator: ",") + "}"
    }

    /// `key: value` lines, class first; names and string values escaped (``escapedText(_:)``), so
    /// each item is exactly its lines and blocks are separated by one empty line.
    static func textBlock(_ cls: ItemClass, _ attrs: Attributes) -> String {
        (["class: \(cls.rawValue)"] + attrs.keys.sorted().map { "\(escapedText($0)): \(text(attrs[$0]!))" }).joined(separator: "\n")
    }

    /// Writes bytes to a descriptor in full.
    static func write(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Bool { StandardStreams.write(fd, bytes) }
    /// Writes a line to standard error.
    static func printError(_ s: String) { StandardStreams.printError(s) }
    /// Writes a line to standard output.
    static func print(_ s: String) { StandardStreams.print(s) }
}
