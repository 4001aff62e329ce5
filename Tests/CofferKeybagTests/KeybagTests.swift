@testable import CofferKeybag
import CofferCrypto
import CofferModel
import CofferSystem
import CofferTestSupport
import Glibc
import Testing

func keyBytes(_ bag: Keybag, _ c: ProtectionClass) throws -> [UInt8] {
    try bag.withClassKey(c) { Array($0) }
}

@Suite struct KeybagTests {
    @Test func newKeybagWithoutPasscodeIsUnlockedAndHasNoPasscodeClass() throws {
        let dir = TemporaryDirectory()
        let bag = try Keybag.openOrCreate(directory: dir.path, deviceKey: FileDeviceKey(path: dir.file("device.key")))
        #expect(bag.state == .unlocked)
        #expect(!bag.isPasscodeSet)
        for c in ProtectionClass.allCases where !c.requiresPasscode { #expect(bag.isAvailable(c)) }
        #expect(throws: SecError.self) { try bag.withClassKey(.whenPasscodeSetThisDeviceOnly) { _ in () } }
        do {
            try bag.withClassKey(.whenPasscodeSetThisDeviceOnly) { _ in () }
        } catch {
            #expect(error.status == .notAvailable)
        }
        #expect(Files.mode(dir.file("device.key")) == 0o600)
        #expect(fileBytes(dir.file("device.key")).count == 32)
        #expect(Files.mode(dir.file("keybag.key")) == 0o600)
    }

    @Test func classKeysAreDistinctAndSurviveReopen() throws {
        let dir = TemporaryDirectory()
        let src = FileDeviceKey(path: dir.file("device.key"))
        let a = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        let keys = try ProtectionClass.allCases.filter { !$0.requiresPasscode }.map { try keyBytes(a, $0) }
        #expect(Set(keys).count == keys.count)
        let b = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        #expect(try keyBytes(b, .whenUnlocked) == keys[0])
    }

    @Test func lockUnlockAndRebootTransitionsPerClass() throws {
        let dir = TemporaryDirectory()
        let src = FileDeviceKey(path: dir.file("device.key"))
        let bag = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        try bag.setPasscode(current: nil, new: secret("1234"), kdf: testKDF)
        #expect(bag.isPasscodeSet && bag.state == .unlocked)
        #expect(ProtectionClass.allCases.allSatisfy { bag.isAvailable($0) })
        let akpu = try keyBytes(bag, .whenPasscodeSetThisDeviceOnly)

        bag.lock()
        #expect(bag.state == .locked)
        for c in ProtectionClass.allCases {
            #expect(bag.isAvailable(c) == (c.availability != .whenUnlocked), "\(c)")
        }
        do { _ = try keyBytes(bag, .whenUnlocked); Issue.record("locked key handed out") } catch let e as SecError {
            #expect(e.status == .interactionNotAllowed)
        }

        // Reboot: a new process sees only the Always classes until the first unlock.
        let rebooted = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        #expect(rebooted.state == .boot)
        for c in ProtectionClass.allCases { #expect(rebooted.isAvailable(c) == (c.availability == .always), "\(c)") }
        rebooted.lock()
        #expect(rebooted.state == .boot)
        try rebooted.unlock(passcode: secret("1234"))
        #expect(rebooted.state == .unlocked)
        #expect(ProtectionClass.allCases.allSatisfy { rebooted.isAvailable($0) })
        #expect(try keyBytes(rebooted, .whenPasscodeSetThisDeviceOnly) == akpu)
        rebooted.lock()
        #expect(rebooted.isAvailable(.afterFirstUnlock) && !rebooted.isAvailable(.whenUnlockedThisDeviceOnly))
    }

    @Test func wrongPasscodeFailsAndChangesNothing() throws {
        let dir = TemporaryDirectory()
        let src = FileDeviceKey(path: dir.file("device.key"))
        try Keybag.openOrCreate(directory: dir.path, deviceKey: src).setPasscode(current: nil, new: secret("right"), kdf: testKDF)
        let bag = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        let before = (fileBytes(dir.file("keybag")), fileBytes(dir.file("keybag.key")))
        for wrong in ["guess1", "righ", "right ", "RIGHT"] {
            do { try bag.unlock(passcode: secret(wrong)); Issue.record("wrong passcode accepted") } catch {
                #expect(error.status == .authFailed)
                #expect(!error.message.contains(wrong))
            }
        }
        #expect(throws: SecError.self) { try bag.unlock(passcode: nil) }
        #expect(bag.state == .boot)
        #expect(!bag.isAvailable(.afterFirstUnlock))
        #expect(fileBytes(dir.file("keybag")) == before.0)
        #expect(fileBytes(dir.file("keybag.key")) == before.1)
        try bag.unlock(passcode: secret("right"))
        #expect(bag.state == .unlocked)
    }

    @Test func passcodeChangeReplacesTheKeybagKeySoOldFilesOpenNothing() throws {
        let dir = TemporaryDirectory()
        let src = FileDeviceKey(path: dir.file("device.key"))
        let bag = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        try bag.setPasscode(current: nil, new: secret("old"), kdf: testKDF)
        let ck = try keyBytes(bag, .afterFirstUnlock)
        let oldKeybag = fileBytes(dir.file("keybag")), oldKeyFile = fileBytes(dir.file("keybag.key"))

        do { try bag.setPasscode(current: secret("nope"), new: secret("new"), kdf: testKDF); Issue.record("accepted") } catch {
            #expect(error.status == .authFailed)
        }
        #expect(throws: SecError.self) { try bag.setPasscode(current: nil, new: secret("new"), kdf: testKDF) }
        bag.lock() // a change works while locked: it unwraps from the file with the current passcode
        try bag.setPasscode(current: secret("old"), new: secret("new"), kdf: testKDF)
        #expect(fileBytes(dir.file("keybag.key")) != oldKeyFile)
        // Issue #10 item 3: a change rotates the class keys (the keychain re-seals its items under them).
        #expect(try keyBytes(bag, .afterFirstUnlock) != ck)
        let rotated = try keyBytes(bag, .afterFirstUnlock)

        let rebooted = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        #expect(throws: SecError.self) { try rebooted.unlock(passcode: secret("old")) }
        try rebooted.unlock(passcode: secret("new"))
        #expect(try keyBytes(rebooted, .afterFirstUnlock) == rotated)

        // An attacker restores the old keybag file: with the current key file it does not even open.
        writeFileBytes(dir.file("keybag"), oldKeybag)
        do { _ = try Keybag.openOrCreate(directory: dir.path, deviceKey: src); Issue.record("old keybag opened") } catch {
            #expect(error.status == .decode)
        }
    }

    @Test func tamperedKeybagOrKeyFileFailsClearly() throws {
        let dir = TemporaryDirectory()
        let src = FileDeviceKey(path: dir.file("device.key"))
        try Keybag.openOrCreate(directory: dir.path, deviceKey: src).setPasscode(current: nil, new: secret("pw"), kdf: testKDF)
        let good = fileBytes(dir.file("keybag"))
        for i in stride(from: 0, to: good.count, by: 7) {
            var bad = good
            bad[i] ^= 0x80
            writeFileBytes(dir.file("keybag"), bad)
            do { _ = try Keybag.openOrCreate(directory: dir.path, deviceKey: src); Issue.record("tampered byte \(i) accepted") } catch {
                #expect(error.status == .decode)
            }
        }
        writeFileBytes(dir.file("keybag"), good)
        writeFileBytes(dir.file("keybag"), Array(good.prefix(10)))
        #expect(throws: SecError.self) { _ = try Keybag.openOrCreate(directory: dir.path, deviceKey: src) }
        writeFileBytes(dir.file("keybag"), good)
        var key = fileBytes(dir.file("keybag.key"))
        key[key.count - 1] ^= 1
        writeFileBytes(dir.file("keybag.key"), key)
        #expect(throws: SecError.self) { _ = try Keybag.openOrCreate(directory: dir.path, deviceKey: src) }
        // A different device key cannot open the keybag either.
        writeFileBytes(dir.file("other.key"), [UInt8](repeating: 9, count: 32))
        chmod(dir.file("other.key"), 0o600)
        key[key.count - 1] ^= 1
        writeFileBytes(dir.file("keybag.key"), key)
        #expect(throws: SecError.self) {
            _ = try Keybag.openOrCreate(directory: dir.path, deviceKey: FileDeviceKey(path: dir.file("other.key")))
        }
        _ = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
    }

    @Test func missingKeyFileWithExistingKeybagIsAnErrorNotAFreshKeybag() throws {
        let dir = TemporaryDirectory()
        let src = FileDeviceKey(path: dir.file("device.key"))
        _ = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        unlink(dir.file("keybag.key"))
        do { _ = try Keybag.openOrCreate(directory: dir.path, deviceKey: src); Issue.record("opened") } catch {
            #expect(error.status == .decode)
            #expect(error.message.contains("missing"))
        }
    }

    @Test func interruptedReplacementIsFinishedOnLoad() throws {
        let dir = TemporaryDirectory()
        let src = FileDeviceKey(path: dir.file("device.key"))
        let bag = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        try bag.setPasscode(current: nil, new: secret("pw"), kdf: testKDF)
        // Simulate a crash after the key file was committed but before keybag.next was renamed.
        let committed = fileBytes(dir.file("keybag"))
        try Files.renameDurably(dir.file("keybag"), dir.file("keybag.next"))
        writeFileBytes(dir.file("keybag"), [0x43, 0x46, 0x4b, 0x42, 1, 0, 0]) // stale/garbage old keybag
        let recovered = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        try recovered.unlock(passcode: secret("pw"))
        #expect(fileBytes(dir.file("keybag")) == committed)
        #expect(!Files.exists(dir.file("keybag.next")))
        // A crash before the commit point leaves a keybag.next the old key cannot open: it is dropped.
        writeFileBytes(dir.file("keybag.next"), [1, 2, 3])
        _ = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        #expect(!Files.exists(dir.file("keybag.next")))
    }

    @Test func deviceKeyReadableByOthersIsRefused() throws {
        let dir = TemporaryDirectory()
        let path = dir.file("device.key")
        _ = try FileDeviceKey(path: path).loadDeviceKey()
        chmod(path, 0o640)
        #expect(throws: SecError.self) { _ = try FileDeviceKey(path: path).loadDeviceKey() }
        chmod(path, 0o600)
        writeFileBytes(path, [1, 2, 3])
        chmod(path, 0o600)
        #expect(throws: SecError.self) { _ = try FileDeviceKey(path: path).loadDeviceKey() }
    }

    @Test func calibrationMeetsAppleFloorAndIsStored() throws {
        let dir = TemporaryDirectory()
        let src = FileDeviceKey(path: dir.file("device.key"))
        let bag = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        try bag.setPasscode(current: nil, new: secret("calibrate me"))
        let p = try #require(bag.kdfParameters)
        #expect(p.memLimit >= 64 << 20)
        let rebooted = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        #expect(rebooted.kdfParameters == p)
        // Time a real unlock: the derivation must take at least ~80 ms (allow scheduler noise below).
        var best = Double.infinity
        for _ in 0..<3 {
            let t0 = nowMillis()
            try rebooted.unlock(passcode: secret("calibrate me"))
            best = min(best, nowMillis() - t0)
        }
        #expect(best >= 70, "unlock took \(best) ms")
    }
}

@Suite struct KeybagDecoderTests {
    /// Should-fix of issue #10: with a passcode set, a passcode-class slot marked device-wrapped (and
    /// really sealed under the device wrap key, so only the marking gives it away) is rejected.
    @Test func passcodeClassSlotMarkedDeviceWrappedIsRejected() throws {
        let dir = TemporaryDirectory()
        let src = FileDeviceKey(path: dir.file("device.key"))
        let bag = try Keybag.openOrCreate(directory: dir.path, deviceKey: src)
        try bag.setPasscode(current: nil, new: secret("pw"), kdf: testKDF)
        let deviceKey = try src.loadDeviceKey()
        let paths = KeybagPaths(directory: dir.path)
        let good = (fileBytes(dir.file("keybag")), fileBytes(dir.file("keybag.key")))
        for slot in [Slot.classKey(.whenUnlocked), Slot.metadataKey(.afterFirstUnlock), Slot.passcodeIndexKey] {
            writeFileBytes(dir.file("keybag"), good.0)
            writeFileBytes(dir.file("keybag.key"), good.1)
            var file = try #require(try KeybagFile.load(paths, deviceKey: deviceKey))
            let dwk = deviceKey.withUnsafeBytes { Slot.deviceWrapKey($0) }
            file.entries[slot] = .seal(.random(count: 32), slot: slot, wrapping: .device, key: dwk)
            file.generation += 1
            // The decoder itself names the reason.
            let body = file.encodeBody().withUnsafeBytes { SecureBytes(copying: $0) }
            do { _ = try KeybagFile.decodeBody(body, version: 2); Issue.record("decoded") } catch {
                #expect(error.reason.contains("wrapping"), "\(error)")
            }
            try file.save(paths, keybagKey: .random(count: 32), deviceKey: deviceKey)
            do { _ = try Keybag.openOrCreate(directory: dir.path, deviceKey: src); Issue.record("slot \(slot) accepted") } catch {
                #expect(error.status == .decode)
            }
        }
        // And without a passcode, a passcode-wrapped slot is rejected too.
        let plain = TemporaryDirectory()
        let psrc = FileDeviceKey(path: plain.file("device.key"))
        _ = try Keybag.openOrCreate(directory: plain.path, deviceKey: psrc)
        let pkey = try psrc.loadDeviceKey()
        let ppaths = KeybagPaths(directory: plain.path)
        var file = try #require(try KeybagFile.load(ppaths, deviceKey: pkey))
        file.entries[Slot.classKey(.always)] = .seal(.random(count: 32), slot: Slot.classKey(.always), wrapping: .passcode, key: .random(count: 32))
        file.generation += 1
        try file.save(ppaths, keybagKey: .random(count: 32), deviceKey: pkey)
        #expect(throws: SecError.self) { _ = try Keybag.openOrCreate(directory: plain.path, deviceKey: psrc) }
    }

    @Test func aNewKeybagIsFormatTwoWithBothIndexTiers() throws {
        let dir = TemporaryDirectory()
        let bag = try Keybag.openOrCreate(directory: dir.path, deviceKey: FileDeviceKey(path: dir.file("device.key")))
        #expect(bag.formatVersion == 2 && !bag.needsRekey)
        #expect(bag.isAvailable(.device) && bag.isAvailable(.passcode))
        #expect(fileBytes(dir.file("keybag"))[4] == 2)
        let d = try bag.withIndexKey(.device) { Array($0) }
        let p = try bag.withIndexKey(.passcode) { Array($0) }
        #expect(d != p)
    }
}
