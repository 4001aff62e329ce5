import CofferCrypto
@testable import CofferManifest
import CofferModel
import Foundation
import Testing

/// The spec's fixed keys: Ed25519 seeds of 32 bytes 0x01 (trusted) and 0x02 (untrusted).
enum Keys {
    static func pair(_ seedByte: UInt8) -> (publicKey: [UInt8], secretKey: SecureBytes) {
        var seed = [UInt8](repeating: seedByte, count: Ed25519.seedBytes)
        return Ed25519.keyPair(seed: SecureBytes(consuming: &seed))
    }
    static let trusted = pair(0x01)
    static let untrusted = pair(0x02)
    static let trustedSet: Set<SignerKey> = [SignerKey(trusted.publicKey)!]
}

/// SHA-256 of "abc", the digest every vector pins.
let abcDigest = SHA256.hash(Array("abc".utf8))

/// One ```manifest-vector block of ManifestFormat.md.
struct ManifestVector: CustomTestStringConvertible, Sendable {
    var name = "", outcome = ""
    var display: [String] = []
    var bytes: [UInt8] = []
    var testDescription: String { name }
}

/// The spec, read from the source tree so the document and the code cannot drift apart.
let specText: String = {
    let doc = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Sources/CofferManifest/CofferManifest.docc/ManifestFormat.md")
    return (try? String(contentsOf: doc, encoding: .utf8)) ?? ""
}()

/// Parses the vector blocks: `name:` and `outcome:` lines, then `manifest:` and display lines up to the fence.
let manifestVectors: [ManifestVector] = {
    var out: [ManifestVector] = []
    var current: ManifestVector? = nil
    var inManifest = false
    for line in specText.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
        if line == "```manifest-vector" { current = ManifestVector(); inManifest = false; continue }
        guard var v = current else { continue }
        if line == "```" {
            v.bytes = unescape(v.display) ?? []
            out.append(v); current = nil; continue
        }
        if inManifest { v.display.append(line) }
        else if line == "manifest:" { inManifest = true }
        else if line.hasPrefix("name: ") { v.name = String(line.dropFirst(6)) }
        else if line.hasPrefix("outcome: ") { v.outcome = String(line.dropFirst(9)) }
        current = v
    }
    return out
}()

/// Decodes display lines as the spec defines them: `\\`, `\xHH`, `\xHH{N}`, a final `\c`; nil if
/// the escapes are malformed.
func unescape(_ lines: [String]) -> [UInt8]? {
    var out: [UInt8] = []
    for line in lines {
        let b = Array(line.utf8)
        var i = 0
        var newline = true
        while i < b.count {
            guard b[i] == 0x5C else { out.append(b[i]); i += 1; continue }
            guard i + 1 < b.count else { return nil }
            switch b[i + 1] {
            case 0x5C: out.append(0x5C); i += 2
            case 0x63 where i + 2 == b.count: newline = false; i += 2
            case 0x78:
                guard i + 4 <= b.count, let byte = Hex.decodeLowercase(b[(i + 2)..<(i + 4)], byteCount: 1) else { return nil }
                i += 4
                var n = 1
                if i < b.count, b[i] == 0x7B {
                    guard let close = b[i...].firstIndex(of: 0x7D),
                          let count = Int(String(decoding: b[(i + 1)..<close], as: UTF8.self)), count >= 1 else { return nil }
                    n = count
                    i = close + 1
                }
                out += [UInt8](repeating: byte[0], count: n)
            default: return nil
            }
        }
        if newline { out.append(0x0A) }
    }
    return out
}

/// The lowercase hex of `bytes`.
func hex(_ bytes: [UInt8]) -> String { Hex.encode(bytes) }

/// A small deterministic generator (SplitMix64) so property tests can be replayed from their seed.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
