import CofferKeychain
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
        if daemonize {
            do {
                // The daemon inherits the locked descriptor (the parent's exit does not release it).
                let role = try ThisProcess.daemonize(logFile: cfg.stateDirectory + "/cofferd.log")
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
        let level = Logger.Level(rawValue: logLevel) ?? .info
        LoggingSystem.bootstrap { label in
            var h = StreamLogHandler.standardError(label: label)
            h.logLevel = level
            return h
        }
        let logger = Logger(label: "cofferd")
        let signals = [SIGTERM, SIGINT, SIGUSR1, SIGHUP]
        Signals.block(signals)

        let agent: Agent
        do {
            agent = try Agent(configuration: cfg, logger: logger)
        } catch {
            logger.critical("cannot start: \(error)")
            StandardStreams.printError("cofferd: \(error)")
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
