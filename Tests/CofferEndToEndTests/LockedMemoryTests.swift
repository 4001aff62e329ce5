import CofferClient
import CofferCrypto
import CofferModel
import CofferSystem
import Foundation
import CofferTestSupport
import Testing

/// The agent keeps the memory it locks within RLIMIT_MEMLOCK, even under a load of large frames,
/// and even as root (whose CAP_IPC_LOCK would let it lock more: the agent budgets for itself).
@Suite struct LockedMemoryTests {
    /// A field of /proc/PID/status in KiB (VmLck, VmRSS, …).
    static func statusKiB(_ pid: Int32, _ field: String) -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix(field + ":") {
            return Int(line.dropFirst(field.count + 1).filter(\.isNumber))
        }
        return nil
    }

    /// The soft RLIMIT_MEMLOCK of `pid` in bytes, from /proc/PID/limits (nil: unlimited or unreadable).
    static func memlockLimit(_ pid: Int32) -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/limits", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("Max locked memory") {
            let fields = line.dropFirst("Max locked memory".count).split(separator: " ")
            return fields.first.flatMap { Int($0) }
        }
        return nil
    }

    /// True when this test runner (and so the agent of the same build) runs under ASan or TSan.
    static let underSanitizer: Bool = {
        let me = dlopen(nil, RTLD_NOW)
        return dlsym(me, "__asan_init") != nil || dlsym(me, "__tsan_init") != nil
    }()

    @Test func lockedMemoryStaysWithinRLIMIT_MEMLOCKUnderLargeFrames() throws {
        let limit = 1 << 20
        let agent = try AgentProcess(launcher: ["/usr/bin/prlimit", "--memlock=\(limit):\(limit)", "--"])
        agent.setPasscode()
        #expect(Self.memlockLimit(agent.pid) == limit, "prlimit did not apply to the agent")

        // Sample the agent's locked memory every millisecond while the load runs.
        let sampling = Flag()
        let peak = Peak()
        Threads.detach {
            while !sampling.isSet {
                if let kib = Self.statusKiB(agent.pid, "VmLck") { peak.note(kib * 1024) }
                usleep(1000)
            }
        }
        // 16 clients each add 160 KiB secrets (frames of ~160 KiB: 16 at once would need over
        // 2.5 MiB of locked memory), while 4 others keep reading a small item.
        try AgentConnection(path: agent.socketPath).add(newPassword("small", "one", "tiny"))
        let failures = Tally()
        let group = DispatchGroup()
        let big = String(repeating: "s", count: 160 << 10)
        for t in 0..<20 {
            group.enter()
            Threads.detach {
                defer { group.leave() }
                guard let c = try? AgentConnection(path: agent.socketPath) else { failures.add(1); return }
                for i in 0..<6 {
                    do {
                        if t < 16 {
                            try c.add(newPassword("big", "t\(t)-\(i)", big))
                        } else {
                            #expect(text(try c.copyMatching(password("small", "one")).first?.data) == "tiny")
                        }
                    } catch {
                        failures.add(1)
                    }
                }
            }
        }
        group.wait()
        sampling.set()
        #expect(failures.value == 0)
        let c = try AgentConnection(path: agent.socketPath)
        #expect(try c.status().itemCount == 1 + 16 * 6)
        #expect(text(try c.copyMatching(password("big", "t3-5")).first?.data) == big)
        // The sanitizers' runtimes turn mlock into a no-op (an interceptor): then nothing is locked at all.
        if !Self.underSanitizer { #expect(peak.value > 0, "VmLck was never read") }
        #expect(peak.value <= limit, "the agent locked \(peak.value) bytes, over its RLIMIT_MEMLOCK of \(limit)")
    }
}

/// A flag set once, read from another thread.
final class Flag: @unchecked Sendable {
    private let lock = PThreadMutex()
    private var value = false
    func set() { lock.withLock { value = true } }
    var isSet: Bool { lock.withLock { value } }
}

/// The largest value noted from any thread.
final class Peak: @unchecked Sendable {
    private let lock = PThreadMutex()
    private var max = 0
    func note(_ v: Int) { lock.withLock { if v > max { max = v } } }
    var value: Int { lock.withLock { max } }
}

/// A count added to from many threads.
final class Tally: @unchecked Sendable {
    private let lock = PThreadMutex()
    private var n = 0
    func add(_ k: Int) { lock.withLock { n += k } }
    var value: Int { lock.withLock { n } }
}
