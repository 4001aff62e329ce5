import CPAM
package import CofferCrypto
import Glibc

/// Why PAM refused (for logs; never contains the passcode).
package struct PAMError: Error, Sendable, CustomStringConvertible {
    /// The PAM result code (e.g. 7 PAM_AUTH_ERR; pam_exec reports a wrong password as 4 PAM_SYSTEM_ERR).
    package let code: Int32
    /// Which stage failed: start, authenticate, account, or input.
    package let stage: String
    /// `pam_strerror` text.
    package let text: String

    package var description: String { "PAM \(stage) failed: \(text) (\(code))" }
}

/// Verifies a passcode by running a PAM stack for a user: `pam_authenticate` then `pam_acct_mgmt`.
///
/// Blocking (pam_unix waits about 2 s after a failure): call it off any event loop, on the
/// requesting connection's thread. The conversation hands PAM a `malloc`ed copy of the passcode,
/// which PAM frees (and which its modules may copy further: outside Coffer's control).
package struct PAMAuthenticator: Sendable {
    /// The service name (a file in /etc/pam.d, or in `confdir`).
    package let service: String
    /// A private configuration directory for `pam_start_confdir` (tests, sandboxes), or nil for the system's.
    package let confdir: String?

    /// Most prompts answered in one conversation (a stack asking more is misconfigured or hostile).
    static let maxPrompts = 4

    /// Makes an authenticator for `service`.
    package init(service: String, confdir: String?) {
        self.service = service
        self.confdir = confdir
    }

    /// Succeeds only if PAM accepts `passcode` for `user` and the account is usable; every other
    /// outcome is a ``PAMError``.
    package func authenticate(user: String, passcode: SecureBytes) throws(PAMError) {
        guard passcode.count > 0 else { throw PAMError(code: PAM_AUTH_ERR, stage: "input", text: "empty passcode") }
        let hasNUL = unsafe passcode.withUnsafeBytes { unsafe $0.contains(0) }
        guard !hasNUL else { throw PAMError(code: PAM_AUTH_ERR, stage: "input", text: "passcode contains a NUL byte") }

        var conv = unsafe pam_conv(conv: { count, messages, responses, appdata in
            guard count > 0, count <= Int32(PAMAuthenticator.maxPrompts), let messages = unsafe messages, let responses = unsafe responses, let appdata = unsafe appdata else {
                return PAM_CONV_ERR
            }
            let secret = unsafe Unmanaged<SecureBytes>.fromOpaque(appdata).takeUnretainedValue()
            guard let replies = unsafe calloc(Int(count), MemoryLayout<pam_response>.size)?
                .bindMemory(to: pam_response.self, capacity: Int(count)) else { return PAM_BUF_ERR }
            for i in 0..<Int(count) {
                guard let msg = unsafe messages[i]?.pointee else { continue }
                switch unsafe msg.msg_style {
                case PAM_PROMPT_ECHO_OFF, PAM_PROMPT_ECHO_ON:
                    // PAM frees resp with free(): copy with malloc, NUL-terminated.
                    let copy = unsafe secret.withUnsafeBytes { s -> UnsafeMutablePointer<CChar>? in
                        guard let p = unsafe malloc(s.count + 1) else { return nil }
                        unsafe p.copyMemory(from: s.baseAddress!, byteCount: s.count)
                        unsafe p.storeBytes(of: 0, toByteOffset: s.count, as: UInt8.self)
                        return unsafe p.assumingMemoryBound(to: CChar.self)
                    }
                    unsafe replies[i].resp = copy
                default:
                    unsafe replies[i].resp = nil // info and error messages need no answer
                }
                unsafe replies[i].resp_retcode = 0
            }
            unsafe responses.pointee = replies
            return PAM_SUCCESS
        }, appdata_ptr: unsafe Unmanaged.passUnretained(passcode).toOpaque())

        var handle: OpaquePointer?
        let started: Int32
        if let confdir { started = unsafe pam_start_confdir(service, user, &conv, confdir, &handle) } else {
            started = unsafe pam_start(service, user, &conv, &handle)
        }
        guard started == PAM_SUCCESS, let handle = unsafe handle else {
            let text = unsafe handle.map { unsafe String(cString: pam_strerror($0, started)) } ?? "pam_start failed"
            if let handle = unsafe handle { unsafe pam_end(handle, started) }
            throw PAMError(code: started, stage: "start", text: text)
        }
        var rc = unsafe pam_authenticate(handle, Int32(PAM_SILENT | PAM_DISALLOW_NULL_AUTHTOK))
        var stage = "authenticate"
        if rc == PAM_SUCCESS {
            rc = unsafe pam_acct_mgmt(handle, Int32(PAM_SILENT | PAM_DISALLOW_NULL_AUTHTOK))
            stage = "account"
        }
        let text = unsafe String(cString: pam_strerror(handle, rc))
        unsafe pam_end(handle, rc)
        withExtendedLifetime(passcode) {}
        guard rc == PAM_SUCCESS else { throw PAMError(code: rc, stage: stage, text: text) }
    }
}
