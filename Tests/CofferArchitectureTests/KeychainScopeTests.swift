import Foundation
import Testing

/// The keychain's item methods take the caller's access scope with no default (issue #25): a call
/// that forgets it does not compile, instead of quietly running unrestricted. Tests and offline tools
/// pass `.unrestricted` on purpose, where it can be seen.
@Suite struct KeychainScopeTests {
    /// Every parameter in `text` that is a scope (named `scope` or of type `AccessScope`) and has a
    /// default value, as `line N: declaration`. Comments, and `let`/`var` declarations, are not parameters.
    static func defaultedScopes(in text: String) -> [String] {
        // A parameter declaration `label name: Type = default`, at a line's start or after `(` or `,`;
        // group 1 is the label (or `let`/`var`), 2 the name, 3 the type.
        let parameter = try! Regex(#"(?:^|[(,])\s*(?:(\w+)\s+)?(\w+)\s*:\s*([\w.]+[?!]?)\s*=(?!=)"#)
        var found: [String] = []
        for (n, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.range(of: "//").map { raw[..<$0.lowerBound] } ?? raw
            for m in line.matches(of: parameter) {
                let label = m.output[1].substring.map(String.init)
                if label == "let" || label == "var" || label == "case" { continue }
                guard let name = m.output[2].substring, let type = m.output[3].substring else { continue }
                if name == "scope" || type.hasPrefix("AccessScope") {
                    found.append("line \(n + 1): \(line.trimmingCharacters(in: .whitespaces))")
                }
            }
        }
        return found
    }

    @Test func keychainScopeParametersHaveNoDefault() {
        let files = DocumentedNamesTests.files(under: "Sources/CofferKeychain", ending: ".swift")
        #expect(files.count > 5, "could not list Sources/CofferKeychain")
        for file in files {
            for hit in Self.defaultedScopes(in: DocumentedNamesTests.read(file)) {
                Issue.record("\((file as NSString).lastPathComponent) \(hit): a keychain method's scope must have no default (callers pass theirs, or .unrestricted on purpose)")
            }
        }
    }

    /// The scan itself: a defaulted scope is found inline and on a signature's continuation line;
    /// a scope without a default, a local variable and a comment are not.
    @Test func theScanFindsDefaultedScopes() {
        #expect(Self.defaultedScopes(in: "public func add(_ item: NewItem, scope: AccessScope = .unrestricted) {").count == 1)
        #expect(Self.defaultedScopes(in: "func f(_ q: ItemQuery,\n    in scope: AccessScope = .unrestricted,\n    x: Int = 0)")
            == ["line 2: in scope: AccessScope = .unrestricted,"])
        #expect(Self.defaultedScopes(in: "func f(_ s: AccessScope? = nil)").count == 1)
        #expect(Self.defaultedScopes(in: "func f(_ q: ItemQuery, scope: AccessScope, limit: Int = 1)").isEmpty)
        #expect(Self.defaultedScopes(in: "    let scope: AccessScope = .unrestricted\n    var scope: AccessScope = x").isEmpty)
        #expect(Self.defaultedScopes(in: "/// `scope: AccessScope = .unrestricted` was the old default").isEmpty)
    }
}
