import Foundation
import Testing

/// The architecture, checked against the sources: every module a file imports is declared in
/// Package.swift (SwiftPM's `--explicit-target-dependency-import-check` misses imports reachable
/// through another dependency), and data flows one way — request → identity → policy → keychain →
/// store — so a lower layer never imports a higher one: every module has a rank (``ranks``) and may
/// depend only on lower ranks.
@Suite struct PackageGraphTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// Modules that come with the toolchain or the system, needing no declaration.
    static let platform: Set<String> = ["Glibc", "Foundation", "FoundationEssentials", "Testing", "XCTest", "Dispatch",
                                        "Synchronization", "_Concurrency"]

    struct Target {
        let name: String; let path: String; let dependencies: Set<String>
        /// Built with `.strictMemorySafety()`: every unsafe construct is spelled `unsafe`.
        var strictMemorySafety = false
        /// The Swift upcoming features it builds with (`enableUpcomingFeature`).
        var upcomingFeatures: Set<String> = []
        /// A test target (`testTarget`), not a module of the product.
        var isTestTarget = false
    }

    /// The package's targets as SwiftPM sees them (`swift package dump-package`).
    static func targets() throws -> [Target] {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        // A scratch path of its own: the running `swift test` holds the lock on the package's .build.
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("coffer-graph-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: scratch) }
        p.arguments = ["swift", "package", "--scratch-path", scratch.path, "dump-package"]
        p.currentDirectoryURL = root
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        let json = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let list = try #require(json["targets"] as? [[String: Any]])
        return list.map { t in
            let name = t["name"] as! String
            let type = t["type"] as! String
            let path = (t["path"] as? String) ?? ((type == "test" ? "Tests/" : "Sources/") + name)
            var deps: Set<String> = []
            for d in (t["dependencies"] as? [[String: Any]]) ?? [] {
                for key in ["byName", "target", "product"] {
                    if let v = d[key] as? [Any], let first = v.first as? String { deps.insert(first) }
                }
            }
            let strict = ((t["settings"] as? [[String: Any]]) ?? []).contains { ($0["kind"] as? [String: Any])?["strictMemorySafety"] != nil }
            let features = ((t["settings"] as? [[String: Any]]) ?? []).compactMap { setting -> String? in
                let feature = (setting["kind"] as? [String: Any])?["enableUpcomingFeature"] as? [String: Any]
                return feature?["_0"] as? String
            }
            return Target(name: name, path: path, dependencies: deps, strictMemorySafety: strict, upcomingFeatures: Set(features),
                          isTestTarget: type == "test")
        }
    }

    /// Every module the target's Swift files import.
    static func imports(of target: Target) -> [String: [String]] {
        var found: [String: [String]] = [:]
        let dir = root.appendingPathComponent(target.path)
        guard let files = FileManager.default.enumerator(at: dir, includingPropertiesForKeys: nil) else { return [:] }
        let pattern = try! Regex(#"^\s*(?:@testable\s+|@_spi\(\w+\)\s+|(?:public|package|internal|private|fileprivate)\s+)*import\s+(?:(?:struct|class|enum|func|protocol|var|let|typealias)\s+)?(\w+)"#)
        for case let url as URL in files where url.pathExtension == "swift" {
            guard let text = try? String(contentsOf: url, encoding: .utf8) else { continue }
            for line in text.split(separator: "\n") {
                if let m = line.firstMatch(of: pattern), let module = m.output[1].substring {
                    found[String(module), default: []].append(url.lastPathComponent)
                }
            }
        }
        return found
    }

    @Test func everyImportIsDeclared() throws {
        let targets = try Self.targets()
        #expect(targets.count > 20, "could not read the package (swift package dump-package)")
        for t in targets {
            for (module, files) in Self.imports(of: t)
            where module != t.name && !t.dependencies.contains(module) && !Self.platform.contains(module) {
                Issue.record("\(t.name) imports \(module) (\(Set(files).sorted().joined(separator: ", "))) without declaring it in Package.swift")
            }
        }
    }

    /// Every module's rank, from the C walls up to the executables: a module may depend on (declare or
    /// import) only modules of a lower rank, so modules of one rank never reach each other and data
    /// flows one way — request → identity → policy → keychain → store. A module without a row fails
    /// ``dataFlowsOneWay()``: a new module gets a row here, placed on purpose, and so does a row for a
    /// module that does not exist (``everyRankNamesAModule()``). Test targets sit above every rank.
    static let ranks: [String: Int] = [
        // C walls and outside packages.
        "CSystemShims": 0, "CSodium": 0, "CSQLite": 0, "CPAM": 0, "CCofferABI": 0, "CCofferPlugin": 0, "COpenSSL": 0,
        "CSDBus": 0, "CTPM": 0, "CFscrypt": 0,
        "Logging": 0, "ArgumentParser": 0,
        // The POSIX layer; the plain-C plugins (they see only the plugin ABI).
        "CofferSystem": 1,
        "CofferPluginTest": 1, "CofferPluginPasscode": 1, "CofferPluginBiometricEmulator": 1, "CofferPluginFprintd": 1,
        "CofferCrypto": 2,
        // SSH key crypto and the Secret Service's session crypto (leaves beside the model); the TPM (issue #28),
        // below the keybag that will use it (its errors carry SecStatus numbers, not CofferModel's types).
        "CofferModel": 3, "CofferSSHKeys": 3, "CofferSecretServiceCrypto": 3, "CofferTPM": 3,
        // What the keychain is made of.
        "CofferStore": 4, "CofferKeybag": 4, "CofferFiles": 4,
        // The keychain and its siblings: wire formats, PAM, manifests, policy, audit, the pinentry prompter.
        "CofferKeychain": 5, "CofferProtocol": 5, "CofferPluginProtocol": 5, "CofferPAM": 5, "CofferManifest": 5,
        "CofferPolicy": 5, "CofferAudit": 5, "CofferPrompt": 5, "CofferSSHAgentProtocol": 5,
        // Sync's circle, records and merging (issue #29), beside the keychain it never touches.
        "CofferSync": 5,
        // Built on one of those: trust roots and identity on manifests, the plugin host and its client on
        // the plugin protocol, the client library on the wire (and the prompter).
        "CofferTrust": 6, "CofferIdentity": 6, "CofferPluginClient": 6, "CofferPluginHost": 6, "CofferClient": 6,
        "CofferTestSupport": 6,
        // SSH keys as keychain items, on the SSH wire codec and the SSH key crypto.
        "CofferSSHKeyItems": 6,
        // The protocol-free service core (issue #25), over keychain, policy, identity, audit and plugins.
        "CofferService": 7, "CofferCLISupport": 7, "coffer-plugin-host": 7,
        // The Secret Service front end (issue #26): the bus on one side, the agent through CofferClient on the other.
        "CofferSecretService": 7,
        // The desktop portal's secret backend (issue #26, part 6): the bus on one side, the agent through CofferClient.
        "CofferSecretPortal": 7, "coffer-portal-secret": 8,
        // Moving in (issue #26): importers over the client library (and, for the Secret Service, the bus as a client).
        "CofferImport": 7, "CofferSecretServiceImport": 8, "coffer-secret-service-import": 9,
        // Apple's keychain API over the client library (issue #46): Security, and LocalAuthentication on it (as on
        // Apple platforms, where LAContext evaluates a SecAccessControl).
        "Security": 7, "LocalAuthentication": 8,
        // The agent's socket server (over the core for its log throttle) and its own prompter; the command-line tools.
        "CofferSocketServer": 8, "CofferAgentPrompt": 8, "CofferServiceTestSupport": 8,
        "coffer": 8, "coffer-cli": 8, "coffer-secret-service": 8, "pinentry-coffer": 8, "git-credential-coffer": 8,
        // The agent's front ends, on the socket server and the prompter.
        "CofferSSHAgentFrontEnd": 9, "CofferNativeFrontEnd": 9,
        // The agent's composition: the core, its front ends and their listeners.
        "CofferAgent": 10,
        "cofferd": 11, "coffer-bench": 9,
    ]

    /// Modules only a few others may use (test targets aside): what holds keys and items, and PAM.
    static let confined: [String: Set<String>] = {
        let keyHolders: Set<String> = ["CofferKeychain", "CofferService", "CofferAgent", "CofferNativeFrontEnd", "CofferSSHAgentFrontEnd",
                                       "CofferServiceTestSupport", "CofferTestSupport", "cofferd", "coffer-bench"]
        return [
            "CofferStore": ["CofferKeychain"],
            "CofferKeybag": keyHolders,
            "CofferKeychain": keyHolders,
            "CofferPAM": ["CofferService", "CofferAgent"],
        ]
    }()

    // The purity rules the ranks alone would allow breaking (the policy pure, the wire formats bytes
    // only, the core protocol-free, the Secret Service front end off the wire) are ModuleEdgesTests'
    // allow-list of edges now: each module names what it may use.

    /// What is wrong with the layering of `targets`, whose modules use `uses` (declared and imported,
    /// platform modules left out): one message per broken rule.
    static func layeringViolations(_ targets: [Target], uses: (Target) -> Set<String>) -> [String] {
        var found: [String] = []
        for t in targets {
            let isTest = t.path.hasPrefix("Tests") && ranks[t.name] == nil
            let rank = ranks[t.name]
            if rank == nil && !isTest {
                found.append("\(t.name) has no rank: add a row for it to PackageGraphTests.ranks (it may depend only on lower ranks)")
            }
            for m in uses(t).subtracting([t.name]).sorted() {
                guard let r = ranks[m] else {
                    found.append("\(t.name) depends on \(m), which has no rank: add a row for \(m) to PackageGraphTests.ranks")
                    continue
                }
                if let rank, r >= rank {
                    found.append("\(t.name) (rank \(rank)) depends on \(m) (rank \(r)): a module may depend only on lower ranks")
                }
                if !isTest, let allowed = confined[m], !allowed.contains(t.name) {
                    found.append("\(t.name) depends on \(m), which only \(allowed.sorted().joined(separator: ", ")) may use")
                }
            }
        }
        return found
    }

    @Test func dataFlowsOneWay() throws {
        let targets = try Self.targets()
        #expect(targets.count > 20, "could not read the package (swift package dump-package)")
        for v in Self.layeringViolations(targets, uses: { t in t.dependencies.union(Self.imports(of: t).keys).subtracting(Self.platform) }) {
            Issue.record(Comment(rawValue: v))
        }
    }

    /// The rules themselves: a module without a row, an upward or sideways edge, a confined module used
    /// from outside are each reported, with what to do; a row for a module that does not exist is not.
    @Test func theRanksCatchNewModulesAndWrongEdges() {
        func check(_ name: String, path: String = "Sources/X", uses: Set<String>) -> [String] {
            Self.layeringViolations([Target(name: name, path: path, dependencies: [])], uses: { _ in uses })
        }
        #expect(check("CofferNew", uses: ["CofferModel"])
            == ["CofferNew has no rank: add a row for it to PackageGraphTests.ranks (it may depend only on lower ranks)"])
        #expect(check("CofferIdentity", uses: ["CofferNew"])
            == ["CofferIdentity depends on CofferNew, which has no rank: add a row for CofferNew to PackageGraphTests.ranks"])
        #expect(check("CofferModel", uses: ["CofferKeychain"]).first?.contains("may depend only on lower ranks") == true)
        #expect(check("CofferTrust", uses: ["CofferIdentity"]).first?.contains("may depend only on lower ranks") == true)
        #expect(check("CofferPluginHost", uses: ["CofferTrust"]).first?.contains("may depend only on lower ranks") == true)
        #expect(check("CofferClient", uses: ["CofferKeybag"]).first?.contains("which only") == true)
        #expect(check("CofferIdentityTests", path: "Tests/CofferIdentityTests", uses: ["CofferIdentity", "CofferKeybag"]).isEmpty)
        #expect(check("CofferManifest", uses: ["CofferModel", "CofferSystem"]).isEmpty)
    }

    /// Every row of ``ranks`` names a module of the package (a row left behind by a removed module
    /// would let a new one of that name in unplaced).
    @Test func everyRankNamesAModule() throws {
        let targets = try Self.targets()
        #expect(targets.count > 20, "could not read the package (swift package dump-package)")
        let names = Set(targets.map(\.name)).union(["Logging", "ArgumentParser"])
        for name in Set(Self.ranks.keys).subtracting(names).sorted() {
            Issue.record("PackageGraphTests.ranks has a row for \(name), which is no module of the package")
        }
    }

    /// The modules that touch raw memory — secrets, system calls, SQLite, PAM and plugin buffers —
    /// build with strict memory safety (issue #25 added the keychain and the plugin host).
    @Test func rawMemoryModulesAreStrictlyMemorySafe() throws {
        let strict: Set<String> = ["CofferSystem", "CofferCrypto", "CofferKeybag", "CofferStore", "CofferPAM", "CofferKeychain",
                                   "CofferPluginHost", "CofferSSHKeys", "CofferTPM", "CofferSync", "CofferFiles"]
        let targets = try Self.targets()
        #expect(targets.count > 20, "could not read the package (swift package dump-package)")
        for t in targets where strict.contains(t.name) && !t.strictMemorySafety {
            Issue.record("\(t.name) does not build with strict memory safety (swiftSettings: rawMemorySettings)")
        }
    }

    /// Every Swift target builds with MemberImportVisibility (SE-0444): a member is visible only
    /// through a module the file imports itself, so the imports the tests above read are every edge.
    @Test func everySwiftTargetSeesOnlyWhatItImports() throws {
        let targets = try Self.targets()
        #expect(targets.count > 20, "could not read the package (swift package dump-package)")
        for t in targets where !Self.imports(of: t).isEmpty && !t.upcomingFeatures.contains("MemberImportVisibility") {
            Issue.record("\(t.name) does not build with MemberImportVisibility (swiftSettings: settings)")
        }
    }

    /// A C target is imported only by the Swift modules it serves (and by tests of their kind): one each,
    /// except the one OpenSSL target and the one sd-bus target (issue #42), which hold one wall per module.
    @Test func eachCWallHasOneOwner() throws {
        let owners: [String: Set<String>] = [
            "CSodium": ["CofferCrypto"], "CSQLite": ["CofferStore"], "CPAM": ["CofferPAM"], "CSystemShims": ["CofferSystem"],
            "CTPM": ["CofferTPM"], "CFscrypt": ["CofferFiles"],
            "COpenSSL": Set(Self.wallPrefixes.filter { $0.target == "COpenSSL" }.map(\.owner)),
            "CSDBus": Set(Self.wallPrefixes.filter { $0.target == "CSDBus" }.map(\.owner))]
        for t in try Self.targets() where !t.path.hasPrefix("Tests") {
            for (wall, owner) in owners where !owner.contains(t.name) && (t.dependencies.contains(wall) || Self.imports(of: t)[wall] != nil) {
                Issue.record("\(t.name) reaches through the \(wall) wall (only \(owner.sorted().joined(separator: ", ")) may)")
            }
        }
    }

    /// The walls inside COpenSSL and CSDBus, each a header with its own name prefix, and the one module that calls it.
    static let wallPrefixes: [(target: String, header: String, prefix: String, owner: String)] = [
        ("COpenSSL", "CSSHCrypto.h", "cssh", "CofferSSHKeys"),
        ("COpenSSL", "CSecretServiceCrypto.h", "css", "CofferSecretServiceCrypto"),
        ("COpenSSL", "CSecurityX509.h", "csx", "Security"),
        ("CSDBus", "CSecretServiceBus.h", "ssb", "CofferSecretService"),
        ("CSDBus", "CSecretServiceClient.h", "ssc", "CofferSecretServiceImport"),
        ("CSDBus", "CSecretServicePortal.h", "csp", "CofferSecretPortal"),
    ]

    /// Inside the shared C targets each wall still has one owner: a module calls only the functions,
    /// types and constants of its own wall's prefix (`cssh_`/`CSSH_` …), and calls them (the table is not stale).
    /// Every header of the two targets is in the table.
    @Test func eachWallInsideASharedTargetHasOneOwner() throws {
        let targets = try Self.targets()
        #expect(targets.count > 20, "could not read the package (swift package dump-package)")
        for target in Set(Self.wallPrefixes.map(\.target)) {
            let dir = Self.root.appendingPathComponent("Sources/\(target)/include")
            let headers = Set(try FileManager.default.contentsOfDirectory(atPath: dir.path).filter { $0.hasSuffix(".h") && $0 != "\(target).h" })
            #expect(headers == Set(Self.wallPrefixes.filter { $0.target == target }.map(\.header)),
                    "\(target)'s headers and the wall table differ")
        }
        for t in targets where !t.isTestTarget {
            let files = Self.swiftSources(of: t)
            for wall in Self.wallPrefixes {
                let pattern = try Regex("\\b(?:\(wall.prefix)|\(wall.prefix.uppercased()))_\\w")
                let users = files.filter { $0.text.contains(pattern) }.map(\.name)
                if t.name == wall.owner {
                    #expect(!users.isEmpty, "\(t.name) calls nothing of \(wall.header): take its row out of wallPrefixes")
                } else if !users.isEmpty {
                    Issue.record("\(t.name) uses \(wall.header)'s \(wall.prefix)_ names (\(users.sorted().joined(separator: ", "))); only \(wall.owner) may")
                }
            }
        }
    }

    /// A target's Swift files: name and text.
    static func swiftSources(of target: Target) -> [(name: String, text: String)] {
        let dir = root.appendingPathComponent(target.path)
        guard let files = FileManager.default.enumerator(at: dir, includingPropertiesForKeys: nil) else { return [] }
        return files.compactMap { item -> (name: String, text: String)? in
            guard let url = item as? URL, url.pathExtension == "swift", let text = try? String(contentsOf: url, encoding: .utf8) else { return nil }
            return (url.lastPathComponent, text)
        }
    }
}
