import CofferProtocol
import CofferTestSupport
import Foundation
import Testing

/// Replays inputs saved by contrib/fuzz/run (seeds, and any input that ever crashed a decoder).
@Suite struct FuzzRegressionTests {
    static let inputs = fuzzRegressionInputs()

    @Test func thereAreSavedInputs() { #expect(!Self.inputs.isEmpty) }

    @Test(arguments: inputs)
    func replays(_ url: URL) throws {
        let bytes = [UInt8](try Data(contentsOf: url))
        // Must not crash; whatever decodes must re-encode to the same body.
        if let (id, r) = try? bytes.withUnsafeBytes({ try AgentRequest.decodeBody($0) }) {
            #expect(Array(r.encodeFrame(requestID: id)[4...]) == bytes)
        }
        if let (id, r) = try? bytes.withUnsafeBytes({ try AgentResponse.decodeBody($0) }) {
            #expect(Array(r.encodeFrame(requestID: id)[4...]) == bytes)
        }
    }
}
