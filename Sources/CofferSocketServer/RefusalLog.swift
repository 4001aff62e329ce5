package import CofferSystem
package import Logging

/// Lines about refused requests or dropped connections, at most one per kind per interval
/// (``LogThrottle``, config key `log-repeat-interval`): whatever a client can repeat at will.
package struct RefusalLog: Sendable {
    let logger: Logger
    let throttle: LogThrottle

    package init(logger: Logger, throttle: LogThrottle) {
        self.logger = logger
        self.throttle = throttle
    }

    /// A line at `level` (a warning unless said), unless one for `key` went out less than the interval
    /// ago; the next one that gets through says how many were left out.
    package func log(_ key: String, _ message: Logger.Message, peer: PeerIdentity?, level: Logger.Level = .warning,
             metadata more: Logger.Metadata = [:]) {
        guard let suppressed = throttle.admit(key) else { return }
        var metadata = more
        if let peer { metadata["peer"] = "\(peer)" }
        if suppressed > 0 { metadata["suppressed"] = "\(suppressed) like it since the last such line" }
        logger.log(level: level, message, metadata: metadata)
    }
}
