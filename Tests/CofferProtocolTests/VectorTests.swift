import CofferCrypto
import CofferModel
@testable import CofferProtocol
import Foundation
import Testing

/// One test vector from WireProtocol.md.
struct Vector: CustomTestStringConvertible, Sendable {
    var name = "", direction = "", outcome = ""
    var frame: [UInt8] = []
    var testDescription: String { name }
}

/// Parses the ```vector blocks of the spec, so the document and the code cannot drift apart.
let vectors: [Vector] = {
    let doc = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Sources/CofferProtocol/CofferProtocol.docc/WireProtocol.md")
    let text = (try? String(contentsOf: doc, encoding: .utf8)) ?? ""
    var out: [Vector] = []
    var current: Vector? = nil
    for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
        if line == "```vector" { current = Vector(); continue }
        guard var v = current else { continue }
        if line == "```" { out.append(v); current = nil; continue }
        let parts = line.split(separator: ":", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
        guard parts.count == 2 else { continue }
        switch parts[0] {
        case "name": v.name = parts[1]
        case "direction": v.direction = parts[1]
        case "outcome": v.outcome = parts[1]
        case "frame": v.frame = hexBytes(parts[1].replacingOccurrences(of: " ", with: ""))
        default: break
        }
        current = v
    }
    return out
}()

func hexBytes(_ s: String) -> [UInt8] {
    var out: [UInt8] = []
    var i = s.startIndex
    while i < s.endIndex, let j = s.index(i, offsetBy: 2, limitedBy: s.endIndex) {
        out.append(UInt8(s[i..<j], radix: 16)!)
        i = j
    }
    return out
}

/// The framing rule a receiver applies before decoding: nil means "close the connection".
func body(of frame: [UInt8]) -> [UInt8]? {
    guard frame.count >= 4 else { return nil }
    let len = Int(frame[0]) << 24 | Int(frame[1]) << 16 | Int(frame[2]) << 8 | Int(frame[3])
    guard len >= WireFormat.minimumBodyBytes, len <= WireFormat.maximumBodyBytes else { return nil }
    return Array(frame[4...])
}

@Suite struct VectorTests {
    @Test func theSpecHasVectorsOfEveryOutcome() {
        #expect(vectors.count >= 20)
        #expect(Set(vectors.map(\.outcome)) == ["ok", "close", "error -50"])
    }

    @Test(arguments: vectors)
    func vector(_ v: Vector) throws {
        let decoded = body(of: v.frame)
        switch v.outcome {
        case "close":
            #expect(decoded == nil)
        case "ok":
            let b = try #require(decoded)
            #expect(b.count + 4 == v.frame.count, "length prefix does not match")
            let again: [UInt8]
            if v.direction == "request" {
                let (id, req) = try b.withUnsafeBytes { try AgentRequest.decodeBody($0) }
                again = req.encodeFrame(requestID: id)
            } else {
                let (id, resp) = try b.withUnsafeBytes { try AgentResponse.decodeBody($0) }
                again = resp.encodeFrame(requestID: id)
            }
            #expect(again == v.frame)
        case "error -50":
            let b = try #require(decoded)
            #expect(b.count + 4 == v.frame.count, "length prefix must be right so the payload rule is what fails")
            do {
                _ = try b.withUnsafeBytes { try AgentRequest.decodeBody($0) }
                Issue.record("decoded")
            } catch let e as ProtocolError {
                #expect(e.secError.status == .param)
            }
        default:
            Issue.record("unknown outcome \(v.outcome)")
        }
    }

    /// Every prefix of every valid vector fails cleanly (typed error), never crashes.
    @Test func everyTruncationIsACleanError() {
        for v in vectors where v.outcome == "ok" {
            let b = Array(v.frame[4...])
            for cut in 0..<b.count {
                let prefix = Array(b[0..<cut])
                let threw: Bool
                if v.direction == "request" {
                    threw = (try? prefix.withUnsafeBytes { try AgentRequest.decodeBody($0) }) == nil
                } else {
                    threw = (try? prefix.withUnsafeBytes { try AgentResponse.decodeBody($0) }) == nil
                }
                #expect(threw, "\(v.name): prefix of \(cut) bytes decoded")
            }
        }
    }
}
