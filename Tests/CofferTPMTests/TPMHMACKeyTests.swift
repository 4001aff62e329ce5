import CofferCrypto
import CofferModel
import CofferTestSupport
@testable import CofferTPM
import Foundation
import Glibc
import Testing

/// The TPM HMAC key against real swtpm instances (one or two per test, each a fresh TPM).
@Suite struct TPMHMACKeyTests {
    let input = Array("coffer device key tangle".utf8)

    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func createSaveLoadAndHMACAgree() throws {
        let sw = try SoftwareTPM()
        let path = sw.state.file("device-key.tpm")
        let auth = SecureBytes.random(count: 32)
        var first: [UInt8] = []
        do {
            let tpm = try TPM(tcti: sw.tcti)
            let key = try TPMHMACKey.create(authorization: auth, on: tpm)
            try key.save(to: path)
            var st = stat()
            #expect(stat(path, &st) == 0 && st.st_mode & 0o7777 == 0o600, "the blob file is private")
            first = bytes(try key.hmac(input, authorization: auth, on: tpm))
            #expect(first.count == 32)
            #expect(bytes(try key.hmac(input, authorization: auth, on: tpm)) == first, "the same key and input give the same HMAC")
            #expect(bytes(try key.hmac(input + [0], authorization: auth, on: tpm)) != first)
            #expect(try key.hmac([], authorization: auth, on: tpm).count == 32, "an empty input is an input")
            // swtpm has three transient object slots and no resource manager: a handle left loaded per call fails by the third.
            for _ in 0..<8 { #expect(bytes(try key.hmac(input, authorization: auth, on: tpm)) == first) }
            #expect(throws: TPMError.self) { try key.hmac([UInt8](repeating: 1, count: TPMHMACKey.maxInputBytes + 1), authorization: auth, on: tpm) }
            let other = try TPMHMACKey.create(authorization: auth, on: tpm)
            #expect(other.blob != key.blob)
            #expect(bytes(try other.hmac(input, authorization: auth, on: tpm)) != first, "another key gives another HMAC")
        }
        // A new connection (a new storage primary, derived again from the same seed) loads the saved blob.
        do {
            let tpm = try TPM(tcti: sw.tcti)
            let loaded = try TPMHMACKey.load(from: path, on: tpm)
            #expect(bytes(try loaded.hmac(input, authorization: auth, on: tpm)) == first)
            #expect(try tpm.lockoutState().failedTries == 0)
        }
        if SoftwareTPM.tools != nil {
            // Every transient object is flushed once the connection is released (its primary included).
            let handles = sw.tool("tpm2_getcap", ["handles-transient"])
            #expect(handles.status == 0 && !handles.stdout.contains("0x80"), "transient objects left loaded: \(handles)")
        }
    }

    /// The blob parser (no TPM): encode → decode gives the blob back, and no mutation of its bytes crashes it.
    @Test func blobsRoundTripAndMutationsNeverCrashTheParser() throws {
        let name: [UInt8] = [0x00, 0x0B] + (0..<32).map { UInt8($0) }
        let publicArea = [UInt8](TPMHMACKey.keyTemplate.dropLast(2)) + [0, 32] + [UInt8](repeating: 7, count: 32)
        var sized = publicArea
        sized[0] = UInt8((publicArea.count - 2) >> 8)
        sized[1] = UInt8((publicArea.count - 2) & 0xFF)
        let blob = TPMKeyBlob(parentName: name, publicArea: sized, privateArea: [0, 4, 1, 2, 3, 4])
        let good = blob.encoded()
        #expect(try TPMKeyBlob.decode(good) == blob)
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<3000 {
            var b = good
            for _ in 0..<Int.random(in: 1...4, using: &rng) {
                switch Int.random(in: 0..<3, using: &rng) {
                case 0: b[Int.random(in: 0..<b.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
                case 1: if !b.isEmpty { b.remove(at: Int.random(in: 0..<b.count, using: &rng)) }
                default: b.insert(UInt8.random(in: 0...255, using: &rng), at: Int.random(in: 0...b.count, using: &rng))
                }
            }
            if let decoded = try? TPMKeyBlob.decode(b) { #expect(decoded.encoded() == b, "what parses encodes back to the same bytes") }
        }
    }

    /// A `noDA` key (kind 2, the TPM device key's sealing key) never passes for a counted one (kind 1,
    /// the passcode's), nor the other way round: the kind field and the template's attributes must agree
    /// with what the caller expects.
    @Test func aNoDAKeyNeverStandsInForACountedOne() throws {
        let name: [UInt8] = [0x00, 0x0B] + (0..<32).map { UInt8($0) }
        func blob(kind: UInt16) -> TPMKeyBlob {
            var publicArea = [UInt8](TPMHMACKey.keyTemplate(kind: kind).dropLast(2)) + [0, 32] + [UInt8](repeating: 7, count: 32)
            publicArea[0] = UInt8((publicArea.count - 2) >> 8)
            publicArea[1] = UInt8((publicArea.count - 2) & 0xFF)
            return TPMKeyBlob(parentName: name, publicArea: publicArea, privateArea: [0, 4, 1, 2, 3, 4], kind: kind)
        }
        let noDA = blob(kind: TPMKeyBlob.kindHMACSHA256NoDA), counted = blob(kind: TPMKeyBlob.kindHMACSHA256)
        #expect(try TPMKeyBlob.decode(noDA.encoded(), kind: TPMKeyBlob.kindHMACSHA256NoDA) == noDA)
        #expect(throws: TPMError.self) { try TPMKeyBlob.decode(noDA.encoded()) }
        #expect(throws: TPMError.self) { try TPMKeyBlob.decode(counted.encoded(), kind: TPMKeyBlob.kindHMACSHA256NoDA) }
        // A kind-1 header over a noDA template (or the reverse) is refused too.
        var forged = noDA.encoded()
        forged[TPMKeyBlob.magic.count + 3] = 1
        #expect(throws: TPMError.self) { try TPMKeyBlob.decode(forged) }
    }

    /// tpm2-tools, an independent client, loads the blob's parts under a primary it makes from the
    /// documented template and computes the same HMAC with the documented authValue.
    @Test(.enabled(if: SoftwareTPM.available && SoftwareTPM.tools != nil, "\(SoftwareTPM.unavailableReason), or no tpm2-tools"))
    func tpm2ToolsComputeTheSameHMAC() throws {
        let sw = try SoftwareTPM()
        let auth = SecureBytes.random(count: 32)
        var ours: [UInt8] = []
        var blob: TPMKeyBlob?
        do {
            let tpm = try TPM(tcti: sw.tcti)
            let key = try TPMHMACKey.create(authorization: auth, on: tpm)
            ours = bytes(try key.hmac(input, authorization: auth, on: tpm))
            blob = key.blob
        } // released: our primary is flushed, so tpm2-tools has the TPM's object slots
        let b = try #require(blob)
        writeFileBytes(sw.state.file("key.pub"), b.publicArea)
        writeFileBytes(sw.state.file("key.priv"), b.privateArea)
        writeFileBytes(sw.state.file("msg"), input)
        let primary = sw.tool("tpm2_createprimary", ["-C", "o", "-g", "sha256", "-G", "ecc256:aes128cfb", "-a",
                                                     "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|noda|restricted|decrypt",
                                                     "-c", "primary.ctx"])
        #expect(primary.status == 0, "\(primary)")
        #expect(sw.tool("tpm2_readpublic", ["-c", "primary.ctx", "-n", "primary.name"]).status == 0)
        #expect(fileBytes(sw.state.file("primary.name")) == b.parentName, "tpm2-tools' primary from the documented template has the blob's parent Name")
        #expect(sw.tool("tpm2_flushcontext", ["-t"]).status == 0)
        let load = sw.tool("tpm2_load", ["-C", "primary.ctx", "-u", "key.pub", "-r", "key.priv", "-c", "key.ctx"])
        #expect(load.status == 0, "\(load)")
        #expect(sw.tool("tpm2_flushcontext", ["-t"]).status == 0)
        let authHex = hex(bytes(try TPMHMACKey.authValue(for: auth)))
        let hmac = sw.tool("tpm2_hmac", ["-c", "key.ctx", "-p", "hex:" + authHex, "-g", "sha256", "-o", "out", "msg"])
        #expect(hmac.status == 0, "\(hmac)")
        #expect(fileBytes(sw.state.file("out")) == ours)
        _ = sw.tool("tpm2_flushcontext", ["-t"])
    }

    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func wrongAuthorizationIsCountedAndLocksOut() throws {
        let sw = try SoftwareTPM()
        let tpm = try TPM(tcti: sw.tcti)
        let auth = SecureBytes.random(count: 32)
        let key = try TPMHMACKey.create(authorization: auth, on: tpm)
        let before = try tpm.lockoutState()
        #expect(before.failedTries == 0 && !before.inLockout)
        #expect(before.maxTries > 0 && before.maxTries <= 32, "swtpm's default MAX_AUTH_FAIL is small (3)")
        for n in 1...before.maxTries {
            #expect(throws: TPMError.wrongAuthorization) { try key.hmac(input, authorization: SecureBytes.random(count: 32), on: tpm) }
            #expect(try tpm.lockoutState().failedTries == n, "the TPM counted wrong authorization \(n)")
        }
        #expect(TPMError.wrongAuthorization.osStatus == SecStatus.authFailed.rawValue)
        let locked = try tpm.lockoutState()
        #expect(locked.inLockout)
        // In lockout even the right authorization is refused, and says why.
        #expect(throws: TPMError.lockout) { try key.hmac(input, authorization: auth, on: tpm) }
        #expect(TPMError.lockout.description.contains("locked out"))
        #expect(try tpm.lockoutState().failedTries == before.maxTries, "an attempt in lockout is not counted again")
        if SoftwareTPM.tools != nil {
            // The HMAC sessions of failed commands were flushed (swtpm holds three).
            let sessions = sw.tool("tpm2_getcap", ["handles-loaded-session"])
            #expect(sessions.status == 0 && !sessions.stdout.contains("0x2"), "sessions left loaded: \(sessions)")
        }
    }

    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func aBlobFromAnotherTPMDoesNotLoad() throws {
        let a = try SoftwareTPM(), b = try SoftwareTPM()
        let tpmA = try TPM(tcti: a.tcti), tpmB = try TPM(tcti: b.tcti)
        let auth = SecureBytes.random(count: 32)
        let key = try TPMHMACKey.create(authorization: auth, on: tpmA)
        let path = a.state.file("device-key.tpm")
        try key.save(to: path)
        let copy = b.state.file("device-key.tpm")
        try FileManager.default.copyItem(atPath: path, toPath: copy)
        let error = try #require(throws: TPMError.self) { try TPMHMACKey.load(from: copy, on: tpmB) }
        guard case .foreignBlob = error else { Issue.record("expected foreignBlob, got \(error)"); return }
        #expect(error.osStatus == SecStatus.decode.rawValue)
        // What happened, once, and no advice (the keybag gives the way back): issue #41.
        #expect(error.description.hasPrefix("the TPM key blob was made under another storage key, by another TPM or by this TPM before "
                                            + "its owner hierarchy was cleared (the key's storage key is 000b"), "\(error)")
        #expect(!error.description.contains("escrow") && !error.description.contains("restore"), "\(error)")
        #expect(throws: TPMError.self) { try key.hmac(input, authorization: auth, on: tpmB) }
        // A blob made on A that names B's storage key gets past the Name check: B's TPM refuses it itself.
        let onB = try TPMHMACKey.create(authorization: auth, on: tpmB)
        let forged = TPMHMACKey(blob: TPMKeyBlob(parentName: onB.blob.parentName, publicArea: key.blob.publicArea,
                                                 privateArea: key.blob.privateArea))
        let refused = try #require(throws: TPMError.self) { try forged.hmac(input, authorization: auth, on: tpmB) }
        guard case .corruptBlob = refused else { Issue.record("expected corruptBlob, got \(refused)"); return }
        // Both TPMs still work.
        #expect(try key.hmac(input, authorization: auth, on: tpmA).count == 32)
        #expect(try onB.hmac(input, authorization: auth, on: tpmB).count == 32)
        #expect(try tpmB.lockoutState().failedTries == 0, "a foreign blob is not a wrong passcode")
    }

    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func truncatedAlteredAndWrongVersionBlobsFailCleanly() throws {
        let sw = try SoftwareTPM()
        let tpm = try TPM(tcti: sw.tcti)
        let auth = SecureBytes.random(count: 32)
        let key = try TPMHMACKey.create(authorization: auth, on: tpm)
        let good = key.blob.encoded()
        let path = sw.state.file("blob")
        func loading(_ bytes: [UInt8]) -> TPMError? {
            writeFileBytes(path, bytes)
            do { _ = try TPMHMACKey.load(from: path, on: tpm); return nil } catch { return error }
        }
        for n in 0..<good.count {
            guard case .corruptBlob = loading(Array(good[..<n])) else { Issue.record("a blob truncated to \(n) bytes was not refused as corrupt"); continue }
        }
        #expect(loading(good + [0]).map { if case .corruptBlob = $0 { true } else { false } } == true, "trailing bytes")
        var version = good
        version[9] = 2
        #expect(loading(version) == .unsupportedBlobVersion(2))
        #expect(TPMError.unsupportedBlobVersion(2).osStatus == SecStatus.decode.rawValue)
        var magic = good
        magic[0] ^= 1
        #expect(loading(magic).map { if case .corruptBlob = $0 { true } else { false } } == true, "bad magic")
        // The public part made DA-exempt (noDA set): refused before it reaches the TPM.
        var noDA = good
        let attributes = TPMKeyBlob.magic.count + 4 + 2 + 34 + 2 + 4
        noDA[attributes + 2] |= 0x04
        #expect(loading(noDA).map { if case .corruptBlob = $0 { true } else { false } } == true, "a noDA key")
        // A byte of the encrypted private part flipped: the TPM's integrity check refuses it.
        var altered = good
        altered[good.count - 5] ^= 0x40
        let refused = loading(altered)
        #expect(refused.map { if case .corruptBlob = $0 { true } else { false } } == true, "an altered private part: \(String(describing: refused))")
        #expect(loading([UInt8](repeating: 0x41, count: TPMKeyBlob.maxBytes + 1)).map { if case .corruptBlob = $0 { true } else { false } } == true)
        #expect(throws: TPMError.self) { try TPMHMACKey.load(from: sw.state.file("missing"), on: tpm) }
        // Nothing was lost: the good blob still loads and works, and nothing counted as a wrong passcode.
        #expect(loading(good) == nil)
        #expect(try key.hmac(input, authorization: auth, on: tpm).count == 32)
        #expect(try tpm.lockoutState().failedTries == 0)
    }

    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func noTPMIsAClearError() throws {
        let sw = try SoftwareTPM()
        let tcti = sw.tcti
        sw.stop()
        let error = try #require(throws: TPMError.self) { try TPM(tcti: tcti) }
        guard case .unavailable = error else { Issue.record("expected unavailable, got \(error)"); return }
        #expect(error.osStatus == SecStatus.notAvailable.rawValue)
        let device = try #require(throws: TPMError.self) { try TPM(tcti: "device:" + sw.state.file("no-tpmrm0")) }
        guard case .unavailable = device else { Issue.record("expected unavailable, got \(device)"); return }
    }

    @Test func authorizationSeedsOutOfRangeAreRefused() {
        #expect(throws: TPMError.self) { try TPMHMACKey.authValue(for: secret(count: 15)) }
        #expect(throws: TPMError.self) { try TPMHMACKey.authValue(for: secret(count: 65)) }
        #expect(throws: Never.self) { try TPMHMACKey.authValue(for: secret(count: 16)) }
    }

    /// Every error's OSStatus is one of SecStatus's stable codes.
    @Test func everyErrorMapsToASecStatus() {
        let all: [(TPMError, SecStatus)] = [
            (.unavailable(tcti: "x", reason: "y"), .notAvailable), (.wrongAuthorization, .authFailed), (.lockout, .authFailed),
            (.corruptBlob("x"), .decode), (.unsupportedBlobVersion(9), .decode), (.foreignBlob("x"), .decode),
            (.nvIndexConflict(index: 1, reason: "x"), .param), (.invalidArgument("x"), .param), (.file("x"), .io),
            (.tpmFailure(command: "x", code: 1, text: "y"), .internalComponent),
        ]
        for (error, status) in all { #expect(SecStatus(rawValue: error.osStatus) == status, "\(error)") }
    }
}

func bytes(_ s: SecureBytes) -> [UInt8] { s.withUnsafeBytes { Array($0) } }
func hex(_ b: [UInt8]) -> String { b.map { String(format: "%02x", $0) }.joined() }
