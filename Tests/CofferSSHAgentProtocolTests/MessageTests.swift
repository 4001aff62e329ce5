import CofferCrypto
import CofferSSHAgentProtocol
import Testing

/// Requests and replies: round trips of every case, the captured OpenSSH frames' contents, and
/// the constraint and extension rules (9–12).
@Suite struct MessageTests {
    func vector(_ prefix: String) throws -> SSHVector {
        try #require(sshVectors.first { $0.name.hasPrefix(prefix) }, "no vector \(prefix)")
    }

    func roundTrip(_ r: SSHAgentRequest) throws -> SSHAgentRequest {
        let frame = try r.encodeFrame()
        let back = try SSHAgentRequest.decode(frame: frame)
        #expect(try back.encodeFrame() == frame)
        return back
    }

    @Test func everyRequestRoundTrips() throws {
        let (pk, sk) = Ed25519.generateKeyPair()
        let key = SSHWirePrivateKey.ed25519(publicKey: pk, secret: sk)
        let hop = SSHDestinationHop(user: "", hostname: "", keys: [])
        let to = SSHDestinationHop(user: "bob", hostname: "h.example", keys: [.init(blob: [1, 2], isCA: true), .init(blob: [3], isCA: false)])
        let requests: [SSHAgentRequest] = [
            .requestIdentities, .signRequest(keyBlob: [1], data: [2, 3], flags: 6),
            .addIdentity(key, comment: "c", constraints: []),
            .addIdentity(key, comment: "ç", constraints: [.lifetime(seconds: 5), .confirm, .maxSignatures(9),
                                                          .restrictDestination([.init(from: hop, to: to)]),
                                                          .skProvider("internal"), .associatedCerts(certOnly: true, certificates: [[1], [2, 3]])]),
            .removeIdentity(keyBlob: [9]), .removeAllIdentities, .lock(passphrase: secure("pw")), .unlock(passphrase: secure("pw")),
            .addSmartcardKey(provider: "/p.so", pin: secure("1234"), constraints: []),
            .addSmartcardKey(provider: "/p.so", pin: secure(""), constraints: [.confirm]),
            .removeSmartcardKey(provider: "/p.so", pin: secure("")),
            .extension(.query), .extension(.other(name: "x@y", contents: [0, 1])),
            .extension(.sessionBind(SSHSessionBind(hostKey: [1], sessionIdentifier: [2], signature: [3], isForwarding: true))),
            .unknown(type: 200),
        ]
        let types: [UInt8] = [11, 13, 17, 25, 18, 19, 22, 23, 20, 26, 21, 27, 27, 27, 200]
        for (r, t) in zip(requests, types) {
            #expect(r.encodeBody().first == t)
            _ = try roundTrip(r)
        }
        guard case .addIdentity(_, let comment, let constraints) = try roundTrip(requests[3]) else { Issue.record("case"); return }
        #expect(comment == "ç")
        #expect(constraints.count == 6)
        #expect(constraints[3] == .restrictDestination([.init(from: hop, to: to)]))
    }

    @Test func everyReplyRoundTrips() throws {
        let replies: [SSHAgentReply] = [
            .failure, .success, .extensionFailure, .identities([]), .identities([.init(keyBlob: [1], comment: "a"), .init(keyBlob: [2], comment: "")]),
            .signResponse(signatureBlob: [1, 2]), .queryResponse(["query", "session-bind@openssh.com"]), .queryResponse([]),
            .extensionResponse(name: "x@y", contents: [7]),
        ]
        for r in replies {
            let frame = try r.encodeFrame()
            #expect(try SSHAgentReply.decode(frame: frame) == r)
        }
    }

    /// What OpenSSH's ssh-add sent, decoded field by field.
    @Test func capturedFramesDecodeToWhatSSHAddMeant() throws {
        guard case .lock(let pw) = try SSHAgentRequest.decode(frame: vector("LOCK").frame) else { Issue.record("lock"); return }
        #expect(plain(pw) == bytes("test-lock-pw"))
        guard case .addIdentity(_, let comment, let c) = try SSHAgentRequest.decode(frame: vector("ADD_ID_CONSTRAINED ed25519, lifetime").frame)
        else { Issue.record("constrained"); return }
        #expect(comment == "coffer-test-ed25519")
        #expect(Set(c) == [.lifetime(seconds: 600), .confirm])
        guard case .addIdentity(_, _, let r) = try SSHAgentRequest.decode(frame: vector("ADD_ID_CONSTRAINED ed25519, restrict").frame),
              case .restrictDestination(let hops) = try #require(r.first) else { Issue.record("restrict"); return }
        #expect(hops.count == 2)
        #expect(hops[0].from.hostname == "" && hops[0].from.keys.isEmpty && hops[0].to.hostname == "host1.example" && hops[0].to.user == "")
        #expect(hops[1].from.hostname == "host1.example" && hops[1].to.user == "alice" && hops[1].to.hostname == "host2.example")
        #expect(try SSHWirePublicKey(blob: hops[0].to.keys[0].blob).keyType == "ecdsa-sha2-nistp256")
        #expect(try SSHWirePublicKey(blob: hops[1].to.keys[0].blob).keyType == "ssh-ed25519")
        #expect(hops.allSatisfy { $0.to.keys.allSatisfy { !$0.isCA } })
        guard case .unknown(type: 9) = try SSHAgentRequest.decode(frame: vector("SSH1 REMOVE_ALL").frame) else { Issue.record("type 9"); return }
        guard case .addSmartcardKey(let provider, let pin, let sc) = try SSHAgentRequest.decode(frame: vector("ADD_SMARTCARD_KEY /").frame)
        else { Issue.record("smartcard"); return }
        #expect(provider == "/nonexistent.so" && pin.count == 0 && sc.isEmpty)
        guard case .extension(.sessionBind(let bind)) = try SSHAgentRequest.decode(frame: vector("EXTENSION session-bind").frame)
        else { Issue.record("bind"); return }
        #expect(bind.sessionIdentifier.count == 32 && !bind.isForwarding)
        guard case .ed25519(let hostKey) = try SSHWirePublicKey(blob: bind.hostKey), case .ed25519(let sig) = try SSHWireSignature(blob: bind.signature)
        else { Issue.record("bind key"); return }
        #expect(Ed25519.verify(signature: sig, message: bind.sessionIdentifier, publicKey: hostKey))
        guard case .signRequest(_, _, let flags) = try SSHAgentRequest.decode(frame: vector("SIGN_REQUEST rsa").frame) else { Issue.record("sign"); return }
        #expect(SSHRSASignatureAlgorithm(signFlags: flags) == .sha512)
    }

    /// Rule 9: constraints this codec cannot delimit, and repeated ones, are refused.
    @Test func constraintRules() throws {
        let add = Array(try vector("ADD_IDENTITY ed25519").frame.dropFirst(5))
        func constrained(_ tail: [UInt8]) throws(SSHAgentWireError) -> SSHAgentRequest { try .decode(body: [25] + add + tail) }
        #expect(throws: SSHAgentWireError.unknownConstraint(4)) { try constrained([4]) }
        #expect(throws: SSHAgentWireError.duplicateConstraint) { try constrained([1, 0, 0, 0, 1, 1, 0, 0, 0, 2]) }
        #expect(throws: SSHAgentWireError.truncated) { try constrained([1, 0, 0]) }
        var w = SSHWireWriter()
        w.writeByte(255); w.writeText("sk-provider@openssh.com"); w.writeText("internal")
        #expect(try constrained(w.bytes).encodeBody() == [25] + add + w.bytes)
        w = SSHWireWriter()
        w.writeByte(255); w.writeText("future@openssh.com")
        #expect(throws: SSHAgentWireError.unknownConstraintExtension("future@openssh.com")) { try constrained(w.bytes) }
        // 17 takes no constraints: bytes after the comment are left over.
        #expect(throws: SSHAgentWireError.trailingBytes(1)) { try SSHAgentRequest.decode(body: [17] + add + [2]) }
    }

    /// Rule 10: OpenSSH's consistency checks on destination constraints.
    @Test func destinationConstraintRules() {
        let key = SSHDestinationHop.HostKey(blob: [1], isCA: false)
        func check(_ from: SSHDestinationHop, _ to: SSHDestinationHop) throws(SSHAgentWireError) {
            let c = SSHKeyConstraint.restrictDestination([.init(from: from, to: to)])
            let (pk, sk) = Ed25519.generateKeyPair()
            let body = SSHAgentRequest.addIdentity(.ed25519(publicKey: pk, secret: sk), comment: "", constraints: [c]).encodeBody()
            _ = try SSHAgentRequest.decode(body: body)
        }
        let origin = SSHDestinationHop(user: "", hostname: "", keys: [])
        let host = SSHDestinationHop(user: "", hostname: "h", keys: [key])
        #expect(throws: Never.self) { try check(origin, host) }
        #expect(throws: Never.self) { try check(host, SSHDestinationHop(user: "u", hostname: "h2", keys: [key])) }
        #expect(throws: SSHAgentWireError.badDestinationConstraint) { try check(SSHDestinationHop(user: "u", hostname: "", keys: []), host) }
        #expect(throws: SSHAgentWireError.badDestinationConstraint) { try check(SSHDestinationHop(user: "", hostname: "h", keys: []), host) }
        #expect(throws: SSHAgentWireError.badDestinationConstraint) { try check(SSHDestinationHop(user: "", hostname: "", keys: [key]), host) }
        #expect(throws: SSHAgentWireError.badDestinationConstraint) { try check(origin, SSHDestinationHop(user: "", hostname: "h", keys: [])) }
        #expect(throws: SSHAgentWireError.badDestinationConstraint) { try check(origin, SSHDestinationHop(user: "", hostname: "", keys: [key])) }
    }

    /// Rules 2 and 11: extensions and replies are exact; unknown replies are malformed.
    @Test func extensionAndReplyRules() {
        var w = SSHWireWriter()
        w.writeByte(27); w.writeText("query"); w.writeByte(0)
        #expect(throws: SSHAgentWireError.trailingBytes(1)) { try SSHAgentRequest.decode(body: w.bytes) }
        #expect(throws: SSHAgentWireError.emptyMessage) { try SSHAgentRequest.decode(frame: hex("00000000")) }
        #expect(throws: SSHAgentWireError.truncated) { try SSHAgentRequest.decode(body: []) }
        #expect(throws: SSHAgentWireError.unknownReply(13)) { try SSHAgentReply.decode(body: [13]) }
        #expect(throws: SSHAgentWireError.trailingBytes(1)) { try SSHAgentReply.decode(body: [6, 0]) }
        #expect(throws: SSHAgentWireError.truncated) { try SSHAgentReply.decode(body: [12, 0xff, 0xff, 0xff, 0xff]) }
    }

    /// Issue #43: a certificate key as ssh-add sends it (captured) decodes to the certificate and the
    /// certified key, and encodes back to the same bytes.
    @Test func aCertificateKeyDecodesToItsCertificateAndItsCertifiedKey() throws {
        let v = try vector("ADD_IDENTITY ed25519 certificate (ssh-add")
        guard case .addCertificate(let certified, let comment, let constraints) = try SSHAgentRequest.decode(frame: v.frame) else {
            Issue.record("not a certificate key"); return
        }
        #expect(certified.certificate.certificateType == "ssh-ed25519-cert-v01@openssh.com")
        #expect(certified.certificate.keyID == "coffer-vector" && certified.certificate.principals == ["alice"] && certified.certificate.serial == 7)
        #expect(certified.key.publicKey.blob == certified.certificate.publicKey.blob)
        #expect(certified.key.publicKey.fingerprint == "SHA256:9MPb8c9qiLnM6A9LoVMIT0CdKcx4RkZtI9hkfsu6bkU", "ssh-keygen -l of the key")
        #expect(comment == "coffer-test-cert" && constraints.isEmpty)
        #expect(try roundTrip(.addCertificate(certified, comment: comment, constraints: [.confirm])).encodeFrame().count > v.frame.count)
        // A certified key that is not the certificate's is refused.
        let (pk, sk) = Ed25519.generateKeyPair()
        #expect(throws: SSHAgentWireError.inconsistentKey) {
            _ = try SSHCertifiedPrivateKey(certificate: certified.certificate, key: .ed25519(publicKey: pk, secret: sk))
        }
    }
}
