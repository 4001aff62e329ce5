import CofferTestSupport
import Foundation
import Testing

/// The Secret Service front end answers as the freedesktop specification and gnome-keyring do where
/// a black-box comparison found it did not (issue #44): an object that does not exist is
/// `org.freedesktop.Secret.Error.NoSuchObject` whatever its kind, introspection lists each child
/// once, one process cannot shut every other out, and the size limits are refused by name.
@Suite(.enabled(if: PrivateSessionBus.available, "needs dbus-daemon, gdbus and Debian's python3 with python3-secretstorage (contrib/deps.sh)"))
struct SecretServiceConformanceTests {
    @Test func everyPathThatDoesNotExistIsNoSuchObject() throws {
        let (apps, agent, bus, frontEnd, _) = try SecretServiceBusTests.setUp()
        defer { withExtendedLifetime((apps, agent)) {} }
        agent.setPasscode()
        let r = try bus.python(SecretServiceBusTests.prelude + #"""
            NSO = ('error', 'org.freedesktop.Secret.Error.NoSuchObject')
            ITEM, COLL, PROMPT, SESSION = 'org.freedesktop.Secret.Item', 'org.freedesktop.Secret.Collection', 'org.freedesktop.Secret.Prompt', 'org.freedesktop.Secret.Session'
            PROPS = 'org.freedesktop.DBus.Properties'
            session = open_plain(a)[1][1]
            cases = {
                'item, well formed': call(a, PATH + '/collection/login/' + '0' * 32, ITEM, 'GetSecret', 'o', session),
                'item, malformed id': call(a, PATH + '/collection/login/nothing', ITEM, 'Delete'),
                'item, too deep': call(a, PATH + '/collection/login/' + '0' * 32 + '/x', ITEM, 'Delete'),
                'item under an alias': call(a, PATH + '/aliases/default/' + '0' * 32, ITEM, 'Delete'),
                'item property': call(a, PATH + '/collection/login/' + '0' * 32, PROPS, 'Get', 'ss', ITEM, 'Label'),
                'item by reference': call(a, PATH + '/item/nothing', ITEM, 'Delete'),
                'collection': call(a, PATH + '/collection/nothing', COLL, 'SearchItems', 'a{ss}', {}),
                'collection property': call(a, PATH + '/collection/nothing', PROPS, 'Get', 'ss', COLL, 'Label'),
                'alias': call(a, PATH + '/aliases/nothing', COLL, 'Delete'),
                'prompt': call(a, PATH + '/prompt/nothing', PROMPT, 'Prompt', 's', ''),
                'prompt dismissed': call(a, PATH + '/prompt/nothing', PROMPT, 'Dismiss'),
                'session never opened': call(a, PATH + '/session/nothing', SESSION, 'Close'),
                # Outside the service's namespace, and its bare nodes (python-secretstorage 3.3 reads only
                # NoSuchObject as "no such item", not sd-bus's UnknownObject).
                'item property outside the namespace': call(a, '/not/existing/path', PROPS, 'Get', 'ss', ITEM, 'Label'),
                'item at /': call(a, '/', ITEM, 'Delete'),
                'collection outside the namespace': call(a, PATH + '/nothing', COLL, 'Delete'),
                'the bare item node': call(a, PATH + '/item', ITEM, 'Delete'),
                'the bare session node': call(a, PATH + '/session', SESSION, 'Close'),
                'the bare prompt node': call(a, PATH + '/prompt', PROMPT, 'Dismiss'),
                'item interface on the service': call(a, PATH, ITEM, 'Delete'),
            }
            assert close(a, session)[0] == 'ok'
            cases['session closed'] = close(a, session)
            # Another sender's session exists, but not for this caller.
            other = open_plain(b)[1][1]
            cases["another sender's session"] = close(a, other)
            wrong = {k: v for k, v in cases.items() if v != NSO}
            assert not wrong, wrong
            assert close(b, other)[0] == 'ok', 'the owner still closes its session'
            # The service object and the standard interfaces still answer.
            assert call(a, PATH, PROPS, 'Get', 'ss', 'org.freedesktop.Secret.Service', 'Collections')[0] == 'ok'
            # python-secretstorage's own check (its test_non_existing_item): no such item, by its exception.
            try:
                secretstorage.Item(a, '/not/existing/path')
                raise AssertionError('an item at /not/existing/path')
            except secretstorage.exceptions.ItemNotFoundException:
                pass
            print('done')
            """#)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(bus.read("front-end.log"))")
        #expect(frontEnd.isRunning)
    }

    /// python-secretstorage's own test suite (its tests/, from Debian's source of the installed version,
    /// contrib/secretstorage-suite.sh) with the installed module against the front end, as it runs against
    /// gnome-keyring: every test that runs passes, and the ones it skips on the real service
    /// (org.freedesktop.secrets: the mock-service tests) are the only ones skipped. Cancelled with the
    /// script's reason where Debian's source archive cannot be reached.
    @Test(.timeLimit(.minutes(5))) func pythonSecretStoragesOwnSuitePasses() throws {
        let (apps, agent, bus, frontEnd, _) = try SecretServiceBusTests.setUp()
        defer { withExtendedLifetime((apps, agent)) {} }
        agent.setPasscode()
        let r = runProcess("/bin/bash", [Binaries.packageRoot + "/contrib/secretstorage-suite.sh"],
                           environment: ["DBUS_SESSION_BUS_ADDRESS": bus.address, "DISPLAY": ":0"], unset: ["WAYLAND_DISPLAY"], timeout: 240)
        if r.status == 77 {
            try Test.cancel("python-secretstorage's suite cannot run here: \(r.stderr.trimmingCharacters(in: .whitespacesAndNewlines).suffix(400))")
        }
        let summary = r.stderr.split(separator: "\n").map(String.init)
        let ran = summary.compactMap { line -> Int? in
            guard line.hasPrefix("Ran "), let n = Int(line.split(separator: " ")[1]) else { return nil }
            return n
        }.first ?? 0
        #expect(r.status == 0 && summary.contains { $0.hasPrefix("OK") }, "the suite failed:\n\(r.stderr.suffix(6000))\n\(bus.read("front-end.log").suffix(2000))")
        // 26 tests in 3.3.3: 20 run and pass, 6 are skipped on the real service, as on gnome-keyring.
        #expect(ran >= 26, "only \(ran) tests ran:\n\(r.stderr.suffix(3000))")
        let skipped = r.stderr.split(separator: "\n").filter { $0.hasSuffix("skipped") || $0.contains(" ... skipped ") }.count
        #expect(skipped == 6, "\(skipped) skipped (6 on gnome-keyring):\n\(r.stderr.suffix(3000))")
        #expect(frontEnd.isRunning)
    }

    @Test func introspectionListsEachChildOnce() throws {
        let (apps, agent, bus, _, _) = try SecretServiceBusTests.setUp()
        defer { withExtendedLifetime((apps, agent)) {} }
        agent.setPasscode()
        let r = try bus.python(SecretServiceBusTests.prelude + #"""
            re = __import__('re')
            c = secretstorage.get_default_collection(a)
            for n in range(3):
                c.create_item('item %d' % n, {'n': str(n)}, b'secret')
            s = secretstorage.Collection(a, PATH + '/collection/session')
            s.create_item('in the session', {'n': 's'}, b'secret')
            children = {}
            for path in (PATH, PATH + '/collection', PATH + '/collection/login', PATH + '/collection/session', PATH + '/aliases',
                         PATH + '/aliases/default', PATH + '/session', PATH + '/item', PATH + '/prompt'):
                text = introspect(path)
                nodes = [n for n in re.findall(r'node (\S+) \{', text) if not n.startswith('/')]
                # Each child once, and only children: a grandchild is its child's to list.
                assert len(nodes) == len(set(nodes)) and not any('/' in n for n in nodes), (path, nodes)
                children[path] = set(nodes)
            assert {'collection', 'aliases', 'prompt', 'session', 'item'} <= children[PATH], children[PATH]
            assert children[PATH + '/collection'] == {'login', 'session'}, children[PATH + '/collection']
            assert len(children[PATH + '/collection/login']) == 3 and len(children[PATH + '/collection/session']) == 1, children
            print('done')
            """#)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(bus.read("front-end.log"))")
    }
    /// A secret, an attribute value or an attribute count over the limits is refused with
    /// `org.freedesktop.DBus.Error.InvalidArgs` naming the limit; the caller's next call is served
    /// (a 1 MB value used to drop the front end's agent connection: the client saw an I/O error), and
    /// the limits themselves round-trip: a 1 MiB secret, 128 attributes with 255-byte names.
    @Test func valuesOverTheLimitsAreRefusedByNameAndTheCallerIsServedOn() throws {
        let (apps, agent, bus, frontEnd, _) = try SecretServiceBusTests.setUp(arguments: [], agentConfig: [])
        defer { withExtendedLifetime((apps, agent)) {} }
        agent.setPasscode()
        let r = try bus.python(SecretServiceBusTests.prelude + #"""
            exceptions = __import__('secretstorage.exceptions', fromlist=['x'])
            c = secretstorage.get_default_collection(a)
            def refused(label, attributes, secret):
                try:
                    c.create_item(label, attributes, secret)
                except Exception as e:
                    return str(e)
                return None
            big = refused('big', {'k': 'v'}, b'x' * 1048577)
            assert big is not None and 'InvalidArgs' in big and '1048576' in big, big
            many = refused('many', {'a%d' % i: 'v' for i in range(129)}, b's')
            assert many is not None and 'InvalidArgs' in many and '128' in many, many
            long_name = refused('long name', {'n' * 256: 'v'}, b's')
            assert long_name is not None and 'InvalidArgs' in long_name and '255' in long_name, long_name
            long_value = refused('long', {'k': 'v' * 70000}, b's')
            assert long_value is not None and 'InvalidArgs' in long_value, long_value
            # The caller is served on, at the limits' edge too: a 1 MiB secret, 128 attributes whose
            # names are 255 bytes (what people store: kubeconfigs, PEM chains, many-field records).
            item = c.create_item('fits', {'k': 'v'}, b'y' * 1048576)
            assert item.get_secret() == b'y' * 1048576
            wide = {('%03d' % i) + 'n' * 252: 'v%d' % i for i in range(128)}
            item = c.create_item('wide', wide, b'w')
            assert item.get_attributes() == wide, sorted(item.get_attributes())[:3]
            found = list(c.search_items({('%03d' % 7) + 'n' * 252: 'v7'}))
            assert len(found) == 1 and found[0].get_secret() == b'w', found
            print('done')
            """#)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(bus.read("front-end.log"))")
        #expect(frontEnd.isRunning)
    }

    /// What a second process sees while the first holds every connection it may: served.
    static let secondProcess = #"""
        r = subprocess.run([sys.executable, '-c', "secretstorage = __import__('secretstorage')\n"
            "from secretstorage.util import open_session\n"
            "c = secretstorage.dbus_init()\n"
            "open_session(c)\n"
            "print('second served')\n"], capture_output=True, text=True, timeout=60)
        assert 'second served' in r.stdout, r.stdout + r.stderr
        """#

    /// A script that opens bus connections in a loop and never closes them (140, as the review's)
    /// is refused at its own limit, and another process is still served; so are the senders the
    /// flooding process already holds.
    @Test func aProcessOpeningConnectionsInALoopShutsOutOnlyItself() throws {
        let (apps, agent, bus, frontEnd, _) = try SecretServiceBusTests.setUp()
        defer { withExtendedLifetime((apps, agent)) {} }
        let r = try bus.python(SecretServiceBusTests.prelude + #"""
            flood = [secretstorage.dbus_init() for _ in range(140)]
            answers = [open_plain(c) for c in flood]
            served = [x for x in answers if x[0] == 'ok']
            refused = [x for x in answers if x[0] != 'ok']
            assert len(served) == 32, (len(served), answers[:3], answers[-3:])
            assert set(refused) == {('error', 'org.freedesktop.DBus.Error.LimitsExceeded')}, set(refused)
            assert open_plain(flood[0])[0] == 'ok', 'a sender already held is still served'
            """# + "\n" + Self.secondProcess + "\nprint('done')\n")
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(bus.read("front-end.log"))")
        #expect(frontEnd.isRunning)
    }

    /// The agent counts a front end's delegated connection against the process it acts for: with
    /// an allowance of 4 connections per process, a process flooding the front end is refused past its
    /// fourth sender, and another process is still served (before, all of them counted against the
    /// front end, and the fifth sender of any process was refused).
    @Test func theAgentCountsDelegatedConnectionsAgainstTheProcessServed() throws {
        let (apps, agent, bus, frontEnd, _) = try SecretServiceBusTests.setUp(agentConfig: ["max-connections-per-process = 4"])
        defer { withExtendedLifetime((apps, agent)) {} }
        let r = try bus.python(SecretServiceBusTests.prelude + #"""
            flood = [secretstorage.dbus_init() for _ in range(8)]
            answers = [open_plain(c)[0] for c in flood]
            assert answers == ['ok'] * 4 + ['error'] * 4, answers
            """# + "\n" + Self.secondProcess + "\nprint('done')\n")
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(bus.read("front-end.log"))\n\(agent.log)")
        #expect(frontEnd.isRunning)
    }
}

/// After an unlock, the items a sender was shown locked are announced readable (issue #44): a client
/// that keeps each item proxy's properties (libsecret, seahorse) would otherwise show them blank until
/// it reconnected.
@Suite(.enabled(if: PrivateSessionBus.available && PrivateSessionBus.clientsAvailable,
                "needs dbus-daemon, gdbus, python3-secretstorage, libsecret-tools, gir1.2-secret-1, python3-gi and python3-keyring (contrib/deps.sh)"))
struct SecretServiceUnlockAnnouncementTests {
    @Test func itemsShownLockedAreAnnouncedWithTheirValuesAtTheUnlock() throws {
        let f = try SecretServicePromptTests.Locked(passcode: AgentProcess.password)
        let r = try f.bus.python(SecretServicePromptTests.prelude + SecretServiceItemTests.signals + #"""
            SVC, ITEM, PROPS = 'org.freedesktop.Secret.Service', 'org.freedesktop.Secret.Item', 'org.freedesktop.DBus.Properties'
            found = call(a, PATH, SVC, 'SearchItems', 'a{ss}', {'server': 'mail.example.com'})
            assert found[0] == 'ok' and found[1][0] == [] and len(found[1][1]) == 1, found
            ref = found[1][1][0]
            every = call(a, ref, PROPS, 'GetAll', 's', ITEM)
            assert every[1][0]['Label'] == ('s', '') and every[1][0]['Locked'] == ('b', True), every
            q = watch(a, interface=PROPS, member='PropertiesChanged', path=ref)
            assert run_prompt(a, unlock(a)) == (False, [LOGIN]), 'not unlocked'
            member, path, body = next_signal(a, q)
            assert path == ref and body[0] == ITEM, (member, path, body)
            changed = body[1]
            assert changed['Locked'] == ('b', False), changed
            assert changed['Label'] == ('s', 'Mail'), changed
            assert changed['Attributes'][1]['server'] == 'mail.example.com', changed
            print('done')
            """#)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(f.bus.read("front-end.log"))\n\(f.agent.log)")
    }
}
