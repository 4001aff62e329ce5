import CofferCrypto
import CofferManifest

/// The spec's trusted test key (Ed25519 seed of 32 bytes 0x01), so seeds from the vectors reach
/// signature verification.
let trusted: Set<SignerKey> = [SignerKey(hex: "8a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c")!]

/// Feeds arbitrary bytes to the manifest parser. Invariants: parsing never crashes; a rejection names
/// a line that exists (or the one after the last); whatever parses re-encodes to exactly the input
/// (one canonical form) and re-parses equal; verifying it never crashes.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: data, count: size)
    let manifest: Manifest
    do {
        manifest = try Manifest.parse(input)
    } catch {
        switch error {
        case .tooLarge(let n):
            precondition(n == size && size > Manifest.maximumBytes, "too-large below the limit")
        case .malformed(let line, _):
            precondition(size <= Manifest.maximumBytes, "the size limit was not checked first")
            precondition(line >= 1 && line <= input.count(where: { $0 == 0x0A }) + 1, "error names a line that does not exist")
        default:
            preconditionFailure("parse threw a non-parse error")
        }
        return 0
    }
    let encoded = manifest.encoded()
    precondition(encoded.elementsEqual(input), "a parsed manifest did not re-encode to its input")
    precondition((try? Manifest.parse(encoded)) == manifest, "a re-encoded manifest did not re-parse equal")
    _ = try? manifest.verify(trusting: trusted)
    return 0
}
