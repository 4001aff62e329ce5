import CofferSystem
import Logging

/// Where a daemonised agent's log lines go: `cofferd.log` in the state directory, rotated by size
/// (``CofferSystem/RotatingLogFile``; config keys `log-max-bytes` and `log-keep`). swift-log's
/// ``Logging/StreamLogHandler`` formats each line (as it formats them on standard error in the
/// foreground) and writes it here whole, in one call.
struct RotatingLogStream: TextOutputStream, Sendable {
    let file: RotatingLogFile

    mutating func write(_ string: String) { file.append(Array(string.utf8)) }
}

extension AgentMain {
    /// The log handlers of `cofferd`: a daemon's lines go to its rotated `cofferd.log` (standard
    /// error, where ``CofferSystem/ThisProcess/daemonize(logFile:)`` opened it), otherwise to
    /// standard error as they are (systemd's journal, a terminal, a test's file).
    static func bootstrapLogging(level: Logger.Level, daemonLog: RotatingLogFile?) {
        LoggingSystem.bootstrap { label in
            var h = daemonLog.map { StreamLogHandler(label: label, stream: RotatingLogStream(file: $0)) }
                ?? StreamLogHandler.standardError(label: label)
            h.logLevel = level
            return h
        }
    }
}
