import CofferCrypto
import CofferProtocol

/// Feeds arbitrary bytes to the agent's frame-body decoder and the client's reply decoder.
/// Invariants: decoding never crashes; whatever decodes re-encodes and decodes to the same bytes.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let body = UnsafeRawBufferPointer(start: data, count: size)
    if let (id, request) = try? AgentRequest.decodeBody(body) {
        var frame = request.encodeFrame(requestID: id)
        let again = Array(frame[4...]).withUnsafeBytes { try? AgentRequest.decodeBody($0) }
        precondition(again != nil, "a decoded request did not re-decode")
        let reencoded = again!.1.encodeFrame(requestID: again!.0)
        precondition(reencoded == frame, "request encoding is not stable")
        secureZero(&frame)
    }
    if let (id, response) = try? AgentResponse.decodeBody(body) {
        let frame = response.encodeFrame(requestID: id)
        let again = Array(frame[4...]).withUnsafeBytes { try? AgentResponse.decodeBody($0) }
        precondition(again.map { $0.1.encodeFrame(requestID: $0.0) } == frame, "response encoding is not stable")
    }
    return 0
}
