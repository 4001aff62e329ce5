import CofferClient
import CofferKeychain
import CofferModel
import CofferSystem
import Glibc

/// Where the time of a new connection goes (issue #25): what `coffer get` and every git credential
/// fill pay before their one request. Measured from the client, each stage against a floor that has
/// everything before it and nothing of it, alternating in blocks so machine noise falls on all alike:
///
/// - accept: a bare Unix-socket server answering a 9-byte frame on its accepting thread (connect +
///   round trip + close), against the same round trip on a persistent connection;
/// - thread: the same server answering each connection on a thread of its own, as the agent does;
/// - identity: connect + HELLO round trip to an agent that identifies callers (pidfd, /proc/PID,
///   the executable's hash from the cache, manifests), against one with `identify-callers = no`;
/// - HELLO: the agent without identification against the threaded floor (admission, the session,
///   the frame parser, HELLO itself);
/// - the GET on the new connection against a GET on a persistent one (a new connection's first
///   request pays cold caches: the thread's malloc arena, the statement, the index pages).
struct ConnectionBench {
    let binDir: String
    static let items = 1000
    var tools: AgentBench { AgentBench(binDir: binDir, sizes: []) }
    var identity: IdentityBench { IdentityBench(binDir: binDir) }

    func run() throws {
        let root = try identity.canonical(makeTempDir())
        defer { _ = system("rm -rf '\(root)'") }
        let identified = IdentityBench.Agent(path: root + "/identified"), plain = IdentityBench.Agent(path: root + "/plain")
        for (agent, extra) in [(identified, ""), (plain, "identify-callers = no\n")] {
            guard mkdir(agent.path, 0o700) == 0, mkdir(agent.state, 0o700) == 0 else { throw SecError(.io, "mkdir \(agent.path)") }
            try tools.writeFile(agent.config, "standard-trust-dirs = no\n" + extra)
            try identity.fill(agent.state)
        }
        sync()
        identity.waitUntilSettled(try identity.canonical("/proc/self/exe"))
        var started: [IdentityBench.Agent] = []
        defer { for a in started { identity.stop(a) } }
        for a in [identified, plain] {
            try identity.start(a)
            started.append(a)
        }
        let inline = try EchoServer(path: root + "/echo-inline.sock", threadPerConnection: false)
        let threaded = try EchoServer(path: root + "/echo-threaded.sock", threadPerConnection: true)

        progress("connection bench: new connections")
        var s = Samples()
        let persistent = try UnixSocket.connect(path: threaded.path)
        defer { close(persistent) }
        let agentConnections = try [identified, plain].map { try AgentConnection(path: $0.socket) }
        var rng = SystemRandomNumberGenerator()
        for block in 0..<44 {
            let keep = block >= 4
            for _ in 0..<50 {
                try s.add(\.echoPersistent, keep) { try EchoServer.roundTrip(persistent) }
                try s.add(\.echoInline, keep) { try inline.connectRoundTripClose() }
                try s.add(\.echoThreaded, keep) { try threaded.connectRoundTripClose() }
            }
            for (i, a) in [identified, plain].enumerated() {
                for _ in 0..<50 {
                    let q = identity.query(Int.random(in: 0..<Self.items, using: &rng))
                    var t = nowNanos()
                    let c = try AgentConnection(path: a.socket)                       // connect + HELLO round trip
                    let hello = nowNanos() - t
                    t = nowNanos()
                    let r = try c.copyMatching(q)                                     // the first GET
                    let get = nowNanos() - t
                    precondition(r.count == 1 && r[0].data != nil)
                    t = nowNanos()
                    let r2 = try agentConnections[i].copyMatching(q)                  // a GET on a persistent connection
                    let warm = nowNanos() - t
                    precondition(r2.count == 1)
                    guard keep else { continue }
                    if i == 0 {
                        s.helloIdentified.append(hello); s.firstGetIdentified.append(get); s.warmGetIdentified.append(warm)
                    } else {
                        s.helloPlain.append(hello); s.firstGetPlain.append(get); s.warmGetPlain.append(warm)
                    }
                }
            }
        }
        inline.stop()
        threaded.stop()
        s.print(tools: tools)
    }

    struct Samples {
        var echoPersistent: [UInt64] = [], echoInline: [UInt64] = [], echoThreaded: [UInt64] = []
        var helloIdentified: [UInt64] = [], helloPlain: [UInt64] = []
        var firstGetIdentified: [UInt64] = [], firstGetPlain: [UInt64] = []
        var warmGetIdentified: [UInt64] = [], warmGetPlain: [UInt64] = []

        mutating func add(_ key: WritableKeyPath<Samples, [UInt64]>, _ keep: Bool, _ body: () throws -> Void) rethrows {
            let t = nowNanos()
            try body()
            if keep { self[keyPath: key].append(nowNanos() - t) }
        }

        func print(tools: AgentBench) {
            let m = { (xs: [UInt64]) in percentile(xs, 0.5) }
            // (The persistent round trip is to the threaded server: the inline one answers one frame.)
            let stages: [(String, Double, String)] = [
                ("accept (+ connect, close)", m(echoInline) - m(echoPersistent),
                 "bare server answering on its accepting thread − the same round trip on a persistent connection"),
                ("a thread per connection", m(echoThreaded) - m(echoInline), "bare server answering on a new thread − on the accepting thread"),
                ("admission, session, HELLO", m(helloPlain) - m(echoThreaded),
                 "connect + HELLO to the agent with `identify-callers = no` − the threaded bare server"),
                ("caller identity", m(helloIdentified) - m(helloPlain),
                 "connect + HELLO, agent identifying callers − not identifying"),
                ("the first GET's extra cost", m(firstGetIdentified) - m(warmGetIdentified),
                 "first GET on the new connection − a GET on a persistent one"),
            ]
            Swift.print("| stage of a new connection | median | how it is measured |")
            Swift.print("|---|---:|---|")
            for (label, v, how) in stages { Swift.print("| \(label) | \(signed(v, tools)) | \(how) |") }
            Swift.print("| **connect + HELLO, agent identifying callers** | \(tools.us(m(helloIdentified))) | p99 \(tools.us(percentile(helloIdentified, 0.99))) |")
            Swift.print("| GET, new connection / persistent (identifying agent) | \(tools.us(m(firstGetIdentified))) / \(tools.us(m(warmGetIdentified))) | |")
            Swift.print("| GET, new connection / persistent (`identify-callers = no`) | \(tools.us(m(firstGetPlain))) / \(tools.us(m(warmGetPlain))) | |")
            Swift.print("| floors: echo persistent / new connection inline / new connection on a thread | \(tools.us(m(echoPersistent))) / \(tools.us(m(echoInline))) / \(tools.us(m(echoThreaded))) | |")
            Swift.print()
            Swift.print("(\(echoPersistent.count) samples of each, taken in alternating blocks; each stage is a difference of medians.)")
        }

        func signed(_ x: Double, _ tools: AgentBench) -> String { (x >= 0 ? "+" : "−") + tools.us(abs(x)) }
    }
}

/// A bare Unix-socket server: answers a connection's 9-byte frames with themselves, on a new thread
/// per connection (until the peer closes), or on the accepting thread (one frame, then close).
final class EchoServer: @unchecked Sendable {
    let path: String
    private let listener: Int32

    init(path: String, threadPerConnection: Bool) throws {
        self.path = path
        listener = try UnixSocket.listen(path: path)
        let listener = listener
        Threads.detach {
            while let fd = try? UnixSocket.accept(listener) {
                if threadPerConnection {
                    if !Threads.detach({ Self.serve(fd) }) { close(fd) }
                } else {
                    Self.serve(fd, once: true)
                }
            }
        }
    }

    /// Echoes frames until the peer closes (`once`: one frame, so the accepting thread is free again).
    static func serve(_ fd: Int32, once: Bool = false) {
        var buf = [UInt8](repeating: 0, count: 9)
        while buf.withUnsafeMutableBytes({ UnixSocket.readExactly(fd, into: $0) }) {
            guard buf.withUnsafeBytes({ UnixSocket.writeAll(fd, $0) }), !once else { break }
        }
        close(fd)
    }

    static func roundTrip(_ fd: Int32) throws {
        var frame: [UInt8] = [0, 0, 0, 5, 0x02, 0, 0, 0, 1]
        guard frame.withUnsafeBytes({ UnixSocket.writeAll(fd, $0) }),
              frame.withUnsafeMutableBytes({ UnixSocket.readExactly(fd, into: $0) }) else { throw SecError(.io, "echo failed") }
    }

    func connectRoundTripClose() throws {
        let fd = try UnixSocket.connect(path: path)
        defer { close(fd) }
        try Self.roundTrip(fd)
    }

    func stop() {
        Glibc.shutdown(listener, Int32(SHUT_RDWR))
        unlink(path)
    }
}
