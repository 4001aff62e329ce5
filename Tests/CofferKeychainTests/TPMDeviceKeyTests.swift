import CofferCrypto
import CofferKeybag
@testable import CofferKeychain
import CofferModel
import CofferTPM
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// The TPM device key (issue #28) against real swtpm instances: what a copy of the state directory
/// opens elsewhere (nothing), wrong passcodes counted by the TPM, a TPM gone, cleared or answering
/// errors, and the move of an existing keychain (the format-2 fixture included) to the TPM.
@Suite struct TPMDeviceKeyTests {
    static let passcode = "correct horse"
    static let files = ["device.key", "device-key.tpm", "keybag", "keybag.key", "keychain.db"]

    func tpmKey(_ dir: TemporaryDirectory, _ sw: SoftwareTPM) -> TPMDeviceKey {
        TPMDeviceKey(path: dir.file(TPMDeviceKey.fileName), tcti: sw.tcti)
    }

    /// Every state file's SHA-256 ("absent" for a missing one), to show that a refusal changed nothing.
    func snapshot(_ dir: String) -> [String: String] {
        var out: [String: String] = [:]
        for f in Self.files {
            out[f] = FileManager.default.fileExists(atPath: dir + "/" + f) ? SHA256.hash(fileBytes(dir + "/" + f)).map { String($0, radix: 16) }.joined() : "absent"
        }
        return out
    }

    @Test func theFormatTwoFixtureOpensUnchangedWithTheFileKeyAndRefusesATPMConfiguration() throws {
        let dir = try Fixtures.copy("schema3")
        let keybag = fileBytes(dir.file("keybag"))
        do {
            let kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
            #expect(kc.deviceKeyKind == .file && !kc.attemptsCountedByTPM)
            #expect(try kc.count() == 5)
            let q = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("erin")], returnData: true)
            #expect(text(try kc.copyMatching(q, scope: .unrestricted).first?.data) == "pw-erin")
        }
        #expect(keybagVersion(dir) == 2, "a file keychain keeps format 2")
        #expect(fileBytes(dir.file("keybag")) == keybag, "the keybag is not rewritten")
        let before = snapshot(dir.path)
        // Configured for the TPM: refused before any TPM is asked or any file is written.
        let error = try #require(throws: SecError.self) {
            try Keychain(directory: dir.path, deviceKey: TPMDeviceKey(path: dir.file(TPMDeviceKey.fileName), tcti: "swtpm:host=127.0.0.1,port=1"),
                         lockingStateDirectory: false)
        }
        #expect(error.status == .notAvailable && error.message.contains("coffer device-key migrate --to tpm"), "\(error)")
        #expect(snapshot(dir.path) == before)
    }

    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func aTPMKeychainLeavesNoKeyOnDiskAndACopyOpensNothingOnAnotherTPM() throws {
        let sw = try SoftwareTPM()
        let dir = TemporaryDirectory("coffer-tpm-keychain")
        var kc: Keychain? = try Keychain(directory: dir.path, deviceKey: tpmKey(dir, sw), lockingStateDirectory: false)
        try kc!.setPasscode(current: nil, new: secret(Self.passcode), kdf: testKDF)
        for (acct, p) in [("always", "dk"), ("unlocked", "ak")] {
            _ = try kc!.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("s"), "acct": .string(acct), "pdmn": .string(p)],
                                    secret: secret("secret " + acct)), scope: .unrestricted, returnPersistentRef: false)
        }
        #expect(kc!.deviceKeyKind == .tpm && kc!.attemptsCountedByTPM)
        kc = nil
        #expect(!FileManager.default.fileExists(atPath: dir.file("device.key")), "no device key file")
        #expect(keybagVersion(dir) == 3)
        // The same TPM: a restart, the passcode, every item.
        do {
            let again = try Keychain(directory: dir.path, deviceKey: tpmKey(dir, sw), lockingStateDirectory: false)
            #expect(status { try again.unlock(passcode: secret("wrong")) } == .authFailed)
            try again.unlock(passcode: secret(Self.passcode))
            #expect(try again.count() == 2)
            let q = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("unlocked")], returnData: true)
            #expect(text(try again.copyMatching(q, scope: .unrestricted).first?.data) == "secret unlocked")
        }
        // Every file, copied to a machine with another TPM: nothing opens, not even the Always items.
        let copy = TemporaryDirectory("coffer-tpm-copy")
        try copyState(Self.files.filter { FileManager.default.fileExists(atPath: dir.file($0)) }, from: dir.path, to: copy.path)
        let other = try SoftwareTPM()
        let before = snapshot(copy.path)
        let error = try #require(throws: SecError.self) {
            try Keychain(directory: copy.path, deviceKey: tpmKey(copy, other), lockingStateDirectory: false)
        }
        #expect(error.status == .decode && error.message.contains("cleared or replaced") && error.message.contains("backup"), "\(error)")
        // One statement (issue #41): another storage key, so the backup and not an escrow record; not "damaged".
        #expect(error.message.contains("another storage key") && error.message.contains("escrow records need the device key too")
                && !error.message.contains("or an escrow record") && !error.message.contains("damaged"), "\(error)")
        // Nor with the file device key (no silent fallback, no new key over the TPM's).
        let fileError = try #require(throws: SecError.self) { try Keychain(directory: copy.path, lockingStateDirectory: false) }
        #expect(fileError.status == .notAvailable && fileError.message.contains("device-key = tpm"), "\(fileError)")
        #expect(snapshot(copy.path) == before, "a refused open changes nothing")
    }

    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func wrongPasscodesAreCountedByTheTPMUntilItLocksOutAcrossRestarts() throws {
        let sw = try SoftwareTPM()
        let dir = TemporaryDirectory("coffer-tpm-lockout")
        do {
            let kc = try Keychain(directory: dir.path, deviceKey: tpmKey(dir, sw), lockingStateDirectory: false)
            try kc.setPasscode(current: nil, new: secret(Self.passcode), kdf: testKDF)
        }
        let tpm = try TPM(tcti: sw.tcti)
        let limit = try tpm.lockoutState().maxTries
        #expect(limit > 0)
        for i in 0..<Int(limit) {
            // A new keychain each time: nothing in this process (nor an `attempts` file) carries the count.
            let kc = try Keychain(directory: dir.path, deviceKey: tpmKey(dir, sw), lockingStateDirectory: false)
            #expect(status { try kc.unlock(passcode: secret("guess \(i)")) } == .authFailed)
            #expect(try tpm.lockoutState().failedTries == UInt32(i + 1), "the TPM counted guess \(i)")
        }
        #expect(try tpm.lockoutState().inLockout)
        let kc = try Keychain(directory: dir.path, deviceKey: tpmKey(dir, sw), lockingStateDirectory: false)
        let error = try #require(throws: SecError.self) { try kc.unlock(passcode: secret(Self.passcode)) }
        #expect(error.status == .notAvailable && error.message.contains("TPM is locked out")
                && error.message.contains("tpm2_dictionarylockout --clear-lockout"), "\(error)")
        #expect(kc.status.lockState == .boot, "the right passcode opens nothing while the TPM is locked out")
        if SoftwareTPM.tools != nil {
            // The administrator's way out.
            let reset = sw.tool("tpm2_dictionarylockout", ["--clear-lockout"])
            #expect(reset.status == 0, "\(reset)")
            try kc.unlock(passcode: secret(Self.passcode))
            #expect(kc.status.lockState == .unlocked)
        }
    }

    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func aTPMThatIsGoneAtStartOrMidUnlockIsAClearErrorThatLosesNothing() throws {
        let sw = try SoftwareTPM()
        let dir = TemporaryDirectory("coffer-tpm-gone")
        do {
            let kc = try Keychain(directory: dir.path, deviceKey: tpmKey(dir, sw), lockingStateDirectory: false)
            try kc.setPasscode(current: nil, new: secret(Self.passcode), kdf: testKDF)
            _ = try kc.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("s"), "acct": .string("a")], secret: secret("kept")),
                           scope: .unrestricted, returnPersistentRef: false)
        }
        let kc = try Keychain(directory: dir.path, deviceKey: tpmKey(dir, sw), lockingStateDirectory: false)
        let tcti = sw.tcti
        sw.stop()
        let before = snapshot(dir.path)
        // Mid-unlock: the keychain is open, the TPM stops answering.
        let mid = try #require(throws: SecError.self) { try kc.unlock(passcode: secret(Self.passcode)) }
        #expect(mid.status == .notAvailable && mid.message.contains(tcti), "\(mid)")
        // At start.
        let start = try #require(throws: SecError.self) {
            try Keychain(directory: dir.path, deviceKey: TPMDeviceKey(path: dir.file(TPMDeviceKey.fileName), tcti: tcti), lockingStateDirectory: false)
        }
        #expect(start.status == .notAvailable && start.message.contains("no TPM answers at \(tcti)") && start.message.contains("nothing was changed"),
                "\(start)")
        #expect(snapshot(dir.path) == before, "nothing written, nothing removed")
        try sw.start()
        let back = try Keychain(directory: dir.path, deviceKey: tpmKey(dir, sw), lockingStateDirectory: false)
        try back.unlock(passcode: secret(Self.passcode))
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("a")], returnData: true)
        #expect(text(try back.copyMatching(q, scope: .unrestricted).first?.data) == "kept")
    }

    @Test(.enabled(if: SoftwareTPM.available && SoftwareTPM.tools != nil, "\(SoftwareTPM.unavailableReason), or no tpm2-tools"))
    func aClearedTPMSaysWhyAndHowToRecover() throws {
        let sw = try SoftwareTPM()
        let dir = TemporaryDirectory("coffer-tpm-cleared")
        do { _ = try Keychain(directory: dir.path, deviceKey: tpmKey(dir, sw), lockingStateDirectory: false) }
        let cleared = sw.tool("tpm2_clear", ["-c", "p"])
        #expect(cleared.status == 0, "\(cleared)")
        let error = try #require(throws: SecError.self) { try Keychain(directory: dir.path, deviceKey: tpmKey(dir, sw), lockingStateDirectory: false) }
        #expect(error.status == .decode && error.message.contains("cleared") && error.message.contains("coffer backup restore"), "\(error)")
        // A damaged key file says the same, and nothing parses past a bad field.
        var bytes = fileBytes(dir.file(TPMDeviceKey.fileName))
        bytes[bytes.count - 3] ^= 1
        writeFileBytes(dir.file(TPMDeviceKey.fileName), bytes)
        #expect(status { try Keychain(directory: dir.path, deviceKey: tpmKey(dir, sw), lockingStateDirectory: false) } == .decode)
    }

    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func migratingTheFormatTwoFixtureAndAPasscodeKeychainKeepsEveryItem() throws {
        let sw = try SoftwareTPM()
        // The fixture of today's format (no passcode).
        let dir = try Fixtures.copy("schema3")
        let source = TPMDeviceKey(path: dir.file(TPMDeviceKey.fileName), tcti: sw.tcti, adopting: try FileDeviceKey(path: dir.file("device.key")).loadDeviceKey())
        do {
            let kc = try Keychain(directory: dir.path, deviceKey: source, lockingStateDirectory: false, migratingDeviceKey: true)
            try kc.migrateDeviceKey(passcode: nil)
        }
        #expect(!FileManager.default.fileExists(atPath: dir.file("device.key")) && keybagVersion(dir) == 3)
        do {
            let kc = try Keychain(directory: dir.path, deviceKey: tpmKey(dir, sw), lockingStateDirectory: false)
            #expect(try kc.count() == 5)
            for acct in ["alice", "bob", "dave", "erin"] {
                let q = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string(acct)], returnData: true)
                #expect(text(try kc.copyMatching(q, scope: .unrestricted).first?.data) == "pw-" + acct)
            }
        }
        // A keychain with a passcode: a wrong one changes nothing; the right one moves it.
        let f = try Fixture(passcode: Self.passcode)
        for p in ["ak", "dk", "akpu"] { try f.addPassword(service: "s", account: p, secret: "secret " + p, ["pdmn": .string(p)]) }
        let migratingKeyBytes = fileBytes(f.dir.file("device.key"))
        let migrating = TPMDeviceKey(path: f.dir.file(TPMDeviceKey.fileName), tcti: sw.tcti,
                                     adopting: try FileDeviceKey(path: f.dir.file("device.key")).loadDeviceKey())
        let kc = try Keychain(directory: f.dir.path, deviceKey: migrating, lockingStateDirectory: false, migratingDeviceKey: true)
        #expect(status { try kc.migrateDeviceKey(passcode: secret("wrong")) } == .authFailed)
        #expect(keybagVersion(f.dir) == 2 && FileManager.default.fileExists(atPath: f.dir.file("device.key")))
        try kc.migrateDeviceKey(passcode: secret(Self.passcode))
        #expect(keybagVersion(f.dir) == 3 && !FileManager.default.fileExists(atPath: f.dir.file("device.key")))
        f.deviceKey = TPMDeviceKey(path: f.dir.file(TPMDeviceKey.fileName), tcti: sw.tcti)
        try f.reboot()
        #expect(f.keychain.attemptsCountedByTPM)
        try f.keychain.unlock(passcode: secret(Self.passcode))
        for p in ["ak", "dk", "akpu"] { #expect(try f.password(service: "s", account: p) == "secret " + p) }
        // The whole state directory and the device key itself (a device.key kept from before the
        // migration), on a machine with another TPM: the file key is refused (format 3), and a TPM
        // source made there to seal that very key opens the keybag but cannot check one passcode,
        // not even the right one: the passcode's TPM key loads only in the first TPM.
        do {
            let copy = TemporaryDirectory("coffer-tpm-stolen")
            try copyState(["keybag", "keybag.key", "keychain.db"], from: f.dir.path, to: copy.path)
            let other = try SoftwareTPM()
            writeFileBytes(copy.file("device.key"), migratingKeyBytes)
            chmod(copy.file("device.key"), 0o600)
            #expect(status { try Keychain(directory: copy.path, lockingStateDirectory: false) } == .notAvailable)
            unlink(copy.file("device.key"))
            let forged = TPMDeviceKey(path: copy.file(TPMDeviceKey.fileName), tcti: other.tcti,
                                      adopting: migratingKeyBytes.withUnsafeBytes { SecureBytes(copying: $0) })
            // (An attacker's own code skips every check of the directory's files: `migratingDeviceKey`.)
            let kc = try Keychain(directory: copy.path, deviceKey: forged, lockingStateDirectory: false, migratingDeviceKey: true)
            let error = try #require(throws: SecError.self) { try kc.unlock(passcode: secret(Self.passcode)) }
            #expect(error.status == .decode && error.message.contains("another storage key"), "\(error)")
        }
        // A passcode change keeps the passcode bound to the TPM (a new counted key).
        try f.keychain.setPasscode(current: secret(Self.passcode), new: secret("new one"), kdf: testKDF)
        try f.reboot()
        #expect(status { try f.keychain.unlock(passcode: secret(Self.passcode)) } == .authFailed)
        try f.keychain.unlock(passcode: secret("new one"))
        #expect(try f.password(service: "s", account: "akpu") == "secret akpu")
    }
}
