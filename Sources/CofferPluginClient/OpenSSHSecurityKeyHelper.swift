package import CofferCrypto
import CofferSystem
import Glibc

/// OpenSSH's own `ssh-sk-helper` (`/usr/lib/openssh/ssh-sk-helper` on Debian), for the one FIDO
/// middleware OpenSSH has that is not a library: `internal`, its built-in libfido2 support (what
/// `ssh-add` names when no middleware is given). OpenSSH's agent runs the same program, one process
/// per signature; so does this client, through the helper's own protocol (OpenSSH's ssh-sk-client.c
/// and ssh-sk-helper.c, ``version`` 5 since OpenSSH 8.9): a message is `uint32 length ‖ byte version
/// ‖ payload`, on the helper's standard input and output.
///
/// request payload: `uint32 type (1: sign)`, `byte log on stderr (1)`, `uint32 log level (0: quiet)`,
/// `string key` (the FIDO key as `sshkey_private_serialize` writes it: ADD_IDENTITY's form),
/// `string provider`, `string data`, `string algorithm` (empty), `uint32 compat (0)`, `string PIN` (empty).
///
/// reply payload: `uint32 1`, `string signature blob`; or `uint32 0`, `uint32 e` (OpenSSH's error -e).
package struct OpenSSHSecurityKeyHelper: Sendable {
    /// Where Debian's OpenSSH installs it.
    package static let defaultPath = "/usr/lib/openssh/ssh-sk-helper"
    /// The helper protocol's version (OpenSSH's `SSH_SK_HELPER_VERSION`).
    package static let version: UInt8 = 5

    package var executable: String
    /// How long a signature may take: a person has this long to touch the key.
    package var timeout: Double

    package init(executable: String = Self.defaultPath, timeout: Double = 60) {
        self.executable = executable
        self.timeout = timeout
    }

    /// The helper at ``defaultPath``, if it is installed.
    package static var installed: OpenSSHSecurityKeyHelper? {
        access(defaultPath, X_OK) == 0 ? OpenSSHSecurityKeyHelper() : nil
    }

    /// Asks the helper to sign `data` with the FIDO key `key` (its private serialization, which holds
    /// the key handle) through `provider` (`internal`, or a middleware's path); the signature blob,
    /// as OpenSSH's agent sends it. No PIN, as OpenSSH's agent passes none.
    package func sign(key: SecureBytes, provider: String, data: [UInt8]) throws(SecurityKeyError) -> [UInt8] {
        var payload: [UInt8] = []
        payload.reserveCapacity(64 + key.count + provider.utf8.count + data.count)
        func uint32(_ v: UInt32) { payload += [UInt8(v >> 24), UInt8(v >> 16 & 0xff), UInt8(v >> 8 & 0xff), UInt8(v & 0xff)] }
        func string(_ b: [UInt8]) { uint32(UInt32(b.count)); payload += b }
        uint32(UInt32(payload.count))   // the length, filled in below
        payload.append(Self.version)
        uint32(1)                       // SSH_SK_HELPER_SIGN
        payload.append(1)               // log on stderr …
        uint32(0)                       // … at SYSLOG_LEVEL_QUIET: nothing
        uint32(UInt32(key.count))
        key.withUnsafeBytes { payload.append(contentsOf: $0) }
        string(Array(provider.utf8))
        string(data)
        string([])                      // algorithm
        uint32(0)                       // compat
        string([])                      // PIN
        let n = UInt32(payload.count - 4)
        payload[0] = UInt8(n >> 24); payload[1] = UInt8(n >> 16 & 0xff); payload[2] = UInt8(n >> 8 & 0xff); payload[3] = UInt8(n & 0xff)
        defer { secureZero(&payload) }
        let body = try HelperExchange.run(executable: executable, arguments: [], environment: [], socketAt: [0, 1], frame: payload,
                                          timeout: timeout)
        return try Self.decodeReply(body)
    }

    /// Decodes the helper's reply (after its length): the signature blob, or its error.
    package static func decodeReply(_ body: [UInt8]) throws(SecurityKeyError) -> [UInt8] {
        guard body.count >= 5, body[0] == version else { throw .malformedReply }
        let type = body[1..<5].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        let rest = Array(body[5...])
        func uint32(_ b: ArraySlice<UInt8>) -> UInt32 { b.reduce(UInt32(0)) { $0 << 8 | UInt32($1) } }
        switch type {
        case 0:
            guard rest.count == 4 else { throw .malformedReply }
            let e = uint32(rest[0..<4])
            throw .openSSH(code: e == 0 || e >= UInt32(Int32.max) ? -1 : -Int32(e))
        case 1:
            guard rest.count >= 4 else { throw .malformedReply }
            let n = Int(uint32(rest[0..<4]))
            guard rest.count == 4 + n else { throw .malformedReply }
            return Array(rest[4...])
        default:
            throw .malformedReply
        }
    }
}
