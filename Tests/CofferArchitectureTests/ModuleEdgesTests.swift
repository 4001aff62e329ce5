import Foundation
import Testing

/// The architecture as an allow-list of edges (issue #42): each module names every module it may
/// depend on (declare in Package.swift or import), and nothing else. A new edge is a line in this
/// file, made on purpose and seen in review; an edge a module no longer uses must be taken out, so the
/// list stays the architecture as it is; a module without a row, or a row for a module that does not
/// exist, fails. ``PackageGraphTests/ranks`` still checks that every allowed edge points down (data
/// flows one way: front end → identity → policy → authentication → keychain → store).
@Suite struct ModuleEdgesTests {
    /// Every library and executable module, and what it may use (platform modules aside).
    static let allowed: [String: Set<String>] = [
        // C walls and the plain-C plugins: nothing of ours.
        "CCofferABI": [], "CCofferPlugin": [], "CFscrypt": [], "COpenSSL": [], "CPAM": [], "CSDBus": [], "CSQLite": [],
        "CSodium": [], "CSystemShims": [], "CTPM": [],
        "CofferPluginBiometricEmulator": ["CCofferPlugin"], "CofferPluginFprintd": ["CCofferPlugin"],
        "CofferPluginPasscode": ["CCofferPlugin"], "CofferPluginTest": ["CCofferPlugin"],
        // The POSIX layer and the crypto over libsodium.
        "CofferSystem": ["CSystemShims"],
        "CofferCrypto": ["CSodium", "CofferSystem"],
        // The model knows no processes or files.
        "CofferModel": ["CofferCrypto"],
        "CofferSSHKeys": ["COpenSSL", "CofferCrypto"],
        "CofferSecretServiceCrypto": ["COpenSSL", "CofferCrypto"],
        "CofferTPM": ["CTPM", "CofferCrypto", "CofferSystem"],
        // What the keychain is made of: the store sees rows and SQLite, never keys.
        "CofferStore": ["CSQLite", "CofferModel"],
        "CofferKeybag": ["CofferCrypto", "CofferModel", "CofferSystem", "CofferTPM"],
        "CofferFiles": ["CFscrypt", "CofferCrypto", "CofferModel"],
        "CofferKeychain": ["CofferCrypto", "CofferKeybag", "CofferModel", "CofferStore", "CofferSystem", "CofferTPM"],
        // Wire formats are bytes only: no processes, files or Foundation.
        "CofferProtocol": ["CofferCrypto", "CofferModel"],
        "CofferPluginProtocol": ["CofferCrypto", "CofferModel"],
        "CofferSSHAgentProtocol": ["CofferCrypto"],
        "CofferPAM": ["CPAM", "CofferCrypto"],
        "CofferManifest": ["CofferCrypto", "CofferModel", "CofferSystem"],
        // Policy decides from a caller identity alone: pure.
        "CofferPolicy": ["CofferModel"],
        "CofferAudit": ["CofferModel", "CofferSystem"],
        // The pinentry conversation serves the client and the agent alike: no wire.
        "CofferPrompt": ["CofferCrypto", "CofferModel", "CofferSystem"],
        "CofferSync": ["CofferCrypto", "CofferModel", "CofferSystem"],
        // Identity turns a process into a caller: manifests, no wire, no policy.
        "CofferTrust": ["CofferCrypto", "CofferManifest", "CofferModel", "CofferSystem"],
        "CofferIdentity": ["CofferManifest", "CofferModel", "CofferSystem"],
        "CofferPluginClient": ["CofferCrypto", "CofferPluginProtocol", "CofferSystem"],
        "CofferPluginHost": ["CCofferPlugin", "CofferCrypto", "CofferPluginProtocol", "CofferSystem"],
        "CofferClient": ["CofferCrypto", "CofferModel", "CofferPrompt", "CofferProtocol", "CofferSystem"],
        "CofferTestSupport": ["CofferCrypto", "CofferKeybag", "CofferModel"],
        // The protocol-free service core: no wire module, no front end, no client. (CofferPAM is here for
        // one conformance the review would move to composition.)
        "CofferService": ["CofferAudit", "CofferCrypto", "CofferFiles", "CofferIdentity", "CofferKeybag", "CofferKeychain", "CofferModel",
                          "CofferPAM", "CofferPolicy", "CofferSync", "CofferSystem", "Logging"],
        "CofferServiceTestSupport": ["CofferAudit", "CofferCrypto", "CofferKeybag", "CofferKeychain", "CofferModel", "CofferPolicy",
                                     "CofferService", "CofferSystem", "CofferTestSupport", "Logging"],
        // The fast CLI's support stays small: no Foundation, no argument parser.
        "CofferCLISupport": ["CofferClient", "CofferCrypto", "CofferModel", "CofferSystem"],
        // Front ends in processes of their own reach the agent through CofferClient only, never its wire.
        "CofferSecretService": ["CSDBus", "CofferClient", "CofferCrypto", "CofferModel", "CofferSecretServiceCrypto", "CofferSystem"],
        "CofferSecretPortal": ["CSDBus", "CofferClient", "CofferCrypto", "CofferModel", "CofferSystem"],
        "CofferImport": ["CofferClient", "CofferCrypto", "CofferModel", "CofferSystem"],
        "CofferSecretServiceImport": ["CSDBus", "CofferClient", "CofferCrypto", "CofferImport", "CofferModel",
                                      "CofferSecretServiceCrypto", "CofferSystem"],
        // Apple's API over the client library (keys made and used through the agent's wire and ssh-agent socket;
        // certificates parsed by OpenSSL behind the COpenSSL wall).
        "Security": ["COpenSSL", "CofferClient", "CofferCrypto", "CofferModel", "CofferProtocol", "CofferSSHAgentProtocol", "CofferSSHKeys", "CofferSystem"],
        "LocalAuthentication": ["CofferClient", "CofferCrypto", "CofferModel", "Security"],
        // The agent's socket server: listeners, connections, limits and the frame budget, no protocol of its own
        // (the frame budget is sized by the native protocol's largest frame; refusals are logged with the core's LogThrottle).
        "CofferSocketServer": ["CofferCrypto", "CofferModel", "CofferProtocol", "CofferSystem", "Logging"],
        // SSH keys as keychain items: attributes and stored forms, the wire codec's key types and the crypto layer's.
        "CofferSSHKeyItems": ["CofferCrypto", "CofferModel", "CofferSSHAgentProtocol", "CofferSSHKeys"],
        // The agent's own prompter: the pinentry as the core's channels; no wire, no socket.
        "CofferAgentPrompt": ["CofferModel", "CofferPrompt", "CofferService", "CofferSystem"],
        // The ssh-agent front end: its wire, the socket server, the core; never the native protocol or the composition.
        // (CofferKeychain: it reads whether a passcode is set through the core's keychain.)
        "CofferSSHAgentFrontEnd": ["CofferAgentPrompt", "CofferCrypto", "CofferKeychain", "CofferModel", "CofferPluginClient", "CofferPrompt",
                                   "CofferSSHAgentProtocol", "CofferSSHKeyItems", "CofferSSHKeys", "CofferService", "CofferSocketServer",
                                   "CofferSystem", "Logging"],
        // The native protocol's front end: its wire, the socket server, the core.
        "CofferNativeFrontEnd": ["CofferAgentPrompt", "CofferCrypto", "CofferIdentity", "CofferKeybag", "CofferKeychain", "CofferModel",
                                 "CofferPolicy", "CofferPrompt", "CofferProtocol", "CofferSSHAgentProtocol", "CofferSSHKeyItems", "CofferService",
                                 "CofferSocketServer", "CofferSystem", "Logging"],
        // The agent's composition: the core, the front ends and their listeners, the configuration, plugins, trust.
        "CofferAgent": ["CofferAgentPrompt", "CofferAudit", "CofferCrypto", "CofferIdentity", "CofferKeybag", "CofferKeychain", "CofferManifest",
                        "CofferModel", "CofferNativeFrontEnd", "CofferPAM", "CofferPluginClient", "CofferPluginProtocol", "CofferPolicy",
                        "CofferPrompt", "CofferSSHAgentFrontEnd", "CofferService", "CofferSocketServer", "CofferSystem", "CofferTrust", "Logging"],
        // Executables.
        "cofferd": ["ArgumentParser", "CofferAgent", "CofferKeybag"],
        "coffer": ["CofferCLISupport", "CofferClient", "CofferModel", "CofferSystem"],
        "coffer-cli": ["ArgumentParser", "CofferAudit", "CofferCLISupport", "CofferClient", "CofferCrypto", "CofferFiles", "CofferImport",
                       "CofferManifest", "CofferModel", "CofferProtocol", "CofferSSHAgentProtocol", "CofferSystem", "CofferTrust"],
        "coffer-bench": ["CofferCLISupport", "CofferClient", "CofferCrypto", "CofferIdentity", "CofferKeybag", "CofferKeychain", "CofferModel",
                         "CofferProtocol", "CofferSSHAgentProtocol", "CofferSync", "CofferSystem", "Security"],
        "coffer-plugin-host": ["CofferPluginHost", "CofferSystem"],
        "coffer-portal-secret": ["CofferSecretPortal"],
        "coffer-secret-service": ["CofferSecretService"],
        "coffer-secret-service-import": ["CofferCLISupport", "CofferClient", "CofferImport", "CofferModel", "CofferSecretServiceImport", "CofferSystem"],
        "git-credential-coffer": ["CofferCLISupport", "CofferClient", "CofferCrypto", "CofferModel", "CofferSystem"],
        "pinentry-coffer": ["CofferCLISupport", "CofferClient", "CofferCrypto", "CofferModel", "CofferPrompt", "CofferSystem"],
    ]

    /// Test targets that must stay off a layer: the service core's tests drive it without any wire or front end.
    static let testsKeptOff: [String: Set<String>] = [
        "CofferServiceTests": ["CofferProtocol", "CofferPluginProtocol", "CofferAgent", "CofferAgentPrompt", "CofferClient", "CofferNativeFrontEnd",
                               "CofferSSHAgentFrontEnd", "CofferSocketServer"],
    ]

    /// What is wrong with `targets` against `allowed`: one message per module without a row, per edge
    /// not allowed, per allowed edge no longer used, per row without a module.
    static func violations(_ targets: [PackageGraphTests.Target], allowed: [String: Set<String>],
                           uses: (PackageGraphTests.Target) -> Set<String>) -> [String] {
        var found: [String] = []
        let modules = targets.filter { !$0.isTestTarget }
        for t in modules {
            let used = uses(t).subtracting([t.name])
            guard let row = allowed[t.name] else {
                found.append("\(t.name) has no row in ModuleEdgesTests.allowed: list what it may use (\(used.sorted().joined(separator: ", ")))")
                continue
            }
            for m in used.subtracting(row).sorted() {
                found.append("\(t.name) uses \(m), which its row in ModuleEdgesTests.allowed does not allow")
            }
            for m in row.subtracting(used).sorted() {
                found.append("\(t.name) no longer uses \(m): take the edge out of its row in ModuleEdgesTests.allowed")
            }
        }
        let names = Set(modules.map(\.name))
        for name in Set(allowed.keys).subtracting(names).sorted() {
            found.append("ModuleEdgesTests.allowed has a row for \(name), which is no module of the package")
        }
        for t in targets where t.isTestTarget {
            for m in uses(t).intersection(testsKeptOff[t.name] ?? []).sorted() {
                found.append("\(t.name) uses \(m), which the tests of its layer must not")
            }
        }
        return found
    }

    static func uses(_ t: PackageGraphTests.Target) -> Set<String> {
        t.dependencies.union(PackageGraphTests.imports(of: t).keys).subtracting(PackageGraphTests.platform)
    }

    @Test func everyModuleUsesExactlyTheEdgesItsRowAllows() throws {
        let targets = try PackageGraphTests.targets()
        #expect(targets.count > 20, "could not read the package (swift package dump-package)")
        for v in Self.violations(targets, allowed: Self.allowed, uses: Self.uses) { Issue.record(Comment(rawValue: v)) }
    }

    /// Every allowed edge points to a lower rank: the list can grow only downwards.
    @Test func everyAllowedEdgePointsDown() {
        for (module, edges) in Self.allowed {
            guard let rank = PackageGraphTests.ranks[module] else { Issue.record("\(module) has no rank"); continue }
            for m in edges.sorted() {
                guard let r = PackageGraphTests.ranks[m] else { Issue.record("\(module) → \(m): \(m) has no rank"); continue }
                if r >= rank { Issue.record("\(module) (rank \(rank)) may use \(m) (rank \(r)): an edge must point down") }
            }
        }
    }

    /// The rules themselves: a module without a row, an edge not allowed, a stale edge, a row without a
    /// module, and a kept-off test edge are each reported; an exact row is not.
    @Test func theCheckCatchesEachKindOfMistake() {
        func t(_ name: String, test: Bool = false) -> PackageGraphTests.Target {
            PackageGraphTests.Target(name: name, path: (test ? "Tests/" : "Sources/") + name, dependencies: [], isTestTarget: test)
        }
        let uses: [String: Set<String>] = ["A": ["B"], "B": [], "CofferServiceTests": ["CofferClient"]]
        let u: (PackageGraphTests.Target) -> Set<String> = { uses[$0.name] ?? [] }
        #expect(Self.violations([t("A"), t("B")], allowed: ["A": ["B"], "B": []], uses: u).isEmpty)
        #expect(Self.violations([t("A"), t("B")], allowed: ["B": []], uses: u).first?.contains("has no row") == true)
        #expect(Self.violations([t("A"), t("B")], allowed: ["A": [], "B": []], uses: u) == ["A uses B, which its row in ModuleEdgesTests.allowed does not allow"])
        #expect(Self.violations([t("A"), t("B")], allowed: ["A": ["B", "C"], "B": []], uses: u)
            == ["A no longer uses C: take the edge out of its row in ModuleEdgesTests.allowed"])
        #expect(Self.violations([t("A"), t("B")], allowed: ["A": ["B"], "B": [], "Gone": []], uses: u)
            == ["ModuleEdgesTests.allowed has a row for Gone, which is no module of the package"])
        #expect(Self.violations([t("CofferServiceTests", test: true)], allowed: [:], uses: u)
            == ["CofferServiceTests uses CofferClient, which the tests of its layer must not"])
    }
}
