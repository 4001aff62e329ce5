@testable import CofferTPM
import CofferModel
import CofferTestSupport
import Testing

/// The NV monotonic counter against real swtpm instances.
@Suite struct TPMNVCounterTests {
    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func defineReadIncrementAndSurviveARestart() throws {
        let sw = try SoftwareTPM()
        let index: UInt32 = 0x0100_C0F0
        var value: UInt64 = 0
        do {
            let tpm = try TPM(tcti: sw.tcti)
            let counter = try TPMNVCounter.define(index: index, on: tpm)
            value = try counter.read(on: tpm)
            #expect(try counter.increment(on: tpm) == value + 1)
            #expect(try counter.read(on: tpm) == value + 1)
            // Defining again opens the same counter; its value is kept.
            #expect(try TPMNVCounter.define(index: index, on: tpm).read(on: tpm) == value + 1)
        }
        try sw.restart()
        let tpm = try TPM(tcti: sw.tcti)
        let counter = TPMNVCounter(index: index)
        #expect(try counter.read(on: tpm) == value + 1, "the counter survived the TPM's restart")
        #expect(try counter.increment(on: tpm) == value + 2)
        #expect(throws: TPMError.self) { try TPMNVCounter.define(index: 0x8100_0001, on: tpm) }
    }

    @Test(.enabled(if: SoftwareTPM.available && SoftwareTPM.tools != nil, "\(SoftwareTPM.unavailableReason), or no tpm2-tools"))
    func anIndexWithOtherAttributesIsRefused() throws {
        let sw = try SoftwareTPM()
        let index = "0x0100c0f1"
        let define = sw.tool("tpm2_nvdefine", [index, "-C", "o", "-s", "8", "-a", "ownerread|ownerwrite"])
        #expect(define.status == 0, "\(define)")
        let tpm = try TPM(tcti: sw.tcti)
        let error = try #require(throws: TPMError.self) { try TPMNVCounter.define(index: 0x0100_C0F1, on: tpm) }
        guard case .nvIndexConflict = error else { Issue.record("expected nvIndexConflict, got \(error)"); return }
        #expect(error.osStatus == SecStatus.param.rawValue)
        #expect(sw.tool("tpm2_nvreadpublic", [index]).status == 0, "the other index was left alone")
    }

    /// isDefined asks the TPM's list of handles (TPM2_GetCapability), not a TPM2_NV_ReadPublic that
    /// fails and that libtss2 logs as an error (issue #41): an absent index, the index just below a
    /// defined one (the list starts at the next handle), a defined one and an undefined one again.
    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func isDefinedTellsAbsentFromDefinedIndicesByTheHandleList() throws {
        let sw = try SoftwareTPM()
        let tpm = try TPM(tcti: sw.tcti)
        let index: UInt32 = 0x0100_C0F3
        #expect(try !TPMNVCounter.isDefined(index: index, on: tpm))
        let counter = try TPMNVCounter.define(index: index, on: tpm)
        #expect(try TPMNVCounter.isDefined(index: index, on: tpm))
        #expect(try !TPMNVCounter.isDefined(index: index - 1, on: tpm), "the next defined handle is not this one")
        #expect(try !TPMNVCounter.isDefined(index: index + 1, on: tpm))
        let old = try counter.increment(on: tpm)
        try counter.undefine(on: tpm)
        #expect(try !TPMNVCounter.isDefined(index: index, on: tpm))
        // Defined again after it went away: a new counter that starts no lower than the old one.
        #expect(try TPMNVCounter.define(index: index, on: tpm).read(on: tpm) >= old)
    }
}
