import CofferCrypto
package import CofferPluginClient
import CofferSSHAgentProtocol
import CofferSSHKeys
import CofferSystem
import Glibc

/// FIDO keys added with `ssh-add` (`sk-ssh-ed25519@openssh.com`, `sk-ecdsa-sha2-nistp256@openssh.com`),
/// as OpenSSH 9.x's agent serves them: the agent holds the key handle and the middleware named by
/// the `sk-provider@openssh.com` constraint, and each signature is the authenticator's, asked for
/// through OpenSSH's middleware interface (sk-api.h) in `coffer-plugin-host --sk-sign`, a process
/// started for that one signature (OpenSSH runs `ssh-sk-helper` the same way). The agent never loads
/// a middleware: one that crashes or hangs costs that signature (FAILURE), not the agent.
///
/// Which middlewares a key may name is OpenSSH ssh-agent's rule (`-P`): the path is resolved
/// (`realpath`) when the key is added and must match the allow-list (``AgentConfiguration/sshAllowedProviders``,
/// OpenSSH's default `/usr/lib*/*,/usr/local/lib*/*`). `internal` (OpenSSH's built-in libfido2
/// support, what `ssh-add` names when `SSH_SK_PROVIDER` is unset) is always allowed, as in OpenSSH,
/// and runs where OpenSSH runs it: in OpenSSH's own `ssh-sk-helper` (``OpenSSHSecurityKeyHelper``), one
/// process per signature; without that program such a key is refused when added.
package final class SSHSecurityKeySigner: Sendable {
    /// The allow-list's patterns, as given (comma-separated).
    let allowedProviders: String
    /// The helper that runs a middleware; nil when `coffer-plugin-host` could not be found.
    let middleware: SecurityKeyMiddleware?
    /// OpenSSH's `ssh-sk-helper`, for `internal`; nil when it is not installed.
    let openSSHHelper: OpenSSHSecurityKeyHelper?
    /// Signatures running at once (each holds a process): at most ``maximumConcurrentSignatures``.
    private let running = Protected(0)
    static let maximumConcurrentSignatures = 8

    package init(allowedProviders: String, middleware: SecurityKeyMiddleware?, openSSHHelper: OpenSSHSecurityKeyHelper? = nil) {
        self.allowedProviders = allowedProviders
        self.middleware = middleware
        self.openSSHHelper = openSSHHelper
    }

    /// The name a key gives for OpenSSH's built-in FIDO support (compared without case, as OpenSSH does).
    static let internalProvider = "internal"

    /// Why a FIDO key is not added (the log line's reason).
    struct Refusal: Error, Equatable {
        let reason: String
    }

    /// The middleware a key added with `sk-provider@openssh.com` = `provider` signs through: its
    /// resolved path, if the allow-list permits it (OpenSSH's `process_add_identity`).
    /// `internal` resolves to itself, when OpenSSH's `ssh-sk-helper` is there to run it.
    func resolve(provider: String) -> Result<String, Refusal> {
        if provider.lowercased() == Self.internalProvider {
            guard openSSHHelper != nil else {
                return .failure(Refusal(reason: "it names OpenSSH's built-in FIDO support (\"internal\"), which runs in OpenSSH's "
                                        + "\(OpenSSHSecurityKeyHelper.defaultPath), and that is not installed: install it "
                                        + "(apt: openssh-client) or name a middleware library with SSH_SK_PROVIDER or ssh-add -S"))
            }
            return .success(Self.internalProvider)
        }
        guard let canonical = Self.realPath(provider) else {
            return .failure(Refusal(reason: "its middleware \(provider) cannot be resolved (realpath: \(String(cString: strerror(errno))))"))
        }
        guard Self.matchPatternList(canonical, allowedProviders) == 1 else {
            return .failure(Refusal(reason: "its middleware \(canonical) is not in ssh-allowed-providers (\(allowedProviders))"))
        }
        return .success(canonical)
    }

    /// `realpath(3)`, nil on failure (errno set).
    static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    /// OpenSSH's `match_pattern_list` (case-sensitive): 1 if `string` matches a pattern of the
    /// comma-separated `list` and no `!`-negated one, -1 if it matches a negated one, else 0.
    static func matchPatternList(_ string: String, _ list: String) -> Int {
        var positive = 0
        for raw in list.split(separator: ",", omittingEmptySubsequences: false) {
            var pattern = Substring(raw)
            let negated = pattern.first == "!"
            if negated { pattern = pattern.dropFirst() }
            guard !pattern.isEmpty, SSHDestinationPolicy.globMatches(string, String(pattern)) else { continue }
            if negated { return -1 }
            positive = 1
        }
        return positive
    }

    /// Whether a FIDO key for `application` may sign `data`, as OpenSSH's agent decides by default
    /// (`restrict_websafe`, `check_websafe_message_contents`): a key made for an `ssh:` application
    /// signs anything; one made for another application (a web site's) signs only what ssh signs
    /// (a public-key userauth request for this very key, or an SSHSIG request), never a web challenge.
    static func webSafe(_ key: SSHSigningKey, application: String, data: [UInt8]) -> Bool {
        application.hasPrefix("ssh:") || SSHUserauthRequest(data, expecting: key) != nil || isSSHSIGRequest(data)
    }

    /// OpenSSH's `parse_sshsig_request`: `"SSHSIG"`, `string namespace`, `string reserved`,
    /// `string hash algorithm`, `string H(message)`, nothing after.
    static func isSSHSIGRequest(_ data: [UInt8]) -> Bool {
        guard data.count >= 6, data.prefix(6).elementsEqual("SSHSIG".utf8) else { return false }
        var r = SSHWireReader(Array(data.dropFirst(6)))
        do {
            _ = try r.readString(); _ = try r.readString(); _ = try r.readString(); _ = try r.readString()
            try r.finish()
            return true
        } catch {
            return false
        }
    }

    /// Why a signature did not come back.
    enum SignFailure: Error, CustomStringConvertible {
        case noHelper
        case busy
        case middleware(SecurityKeyError)
        /// The middleware's answer is not a signature by this key over this data.
        case badSignature(String)

        var description: String {
            switch self {
            case .noHelper: "the helper that runs the middleware was not found (coffer-plugin-host: set plugin-host; for internal, OpenSSH's ssh-sk-helper)"
            case .busy: "\(SSHSecurityKeySigner.maximumConcurrentSignatures) FIDO signatures are running already"
            case .middleware(let e): e.description
            case .badSignature(let why): "the middleware's answer is not a valid signature (\(why))"
            }
        }
    }

    /// Asks the authenticator, through `middleware`, to sign `data` with `key`, and checks the answer:
    /// it must verify with the key's public key over what the authenticator signs
    /// (``CofferSSHAgentProtocol/SSHSecurityKeySignature/signedBytes(application:flags:counter:data:)``).
    func sign(_ key: SSHSecurityKeyPrivateKey, middleware path: String, data: [UInt8]) -> Result<SSHSecurityKeySignature, SignFailure> {
        let builtIn = path == Self.internalProvider
        guard builtIn ? openSSHHelper != nil : middleware != nil else { return .failure(.noHelper) }
        let admitted = running.withLock { n -> Bool in
            guard n < Self.maximumConcurrentSignatures else { return false }
            n += 1
            return true
        }
        guard admitted else { return .failure(.busy) }
        defer { running.withLock { $0 -= 1 } }
        let publicKey = key.publicKey
        let signature: SSHSecurityKeySignature
        if let helper = openSSHHelper, builtIn {
            // OpenSSH's helper answers the signature blob itself.
            do {
                let blob = try helper.sign(key: key.encodeWire(), provider: Self.internalProvider, data: data)
                signature = try SSHSecurityKeySignature(blob: blob)
            } catch let error as SecurityKeyError {
                return .failure(.middleware(error))
            } catch {
                return .failure(.badSignature("\(error)"))
            }
            guard signature.algorithm == publicKey.algorithm else { return .failure(.badSignature("it is of another key type")) }
            guard Self.verify(signature, by: publicKey, data: data) else { return .failure(.badSignature("it does not verify")) }
            return .success(signature)
        }
        guard let middleware else { return .failure(.noHelper) }
        let request = SecurityKeySignRequest(middleware: path, algorithm: publicKey.algorithm.middlewareAlgorithm,
                                             application: publicKey.application, flags: key.flags, keyHandle: key.keyHandle, data: data)
        let response: SecurityKeyResponse
        do {
            response = try middleware.sign(request)
        } catch {
            return .failure(.middleware(error))
        }
        do {
            let body: SSHSecurityKeySignature.Body = switch publicKey.algorithm {
            case .ed25519: .ed25519(response.r)
            case .ecdsaP256: .ecdsa(r: response.r, s: response.s)
            }
            signature = try SSHSecurityKeySignature(algorithm: publicKey.algorithm, body: body, flags: response.flags, counter: response.counter)
        } catch {
            return .failure(.badSignature("\(error)"))
        }
        guard Self.verify(signature, by: publicKey, data: data) else { return .failure(.badSignature("it does not verify")) }
        return .success(signature)
    }

    /// True if `signature` is `key`'s over `data` (OpenSSH's `ssh_ed25519_sk_verify`, `ssh_ecdsa_sk_verify`).
    static func verify(_ signature: SSHSecurityKeySignature, by key: SSHSecurityKeyPublicKey, data: [UInt8]) -> Bool {
        let signed = SSHSecurityKeySignature.signedBytes(application: key.application, flags: signature.flags,
                                                         counter: signature.counter, data: data)
        switch (key.algorithm, signature.body) {
        case (.ed25519, .ed25519(let s)):
            return SSHPublicKey.ed25519(key.key).verify(.ed25519(s), data: signed)
        case (.ecdsaP256, .ecdsa(let r, let s)):
            return SSHPublicKey.ecdsa(curve: .p256, q: key.key).verify(.ecdsa(r: r, s: s), data: signed)
        default:
            return false
        }
    }
}
