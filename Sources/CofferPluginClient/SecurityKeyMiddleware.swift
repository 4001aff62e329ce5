package import CofferCrypto
import CofferSystem
import Glibc

/// Why a FIDO signature did not come back from the middleware.
package enum SecurityKeyError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The middleware's `sk_sign` returned this error code (OpenSSH's sk-api.h: -1 general, -2
    /// unsupported, -3 PIN required, -4 no device, -5 credential exists).
    case middleware(code: Int32)
    /// The helper could not use the middleware (the reason it gave: not a regular file, not loadable,
    /// another API version, no signature in its response, …).
    case refused(String)
    /// The helper ended without an answer: it crashed (the middleware with it) or exited.
    case helperEnded(String)
    /// No answer within the deadline: the helper was killed.
    case timedOut(seconds: Double)
    /// The helper could not be started.
    case unavailable(String)
    /// The helper's answer was not one this client can read.
    case malformedReply
    /// OpenSSH's `ssh-sk-helper` answered this error (OpenSSH's negative `SSH_ERR_*` code, e.g. -60:
    /// no device).
    case openSSH(code: Int32)

    package var description: String {
        switch self {
        case .middleware(let code):
            let meaning: String = switch code {
            case -2: "unsupported"
            case -3: "a PIN is required"
            case -4: "no authenticator found"
            case -5: "the credential exists"
            default: "general error"
            }
            return "the middleware failed: \(meaning) (\(code))"
        case .refused(let why): return "the middleware could not be used: \(why)"
        case .helperEnded(let how): return "the middleware's process ended without an answer (\(how))"
        case .timedOut(let s): return "no answer from the authenticator within \(Int(s)) s (its process was killed)"
        case .unavailable(let why): return "the middleware's process could not start: \(why)"
        case .malformedReply: return "the middleware's process answered something unreadable"
        case .openSSH(let code):
            let meaning: String = switch code {
            case -60: "no authenticator found"
            case -59: "unsupported"
            case -43: "a PIN is required"
            case -44: "the credential exists"
            case -24: "a system error"
            default: "error"
            }
            return "OpenSSH's ssh-sk-helper failed: \(meaning) (\(code))"
        }
    }
}

/// One signature an authenticator made through the middleware: what sk-api's `sk_sign_response`
/// holds. ed25519: the 64-byte signature in ``r``, ``s`` empty; ECDSA: r and s, big-endian.
package struct SecurityKeyResponse: Sendable, Equatable {
    package var flags: UInt8
    package var counter: UInt32
    package var r: [UInt8]
    package var s: [UInt8]

    package init(flags: UInt8, counter: UInt32, r: [UInt8], s: [UInt8]) {
        self.flags = flags; self.counter = counter; self.r = r; self.s = s
    }
}

/// A signature to ask of a FIDO middleware.
package struct SecurityKeySignRequest: Sendable {
    /// The middleware's absolute, resolved path.
    package var middleware: String
    /// sk-api's algorithm number (0 ECDSA P-256, 1 ed25519).
    package var algorithm: UInt32
    package var application: String
    package var flags: UInt8
    package var keyHandle: SecureBytes
    /// The data to sign (the middleware hashes it).
    package var data: [UInt8]

    package init(middleware: String, algorithm: UInt32, application: String, flags: UInt8, keyHandle: SecureBytes, data: [UInt8]) {
        self.middleware = middleware; self.algorithm = algorithm; self.application = application
        self.flags = flags; self.keyHandle = keyHandle; self.data = data
    }

    /// The request frame of `coffer-plugin-host --sk-sign` (CofferPluginHost's `SecurityKeyHelper`
    /// documents it). It holds the key handle: the caller wipes it once written.
    package func encodeFrame() -> [UInt8] {
        let size = 64 + middleware.utf8.count + application.utf8.count + keyHandle.count + data.count
        var body: [UInt8] = []
        body.reserveCapacity(size + 4)
        func uint32(_ v: UInt32) { body += [UInt8(v >> 24), UInt8(v >> 16 & 0xff), UInt8(v >> 8 & 0xff), UInt8(v & 0xff)] }
        func string(_ b: [UInt8]) { uint32(UInt32(b.count)); body += b }
        uint32(0)   // the length, filled in below
        body.append(1)
        string(Array(middleware.utf8))
        uint32(algorithm)
        string(Array(application.utf8))
        body.append(flags)
        uint32(UInt32(keyHandle.count))
        keyHandle.withUnsafeBytes { body.append(contentsOf: $0) }
        string(data)
        let n = UInt32(body.count - 4)
        body[0] = UInt8(n >> 24); body[1] = UInt8(n >> 16 & 0xff); body[2] = UInt8(n >> 8 & 0xff); body[3] = UInt8(n & 0xff)
        return body
    }
}

/// Runs one FIDO signature in `coffer-plugin-host --sk-sign`, a process of its own started for it
/// (as OpenSSH's agent runs `ssh-sk-helper`): the calling process never loads the middleware, and a
/// middleware that crashes or hangs ends only that process. Blocks the calling thread until the
/// answer, the helper's end or ``timeout``.
package struct SecurityKeyMiddleware: Sendable {
    /// Absolute path of `coffer-plugin-host`.
    package var executable: String
    /// A file the helper appends its log to (the middleware's own messages too), instead of inheriting stderr.
    package var logFile: String?
    /// How long a signature may take: a person has this long to touch the key.
    package var timeout: Double

    package init(executable: String, logFile: String? = nil, timeout: Double = 60) {
        self.executable = executable
        self.logFile = logFile
        self.timeout = timeout
    }

    /// Asks the middleware for one signature.
    package func sign(_ request: SecurityKeySignRequest) throws(SecurityKeyError) -> SecurityKeyResponse {
        var frame = request.encodeFrame()
        defer { secureZero(&frame) }
        // Its environment is empty but for this: a crash (a middleware's) writes no backtrace, whose
        // register and memory dumps could carry the key handle into the log.
        let body = try HelperExchange.run(executable: executable, arguments: ["--sk-sign"] + (logFile.map { ["--log-file", $0] } ?? []),
                                          environment: ["SWIFT_BACKTRACE=enable=no"], socketAt: [3], frame: frame, timeout: timeout)
        return try Self.decodeReply(body)
    }

    /// Decodes the helper's reply body.
    package static func decodeReply(_ body: [UInt8]) throws(SecurityKeyError) -> SecurityKeyResponse {
        var offset = 0
        func byte() throws(SecurityKeyError) -> UInt8 {
            guard offset < body.count else { throw .malformedReply }
            defer { offset += 1 }
            return body[offset]
        }
        func uint32() throws(SecurityKeyError) -> UInt32 {
            guard body.count - offset >= 4 else { throw .malformedReply }
            defer { offset += 4 }
            return body[offset..<offset + 4].reduce(0) { $0 << 8 | UInt32($1) }
        }
        func string() throws(SecurityKeyError) -> [UInt8] {
            let n = Int(try uint32())
            guard body.count - offset >= n else { throw .malformedReply }
            defer { offset += n }
            return Array(body[offset..<offset + n])
        }
        let result: Result<SecurityKeyResponse, SecurityKeyError>
        switch try byte() {
        case 0:
            let flags = try byte(), counter = try uint32(), r = try string(), s = try string()
            result = .success(SecurityKeyResponse(flags: flags, counter: counter, r: r, s: s))
        case 1:
            result = .failure(.middleware(code: Int32(bitPattern: try uint32())))
        case 2:
            guard let why = String(validating: try string(), as: UTF8.self) else { throw .malformedReply }
            result = .failure(.refused(why))
        default:
            throw .malformedReply
        }
        guard offset == body.count else { throw .malformedReply }
        return try result.get()
    }
}

/// One request to a helper process started for it, and its answer: the frame is written on the
/// socket the child has on `socketAt`, one `uint32 length ‖ body` answer (at most
/// ``maximumReplyBytes``) is read by the deadline, and the child is reaped (killed at the deadline).
enum HelperExchange {
    /// A longer answer than any signature needs is malformed.
    static let maximumReplyBytes = 16 * 1024

    enum ReadFailure: Error { case eof, timeout, tooLong }

    /// The answer's body; ``SecurityKeyError/helperEnded(_:)`` (how it ended), ``SecurityKeyError/timedOut(seconds:)``
    /// or ``SecurityKeyError/malformedReply`` without one.
    static func run(executable: String, arguments: [String], environment: [String], socketAt: [Int32], frame: [UInt8],
                    timeout: Double) throws(SecurityKeyError) -> [UInt8] {
        let child: Subprocess.Child
        do {
            child = try Subprocess.spawn(executable: executable, arguments: arguments, environment: environment, socketAt: socketAt)
        } catch {
            throw .unavailable("\(error)")
        }
        let pid = child.pid
        let socket = child.takeSocket()
        let deadline = Threads.monotonicSeconds() + timeout
        let reply = UnixSocket.writeAll(socket.rawValue, frame) ? readReply(socket.rawValue, deadline: deadline) : .failure(.eof)
        try? socket.close()
        let status = reap(pid, deadline: reply.isTimeout ? 0 : deadline)
        switch reply {
        case .success(let body): return body
        case .failure(.timeout): throw .timedOut(seconds: timeout)
        case .failure(.eof): throw .helperEnded(describe(status))
        case .failure(.tooLong): throw .malformedReply
        }
    }

    /// Reads one frame (`uint32 length ‖ body`) by `deadline`.
    static func readReply(_ fd: Int32, deadline: Double) -> Result<[UInt8], ReadFailure> {
        var header = [UInt8](repeating: 0, count: 4)
        if case .failure(let e) = readExactly(fd, into: &header, deadline: deadline) { return .failure(e) }
        let n = header.reduce(0) { $0 << 8 | Int($1) }
        guard n > 0, n <= maximumReplyBytes else { return .failure(.tooLong) }
        var body = [UInt8](repeating: 0, count: n)
        if case .failure(let e) = readExactly(fd, into: &body, deadline: deadline) { return .failure(e) }
        return .success(body)
    }

    private static func readExactly(_ fd: Int32, into buffer: inout [UInt8], deadline: Double) -> Result<Void, ReadFailure> {
        var done = 0
        while done < buffer.count {
            let left = deadline - Threads.monotonicSeconds()
            guard left > 0 else { return .failure(.timeout) }
            guard let ready = try? Poll.readable([fd], timeoutMillis: Int32(min(left, 3600) * 1000) + 1, what: "the sk helper"),
                  ready[0] else { continue }
            let n = buffer.withUnsafeMutableBytes { p in recv(fd, p.baseAddress! + done, p.count - done, 0) }
            if n < 0 && (errno == EINTR || errno == EAGAIN) { continue }
            guard n > 0 else { return .failure(.eof) }
            done += n
        }
        return .success(())
    }

    /// Waits for the helper to exit until `deadline`, then kills it; its exit status (128 + signal).
    static func reap(_ pid: Int32, deadline: Double) -> Int32 {
        var status: Int32 = 0
        while true {
            let r = waitpid(pid, &status, WNOHANG)
            if r == pid { break }
            if r < 0 && errno != EINTR { return -1 }
            if r == 0 && Threads.monotonicSeconds() >= deadline {
                kill(pid, SIGKILL)
                _ = try? Syscall.retrying("waitpid", "the sk helper") { waitpid(pid, &status, 0) }
                break
            }
            if r == 0 { Threads.sleep(seconds: 0.005) }
        }
        return (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
    }

    static func describe(_ status: Int32) -> String {
        if status > 128 {
            let signal = status - 128
            let name = strsignal(signal).map { String(cString: $0) } ?? "signal"
            return "killed by signal \(signal), \(name)"
        }
        return status < 0 ? "its exit status is unknown" : "exit status \(status)"
    }
}

extension Result where Failure == HelperExchange.ReadFailure {
    var isTimeout: Bool {
        if case .failure(.timeout) = self { return true }
        return false
    }
}
