import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// General attributes (`--attr NAME=VALUE` with any name) through the CLI, the native protocol and a
/// real agent over a real socket: added, shown, searched by exact match on any subset, replaced by an
/// update, held to their limits, never written to the database file in the clear.
@Suite struct GeneralAttributeCLITests {
    @Test func addFindGetAndUpdateByGeneralAttributes() throws {
        let agent = try AgentProcess()
        var r = agent.cli(["add", "--service", "web", "--account", "alice", "--attr", "xdg:schema=org.example.Password",
                           "--attr", "env=prod", "--attr", "@acct=shadow", "--secret-stdin"], stdin: "pw-a")
        #expect(r.status == 0, "\(r)")
        r = agent.cli(["add", "--service", "web", "--account", "bob", "--attr", "xdg:schema=org.example.Password",
                       "--attr", "env=test", "--secret-stdin"], stdin: "pw-b")
        #expect(r.status == 0, "\(r)")

        // Shown as @NAME beside the catalog attributes (text and JSON), never the secret.
        r = agent.cli(["find", "--attr", "env=prod"])
        #expect(r.status == 0 && r.stdout.contains("@env: prod") && r.stdout.contains("@xdg:schema: org.example.Password")
                && r.stdout.contains("@acct: shadow") && r.stdout.contains("acct: alice") && !r.stdout.contains("bob")
                && !r.stdout.contains("pw-a"), "\(r)")
        r = agent.cli(["find", "--attr", "xdg:schema=org.example.Password", "--json"])
        #expect(r.status == 0 && r.stdout.contains("\"@env\":\"prod\"") && r.stdout.contains("\"@env\":\"test\""), "\(r)")
        // A subset must all match; one value differing, or a prefix of one, matches nothing.
        r = agent.cli(["find", "--attr", "xdg:schema=org.example.Password", "--attr", "env=test"])
        #expect(r.status == 0 && r.stdout.contains("acct: bob") && !r.stdout.contains("alice"), "\(r)")
        for query in [["--attr", "env=prod", "--attr", "xdg:schema=org.example"], ["--attr", "env=pro"], ["--attr", "en=prod"],
                      ["--attr", "@acct=alice"]] {
            r = agent.cli(["find"] + query)
            #expect(r.status == 3 && r.stderr.contains("errSecItemNotFound (-25300)") && r.stdout.isEmpty, "\(query): \(r)")
        }
        r = agent.cli(["get", "--attr", "env=test", "--attr", "xdg:schema=org.example.Password"])
        #expect(r.status == 0 && r.stdout == "pw-b", "\(r)")
        r = agent.cli(["get", "--attr", "env=prod", "--format", "json"])
        #expect(r.status == 0 && r.stdout.contains("\"@env\":\"prod\"") && r.stdout.contains("\"secret\":\"pw-a\""), "\(r)")

        // An update naming general attributes leaves the item exactly those.
        r = agent.cli(["update", "--attr", "env=test", "--set-attr", "env=staging", "--set-attr", "team=ops"])
        #expect(r.status == 0 && r.stderr.contains("updated 1 item"), "\(r)")
        r = agent.cli(["find", "--attr", "env=staging", "--attr", "team=ops"])
        #expect(r.status == 0 && r.stdout.contains("acct: bob") && !r.stdout.contains("@xdg:schema"), "\(r)")
        #expect(agent.cli(["find", "--attr", "env=test"]).status == 3)
        // --set-attr @= leaves it none.
        r = agent.cli(["update", "--attr", "team=ops", "--set-attr", "@="])
        #expect(r.status == 0 && r.stderr.contains("updated 1 item"), "\(r)")
        r = agent.cli(["find", "--account", "bob"])
        #expect(r.status == 0 && r.stdout.contains("acct: bob") && !r.stdout.contains("@"), "\(r)")

        // Limits: errSecParam (exit 2), naming the limit and not the caller's name; nothing added.
        let longName = String(repeating: "n", count: GeneralAttributes.maxNameBytes + 1)
        r = agent.cli(["add", "--service", "web", "--account", "carol", "--attr", "\(longName)=v", "--secret-stdin"], stdin: "x")
        #expect(r.status == 2 && r.stderr.contains("errSecParam (-50)") && r.stderr.contains("1 to \(GeneralAttributes.maxNameBytes)") && !r.stderr.contains(longName), "\(r)")
        r = agent.cli(["add", "--service", "web", "--account", "carol", "--attr", "big=" + String(repeating: "v", count: 4097), "--secret-stdin"], stdin: "x")
        #expect(r.status == 2 && r.stderr.contains("errSecParam (-50)") && r.stderr.contains("4096"), "\(r)")
        let many = (0...GeneralAttributes.maxCount).flatMap { ["--attr", "k\($0)=v"] }
        r = agent.cli(["add", "--service", "web", "--account", "carol"] + many + ["--secret-stdin"], stdin: "x")
        #expect(r.status == 2 && r.stderr.contains("errSecParam (-50)") && r.stderr.contains("too many general attributes"), "\(r)")
        #expect(agent.cli(["find", "--account", "carol"]).status == 3)

        // Nothing of the names or values in the database file (the WAL checkpointed at the agent's stop).
        #expect(agent.stop() == 0)
        let bytes = ["keychain.db", "keychain.db-wal"].flatMap { fileBytes(agent.stateDir + "/" + $0) }
        #expect(bytes.count > 0)
        for needle in ["xdg:schema", "org.example.Password", "staging", "shadow"] {
            let n = Array(needle.utf8)
            #expect(!bytes.indices.contains { bytes[$0...].starts(with: n) }, "'\(needle)' is in the database file")
        }
    }

    /// Two signed apps and an unsigned caller, each with an item of the same general attributes,
    /// each find (by one and by both) and delete only their own.
    @Test func accessGroupsStillIsolate() throws {
        let apps = try SignedApps()
        let aPath = try apps.app("appA", appID: "com.example.a", groups: ["a"])
        let bPath = try apps.app("appB", appID: "com.example.b", groups: ["b"])
        let agent = try apps.startAgent()
        let clients = [AppClient(executable: aPath, agent: agent), AppClient(executable: bPath, agent: agent),
                       AppClient(executable: Binaries.directory + "/coffer-cli", agent: agent)]
        let same = ["--attr", "xdg:schema=org.example.Password", "--attr", "user=alice"]
        for (i, c) in clients.enumerated() {
            let r = c.run(["add", "--service", "svc\(i)", "--account", "me"] + same + ["--secret-stdin"], stdin: "secret-\(i)")
            #expect(r.status == 0, "\(i): \(r)\n\(agent.log)")
        }
        for (i, c) in clients.enumerated() {
            for query in [["--attr", "user=alice"], same] {
                let r = c.run(["find", "--json"] + query)
                #expect(r.status == 0 && r.stdout.contains("\"svce\":\"svc\(i)\"") && r.stdout.components(separatedBy: "\"svce\"").count == 2, "\(i): \(r)")
            }
            let r = c.run(["get"] + same)
            #expect(r.status == 0 && r.stdout == "secret-\(i)", "\(i): \(r)")
        }
        var r = clients[0].run(["delete"] + same)
        #expect(r.status == 0 && r.stderr.contains("deleted 1 item"), "\(r)")
        r = clients[0].run(["find"] + same)
        #expect(r.status == 3, "\(r)")
        r = clients[1].run(["find"] + same)
        #expect(r.status == 0 && r.stdout.contains("svce: svc1"), "\(r)")
    }
}
