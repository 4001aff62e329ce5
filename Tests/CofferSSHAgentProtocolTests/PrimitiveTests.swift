import CofferSSHAgentProtocol
import Testing

/// RFC 4251 §5 primitives and the framing limit (rules 1–4).
@Suite struct PrimitiveTests {
    func mpint(_ magnitude: [UInt8]) -> [UInt8] {
        var w = SSHWireWriter()
        w.writePositiveMPInt(magnitude)
        return w.bytes
    }

    func readMPInt(_ b: [UInt8]) throws(SSHAgentWireError) -> [UInt8] {
        var r = SSHWireReader(b)
        let m = try r.readPositiveMPInt()
        try r.finish()
        return m
    }

    /// RFC 4251 §5's own examples (the non-negative ones), both ways.
    @Test func rfc4251Examples() throws {
        #expect(mpint([]) == hex("00000000"))
        #expect(mpint([0, 0]) == hex("00000000"))
        #expect(mpint(hex("09a378f9b2e332a7")) == hex("0000000809a378f9b2e332a7"))
        #expect(mpint([0x80]) == hex("000000020080"))
        #expect(mpint([0x00, 0x80]) == hex("000000020080"))
        #expect(try readMPInt(hex("00000000")) == [])
        #expect(try readMPInt(hex("0000000809a378f9b2e332a7")) == hex("09a378f9b2e332a7"))
        #expect(try readMPInt(hex("000000020080")) == [0x80])
    }

    /// Rule 3: negative numbers (RFC 4251's -1234 and -deadbeef) and non-minimal forms are refused.
    @Test func negativeAndNonMinimalMPIntsAreRefused() {
        #expect(throws: SSHAgentWireError.negativeMPInt) { try readMPInt(hex("00000002edcc")) }
        #expect(throws: SSHAgentWireError.negativeMPInt) { try readMPInt(hex("00000005ff21524111")) }
        #expect(throws: SSHAgentWireError.negativeMPInt) { try readMPInt(hex("0000000180")) }
        #expect(throws: SSHAgentWireError.nonMinimalMPInt) { try readMPInt(hex("0000000100")) }
        #expect(throws: SSHAgentWireError.nonMinimalMPInt) { try readMPInt(hex("000000020001")) }
        #expect(throws: SSHAgentWireError.nonMinimalMPInt) { try readMPInt(hex("00000003000080")) }
        #expect(throws: SSHAgentWireError.truncated) { try readMPInt(hex("0000000201")) }
    }

    /// Rules 2 and 4: short reads, leftovers, booleans other than 0 and 1, text that is not UTF-8.
    @Test func primitivesAreStrict() throws {
        var r = SSHWireReader([0, 0, 0])
        #expect(throws: SSHAgentWireError.truncated) { try r.readUInt32() }
        r = SSHWireReader(hex("00000005616263"))
        #expect(throws: SSHAgentWireError.truncated) { try r.readString() }
        r = SSHWireReader(hex("ffffffff"))
        #expect(throws: SSHAgentWireError.truncated) { try r.readString() }
        r = SSHWireReader([2])
        #expect(throws: SSHAgentWireError.badBoolean(2)) { try r.readBool() }
        r = SSHWireReader(hex("00000002c328"))
        #expect(throws: SSHAgentWireError.badUTF8) { try r.readText() }
        r = SSHWireReader(hex("0000000161ff"))
        #expect(try r.readText() == "a")
        #expect(throws: SSHAgentWireError.trailingBytes(1)) { try r.finish() }
    }

    /// Rule 1: 256 KiB is the largest body; 0 and anything longer are refused at the prefix.
    @Test func framingLimit() throws {
        #expect(SSHAgentFraming.maximumBodyBytes == 262144)
        #expect(try SSHAgentFraming.bodyLength(prefix: hex("00040000")) == 262144)
        #expect(throws: SSHAgentWireError.oversize(262145)) { try SSHAgentFraming.bodyLength(prefix: hex("00040001")) }
        #expect(throws: SSHAgentWireError.oversize(Int(UInt32.max))) { try SSHAgentFraming.bodyLength(prefix: hex("ffffffff")) }
        #expect(throws: SSHAgentWireError.emptyMessage) { try SSHAgentFraming.bodyLength(prefix: hex("00000000")) }
        #expect(throws: SSHAgentWireError.truncated) { try SSHAgentFraming.bodyLength(prefix: hex("000000")) }
        #expect(throws: SSHAgentWireError.trailingBytes(1)) { try SSHAgentFraming.body(ofFrame: hex("000000010b05")) }
        // A reply too big to send is refused by the encoder, never sent oversized.
        let many = SSHAgentReply.identities((0..<3000).map { _ in SSHAgentIdentity(keyBlob: [UInt8](repeating: 7, count: 80), comment: "k") })
        #expect(throws: SSHAgentWireError.self) { try many.encodeFrame() }
        let body = [UInt8](repeating: 6, count: 262144)
        #expect(try SSHAgentFraming.frame(body).count == 262148)
    }
}
