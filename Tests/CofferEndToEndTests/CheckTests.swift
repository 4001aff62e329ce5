import CofferModel
import CofferProtocol
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// `coffer check` and listings that meet damaged rows (issue 23), against a real agent and the real
/// SQLite file, damaged with the `sqlite3` shell the way an accident or an attacker would.
@Suite struct CheckTests {
    /// The `sqlite3` shell, or nil (the tests then skip, saying so).
    static let sqlite3: String? = ["/usr/bin/sqlite3", "/bin/sqlite3", "/usr/local/bin/sqlite3"].first { access($0, X_OK) == 0 }

    /// Runs `sql` on the agent's database; returns stdout (trimmed).
    @discardableResult
    static func sql(_ agent: AgentProcess, _ sql: String) -> String {
        let r = runCLI([agent.stateDir + "/keychain.db", sql], executable: sqlite3!, timeout: 60)
        #expect(r.status == 0, "sqlite3: \(r)")
        return r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static let forgedRef = "00112233445566778899aabbccddeeff"

    @Test(.enabled(if: sqlite3 != nil, "needs the sqlite3 shell to damage a database"))
    func aForgedRowIsReportedQuarantinedAndRestored() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        for a in ["alice", "bob"] {
            #expect(agent.cli(["add", "--service", "mail", "--account", a, "--secret-stdin"], stdin: "pw-\(a)").status == 0)
        }
        Self.sql(agent, "INSERT INTO items(pref, pk, pclass, meta, secret) VALUES (X'\(Self.forgedRef)', randomblob(32), 1, randomblob(120), randomblob(120))")

        // A listing goes on past it, warning with the count and the command to run.
        var r = agent.cli(["find"])
        #expect(r.status == 0 && r.stdout.contains("alice") && r.stdout.contains("bob"), "\(r)")
        #expect(r.stderr.contains("warning: 1 item could not be read") && r.stderr.contains("coffer check"), "\(r)\n\(agent.log)")
        #expect(agent.cli(["get", "--service", "mail", "--account", "alice"]).stdout == "pw-alice")

        // check reports it by reference and reason, and fails.
        r = agent.cli(["check"])
        #expect(r.status == 8, "\(r)")
        #expect(r.stdout.hasPrefix("\(Self.forgedRef) authentication: "), "\(r)")
        #expect(r.stderr.contains("3 items checked, 1 damaged"), "\(r)")
        r = agent.cli(["check", "--json"])
        #expect(r.stdout.contains("\"checked\":3") && r.stdout.contains("{\"persistentRef\":\"\(Self.forgedRef)\",\"reason\":\"authentication\",\"quarantined\":false"),
                "\(r)")

        // Quarantined: out of the items (listings are clean), kept whole, listed, restorable.
        r = agent.cli(["check", "--quarantine"])
        #expect(r.status == 0 && r.stdout.contains("\(Self.forgedRef) authentication (quarantined)"), "\(r)")
        r = agent.cli(["check"])
        #expect(r.status == 0 && r.stdout.isEmpty && r.stderr.contains("2 items checked, 0 damaged"), "\(r)")
        r = agent.cli(["find"])
        #expect(r.status == 0 && !r.stderr.contains("warning"), "\(r)")
        #expect(Self.sql(agent, "SELECT count(*) FROM quarantine WHERE pref = X'\(Self.forgedRef)'") == "1")
        r = agent.cli(["check", "--list-quarantine"])
        #expect(r.status == 0 && r.stdout.hasPrefix(Self.forgedRef) && r.stderr.contains("1 quarantined item"), "\(r)")

        r = agent.cli(["check", "--restore", Self.forgedRef])
        #expect(r.status == 0, "\(r)")
        #expect(Self.sql(agent, "SELECT count(*) FROM items WHERE pref = X'\(Self.forgedRef)'") == "1")
        #expect(agent.cli(["check", "--list-quarantine"]).stdout.isEmpty)
        #expect(agent.cli(["check"]).status == 8)
        r = agent.cli(["check", "--restore", Self.forgedRef])
        #expect(r.status == 3, "nothing quarantined with that reference: \(r)")
        #expect(agent.cli(["check", "--restore", "abc"]).status == 64)
    }

    /// The data loss of issue 23 left rows sealed under keys the keybag no longer holds: listings
    /// then failed as a whole. Now the row is reported by reference, and listings show the rest.
    @Test(.enabled(if: sqlite3 != nil, "needs the sqlite3 shell to damage a database"))
    func aRowSealedUnderARetiredKeyIsReported() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        #expect(agent.cli(["add", "--service", "mail", "--account", "alice", "--secret-stdin"], stdin: "one").status == 0)
        let ref = Self.sql(agent, "SELECT lower(hex(pref)) FROM items")
        let old = Self.sql(agent, "SELECT hex(meta) || ' ' || hex(secret) FROM items").split(separator: " ")
        #expect(old.count == 2)
        // A passcode change rotates the class keys and re-seals the row; then the old sealing comes back.
        #expect(agent.cli(["passcode", "change", "--passcode-stdin"], stdin: "\(AgentProcess.password)\n\(AgentProcess.password)\n").status == 0)
        #expect(agent.cli(["add", "--service", "mail", "--account", "bob", "--secret-stdin"], stdin: "two").status == 0)
        Self.sql(agent, "UPDATE items SET meta = X'\(old[0])', secret = X'\(old[1])' WHERE pref = X'\(ref)'")

        var r = agent.cli(["find", "--service", "mail"])
        #expect(r.status == 0 && r.stdout.contains("bob") && r.stderr.contains("1 item could not be read"), "\(r)")
        r = agent.cli(["check"])
        #expect(r.status == 8 && r.stdout.hasPrefix("\(ref) authentication: "), "\(r)")
        #expect(r.stderr.contains("2 items checked, 1 damaged"), "\(r)")
    }

    /// A write-ahead log cut short (a crash while it was written, a full disk): SQLite drops the
    /// transactions whose frames are incomplete, never half of one. The agent starts, check finds every
    /// remaining row sound, and listings work.
    @Test func aTruncatedWriteAheadLogChecksClean() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        for i in 0..<6 {
            #expect(agent.cli(["add", "--service", "wal", "--account", "a\(i)", "--secret-stdin"], stdin: "s\(i)").status == 0)
        }
        agent.kill9() // no checkpoint: the last transactions are only in the log
        let wal = agent.stateDir + "/keychain.db-wal"
        let size = (try? FileManager.default.attributesOfItem(atPath: wal)[.size] as? Int) ?? 0
        try #require(size > 4096, "the log holds the recent transactions (\(size) bytes)")
        #expect(truncate(wal, off_t(size - 1000)) == 0)

        try agent.start()
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        let r = agent.cli(["check"])
        #expect(r.status == 0 && r.stdout.isEmpty && r.stderr.contains("0 damaged"), "\(r)")
        let find = agent.cli(["find", "--service", "wal"])
        #expect(find.status == 0 && !find.stderr.contains("warning"), "\(find)")
        let listed = find.stdout.components(separatedBy: "\n\n").filter { !$0.isEmpty }.count
        #expect(listed >= 1 && listed < 6, "whole transactions lost from the end only: \(listed) of 6")
        #expect(agent.cli(["status"]).stdout.contains("items: \(listed)"))
        #expect(r.stderr.contains("\(listed) item"), "\(r)")
    }

    /// Thousands of damaged rows (a keychain sealed under a retired key at scale): the report no longer
    /// fits one frame, so `coffer check` pages it. Every row is reported, quarantined and listed; the
    /// unpaged CHECK refuses with -108 before moving anything. Before paging: -108 after the
    /// quarantine had committed, and a quarantine that could never be listed again.
    @Test(.enabled(if: sqlite3 != nil, "needs the sqlite3 shell to damage a database"))
    func aReportOfThousandsOfFindingsIsPaged() throws {
        let agent = try AgentProcess()
        #expect(agent.cli(["add", "--service", "mail", "--account", "alice", "--secret-stdin"], stdin: "one").status == 0)
        let bad = 2_300
        Self.sql(agent, """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < \(bad))
            INSERT INTO items(pref, pk, pclass, meta, secret) SELECT randomblob(16), randomblob(32), 3, randomblob(120), randomblob(120) FROM n
            """)
        var r = agent.cli(["check", "--json"])
        #expect(r.status == 8, "\(r.stderr)")
        #expect(r.stdout.components(separatedBy: "\"reason\":\"authentication\"").count - 1 == bad)
        #expect(r.stdout.hasPrefix("{\"checked\":\(bad + 1),\"skipped\":0,"), "\(r.stdout.prefix(80))")

        // The first, unpaged form (an older client) is refused whole, and moves nothing.
        let unpaged = AgentRequest.check(.quarantine).encodeFrame(requestID: 2)
        let reply = try ProtocolConformanceTests.exchange(agent.socketPath, ProtocolConformanceTests.helloFrame + unpaged, wanted: 2, quiet: 60)
        #expect(reply.frames.count == 2 && ProtocolConformanceTests.errorStatus(reply.frames.last?.response) == .allocate, "\(reply.frames.map(\.type))")
        #expect(Self.sql(agent, "SELECT count(*) FROM quarantine") == "0")

        r = agent.cli(["check", "--quarantine"])
        #expect(r.status == 0 && r.stderr.contains("\(bad + 1) items checked, \(bad) damaged"), "\(r.stderr)")
        #expect(r.stdout.components(separatedBy: "(quarantined)").count - 1 == bad)
        #expect(Self.sql(agent, "SELECT count(*) FROM quarantine") == "\(bad)")
        r = agent.cli(["check", "--list-quarantine"])
        #expect(r.status == 0 && r.stderr.contains("\(bad) quarantined items"), "\(r.stderr)")
        #expect(r.stdout.split(separator: "\n").count == bad)
        #expect(agent.cli(["get", "--service", "mail", "--account", "alice"]).stdout == "one")
    }

    /// A reason longer than a short string can carry (a damaged or hostile quarantine table): the agent
    /// cuts it and goes on serving. Before: the CHECK_REPORT encoder trapped and the agent died.
    @Test(.enabled(if: sqlite3 != nil, "needs the sqlite3 shell to damage a database"))
    func aHugeQuarantineReasonNeitherCrashesTheAgentNorReachesTheReport() throws {
        let agent = try AgentProcess()
        #expect(agent.cli(["add", "--service", "mail", "--account", "alice", "--secret-stdin"], stdin: "one").status == 0)
        Self.sql(agent, "INSERT INTO items(pref, pk, pclass, meta, secret) VALUES (X'\(Self.forgedRef)', randomblob(32), 3, randomblob(120), randomblob(120))")
        #expect(agent.cli(["check", "--quarantine"]).status == 0)
        Self.sql(agent, "UPDATE quarantine SET reason = printf('%.*c', 70000, 'x')")
        let r = agent.cli(["check", "--list-quarantine"])
        #expect(r.status == 0 && r.stdout.hasPrefix(Self.forgedRef), "\(r.stderr)")
        #expect(r.stdout.count < 1_000, "the reason is cut (\(r.stdout.count) bytes)")
        #expect(agent.cli(["get", "--service", "mail", "--account", "alice"]).stdout == "one", "the agent still serves")
    }
}
