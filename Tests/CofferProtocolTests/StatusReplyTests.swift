import CofferCrypto
import CofferModel
@testable import CofferProtocol
import Testing

/// STATUS_REPLY carries a typed lock state; the wire byte is unchanged (0 boot, 1 locked, 2 unlocked).
@Suite struct StatusReplyTests {
    func frame(_ state: LockState) -> [UInt8] {
        AgentResponse.status(StatusReply(lockState: state, passcodeSet: true, itemCount: 7, agentVersion: "v",
                                    lockedMemoryBytes: 0, idleLockSeconds: 0)).encodeFrame(requestID: 1)
    }

    func decode(_ frame: [UInt8]) throws -> AgentResponse {
        try Array(frame.dropFirst(4)).withUnsafeBytes { b in try AgentResponse.decodeBody(b).1 }
    }

    @Test(arguments: [(LockState.boot, UInt8(0)), (.locked, 1), (.unlocked, 2)])
    func theLockStateIsOneWireByte(state: LockState, byte: UInt8) throws {
        let f = frame(state)
        #expect(f[4 + 5] == byte) // after the length (4) and the body's type and request id (5)
        guard case .status(let s) = try decode(f) else { Issue.record("not a status"); return }
        #expect(s.lockState == state)
    }

    @Test func anUnknownLockStateByteIsMalformed() {
        var f = frame(.unlocked)
        f[4 + 5] = 3
        #expect(throws: ProtocolError.self) { try decode(f) }
        do { _ = try decode(f) } catch let e as ProtocolError { #expect(e.secError.status == .param) } catch {}
    }
}
