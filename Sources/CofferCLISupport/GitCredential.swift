package import CofferCrypto
package import CofferModel

/// git's credential-helper protocol (git-credential(1), gitcredentials(7)) and how
/// `git-credential-coffer` keeps a credential in the keychain. Pure: no agent, no I/O.
///
/// ## The protocol
/// git writes `key=value` lines on the helper's standard input, ended by a blank line or end of
/// input: `protocol`, `host` (with `:PORT` when the URL has one), `path` (only with
/// `credential.useHttpPath`, or for protocols such as `cert`), `username`, `password`, and from newer
/// git `password_expiry_utc`, `oauth_refresh_token`, `wwwauth[]`, `capability[]`; a `url=` line
/// stands for the fields of its URL. Unknown keys are ignored unread, as git specifies (their values
/// may be any bytes). A value this helper uses may not hold a NUL, and one that is not a secret must
/// be UTF-8 (a keychain attribute is text); a request that breaks this is answered with nothing. `get` answers with `username=` and `password=` lines (and the
/// expiry and refresh token when stored); anything else it prints, git ignores.
///
/// ## The item (format 1)
/// One internet-password item per credential: `ptcl` = protocol (Apple's code where it has one that
/// differs from git's name: `https` → `htps`, `imaps` → `imps`, `pop3s` → `pops`, `ldaps` → `ldps`,
/// as macOS's git-credential-osxkeychain stores them; others as git names them), `srvr` = host without the port,
/// `port` = the port when the URL has one, `path` = the path when git sends one, `acct` = username,
/// `labl` = `git: PROTOCOL://USER@HOST[:PORT][/PATH]`, `desc` = `git credential`, and `icmt` =
/// `password_expiry_utc=SECONDS` when git gave an expiry. The secret is the password's bytes; when
/// git gave an OAuth refresh token, a NUL byte and the token follow (a git password cannot hold a
/// NUL, so the split is unambiguous, and an item without a token holds exactly the password that
/// `coffer get --server HOST` prints).
///
/// ## Matching (as git-credential-store does)
/// A field the request names must equal the item's; a field it leaves out matches anything — except
/// the port: when the request names a host, the item's port must be the request's (`host` and
/// `host:8080` are different servers, as they are to git's own helpers) — and the host: a request
/// without one matches only items stored without one (git always sends a host for a URL that has
/// one; other programs speak this protocol too, and `protocol=https` alone must not return the
/// newest password of any server, as git-credential-store's would). A `get` never returns an
/// expired password.
package struct GitCredential {
    package var `protocol`: String?
    /// The host without its port.
    package var host: String?
    package var port: Int64?
    package var path: String?
    package var username: String?
    package var password: SecureBytes?
    package var passwordExpiryUTC: Int64?
    package var oauthRefreshToken: SecureBytes?

    package init() {}

    /// A request this helper cannot serve: a NUL in a field it uses, invalid UTF-8 in one that is
    /// not a secret, a `url=` git would not understand.
    package struct ParseError: Error, CustomStringConvertible {
        package let description: String
    }

    /// The largest request read: a secret's limit and room for the other fields.
    package static let maximumInputBytes = 1 << 20

    /// The keys this helper reads; every other key (`wwwauth[]`, `capability[]`, `quit`, …) is skipped unread.
    private enum Field {
        case `protocol`, host, path, username, password, passwordExpiryUTC, oauthRefreshToken, url

        /// The key as git spells it.
        var name: String {
            switch self {
            case .protocol: "protocol"
            case .host: "host"
            case .path: "path"
            case .username: "username"
            case .password: "password"
            case .passwordExpiryUTC: "password_expiry_utc"
            case .oauthRefreshToken: "oauth_refresh_token"
            case .url: "url"
            }
        }

        /// The field `key` names; nil for a key this helper does not read. Compared byte for byte, not
        /// looked up in a `Set<[UInt8]>`: in a static binary the first use of such a set builds its
        /// generic metadata at run time, which cost `git-credential-coffer get` more than the rest of
        /// the parse (callgrind, docs/PERFORMANCE.md).
        init?(_ key: UnsafeRawBufferPointer) {
            func named(_ field: Field) -> Bool {
                let name = field.name.utf8
                return name.count == key.count && name.elementsEqual(key)
            }
            // (A chain, not a search through an array of the cases: that array's type is generic too.)
            if named(.protocol) { self = .protocol } else if named(.host) { self = .host } else if named(.path) { self = .path }
            else if named(.username) { self = .username } else if named(.password) { self = .password }
            else if named(.passwordExpiryUTC) { self = .passwordExpiryUTC } else if named(.oauthRefreshToken) { self = .oauthRefreshToken }
            else if named(.url) { self = .url } else { return nil }
        }
    }

    /// Parses git's `key=value` lines (up to a blank line or the end). Secrets never leave secure
    /// memory; a field given twice keeps its last value, as git does.
    package init(parsing input: SecureBytes) throws(ParseError) {
        self.init()
        var failure: ParseError?
        input.withUnsafeBytes { bytes in
            var start = 0
            while start < bytes.count {
                var end = start
                while end < bytes.count && bytes[end] != 0x0A { end += 1 }
                defer { start = end + 1 }
                // git's strbuf_getline takes a CR before the LF off too (a request from Windows tools).
                let stop = end > start && bytes[end - 1] == 0x0D ? end - 1 : end
                if stop == start { break }                       // a blank line ends the request
                let line = UnsafeRawBufferPointer(rebasing: bytes[start..<stop])
                guard let eq = line.firstIndex(of: UInt8(ascii: "=")) else { continue }   // git ignores such lines too
                // Only the fields this helper uses are checked: git passes other values (a server's
                // wwwauth[] realm in Latin-1, say) byte for byte, and they are none of our business.
                guard let field = Field(UnsafeRawBufferPointer(rebasing: line[..<eq])) else { continue }
                let name = field.name
                let value = UnsafeRawBufferPointer(rebasing: line[(eq + 1)...])
                guard !value.contains(0) else { failure = ParseError(description: "the value of \(name) holds a NUL byte"); return }
                if field == .password {
                    password = SecureBytes(copying: value)
                    continue
                }
                if field == .oauthRefreshToken {
                    oauthRefreshToken = SecureBytes(copying: value)
                    continue
                }
                if field == .url {
                    // git's credential_from_url: the URL's fields replace every earlier one. Parsed
                    // from the bytes, so a password in the URL never becomes an ordinary string.
                    guard let url = Self.fields(ofURL: value) else {
                        failure = ParseError(description: "url= is not a URL git understands, or not UTF-8")
                        return
                    }
                    password?.wipe()
                    oauthRefreshToken?.wipe()
                    (password, oauthRefreshToken, passwordExpiryUTC) = (nil, nil, nil)
                    self.protocol = url.protocol
                    (host, port, path, username) = (url.host, url.port, url.path, url.username)
                    continue
                }
                // A username or host that is not UTF-8 cannot name a keychain item (its attributes are
                // text): such a request is answered with nothing, and git asks the person.
                guard let text = String(validating: value, as: UTF8.self) else {
                    failure = ParseError(description: "the value of \(name) is not UTF-8")
                    return
                }
                switch field {
                case .protocol: self.protocol = text
                case .host: (host, port) = Self.splitHost(text)
                case .path: path = text
                case .username: username = text
                case .passwordExpiryUTC: passwordExpiryUTC = Int64(text)
                case .password, .oauthRefreshToken, .url: break
                }
            }
        }
        if let failure { throw failure }
    }

    /// `example.com:8080` → (`example.com`, 8080); `[::1]:22` → (`[::1]`, 22); a host without a
    /// numeric port stays whole, and so does an IPv6 address without brackets (`::1`, `fe80::2`: its
    /// last group is no port).
    package static func splitHost(_ text: String) -> (host: String, port: Int64?) {
        let u = Array(text.utf8)
        guard let colon = u.lastIndex(of: UInt8(ascii: ":")), colon + 1 < u.count,
              u[..<colon].contains(UInt8(ascii: "["))
                ? u[colon - 1] == UInt8(ascii: "]")
                : !u[..<colon].contains(UInt8(ascii: ":")),
              u[(colon + 1)...].allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), u.count - colon - 1 <= 5,
              let port = Int64(String(decoding: u[(colon + 1)...], as: UTF8.self)), port > 0, port <= 65535 else {
            return (text, nil)
        }
        return (String(decoding: u[..<colon], as: UTF8.self), port)
    }

    /// The fields of `scheme://[user[:password]@]host[:port][/path]`, split and %-decoded as git's
    /// `credential_from_url` does: the host ends at the first `/`, `?` or `#`; userinfo is used only
    /// when its `@` comes before that; the path loses its leading and trailing slashes; a `%` not
    /// followed by two hex digits stays as it is. The password in a URL is skipped, never copied: it
    /// does not go into the keychain from there. nil without `://`, or if a part is not UTF-8.
    static func fields(ofURL url: UnsafeRawBufferPointer) -> (protocol: String, host: String?, port: Int64?, path: String?, username: String?)? {
        guard let protoEnd = (0..<url.count).first(where: { url[$0] == UInt8(ascii: ":") && $0 + 2 < url.count
                                                            && url[$0 + 1] == UInt8(ascii: "/") && url[$0 + 2] == UInt8(ascii: "/") }),
              protoEnd > 0, let scheme = String(validating: url[..<protoEnd], as: UTF8.self) else { return nil }
        let cp = protoEnd + 3
        let slash = (cp..<url.count).first { [UInt8(ascii: "/"), UInt8(ascii: "?"), UInt8(ascii: "#")].contains(url[$0]) } ?? url.count
        let at = (cp..<url.count).first { url[$0] == UInt8(ascii: "@") }
        let colon = (cp..<url.count).first { url[$0] == UInt8(ascii: ":") }
        var username: String?
        var hostStart = cp
        if let at, at < slash {
            let userEnd = if let colon, colon < at { colon } else { at }
            guard let user = Self.gitURLDecoded(url[cp..<userEnd]) else { return nil }
            username = user
            hostStart = at + 1
        }
        guard let hostText = Self.gitURLDecoded(url[hostStart..<slash]) else { return nil }
        var pathStart = slash
        while pathStart < url.count, url[pathStart] == UInt8(ascii: "/") { pathStart += 1 }
        var path: String?
        if pathStart < url.count {
            guard var p = Self.gitURLDecoded(url[pathStart...]) else { return nil }
            while p.count > 1, p.hasSuffix("/") { p.removeLast() }
            path = p
        }
        if hostText.isEmpty { return (scheme, nil, nil, path, username) }
        let (host, port) = splitHost(hostText)
        return (scheme, host, port, path, username)
    }

    /// git's url_decode: `%XX` becomes its byte, any other `%` stays; nil if the result is not UTF-8.
    private static func gitURLDecoded(_ bytes: UnsafeRawBufferPointer.SubSequence) -> String? {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = bytes.startIndex
        while i < bytes.endIndex {
            if bytes[i] == UInt8(ascii: "%"), i + 2 < bytes.endIndex,
               let hi = Hex.digitValue(bytes[i + 1]), let lo = Hex.digitValue(bytes[i + 2]) {
                out.append(hi << 4 | lo)
                i += 3
            } else {
                out.append(bytes[i])
                i += 1
            }
        }
        return String(validating: out, as: UTF8.self)
    }

    // MARK: The keychain side

    /// What `get` and `erase` ask the keychain for (the port is checked by ``matches(_:)``).
    package var queryAttributes: Attributes {
        var a: Attributes = [:]
        if let p = self.protocol { a["ptcl"] = .string(InternetProtocol.keychainCode(p)) }
        if let h = host { a["srvr"] = .string(h) }
        if let p = path { a["path"] = .string(p) }
        if let u = username { a["acct"] = .string(u) }
        return a
    }

    /// True if a stored item (its attributes) answers this request: the fields the keychain was
    /// asked for matched already; this checks the port, which "no port" must match exactly, and the
    /// host: a request without one matches only items without one (a `cert` path, say), never the
    /// password of whatever host was stored last.
    package func matches(_ item: Attributes) -> Bool {
        guard host != nil else {
            if case .string(let server)? = item["srvr"], !server.isEmpty { return false }
            return true
        }
        let stored: Int64? = if case .integer(let p)? = item["port"], p != 0 { p } else { nil }
        return stored == port
    }

    /// True if `item` is the exact credential this request names (same protocol, host, port, path
    /// and username, a missing path or port matching only a missing one): the one `store` replaces.
    package func isSame(_ item: Attributes) -> Bool {
        func string(_ key: String) -> String? { if case .string(let s)? = item[key] { s } else { nil } }
        return matches(item) && string("ptcl") == self.protocol.map(InternetProtocol.keychainCode) && string("srvr") == host
            && (string("path") ?? "") == (path ?? "") && string("acct") == username
    }

    /// The expiry stored with an item (seconds since 1970, UTC), if any.
    package static func expiry(of item: Attributes) -> Int64? {
        guard case .string(let comment)? = item["icmt"] else { return nil }
        let prefix = "password_expiry_utc="
        guard comment.hasPrefix(prefix) else { return nil }
        return Int64(comment.dropFirst(prefix.count))
    }

    /// Why `store` keeps nothing: git's own helpers need a protocol, a host or a path, a username
    /// and a password.
    package var isStorable: Bool {
        self.protocol != nil && (host != nil || path != nil) && username != nil && password != nil
    }

    /// True if `value` is false as git reads a boolean variable such as `GIT_TERMINAL_PROMPT`
    /// (git_parse_maybe_bool): empty, `false`, `no` or `off` in any case, or an integer that is 0
    /// (`0`, `00`, `-0`). Anything else, a word git would refuse included, leaves prompts on.
    package static func isFalse(_ value: String) -> Bool {
        if value.isEmpty || ["false", "no", "off"].contains(value.lowercased()) { return true }
        var digits = Substring(value)
        if digits.first == "+" || digits.first == "-" { digits = digits.dropFirst() }
        return !digits.isEmpty && digits.allSatisfy { $0 == "0" }
    }

    /// True if the request names something to erase (a blank one would mean "everything", which git's
    /// store helper refuses as too easy to send by accident).
    package var isErasable: Bool {
        self.protocol != nil || host != nil || path != nil || username != nil
    }

    /// The attributes of the item `store` writes.
    package var itemAttributes: Attributes {
        var a = queryAttributes
        if let port { a["port"] = .integer(port) }
        a["desc"] = .string("git credential")
        a["labl"] = .string("git: " + displayURL)
        a["icmt"] = .string(passwordExpiryUTC.map { "password_expiry_utc=\($0)" } ?? "")
        return a
    }

    /// `PROTOCOL://USER@HOST:PORT/PATH`, for the label.
    var displayURL: String {
        var s = (self.protocol ?? "") + "://"
        if let username, !username.isEmpty { s += username + "@" }
        s += host ?? ""
        if let port { s += ":\(port)" }
        if let path { s += "/" + path }
        return s
    }

    /// The secret `store` writes: the password, then a NUL and the refresh token if there is one.
    package func encodedSecret() -> SecureBytes? {
        guard let password else { return nil }
        guard let token = oauthRefreshToken, token.count > 0 else { return password.withUnsafeBytes { SecureBytes(copying: $0) } }
        let out = SecureBytes(count: password.count + 1 + token.count)
        out.withUnsafeMutableBytes { o in
            password.withUnsafeBytes { o.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
            o[password.count] = 0
            token.withUnsafeBytes { (o.baseAddress! + password.count + 1).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        }
        return out
    }

    /// True if `item` was stored by this helper (format 1: `desc` = `git credential`), so a NUL in its
    /// secret separates the refresh token. An internet password made another way (`coffer add
    /// --server`) is a password only, NULs and all.
    package static func isGitFormat(_ item: Attributes) -> Bool {
        if case .string("git credential")? = item["desc"] { true } else { false }
    }

    /// Splits a stored secret into the password and the refresh token (if any); a secret not in this
    /// helper's format (`gitFormat` false) is all password.
    package static func decodeSecret(_ secret: SecureBytes, gitFormat: Bool = true) -> (password: SecureBytes, refreshToken: SecureBytes?) {
        secret.withUnsafeBytes { b in
            guard gitFormat, let nul = b.firstIndex(of: 0) else { return (SecureBytes(copying: b), nil) }
            return (SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[..<nul])),
                    SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[(nul + 1)...])))
        }
    }

    /// True if `username` can be written into git's protocol: a line break would end the value and
    /// start a field of the item's choosing (`host=`, `url=`, …), which git's own writers refuse.
    package static func isWritable(username: String) -> Bool {
        !username.utf8.contains(0x0A) && !username.utf8.contains(0)
    }

    /// `get`'s answer: `username=`, `password=`, and the expiry and refresh token when stored, in
    /// secure memory. nil if a value holds a line break or a NUL (or the username does): an item
    /// stored another way (`coffer add`, `gitFormat` false) could otherwise inject fields into git's
    /// protocol, or have git keep only the part of its password before the NUL.
    package static func answer(username: String, secret: SecureBytes, expiry: Int64?, gitFormat: Bool = true) -> SecureBytes? {
        let (password, token) = decodeSecret(secret, gitFormat: gitFormat)
        defer { password.wipe(); token?.wipe() }
        func unsafeForGit(_ value: SecureBytes) -> Bool { value.withUnsafeBytes { $0.contains(0x0A) || $0.contains(0) } }
        let breaks = unsafeForGit(password) || (token.map(unsafeForGit) ?? false)
        guard isWritable(username: username), !breaks else { return nil }
        var head = Array("username=\(username)\npassword=".utf8)
        let expiryLine = Array((expiry.map { "password_expiry_utc=\($0)\n" } ?? "").utf8)
        let tokenKey = Array("oauth_refresh_token=".utf8)
        let tokenCount = token.map { tokenKey.count + $0.count + 1 } ?? 0
        let out = SecureBytes(count: head.count + password.count + 1 + expiryLine.count + tokenCount)
        out.withUnsafeMutableBytes { o in
            var n = 0
            func put(_ b: UnsafeRawBufferPointer) {
                guard b.count > 0 else { return }
                (o.baseAddress! + n).copyMemory(from: b.baseAddress!, byteCount: b.count)
                n += b.count
            }
            head.withUnsafeBytes { put($0) }
            password.withUnsafeBytes { put($0) }
            o[n] = 0x0A; n += 1
            expiryLine.withUnsafeBytes { put($0) }
            if let token {
                tokenKey.withUnsafeBytes { put($0) }
                token.withUnsafeBytes { put($0) }
                o[n] = 0x0A; n += 1
            }
        }
        head.removeAll()
        return out
    }
}
