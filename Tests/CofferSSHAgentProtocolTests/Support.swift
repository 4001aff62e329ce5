import CofferCrypto
import CofferSSHAgentProtocol
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
let sshVectors: [SSHVector] = {
    let doc = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Sources/CofferSSHAgentProtocol/CofferSSHAgentProtocol.docc/SSHAgentProtocol.md")
    let text = (try? String(contentsOf: doc, encoding: .utf8)) ?? ""
    var out: [SSHVector] = []
    var current: SSHVector? = nil
    for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
        if line == "```vector" { current = SSHVector(); continue }
        guard var v = current else { continue }
        if line == "```" { out.append(v); current = nil; continue }
        let parts = line.split(separator: ":", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
        guard parts.count == 2 else { continue }
        switch parts[0] {
        case "name": v.name = parts[1]
        case "direction": v.direction = parts[1]
        case "outcome": v.outcome = parts[1]
        case "frame": v.frame = hex(parts[1])
        default: v.fields[parts[0]] = parts[1]
        }
        current = v
    }
    return out
}()

func hex(_ s: String) -> [UInt8] {
    var out: [UInt8] = []
    var i = s.startIndex
    while i < s.endIndex, let j = s.index(i, offsetBy: 2, limitedBy: s.endIndex) {
        out.append(UInt8(s[i..<j], radix: 16)!)
        i = j
    }
    return out
}

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
