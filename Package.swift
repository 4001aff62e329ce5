// swift-tools-version:6.1
import PackageDescription

/// Settings every Coffer module shares: Swift 6 language mode (strict concurrency).
let settings: [SwiftSetting] = [.swiftLanguageMode(.v6)]

let package = Package(
    name: "Coffer",
    products: [
        .executable(name: "cofferd", targets: ["cofferd"]),
        .executable(name: "coffer", targets: ["coffer"]),
        .library(name: "CofferClient", targets: ["CofferClient"]),
        .library(name: "CofferKeychain", targets: ["CofferKeychain"]),
        // For contrib/fuzz (a separate package, so the main build never links a harness without main).
        .library(name: "CofferProtocolFuzzing", targets: ["CofferProtocol", "CofferCrypto"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
    ],
    targets: [
        // C walls: each imported by exactly one Swift module.
        .systemLibrary(name: "CSodium", path: "Sources/CSodium", pkgConfig: "libsodium",
                       providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CSQLite", path: "Sources/CSQLite", pkgConfig: "sqlite3",
                       providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CPAM", path: "Sources/CPAM", providers: [.apt(["libpam0g-dev"])]),
        .target(name: "CSystemShims", path: "Sources/CSystemShims"),

        // Swift modules, one per trust boundary.
        .target(name: "CofferCrypto", dependencies: ["CSodium", "CofferSystem"], swiftSettings: settings),
        .target(name: "CofferModel", dependencies: ["CofferCrypto"], swiftSettings: settings),
        .target(name: "CofferSystem", dependencies: ["CSystemShims"], swiftSettings: settings),
        .target(name: "CofferKeybag", dependencies: ["CofferCrypto", "CofferModel", "CofferSystem"],
                swiftSettings: settings),
        .target(name: "CofferStore", dependencies: ["CSQLite", "CofferModel"], swiftSettings: settings),
        .target(name: "CofferKeychain",
                dependencies: ["CofferCrypto", "CofferModel", "CofferKeybag", "CofferStore", "CofferSystem"],
                swiftSettings: settings),
        .target(name: "CofferProtocol", dependencies: ["CofferModel", "CofferCrypto"], swiftSettings: settings),
        .target(name: "CofferPAM", dependencies: ["CPAM", "CofferCrypto"], swiftSettings: settings),
        .target(name: "CofferClient", dependencies: ["CofferProtocol", "CofferModel", "CofferCrypto", "CofferSystem"],
                swiftSettings: settings),
        .target(name: "CofferAgent",
                dependencies: ["CofferKeychain", "CofferProtocol", "CofferPAM", "CofferSystem",
                               .product(name: "Logging", package: "swift-log")],
                swiftSettings: settings),
        .executableTarget(name: "cofferd",
                          dependencies: ["CofferAgent", .product(name: "ArgumentParser", package: "swift-argument-parser")],
                          swiftSettings: settings),
        // `coffer` is what shell scripts run in loops, so its start-up is most of a fetch. A fully
        // static executable skips the dynamic loader and libstdc++'s relocation: ~0.5 ms to main()
        // instead of ~1.3 ms with --static-swift-stdlib (and ~2.5 ms fully dynamic) on the dev VM.
        // It needs no NSS: coffer never looks up users or groups. The two _Foundation* archives
        // are what FoundationEssentials (pulled in by ArgumentParser) needs and the driver omits.
        // Not static-pie: glibc's static-pie start-up asserts on the $ORIGIN rpath SwiftPM adds.
        // Sanitizer runtimes cannot go into a static executable, so contrib/sanitizers.sh sets
        // COFFER_DYNAMIC_CLI=1 and `coffer` links dynamically there.
        .executableTarget(name: "coffer",
                          dependencies: ["CofferClient", "CofferSystem", .product(name: "ArgumentParser", package: "swift-argument-parser")],
                          swiftSettings: settings,
                          linkerSettings: Context.environment["COFFER_DYNAMIC_CLI"] == nil
                              ? [.unsafeFlags(["-static-executable", "-l_FoundationCollections", "-l_FoundationCShims"])] : []),

        .target(name: "CofferTestSupport", path: "Tests/CofferTestSupport", swiftSettings: settings),
        .testTarget(name: "CofferCryptoTests", dependencies: ["CofferCrypto"], swiftSettings: settings),
        .testTarget(name: "CofferKeybagTests", dependencies: ["CofferKeybag", "CofferSystem", "CofferTestSupport"],
                    swiftSettings: settings),
        .testTarget(name: "CofferStoreTests", dependencies: ["CofferStore", "CofferSystem", "CofferTestSupport", "CSQLite"], swiftSettings: settings),
        .testTarget(name: "CofferKeychainTests", dependencies: ["CofferKeychain", "CofferSystem", "CofferTestSupport", "CSQLite"],
                    swiftSettings: settings),
        .testTarget(name: "CofferProtocolTests", dependencies: ["CofferProtocol"],
                    exclude: ["FuzzRegressions"], swiftSettings: settings),
        .testTarget(name: "CofferPAMTests", dependencies: ["CofferPAM", "CofferCrypto"], swiftSettings: settings),
        .testTarget(name: "CofferEndToEndTests",
                    dependencies: ["CofferClient", "CofferSystem", "CofferProtocol", "CofferKeybag", "CofferTestSupport"],
                    swiftSettings: settings),

        .executableTarget(name: "coffer-bench", dependencies: ["CofferKeychain", "CofferClient", "CofferSystem"],
                          path: "Sources/coffer-bench", swiftSettings: settings),
    ]
)
