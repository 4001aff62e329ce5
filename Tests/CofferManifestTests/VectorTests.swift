import CofferCrypto
@testable import CofferManifest
import Testing

/// Checks every ```manifest-vector block of ManifestFormat.md.
@Suite struct ManifestVectorTests {
    @Test func theSpecHasVectorsOfEveryOutcome() {
        #expect(manifestVectors.count >= 20)
        let kinds = Set(manifestVectors.map { $0.outcome.split(separator: " ").first.map(String.init) ?? "" })
        #expect(kinds == ["ok", "too-large", "malformed", "untrusted", "bad-signature"])
        #expect(Set(manifestVectors.map(\.name)).count == manifestVectors.count, "vector names must be unique")
    }

    /// Every problem the parser can report has at least one vector.
    @Test func everyProblemHasAVector() {
        let named = Set(manifestVectors.compactMap { v -> String? in
            let parts = v.outcome.split(separator: " ")
            guard parts.first == "malformed", parts.count >= 3 else { return nil }
            return String(parts[2])
        })
        #expect(named == ["bad-header", "unsupported-version", "missing-newline", "empty-line", "carriage-return",
                          "control-character", "not-utf8", "trailing-space", "expected-field", "missing-field",
                          "bad-separator", "bad-value", "duplicate-access-group", "too-many-access-groups",
                          "trailing-data", "duplicate-entitlement"])
        let fields = Set(manifestVectors.compactMap { v -> String? in
            let parts = v.outcome.split(separator: " ")
            guard parts.count == 4, parts[2] == "bad-value" else { return nil }
            return String(parts[3])
        })
        #expect(fields == Set(ManifestField.allCases.map(\.rawValue)))
    }

    /// The display form is robust against editors: well-formed escapes, no raw trailing spaces,
    /// no raw control or bidirectional characters.
    @Test(arguments: manifestVectors)
    func displayLinesAreClean(_ v: ManifestVector) {
        #expect(unescape(v.display) != nil, "bad escape")
        for line in v.display {
            #expect(!line.hasSuffix(" "), "raw trailing space")
            #expect(!line.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F || Syntax.isForbiddenScalar($0) },
                    "raw control character")
        }
    }

    @Test(arguments: manifestVectors)
    func vector(_ v: ManifestVector) throws {
        let words = v.outcome.split(separator: " ").map(String.init)
        let parsed: Manifest
        do {
            parsed = try Manifest.parse(v.bytes)
        } catch {
            switch error {
            case .tooLarge(let n):
                #expect(v.outcome == "too-large")
                #expect(n == v.bytes.count && n > Manifest.maximumBytes)
            case .malformed(let line, let problem):
                #expect(v.outcome == "malformed \(line) \(problem.code)")
                // Messages name lines and fields, never values (every value in the vectors says "example").
                #expect(!error.description.contains("example") && !error.description.contains("abc"))
            default:
                Issue.record("parse threw \(error)")
            }
            return
        }
        #expect(words[0] != "malformed" && words[0] != "too-large", "parsed, expected \(v.outcome)")
        #expect(parsed.encoded() == v.bytes, "not canonical: re-encoding differs")
        #expect(try Manifest.parse(parsed.encoded()) == parsed)
        do {
            try parsed.verify(trusting: Keys.trustedSet)
            #expect(v.outcome == "ok")
        } catch {
            #expect(error == (v.outcome == "untrusted" ? .untrustedSigner : .badSignature), "\(error)")
            #expect(v.outcome == "untrusted" || v.outcome == "bad-signature")
        }
    }

    /// Ed25519 is deterministic: libsodium signing the fields of each `ok` vector reproduces it (the
    /// vectors were made with another implementation).
    @Test(arguments: manifestVectors.filter { $0.outcome == "ok" })
    func signingReproducesOkVectors(_ v: ManifestVector) throws {
        let m = try Manifest.parse(v.bytes)
        let again = try Manifest.sign(app: m.app, executable: m.executable, executableSHA256: m.executableSHA256,
                                      accessGroups: m.accessGroups, entitlements: m.entitlements, secretKey: Keys.trusted.secretKey)
        #expect(again.encoded() == v.bytes)
        #expect(m.executableSHA256 == abcDigest)
    }

    /// Every proper prefix of a valid manifest fails with a typed error naming a line within it.
    @Test func everyTruncationIsACleanError() {
        for v in manifestVectors where v.outcome == "ok" {
            for cut in 0..<v.bytes.count {
                let prefix = Array(v.bytes[0..<cut])
                do {
                    _ = try Manifest.parse(prefix)
                    Issue.record("\(v.name): prefix of \(cut) bytes parsed")
                } catch {
                    guard case .malformed(let line, _) = error else { Issue.record("\(error)"); continue }
                    #expect(line >= 1 && line <= prefix.count(where: { $0 == 0x0A }) + 1)
                }
            }
        }
    }

    /// The keys the spec prints are the ones its seeds derive.
    @Test func theSpecsKeysMatchTheirSeeds() {
        #expect(specText.contains(hex(Keys.trusted.publicKey)))
        #expect(specText.contains(hex(Keys.untrusted.publicKey)))
        #expect(hex(Keys.trusted.publicKey) == "8a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c")
    }
}
