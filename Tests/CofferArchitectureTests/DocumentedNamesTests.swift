import Foundation
import Testing

/// The docs name what the code has: every Swift type a README, ARCHITECTURE.md, a page of docs/ or a DocC article puts in code format,
/// and every config key it documents, still exists. A rename that leaves a doc behind (the agent's
/// `AttemptSchedule` was once another type, and two articles kept the old name) fails here.
@Suite struct DocumentedNamesTests {
    static let root = PackageGraphTests.root.path

    /// Names in code format that are not Coffer's and need not exist in the sources, each with why.
    static let foreignNames: [String: String] = [
        "FileProtectionType": "Apple's Foundation type, whose classes Coffer's protected directories follow",
        "FileManager": "Foundation's class (the Security module's file protection methods extend it)",
        "Data": "Foundation's type (the Security module's writeProtected(to:) extends it)",
        "NSOSStatusErrorDomain": "the NSError domain of Apple's Security errors",
        "Synchronization": "the Swift standard library module (`Synchronization.Mutex`)",
        "TracerPid": "a field of /proc/PID/status",
        "VmLck": "a field of /proc/PID/status",
        // The Secret Service front end's docs name D-Bus members, errors and credentials.
        "AccessDenied": "a D-Bus error name (org.freedesktop.DBus.Error.AccessDenied)",
        "GetConnectionCredentials": "a D-Bus method of the bus daemon",
        "InvalidArgs": "a D-Bus error name (org.freedesktop.DBus.Error.InvalidArgs)",
        "LimitsExceeded": "a D-Bus error name (org.freedesktop.DBus.Error.LimitsExceeded)",
        "NameOwnerChanged": "a D-Bus signal of the bus daemon",
        "NoSession": "a Secret Service error name (org.freedesktop.Secret.Error.NoSession)",
        "NotSupported": "a D-Bus error name (org.freedesktop.DBus.Error.NotSupported)",
        "ProcessFD": "a key of GetConnectionCredentials' answer",
        "ProcessID": "a key of GetConnectionCredentials' answer",
        "UnknownMethod": "a D-Bus error name (org.freedesktop.DBus.Error.UnknownMethod)",
        // Where the agent's dialogs appear (issue #41, F1): a property systemd-logind reports.
        "RuntimePath": "a property of systemd-logind's user object (loginctl show-user)",
    ]

    /// `x = y` spans that are not config lines, each with why.
    static let notConfigKeys: [String: String] = [
        "key": "the placeholder in \"`key = value` lines\"",
        "h": "a formula in ItemFormat.md (the blind index)",
        "pk": "a formula in ItemFormat.md (the primary-key hash)",
        "sync": "a SecItem attribute (`sync = true` is refused)",
    ]

    /// The README files, ARCHITECTURE.md, every page of docs/ and every DocC article.
    static func documents() -> [String] {
        var docs = ["README.md", "Plugins/README.md", "contrib/pam.d/README.md", "ARCHITECTURE.md"].map { root + "/" + $0 }
        docs += guides()
        for file in files(under: "Sources", ending: ".md") where file.contains(".docc/") { docs.append(file) }
        return docs
    }

    /// The pages of docs/ (issue #42: what the README's sections became), sorted.
    static func guides() -> [String] { files(under: "docs", ending: ".md").sorted() }

    /// Files under `dir` (relative to the package root) whose names end in `suffix`.
    static func files(under dir: String, ending suffix: String) -> [String] {
        let base = root + "/" + dir
        guard let e = FileManager.default.enumerator(atPath: base) else { return [] }
        return e.compactMap { $0 as? String }.filter { $0.hasSuffix(suffix) }.map { base + "/" + $0 }
    }

    static func read(_ path: String) -> String { (try? String(contentsOfFile: path, encoding: .utf8)) ?? "" }

    /// A document's text without its fenced code blocks (shell sessions and examples, not prose).
    static func prose(_ text: String) -> String {
        var out: [Substring] = [], fenced = false
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.trimmingCharacters(in: .whitespaces).hasPrefix("```") { fenced.toggle(); continue }
            if !fenced { out.append(line) }
        }
        return out.joined(separator: "\n")
    }

    /// Code spans: ``Symbol/links`` (DocC, `symbol: true`) and `code`.
    static func codeSpans(_ text: String) -> [(text: String, symbol: Bool)] {
        let pattern = try! Regex(#"``([^`]+)``|`([^`\n]+)`"#)
        return text.matches(of: pattern).compactMap { m in
            if let s = m.output[1].substring { return (String(s), true) }
            if let s = m.output[2].substring { return (String(s), false) }
            return nil
        }
    }

    /// The Swift type names a span names: every capitalised path component of a DocC symbol link;
    /// in plain code, an UpperCamelCase name (two capitals or more: `AccessGate`, `SecureBytes`), or a
    /// capitalised name used with a member or a call (`Pipeline.handle(_:session:)`, `Agent.start`).
    /// File names (`Package.swift`) are not types.
    static func typeNames(in span: (text: String, symbol: Bool)) -> [String] {
        if span.symbol {
            return span.text.split(whereSeparator: { "/.(".contains($0) }).map(String.init).filter { $0.first?.isUppercase == true }
                .map { String($0.prefix { $0.isLetter || $0.isNumber || $0 == "_" }) }
        }
        guard let m = span.text.wholeMatch(of: try! Regex(#"([A-Z][A-Za-z0-9]*)((?:[.(<].*)?)"#)),
              let head = m.output[1].substring.map(String.init), let rest = m.output[2].substring else { return [] }
        guard head.contains(where: \.isLowercase), !span.text.contains(try! Regex(#"\.(swift|md|h|c|so|json|log|txt)$"#)) else { return [] }
        let camel = head.filter(\.isUppercase).count >= 2
        return camel || rest.hasPrefix(".") || rest.hasPrefix("(") ? [head] : []
    }

    /// Every type, module, target and test suite the package has: declarations in Sources/ and Tests/,
    /// the module, plugin and fuzz-target directories, and the names Package.swift quotes.
    static func knownNames() throws -> Set<String> {
        var known = Set<String>()
        let decl = try Regex(#"\b(?:struct|class|enum|protocol|actor|typealias)\s+([A-Za-z_][A-Za-z0-9_]*)"#)
        for file in files(under: "Sources", ending: ".swift") + files(under: "Tests", ending: ".swift") {
            for m in read(file).matches(of: decl) { if let n = m.output[1].substring { known.insert(String(n)) } }
        }
        for dir in ["Sources", "Tests", "Plugins", "contrib/fuzz/Sources"] {
            known.formUnion(try FileManager.default.contentsOfDirectory(atPath: root + "/" + dir))
        }
        for m in read(root + "/Package.swift").matches(of: try Regex(#""([A-Za-z0-9_]+)""#)) {
            if let n = m.output[1].substring { known.insert(String(n)) }
        }
        return known
    }

    /// The keys the config file parsers accept: the agent's (`case "key":` at the top level of
    /// `AgentConfiguration.apply`'s `switch key`), pinentry-coffer's (`key == "…"`) and the Secret
    /// Service front end's (`static let …Key = "…"` in SecretServiceSettings).
    static func configKeys() throws -> Set<String> {
        let agent = read(root + "/Sources/CofferAgent/AgentConfiguration.swift")
        let start = try #require(agent.range(of: "switch key {"), "AgentConfiguration no longer switches over the key")
        var keys = Set<String>(), depth = 1
        let literal = try Regex(#""([a-z0-9-]+)""#)
        for line in agent[start.upperBound...].split(separator: "\n") {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if depth == 1, trimmed.hasPrefix("case "), let colon = trimmed.firstIndex(of: ":") {
                for m in trimmed[..<colon].matches(of: literal) { if let k = m.output[1].substring { keys.insert(String(k)) } }
            }
            depth += line.filter { $0 == "{" }.count - line.filter { $0 == "}" }.count
            if depth <= 0 { break }
        }
        // The trust store's keys, which the agent's switch hands to TrustSettings.
        let trust = read(root + "/Sources/CofferTrust/TrustSettings.swift")
        let trustKeys = try #require(trust.firstMatch(of: try Regex(#"static let keys = \[([^\]]*)\]"#))?.output[1].substring)
        for m in trustKeys.matches(of: literal) { if let k = m.output[1].substring { keys.insert(String(k)) } }
        let pinentry = read(root + "/Sources/pinentry-coffer/Configuration.swift")
        for m in pinentry.matches(of: try Regex(#"key == "([a-z0-9-]+)""#)) { if let k = m.output[1].substring { keys.insert(String(k)) } }
        let secretService = read(root + "/Sources/CofferSecretService/SecretServiceSettings.swift")
        for m in secretService.matches(of: try Regex(#"static let \w+Key = "([a-z0-9-]+)""#)) { if let k = m.output[1].substring { keys.insert(String(k)) } }
        return keys
    }

    /// Config keys a document names: `key = value` spans, the first column of a table headed
    /// "config key", and the `(key)` of a table headed "flag (config key)".
    static func documentedKeys(_ text: String) -> [String] {
        var keys: [String] = []
        for span in codeSpans(text) where !span.symbol {
            if let m = span.text.prefixMatch(of: try! Regex(#"([a-z][a-z0-9]*(?:-[a-z0-9]+)*) = "#)), let k = m.output[1].substring {
                keys.append(String(k))
            }
        }
        var table: String? = nil
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            guard line.hasPrefix("|") else { table = nil; continue }
            let first = line.split(separator: "|", omittingEmptySubsequences: false).dropFirst().first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
            if table == nil { table = first; continue }
            guard table == "config key" || table == "flag (config key)", !first.hasPrefix("---") else { continue }
            let spans = codeSpans(first).map(\.text)
            if table == "config key" {
                keys += spans
            } else if let m = first.firstMatch(of: try! Regex(#"\(`([a-z0-9-]+)`\)"#)), let k = m.output[1].substring {
                keys.append(String(k))
            }
        }
        return keys
    }

    /// Every name `extract` finds in the documents' prose exists (or is in `allowed`); at least
    /// `minimum` different names are found (else the extraction broke); and every `allowed` entry is
    /// still documented and still not a real name, so the list stays honest.
    static func checkDocumented(_ what: String, minimum: Int, allowed: [String: String], exists: (String) -> Bool,
                                extract: (String) -> [(name: String, shown: String)]) {
        var seen = Set<String>(), missing: [String] = []
        for doc in documents() {
            for (name, shown) in extract(prose(read(doc))) {
                seen.insert(name)
                if !exists(name) && allowed[name] == nil { missing.append("\(doc.dropFirst(root.count + 1)): \(shown) names the \(what) \(name), which no longer exists") }
            }
        }
        #expect(missing.isEmpty, "\(missing.joined(separator: "\n"))")
        #expect(seen.count >= minimum, "only \(seen.count) \(what) names found: the extraction is broken")
        for name in allowed.keys.sorted() {
            #expect(seen.contains(name) && !exists(name), "\(name) need not be allowed any more")
        }
    }

    @Test func everyDocumentedTypeExists() throws {
        let known = try knownNamesChecked()
        Self.checkDocumented("type", minimum: 100, allowed: Self.foreignNames, exists: known.contains) { text in
            Self.codeSpans(text).flatMap { span in Self.typeNames(in: span).map { ($0, "`\(span.text)`") } }
        }
    }

    @Test func everyDocumentedConfigKeyExists() throws {
        let accepted = try Self.configKeys()
        #expect(accepted.isSuperset(of: ["socket", "unlock-delays", "erase-after", "biometry", "pinentry", "save"]), "\(accepted.sorted())")
        #expect(!accepted.contains("off") && !accepted.contains("yes"), "values were taken for keys: \(accepted.sorted())")
        Self.checkDocumented("config key", minimum: 15, allowed: Self.notConfigKeys, exists: accepted.contains) { text in
            Self.documentedKeys(text).map { ($0, "a config line") }
        }
    }

    /// The extraction itself, on the sentence that went stale.
    @Test func aStaleTypeNameIsFound() throws {
        let spans = Self.codeSpans("through `UnlockService` (a `PasscodeVerifier` and a pure `RetryThrottle`); ``Agent/start()``, `Package.swift`, `Always`")
        let names = spans.flatMap { Self.typeNames(in: $0) }
        #expect(names == ["UnlockService", "PasscodeVerifier", "RetryThrottle", "Agent"], "\(names)")
        let known = try knownNamesChecked()
        #expect(!known.contains("RetryThrottle") && known.contains("AttemptSchedule") && known.contains("FailedAttempts"))
    }

    /// The README stays a front page (issue #42): what grows goes into docs/.
    @Test func theReadmeIsAFrontPage() throws {
        let text = Self.read(Self.root + "/README.md")
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).count - (text.hasSuffix("\n") ? 1 : 0)
        #expect(lines > 0, "README.md was not found under \(Self.root)")
        #expect(lines <= 220, "README.md has \(lines) lines (at most 220): move sections into docs/ and link them")
        for page in ["docs/INSTALL.md", "docs/TESTING.md", "docs/PERFORMANCE.md", "docs/cli.md", "ARCHITECTURE.md"] {
            #expect(FileManager.default.fileExists(atPath: Self.root + "/" + page), "\(page) is missing")
        }
    }

    /// The relative links of `text`'s prose (fenced blocks and code spans left out): the part before
    /// any `#`, for every `[text](target)` whose target is not a URL (`http:`, `https:`, `mailto:`) or a bare `#anchor`.
    static func relativeLinks(_ text: String) -> [String] {
        prose(text).replacing(try! Regex(#"``[^`]+``|`[^`\n]+`"#), with: "").matches(of: try! Regex(#"\]\(<?([^)\s>]+)>?(?:\s+"[^"]*")?\)"#)).compactMap { m in
            guard let target = m.output[1].substring.map(String.init) else { return nil }
            if target.hasPrefix("http://") || target.hasPrefix("https://") || target.hasPrefix("mailto:") || target.hasPrefix("#") { return nil }
            return String(target.prefix { $0 != "#" })
        }
    }

    /// Every relative link of the README, ARCHITECTURE.md and docs/ points to a file or directory that
    /// exists (anchors are not checked, only the file part), so moving a section cannot strand a link.
    @Test func everyRelativeLinkResolves() throws {
        let pages = [Self.root + "/README.md", Self.root + "/ARCHITECTURE.md"] + Self.guides()
        #expect(Self.guides().count >= 14, "only \(Self.guides().count) pages under docs/")
        var broken: [String] = [], checked = 0
        for page in pages {
            let dir = (page as NSString).deletingLastPathComponent
            for target in Self.relativeLinks(Self.read(page)) {
                checked += 1
                let resolved = ((dir as NSString).appendingPathComponent(target) as NSString).standardizingPath
                if !FileManager.default.fileExists(atPath: resolved) {
                    broken.append("\(page.dropFirst(Self.root.count + 1)): (\(target)) points to \(resolved), which does not exist")
                }
            }
        }
        #expect(broken.isEmpty, "\(broken.joined(separator: "\n"))")
        #expect(checked >= 40, "only \(checked) relative links found: the extraction is broken")
    }

    /// The link extraction itself.
    @Test func relativeLinksAreExtracted() {
        let text = "[a](docs/cli.md) [b](https://example.org/x.md) [c](../Sources/X.md#part) [d](#local) `[e](code.md)`\n```\n[f](fenced.md)\n```\n[g](<tpm.md> \"TPM\")"
        #expect(Self.relativeLinks(text) == ["docs/cli.md", "../Sources/X.md", "tpm.md"], "\(Self.relativeLinks(text))")
    }

    func knownNamesChecked() throws -> Set<String> {
        let known = try Self.knownNames()
        #expect(known.contains("AgentConfiguration") && known.contains("CofferAgent"), "the sources were not found under \(Self.root)")
        return known
    }
}
