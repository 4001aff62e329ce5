import CofferClient
import CofferCrypto
import CofferModel
import CofferProtocol
import CofferTPM
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// The real `cofferd` with `device-key = tpm` against a swtpm (issue #28): wrong passcodes counted by
/// the TPM whatever happens to the `attempts` file, a TPM gone at start, the migration of a file
/// keychain killed at every step.
@Suite(.serialized) struct TPMAgentTests {
    /// A `cofferd.conf` choosing the TPM at `tcti` (or the file key).
    static func config(_ dir: TemporaryDirectory, tcti: String?) -> String {
        let path = dir.file("cofferd-\(UUID().uuidString.prefix(6)).conf")
        let text = tcti.map { "device-key = tpm\ntpm-tcti = \($0)\n" } ?? "device-key = file\n"
        try? text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    static func exists(_ path: String) -> Bool { FileManager.default.fileExists(atPath: path) }

    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func wrongPasscodesThroughTheAgentLockTheTPMOutAcrossRestartsWithTheAttemptsFileDeleted() throws {
        let sw = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-tpm-agent")
        let agent = try AgentProcess(extraArguments: ["--config", Self.config(control, tcti: sw.tcti)])
        agent.setPasscode()
        #expect(Self.exists(agent.stateDir + "/device-key.tpm") && !Self.exists(agent.stateDir + "/device.key"), "\(agent.log)")
        let tpm = try TPM(tcti: sw.tcti)
        let limit = Int(try tpm.lockoutState().maxTries)
        for i in 0..<limit {
            // A new agent each time and no `attempts` file: only the TPM remembers.
            agent.stop()
            unlink(agent.stateDir + "/attempts")
            try agent.start()
            let c = try AgentConnection(path: agent.socketPath)
            #expect(status { try c.unlock(passcode: secret("guess \(i)")) } == .authFailed)
            #expect(try tpm.lockoutState().failedTries == UInt32(i + 1), "guess \(i) was not counted by the TPM:\n\(agent.log)")
        }
        #expect(try tpm.lockoutState().inLockout)
        agent.stop()
        unlink(agent.stateDir + "/attempts")
        try agent.start()
        let r = agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password)
        let state = try tpm.lockoutState()
        #expect(r.status == SecStatus.notAvailable.exitCode && r.stderr.contains("TPM is locked out")
                && r.stderr.contains("tpm2_dictionarylockout --clear-lockout"), "\(r)")
        #expect(r.stderr.contains("\(state.failedTries) failures counted, \(state.maxTries) allowed")
                && r.stderr.contains("try again in about \(state.recoveryInterval) s"), "the TPM's own wait is not named: \(r)")
        let c = try AgentConnection(path: agent.socketPath)
        #expect(try c.status().lockState == .boot)
        if SoftwareTPM.tools != nil {
            #expect(sw.tool("tpm2_dictionarylockout", ["--clear-lockout"]).status == 0)
            try c.unlock(passcode: secret(AgentProcess.password))
            #expect(try c.status().lockState == .unlocked)
        }
    }

    /// A TPM whose lockout allows fewer tries than Coffer expects (swtpm's default is 3) is named in
    /// the agent's log with the administrator's command; raised to 10, the warning is gone.
    @Test(.enabled(if: SoftwareTPM.available && SoftwareTPM.tools != nil, "\(SoftwareTPM.unavailableReason), or no tpm2-tools"))
    func aLockoutBelowFiveTriesIsWarnedAboutAtStart() throws {
        let sw = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-tpm-maxtries")
        let three = sw.tool("tpm2_dictionarylockout", ["--setup-parameters", "--max-tries", "3", "--recovery-time", "60"])
        #expect(three.status == 0, "\(three)")
        let agent = try AgentProcess(extraArguments: ["--config", Self.config(control, tcti: sw.tcti)])
        #expect(agent.log.contains("locks out after 3 wrong authorizations") && agent.log.contains("--max-tries N"), "\(agent.log)")
        agent.stop()
        let ten = sw.tool("tpm2_dictionarylockout", ["--setup-parameters", "--max-tries", "10", "--recovery-time", "60"])
        #expect(ten.status == 0, "\(ten)")
        let again = try AgentProcess(extraArguments: ["--config", Self.config(control, tcti: sw.tcti), "--state-dir", agent.stateDir], start: false)
        try again.start()
        defer { again.stop() }
        #expect(!again.log.contains("wrong authorizations (TPM2_PT_MAX_AUTH_FAIL)"), "\(again.log)")
    }

    /// The TPM gone under a running agent: the unlock fails with the TCTI named, the agent keeps
    /// serving; a cleared TPM (tpm2_clear): the agent refuses to start, says the TPM was cleared or
    /// replaced and how to recover from a backup, and changes no file.
    @Test(.enabled(if: SoftwareTPM.available && SoftwareTPM.tools != nil, "\(SoftwareTPM.unavailableReason), or no tpm2-tools"))
    func aTPMGoneMidRunOrClearedIsExplainedAndLosesNothing() throws {
        let sw = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-tpm-cleared")
        let agent = try AgentProcess(extraArguments: ["--config", Self.config(control, tcti: sw.tcti)])
        agent.setPasscode()
        #expect(agent.cli(["add", "--service", "s", "--account", "a", "--secret-stdin"], stdin: "kept").status == 0, "\(agent.log)")
        #expect(agent.cli(["lock"]).status == 0)
        sw.stop()
        let gone = agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password)
        #expect(gone.status == SecStatus.notAvailable.exitCode && gone.stderr.contains("no TPM answers"), "\(gone)")
        #expect(agent.cli(["status"]).status == 0, "the agent stopped serving after the TPM went away:\n\(agent.log)")
        agent.stop()
        try sw.start()
        let files = ["device-key.tpm", "keybag", "keybag.key", "keychain.db"]
        let before = files.map { fileBytes(agent.stateDir + "/" + $0) }
        let cleared = sw.tool("tpm2_clear", [])
        #expect(cleared.status == 0, "\(cleared)")
        let afterClear = try AgentProcess(extraArguments: ["--config", Self.config(control, tcti: sw.tcti), "--state-dir", agent.stateDir], start: false)
        #expect(throws: AgentProcess.AgentStartError.self) { try afterClear.start() }
        #expect(afterClear.log.contains("the TPM was cleared or replaced") && afterClear.log.contains("coffer backup restore"), "\(afterClear.log)")
        #expect(files.map { fileBytes(agent.stateDir + "/" + $0) } == before, "nothing written or removed")
    }

    /// `coffer status` says truthfully where the device key is and who counts wrong passcodes.
    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func statusReportsTheProtectionsInForce() throws {
        func lines(_ agent: AgentProcess) -> [String] {
            let r = agent.cli(["status"])
            #expect(r.status == 0, "\(r)")
            return r.stdout.split(separator: "\n").map(String.init).filter {
                $0.hasPrefix("device key:") || $0.hasPrefix("attempt counting:") || $0.hasPrefix("rollback detection:")
            }
        }
        let fileAgent = try AgentProcess()
        fileAgent.setPasscode()
        #expect(lines(fileAgent) == ["device key: file", "attempt counting: file", "rollback detection: off"])
        let sw = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-tpm-agent")
        let agent = try AgentProcess(extraArguments: ["--config", Self.config(control, tcti: sw.tcti)])
        #expect(lines(agent) == ["device key: TPM 2.0", "attempt counting: file", "rollback detection: off"], "no passcode: nothing for the TPM to count")
        agent.setPasscode()
        // swtpm, like most machines, has no lockout authorization: the TPM counts, and anyone can reset it.
        #expect(lines(agent) == ["device key: TPM 2.0", "attempt counting: \(Self.resettable)", "rollback detection: off"])
        let json = agent.cli(["status", "--json"])
        #expect(json.stdout.contains("\"deviceKey\":\"TPM 2.0\"") && json.stdout.contains("\"attemptCounting\":\"\(Self.resettable)\""), "\(json)")
        #expect(fileAgent.cli(["status", "--json"]).stdout.contains("\"attemptCounting\":\"file\",\"tpmLockoutAuthorization\":null"))
    }

    /// What `coffer status` says of a TPM whose lockout authorization is empty.
    static let resettable = "TPM, but its lockout authorization is empty: any local process can reset it (the bound is Coffer's attempts file)"
    /// The start-up warning for it (once per start).
    static let emptyLockoutWarning = "has an empty lockout authorization (TPMA_PERMANENT.lockoutAuthSet is clear)"

    /// `coffer status`'s attempt-counting line.
    static func attemptLine(_ agent: AgentProcess) -> String? {
        agent.cli(["status"]).stdout.split(separator: "\n").map(String.init).first { $0.hasPrefix("attempt counting:") }
    }

    /// Writes the administrator's lockout authorization into a private file in `dir` and returns
    /// tpm2-tools' `file:PATH` for it (never an argument holding the value).
    static func lockoutAuthorization(_ dir: TemporaryDirectory) throws -> String {
        let path = dir.file("lockout-auth")
        try "the administrator's lockout authorization".write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o600)
        return "file:" + path
    }

    /// F2 (issue #41): `coffer status` (text and JSON) tells whether the TPM's count of wrong passcodes
    /// can be reset by anyone, asked of the TPM at each status (the administrator may set the
    /// authorization while the agent runs), and the agent's log says it once per start.
    @Test(.enabled(if: SoftwareTPM.available && SoftwareTPM.tools != nil, "\(SoftwareTPM.unavailableReason), or no tpm2-tools"))
    func statusTellsTheTruthAboutTheTPMsCountWithAndWithoutALockoutAuthorization() throws {
        let sw = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-tpm-lockout-auth")
        let config = Self.config(control, tcti: sw.tcti)
        let agent = try AgentProcess(extraArguments: ["--config", config])
        agent.setPasscode()
        // Empty (swtpm's default, and most machines').
        #expect(Self.attemptLine(agent) == "attempt counting: \(Self.resettable)")
        let empty = agent.cli(["status", "--json"])
        #expect(empty.stdout.contains("\"attemptCounting\":\"\(Self.resettable)\",\"tpmLockoutAuthorization\":\"empty\""), "\(empty)")
        #expect(agent.cli(["lock"]).status == 0 && agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        _ = agent.cli(["status"])
        #expect(agent.log.components(separatedBy: Self.emptyLockoutWarning).count == 2, "the warning, exactly once:\n\(agent.log)")
        #expect(agent.log.contains("tpm2_changeauth -c lockout"), "\(agent.log)")
        // The administrator's one-time step, under the running agent: status follows the TPM.
        let set = sw.tool("tpm2_changeauth", ["-c", "lockout", try Self.lockoutAuthorization(control)])
        #expect(set.status == 0, "\(set)")
        #expect(Self.attemptLine(agent) == "attempt counting: TPM")
        let json = agent.cli(["status", "--json"])
        #expect(json.stdout.contains("\"attemptCounting\":\"TPM\",\"tpmLockoutAuthorization\":\"set\""), "\(json)")
        // A new start with it set: no warning.
        try agent.restart()
        #expect(!agent.log.contains(Self.emptyLockoutWarning), "\(agent.log)")
        #expect(Self.attemptLine(agent) == "attempt counting: TPM")
    }

    /// F2 (issue #41), the attack: with the TPM's lockout authorization empty, the same uid resets the
    /// TPM's count (`tpm2_dictionarylockout --clear-lockout`) each time it locks out, and keeps guessing
    /// through the real agent. Coffer's own persisted count (the `attempts` file: here six guesses,
    /// then an hour) is the bound, across a restart of the agent, and `coffer status` says that the
    /// TPM's count binds nobody. The rest is pinned as the threat model states it: code of that uid
    /// that also deletes `attempts` (or asks the TPM itself) is bound by neither.
    @Test(.enabled(if: SoftwareTPM.available && SoftwareTPM.tools != nil, "\(SoftwareTPM.unavailableReason), or no tpm2-tools"))
    func resettingTheTPMsCountEarnsNoGuessesPastCoffersOwnBound() throws {
        let sw = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-tpm-reset")
        let config = Self.config(control, tcti: sw.tcti)
        let bound = 6
        try (String(contentsOfFile: config, encoding: .utf8) + "unlock-delays = 0,0,0,0,0,3600\n").write(toFile: config, atomically: true, encoding: .utf8)
        let agent = try AgentProcess(extraArguments: ["--config", config])
        agent.setPasscode()
        let tpm = try TPM(tcti: sw.tcti)
        let start = try tpm.lockoutState()
        #expect(!start.lockoutAuthSet && Int(start.maxTries) < bound, "the guesser must get past the TPM's \(start.maxTries) tries: \(start)")
        #expect(Self.attemptLine(agent) == "attempt counting: \(Self.resettable)")
        var tried = 0, resets = 0
        var refusal: CLIResult? = nil
        for i in 0..<(bound + 3) {
            if try tpm.lockoutState().inLockout {
                let reset = sw.tool("tpm2_dictionarylockout", ["--clear-lockout"])
                #expect(reset.status == 0, "the same uid resets the TPM's count: \(reset)")
                #expect(try tpm.lockoutState().failedTries == 0)
                resets += 1
            }
            if i == bound / 2 { try agent.restart() }   // the count is in the file, not in the process
            let r = agent.cli(["unlock", "--passcode-stdin"], stdin: "guess \(i)")
            if r.stderr.contains("too many failed attempts") {
                refusal = r
                break
            }
            #expect(r.status == SecStatus.authFailed.exitCode, "guess \(i): \(r)\n\(agent.log)")
            tried += 1
        }
        #expect(resets >= 1, "the TPM's own lockout was never reached")
        #expect(tried == bound, "Coffer's bound is \(bound) guesses, then an hour; \(tried) were tried")
        #expect(refusal?.status == SecStatus.authFailed.exitCode && refusal?.stderr.contains("too many failed attempts (\(bound)): try again in") == true, "\(String(describing: refusal))")
        // Reset or not, the next guess is refused before it reaches PAM or the TPM.
        let before = try tpm.lockoutState().failedTries
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: "one more").stderr.contains("too many failed attempts"))
        #expect(try tpm.lockoutState().failedTries == before, "a refused attempt reached the TPM")
        // Pinned, as the threat model says: the same uid that also deletes the attempts file is bound by
        // nothing here (it could as well run the TPM commands itself).
        agent.stop()
        unlink(agent.stateDir + "/attempts")
        if try tpm.lockoutState().inLockout { #expect(sw.tool("tpm2_dictionarylockout", ["--clear-lockout"]).status == 0) }
        try agent.start()
        let past = agent.cli(["unlock", "--passcode-stdin"], stdin: "past the bound")
        #expect(past.status == SecStatus.authFailed.exitCode && !past.stderr.contains("too many failed attempts"), "\(past)")
    }

    /// F2 (issue #41), the other configuration: with a lockout authorization set, the same uid can
    /// neither reset the TPM's count nor, by deleting the `attempts` file and restarting the agent, get
    /// a guess past the TPM's `max-tries`; even the right passcode waits for the TPM.
    @Test(.enabled(if: SoftwareTPM.available && SoftwareTPM.tools != nil, "\(SoftwareTPM.unavailableReason), or no tpm2-tools"))
    func withALockoutAuthorizationTheSameUIDCannotResetTheTPMsCount() throws {
        let sw = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-tpm-lockout-set")
        let set = sw.tool("tpm2_changeauth", ["-c", "lockout", try Self.lockoutAuthorization(control)])
        #expect(set.status == 0, "\(set)")
        let agent = try AgentProcess(extraArguments: ["--config", Self.config(control, tcti: sw.tcti)])
        agent.setPasscode()
        #expect(Self.attemptLine(agent) == "attempt counting: TPM")
        #expect(!agent.log.contains(Self.emptyLockoutWarning), "\(agent.log)")
        let tpm = try TPM(tcti: sw.tcti)
        let limit = Int(try tpm.lockoutState().maxTries)
        for i in 0..<limit {
            agent.stop()
            unlink(agent.stateDir + "/attempts")
            try agent.start()
            #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: "guess \(i)").status == SecStatus.authFailed.exitCode)
        }
        #expect(try tpm.lockoutState().inLockout)
        let reset = sw.tool("tpm2_dictionarylockout", ["--clear-lockout"])
        #expect(reset.status != 0, "the reset without the lockout authorization: \(reset)")
        #expect(try tpm.lockoutState().inLockout, "the count was reset without the lockout authorization")
        agent.stop()
        unlink(agent.stateDir + "/attempts")
        try agent.start()
        let right = agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password)
        #expect(right.status == SecStatus.notAvailable.exitCode && right.stderr.contains("TPM is locked out"), "\(right)")
    }

    /// Issue #41: the first start with rollback detection finds no counter on the TPM and defines one;
    /// asking whether it exists is no failed TPM command, so libtss2 logs nothing (it logged three
    /// `NV_ReadPublic` errors per probe). Its logging stays on: a wrong passcode's refused TPM2_HMAC is
    /// still logged by it.
    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func theFirstStartProbesTheTPMsCounterWithoutLibtss2Errors() throws {
        let sw = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-tpm-probe")
        let config = control.file("probe.conf")
        try "device-key = tpm\ntpm-tcti = \(sw.tcti)\nrollback-detection = on\nrollback-interval = 3600\n".write(toFile: config, atomically: true, encoding: .utf8)
        let agent = try AgentProcess(extraArguments: ["--config", config])
        agent.setPasscode()
        #expect(agent.cli(["lock"]).status == 0)
        #expect(agent.log.contains("anchored to the TPM NV counter"), "\(agent.log)")
        for log in [agent.log, { try? agent.restart(); return agent.log }()] {
            #expect(!log.contains("NV_ReadPublic") && !log.contains("FromTPMPublic") && !log.contains(":esys:"), "\(log)")
        }
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: "wrong").status == SecStatus.authFailed.exitCode)
        #expect(agent.log.contains("Esys_HMAC"), "libtss2's own error log was turned off:\n\(agent.log)")
    }

    /// Issue #41: a keychain whose keys another TPM made is refused with one statement: what happened
    /// (another storage key: this TPM cleared or replaced, or a state directory from another machine)
    /// and the one way back (a backup; escrow records need the device key, so they are not one).
    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func aKeychainFromAnotherTPMIsRefusedInOneConsistentStatement() throws {
        let first = try SoftwareTPM(), other = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-tpm-other")
        let agent = try AgentProcess(extraArguments: ["--config", Self.config(control, tcti: first.tcti)])
        agent.setPasscode()
        agent.stop()
        let elsewhere = try AgentProcess(extraArguments: ["--config", Self.config(control, tcti: other.tcti), "--state-dir", agent.stateDir],
                                         start: false)
        #expect(throws: AgentProcess.AgentStartError.self) { try elsewhere.start() }
        let line = elsewhere.log.split(separator: "\n").map(String.init).first { $0.contains("cannot start") } ?? elsewhere.log
        #expect(line.contains("errSecDecode") && line.contains("this TPM cannot open the keychain, now or later")
                && line.contains("another storage key") && line.contains("cleared or replaced") && line.contains("another machine")
                && line.contains("coffer backup restore") && line.contains("escrow records need the device key too, so they cannot help"), "\(line)")
        #expect(!line.contains("or an escrow record") && !line.contains("damaged") && !line.contains("belongs to another TPM"), "\(line)")
        #expect(line.components(separatedBy: "restore").count == 3, "one way back, named once (and its command): \(line)")
    }

    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func theAgentRefusesToStartWithoutItsTPMOrWithTheFileKeyAndLosesNothing() throws {
        let sw = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-tpm-agent")
        let tcti = sw.tcti
        let agent = try AgentProcess(extraArguments: ["--config", Self.config(control, tcti: tcti)])
        agent.setPasscode()
        let c = try AgentConnection(path: agent.socketPath)
        try c.add(newPassword("s", "a", "kept"))
        agent.stop()
        let files = ["device-key.tpm", "keybag", "keybag.key", "keychain.db"]
        let before = files.map { fileBytes(agent.stateDir + "/" + $0) }
        sw.stop()
        #expect(throws: AgentProcess.AgentStartError.self) { try agent.start() }
        #expect(agent.log.contains("no TPM answers at \(tcti)"), "\(agent.log)")
        // The file key instead: refused, no new device.key over the TPM keychain.
        let fileAgent = try AgentProcess(extraArguments: ["--config", Self.config(control, tcti: nil), "--state-dir", agent.stateDir], start: false)
        #expect(throws: AgentProcess.AgentStartError.self) { try fileAgent.start() }
        #expect(fileAgent.log.contains("device-key = tpm"), "\(fileAgent.log)")
        #expect(!Self.exists(agent.stateDir + "/device.key"))
        #expect(files.map { fileBytes(agent.stateDir + "/" + $0) } == before, "nothing written or removed")
    }

    #if DEBUG
    static let crashPointsCompiledIn = true
    #else
    static let crashPointsCompiledIn = false
    #endif
    static let migrationPoints = ["migrate-tpm-key-written", "rekey-start", "rekey-next-written", "rekey-committed", "rekey-reseal-half",
                                  "rekey-resealed", "rekey-final-next-written", "rekey-done", "migrate-committed", "migrate-done"]
    /// Points before the format-3 keybag is committed: the file key still opens everything.
    static let beforeCommit: Set<String> = ["migrate-tpm-key-written", "rekey-start", "rekey-next-written"]

    /// Runs `coffer device-key migrate --to tpm` (which runs `cofferd --migrate-device-key tpm`) on the
    /// agent's state directory, the passcode on stdin, with `COFFER_TEST_CRASH_POINT` set to `point` (empty: none).
    static func migrate(_ agent: AgentProcess, config: String, at point: String) -> CLIResult {
        runCLI(["device-key", "migrate", "--to", "tpm", "--config", config, "--state-dir", agent.stateDir, "--passcode-stdin"],
               stdin: AgentProcess.password, environment: ["COFFER_TEST_CRASH_POINT": point])
    }

    /// A file keychain with a passcode and items of every class, moved to the TPM by a migration
    /// killed at `point`, then by the migration run again: every item reads with the TPM, `device.key`
    /// is gone only once the format-3 keybag is durable, and before the commit the file key still works.
    @Test(.enabled(if: SoftwareTPM.available && crashPointsCompiledIn, "\(SoftwareTPM.unavailableReason), or a release build"),
          // With rollback detection at three steps too, in the plain pass (CI's 30 minutes hold no more under a sanitizer).
          arguments: migrationPoints.map { ($0, false) }
              + (SSHOpenSSHTests.sanitized ? [] : ["rekey-reseal-half", "rekey-done", "migrate-committed"].map { ($0, true) }))
    func migrationKilledAtEveryStep(at point: String, rollbackDetection: Bool) throws {
        let sw = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-tpm-migrate")
        let fileConfig = Self.config(control, tcti: nil), tpmConfig = Self.config(control, tcti: sw.tcti)
        if rollbackDetection {
            // The same counter before and after the move; the kill must not cost the records either.
            let lines = "rollback-detection = on\nrollback-tcti = \(sw.tcti)\nrollback-interval = 3600\n"
            for path in [fileConfig, tpmConfig] { try (String(contentsOfFile: path, encoding: .utf8) + lines).write(toFile: path, atomically: true, encoding: .utf8) }
        }
        let agent = try AgentProcess(extraArguments: ["--config", fileConfig])
        agent.setPasscode()
        let c = try AgentConnection(path: agent.socketPath)
        let items = ProtectionClass.allCases.map { ($0, "secret of \($0.shortCode)") }
        for (p, s) in items { try c.add(newPassword("m", p.shortCode, s, p.shortCode)) }
        agent.stop()
        let killed = Self.migrate(agent, config: tpmConfig, at: point)
        #expect(killed.status == 99, "the migration did not stop at \(point): \(killed)")
        #expect(Self.exists(agent.stateDir + "/device.key") || point == "migrate-done", "\(point): device.key removed before the commit was durable")
        /// Unlocks through `socket` and reads every item.
        func expectItems(_ socket: String, _ label: String) throws {
            let c = try AgentConnection(path: socket)
            try c.unlock(passcode: secret(AgentProcess.password))
            for (p, s) in items { #expect(text(try c.copyMatching(password("m", p.shortCode)).first?.data) == s, "\(label): \(p.shortCode)") }
        }
        if Self.beforeCommit.contains(point) {
            // Nothing committed: the file key opens the keychain as before.
            let fileAgent = try AgentProcess(extraArguments: ["--config", fileConfig, "--state-dir", agent.stateDir], start: false)
            try fileAgent.start()
            defer { fileAgent.stop() }
            try expectItems(fileAgent.socketPath, "\(point), file key")
        }
        let again = Self.migrate(agent, config: tpmConfig, at: "")
        #expect(again.status == 0, "\(point): running the migration again: \(again)")
        #expect(!Self.exists(agent.stateDir + "/device.key"), "\(point)")
        let tpmAgent = try AgentProcess(extraArguments: ["--config", tpmConfig, "--state-dir", agent.stateDir], start: false)
        try tpmAgent.start()
        defer { tpmAgent.stop() }
        try expectItems(tpmAgent.socketPath, "\(point), TPM")
    }

    /// A keychain with rollback detection on, moved to the TPM: the migration re-seals the rollback
    /// records under the new keys (they were sealed under the file key's passcode tier), so the TPM agent
    /// unlocks and serves every item, and a keychain.db put back from before a later change is still refused.
    @Test(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
    func aMigrationKeepsRollbackDetectionWorking() throws {
        let sw = try SoftwareTPM()
        let control = TemporaryDirectory("coffer-tpm-migrate-rollback")
        let rollback = "rollback-detection = on\nrollback-tcti = \(sw.tcti)\nrollback-interval = 3600\n"
        let fileConfig = control.file("file.conf"), tpmConfig = control.file("tpm.conf")
        try ("device-key = file\n" + rollback).write(toFile: fileConfig, atomically: true, encoding: .utf8)
        try ("device-key = tpm\ntpm-tcti = \(sw.tcti)\n" + rollback).write(toFile: tpmConfig, atomically: true, encoding: .utf8)
        let agent = try AgentProcess(extraArguments: ["--config", fileConfig])
        agent.setPasscode()
        #expect(agent.cli(["add", "--service", "svc", "--account", "a", "--secret-stdin"], stdin: "before").status == 0, "\(agent.log)")
        #expect(agent.cli(["lock"]).status == 0, "\(agent.log)")   // anchors the add: the records' epoch is > 0
        agent.stop()
        let migrated = Self.migrate(agent, config: tpmConfig, at: "")
        #expect(migrated.status == 0, "\(migrated)")
        let tpmAgent = try AgentProcess(extraArguments: ["--config", tpmConfig, "--state-dir", agent.stateDir], start: false)
        try tpmAgent.start()
        defer { tpmAgent.stop() }
        let unlocked = tpmAgent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password)
        #expect(unlocked.status == 0, "the migrated keychain does not unlock with rollback detection on: \(unlocked)\n\(tpmAgent.log)")
        let status = tpmAgent.cli(["status"]).stdout
        #expect(status.contains("rollback detection: on") && status.contains("device key: TPM 2.0"), "\(status)")
        #expect(tpmAgent.cli(["get", "--service", "svc", "--account", "a"]).stdout.contains("before"), "\(tpmAgent.log)")
        #expect(tpmAgent.cli(["lock"]).status == 0)
        tpmAgent.stop()
        let refused = try RollbackAgentTests.unlockAfterPuttingBackAnUpdate(tpmAgent, stateDir: agent.stateDir, secret: "after")
        #expect(refused.status != 0 && refused.stderr.contains("rollback detected"), "an earlier keychain.db after the migration: \(refused)")
    }
}
