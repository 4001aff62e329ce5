import CofferClient
import CofferCrypto
import CofferModel
import CofferTestSupport
import Foundation
import Testing

/// Rollback detection through the real agent (`rollback-detection = on`, the counter in a swtpm
/// reached through `rollback-tcti`): a keychain.db put back after item writes makes `coffer unlock`
/// fail with the rollback error and leaves the agent locked; a kill -9 between the records' commit and
/// the NV increment is no false alarm and loses nothing.
@Suite(.serialized, .enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
struct RollbackAgentTests {
    /// A configuration file turning rollback detection on with `tpm`'s counter.
    static func config(_ dir: TemporaryDirectory, _ tpm: SoftwareTPM) -> [String] {
        let path = dir.file("cofferd.conf")
        writeFileBytes(path, Array("rollback-detection = on\nrollback-tcti = \(tpm.tcti)\nrollback-interval = 3600\n".utf8))
        return ["--config", path]
    }

    /// The database files of a stopped agent's state directory, to put back later (``putBack(_:in:)``).
    static func savedDatabase(in stateDir: String) -> [(String, Data?)] {
        ["keychain.db", "keychain.db-wal"].map { ($0, FileManager.default.contents(atPath: stateDir + "/" + $0)) }
    }

    /// Puts back what ``savedDatabase(in:)`` saved (the stale shared-memory index removed).
    static func putBack(_ saved: [(String, Data?)], in stateDir: String) {
        for (name, bytes) in saved {
            unlink(stateDir + "/" + name)
            if let bytes { writeFileBytes(stateDir + "/" + name, Array(bytes)) }
        }
        unlink(stateDir + "/keychain.db-shm")
    }

    /// With `agent` stopped cleanly: saves its database, starts it, updates svc/a to `secret` and locks
    /// (anchoring the update), stops it, puts the saved database back, starts it again and tries to
    /// unlock: that try's result.
    static func unlockAfterPuttingBackAnUpdate(_ agent: AgentProcess, stateDir: String, secret: String) throws -> CLIResult {
        let saved = savedDatabase(in: stateDir)
        try agent.start()
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0, "\(agent.log)")
        #expect(agent.cli(["update", "--service", "svc", "--account", "a", "--secret-stdin"], stdin: secret).status == 0, "\(agent.log)")
        #expect(agent.cli(["lock"]).status == 0)                // anchors the update
        agent.stop()
        putBack(saved, in: stateDir)
        try agent.start()
        return agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password)
    }

    @Test func anEarlierKeychainDatabaseMakesTheUnlockFailWithTheRollbackError() throws {
        let tpm = try SoftwareTPM()
        let confDir = TemporaryDirectory("coffer-rollback-conf")
        let agent = try AgentProcess(extraArguments: Self.config(confDir, tpm))
        agent.setPasscode()
        #expect(agent.cli(["status"]).stdout.contains("rollback detection: on"), "coffer status says the detection is on")
        #expect(agent.cli(["add", "--service", "svc", "--account", "a", "--secret-stdin"], stdin: "first").status == 0)
        #expect(agent.cli(["lock"]).status == 0, "\(agent.log)")
        agent.stop()                                            // a clean stop: the database file is whole
        let r = try Self.unlockAfterPuttingBackAnUpdate(agent, stateDir: agent.stateDir, secret: "rotated")
        #expect(r.status != 0)
        #expect(r.stderr.contains("rollback detected") && r.stderr.contains("keychain.db was put back from an earlier copy"), "\(r.stderr)")
        #expect(r.stderr.contains("restoring a backup"), "\(r.stderr)")
        let c = try AgentConnection(path: agent.socketPath)
        #expect(try c.status().lockState != .unlocked, "the refused unlock left the agent unlocked")
        #expect(status { try c.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("a")], returnData: true)) }
                == .interactionNotAllowed, "nothing is served from the rolled-back file")
    }

    #if DEBUG
    static let crashPointsCompiledIn = true
    #else
    static let crashPointsCompiledIn = false
    #endif

    @Test(.enabled(if: crashPointsCompiledIn, "crash points exist only in debug builds"),
          arguments: ["rollback-flush-before-increment"])
    func killedBetweenTheRecordsAndTheIncrement(at point: String) throws {
        let tpm = try SoftwareTPM()
        let confDir = TemporaryDirectory("coffer-rollback-conf")
        let a = try RekeyCrashTests.CrashableAgent(extraArguments: Self.config(confDir, tpm))
        try a.agent.start()
        a.agent.setPasscode()
        let c = try AgentConnection(path: a.agent.socketPath)
        try c.add(newPassword("svc", "a", "written before the crash"))
        a.arm(point)
        try a.agent.restart()
        let c2 = try AgentConnection(path: a.agent.socketPath)
        try c2.unlock(passcode: secret(AgentProcess.password))
        try c2.add(newPassword("svc", "b", "also written"))
        _ = try? c2.lock()                                      // dies between the records' commit and TPM2_NV_Increment
        #expect(a.diedAtCrashPoint(), "cofferd did not stop at \(point):\n\(a.agent.log)")
        a.arm("")
        try a.agent.start()
        let c3 = try AgentConnection(path: a.agent.socketPath)
        #expect(status { try c3.unlock(passcode: secret(AgentProcess.password)) } == nil, "a false alarm after the crash:\n\(a.agent.log)")
        for (acct, s) in [("a", "written before the crash"), ("b", "also written")] {
            let got = try? c3.copyMatching(password("svc", acct)).first?.data
            #expect(text(got) == s, "\(acct)")
        }
    }
}
