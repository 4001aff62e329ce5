@testable import CofferSSHAgentFrontEnd
import CofferSSHAgentProtocol
import CofferTestSupport
import Testing

/// OpenSSH's destination rules (ssh-agent.c: identity_permitted, permitted_by_dest_constraints) over
/// several hops, which the end-to-end tests (one sshd) do not reach.
@Suite struct SSHDestinationPolicyTests {
    static let (a, b, c) = ([UInt8](repeating: 0xA, count: 51), [UInt8](repeating: 0xB, count: 51), [UInt8](repeating: 0xC, count: 51))

    static func hop(_ host: String, _ key: [UInt8]?, user: String = "", ca: Bool = false) -> SSHDestinationHop {
        SSHDestinationHop(user: user, hostname: host, keys: key.map { [.init(blob: $0, isCA: ca)] } ?? [])
    }

    static func bind(_ key: [UInt8], forwarding: Bool) -> SSHSessionBind {
        SSHSessionBind(hostKey: key, sessionIdentifier: [1], signature: [], isForwarding: forwarding)
    }

    /// origin > a.example, a.example > alice*@b.example
    static let chain = [SSHDestinationConstraint(from: hop("", nil), to: hop("a.example", a)),
                        SSHDestinationConstraint(from: hop("a.example", a), to: hop("b.example", b, user: "alice*"))]

    @Test func everyHopMustBeAllowedAndOnlyTheLastSigns() {
        let p = { (binds: [SSHSessionBind], user: String?) in SSHDestinationPolicy.permitted(Self.chain, binds: binds, bindAttempted: !binds.isEmpty, user: user) }
        #expect(p([], nil) == .some(nil), "local use lists it")
        #expect(p([Self.bind(Self.a, forwarding: false)], "anyone") == .some("a.example"))
        #expect(p([Self.bind(Self.a, forwarding: true), Self.bind(Self.b, forwarding: false)], "alice2") == .some("b.example"))
        #expect(p([Self.bind(Self.a, forwarding: true), Self.bind(Self.b, forwarding: false)], "bob") == nil, "the last hop's user pattern")
        #expect(p([Self.bind(Self.b, forwarding: false)], "alice") == nil, "b.example is not reachable from the origin")
        #expect(p([Self.bind(Self.a, forwarding: false), Self.bind(Self.b, forwarding: false)], "alice") == nil, "a bind after authentication")
        #expect(p([Self.bind(Self.a, forwarding: true)], "alice") == nil, "no signature on a forwarding hop")
        #expect(p([Self.bind(Self.a, forwarding: true)], nil) == .some("a.example"), "listed at a.example: usable beyond it")
        #expect(p([Self.bind(Self.a, forwarding: true), Self.bind(Self.b, forwarding: true)], nil) == nil, "hidden beyond b.example")
        #expect(SSHDestinationPolicy.permitted(Self.chain, binds: [], bindAttempted: true, user: nil) == nil, "a bind failed")
        #expect(SSHDestinationPolicy.permitted([], binds: [Self.bind(Self.c, forwarding: true)], bindAttempted: true, user: "x") == .some(nil),
                "an unconstrained key")
    }

    @Test func aCertificateAuthorityHopNeverMatchesAPlainKey() {
        let ca = [SSHDestinationConstraint(from: Self.hop("", nil), to: Self.hop("a.example", Self.a, ca: true))]
        #expect(SSHDestinationPolicy.permitted(ca, binds: [Self.bind(Self.a, forwarding: false)], bindAttempted: true, user: "u") == nil)
    }

    /// The protocol spec's certificate vectors (real `ssh-keygen -s` output), by name.
    static func certificate(_ name: String) throws -> (bytes: [UInt8], cert: SSHCertificate, fields: [String: String]) {
        let blocks = specVectorBlocks("Sources/CofferSSHAgentProtocol/CofferSSHAgentProtocol.docc/SSHAgentProtocol.md", fence: "certificate")
        let v = try #require(blocks.first { $0["name"]?.hasPrefix(name) == true }, "no certificate vector \(name)")
        let bytes = try #require(hexDecode(v["certificate"] ?? ""))
        return (bytes, try SSHCertificate(blob: bytes), v)
    }

    /// OpenSSH's match_key_hop / sshkey_cert_check_host: a CA hop matches a host certificate by that
    /// CA, valid now, whose principals the hop's host name matches (or that lists none).
    @Test func aCertificateAuthorityHopMatchesItsValidHostCertificates() throws {
        let hostD = try Self.certificate("host certificate, ed25519 key, ed25519 CA")
        let caEd = hostD.cert.signatureKey.blob
        let now: UInt64 = 1_900_000_000  // inside host_d's window (2026-01-01 to 2036-01-01)
        let holds = { (host: String, key: [UInt8], ca: Bool, hostKey: [UInt8], at: UInt64) in
            SSHDestinationPolicy.hopHolds(Self.hop(host, key, ca: ca), hostKey, now: at)
        }
        #expect(holds("host_d", caEd, true, hostD.bytes, now))
        #expect(holds("host_*", caEd, true, hostD.bytes, now), "the hop's host name is a pattern over the principals")
        #expect(!holds("host_e", caEd, true, hostD.bytes, now), "host_d is not a principal of host_e")
        #expect(!holds("host_d", caEd, false, hostD.bytes, now), "the CA key not marked as a CA")
        #expect(!holds("host_d", hostD.cert.publicKey.blob, false, hostD.bytes, now), "a certificate is not its plain key")
        #expect(holds("host_d", hostD.bytes, false, hostD.bytes, now), "the certificate itself listed as a plain key")
        #expect(!holds("host_d", caEd, true, hostD.cert.publicKey.blob, now), "a plain host key under a CA hop")
        #expect(!holds("host_d", caEd, true, hostD.bytes, 1_767_225_599), "not yet valid")
        #expect(holds("host_d", caEd, true, hostD.bytes, 1_767_225_600), "valid from valid-after")
        #expect(holds("host_d", caEd, true, hostD.bytes, 2_082_758_399))
        #expect(!holds("host_d", caEd, true, hostD.bytes, 2_082_758_400), "expired at valid-before")

        let anyHost = try Self.certificate("host certificate, p256 key, RSA CA")
        #expect(holds("anything.example", anyHost.cert.signatureKey.blob, true, anyHost.bytes, now), "no principals: any host")
        #expect(!holds("host_d", anyHost.cert.signatureKey.blob, true, hostD.bytes, now), "another CA")

        let user = try Self.certificate("user certificate")
        #expect(!holds("alice", user.cert.signatureKey.blob, true, user.bytes, now), "a user certificate")
        #expect(!holds("host_d", caEd, true, user.bytes, now))

        let sha1 = try Self.certificate("host certificate signed with SHA-1")
        #expect(sha1.fields["verifies"] == "no")
        #expect(!holds("host_d", sha1.cert.signatureKey.blob, true, sha1.bytes, now), "a SHA-1 ssh-rsa CA signature")
        let tampered = try Self.certificate("the first vector with its serial changed")
        #expect(!holds("host_d", caEd, true, tampered.bytes, now), "a CA signature that fails")

        // Each vector's `verifies` is what the agent finds.
        for name in ["host certificate, ed25519", "host certificate, p256", "user certificate", "host certificate signed with SHA-1",
                     "the first vector with its serial changed"] {
            let v = try Self.certificate(name)
            #expect(SSHDestinationPolicy.certificateSignatureVerifies(v.cert) == (v.fields["verifies"] == "yes"), "\(name)")
        }

        // Through a whole constraint: origin > host_d by its CA, then the user's signature.
        let constraint = [SSHDestinationConstraint(from: Self.hop("", nil), to: Self.hop("host_d", caEd, ca: true))]
        #expect(SSHDestinationPolicy.permitted(constraint, binds: [Self.bind(hostD.bytes, forwarding: false)], bindAttempted: true,
                                               user: "u") == .some("host_d"))
    }

    /// A session-bind's host key may be a certificate: its certified key signs, once its CA signature
    /// verifies; a certificate whose CA signature fails signs for nothing.
    @Test func aSessionBindsCertificateHostKeyIsItsCertifiedKey() throws {
        let hostD = try Self.certificate("host certificate, ed25519 key, ed25519 CA")
        #expect(SSHDestinationPolicy.signingKey(ofHostKey: hostD.bytes) == hostD.cert.publicKey)
        #expect(SSHDestinationPolicy.signingKey(ofHostKey: hostD.cert.publicKey.blob) == hostD.cert.publicKey)
        #expect(SSHDestinationPolicy.signingKey(ofHostKey: try Self.certificate("the first vector with its serial changed").bytes) == nil)
        #expect(SSHDestinationPolicy.signingKey(ofHostKey: [0, 0, 0, 1]) == nil)
    }

    @Test func userPatternsAreOpenSSHsMatchPattern() {
        for (text, pattern, expected) in [("alice", "alice", true), ("alice", "al*", true), ("alice", "a?ice", true), ("alice", "*", true),
                                          ("alice", "*e", true), ("alice", "bob", false), ("alice", "alic", false), ("", "*", true),
                                          ("alice", "a*c*e", true), ("alice", "a*x", false), ("alice", "?", false)] {
            #expect(SSHDestinationPolicy.globMatches(text, pattern) == expected, "\(text) ~ \(pattern)")
        }
    }
}
