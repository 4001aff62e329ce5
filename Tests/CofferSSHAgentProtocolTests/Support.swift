import CofferCrypto
import CofferSSHAgentProtocol
import CofferTestSupport
import Foundation
import Testing

/// One test vector block of SSHAgentProtocol.md.
struct SSHVector: CustomTestStringConvertible, Sendable {
    var name = "", direction = "", outcome = ""
    var frame: [UInt8] = []
    var fields: [String: String] = [:]
    var testDescription: String { name }
}

/// The vectors of the spec article, in order, so the document and the code cannot drift apart.
let sshVectors: [SSHVector] = specVectorBlocks("Sources/CofferSSHAgentProtocol/CofferSSHAgentProtocol.docc/SSHAgentProtocol.md").map { block in
    var v = SSHVector(name: block["name"] ?? "", direction: block["direction"] ?? "", outcome: block["outcome"] ?? "")
    v.frame = hexDecode(block["frame"] ?? "") ?? []
    v.fields = block
    return v
}

func hex(_ s: String) -> [UInt8] { hexDecode(s)! }

func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }

func secure(_ s: String) -> SecureBytes { var b = Array(s.utf8); return SecureBytes(consuming: &b) }

func plain(_ s: SecureBytes) -> [UInt8] { s.withUnsafeBytes { Array($0) } }

/// The error's case name, without associated values (`trailingBytes(1)` → `trailingBytes`).
func caseName(_ e: SSHAgentWireError) -> String { String(String(describing: e).prefix { $0 != "(" }) }

/// Decodes `frame` in `direction` and re-encodes it: the round trip every `ok` vector must survive.
func reencode(_ frame: [UInt8], direction: String) throws(SSHAgentWireError) -> [UInt8] {
    if direction == "request" { return try SSHAgentRequest.decode(frame: frame).encodeFrame() }
    return try SSHAgentReply.decode(frame: frame).encodeFrame()
}

/// Decodes a body the way the fuzzer does, in both directions; whatever decodes must re-encode to a
/// body that decodes and re-encodes to itself. Returns whether either direction decoded.
@discardableResult
func decodesStably(body: [UInt8]) -> Bool {
    var any = false
    if let r = try? SSHAgentRequest.decode(body: body) {
        any = true
        let once = r.encodeBody()
        precondition((try? SSHAgentRequest.decode(body: once))?.encodeBody() == once, "request encoding is not stable")
    }
    if let r = try? SSHAgentReply.decode(body: body) {
        any = true
        let once = r.encodeBody()
        precondition((try? SSHAgentReply.decode(body: once))?.encodeBody() == once, "reply encoding is not stable")
    }
    return any
}
