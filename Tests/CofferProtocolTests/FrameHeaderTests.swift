import CofferProtocol
import Testing

/// `WireFormat.bodyLength(header:)`: the one parse of a frame header (client and agent readers).
@Suite struct FrameHeaderTests {
    static func length(_ bytes: [UInt8]) -> Result<Int, WireFormat.BadLength> {
        bytes.withUnsafeBytes { WireFormat.bodyLength(header: $0) }
    }

    @Test func bigEndianWithinBounds() {
        #expect(Self.length([0, 0, 0, 5]) == .success(WireFormat.minimumBodyBytes))
        #expect(Self.length([0, 0, 1, 2]) == .success(258))
        #expect(Self.length([0, 4, 0, 0]) == .success(WireFormat.maximumBodyBytes))
    }

    @Test func outOfBoundsLengthsAreFramingErrors() {
        #expect(Self.length([0, 0, 0, 0]) == .failure(.init(length: 0)))
        #expect(Self.length([0, 0, 0, 4]) == .failure(.init(length: 4)))
        #expect(Self.length([0, 4, 0, 1]) == .failure(.init(length: WireFormat.maximumBodyBytes + 1)))
        #expect(Self.length([0xFF, 0xFF, 0xFF, 0xFF]) == .failure(.init(length: Int(UInt32.max))))
    }
}
