@testable import CofferSSHAgentFrontEnd
import CofferCrypto
import CofferPluginClient
import CofferSSHAgentProtocol
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// The ssh-agent front end's rules for FIDO keys that the end-to-end tests (SSHSecurityKeyTests, with
/// OpenSSH's sk-dummy) do not reach one by one: OpenSSH's provider allow-list matching, the web-origin
/// rule, and the check of a middleware's answer against the key.
@Suite struct SSHSecurityKeySignerTests {
    static func signer(_ allowList: String) -> SSHSecurityKeySigner { SSHSecurityKeySigner(allowedProviders: allowList, middleware: nil) }

    /// A public-key userauth request as ssh signs it (RFC 4252 §7).
    static func userauth(session: [UInt8], user: String, algorithm: String, key: [UInt8]) -> [UInt8] {
        var w = SSHWireWriter()
        w.writeString(session); w.writeByte(50); w.writeText(user); w.writeText("ssh-connection"); w.writeText("publickey")
        w.writeBool(true); w.writeText(algorithm); w.writeString(key)
        return w.bytes
    }

    /// OpenSSH's `match_pattern_list`: any positive match, unless a `!` pattern matches.
    @Test func theAllowListMatchesAsOpenSSHDoes() {
        let list = "/usr/lib*/*,/usr/local/lib*/*"
        for (path, expected) in [("/usr/lib/x86_64-linux-gnu/libsk.so", 1), ("/usr/lib64/sk.so", 1), ("/usr/local/lib/sk.so", 1),
                                 ("/usr/libexec/sk.so", 1), ("/opt/sk.so", 0), ("/usr/share/sk.so", 0), ("/tmp/usr/lib/sk.so", 0)] {
            #expect(SSHSecurityKeySigner.matchPatternList(path, list) == expected, "\(path)")
        }
        #expect(SSHSecurityKeySigner.matchPatternList("/usr/lib/bad.so", "/usr/lib/*,!/usr/lib/bad.so") == -1)
        #expect(SSHSecurityKeySigner.matchPatternList("/usr/lib/good.so", "/usr/lib/*,!/usr/lib/bad.so") == 1)
        #expect(SSHSecurityKeySigner.matchPatternList("/usr/lib/a.so", "/usr/lib/?.so") == 1)
        #expect(SSHSecurityKeySigner.matchPatternList("/usr/lib/ab.so", "/usr/lib/?.so") == 0)
        #expect(SSHSecurityKeySigner.matchPatternList("/usr/lib/a.so", "") == 0)
    }

    /// A provider is resolved before it is matched: a link in an allowed directory to a file elsewhere is
    /// judged by where it leads; a missing file and `internal` are refused with their reasons.
    @Test func providersAreResolvedBeforeTheyAreMatched() throws {
        let allowed = TemporaryDirectory("coffer-sk-allowed"), other = TemporaryDirectory("coffer-sk-other")
        let allowedPath = try #require(SSHSecurityKeySigner.realPath(allowed.path))
        let otherPath = try #require(SSHSecurityKeySigner.realPath(other.path))
        try Data().write(to: URL(fileURLWithPath: allowedPath + "/sk.so"))
        try Data().write(to: URL(fileURLWithPath: otherPath + "/sk.so"))
        try FileManager.default.createSymbolicLink(atPath: allowedPath + "/link.so", withDestinationPath: otherPath + "/sk.so")
        let s = Self.signer(allowedPath + "/*")
        #expect(s.resolve(provider: allowed.path + "/sk.so") == .success(allowedPath + "/sk.so"))
        #expect(s.resolve(provider: allowedPath + "/./sk.so") == .success(allowedPath + "/sk.so"))
        guard case .failure(let link) = s.resolve(provider: allowedPath + "/link.so") else { Issue.record("a link out was followed"); return }
        #expect(link.reason.contains(otherPath + "/sk.so is not in ssh-allowed-providers"), "\(link)")
        guard case .failure(let missing) = s.resolve(provider: allowedPath + "/none.so") else { Issue.record("a missing file was taken"); return }
        #expect(missing.reason.contains("cannot be resolved"), "\(missing)")
        // internal: OpenSSH's built-in support, in its ssh-sk-helper (whatever the allow-list says), or refused without it.
        let withHelper = SSHSecurityKeySigner(allowedProviders: allowedPath + "/*", middleware: nil,
                                              openSSHHelper: OpenSSHSecurityKeyHelper(executable: "/nonexistent/ssh-sk-helper"))
        for name in ["internal", "INTERNAL"] {
            guard case .failure(let builtIn) = s.resolve(provider: name) else { Issue.record("\(name) was taken"); continue }
            #expect(builtIn.reason.contains("\"internal\"") && builtIn.reason.contains("ssh-sk-helper"))
            #expect(withHelper.resolve(provider: name) == .success("internal"))
        }
    }

    /// OpenSSH's `restrict_websafe`: a key of an `ssh:` application signs anything; another
    /// application's key signs only a userauth request for itself or an SSHSIG request.
    @Test func aWebOriginKeySignsOnlyWhatSSHSigns() {
        let blob = [UInt8](repeating: 7, count: 40)
        let key = SSHSigningKey(blob: blob, fingerprint: "SHA256:x", keyType: "sk-ssh-ed25519@openssh.com", comment: "", confirm: false, destinations: [])
        let challenge = Array("a web site's challenge".utf8)
        #expect(SSHSecurityKeySigner.webSafe(key, application: "ssh:", data: challenge))
        #expect(SSHSecurityKeySigner.webSafe(key, application: "ssh:work", data: challenge))
        #expect(!SSHSecurityKeySigner.webSafe(key, application: "https://example.com", data: challenge))
        let userauth = Self.userauth(session: [1, 2, 3], user: "alice", algorithm: "sk-ssh-ed25519@openssh.com", key: blob)
        #expect(SSHSecurityKeySigner.webSafe(key, application: "https://example.com", data: userauth))
        let otherKey = Self.userauth(session: [1, 2, 3], user: "alice", algorithm: "sk-ssh-ed25519@openssh.com", key: [1])
        #expect(!SSHSecurityKeySigner.webSafe(key, application: "https://example.com", data: otherKey))
        var w = SSHWireWriter()
        w.writeRaw(Array("SSHSIG".utf8)); w.writeText("file"); w.writeString([]); w.writeText("sha512"); w.writeString([UInt8](repeating: 1, count: 64))
        #expect(SSHSecurityKeySigner.isSSHSIGRequest(w.bytes))
        #expect(SSHSecurityKeySigner.webSafe(key, application: "https://example.com", data: w.bytes))
        #expect(!SSHSecurityKeySigner.isSSHSIGRequest(w.bytes + [0]), "bytes after the hash")
        #expect(!SSHSecurityKeySigner.isSSHSIGRequest(Array(w.bytes.dropLast())))
        #expect(!SSHSecurityKeySigner.isSSHSIGRequest(Array("SSHSIG".utf8)))
    }

    /// The spec's captured signatures (sk-dummy's, through cofferd) verify with their keys over the
    /// data of the request before them, ECDSA P-256 with OpenSSL and ed25519 with libsodium; a changed
    /// counter, flag or data byte does not.
    @Test func authenticatorSignaturesAreCheckedAgainstTheKey() throws {
        let blocks = specVectorBlocks("Sources/CofferSSHAgentProtocol/CofferSSHAgentProtocol.docc/SSHAgentProtocol.md")
        var keys: [String: SSHSecurityKeyPublicKey] = [:]
        var checked = 0
        for (i, block) in blocks.enumerated() {
            guard let frame = block["frame"].flatMap(hexDecode) else { continue }
            if block["direction"] == "request", case .addSecurityKey(let key, _, _)? = try? SSHAgentRequest.decode(frame: frame) {
                keys[key.publicKey.fingerprint] = key.publicKey
            }
            guard let fp = block["sk-key"], case .signResponse(let blob) = try SSHAgentReply.decode(frame: frame) else { continue }
            let key = try #require(keys[fp])
            guard let previous = blocks[i - 1]["frame"].flatMap(hexDecode),
                  case .signRequest(_, let data, _) = try SSHAgentRequest.decode(frame: previous) else { Issue.record("no request"); continue }
            let signature = try SSHSecurityKeySignature(blob: blob)
            #expect(SSHSecurityKeySigner.verify(signature, by: key, data: data), "\(fp)")
            #expect(!SSHSecurityKeySigner.verify(signature, by: key, data: data + [0]), "\(fp)")
            let recounted = try SSHSecurityKeySignature(algorithm: signature.algorithm, body: signature.body, flags: signature.flags,
                                                        counter: signature.counter &+ 1)
            #expect(!SSHSecurityKeySigner.verify(recounted, by: key, data: data), "\(fp)")
            let reflagged = try SSHSecurityKeySignature(algorithm: signature.algorithm, body: signature.body, flags: signature.flags ^ 4,
                                                        counter: signature.counter)
            #expect(!SSHSecurityKeySigner.verify(reflagged, by: key, data: data), "\(fp)")
            checked += 1
        }
        #expect(checked == 2)
    }

    /// Without the helper there is no signature, and the refusal says why.
    @Test func noHelperNoSignature() throws {
        let key = try SSHSecurityKeyPrivateKey(publicKey: SSHSecurityKeyPublicKey(algorithm: .ed25519, key: [UInt8](repeating: 1, count: 32),
                                                                                  application: "ssh:"),
                                               flags: 1, keyHandle: [UInt8]([1, 2, 3]).withUnsafeBytes { SecureBytes(copying: $0) })
        guard case .failure(let why) = Self.signer("/usr/lib*/*").sign(key, middleware: "/usr/lib/sk.so", data: [1]) else {
            Issue.record("signed without a helper"); return
        }
        #expect("\(why)".contains("the helper that runs the middleware was not found"))
    }
}
