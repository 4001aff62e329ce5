import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import CofferService
import CofferSystem
import Glibc
import Logging

/// Process-level start-up of `cofferd`: hardening, daemonising, signals, and the serve loop.
package enum AgentMain {
    /// The exit status of an agent refused because another process holds its state directory (a
    /// service manager must not restart it: `RestartPreventExitStatus=` in the systemd unit).
    package static let stateDirectoryHeldStatus: Int32 = 69

    /// Runs the agent until SIGTERM/SIGINT; returns the process exit status.
    package static func run(configuration cfg: AgentConfiguration, daemonize: Bool, logLevel: String) -> Int32 {
        do {
            try ProcessHardening.disableCoreDumps()
        } catch {
            StandardStreams.printError("cofferd: cannot disable core dumps: \(error)")
            return 1
        }
        // One agent per state directory, decided before anything in it is read (and before a daemon
        // detaches, so a refusal reaches the terminal): a second agent on the same keychain would
        // seal under keys the first one rotated, or overwrite what it acknowledged.
        let stateLock: StateDirectoryLock
        do {
            try Files.makePrivateDirectory(cfg.stateDirectory)
            stateLock = try StateDirectoryLock.acquire(directory: cfg.stateDirectory, socket: cfg.socketPath)
        } catch let failure as StateDirectoryLock.Failure {
            StandardStreams.printError("cofferd: \(failure)")
            if case .held = failure { return stateDirectoryHeldStatus }
            return 1
        } catch {
            StandardStreams.printError("cofferd: \(error)")
            return 1
        }
        // Released only by the process's exit, never by a deinit while other threads still run.
        stateLock.keepUntilExit()
        var readiness: ThisProcess.Readiness? = nil
        let logFile = cfg.stateDirectory + "/cofferd.log"
        if daemonize {
            do {
                // The daemon inherits the locked descriptor (the parent's exit does not release it).
                let role = try ThisProcess.daemonize(logFile: logFile)
                switch consume role {
                case .parent(let status): return status
                case .daemon(let r): readiness = .some(r)
                }
            } catch {
                StandardStreams.printError("cofferd: \(error)")
                return 1
            }
            stateLock.recordHolder(socket: cfg.socketPath)
        }
        bootstrapLogging(level: Logger.Level(rawValue: logLevel) ?? .info,
                         daemonLog: daemonize ? RotatingLogFile(path: logFile, descriptor: 2, maximumBytes: cfg.logMaximumBytes, keep: cfg.logKeep) : nil)
        let logger = Logger(label: "cofferd")
        let signals = [SIGTERM, SIGINT, SIGUSR1, SIGHUP]
        Signals.block(signals)

        let agent: Agent
        do {
            agent = try Agent(configuration: cfg, logger: logger)
        } catch {
            logger.critical("cannot start: \(error)")
            StandardStreams.printError("cofferd: \(error)")
            // A daemon's stderr is its log: the waiting parent prints the reason on the terminal.
            if let r = consume readiness { r.fail("cofferd: \(error)") }
            return 1
        }
        agent.start()
        logger.info("state directory locked", metadata: ["lock": "\(stateLock.path)"])
        Systemd.notify("READY=1\nSTATUS=serving \(cfg.socketPath)\nMAINPID=\(getpid())")
        if let r = consume readiness { r.signal() }
        while true {
            switch Signals.wait(signals) {
            case SIGUSR1:
                agent.sessionLocked()
            case SIGHUP:
                agent.reloadTrust()
            default:
                Systemd.notify("STOPPING=1")
                agent.shutdown()
                return 0
            }
        }
    }
}

extension AgentMain {
    /// `cofferd --migrate-device-key tpm` (what `coffer device-key migrate --to tpm` runs): moves the
    /// keychain in the state directory from `device.key` to the TPM at `tpm-tcti`, with the agent
    /// stopped (the state directory's lock is taken like the agent's). The passcode, when one is set,
    /// is read from descriptor `passcodeFD` (standard input), never from argv or the environment.
    /// Crash-safe (see ``CofferKeychain/Keychain/migrateDeviceKey(passcode:)``): run it again after
    /// an interruption. Returns the exit status (the error's, see docs/cli.md's exit table).
    package static func migrateDeviceKey(configuration cfg: AgentConfiguration, passcodeFD: Int32 = 0) -> Int32 {
        let dir = cfg.stateDirectory
        let filePath = dir + "/" + Keychain.FileNames.deviceKey
        let tpmPath = dir + "/" + Keychain.FileNames.tpmDeviceKey
        guard Files.exists(filePath) else {
            if Files.exists(tpmPath) {
                StandardStreams.print("the keychain in \(dir) already keeps its device key in the TPM (\(Keychain.FileNames.tpmDeviceKey))")
                return 0
            }
            StandardStreams.printError("cofferd: no keychain with a file device key in \(dir)")
            return SecStatus.notAvailable.exitCode
        }
        do throws(SecError) {
            let fileKey = try FileDeviceKey(path: filePath).loadDeviceKey()
            let source = TPMDeviceKey(path: tpmPath, tcti: cfg.tpmTCTI, adopting: fileKey)
            // Creates the TPM's file (sealing the file key) or, after an interrupted run, reads it back:
            // it must seal the same key, or it is not this keychain's.
            guard try source.loadDeviceKey().constantTimeEquals(fileKey) else {
                throw .decode("\(tpmPath) seals another device key than \(filePath): move it aside and run the migration again")
            }
            CrashPoint.hit("migrate-tpm-key-written")
            // With rollback detection on, the migration re-seals the rollback records under the new keys:
            // it needs the same counter the agent uses.
            let rollbackCounter = cfg.rollbackDetection ? TPMRollbackCounter(tcti: cfg.rollbackTCTI, index: cfg.rollbackNVIndex) : nil
            let kc = try Keychain(directory: dir, deviceKey: source, applicationPasswordDelays: cfg.attemptSchedule.delays,
                                  clock: SystemWallClock(), rollbackCounter: rollbackCounter, rollbackInterval: cfg.rollbackInterval,
                                  lockingStateDirectory: true, migratingDeviceKey: true)
            var passcode: SecureBytes? = nil
            if kc.status.passcodeSet { passcode = try readPasscode(fd: passcodeFD) }
            try kc.migrateDeviceKey(passcode: passcode)
            StandardStreams.print("the keychain in \(dir) now keeps its device key in the TPM at \(cfg.tpmTCTI); \(Keychain.FileNames.deviceKey) "
                + "is gone. Set 'device-key = tpm' (and 'tpm-tcti') in cofferd.conf before starting cofferd")
            return 0
        } catch {
            StandardStreams.printError("cofferd: \(error.status.name) (\(error.status.rawValue)): \(error.message)")
            return error.status.exitCode
        }
    }

    /// The passcode from `fd`, into secure memory (one trailing newline dropped).
    private static func readPasscode(fd: Int32) throws(SecError) -> SecureBytes {
        let buffer = SecureBytes(count: 4096)
        let n: Int
        do { n = unsafe try buffer.withUnsafeMutableBytes { b throws(SystemError) in unsafe try Files.readAll(fd: fd, into: b) } } catch {
            throw .io("cannot read the passcode from standard input: \(error)")
        }
        var length = n
        if length > 0, unsafe buffer.withUnsafeBytes({ $0[length - 1] }) == 0x0A { length -= 1 }
        guard length > 0 else { throw .authFailed("the keychain has a passcode: give it on standard input") }
        return unsafe buffer.withUnsafeBytes { unsafe SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[..<length])) }
    }
}
