import CofferCrypto
import CofferKeybag
@testable import CofferKeychain
import CofferModel
import CofferTestSupport
import Foundation
import Testing

/// The committed v1 fixture directories (never opened in place: tests work on copies).
enum Fixtures {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures").path

    /// A private copy of fixture `name` in a fresh temporary directory.
    static func copy(_ name: String) throws -> TemporaryDirectory {
        let dir = TemporaryDirectory("coffer-fixture")
        try copyState(["device.key", "keybag", "keybag.key", "keychain.db"], from: root + "/" + name, to: dir.path)
        return dir
    }
}

/// Every fixture item reads back with exactly its secret and attributes (and its cdat from the manifest).
func expectFixtureIntact(_ kc: Keychain, withPasscode: Bool, manifest: String) throws {
    var cdats: [Int: UInt64] = [:]
    for line in manifest.split(separator: "\n") where line.hasPrefix("item ") {
        let fields = line.split(separator: " ")
        let n = Int(fields[1])!
        let bits = fields.first { $0.hasPrefix("cdat-bits=") }!.dropFirst("cdat-bits=".count)
        cdats[n] = UInt64(bits, radix: 16)
    }
    let items = V1Fixture.items(withPasscode: withPasscode)
    #expect(cdats.count == items.count)
    #expect(try kc.count() == items.count)
    for item in items {
        let keys = item.attributes.filter { ["svce", "srvr", "acct"].contains($0.key) }
        let q = ItemQuery(itemClass: item.itemClass, attributes: keys, limit: .all, returnData: true, returnAttributes: true)
        let got = try kc.copyMatching(q, scope: .unrestricted)
        #expect(got.count == 1, "item \(item.n)")
        guard let r = got.first, let attrs = r.attributes else { continue }
        #expect(r.data?.withUnsafeBytes { Array($0) } == item.secret, "item \(item.n) secret")
        for (k, v) in item.attributes { #expect(attrs[k] == v, "item \(item.n) attribute \(k)") }
        #expect(attrs["agrp"] == .string("coffer.default") && attrs["sync"] == .bool(false))
        #expect(attrs["cdat"] == .date(Double(bitPattern: cdats[item.n]!)) && attrs["mdat"] == attrs["cdat"], "item \(item.n) dates")
        #expect(Set(attrs.keys) == Set(item.attributes.keys).union(["agrp", "sync", "cdat", "mdat"]), "item \(item.n) attribute names")
    }
}

func manifest(_ name: String) throws -> String {
    try String(contentsOfFile: Fixtures.root + "/" + name + "/manifest.txt", encoding: .utf8)
}

func keybagVersion(_ dir: TemporaryDirectory) -> UInt8? { fileBytes(dir.file("keybag")).dropFirst(4).first }

@Suite struct MigrationTests {
    @Test func fixturesAreFormatOne() throws {
        for name in ["v1-passcode", "v1-nopasscode"] {
            let dir = try Fixtures.copy(name)
            #expect(keybagVersion(dir) == 1)
            #expect(sqlRows(dir.file("keychain.db"), "SELECT secret FROM items").allSatisfy { $0.first == 1 })
        }
    }

    @Test func withoutPasscodeEverythingMigratesAtOpen() throws {
        let dir = try Fixtures.copy("v1-nopasscode")
        let kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(kc.keybag.state == .unlocked && !kc.keybag.needsRekey && kc.keybag.formatVersion == 2)
        #expect(keybagVersion(dir) == 2)
        #expect(!kc.migrationReport.isEmpty)
        try expectFixtureIntact(kc, withPasscode: false, manifest: try manifest("v1-nopasscode"))
        #expect(sqlRows(dir.file("keychain.db"), "SELECT secret FROM items").allSatisfy { $0.first == 2 })
        // A second open is a no-op.
        let before = fileBytes(dir.file("keybag"))
        let again = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(again.migrationReport.isEmpty)
        #expect(fileBytes(dir.file("keybag")) == before)
        try expectFixtureIntact(again, withPasscode: false, manifest: try manifest("v1-nopasscode"))
        // New items work alongside.
        try again.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("new"), "acct": .string("x")], secret: secret("n")), scope: .unrestricted)
        #expect(text(try again.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("new")], returnData: true), scope: .unrestricted)[0].data) == "n")
    }

    @Test func withPasscodeTheFirstUnlockMigrates() throws {
        let dir = try Fixtures.copy("v1-passcode")
        let kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(kc.keybag.state == .boot && kc.keybag.needsRekey)
        // Before the unlock: Always items read (already re-padded), the rest waits for the passcode.
        let always = sqlRows(dir.file("keychain.db"), "SELECT secret FROM items WHERE pclass IN (3, 6)")
        #expect(!always.isEmpty && always.allSatisfy { $0.first == 2 })
        let dk = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc.dk"), "acct": .string("alice"), "pdmn": .string("dk")],
                           returnData: true)
        #expect(try kc.copyMatching(dk, scope: .unrestricted).first?.data?.withUnsafeBytes { Array($0) } == V1Fixture.items(withPasscode: true)[2].secret)
        #expect(status { try kc.unlock(passcode: secret("wrong")) } == .authFailed)
        #expect(keybagVersion(dir) == 1) // a wrong passcode changes nothing
        try kc.unlock(passcode: secret(V1Fixture.passcode))
        #expect(!kc.keybag.needsRekey && kc.keybag.formatVersion == 2 && keybagVersion(dir) == 2)
        try expectFixtureIntact(kc, withPasscode: true, manifest: try manifest("v1-passcode"))
        #expect(sqlRows(dir.file("keychain.db"), "SELECT secret FROM items").allSatisfy { $0.first == 2 })
        // Reopen: nothing left to migrate; the passcode still unlocks and every item reads.
        let again = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(!again.keybag.needsRekey)
        try again.unlock(passcode: secret(V1Fixture.passcode))
        #expect(again.migrationReport.isEmpty)
        try expectFixtureIntact(again, withPasscode: true, manifest: try manifest("v1-passcode"))
        // And a passcode change afterwards works as on a new keychain.
        try again.setPasscode(current: secret(V1Fixture.passcode), new: secret("next"), kdf: testKDF)
        let third = try Keychain(directory: dir.path, lockingStateDirectory: false)
        try third.unlock(passcode: secret("next"))
        try expectFixtureIntact(third, withPasscode: true, manifest: try manifest("v1-passcode"))
    }

    @Test func aPasscodeChangeBeforeTheFirstUnlockAlsoMigrates() throws {
        let dir = try Fixtures.copy("v1-passcode")
        let kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        try kc.setPasscode(current: secret(V1Fixture.passcode), new: secret("changed"), kdf: testKDF)
        #expect(keybagVersion(dir) == 2)
        let again = try Keychain(directory: dir.path, lockingStateDirectory: false)
        try again.unlock(passcode: secret("changed"))
        try expectFixtureIntact(again, withPasscode: true, manifest: try manifest("v1-passcode"))
    }
}
