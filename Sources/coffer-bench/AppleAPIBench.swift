import CofferClient
import CofferKeychain
import CofferModel
import CofferSystem
import Foundation
import Glibc
import Security

/// What Apple's API costs over the native client (issue #46): SecItemCopyMatching of one item (by service and
/// account, returning its data) on a warm process against the native client's own COPY_MATCHING on a persistent
/// connection, alternating in blocks, at each keychain size; and the first call of a process (connect, HELLO, the
/// agent identifying the caller, the search), each in a fresh process of this binary, reported separately.
struct AppleAPIBench {
    let binDir: String
    let sizes: [Int]

    var tools: AgentBench { AgentBench(binDir: binDir, sizes: []) }

    func run() throws {
        print("| items | SecItemCopyMatching median (µs) | p99 (µs) | native copyMatching median (µs) | p99 (µs) | ratio (median) | first SecItemCopyMatching of a process, median (µs) | first native call of a process, median (µs) |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n in sizes { try measure(items: n) }
        print()
        print("Target: the warm ratio within 1.2×. The first call includes connecting, HELLO and the agent identifying the process.")
    }

    /// An agent in a new temporary directory whose keychain holds `items` items, started and unlocked; the caller
    /// stops it and removes the directory (``stop(_:)``).
    func startFilledAgent(items: Int) throws -> AgentBench.AgentDirectory {
        let agent = AgentBench.AgentDirectory(path: makeTempDir())
        try tools.writePAMStack(agent.pam, passdb: agent.path + "/passdb")
        progress("apple-api bench: filling \(items) items")
        try Files.makePrivateDirectory(agent.state)
        do {
            let kc = try Keychain(directory: agent.state, lockingStateDirectory: true)
            try kc.setPasscode(current: nil, new: secret(AgentBench.passcode))
            var i = 0
            while i < items {
                try kc.add(contentsOf: (i..<min(items, i + 5000)).map(Self.item), scope: .unrestricted)
                i += 5000
            }
            kc.checkpoint()
        }
        sync()
        try tools.startAgent(agent)
        try AgentConnection(path: agent.socket).unlock(passcode: secret(AgentBench.passcode))
        return agent
    }

    func stop(_ agent: AgentBench.AgentDirectory) {
        _ = system("pkill -TERM -f -- '--state-dir \(agent.state)'; rm -rf '\(agent.path)'")
    }

    func measure(items: Int) throws {
        let agent = try startFilledAgent(items: items)
        defer { stop(agent) }
        let native = try AgentConnection(path: agent.socket)
        AgentSession.socket = agent.socket

        // Warm: both paths connected and used once, then alternating blocks of 100 random lookups.
        var rng = SystemRandomNumberGenerator()
        var apple: [UInt64] = [], plain: [UInt64] = []
        for block in 0..<110 {
            for useApple in [true, false] {
                for _ in 0..<100 {
                    let k = Int.random(in: 0..<items, using: &rng)
                    let t0 = nowNanos()
                    if useApple {
                        let result = Self.appleLookup(k)
                        let dt = nowNanos() - t0
                        precondition(result is Data, "SecItemCopyMatching: no Data")
                        if block >= 10 { apple.append(dt) }
                    } else {
                        let r = try native.copyMatching(Self.query(k))
                        let dt = nowNanos() - t0
                        precondition(r.count == 1 && r[0].data != nil)
                        if block >= 10 { plain.append(dt) }
                    }
                }
            }
        }

        // The first call of a process: this binary run afresh, once per sample.
        var firstApple: [UInt64] = [], firstNative: [UInt64] = []
        let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        for i in 0..<30 {
            for mode in ["apple", "native"] {
                guard let ns = probe(me, mode: mode, socket: agent.socket, key: i) else { throw SecError(.io, "apple-api probe \(mode) failed") }
                if mode == "apple" { firstApple.append(ns) } else { firstNative.append(ns) }
            }
        }
        let a = percentile(apple, 0.5), p = percentile(plain, 0.5)
        print("| \(grouped(items)) | \(fixed(a, 1)) | \(fixed(percentile(apple, 0.99), 1)) | \(fixed(p, 1)) | \(fixed(percentile(plain, 0.99), 1)) "
              + "| \(fixed(a / p, 2))× | \(fixed(percentile(firstApple, 0.5), 0)) | \(fixed(percentile(firstNative, 0.5), 0)) |")
    }

    /// Runs `coffer-bench apple-api-probe MODE SOCKET KEY` and reads the nanoseconds it prints.
    func probe(_ me: String, mode: String, socket: String, key: Int) -> UInt64? {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: me)
        p.arguments = ["apple-api-probe", mode, socket, String(key)]
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        guard (try? p.run()) != nil else { return nil }
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        guard p.terminationStatus == 0 else { return nil }
        return UInt64(String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// One SecItemCopyMatching as Apple code writes it: the query built, bridged, searched; its result.
    @inline(__always)
    static func appleLookup(_ k: Int) -> CFTypeRef? {
        let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword,
                                    kSecAttrService as String: "service-\(k % 97)", kSecAttrAccount as String: "account-\(k)",
                                    kSecReturnData as String: true]
        var result: CFTypeRef?
        let status = SecItemCopyMatching(query as CFDictionary, &result)
        precondition(status == errSecSuccess, "SecItemCopyMatching: \(status)")
        return result
    }

    static func item(_ i: Int) -> NewItem {
        NewItem(itemClass: .genericPassword,
                attributes: ["svce": .string("service-\(i % 97)"), "acct": .string("account-\(i)"), "agrp": .string("unsigned")],
                secret: secret("password-\(i)"))
    }

    static func query(_ k: Int) -> ItemQuery {
        ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("service-\(k % 97)"), "acct": .string("account-\(k)")],
                  returnData: true)
    }
}

/// `coffer-bench apple-api-probe apple|native SOCKET KEY`: the first lookup of this process, timed from before the
/// connection exists; prints its nanoseconds.
func appleAPIProbe(mode: String, socket: String, key k: Int) throws {
    let t0: UInt64
    if mode == "apple" {
        AgentSession.socket = socket
        let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "service-\(k % 97)",
                                    kSecAttrAccount as String: "account-\(k)", kSecReturnData as String: true]
        var result: CFTypeRef?
        t0 = nowNanos()
        guard SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess else { throw SecError(.itemNotFound, "probe") }
    } else {
        t0 = nowNanos()
        guard try AgentConnection(path: socket).copyMatching(AppleAPIBench.query(k)).count == 1 else { throw SecError(.itemNotFound, "probe") }
    }
    print(nowNanos() - t0)
}

/// `coffer-bench apple-api-agent BIN_DIR ITEMS`: an agent with ITEMS items, started and unlocked; prints its socket
/// and serves until standard input ends (for ``appleAPILoop(mode:socket:items:count:)`` under callgrind).
func appleAPIAgent(binDir: String, items: Int) throws {
    let bench = AppleAPIBench(binDir: binDir, sizes: [])
    let agent = try bench.startFilledAgent(items: items)
    defer { bench.stop(agent) }
    StandardStreams.print(agent.socket)
    _ = FileHandle.standardInput.readDataToEndOfFile()
}

/// `coffer-bench apple-api-loop apple|native|native-sync SOCKET ITEMS N`: N lookups of one path on a warm connection
/// (the same keys for each) inside ``appleAPILookups(_:items:count:)``, the function callgrind counts (on a copy
/// stripped with `strip -g`: valgrind 3.19 reads no DWARF 5):
///   valgrind --tool=callgrind --toggle-collect='*appleAPILookups*' coffer-bench apple-api-loop apple SOCKET 1000 2000
/// The client's instructions per call repeat within about 1% (the reply wait spins a little) where the wall clock
/// on a shared machine does not; the agent's are the same for `apple` and `native-sync` (Apple's search adds
/// `sync = false`). Prints the wall clock and this process's CPU time per call too.
func appleAPILoop(mode: String, socket: String, items: Int, count: Int) throws {
    AgentSession.socket = socket
    AppleAPIBench.native = try AgentConnection(path: socket)
    guard let path = AppleAPILoopPath(rawValue: mode) else { throw SecError(.param, "apple-api-loop: apple, native or native-sync") }
    appleAPILookups(path, items: items, count: 100)
    var r0 = rusage(), r1 = rusage()
    getrusage(RUSAGE_SELF.rawValue, &r0)
    let t0 = nowNanos()
    appleAPILookups(path, items: items, count: count)
    let t1 = nowNanos()
    getrusage(RUSAGE_SELF.rawValue, &r1)
    func micros(_ t: timeval) -> Double { Double(t.tv_sec) * 1e6 + Double(t.tv_usec) }
    let cpu = micros(r1.ru_utime) + micros(r1.ru_stime) - micros(r0.ru_utime) - micros(r0.ru_stime)
    let n = Double(max(count, 1))
    print("\(mode): \(count) lookups, \(fixed(Double(t1 - t0) / n / 1000, 1)) µs each, this process's CPU \(fixed(cpu / n, 1)) µs each")
}

/// What ``appleAPILookups(_:items:count:)`` calls: SecItemCopyMatching, the native call, or the native call with
/// the `sync = false` a search through Apple's API adds (the agent's share of the difference).
enum AppleAPILoopPath: String {
    case apple, native, nativeSync = "native-sync"
}

@inline(never)
func appleAPILookups(_ path: AppleAPILoopPath, items: Int, count: Int) {
    for i in 0..<count {
        let k = (i &* 7919) % items
        switch path {
        case .apple:
            precondition(AppleAPIBench.appleLookup(k) is NSData)
        case .native:
            precondition((try? AppleAPIBench.native!.copyMatching(AppleAPIBench.query(k)))?.first?.data != nil)
        case .nativeSync:
            var q = AppleAPIBench.query(k)
            q.attributes["sync"] = .bool(false)
            precondition((try? AppleAPIBench.native!.copyMatching(q))?.first?.data != nil)
        }
    }
}

extension AppleAPIBench {
    /// The native connection of ``appleAPILoop(mode:socket:items:count:)``.
    nonisolated(unsafe) static var native: AgentConnection?
}

/// `coffer-bench apple-api-unlock SOCKET`: unlocks the agent `apple-api-agent` made (restarted under a profiler).
func appleAPIUnlock(socket: String) throws {
    try AgentConnection(path: socket).unlock(passcode: secret(AgentBench.passcode))
}
