import CofferCrypto
import CofferSSHKeys
import CofferTestSupport
import Foundation
import Testing

/// The `openssl` command-line tool, the independent party of the ECDSA and RSA tests: it makes keys
/// for import, and signs and verifies what this module verifies and signs.
enum OpenSSLTool {
    static let path: String? = ["/usr/bin/openssl", "/bin/openssl", "/usr/local/bin/openssl"]
        .first { FileManager.default.isExecutableFile(atPath: $0) }
    static var available: Bool { path != nil }

    /// Runs `openssl arguments` in `directory`; its standard output, or a recorded issue and nil on failure.
    @discardableResult
    static func run(_ arguments: [String], in directory: URL, expectFailure: Bool = false,
                    sourceLocation: SourceLocation = #_sourceLocation) throws -> (status: Int32, output: String) {
        let r = runProcess(try #require(path), arguments, directory: directory, timeout: 120)
        if !expectFailure && r.status != 0 {
            let message = "openssl \(arguments.joined(separator: " ")) failed (\(r.status)): " + r.stderr
            Issue.record(Comment(rawValue: message), sourceLocation: sourceLocation)
        }
        return (r.status, r.stdout)
    }

    /// The key components `openssl pkey -text -noout` prints, by label (`priv`, `pub`, `modulus`,
    /// `publicExponent`, `privateExponent`, `prime1`, `prime2`, `coefficient`, …), as bytes.
    static func components(ofKeyFile file: String, in directory: URL) throws -> [String: [UInt8]] {
        let text = try run(["pkey", "-in", file, "-text", "-noout"], in: directory).output
        var found: [String: [UInt8]] = [:]
        var label: String?
        for line in text.split(separator: "\n") {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if !line.hasPrefix(" "), let colon = trimmed.firstIndex(of: ":") {
                label = String(trimmed[..<colon])
                let rest = trimmed[trimmed.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                // `publicExponent: 65537 (0x10001)`: the value on the label's line.
                if let open = rest.range(of: "(0x"), let close = rest.lastIndex(of: ")") {
                    var hexDigits = String(rest[open.upperBound..<close])
                    if hexDigits.count % 2 == 1 { hexDigits = "0" + hexDigits }
                    found[label!] = hex(hexDigits)
                    label = nil
                }
                continue
            }
            if let label, trimmed.allSatisfy({ $0.isHexDigit || $0 == ":" }) {
                found[label, default: []] += hex(trimmed.replacingOccurrences(of: ":", with: ""))
            }
        }
        return found
    }
}

/// A directory of its own for one test's files, removed at the end.
final class Scratch {
    let url: URL
    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent("coffer-sshkeys-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
    }
    deinit { try? FileManager.default.removeItem(at: url) }

    func write(_ bytes: [UInt8], to name: String) throws { try Data(bytes).write(to: url.appendingPathComponent(name)) }
    func write(_ text: String, to name: String) throws { try Data(text.utf8).write(to: url.appendingPathComponent(name)) }
    func read(_ name: String) throws -> [UInt8] { [UInt8](try Data(contentsOf: url.appendingPathComponent(name))) }
}

/// Just enough DER to hand public keys and ECDSA signatures to the `openssl` tool (tests only).
enum DER {
    static func length(_ n: Int) -> [UInt8] {
        if n < 0x80 { return [UInt8(n)] }
        var bytes: [UInt8] = []
        var v = n
        while v > 0 { bytes.insert(UInt8(v & 0xff), at: 0); v >>= 8 }
        return [0x80 | UInt8(bytes.count)] + bytes
    }
    static func tlv(_ tag: UInt8, _ content: [UInt8]) -> [UInt8] { [tag] + length(content.count) + content }
    static func integer(_ unsigned: [UInt8]) -> [UInt8] {
        var v = Array(unsigned.drop { $0 == 0 })
        if v.isEmpty || v[0] & 0x80 != 0 { v.insert(0, at: 0) }
        return tlv(0x02, v)
    }
    static func sequence(_ parts: [UInt8]...) -> [UInt8] { tlv(0x30, parts.flatMap { $0 }) }
    static func bitString(_ bytes: [UInt8]) -> [UInt8] { tlv(0x03, [0] + bytes) }

    /// The SubjectPublicKeyInfo of an ECDSA or RSA public key.
    static func subjectPublicKeyInfo(_ key: SSHPublicKey) -> [UInt8] {
        switch key {
        case .ecdsa(let curve, let q):
            let idECPublicKey: [UInt8] = [0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01]
            let named: [UInt8] = switch curve {
            case .p256: [0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07]
            case .p384: [0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22]
            case .p521: [0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x23]
            }
            return sequence(sequence(idECPublicKey, named), bitString(q))
        case .rsa(let e, let n):
            let rsaEncryption: [UInt8] = [0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00]
            return sequence(sequence(rsaEncryption), bitString(sequence(integer(n), integer(e))))
        case .ed25519:
            preconditionFailure("the Ed25519 tests use RFC 8032's vectors")
        }
    }

    /// A PEM `PUBLIC KEY` of `key`.
    static func publicKeyPEM(_ key: SSHPublicKey) -> String {
        "-----BEGIN PUBLIC KEY-----\n"
            + Data(subjectPublicKeyInfo(key)).base64EncodedString(options: [.lineLength64Characters, .endLineWithLineFeed])
            + "\n-----END PUBLIC KEY-----\n"
    }
}

func hex(_ s: String) -> [UInt8] {
    var out: [UInt8] = []
    var i = s.startIndex
    while i < s.endIndex {
        let j = s.index(i, offsetBy: 2)
        out.append(UInt8(s[i..<j], radix: 16)!)
        i = j
    }
    return out
}

func hexString(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

func secure(_ bytes: [UInt8]) -> SecureBytes { var copy = bytes; return SecureBytes(consuming: &copy) }

func bytes(_ s: SecureBytes) -> [UInt8] { s.withUnsafeBytes { Array($0) } }

/// The error `body` throws (nil if it throws none).
func thrown<T>(_ body: () throws -> T, sourceLocation: SourceLocation = #_sourceLocation) -> SSHKeyError? {
    do {
        _ = try body()
        return nil
    } catch let error as SSHKeyError {
        return error
    } catch {
        Issue.record("not an SSHKeyError: \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

extension DER {
    /// The INTEGERs of a DER SEQUENCE of INTEGERs (an ECDSA-Sig-Value from `openssl dgst -sign`), unsigned.
    static func integers(ofSequence der: [UInt8]) -> [[UInt8]]? {
        var i = 0
        func readLength() -> Int? {
            guard i < der.count else { return nil }
            let first = Int(der[i]); i += 1
            if first < 0x80 { return first }
            var n = 0
            for _ in 0..<(first & 0x7f) { guard i < der.count else { return nil }; n = n << 8 | Int(der[i]); i += 1 }
            return n
        }
        guard der.first == 0x30 else { return nil }
        i = 1
        guard let total = readLength(), i + total == der.count else { return nil }
        var out: [[UInt8]] = []
        while i < der.count {
            guard der[i] == 0x02 else { return nil }
            i += 1
            guard let n = readLength(), i + n <= der.count else { return nil }
            out.append(Array(der[i..<(i + n)].drop { $0 == 0 }))
            i += n
        }
        return out
    }
}
