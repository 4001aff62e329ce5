import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// The backup format's test vector: `Fixtures/backup-v1/keys.cfbu`, written by this version's
/// `Keychain.backup` for the device key beside it (password "fixture backup password"), restores with
/// exactly its manifest — later versions must keep reading it.
@Suite struct BackupFixtureTests {
    static let dir = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures/backup-v1").path
    static let password = "fixture backup password"
    static let expected: [(String, String)] = [("mail", "mail secret"), ("vpn", "vpn secret (this device only)"), ("boot", "boot secret")]

    @Test func theV1FixtureRestoresOnItsDeviceAndPartlyElsewhere() throws {
        let bytes = fileBytes(Self.dir + "/keys.cfbu")
        #expect(Array(bytes.prefix(5)) == Array("CFBU".utf8) + [1])
        let same = TemporaryDirectory("coffer-backup-fixture")
        writeFileBytes(same.file("device.key"), fileBytes(Self.dir + "/device.key"))
        chmod(same.file("device.key"), 0o600)
        let kc = try Keychain(directory: same.path, lockingStateDirectory: false)
        let r = try kc.restoreBackup(bytes, password: secret(Self.password), dryRun: false)
        #expect(r == Keychain.RestoreSummary(added: 3, duplicates: 0, otherDevice: 0))
        for (svc, s) in Self.expected {
            let got = try kc.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string(svc)], returnData: true, returnAttributes: true), scope: .unrestricted)
            #expect(text(got.first?.data) == s, "\(svc)")
            #expect(got.first?.attributes?["acct"] == .string("fixture"))
        }
        let otherDir = TemporaryDirectory("coffer-backup-fixture-2")
        let elsewhere = try Keychain(directory: otherDir.path, lockingStateDirectory: false)
        #expect(try elsewhere.restoreBackup(bytes, password: secret(Self.password), dryRun: true)
                == Keychain.RestoreSummary(added: 2, duplicates: 0, otherDevice: 1))
    }

    /// Writes the fixture (run by hand with COFFER_WRITE_BACKUP_FIXTURE=1 when the format changes on
    /// purpose; the committed file is what older versions wrote).
    @Test(.enabled(if: ProcessInfo.processInfo.environment["COFFER_WRITE_BACKUP_FIXTURE"] != nil, "writes the fixture only when asked"))
    func writeFixture() throws {
        let tmp = TemporaryDirectory("coffer-backup-fixture-writer")
        let kc = try Keychain(directory: tmp.path, lockingStateDirectory: false)
        for (svc, s) in Self.expected {
            var attrs: Attributes = ["svce": .string(svc), "acct": .string("fixture")]
            if svc == "vpn" { attrs["pdmn"] = .string("cku") }
            if svc == "boot" { attrs["pdmn"] = .string("dk") }
            try kc.add(NewItem(itemClass: .genericPassword, attributes: attrs, secret: secret(s)), scope: .unrestricted)
        }
        let (bytes, _) = try kc.backup(password: secret(Self.password), kdf: KDFParameters(opsLimit: 1, memLimit: UInt64(Argon2id.minimumMemory)))
        try FileManager.default.createDirectory(atPath: Self.dir, withIntermediateDirectories: true)
        writeFileBytes(Self.dir + "/keys.cfbu", bytes)
        writeFileBytes(Self.dir + "/device.key", fileBytes(tmp.file("device.key")))
    }
}
