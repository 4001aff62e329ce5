// `coffer manifest …`: signing keys, signed app manifests, and what the agent's trust roots hold.
import ArgumentParser
import CofferCLISupport
import CofferCrypto
import CofferManifest
import CofferModel
import CofferSystem
import CofferTrust
import Glibc

struct ManifestCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "manifest",
        abstract: "Create signing keys, sign app manifests, verify them, and list what the agent trusts.",
        discussion: """
            A manifest names an executable (its resolved path and SHA-256) and the keychain access groups it may use, \
            signed with an Ed25519 key. The agent trusts keys in /etc/coffer/trusted-keys.d/*.pub (and, if configured, \
            $XDG_CONFIG_HOME/coffer/trusted-keys.d) and reads manifests from /etc/coffer/manifests.d/*.manifest and \
            $XDG_DATA_HOME/coffer/manifests.d. Files or directories writable by group or others, or owned by another \
            user, are refused.
            """,
        subcommands: [Keygen.self, Sign.self, Verify.self, List.self])

    struct Keygen: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create a signing key: the secret in KEYFILE (mode 0600, never printed), the public key in KEYFILE.pub.",
            discussion: "Prints the public key (64 hex digits). Copy KEYFILE.pub into /etc/coffer/trusted-keys.d/ to trust it.")
        @Option(help: "Where to write the secret key (must not exist).") var out: String

        func run() throws {
            try reporting { () throws(SecError) in
                let key = try KeyFile.generate(secretPath: out)
                Output.print(key.description)
                Output.printError("coffer: secret key written to \(Output.escapedText(out)) (mode 0600); public key to \(Output.escapedText(out + TrustConfiguration.keySuffix))")
            }
        }
    }

    struct Sign: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Sign a manifest for an executable (its SHA-256 is computed here).",
            discussion: """
                The executable's path is resolved (symbolic links followed) because the agent sees the resolved path. \
                Interpreters (python3, perl, bash, node, java, the dynamic loader, …) are refused unless --force: every \
                script they run would get the groups. Ship a script as an app through a small compiled launcher instead.
                """)
        @Option(help: "The secret key file (from 'coffer manifest keygen').") var key: String
        @Option(name: .customLong("app-id"), help: "The app identifier, e.g. com.example.mail.") var appID: String
        @Option(help: "The executable the manifest is for.") var executable: String
        @Option(name: .customLong("group"), help: "An access group (repeat; the first is the default group).") var groups: [String] = []
        @Option(name: .customLong("entitlement"),
                help: "An entitlement to grant (repeat): delegate-identity (a front end that serves other processes), portal-secret (the desktop portal's secret backend); version-2 manifest.")
        var entitlements: [String] = []
        @Option(help: "Write the manifest here (default: standard output).") var out: String?
        @Option(name: .customLong("installed-as"),
                help: "The absolute, resolved path the executable will run from, when it is signed elsewhere (a staging tree).")
        var installedAs: String?
        @Flag(help: "Sign even an interpreter.") var force = false

        func validate() throws {
            guard !groups.isEmpty else { throw ValidationError("give at least one --group") }
            for e in entitlements where ManifestEntitlement(rawValue: e) == nil {
                throw ValidationError("unknown --entitlement (known: \(ManifestEntitlement.allCases.map(\.rawValue).joined(separator: ", ")))")
            }
            if let installedAs, !installedAs.hasPrefix("/") || installedAs.split(separator: "/").contains(where: { $0 == ".." || $0 == "." }) {
                throw ValidationError("--installed-as needs an absolute path without . or .. components")
            }
        }

        func run() throws {
            try reporting { () throws(SecError) in
                let resolved: String
                do throws(StableFile.Failure) {
                    resolved = String(decoding: try StableFile.canonicalPath(executable), as: UTF8.self)
                } catch {
                    throw ManifestError(fromFailure: error).secError
                }
                if let family = Interpreters.match(resolved) ?? Interpreters.match(executable), !force {
                    throw .param("\(Output.escapedText(resolved)) is an interpreter (\(family)): a manifest for it would give its groups "
                        + "to every script it runs; ship the script behind a compiled launcher, or pass --force")
                }
                let digest: [UInt8]
                do throws(ManifestError) { digest = try ExecutableHash.sha256(path: resolved) } catch { throw error.secError }
                let named = installedAs ?? resolved
                if installedAs != nil, let family = Interpreters.match(named), !force {
                    throw .param("\(Output.escapedText(named)) is an interpreter (\(family)); pass --force to sign it anyway")
                }
                let secret = try KeyFile.readSecretKey(key)
                defer { secret.wipe() }
                let manifest: Manifest
                do throws(ManifestError) {
                    manifest = try Manifest.sign(app: appID, executable: named, executableSHA256: digest,
                                                 accessGroups: groups, entitlements: entitlements.compactMap(ManifestEntitlement.init(rawValue:)),
                                                 secretKey: secret)
                } catch {
                    throw SecError(.param, error.description)
                }
                let bytes = manifest.encoded()
                if let out {
                    do { try Files.writeAtomically(out, bytes, mode: 0o644, temporary: .unique) } catch { throw .io("\(error)") }
                    if installedAs == nil && resolved != executable {
                        Output.printError("coffer: signed the resolved path \(Output.escapedText(resolved))")
                    }
                } else {
                    guard bytes.withUnsafeBytes({ Output.write(1, $0) }) else { throw .io("cannot write to standard output") }
                }
            }
        }
    }

    struct Verify: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check a manifest's format and signature against the trusted keys, and optionally its executable.")
        @Argument(help: "The manifest file.") var file: String
        @Option(name: .customLong("trusted-keys"), help: "Trust the *.pub keys in this directory instead of the agent's (repeat).")
        var trustedKeys: [String] = []
        @Flag(name: .customLong("user-keys"), help: "Also trust $XDG_CONFIG_HOME/coffer/trusted-keys.d (as an agent configured so would).")
        var userKeys = false
        @Flag(name: .customLong("check-executable"), help: "Also check that the file at the manifest's executable path has the pinned SHA-256.")
        var checkExecutable = false

        func run() throws {
            try reporting { () throws(SecError) in
                let bytes: [UInt8]
                do { bytes = try Files.read(file, maxBytes: Manifest.maximumBytes + 1) } catch { throw .io("\(error)") }
                let config = trustedKeys.isEmpty
                    ? TrustConfiguration.standard(allowUserKeys: userKeys)
                    : TrustConfiguration(keyDirectories: trustedKeys.map { TrustDirectory($0) }, manifestDirectories: [])
                let snapshot = TrustSnapshot.load(config)
                for r in snapshot.refused { Output.printError("coffer: refused \(Output.escapedText(r.path)): \(Output.escapedText(r.reason))") }
                let manifest: Manifest
                do throws(ManifestError) {
                    manifest = try Manifest.parse(bytes)
                    try manifest.verify(trusting: snapshot.trustedKeys)
                } catch {
                    throw error.secError
                }
                if checkExecutable {
                    let digest: [UInt8]
                    do throws(ManifestError) { digest = try ExecutableHash.sha256(path: manifest.executable) } catch { throw error.secError }
                    let canonical = (try? StableFile.canonicalPath(manifest.executable)) ?? []
                    guard canonical.elementsEqual(manifest.executable.utf8) else {
                        throw SecError(.missingEntitlement, "executable \(Output.escapedText(manifest.executable)) is not a resolved path (a symbolic link on the way): no process will ever match it")
                    }
                    guard digest == manifest.executableSHA256 else {
                        throw SecError(.missingEntitlement, "executable \(Output.escapedText(manifest.executable)) has SHA-256 \(Hex.encode(digest)), "
                            + "not the manifest's \(Hex.encode(manifest.executableSHA256)): it changed since signing and gets no access group")
                    }
                }
                let keyFile = snapshot.keys.first { $0.key == manifest.signer }?.path ?? "?"
                Output.print("\(Output.escapedText(file)): ok")
                Output.print("app: \(manifest.app)")
                Output.print("executable: \(Output.escapedText(manifest.executable))")
                Output.print("executable-sha256: \(Hex.encode(manifest.executableSHA256))\(checkExecutable ? " (matches the file)" : "")")
                for g in manifest.accessGroups { Output.print("access-group: \(g)") }
                for e in manifest.entitlements { Output.print("entitlement: \(e.rawValue)") }
                Output.print("signed-by: \(manifest.signer) (trusted: \(Output.escapedText(keyFile)))")
            }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List the trusted keys and manifests, and every refused file with the reason.")
        @Option(name: .customLong("key-dir"), help: "Another directory of trusted *.pub keys (repeat).") var keyDirs: [String] = []
        @Option(name: .customLong("manifest-dir"), help: "Another directory of *.manifest files (repeat).") var manifestDirs: [String] = []
        @Flag(name: .customLong("user-keys"), help: "Also trust $XDG_CONFIG_HOME/coffer/trusted-keys.d.") var userKeys = false
        @Flag(name: .customLong("no-default-dirs"), help: "Only the directories given with --key-dir and --manifest-dir.")
        var noDefaultDirs = false
        @Option(name: .customLong("agent-config"),
                help: "The agent's configuration file, whose trusted-keys-dir, manifests-dir, user-trusted-keys and standard-trust-dirs are listed too (default $XDG_CONFIG_HOME/coffer/cofferd.conf when it exists).")
        var agentConfig: String?
        @Flag(help: "Print JSON.") var json = false

        /// What the agent reads: its configuration file's trust keys (the same reader as the agent's).
        func agentSettings() throws -> TrustSettings {
            let path = agentConfig ?? Self.defaultAgentConfig()
            guard let path, agentConfig != nil || access(path, F_OK) == 0 else { return TrustSettings() }
            guard let bytes = try? Files.read(path, maxBytes: 64 * 1024) else {
                throw ValidationError("--agent-config: cannot read \(Output.escapedText(path))")
            }
            return TrustSettings.read(configFile: String(decoding: bytes, as: UTF8.self))
        }

        static func defaultAgentConfig() -> String? {
            // HOME, not getpwuid: this binary is linked statically (NSS would need the shared glibc).
            let env = ThisProcess.environment(["XDG_CONFIG_HOME", "HOME"])
            return AgentPaths.agentConfigFile(environment: env, home: env["HOME"])
        }

        func run() throws {
            var settings = noDefaultDirs ? TrustSettings() : try agentSettings()
            if noDefaultDirs { settings.standardTrustDirectories = false }
            settings.allowUserTrustedKeys = settings.allowUserTrustedKeys || userKeys
            settings.extraKeyDirectories += keyDirs
            settings.extraManifestDirectories += manifestDirs
            let config = settings.configuration
            let s = TrustSnapshot.load(config)
            if json {
                let keys = s.keys.map { "{\"key\":\(Output.json($0.key.description)),\"file\":\(Output.json($0.path))}" }
                let manifests = s.manifests.map { a in
                    "{\"file\":\(Output.json(a.path)),\"app\":\(Output.json(a.manifest.app)),"
                        + "\"executable\":\(Output.json(a.manifest.executable)),"
                        + "\"executableSHA256\":\(Output.json(Hex.encode(a.manifest.executableSHA256))),"
                        + "\"accessGroups\":[\(a.manifest.accessGroups.map(Output.json).joined(separator: ","))],"
                        + "\"entitlements\":[\(a.manifest.entitlements.map { Output.json($0.rawValue) }.joined(separator: ","))],"
                        + "\"signedBy\":\(Output.json(a.manifest.signer.description)),\"keyFile\":\(Output.json(a.keyPath))}"
                }
                let refused = s.refused.map { "{\"file\":\(Output.json($0.path)),\"reason\":\(Output.json($0.reason))}" }
                Output.print("{\"keys\":[\(keys.joined(separator: ","))],\"manifests\":[\(manifests.joined(separator: ","))],"
                    + "\"refused\":[\(refused.joined(separator: ","))]}")
                return
            }
            for k in s.keys { Output.print("trusted key \(k.key) from \(Output.escapedText(k.path))") }
            for a in s.manifests {
                Output.print("manifest \(Output.escapedText(a.path)): app \(a.manifest.app) for \(Output.escapedText(a.manifest.executable)), "
                    + "groups \(a.manifest.accessGroups.joined(separator: ", "))"
                    + (a.manifest.entitlements.isEmpty ? "" : ", entitlements \(a.manifest.entitlements.map(\.rawValue).joined(separator: ", "))")
                    + "; signed by \(Output.escapedText(a.keyPath))")
            }
            for r in s.refused { Output.print("refused \(Output.escapedText(r.path)): \(Output.escapedText(r.reason))") }
            if s.keys.isEmpty && s.manifests.isEmpty && s.refused.isEmpty { Output.print("no trusted keys and no manifests") }
        }
    }
}

extension ManifestError {
    /// The manifest vocabulary for a failed path resolution.
    init(fromFailure failure: StableFile.Failure) {
        switch failure {
        case .notRegularFile: self = .executableNotRegularFile
        case .tooLarge: self = .executableTooLarge
        case .unreadable(let e): self = .executableUnreadable(errno: e)
        case .changed: self = .executableChanged
        }
    }
}
