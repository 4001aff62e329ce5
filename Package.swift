// swift-tools-version:6.2
import PackageDescription

/// Settings every Coffer module shares: Swift 6 language mode (strict concurrency), and members visible
/// only through modules a file imports itself (MemberImportVisibility, SE-0444): a file's imports
/// list every module it uses, so the architecture tests that read them see every edge.
/// Under CI (`COFFER_CI`, which contrib/test.sh sets when CI=true) every warning is an error, as in
/// swift-system's SYSTEM_CI: a warning is fixed when it appears, not after it has company.
let settings: [SwiftSetting] = [.swiftLanguageMode(.v6), .enableUpcomingFeature("InternalImportsByDefault"),
                                .enableUpcomingFeature("MemberImportVisibility")]
    + (Context.environment["COFFER_CI"] != nil ? [.treatAllWarnings(as: .error)] : [])

/// The modules that touch raw memory (secrets, syscalls, SQLite and PAM buffers) also build with
/// strict memory safety: every unsafe construct there is spelled `unsafe` and can be reviewed.
let rawMemorySettings: [SwiftSetting] = settings + [.strictMemorySafety()]

/// Linker settings of the command-line executables: static and (in release) stripped, unless
/// COFFER_DYNAMIC_CLI is set (sanitizer builds). See the `coffer` target.
func staticCLI(_ libraries: [String]) -> [LinkerSetting] {
    guard Context.environment["COFFER_DYNAMIC_CLI"] == nil else { return [] }
    return [.unsafeFlags(["-static-executable"] + libraries), .unsafeFlags(["-Xlinker", "-s"], .when(configuration: .release))]
}

let package = Package(
    name: "Coffer",
    products: [
        .executable(name: "cofferd", targets: ["cofferd"]),
        .executable(name: "coffer", targets: ["coffer"]),
        .executable(name: "coffer-cli", targets: ["coffer-cli"]),
        .executable(name: "pinentry-coffer", targets: ["pinentry-coffer"]),
        .executable(name: "git-credential-coffer", targets: ["git-credential-coffer"]),
        .executable(name: "coffer-secret-service", targets: ["coffer-secret-service"]),
        .executable(name: "coffer-portal-secret", targets: ["coffer-portal-secret"]),
        .executable(name: "coffer-secret-service-import", targets: ["coffer-secret-service-import"]),
        .library(name: "CofferClient", targets: ["CofferClient"]),
        .library(name: "CofferKeychain", targets: ["CofferKeychain"]),
        // Apple's keychain API for Swift code written for Apple platforms (issue #46): `import Security` and
        // `import LocalAuthentication` on Linux, backed by the agent. Linux only: on Apple platforms a package
        // keeps the system frameworks (these modules then compile to nothing; see the Security module's docs).
        .library(name: "Security", targets: ["Security"]),
        .library(name: "LocalAuthentication", targets: ["LocalAuthentication"]),
        // For contrib/fuzz (a separate package, so the main build never links a harness without main).
        // Authenticator plugins: the host executable and the plain-C plugins it dlopens.
        .executable(name: "coffer-plugin-host", targets: ["coffer-plugin-host"]),
        .library(name: "CofferPluginTest", type: .dynamic, targets: ["CofferPluginTest"]),
        .library(name: "CofferPluginPasscode", type: .dynamic, targets: ["CofferPluginPasscode"]),
        .library(name: "CofferPluginBiometricEmulator", type: .dynamic, targets: ["CofferPluginBiometricEmulator"]),
        .library(name: "CofferPluginFprintd", type: .dynamic, targets: ["CofferPluginFprintd"]),
        .library(name: "CofferProtocolFuzzing", targets: ["CofferProtocol", "CofferCrypto", "CofferManifest", "CofferSSHAgentProtocol"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        // 1.15: StreamLogHandler(label:stream:) is public (the daemon's rotated log, AgentLog.swift).
        .package(url: "https://github.com/apple/swift-log", from: "1.15.0"),
    ],
    targets: [
        // C walls: each called by exactly one Swift module (COpenSSL and CSDBus hold one wall per module).
        .systemLibrary(name: "CSodium", path: "Sources/CSodium", pkgConfig: "libsodium",
                       providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CSQLite", path: "Sources/CSQLite", pkgConfig: "sqlite3",
                       providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CPAM", path: "Sources/CPAM", providers: [.apt(["libpam0g-dev"])]),
        .target(name: "CSystemShims", path: "Sources/CSystemShims"),
        // The wire protocol's constants for C (pam_coffer, plugins): headers only, checked against Swift by CofferABITests.
        .target(name: "CCofferABI", path: "Sources/CCofferABI"),
        // OpenSSL 3 libcrypto, one wall for every use (issue #42), one header and .c file each: the SSH key types
        // libsodium lacks (CSSHCrypto.h: ECDSA P-256/384/521, RSA, raw components) for CofferSSHKeys; the Secret
        // Service's transport encryption (CSecretServiceCrypto.h: the RFC 2409 DH group, HKDF-SHA256, AES-128-CBC,
        // issue #26) for CofferSecretServiceCrypto; the X.509 parser (CSecurityX509.h: one certificate's names, serial
        // number, key identifiers and public key copied out as bytes, issue #46) for Security's SecCertificate.
        .target(name: "COpenSSL", path: "Sources/COpenSSL", linkerSettings: [.linkedLibrary("crypto")]),
        // sd-bus from libsystemd, one wall for every use (issue #42): one fixed signature per function, because Swift
        // cannot call sd-bus's varargs readers and writers; no marshalling of its own. One header and .c file each:
        // the Secret Service front end (CSecretServiceBus.h, issue #26) for CofferSecretService; another provider as
        // a Secret Service *client* (CSecretServiceClient.h, the importer) for CofferSecretServiceImport; the desktop
        // portal's secret backend (CSecretServicePortal.h) for CofferSecretPortal. Only those three link libsystemd.
        .target(name: "CSDBus", path: "Sources/CSDBus", linkerSettings: [.linkedLibrary("systemd")]),
        // tpm2-tss's ESAPI for the TPM 2.0 device key (issue #28): one TPM command per function, the TCTI chosen by a
        // configuration string; links what `pkg-config --libs tss2-esys tss2-tctildr tss2-mu tss2-rc` says (libtss2-dev).
        .target(name: "CTPM", path: "Sources/CTPM",
                linkerSettings: [.linkedLibrary("tss2-esys"), .linkedLibrary("tss2-tctildr"), .linkedLibrary("tss2-mu"), .linkedLibrary("tss2-rc")]),

        // The kernel's fscrypt ioctls for protected directories (issue #45): one function per ioctl, the
        // key argument built and wiped in C; only CofferFiles imports it.
        .target(name: "CFscrypt", path: "Sources/CFscrypt"),

        // Swift modules, one per trust boundary.
        .target(name: "CofferCrypto", dependencies: ["CSodium", "CofferSystem"], swiftSettings: rawMemorySettings),
        .target(name: "CofferModel", dependencies: ["CofferCrypto"], swiftSettings: settings),
        // SSH key crypto (issue #27): generation, import checks, signatures for ssh-ed25519 (libsodium), ECDSA and RSA
        // (OpenSSL), in raw components; the SSH wire encoding is not here.
        .target(name: "CofferSSHKeys", dependencies: ["COpenSSL", "CofferCrypto"], swiftSettings: rawMemorySettings),
        // The Secret Service's session algorithms (issue #26): `plain` and dh-ietf1024-sha256-aes128-cbc-pkcs7,
        // in model terms (bytes in, bytes out); no D-Bus.
        .target(name: "CofferSecretServiceCrypto", dependencies: ["COpenSSL", "CofferCrypto"], swiftSettings: rawMemorySettings),
        .target(name: "CofferSystem", dependencies: ["CSystemShims"], swiftSettings: rawMemorySettings),
        // The TPM 2.0 in model terms (issue #28): an HMAC key only this TPM can load, authorized from the passcode and
        // counted by the TPM's dictionary-attack lockout; the lockout state; an NV monotonic counter. No keybag here.
        .target(name: "CofferTPM", dependencies: ["CTPM", "CofferCrypto", "CofferSystem"], swiftSettings: rawMemorySettings),
        .target(name: "CofferKeybag", dependencies: ["CofferCrypto", "CofferModel", "CofferSystem", "CofferTPM"],
                swiftSettings: rawMemorySettings),
        .target(name: "CofferStore", dependencies: ["CSQLite", "CofferModel"], swiftSettings: rawMemorySettings),
        // Protected directories on disk (issue #45): fscrypt keys and policies, the checks that refuse what
        // cannot be protected, the crash-safe migration of a non-empty directory, who holds files open.
        .target(name: "CofferFiles", dependencies: ["CFscrypt", "CofferCrypto", "CofferModel"], swiftSettings: rawMemorySettings),
        .target(name: "CofferKeychain",
                dependencies: ["CofferCrypto", "CofferModel", "CofferKeybag", "CofferStore", "CofferSystem", "CofferTPM"],
                swiftSettings: rawMemorySettings),
        .target(name: "CofferProtocol", dependencies: ["CofferModel", "CofferCrypto"], swiftSettings: settings),
        // Sync across a person's machines (issue #29): the circle of devices, sealed records, merging by hybrid logical
        // clock, and the git transport through the installed `git`. Knows nothing of the keychain: the agent applies.
        .target(name: "CofferSync", dependencies: ["CofferCrypto", "CofferModel", "CofferSystem"], swiftSettings: rawMemorySettings),
        .target(name: "CofferPAM", dependencies: ["CPAM", "CofferCrypto"], swiftSettings: rawMemorySettings),
        // The SSH agent protocol (issue #27): OpenSSH's agent messages, key and signature blobs, pure bytes.
        .target(name: "CofferSSHAgentProtocol", dependencies: ["CofferCrypto"], swiftSettings: rawMemorySettings),
        .target(name: "CofferManifest", dependencies: ["CofferCrypto", "CofferModel", "CofferSystem"], swiftSettings: settings),
        // Trust roots and manifest directories: which signer keys and signed manifests the agent believes,
        // with a reason for every refused file (StrictModes-style ownership and permission checks).
        .target(name: "CofferTrust", dependencies: ["CofferManifest", "CofferCrypto", "CofferModel", "CofferSystem"],
                swiftSettings: settings),
        // The audit log: one JSON line per allowed or denied access, never a secret or attribute value.
        .target(name: "CofferAudit", dependencies: ["CofferModel", "CofferSystem"], swiftSettings: settings),
        // Who is calling: a connection's peer process → CallerIdentity (pidfd, /proc, executable hash, manifests, Flatpak).
        .target(name: "CofferIdentity", dependencies: ["CofferManifest", "CofferModel", "CofferSystem"], swiftSettings: settings),
        // Who may use which access groups: a caller identity → the AccessScope the keychain gets. Pure (Model only).
        .target(name: "CofferPolicy", dependencies: ["CofferModel"], swiftSettings: settings),
        // Asking the person through a pinentry (GnuPG's Assuan protocol): the client library's pinentry
        // delegate and the agent's own prompter (for front ends whose clients cannot prompt).
        .target(name: "CofferPrompt", dependencies: ["CofferModel", "CofferCrypto", "CofferSystem"], swiftSettings: settings),
        .target(name: "CofferClient", dependencies: ["CofferProtocol", "CofferModel", "CofferCrypto", "CofferSystem", "CofferPrompt"],
                swiftSettings: settings),
        // The protocol-free service core (issue #25): the access gate, the authenticator, unlocking, the
        // lock schedule and every keychain operation, typed in model terms, for a caller context and
        // an authentication channel. It imports no wire module: each front end is an adapter.
        .target(name: "CofferService",
                dependencies: ["CofferCrypto", "CofferKeybag", "CofferModel", "CofferKeychain", "CofferPAM", "CofferSystem",
                               "CofferIdentity", "CofferPolicy", "CofferAudit", "CofferSync", "CofferFiles",
                               .product(name: "Logging", package: "swift-log")],
                swiftSettings: settings),
        // The agent's socket server (issue #42): Unix-socket listeners with no protocol of their own (accept, peer
        // checks, one thread per connection, limits shared by every listener, the frame budget, shutdown);
        // each front end brings its framing and its connection handler.
        .target(name: "CofferSocketServer",
                dependencies: ["CofferCrypto", "CofferModel", "CofferProtocol", "CofferSystem",
                               .product(name: "Logging", package: "swift-log")],
                swiftSettings: settings),
        // SSH keys as keychain items (issue #27): the item a generated or imported key becomes, and the key read back to
        // sign; the one place the wire codec's SSH types meet the crypto layer's. Shared by the native and ssh-agent front ends.
        .target(name: "CofferSSHKeyItems", dependencies: ["CofferCrypto", "CofferModel", "CofferSSHAgentProtocol", "CofferSSHKeys"],
                swiftSettings: settings),
        // The agent's own prompter (issue #42): the user's pinentry as the core's AuthChannel and ConfirmationChannel,
        // for front ends whose clients cannot prompt. Which pinentry and which display is composition's (CofferAgent).
        .target(name: "CofferAgentPrompt", dependencies: ["CofferModel", "CofferPrompt", "CofferService", "CofferSystem"],
                swiftSettings: settings),
        // The ssh-agent front end (issue #27, split out by issue #42): OpenSSH's agent protocol on a socket server,
        // ssh-add's keys in memory, the keychain's keys through the service core.
        .target(name: "CofferSSHAgentFrontEnd",
                dependencies: ["CofferAgentPrompt", "CofferCrypto", "CofferKeychain", "CofferModel", "CofferPluginClient", "CofferPrompt",
                               "CofferSSHAgentProtocol", "CofferSSHKeyItems", "CofferSSHKeys", "CofferService", "CofferSocketServer", "CofferSystem",
                               .product(name: "Logging", package: "swift-log")],
                swiftSettings: settings),
        // The native protocol's front end (issue #42): framing, the per-connection session and the Pipeline, the
        // adapter from CofferProtocol's requests onto the service core.
        .target(name: "CofferNativeFrontEnd",
                dependencies: ["CofferAgentPrompt", "CofferCrypto", "CofferIdentity", "CofferKeybag", "CofferKeychain", "CofferModel",
                               "CofferPolicy", "CofferPrompt", "CofferProtocol", "CofferSSHAgentProtocol", "CofferSSHKeyItems", "CofferService",
                               "CofferSocketServer", "CofferSystem", .product(name: "Logging", package: "swift-log")],
                swiftSettings: settings),
        // The agent's composition: one service core, its front ends on their socket servers, the configuration,
        // the plugin host, start-up and shutdown.
        .target(name: "CofferAgent",
                dependencies: ["CofferAgentPrompt", "CofferAudit", "CofferCrypto", "CofferIdentity", "CofferKeybag", "CofferKeychain",
                               "CofferManifest", "CofferModel", "CofferNativeFrontEnd", "CofferPAM", "CofferPluginClient", "CofferPluginProtocol",
                               "CofferPolicy", "CofferPrompt", "CofferSSHAgentFrontEnd", "CofferService", "CofferSocketServer", "CofferSystem",
                               "CofferTrust", .product(name: "Logging", package: "swift-log")],
                swiftSettings: settings),
        // Apple's Security framework over the agent (issue #46): SecItem, SecAccessControl, SecKey and the CF types as
        // Swift code written for Apple sees them, on swift-corelibs-foundation; one agent connection per process.
        .target(name: "Security", dependencies: ["COpenSSL", "CofferClient", "CofferModel", "CofferCrypto", "CofferProtocol", "CofferSSHKeys",
                                                 "CofferSSHAgentProtocol", "CofferSystem"],
                swiftSettings: settings),
        // Apple's LocalAuthentication over the agent (issue #46): LAContext, each with a connection of its own that
        // carries its evaluation into the SecItem calls it is passed to.
        .target(name: "LocalAuthentication", dependencies: ["Security", "CofferClient", "CofferModel", "CofferCrypto"],
                swiftSettings: settings),
        // What every command-line tool shares: error reporting with exit statuses, secret printing.
        // No Foundation, no ArgumentParser (`coffer` links it and must stay small and static).
        .target(name: "CofferCLISupport", dependencies: ["CofferClient", "CofferCrypto", "CofferModel", "CofferSystem"],
                swiftSettings: settings),
        // Moving in (issue #26): `coffer import pass` (a password-store through the user's gpg) and `coffer import
        // secret-service` (the provider on the session bus, as a client), into items over the agent's client library.
        // The password-store importer (and what every importer reports) is linked into coffer-cli; the Secret Service
        // importer needs libsystemd, which has no static archive, so it is an executable of its own that coffer-cli
        // runs, unsigned like the libsecret apps whose `unsigned` group its items belong in.
        .target(name: "CofferImport", dependencies: ["CofferClient", "CofferCrypto", "CofferModel", "CofferSystem"],
                swiftSettings: settings),
        .target(name: "CofferSecretServiceImport",
                dependencies: ["CSDBus", "CofferImport", "CofferClient", "CofferCrypto", "CofferModel", "CofferSecretServiceCrypto",
                               "CofferSystem"],
                swiftSettings: settings),
        .executableTarget(name: "coffer-secret-service-import",
                          dependencies: ["CofferSecretServiceImport", "CofferImport", "CofferClient", "CofferCLISupport", "CofferModel", "CofferSystem"],
                          swiftSettings: settings),
        .executableTarget(name: "cofferd",
                          dependencies: ["CofferAgent", "CofferKeybag", .product(name: "ArgumentParser", package: "swift-argument-parser")],
                          swiftSettings: settings),
        // `coffer` is what shell scripts run in loops, so its start-up is most of a fetch: it answers
        // the plain `get` and `add` forms itself, links neither swift-argument-parser nor Foundation,
        // and execs `coffer-cli` (the full parser) for everything else. Measured on the dev VM:
        // ~0.5 ms to main() as a static executable (like /bin/true), against ~1.3 ms with
        // --static-swift-stdlib and ~2.5 ms fully dynamic; ArgumentParser + Foundation add ~0.4 ms.
        // Static executables need no NSS lookups (neither binary looks up users or groups) and are not
        // static-pie (glibc's static-pie start-up asserts on the $ORIGIN rpath SwiftPM adds). Sanitizer
        // runtimes cannot go into a static executable: contrib/sanitizers.sh sets COFFER_DYNAMIC_CLI=1.
        .executableTarget(name: "coffer", dependencies: ["CofferClient", "CofferCLISupport", "CofferModel", "CofferSystem"],
                          swiftSettings: settings, linkerSettings: staticCLI([])),
        .executableTarget(name: "coffer-cli",
                          dependencies: ["CofferClient", "CofferCrypto", "CofferModel", "CofferCLISupport", "CofferSystem",
                                         "CofferManifest", "CofferTrust", "CofferAudit", "CofferProtocol", "CofferSSHAgentProtocol",
                                         "CofferImport", "CofferFiles",
                                         .product(name: "ArgumentParser", package: "swift-argument-parser")],
                          swiftSettings: settings,
                          // The archives FoundationEssentials needs and the driver omits from a static link.
                          linkerSettings: staticCLI(["-l_FoundationCollections", "-l_FoundationCShims", "-lswiftSynchronization"])),

        // Shell helpers (issue #17): GnuPG's pinentry with a keychain, started once per passphrase by
        // gpg-agent, so small and static like `coffer`.
        .executableTarget(name: "pinentry-coffer", dependencies: ["CofferClient", "CofferCLISupport", "CofferCrypto", "CofferModel", "CofferSystem",
                                                                "CofferPrompt"],
                          swiftSettings: settings, linkerSettings: staticCLI([])),
        // git's credential helper, started by git for every fetch and push that needs a password.
        .executableTarget(name: "git-credential-coffer", dependencies: ["CofferClient", "CofferCLISupport", "CofferCrypto", "CofferModel", "CofferSystem"],
                          swiftSettings: settings, linkerSettings: staticCLI([])),

        // The Secret Service front end (issue #26): a process of its own on the session bus, so that D-Bus
        // parsing never happens in cofferd; it reaches the agent through CofferClient only, one
        // connection per bus sender, delegated to the sender's process (DELEGATE).
        .target(name: "CofferSecretService",
                dependencies: ["CSDBus", "CofferClient", "CofferCrypto", "CofferModel", "CofferSecretServiceCrypto",
                               "CofferSystem"],
                swiftSettings: settings),
        .executableTarget(name: "coffer-secret-service", dependencies: ["CofferSecretService"], swiftSettings: settings),
        // The desktop portal's secret backend (issue #26, part 6): xdg-desktop-portal's
        // org.freedesktop.impl.portal.Secret for Flatpak apps, a process of its own like the front end;
        // sd-bus behind the CSDBus wall (one fixed signature), the agent through CofferClient (PORTAL_SECRET).
        .target(name: "CofferSecretPortal", dependencies: ["CSDBus", "CofferClient", "CofferCrypto", "CofferModel", "CofferSystem"],
                swiftSettings: settings),
        .executableTarget(name: "coffer-portal-secret", dependencies: ["CofferSecretPortal"], swiftSettings: settings),

        // Authenticator plugins (issue #14): the C ABI, the agent ↔ host protocol, the host (its own,
        // non-dumpable process that dlopens plugins) and the agent's client of it.
        .target(name: "CCofferPlugin", path: "Sources/CCofferPlugin"),
        .target(name: "CofferPluginProtocol", dependencies: ["CofferModel", "CofferCrypto"], swiftSettings: settings),
        .target(name: "CofferPluginHost",
                dependencies: ["CCofferPlugin", "CofferPluginProtocol", "CofferCrypto", "CofferSystem"],
                swiftSettings: rawMemorySettings),
        .executableTarget(name: "coffer-plugin-host", dependencies: ["CofferPluginHost", "CofferSystem"], swiftSettings: settings),
        .target(name: "CofferPluginClient", dependencies: ["CofferPluginProtocol", "CofferCrypto", "CofferSystem"],
                swiftSettings: settings),
        .target(name: "CofferPluginTest", dependencies: ["CCofferPlugin"], path: "Plugins/Test"),
        // The passcode authenticator: PAM in the plugin host (plain C, links libpam directly).
        .target(name: "CofferPluginPasscode", dependencies: ["CCofferPlugin"], path: "Plugins/Passcode",
                linkerSettings: [.linkedLibrary("pam")]),
        .target(name: "CofferPluginBiometricEmulator", dependencies: ["CCofferPlugin"], path: "Plugins/BiometricEmulator"),
        // A real fingerprint reader through fprintd on the system bus (plain C, sd-bus from libsystemd).
        .target(name: "CofferPluginFprintd", dependencies: ["CCofferPlugin"], path: "Plugins/Fprintd",
                linkerSettings: [.linkedLibrary("systemd"), .linkedLibrary("sodium")]),

        .target(name: "CofferTestSupport", dependencies: ["CofferCrypto", "CofferModel", "CofferKeybag"],
                path: "Tests/CofferTestSupport", swiftSettings: settings),
        // The service core's test doubles and its in-process composition, shared by the service's and the agent's tests.
        .target(name: "CofferServiceTestSupport",
                dependencies: ["CofferService", "CofferAudit", "CofferCrypto", "CofferKeybag", "CofferKeychain", "CofferModel", "CofferPolicy",
                               "CofferSystem", "CofferTestSupport", .product(name: "Logging", package: "swift-log")],
                path: "Tests/CofferServiceTestSupport", swiftSettings: settings),
        .testTarget(name: "CofferSystemTests", dependencies: ["CofferSystem", "CofferTestSupport"], swiftSettings: settings),
        // The shell helpers' pure parts: secret references and templates, secret renderings.
        .testTarget(name: "CofferCLISupportTests", dependencies: ["CofferCLISupport", "CofferCrypto", "CofferModel"], swiftSettings: settings),
        .testTarget(name: "CofferCryptoTests", dependencies: ["CofferCrypto"], swiftSettings: settings),
        .testTarget(name: "CofferSSHKeysTests", dependencies: ["CofferSSHKeys", "CofferCrypto", "CofferTestSupport"], swiftSettings: settings),
        // The TPM module against real swtpm instances the tests start (skipped with a message without swtpm).
        .testTarget(name: "CofferSyncTests", dependencies: ["CofferSync", "CofferCrypto", "CofferModel", "CofferTestSupport"],
                    swiftSettings: settings),
        .testTarget(name: "CofferTPMTests", dependencies: ["CofferTPM", "CofferCrypto", "CofferModel", "CofferTestSupport"], swiftSettings: settings),
        .testTarget(name: "CofferSecretServiceCryptoTests", dependencies: ["CofferSecretServiceCrypto", "CofferCrypto"], swiftSettings: settings),
        .testTarget(name: "CofferKeybagTests", dependencies: ["CofferCrypto", "CofferModel", "CofferKeybag", "CofferSystem", "CofferTestSupport"],
                    swiftSettings: settings),
        // Protected directories on a real ext4 with the encrypt feature on a loop device the tests make (root).
        .testTarget(name: "CofferFilesTests", dependencies: ["CofferFiles", "CofferCrypto", "CofferModel", "CofferTestSupport"],
                    swiftSettings: settings),
        .testTarget(name: "CofferStoreTests", dependencies: ["CofferModel", "CofferStore", "CofferSystem", "CofferTestSupport", "CSQLite"], swiftSettings: settings),
        .testTarget(name: "CofferKeychainTests", dependencies: ["CofferCrypto", "CofferKeybag", "CofferModel", "CofferKeychain", "CofferStore", "CofferSystem", "CofferTestSupport", "CSQLite", "CofferTPM"], exclude: ["Fixtures"],
                    swiftSettings: settings),
        .testTarget(name: "CofferProtocolTests", dependencies: ["CofferCrypto", "CofferModel", "CofferProtocol", "CofferTestSupport"],
                    exclude: ["FuzzRegressions"], swiftSettings: settings),
        .testTarget(name: "CofferSSHAgentProtocolTests", dependencies: ["CofferSSHAgentProtocol", "CofferCrypto", "CofferTestSupport"],
                    exclude: ["FuzzRegressions"], swiftSettings: settings),
        // The package graph checked against the sources: every import declared, layers one way, one owner per C wall.
        .testTarget(name: "CofferArchitectureTests", swiftSettings: settings),
        .testTarget(name: "CofferABITests", dependencies: ["CCofferABI", "CofferProtocol", "CofferModel"],
                    swiftSettings: settings),
        .testTarget(name: "CofferPAMTests", dependencies: ["CofferPAM", "CofferCrypto", "CofferTestSupport"], swiftSettings: settings),
        .testTarget(name: "CofferManifestTests", dependencies: ["CofferManifest", "CofferCrypto", "CofferModel", "CofferTestSupport"],
                    exclude: ["FuzzRegressions"], swiftSettings: settings),
        .testTarget(name: "CofferTrustTests",
                    dependencies: ["CofferTrust", "CofferAudit", "CofferManifest", "CofferCrypto", "CofferModel", "CofferSystem", "CofferTestSupport"],
                    swiftSettings: settings),
        .testTarget(name: "CofferIdentityTests",
                    dependencies: ["CofferIdentity", "CofferManifest", "CofferModel", "CofferCrypto", "CofferSystem"],
                    exclude: ["Fixtures"], swiftSettings: settings),
        // The agent's request path in-process: the pipeline, the unlock throttle and the lock schedule
        // with a fake clock and a stub passcode verifier (a real keychain in a temporary directory).
        .testTarget(name: "CofferAgentTests",
                    dependencies: ["CofferKeybag", "CofferAgent", "CofferAgentPrompt", "CofferNativeFrontEnd", "CofferSSHAgentFrontEnd", "CofferSocketServer", "CofferService", "CofferServiceTestSupport", "CofferKeychain", "CofferProtocol", "CofferModel", "CofferCrypto",
                                   "CofferSystem", "CofferTestSupport", "CofferPolicy", "CofferAudit", "CofferPluginClient", "CofferPAM", "CofferPrompt", "CofferSSHAgentProtocol", "CofferTrust",
                                   .product(name: "Logging", package: "swift-log")],
                    swiftSettings: settings),
        // The pinentry conversation against real (scripted) pinentry processes: answers, cancels, hangs, crashes, garbage.
        .testTarget(name: "CofferPromptTests", dependencies: ["CofferPrompt", "CofferCrypto", "CofferModel", "CofferSystem", "CofferTestSupport"],
                    swiftSettings: settings),
        // The service core alone: every operation with a scripted channel and a fake clock; no wire module.
        .testTarget(name: "CofferServiceTests",
                    dependencies: ["CofferService", "CofferServiceTestSupport", "CofferAudit", "CofferCrypto", "CofferKeychain", "CofferModel",
                                   "CofferPolicy", "CofferSystem", "CofferTestSupport", "CofferSync"],
                    swiftSettings: settings),
        .testTarget(name: "CofferEndToEndTests",
                    dependencies: ["CofferCrypto", "CofferModel", "CofferClient", "CofferSystem", "CofferProtocol", "CofferKeybag", "CofferSSHAgentProtocol",
                                   "CofferTestSupport", "CofferTPM", "CofferSecretService", "CofferSync"],
                    swiftSettings: settings),

        // Apple's API as Apple code calls it (issue #46), against a real agent over a real socket.
        .testTarget(name: "CofferAppleAPITests", dependencies: ["Security", "LocalAuthentication", "CofferTestSupport"],
                    swiftSettings: settings),

        // The plugin host and its client against real plugins loaded by dlopen (and the protocol's vectors).
        .testTarget(name: "CofferPluginTests",
                    dependencies: ["CofferPluginHost", "CofferPluginClient", "CofferPluginProtocol", "CofferCrypto",
                                   "CofferSystem", "CofferTestSupport"],
                    swiftSettings: settings),

        .executableTarget(name: "coffer-bench", dependencies: ["CofferCrypto", "CofferKeybag", "CofferModel", "CofferSync", "CofferProtocol", "CofferKeychain", "CofferClient", "CofferSystem",
                                                                     "CofferIdentity", "CofferSSHAgentProtocol", "CofferCLISupport", "Security"],
                          path: "Sources/coffer-bench", swiftSettings: settings),
    ]
)
