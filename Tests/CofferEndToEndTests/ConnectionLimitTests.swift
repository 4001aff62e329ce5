import CofferClient
import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// What one client can take from the others: connections, time, locked memory, the lock path, the log.
@Suite struct ConnectionLimitTests {
    /// An agent started with `config` (a `--config` file) and the harness's usual arguments.
    static func agent(config: String, extraArguments: [String] = [], launcher: [String] = []) throws -> AgentProcess {
        let dir = TemporaryDirectory("coffer-limits")
        let file = dir.file("cofferd.conf")
        try config.write(toFile: file, atomically: true, encoding: .utf8)
        let agent = try AgentProcess(extraArguments: ["--config", file] + extraArguments, launcher: launcher)
        // The harness's start-up probe is a connection of this process too: let the agent drop it.
        usleep(300_000)
        return agent
    }

    /// A raw connection that said HELLO and got its reply.
    static func greeted(_ path: String) throws -> Int32 {
        let fd = try UnixSocket.connect(path: path)
        // Generous: the agent identifies this process first, hashing the test binary (hundreds of MiB
        // under a sanitizer, on a loaded machine) before the HELLO reply.
        UnixSocket.setTimeouts(fd, send: 60, receive: 60)
        let hello = AgentRequest.hello(minVersion: 1, maxVersion: 1, clientName: "limits").encodeFrame(requestID: 1)
        guard hello.withUnsafeBytes({ UnixSocket.writeAll(fd, $0) }), readFrame(fd) != nil else {
            close(fd)
            throw SecError(.io, "no HELLO reply")
        }
        return fd
    }

    /// `count` greeted connections, once the agent has let go of the start-up check's connection (a
    /// loaded machine may still count it for a moment: a refused one is then tried again).
    static func holding(_ count: Int, _ path: String) throws -> [Int32] {
        var held: [Int32] = []
        let deadline = now() + 60
        while held.count < count {
            if let fd = try? greeted(path) { held.append(fd); continue }
            guard now() < deadline else {
                for fd in held { close(fd) }
                throw SecError(.io, "the agent never served \(count) connections at once")
            }
            usleep(100_000)
        }
        return held
    }

    /// One frame's bytes (header included), or nil if the agent closed or went quiet.
    static func readFrame(_ fd: Int32) -> [UInt8]? {
        var header = [UInt8](repeating: 0, count: 4)
        guard header.withUnsafeMutableBytes({ UnixSocket.readExactly(fd, into: $0) }) else { return nil }
        var body = [UInt8](repeating: 0, count: Int(header[0]) << 24 | Int(header[1]) << 16 | Int(header[2]) << 8 | Int(header[3]))
        guard body.withUnsafeMutableBytes({ UnixSocket.readExactly(fd, into: $0) }) else { return nil }
        return header + body
    }

    /// True if the agent closes `fd` (end of file) within `seconds`, with nothing sent before.
    static func closedByAgent(_ fd: Int32, within seconds: Double) -> Bool {
        UnixSocket.setTimeouts(fd, send: 5, receive: seconds)
        var byte: UInt8 = 0
        let n = recv(fd, &byte, 1, 0)
        return n == 0 || (n < 0 && errno == ECONNRESET)
    }

    static func now() -> Double { Threads.monotonicSeconds() }

    // MARK: Frames

    /// A client that starts a maximal frame and drips a byte every 0.3 s held its locked-memory
    /// budget for as long as it kept dripping (the timeout was per read). The frame now has a
    /// deadline from its first byte; once it is cut, another client's large frame is served.
    @Test func aDrippingFrameIsCutAtItsDeadlineAndAnotherLargeFrameIsServed() throws {
        // One maximal frame of budget: the dripper takes all of it.
        let limit = 1 << 20
        let agent = try Self.agent(config: "frame-deadline = 1.5\n",
                                   launcher: ["/usr/bin/prlimit", "--memlock=\(limit):\(limit)", "--"])
        let path = agent.socketPath
        let fd = try Self.greeted(path)
        defer { close(fd) }
        let length = UInt32(WireFormat.maximumBodyBytes)
        let start: [UInt8] = [UInt8(length >> 24), UInt8(length >> 16 & 0xff), UInt8(length >> 8 & 0xff), UInt8(length & 0xff), 0x06]
        let t0 = Self.now()
        #expect(start.withUnsafeBytes { UnixSocket.writeAll(fd, $0) })
        let cutAfter = Locked<Double?>(nil)
        let dripper = Thread {
            while Self.now() - t0 < 15 {
                usleep(300_000)
                var b: UInt8 = 0x41
                if send(fd, &b, 1, Int32(MSG_NOSIGNAL)) != 1 { break }
                let n = recv(fd, &b, 1, Int32(MSG_DONTWAIT))
                if n == 0 || (n < 0 && errno != EAGAIN) { break }
            }
            cutAfter.mutate { $0 = Self.now() - t0 }
        }
        dripper.start()
        usleep(200_000)
        // Another client's large frame waits for the budget, and gets it once the dripper is cut.
        let big = String(repeating: "b", count: 160 << 10)
        let t1 = Self.now()
        let added = status { try AgentConnection(path: path).add(newPassword("big", "one", big)) }
        let addTook = Self.now() - t1
        #expect(added == nil, "the large frame was not served: \(String(describing: added))\n\(agent.log)")
        #expect(addTook < 30, "the large frame waited \(addTook) s")   // a failure bound: the defect waits for good
        while dripper.isExecuting { usleep(10_000) }
        let cut = cutAfter.value ?? 99
        #expect(cut > 1.0 && cut < 12, "the dripping client was cut after \(cut) s (deadline 1.5 s; it drips for 15 s if never cut)")
        #expect(agent.log.contains("frame did not arrive within 1.5 s"), "\(agent.log)")
        #expect(text(try AgentConnection(path: path).copyMatching(password("big", "one")).first?.data)?.count == big.count)
    }

    // MARK: Connections

    @Test func aConnectionThatNeverSaysHelloIsClosed() throws {
        let agent = try Self.agent(config: "hello-timeout = 0.5\n")
        let fd = try UnixSocket.connect(path: agent.socketPath)
        defer { close(fd) }
        let t0 = Self.now()
        // 60 s is a failure bound, not the expected time: the defect this catches keeps the connection
        // open for good, and a loaded machine (stress-ng beside three test processes) once took over 4 s
        // to run the agent's timer. What is asserted is the order: not before the timeout, and because of it.
        #expect(Self.closedByAgent(fd, within: 60), "a connection without HELLO was kept open")
        let took = Self.now() - t0
        #expect(took > 0.3, "closed after \(took) s, before the timeout (0.5 s)")
        #expect(agent.log.contains("sent no HELLO within 0.5 s"), "\(agent.log)")
        // A greeted client may stay idle.
        let c = try AgentConnection(path: agent.socketPath)
        Thread.sleep(forTimeInterval: 1.2)
        #expect(try c.status().agentVersion.isEmpty == false)
    }

    @Test func oneProcessCannotTakeEveryConnection() throws {
        let agent = try Self.agent(config: "max-connections-per-process = 3\n")
        let path = agent.socketPath
        var held = try Self.holding(3, path)
        defer { for fd in held { close(fd) } }
        // The fourth connection of this process is closed unanswered.
        let fourth = try UnixSocket.connect(path: path)
        defer { close(fourth) }
        let hello = AgentRequest.hello(minVersion: 1, maxVersion: 1, clientName: "limits").encodeFrame(requestID: 1)
        _ = hello.withUnsafeBytes { UnixSocket.writeAll(fourth, $0) }
        #expect(Self.closedByAgent(fourth, within: 3), "a fourth connection of one process was served")
        #expect(agent.log.contains("process already has 3 connections"), "\(agent.log)")
        // Other processes are still served, fast path and full CLI.
        #expect(agent.cli(["status"]).status == 0)
        #expect(agent.cli(["get", "--service", "none", "--account", "none"]).status == SecStatus.itemNotFound.exitCode)
        // A freed slot can be used again.
        close(held.removeFirst())
        usleep(300_000)
        held.append(try Self.greeted(path))
    }

    @Test func refusedConnectionsWriteABoundedNumberOfLogLines() throws {
        let agent = try Self.agent(config: "max-connections = 2\nlog-repeat-interval = 1\n")
        let path = agent.socketPath
        let held = try Self.holding(2, path)
        defer { for fd in held { close(fd) } }
        let t0 = Self.now()
        var refused = 0
        for _ in 0..<1000 {
            guard let fd = try? UnixSocket.connect(path: path) else { continue }
            if Self.closedByAgent(fd, within: 3) { refused += 1 }
            close(fd)
        }
        // One more after the interval: its line tells how many were left out.
        Thread.sleep(forTimeInterval: 1.1)
        if let fd = try? UnixSocket.connect(path: path) {
            if Self.closedByAgent(fd, within: 3) { refused += 1 }
            close(fd)
        }
        let took = Self.now() - t0
        #expect(refused == 1001)
        let lines = agent.log.split(separator: "\n").filter { $0.contains("too many connections") }
        #expect(lines.count >= 2 && lines.count <= 2 + Int(took), "\(lines.count) log lines for 1001 refusals in \(took) s")
        #expect(lines.last?.contains("suppressed") == true, "\(lines.last ?? "")")
    }

    // MARK: The lock path

    /// A subscriber that stopped reading while a large reply is being written to it held that
    /// connection's write lock, and the lock event waited on it (up to the 10 s send timeout), so
    /// `coffer lock` by another client waited too.
    @Test func aSubscriberThatStoppedReadingDoesNotDelayALock() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        let path = agent.socketPath
        let c = try AgentConnection(path: path)
        let big = String(repeating: "r", count: 160 << 10)
        try c.add(newPassword("big", "one", big))
        let fd = try Self.greeted(path)
        defer { close(fd) }
        var frames = AgentRequest.subscribe.encodeFrame(requestID: 2)
        for i in 0..<6 { frames += AgentRequest.copyMatching(password("big", "one")).encodeFrame(requestID: UInt32(3 + i)) }
        #expect(frames.withUnsafeBytes { UnixSocket.writeAll(fd, $0) })
        // The agent now sits in a reply write to a socket nobody reads.
        Thread.sleep(forTimeInterval: 0.8)
        let t0 = Self.now()
        try c.lock()
        let lockTook = Self.now() - t0
        // Room for a loaded machine, still under the 10 s send timeout the old code waited out.
        #expect(lockTook < 8, "coffer lock took \(lockTook) s behind a subscriber that stopped reading")
        let t1 = Self.now()
        #expect(try AgentConnection(path: path).status().lockState == .locked)
        #expect(Self.now() - t1 < 5)
    }

    @Test func statusPollingDoesNotKeepTheKeysUnlocked() throws {
        let agent = try AgentProcess(extraArguments: ["--idle-lock", "1", "--lock-grace", "0"])
        agent.setPasscode()
        let c = try AgentConnection(path: agent.socketPath)
        // STATUS every 0.2 s, on this connection and on a new one, from the passcode set on: the idle lock
        // (1 s) must still come. Not a duration: a busy machine may fire the timer late, so the polling goes on
        // until the lock (60 s is the failure bound), and a poll that kept the keys unlocked would never see it.
        let end = Self.now() + 60
        var locked = false
        var polls = 0
        while !locked && Self.now() < end {
            locked = try c.status().lockState == .locked
            _ = try AgentConnection(path: agent.socketPath).status()
            polls += 1
            if !locked { usleep(200_000) }
        }
        #expect(locked, "polling STATUS kept the keys unlocked (\(polls) polls in 60 s)")
    }
}
