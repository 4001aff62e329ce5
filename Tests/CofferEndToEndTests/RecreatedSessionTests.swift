import CofferTestSupport
import Foundation
import Glibc
import Testing

/// Issue #42, the second review's attack: a reuse grant the core keeps for a caller must not be served
/// to a *recreated* session, one whose id is the old one's because its leader got the old leader's pid
/// (any process of the user can wait for a pid to come back and call setsid()). The core keys a
/// caller's grants by its login session told apart by the leader's start time (CallerSessions), and
/// item grants by the process's own start time; these tests mount the attack for real through each
/// front end that serves a grant: the same program in the same session is served without asking, the
/// same program in the recreated session (same session id, another leader) is asked again.
///
/// A chosen pid needs `/proc/sys/kernel/ns_last_pid` (root, as CI runs): without it the tests skip.
///
/// The suite is serialized: a test's write of `ns_last_pid` steers whichever process forks next onto
/// that pid, and another test's session leader must not be the one (one CI run's was, and kept the
/// pid for the length of its session).
@Suite(.serialized, .enabled(if: RecreatedSession.available, "needs root: a session is recreated with the same id through /proc/sys/kernel/ns_last_pid"))
struct RecreatedSessionTests {
    /// The ssh-agent front end: a keychain key with a 300 s reuse window, `ssh-keygen -Y sign` through
    /// the agent's ssh-agent socket (each signature its own connection).
    @Test func theSSHAgentFrontEndAsksAgainInARecreatedSession() throws {
        let prompted = try SSHAgentPolicyTests.Prompted(pin: AgentProcess.password, passcode: AgentProcess.password)
        let (f, fake) = (prompted.f, prompted.fake)
        f.agent.setPasscode()
        let pub = try prompted.reuseKey()
        let data = f.dir.file("data")
        try "w\n".write(toFile: data, atomically: true, encoding: .utf8)
        // Two signatures, each its own ssh-keygen and connection, in one new session: one question.
        let sign = "/usr/bin/ssh-keygen -Y sign -f '\(pub)' -n file '\(data)' && rm -f '\(data).sig'"
        let first = try RecreatedSession.run("\(sign) && \(sign)", environment: ["SSH_AUTH_SOCK": f.sshSocket])
        #expect(first.result.status == 0, "\(first.result)\n\(f.agent.log)")
        #expect(fake.pinsAsked == 1, "the same program in the same session is served by the grant")
        // Its leader gone, a new session with the old id: the same program is asked again.
        let again = try RecreatedSession.run(sign, leader: first.leader, environment: ["SSH_AUTH_SOCK": f.sshSocket])
        #expect(again.leader == first.leader)
        #expect(again.result.status == 0, "\(again.result)\n\(f.agent.log)")
        #expect(fake.pinsAsked == 2, "a recreated session (same id, another leader) was served the old session's grant")
    }

    /// The native front end: the same key used with KEY_SIGN (SecKeyCreateSignature's request) by a
    /// client written from the wire spec (contrib/outside-client's codec), which answers AUTH_NEEDED with
    /// the passcode (read from stdin) and prints how many times it was asked.
    @Test func theNativeFrontEndAsksAgainInARecreatedSession() throws {
        let prompted = try SSHAgentPolicyTests.Prompted(pin: AgentProcess.password, passcode: AgentProcess.password)
        let f = prompted.f
        f.agent.setPasscode()
        _ = try prompted.reuseKey()
        let dir = TemporaryDirectory("coffer-native-signer")
        let client = dir.file("sign.py")
        try Self.nativeSigner.write(toFile: client, atomically: true, encoding: .utf8)
        let library = Binaries.packageRoot + "/contrib/outside-client"
        /// Signs `times` times, each on a new connection, in a new session (with leader `leader`):
        /// how many times the agent asked.
        func sign(times: Int, leader: Int32 = 0) throws -> (asked: Int?, leader: Int32) {
            let run = try RecreatedSession.run("/usr/bin/python3 '\(client)' '\(library)' '\(f.agent.socketPath)' reused \(times)",
                                               leader: leader, stdin: AgentProcess.password)
            #expect(run.result.status == 0, "\(run.result)\n\(f.agent.log)")
            let asked = run.result.stdout.split(separator: "\n").last.flatMap { $0.hasPrefix("asked ") ? Int($0.dropFirst(6)) : nil }
            return (asked, run.leader)
        }
        let first = try sign(times: 2)
        #expect(first.asked == 1, "two connections of the same program in the same session: one question")
        let again = try sign(times: 1, leader: first.leader)
        #expect(again.leader == first.leader)
        #expect(again.asked == 1, "a recreated session (same id, another leader) was served the old session's grant")
    }

    /// The Secret Service front end, whose prompt grants a read to the client's process (its pid and
    /// start time, in its session): the holder is a session leader (python3 with the session's id as
    /// its pid), and the attacker takes both back, the same program as leader of a new session with
    /// that pid and id. Only the start times differ, and the attacker's read is refused unasked.
    @Test func theSecretServiceFrontEndAsksAgainInARecreatedSession() throws {
        let f = try SecretServiceAccessControlTests.Guarded(rule: "device-passcode")
        let item = SecretServiceAccessControlTests.itemPath
        let dir = TemporaryDirectory("coffer-ss-session")
        let holder = dir.file("holder.py"), attacker = dir.file("attacker.py")
        try (SecretServiceBusTests.prelude + """
            from secretstorage.util import exec_prompt
            unlocked = call(a, PATH, 'org.freedesktop.Secret.Service', 'Unlock', 'ao', ['\(item)'])
            assert unlocked[0] == 'ok' and unlocked[1][1] != '/', unlocked
            assert exec_prompt(a, unlocked[1][1]) == (False, ('ao', ['\(item)']))
            for n in range(2):
                got = call(a, '\(item)', 'org.freedesktop.Secret.Item', 'GetSecret', 'o', open_plain(a)[1][1])
                assert got[0] == 'ok' and got[1][0][2] == b'guarded secret', got
            print('done')

            """).write(toFile: holder, atomically: true, encoding: .utf8)
        try (SecretServiceBusTests.prelude + """
            locked = call(a, '\(item)', 'org.freedesktop.DBus.Properties', 'Get', 'ss', 'org.freedesktop.Secret.Item', 'Locked')
            assert locked == ('ok', (('b', True),)), locked
            got = call(a, '\(item)', 'org.freedesktop.Secret.Item', 'GetSecret', 'o', open_plain(a)[1][1])
            assert got == ('error', 'org.freedesktop.Secret.Error.IsLocked'), got
            print('done')

            """).write(toFile: attacker, atomically: true, encoding: .utf8)
        let environment = ["DBUS_SESSION_BUS_ADDRESS": f.bus.address, "DISPLAY": ":0"]
        let first = try RecreatedSession.run("exec \(PrivateSessionBus.python) '\(holder)'", environment: environment)
        #expect(first.result.status == 0 && first.result.stdout.contains("done"), "\(first.result)\n\(f.log)")
        #expect(f.fake.takeQuestions().filter { $0.hasPrefix("GETPIN") }.count == 1, "the person is asked once for the grant")
        let again = try RecreatedSession.run("exec \(PrivateSessionBus.python) '\(attacker)'", leader: first.leader, environment: environment)
        #expect(again.leader == first.leader)
        #expect(again.result.status == 0 && again.result.stdout.contains("done"),
                "the same pid in a recreated session was served the first process's grant: \(again.result)\n\(f.log)")
        #expect(f.fake.takeQuestions().filter { $0.hasPrefix("GETPIN") }.isEmpty)
    }

    /// A native client that signs with key LABEL TIMES times, each time on a new connection, answering
    /// each AUTH_NEEDED with the passcode on stdin; prints `asked N`.
    static let nativeSigner = """
        sys = __import__("sys")
        sys.path.insert(0, sys.argv[1])
        from coffer_wire_client import Connection, query, KEYS, LIMIT_ONE, S
        socket, label, times = sys.argv[2], sys.argv[3], int(sys.argv[4])
        passcode = sys.stdin.buffer.read()
        asked = 0
        def answer(conn, rid, rep):
            global asked
            if rep.name != 'AUTH_NEEDED':
                return None
            asked += 1
            return {'kind': 1, 'secret': passcode}
        for _ in range(times):
            c = Connection(socket)
            assert c.hello().name == 'HELLO_REPLY'
            r = c.request('KEY_SIGN', {'query': query(KEYS, {'labl': S(label)}, limit=LIMIT_ONE), 'data': b'w', 'flags': 0}, auth=answer)
            assert r.name == 'KEY_SIGNATURE', r
            c.close()
        print('asked %d' % asked)

        """
}

/// Commands run as the leader of a new session, the leader's pid (the session's id) chosen when asked:
/// the next pid is set through `/proc/sys/kernel/ns_last_pid` and the fork tried again while other
/// processes take it first.
enum RecreatedSession {
    static var available: Bool { getuid() == 0 && access("/proc/sys/kernel/ns_last_pid", W_OK) == 0 }

    /// A python3 driver: forks the leader (with pid `want` unless 0), which calls setsid() and runs
    /// `sh -c COMMAND`; writes the leader's pid to PIDFILE and exits with the command's status
    /// (125: the pid could not be had within 60 s). A pid another process holds (one the write of
    /// `ns_last_pid` steered there, say: any process's fork right after it takes that pid) is waited for.
    static let driver = """
        os, sys, time = __import__("os"), __import__("sys"), __import__("time")
        pidfile, want, command = sys.argv[1], int(sys.argv[2]), sys.argv[3]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if want and os.path.exists('/proc/%d' % want):
                time.sleep(0.05)
                continue
            if want:
                fd = os.open('/proc/sys/kernel/ns_last_pid', os.O_WRONLY)
                os.write(fd, str(want - 1).encode())
                os.close(fd)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                if want and os.getpid() != want:
                    os._exit(0)
                os.write(w, b'1')
                os.close(w)
                os.setsid()
                os.execv('/bin/sh', ['sh', '-c', command])
            os.close(w)
            took = os.read(r, 1) == b'1'
            os.close(r)
            _, status = os.waitpid(pid, 0)
            if took:
                open(pidfile, 'w').write('%d\\n' % pid)
                sys.exit(os.waitstatus_to_exitcode(status))
        sys.exit(125)

        """

    /// Runs `command` (sh) as the leader of a new session, with pid `leader` when given (the session
    /// that had it must be over); returns its result and the leader's pid.
    static func run(_ command: String, leader: Int32 = 0, environment: [String: String] = [:], stdin: String? = nil) throws
        -> (result: CLIResult, leader: Int32) {
        let dir = TemporaryDirectory("coffer-session")
        let script = dir.file("driver.py"), pidfile = dir.file("leader")
        try driver.write(toFile: script, atomically: true, encoding: .utf8)
        let r = runProcess("/usr/bin/python3", [script, pidfile, String(leader), command], stdin: stdin, environment: environment,
                           timeout: 120)
        let pid = Int32(((try? String(contentsOfFile: pidfile, encoding: .utf8)) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
        if r.status == 125 && pid == 0 { throw SignedApps.Failure("pid \(leader) could not be had for a new session leader within 60 s: \(r)") }
        return (r, pid)
    }
}
