import CofferSSHAgentProtocol
import CofferTestSupport
import Testing

/// The spec's certificate vectors (real `ssh-keygen -s` output): each `ok` one decodes to the fields
/// `ssh-keygen -L` printed, each `error` one throws the named case, and no cut or changed byte traps.
@Suite struct CertificateTests {
    static let vectors = specVectorBlocks("Sources/CofferSSHAgentProtocol/CofferSSHAgentProtocol.docc/SSHAgentProtocol.md", fence: "certificate")

    @Test func theSpecHasCertificateVectorsOfEveryKind() {
        #expect(Self.vectors.count >= 9)
        let ok = Self.vectors.filter { $0["outcome"] == "ok" }
        #expect(Set(ok.compactMap { $0["type"] }) == ["host", "user"])
        #expect(Set(ok.compactMap { $0["signature"] }).isSuperset(of: ["ssh-ed25519", "rsa-sha2-512", "ssh-rsa"]))
        #expect(Set(Self.vectors.compactMap { $0["outcome"] }) == ["ok", "error badCertificate", "error trailingBytes", "error unknownKeyType",
                                                                    "error truncated"])
    }

    @Test(arguments: vectors)
    func vector(_ v: [String: String]) throws {
        let bytes = try #require(hexDecode(v["certificate"] ?? ""), "\(v["name"] ?? "")")
        guard v["outcome"] == "ok" else {
            let expected = try #require(v["outcome"]?.split(separator: " ").last.map(String.init))
            #expect(throws: SSHAgentWireError.self) { try SSHCertificate(blob: bytes) }
            do { _ = try SSHCertificate(blob: bytes) } catch { #expect(caseName(error) == expected, "\(v["name"] ?? "")") }
            return
        }
        let cert = try SSHCertificate(blob: bytes)
        #expect(cert.blob == bytes)
        #expect(bytes.starts(with: cert.signedBytes) && cert.signedBytes.count < bytes.count)
        #expect(SSHCertificate.plainKeyType(of: cert.certificateType) == cert.publicKey.keyType)
        #expect(cert.type == (v["type"] == "host" ? .host : .user))
        #expect("\(cert.serial)" == v["serial"])
        #expect(cert.keyID == v["key id"])
        #expect(cert.principals.joined(separator: ",") == v["principals"])
        #expect("\(cert.validAfter) \(cert.validBefore)" == v["valid"])
        #expect(cert.publicKey.fingerprint == v["key"])
        #expect(cert.signatureKey.fingerprint == v["ca"])
        #expect(cert.signature.algorithm == v["signature"])
        // The signed part ends where the signature field starts: the field is the rest of the blob.
        var tail = SSHWireReader(Array(bytes[cert.signedBytes.count...]))
        #expect(try SSHWireSignature(blob: tail.readString()) == cert.signature)
        #expect(tail.remaining == 0)
    }

    @Test func userCertificatesKeepTheirExtensions() throws {
        let user = try #require(Self.vectors.first { $0["type"] == "user" })
        let cert = try SSHCertificate(blob: #require(hexDecode(user["certificate"] ?? "")))
        #expect(cert.criticalOptions.isEmpty)
        #expect(cert.extensions.map { String(decoding: $0.name, as: UTF8.self) }
                == ["permit-X11-forwarding", "permit-agent-forwarding", "permit-port-forwarding", "permit-pty", "permit-user-rc"])
    }

    /// Every prefix and every single-byte change decodes or throws a wire error, never traps, and
    /// whatever decodes keeps its bytes.
    @Test(arguments: vectors.filter { $0["outcome"] == "ok" })
    func cutsAndMutationsNeverTrap(_ v: [String: String]) throws {
        let bytes = try #require(hexDecode(v["certificate"] ?? ""))
        for n in 0..<bytes.count { #expect(throws: SSHAgentWireError.self) { try SSHCertificate(blob: Array(bytes.prefix(n))) } }
        for i in bytes.indices {
            for delta: UInt8 in [1, 0x80, 0xff] {
                var m = bytes
                m[i] &+= delta
                if let cert = try? SSHCertificate(blob: m) { #expect(cert.blob == m && m.starts(with: cert.signedBytes)) }
            }
        }
    }
}
