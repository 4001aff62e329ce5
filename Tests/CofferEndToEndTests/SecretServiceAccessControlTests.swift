import CofferClient
import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Items with an access control through the Secret Service (SecretServiceMapping.md, Locked, Lock
/// and Unlock): such an item is Locked; *Unlock* of it gives a *Prompt*, and the prompt's own
/// delegated agent connection reads it with PROMPT_READ, the agent's prompter answering the item's
/// control (its pinentry, here PinentryHarness's scripted one; the biometric emulator through the
/// plugin host). Real agent, real bus, secret-tool and secretstorage.
@Suite(.serialized, .enabled(if: PrivateSessionBus.available && PrivateSessionBus.clientsAvailable && biometryPluginsBuilt,
                             "needs dbus-daemon, the Secret Service clients (contrib/deps.sh) and the built plugins"))
struct SecretServiceAccessControlTests {
    static let itemID = "00112233445566778899aabbccddeeff"
    static let itemPath = "/org/freedesktop/secrets/collection/login/" + itemID
    /// Where the agent's dialogs appear (`prompt-display`; no logind session here): the scripted
    /// pinentry only notes it.
    static let promptDisplay = ":5"

    /// A front end whose agent has the biometric emulator (alice enrolled) and, with `pinentry`, the
    /// scripted pinentry answering GETPIN with `pin` and CONFIRM with `confirm`; a passcode set, and
    /// one Secret Service item made natively with the access control `rule` (an application-password
    /// rule's password: `appPassword`).
    final class Guarded: @unchecked Sendable {
        let dir = PinentryHarness.ShortDirectory()
        let plugins = TemporaryDirectory("coffer-ssac-plugins")
        let fake: PinentryHarness.FakePinentry
        let apps: SignedApps
        let agent: AgentProcess
        let bus: PrivateSessionBus
        let frontEnd: Process

        init(rule: String, pinentry: Bool = true, pin: String = AgentProcess.password, confirm: String = "hang",
             appPassword: String? = nil, accessible: String? = nil) throws {
            fake = try PinentryHarness.FakePinentry(in: dir, pin: pin, passcode: pin, confirm: confirm)
            (apps, agent, bus, frontEnd, _) = try SecretServiceBusTests.setUp(
                agentConfig: BiometryTests.pluginConfig(in: plugins) + ["authentication-timeout = 60"]
                    + (pinentry ? ["pinentry = \(fake.path)", "prompt-display = \(SecretServiceAccessControlTests.promptDisplay)"] : []))
            agent.setPasscode()
            let enroll = BiometryTests.withPasscode(agent, ["bio", "enroll", "alice"])
            #expect(enroll.status == 0, "\(enroll)")
            let item = ["add", "--service", "org.freedesktop.secrets", "--account", SecretServiceAccessControlTests.itemID,
                        "--label", "Guarded", "--attr", "coffer:collection=login", "--attr", "kind=guarded", "--access-control", rule]
                + (accessible.map { ["--accessible", $0] } ?? [])
            let add: CLIResult
            if let appPassword {
                // The secret on descriptor 3, the application password on stdin.
                let secretFile = agent.dir.file("secret-input")
                try "guarded secret".write(toFile: secretFile, atomically: true, encoding: .utf8)
                add = AccessControlCLITests.detached(agent, item + ["--secret-fd", "3", "--app-password-fd", "0"], stdin: appPassword,
                                                     extraShell: "3<'\(secretFile)'")
            } else {
                add = agent.cli(item + ["--secret-stdin"], stdin: "guarded secret")
            }
            #expect(add.status == 0, "\(add)")
            _ = fake.takeQuestions()
        }

        func lookup() -> CLIResult { bus.run("/usr/bin/secret-tool", ["lookup", "kind", "guarded"]) }

        /// The item is still there, unchanged, for its (unsigned) identity.
        func itemIsUnchanged() -> Bool {
            let found = agent.cli(["find", "--json", "--attr", "kind=guarded"])
            return found.status == 0 && found.stdout.contains("Guarded")
        }

        var log: String { bus.read("front-end.log") + "\n" + agent.log }
    }

    @Test func aPasscodeItemIsReadThroughThePromptAndTheScriptedPinentry() throws {
        let f = try Guarded(rule: "device-passcode")
        let r = f.lookup()
        #expect(r.status == 0 && r.stdout == "guarded secret", "\(r)\n\(f.log)")
        // The person was asked once, by the agent's pinentry; the next read asks again.
        #expect(f.fake.takeQuestions().filter { $0.hasPrefix("GETPIN") }.count == 1)
        #expect(f.lookup().stdout == "guarded secret")
        #expect(f.fake.takeQuestions().filter { $0.hasPrefix("GETPIN") }.count == 1)
        // Without the prompt the secret is locked: GetSecret answers IsLocked.
        let direct = try f.bus.python(SecretServiceBusTests.prelude + """
            s = open_plain(a)[1][1]
            assert call(a, '\(Self.itemPath)', 'org.freedesktop.Secret.Item', 'GetSecret', 'o', s) \\
                == ('error', 'org.freedesktop.Secret.Error.IsLocked')
            print('done')

            """)
        #expect(direct.status == 0 && direct.stdout.contains("done"), "\(direct)")
        // Unlock of the item while the keybag is locked: one prompt asks the passcode to unlock the
        // keybag, then the item's, and the secret is read.
        #expect(f.agent.cli(["lock"]).status == 0)
        let locked = try f.bus.python(SecretServiceBusTests.prelude + """
            from secretstorage.util import exec_prompt
            item = '\(Self.itemPath)'
            unlocked = call(a, PATH, 'org.freedesktop.Secret.Service', 'Unlock', 'ao', [item])
            assert unlocked[0] == 'ok' and unlocked[1][0] == [] and unlocked[1][1] != '/', unlocked
            assert exec_prompt(a, unlocked[1][1]) == (False, ('ao', [item]))
            got = call(a, item, 'org.freedesktop.Secret.Item', 'GetSecret', 'o', open_plain(a)[1][1])
            assert got[0] == 'ok' and got[1][0][2] == b'guarded secret', got
            print('done')

            """)
        #expect(locked.status == 0 && locked.stdout.contains("done"), "\(locked)\n\(f.log)")
        #expect(f.fake.takeQuestions().filter { $0.hasPrefix("GETPIN") }.count == 2)
    }

    /// CreateItem with `io.coffer.Item.AccessControl`: the item is made without asking anyone, has the
    /// control (its property, the keychain's `accc`, a ThisDeviceOnly class), is Locked, and its
    /// secret is read only through the prompt; a control with a class that leaves the device, with sync,
    /// or different from a replaced item's, is refused and changes nothing.
    @Test func anItemMadeWithAControlThroughCreateItemIsReadThroughThePrompt() throws {
        let f = try Guarded(rule: "device-passcode")
        let r = try f.bus.python(SecretServiceBusTests.prelude + """
            from secretstorage.util import exec_prompt
            COLL, ITEM, PROPS = 'org.freedesktop.Secret.Collection', 'org.freedesktop.Secret.Item', 'org.freedesktop.DBus.Properties'
            LOGIN = '/org/freedesktop/secrets/collection/login'
            def create(props, replace=False, secret=b'made guarded'):
                return call(a, LOGIN, COLL, 'CreateItem', 'a{sv}(oayays)b',
                            dict({'org.freedesktop.Secret.Item.Label': ('s', 'Made guarded'),
                                  'org.freedesktop.Secret.Item.Attributes': ('a{ss}', {'kind': 'made'})}, **props),
                            (open_plain(a)[1][1], b'', secret, 'text/plain'), replace)
            control = {'io.coffer.Item.AccessControl': ('s', 'device-passcode,or,biometry-any')}
            # Refused, nothing made: a class that leaves the device, or sync, with a control.
            assert create(dict(control, **{'io.coffer.Item.Accessible': ('s', 'ak')})) == ('error', 'org.freedesktop.DBus.Error.InvalidArgs')
            assert create(dict(control, **{'io.coffer.Item.Synchronizable': ('b', True)})) == ('error', 'org.freedesktop.DBus.Error.InvalidArgs')
            assert call(a, LOGIN, COLL, 'SearchItems', 'a{ss}', {'kind': 'made'}) == ('ok', ([],)), 'a refused CreateItem made something'
            made = create({'io.coffer.Item.AccessControl': ('s', 'device-passcode')})
            assert made[0] == 'ok' and made[1][1] == '/', made
            item = made[1][0]
            assert call(a, item, PROPS, 'Get', 'ss', 'io.coffer.Item', 'AccessControl') == ('ok', (('s', 'device-passcode'),))
            assert call(a, item, PROPS, 'Get', 'ss', ITEM, 'Locked') == ('ok', (('b', True),))
            assert call(a, item, ITEM, 'GetSecret', 'o', open_plain(a)[1][1]) == ('error', 'org.freedesktop.Secret.Error.IsLocked')
            # Replacing it with another control, or with none asked for but a different one kept: refused.
            assert create({'io.coffer.Item.AccessControl': ('s', 'user-presence')}, replace=True, secret=b'x') \
                == ('error', 'org.freedesktop.DBus.Error.NotSupported')
            print('item=' + item)
            # Read through the prompt: the agent's pinentry asks the passcode.
            unlocked = call(a, PATH, 'org.freedesktop.Secret.Service', 'Unlock', 'ao', [item])
            assert unlocked[0] == 'ok' and unlocked[1][0] == [] and unlocked[1][1] != '/', unlocked
            assert exec_prompt(a, unlocked[1][1]) == (False, ('ao', [item]))
            got = call(a, item, ITEM, 'GetSecret', 'o', open_plain(a)[1][1])
            assert got[0] == 'ok' and got[1][0][2] == b'made guarded', got
            print('done')

            """)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(f.log)")
        // Made without asking anyone; read with one question.
        let questions = f.fake.takeQuestions()
        #expect(questions.filter { $0.hasPrefix("GETPIN") }.count == 1, "\(questions)")
        // The keychain holds the control and a ThisDeviceOnly class; the item does not sync.
        let shown = f.agent.cli(["find", "--json", "--attr", "kind=made"])
        #expect(shown.status == 0 && shown.stdout.contains(#""accc":"hex:"#) && shown.stdout.contains(#""pdmn":"aku""#)
                && shown.stdout.contains(#""sync":false"#), "\(shown)")
        // The secret is the first one: the refused replace changed nothing.
        let read = f.bus.run("/usr/bin/secret-tool", ["lookup", "kind", "made"])
        #expect(read.status == 0 && read.stdout == "made guarded", "\(read)\n\(f.log)")
    }

    /// An application-password item: the agent's pinentry asks the item's password (never the
    /// passcode); a wrong one reads nothing.
    @Test func anApplicationPasswordItemIsReadThroughTheScriptedPinentry() throws {
        let f = try Guarded(rule: "application-password", pin: "open sesame", appPassword: "open sesame")
        let r = f.lookup()
        #expect(r.status == 0 && r.stdout == "guarded secret", "\(r)\n\(f.log)")
        #expect(f.fake.takeQuestions().filter { $0.hasPrefix("GETPIN") }.count == 1)
        try f.fake.set(pin: "open sesam")
        let wrong = f.lookup()
        #expect(wrong.stdout.isEmpty, "\(wrong)")
        #expect(f.itemIsUnchanged())
    }

    @Test func aBiometryItemIsReadWhenTheEmulatorMatches() throws {
        let f = try Guarded(rule: "biometry-any")
        let pending = BiometryTests.Background { f.lookup() }
        // The finger comes once the dialog is up (a match before it would need no dialog at all).
        #expect(f.fake.waitForQuestion("CONFIRM", within: 90), "no dialog while the sensor ran: \(f.log)")
        #expect(BiometryTests.touch(f.agent, ["alice"], within: 90), "no evaluation waited for a finger: \(f.log)")
        let r = pending.wait()
        #expect(r.status == 0 && r.stdout == "guarded secret", "\(r)\n\(f.log)")
        // The pinentry showed the agent's one-button dialog while the sensor ran.
        #expect(f.fake.takeQuestions().contains { $0.hasPrefix("CONFIRM") })
    }

    @Test func aBiometryItemStaysLockedWhenThePersonCancels() throws {
        let f = try Guarded(rule: "biometry-any", confirm: "cancel")
        let r = f.lookup()
        #expect(r.stdout.isEmpty, "\(r)")
        #expect(f.fake.takeQuestions().contains { $0.hasPrefix("CONFIRM") })
        #expect(f.itemIsUnchanged())
    }

    /// Dismiss while the agent's dialog is open: Completed(true), the pinentry goes, the secret stays
    /// locked and nothing changed.
    @Test func dismissingABiometryPromptReadsNothing() throws {
        let f = try Guarded(rule: "biometry-any")
        let r = try f.bus.python(SecretServiceBusTests.prelude + SecretServicePromptTests.pinentryWaits(f.dir.file("hung.pid")) + """
            from jeepney.bus_messages import MatchRule
            PROMPT, ITEM = 'org.freedesktop.Secret.Prompt', 'org.freedesktop.Secret.Item'
            s = open_plain(a)[1][1]
            unlocked = call(a, PATH, 'org.freedesktop.Secret.Service', 'Unlock', 'ao', ['\(Self.itemPath)'])
            assert unlocked[0] == 'ok' and unlocked[1][0] == [] and unlocked[1][1] != '/', unlocked
            prompt = unlocked[1][1]
            rule = MatchRule(path=prompt, interface=PROMPT, member='Completed', type=MessageType.signal)
            with a.filter(rule) as signals:
                assert call(a, prompt, PROMPT, 'Prompt', 's', '') == ('ok', ())
                wait_asked()
                assert call(a, prompt, PROMPT, 'Dismiss') == ('ok', ())
                assert a.recv_until_filtered(signals, timeout=30).body == (True, ('ao', []))
            wait_gone()
            assert call(a, '\(Self.itemPath)', ITEM, 'GetSecret', 'o', s) == ('error', 'org.freedesktop.Secret.Error.IsLocked')
            print('done')

            """)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(f.log)")
        #expect(f.itemIsUnchanged())
    }

    /// No pinentry: nobody can see a prompt, so the item's prompt completes dismissed at once and the
    /// sensor is never started.
    @Test func withoutAPinentryTheItemsPromptCompletesDismissedAtOnce() throws {
        let f = try Guarded(rule: "biometry-any", pinentry: false)
        let r = try f.bus.python(SecretServiceBusTests.prelude + """
            from secretstorage.util import exec_prompt
            unlocked = call(a, PATH, 'org.freedesktop.Secret.Service', 'Unlock', 'ao', ['\(Self.itemPath)'])
            assert unlocked[0] == 'ok' and unlocked[1][1] != '/', unlocked
            dismissed, result = exec_prompt(a, unlocked[1][1])
            assert dismissed is True and result == ('ao', []), (dismissed, result)
            print('done')

            """)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(f.log)")
        #expect(f.agent.cli(["bio", "present", "alice"]).status != 0, "an evaluation waited for a finger")
        #expect(f.lookup().stdout.isEmpty)
        #expect(f.fake.takeQuestions().isEmpty)
    }

    /// Whether a dialog can appear is the agent's to decide, from the person's session, never from the
    /// client's environment (issue #43: Chromium rewrites its own, and a lost prompt lost a cookie): a
    /// client without a display in its environment is asked like one with a display, by the agent's
    /// pinentry on the session's display (here the configured `prompt-display`), never on the one the
    /// client's environment names (issue #41, F1).
    @Test func aCallerWithoutADisplayIsAskedOnTheSessionsDisplay() throws {
        let f = try Guarded(rule: "device-passcode")
        let script = SecretServiceBusTests.prelude + """
            from secretstorage.util import exec_prompt
            unlocked = call(a, PATH, 'org.freedesktop.Secret.Service', 'Unlock', 'ao', ['\(Self.itemPath)'])
            assert unlocked[0] == 'ok' and unlocked[1][1] != '/', unlocked
            print(exec_prompt(a, unlocked[1][1]))

            """
        for display in [nil, ":42"] {
            let shown = try f.bus.python(script, display: display)
            #expect(shown.status == 0 && shown.stdout.contains("(False, ('ao', ['\(Self.itemPath)']))"), "\(String(describing: display)): \(shown)\n\(f.log)")
            #expect(f.fake.takeQuestions().filter { $0.hasPrefix("GETPIN") }.count == 1)
            #expect(!f.fake.displays().isEmpty && f.fake.displays().allSatisfy { $0 == Self.promptDisplay }, "\(f.fake.displays())")
        }
    }

    /// What a prompt granted the client's process ends when the keychain locks: the item reads as
    /// locked again and GetSecret hands out nothing (the grant's 60 s are not waited out).
    @Test func aLockEndsWhatAPromptReleased() throws {
        // AfterFirstUnlock: its class stays open after the lock, so only the lock check can end the release.
        let f = try Guarded(rule: "device-passcode", accessible: "after-first-unlock-this-device-only")
        let r = try f.bus.python(SecretServiceBusTests.prelude + """
            from secretstorage.util import exec_prompt
            unlocked = call(a, PATH, 'org.freedesktop.Secret.Service', 'Unlock', 'ao', ['\(Self.itemPath)'])
            assert unlocked[0] == 'ok' and unlocked[1][1] != '/', unlocked
            print('prompt', exec_prompt(a, unlocked[1][1]))
            locked = subprocess.run(['\(Binaries.coffer)', 'lock', '--socket', '\(f.agent.socketPath)'], capture_output=True, text=True)
            print('lock', locked.returncode, locked.stderr)
            session = open_plain(a)[1][1]
            print('get', call(a, '\(Self.itemPath)', 'org.freedesktop.Secret.Item', 'GetSecret', 'o', session))
            print('locked', call(a, '\(Self.itemPath)', 'org.freedesktop.DBus.Properties', 'Get', 'ss', 'org.freedesktop.Secret.Item', 'Locked'))

            """)
        #expect(r.status == 0 && r.stdout.contains("prompt (False"), "\(r)\n\(f.log)")
        #expect(r.stdout.contains("lock 0 "), "\(r)")
        #expect(r.stdout.contains("get ('error', 'org.freedesktop.Secret.Error.IsLocked')"), "the released secret outlived the lock: \(r)")
        #expect(r.stdout.contains("locked ('ok', (('b', True),))"), "\(r)")
        #expect(!r.stdout.contains("guarded secret"))
    }

    /// Issue #42: a prompt's read is the agent's grant to the client's process, not a secret the front
    /// end keeps. The process reads the item (twice: the grant lasts its window) and sees it unlocked;
    /// another process of the same program in the same session, started after it, is refused
    /// (IsLocked, Locked true) and nobody is asked for it.
    @Test func aPromptsGrantIsTheClientProcesssAlone() throws {
        let f = try Guarded(rule: "device-passcode")
        let item = Self.itemPath
        let first = try f.bus.python(SecretServiceBusTests.prelude + """
            from secretstorage.util import exec_prompt
            before = call(a, '\(item)', 'org.freedesktop.DBus.Properties', 'Get', 'ss', 'org.freedesktop.Secret.Item', 'Locked')
            assert before == ('ok', (('b', True),)), before
            unlocked = call(a, PATH, 'org.freedesktop.Secret.Service', 'Unlock', 'ao', ['\(item)'])
            assert unlocked[0] == 'ok' and unlocked[1][1] != '/', unlocked
            assert exec_prompt(a, unlocked[1][1]) == (False, ('ao', ['\(item)']))
            after = call(a, '\(item)', 'org.freedesktop.DBus.Properties', 'Get', 'ss', 'org.freedesktop.Secret.Item', 'Locked')
            assert after == ('ok', (('b', False),)), after
            for n in range(2):
                got = call(a, '\(item)', 'org.freedesktop.Secret.Item', 'GetSecret', 'o', open_plain(a)[1][1])
                assert got[0] == 'ok' and got[1][0][2] == b'guarded secret', got
            print('done')

            """)
        #expect(first.status == 0 && first.stdout.contains("done"), "\(first)\n\(f.log)")
        #expect(f.fake.takeQuestions().filter { $0.hasPrefix("GETPIN") }.count == 1, "the person is asked once for the grant")
        let second = try f.bus.python(SecretServiceBusTests.prelude + """
            locked = call(a, '\(item)', 'org.freedesktop.DBus.Properties', 'Get', 'ss', 'org.freedesktop.Secret.Item', 'Locked')
            assert locked == ('ok', (('b', True),)), locked
            got = call(a, '\(item)', 'org.freedesktop.Secret.Item', 'GetSecret', 'o', open_plain(a)[1][1])
            assert got == ('error', 'org.freedesktop.Secret.Error.IsLocked'), got
            print('done')

            """)
        #expect(second.status == 0 && second.stdout.contains("done"), "another process was served the first one's grant: \(second)\n\(f.log)")
        #expect(f.fake.takeQuestions().filter { $0.hasPrefix("GETPIN") }.isEmpty)
    }

    /// An item a search found needing the person reads Locked from the agent, not from the search's
    /// record (which the front end keeps for properties): after the prompt's grant it is unlocked.
    @Test func theLockedPropertyOfASearchedItemFollowsAPromptsGrant() throws {
        let f = try Guarded(rule: "device-passcode")
        let item = Self.itemPath
        let r = try f.bus.python(SecretServiceBusTests.prelude + """
            from secretstorage.util import exec_prompt
            PROPS, ITEM = 'org.freedesktop.DBus.Properties', 'org.freedesktop.Secret.Item'
            found = call(a, PATH, 'org.freedesktop.Secret.Service', 'SearchItems', 'a{ss}', {'kind': 'guarded'})
            assert found == ('ok', ([], ['\(item)'])), found
            before = call(a, '\(item)', PROPS, 'GetAll', 's', ITEM)
            assert before[0] == 'ok' and before[1][0]['Locked'] == ('b', True), before
            unlocked = call(a, PATH, 'org.freedesktop.Secret.Service', 'Unlock', 'ao', ['\(item)'])
            assert unlocked[0] == 'ok' and unlocked[1][1] != '/', unlocked
            assert exec_prompt(a, unlocked[1][1]) == (False, ('ao', ['\(item)']))
            after = call(a, '\(item)', PROPS, 'Get', 'ss', ITEM, 'Locked')
            assert after == ('ok', (('b', False),)), after
            print('done')

            """)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(f.log)")
    }

    /// Issue #42: what a `secret-tool lookup` costs, from the agent's own counters (COUNTERS): requests,
    /// connections, identity resolutions and keychain searches, for a plain item and for one with an
    /// access control (the prompt, the person's passcode, the granted read), against the issue's
    /// targets: a protected lookup in at most 5 round trips, 1 identity resolution and 3 searches; a
    /// plain one in at most 3 round trips.
    ///
    /// Round trips are requests less those a connection's opening pipelines: the front end writes
    /// HELLO, DELEGATE and WHOAMI at once and reads their replies together (one round trip for three
    /// requests), and a prompt's connection HELLO and DELEGATE (one for two). The requests themselves
    /// are bounded too, so a request added anywhere fails here.
    @Test func whatALookupCostsIsCountedByTheAgent() throws {
        let f = try Guarded(rule: "device-passcode")
        let stored = f.bus.run("/usr/bin/secret-tool", ["store", "--label", "Plain", "kind", "plain"], stdin: "plain secret")
        #expect(stored.status == 0, "\(stored)")
        let meter = try AgentMeter(f.agent)
        let cost = meter.cost
        // The client's connection pipelines two requests behind its HELLO, each prompt's one.
        func roundTrips(_ c: AgentCounters) -> UInt64 { c.requests - (c.connections > 0 ? 2 + (c.connections - 1) : 0) }
        // The cheapest of three plain lookups: on a loaded machine the agent's change event of the
        // store above can reach the front end after the meter saw the agent quiet, and the front end
        // then (rightly) looks again at what changed inside a measured lookup. A cost that every
        // lookup pays still shows in all three.
        var (plain, p) = try cost { f.bus.run("/usr/bin/secret-tool", ["lookup", "kind", "plain"]) }
        for _ in 0..<2 {
            let (again, a) = try cost { f.bus.run("/usr/bin/secret-tool", ["lookup", "kind", "plain"]) }
            if a.requests < p.requests || a.searches < p.searches { (plain, p) = (again, a) }
        }
        #expect(plain.status == 0 && plain.stdout == "plain secret", "\(plain)")
        let (guarded, g) = try cost { f.lookup() }
        #expect(guarded.status == 0 && guarded.stdout == "guarded secret", "\(guarded)\n\(f.log)")
        print("secret-tool lookup, plain: \(roundTrips(p)) round trips (\(p.requests) requests), \(p.connections) connections, "
              + "\(p.identifications) identity resolutions, \(p.searches) searches")
        print("secret-tool lookup, protected: \(roundTrips(g)) round trips (\(g.requests) requests), \(g.connections) connections, "
              + "\(g.identifications) identity resolutions, \(g.searches) searches")
        // A plain lookup: the client's connection (HELLO, DELEGATE, WHOAMI: secret-tool identified, the
        // front end known already), the search, the read (by the reference the search found: no second
        // search). The collections were listed for an earlier client and nothing changed them since:
        // no listing. (Issue #42's bound is 3 searches; this is what it costs.)
        #expect(p.connections == 1 && p.requests <= 5 && roundTrips(p) <= 3, "plain: \(p)")
        #expect(p.identifications <= 1 && p.searches <= 1, "plain: \(p)")
        // A protected one: the client's connection, the search, then the prompt's connection (HELLO,
        // DELEGATE: both processes known) and PROMPT_READ (the person answers; the row the search found
        // is opened by reference and granted to secret-tool's process), the granted read.
        #expect(g.connections == 2 && g.requests <= 8 && roundTrips(g) <= 5, "protected: \(g)")
        #expect(g.identifications <= 1 && g.searches <= 1, "protected: \(g)")
        #expect(f.fake.takeQuestions().filter { $0.hasPrefix("GETPIN") }.count == 1)
    }

    /// Issue #42: a GetSecrets of several items the sender found is one agent request (the items
    /// read by their references, no search), whatever their number; each secret and content type is
    /// the item's, an item changed since the search is answered as it is now, and an unknown path is
    /// left out.
    @Test func getSecretsOfSeveralItemsIsOneAgentRequest() throws {
        let f = try Guarded(rule: "device-passcode")
        try Self.makeItems(f, kind: "many", count: 6, secret: "secret", extra: ", content_type='text/x-%d' % i")
        let script = { (then: String) in
            Self.afterSearch(kind: "many", count: 6, defs: """
                def secrets(paths):
                    got = call(a, PATH, SVC, 'GetSecrets', 'aoo', paths, session)
                    assert got[0] == 'ok', got
                    return got[1][0]
                """, then)
        }
        // The same client without and with the GetSecrets: the difference is what it costs.
        let (s, g) = try Self.costBeyondSearch(f, script, """
            # Two of the six, then all six: two requests (one each), whatever the share of the search.
            assert sorted(secrets(list(found)[:2])) == sorted(found[:2])
            got = secrets(list(found))
            assert sorted(got) == sorted(found), got
            values = sorted((bytes(v[2]), v[3]) for v in got.values())
            assert values == sorted((b'secret %d' % i, 'text/x-%d' % i) for i in range(6)), values
            """)
        print("GetSecrets of 2, then of 6 items: \(g.requests - s.requests) agent requests, \(g.searches - s.searches) searches")
        #expect(g.requests - s.requests == 2 && g.searches == s.searches, "search only: \(s), with GetSecrets: \(g)")
        // Changed by another connection after the search: answered as it is now; an unknown path left out.
        let changed = try f.bus.python(script("""
            list(secretstorage.search_items(b, {'n': '5'}))[0].set_secret(b'changed', 'text/x-changed')
            got = secrets(list(found) + ['/org/freedesktop/secrets/collection/login/nothing'])
            assert sorted(got) == sorted(found), got
            values = sorted((bytes(v[2]), v[3]) for v in got.values())
            assert (b'changed', 'text/x-changed') in values and (b'secret 5', 'text/x-5') not in values, values
            """))
        #expect(changed.status == 0 && changed.stdout.contains("done"), "\(changed)\n\(f.bus.read("front-end.log"))")
    }

    /// A query names at most 256 references: GetSecrets of 300 items is two agent requests (256 and
    /// 44), never 300 reads one by one, and every secret comes back.
    @Test func getSecretsOfMoreItemsThanOneQueryNamesIsAQueryPer256() throws {
        let f = try Guarded(rule: "device-passcode")
        let n = ItemQuery.maximumPersistentRefs + 44
        try Self.makeItems(f, kind: "bulk", count: n, secret: "bulk secret")
        let (s, g) = try Self.costBeyondSearch(f, { Self.afterSearch(kind: "bulk", count: n, $0) }, """
            got = call(a, PATH, SVC, 'GetSecrets', 'aoo', list(found), session)
            assert got[0] == 'ok', got
            values = sorted(bytes(v[2]) for v in got[1][0].values())
            assert values == sorted(b'bulk secret %d' % i for i in range(\(n))), len(values)
            """)
        #expect(g.requests - s.requests == 2 && g.searches == s.searches, "search only: \(s), with GetSecrets: \(g)")
    }

    /// A client reads the properties of every item its search found (libsecret makes a proxy of each):
    /// those come from the search while nothing changed since, no agent request each; after a change
    /// by another connection they are read afresh and show it.
    @Test func propertiesOfItemsASearchFoundCostNoAgentRequest() throws {
        let f = try Guarded(rule: "device-passcode")
        try Self.makeItems(f, kind: "prop", count: 5, secret: "secret")
        let script = { (then: String) in
            Self.afterSearch(kind: "prop", count: 5, defs: """
                def props(path):
                    got = call(a, path, PROPS, 'GetAll', 's', ITEM)
                    assert got[0] == 'ok', got
                    return {k: v[1] for k, v in got[1][0].items()}
                """, then)
        }
        let (s, g) = try Self.costBeyondSearch(f, script, """
            for path in found:
                p = props(path)
                assert p['Label'] == 'prop ' + p['Attributes']['n'] and p['Attributes']['kind'] == 'prop' and not p['Locked'], p
                assert p['Created'] > 0 and p['Modified'] >= p['Created'], p
            """)
        #expect(g.requests == s.requests && g.searches == s.searches, "search only: \(s), with every item's properties: \(g)")
        // Changed by another connection after the search: read afresh, and shown as it is now.
        let changed = try f.bus.python(script("""
            list(secretstorage.search_items(b, {'n': '3'}))[0].set_label('renamed')
            labels = sorted(props(path)['Label'] for path in found)
            assert labels == ['prop 0', 'prop 1', 'prop 2', 'prop 4', 'renamed'], labels
            """))
        #expect(changed.status == 0 && changed.stdout.contains("done"), "\(changed)\n\(f.bus.read("front-end.log"))")
    }

    /// `count` items of the sender's collection made through secretstorage: labelled "KIND i", with the
    /// attributes kind = KIND and n = i, the secret "SECRET i", and `extra` more arguments of create_item.
    static func makeItems(_ f: Guarded, kind: String, count: Int, secret: String, extra: String = "") throws {
        let made = try f.bus.python(SecretServiceBusTests.prelude + """
            coll = secretstorage.get_default_collection(a)
            for i in range(\(count)):
                coll.create_item('\(kind) %d' % i, {'kind': '\(kind)', 'n': str(i)}, b'\(secret) %d' % i\(extra))
            print('made')

            """)
        #expect(made.status == 0 && made.stdout.contains("made"), "\(made)")
    }

    /// A script that opens a plain session (`session`), finds the sender's items of `kind` (`found`,
    /// checked to be `count`), defines `defs`, runs `then` and prints done.
    static func afterSearch(kind: String, count: Int, defs: String = "", _ then: String) -> String {
        SecretServiceBusTests.prelude + """
        SVC, PROPS, ITEM = 'org.freedesktop.Secret.Service', 'org.freedesktop.DBus.Properties', 'org.freedesktop.Secret.Item'
        session = open_plain(a)[1][1]
        found = call(a, PATH, SVC, 'SearchItems', 'a{ss}', {'kind': '\(kind)'})[1][0]
        assert len(found) == \(count), found
        \(defs)
        \(then)
        print('done')

        """
    }

    /// What the agent's counters say `script("pass")` (the search alone) and `script(then)` cost, each
    /// run checked to finish: their difference is what `then` costs.
    static func costBeyondSearch(_ f: Guarded, _ script: (String) -> String, _ then: String) throws -> (AgentCounters, AgentCounters) {
        let meter = try AgentMeter(f.agent)
        let (searchOnly, s) = try meter.cost { try f.bus.python(script("pass")) }
        #expect(searchOnly.status == 0 && searchOnly.stdout.contains("done"), "\(searchOnly)\n\(f.bus.read("front-end.log"))")
        let (both, g) = try meter.cost { try f.bus.python(script(then)) }
        #expect(both.status == 0 && both.stdout.contains("done"), "\(both)\n\(f.bus.read("front-end.log"))")
        return (s, g)
    }

    /// PROMPT_READ on a connection that was not delegated is refused -34018, and nobody is asked.
    @Test func promptReadOnAConnectionThatWasNotDelegatedIsRefused() throws {
        let f = try Guarded(rule: "device-passcode")
        let c = try AgentConnection(path: f.agent.socketPath, replyTimeout: 60)
        let query = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("org.freedesktop.secrets"),
                                                                        "acct": .string(Self.itemID)], returnData: true)
        do {
            _ = try c.promptRead(query)
            Issue.record("PROMPT_READ was answered on a connection that was not delegated")
        } catch {
            #expect(error.status == .missingEntitlement, "\(error)")
        }
        #expect(f.fake.takeQuestions().isEmpty)
    }
}

/// The agent's own counters (COUNTERS) around something a client does: what it cost, measured from a
/// moment the agent is quiet (the front end announces stored items to its senders when the agent's
/// change event reaches it, a search of its own).
final class AgentMeter {
    let connection: AgentConnection

    init(_ agent: AgentProcess) throws {
        connection = try AgentConnection(path: agent.socketPath, clientName: "meter")
    }

    /// Waits until nothing but the meter's own request happens between two looks.
    func awaitQuiet() throws {
        for _ in 0..<100 {
            let a = try connection.counters()
            Thread.sleep(forTimeInterval: 0.2)
            let b = try connection.counters()
            if b.requests - a.requests == 1 && b.searches == a.searches && b.connections == a.connections { return }
        }
        Issue.record("the agent never went quiet")
    }

    /// What `body` cost the agent.
    func cost(_ body: () throws -> CLIResult) throws -> (CLIResult, AgentCounters) {
        try awaitQuiet()
        let before = try connection.counters()
        let r = try body()
        let after = try connection.counters()
        // The meter's own second COUNTERS is one request.
        return (r, AgentCounters(connections: after.connections - before.connections, requests: after.requests - before.requests - 1,
                                 identifications: after.identifications - before.identifications,
                                 searches: after.searches - before.searches))
    }
}
