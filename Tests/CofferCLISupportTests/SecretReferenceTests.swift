import CofferCLISupport
import CofferCrypto
import CofferModel
import Testing

@Suite struct SecretReferenceTests {
    @Test func genericForms() throws {
        let r = try SecretReference(parsing: "coffer://github/me")
        #expect(r.itemClass == .genericPassword)
        #expect(r.attributes == ["svce": .string("github"), "acct": .string("me")])
        #expect(try SecretReference(parsing: "coffer://github").attributes == ["svce": .string("github")])
        #expect(try SecretReference(parsing: "github/me", allowBare: true).attributes == r.attributes)
        #expect(try SecretReference(parsing: "coffer://a%2Fb/c%40d%25?group=team").attributes
                == ["svce": .string("a/b"), "acct": .string("c@d%"), "agrp": .string("team")])
    }

    @Test func internetForms() throws {
        let r = try SecretReference(parsing: "coffer-inet://bob@git.example.com:8443/org/repo.git?protocol=https")
        #expect(r.itemClass == .internetPassword)
        #expect(r.attributes == ["srvr": .string("git.example.com"), "acct": .string("bob"), "port": .integer(8443),
                                 "path": .string("org/repo.git"), "ptcl": .string("htps")], "https is stored as Apple's code htps, as git-credential-coffer does")
        #expect(try SecretReference(parsing: "coffer-inet://host").attributes == ["srvr": .string("host")])
        // An account may hold an @ (the last one separates it from the server).
        #expect(try SecretReference(parsing: "coffer-inet://me@corp@host").attributes == ["srvr": .string("host"), "acct": .string("me@corp")])
    }

    @Test(arguments: ["", "coffer://", "coffer:///me", "coffer://svc/", "coffer://a/b/c", "coffer://a%zz", "coffer://a%FF",
                      "coffer://a?group=", "coffer://a?colour=red", "coffer://a?group=x&group=y", "coffer-inet://",
                      "coffer-inet://@host", "coffer-inet://host:0", "coffer-inet://host:99999", "coffer-inet://host:http",
                      "https://host/x", "github/me"])
    func refuses(_ text: String) {
        #expect(throws: SecretReference.ParseError.self) { try SecretReference(parsing: text) }
    }

    @Test func bareOnlyWhereAllowed() {
        #expect(throws: SecretReference.ParseError.self) { try SecretReference(parsing: "svc/acct") }
        #expect(throws: SecretReference.ParseError.self) { try SecretReference(parsing: "https://x/y", allowBare: true) }
    }

    /// The template with each placeholder shown as `<reference>`.
    private static func rendered(_ t: SecretTemplate, _ text: String) -> String {
        var rebuilt = ""
        for piece in t.pieces {
            switch piece {
            case .literal(let r): rebuilt += String(decoding: Array(text.utf8)[r], as: UTF8.self)
            case .reference(let ref): rebuilt += "<\(ref.text)>"
            }
        }
        return rebuilt
    }

    @Test func templatePieces() throws {
        let text = "user={{ coffer://db/admin }}\npass={{coffer://db/admin}} x={{ other }} {{ coffer-inet://h/p }}{"
        let t = try SecretTemplate(parsing: Array(text.utf8))
        #expect(t.references.map(\.text) == ["coffer://db/admin", "coffer-inet://h/p"])
        #expect(Self.rendered(t, text) == "user=<coffer://db/admin>\npass=<coffer://db/admin> x={{ other }} <coffer-inet://h/p>{")
    }

    /// A run of braces before a placeholder never hides it (an odd run once skipped the real `{{`).
    @Test(arguments: [("{{{ coffer://db/admin }}}", "{<coffer://db/admin>}"), ("x{{{coffer://db/admin}}", "x{<coffer://db/admin>"),
                      ("{{{{{ coffer://db/admin }}", "{{{<coffer://db/admin>"), ("{{{{ coffer://db/admin }}", "{{<coffer://db/admin>")])
    func extraBracesStayLiteral(_ text: String, _ expected: String) throws {
        #expect(Self.rendered(try SecretTemplate(parsing: Array(text.utf8)), text) == expected)
    }

    @Test(arguments: ["a {{ coffer://db/admin", "a {{ coffer://db/admin\n}}", "{{ coffer://db/a/b }}", "{{ coffer:// }}",
                      "{{ COFFER://db/admin }}", "{{ coffer:/db/admin }}", "{{ Coffer-Inet://h/p }}", "{{{ coffer:db }}}"])
    func templateRefuses(_ text: String) {
        #expect(throws: SecretReference.ParseError.self) { try SecretTemplate(parsing: Array(text.utf8)) }
    }

    @Test func templateWithoutReferences() throws {
        #expect(try SecretTemplate(parsing: []).pieces.isEmpty)
        #expect(try SecretTemplate(parsing: Array("{{ x }}".utf8)).references.isEmpty)
    }
}

@Suite struct SecretFormatTests {
    private func secret(_ bytes: [UInt8]) -> SecureBytes { bytes.withUnsafeBytes { SecureBytes(copying: $0) } }
    private func text(_ s: SecureBytes) -> String { s.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }

    @Test func json() throws {
        let s = secret(Array("a\"b\\c\nd\u{7}é\u{202E}".utf8))
        #expect(text(try SecretFormat.json(prefix: "{", secret: s, suffix: "}")) == "{\"a\\\"b\\\\c\\nd\\u0007é\\u202e\"}")
        #expect(throws: SecretFormat.Failure.notUTF8) { try SecretFormat.json(prefix: "", secret: secret([0xC3, 0x28]), suffix: "") }
        #expect(throws: SecretFormat.Failure.notUTF8) { try SecretFormat.json(prefix: "", secret: secret([0xED, 0xA0, 0x80]), suffix: "") }
        #expect(throws: SecretFormat.Failure.notUTF8) { try SecretFormat.json(prefix: "", secret: secret([0xC0, 0x80]), suffix: "") }
        #expect(text(SecretFormat.hexJSON(prefix: "", secret: secret([0x00, 0xFF]), suffix: "")) == "\"00ff\"")
    }

    @Test func shell() throws {
        #expect(text(try SecretFormat.shellAssignment(name: "T", secret: secret(Array("it's $x\n".utf8)))) == "T='it'\\''s $x\n'\n")
        #expect(throws: SecretFormat.Failure.containsNUL) { try SecretFormat.shellAssignment(name: "T", secret: secret([0x61, 0])) }
        #expect(throws: SecretFormat.Failure.containsNUL) { try SecretFormat.environmentEntry(name: "T", secret: secret([0])) }
        #expect(text(try SecretFormat.environmentEntry(name: "T", secret: secret([0x61]))) == "T=a\0")
    }

    @Test func names() {
        #expect(SecretFormat.isVariableName("GITHUB_TOKEN") && SecretFormat.isVariableName("_x1"))
        #expect(!SecretFormat.isVariableName("1X") && !SecretFormat.isVariableName("") && !SecretFormat.isVariableName("A-B"))
        #expect(SecretFormat.variableName(from: "api.github.com") == "API_GITHUB_COM")
        #expect(SecretFormat.variableName(from: "9lives") == "_9LIVES")
        #expect(SecretFormat.variableName(from: "") == "_")
    }
}
