import CofferKeychain
import CofferModel
import CofferTestSupport
import Foundation
import Testing

/// A process killed in the middle of applying a pull (crash point `sync-apply-half`: `_exit` after half
/// of the changes were written, nothing cleaned up) leaves the keychain as before the pull: no item of
/// it and the old sync state. The same pull applied again afterwards lands whole. The child is this
/// test binary running ``child()`` on the parent's state directory.
@Suite struct SyncApplyCrashTests {
    static let childVariable = "COFFER_SYNC_APPLY_CHILD"

    static func changes() -> [SyncItemChange] {
        (0..<100).map { i in
            let attrs: Attributes = ["svce": .string("svc\(i)"), "acct": .string("a"), "agrp": .string("unsigned"),
                                     "sync": .bool(true), "pdmn": .string("ak")]
            let payload = Array("pw\(i)".utf8).withUnsafeBytes { SyncItem.payload(.genericPassword, attrs, secret: $0) }
            return (SyncItem.itemKey(.genericPassword, attrs), payload)
        }
    }

    /// The child: applies the pull to the keychain in `$COFFER_SYNC_APPLY_CHILD`.
    @Test(.enabled(if: ProcessInfo.processInfo.environment[childVariable] != nil, "the crash trial's child: runs only inside the process the trial starts"))
    func child() throws {
        let kc = try Keychain(directory: ProcessInfo.processInfo.environment[Self.childVariable]!, lockingStateDirectory: false)
        try kc.applySync(Self.changes(), state: [9])
    }

    #if DEBUG
    @Test func aKillMidApplyLeavesNothingHalfApplied() throws {
        let f = try Fixture()
        try f.keychain.commitSyncRecorded(through: 0, state: [1])
        let me = ProcessInfo.processInfo.arguments[0]
        let args = ["--testing-library", "swift-testing", "--filter", "SyncApplyCrashTests/child"]
        let crashed = runProcess(me, args, environment: [Self.childVariable: f.dir.path, "COFFER_TEST_CRASH_POINT": "sync-apply-half"], timeout: 600)
        #expect(crashed.status == 99, "\(crashed)")
        try f.reboot()
        #expect(try f.keychain.count() == 0)
        #expect(text(try f.keychain.syncState()) == "\u{1}")
        #expect(try f.keychain.integrityCheck())
        let whole = runProcess(me, args, environment: [Self.childVariable: f.dir.path], timeout: 600)
        #expect(whole.status == 0, "\(whole)")
        try f.reboot()
        #expect(try f.keychain.count() == 100)
        #expect(try f.password(service: "svc73", account: "a") == "pw73")
        #expect(text(try f.keychain.syncState()) == "\u{9}")
    }
    #endif
}
