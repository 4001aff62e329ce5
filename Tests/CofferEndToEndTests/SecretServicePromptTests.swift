import CofferClient
import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// The Secret Service front end's prompts (SecretServiceMapping.md, Locking and prompts): *Unlock*
/// of a locked keychain returns a *Prompt*; *Prompt* returns at once and the agent asks the person
/// with its own pinentry (PROMPT_UNLOCK on a connection delegated to the sender), here the scripted
/// one of PinentryHarness; *Completed* follows. Real agent, real bus, secretstorage and secret-tool.
@Suite(.enabled(if: PrivateSessionBus.available && PrivateSessionBus.clientsAvailable,
                "needs dbus-daemon, gdbus, python3-secretstorage, libsecret-tools, gir1.2-secret-1, python3-gi and python3-keyring (contrib/deps.sh)"))
struct SecretServicePromptTests {
    /// A front end whose agent's pinentry is the scripted one answering `passcode`, with a passcode
    /// set, one item stored through secret-tool, and the keychain locked.
    final class Locked: @unchecked Sendable {
        let dir = PinentryHarness.ShortDirectory()
        let fake: PinentryHarness.FakePinentry
        let apps: SignedApps
        let agent: AgentProcess
        let bus: PrivateSessionBus
        let frontEnd: Process

        init(passcode: String, pinentry: Bool = true) throws {
            fake = try PinentryHarness.FakePinentry(in: dir, pin: passcode, passcode: passcode)
            (apps, agent, bus, frontEnd, _) = try SecretServiceBusTests.setUp(
                agentConfig: ["authentication-timeout = 120"] + (pinentry ? ["pinentry = \(fake.path)"] : []))
            agent.setPasscode()
            let store = bus.run("/usr/bin/secret-tool", ["store", "--label=Mail", "server", "mail.example.com"], stdin: "s3cret")
            #expect(store.status == 0, "\(store)\n\(bus.read("front-end.log"))")
            let lock = agent.cli(["lock"])
            #expect(lock.status == 0, "\(lock)")
        }

        func lookup() -> CLIResult { bus.run("/usr/bin/secret-tool", ["lookup", "server", "mail.example.com"]) }
    }

    /// What the scripts share: Unlock of the login collection, answered with a prompt.
    static let prelude = SecretServiceBusTests.prelude + #"""
        from secretstorage.util import exec_prompt
        LOGIN = '/org/freedesktop/secrets/collection/login'
        def unlock(conn):
            r = call(conn, PATH, 'org.freedesktop.Secret.Service', 'Unlock', 'ao', [LOGIN])
            assert r[0] == 'ok' and r[1][0] == [] and r[1][1] != '/', r
            return r[1][1]
        def run_prompt(conn, prompt):
            dismissed, result = exec_prompt(conn, prompt)
            assert result[0] == 'ao', result
            return (dismissed, result[1])

        """#

    /// Python helpers for a scripted pinentry told to `hang` (its pid then in `hung`): `wait_asked()`
    /// until the agent's pinentry is asked, `wait_gone()` until that pinentry has exited.
    static func pinentryWaits(_ hung: String) -> String {
        """
        def wait_asked():
            deadline = time.time() + 60
            while not os.path.exists('\(hung)') and time.time() < deadline:
                time.sleep(0.05)
            assert os.path.exists('\(hung)'), 'the pinentry was not asked'
        def wait_gone():
            pid = int(open('\(hung)').read())
            deadline = time.time() + 30
            while os.path.exists('/proc/%d' % pid) and time.time() < deadline:
                time.sleep(0.05)
            assert not os.path.exists('/proc/%d' % pid), 'the pinentry is still running'

        """
    }

    @Test func aLockedKeychainIsUnlockedThroughThePromptAndTheAgentsPinentry() throws {
        let f = try Locked(passcode: AgentProcess.password)
        #expect(f.lookup().stdout.isEmpty, "the keychain is not locked")
        let r = try f.bus.python(Self.prelude + #"""
            prompt = unlock(a)
            assert run_prompt(a, prompt) == (False, [LOGIN]), 'not unlocked'
            r = call(a, PATH, 'org.freedesktop.Secret.Service', 'Unlock', 'ao', [LOGIN])
            assert r == ('ok', ([LOGIN], '/')), r
            print('done')
            """#)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(f.bus.read("front-end.log"))\n\(f.agent.log)")
        #expect(f.lookup().stdout == "s3cret", "\(f.lookup())")
        // The person was asked once, by the agent's pinentry.
        #expect(f.fake.takeQuestions().filter { $0.hasPrefix("GETPIN") }.count == 1)
    }

    /// Three wrong passcodes end the prompt dismissed (the keychain stays locked); a second prompt
    /// whose pinentry waits is dismissed by the caller: its pinentry goes, Completed(true) follows,
    /// and another sender is served while it waits.
    @Test func wrongPasscodesThenDismissWhileAnotherSenderIsServed() throws {
        let f = try Locked(passcode: "wrong passcode")
        let r = try f.bus.python(Self.prelude + """
            assert run_prompt(a, unlock(a)) == (True, []), 'a wrong passcode unlocked'
            for answer in ('\(f.dir.file("pin"))', '\(f.dir.file("passcode"))'):
                with open(answer, 'w') as file:
                    file.write('hang')
            prompt = unlock(a)
            from jeepney.bus_messages import MatchRule
            rule = MatchRule(path=prompt, interface='org.freedesktop.Secret.Prompt', member='Completed', type=MessageType.signal)
            with a.filter(rule) as signals:
                assert call(a, prompt, 'org.freedesktop.Secret.Prompt', 'Prompt', 's', '') == ('ok', ())
                deadline = time.time() + 60
                while not os.path.exists('\(f.dir.file("hung.pid"))') and time.time() < deadline:
                    time.sleep(0.05)
                assert os.path.exists('\(f.dir.file("hung.pid"))'), 'the pinentry was not asked'
                # Another sender is served while the prompt waits.
                assert open_plain(b)[0] == 'ok'
                # (Answered by the agent on b's own connection: the keychain is still locked.)
                search = call(b, PATH, 'org.freedesktop.Secret.Service', 'SearchItems', 'a{ss}', {})
                assert search == ('error', 'org.freedesktop.Secret.Error.IsLocked'), search
                assert call(a, prompt, 'org.freedesktop.Secret.Prompt', 'Dismiss') == ('ok', ())
                assert a.recv_until_filtered(signals, timeout=30).body == (True, ('ao', []))
            pid = int(open('\(f.dir.file("hung.pid"))').read())
            deadline = time.time() + 30
            while os.path.exists('/proc/%d' % pid) and time.time() < deadline:
                time.sleep(0.05)
            assert not os.path.exists('/proc/%d' % pid), 'the pinentry is still running'
            print('done')

            """)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(f.bus.read("front-end.log"))\n\(f.agent.log)")
        #expect(f.lookup().stdout.isEmpty, "the keychain was unlocked")
        #expect(f.fake.takeQuestions().filter { $0.hasPrefix("GETPIN") }.count == 4)
    }

    /// A sender that leaves the bus while its prompt waits cancels it: the agent's pinentry goes, and
    /// the keychain stays locked.
    @Test func aSenderThatLeavesMidPromptCancelsIt() throws {
        let f = try Locked(passcode: "hang")
        let hung = f.dir.file("hung.pid")
        let r = try f.bus.python(Self.prelude + """
            assert call(b, unlock(b), 'org.freedesktop.Secret.Prompt', 'Prompt', 's', '') == ('ok', ())
            deadline = time.time() + 60
            while not os.path.exists('\(hung)') and time.time() < deadline:
                time.sleep(0.05)
            assert os.path.exists('\(hung)'), 'the pinentry was not asked'
            b.close()
            pid = int(open('\(hung)').read())
            deadline = time.time() + 30
            while os.path.exists('/proc/%d' % pid) and time.time() < deadline:
                time.sleep(0.05)
            assert not os.path.exists('/proc/%d' % pid), 'the pinentry is still running'
            assert open_plain(a)[0] == 'ok'
            print('done')

            """)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(f.bus.read("front-end.log"))\n\(f.agent.log)")
        #expect(f.lookup().stdout.isEmpty, "the keychain was unlocked")
    }

    /// One running prompt per sender: while the first prompt's pinentry waits, the same sender's
    /// second *Prompt* is refused LimitsExceeded and nobody else is asked; another sender's prompt is
    /// still accepted; once the first is dismissed, the second runs.
    @Test func aSecondRunningPromptFromTheSameSenderIsRefused() throws {
        let f = try Locked(passcode: "hang")
        let r = try f.bus.python(Self.prelude + Self.pinentryWaits(f.dir.file("hung.pid")) + """
            from jeepney.bus_messages import MatchRule
            PROMPT = 'org.freedesktop.Secret.Prompt'
            first, second = unlock(a), unlock(a)
            assert first != second, (first, second)
            def completed(prompt):
                return MatchRule(path=prompt, interface=PROMPT, member='Completed', type=MessageType.signal)
            with a.filter(completed(first)) as signals:
                assert call(a, first, PROMPT, 'Prompt', 's', '') == ('ok', ())
                wait_asked()
                refused = call(a, second, PROMPT, 'Prompt', 's', '')
                assert refused == ('error', 'org.freedesktop.DBus.Error.LimitsExceeded'), refused
                # The running one asked again is no second prompt.
                assert call(a, first, PROMPT, 'Prompt', 's', '') == ('ok', ())
                # Another sender is not limited by a's prompt.
                other = unlock(b)
                with b.filter(completed(other)) as others:
                    assert call(b, other, PROMPT, 'Prompt', 's', '') == ('ok', ())
                    assert call(b, other, PROMPT, 'Dismiss') == ('ok', ())
                    assert b.recv_until_filtered(others, timeout=30).body == (True, ('ao', []))
                assert call(a, first, PROMPT, 'Dismiss') == ('ok', ())
                assert a.recv_until_filtered(signals, timeout=30).body == (True, ('ao', []))
            # The refused prompt is still there, and runs now that the first has ended.
            with a.filter(completed(second)) as signals:
                assert call(a, second, PROMPT, 'Prompt', 's', '') == ('ok', ())
                assert call(a, second, PROMPT, 'Dismiss') == ('ok', ())
                assert a.recv_until_filtered(signals, timeout=30).body == (True, ('ao', []))
            print('done')

            """)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(f.bus.read("front-end.log"))\n\(f.agent.log)")
        #expect(f.lookup().stdout.isEmpty, "the keychain was unlocked")
    }

    /// No pinentry configured: nobody can be asked, and the prompt completes dismissed at once.
    @Test func withoutAPinentryThePromptCompletesDismissedAtOnce() throws {
        let f = try Locked(passcode: AgentProcess.password, pinentry: false)
        let r = try f.bus.python(Self.prelude + #"""
            assert run_prompt(a, unlock(a)) == (True, [])
            print('done')
            """#)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(f.bus.read("front-end.log"))")
        #expect(f.lookup().stdout.isEmpty)
        #expect(f.fake.takeQuestions().isEmpty)
    }

    /// PROMPT_UNLOCK on a connection that was not delegated is refused -34018 and nobody is asked,
    /// even with a pinentry configured and the keychain locked.
    @Test func promptUnlockOnAConnectionThatWasNotDelegatedIsRefused() throws {
        let f = try Locked(passcode: AgentProcess.password)
        let c = try AgentConnection(path: f.agent.socketPath, replyTimeout: 60)
        do {
            try c.promptUnlock()
            Issue.record("PROMPT_UNLOCK was answered OK on a connection that was not delegated")
        } catch {
            #expect(error.status == .missingEntitlement, "\(error)")
        }
        #expect(f.fake.takeQuestions().isEmpty)
        #expect(f.lookup().stdout.isEmpty)
    }
}
