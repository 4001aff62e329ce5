import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import CofferSystem
import Glibc

/// Backup create and restore at N items (issue #16's benchmark): the keychain library alone (what the
/// agent runs), a backup password at libsodium's moderate Argon2id cost (as the agent uses), restored
/// into a fresh keychain with the same device key.
func benchBackup(sizes: [Int]) throws {
    let kdf = KDFParameters(opsLimit: 3, memLimit: 256 << 20)
    print("| items | backup create | file size | restore (fresh keychain) | restore again (all duplicates) | Argon2id alone |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in sizes {
        let dir = makeTempDir(), target = makeTempDir()
        defer { _ = system("rm -rf '\(dir)' '\(target)'") }
        let kc = try Keychain(directory: dir)
        var i = 0
        while i < n {
            try kc.add(contentsOf: (i..<min(n, i + 5000)).map(item), scope: .unrestricted)
            i += 5000
        }
        let password = secret("benchmark backup password")
        var t0 = nowNanos()
        let (bytes, count) = try kc.backup(password: password, kdf: kdf)
        let create = nowNanos() - t0
        guard count == n else { throw SecError(.internalComponent, "backed up \(count) of \(n)") }
        _ = system("cp '\(dir)/device.key' '\(target)/device.key'")
        let restored = try Keychain(directory: target)
        t0 = nowNanos()
        let r = try restored.restoreBackup(bytes, password: password, dryRun: false)
        let restore = nowNanos() - t0
        guard r.added == n else { throw SecError(.internalComponent, "restored \(r.added) of \(n)") }
        t0 = nowNanos()
        _ = try restored.restoreBackup(bytes, password: password, dryRun: false)
        let again = nowNanos() - t0
        t0 = nowNanos()
        _ = try password.withUnsafeBytes { pw throws(CryptoError) in
            try Argon2id.deriveKey(password: pw, salt: Random.bytes(16), opsLimit: kdf.opsLimit, memLimit: Int(kdf.memLimit))
        }
        let argon = nowNanos() - t0
        func s(_ ns: UInt64) -> String { fixed(Double(ns) / 1e9, 2) + " s" }
        print("| \(grouped(n)) | \(s(create)) | \(fixed(Double(bytes.count) / 1_048_576, 1)) MiB | \(s(restore)) | \(s(again)) | \(s(argon)) |")
    }
}
