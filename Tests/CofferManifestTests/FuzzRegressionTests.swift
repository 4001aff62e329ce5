import CofferManifest
import CofferTestSupport
import Foundation
import Testing

/// Replays inputs saved by contrib/fuzz/run (seeds, and any input that ever crashed the manifest parser),
/// with the fuzz target's invariants.
@Suite struct ManifestFuzzRegressionTests {
    static let inputs = fuzzRegressionInputs()

    @Test func thereAreSavedInputs() { #expect(!Self.inputs.isEmpty) }

    @Test(arguments: inputs)
    func replays(_ url: URL) throws {
        let bytes = [UInt8](try Data(contentsOf: url))
        // Must not crash; whatever parses must re-encode to the same bytes and re-parse equal.
        guard let m = try? Manifest.parse(bytes) else { return }
        #expect(m.encoded() == bytes)
        #expect(try Manifest.parse(m.encoded()) == m)
        _ = try? m.verify(trusting: Keys.trustedSet)
    }
}
