import CofferClient
import CofferModel
import CofferSecretService
import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

extension PrivateSessionBus {
    /// A private bus that D-Bus-activates the front end at `executable` for `agent` through
    /// contrib/dbus's activation file (its Exec= pointed at the built front end and the agent's socket).
    static func activating(_ executable: String, agent: AgentProcess, plainSessions: Bool = true) throws -> (PrivateSessionBus, TemporaryDirectory) {
        let services = TemporaryDirectory("coffer-ssbus-services")
        let file = try String(contentsOfFile: Binaries.packageRoot + "/contrib/dbus/org.freedesktop.secrets.service", encoding: .utf8)
        guard file.contains("\nExec=/usr/local/bin/coffer-secret-service\n") else {
            throw SignedApps.Failure("contrib/dbus/org.freedesktop.secrets.service has no Exec=/usr/local/bin/coffer-secret-service line")
        }
        try file.replacingOccurrences(of: "\nExec=/usr/local/bin/coffer-secret-service\n",
                                      with: "\nExec=\(executable) --socket \(agent.socketPath)\n")
            .write(toFile: services.file("org.freedesktop.secrets.service"), atomically: true, encoding: .utf8)
        return (try PrivateSessionBus(serviceDirectory: services.path, plainSessions: plainSessions), services)
    }

    /// The pid of the process owning org.freedesktop.secrets, if any.
    func ownerPID() -> Int32? {
        let r = run("/usr/bin/gdbus", ["call", "--session", "-d", "org.freedesktop.DBus", "-o", "/org/freedesktop/DBus",
                                       "-m", "org.freedesktop.DBus.GetConnectionUnixProcessID", "org.freedesktop.secrets"])
        guard r.status == 0 else { return nil }
        // "(uint32 1234,)"
        return r.stdout.split(whereSeparator: { !$0.isNumber }).compactMap { Int32($0) }.last
    }
}

/// The front end's own checks on a sender's process (the start-time check of delegated identity)
/// and a front end that crashes under a working client (restarted by D-Bus activation, nothing lost).
@Suite(.enabled(if: PrivateSessionBus.available, "needs dbus-daemon, gdbus and Debian's python3 with python3-secretstorage (contrib/deps.sh)"))
struct SecretServiceRecoveryTests {
    /// The front end's start-time check (ThreatModel.md, Delegated identity): a process that started
    /// after its sender's unique name appeared holds a reused pid and is refused before anything is
    /// asked of the agent. A real pid reuse cannot be forced here, so the check is fed what the bus
    /// would give after one: a live process (a child started now) and a recorded time at which the
    /// name appeared that is earlier than the process's start. The process the check accepts is the
    /// one the real agent identifies through DELEGATE; and a start time recorded for it that does not
    /// match (what the front end would hand over had the pid changed hands after its read) is refused
    /// by the agent.
    @Test func aSenderProcessStartedAfterItsNameAppearedIsRefused() throws {
        // This test process is the front end (signed with delegate-identity), as in DelegationTests.
        let (apps, agent) = try DelegationTests.setUp()
        defer { withExtendedLifetime(apps) {} }
        let child = try DelegationTests.Sleeper(DelegationTests.sleepPath)
        defer { child.stop() }
        let started = child.startTime
        #expect(started > 0 && started <= SecretServiceFrontEnd.ticksSinceBoot())

        // The name appeared one tick before the process started: not the sender.
        var refusal: SecretServiceFrontEnd.BusError?
        do { _ = try SecretServiceFrontEnd.senderProcess(":1.42", pid: child.pid, busPIDFD: -1, appeared: started - 1) } catch { refusal = error }
        #expect(refusal?.name == "org.freedesktop.DBus.Error.AccessDenied" && refusal?.message.contains("started after :1.42 appeared") == true,
                "\(String(describing: refusal))")

        // Appeared when it started, or before the front end was there to see it: the process, pinned.
        for appeared in [started, started + 100, nil] as [UInt64?] {
            let p = try SecretServiceFrontEnd.senderProcess(":1.42", pid: child.pid, busPIDFD: -1, appeared: appeared)
            let link = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(p.pidfd)")
            #expect(p.pid == child.pid && p.startTime == started && link == "anon_inode:[pidfd]", "\(String(describing: link))")
        }

        // What the check accepts, the agent identifies as that process (the unsigned sleep here).
        let process = try SecretServiceFrontEnd.senderProcess(":1.42", pid: child.pid, busPIDFD: -1, appeared: started)
        let accepted = try DelegationTests.connect(agent)
        try accepted.delegate(pidfd: process.pidfd, pid: process.pid, startTime: process.startTime)
        let who = try accepted.whoami()
        #expect(who.pid == UInt32(child.pid) && who.accessGroups == ["unsigned"], "\(who)")
        // A recorded start time that is not the live process's: refused, the connection closed.
        for stale in [started - 1, started + 1] {
            let r = try DelegationTests.delegate(agent, descriptors: [process.pidfd], pid: process.pid, startTime: stale)
            #expect(r.0 == .notAvailable && r.closed, "\(r)")
        }

        // A process that is gone: refused, nothing pinned.
        child.stop()
        refusal = nil
        do { _ = try SecretServiceFrontEnd.senderProcess(":1.42", pid: child.pid, busPIDFD: -1, appeared: nil) } catch { refusal = error }
        #expect(refusal?.name == "org.freedesktop.DBus.Error.AccessDenied" && refusal?.message.contains("is gone") == true,
                "\(String(describing: refusal))")
    }

    /// A front end killed (SIGKILL) under a client that keeps its bus connection: the client's next
    /// call D-Bus-activates a new front end through the activation file, the items stored before are
    /// all there with their secrets, and the new one stores and serves as the first did. The script
    /// waits (a file in the bus's directory) while the test kills the front end.
    @Test func aFrontEndThatCrashesIsActivatedAgainAndNothingIsLost() throws {
        let apps = try SignedApps()
        let executable = String(decoding: try StableFile.canonicalPath(Binaries.directory + "/coffer-secret-service"), as: UTF8.self)
        try apps.sign("secret-service", appID: SecretServiceBusTests.frontEndApp, groups: ["secret-service"], path: executable,
                      entitlements: ["delegate-identity"])
        let agent = try apps.startAgent()
        let (bus, services) = try PrivateSessionBus.activating(executable, agent: agent)
        defer { withExtendedLifetime(services) {} }
        let ready = bus.dir.file("ready"), go = bus.dir.file("go")
        let script = SecretServiceBusTests.prelude + """
            from jeepney.wrappers import DBusErrorResponse
            collection = secretstorage.get_default_collection(a, open_session(a))
            for i in range(20):
                collection.create_item('crash %d' % i, {'crash': 'test', 'n': str(i)}, b'secret-%d' % i)
            old_session = collection.session.object_path
            open('\(ready)', 'w').close()
            deadline = time.time() + 60
            while not os.path.exists('\(go)') and time.time() < deadline:
                time.sleep(0.05)
            assert os.path.exists('\(go)'), 'the front end was not killed'

            # The same connection (the same sender): its next call starts a new front end.
            session = open_session(a)
            collection = secretstorage.get_default_collection(a, session)
            found = {}
            for item in collection.search_items({'crash': 'test'}):
                item.session = session
                found[item.get_attributes()['n']] = item.get_secret()
            assert found == {str(i): b'secret-%d' % i for i in range(20)}, found
            # The old front end's session died with it; the new one does not know it.
            assert close(a, old_session)[0] == 'error'
            collection.create_item('after', {'crash': 'after'}, b'after the crash')
            after = list(collection.search_items({'crash': 'after'}))
            assert len(after) == 1, after
            after[0].session = session
            assert after[0].get_secret() == b'after the crash'

            print('done')

            """
        let finished = bus.pythonInBackground(script)
        let stored = PrivateSessionBus.wait(120) { FileManager.default.fileExists(atPath: ready) }
        let first = bus.ownerPID()
        if stored, let first {
            kill(first, SIGKILL)
            // Gone from the bus (its connection closed with the process).
            _ = PrivateSessionBus.wait(30) { bus.nameOwner() == nil }
        }
        _ = FileManager.default.createFile(atPath: go, contents: nil)
        let r = finished()
        #expect(stored && first != nil, "\(String(describing: r))\n\(bus.read("dbus-daemon.log"))")
        #expect(r?.status == 0 && r?.stdout.contains("done") == true, "\(String(describing: r))\n\(bus.read("dbus-daemon.log"))")
        let second = bus.ownerPID()
        #expect(second != nil && second != first, "\(String(describing: first)) then \(String(describing: second))")
        // Every item the client stored is in the keychain, for the client's (unsigned) identity.
        let listed = agent.cli(["find", "--json", "--attr", "crash=test"])
        #expect(listed.status == 0 && (0..<20).allSatisfy { listed.stdout.contains("crash \($0)\"") }, "\(listed)")
    }

    /// A GetSecrets of items the sender's last SearchItems found is one agent query, whatever their
    /// number (it was one per item: 1,000 items took 1,000 round trips; then one only for most of the
    /// search), answered exactly as item by item: the secrets of the items asked for only, unknown
    /// paths left out, and after a change each item as it is now.
    @Test func getSecretsOfASearchsItemsIsOneAgentQuery() throws {
        let (apps, agent, bus, frontEnd, _) = try SecretServiceBusTests.setUp()
        defer { withExtendedLifetime(apps) {} }
        // The agent's reads with secrets, counted from its audit log between steps.
        let r = try bus.python(SecretServiceBusTests.prelude + """
            json, time = __import__('json'), __import__('time')
            def gets():
                with open('\(agent.stateDir)/audit.log') as f:
                    return sum(1 for line in f if line.strip() and json.loads(line).get('operation') == 'get')
            collection = secretstorage.get_default_collection(a, open_session(a))
            for i in range(20):
                collection.create_item('bulk %d' % i, {'bulk': 'yes', 'n': str(i)}, b'secret-%d' % i)
            collection.create_item('other', {'bulk': 'no'}, b'not asked for')
            session = open_plain(a)[1][1]
            # 19 items (the unknown path is no item id, never asked of the agent) in one read, where
            # item by item is 19, whether or not the agent's events of the writes above have come.
            found = call(a, PATH, 'org.freedesktop.Secret.Service', 'SearchItems', 'a{ss}', {'bulk': 'yes'})
            assert found[0] == 'ok' and len(found[1][0]) == 20, found
            paths = list(found[1][0])
            missing = paths[0].rsplit('/', 1)[0] + '/nosuchitem'
            before = gets()
            got = call(a, PATH, 'org.freedesktop.Secret.Service', 'GetSecrets', 'aoo', paths[1:] + [missing], session)
            assert got[0] == 'ok', got
            assert gets() - before == 1, 'GetSecrets of a search was not one agent query: %d' % (gets() - before)
            secrets = {p: bytes(v[2]) for p, v in got[1][0].items()}
            assert len(secrets) == 19 and paths[0] not in secrets and missing not in secrets, secrets
            before = gets()
            first = call(a, paths[0], 'org.freedesktop.Secret.Item', 'GetSecret', 'o', session)
            assert first[0] == 'ok' and sorted(list(secrets.values()) + [bytes(first[1][0][2])]) == sorted(b'secret-%d' % i for i in range(20)), secrets
            assert gets() - before == 1
            # Each path has its own item's secret and content type (the one query's answers are
            # matched to the search's items by reference).
            for p, v in got[1][0].items():
                n = call(a, p, 'org.freedesktop.DBus.Properties', 'Get', 'ss', 'org.freedesktop.Secret.Item', 'Attributes')[1][0][1]['n']
                assert bytes(v[2]) == b'secret-%s' % n.encode() and v[3] == 'text/plain', (p, n, v)
            # Three of the twenty: one query too, for those three only.
            before = gets()
            few = call(a, PATH, 'org.freedesktop.Secret.Service', 'GetSecrets', 'aoo', paths[:3], session)
            assert few[0] == 'ok' and len(few[1][0]) == 3, few
            assert gets() - before == 1, gets() - before
            # After a change since the search (here the caller's own SetSecret, a new content type),
            # every answer is the item as it is now (its attributes read again), still one query.
            changed = call(a, paths[1], 'org.freedesktop.Secret.Item', 'SetSecret', '(oayays)', (session, b'', b'new', 'text/x-new'))
            assert changed[0] == 'ok', changed
            before = gets()
            again = call(a, PATH, 'org.freedesktop.Secret.Service', 'GetSecrets', 'aoo', paths[1:], session)
            assert again[0] == 'ok' and len(again[1][0]) == 19, again
            assert bytes(again[1][0][paths[1]][2]) == b'new' and again[1][0][paths[1]][3] == 'text/x-new', again[1][0][paths[1]]
            assert gets() - before == 1, gets() - before
            print('done')

            """)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(bus.read("front-end.log"))")
        #expect(frontEnd.isRunning)
    }
}
