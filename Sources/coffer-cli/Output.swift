import CofferModel
import CofferSystem
import Glibc

/// Text and JSON renderings of attributes (never secrets).
enum Output {
    /// A JSON string, terminal-safe (``TerminalSafeText/json(_:)``).
    static func json(_ s: String) -> String { TerminalSafeText.json(s) }

    /// The escaped text form of a string (``TerminalSafeText/escaped(_:)``).
    static func escapedText(_ s: String) -> String { TerminalSafeText.escaped(s) }

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
