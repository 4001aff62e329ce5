import CofferModel

/// The little JSON the audit log needs: quoting strings safely, and reading back a flat object of
/// strings, numbers and nulls (what ``AuditRecord/jsonLine()`` writes). No Foundation: the agent links this.
enum AuditJSON {
    enum Value: Equatable { case string(String), number(Double), null }

    /// `s` as a terminal-safe JSON string (``TerminalSafeText/json(_:)``).
    static func quote(_ s: String) -> String { TerminalSafeText.json(s) }

    /// A flat JSON object (`{"k":"v","n":1.5,"x":null}`), or nil for anything else.
    static func parseFlatObject(_ text: String) -> [String: Value]? {
        var p = Parser(Array(text.unicodeScalars))
        return p.object()
    }

    struct Parser {
        let s: [Unicode.Scalar]
        var i = 0
        init(_ s: [Unicode.Scalar]) { self.s = s }

        mutating func skipSpace() { while i < s.count, s[i] == " " || s[i] == "\t" { i += 1 } }
        mutating func eat(_ c: Unicode.Scalar) -> Bool {
            skipSpace()
            guard i < s.count, s[i] == c else { return false }
            i += 1
            return true
        }

        mutating func object() -> [String: Value]? {
            guard eat("{") else { return nil }
            var out: [String: Value] = [:]
            if eat("}") { return end(out) }
            repeat {
                skipSpace()
                guard let k = string(), eat(":"), let v = value(), out.updateValue(v, forKey: k) == nil else { return nil }
            } while eat(",")
            guard eat("}") else { return nil }
            return end(out)
        }

        mutating func end(_ o: [String: Value]) -> [String: Value]? {
            skipSpace()
            return i == s.count ? o : nil
        }

        mutating func value() -> Value? {
            skipSpace()
            guard i < s.count else { return nil }
            if s[i] == "\"" { return string().map(Value.string) }
            if s[i] == "n" {
                guard i + 4 <= s.count, String(String.UnicodeScalarView(s[i..<i + 4])) == "null" else { return nil }
                i += 4
                return .null
            }
            let start = i
            while i < s.count, "-+.eE0123456789".unicodeScalars.contains(s[i]) { i += 1 }
            return Double(String(String.UnicodeScalarView(s[start..<i]))).map(Value.number)
        }

        mutating func string() -> String? {
            guard i < s.count, s[i] == "\"" else { return nil }
            i += 1
            var out = String.UnicodeScalarView()
            while i < s.count {
                let c = s[i]
                i += 1
                switch c {
                case "\"": return String(out)
                case "\\":
                    guard i < s.count else { return nil }
                    let e = s[i]
                    i += 1
                    switch e {
                    case "\"": out.append("\"")
                    case "\\": out.append("\\")
                    case "/": out.append("/")
                    case "n": out.append("\n")
                    case "r": out.append("\r")
                    case "t": out.append("\t")
                    case "b": out.append("\u{08}")
                    case "f": out.append("\u{0C}")
                    case "u":
                        guard let hi = hex4() else { return nil }
                        if (0xD800..<0xDC00).contains(hi) {
                            guard i + 1 < s.count, s[i] == "\\", s[i + 1] == "u" else { return nil }
                            i += 2
                            guard let lo = hex4(), (0xDC00..<0xE000).contains(lo),
                                  let u = Unicode.Scalar(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)) else { return nil }
                            out.append(u)
                        } else {
                            guard let u = Unicode.Scalar(hi) else { return nil }
                            out.append(u)
                        }
                    default: return nil
                    }
                default:
                    guard c.value >= 0x20 else { return nil }
                    out.append(c)
                }
            }
            return nil
        }

        mutating func hex4() -> UInt32? {
            guard i + 4 <= s.count else { return nil }
            var v: UInt32 = 0
            for k in 0..<4 {
                guard let d = hexDigit(s[i + k]) else { return nil }
                v = v << 4 | d
            }
            i += 4
            return v
        }

        func hexDigit(_ c: Unicode.Scalar) -> UInt32? {
            switch c.value {
            case 0x30...0x39: c.value - 0x30
            case 0x61...0x66: c.value - 0x61 + 10
            case 0x41...0x46: c.value - 0x41 + 10
            default: nil
            }
        }
    }
}
