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

    /// cofferd's modules that face clients: its front ends (the ssh-agent's, the native protocol's), the
    /// socket server they run on, the agent's own prompter and the composition (issue #42 split them
    /// out of CofferAgent). Every module named `…FrontEnd` must be listed (``everyFrontEndModuleIsSearched()``).
    static let cofferdModules = ["CofferAgent", "CofferAgentPrompt", "CofferNativeFrontEnd", "CofferSSHAgentFrontEnd", "CofferSocketServer"]

    /// The front ends' files and what they run on: they call the core, which keeps the grants.
    @Test func theFrontEndsOfCofferdKeepNoGrants() {
        var files: [String] = []
        for module in Self.cofferdModules {
            let found = DocumentedNamesTests.files(under: "Sources/" + module, ending: ".swift")
            #expect(!found.isEmpty, "could not list Sources/\(module)")
            files += found
        }
        #expect(files.contains { $0.hasSuffix("SSHAgentItemKeys.swift") } && files.contains { $0.hasSuffix("Pipeline.swift") })
        for file in files {
            for hit in Self.grantLines(in: DocumentedNamesTests.read(file)) {
                Issue.record("\((file as NSString).lastPathComponent) \(hit): grants are the core's (CallerSessions), not a front end's")
            }
        }
    }

    /// A new front-end module of cofferd is searched too: every module of `Sources` named `…FrontEnd`
    /// is in ``cofferdModules``.
    @Test func everyFrontEndModuleIsSearched() throws {
        let modules = try FileManager.default.contentsOfDirectory(atPath: DocumentedNamesTests.root + "/Sources")
        let frontEnds = modules.filter { $0.hasSuffix("FrontEnd") }
        #expect(!frontEnds.isEmpty, "could not list the front-end modules under Sources")
        for module in frontEnds where !Self.cofferdModules.contains(module) {
            Issue.record("Sources/\(module) is a front end: add it to FrontEndStateTests.cofferdModules")
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

    /// Issue #42: whether an item is locked is the agent's answer per match (locked away by reference,
    /// or needing the person), never the Secret Service front end's derivation from the item's
    /// protection class and the lock state (it had one, `isLocked`, until 2026-12-08): no file of the
    /// front end reads a class's availability.
    @Test func theSecretServiceFrontEndDerivesNoItemLockState() {
        let files = DocumentedNamesTests.files(under: "Sources/CofferSecretService", ending: ".swift")
        #expect(files.contains { $0.hasSuffix("SecretServiceRecords.swift") }, "could not list Sources/CofferSecretService")
        for file in files {
            for (n, raw) in DocumentedNamesTests.read(file).split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                let code = raw.range(of: "//").map { raw[..<$0.lowerBound] } ?? raw
                if code.contains(".availability") {
                    Issue.record("\((file as NSString).lastPathComponent) line \(n + 1): an item's lock state is the agent's answer, not derived from its class")
                }
            }
        }
    }

    /// Issue #43 and the third review's F1: where a prompt appears comes from the person's session
    /// (logind, `prompt-display`), never from a caller's environment, which any process of the user
    /// can set (and a client like Chromium rewrites). No module reads another process's
    /// `/proc/PID/environ` (the last reader, unused since, went on 2026-12-07).
    @Test func noModuleReadsAnotherProcesssEnvironment() {
        let files = DocumentedNamesTests.files(under: "Sources", ending: ".swift")
            + DocumentedNamesTests.files(under: "Sources", ending: ".c")
        #expect(files.count > 100, "could not list Sources")
        for file in files {
            for (n, raw) in DocumentedNamesTests.read(file).split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                let code = raw.range(of: "//").map { raw[..<$0.lowerBound] } ?? raw
                if code.contains("/environ") {
                    Issue.record("\((file as NSString).lastPathComponent) line \(n + 1): reads a process's environment: a prompt's display is the session's")
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
