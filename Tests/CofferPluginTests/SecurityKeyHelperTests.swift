import CofferCrypto
import CofferPluginClient
import CofferPluginHost
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// `coffer-plugin-host --sk-sign`, the process one FIDO signature runs in (issue #43): its request and
/// reply as the client writes and the host reads them (and the other way round), and the real host
/// binary with test middlewares written against coffer/coffer_sk_api.h: every argument arrives, and a
/// middleware that refuses, crashes, hangs, is of another API version or may be written by others ends
/// in an error that says so.
@Suite struct SecurityKeyHelperTests {
    static func secure(_ bytes: [UInt8]) -> SecureBytes { bytes.withUnsafeBytes { SecureBytes(copying: $0) } }

    static func request(middleware: String, handle: [UInt8] = [9, 8, 7, 0, 6], data: [UInt8] = Array("data to sign".utf8)) -> SecurityKeySignRequest {
        SecurityKeySignRequest(middleware: middleware, algorithm: 1, application: "ssh:test", flags: 0x21, keyHandle: secure(handle), data: data)
    }

    @Test func theClientsRequestIsWhatTheHelperReads() throws {
        let frame = Self.request(middleware: "/usr/lib/sk.so").encodeFrame()
        let length = frame.prefix(4).reduce(0) { $0 << 8 | Int($1) }
        #expect(length == frame.count - 4)
        let decoded = try #require(SecurityKeyHelper.decodeRequest(Array(frame.dropFirst(4))))
        #expect(decoded.middleware == "/usr/lib/sk.so" && decoded.algorithm == 1 && decoded.application == "ssh:test" && decoded.flags == 0x21)
        #expect(decoded.keyHandle.withUnsafeBytes { Array($0) } == [9, 8, 7, 0, 6] && decoded.data == Array("data to sign".utf8))
        // Cut short, with a byte after it, another version, a NUL in a C string: refused.
        let body = Array(frame.dropFirst(4))
        #expect(SecurityKeyHelper.decodeRequest(Array(body.dropLast())) == nil)
        #expect(SecurityKeyHelper.decodeRequest(body + [0]) == nil)
        #expect(SecurityKeyHelper.decodeRequest([2] + body.dropFirst()) == nil)
        let nul = SecurityKeySignRequest(middleware: "/usr/lib/sk.so", algorithm: 1, application: "ssh:\u{0}x", flags: 1,
                                         keyHandle: Self.secure([1]), data: []).encodeFrame()
        #expect(SecurityKeyHelper.decodeRequest(Array(nul.dropFirst(4))) == nil)
    }

    @Test func theHelpersRepliesAreWhatTheClientReads() throws {
        func body(_ frame: [UInt8]) -> [UInt8] { Array(frame.dropFirst(4)) }
        let signed = try SecurityKeyMiddleware.decodeReply(body(SecurityKeyHelper.signedReply(flags: 5, counter: 0x1234_5678, r: [1, 2], s: [3])))
        #expect(signed == SecurityKeyResponse(flags: 5, counter: 0x1234_5678, r: [1, 2], s: [3]))
        #expect(throws: SecurityKeyError.middleware(code: -4)) { try SecurityKeyMiddleware.decodeReply(body(SecurityKeyHelper.middlewareErrorReply(-4))) }
        #expect(throws: SecurityKeyError.refused("why")) { try SecurityKeyMiddleware.decodeReply(body(SecurityKeyHelper.refusedReply("why"))) }
        let good = body(SecurityKeyHelper.signedReply(flags: 5, counter: 1, r: [1], s: []))
        for bad in [Array(good.dropLast()), good + [0], [3] + good.dropFirst(), []] {
            #expect(throws: SecurityKeyError.malformedReply) { try SecurityKeyMiddleware.decodeReply(bad) }
        }
        #expect(SecurityKeyError.middleware(code: -4).description.contains("no authenticator found"))
    }

    /// A test middleware: `sk_api_version` returns `version`; `sk_sign` runs `body` (C, with the
    /// arguments as sk-api.h names them), built against coffer/coffer_sk_api.h.
    static func middleware(version: String = "COFFER_SK_VERSION_MAJOR", body: String) -> String {
        """
        #include <stdlib.h>
        #include <string.h>
        #include <signal.h>
        #include <unistd.h>
        #include "coffer/coffer_sk_api.h"
        uint32_t sk_api_version(void) { return \(version); }
        int sk_enroll(void) { return COFFER_SK_ERR_UNSUPPORTED; }
        int sk_load_resident_keys(void) { return COFFER_SK_ERR_UNSUPPORTED; }
        int sk_sign(uint32_t alg, const uint8_t *data, size_t data_len, const char *application, const uint8_t *key_handle,
                    size_t key_handle_len, uint8_t flags, const char *pin, struct coffer_sk_option **options,
                    struct coffer_sk_sign_response **sign_response) {
            \(body)
        }
        """
    }

    /// Echoes what it got: r is the key handle and the application, s the data's last 64 bytes; the
    /// flags come back with bit 7 set, the counter is alg × 1,000,000 + the data's length; a PIN or
    /// options given would fail it.
    static let echo = middleware(body: """
        if (pin != NULL || options != NULL || data_len < 64) return -1;
        size_t app_len = strlen(application);
        struct coffer_sk_sign_response *r = calloc(1, sizeof(*r));
        r->flags = flags | 0x80; r->counter = alg * 1000000 + (uint32_t)data_len;
        r->sig_r = malloc(key_handle_len + app_len); r->sig_r_len = key_handle_len + app_len;
        memcpy(r->sig_r, key_handle, key_handle_len); memcpy(r->sig_r + key_handle_len, application, app_len);
        r->sig_s = malloc(64); memcpy(r->sig_s, data + data_len - 64, 64); r->sig_s_len = 64;
        *sign_response = r;
        return 0;
        """)

    @Test(.enabled(if: PluginBinaries.available && PluginBinaries.haveCC, "needs the built coffer-plugin-host and a C compiler"))
    func theHelperPassesEverythingToTheMiddlewareAndBack() throws {
        let sandbox = try PluginSandbox(plugins: [:])
        try sandbox.compile(Self.echo, as: "echo.so")
        let helper = SecurityKeyMiddleware(executable: PluginBinaries.host, logFile: sandbox.logFile, timeout: 60)
        let data = [UInt8](0...255) + [UInt8](repeating: 0xAB, count: 100_000)
        let response = try helper.sign(Self.request(middleware: sandbox.pluginDir + "/echo.so", data: data))
        #expect(response == SecurityKeyResponse(flags: 0xA1, counter: 1_000_000 + UInt32(data.count), r: [9, 8, 7, 0, 6] + Array("ssh:test".utf8),
                                                s: Array(data.suffix(64))))
    }

    @Test(.enabled(if: PluginBinaries.available && PluginBinaries.haveCC, "needs the built coffer-plugin-host and a C compiler"))
    func aFailingMiddlewareEndsInAnErrorThatSaysWhy() throws {
        let sandbox = try PluginSandbox(plugins: [:])
        try sandbox.compile(Self.middleware(body: "return -4;"), as: "nodevice.so")
        try sandbox.compile(Self.middleware(body: "raise(SIGSEGV); return 0;"), as: "crash.so")
        try sandbox.compile(Self.middleware(body: "*sign_response = calloc(1, sizeof(**sign_response)); return 0;"), as: "empty.so")
        try sandbox.compile(Self.middleware(version: "0x00090000", body: "return 0;"), as: "older.so")
        try sandbox.compile("int sk_api_version_not(void) { return 0; }\n", as: "other.so")
        try sandbox.compile(Self.echo, as: "writable.so")
        chmod(sandbox.pluginDir + "/writable.so", 0o666)
        let helper = SecurityKeyMiddleware(executable: PluginBinaries.host, logFile: sandbox.logFile, timeout: 60)
        func failure(_ name: String) -> SecurityKeyError? {
            do {
                _ = try helper.sign(Self.request(middleware: name.hasPrefix("relative") ? name : sandbox.pluginDir + "/" + name))
                Issue.record("\(name) signed")
                return nil
            } catch {
                return error
            }
        }
        #expect(failure("nodevice.so") == .middleware(code: -4))
        // Under a sanitizer (contrib/sanitizers.sh) the host's SIGSEGV handler is the sanitizer's, which reports the
        // crash and exits (AddressSanitizer 1, ThreadSanitizer 66): the helper still ends without an answer, by that
        // exit status instead of the signal.
        let crashed: SecurityKeyError = switch ProcessInfo.processInfo.environment["COFFER_SANITIZED"] {
        case "address": .helperEnded("exit status 1")
        case "thread": .helperEnded("exit status 66")
        default: .helperEnded("killed by signal \(SIGSEGV), Segmentation fault")
        }
        #expect(failure("crash.so") == crashed)
        #expect(failure("empty.so").map { "\($0)".contains("returned no signature") } == true)
        #expect(failure("older.so").map { "\($0)".contains("implements the middleware API version 0x00090000, not 0x000a0000") } == true)
        #expect(failure("other.so").map { "\($0)".contains("not an OpenSSH FIDO middleware") } == true)
        #expect(failure("writable.so").map { "\($0)".contains("world-writable") } == true)
        #expect(failure("missing.so").map { "\($0)".contains("cannot be opened (No such file or directory)") } == true)
        #expect(failure("relative.so").map { "\($0)".contains("is not an absolute path") } == true)
        // A crash leaves no backtrace (registers, memory) in the log.
        #expect(!sandbox.log.contains("Registers:"), "\(sandbox.log)")
    }

    /// A middleware that never answers is killed at the deadline; the caller is not held longer.
    @Test(.enabled(if: PluginBinaries.available && PluginBinaries.haveCC, "needs the built coffer-plugin-host and a C compiler"))
    func aHangingMiddlewareIsKilledAtTheDeadline() throws {
        let sandbox = try PluginSandbox(plugins: [:])
        try sandbox.compile(Self.middleware(body: "for (;;) pause(); return 0;"), as: "hang.so")
        let helper = SecurityKeyMiddleware(executable: PluginBinaries.host, logFile: sandbox.logFile, timeout: 2)
        let started = Date()
        #expect(throws: SecurityKeyError.timedOut(seconds: 2)) { try helper.sign(Self.request(middleware: sandbox.pluginDir + "/hang.so")) }
        // Killed at the deadline, not waited for: far less than the minute a slow machine could add.
        #expect(Date().timeIntervalSince(started) < 60)
        // No helper is left running.
        let left = runProcess("/usr/bin/pgrep", ["-f", "coffer-plugin-host --sk-sign --log-file \(sandbox.logFile)"], timeout: 60)
        #expect(left.stdout.isEmpty, "\(left)")
    }

    // MARK: OpenSSH's ssh-sk-helper, for `internal`

    /// An sk-ssh-ed25519@openssh.com key as `sshkey_private_serialize` writes it (ADD_IDENTITY's form).
    static func serializedKey(handle: [UInt8]) -> SecureBytes {
        var b: [UInt8] = []
        func string(_ x: [UInt8]) { b += [UInt8(x.count >> 24), UInt8(x.count >> 16 & 0xff), UInt8(x.count >> 8 & 0xff), UInt8(x.count & 0xff)] + x }
        string(Array("sk-ssh-ed25519@openssh.com".utf8)); string([UInt8](repeating: 0x11, count: 32)); string(Array("ssh:test".utf8))
        b.append(0x01); string(handle); string([])
        return secure(b)
    }

    static let openSSHHelperInstalled = FileManager.default.isExecutableFile(atPath: OpenSSHSecurityKeyHelper.defaultPath)

    /// Through OpenSSH's own helper, with a test middleware it loads: the key, the application, the
    /// data and the flags arrive (as the echo middleware shows), and the signature blob comes back as
    /// OpenSSH assembles it (type, signature, flags, counter).
    @Test(.enabled(if: PluginBinaries.haveCC && SecurityKeyHelperTests.openSSHHelperInstalled,
                   "needs a C compiler and OpenSSH's ssh-sk-helper (apt: openssh-client)"))
    func openSSHsHelperSignsThroughTheMiddlewareItIsGiven() throws {
        let sandbox = try PluginSandbox(plugins: [:])
        try sandbox.compile(Self.echo, as: "echo.so")
        let data = [UInt8](repeating: 0x5A, count: 1000)
        let blob = try OpenSSHSecurityKeyHelper().sign(key: Self.serializedKey(handle: [9, 8, 7]), provider: sandbox.pluginDir + "/echo.so", data: data)
        var expected: [UInt8] = []
        func string(_ x: [UInt8]) { expected += [UInt8(x.count >> 24), UInt8(x.count >> 16 & 0xff), UInt8(x.count >> 8 & 0xff), UInt8(x.count & 0xff)] + x }
        string(Array("sk-ssh-ed25519@openssh.com".utf8))
        string([9, 8, 7] + Array("ssh:test".utf8))
        expected.append(0x81)
        let counter = UInt32(1_000_000 + data.count)
        expected += [UInt8(counter >> 24), UInt8(counter >> 16 & 0xff), UInt8(counter >> 8 & 0xff), UInt8(counter & 0xff)]
        #expect(blob == expected)
        // The middleware's error comes back as OpenSSH's (SSH_SK_ERR_DEVICE_NOT_FOUND → SSH_ERR_DEVICE_NOT_FOUND).
        try sandbox.compile(Self.middleware(body: "return COFFER_SK_ERR_DEVICE_NOT_FOUND;"), as: "nodevice.so")
        #expect(throws: SecurityKeyError.openSSH(code: -60)) {
            try OpenSSHSecurityKeyHelper().sign(key: Self.serializedKey(handle: [1]), provider: sandbox.pluginDir + "/nodevice.so", data: [1])
        }
        #expect(SecurityKeyError.openSSH(code: -60).description.contains("no authenticator found"))
    }

    @Test func openSSHsHelperRepliesAreRead() throws {
        #expect(try OpenSSHSecurityKeyHelper.decodeReply([5, 0, 0, 0, 1, 0, 0, 0, 2, 0xAB, 0xCD]) == [0xAB, 0xCD])
        #expect(throws: SecurityKeyError.openSSH(code: -60)) { try OpenSSHSecurityKeyHelper.decodeReply([5, 0, 0, 0, 0, 0, 0, 0, 60]) }
        for bad: [UInt8] in [[4, 0, 0, 0, 1, 0, 0, 0, 0], [5, 0, 0, 0, 1, 0, 0, 0, 2, 0xAB], [5, 0, 0, 0, 1, 0, 0, 0, 0, 0], [5, 0, 0, 0, 2], [5]] {
            #expect(throws: SecurityKeyError.malformedReply) { try OpenSSHSecurityKeyHelper.decodeReply(bad) }
        }
    }
}
