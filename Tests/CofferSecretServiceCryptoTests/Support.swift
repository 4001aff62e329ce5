import CofferCrypto
import Foundation
import Testing

/// The package's root (three levels above this file).
let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path

/// Bytes from lowercase or uppercase hex (test data only).
func hex(_ s: String) -> [UInt8] {
    let h = Array(s.utf8)
    precondition(h.count % 2 == 0, "odd hex length")
    return stride(from: 0, to: h.count, by: 2).map { UInt8(String(decoding: h[$0..<$0 + 2], as: UTF8.self), radix: 16)! }
}

/// Lowercase hex of `bytes`.
func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

/// A secure copy of `bytes`.
func secure(_ bytes: [UInt8]) -> SecureBytes {
    var copy = bytes
    return SecureBytes(consuming: &copy)
}

/// The bytes of a secure buffer, copied out (tests only).
func bytes(_ s: SecureBytes) -> [UInt8] { s.withUnsafeBytes { Array($0) } }

/// One ```vector block of SecretServiceSessions.md: its `key: value` lines.
struct SessionVector: CustomTestStringConvertible, Sendable {
    var fields: [String: String] = [:]
    var kind: String { fields["kind"] ?? "" }
    var name: String { fields["name"] ?? "" }
    var testDescription: String { "\(kind): \(name)" }
    subscript(_ key: String) -> [UInt8] { hex(fields[key] ?? "") }
}

/// The vectors of the spec article, so the document and the code cannot drift apart.
let sessionVectors: [SessionVector] = {
    let doc = packageRoot + "/Sources/CofferSecretServiceCrypto/CofferSecretServiceCrypto.docc/SecretServiceSessions.md"
    let text = (try? String(contentsOfFile: doc, encoding: .utf8)) ?? ""
    var out: [SessionVector] = [], current: SessionVector? = nil
    for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
        if line == "```vector" { current = SessionVector(); continue }
        guard current != nil else { continue }
        if line == "```" { out.append(current!); current = nil; continue }
        guard let colon = line.firstIndex(of: ":") else { continue }
        current!.fields[String(line[..<colon])] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
    }
    return out
}()
