import CofferCrypto
import CofferManifest
import CofferModel
import CofferSystem
import CofferTestSupport
import CofferTrust
import Foundation
import Testing

/// A temporary trust layout: keys/, manifests/, and executables to sign, all real files.
final class TrustFixture: @unchecked Sendable {
    let dir = TemporaryDirectory("coffer-trust")
    let keys: String, manifests: String
    /// `dir`'s resolved path (a manifest names a canonical path; TemporaryDirectory's has a `//`).
    let root: String
    /// The trusted key (seed 0x01) and an untrusted one (seed 0x02).
    let trusted = TrustFixture.keyPair(1)
    let untrusted = TrustFixture.keyPair(2)

    /// The key pair of the seed of 32 bytes `byte` (the spec's test keys for 1 and 2).
    static func keyPair(_ byte: UInt8) -> (publicKey: [UInt8], secretKey: SecureBytes) {
        var seed = [UInt8](repeating: byte, count: 32)
        return Ed25519.keyPair(seed: SecureBytes(consuming: &seed))
    }

    init() throws {
        root = String(decoding: try StableFile.canonicalPath(dir.path), as: UTF8.self)
        keys = root + "/keys"
        manifests = root + "/manifests"
        for d in [keys, manifests] { mkdir(d, 0o755) }
        try write(keys + "/admin.pub", "# the administrator\n" + SignerKey(trusted.publicKey)!.description + "\n")
    }

    var configuration: TrustConfiguration {
        TrustConfiguration(keyDirectories: [TrustDirectory(keys)], manifestDirectories: [TrustDirectory(manifests)])
    }

    func write(_ path: String, _ text: String, mode: mode_t = 0o644) throws {
        try text.write(toFile: path, atomically: false, encoding: .utf8)
        chmod(path, mode)
    }

    /// An executable file (a copy of /usr/bin/true with `tag` appended, so each has its own hash).
    func executable(_ name: String, tag: String = "") throws -> String {
        let path = root + "/" + name
        var bytes = try Data(contentsOf: URL(fileURLWithPath: "/usr/bin/true"))
        bytes.append(Data(tag.utf8))
        try bytes.write(to: URL(fileURLWithPath: path))
        chmod(path, 0o755)
        return path
    }

    /// Signs a manifest for `exe` and writes it as manifests/NAME.manifest.
    @discardableResult
    func manifest(_ name: String, app: String, exe: String, groups: [String], trustedKey: Bool = true,
                  mode: mode_t = 0o644) throws -> Manifest {
        let m = try Manifest.sign(app: app, executable: exe, executableSHA256: try ExecutableHash.sha256(path: exe),
                                  accessGroups: groups, secretKey: trustedKey ? trusted.secretKey : untrusted.secretKey)
        let path = manifests + "/" + name + ".manifest"
        try Data(m.encoded()).write(to: URL(fileURLWithPath: path))
        chmod(path, mode)
        return m
    }
}


@Suite struct TrustStoreTests {
    @Test func signedManifestIsAcceptedAndIndexedByExecutable() throws {
        let f = try TrustFixture()
        let exe = try f.executable("app-a")
        let m = try f.manifest("a", app: "com.example.a", exe: exe, groups: ["a", "shared"])
        let store = TrustStore(configuration: f.configuration)
        #expect(store.snapshot.refused.isEmpty, "\(store.snapshot.refused)")
        #expect(store.snapshot.keys.map(\.path) == [f.keys + "/admin.pub"])
        #expect(store.manifests(forExecutable: exe) == [m])
        #expect(store.manifests(forExecutable: exe + "x").isEmpty)
        #expect(store.snapshot.manifests.first?.keyPath == f.keys + "/admin.pub")
    }

    @Test func manifestByAnUntrustedKeyIsRefusedWithTheReason() throws {
        let f = try TrustFixture()
        let exe = try f.executable("app-b")
        try f.manifest("b", app: "com.example.b", exe: exe, groups: ["b"], trustedKey: false)
        let s = TrustSnapshot.load(f.configuration)
        #expect(s.manifests.isEmpty)
        #expect(s.refused == [RefusedFile(path: f.manifests + "/b.manifest", reason: ManifestError.untrustedSigner.description)])
    }

    @Test func tamperedAndMalformedManifestsAreRefused() throws {
        let f = try TrustFixture()
        let exe = try f.executable("app-c")
        let m = try f.manifest("c", app: "com.example.c", exe: exe, groups: ["c"])
        // Same signature, another group: the signature no longer verifies.
        var text = String(decoding: m.encoded(), as: UTF8.self)
        text = text.replacingOccurrences(of: "access-group: c\n", with: "access-group: d\n")
        try f.write(f.manifests + "/tampered.manifest", text)
        try f.write(f.manifests + "/junk.manifest", "hello\n")
        let s = TrustSnapshot.load(f.configuration)
        #expect(s.manifests.map(\.path) == [f.manifests + "/c.manifest"])
        let reasons = Dictionary(uniqueKeysWithValues: s.refused.map { ($0.path, $0.reason) })
        #expect(reasons[f.manifests + "/tampered.manifest"] == "manifest signature does not verify")
        #expect(reasons[f.manifests + "/junk.manifest"]?.hasPrefix("manifest line 1:") == true)
    }

    @Test func worldWritableFileAndGroupWritableDirectoryAreRefused() throws {
        let f = try TrustFixture()
        let exe = try f.executable("app-d")
        try f.manifest("d", app: "com.example.d", exe: exe, groups: ["d"], mode: 0o666)
        var s = TrustSnapshot.load(f.configuration)
        #expect(s.manifests.isEmpty)
        #expect(s.refused == [RefusedFile(path: f.manifests + "/d.manifest", reason: "file is world-writable (mode 0666)")])

        chmod(f.manifests + "/d.manifest", 0o644)
        chmod(f.manifests, 0o775)
        s = TrustSnapshot.load(f.configuration)
        #expect(s.manifests.isEmpty)
        #expect(s.refused == [RefusedFile(path: f.manifests, reason: "directory is group-writable (mode 0775); nothing in it is trusted")])

        // A group-writable key directory: no key is trusted, so the manifest is refused too.
        chmod(f.manifests, 0o755)
        chmod(f.keys, 0o770)
        s = TrustSnapshot.load(f.configuration)
        #expect(s.keys.isEmpty && s.manifests.isEmpty)
        #expect(s.refused.map(\.path) == [f.keys, f.manifests + "/d.manifest"])
    }

    @Test func symbolicLinksAndOtherFilesAreRefused() throws {
        let f = try TrustFixture()
        let exe = try f.executable("app-e")
        try f.manifest("e", app: "com.example.e", exe: exe, groups: ["e"])
        symlink(f.manifests + "/e.manifest", f.manifests + "/link.manifest")
        try f.write(f.manifests + "/notes.txt", "x\n")
        try f.write(f.manifests + "/.hidden.manifest", "x\n")
        let s = TrustSnapshot.load(f.configuration)
        #expect(s.manifests.map(\.path) == [f.manifests + "/e.manifest"])
        let reasons = Dictionary(uniqueKeysWithValues: s.refused.map { ($0.path, $0.reason) })
        #expect(reasons[f.manifests + "/link.manifest"] == "file is a symbolic link")
        #expect(reasons[f.manifests + "/notes.txt"] == "not a *.manifest file; ignored")
        #expect(reasons.count == 2)
    }

    @Test(.enabled(if: getuid() == 0, "needs root to chown a file to another user"))
    func fileOrDirectoryOwnedByAnotherUserIsRefused() throws {
        let f = try TrustFixture()
        let exe = try f.executable("app-f")
        try f.manifest("f", app: "com.example.f", exe: exe, groups: ["f"])
        #expect(chown(f.manifests + "/f.manifest", 65534, 65534) == 0)
        var s = TrustSnapshot.load(f.configuration)
        #expect(s.refused == [RefusedFile(path: f.manifests + "/f.manifest", reason: "file is owned by uid 65534, neither root nor you (uid 0)")])
        #expect(chown(f.manifests + "/f.manifest", 0, 0) == 0)
        #expect(chown(f.keys, 65534, 65534) == 0)
        s = TrustSnapshot.load(f.configuration)
        #expect(s.keys.isEmpty)
        #expect(s.refused.first == RefusedFile(path: f.keys, reason: "directory is owned by uid 65534, neither root nor you (uid 0); nothing in it is trusted"))
    }

    @Test(.enabled(if: getuid() == 0, "needs root to chown a file to another user"))
    func systemDirectoriesMustBeOwnedByRoot() throws {
        let f = try TrustFixture()
        #expect(chown(f.keys + "/admin.pub", 65534, 65534) == 0)
        let config = TrustConfiguration(keyDirectories: [TrustDirectory(f.keys, requireRootOwner: true)], manifestDirectories: [])
        let s = TrustSnapshot.load(config)
        #expect(s.keys.isEmpty)
        #expect(s.refused == [RefusedFile(path: f.keys + "/admin.pub", reason: "file is owned by uid 65534, not by root")])
    }

    @Test func reloadSeesNewAndRemovedManifests() throws {
        let f = try TrustFixture()
        let exe = try f.executable("app-g")
        let store = TrustStore(configuration: f.configuration)
        #expect(store.manifests(forExecutable: exe).isEmpty)
        let m = try f.manifest("g", app: "com.example.g", exe: exe, groups: ["g"])
        #expect(store.manifests(forExecutable: exe).isEmpty, "nothing changes before reload()")
        store.reload()
        #expect(store.manifests(forExecutable: exe) == [m])
        unlink(f.manifests + "/g.manifest")
        #expect(store.reload().manifests.isEmpty)
        #expect(store.manifests(forExecutable: exe).isEmpty)
    }

    /// Issue #24 (SIGHUP): lookups racing reloads that alternate between two whole manifest sets (the
    /// file replaced by rename, so the disk always holds one) always see one whole set — never an
    /// empty or half-loaded store, which would make a signed caller unsigned for a moment.
    @Test func lookupsRacingReloadsSeeOneWholeSet() throws {
        let f = try TrustFixture()
        let exe = try f.executable("app-r")
        let one = try f.manifest("r", app: "com.example.one", exe: exe, groups: ["one"])
        try FileManager.default.moveItem(atPath: f.manifests + "/r.manifest", toPath: f.root + "/one")
        let two = try f.manifest("r", app: "com.example.two", exe: exe, groups: ["two"])
        try FileManager.default.moveItem(atPath: f.manifests + "/r.manifest", toPath: f.root + "/two")
        func install(_ set: String) throws {
            try FileManager.default.copyItem(atPath: f.root + "/" + set, toPath: f.manifests + "/r.staged")
            guard rename(f.manifests + "/r.staged", f.manifests + "/r.manifest") == 0 else { throw SystemError("rename", set) }
        }
        try install("one")
        let store = TrustStore(configuration: f.configuration)
        let done = Protected(false)
        let seen = Protected((lookups: 0, wrong: [[Manifest]]()))
        let group = DispatchGroup()
        for _ in 0..<4 {
            DispatchQueue.global().async(group: group) {
                while !done.withLock({ $0 }) {
                    let found = store.manifests(forExecutable: exe)
                    let whole = found == [one] || found == [two]
                    seen.withLock { $0.lookups += 1; if !whole && $0.wrong.count < 5 { $0.wrong.append(found) } }
                }
            }
        }
        // The workers may start late on a loaded machine: the reloads begin once they look, and go on
        // (in pairs, so the last one installs "one") until they have raced at least 200 lookups.
        let deadline = Date().addingTimeInterval(120)
        while seen.withLock({ $0.lookups }) == 0 && Date() < deadline { usleep(1_000) }
        var i = 0
        while i < 200 || (seen.withLock({ $0.lookups }) < 200 && Date() < deadline) {
            for set in ["two", "one"] {
                try install(set)
                let loaded = store.reload()
                #expect(loaded.refused.isEmpty, "\(loaded.refused)")
            }
            i += 2
        }
        done.withLock { $0 = true }
        group.wait()
        let result = seen.withLock { $0 }
        #expect(result.lookups > 0 && result.wrong.isEmpty, "\(result.wrong.count) lookups saw no whole set: \(result.wrong)")
        #expect(store.manifests(forExecutable: exe) == [one], "the last reload is in force")
    }

    @Test func twoVersionsOfAnExecutableBothCountButADuplicatePinIsRefused() throws {
        let f = try TrustFixture()
        let exe = try f.executable("app-h", tag: "v1")
        let v1 = try f.manifest("h1", app: "com.example.h", exe: exe, groups: ["h"])
        _ = try f.executable("app-h", tag: "v2")
        let v2 = try f.manifest("h2", app: "com.example.h", exe: exe, groups: ["h"])
        _ = try f.manifest("h3", app: "com.example.other", exe: exe, groups: ["other"])
        let s = TrustSnapshot.load(f.configuration)
        #expect(s.byExecutable[exe] == [v1, v2])
        #expect(s.refused.map(\.path) == [f.manifests + "/h3.manifest"])
        #expect(s.refused.first?.reason.contains("already pins this executable") == true)
    }

    @Test func keyFilesMustHoldOnlyKeys() throws {
        #expect(throws: Never.self) { try KeyFile.parsePublicKeys(Array("# c\n\n\(String(repeating: "ab", count: 32))\n".utf8)).get() }
        for bad in ["", "zz\n", String(repeating: "AB", count: 32) + "\n", String(repeating: "ab", count: 32), "# only a comment\n"] {
            #expect(throws: RefusalReason.self, "\(bad)") { try KeyFile.parsePublicKeys(Array(bad.utf8)).get() }
        }
        let f = try TrustFixture()
        try f.write(f.keys + "/bad.pub", "not a key\n")
        let s = TrustSnapshot.load(f.configuration)
        #expect(s.keys.count == 1)
        #expect(s.refused == [RefusedFile(path: f.keys + "/bad.pub", reason: "line 1: not an Ed25519 public key (64 lowercase hex digits)")])
    }

    @Test func secretKeyFileRoundTripAndModeCheck() throws {
        let f = try TrustFixture()
        let path = f.root + "/signing"
        let pub = try KeyFile.generate(secretPath: path)
        #expect(Files.mode(path) == 0o600)
        #expect(try String(contentsOfFile: path + ".pub", encoding: .utf8) == pub.description + "\n")
        let sk = try KeyFile.readSecretKey(path)
        #expect(Ed25519.publicKey(secretKey: sk) == pub.bytes)
        #expect(throws: SecError.self) { try KeyFile.generate(secretPath: path) }
        chmod(path, 0o640)
        #expect(throws: SecError.self) { try KeyFile.readSecretKey(path) }
    }

    @Test func standardPlacesFollowXDG() {
        let env = ["HOME": "/home/u", "XDG_DATA_HOME": "/data"]
        let c = TrustConfiguration.standard(allowUserKeys: false, extraManifestDirectories: ["/x"]) { env[$0] }
        #expect(c.keyDirectories == [TrustDirectory("/etc/coffer/trusted-keys.d", requireRootOwner: true)])
        #expect(c.manifestDirectories == [TrustDirectory("/etc/coffer/manifests.d", requireRootOwner: true),
                                          TrustDirectory("/data/coffer/manifests.d"), TrustDirectory("/x")])
        let u = TrustConfiguration.standard(allowUserKeys: true) { env[$0] }
        #expect(u.keyDirectories.last == TrustDirectory("/home/u/.config/coffer/trusted-keys.d"))
    }

    @Test func interpretersAreRecognised() {
        for p in ["/usr/bin/python3.11", "/usr/bin/python3", "/usr/bin/perl", "/usr/bin/perl5.36.0", "/usr/bin/bash", "/usr/bin/dash",
                  "/bin/sh", "/usr/bin/node", "/usr/bin/ruby3.1", "/usr/bin/lua5.4", "/usr/bin/php8.2", "/usr/bin/tclsh8.6",
                  "/usr/lib/jvm/java-17/bin/java", "/usr/lib64/ld-linux-x86-64.so.2", "/usr/bin/zsh", "/usr/bin/fish", "/usr/bin/env"] {
            #expect(Interpreters.match(p) != nil, "\(p)")
        }
        for p in ["/usr/bin/true", "/usr/bin/pythonista-mail", "/usr/bin/nodeapp", "/opt/mail/bin/mail", "/usr/bin/shred"] {
            #expect(Interpreters.match(p) == nil, "\(p)")
        }
    }
}
