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

    func measure(items: Int) throws {
        let agent = AgentBench.AgentDirectory(path: makeTempDir())
        defer { _ = system("pkill -TERM -f -- '--state-dir \(agent.state)'; rm -rf '\(agent.path)'") }
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
        let native = try AgentConnection(path: agent.socket)
        try native.unlock(passcode: secret(AgentBench.passcode))
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
                        let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword,
                                                    kSecAttrService as String: "service-\(k % 97)", kSecAttrAccount as String: "account-\(k)",
                                                    kSecReturnData as String: true]
                        var result: CFTypeRef?
                        let status = SecItemCopyMatching(query as CFDictionary, &result)
                        let dt = nowNanos() - t0
                        precondition(status == errSecSuccess && result is Data, "SecItemCopyMatching: \(status)")
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
