import CofferClient
import CofferCrypto
import CofferKeybag
import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// After a lock, the agent's memory holds neither a WhenUnlocked item's secret nor its class key.
/// Reads /proc/PID/mem, which needs root (the agent is non-dumpable).
@Suite struct MemoryHygieneTests {
    /// Every readable private mapping of `pid`, concatenated per mapping.
    static func memory(of pid: Int32) -> [[UInt8]] {
        // Read /proc/PID/maps with plain read(2) until EOF: procfs files report size 0.
        let mfd = open("/proc/\(pid)/maps", O_RDONLY)
        guard mfd >= 0 else { return [] }
        var mapBytes: [UInt8] = []
        var chunkBuf = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunkBuf.withUnsafeMutableBytes { read(mfd, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            mapBytes += chunkBuf[0..<n]
        }
        close(mfd)
        let maps = String(decoding: mapBytes, as: UTF8.self)
        let fd = open("/proc/\(pid)/mem", O_RDONLY)
        guard fd >= 0 else { return [] }
        defer { close(fd) }
        var out: [[UInt8]] = []
        for line in maps.split(separator: "\n") {
            let f = line.split(separator: " ", omittingEmptySubsequences: true)
            guard f.count >= 2, f[1].hasPrefix("r") else { continue }
            if f.count >= 6, f[5].hasPrefix("/") { continue } // file-backed: code and read-only data
            let range = f[0].split(separator: "-").compactMap { UInt64($0, radix: 16) }
            guard range.count == 2, range[1] > range[0], range[1] - range[0] < 1 << 30 else { continue }
            // Read in page-aligned chunks, skipping any chunk the kernel refuses, so one bad page
            // cannot hide the rest of a mapping.
            var region = [UInt8]()
            var at = range[0]
            let chunk: UInt64 = 64 << 10
            var buf = [UInt8](repeating: 0, count: Int(chunk))
            while at < range[1] {
                let want = Int(min(chunk, range[1] - at))
                let n = buf.withUnsafeMutableBytes { pread(fd, $0.baseAddress, want, off_t(Int64(bitPattern: at))) }
                if n > 0 { region += buf[0..<n] } else { region += [UInt8](repeating: 0, count: want) }
                at += UInt64(n > 0 ? n : want)
            }
            out.append(region)
        }
        return out
    }

    @Test(.enabled(if: getuid() == 0, "reading another process's memory needs root"))
    func lockWipesSecretsAndClassKeysFromTheAgentsMemory() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        let marker = "WHEN-UNLOCKED-SECRET-\(UUID().uuidString)"
        #expect(agent.cli(["add", "--service", "mem", "--account", "a", "--secret-stdin"], stdin: marker).status == 0)
        for _ in 0..<5 { #expect(agent.cli(["get", "--service", "mem", "--account", "a"]).stdout == marker) }

        // The class key, learned the honest way: open the keybag with the device key and passcode.
        let bag = try Keybag.openOrCreate(directory: agent.stateDir, deviceKey: FileDeviceKey(path: agent.stateDir + "/device.key"))
        try bag.unlock(passcode: Array(AgentProcess.password.utf8).withUnsafeBytes { SecureBytes(copying: $0) })
        let classKey = try bag.withClassKey(.whenUnlocked) { Array($0) }
        let metaKey = try bag.withMetadataKey(.whenUnlocked) { Array($0) }

        // Sanity: the scan reaches the agent's key arena. The device key sits in the same locked
        // allocation as the class keys and stays there in every state.
        let deviceKey = try #require(FileManager.default.contents(atPath: agent.stateDir + "/device.key")).map { $0 }
        let before = Self.memory(of: agent.pid)
        #expect(!before.isEmpty, "could not read the agent's memory")
        #expect(before.contains { containsSubsequenceFast($0, deviceKey) }, "the scan does not reach the key arena")

        #expect(agent.cli(["lock"]).status == 0)
        let after = Self.memory(of: agent.pid)
        let secretBytes = Array(marker.utf8)
        #expect(!after.contains { containsSubsequenceFast($0, secretBytes) }, "the item's secret is still in memory after lock")
        #expect(!after.contains { containsSubsequenceFast($0, classKey) }, "the WhenUnlocked class key is still in memory after lock")
        #expect(!after.contains { containsSubsequenceFast($0, metaKey) }, "the WhenUnlocked metadata key is still in memory after lock")
    }
}

extension MemoryHygieneTests {
    /// The agent is non-dumpable (PR_SET_DUMPABLE 0): the kernel then makes its /proc files root's,
    /// whoever runs it, and refuses ptrace and /proc/PID/mem to the agent's own user. Visible only
    /// for an agent that does not run as root, so this starts one as a throwaway user.
    @Test(.enabled(if: getuid() == 0, "running the agent as another user needs root"))
    func agentIsNotDumpableAndHasNoCoreDumps() throws {
        let other = try ThrowawayUser(prefix: "coffer-d")
        let user = other.name
        let uid: uid_t? = other.uid
        // The other user runs a copy in a directory it can reach: the checkout may sit under a
        // directory it cannot traverse.
        let shared = try SharedDirectory()
        let agent = try AgentProcess(launcher: ["/usr/bin/setpriv", "--reuid=\(user)", "--regid=nogroup", "--clear-groups"],
                                     executable: try shared.copyExecutable(Binaries.cofferd), start: false)
        #expect(runShell("chown -R \(user) '\(agent.dir.path)'", socket: "").status == 0)
        try agent.start()
        var st = stat()
        #expect(stat("/proc/\(agent.pid)/status", &st) == 0)
        let status = (try? String(contentsOfFile: "/proc/\(agent.pid)/status", encoding: .utf8)) ?? ""
        let agentUID = status.split(separator: "\n").first { $0.hasPrefix("Uid:") }?.split(separator: "\t").dropFirst().first.flatMap { UInt32($0) }
        #expect(agentUID != nil && agentUID == uid, "the agent does not run as \(user): \(status.prefix(400))")
        #expect(st.st_uid == 0, "the agent's /proc files belong to uid \(st.st_uid): it is dumpable")
        let limits = (try? String(contentsOfFile: "/proc/\(agent.pid)/limits", encoding: .utf8)) ?? ""
        #expect(limits.split(separator: "\n").contains { $0.hasPrefix("Max core file size") && $0.contains(" 0 ") })
        // Its own user cannot read its memory.
        let peek = runShell("setpriv --reuid=\(user) --regid=nogroup --clear-groups head -c 1 /proc/\(agent.pid)/environ", socket: "")
        #expect(peek.status != 0, "the agent's user could read its /proc/PID/environ")
    }
}

/// memchr + memcmp search (the agent's heap is megabytes).
func containsSubsequenceFast(_ hay: [UInt8], _ needle: [UInt8]) -> Bool {
    guard !needle.isEmpty, hay.count >= needle.count else { return false }
    return hay.withUnsafeBytes { h in
        needle.withUnsafeBytes { n in
            var start = h.baseAddress!
            let end = h.baseAddress! + (h.count - n.count + 1)
            while start < end, let hit = memchr(start, Int32(n[0]), end - start) {
                if memcmp(hit, n.baseAddress!, n.count) == 0 { return true }
                start = UnsafeRawPointer(hit) + 1
            }
            return false
        }
    }
}
