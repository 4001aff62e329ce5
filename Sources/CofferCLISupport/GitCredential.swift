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
/// stands for the fields of its URL. Unknown keys are ignored, as git specifies. A value may not hold
/// a NUL (git refuses one too). `get` answers with `username=` and `password=` lines (and the
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
/// `host:8080` are different servers, as they are to git's own helpers). A `get` never returns an
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

    /// Input git's protocol refuses (a NUL, invalid UTF-8 in a field that is not a secret, input
    /// larger than ``maximumInputBytes``).
    package struct ParseError: Error, CustomStringConvertible {
        package let description: String
    }

    /// The largest request read: a secret's limit and room for the other fields.
    package static let maximumInputBytes = 1 << 20

    /// The keys whose values are secrets, kept in secure memory.
    private static let password = Array("password".utf8), refreshToken = Array("oauth_refresh_token".utf8)

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
                if end == start { break }                        // a blank line ends the request
                let line = UnsafeRawBufferPointer(rebasing: bytes[start..<end])
                guard !line.contains(0) else { failure = ParseError(description: "a line holds a NUL byte"); return }
                guard let eq = line.firstIndex(of: UInt8(ascii: "=")) else { continue }   // git ignores such lines too
                let key = Array(line[..<eq])
                let value = UnsafeRawBufferPointer(rebasing: line[(eq + 1)...])
                if key == Self.password {
                    password = SecureBytes(copying: value)
                    continue
                }
                if key == Self.refreshToken {
                    oauthRefreshToken = SecureBytes(copying: value)
                    continue
                }
                guard let text = String(validating: value, as: UTF8.self) else {
                    failure = ParseError(description: "the value of \(String(decoding: key, as: UTF8.self)) is not UTF-8")
                    return
                }
                switch String(decoding: key, as: UTF8.self) {
                case "protocol": self.protocol = text
                case "host": (host, port) = Self.splitHost(text)
                case "path": path = text
                case "username": username = text
                case "password_expiry_utc": passwordExpiryUTC = Int64(text)
                case "url":
                    guard let url = Self.fields(ofURL: text) else { failure = ParseError(description: "url= is not a URL git understands"); return }
                    self.protocol = url.protocol
                    (host, port, path) = (url.host, url.port, url.path)
                    if let user = url.username { username = user }
                default: break                                    // wwwauth[], capability[], quit, … are not ours
                }
            }
        }
        if let failure { throw failure }
    }

    /// `example.com:8080` → (`example.com`, 8080); `[::1]:22` → (`[::1]`, 22); a host without a
    /// numeric port stays whole.
    package static func splitHost(_ text: String) -> (host: String, port: Int64?) {
        let u = Array(text.utf8)
        guard let colon = u.lastIndex(of: UInt8(ascii: ":")), colon + 1 < u.count,
              !u[..<colon].contains(UInt8(ascii: "[")) || u[colon - 1] == UInt8(ascii: "]"),
              u[(colon + 1)...].allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), u.count - colon - 1 <= 5,
              let port = Int64(String(decoding: u[(colon + 1)...], as: UTF8.self)), port > 0, port <= 65535 else {
            return (text, nil)
        }
        return (String(decoding: u[..<colon], as: UTF8.self), port)
    }

    /// The fields of `scheme://[user[:password]@]host[:port][/path]`, %-decoded as git decodes them
    /// (a password in the URL is dropped: it never goes into the keychain from there).
    static func fields(ofURL text: String) -> (protocol: String, host: String?, port: Int64?, path: String?, username: String?)? {
        let u = Array(text.utf8)
        guard let colon = u.firstIndex(of: UInt8(ascii: ":")), colon > 0, u.count >= colon + 3,
              u[colon + 1] == UInt8(ascii: "/"), u[colon + 2] == UInt8(ascii: "/") else { return nil }
        let scheme = String(decoding: u[..<colon], as: UTF8.self)
        var rest = u[(colon + 3)...]
        var path: String?
        if let slash = rest.firstIndex(of: UInt8(ascii: "/")) {
            let p = rest[(slash + 1)...]
            if !p.isEmpty {
                guard let decoded = Hex.percentDecoded(p) else { return nil }
                path = decoded
            }
            rest = rest[..<slash]
        }
        var username: String?
        if let at = rest.lastIndex(of: UInt8(ascii: "@")) {
            let userinfo = rest[..<at]
            let user = userinfo.firstIndex(of: UInt8(ascii: ":")).map { userinfo[..<$0] } ?? userinfo
            guard let decoded = Hex.percentDecoded(user) else { return nil }
            username = decoded
            rest = rest[(at + 1)...]
        }
        guard let hostText = Hex.percentDecoded(rest) else { return nil }
        if hostText.isEmpty { return (scheme, nil, nil, path, username) }
        let (host, port) = splitHost(hostText)
        return (scheme, host, port, path, username)
    }

    // MARK: The keychain side

    /// What `get` and `erase` ask the keychain for (the port is checked by ``matches(_:)``).
    package var queryAttributes: Attributes {
        var a: Attributes = [:]
        if let p = self.protocol { a["ptcl"] = .string(Self.keychainProtocol(p)) }
        if let h = host { a["srvr"] = .string(h) }
        if let p = path { a["path"] = .string(p) }
        if let u = username { a["acct"] = .string(u) }
        return a
    }

    /// The `ptcl` value for git's protocol name (kSecAttrProtocolHTTPS is `htps`, and so on).
    package static func keychainProtocol(_ git: String) -> String {
        switch git {
        case "https": "htps"
        case "imaps": "imps"
        case "pop3s": "pops"
        case "ldaps": "ldps"
        default: git
        }
    }

    /// True if a stored item (its attributes) answers this request: the fields the keychain was
    /// asked for matched already; this checks the port, which "no port" must match exactly.
    package func matches(_ item: Attributes) -> Bool {
        guard host != nil else { return true }
        let stored: Int64? = if case .integer(let p)? = item["port"], p != 0 { p } else { nil }
        return stored == port
    }

    /// True if `item` is the exact credential this request names (same protocol, host, port, path
    /// and username, a missing path or port matching only a missing one): the one `store` replaces.
    package func isSame(_ item: Attributes) -> Bool {
        func string(_ key: String) -> String? { if case .string(let s)? = item[key] { s } else { nil } }
        return matches(item) && string("ptcl") == self.protocol.map(Self.keychainProtocol) && string("srvr") == host
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

    /// Splits a stored secret into the password and the refresh token (if any).
    package static func decodeSecret(_ secret: SecureBytes) -> (password: SecureBytes, refreshToken: SecureBytes?) {
        secret.withUnsafeBytes { b in
            guard let nul = b.firstIndex(of: 0) else { return (SecureBytes(copying: b), nil) }
            return (SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[..<nul])),
                    SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[(nul + 1)...])))
        }
    }

    /// `get`'s answer: `username=`, `password=`, and the expiry and refresh token when stored, in
    /// secure memory.
    package static func answer(username: String, secret: SecureBytes, expiry: Int64?) -> SecureBytes {
        let (password, token) = decodeSecret(secret)
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
        password.wipe()
        token?.wipe()
        head.removeAll()
        return out
    }
}
