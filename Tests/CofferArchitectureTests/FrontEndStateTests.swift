import Foundation
import Testing

/// Issue #42: the decision "is this the same caller, may it reuse an authentication" is the core's
/// (`CallerSessions` in CofferService). A front end keeps no grant of its own: none of its files names
/// the core's carried authorizations or keeps a table of them.
@Suite struct FrontEndStateTests {
    /// What holding a grant looks like in Swift source: the core's carried authorization, or a table
    /// of reuse grants.
    static let grantState = ["CarriedAuthorization", "carriedAuthorization(", "SignatureReuse", "CallerSessions("]

    /// The lines of `text` (comments dropped) that hold grant state, as `line N: text`.
    static func grantLines(in text: String) -> [String] {
        text.split(separator: "\n", omittingEmptySubsequences: false).enumerated().compactMap { n, raw in
            let code = raw.range(of: "//").map { raw[..<$0.lowerBound] } ?? raw
            return grantState.contains { code.contains($0) } ? "line \(n + 1): \(code.trimmingCharacters(in: .whitespaces))" : nil
        }
    }

    /// The ssh-agent front end's files and the native front end's (cofferd's CofferAgent module):
    /// they call the core, which keeps the grants.
    @Test func theFrontEndsOfCofferdKeepNoGrants() {
        let files = DocumentedNamesTests.files(under: "Sources/CofferAgent", ending: ".swift")
        #expect(files.count > 10, "could not list Sources/CofferAgent")
        #expect(files.contains { $0.hasSuffix("SSHAgentItemKeys.swift") })
        for file in files {
            for hit in Self.grantLines(in: DocumentedNamesTests.read(file)) {
                Issue.record("\((file as NSString).lastPathComponent) \(hit): grants are the core's (CallerSessions), not a front end's")
            }
        }
    }

    /// What keeping a released secret looks like: a table of secrets a prompt read, kept for a sender
    /// until it asks (the Secret Service front end had one, 60 s per sender, until issue #42 moved the
    /// decision to the core's grants), or a timer to wipe them.
    static let releasedSecretState = ["ReleasedSecret", "releasedSecret", "released[", "releasedSecretSeconds", "SecretExpires"]

    /// The Secret Service front end (its own process) keeps no grant and no secret past its reply: a
    /// prompt's read is the agent's grant to the client's process (CallerSessions), and GetSecret reads
    /// through the agent as any read.
    @Test func theSecretServiceFrontEndKeepsNoGrantsAndNoReleasedSecrets() {
        let files = DocumentedNamesTests.files(under: "Sources/CofferSecretService", ending: ".swift")
        #expect(files.contains { $0.hasSuffix("SecretServiceObjects.swift") }, "could not list Sources/CofferSecretService")
        for file in files {
            let text = DocumentedNamesTests.read(file)
            let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
            for hit in Self.grantLines(in: text) {
                Issue.record("\((file as NSString).lastPathComponent) \(hit): grants are the core's (CallerSessions), not a front end's")
            }
            for (n, raw) in lines.enumerated() {
                let code = raw.range(of: "//").map { raw[..<$0.lowerBound] } ?? raw
                for word in Self.releasedSecretState where code.contains(word) {
                    Issue.record("\((file as NSString).lastPathComponent) line \(n + 1): \(word): a front end keeps no secret past its reply")
                }
            }
        }
    }

    /// The scan finds a table of grants and a carried authorization, not a comment.
    @Test func theScanFindsGrantState() {
        #expect(Self.grantLines(in: "let reuse = SSHSignatureReuse()").count == 1)
        #expect(Self.grantLines(in: "var carried: CallerContext.CarriedAuthorization?").count == 1)
        #expect(Self.grantLines(in: "// the core keeps CarriedAuthorization values").isEmpty)
    }
}
