@testable import CofferAgent
import CofferSSHAgentProtocol
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

    @Test func aCertificateAuthorityHopNeverMatches() {
        let ca = [SSHDestinationConstraint(from: Self.hop("", nil), to: Self.hop("a.example", Self.a, ca: true))]
        #expect(SSHDestinationPolicy.permitted(ca, binds: [Self.bind(Self.a, forwarding: false)], bindAttempted: true, user: "u") == nil)
    }

    @Test func userPatternsAreOpenSSHsMatchPattern() {
        for (text, pattern, expected) in [("alice", "alice", true), ("alice", "al*", true), ("alice", "a?ice", true), ("alice", "*", true),
                                          ("alice", "*e", true), ("alice", "bob", false), ("alice", "alic", false), ("", "*", true),
                                          ("alice", "a*c*e", true), ("alice", "a*x", false), ("alice", "?", false)] {
            #expect(SSHDestinationPolicy.globMatches(text, pattern) == expected, "\(text) ~ \(pattern)")
        }
    }
}
