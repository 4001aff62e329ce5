import CofferCrypto
import CofferSSHAgentProtocol

/// Feeds arbitrary bytes to the SSH agent codec: as a request body, a reply body, a key blob, a
/// signature blob and a stored private key. Invariants: decoding never crashes; whatever decodes
/// re-encodes to bytes that decode and re-encode to the same bytes.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    var input = Array(UnsafeBufferPointer(start: data, count: size))
    if let request = try? SSHAgentRequest.decode(body: input) {
        var once = request.encodeBody()
        var twice = (try? SSHAgentRequest.decode(body: once))?.encodeBody()
        precondition(twice == once, "request encoding is not stable")
        secureZero(&once)
        if twice != nil { secureZero(&twice!) }
    }
    if let reply = try? SSHAgentReply.decode(body: input) {
        let once = reply.encodeBody()
        precondition((try? SSHAgentReply.decode(body: once))?.encodeBody() == once, "reply encoding is not stable")
    }
    if let key = try? SSHWirePublicKey(blob: input) {
        precondition((try? SSHWirePublicKey(blob: key.blob)) == key, "key blob encoding is not stable")
        _ = key.fingerprint
    }
    if let sig = try? SSHWireSignature(blob: input) {
        precondition((try? SSHWireSignature(blob: sig.blob)) == sig, "signature blob encoding is not stable")
    }
    if let cert = try? SSHCertificate(blob: input) {
        precondition(cert.blob == input && input.starts(with: cert.signedBytes), "certificate does not keep its bytes")
        precondition((try? SSHCertificate(blob: cert.blob)) == cert, "certificate decoding is not stable")
    }
    let stored = SecureBytes(copying: UnsafeRawBufferPointer(start: data, count: size))
    if let key = try? SSHWirePrivateKey.decodeStored(stored) {
        precondition((try? SSHWirePrivateKey.decodeStored(key.encodeStored()))?.encodeStored().withUnsafeBytes({ Array($0) })
                     == key.encodeStored().withUnsafeBytes({ Array($0) }), "stored key encoding is not stable")
    }
    secureZero(&input)
    return 0
}
