// swift-tools-version:6.1
// libFuzzer harnesses for Coffer's untrusted-input parsers (wire frames, app manifests, SSH agent messages), kept in
// their own package so the main build never links an executable without `main`. Run with
// contrib/fuzz/run SECONDS.
import PackageDescription

let package = Package(
    name: "CofferFuzz",
    dependencies: [.package(name: "Coffer", path: "../..")],
    targets: [
        .executableTarget(name: "FuzzFrames",
                          dependencies: [.product(name: "CofferProtocolFuzzing", package: "Coffer")],
                          swiftSettings: [.unsafeFlags(["-parse-as-library"])]),
        .executableTarget(name: "FuzzManifest",
                          dependencies: [.product(name: "CofferProtocolFuzzing", package: "Coffer")],
                          swiftSettings: [.unsafeFlags(["-parse-as-library"])]),
        .executableTarget(name: "FuzzSSHAgent",
                          dependencies: [.product(name: "CofferProtocolFuzzing", package: "Coffer")],
                          swiftSettings: [.unsafeFlags(["-parse-as-library"])]),
    ]
)
