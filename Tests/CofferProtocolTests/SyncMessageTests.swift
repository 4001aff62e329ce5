import CofferModel
import CofferProtocol
import Testing

/// The sync replies (WireProtocol.md, Sync) refuse what their rules forbid; the vectors check the valid
/// ones byte for byte (a reply vector's error outcome is only checked as a request).
@Suite struct SyncMessageTests {
    func decodeReply(_ hex: String) throws -> AgentResponse {
        let frame = hexBytes(hex)
        return try Array(frame[4...]).withUnsafeBytes { try AgentResponse.decodeBody($0).1 }
    }

    @Test func repliesOutsideTheirRulesAreRefused() {
        // SYNC_DEVICES with flags 4.
        #expect(throws: ProtocolError.self) { try decodeReply("000000169900000037000100043061316200066c6170746f7004") }
        // SYNC_STATUS_REPLY with state 4.
        #expect(throws: ProtocolError.self) {
            try decodeReply("000000299a0000003a04000000000000000000000000000000000000000000012c000000000000000000000000")
        }
        // SYNC_STATUS_REPLY: phase 5; phase 2 (verifying) while not running; done 3 above total 2; the
        // layout from before the progress fields (cut short).
        let idle = "000000329a0000003a02000000018bcfe568000000018bcfe5680000000000012c000000010000000500000002"
        #expect(throws: Never.self) { try decodeReply(idle + "000000000000000000") }
        for bad in [idle + "050000000000000000", idle + "020000000100000002",
                    "000000299a0000003a02000000018bcfe568000000018bcfe5680000000000012c000000010000000500000002"] {
            #expect(throws: ProtocolError.self, "\(bad)") { try decodeReply(bad) }
        }
        let running = "000000329a0000003c02010000018bcfe568000000018bcfe5680000000000012c000000010000000500000002"
        #expect(throws: Never.self) { try decodeReply(running + "020000000200000003") }
        #expect(throws: ProtocolError.self) { try decodeReply(running + "020000000300000002") }
        // SYNC_CONFLICTS_REPLY whose loser is "deleted" 2.
        #expect(throws: ProtocolError.self) {
            try decodeReply("0000003f9b0000003d00000001000a34653566363037312d37000467656e7000046d61696c00026d650000018bcfe569f40000018bcfe5699000076465736b746f7002")
        }
    }

    @Test func aStatusRoundTrips() throws {
        let s = SyncStatus(state: .waiting, running: true, lastSuccessMillis: 1, lastAttemptMillis: 2, lastError: "errSecIO: git",
                           intervalSeconds: 300, conflicts: 3, applied: 4, recorded: 5, phase: .verifying, done: 3_200, total: 10_000)
        let frame = AgentResponse.syncStatus(s).encodeFrame(requestID: 9)
        guard case .syncStatus(let back) = try Array(frame[4...]).withUnsafeBytes({ try AgentResponse.decodeBody($0).1 }) else {
            Issue.record("not a status")
            return
        }
        #expect(back == s)
    }

    /// SYNC_CIRCLE circle (operation 4): no argument; an argument, or operation 5, does not decode.
    @Test func theCircleOperationTakesNoArgument() throws {
        let frame = AgentRequest.syncCircle(.circle, argument: "").encodeFrame(requestID: 3)
        let (_, back) = try Array(frame[4...]).withUnsafeBytes { try AgentRequest.decodeBody($0) }
        guard case .syncCircle(.circle, let argument) = back else { Issue.record("\(back)"); return }
        #expect(argument.isEmpty)
        var withArgument = Array(AgentRequest.syncCircle(.remove, argument: "x").encodeFrame(requestID: 3)[4...])
        let op = withArgument.count - 4   // u8 operation ‖ sstr "x"
        withArgument[op] = 4
        #expect(throws: ProtocolError.self) { _ = try withArgument.withUnsafeBytes { try AgentRequest.decodeBody($0) } }
        var unknown = Array(frame[4...])
        unknown[unknown.count - 3] = 5
        #expect(throws: ProtocolError.self) { _ = try unknown.withUnsafeBytes { try AgentRequest.decodeBody($0) } }
    }

    @Test func textRules() {
        #expect(SyncText.isName("desktop") && SyncText.isRemote("ssh://host/keys.git"))
        #expect(!SyncText.isName("") && !SyncText.isName(String(repeating: "a", count: 65)) && !SyncText.isName("a\u{7F}"))
        #expect(!SyncText.isRemote("a\nb") && !SyncText.isRemote(String(repeating: "a", count: 4097)))
    }
}
