import CofferClient
import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// `git-credential-coffer` (issue #17) driven by the real `/usr/bin/git` against a real agent:
/// `git credential fill/approve/reject` round trips, ports and `credential.useHttpPath`, the fields
/// newer git sends, a locked or missing agent (git goes on and asks, never breaks), prompts only on a
/// terminal, and a `git clone` over HTTP with basic auth from a loopback server.
@Suite(.enabled(if: GitRun.available, "needs /usr/bin/git"))
struct GitCredentialTests {
    /// `git credential ACTION` with only this helper configured, for the agent at `agent`.
    static func credential(_ agent: AgentProcess, _ action: String, _ fields: String, config: [String] = [],
                           home: TemporaryDirectory = TemporaryDirectory("coffer-git-home")) -> CLIResult {
        GitRun.git(["credential", action], stdin: fields + "\n", helper: GitRun.helper(agent), config: config, home: home)
    }

    /// `fill`'s `password=` value, or nil when git could not fill.
    static func filled(_ agent: AgentProcess, _ fields: String, config: [String] = []) -> (username: String?, password: String?) {
        let r = credential(agent, "fill", fields, config: config)
        guard r.status == 0 else { return (nil, nil) }
        var out: [String: String] = [:]
        for line in r.stdout.split(separator: "\n") {
            let kv = line.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            if kv.count == 2 { out[String(kv[0])] = String(kv[1]) }
        }
        return (out["username"], out["password"])
    }

    @Test func fillApproveRejectRoundTrips() throws {
        let agent = try AgentProcess()
        // Nothing stored: git gets nothing from the helper and, with prompts off, fails on its own.
        var r = Self.credential(agent, "fill", "protocol=https\nhost=git.example.com")
        #expect(r.status != 0 && r.stderr.contains("terminal prompts disabled") && !r.stderr.contains("git-credential-coffer"), "\(r)")

        // No username in the request: the stored one comes back with its password.
        r = Self.credential(agent, "approve", "protocol=https\nhost=git.example.com\nusername=alice\npassword=pw-alice")
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r)")
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com") == ("alice", "pw-alice"))

        // Several usernames on one host: each gets its own.
        r = Self.credential(agent, "approve", "protocol=https\nhost=git.example.com\nusername=bob\npassword=pw-bob")
        #expect(r.status == 0, "\(r)")
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com\nusername=alice") == ("alice", "pw-alice"))
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com\nusername=bob") == ("bob", "pw-bob"))
        let either = Self.filled(agent, "protocol=https\nhost=git.example.com")
        #expect(either == ("alice", "pw-alice") || either == ("bob", "pw-bob"), "\(either)")
        // Protocol and host must match.
        #expect(Self.filled(agent, "protocol=http\nhost=git.example.com\nusername=alice").password == nil)
        #expect(Self.filled(agent, "protocol=https\nhost=example.com\nusername=alice").password == nil)

        // approve again replaces the password (one item, not two).
        r = Self.credential(agent, "approve", "protocol=https\nhost=git.example.com\nusername=alice\npassword=pw-alice-2")
        #expect(r.status == 0, "\(r)")
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com\nusername=alice") == ("alice", "pw-alice-2"))
        let items = agent.cli(["find", "--class", "inet", "--json"])
        #expect(items.stdout.components(separatedBy: "\"acct\":\"alice\"").count == 2, "\(items)")

        // The item is a plain internet password every Coffer client can read.
        let plain = agent.cli(["get", "--server", "git.example.com", "--account", "bob"])
        #expect(plain.status == 0 && plain.stdout == "pw-bob", "\(plain)")
        let json = agent.cli(["get", "--server", "git.example.com", "--account", "bob", "--format", "json"])
        #expect(json.stdout.contains("\"ptcl\":\"htps\"") && json.stdout.contains("\"labl\":\"git: https://bob@git.example.com\""), "\(json)")
        // The protocol as people write it finds it too: --protocol https and a reference's ?protocol=https.
        let named = agent.cli(["get", "--server", "git.example.com", "--protocol", "https", "--account", "bob"])
        #expect(named.status == 0 && named.stdout == "pw-bob", "\(named)")
        let injected = agent.cli(["inject"], stdin: "pw={{ coffer-inet://bob@git.example.com?protocol=https }}\n")
        #expect(injected.status == 0 && injected.stdout == "pw=pw-bob\n", "\(injected)")

        // Erasing an entry that does not match leaves the others.
        r = Self.credential(agent, "reject", "protocol=https\nhost=git.example.com\nusername=carol\npassword=x")
        #expect(r.status == 0, "\(r)")
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com\nusername=bob") == ("bob", "pw-bob"))
        // A reject naming another password leaves this one (git rejects the password it tried).
        r = Self.credential(agent, "reject", "protocol=https\nhost=git.example.com\nusername=bob\npassword=stale")
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com\nusername=bob") == ("bob", "pw-bob"))
        // The password the server refused goes; the other user stays.
        r = Self.credential(agent, "reject", "protocol=https\nhost=git.example.com\nusername=bob\npassword=pw-bob")
        #expect(r.status == 0, "\(r)")
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com\nusername=bob").password == nil)
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com") == ("alice", "pw-alice-2"))
    }

    @Test func portsArePartOfTheServer() throws {
        let agent = try AgentProcess()
        var r = Self.credential(agent, "approve", "protocol=https\nhost=git.example.com:8443\nusername=alice\npassword=on-8443")
        #expect(r.status == 0, "\(r)")
        r = Self.credential(agent, "approve", "protocol=https\nhost=git.example.com\nusername=alice\npassword=default-port")
        #expect(r.status == 0, "\(r)")
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com:8443") == ("alice", "on-8443"))
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com") == ("alice", "default-port"))
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com:9999").password == nil)
        // URLs work as git's own input (git splits them into fields before the helper sees them).
        #expect(Self.filled(agent, "url=https://git.example.com:8443/org/repo.git") == ("alice", "on-8443"))
        let json = agent.cli(["get", "--server", "git.example.com", "--account", "alice", "--port", "8443", "--format", "json"])
        #expect(json.status == 0 && json.stdout.contains("\"port\":8443") && !json.stdout.contains("\"path\""), "\(json)")
        // Erasing the default-port credential leaves the one on 8443.
        r = Self.credential(agent, "reject", "protocol=https\nhost=git.example.com\nusername=alice")
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com").password == nil)
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com:8443") == ("alice", "on-8443"))
    }

    @Test func useHttpPathScopesCredentialsToARepository() throws {
        let agent = try AgentProcess()
        let byPath = ["credential.useHttpPath=true"]
        for (repo, password) in [("a", "pw-a"), ("b", "pw-b")] {
            let r = Self.credential(agent, "approve", "url=https://git.example.com/org/\(repo).git\nusername=u\npassword=\(password)", config: byPath)
            #expect(r.status == 0, "\(r)")
        }
        #expect(Self.filled(agent, "url=https://git.example.com/org/a.git", config: byPath) == ("u", "pw-a"))
        #expect(Self.filled(agent, "url=https://git.example.com/org/b.git", config: byPath) == ("u", "pw-b"))
        // Another repository on the host has none of them.
        #expect(Self.filled(agent, "url=https://git.example.com/org/c.git", config: byPath).password == nil)
        let json = agent.cli(["get", "--server", "git.example.com", "--path", "org/a.git", "--format", "json"])
        #expect(json.stdout.contains("\"path\":\"org/a.git\""), "\(json)")

        // Without useHttpPath git sends no path: a credential for the whole host answers before a
        // repository's (as git-credential-store matches: a field git leaves out matches anything).
        var r = Self.credential(agent, "approve", "url=https://git.example.com\nusername=u\npassword=pw-host")
        #expect(r.status == 0, "\(r)")
        #expect(Self.filled(agent, "url=https://git.example.com/org/a.git") == ("u", "pw-host"))
        #expect(Self.filled(agent, "url=https://git.example.com/org/a.git", config: byPath) == ("u", "pw-a"))
        // Erasing a repository's credential leaves the host's and the other repository's.
        r = Self.credential(agent, "reject", "url=https://git.example.com/org/a.git\nusername=u", config: byPath)
        #expect(Self.filled(agent, "url=https://git.example.com/org/a.git", config: byPath).password == nil)
        #expect(Self.filled(agent, "url=https://git.example.com/org/b.git", config: byPath) == ("u", "pw-b"))
        #expect(Self.filled(agent, "url=https://git.example.com") == ("u", "pw-host"))
    }

    /// The fields newer git sends, spoken to the helper directly (the installed git predates some).
    @Test func newerFieldsExpiryAndRefreshToken() throws {
        let agent = try AgentProcess()
        let future = Int(Date().timeIntervalSince1970) + 3600
        var r = GitRun.helper(agent, "store", "capability[]=authtype\nprotocol=https\nhost=h.example\nusername=u\npassword=p1\n"
                              + "password_expiry_utc=\(future)\noauth_refresh_token=refresh-1\nwwwauth[]=Basic realm=\"x\"\nunknown=1\n")
        #expect(r.status == 0 && r.stdout.isEmpty && r.stderr.isEmpty, "\(r)")
        r = GitRun.helper(agent, "get", "capability[]=authtype\nprotocol=https\nhost=h.example\nwwwauth[]=Basic realm=\"x\"\n")
        #expect(r.status == 0 && r.stdout == "username=u\npassword=p1\npassword_expiry_utc=\(future)\noauth_refresh_token=refresh-1\n", "\(r)")
        // The secret holds the password, a NUL and the token (format 1 in GitCredential).
        #expect(agent.cli(["get", "--server", "h.example"]).stdout == "p1\u{0}refresh-1")
        // An expired password never comes back; storing a fresh one without an expiry clears it.
        r = GitRun.helper(agent, "store", "protocol=https\nhost=h.example\nusername=u\npassword=p2\npassword_expiry_utc=1000\n")
        r = GitRun.helper(agent, "get", "protocol=https\nhost=h.example\n")
        #expect(r.status == 0 && r.stdout.isEmpty, "\(r)")
        r = GitRun.helper(agent, "store", "protocol=https\nhost=h.example\nusername=u\npassword=p3\n")
        r = GitRun.helper(agent, "get", "protocol=https\nhost=h.example\n")
        #expect(r.stdout == "username=u\npassword=p3\n", "\(r)")
        #expect(agent.cli(["get", "--server", "h.example"]).stdout == "p3")
        // A request larger than the first read buffer (a 20,000-byte password) arrives whole.
        let long = String(repeating: "x", count: 19_999) + "!"
        r = GitRun.helper(agent, "store", "protocol=https\nhost=long.example\nusername=u\npassword=\(long)\n")
        r = GitRun.helper(agent, "get", "protocol=https\nhost=long.example\n")
        #expect(r.stdout == "username=u\npassword=\(long)\n", "\(r.stderr)")

        // What git's protocol refuses is ignored without a word on stdout: unknown actions, a NUL,
        // a store without a username, an erase naming nothing.
        r = GitRun.helper(agent, "capabilities", "")
        #expect(r.status == 0 && r.stdout.isEmpty, "\(r)")
        r = GitRun.helper(agent, "get", "protocol=https\nhost=h.ex\u{0}ample\n")
        #expect(r.status == 0 && r.stdout.isEmpty && r.stderr.contains("malformed"), "\(r)")
        r = GitRun.helper(agent, "store", "protocol=https\nhost=other.example\npassword=p\n")
        #expect(r.status == 0 && agent.cli(["get", "--server", "other.example"]).status == 3, "\(r)")
        r = GitRun.helper(agent, "erase", "\n")
        #expect(r.status == 0 && agent.cli(["get", "--server", "h.example"]).stdout == "p3", "\(r)")
        // Usage errors are the only non-zero exits.
        r = GitRun.helper(agent, nil, "")
        #expect(r.status == 2 && r.stderr.contains("usage: git-credential-coffer"), "\(r)")
    }

    /// Issue #24 (5): a request without a host (git always sends one; other programs speaking the
    /// protocol may not) gets nothing from the items of any host, only from one stored without a host.
    @Test func aRequestWithoutAHostMatchesOnlyCredentialsWithoutOne() throws {
        let agent = try AgentProcess()
        for (host, password) in [("a.example", "pw-a"), ("b.example", "pw-b")] {
            let r = GitRun.helper(agent, "store", "protocol=https\nhost=\(host)\nusername=u\npassword=\(password)\n")
            #expect(r.status == 0 && r.stderr.isEmpty, "\(r)")
        }
        var r = GitRun.helper(agent, "get", "protocol=https\n")
        #expect(r.status == 0 && r.stdout.isEmpty, "no host: no server's password, \(r)")
        r = GitRun.helper(agent, "get", "protocol=https\nusername=u\n")
        #expect(r.status == 0 && r.stdout.isEmpty, "\(r)")
        r = GitRun.helper(agent, "get", "protocol=https\nhost=b.example\n")
        #expect(r.stdout == "username=u\npassword=pw-b\n", "\(r)")
        // An erase without a host leaves the hosts' credentials alone too.
        r = GitRun.helper(agent, "erase", "protocol=https\nusername=u\n")
        #expect(r.status == 0 && agent.cli(["get", "--server", "a.example"]).stdout == "pw-a", "\(r)")
        // A credential stored without a host (a certificate's path) is what a hostless request finds.
        r = GitRun.helper(agent, "store", "protocol=cert\npath=/home/u/id.p12\nusername=u\npassword=pw-cert\n")
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r)")
        r = GitRun.helper(agent, "get", "protocol=cert\npath=/home/u/id.p12\n")
        #expect(r.stdout == "username=u\npassword=pw-cert\n", "\(r)")
        r = GitRun.helper(agent, "get", "protocol=cert\n")
        #expect(r.stdout == "username=u\npassword=pw-cert\n", "\(r)")
    }

    /// Values the helper does not use pass unread; stored values that would break git's protocol are
    /// never written into it; a caller that keeps its end open gets its answer after the blank line.
    @Test func hostileValuesNeverBreakGitsProtocol() throws {
        let agent = try AgentProcess()
        var r = GitRun.helper(agent, "store", "protocol=https\nhost=h.example\nusername=u\npassword=p1\n")
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r)")
        // A Latin-1 realm (git ≥ 2.41 forwards WWW-Authenticate byte for byte) and a NUL in a field
        // nobody reads: the request is still served.
        r = runCLI(["-c", "printf 'protocol=https\\nhost=h.example\\nwwwauth[]=Basic realm=\"Caf\\351\"\\nfuture=a\\000b\\n\\n' | \"$0\" --socket \"$1\" get",
                    GitRun.helperBinary, agent.socketPath], executable: "/bin/sh")
        #expect(r.status == 0 && r.stdout == "username=u\npassword=p1\n", "\(r)")
        // A username that is not UTF-8 cannot name an item: nothing, and git asks.
        r = runCLI(["-c", "printf 'protocol=https\\nhost=h.example\\nusername=J\\351r\\364me\\n' | \"$0\" --socket \"$1\" get",
                    GitRun.helperBinary, agent.socketPath], executable: "/bin/sh")
        #expect(r.status == 0 && r.stdout.isEmpty && r.stderr.contains("not UTF-8"), "\(r)")

        // An item stored another way whose password holds a line break: written into the answer it
        // would add a field of its own (host=…); the helper answers nothing instead.
        r = agent.cli(["add", "--server", "inj.example", "--protocol", "htps", "--account", "u", "--secret-stdin"],
                      stdin: "pw\nhost=evil.example\n")
        #expect(r.status == 0, "\(r)")
        r = GitRun.helper(agent, "get", "protocol=https\nhost=inj.example\n")
        #expect(r.status == 0 && r.stdout.isEmpty && r.stderr.contains("line break"), "\(r)")
        // An account with a line break is passed over for one git can be given, even when it is the
        // newest (the one a request without a username would otherwise get).
        r = agent.cli(["add", "--server", "acct.example", "--protocol", "htps", "--account", "plain", "--secret-stdin"], stdin: "pw3")
        #expect(r.status == 0, "\(r)")
        usleep(20_000)
        r = agent.cli(["add", "--server", "acct.example", "--protocol", "htps", "--account", "a\nhost=evil.example", "--secret-stdin"],
                      stdin: "pw2")
        #expect(r.status == 0, "\(r)")
        r = GitRun.helper(agent, "get", "protocol=https\nhost=acct.example\n")
        #expect(r.stdout == "username=plain\npassword=pw3\n", "\(r)")

        // url= replaces every earlier field, as git's credential_from_url does.
        r = GitRun.helper(agent, "get", "protocol=imap\nhost=other.example\nusername=x\nurl=https://h.example/\n")
        #expect(r.stdout == "username=u\npassword=p1\n", "\(r)")

        // The request's end is its blank line: a caller that keeps standard input open is answered.
        let kept = try GitRun.getKeepingInputOpen(agent, "protocol=https\nhost=h.example\n\n")
        #expect(kept.answered && kept.stdout == "username=u\npassword=p1\n", "\(kept)")
    }

    /// The request is read into a small buffer that grows (256 bytes first, then 2,048, …): a blank
    /// line that ends the request just before, at, or just after a buffer's end is found, with the
    /// caller keeping standard input open (so only the blank line can end the reading).
    @Test func aRequestEndingAtTheFirstBuffersEdgeIsAnswered() throws {
        let agent = try AgentProcess()
        let r = GitRun.helper(agent, "store", "protocol=https\nhost=h.example\nusername=u\npassword=p1\n")
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r)")
        let head = "protocol=https\nhost=h.example\nwwwauth[]=Basic realm=\""
        for size in [254, 255, 256, 257, 258, 2047, 2048, 2049] {
            // The realm pads the request to `size` bytes, its blank line included.
            let tail = "\"\n\n"
            let request = head + String(repeating: "r", count: size - head.utf8.count - tail.utf8.count) + tail
            #expect(request.utf8.count == size)
            let kept = try GitRun.getKeepingInputOpen(agent, request)
            #expect(kept.answered && kept.stdout == "username=u\npassword=p1\n", "\(size) bytes: \(kept)")
        }
    }

    /// Issue #42: what a `get` costs, from the agent's own counters (COUNTERS): a credential nobody
    /// need be asked about is found as `coffer get` fetches one, with one search that brings the
    /// secrets with the attributes, behind AUTH_OPTIONS (nobody may be asked: no prompt for a match
    /// that might not be chosen) pipelined with it, on one connection. Where a match is behind an
    /// access control, that search is refused and the helper chooses by attributes, then reads only
    /// the chosen one (which, with nobody to ask, fails at once). A store never needs the person and
    /// never tells it. A change that adds a round trip or a search to a get or a store fails here.
    @Test func whatAGetCostsIsCountedByTheAgent() throws {
        let agent = try Self.agentWithGuardedItem()
        let r = GitRun.helper(agent, "store", "protocol=https\nhost=plain.example\nusername=u\npassword=pw-plain\n")
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r)")
        let meter = try AgentConnection(path: agent.socketPath, clientName: "meter")
        func cost(_ body: () -> CLIResult) throws -> (CLIResult, AgentCounters) {
            let before = try meter.counters()
            let r = body()
            let after = try meter.counters()
            // The meter's own second COUNTERS is one request.
            return (r, AgentCounters(connections: after.connections - before.connections, requests: after.requests - before.requests - 1,
                                     identifications: after.identifications - before.identifications,
                                     searches: after.searches - before.searches))
        }
        // Without a terminal (a new session), as from an IDE or a cron job.
        let (plain, p) = try cost { GitRun.detachedHelper(agent, "get", "protocol=https\nhost=plain.example\n") }
        #expect(plain.status == 0 && plain.stdout == "username=u\npassword=pw-plain\n", "\(plain)")
        let (guarded, g) = try cost { GitRun.detachedHelper(agent, "get", "protocol=https\nhost=git.example.com\n") }
        #expect(guarded.status == 0 && guarded.stdout.isEmpty, "\(guarded)")
        // GIT_TERMINAL_PROMPT=0 is the same as no terminal.
        let (quiet, q) = try cost {
            runCLI(["--socket", agent.socketPath, "get"], stdin: "protocol=https\nhost=plain.example\n\n", environment: ["GIT_TERMINAL_PROMPT": "0"],
                   executable: GitRun.helperBinary)
        }
        #expect(quiet.status == 0 && quiet.stdout == "username=u\npassword=pw-plain\n", "\(quiet)")
        // git stores what worked after every use: the credential is there already, so the add is
        // refused as a duplicate and the same one is found and changed. No AUTH_OPTIONS: none of
        // these can need the person.
        let (stored, s) = try cost {
            GitRun.detachedHelper(agent, "store", "protocol=https\nhost=plain.example\nusername=u\npassword=pw-plain\n")
        }
        #expect(stored.status == 0 && stored.stderr.isEmpty, "\(stored)")
        print("git-credential-coffer get, plain: \(p.requests) round trips, \(p.connections) connections, \(p.searches) searches; "
              + "protected, nobody to ask: \(g.requests) round trips, \(g.searches) searches; store of a stored one: \(s.requests) round trips")
        // HELLO, ADD (a duplicate), the search, UPDATE.
        #expect(s.connections == 1 && s.requests == 4, "store: \(s)")
        // HELLO, AUTH_OPTIONS, the search with the secrets.
        #expect(p.connections == 1 && p.identifications <= 1 && p.requests == 3 && p.searches == 1, "plain: \(p)")
        #expect(q.connections == 1 && q.requests == 3 && q.searches == 1, "GIT_TERMINAL_PROMPT=0: \(q)")
        // HELLO, AUTH_OPTIONS, the search with the secrets (refused: a match needs the person), the
        // search by attributes, the read refused without asking.
        #expect(g.connections == 1 && g.requests == 5 && g.searches <= 3, "protected: \(g)")
    }

    /// The credential `get` answers with when several match: the one for the request's path (or a
    /// pathless one when git sent no path), then the most recently changed; a credential behind an
    /// access control among them changes nothing about the choice, and without a terminal it is
    /// neither read nor asked for unless it is the one chosen (then nothing is answered).
    @Test func theChosenCredentialAmongSeveralIsTheNewestOneGitCanUse() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        func add(_ account: String, _ password: String, path: String? = nil, guarded: Bool = false) {
            var args = ["add", "--server", "multi.example", "--protocol", "https", "--account", account, "--secret-stdin"]
            if let path { args += ["--path", path] }
            if guarded { args += ["--access-control", "user-presence"] }
            let r = agent.cli(args, stdin: password)
            #expect(r.status == 0, "\(r)")
            usleep(20_000)   // distinct modification dates
        }
        let request = "protocol=https\nhost=multi.example\n"
        add("old", "pw-old")
        add("repo", "pw-repo", path: "org/repo.git")
        add("new", "pw-new")
        // A credential for the whole host before a repository's, though the repository's is not the oldest.
        #expect(GitRun.detachedHelper(agent, "get", request).stdout == "username=new\npassword=pw-new\n")
        #expect(GitRun.detachedHelper(agent, "get", request + "path=org/repo.git\n").stdout == "username=repo\npassword=pw-repo\n")
        #expect(GitRun.detachedHelper(agent, "get", request + "username=old\n").stdout == "username=old\npassword=pw-old\n")
        // The newest one changed last wins.
        var r = agent.cli(["update", "--server", "multi.example", "--account", "old", "--secret-stdin"], stdin: "pw-old-2")
        #expect(r.status == 0, "\(r)")
        #expect(GitRun.detachedHelper(agent, "get", request).stdout == "username=old\npassword=pw-old-2\n")
        // A protected credential, older than the chosen one, is passed over without a word.
        usleep(20_000)
        add("guarded-old", "pw-guarded", guarded: true)
        r = agent.cli(["update", "--server", "multi.example", "--account", "new", "--secret-stdin"], stdin: "pw-new-2")
        #expect(r.status == 0, "\(r)")
        r = GitRun.detachedHelper(agent, "get", request)
        #expect(r.status == 0 && r.stdout == "username=new\npassword=pw-new-2\n" && r.stderr.isEmpty, "\(r)")
        // The newest being protected, nobody to ask: nothing (git asks the person), not the next one.
        usleep(20_000)
        add("guarded-new", "pw-guarded-new", guarded: true)
        r = GitRun.detachedHelper(agent, "get", request)
        #expect(r.status == 0 && r.stdout.isEmpty, "\(r)")
    }

    /// An ordinary user's agent has no CAP_SYS_PTRACE: it reads a client's /proc/PID/exe (to find its
    /// signed identity) only while the client stays dumpable. The helper gives up core files, not
    /// that (here: a reader without CAP_SYS_PTRACE, while the helper waits for git's request).
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"), "needs util-linux setpriv"))
    func theHelperStaysIdentifiableByAnOrdinaryUsersAgent() throws {
        // Both without CAP_SYS_PTRACE, as two processes of an ordinary user are (setpriv execs in place).
        let dropPtrace = ["--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace"]
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        p.arguments = dropPtrace + [GitRun.helperBinary, "--socket", "/nonexistent", "get"]
        let inp = Pipe()
        p.standardInput = inp
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        defer {
            try? inp.fileHandleForWriting.close()
            p.waitUntilExit()
        }
        // Blocked reading the request from its pipe (the kernel says where it sleeps): hardening is done.
        var wchan = ""
        for _ in 0..<500 {
            wchan = (try? String(contentsOfFile: "/proc/\(p.processIdentifier)/wchan", encoding: .utf8)) ?? ""
            if wchan.contains("pipe") { break }
            usleep(10_000)
        }
        try #require(wchan.contains("pipe"), "the helper never waited for its request: \(wchan)")
        let r = runCLI(dropPtrace + ["readlink", "/proc/\(p.processIdentifier)/exe"], executable: "/usr/bin/setpriv")
        #expect(r.status == 0 && r.stdout.hasSuffix("git-credential-coffer\n"), "\(r)")
    }

    @Test func aLockedOrMissingAgentLeavesGitToAsk() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        var r = Self.credential(agent, "approve", "protocol=https\nhost=git.example.com\nusername=alice\npassword=pw")
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com") == ("alice", "pw"))
        #expect(agent.cli(["lock"]).status == 0)
        // The helper answers nothing and exits 0; git then asks (and, with prompts off, says so itself).
        r = GitRun.helper(agent, "get", "protocol=https\nhost=git.example.com\n")
        #expect(r.status == 0 && r.stdout.isEmpty, "\(r)")
        r = Self.credential(agent, "fill", "protocol=https\nhost=git.example.com")
        #expect(r.status != 0 && r.stdout.isEmpty && r.stderr.contains("terminal prompts disabled"), "\(r)")
        // store and erase while locked do not fail git either, and keep what is stored.
        r = Self.credential(agent, "approve", "protocol=https\nhost=git.example.com\nusername=alice\npassword=other")
        #expect(r.status == 0, "\(r)")
        r = Self.credential(agent, "reject", "protocol=https\nhost=git.example.com\nusername=alice\npassword=pw")
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(Self.filled(agent, "protocol=https\nhost=git.example.com") == ("alice", "pw"))

        // No agent at all: nothing on stdout, one line on stderr saying why, exit 0.
        agent.stop()
        r = GitRun.helper(agent, "get", "protocol=https\nhost=git.example.com\n")
        #expect(r.status == 0 && r.stdout.isEmpty && r.stderr.contains("keychain not used") && !r.stderr.contains("pw"), "\(r)")
        // The helper connects before it reads git's request, but a malformed request is still what it
        // names, in its one line.
        r = GitRun.helper(agent, "get", "protocol=https\nhost=h.ex\u{0}ample\n")
        #expect(r.status == 0 && r.stdout.isEmpty && r.stderr.contains("malformed") && !r.stderr.contains("keychain not used"), "\(r)")
        r = Self.credential(agent, "fill", "protocol=https\nhost=git.example.com")
        #expect(r.status != 0 && r.stderr.contains("terminal prompts disabled"), "\(r)")
    }

    /// An agent with a passcode and alice's credential for git.example.com behind user presence
    /// (password "guarded").
    static func agentWithGuardedItem() throws -> AgentProcess {
        let agent = try AgentProcess()
        agent.setPasscode()
        let r = agent.cli(["add", "--server", "git.example.com", "--protocol", "https", "--account", "alice",
                           "--access-control", "user-presence", "--secret-stdin"], stdin: "guarded")
        #expect(r.status == 0, "\(r)")
        return agent
    }

    @Test(.enabled(if: TerminalRun.available, "needs util-linux script and setsid"))
    func protectedItemsPromptOnlyOnATerminal() throws {
        let agent = try Self.agentWithGuardedItem()
        let request = "protocol=https\nhost=git.example.com\n"
        // No terminal: nothing, at once (the agent never waits for a person).
        let start = Date()
        let r = GitRun.detachedHelper(agent, "get", request)
        #expect(r.status == 0 && r.stdout.isEmpty && Date().timeIntervalSince(start) < 10, "\(r)")
        // On a terminal the agent's authenticator asks there; then git gets the password.
        let dir = TemporaryDirectory("coffer-git-tty")
        let input = dir.file("request")
        try request.write(toFile: input, atomically: true, encoding: .utf8)
        let t = TerminalRun.run(["/bin/sh", "-c", "\"$0\" --socket \"$1\" get < \"$2\"", GitRun.helperBinary, agent.socketPath, input],
                                typing: AgentProcess.password, prompt: "Passcode: ")
        #expect(t.status == 0 && t.prompted && t.output.contains("password=guarded"), "\(t)")
        #expect(t.output.contains("git-credential-coffer wants to read the secret of \"git.example.com\""), "\(t)")
        // GIT_TERMINAL_PROMPT=0 (go, cargo, CI around git) means no prompt, even on a terminal.
        let quiet = TerminalRun.run(["/bin/sh", "-c", "GIT_TERMINAL_PROMPT=0 \"$0\" --socket \"$1\" get < \"$2\"; echo \"done $?\"",
                                     GitRun.helperBinary, agent.socketPath, input],
                                    typing: AgentProcess.password, prompt: "Passcode: ", timeout: 10)
        #expect(quiet.output.contains("done 0") && !quiet.prompted && !quiet.output.contains("password="), "\(quiet)")
        // git stores what worked after every use: that never asks a second time (nor changes the item).
        try (request + "username=alice\npassword=guarded\n").write(toFile: input, atomically: true, encoding: .utf8)
        let s = TerminalRun.run(["/bin/sh", "-c", "\"$0\" --socket \"$1\" store < \"$2\"", GitRun.helperBinary, agent.socketPath, input],
                                typing: nil, prompt: "Passcode: ", timeout: 10)
        #expect(s.status == 0 && !s.prompted, "\(s)")
        // A newer plain credential for the same host is chosen: on a terminal too, nobody is asked for
        // the protected one (the one search that brings secrets runs with nobody to be asked).
        usleep(20_000)
        let bob = agent.cli(["add", "--server", "git.example.com", "--protocol", "https", "--account", "bob", "--secret-stdin"], stdin: "plain")
        #expect(bob.status == 0, "\(bob)")
        try request.write(toFile: input, atomically: true, encoding: .utf8)
        let chosen = TerminalRun.run(["/bin/sh", "-c", "\"$0\" --socket \"$1\" get < \"$2\"", GitRun.helperBinary, agent.socketPath, input],
                                     typing: nil, prompt: "Passcode: ", timeout: 10)
        #expect(chosen.status == 0 && !chosen.prompted && chosen.output.contains("username=bob") && chosen.output.contains("password=plain"),
                "\(chosen)")
    }

    /// An internet password made with `coffer add` is the password whole: a NUL in it is not the
    /// helper's refresh-token separator (its tail never reaches git as oauth_refresh_token=), and
    /// git, which would keep only the part before the NUL, gets nothing.
    @Test func aSecretGitCannotCarryIsNotHandedToGit() throws {
        let agent = try AgentProcess()
        var r = agent.cli(["add", "--server", "nul.example.com", "--protocol", "https", "--account", "alice", "--secret-stdin"],
                          stdin: "head\u{0}tail")
        #expect(r.status == 0, "\(r)")
        r = GitRun.helper(agent, "get", "protocol=https\nhost=nul.example.com\n")
        #expect(r.status == 0 && r.stdout.isEmpty && r.stderr.contains("NUL") && !r.stderr.contains("tail"), "\(r)")
        // git's reject with the password before the NUL is no match for the whole secret: the item stays.
        r = GitRun.helper(agent, "erase", "protocol=https\nhost=nul.example.com\nusername=alice\npassword=head\n")
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["get", "--server", "nul.example.com", "--account", "alice"]).stdout == "head\u{0}tail")
    }

    /// git erases right after a server refused a password: on a terminal too, a protected item is
    /// neither read (to compare) nor deleted behind a prompt; it stays, and unprotected ones go.
    @Test(.enabled(if: TerminalRun.available, "needs util-linux script and setsid"))
    func eraseNeverPrompts() throws {
        let agent = try Self.agentWithGuardedItem()
        let r = agent.cli(["add", "--server", "git.example.com", "--protocol", "https", "--account", "bob", "--secret-stdin"], stdin: "plain")
        #expect(r.status == 0, "\(r)")
        let dir = TemporaryDirectory("coffer-git-erase")
        let input = dir.file("request")
        for request in ["protocol=https\nhost=git.example.com\nusername=alice\npassword=guarded\n",   // compare: would read
                        "protocol=https\nhost=git.example.com\n"] {                                     // no password: delete all
            try request.write(toFile: input, atomically: true, encoding: .utf8)
            let t = TerminalRun.run(["/bin/sh", "-c", "\"$0\" --socket \"$1\" erase < \"$2\"; echo \"done $?\"", GitRun.helperBinary,
                                     agent.socketPath, input], typing: AgentProcess.password, prompt: "Passcode: ", timeout: 10)
            #expect(t.output.contains("done 0") && !t.prompted, "\(t)")
        }
        let left = agent.cli(["find", "--class", "inet", "--json"])
        #expect(left.stdout.contains("\"acct\":\"alice\"") && !left.stdout.contains("\"acct\":\"bob\""), "\(left)")
    }

    @Test func gitCloneOverHTTPGetsItsPasswordFromCoffer() throws {
        let agent = try AgentProcess()
        let dir = TemporaryDirectory("coffer-git-clone")
        let home = TemporaryDirectory("coffer-git-home")
        // A bare repository with one commit, served as git's dumb HTTP protocol.
        let work = dir.file("work"), bare = dir.file("repo.git")
        for args in [["init", "-q", "-b", "main", work], ["-C", work, "-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-q",
                                                       "--allow-empty", "-m", "first"],
                     ["clone", "-q", "--bare", work, bare], ["-C", bare, "update-server-info"]] {
            let r = GitRun.git(args, helper: nil, home: home)
            try #require(r.status == 0, "git \(args): \(r)")
        }
        let server = try BasicAuthServer(root: dir.path, username: "alice", password: "s3cret pass")
        defer { server.stop() }
        let url = "http://127.0.0.1:\(server.port)/repo.git"

        // Without a stored credential the clone fails (git cannot ask: prompts are off).
        var r = GitRun.git(["clone", "-q", url, dir.file("first")], helper: GitRun.helper(agent), home: home)
        #expect(r.status != 0 && server.refused > 0, "\(r)")
        #expect(server.served == 0)

        // Stored in Coffer (as a person would with the CLI), the clone authenticates with it.
        r = agent.cli(["add", "--server", "127.0.0.1", "--port", "\(server.port)", "--protocol", "http", "--account", "alice",
                       "--secret-stdin"], stdin: "s3cret pass")
        #expect(r.status == 0, "\(r)")
        r = GitRun.git(["clone", "-q", url, dir.file("second")], helper: GitRun.helper(agent), home: home)
        #expect(r.status == 0 && server.served > 0, "\(r)")
        #expect(FileManager.default.fileExists(atPath: dir.file("second/.git/HEAD")))
        #expect(server.wrongPasswords == 0)

        // A wrong stored password: git rejects it (the helper erases it), and the next clone fails
        // without sending it again.
        r = agent.cli(["update", "--server", "127.0.0.1", "--port", "\(server.port)", "--secret-stdin"], stdin: "wrong")
        #expect(r.status == 0, "\(r)")
        r = GitRun.git(["clone", "-q", url, dir.file("third")], helper: GitRun.helper(agent), home: home)
        #expect(r.status != 0 && server.wrongPasswords == 1, "\(r)")
        #expect(agent.cli(["get", "--server", "127.0.0.1"]).status == 3, "the refused password was not erased")
    }
}

/// Running `/usr/bin/git` and the helper with no user or system configuration in the way.
enum GitRun {
    static let available = FileManager.default.isExecutableFile(atPath: "/usr/bin/git")
    static var helperBinary: String { Binaries.directory + "/git-credential-coffer" }

    /// The `credential.helper` value naming this build's helper for `agent` (an absolute path, which
    /// git runs through the shell as it is).
    static func helper(_ agent: AgentProcess) -> String { "\(helperBinary) --socket \(agent.socketPath)" }

    static func environment(home: TemporaryDirectory) -> [String: String] {
        ["HOME": home.path, "XDG_CONFIG_HOME": home.file("config"), "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
         "GIT_ASKPASS": "", "SSH_ASKPASS": "", "LC_ALL": "C", "COFFER_SOCKET": "/nonexistent"]
    }

    static func git(_ args: [String], stdin: String? = nil, helper: String?, config: [String] = [],
                    home: TemporaryDirectory) -> CLIResult {
        var pre = ["-c", "credential.helper="]
        if let helper { pre += ["-c", "credential.helper=\(helper)"] }
        for c in config { pre += ["-c", c] }
        return runCLI(pre + args, stdin: stdin, environment: environment(home: home), executable: "/usr/bin/git")
    }

    /// The helper itself, as git would run it.
    static func helper(_ agent: AgentProcess, _ action: String?, _ input: String) -> CLIResult {
        runCLI(["--socket", agent.socketPath] + (action.map { [$0] } ?? []), stdin: input, executable: helperBinary)
    }

    /// `get` of `request` written to the helper's standard input, which stays open until it exits:
    /// whether it answered (within 15 s) and what it printed.
    static func getKeepingInputOpen(_ agent: AgentProcess, _ request: String) throws -> (answered: Bool, stdout: String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: helperBinary)
        p.arguments = ["--socket", agent.socketPath, "get"]
        let out = Pipe(), inp = Pipe()
        p.standardOutput = out
        p.standardInput = inp
        try p.run()
        inp.fileHandleForWriting.write(Data(request.utf8))
        let deadline = Date().addingTimeInterval(15)
        while p.isRunning && Date() < deadline { usleep(10_000) }
        let answered = !p.isRunning
        if p.isRunning { kill(p.processIdentifier, SIGKILL) }
        p.waitUntilExit()
        try? inp.fileHandleForWriting.close()
        return (answered, String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self))
    }

    /// The helper in a new session: no controlling terminal.
    static func detachedHelper(_ agent: AgentProcess, _ action: String, _ input: String) -> CLIResult {
        runCLI(["-w", helperBinary, "--socket", agent.socketPath, action], stdin: input, executable: "/usr/bin/setsid")
    }
}

/// A loopback HTTP/1.1 server with basic auth serving the files under `root` (git's dumb HTTP
/// protocol needs nothing more): 401 with `WWW-Authenticate` unless the request carries the right
/// credentials. One thread, one request per connection.
final class BasicAuthServer: @unchecked Sendable {
    let port: UInt16
    private let fd: Int32
    private let root: String
    private let expected: String
    private let lock = NSLock()
    private var counts = (served: 0, refused: 0, wrong: 0)
    private var stopped = false
    private let thread: Thread

    var served: Int { lock.withLock { counts.served } }
    var refused: Int { lock.withLock { counts.refused } }
    var wrongPasswords: Int { lock.withLock { counts.wrong } }

    init(root: String, username: String, password: String) throws {
        self.root = root
        expected = "Basic " + Data("\(username):\(password)".utf8).base64EncodedString()
        let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = 0
        let bound = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(s, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard s >= 0, bound == 0, listen(s, 16) == 0 else { throw POSIXError(.EADDRNOTAVAIL) }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(s, $0, &length) } }
        port = UInt16(bigEndian: addr.sin_port)
        fd = s
        let box = ServerBox()
        thread = Thread { box.server?.serve() }
        box.server = self
        thread.start()
    }

    private final class ServerBox: @unchecked Sendable { weak var server: BasicAuthServer? }

    func stop() {
        lock.withLock { stopped = true }
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
    }

    private func serve() {
        while !lock.withLock({ stopped }) {
            let c = accept(fd, nil, nil)
            if c < 0 { if errno == EINTR { continue } else { return } }
            handle(c)
            close(c)
        }
    }

    private func handle(_ c: Int32) {
        var tv = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var request = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while !request.ends(with: Array("\r\n\r\n".utf8)) && request.count < 65536 {
            let n = read(c, &buffer, buffer.count)
            if n <= 0 { return }
            request += buffer[..<n]
        }
        let text = String(decoding: request, as: UTF8.self)
        let lines = text.components(separatedBy: "\r\n")
        let parts = lines[0].split(separator: " ")
        guard parts.count >= 2 else { return }
        let authorization = lines.first { $0.lowercased().hasPrefix("authorization:") }
            .map { String($0.dropFirst("authorization:".count)).trimmingCharacters(in: .whitespaces) }
        guard authorization == expected else {
            lock.withLock {
                counts.refused += 1
                if authorization != nil { counts.wrong += 1 }
            }
            respond(c, "401 Unauthorized", ["WWW-Authenticate: Basic realm=\"coffer test\""], Data())
            return
        }
        var path = String(parts[1])
        if let q = path.firstIndex(of: "?") { path = String(path[..<q]) }
        let file = root + path
        guard !path.contains(".."), let data = FileManager.default.contents(atPath: file) else {
            respond(c, "404 Not Found", [], Data())
            return
        }
        lock.withLock { counts.served += 1 }
        respond(c, "200 OK", ["Content-Type: application/octet-stream"], data)
    }

    private func respond(_ c: Int32, _ status: String, _ headers: [String], _ body: Data) {
        var head = "HTTP/1.1 \(status)\r\nContent-Length: \(body.count)\r\nConnection: close\r\n"
        for h in headers { head += h + "\r\n" }
        let bytes = Array((head + "\r\n").utf8) + Array(body)
        var sent = 0
        while sent < bytes.count {
            let n = bytes[sent...].withUnsafeBytes { write(c, $0.baseAddress, $0.count) }
            if n <= 0 { return }
            sent += n
        }
    }
}

private extension Array where Element == UInt8 {
    func ends(with suffix: [UInt8]) -> Bool { count >= suffix.count && Array(self[(count - suffix.count)...]) == suffix }
}
