import Foundation
import Testing

/// The architecture, checked against the sources: every module a file imports is declared in
/// Package.swift (SwiftPM's `--explicit-target-dependency-import-check` misses imports reachable
/// through another dependency), and data flows one way — request → identity → policy → keychain →
/// store — so a lower layer never imports a higher one.
@Suite struct PackageGraphTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// Modules that come with the toolchain or the system, needing no declaration.
    static let platform: Set<String> = ["Glibc", "Foundation", "FoundationEssentials", "Testing", "XCTest", "Dispatch",
                                        "Synchronization", "_Concurrency"]

    struct Target { let name: String; let path: String; let dependencies: Set<String> }

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
            return Target(name: name, path: path, dependencies: deps)
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

    /// Which modules each layer may never depend on (directly): the one-way flow of the architecture.
    static let forbidden: [String: Set<String>] = [
        "CofferSystem": ["CofferCrypto", "CofferModel", "CofferKeybag", "CofferStore", "CofferKeychain", "CofferProtocol",
                         "CofferPAM", "CofferAgent", "CofferClient", "CofferManifest"],
        "CofferCrypto": ["CofferModel", "CofferKeybag", "CofferStore", "CofferKeychain", "CofferProtocol", "CofferPAM",
                         "CofferAgent", "CofferClient", "CofferManifest"],
        "CofferModel": ["CofferKeybag", "CofferStore", "CofferKeychain", "CofferProtocol", "CofferPAM", "CofferAgent",
                        "CofferClient", "CofferManifest", "CofferSystem"],
        "CofferStore": ["CofferKeybag", "CofferKeychain", "CofferProtocol", "CofferPAM", "CofferAgent", "CofferClient",
                        "CofferCrypto"],
        "CofferKeybag": ["CofferStore", "CofferKeychain", "CofferProtocol", "CofferPAM", "CofferAgent", "CofferClient"],
        // The keychain receives a scope and a decision; it knows no processes, wire, PAM or agent.
        "CofferKeychain": ["CofferProtocol", "CofferPAM", "CofferAgent", "CofferClient", "CofferManifest", "CofferIdentity",
                           "CofferTrust", "CofferAudit", "CofferPolicy"],
        // Policy decides from a caller identity alone: pure, no processes, files, keys, wire or PAM.
        "CofferPolicy": ["CofferSystem", "CofferCrypto", "CofferKeybag", "CofferStore", "CofferKeychain", "CofferProtocol",
                         "CofferPAM", "CofferAgent", "CofferClient", "CofferManifest", "CofferIdentity", "CofferTrust",
                         "CofferAudit", "Foundation"],
        // Identity turns a connection into a caller; it knows no keys, items, wire or PAM.
        "CofferIdentity": ["CofferKeybag", "CofferStore", "CofferKeychain", "CofferProtocol", "CofferPAM", "CofferAgent",
                           "CofferClient", "CofferPolicy"],
        "CofferTrust": ["CofferKeybag", "CofferStore", "CofferKeychain", "CofferProtocol", "CofferPAM", "CofferAgent",
                        "CofferClient"],
        "CofferAudit": ["CofferKeybag", "CofferStore", "CofferKeychain", "CofferProtocol", "CofferPAM", "CofferAgent",
                        "CofferClient", "CofferCrypto"],
        "CofferProtocol": ["CofferKeybag", "CofferStore", "CofferKeychain", "CofferPAM", "CofferAgent", "CofferClient",
                           "CofferSystem"],
        "CofferManifest": ["CofferKeybag", "CofferStore", "CofferKeychain", "CofferProtocol", "CofferPAM", "CofferAgent",
                           "CofferClient"],
        "CofferClient": ["CofferKeybag", "CofferStore", "CofferKeychain", "CofferPAM", "CofferAgent"],
        // Plugins run outside the agent: the host and its client never reach keys, items or the store,
        // and the plugin protocol is bytes only (no processes or files).
        "CofferPluginHost": ["CofferKeychain", "CofferKeybag", "CofferStore", "CofferAgent", "CofferPAM", "CofferPluginClient", "CofferTrust"],
        "CofferPluginClient": ["CofferKeychain", "CofferKeybag", "CofferStore", "CofferAgent", "CofferPluginHost"],
        "CofferPluginProtocol": ["CofferSystem", "CofferKeychain", "CofferKeybag", "CofferStore", "CofferAgent",
                                 "CofferPluginHost", "CofferPluginClient"],
        "coffer-plugin-host": ["CofferKeychain", "CofferKeybag", "CofferStore", "CofferAgent"],
        "CofferCLISupport": ["CofferKeybag", "CofferStore", "CofferKeychain", "CofferPAM", "CofferAgent", "Foundation",
                             "ArgumentParser"],
        // The fast CLI stays small and static: no Foundation, no argument parser.
        "coffer": ["Foundation", "ArgumentParser", "CofferKeybag", "CofferStore", "CofferKeychain", "CofferAgent"],
    ]

    @Test func dataFlowsOneWay() throws {
        let targets = try Self.targets()
        let byName = Dictionary(uniqueKeysWithValues: targets.map { ($0.name, $0) })
        for (name, banned) in Self.forbidden {
            let t = try #require(byName[name], "no target \(name)")
            let used = t.dependencies.union(Self.imports(of: t).keys)
            for m in used.intersection(banned).sorted() { Issue.record("\(name) depends on \(m), against the layering") }
        }
    }

    /// A C wall is imported by the one Swift module it serves (and by tests of that module's kind).
    @Test func eachCWallHasOneOwner() throws {
        let owners = ["CSodium": "CofferCrypto", "CSQLite": "CofferStore", "CPAM": "CofferPAM", "CSystemShims": "CofferSystem"]
        for t in try Self.targets() where !t.path.hasPrefix("Tests") {
            for (wall, owner) in owners where t.name != owner && (t.dependencies.contains(wall) || Self.imports(of: t)[wall] != nil) {
                Issue.record("\(t.name) reaches through the \(wall) wall (only \(owner) may)")
            }
        }
    }
}
