import CCofferPlugin
package import CofferCrypto
import CofferPluginProtocol
import CofferSystem
import Glibc

/// `coffer-plugin-host --sk-sign [--log-file FILE]`: one signature by a FIDO key through OpenSSH's
/// middleware interface (coffer_sk_api.h), in a process of its own, as OpenSSH's agent runs
/// `ssh-sk-helper` for each signature: the agent, which holds the class keys, never loads a
/// middleware, and a middleware that crashes or hangs takes down only this process.
///
/// The agent starts it with a socket on descriptor 3, writes one request and reads one reply; the
/// process exits after replying. Both are a frame, `uint32 length ‖ body` (a body of at most
/// ``maximumBodyBytes``), in the SSH wire encoding (RFC 4251 §5):
///
/// request: `byte version (1)`, `string middleware` (an absolute path, as the agent resolved and
/// allowed it), `uint32 algorithm` (sk-api's: 0 ECDSA P-256, 1 ed25519), `string application`,
/// `byte flags`, `string key handle`, `string data`.
///
/// reply, one of:
/// - `byte 0`, `byte flags`, `uint32 counter`, `string r`, `string s`: the middleware signed (ed25519:
///   the 64-byte signature in r, s empty; ECDSA: r and s as big-endian magnitudes);
/// - `byte 1`, `uint32 code`: the middleware returned this error (sk-api's negative codes, e.g. -4:
///   no device);
/// - `byte 2`, `string reason`: the request was malformed, or the middleware could not be used (not a
///   regular file, owned by someone other than root or the user, writable by group or others, not
///   loadable, no `sk_api_version` or `sk_sign`, another major API version than 0x000a0000, no
///   signature in its response).
///
/// The middleware file is opened with `O_NOFOLLOW`, checked on its descriptor (``StrictModes``) and
/// loaded through `/proc/self/fd`, so what was checked is what is loaded. It is called with no PIN
/// and no options (OpenSSH's agent passes none either). The key handle is wiped once the call returns.
package enum SecurityKeyHelper {
    /// The request's format version.
    package static let version: UInt8 = 1
    /// The largest frame body either side sends: the agent's own frames are at most 256 KiB.
    package static let maximumBodyBytes = 512 * 1024

    /// The reply kinds.
    package enum ReplyKind: UInt8 {
        case signed = 0
        case middlewareError = 1
        case refused = 2
    }

    /// A decoded request. The key handle is in guarded memory.
    package struct Request {
        package var middleware: String
        package var algorithm: UInt32
        package var application: String
        package var flags: UInt8
        package var keyHandle: SecureBytes
        package var data: [UInt8]
    }

    /// Decodes a request body (the frame's body); nil if it is malformed.
    package static func decodeRequest(_ body: [UInt8]) -> Request? {
        var r = HelperWireReader(body)
        guard r.byte() == version, let middleware = r.text(), let algorithm = r.uint32(), let application = r.text(),
              let flags = r.byte(), let handle = r.secureString(), let data = r.string(), r.atEnd else { return nil }
        return Request(middleware: middleware, algorithm: algorithm, application: application, flags: flags, keyHandle: handle, data: data)
    }

    /// The whole reply frame for a signature.
    package static func signedReply(flags: UInt8, counter: UInt32, r: [UInt8], s: [UInt8]) -> [UInt8] {
        var w = HelperWireWriter()
        w.byte(ReplyKind.signed.rawValue); w.byte(flags); w.uint32(counter); w.string(r); w.string(s)
        return w.frame
    }

    /// The whole reply frame for a middleware's error code.
    package static func middlewareErrorReply(_ code: Int32) -> [UInt8] {
        var w = HelperWireWriter()
        w.byte(ReplyKind.middlewareError.rawValue); w.uint32(UInt32(bitPattern: code))
        return w.frame
    }

    /// The whole reply frame for a refusal.
    package static func refusedReply(_ reason: String) -> [UInt8] {
        var w = HelperWireWriter()
        w.byte(ReplyKind.refused.rawValue); w.string(Array(sanitizedText(reason, max: 1000).utf8))
        return w.frame
    }

    /// The process's main (after `--sk-sign`): 0 once a reply was written, 1 if none could be, 2 for a usage error.
    package static func run(_ arguments: [String]) -> Int32 {
        do { try ProcessHardening.disableCoreDumps() } catch {
            hostLog("cannot make the process non-dumpable: \(error)")
            return 1
        }
        var i = 0
        while i < arguments.count {
            if arguments[i] == "--log-file", i + 1 < arguments.count {
                guard let log = try? FileDescriptor.open(arguments[i + 1], O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW, mode: 0o600),
                      (try? Syscall.retrying("dup2", "the log file") { dup2(log.rawValue, 2) }) != nil
                else { hostLog("cannot open the log file"); return 1 }
                i += 2
                continue
            }
            hostLog("usage: coffer-plugin-host --sk-sign [--log-file FILE]")
            return 2
        }
        // A middleware writes nothing to the agent's standard streams but its log (stderr).
        if let null = try? FileDescriptor.open("/dev/null", O_RDWR) {
            _ = dup2(null.rawValue, 0)
            _ = dup2(null.rawValue, 1)
        }
        var st = stat()
        guard (try? Syscall.retrying("fstat", "fd 3") { unsafe fstat(3, &st) }) != nil, st.st_mode & S_IFMT == S_IFSOCK else {
            hostLog("descriptor 3 is not the agent's socket")
            return 2
        }
        guard let header = UnixSocket.readExactly(3, count: 4) else { return 1 }
        let length = header.reduce(0) { $0 << 8 | Int($1) }
        guard length > 0, length <= maximumBodyBytes else {
            return UnixSocket.writeAll(3, refusedReply("a request of \(length) bytes")) ? 0 : 1
        }
        guard var body = UnixSocket.readExactly(3, count: length) else { return 1 }
        let decoded = decodeRequest(body)
        secureZero(&body)
        guard let request = decoded else { return UnixSocket.writeAll(3, refusedReply("a malformed request")) ? 0 : 1 }
        let reply = sign(request)
        return UnixSocket.writeAll(3, reply) ? 0 : 1
    }

    /// Loads the request's middleware and signs; the reply frame.
    static func sign(_ request: Request) -> [UInt8] {
        let middleware: Middleware
        switch loadMiddleware(request.middleware) {
        case .success(let m): middleware = m
        case .failure(let refusal):
            hostLog("sk-sign: refused \(request.middleware): \(refusal.text)")
            return refusedReply("the middleware \(request.middleware) \(refusal.text)")
        }
        var response: UnsafeMutablePointer<coffer_sk_sign_response>? = nil
        let rc: Int32 = unsafe request.application.withCString { application in
            unsafe request.data.withUnsafeBufferPointer { data in
                unsafe request.keyHandle.withUnsafeBytes { handle in
                    unsafe middleware.sign(request.algorithm, data.baseAddress, data.count, application,
                                           handle.baseAddress?.assumingMemoryBound(to: UInt8.self), handle.count,
                                           request.flags, nil, nil, &response)
                }
            }
        }
        request.keyHandle.wipe()
        guard rc == 0 else {
            if let response = unsafe response { unsafe free(response: response) }
            return middlewareErrorReply(rc)
        }
        guard let response = unsafe response else { return refusedReply("the middleware \(request.middleware) returned no response") }
        defer { unsafe free(response: response) }
        let p = unsafe response.pointee
        guard let r = unsafe p.sig_r, unsafe p.sig_r_len > 0, unsafe p.sig_r_len <= 1024, unsafe p.sig_s_len <= 1024 else {
            return refusedReply("the middleware \(request.middleware) returned no signature")
        }
        let rBytes = unsafe Array(UnsafeBufferPointer(start: r, count: p.sig_r_len))
        let sBytes: [UInt8] = unsafe p.sig_s.map { unsafe Array(UnsafeBufferPointer(start: $0, count: p.sig_s_len)) } ?? []
        return unsafe signedReply(flags: p.flags, counter: p.counter, r: rBytes, s: sBytes)
    }

    /// Frees a response as OpenSSH's `sshsk_free_sign_response` does (the middleware allocated it with malloc).
    static func free(response: UnsafeMutablePointer<coffer_sk_sign_response>) {
        unsafe Glibc.free(response.pointee.sig_r)
        unsafe Glibc.free(response.pointee.sig_s)
        unsafe Glibc.free(response)
    }

    struct Refusal: Error { let text: String; init(_ t: String) { text = t } }

    /// A loaded middleware's `sk_sign`.
    @safe struct Middleware {
        // @safe: the function lives as long as the library, which this short process never unloads.
        let sign: coffer_sk_sign_fn
    }

    /// Opens, checks and loads the middleware at `path`; its `sk_sign`, after its API version was checked.
    static func loadMiddleware(_ path: String) -> Result<Middleware, Refusal> {
        guard path.hasPrefix("/") else { return .failure(Refusal("is not an absolute path")) }
        let fd: Int32
        do throws(SystemError) { fd = try FileDescriptor.open(path, O_RDONLY | O_NOFOLLOW).release() } catch {
            return .failure(Refusal(unsafe "cannot be opened (\(String(cString: strerror(error.errno))))"))
        }
        // The descriptor stays open for the life of this short process: the library is never unloaded.
        var st = stat()
        guard (try? Syscall.retrying("fstat", path) { unsafe fstat(fd, &st) }) != nil else {
            return .failure(Refusal("cannot be examined"))
        }
        guard st.st_mode & S_IFMT == S_IFREG else { return .failure(Refusal("is not a regular file")) }
        if let p = StrictModes.problem(st, what: "file", requireRoot: false) { return .failure(Refusal(p)) }
        _ = unsafe dlerror()
        guard let handle = unsafe dlopen("/proc/self/fd/\(fd)", RTLD_NOW | RTLD_LOCAL) else {
            let why = unsafe dlerror().map { unsafe String(cString: $0) } ?? "unknown error"
            return .failure(Refusal("cannot be loaded: \(why.split(separator: ":").last.map { $0.trimmingCharacters() } ?? why)"))
        }
        guard let versionSymbol = unsafe dlsym(handle, COFFER_SK_API_VERSION_SYMBOL),
              let signSymbol = unsafe dlsym(handle, COFFER_SK_SIGN_SYMBOL) else {
            return .failure(Refusal("is not an OpenSSH FIDO middleware (no sk_api_version or sk_sign)"))
        }
        let version = unsafe unsafeBitCast(versionSymbol, to: coffer_sk_api_version_fn.self)()
        guard version & UInt32(COFFER_SK_VERSION_MAJOR_MASK) == UInt32(COFFER_SK_VERSION_MAJOR) else {
            return .failure(Refusal("implements the middleware API version 0x\(hex8(version)), not 0x\(hex8(UInt32(COFFER_SK_VERSION_MAJOR)))"))
        }
        return unsafe .success(Middleware(sign: unsafeBitCast(signSymbol, to: coffer_sk_sign_fn.self)))
    }

    static func hex8(_ v: UInt32) -> String {
        let digits = String(v, radix: 16)
        return String(repeating: "0", count: max(0, 8 - digits.count)) + digits
    }
}

/// Reads the helper protocol's SSH wire fields; every read returns nil past the end.
struct HelperWireReader {
    private let bytes: [UInt8]
    private var offset = 0
    init(_ bytes: [UInt8]) { self.bytes = bytes }

    var atEnd: Bool { offset == bytes.count }

    mutating func byte() -> UInt8? {
        guard offset < bytes.count else { return nil }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func uint32() -> UInt32? {
        guard bytes.count - offset >= 4 else { return nil }
        defer { offset += 4 }
        return bytes[offset..<offset + 4].reduce(0) { $0 << 8 | UInt32($1) }
    }

    private mutating func range() -> Range<Int>? {
        guard let n = uint32().map(Int.init), bytes.count - offset >= n else { return nil }
        defer { offset += n }
        return offset..<offset + n
    }

    mutating func string() -> [UInt8]? { range().map { Array(bytes[$0]) } }

    /// A `string` of UTF-8 text without NUL (it becomes a C string).
    mutating func text() -> String? {
        guard let raw = string(), !raw.contains(0), let s = String(validating: raw, as: UTF8.self) else { return nil }
        return s
    }

    /// A `string` copied straight into guarded memory.
    mutating func secureString() -> SecureBytes? {
        guard let r = range() else { return nil }
        return unsafe bytes.withUnsafeBytes { unsafe SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[r])) }
    }
}

/// Writes the helper protocol's SSH wire fields (public data only).
struct HelperWireWriter {
    private(set) var bytes: [UInt8] = []
    mutating func byte(_ b: UInt8) { bytes.append(b) }
    mutating func uint32(_ v: UInt32) { bytes += [UInt8(v >> 24), UInt8(v >> 16 & 0xff), UInt8(v >> 8 & 0xff), UInt8(v & 0xff)] }
    mutating func string(_ b: [UInt8]) { uint32(UInt32(b.count)); bytes += b }
    /// The bytes with their length prefix.
    var frame: [UInt8] {
        var w = HelperWireWriter()
        w.uint32(UInt32(bytes.count))
        return w.bytes + bytes
    }
}
