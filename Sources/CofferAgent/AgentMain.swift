import CofferKeychain
import CofferSystem
import Glibc
import Logging

/// Process-level start-up of `cofferd`: hardening, daemonising, signals, and the serve loop.
public enum AgentMain {
    /// Runs the agent until SIGTERM/SIGINT; returns the process exit status.
    public static func run(configuration cfg: AgentConfiguration, daemonize: Bool, logLevel: String) -> Int32 {
        do {
            try ProcessHardening.disableCoreDumps()
        } catch {
            StandardStreams.printError("cofferd: cannot disable core dumps: \(error)")
            return 1
        }
        var readiness: Int32 = -1
        if daemonize {
            switch Daemon.detach(logFile: cfg.stateDirectory + "/cofferd.log", stateDirectory: cfg.stateDirectory) {
            case .parent(let status): return status
            case .child(let fd): readiness = fd
            case .failed(let message):
                StandardStreams.printError("cofferd: \(message)")
                return 1
            }
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
        Systemd.notify("READY=1\nSTATUS=serving \(cfg.socketPath)\nMAINPID=\(getpid())")
        if readiness >= 0 {
            var one: UInt8 = 1
            _ = write(readiness, &one, 1)
            close(readiness)
        }
        while true {
            switch Signals.wait(signals) {
            case SIGUSR1:
                agent.sessionLocked()
            case SIGHUP:
                logger.info("SIGHUP ignored (restart the agent to reload its configuration)")
            default:
                Systemd.notify("STOPPING=1")
                agent.shutdown()
                return 0
            }
        }
    }
}

/// Classic double-fork-free daemonising with a readiness pipe, so `cofferd` returns only once the
/// socket is accepting (or with an error status if start-up failed).
enum Daemon {
    enum Outcome {
        case parent(Int32)
        case child(readinessFD: Int32)
        case failed(String)
    }

    static func detach(logFile: String, stateDirectory: String) -> Outcome {
        do { try Files.makePrivateDirectory(stateDirectory) } catch { return .failed("\(error)") }
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { return .failed("\(SystemError("pipe", "readiness"))") }
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        let pid = fork()
        if pid < 0 { return .failed("fork failed") }
        if pid > 0 {
            close(fds[1])
            var byte: UInt8 = 0
            let n = retryingEINTR { read(fds[0], &byte, 1) }
            close(fds[0])
            if n == 1 { return .parent(0) }
            var status: Int32 = 0
            waitpid(pid, &status, 0)
            let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 1
            return .parent(code == 0 ? 1 : code)
        }
        close(fds[0])
        setsid()
        let null = open("/dev/null", O_RDWR)
        let log = open(logFile, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0o600)
        dup2(null, 0)
        dup2(null, 1)
        dup2(log >= 0 ? log : null, 2)
        if null > 2 { close(null) }
        if log > 2 { close(log) }
        return .child(readinessFD: fds[1])
    }
}
