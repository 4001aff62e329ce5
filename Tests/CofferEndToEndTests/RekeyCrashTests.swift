import CofferClient
import CofferCrypto
import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Kill -9 (a test crash point: `_exit(99)`, debug builds) at every step of a rekey inside a real
/// `cofferd`, then restart it: the old or the new passcode unlocks, never neither, and every item reads.
///
/// The agent is started through `sh`, which reads the crash point from a file just before exec'ing
/// `cofferd` (the harness passes no environment of its own), so one agent directory can be run with
/// and without the crash point.
@Suite(.serialized) struct RekeyCrashTests {
    static let points = ["rekey-start", "rekey-next-written", "rekey-committed", "rekey-reseal-half", "rekey-resealed",
                         "rekey-final-next-written", "rekey-done"]
    /// Points before the new keybag key file replaces the old one: the old passcode still works.
    static let beforeCommit: Set<String> = ["rekey-start", "rekey-next-written"]
    static let newPasscode = "battery staple horse"

    #if DEBUG
    static let crashPointsCompiledIn = true
    #else
    static let crashPointsCompiledIn = false
    #endif

    final class CrashableAgent {
        let control = TemporaryDirectory("coffer-crashpoint")
        let agent: AgentProcess
        var pointFile: String { control.file("point") }

        init(extraArguments: [String] = []) throws {
            writeFileBytes(control.file("point"), [])
            let script = "COFFER_TEST_CRASH_POINT=\"$(cat '\(control.file("point"))')\"; export COFFER_TEST_CRASH_POINT; exec \"$0\" \"$@\""
            agent = try AgentProcess(extraArguments: extraArguments, launcher: ["/bin/sh", "-c", script], start: false)
        }

        func arm(_ point: String) { writeFileBytes(pointFile, Array(point.utf8)) }

        /// pam_matrix accepts exactly `password` from now on.
        func setPAMPassword(_ password: String) throws {
            try "\(currentUser):\(password):\(agent.pamService)\n".write(toFile: agent.passdb, atomically: true, encoding: .utf8)
        }

        /// Waits for the agent to die at the crash point; true if it exited with 99.
        func diedAtCrashPoint() -> Bool {
            guard let p = agent.process else { return false }
            p.waitUntilExit()
            return p.terminationReason == .exit && p.terminationStatus == 99
        }
    }

    func items() -> [(ProtectionClass, String, String)] {
        ProtectionClass.allCases.flatMap { p in (0..<3).map { i in (p, "svc\(i)", "secret \(i) of \(p.shortCode)") } }
    }

    func expectAllItems(_ c: AgentConnection, _ label: String) {
        for (p, svc, s) in items() {
            let got = try? c.copyMatching(password(svc, p.shortCode)).first?.data
            #expect(text(got) == s, "\(label): \(svc)/\(p.shortCode)")
        }
    }

    @Test(.enabled(if: crashPointsCompiledIn, "crash points exist only in debug builds"), arguments: points)
    func killedPasscodeChange(at point: String) throws {
        let a = try CrashableAgent()
        try a.agent.start()
        a.agent.setPasscode()
        let c = try AgentConnection(path: a.agent.socketPath)
        for (p, svc, s) in items() { try c.add(newPassword(svc, p.shortCode, s, p.shortCode)) }

        a.arm(point)
        try a.agent.restart()
        try a.setPAMPassword(Self.newPasscode)
        let c2 = try AgentConnection(path: a.agent.socketPath)
        let change = status { try c2.setPasscode(current: secret(AgentProcess.password), new: secret(Self.newPasscode)) }
        #expect(change != nil, "the change succeeded though the agent should have died at \(point)")
        #expect(a.diedAtCrashPoint(), "cofferd did not stop at \(point):\n\(a.agent.log)")

        a.arm("")
        try a.agent.start()
        let expected = Self.beforeCommit.contains(point) ? AgentProcess.password : Self.newPasscode
        try a.setPAMPassword(expected)
        let c3 = try AgentConnection(path: a.agent.socketPath)
        let unlocked = status { try c3.unlock(passcode: secret(expected)) }
        #expect(unlocked == nil, "\(point): the \(expected == AgentProcess.password ? "old" : "new") passcode does not unlock:\n\(a.agent.log)")
        expectAllItems(c3, point)

        // The state the restart left is final: another restart and unlock read everything again.
        try a.agent.restart()
        let c4 = try AgentConnection(path: a.agent.socketPath)
        try c4.unlock(passcode: secret(expected))
        expectAllItems(c4, "\(point), second restart")
    }

    /// Removing the passcode (issue #16), killed at every step of its rekey, then restarted: either the
    /// passcode is still set and unlocks with every item, or it is gone, the WhenPasscodeSet items are
    /// gone with it and every other item reads without unlocking; never a keybag that opens nothing.
    @Test(.enabled(if: crashPointsCompiledIn, "crash points exist only in debug builds"), arguments: points)
    func killedPasscodeRemoval(at point: String) throws {
        let a = try CrashableAgent()
        try a.agent.start()
        a.agent.setPasscode()
        let c = try AgentConnection(path: a.agent.socketPath)
        for (p, svc, s) in items() { try c.add(newPassword(svc, p.shortCode, s, p.shortCode)) }
        a.arm(point)
        try a.agent.restart()
        let c2 = try AgentConnection(path: a.agent.socketPath)
        #expect(status { try c2.removePasscode(current: secret(AgentProcess.password)) } != nil)
        #expect(a.diedAtCrashPoint(), "cofferd did not stop at \(point):\n\(a.agent.log)")

        a.arm("")
        try a.agent.start()
        let c3 = try AgentConnection(path: a.agent.socketPath)
        if Self.beforeCommit.contains(point) {
            #expect(try c3.status().passcodeSet, "\(point)")
            #expect(status { try c3.unlock(passcode: secret(AgentProcess.password)) } == nil, "\(point): \(a.agent.log)")
            expectAllItems(c3, point)
        } else {
            #expect(try !c3.status().passcodeSet && c3.status().lockState == .unlocked, "\(point): \(a.agent.log)")
            for (p, svc, s) in items() {
                let got = try? c3.copyMatching(password(svc, p.shortCode)).first?.data
                if p.requiresPasscode {
                    #expect(got == nil, "\(point): a WhenPasscodeSet item survived the removal")
                } else {
                    #expect(text(got) == s, "\(point): \(svc)/\(p.shortCode)")
                }
            }
        }
    }

    /// A v1 fixture (written by the Coffer before the format change) migrated by the first unlock (with a
    /// passcode) or at start-up (without), killed in the middle of it, then started and unlocked again:
    /// every item of its manifest reads.
    @Test(.enabled(if: crashPointsCompiledIn, "crash points exist only in debug builds"),
          arguments: ["v1-passcode", "v1-nopasscode"], ["rekey-committed", "rekey-reseal-half", "rekey-resealed"])
    func killedMigration(of fixtureName: String, at point: String) throws {
        let a = try CrashableAgent()
        let fixture = Binaries.packageRoot + "/Tests/CofferKeychainTests/Fixtures/" + fixtureName
        try Files.makePrivateDirectory(a.agent.stateDir)
        for f in ["device.key", "keybag", "keybag.key", "keychain.db"] {
            try FileManager.default.copyItem(atPath: fixture + "/" + f, toPath: a.agent.stateDir + "/" + f)
            chmod(a.agent.stateDir + "/" + f, 0o600)
        }
        let withPasscode = fixtureName == "v1-passcode"
        let passcode = "fixture passcode 1"
        try a.setPAMPassword(passcode)
        a.arm(point)
        if withPasscode {
            try a.agent.start()
            let c = try AgentConnection(path: a.agent.socketPath)
            #expect(status { try c.unlock(passcode: secret(passcode)) } != nil)
        } else {
            #expect(throws: (any Error).self) { try a.agent.start() } // dies while opening the keychain
        }
        #expect(a.diedAtCrashPoint(), "cofferd did not stop at \(point):\n\(a.agent.log)")

        a.arm("")
        try a.agent.start()
        let c2 = try AgentConnection(path: a.agent.socketPath)
        if withPasscode { try c2.unlock(passcode: secret(passcode)) }
        let manifest = try String(contentsOfFile: fixture + "/manifest.txt", encoding: .utf8)
        var checked = 0
        for line in manifest.split(separator: "\n") where line.hasPrefix("item ") {
            let f = Dictionary(uniqueKeysWithValues: line.split(separator: " ").dropFirst(2).map {
                let kv = $0.split(separator: "=", maxSplits: 1)
                return (String(kv[0]), String(kv[1]))
            })
            let n = Int(line.split(separator: " ")[1])!
            let pdmn = f["pdmn"]!, length = Int(f["secret-bytes"]!)!
            let q: ItemQuery
            if f["class"] == "inet" {
                q = ItemQuery(itemClass: .internetPassword, attributes: ["srvr": .string("\(pdmn).example.org"), "acct": .string("bob")], returnData: true)
            } else if f["attrs"]!.contains("desc") {
                q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc.\(pdmn)"), "acct": .string("alice")], returnData: true)
            } else {
                q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("shared"), "acct": .string("user\(n)")], returnData: true)
            }
            let want = (0..<length).map { UInt8(truncatingIfNeeded: n &* 31 &+ $0 &* 7 &+ 1) }
            let got = try? c2.copyMatching(q).first?.data?.withUnsafeBytes { Array($0) }
            let same = got == want // (not compared inside #expect: it would print 70,000-byte secrets)
            #expect(same, "\(point): item \(n) does not read back with its secret")
            checked += 1
        }
        #expect(checked == (withPasscode ? 16 : 14))
        // The agent says in its log what it migrated (counts, never values).
        #expect(a.agent.log.contains("migrated"), "the migration was not logged:\n\(a.agent.log)")
        #expect(fileBytes(a.agent.stateDir + "/keybag")[4] == 2)
    }
}
