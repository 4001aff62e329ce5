import CofferTestSupport
import Foundation
import Glibc
import Testing

/// A client written from WireProtocol.md alone (contrib/outside-client, issue #44) against real agents:
/// its checker runs every test vector of the spec through its own codec, the spec's client-observable
/// MUST rules end to end, and the frames the spec calls malformed. The checker lists where the spec and
/// the agent disagree (`KNOWN_DISAGREEMENTS`, each with the spec's sentence); anything else that fails
/// fails this test with the checker's lines.
@Suite struct OutsideClientTests {
    /// The `python3` the checker runs with, or nil (the test then skips, saying so).
    static let python3: String? = ["/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"].first { access($0, X_OK) == 0 }
    static let checker = Binaries.packageRoot + "/contrib/outside-client/check.py"
    static let spec = "Sources/CofferProtocol/CofferProtocol.docc/WireProtocol.md"

    /// The summary line's counts: part → (passed, run).
    static func counts(_ output: String) -> [String: (Int, Int)] {
        guard let line = output.split(separator: "\n").last(where: { $0.hasPrefix("summary: ") }) else { return [:] }
        var out: [String: (Int, Int)] = [:]
        for part in line.dropFirst("summary: ".count).split(separator: ",") {
            let words = part.split(separator: " ")
            guard words.count >= 2 else { continue }
            let numbers = words[1].split(separator: "/").compactMap { Int($0) }
            if numbers.count == 2 { out[String(words[0])] = (numbers[0], numbers[1]) }
        }
        return out
    }

    @Test(.enabled(if: python3 != nil, "needs python3 (apt: python3) to run contrib/outside-client/check.py"),
          .enabled(if: biometryPluginsBuilt, "needs the built biometry plugins and plugin host (swift build --build-tests)"))
    func aClientWrittenFromTheSpecAlonePassesEveryVectorAndEveryCheck() throws {
        let setup = TemporaryDirectory("coffer-outside")
        // The main agent: short connection time limits (rule 6) and lock grace, so that the checks that
        // wait them out stay short; the checker is told the same values.
        let mainConfig = setup.file("main.conf")
        try "hello-timeout = 2\nframe-deadline = 3\n".write(toFile: mainConfig, atomically: true, encoding: .utf8)
        let main = try AgentProcess(extraArguments: ["--config", mainConfig, "--lock-grace", "1"])
        // A second agent with the biometric emulator (Biometry, the Authentication conversation with a sensor).
        let bioConfig = setup.file("bio.conf")
        try (BiometryTests.pluginConfig(in: setup) + ["authentication-timeout = 30", ""]).joined(separator: "\n")
            .write(toFile: bioConfig, atomically: true, encoding: .utf8)
        let bio = try AgentProcess(extraArguments: ["--config", bioConfig])
        // A third with a short idle lock and authentication timeout.
        let idleConfig = setup.file("idle.conf")
        try "idle-lock = 2\nlock-grace = 1\nauthentication-timeout = 1\n".write(toFile: idleConfig, atomically: true, encoding: .utf8)
        let idle = try AgentProcess(extraArguments: ["--config", idleConfig])

        // The passcode (the PAM password) goes over standard input, never the command line.
        let state = setup.file("state.json")
        func check(_ phase: String, _ arguments: [String]) -> CLIResult {
            let started = Date()
            let r = runProcess(Self.python3!, [Self.checker, "--quiet", "--socket", main.socketPath, "--state-file", state] + arguments,
                               stdin: AgentProcess.password, timeout: 300)
            let failing = r.stdout.split(separator: "\n").filter { $0.hasPrefix("FAIL") || $0.hasPrefix("XPASS") }
            #expect(r.status == 0 && failing.isEmpty,
                    "the outside client's checker failed (\(phase), \(String(format: "%.1f", Date().timeIntervalSince(started))) s):\n\(failing.joined(separator: "\n"))\n\(r.stderr)\n--- main agent ---\n\(main.log.suffix(4000))")
            return r
        }
        let r = withExtendedLifetime((setup, bio, idle)) {
            check("the first run", ["--passdb", main.passdb, "--hello-timeout", "2", "--frame-deadline", "3", "--lock-grace", "1", "--session-lock",
                   "--bio-socket", bio.socketPath,
                   "--idle-socket", idle.socketPath, "--idle-lock-seconds", "2", "--idle-lock-grace", "1", "--auth-timeout", "1"])
        }
        // The same agent restarted: before the first unlock, what survives a restart, then the attempt
        // schedule; restarted again: the failures in a row were kept.
        try main.restart()
        let boot = check("after a restart", ["--part", "boot"])
        try main.restart()
        let restarted = check("after a second restart", ["--part", "restarted"])

        // It cannot pass vacuously: every vector block of the spec ran, and the live parts ran in earnest.
        let counts = Self.counts(r.stdout)
        let blocks = specVectorBlocks(Self.spec).count
        #expect(blocks > 200, "the spec's vector blocks were not found")
        let vectors = counts["vectors"], e2e = counts["e2e"], malformed = counts["malformed"]
        #expect(vectors?.1 == blocks && vectors?.0 == blocks, "vectors \(String(describing: vectors)) of \(blocks) blocks")
        #expect((e2e?.1 ?? 0) >= 1200 && e2e?.0 == e2e?.1, "e2e \(String(describing: e2e))")
        #expect((malformed?.1 ?? 0) >= 900 && malformed?.0 == malformed?.1, "malformed \(String(describing: malformed))")
        let afterBoot = Self.counts(boot.stdout)["e2e"], afterRestart = Self.counts(restarted.stdout)["e2e"]
        #expect((afterBoot?.1 ?? 0) >= 30 && afterBoot?.0 == afterBoot?.1, "boot \(String(describing: afterBoot))")
        #expect((afterRestart?.1 ?? 0) >= 2 && afterRestart?.0 == afterRestart?.1, "restarted \(String(describing: afterRestart))")
    }
}
