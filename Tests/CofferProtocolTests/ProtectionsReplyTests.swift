import CofferModel
@testable import CofferProtocol
import Testing

/// PROTECTIONS_REPLY's attempt-counting byte (issue #41): 0 the `attempts` file, 1 the TPM, 2 the TPM
/// with an empty lockout authorization (anyone who reaches it can reset its count); nothing else.
@Suite struct ProtectionsReplyTests {
    func decode(_ frame: [UInt8]) throws -> AgentResponse {
        try Array(frame.dropFirst(4)).withUnsafeBytes { b in try AgentResponse.decodeBody(b).1 }
    }

    @Test(arguments: [(false, false, UInt8(0)), (true, false, 1), (true, true, 2), (false, true, 0)])
    func attemptCountingIsOneByte(countedByTPM: Bool, lockoutAuthorizationEmpty: Bool, byte: UInt8) throws {
        let reply = ProtectionsReply(deviceKeyInTPM: true, attemptsCountedByTPM: countedByTPM,
                                     tpmLockoutAuthorizationEmpty: lockoutAuthorizationEmpty, rollbackDetection: false)
        let f = AgentResponse.protections(reply).encodeFrame(requestID: 3)
        #expect(f == [0, 0, 0, 8, 0x95, 0, 0, 0, 3, 1, byte, 0])
        guard case .protections(let back) = try decode(f) else { Issue.record("not a protections reply"); return }
        #expect(back == reply)
        // Without the TPM counting, its lockout authorization says nothing.
        #expect(back.tpmLockoutAuthorizationEmpty == (countedByTPM && lockoutAuthorizationEmpty))
    }

    @Test(arguments: [[UInt8](arrayLiteral: 2, 0, 0), [1, 3, 0], [1, 1, 2], [1, 0xFF, 0]])
    func otherValuesAreMalformed(_ payload: [UInt8]) {
        let f: [UInt8] = [0, 0, 0, 8, 0x95, 0, 0, 0, 3] + payload
        #expect(throws: ProtocolError.self) { try decode(f) }
        do { _ = try decode(f) } catch let e as ProtocolError { #expect(e.secError.status == .param) } catch {}
    }
}
