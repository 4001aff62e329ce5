import CofferCrypto
import CofferTestSupport
@testable import CofferTPM
import Foundation
import Glibc
import Testing

/// TPMA_PERMANENT.lockoutAuthSet (issue #41, F2) against real swtpm instances: with it clear, anyone
/// who can send the TPM a command resets its count of wrong authorizations; the administrator's
/// one-time `tpm2_changeauth -c lockout` sets it and takes that away.
@Suite struct TPMLockoutAuthorizationTests {
    let input = Array("coffer lockout authorization".utf8)

    /// Writes `value` to a new private file in `sw`'s directory (tpm2-tools reads `file:PATH`, so no
    /// authorization goes into an argument list) and returns `file:PATH`.
    func authFile(_ sw: SoftwareTPM, _ name: String, _ value: String) throws -> String {
        let path = sw.state.file(name)
        try value.write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o600)
        return "file:" + path
    }

    @Test(.enabled(if: SoftwareTPM.available && SoftwareTPM.tools != nil, "\(SoftwareTPM.unavailableReason), or no tpm2-tools"))
    func lockoutAuthSetSaysWhetherAnyoneCanResetTheCount() throws {
        let sw = try SoftwareTPM()
        let tpm = try TPM(tcti: sw.tcti)
        let auth = SecureBytes.random(count: 32)
        let key = try TPMHMACKey.create(authorization: auth, on: tpm)
        func failOnce() {
            #expect(throws: TPMError.wrongAuthorization) { try key.hmac(input, authorization: SecureBytes.random(count: 32), on: tpm) }
        }
        // A fresh TPM, as most machines have it: no lockout authorization, and a reset needs none.
        #expect(try !tpm.lockoutState().lockoutAuthSet)
        failOnce()
        #expect(try tpm.lockoutState().failedTries == 1)
        let reset = sw.tool("tpm2_dictionarylockout", ["--clear-lockout"])
        #expect(reset.status == 0, "\(reset)")
        #expect(try tpm.lockoutState().failedTries == 0, "an empty lockout authorization lets anyone reset the count")
        // The administrator's step sets the bit; setting the authorization back to empty clears it.
        let secret = try authFile(sw, "lockout-auth", "the administrator's lockout authorization")
        let set = sw.tool("tpm2_changeauth", ["-c", "lockout", secret])
        #expect(set.status == 0, "\(set)")
        #expect(try tpm.lockoutState().lockoutAuthSet)
        let back = sw.tool("tpm2_changeauth", ["-c", "lockout", "-p", secret])
        #expect(back.status == 0, "\(back)")
        #expect(try !tpm.lockoutState().lockoutAuthSet, "an empty authorization again: anyone can reset")
        #expect(sw.tool("tpm2_changeauth", ["-c", "lockout", secret]).status == 0)
        #expect(try tpm.lockoutState().lockoutAuthSet)
        // Set: the reset without it is refused and the count stays (the refused attempt also blocks the
        // lockout authorization itself for TPM2_PT_LOCKOUT_RECOVERY, which is why it is tried last here).
        failOnce()
        let refused = sw.tool("tpm2_dictionarylockout", ["--clear-lockout"])
        #expect(refused.status != 0, "\(refused)")
        let state = try tpm.lockoutState()
        #expect(state.failedTries >= 1 && state.lockoutAuthSet, "\(state)")
        #expect(try key.hmac(input, authorization: auth, on: tpm).count == 32, "the right authorization still works")
    }

    /// Bit 2 of TPMA_PERMANENT, not its neighbours: owner and endorsement authorizations (bits 0 and 1)
    /// leave it clear.
    @Test(.enabled(if: SoftwareTPM.available && SoftwareTPM.tools != nil, "\(SoftwareTPM.unavailableReason), or no tpm2-tools"))
    func otherHierarchiesAuthorizationsDoNotSetIt() throws {
        let sw = try SoftwareTPM()
        let secret = try authFile(sw, "hierarchy-auth", "an owner's authorization")
        for hierarchy in ["owner", "endorsement"] {
            let r = sw.tool("tpm2_changeauth", ["-c", hierarchy, secret])
            #expect(r.status == 0, "\(hierarchy): \(r)")
        }
        let tpm = try TPM(tcti: sw.tcti)
        let state = try tpm.lockoutState()
        #expect(!state.lockoutAuthSet && !state.inLockout, "\(state)")
        #expect(TPMProperty.lockoutAuthSetBit == 0x4, "TPMA_PERMANENT.lockoutAuthSet is bit 2 (TPM 2.0 Part 2)")
    }
}
