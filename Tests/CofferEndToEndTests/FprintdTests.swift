import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// The real fprintd (`/usr/libexec/fprintd`) on a private system bus, as PLATFORM-NOTES.md
/// ("fprintd on a private bus") describes: a private `dbus-daemon` as the system bus, polkit replaced
/// by python-dbusmock's `polkitd` template, fprintd driving libfprint's `virtual_device`, whose socket
/// takes `SCAN finger`, `RETRY n`, … one command per connection.
///
/// The agent's plugin host gets no environment from the agent but COFFER_PAM_*, so the agent runs in
/// a private mount namespace (`unshare --mount`) where the private bus's directory is bound over
/// `/run/dbus`: the plugin reaches it at the standard `/run/dbus/system_bus_socket`.
final class FprintdBus: @unchecked Sendable {
    let dir = TemporaryDirectory("coffer-fprintd")
    /// Bound over /run/dbus in the agent's mount namespace.
    var busDir: String { dir.file("bus") }
    var busAddress: String { "unix:path=" + busDir + "/system_bus_socket" }
    var deviceSocket: String { dir.file("virtual-device.sock") }
    private var daemon: Process?
    private var polkit: Process?
    private(set) var fprintd: Process?
    private var holder: (process: Process, stdin: Pipe)?
    let user = currentUser

    static let python = "/usr/bin/python3"
    /// What this needs: fprintd and its tools, dbus-daemon, gdbus, Debian's python3 with dbusmock
    /// and python3-dbus, and root (for the mount namespace the agent runs in).
    static var available: Bool {
        let files = ["/usr/libexec/fprintd", "/usr/bin/fprintd-enroll", "/usr/bin/dbus-daemon", "/usr/bin/gdbus", python,
                     "/usr/bin/unshare", "/run/dbus", "/usr/lib/python3/dist-packages/dbusmock", "/usr/lib/python3/dist-packages/dbus"]
        return getuid() == 0 && files.allSatisfy { FileManager.default.fileExists(atPath: $0) }
    }

    init() throws {
        mkdir(busDir, 0o755)
        let config = dir.file("bus.conf")
        try """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>system</type>
              <listen>unix:path=\(busDir)/system_bus_socket</listen>
              <auth>EXTERNAL</auth>
              <policy context="default">
                <allow send_destination="*" eavesdrop="true"/>
                <allow eavesdrop="true"/>
                <allow own="*"/>
                <allow user="*"/>
              </policy>
            </busconfig>

            """.write(toFile: config, atomically: true, encoding: .utf8)
        daemon = try spawn("/usr/bin/dbus-daemon", ["--config-file=" + config, "--nofork", "--nopidfile"], log: "dbus-daemon.log")
        guard Self.wait(until: { FileManager.default.fileExists(atPath: self.busDir + "/system_bus_socket") }) else {
            throw SetupError(what: "dbus-daemon did not start", log: read("dbus-daemon.log"))
        }
        polkit = try spawn(Self.python, ["-m", "dbusmock", "--system", "--template", "polkitd"], log: "polkit.log")
        let allowed = "['net.reactivated.fprint.device.enroll','net.reactivated.fprint.device.verify','net.reactivated.fprint.device.setusername']"
        guard Self.wait(until: {
            self.run("/usr/bin/gdbus", ["call", "--system", "-d", "org.freedesktop.PolicyKit1", "-o", "/org/freedesktop/PolicyKit1/Authority",
                                        "-m", "org.freedesktop.DBus.Mock.SetAllowed", allowed]).status == 0
        }) else { throw SetupError(what: "the polkit mock did not start", log: read("polkit.log")) }
        try startFprintd()
    }

    struct SetupError: Error, CustomStringConvertible {
        let what: String
        let log: String
        var description: String { "\(what):\n\(log)" }
    }

    /// Starts fprintd on the virtual device and waits until it answers GetDefaultDevice.
    func startFprintd() throws {
        mkdir(dir.file("fprintd-state"), 0o700)
        mkdir(dir.file("fprintd-run"), 0o700)
        fprintd = try spawn("/usr/libexec/fprintd", ["-t"], log: "fprintd.log",
                            environment: ["FP_VIRTUAL_DEVICE": deviceSocket, "FP_DRIVERS_WHITELIST": "virtual_device",
                                          "STATE_DIRECTORY": dir.file("fprintd-state"), "RUNTIME_DIRECTORY": dir.file("fprintd-run"),
                                          // libfprint's and fprintd's debug messages: the device's opening, closing and
                                          // connections, for a failure's report
                                          "G_MESSAGES_DEBUG": "all"])
        guard Self.wait(until: {
            self.run("/usr/bin/gdbus", ["call", "--system", "-d", "net.reactivated.Fprint", "-o", "/net/reactivated/Fprint/Manager",
                                        "-m", "net.reactivated.Fprint.Manager.GetDefaultDevice"]).status == 0
        }) else { throw SetupError(what: "fprintd did not start", log: read("fprintd.log")) }
    }

    /// Stops fprintd (SIGKILL: the test runner's blocked SIGTERM is inherited by its children) and
    /// waits for it to exit.
    func stopFprintd() {
        guard let p = fprintd, p.isRunning else { return }
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
        // A killed fprintd leaves its virtual device's socket behind; the next one binds afresh.
        unlink(deviceSocket)
    }

    /// `fprintd-delete USER -f FINGER`.
    func delete(_ finger: String) -> Bool {
        run("/usr/bin/fprintd-delete", [user, "-f", finger]).status == 0
    }

    /// `fprintd-enroll -f FINGER USER`, with five `SCAN sample` to the virtual device.
    func enroll(_ finger: String, sample: String = "finger-A") throws {
        let p = try spawn("/usr/bin/fprintd-enroll", ["-f", finger, user], log: "enroll.log")
        for i in 1...5 where !scan("SCAN \(sample)") { throw SetupError(what: "enrolment scan \(i) was not taken", log: read("enroll.log")) }
        let deadline = Date().addingTimeInterval(10)
        while p.isRunning && Date() < deadline { usleep(20_000) }
        guard !p.isRunning, p.terminationStatus == 0 else {
            if p.isRunning { kill(p.processIdentifier, SIGKILL) }
            throw SetupError(what: "fprintd-enroll failed", log: read("enroll.log"))
        }
    }

    /// Sends one command to the virtual device (its socket exists while the device is claimed) and
    /// waits until the driver closes the connection (it takes one command per connection).
    @discardableResult
    func scan(_ command: String, within seconds: Double = 30) -> Bool {
        let start = Date()
        let deadline = start.addingTimeInterval(seconds)
        failures = []
        func failed(_ what: String) {
            // Each distinct failure once, with when it was first seen and the socket's inode then.
            guard !failures.contains(where: { $0.hasSuffix(what) }) else { return }
            var st = stat()
            let inode = stat(deviceSocket, &st) == 0 ? "inode \(st.st_ino)" : "no socket file"
            failures.append(String(format: "+%.2fs (%@) ", Date().timeIntervalSince(start), inode) + what)
        }
        while Date() < deadline {
            let connected: Int32
            do { connected = try UnixSocket.connect(path: deviceSocket) } catch {
                failed("connect: \(error)")
                usleep(20_000)
                continue
            }
            let bytes = Array(command.utf8)
            // A connection the driver dropped (it keeps one at a time, and a reopened device
            // listens afresh) is not a scan taken: try again until the deadline.
            guard write(connected, bytes, bytes.count) == bytes.count else {
                failed("write: \(String(cString: strerror(errno)))")
                close(connected)
                usleep(20_000)
                continue
            }
            var tv = timeval(tv_sec: 5, tv_usec: 0)
            setsockopt(connected, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            var buffer = [UInt8](repeating: 0, count: 64)
            while Glibc.read(connected, &buffer, buffer.count) > 0 {}
            close(connected)
            return true
        }
        return false
    }

    /// Every distinct reason the last ``scan(_:within:)`` was refused, in order, with its time.
    private(set) var failures: [String] = []

    /// Another program claims the reader (one D-Bus connection holding the claim) until `releaseClaim`.
    func holdClaim() throws {
        let script = dir.file("hold.py")
        try """
            dbus, sys = __import__("dbus"), __import__("sys")
            bus = dbus.SystemBus()
            m = dbus.Interface(bus.get_object("net.reactivated.Fprint", "/net/reactivated/Fprint/Manager"), "net.reactivated.Fprint.Manager")
            d = dbus.Interface(bus.get_object("net.reactivated.Fprint", m.GetDefaultDevice()), "net.reactivated.Fprint.Device")
            d.Claim(sys.argv[1])
            open(sys.argv[2], "w").close()
            sys.stdin.read()
            d.Release()

            """.write(toFile: script, atomically: true, encoding: .utf8)
        let marker = dir.file("claimed")
        let stdin = Pipe()
        let p = try spawn(Self.python, [script, user, marker], log: "hold.log", stdin: stdin)
        holder = (p, stdin)
        guard Self.wait(until: { FileManager.default.fileExists(atPath: marker) }) else {
            throw SetupError(what: "the other client could not claim the reader", log: read("hold.log"))
        }
    }

    func releaseClaim() {
        guard let holder else { return }
        try? holder.stdin.fileHandleForWriting.close()
        holder.process.waitUntilExit()
        self.holder = nil
    }

    /// The command the agent is started through: a private mount namespace with the bus at /run/dbus.
    var launcher: [String] {
        ["/usr/bin/unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", "mount --bind \"$0\" /run/dbus && exec \"$@\"", busDir]
    }

    func read(_ log: String) -> String { (try? String(contentsOfFile: dir.file(log), encoding: .utf8)) ?? "" }

    private func spawn(_ executable: String, _ arguments: [String], log: String, environment: [String: String] = [:],
                       stdin: Pipe? = nil) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = arguments
        p.environment = ProcessInfo.processInfo.environment.merging(environment.merging(["DBUS_SYSTEM_BUS_ADDRESS": busAddress]) { $1 }) { $1 }
        let path = dir.file(log)
        // (appended to: a restarted daemon's log follows its predecessor's)
        if !FileManager.default.fileExists(atPath: path) { _ = FileManager.default.createFile(atPath: path, contents: nil) }
        let handle = FileHandle(forWritingAtPath: path)
        handle?.seekToEndOfFile()
        p.standardOutput = handle
        p.standardError = handle
        p.standardInput = stdin ?? FileHandle.nullDevice
        try p.run()
        return p
    }

    private func run(_ executable: String, _ arguments: [String]) -> (status: Int32, output: String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = arguments
        p.environment = ProcessInfo.processInfo.environment.merging(["DBUS_SYSTEM_BUS_ADDRESS": busAddress]) { $1 }
        let out = Pipe()
        p.standardOutput = out
        p.standardError = out
        guard (try? p.run()) != nil else { return (-1, "") }
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    static func wait(_ seconds: Double = 10, until condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if condition() { return true }
            usleep(30_000)
        }
        return false
    }

    deinit {
        releaseClaim()
        for p in [fprintd, polkit, daemon].compactMap({ $0 }) where p.isRunning {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        }
    }
}

let fprintdPluginBuilt = FileManager.default.fileExists(atPath: Binaries.directory + "/libCofferPluginFprintd.so")
    && FileManager.default.fileExists(atPath: Binaries.directory + "/coffer-plugin-host")

/// Biometry through the agent with `biometry = fprintd` against the real fprintd (issue #15): a get
/// waits for a finger on the (virtual) reader; a match opens the item, a non-match is a failed match
/// the agent counts (five lock biometry out until the passcode); a retry scan is feedback, not a
/// failure; a reader claimed by another program is biometryNotAvailable at once; fprintd stopping
/// mid-evaluation fails that evaluation only.
@Suite(.serialized, .enabled(if: TerminalRun.available && fprintdPluginBuilt && FprintdBus.available,
                             "needs root, script/setsid, the built fprintd plugin and fprintd, dbus-daemon, gdbus, python3-dbusmock (contrib/deps.sh)"))
struct FprintdTests {
    static let finger = "right-index-finger"

    /// A private bus with fprintd, `finger` enrolled, and an agent whose biometry is the fprintd plugin.
    static func setUp(enroll: Bool = true) throws -> (FprintdBus, AgentProcess) {
        let bus = try FprintdBus()
        if enroll { try bus.enroll(finger) }
        let setup = TemporaryDirectory("coffer-fprintd-setup")
        let plugins = setup.file("plugins")
        mkdir(plugins, 0o755)
        writeFileBytes(plugins + "/libCofferPluginFprintd.so", fileBytes(Binaries.directory + "/libCofferPluginFprintd.so"))
        chmod(plugins + "/libCofferPluginFprintd.so", 0o644)
        let config = setup.file("cofferd.conf")
        try """
            biometry = fprintd
            plugin-dir = \(plugins)
            plugin-host = \(Binaries.directory)/coffer-plugin-host
            authentication-timeout = 30

            """.write(toFile: config, atomically: true, encoding: .utf8)
        let agent = try AgentProcess(extraArguments: ["--config", config], launcher: bus.launcher)
        agent.keepAlive = setup
        agent.setPasscode()
        return (bus, agent)
    }

    /// How many evaluations reached VerifyStart (the plugin's `status` reply).
    static func verifications(_ agent: AgentProcess) -> Int {
        // (the CLI shows the plugin's reply with its newlines escaped)
        let s = agent.cli(["bio", "status"]).stdout.replacingOccurrences(of: "\\n", with: "\n")
        guard let line = s.split(separator: "\n").first(where: { $0.hasPrefix("verifications: ") }) else { return -1 }
        return Int(line.dropFirst("verifications: ".count)) ?? -1
    }

    /// Waits for an evaluation after the `after`-th to wait for a finger, then sends `command`.
    /// `record: false` reports a failure on standard output only (for a caller that tries again).
    @discardableResult
    static func scan(_ bus: FprintdBus, _ agent: AgentProcess, _ command: String, after: inout Int, record: Bool = true) -> Bool {
        let previous = after
        func report(_ message: String) {
            if record { Issue.record(Comment(rawValue: message)) } else { print("FprintdTests (trying again): " + message) }
        }
        guard FprintdBus.wait(until: { verifications(agent) > previous }) else {
            report("no evaluation reached the reader; bio status: \(agent.cli(["bio", "status"]))")
            return false
        }
        after = verifications(agent)
        guard bus.scan(command) else {
            report("the virtual reader took no \(command) (\(bus.failures.joined(separator: "; "))); fprintd log:\n\(bus.read("fprintd.log").suffix(12000))")
            return false
        }
        return true
    }

    /// A get that `command` on the reader must decide (open, or end in "No match"). On loaded CI machines the virtual reader has
    /// refused every connection for a whole evaluation (libfprint's listener: its socket bound,
    /// VerifyStart answered, no connection accepted; the cause is not known, and a new claim binds
    /// it afresh). Such a try is printed with fprintd's log and the get is made once more; the
    /// caller's expectations apply to that second get.
    /// `typing`: what is typed at `prompt` (nil: nothing), e.g. Enter after a "No match".
    static func opened(_ bus: FprintdBus, _ agent: AgentProcess, _ item: String, by command: String, seen: inout Int,
                       prompt: String = "Touch the sensor", typing: String? = nil) -> TerminalRun {
        var attempt = 1
        while true {
            let pending = BiometryTests.get(agent, item, typing: typing, prompt: prompt)
            let scanned = scan(bus, agent, command, after: &seen, record: attempt == 2)
            let result = pending.wait()
            if scanned || attempt == 2 { return result }
            attempt += 1
        }
    }

    /// The plugin host's log once it contains `line` (it is written by another process), or as it is after 10 s.
    static func plugLog(_ agent: AgentProcess, containing line: String) -> String {
        _ = FprintdBus.wait(until: { plugLog(agent).contains(line) })
        return plugLog(agent)
    }

    static func plugLog(_ agent: AgentProcess) -> String {
        (try? String(contentsOfFile: agent.stateDir + "/plugin-host.log", encoding: .utf8)) ?? ""
    }

    @Test func bioStatusShowsTheReaderAndAMatchingScanOpensTheItem() throws {
        let (bus, agent) = try Self.setUp()
        let status = agent.cli(["bio", "status"])
        #expect(status.status == 0 && status.stdout.contains("authenticator: fprintd") && status.stdout.contains("Virtual device for debugging")
                && status.stdout.contains("fingers: \(Self.finger)") && status.stdout.contains("enrolled: 1"), "\(status)\n\(agent.log)")
        // The plugin never enrols: enrolment stays with fprintd-enroll.
        #expect(BiometryTests.withPasscode(agent, ["bio", "enroll", "x"]).status != 0)
        BiometryTests.add(agent, "bank", "biometry-any")
        var seen = 0
        // A matching finger opens the item.
        var t = Self.opened(bus, agent, "bank", by: "SCAN finger-A", seen: &seen, prompt: "Swipe your finger")
        #expect(t.status == 0 && t.output.contains("secret of bank") && t.output.contains("Swipe your finger on the reader"), "\(t)")
        // A non-matching finger is a failed match: "No match", the item stays closed (Enter cancels).
        // (Through `opened`, as the matches: the virtual reader's refusal, seen once in CI with three test processes.)
        t = Self.opened(bus, agent, "bank", by: "SCAN finger-B", seen: &seen, prompt: "No match", typing: "")
        #expect(t.status != 0 && t.prompted && !t.output.contains("secret of bank"), "\(t)")
        // Enter cancelled the evaluation that followed the miss: the plugin released the reader at
        // once, so the next get claims it and matches.
        t = Self.opened(bus, agent, "bank", by: "SCAN finger-A", seen: &seen)
        #expect(t.status == 0 && t.output.contains("secret of bank"), "\(t)\n\(Self.plugLog(agent))")
    }

    @Test func fiveNonMatchingScansLockBiometryAndThePasscodeLiftsIt() throws {
        let (bus, agent) = try Self.setUp()
        BiometryTests.add(agent, "bank", "user-presence")
        var seen = 0
        let pending = BiometryTests.get(agent, "bank", typing: AgentProcess.password, prompt: "locked out")
        for i in 1...5 { #expect(Self.scan(bus, agent, "SCAN finger-B", after: &seen), "scan \(i): \(Self.plugLog(agent))") }
        var t = pending.wait()
        #expect(t.status == 0 && t.output.contains("secret of bank") && t.output.contains("No match. Try again.") && t.prompted, "\(t)")
        #expect(seen == 5, "exactly five evaluations reached the reader")
        // The passcode lifted the lockout: the reader is used again.
        t = Self.opened(bus, agent, "bank", by: "SCAN finger-A", seen: &seen)
        #expect(t.status == 0 && t.output.contains("secret of bank") && !t.output.contains("locked out"), "\(t)")
    }

    static func domainState(_ agent: AgentProcess) -> String {
        let s = agent.cli(["bio", "status"]).stdout.replacingOccurrences(of: "\\n", with: "\n")
        return s.split(separator: "\n").first(where: { $0.hasPrefix("domain-state: ") }).map(String.init) ?? "none"
    }

    /// biometry-current-set: the domain state comes from fprintd's finger list, so enrolling another
    /// finger with fprintd-enroll makes the item unusable. And the documented limit: fprintd exposes
    /// no template identity, so deleting a finger and enrolling ANOTHER finger under the same name
    /// keeps the domain state (the item then opens with the new finger).
    @Test func theDomainStateFollowsFprintdsFingerListAndItsLimit() throws {
        let (bus, agent) = try Self.setUp()
        BiometryTests.add(agent, "vault", "biometry-current-set")
        let first = Self.domainState(agent)
        #expect(first.count == "domain-state: ".count + 64 && !first.hasSuffix(String(repeating: "0", count: 64)), "\(first)")
        // Re-enrolment under the same name, with a different finger (finger-C): the same domain state.
        #expect(bus.delete(Self.finger))
        #expect(Self.domainState(agent).hasSuffix(String(repeating: "0", count: 64)), "nothing enrolled: all zero")
        try bus.enroll(Self.finger, sample: "finger-C")
        #expect(Self.domainState(agent) == first)
        var seen = 0
        let t = Self.opened(bus, agent, "vault", by: "SCAN finger-C", seen: &seen)
        #expect(t.status == 0 && t.output.contains("secret of vault"), "the limit: \(t)")
        // Another finger enrolled: the set changed, the item is refused at once, without a prompt.
        try bus.enroll("left-index-finger", sample: "finger-D")
        #expect(Self.domainState(agent) != first)
        let refused = BiometryTests.get(agent, "vault").wait()
        #expect(refused.status == 5 && !refused.prompted && !refused.output.contains("secret of vault"), "\(refused)")
    }

    @Test func aRetryScanIsFeedbackNotAFailure() throws {
        let (bus, agent) = try Self.setUp()
        BiometryTests.add(agent, "bank", "biometry-any")
        var seen = 0
        let pending = BiometryTests.get(agent, "bank")
        #expect(Self.scan(bus, agent, "RETRY 0", after: &seen))
        #expect(bus.scan("RETRY 1"))
        #expect(bus.scan("SCAN finger-A"))
        let t = pending.wait()
        // fprintd's retry reports reach the person; the evaluation went on and matched.
        #expect(t.status == 0 && t.output.contains("secret of bank") && t.output.contains("Swipe your finger again")
                && t.output.contains("Swipe too short, try again") && !t.output.contains("No match"), "\(t)")
        #expect(seen == 1 && Self.verifications(agent) == 1, "one evaluation took all three scans")
    }

    @Test func aReaderClaimedByAnotherProgramIsNotAvailableWithoutHanging() throws {
        let (bus, agent) = try Self.setUp()
        BiometryTests.add(agent, "bank", "biometry-any")
        try bus.holdClaim()
        let start = Date()
        let t = BiometryTests.get(agent, "bank", prompt: "no prompt expected").wait()
        let elapsed = Date().timeIntervalSince(start)
        #expect(t.status != 0 && !t.output.contains("secret of bank") && elapsed < 10, "\(t) after \(elapsed) s")
        #expect(Self.plugLog(agent).contains("AlreadyInUse"), "\(Self.plugLog(agent))")
        #expect(Self.verifications(agent) == 0)
        // Once the other program lets go, the reader serves again.
        bus.releaseClaim()
        var seen = 0
        let again = Self.opened(bus, agent, "bank", by: "SCAN finger-A", seen: &seen)
        #expect(again.status == 0 && again.output.contains("secret of bank"), "\(again)")
    }

    @Test func fprintdStoppingMidEvaluationFailsOnlyThatEvaluation() throws {
        let (bus, agent) = try Self.setUp()
        BiometryTests.add(agent, "bank", "biometry-any")
        var seen = 0
        let pending = BiometryTests.get(agent, "bank", prompt: "no prompt expected")
        #expect(FprintdBus.wait(until: { Self.verifications(agent) > 0 }))
        bus.stopFprintd()
        let t = pending.wait()
        #expect(t.status != 0 && !t.output.contains("secret of bank"), "\(t)")
        let log = Self.plugLog(agent, containing: "fprintd left the bus")
        #expect(log.contains("fprintd left the bus"), "\(log)\nfprintd log:\n\(bus.read("fprintd.log").suffix(4000))")
        // The agent keeps serving; without fprintd, biometry is refused at once.
        #expect(agent.cli(["status"]).status == 0)
        let start = Date()
        let refused = BiometryTests.get(agent, "bank", prompt: "no prompt expected").wait()
        #expect(refused.status != 0 && Date().timeIntervalSince(start) < 10, "\(refused)")
        // fprintd back: the enrolled finger (its own store) opens the item again.
        try bus.startFprintd()
        seen = Self.verifications(agent)
        let again = Self.opened(bus, agent, "bank", by: "SCAN finger-A", seen: &seen)
        #expect(again.status == 0 && again.output.contains("secret of bank"), "\(again)\n\(Self.plugLog(agent))")
    }
}
