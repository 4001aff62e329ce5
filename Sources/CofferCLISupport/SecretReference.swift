package import CofferModel

/// A secret named in a script: what `coffer run --env NAME=REFERENCE`, the `coffer://` values of
/// `coffer run`'s environment and `coffer inject`'s `{{ … }}` templates point at.
///
/// ```
/// coffer://SERVICE[/ACCOUNT][?group=G]                                   a generic password
/// coffer-inet://[ACCOUNT@]SERVER[:PORT][/PATH][?protocol=P&group=G]      an internet password
/// SERVICE/ACCOUNT                                                        (in `run --env` only) coffer://SERVICE/ACCOUNT
/// ```
///
/// Each part is percent-decoded after splitting, so `%2F` puts a `/` in a service, `%40` an `@`
/// in an account and `%25` a `%`. A reference without an account matches the first item of that
/// service (as `coffer get --service S` does). Parsing is pure and never sees a secret.
package struct SecretReference: Equatable, Sendable, CustomStringConvertible {
    /// The item class the reference names.
    package var itemClass: ItemClass
    /// The attributes an item must have (svce/acct, or srvr/acct/port/path/ptcl; agrp).
    package var attributes: Attributes
    /// The reference as written (for messages: it names an item, never holds a secret).
    package var text: String

    package var description: String { text }

    /// The schemes, for finding references in text.
    package static let genericScheme = "coffer://"
    package static let internetScheme = "coffer-inet://"

    /// Why a reference does not parse.
    package struct ParseError: Error, Equatable, CustomStringConvertible {
        package var description: String
    }

    /// Parses `text`; `allowBare` accepts `SERVICE/ACCOUNT` without a scheme.
    package init(parsing text: String, allowBare: Bool = false) throws(ParseError) {
        self.text = text
        if text.hasPrefix(Self.genericScheme) {
            (itemClass, attributes) = try Self.generic(String(text.dropFirst(Self.genericScheme.count)), text: text)
        } else if text.hasPrefix(Self.internetScheme) {
            (itemClass, attributes) = try Self.internet(String(text.dropFirst(Self.internetScheme.count)), text: text)
        } else if allowBare, !text.contains("://") {
            (itemClass, attributes) = try Self.generic(text, text: text)
        } else {
            throw ParseError(description: "'\(TerminalSafeText.escaped(text))' is not a reference (coffer://SERVICE/ACCOUNT or coffer-inet://ACCOUNT@SERVER/PATH)")
        }
    }

    /// Whether `text` starts like a reference (the values `coffer run` replaces in its environment).
    package static func looksLikeReference(_ text: String) -> Bool {
        text.hasPrefix(genericScheme) || text.hasPrefix(internetScheme)
    }

    private static func generic(_ rest: String, text: String) throws(ParseError) -> (ItemClass, Attributes) {
        let (body, params) = try splitQuery(rest, text: text, allowed: ["group"])
        let parts = body.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
        var attrs: Attributes = [:]
        let service = try decode(parts[0], text: text)
        guard !service.isEmpty else { throw ParseError(description: "'\(TerminalSafeText.escaped(text))' names no service") }
        attrs["svce"] = .string(service)
        if parts.count == 2 {
            guard !parts[1].contains("/") else {
                throw ParseError(description: "'\(TerminalSafeText.escaped(text))' has more than SERVICE/ACCOUNT (write a / inside a part as %2F)")
            }
            let account = try decode(parts[1], text: text)
            guard !account.isEmpty else { throw ParseError(description: "'\(TerminalSafeText.escaped(text))' has an empty account (leave out the / to match any)") }
            attrs["acct"] = .string(account)
        }
        if let group = params["group"] { attrs["agrp"] = .string(group) }
        return (.genericPassword, attrs)
    }

    private static func internet(_ rest: String, text: String) throws(ParseError) -> (ItemClass, Attributes) {
        let (body, params) = try splitQuery(rest, text: text, allowed: ["group", "protocol"])
        var attrs: Attributes = [:]
        var authority = Substring(body), path: Substring? = nil
        if let slash = body.firstIndex(of: "/") {
            authority = body[..<slash]
            path = body[body.index(after: slash)...]
        }
        if let at = authority.lastIndex(of: "@") {
            let account = try decode(String(authority[..<at]), text: text)
            guard !account.isEmpty else { throw ParseError(description: "'\(TerminalSafeText.escaped(text))' has an empty account before @") }
            attrs["acct"] = .string(account)
            authority = authority[authority.index(after: at)...]
        }
        var host = authority
        if let colon = authority.lastIndex(of: ":"), !authority.hasSuffix("]") {
            let digits = authority[authority.index(after: colon)...]
            guard let port = Int64(digits), (1...65535).contains(port) else {
                throw ParseError(description: "'\(TerminalSafeText.escaped(text))' has a bad port")
            }
            attrs["port"] = .integer(port)
            host = authority[..<colon]
        }
        let server = try decode(String(host), text: text)
        guard !server.isEmpty else { throw ParseError(description: "'\(TerminalSafeText.escaped(text))' names no server") }
        attrs["srvr"] = .string(server)
        if let path, !path.isEmpty { attrs["path"] = .string(try decode(String(path), text: text)) }
        if let p = params["protocol"] { attrs["ptcl"] = .string(InternetProtocol.keychainCode(p)) }   // https → htps, as git stores it
        if let group = params["group"] { attrs["agrp"] = .string(group) }
        return (.internetPassword, attrs)
    }

    /// Splits `?key=value&…` off; only `allowed` keys, each once, with a value.
    private static func splitQuery(_ s: String, text: String, allowed: Set<String>) throws(ParseError) -> (String, [String: String]) {
        guard let q = s.firstIndex(of: "?") else { return (s, [:]) }
        var params: [String: String] = [:]
        for pair in s[s.index(after: q)...].split(separator: "&", omittingEmptySubsequences: false) {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard kv.count == 2, allowed.contains(String(kv[0])), params[String(kv[0])] == nil, !kv[1].isEmpty else {
                throw ParseError(description: "'\(TerminalSafeText.escaped(text))' has a bad parameter (allowed: \(allowed.sorted().joined(separator: ", ")))")
            }
            params[String(kv[0])] = try decode(String(kv[1]), text: text)
        }
        return (String(s[..<q]), params)
    }

    /// Percent-decodes one part (UTF-8; a `%` must start two hex digits).
    private static func decode(_ s: String, text: String) throws(ParseError) -> String {
        guard s.utf8.contains(UInt8(ascii: "%")) else { return s }
        guard let bytes = Hex.percentDecodedBytes(s.utf8) else {
            throw ParseError(description: "'\(TerminalSafeText.escaped(text))' has a bad %-escape")
        }
        guard let decoded = String(validating: bytes, as: UTF8.self) else {
            throw ParseError(description: "'\(TerminalSafeText.escaped(text))' decodes to invalid UTF-8")
        }
        return decoded
    }
}

/// A template for `coffer inject`: literal text and `{{ REFERENCE }}` placeholders.
package struct SecretTemplate {
    /// One piece of the template.
    package enum Piece: Equatable {
        case literal(Range<Int>)
        case reference(SecretReference)
    }

    package var pieces: [Piece]

    /// Parses `bytes`. `{{` followed by optional blanks, a reference (coffer:// or coffer-inet://),
    /// optional blanks and `}}` is a placeholder; a `{{` whose content starts like one of the schemes
    /// (`coffer:` or `coffer-inet:`, any case) but does not parse, or is not closed on its line, is an
    /// error (a typo never passes through as text); any other `{{` (e.g. another template
    /// language's) is left alone. Extra braces before a placeholder stay literal: `{{{ coffer://a/b }}}`
    /// is `{`, the secret, `}`.
    package init(parsing bytes: [UInt8]) throws(SecretReference.ParseError) {
        pieces = []
        var literalStart = 0, i = 0
        let n = bytes.count
        while i + 1 < n {
            guard bytes[i] == UInt8(ascii: "{"), bytes[i + 1] == UInt8(ascii: "{") else { i += 1; continue }
            var j = i + 2
            while j < n, bytes[j] == UInt8(ascii: " ") || bytes[j] == UInt8(ascii: "\t") { j += 1 }
            let contentStart = j
            guard Self.looksLikeReference(bytes[contentStart..<n]) else {
                // One step, not two: in `{{{ coffer://…` the placeholder starts at the second brace.
                i += 1
                continue
            }
            var k = contentStart
            while k + 1 < n, !(bytes[k] == UInt8(ascii: "}") && bytes[k + 1] == UInt8(ascii: "}")), bytes[k] != UInt8(ascii: "\n") { k += 1 }
            guard k + 1 < n, bytes[k] == UInt8(ascii: "}") else {
                throw SecretReference.ParseError(description: "line \(Self.line(of: i, in: bytes)): '{{' is not closed by '}}' on its line")
            }
            var contentEnd = k
            while contentEnd > contentStart, bytes[contentEnd - 1] == UInt8(ascii: " ") || bytes[contentEnd - 1] == UInt8(ascii: "\t") { contentEnd -= 1 }
            guard let text = String(validating: bytes[contentStart..<contentEnd], as: UTF8.self) else {
                throw SecretReference.ParseError(description: "line \(Self.line(of: i, in: bytes)): the reference is not UTF-8")
            }
            let reference: SecretReference
            do { reference = try SecretReference(parsing: text) } catch {
                throw SecretReference.ParseError(description: "line \(Self.line(of: i, in: bytes)): \(error.description)")
            }
            if literalStart < i { pieces.append(.literal(literalStart..<i)) }
            pieces.append(.reference(reference))
            i = k + 2
            literalStart = i
        }
        if literalStart < n { pieces.append(.literal(literalStart..<n)) }
    }

    /// The distinct references, in order of first use.
    package var references: [SecretReference] {
        var seen: [SecretReference] = []
        for case .reference(let r) in pieces where !seen.contains(r) { seen.append(r) }
        return seen
    }

    /// Whether a placeholder's content is meant as a Coffer reference: it starts with `coffer:` or
    /// `coffer-inet:` in any case, so `{{ COFFER://x }}` or `{{ coffer:/x }}` is an error, not text.
    private static func looksLikeReference(_ rest: ArraySlice<UInt8>) -> Bool {
        let lowered = rest.prefix(SecretReference.internetScheme.utf8.count).map { $0 | ($0 >= 0x41 && $0 <= 0x5A ? 0x20 : 0) }
        return lowered.starts(with: "coffer:".utf8) || lowered.starts(with: "coffer-inet:".utf8)
    }

    private static func line(of offset: Int, in bytes: [UInt8]) -> Int {
        1 + bytes[..<offset].reduce(0) { $0 + ($1 == UInt8(ascii: "\n") ? 1 : 0) }
    }
}
