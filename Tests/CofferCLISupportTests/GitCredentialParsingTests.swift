import CofferCLISupport
import CofferCrypto
import CofferModel
import Testing

/// git's credential protocol as `git-credential-coffer` reads it, and the item it keeps (pure parts).
@Suite struct GitCredentialParsingTests {
    static func parse(_ text: String) throws -> GitCredential {
        var bytes = Array(text.utf8)
        return try GitCredential(parsing: SecureBytes(consuming: &bytes))
    }

    static func text(_ s: SecureBytes?) -> String? { s.map { $0.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } } }

    @Test func fieldsGitSends() throws {
        let c = try Self.parse("protocol=https\nhost=git.example.com:8443\npath=org/repo.git\nusername=alice\npassword=p=w\n"
                               + "password_expiry_utc=1700000000\noauth_refresh_token=tok\nwwwauth[]=Basic realm=\"x\"\ncapability[]=authtype\n"
                               + "future_key=1\nno equals sign\n\nusername=after-the-blank-line\n")
        #expect(c.protocol == "https" && c.host == "git.example.com" && c.port == 8443 && c.path == "org/repo.git")
        #expect(c.username == "alice" && Self.text(c.password) == "p=w" && c.passwordExpiryUTC == 1_700_000_000)
        #expect(Self.text(c.oauthRefreshToken) == "tok")
        #expect(c.queryAttributes == ["ptcl": .string("htps"), "srvr": .string("git.example.com"), "path": .string("org/repo.git"),
                                      "acct": .string("alice")])
        #expect(c.itemAttributes["port"] == .integer(8443) && c.itemAttributes["labl"] == .string("git: https://alice@git.example.com:8443/org/repo.git"))
        #expect(c.itemAttributes["icmt"] == .string("password_expiry_utc=1700000000"))
    }

    @Test func urlLinesAndEmptyUsernames() throws {
        var c = try Self.parse("url=https://bob%40corp:secret@[::1]:8080/a%20b.git\n")
        #expect(c.protocol == "https" && c.host == "[::1]" && c.port == 8080 && c.path == "a b.git" && c.username == "bob@corp")
        #expect(c.password == nil, "a password in a URL never becomes the stored one")
        c = try Self.parse("url=https://example.com\n")
        #expect(c.host == "example.com" && c.path == nil && c.username == nil)
        c = try Self.parse("protocol=https\nhost=example.com\nusername=\npassword=x\n")
        #expect(c.username == "" && c.isStorable)
        #expect(throws: GitCredential.ParseError.self) { try Self.parse("url=not a url\n") }
    }

    /// url= as git's credential_from_url reads it.
    @Test func urlAsGitSplitsIt() throws {
        // Every earlier field goes, the password and token too (wiped).
        var c = try Self.parse("username=x\npassword=old\noauth_refresh_token=t\npath=p\nurl=https://h.example\n")
        #expect(c.host == "h.example" && c.username == nil && c.password == nil && c.oauthRefreshToken == nil && c.path == nil)
        // Leading and trailing slashes leave the path; ? and # end the host.
        c = try Self.parse("url=https://h.example//org/repo.git//\n")
        #expect(c.host == "h.example" && c.path == "org/repo.git")
        c = try Self.parse("url=https://h.example?x=1\n")
        #expect(c.host == "h.example" && c.path == "?x=1")
        c = try Self.parse("url=https://h.example#frag\n")
        #expect(c.host == "h.example")
        // The first @ ends the userinfo, and only before the path; a stray % stays.
        c = try Self.parse("url=https://a@b@h.example/x@y\n")
        #expect(c.username == "a" && c.host == "b@h.example" && c.path == "x@y")
        c = try Self.parse("url=https://h.example/100%/a%2Fb\n")
        #expect(c.path == "100%/a/b")
        c = try Self.parse("url=https://u:p%ZZ@h.example:8443\n")
        #expect(c.username == "u" && c.password == nil && c.host == "h.example" && c.port == 8443)
    }

    @Test func answerNeverCarriesALineBreak() {
        func answer(_ user: String, _ secret: String) -> String? {
            var b = Array(secret.utf8)
            return Self.text(GitCredential.answer(username: user, secret: SecureBytes(consuming: &b), expiry: nil))
        }
        #expect(answer("u", "pw") == "username=u\npassword=pw\n")
        #expect(answer("u", "pw\u{0}tok") == "username=u\npassword=pw\noauth_refresh_token=tok\n")
        #expect(answer("u", "pw\nhost=evil") == nil)
        #expect(answer("u", "pw\u{0}tok\nurl=x") == nil)
        #expect(answer("u\nhost=evil", "pw") == nil)
        #expect(answer("u\u{0}", "pw") == nil)
        #expect(answer("u", "pw\r") == "username=u\npassword=pw\r\n", "a CR is the password's own")
    }

    /// An internet password made another way (`coffer add --server`) is all password: a NUL in it is
    /// no refresh-token separator, and such a secret is not handed to git (which would keep only the
    /// part before the NUL).
    @Test func onlyTheHelpersOwnItemsCarryARefreshToken() {
        #expect(GitCredential.isGitFormat(["desc": .string("git credential")]))
        #expect(!GitCredential.isGitFormat([:]) && !GitCredential.isGitFormat(["desc": .string("a note")]))
        var b = Array("pw\u{0}tail".utf8)
        let secret = SecureBytes(consuming: &b)
        #expect(Self.text(GitCredential.answer(username: "u", secret: secret, expiry: nil, gitFormat: false)) == nil)
        let whole = GitCredential.decodeSecret(secret, gitFormat: false)
        #expect(whole.refreshToken == nil && whole.password.withUnsafeBytes { Array($0) } == Array("pw\u{0}tail".utf8))
        var p = Array("plain".utf8)
        #expect(Self.text(GitCredential.answer(username: "u", secret: SecureBytes(consuming: &p), expiry: nil, gitFormat: false))
                == "username=u\npassword=plain\n")
    }

    /// git's strbuf_getline drops a CR before each LF, so a request with CRLF lines (a Windows tool
    /// feeding `git credential`) means what it says, and a CRLF blank line ends it.
    @Test func crlfLinesReadAsGitReadsThem() throws {
        let c = try Self.parse("protocol=https\r\nhost=example.com\r\nusername=alice\r\npassword=pw\r\n\r\nhost=after\n")
        #expect(c.protocol == "https" && c.host == "example.com" && c.username == "alice" && Self.text(c.password) == "pw")
        // Only one CR goes, as in git.
        #expect(Self.text(try Self.parse("password=pw\r\r\n").password) == "pw\r")
    }

    /// GIT_TERMINAL_PROMPT read as git reads it: an empty value is false too.
    @Test func terminalPromptValuesAsGitReadsThem() {
        for v in ["", "0", "00", "-0", "+0", "false", "FALSE", "No", "off"] { #expect(GitCredential.isFalse(v), "\(v)") }
        for v in ["1", "true", "yes", "on", "10", "-", "maybe"] { #expect(!GitCredential.isFalse(v), "\(v)") }
    }

    /// Protocol names the way people write them reach the codes git-credential-coffer stores.
    @Test func protocolNamesMapToKeychainCodes() {
        #expect(InternetProtocol.keychainCode("https") == "htps" && InternetProtocol.keychainCode("imaps") == "imps")
        #expect(InternetProtocol.keychainCode("htps") == "htps" && InternetProtocol.keychainCode("ssh") == "ssh")
        #expect(InternetProtocol.keychainCode("pop3s") == "pops" && InternetProtocol.keychainCode("ldaps") == "ldps")
    }

    @Test(arguments: [("example.com", "example.com", nil), ("example.com:22", "example.com", 22), ("[::1]", "[::1]", nil),
                      ("[::1]:443", "[::1]", 443), ("host:", "host:", nil), ("host:http", "host:http", nil), ("host:99999", "host:99999", nil),
                      ("host:0", "host:0", nil), ("::1", "::1", nil), ("fe80::2:443", "fe80::2:443", nil)] as [(String, String, Int64?)])
    func hostsAndPorts(_ text: String, _ host: String, _ port: Int64?) {
        let split = GitCredential.splitHost(text)
        #expect(split.host == host && split.port == port)
    }

    @Test func refusesOnlyWhatItCannotName() throws {
        #expect(throws: GitCredential.ParseError.self) { try Self.parse("host=a\u{0}b\n") }
        #expect(throws: GitCredential.ParseError.self) { try Self.parse("password=a\u{0}b\n") }
        #expect(throws: GitCredential.ParseError.self) {
            var bytes = Array("username=".utf8) + [0xFF, 0x0A]
            _ = try GitCredential(parsing: SecureBytes(consuming: &bytes))
        }
        // A password need not be UTF-8: it is bytes, kept as such.
        var bytes = Array("password=".utf8) + [0xFF, 0x0A]
        let c = try? GitCredential(parsing: SecureBytes(consuming: &bytes))
        #expect(c?.password?.withUnsafeBytes { Array($0) } == [0xFF])
        // Fields this helper does not use are skipped unread, whatever their bytes.
        var other = Array("protocol=https\nwwwauth[]=Basic realm=\"Caf".utf8) + [0xE9] + Array("\"\nfuture=a".utf8) + [0, 0xFF]
            + Array("\nhost=h\n".utf8)
        let d = try GitCredential(parsing: SecureBytes(consuming: &other))
        #expect(d.protocol == "https" && d.host == "h")
    }

    /// Only a key spelled exactly as git spells it is read (compared byte for byte): one differing in
    /// case, in length or in its last byte, or an empty one, is another field, skipped unread.
    @Test func onlyExactKeysAreRead() throws {
        let c = try Self.parse("Host=a\nhos=b\nhosts=c\nhosx=d\nusernames=e\npasswore=f\npassword_=f\nurl2=https://x/\nur=https://y/\n"
                               + "oauth_refresh_tokem=g\npassword_expiry_utx=5\npat=p\nPROTOCOL=http\n=h\nprotocol=https\nhost=h\n")
        #expect(c.protocol == "https" && c.host == "h" && c.port == nil && c.username == nil && c.password == nil)
        #expect(c.oauthRefreshToken == nil && c.passwordExpiryUTC == nil && c.path == nil)
    }

    @Test func storeAndEraseNeedSomethingToName() throws {
        #expect(try !Self.parse("protocol=https\nhost=h\npassword=p\n").isStorable, "no username")
        #expect(try !Self.parse("protocol=https\nhost=h\nusername=u\n").isStorable, "no password")
        #expect(try !Self.parse("host=h\nusername=u\npassword=p\n").isStorable, "no protocol")
        #expect(try Self.parse("protocol=cert\npath=/etc/cert.p12\nusername=u\npassword=p\n").isStorable, "a path stands for the host")
        // An empty username and password (single sign-on: t0303's "can store empty username").
        #expect(try Self.parse("protocol=https\nhost=sso.tld\nusername=\npassword=\n").isStorable)
        #expect(try !Self.parse("\n").isErasable && Self.parse("username=u\n").isErasable)
    }

    @Test func portMatchingAndSameCredential() throws {
        let noPort = try Self.parse("protocol=https\nhost=h\nusername=u\n")
        let withPort = try Self.parse("protocol=https\nhost=h:8443\nusername=u\n")
        let stored: Attributes = ["ptcl": .string("htps"), "srvr": .string("h"), "acct": .string("u")]
        var stored8443 = stored
        stored8443["port"] = .integer(8443)
        #expect(noPort.matches(stored) && !noPort.matches(stored8443))
        #expect(withPort.matches(stored8443) && !withPort.matches(stored))
        #expect(try !Self.parse("protocol=https\n").matches(stored8443), "no host: only credentials stored without one")
        #expect(noPort.isSame(stored) && !noPort.isSame(stored8443))
        var withPath = stored
        withPath["path"] = .string("repo.git")
        #expect(noPort.matches(withPath) && !noPort.isSame(withPath), "a path-less request matches a path item but is not the same one")
    }

    @Test func secretFormatOne() throws {
        let plain = try Self.parse("password=pw\n")
        #expect(Self.text(plain.encodedSecret()) == "pw")
        let withToken = try Self.parse("password=pw\noauth_refresh_token=rt\n")
        let encoded = try #require(withToken.encodedSecret())
        #expect(encoded.withUnsafeBytes { Array($0) } == Array("pw".utf8) + [0] + Array("rt".utf8))
        let decoded = GitCredential.decodeSecret(encoded)
        #expect(Self.text(decoded.password) == "pw" && Self.text(decoded.refreshToken) == "rt")
        let answer = GitCredential.answer(username: "u", secret: encoded, expiry: 42)
        #expect(Self.text(answer) == "username=u\npassword=pw\npassword_expiry_utc=42\noauth_refresh_token=rt\n")
        #expect(GitCredential.expiry(of: ["icmt": .string("password_expiry_utc=42")]) == 42)
        #expect(GitCredential.expiry(of: ["icmt": .string("a note")]) == nil)
    }
}
