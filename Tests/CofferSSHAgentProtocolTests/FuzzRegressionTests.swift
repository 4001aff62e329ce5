import CofferTestSupport
import Foundation
import Testing

/// Replays inputs saved by contrib/fuzz/run for FuzzSSHAgent (seeds, and any input that ever crashed a decoder).
@Suite struct SSHAgentFuzzRegressionTests {
    static let inputs = fuzzRegressionInputs()

    @Test func thereAreSavedInputs() { #expect(!Self.inputs.isEmpty) }

    @Test(arguments: inputs)
    func replays(_ url: URL) throws {
        // Must not crash; whatever decodes must re-encode stably (the fuzzer's invariant).
        #expect(decodesStably(body: [UInt8](try Data(contentsOf: url))))
    }
}
